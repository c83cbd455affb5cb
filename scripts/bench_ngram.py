"""A micro-benchmark of the n-gram drafter (not a test): the costs docs/NGRAM.md reports.

Replays a token stream as if decoding: propose, verify greedily against the true next tokens,
observe what was accepted. Streams: word-level tokens of Python source (repetitive, like code or
rewrites) and uniform random ids over 32k (nothing repeats: the worst case for trie growth).
Prints mean µs per propose and observe, the 99th percentile of both, and tokens per step. Usage:

    .venv/bin/python scripts/bench_ngram.py
"""

from __future__ import annotations

import glob
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import SpecConfig
from engine.drafters.ngram import NgramDrafter

SETTINGS = (
    ("tree BFS  8", {"num_draft_tokens": 8}),
    ("tree BFS 16", {"num_draft_tokens": 16}),
    ("tree PROB 16", {"num_draft_tokens": 16, "ngram_match_type": "PROB"}),
    ("chain 8", {"num_draft_tokens": 8, "ngram_mode": "chain"}),
    ("chain 16", {"num_draft_tokens": 16, "ngram_mode": "chain"}),
)


def streams() -> dict[str, list[int]]:
    """The two token streams: word tokens of the installed textual sources, and random ids."""
    files = sorted(glob.glob(f"{sys.prefix}/lib/python*/site-packages/textual/*.py"))
    text = "".join(Path(f).read_text(encoding="utf-8", errors="replace") for f in files[:40])
    vocab: dict[str, int] = {}
    code = [vocab.setdefault(w, len(vocab)) for w in re.findall(r"\w+|[^\w\s]|\s+", text)]
    rng = random.Random(0)
    return {"code": code, "random": [rng.randrange(32000) for _ in range(12000)]}


def accepted_drafts(tree, stream: list[int], pos: int) -> list[int]:
    """The drafts greedy verification keeps when ``stream[pos]`` is the root: the path that
    follows the stream's true continuation."""
    kids, node, acc = tree.children(), 0, []
    while True:
        want = stream[pos + 1 + len(acc)]
        node = next((c for c in kids[node] if tree.tokens[c] == want), -1)
        if node < 0:
            return acc
        acc.append(want)


def replay(stream: list[int], history_len: int, config: SpecConfig) -> str:
    """One row of the table: reset on ``history_len`` tokens, then up to 2,000 decoding steps."""
    drafter = NgramDrafter(config)
    t0 = time.perf_counter()
    drafter.reset(stream[:history_len])
    reset_s = time.perf_counter() - t0
    pos = history_len  # stream[pos] is the root
    proposes, observes = [], []
    emitted = 0
    while pos + 20 < len(stream) and len(proposes) < 2000:
        root = stream[pos]
        t0 = time.perf_counter()
        tree = drafter.propose(drafter.tokens, root, config)
        proposes.append(time.perf_counter() - t0)
        acc = accepted_drafts(tree, stream, pos)
        t0 = time.perf_counter()
        drafter.observe([root, *acc])
        observes.append(time.perf_counter() - t0)
        emitted += len(acc) + 1
        pos += len(acc) + 1
    both = sorted(p + o for p, o in zip(proposes, observes, strict=True))
    n = len(proposes)
    return (f"{reset_s * 1e3:8.1f} {sum(proposes) / n * 1e6:10.1f} {sum(observes) / n * 1e6:10.1f} "
            f"{both[int(n * 0.99)] * 1e6:8.0f} {emitted / n:8.2f} {len(drafter.trie):10d}")


def main() -> None:
    print(f"{'stream':6s} {'history':>7s} {'setting':12s} {'reset ms':>8s} {'propose us':>10s} "
          f"{'observe us':>10s} {'p99 both':>8s} {'tok/step':>8s} {'trie nodes':>10s}")
    for stream_name, stream in streams().items():
        for history_len in (1000, 4000):
            for label, changes in SETTINGS:
                row = replay(stream, history_len, SpecConfig(method="ngram", **changes))
                print(f"{stream_name:6s} {history_len:7d} {label:12s} {row}", flush=True)


if __name__ == "__main__":
    main()
