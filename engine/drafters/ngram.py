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
(``reset`` / ``observe`` / ``truncate``) and inserts only what is new, when the next proposal
needs it (so a step the adaptive budget keeps plain inserts nothing), into the structure of the
mode that proposal uses; the other catches up the first time its mode is used. See
docs/NGRAM.md for the design and the measured costs (``scripts/bench_ngram.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from engine.config import SpecConfig
from engine.drafters.ngram_chain import ChainIndex
from engine.drafters.ngram_source import SourceChoice
from engine.drafters.ngram_trie import NgramTrie
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
# alone, 1.64 with the corpus drafting where it matched one token or none;
# docs/history/benchmarks-sessions.md, "Session 30");
# at a one-token match the conversation's own record decides (engine/drafters/ngram_source.py)
_CORPUS_BELOW = 2

def _as_list(tokens: Sequence[int] | Iterable[int]) -> list[int]:
    """A fresh list of Python ints (accepts lists, tuples, numpy arrays and 1-D tensors)."""
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        return list(tolist())
    return list(tokens)


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

        * ``history`` extends what the drafter holds: only the new tokens are inserted, at the
          next proposal (the cache spans the whole conversation).
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

    def clear(self) -> None:
        """Forget everything (tokens, trie and chain index)."""
        self._tokens = []
        self._source.forget()
        self._trie.clear()
        self._trie_len = 0
        self._index.clear()

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take the committed tokens; the trie (or the chain index) reads them at the next
        :meth:`propose`. Why not now: while the adaptive budget pauses drafting nothing reads the
        structure, so a paused step does what a plain one does; the insertions are the same, in
        the same order, whenever they happen (propose syncs before it matches)."""
        self._tokens.extend(_as_list(committed))

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens. The trie keeps the n-grams it
        counted (they were real text); the chain index forgets the cut positions exactly."""
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if length >= len(self._tokens):
            return
        if self._mode == "tree":  # the tokens cut off were real text: counted first, as if observed eagerly
            self._sync_trie()
        self._source.forget()
        self._index.truncate(self._tokens, length)
        del self._tokens[length:]
        if self._trie_len > length:
            self._trie_len = length
            self._trie.rewind(self._tokens[max(0, length - self._trie.max_depth + 1) :])

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
