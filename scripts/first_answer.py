"""The first answers after a load, in a compare's order (baseline, n-gram, baseline, n-gram), with and
without ``Session.warm_up``: does the first compare charge the session's one-time costs to the baseline?

    .venv/bin/python scripts/first_answer.py cold|warm [MODEL]

One process per run (a load each): alternate ``cold`` and ``warm`` runs, alone on the machine.
docs/BENCHMARKS.md ("Does the chat's first compare charge one-time costs to the baseline?") has
the numbers.
"""

from __future__ import annotations

import sys
import time

from engine.config import SpecConfig
from engine.events import Finished
from engine.loader import load_session

PROMPT = "Name three colours and describe each in one sentence."


def main(argv: list[str]) -> None:
    mode, model = argv[0], (argv[1] if len(argv) > 1 else None)
    if mode not in ("cold", "warm"):
        raise SystemExit("usage: first_answer.py cold|warm [MODEL]")
    config = SpecConfig(method="ngram", max_new_tokens=64)
    session = load_session(model, config, device="cpu")
    start = time.perf_counter()
    if mode == "warm":
        session.warm_up()
    warm_s = time.perf_counter() - start
    speeds = []
    for method in ("none", "ngram", "none", "ngram"):
        session.reset()
        finished = [e for e in session.generate([{"role": "user", "content": PROMPT}], config.replace(method=method))
                    if isinstance(e, Finished)][-1]
        speeds.append(f"{method} {finished.stats.tokens_per_s:.1f}")
    print(f"{mode} warm-up {warm_s:.2f} s | " + " | ".join(speeds) + " tok/s")


if __name__ == "__main__":
    main(sys.argv[1:])
