"""N-gram drafting from the conversation's own tokens: no draft model, no features.

Two modes, picked per step by ``config.ngram_mode``:

* ``"tree"`` follows SGLang's NGRAM drafter. A trie holds every n-gram of up to
  ``ngram_max_trie_depth`` tokens seen in this conversation, with its count. The query (the last
  ``ngram_max_match_window_size`` tokens of history + [root]) is matched for every window size
  from the longest down to ``ngram_min_match_window_size``; each matched trie node is an anchor.
  From each anchor, longest first, the tree grows breadth-first over the recorded continuations
  (``"BFS"``: most recent first, breadth scaled so longer matches branch less) or best-first by
  frequency (``"PROB"``), merging identical paths, until ``num_draft_tokens - 1`` drafts exist.
* ``"chain"`` is prompt lookup (transformers / vLLM): the most recent earlier occurrence of the
  longest matching suffix n-gram, and the tokens that followed it, as one chain.

Where the conversation offers no match, a corpus of the model's own answers drafts instead when
one is loaded and ``config.ngram_corpus`` is on (engine/drafters/ngram_corpus.py says why; its
tree carries the corpus's probabilities, so the adaptive budget prices each node by them); where
it matches one token only, whichever of the two has been drafting better in this conversation
(engine/drafters/ngram_source.py).

Both structures are kept incrementally: the drafter mirrors the tokens in the target cache
(``reset`` / ``observe`` / ``truncate``) and inserts only what is new. Only the structure of the
mode in use is updated eagerly; the other catches up the first time its mode is used. See
docs/NGRAM.md for the design and the measured costs (``scripts/bench_ngram.py``).
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from itertools import count, islice
from typing import TYPE_CHECKING, Protocol

from engine.config import SpecConfig
from engine.drafters.ngram_chain import ChainIndex
from engine.drafters.ngram_source import SourceChoice
from engine.prefix import common_prefix
from engine.tree import DraftTree

if TYPE_CHECKING:
    import torch

    from engine.drafters.ngram_corpus import CorpusIndex
    from engine.drafters.tree_search import StopRule
    from engine.sampling import GumbelNoise

__all__ = ["ChainIndex", "NgramDrafter", "NgramTrie"]

# a conversation match shorter than this many tokens (the root alone) may defer to the corpus
# (session 30's replay of MT-bench answers, chains of 2: 1.38 tokens a step from the conversation
# alone, 1.64 with the corpus drafting where it matched one token or none; docs/BENCHMARKS.md);
# at a one-token match the conversation's own record decides (engine/drafters/ngram_source.py)
_CORPUS_BELOW = 2

_ROOT = 0
_DEAD = -2  # parent id of a free (evicted) node slot


def _as_list(tokens: Sequence[int] | Iterable[int]) -> list[int]:
    """A fresh list of Python ints (accepts lists, tuples, numpy arrays and 1-D tensors)."""
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        return list(tolist())
    return list(tokens)


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
        tokens = [root]
        parents = [-1]
        index: dict[tuple[int, int], int] = {}  # (tree parent, token) -> tree node
        limit = max_drafts + 1
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
                    key = (pidx, t)
                    idx = index.get(key)
                    if idx is None:
                        idx = index[key] = len(tokens)
                        tokens.append(t)
                        parents.append(pidx)
                        if len(tokens) >= limit:
                            return DraftTree(tuple(tokens), tuple(parents), (1.0,) * limit, has_probs=False)
                    queue.append((idx, below, child))
        return DraftTree(tuple(tokens), tuple(parents), (1.0,) * len(tokens), has_probs=False)

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
        tokens = [root]
        parents = [-1]
        probs = [1.0]
        index: dict[tuple[int, int], int] = {}
        limit = max_drafts + 1
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
                t = tok[tnode]
                key = (pidx, t)
                idx = index.get(key)
                if idx is None:
                    idx = index[key] = len(tokens)
                    tokens.append(t)
                    parents.append(pidx)
                    probs.append(cond)
                    if len(tokens) >= limit:
                        return DraftTree(tuple(tokens), tuple(parents), tuple(probs))
                push(idx, tnode, -neg)
        return DraftTree(tuple(tokens), tuple(parents), tuple(probs))


class NgramDrafter:
    """The n-gram drafter (SGLang NGRAM tree, or prompt-lookup chain); see the module docstring.

    ``config`` only seeds the structure sizes; every ``propose`` applies the config it is given
    (window, breadth, depth, capacity and mode may change between steps).
    ``extrapolate_chain``: in chain mode, when the match is so recent that the known
    continuation runs into the root, keep copying with the same period (``a b c a b`` ->
    ``c a b c ...``), LZ77-style, instead of stopping at the root.
    """

    name = "ngram"
    needs_features = False
    pays_per_level = False  # a lookup: every level costs the same (nothing)

    def __init__(self, config: SpecConfig | None = None, *, extrapolate_chain: bool = True,
                 corpus: _HasIndex | None = None) -> None:
        cfg = config if config is not None else SpecConfig(method="ngram")
        self.extrapolate_chain = extrapolate_chain
        self.corpus = corpus  # the model's own answers (a CorpusHandle: its index may still be building)
        self._tokens: list[int] = []
        self._trie = NgramTrie(cfg.ngram_max_trie_depth, cfg.ngram_capacity)
        self._trie_len = 0  # tokens of self._tokens inserted in the trie
        self._index = ChainIndex(cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size)
        self._mode = cfg.ngram_mode  # the structure observe() keeps up to date eagerly
        self._source = SourceChoice()  # conversation or corpus, at one-token matches

    # state ------------------------------------------------------------------------------------
    @property
    def tokens(self) -> list[int]:
        """The drafter's copy of the tokens in the target cache (read-only by convention)."""
        return self._tokens

    @property
    def trie(self) -> NgramTrie:
        self._sync_trie()
        return self._trie

    @property
    def chain_index(self) -> ChainIndex:
        self._sync_index()
        return self._index

    def check(self, config: SpecConfig) -> None:
        pass  # every valid SpecConfig is one the n-gram drafter can run

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Start an answer with ``history`` = the tokens now in the target cache.

        * ``history`` extends what the drafter holds: only the new tokens are inserted (the
          cache spans the whole conversation).
        * It shares a prefix but then differs (the session re-rendered the prompt and reused
          only part of its cache, without calling :meth:`truncate`): truncate to the common
          prefix, then insert the rest. The trie keeps what it counted, as after ``truncate``.
        * It shares nothing with a non-empty history: a new conversation, so clear and rebuild.
        """
        hist = _as_list(history)
        self._source.forget()  # a new turn: the tokens after the last pair's root are the user's
        held = self._tokens
        n = len(held)
        if len(hist) >= n and hist[:n] == held:
            held.extend(hist[n:])
        else:
            p = common_prefix(hist, held)
            if p == 0:
                self.clear()
                self._tokens = hist
            else:
                self.truncate(p)
                self._tokens.extend(hist[p:])
        self._sync()

    def clear(self) -> None:
        """Forget everything (tokens, trie and chain index)."""
        self._tokens = []
        self._source.forget()
        self._trie.clear()
        self._trie_len = 0
        self._index.clear()

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        self._tokens.extend(_as_list(committed))
        self._sync()

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens. The trie keeps the n-grams it
        counted (they were real text); the chain index forgets the cut positions exactly."""
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if length >= len(self._tokens):
            return
        self._source.forget()
        self._index.truncate(self._tokens, length)
        del self._tokens[length:]
        if self._trie_len > length:
            self._trie_len = length
            self._trie.rewind(self._tokens[max(0, length - self._trie.max_depth + 1) :])

    def _sync(self) -> None:
        if self._mode == "chain":
            self._sync_index()
        else:
            self._sync_trie()

    def _sync_trie(self) -> None:
        if self._trie_len < len(self._tokens):
            self._trie.extend(self._tokens[self._trie_len :])
            self._trie_len = len(self._tokens)

    def _sync_index(self) -> None:
        if self._index.length < len(self._tokens):
            self._index.extend(self._tokens, len(self._tokens))

    def _apply(self, config: SpecConfig) -> None:
        """Adopt ``config``'s structure settings (cheap when nothing changed)."""
        self._mode = config.ngram_mode
        if config.ngram_mode == "chain":
            lo, hi = config.ngram_min_match_window_size, config.ngram_max_match_window_size
            if (self._index.min_n, self._index.max_n) != (lo, hi):
                self._index = ChainIndex(lo, hi)
            return
        trie = self._trie
        if trie.max_depth != config.ngram_max_trie_depth:
            # A different depth changes every stored path: rebuild from the tokens we hold.
            self._trie = NgramTrie(config.ngram_max_trie_depth, config.ngram_capacity)
            self._trie_len = 0
        elif trie.capacity != config.ngram_capacity:
            trie.set_capacity(config.ngram_capacity)

    # drafting ---------------------------------------------------------------------------------
    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        """The tree (or chain) ``config`` asks for; ``noise`` and ``stop`` do not apply to a lookup."""
        if len(history) != len(self._tokens):  # a missed observe/reset: resynchronise
            self.reset(history)
        self._apply(config)
        max_drafts = config.num_draft_tokens - 1
        root = int(root)
        self._source.score(self._tokens, root)
        if config.ngram_mode == "chain":
            self._sync_index()
            hit = self._index.lookup(self._tokens, root)
            return self._pick(root, max_drafts, config, hit[1] if hit is not None else 0,
                              lambda: self._chain_from(root, max_drafts, hit))
        self._sync_trie()
        tokens = self._tokens
        w = config.ngram_max_match_window_size
        query = tokens[max(0, len(tokens) - w + 1) :]
        query.append(root)
        anchors = self._trie.match(query, config.ngram_min_match_window_size, w)
        return self._pick(root, max_drafts, config, anchors[0][1] if anchors else 0,
                          lambda: self._tree_from(root, max_drafts, config, anchors))

    def _pick(self, root: int, max_drafts: int, config: SpecConfig, matched: int,
              conversation: Callable[[], DraftTree]) -> DraftTree:
        """The conversation's tree (built by ``conversation``) where it matched ``_CORPUS_BELOW``
        tokens or more; the corpus's where the conversation matched nothing; at a one-token match
        whichever :class:`SourceChoice` has seen drafting better in this conversation."""
        corpus = self._from_corpus(root, max_drafts, config, matched)
        if corpus is None:
            return conversation()
        if matched == 0:
            return corpus
        own = conversation()
        return self._source.choose(len(self._tokens), own, corpus) if len(own) > 1 else corpus

    def _tree_from(self, root: int, max_drafts: int, config: SpecConfig, anchors: list[tuple[int, int]]) -> DraftTree:
        if not anchors:
            return DraftTree.root_only(root)
        if config.ngram_match_type == "PROB":
            return self._trie.build_frequency(anchors, root, max_drafts, config.ngram_max_bfs_breadth)
        return self._trie.build_recency(
            anchors,
            root,
            max_drafts,
            config.ngram_min_match_window_size,
            config.ngram_max_match_window_size,
            config.ngram_min_bfs_breadth,
            config.ngram_max_bfs_breadth,
        )

    def _from_corpus(self, root: int, max_drafts: int, config: SpecConfig, matched: int) -> DraftTree | None:
        """The corpus's tree where the conversation matched fewer than ``_CORPUS_BELOW`` tokens
        (a chain in chain mode); None where it has nothing, is off, or is still being indexed."""
        index = self.corpus.index if self.corpus is not None and config.ngram_corpus else None
        if index is None or matched >= _CORPUS_BELOW:
            return None
        tree = index.tree(self._tokens, root, max_drafts, width=1 if config.ngram_mode == "chain" else None)
        return tree if len(tree) > 1 else None

    def _chain_from(self, root: int, max_drafts: int, hit: tuple[int, int] | None) -> DraftTree:
        """Prompt lookup's chain: what followed the most recent earlier occurrence of the matched suffix."""
        if hit is None:
            return DraftTree.root_only(root)
        tokens = self._tokens
        start = hit[0] + 1  # the first token after the occurrence; <= len(tokens)
        drafts = tokens[start : start + max_drafts]
        if len(drafts) < max_drafts:
            drafts.append(root)  # the occurrence's continuation reaches the query itself
            if self.extrapolate_chain:
                period = len(drafts)
                drafts = (drafts * (max_drafts // period + 1))[:max_drafts]
        chain = DraftTree.chain(root, drafts)
        return DraftTree(chain.tokens, chain.parents, chain.draft_probs, chain.depths, has_probs=False)


class _HasIndex(Protocol):
    """What the drafter reads of a corpus (engine/drafters/corpus_files.py's CorpusHandle)."""

    index: CorpusIndex | None
