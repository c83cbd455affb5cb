"""The n-gram drafter's second source: what the target model itself tends to write next.

Why: the conversation's own n-grams draft well where an answer copies its prompt (rewrites,
code edits) and poorly in free chat, where most steps find no earlier occurrence longer than the
root token. A model's answers, though, repeat its own phrasing across conversations ("Here are
some", "In conclusion,", list scaffolding). Replayed on the target's greedy MT-bench answers (80
first turns, chains verified at the measured fast-precision verify costs; a throwaway script,
docs/history/benchmarks-sessions.md, "Session 30"), n-grams of ~8M tokens of its own self-distilled
answers (the EAGLE training data, never MT-bench) raised tokens per step from 1.37 to 1.64 when
consulted wherever the conversation had no match of two tokens or more (the corpus alone: 1.25); end
to end, n-gram on MT-bench went from 1.08-1.09x to 1.18-1.25x. This is the datastore idea of REST
(He et al., 2023) and of SuffixDecoding's global tree, kept small: for every n-gram (n <= ``max_n``)
followed at least ``min_count`` times by one token, its few most frequent continuations and their
counts.

The index is a frozen table: sorted 64-bit n-gram hashes (the order is part of the hash), the top
continuations as token ids, their counts and the n-gram's total count, and an open-addressing
table over the hashes. The tree is grown in our C kernels (engine/kernels/corpus.c: a lookup
probes ~2 cache lines) and, where they do not run, by :meth:`CorpusIndex.tree_python`, the
reference (``searchsorted`` over the sorted hashes); the longest match wins. A hash collision can
only propose a wrong draft, which verification refuses: lossless either way.
"""

from __future__ import annotations

import hashlib
import heapq
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from engine.tree import DraftTree

_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15  # the golden-ratio multiplier: odd, well-mixed bits
_FORMAT = 2  # bump when the hash or the table layout changes (names cached index files)
MAX_N, TOP, MIN_COUNT = 4, 3, 3  # the defaults, chosen by the replay above


def context_hashes(context: Sequence[int], max_n: int) -> list[int]:
    """The hashes of the n-grams ending ``context`` for n = 1..max_n (fewer if it is shorter):
    h_n = h_{n-1} * MUL + token[-n] + n (mod 2^64), the same as :func:`_stream_hashes` builds."""
    h, out = 0, []
    for j in range(1, min(len(context), max_n) + 1):
        h = (h * _MUL + int(context[-j]) + j) & _MASK
        out.append(h)
    return out


def _stream_hashes(stream: np.ndarray, n: int, h: np.ndarray) -> np.ndarray:
    """Every position's order-n hash from its order-(n-1) hash, in place in ``h`` (uint64
    arithmetic wraps like the masked Python ints of :func:`context_hashes`; no full-size temporaries:
    the build's peak memory is a few of these arrays)."""
    with np.errstate(over="ignore"):
        np.multiply(h, np.uint64(_MUL), out=h)
        if n <= len(stream):  # else no position ends an n-gram (the caller masks them all)
            np.add(h[n - 1:], stream[: len(stream) - n + 1], out=h[n - 1:], dtype=np.uint64, casting="unsafe")
        np.add(h, np.uint64(n), out=h)
    return h


@dataclass(frozen=True)
class CorpusIndex:
    """N-gram continuations counted over a token corpus (see the module docstring)."""

    keys: np.ndarray  # uint64 [M], sorted: the n-grams' hashes
    tokens: np.ndarray  # int32 [M, top]: continuations, most frequent first, -1 where fewer
    counts: np.ndarray  # int32 [M, top]: how often each followed the n-gram
    totals: np.ndarray  # int32 [M]: how often the n-gram was followed by anything
    max_n: int
    # an open-addressing table over ``keys`` (int32 row or -1; :func:`hash_slots`) for the native
    # tree: ~2 cache lines a lookup instead of a binary search's ~20 (made from keys if not given)
    slots: np.ndarray | None = None

    def __post_init__(self) -> None:
        # the native tree reads these layouts directly (corpus.c)
        for name, dtype in (("keys", np.uint64), ("tokens", np.int32), ("counts", np.int32), ("totals", np.int32)):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        slots = hash_slots(self.keys) if self.slots is None else self.slots
        object.__setattr__(self, "slots", np.ascontiguousarray(slots, dtype=np.int32))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.tokens, self.counts, self.totals, self.slots))

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def build(cls, documents: Iterable[np.ndarray], *, max_n: int = MAX_N, top: int = TOP,
              min_count: int = MIN_COUNT) -> CorpusIndex:
        """Count the continuations of every n-gram (n = 1..max_n) within each document (no
        n-gram spans two), keeping n-grams followed at least ``min_count`` times by one token and
        their ``top`` most frequent continuations seen that often."""
        if max_n < 1 or top < 1 or min_count < 1:
            raise ValueError("max_n, top and min_count must be >= 1")
        docs = [d for d in (np.asarray(d) for d in documents) if len(d) >= 2]
        if not docs:
            return cls.empty(max_n, top)
        stream = np.concatenate(docs).astype(np.int32)  # the shipped 10.6M tokens: ~0.8 GB at the peak
        lengths = np.array([len(d) for d in docs])
        starts = np.cumsum(lengths) - lengths
        # ok: position i ends an order-n n-gram with a continuation: not its document's last token,
        # nor one of its first n-1 (updated order by order)
        ok = np.ones(len(stream), dtype=bool)
        ok[starts + lengths - 1] = False
        del docs
        parts = []
        h = np.zeros(len(stream), dtype=np.uint64)
        for n in range(1, max_n + 1):
            h = _stream_hashes(stream, n, h)
            if n > 1:
                ok[(starts + n - 2)[lengths >= n - 1]] = False
            parts.append(_top_continuations(h[ok], stream[1:][ok[:-1]], top, min_count))
        keys = np.concatenate([p[0] for p in parts])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        if len(keys) > 1 and bool((keys[1:] == keys[:-1]).any()):  # two orders' hashes collided: keep the first
            keep = np.ones(len(keys), dtype=bool)
            keep[1:] = keys[1:] != keys[:-1]
            order, keys = order[keep], keys[keep]
        return cls(keys, *(np.concatenate([p[i] for p in parts])[order] for i in (1, 2, 3)), max_n=max_n)

    @classmethod
    def empty(cls, max_n: int = MAX_N, top: int = TOP) -> CorpusIndex:
        return cls(np.zeros(0, np.uint64), np.zeros((0, top), np.int32), np.zeros((0, top), np.int32),
                   np.zeros(0, np.int32), max_n)

    # -- files ------------------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """A safetensors file (written aside and renamed, so a reader never sees half of one)."""
        from safetensors.numpy import save_file

        part = path.with_name(f"{path.name}.{os.getpid()}.part")  # two sessions may build at once
        save_file({"keys": self.keys, "tokens": self.tokens, "counts": self.counts, "totals": self.totals,
                   "slots": self.slots},
                  str(part), metadata={"max_n": str(self.max_n), "format": str(_FORMAT)})
        part.replace(path)

    @classmethod
    def load(cls, path: Path) -> CorpusIndex:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            if meta.get("format") != str(_FORMAT):
                raise ValueError(f"{path} is an n-gram index of another format; delete it to rebuild")
            arrays = {k: f.get_tensor(k) for k in ("keys", "tokens", "counts", "totals", "slots")}
        return cls(**arrays, max_n=int(meta["max_n"]))

    # -- drafting ---------------------------------------------------------------------------------
    def find(self, context: Sequence[int]) -> tuple[int, int]:
        """(row, order) of the longest n-gram ending ``context`` that the index holds; (-1, 0) if none."""
        hashes = context_hashes(context, self.max_n)
        if not hashes or not len(self.keys):
            return -1, 0
        rows = np.searchsorted(self.keys, np.array(hashes, dtype=np.uint64))
        for n in range(len(hashes), 0, -1):
            row = int(rows[n - 1])
            if row < len(self.keys) and int(self.keys[row]) == hashes[n - 1]:
                return row, n
        return -1, 0

    def continuations(self, context: Sequence[int]) -> list[tuple[int, float]]:
        """What followed the longest matching n-gram, most frequent first, with an estimate of
        the chance the target writes it next: its count over the n-gram's occurrences plus one,
        so a continuation seen 2 times in 2 reads 0.67, not certainty, and one seen 200 in 200 0.995."""
        row, _ = self.find(context)
        if row < 0:
            return []
        total = float(self.totals[row]) + 1.0
        return [(t, c / total) for t, c in zip(self.tokens[row].tolist(), self.counts[row].tolist(), strict=True)
                if t >= 0]

    def tree(self, history: Sequence[int], root: int, max_drafts: int, *, width: int | None = None,
             min_path: float = 0.02) -> DraftTree:
        """The ``max_drafts`` likeliest continuations of ``history + [root]`` as a tree, best first
        by path probability (each node's draft probability: its share after its parent's
        context), children limited to ``width`` per node and paths below ``min_path``. In our
        native kernel where it runs (corpus.c: the same tree, ~30x faster in the decode loop)."""
        tail = [int(t) for t in history[max(0, len(history) - self.max_n + 1):]] if self.max_n > 1 else []
        native = self._native_tree
        out = native([*tail, int(root)], max_drafts, width or 0, min_path) if native is not None else None
        if out is not None:
            return DraftTree(tuple(out[0]), tuple(out[1]), tuple(out[2]), source="corpus")
        return self.tree_python(tail, root, max_drafts, width=width, min_path=min_path)

    @cached_property
    def _native_tree(self) -> Callable[[list[int], int, int, float], Any] | None:
        """The native tree bound to this index (engine/kernels/native.py), or None without the kernel."""
        from engine.kernels import native

        kernel = native.load()  # cached there: one build and load per process
        if kernel is None:
            return None
        return kernel.corpus_tree((self.keys, self.slots, self.tokens, self.counts, self.totals), self.max_n)

    def tree_python(self, tail: list[int], root: int, max_drafts: int, *, width: int | None = None,
                    min_path: float = 0.02) -> DraftTree:
        """:meth:`tree` in Python (``tail``: the history's last max_n - 1 tokens): the reference."""
        tokens, parents, probs = [int(root)], [-1], [1.0]
        contexts = [[*tail, int(root)]]  # each node's last max_n tokens
        heap: list[tuple[float, int, int, int, float]] = []  # (-path p, tie, parent, token, p)
        tie = 0

        def expand(node: int, path: float) -> None:
            nonlocal tie
            for token, p in self.continuations(contexts[node])[:width or None]:
                if path * p >= min_path:
                    heapq.heappush(heap, (-path * p, tie, node, token, p))
                    tie += 1

        expand(0, 1.0)
        while heap and len(tokens) <= max_drafts:
            neg, _, parent, token, p = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            probs.append(p)
            contexts.append([*contexts[parent][1 - self.max_n:], token] if self.max_n > 1 else [token])
            if len(tokens) <= max_drafts:
                expand(len(tokens) - 1, -neg)
        return DraftTree(tuple(tokens), tuple(parents), tuple(probs), source="corpus")


def hash_slots(keys: np.ndarray) -> np.ndarray:
    """Linear-probing slots for ``keys`` (distinct uint64): a table of a power of two >= 2 x M
    entries, key k starting at its Fibonacci hash (the top bits of k * MUL), each holding a row or
    -1. Filled in rounds: every key still looking tries its next slot, the first of several to
    try a free one takes it (so the table is the same on every machine)."""
    bits = max(4, int(2 * max(len(keys), 1) - 1).bit_length())
    mask = (1 << bits) - 1
    slots = np.full(1 << bits, -1, dtype=np.int32)
    with np.errstate(over="ignore"):
        pos = ((keys * np.uint64(_MUL)) >> np.uint64(64 - bits)).astype(np.int64)
    waiting = np.arange(len(keys))
    while len(waiting):
        want = pos[waiting]
        free = np.flatnonzero(slots[want] == -1)
        taken, first = np.unique(want[free], return_index=True)
        slots[taken] = waiting[free[first]]
        won = np.zeros(len(waiting), dtype=bool)
        won[free[first]] = True
        waiting = waiting[~won]
        pos[waiting] = (pos[waiting] + 1) & mask
    return slots


def _top_continuations(keys: np.ndarray, nexts: np.ndarray, top: int, min_count: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct key: its ``top`` most frequent next tokens seen ``min_count`` times or more
    (ties: the smaller token id), their counts and the key's total; keys with none are dropped."""
    if not len(keys):
        return (np.zeros(0, np.uint64), np.zeros((0, top), np.int32), np.zeros((0, top), np.int32),
                np.zeros(0, np.int32))
    order = np.lexsort((nexts, keys))
    keys, nexts = keys[order], nexts[order]
    new_pair = np.ones(len(keys), dtype=bool)
    new_pair[1:] = (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])
    first = np.flatnonzero(new_pair)
    pair_keys, pair_next = keys[first], nexts[first]
    pair_count = np.diff(np.append(first, len(keys)))
    new_key = np.ones(len(pair_keys), dtype=bool)
    new_key[1:] = pair_keys[1:] != pair_keys[:-1]
    group = np.cumsum(new_key) - 1
    totals = np.bincount(group, weights=pair_count).astype(np.int64)
    # rank the pairs of each key by count (descending), ties by token id
    by_count = np.lexsort((pair_next, -pair_count, group))
    group_start = np.flatnonzero(new_key)
    rank = np.arange(len(by_count)) - group_start[group[by_count]]
    chosen = by_count[(rank < top) & (pair_count[by_count] >= min_count)]
    ranks = rank[(rank < top) & (pair_count[by_count] >= min_count)]
    kept_groups, row_of = np.unique(group[chosen], return_inverse=True)
    tokens = np.full((len(kept_groups), top), -1, dtype=np.int32)
    counts = np.zeros((len(kept_groups), top), dtype=np.int32)
    tokens[row_of, ranks] = pair_next[chosen]
    counts[row_of, ranks] = pair_count[chosen]
    return pair_keys[group_start[kept_groups]], tokens, counts, totals[kept_groups].astype(np.int32)


def index_name(files: Sequence[Path], *, max_n: int = MAX_N, top: int = TOP, min_count: int = MIN_COUNT) -> str:
    """A cache file name that changes whenever the corpus files or the build settings do."""
    digest = hashlib.sha256(f"{_FORMAT}:{max_n}:{top}:{min_count}".encode())
    for f in sorted(files):
        st = f.stat()
        digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"ngram-{digest.hexdigest()[:16]}.safetensors"
