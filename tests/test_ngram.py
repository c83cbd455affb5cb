"""The n-gram drafter: trie semantics, tree building, chain lookup, cache maintenance.

Fast and model-free. The reference functions below recompute everything by brute force from the
token list (n-gram counts, last occurrences), so the incremental structures are checked against
an independent model rather than against themselves.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SpecConfig
from engine.drafters.ngram import ChainIndex, NgramDrafter, NgramTrie
from engine.tree import DraftTree

# --- brute-force reference ------------------------------------------------------------------------


def ngram_counts(tokens: list[int], max_n: int) -> Counter:
    c: Counter = Counter()
    for i in range(len(tokens)):
        for n in range(1, min(max_n, i + 1) + 1):
            c[tuple(tokens[i - n + 1 : i + 1])] += 1
    return c


def last_ends(tokens: list[int], max_n: int) -> dict[tuple[int, ...], int]:
    last: dict[tuple[int, ...], int] = {}
    for i in range(len(tokens)):
        for n in range(1, min(max_n, i + 1) + 1):
            last[tuple(tokens[i - n + 1 : i + 1])] = i
    return last


class RefTrie:
    """The trie an exact SGLang-style cache would hold, from scratch: children by recency."""

    def __init__(self, tokens: list[int], depth: int) -> None:
        self.depth = depth
        self.counts = ngram_counts(tokens, depth)
        self.last = last_ends(tokens, depth)
        self.kids: dict[tuple[int, ...], list[int]] = {}
        for g in self.counts:
            self.kids.setdefault(g[:-1], []).append(g[-1])
        for ctx, toks in self.kids.items():
            toks.sort(key=lambda t, ctx=ctx: -self.last[(*ctx, t)])  # most recent first

    def children(self, ctx: tuple[int, ...]) -> list[int]:
        return self.kids.get(ctx, [])

    def anchors(self, query: list[int], lo: int, hi: int) -> list[tuple[tuple[int, ...], int]]:
        out = []
        for w in range(min(len(query), hi), lo - 1, -1):
            g = tuple(query[len(query) - w :])
            if g in self.counts:
                out.append((g, w))
        return out


def ref_recency(ref: RefTrie, query: list[int], root: int, cfg: SpecConfig) -> list[tuple[int, ...]]:
    """SGLang BFS, written over token paths: returns the draft paths in node order."""
    lo, hi = cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size
    scale = (cfg.ngram_max_bfs_breadth - cfg.ngram_min_bfs_breadth) / (hi - lo + 1)
    paths: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for ctx, d in ref.anchors(query, lo, hi):
        q = deque([((), (hi - d) * scale + cfg.ngram_min_bfs_breadth, ctx)])
        while q:
            path, breadth, c = q.popleft()
            for t in ref.children(c)[: max(1, int(breadth))]:
                p = (*path, t)
                if p not in seen:
                    seen.add(p)
                    paths.append(p)
                    if len(paths) == cfg.num_draft_tokens - 1:
                        return paths
                q.append((p, breadth - scale, (*c, t)))
    return paths


def ref_frequency(ref: RefTrie, query: list[int], root: int, cfg: SpecConfig) -> list[tuple[tuple[int, ...], float]]:
    lo, hi = cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size
    out: list[tuple[tuple[int, ...], float]] = []
    seen: set[tuple[int, ...]] = set()
    tie = itertools.count()
    for ctx, _ in ref.anchors(query, lo, hi):
        heap: list = []

        def push(path, c, score, heap=heap):
            kids = ref.children(c)
            total = sum(ref.counts[(*c, t)] for t in kids)
            ranked = sorted(kids, key=lambda t, c=c: -ref.counts[(*c, t)])[: cfg.ngram_max_bfs_breadth]
            for t in ranked:
                cond = ref.counts[(*c, t)] / total
                heapq.heappush(heap, (-score * cond, next(tie), path, c, t, cond))

        push((), ctx, 1.0)
        while heap:
            neg, _, path, c, t, cond = heapq.heappop(heap)
            p = (*path, t)
            if p not in seen:
                seen.add(p)
                out.append((p, cond))
                if len(out) == cfg.num_draft_tokens - 1:
                    return out
            push(p, (*c, t), -neg)
    return out


def ref_chain(tokens: list[int], root: int, cfg: SpecConfig) -> list[int]:
    s = [*tokens, root]
    for n in range(min(cfg.ngram_max_match_window_size, len(s)), cfg.ngram_min_match_window_size - 1, -1):
        for e in range(len(tokens) - 1, n - 2, -1):  # most recent first, inside tokens
            if s[e - n + 1 : e + 1] == s[len(s) - n :]:
                out = []
                j = e + 1
                while len(out) < cfg.num_draft_tokens - 1:
                    out.append(s[j] if j < len(s) else out[j - len(s)])
                    j += 1
                return out
    return []


def paths(tree: DraftTree) -> list[tuple[int, ...]]:
    return [tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(1, len(tree))]


def trie_dump(trie: NgramTrie) -> dict[tuple[int, ...], tuple[int, tuple[int, ...]]]:
    """Every n-gram -> (count, continuation tokens most recent first)."""
    return {g: (c, tuple(t for t, _ in trie.continuations(g))) for g, c in trie.ngram_counts().items()}


def assert_valid(tree: DraftTree, root: int, cfg: SpecConfig) -> None:
    assert tree.tokens[0] == root and tree.parents[0] == -1
    assert 1 <= len(tree) <= cfg.num_draft_tokens
    for i in range(1, len(tree)):
        assert 0 <= tree.parents[i] < i
        assert 0.0 < tree.draft_probs[i] <= 1.0
    for kids in tree.children():
        toks = [tree.tokens[k] for k in kids]
        assert len(toks) == len(set(toks)), "duplicate siblings"
    DraftTree.from_dict(tree.to_dict())  # round-trips through the constructor's checks


def cfg_of(**kw) -> SpecConfig:
    return SpecConfig(method="ngram", **kw)


# --- strategies -------------------------------------------------------------------------------------

token_lists = st.lists(st.integers(0, 4), max_size=60)


@st.composite
def ngram_configs(draw, modes=("tree",)):
    depth = draw(st.integers(2, 7))
    hi = draw(st.integers(1, depth - 1))
    lo = draw(st.integers(1, hi))
    bmin = draw(st.integers(1, 3))
    bmax = draw(st.integers(bmin, 5))
    return cfg_of(
        num_draft_tokens=draw(st.integers(2, 20)),
        ngram_max_trie_depth=depth,
        ngram_max_match_window_size=hi,
        ngram_min_match_window_size=lo,
        ngram_min_bfs_breadth=bmin,
        ngram_max_bfs_breadth=bmax,
        ngram_match_type=draw(st.sampled_from(["BFS", "PROB"])),
        ngram_mode=draw(st.sampled_from(modes)),
    )


def chunks(draw, seq: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(seq):
        k = draw(st.integers(1, 10))
        out.append(seq[i : i + k])
        i += k
    return out


# --- the trie ---------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(tokens=token_lists, depth=st.integers(2, 7))
def test_trie_matches_bruteforce_counts_and_recency(tokens, depth):
    trie = NgramTrie(depth, capacity=10**6)
    trie.extend(tokens)
    trie.check()
    ref = RefTrie(tokens, depth)
    assert trie.ngram_counts() == dict(ref.counts)
    for ctx in {g[:-1] for g in ref.counts} - {()}:  # (the root is never an anchor: unordered)
        assert [t for t, _ in trie.continuations(ctx)] == ref.children(ctx)
    assert len(trie) == len(ref.counts)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), tokens=token_lists, depth=st.integers(2, 7), capacity=st.integers(1, 40))
def test_incremental_insert_equals_batch_insert(data, tokens, depth, capacity):
    batch = NgramTrie(depth, capacity)
    batch.extend(tokens)
    inc = NgramTrie(depth, capacity)
    for part in chunks(data.draw, tokens):
        inc.extend(part)
        inc.check()
    assert trie_dump(inc) == trie_dump(batch)
    assert list(inc._lru) == list(batch._lru)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), tokens=token_lists, cfg=ngram_configs(modes=("tree", "chain")))
def test_drafter_incremental_equals_batch(data, tokens, cfg):
    """reset + observe in random chunks (with proposals in between) == one reset with it all."""
    split = data.draw(st.integers(0, len(tokens)))
    inc = NgramDrafter(cfg)
    inc.reset(tokens[:split])
    for part in chunks(data.draw, tokens[split:]):
        inc.propose(inc.tokens, part[0], cfg)
        inc.observe(part)
    batch = NgramDrafter(cfg)
    batch.reset(tokens)
    assert inc.tokens == batch.tokens == tokens
    assert trie_dump(inc.trie) == trie_dump(batch.trie)
    assert inc.chain_index.last == batch.chain_index.last
    for root in range(5):
        assert inc.propose(tokens, root, cfg) == batch.propose(tokens, root, cfg)


def test_capacity_bounds_nodes_and_evicts_least_recent():
    trie = NgramTrie(max_depth=4, capacity=60)
    old = list(range(100, 130))
    trie.extend(old)
    rng = random.Random(0)
    for _ in range(50):
        trie.extend(rng.choices(range(10), k=rng.randint(1, 10)))
        assert len(trie) <= 60
        trie.check()
    recent = list(range(200, 210))
    trie.extend(recent)
    trie.check()
    assert trie.count([100, 101]) == 0 and trie.count([100]) == 0  # the oldest went first
    assert all(trie.count(recent[i : i + 3]) == 1 for i in range(len(recent) - 2))  # newest kept


@settings(max_examples=150, deadline=None)
@given(data=st.data(), cfg=ngram_configs(), capacity=st.integers(1, 30))
def test_eviction_and_rewind_keep_trees_valid_and_sound(data, cfg, capacity):
    """Tiny capacities, truncations (rewind) and inserts interleaved: every tree stays valid and
    only ever drafts n-grams that really occurred."""
    depth = cfg.ngram_max_trie_depth
    trie = NgramTrie(depth, capacity)
    stream: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for _ in range(data.draw(st.integers(1, 8))):
        if stream and data.draw(st.booleans()):
            cut = data.draw(st.integers(0, len(stream)))
            del stream[cut:]
            trie.rewind(stream)
        part = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=15))
        stream += part
        trie.extend(part)
        trie.check()
        seen |= set(ngram_counts(stream, depth))
        assert set(trie.ngram_counts()) <= seen
        root = data.draw(st.integers(0, 4))
        hi, lo = cfg.ngram_max_match_window_size, cfg.ngram_min_match_window_size
        query = [*stream[max(0, len(stream) - hi + 1) :], root]
        anchors = trie.match(query, lo, hi)
        for tree in (
            trie.build_recency(anchors, root, cfg.num_draft_tokens - 1, lo, hi, 1, cfg.ngram_max_bfs_breadth),
            trie.build_frequency(anchors, root, cfg.num_draft_tokens - 1, cfg.ngram_max_bfs_breadth),
        ):
            assert_valid(tree, root, cfg)
            for p in paths(tree):
                assert any((*query[len(query) - w :], *p) in seen for w in range(lo, min(hi, len(query)) + 1))


@settings(max_examples=80, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60), tail=st.lists(st.integers(0, 5), max_size=14),
       capacity=st.sampled_from([8, 30, 10_000]), lo=st.integers(1, 3), hi=st.integers(3, 12))
def test_match_finds_every_matching_window_longest_first(tokens, tail, capacity, lo, hi):
    """The shortest-first walk that stops at the first miss finds what trying every window finds,
    evicting tries included (they try every window)."""
    trie = NgramTrie(8, capacity)
    trie.extend(tokens)
    query = [*tokens, *tail][-hi:]
    want = []
    for w in range(min(len(query), hi), lo - 1, -1):
        node = trie._find(query[len(query) - w:])
        if node >= 0:
            want.append((node, w))
    assert trie.match(query, lo, hi) == want


def test_drafter_capacity_from_config_and_hot_swap():
    cfg = cfg_of(ngram_capacity=1000, ngram_max_trie_depth=8, ngram_max_match_window_size=4)
    d = NgramDrafter(cfg)
    rng = random.Random(1)
    d.reset(rng.choices(range(50), k=100))
    for _ in range(200):
        d.propose(d.tokens, rng.randrange(50), cfg)
        d.observe(rng.choices(range(50), k=rng.randint(1, 8)))
        assert len(d.trie) <= 1000
    d.trie.check()
    smaller = cfg.replace(ngram_capacity=1000, ngram_max_trie_depth=5)
    d.propose(d.tokens, 3, smaller)
    assert max(map(len, d.trie.ngram_counts())) == 5  # rebuilt at the new depth
    assert len(d.trie) <= 1000


# --- tree mode --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(tokens=token_lists, root=st.integers(0, 4), cfg=ngram_configs())
def test_tree_matches_reference_and_is_valid(tokens, root, cfg):
    d = NgramDrafter(cfg)
    d.reset(tokens)
    tree = d.propose(tokens, root, cfg)
    assert_valid(tree, root, cfg)
    ref = RefTrie(tokens, cfg.ngram_max_trie_depth)
    hi = cfg.ngram_max_match_window_size
    query = [*tokens[max(0, len(tokens) - hi + 1) :], root]
    if cfg.ngram_match_type == "BFS":
        assert paths(tree) == ref_recency(ref, query, root, cfg)
        assert all(p == 1.0 for p in tree.draft_probs)
    else:
        want = ref_frequency(ref, query, root, cfg)
        assert paths(tree) == [p for p, _ in want]
        assert list(tree.draft_probs[1:]) == pytest.approx([q for _, q in want])
    # Soundness: every drafted path really followed some matched suffix, within the trie depth.
    for p in paths(tree):
        assert any(
            len(query[len(query) - w :]) + len(p) <= cfg.ngram_max_trie_depth
            and ref.counts[(*query[len(query) - w :], *p)] > 0
            for w in range(cfg.ngram_min_match_window_size, min(hi, len(query)) + 1)
        ), (tokens, p)


def test_repetitive_sequence_gives_the_cycle():
    cfg = cfg_of(num_draft_tokens=8)
    history = [1, 2, 3, 4] * 2 + [1, 2, 3]
    d = NgramDrafter(cfg)
    d.reset(history)
    tree = d.propose(history, 4, cfg)
    assert tree.is_chain
    assert tree.tokens == (4, 1, 2, 3, 4, 1, 2, 3)
    prob = d.propose(history, 4, cfg.replace(ngram_match_type="PROB"))
    assert prob.tokens == tree.tokens and prob.is_chain


def test_breadth_is_recency_ordered_and_limited():
    # context 9 was followed by 1..6; 6 is the most recent
    history = [9, 1, 9, 2, 9, 3, 9, 4, 9, 5, 9, 6, 7]
    base = cfg_of(
        num_draft_tokens=16,
        ngram_max_trie_depth=4,
        ngram_min_match_window_size=1,
        ngram_max_match_window_size=3,
        ngram_min_bfs_breadth=1,
        ngram_max_bfs_breadth=4,
    )
    d = NgramDrafter(base)
    d.reset(history)

    def first_level(cfg):
        tree = d.propose(history, 9, cfg)
        return [tree.tokens[k] for k in tree.children()[0]]

    # only the 1-token window matches: breadth (3 - 1) * 1 + 1 = 3
    assert first_level(base) == [6, 5, 4]
    assert first_level(base.replace(ngram_max_bfs_breadth=1)) == [6]
    assert first_level(base.replace(ngram_max_bfs_breadth=10, ngram_min_bfs_breadth=10)) == [6, 5, 4, 3, 2, 1]
    assert len(d.propose(history, 9, base.replace(num_draft_tokens=3))) == 3


def test_longer_matches_branch_less_and_merge():
    # [5, 1] was followed by 10, 11, 12; [1] also by 13 and 14 (most recent)
    history = [5, 1, 10, 5, 1, 11, 5, 1, 12, 2, 1, 13, 2, 1, 14, 3, 5]
    cfg = cfg_of(
        num_draft_tokens=16,
        ngram_max_trie_depth=3,
        ngram_min_match_window_size=1,
        ngram_max_match_window_size=2,
        ngram_min_bfs_breadth=1,
        ngram_max_bfs_breadth=4,
    )
    d = NgramDrafter(cfg)
    d.reset(history)
    tree = d.propose(history, 1, cfg)
    assert_valid(tree, 1, cfg)
    # window 2 ([5, 1]): breadth 1 -> 12; window 1 ([1]): breadth int(2.5) = 2 -> 14, 13.
    assert [tree.tokens[k] for k in tree.children()[0]] == [12, 14, 13]


def test_prob_orders_by_frequency_with_count_ratios():
    history = [7, 1, 7, 2, 7, 1, 7, 2, 7, 1, 7, 3, 8]
    cfg = cfg_of(
        num_draft_tokens=16,
        ngram_max_trie_depth=3,
        ngram_max_match_window_size=2,
        ngram_match_type="PROB",
    )
    d = NgramDrafter(cfg)
    d.reset(history)
    tree = d.propose(history, 7, cfg)
    assert_valid(tree, 7, cfg)
    first = tree.children()[0]
    assert [tree.tokens[k] for k in first] == [1, 2, 3]
    assert [tree.draft_probs[k] for k in first] == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    # best-first: the sure continuation of the likeliest branch comes before the second branch
    assert tree.tokens[:4] == (7, 1, 7, 2)


def test_no_match_short_and_empty_history():
    cfg = cfg_of(num_draft_tokens=8)
    d = NgramDrafter(cfg)
    d.reset([])
    assert d.propose([], 5, cfg) == DraftTree.root_only(5)
    d.observe([5])
    assert d.propose([5], 5, cfg) == DraftTree.root_only(5)  # [5] seen, but nothing after it
    d.observe([5])
    assert d.propose([5, 5], 6, cfg) == DraftTree.root_only(6)  # 6 never seen
    assert d.propose([5, 5], 5, cfg).tokens == (5, 5)
    d.observe([6])
    # after [5] came 5 then (most recently) 6: both become children of the root, 6 first
    assert d.propose([5, 5, 6], 5, cfg).tokens == (5, 6, 5, 6)
    for mode in ("tree", "chain"):
        c = cfg.replace(ngram_mode=mode, num_draft_tokens=2)
        assert d.propose([5, 5, 6], 5, c).num_drafts == 1


# --- chain mode -------------------------------------------------------------------------------------


def test_chain_prefers_longest_window_then_most_recent():
    cfg = cfg_of(ngram_mode="chain", num_draft_tokens=4, ngram_max_match_window_size=3)
    # [8, 1] -> 20 (old, longer match), [1] -> 30 (more recent, shorter)
    history = [8, 1, 20, 21, 22, 0, 1, 30, 31, 32, 0, 8]
    d = NgramDrafter(cfg)
    d.reset(history)
    assert d.propose(history, 1, cfg).tokens == (1, 20, 21, 22)
    # two equally long matches: the most recent wins
    history2 = [4, 5, 40, 41, 42, 4, 5, 50, 51, 52, 4]
    d.reset(history2)
    assert d.propose(history2, 5, cfg).tokens == (5, 50, 51, 52)
    # the minimum window is respected
    strict = cfg.replace(ngram_min_match_window_size=3)
    assert d.propose(history2, 5, strict) == DraftTree.root_only(5)


def test_chain_extrapolates_a_recent_period():
    cfg = cfg_of(ngram_mode="chain", num_draft_tokens=8)
    history = [1, 2, 3, 1, 2]
    d = NgramDrafter(cfg)
    d.reset(history)
    assert d.propose(history, 3, cfg).tokens == (3, 1, 2, 3, 1, 2, 3, 1)
    plain = NgramDrafter(cfg, extrapolate_chain=False)
    plain.reset(history)
    assert plain.propose(history, 3, cfg).tokens == (3, 1, 2, 3)  # stops at the known text


@settings(max_examples=200, deadline=None)
@given(tokens=token_lists, root=st.integers(0, 4), cfg=ngram_configs(modes=("chain",)))
def test_chain_matches_reference(tokens, root, cfg):
    d = NgramDrafter(cfg)
    d.reset(tokens)
    tree = d.propose(tokens, root, cfg)
    assert_valid(tree, root, cfg)
    assert tree.is_chain
    assert list(tree.tokens[1:]) == ref_chain(tokens, root, cfg)


@settings(max_examples=150, deadline=None)
@given(tokens=token_lists, cut=st.integers(0, 60), lo=st.integers(1, 3), extra=st.integers(0, 3))
def test_chain_index_truncate_equals_rebuild(tokens, cut, lo, extra):
    cut = min(cut, len(tokens))
    idx = ChainIndex(lo, lo + extra)
    idx.extend(tokens, len(tokens))
    idx.truncate(tokens, cut)
    fresh = ChainIndex(lo, lo + extra)
    fresh.extend(tokens, cut)
    assert idx.last == fresh.last and idx._prev == fresh._prev and idx.length == cut


# --- reset / truncate / protocol --------------------------------------------------------------------


def test_reset_keeps_a_conversation_wide_cache():
    cfg = cfg_of(num_draft_tokens=6)
    d = NgramDrafter(cfg)
    turn1 = [1, 2, 3, 4, 5]
    d.reset(turn1)
    d.observe([6, 7, 8])  # the answer
    turn2 = [*turn1, 6, 7, 8, 9, 1, 2]  # the next prompt extends the history
    d.reset(turn2)
    fresh = NgramDrafter(cfg)
    fresh.reset(turn2)
    assert trie_dump(d.trie) == trie_dump(fresh.trie)
    assert d.propose(turn2, 3, cfg).tokens == (3, 4, 5, 6, 7, 8)

    # a re-rendered prompt that differs after a shared prefix: keep what was counted
    rerendered = [1, 2, 3, 4, 5, 66, 9]
    d.reset(rerendered)
    assert d.tokens == rerendered
    assert d.trie.count([7, 8, 9]) == 1  # the earlier answer is still in the cache
    assert d.trie.count([5, 66, 9]) == 1
    fresh_idx = ChainIndex(cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size)
    fresh_idx.extend(rerendered, len(rerendered))
    assert d.chain_index.last == fresh_idx.last

    # nothing in common: a new conversation
    d.reset([40, 41, 42])
    assert d.trie.ngram_counts() == dict(ngram_counts([40, 41, 42], cfg.ngram_max_trie_depth))


def test_truncate_then_continue():
    tree_cfg = cfg_of(num_draft_tokens=4)
    d = NgramDrafter(tree_cfg)
    d.reset([1, 2, 3, 4, 5, 1, 2])
    d.truncate(4)
    assert d.tokens == [1, 2, 3, 4]
    d.observe([9])
    assert d.trie.count([3, 4, 9]) == 1 and d.trie.count([1, 2, 3, 4, 9]) == 1  # continues at the cut
    assert d.trie.count([4, 5]) == 1  # what was counted before the cut is kept
    assert_valid(d.propose(d.tokens, 1, tree_cfg), 1, tree_cfg)

    chain_cfg = tree_cfg.replace(ngram_mode="chain")
    c = NgramDrafter(chain_cfg)
    c.reset([1, 2, 3, 4, 5, 1, 2])
    c.truncate(4)
    c.observe([9])
    # positions past the cut are gone: [1, 2] now only occurs at the start
    assert c.propose(c.tokens, 2, chain_cfg).tokens == (2, 3, 4, 9)
    c.truncate(100)  # beyond the end: nothing to do
    assert c.tokens == [1, 2, 3, 4, 9]
    with pytest.raises(ValueError):
        c.truncate(-1)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), cfg=ngram_configs(modes=("tree", "chain")))
def test_random_session_keeps_invariants(data, cfg):
    """Random observe / truncate / reset / mode switches: structures stay consistent."""
    cfg = cfg.replace(ngram_capacity=1000)
    d = NgramDrafter(cfg)
    d.reset(data.draw(token_lists))
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["observe", "observe", "truncate", "reset", "mode"]))
        if op == "observe":
            d.observe(data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=8)))
        elif op == "truncate":
            d.truncate(data.draw(st.integers(0, len(d.tokens))))
        elif op == "reset":
            d.reset(d.tokens[: data.draw(st.integers(0, len(d.tokens)))] + data.draw(token_lists))
        else:
            cfg = cfg.replace(ngram_mode="chain" if cfg.ngram_mode == "tree" else "tree")
        root = data.draw(st.integers(0, 4))
        tree = d.propose(d.tokens, root, cfg)
        assert_valid(tree, root, cfg)
        d.trie.check()
        fresh = ChainIndex(cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size)
        fresh.extend(d.tokens, len(d.tokens))
        assert d.chain_index.last == fresh.last
        # the trie holds at least every n-gram of the current history (truncation keeps extras)
        have = d.trie.ngram_counts()
        for g, c in ngram_counts(d.tokens, cfg.ngram_max_trie_depth).items():
            assert have.get(g, 0) >= c


def test_propose_resynchronises_after_a_missed_observe():
    cfg = cfg_of(num_draft_tokens=5)
    d = NgramDrafter(cfg)
    d.reset([1, 2, 3])
    history = [1, 2, 3, 4, 1, 2, 3]  # the caller never reported [4, 1, 2, 3]
    fresh = NgramDrafter(cfg)
    fresh.reset(history)
    assert d.propose(history, 4, cfg) == fresh.propose(history, 4, cfg)
    assert d.tokens == history


def test_protocol_surface_and_defaults():
    d = NgramDrafter()  # the session builds drafters with no arguments
    assert d.name == "ngram" and d.needs_features is False
    d.reset((1, 2, 3, 1, 2))
    d.observe((3,), features=None)
    cfg = cfg_of()
    tree = d.propose((1, 2, 3, 1, 2, 3), 1, cfg)
    assert_valid(tree, 1, cfg)
    assert tree.tokens[:3] == (1, 2, 3)
    d.clear()
    assert d.tokens == [] and len(d.trie) == 0
