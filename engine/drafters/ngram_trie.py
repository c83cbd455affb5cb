"""The counted trie of the conversation's n-grams that SGLang's NGRAM drafter matches and grows
trees from (engine/drafters/ngram.py drives it; docs/NGRAM.md has the design and its costs).

Node i spells the n-gram on its path and counts its occurrences; children are kept in recency
order, so BFS trees take the most recent continuations first and PROB trees rank them by count.
Flat arrays hold the nodes so that hundreds of thousands stay invisible to Python's cyclic GC.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from itertools import count, islice

from engine.tree import DraftTree

_ROOT = 0
_DEAD = -2  # parent id of a free (evicted) node slot



class NgramTrie:
    """Counts of every n-gram (n <= ``max_depth``) of a token stream, with LRU-leaf eviction.

    Node i (0 is the root) spells the n-gram on its path; ``_tok[i]``, ``_par[i]`` and
    ``_cnt[i]`` (occurrences) live in flat arrays and ``_kids[i]`` maps token -> child id in
    recency order (a touched child is re-inserted last). Flat int storage keeps hundreds of
    thousands of nodes invisible to Python's cyclic GC, which otherwise triples insert time.

    The stream is fed token by token. The *frontier* holds the nodes of the n-grams ending at the
    last token (lengths 1..max_depth-1); a new token adds one child below each, so a token costs
    O(max_depth) dict operations and a node's count is exactly the number of occurrences of its
    n-gram (eviction removes whole leaves; a truncation keeps what was counted).
    """

    def __init__(self, max_depth: int, capacity: int) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.max_depth = max_depth
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self._tok = array("q", [-1])
        self._par = array("q", [-1])
        self._cnt = array("q", [0])
        self._kids: list[dict[int, int] | None] = [{}]
        self._free: list[int] = []  # evicted slots, reused by new nodes
        self._evicted = False  # whether any node was ever evicted (match() says why it asks)
        self.size = 0  # live nodes, root excluded
        # Global LRU, oldest first. Every leaf is in it; an internal node may linger (it is
        # skipped when it reaches the front, and re-enters when it becomes a leaf again).
        self._lru: OrderedDict[int, None] = OrderedDict()
        # _frontier[k]: node of the (k+1)-gram ending at the last token; -1 if that path is gone.
        self._frontier: list[int] = []

    def __len__(self) -> int:
        return self.size

    # insertion --------------------------------------------------------------------------------
    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the stream: insert the n-grams ending at each of them."""
        push = self._push
        for t in tokens:
            push(t)

    def _new(self, t: int, p: int) -> int:
        if self._free:
            i = self._free.pop()
            self._tok[i] = t
            self._par[i] = p
            self._cnt[i] = 1
            self._kids[i] = None
        else:
            i = len(self._tok)
            self._tok.append(t)
            self._par.append(p)
            self._cnt.append(1)
            self._kids.append(None)
        self.size += 1
        self._lru[i] = None
        return i

    def _push(self, t: int) -> None:
        kids = self._kids
        cnt = self._cnt
        lru = self._lru
        # The root's children are never read in recency order (the root is never an anchor).
        rc = kids[_ROOT]
        c = rc.get(t)  # type: ignore[union-attr]
        if c is None:
            c = rc[t] = self._new(t, _ROOT)  # type: ignore[index]
        else:
            cnt[c] += 1
            if not kids[c]:
                lru.move_to_end(c)
        frontier = [c]
        for p in self._frontier:
            if p < 0:
                frontier.append(-1)
                continue
            ch = kids[p]
            if ch is None:
                ch = kids[p] = {}
            c = ch.pop(t, -1)
            if c < 0:
                c = self._new(t, p)
            else:
                cnt[c] += 1
                if not kids[c]:
                    lru.move_to_end(c)
            ch[t] = c  # (re)inserted last = most recent
            frontier.append(c)
        if len(frontier) >= self.max_depth:
            frontier.pop()  # a max_depth-gram is never extended
        self._frontier = frontier
        if self.size > self.capacity:
            self._evict(self.size - self.capacity)

    def set_capacity(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        if self.size > capacity:
            self._evict(self.size - capacity)

    def _evict(self, n: int) -> None:
        """Remove the ``n`` least recently used leaves (a parent left childless becomes the oldest)."""
        lru, kids, par, tok = self._lru, self._kids, self._par, self._tok
        self._evicted = True
        while n > 0 and lru:
            i, _ = lru.popitem(last=False)
            p = par[i]
            if kids[i] or p == _DEAD:
                continue  # internal now (younger than its newest child), or already gone
            del kids[p][tok[i]]  # type: ignore[index]
            par[i] = _DEAD
            kids[i] = None
            self._free.append(i)
            self.size -= 1
            n -= 1
            if p != _ROOT and not kids[p]:
                # Its last touch precedes its children's, so it is now the oldest leaf.
                lru[p] = None
                lru.move_to_end(p, last=False)
        # The frontier must not point at freed slots (they will be reused).
        self._frontier = [f if f >= 0 and par[f] != _DEAD else -1 for f in self._frontier]

    def rewind(self, tail: Sequence[int]) -> None:
        """The stream now ends with ``tail`` (after a truncation): recompute the frontier.

        n-grams already counted are kept (the cache is conversation-wide); future inserts
        continue from the new end.
        """
        tail = list(tail)[len(tail) - (self.max_depth - 1) :] if len(tail) >= self.max_depth else list(tail)
        n = len(tail)
        self._frontier = [self._find(tail[n - k :]) for k in range(1, n + 1)]

    # queries ----------------------------------------------------------------------------------
    def _find(self, ngram: Sequence[int]) -> int:
        kids = self._kids
        node = _ROOT
        for t in ngram:
            ch = kids[node]
            node = ch.get(t, -1) if ch else -1
            if node < 0:
                return -1
        return node

    def count(self, ngram: Sequence[int]) -> int:
        """Occurrences of ``ngram`` recorded (0 if absent or evicted)."""
        node = self._find(ngram)
        return 0 if node < 0 else self._cnt[node]

    def continuations(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """(token, count) of what followed ``context``, most recent first."""
        node = self._find(context)
        ch = self._kids[node] if node >= 0 else None
        if not ch:
            return []
        return [(t, self._cnt[c]) for t, c in reversed(ch.items())]

    def ngram_counts(self) -> dict[tuple[int, ...], int]:
        """Every stored n-gram and its count (tests and debugging; O(size))."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[int, tuple[int, ...]]] = [(_ROOT, ())]
        while stack:
            node, path = stack.pop()
            for t, c in (self._kids[node] or {}).items():
                p = (*path, t)
                out[p] = self._cnt[c]
                stack.append((c, p))
        return out

    def check(self) -> None:
        """Assert the structural invariants (tests only)."""
        n = 0
        stack = [_ROOT]
        while stack:
            node = stack.pop()
            for t, c in (self._kids[node] or {}).items():
                assert self._tok[c] == t and self._par[c] == node, "broken parent link"
                assert self._cnt[c] >= 1
                if not self._kids[c]:
                    assert c in self._lru, "a leaf is missing from the LRU"
                n += 1
                stack.append(c)
        assert n == self.size, f"size {self.size} != {n} live nodes"
        assert self.size <= self.capacity
        assert all(self._par[i] == _DEAD for i in self._free)
        assert len(self._frontier) < self.max_depth
        assert all(f < 0 or self._par[f] != _DEAD for f in self._frontier)

    def match(self, query: Sequence[int], min_window: int, max_window: int) -> list[tuple[int, int]]:
        """Anchors (node, window) for each suffix of ``query`` found, longest window first.

        Shortest first, stopping at the first window not found: every n-gram of the stream was
        inserted with all its suffixes, so no longer window can match past a shorter one that does
        not. Chat queries match a token or two, so this walks a few paths where trying every
        window from the longest walked 78 (~45 us a step). Eviction can break that closure (a
        suffix's leaf may go before a longer path's), so after one every window is tried."""
        kids = self._kids
        anchors = []
        n = len(query)
        for w in range(min_window, min(n, max_window) + 1):
            node = _ROOT
            for i in range(n - w, n):
                ch = kids[node]
                node = ch.get(query[i], -1) if ch else -1
                if node < 0:
                    break
            if node >= 0:
                anchors.append((node, w))
            elif not self._evicted:
                break
        anchors.reverse()
        return anchors

    # tree building ----------------------------------------------------------------------------
    def build_recency(
        self,
        anchors: list[tuple[int, int]],
        root: int,
        max_drafts: int,
        min_window: int,
        max_window: int,
        min_breadth: int,
        max_breadth: int,
    ) -> DraftTree:
        """SGLang ``BFS``: breadth-first from each anchor, most recent continuations first.

        An anchor matched with d tokens starts with breadth ``(max_window - d) * scale +
        min_breadth`` (``scale = (max_breadth - min_breadth) / (max_window - min_window + 1)``)
        and each level below has ``scale`` less; a node takes ``max(1, int(breadth))`` children.
        Paths already in the tree (from a longer anchor) are merged, never duplicated.
        """
        kids = self._kids
        tree = _MergedTree(root, max_drafts + 1)
        add = tree.add
        scale = (max_breadth - min_breadth) / (max_window - min_window + 1)
        for anchor, d in anchors:
            queue = deque(((0, (max_window - d) * scale + min_breadth, anchor),))
            while queue:
                pidx, breadth, tnode = queue.popleft()
                ch = kids[tnode]
                if not ch:
                    continue
                below = breadth - scale
                for t, child in islice(reversed(ch.items()), max(1, int(breadth))):
                    idx = add(pidx, t, 1.0)
                    if idx < 0:
                        return tree.done(has_probs=False)
                    queue.append((idx, below, child))
        return tree.done(has_probs=False)

    def build_frequency(
        self, anchors: list[tuple[int, int]], root: int, max_drafts: int, max_breadth: int
    ) -> DraftTree:
        """SGLang ``PROB``: best-first by estimated path probability, per anchor (longest first).

        A child's conditional probability is its count over the summed counts of its siblings
        (how often the context was followed by that token, among the recorded continuations).
        Only the ``max_breadth`` most frequent children of a node are expanded (ties: most
        recent first). ``draft_probs`` holds the conditional probability.
        """
        kids, cnt, tok = self._kids, self._cnt, self._tok
        by_count = cnt.__getitem__
        tree = _MergedTree(root, max_drafts + 1)
        add = tree.add
        seq = count()
        heap: list[tuple[float, int, int, int, float]] = []

        def push(pidx: int, tnode: int, score: float) -> None:
            ch = kids[tnode]
            if not ch:
                return
            if len(ch) == 1:  # the common case deep in the trie
                for c in ch.values():
                    heapq.heappush(heap, (-score, next(seq), pidx, c, 1.0))
                return
            vals = ch.values()
            total = sum(map(by_count, vals))
            if len(ch) <= max_breadth:  # stable sort: equal counts stay most recent first
                top = sorted(reversed(vals), key=by_count, reverse=True)
            else:
                top = heapq.nlargest(max_breadth, reversed(vals), key=by_count)
            for c in top:
                cond = cnt[c] / total
                heapq.heappush(heap, (-score * cond, next(seq), pidx, c, cond))

        for anchor, _ in anchors:
            heap.clear()
            push(0, anchor, 1.0)
            while heap:
                neg, _, pidx, tnode, cond = heapq.heappop(heap)
                idx = add(pidx, tok[tnode], cond)
                if idx < 0:
                    return tree.done()
                push(idx, tnode, -neg)
        return tree.done()


class _MergedTree:
    """A draft tree grown from several trie anchors: a node is keyed by (tree parent, token), so a
    path a longer anchor already drafted is walked, not added again; growth stops at ``limit``
    nodes (root included)."""

    __slots__ = ("index", "limit", "parents", "probs", "tokens")

    def __init__(self, root: int, limit: int) -> None:
        self.tokens = [root]
        self.parents = [-1]
        self.probs = [1.0]
        self.index: dict[tuple[int, int], int] = {}
        self.limit = limit

    def add(self, parent: int, token: int, prob: float) -> int:
        """The node for ``token`` under ``parent``: the one already there, else a new one; -1 once
        the new one filled the tree (build no further)."""
        key = (parent, token)
        idx = self.index.get(key)
        if idx is None:
            idx = self.index[key] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.probs.append(prob)
            if idx + 1 >= self.limit:
                return -1
        return idx

    def done(self, has_probs: bool = True) -> DraftTree:
        return DraftTree(tuple(self.tokens), tuple(self.parents), tuple(self.probs), has_probs=has_probs)
