"""EAGLE's greedy draft on CUDA as two graph replays and one host read.

Eagerly a step's draft was ~160-220 device ops queued one by one from Python (the head's ~45 a
level, the search's ~10), each ~5-10 us of host time on a GPU, against microseconds of work. Here:

1. **catch-up**: the head's entries for the positions committed since the last step, padded to a
   bucket (1, 2, 4, .. 64 rows) and replayed from a graph per bucket. Entry i sits at slot and
   position ``first + i`` and sees every slot up to its own; padding rows write slots past the
   committed ones, which the tree's levels overwrite before any row reads them. The last real
   row's output (the root's stream) is copied into a fixed buffer, picked by a device index.
2. **the tree**: every level of engine/drafters/device_search.py's search and the choice of the
   tree, one graph per (topk, levels, budget). Level d's k rows sit at slots ``n + (d-1)k ..``,
   at position ``n - 1 + d``, and see the committed slots plus their ancestors' (an ancestor mask
   over the scratch slots, gathered from the parent's row); attention reads the whole head cache
   through a mask built on the device from the device-held ``n``.

Step values (first slot, last real row, committed count ``n``, the entries' tokens) go over in one
non-blocking copy from pinned memory; the features are copied on the device into a fixed buffer.
The one host wait is reading the chosen tree. A catch-up of more than 64 entries (a new prompt)
runs eagerly. With graphs off (CPU tests, ``SPECCHAT_CUDA_GRAPHS=0``) the same bodies run eagerly.
"""

from __future__ import annotations

import torch

from engine.drafters.device_search import Frontier, search_on_device, tree_from_rows
from engine.drafters.eagle_head import EagleHead
from engine.gpu.graphs import CountsGraphs, GraphSet, PinnedUpload, graphs_wanted
from engine.gpu.static import MAX_TOKENS, bucket_for
from engine.models.kv_cache import KVCache
from engine.tree import DraftTree

_FIRST, _LAST, _N, _TOKENS = 0, 1, 2, 3  # the upload's layout: first slot, last real row, n, tokens[64]


class EagleDraftGraphs(CountsGraphs):
    """The catch-up and tree search of one EagleDrafter's head as replayable graphs (see the module)."""

    def __init__(self, head: EagleHead, graphs: bool | None = None) -> None:
        self.head = head
        dev = head.device
        self.upload = PinnedUpload(_TOKENS + MAX_TOKENS, dev)
        d = self.upload.device_buffer
        self.first, self.last, self.n, self.tokens = d[_FIRST:_FIRST + 1], d[_LAST:_LAST + 1], d[_N:_N + 1], d[_TOKENS:]
        self.rows = torch.arange(MAX_TOKENS, device=dev)
        self.root_g = torch.zeros(head.spec.hidden_size, dtype=head.dtype, device=dev)
        self.features: torch.Tensor | None = None  # [64, feature width], made on the first catch-up
        self._graphs = GraphSet(graphs_wanted(dev) if graphs is None else graphs)

    def draft(self, cache: KVCache, tokens: list[int], pending: list[torch.Tensor], root: int, *, steps: int,
              topk: int, budget: int) -> DraftTree:
        """Catch up on ``tokens`` (the entries from ``cache.length``, with ``pending`` features),
        commit them, and search the greedy tree under ``root``."""
        first, T = cache.length, len(tokens)
        n = first + T
        k = min(topk, self.head.vocab_size)
        scratch = max(steps - 1, 1) * k
        # room for the padded catch-up and the tree's scratch slots, and positions up to the capacity
        need = max(first + bucket_for(min(T, MAX_TOKENS)), n + scratch)
        if cache.capacity < need:
            cache.grow(need + 256)
        self.head.rotary.ensure(cache.capacity)
        host = self.upload.writable()
        host[_FIRST], host[_LAST], host[_N] = first, T - 1, n
        small = T <= MAX_TOKENS
        if small:
            host[_TOKENS:_TOKENS + T] = torch.tensor(tokens, dtype=torch.int64)
        self.upload.send(_TOKENS + (T if small else 0))
        if small:
            self._catch_up(cache, pending, T)
        else:  # a new prompt: once an answer
            g, _ = self.head.run(tokens, torch.cat(pending), None, cache, first, None)
            self.root_g.copy_(g[-1])
        cache.commit(T)
        if budget <= 1:
            return DraftTree.root_only(root)
        rows = self._graphs.run(self._address(cache), ("tree", k, steps, budget),
                                lambda: self._search(cache, k, steps, budget, scratch))
        return tree_from_rows(root, rows.tolist())  # the draft's one host wait

    def _address(self, cache: KVCache) -> tuple:
        """The memory the graphs read besides their inputs: a move means capturing again."""
        return (id(cache), cache.k.data_ptr(), cache.v.data_ptr(), cache.capacity,
                self.head.rotary.table.data_ptr(), None if self.features is None else self.features.data_ptr())

    def _catch_up(self, cache: KVCache, pending: list[torch.Tensor], T: int) -> None:
        width, dtype = pending[0].shape[-1], pending[0].dtype
        if self.features is None or self.features.shape[-1] != width or self.features.dtype != dtype:
            self.features = torch.zeros(MAX_TOKENS, width, dtype=dtype, device=self.head.device)
        row = 0
        for piece in pending:  # on the device, no host wait
            self.features[row: row + piece.shape[0]].copy_(piece)
            row += piece.shape[0]
        b = bucket_for(T)
        self._graphs.run(self._address(cache), ("catch-up", b), lambda: self._catch_up_body(cache, b))

    def _catch_up_body(self, cache: KVCache, b: int) -> None:
        slots = self.first + self.rows[:b]  # entry i at slot and position first + i
        allowed = torch.arange(cache.capacity, device=slots.device)[None, :] <= slots[:, None]
        assert self.features is not None
        g = self.head.static_forward(self.tokens[:b], self.features[:b], slots, cache, slots, allowed)
        self.root_g.copy_(g.index_select(0, self.last)[0])

    def _search(self, cache: KVCache, k: int, steps: int, budget: int, scratch: int) -> torch.Tensor:
        head, dev = self.head, self.head.device
        rel = torch.arange(cache.capacity, device=dev) - self.n  # each slot relative to the first scratch slot
        committed = rel < 0
        scratch_slot = (rel >= 0) & (rel < scratch)
        index = rel.clamp(0, scratch - 1).expand(k, -1)
        own = torch.eye(k, dtype=torch.bool, device=dev)
        ancestors = torch.zeros(k, scratch, dtype=torch.bool, device=dev)  # over the scratch slots
        state: dict[str, torch.Tensor] = {"seen": ancestors}

        def expand(f: Frontier) -> torch.Tensor:
            lo = (f.depth - 1) * k  # the level's first scratch slot
            seen = state["seen"] if f.parent_rows is None else state["seen"][f.parent_rows]
            seen[:, lo: lo + k] |= own
            allowed = committed[None, :] | (scratch_slot[None, :] & seen.gather(1, index))
            stream = self.root_g[None].expand(k, -1) if f.parent_rows is None else state["g"][f.parent_rows]
            positions = (self.n + (f.depth - 1)).expand(k)
            slots = self.n + lo + self.rows[:k]
            g = head.static_forward(f.tokens, stream, positions, cache, slots, allowed)
            state["g"], state["seen"] = g, seen
            return head.log_probs(g)

        root_logp = head.log_probs(self.root_g[None])[0]
        return search_on_device(root_logp, expand, head.to_target, num_steps=steps, topk=k, num_draft_tokens=budget)
