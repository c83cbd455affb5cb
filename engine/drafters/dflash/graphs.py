"""The DFlash block forward on CUDA as one graph replay, with the greedy chain or DDTree chosen in it.

Eagerly a block forward is ~25 device ops per draft layer queued one by one from Python, plus the
log-softmax, the top-k and, for a tree, the host heap fed by a read of every candidate. Here a
drafted step is one replay of a graph captured per (context bucket, what is picked):

* **static inputs**: the first context slot, the count of newly committed rows and the anchor token
  go over in one non-blocking copy from pinned memory; the new rows' target features are copied on
  the device into a fixed [64, feature width] buffer.
* **the forward**: the new rows, padded to a bucket (1, 2, 4, .. 64: engine/gpu/static.py's), sit at
  slots ``first ..`` and positions ``first ..``; the block [anchor, mask ...] sits at the slots after
  the padded rows and at positions ``n, n + 1, ..`` (``n = first + new``). Every block row sees the
  committed rows (slots below ``n``) and the whole block; the padding rows' slots are seen by no one
  and are overwritten by the next step's real rows. Attention reads the whole draft cache through a
  mask built on the device, so no shape depends on the step. The layer is model.py's ``run_layer``.
* **the pick**: a greedy chain's per-position argmax, or DDTree's whole best-first search
  (engine/drafters/dflash/device_tree.py), so the step reads back one small tensor.

More than 64 new rows (a new prompt) run the runner's eager forward and the same pick. With graphs
off (``SPECCHAT_CUDA_GRAPHS=0``, CPU tests of this module) the same bodies run eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

from engine.drafters.dflash.model import run_layer
from engine.drafters.dflash.runner import DFlashRunner
from engine.gpu.graphs import CountsGraphs, GraphSet, PinnedUpload, graphs_wanted
from engine.gpu.rms_norm import rms_norm
from engine.gpu.static import MAX_TOKENS, bucket_for
from engine.models.kv_cache import KVCache

_FIRST, _NEW, _ANCHOR = 0, 1, 2  # the upload's layout
# (the block's log-probabilities [block_size - 1, vocab]) -> what the step reads back; run in the graph
Pick = Callable[[torch.Tensor], torch.Tensor]


class BlockGraphs(CountsGraphs):
    """One DFlashRunner's block forward and pick as replayable graphs (see the module)."""

    def __init__(self, runner: DFlashRunner, graphs: bool | None = None) -> None:
        self.runner = runner
        dev = runner.device
        self.upload = PinnedUpload(3, dev)
        d = self.upload.device_buffer
        self.first, self.new, self.anchor = d[_FIRST:_FIRST + 1], d[_NEW:_NEW + 1], d[_ANCHOR:_ANCHOR + 1]
        self.rows = torch.arange(MAX_TOKENS + runner.spec.block_size, device=dev)
        self.features: torch.Tensor | None = None  # [64, feature width], made on the first block
        self._graphs = GraphSet(graphs_wanted(dev) if graphs is None else graphs)

    def run(self, pending: Sequence[torch.Tensor], cache: KVCache, anchor: int, key: Hashable, pick: Pick
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block after ``anchor`` with ``pending`` (the features of the rows committed since the
        cache's last row) joining the cache: (its log-probabilities [block_size - 1, vocab], ``pick``
        of them). ``key`` names the pick (one graph per key and bucket). Both are the graph's own
        tensors, rewritten at its next replay; nothing is read back."""
        runner, size = self.runner, self.runner.spec.block_size
        first, new = cache.length, sum(f.shape[0] for f in pending)
        if new > MAX_TOKENS:  # a new prompt: once an answer
            hidden = runner.forward(torch.cat(list(pending)), cache, anchor)
            logp = runner.log_probs(hidden[1:])
            return logp, pick(logp)
        b = bucket_for(max(new, 1))
        if cache.capacity < first + b + size:
            cache.grow(first + b + size + 256)
        runner.rotary.ensure(cache.capacity + size)
        host = self.upload.writable()
        host[_FIRST], host[_NEW], host[_ANCHOR] = first, new, anchor
        self.upload.send(3)
        self._copy_features(pending)
        out = self._graphs.run(self._address(cache), (b, key), lambda: self._body(cache, b, pick))
        cache.commit(new)  # the context rows stay; the padding's and the block's slots are scratch
        runner.forwards += 1
        return out

    def _copy_features(self, pending: Sequence[torch.Tensor]) -> None:
        """The new rows' features into the fixed buffer, on the device (no host wait)."""
        width = self.runner.spec.feature_width
        if self.features is None:
            self.features = torch.zeros(MAX_TOKENS, width, dtype=self.runner.dtype, device=self.runner.device)
        row = 0
        for piece in pending:
            self.features[row: row + piece.shape[0]].copy_(piece)
            row += piece.shape[0]

    def _address(self, cache: KVCache) -> tuple:
        """The memory the graphs read besides their inputs: a move means capturing again."""
        assert self.features is not None
        return (id(cache), cache.k.data_ptr(), cache.v.data_ptr(), cache.capacity,
                self.runner.rotary.table.data_ptr(), self.features.data_ptr())

    def _body(self, cache: KVCache, b: int, pick: Pick) -> tuple[torch.Tensor, torch.Tensor]:
        r, s = self.runner, self.runner.spec
        size = s.block_size
        assert self.features is not None
        n = self.first + self.new  # the anchor's position
        context = self.first + self.rows[:b]  # the new rows' slots and positions (padding past n)
        block = self.first + b + self.rows[:size]  # the block's slots, after the padded rows
        slots = torch.cat([context, block])
        rot = r.rotary.table[torch.cat([context, n + self.rows[:size]])].unsqueeze(1)
        keys = torch.arange(cache.capacity, device=n.device)
        seen = (keys < n) | ((keys >= block[0]) & (keys <= block[-1]))
        # additive, as the target's static forward's (a bool mask is converted inside sdpa, off the graph's memory)
        mask = torch.zeros(size, cache.capacity, dtype=r.dtype, device=n.device).masked_fill_(~seen, float("-inf"))
        ctx = rms_norm(r.fc(self.features[:b]), r.hidden_norm, s.rms_norm_eps)
        h = torch.cat([r.target.embed_tokens(self.anchor).to(r.dtype), r.mask_rows])
        for i, ops in enumerate(r.layers):
            h = run_layer(s, ops, h, ctx, rot, _keep_at(cache, i, slots), mask)
        logp = r.log_probs(rms_norm(h, r.norm, s.rms_norm_eps)[1:])
        return logp, pick(logp)


def _keep_at(cache: KVCache, layer: int, slots: torch.Tensor
             ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Write a layer's new rows at the device-held ``slots`` and hand back its whole cache (the
    mask says which slots a row sees)."""
    def keep(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache.k[layer].index_copy_(1, slots, k.transpose(0, 1))
        cache.v[layer].index_copy_(1, slots, v.transpose(0, 1))
        return cache.k[layer: layer + 1], cache.v[layer: layer + 1]
    return keep
