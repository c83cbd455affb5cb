"""Static-shape decode/verify for CUDA: bucketed tree sizes, preallocated buffers, CUDA graphs.

At batch 1 a GPU forward of an 8B model is ~300 kernel launches; launched one by one from Python
that costs more than reading the weights. So every verify forward of up to 64 tokens runs with
shapes fixed in advance and is replayed from a CUDA graph:

- Tree sizes are rounded up to a bucket (1, 2, 4, 8, 16, 32, 64); the extra rows are padding nodes
  that attend only to themselves and that no real node attends to, so the real rows' logits are
  those of the unpadded tree. Their K/V land in scratch slots past the tree and are never kept.
- Inputs (tokens, positions, ancestor mask, prefix length) are packed into one pinned host tensor
  and sent with one non-blocking copy to one device buffer at a fixed address; every bucket's
  inputs are views of it. The prefix length lives on the device, so the same graph serves every
  step: K/V are written with ``index_copy_`` at ``length + i`` and attention reads the length.
- One graph per bucket is captured on first use and kept while the cache and rotary table stay at
  the same addresses (a grown cache gets new graphs; CUDA caches grow by doubling, so rarely).

The bucketing, padding and buffer code is plain torch and runs on CPU too (``graphs=False``):
that is how the tests check that padding does not change logits and that buffers are reused.
``SPECCHAT_CUDA_GRAPHS=0`` turns graphs off (eager static forward) for debugging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from engine import gpu
from engine.gpu.graphs import CountsGraphs, GraphSet, PinnedUpload, graphs_wanted
from engine.gpu.rms_norm import rms_norm
from engine.gpu.tree_attention import tree_attention
from engine.models.layer import ForwardOutput

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_TOKENS = BUCKETS[-1]
Attention = Literal["triton", "torch"]
Outputs = tuple[torch.Tensor, "torch.Tensor | None", list[torch.Tensor]]  # logits, hidden, captured inputs


def bucket_for(n: int) -> int:
    """The smallest bucket that holds n tree tokens."""
    if n < 1:
        raise ValueError("a forward needs at least one token")
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} tokens exceed the largest bucket ({MAX_TOKENS})")


def cuda_capacity(capacity: int) -> int:
    """KV capacity on CUDA: a power of two of at least 1024, so the cache (and with it the
    captured graphs) is rebuilt only when a conversation doubles."""
    return max(1024, 1 << (max(capacity, 1) - 1).bit_length())


def pad_tree(tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor, bucket: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad n tree tokens to ``bucket`` rows: padding rows repeat the last token and position and
    see only themselves; no real row sees them. Returns (tokens, positions, mask [b, b] bool)."""
    n = tokens.shape[0]
    if n > bucket:
        raise ValueError(f"{n} tokens do not fit bucket {bucket}")
    pad = bucket - n
    tokens = torch.cat([tokens, tokens[-1:].expand(pad)])
    positions = torch.cat([positions, positions[-1:].expand(pad)])
    mask = torch.eye(bucket, dtype=torch.bool, device=tree_mask.device)
    mask[:n, :n] = tree_mask.bool()
    return tokens, positions, mask


@dataclass
class StepInputs:
    """One bucket's views into the device input buffer."""

    tokens: torch.Tensor  # [b] int64
    positions: torch.Tensor  # [b] int64
    mask: torch.Tensor  # [b, b] int64 (nonzero = may attend)
    length: torch.Tensor  # [1] int64: the committed prefix length
    slots: torch.Tensor  # [b] int64: 0..b-1, added to length for the K/V slots


class StaticBuffers:
    """Every per-step input in one device tensor at a fixed address, filled from one pinned host
    tensor with one copy. Layout (int64): tokens[64] | positions[64] | length[1] | mask[b*b]."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.upload = PinnedUpload(2 * MAX_TOKENS + 1 + MAX_TOKENS * MAX_TOKENS, device)
        self.device_buffer = self.upload.device_buffer
        self._slots = torch.arange(MAX_TOKENS, device=device)

    def views(self, bucket: int) -> StepInputs:
        d = self.device_buffer
        m = 2 * MAX_TOKENS + 1
        return StepInputs(tokens=d[:bucket], positions=d[MAX_TOKENS : MAX_TOKENS + bucket],
                          mask=d[m : m + bucket * bucket].view(bucket, bucket),
                          length=d[2 * MAX_TOKENS : 2 * MAX_TOKENS + 1], slots=self._slots[:bucket])

    def load(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, length: int) -> StepInputs:
        """Write one step's (padded) inputs and send them to the device; returns the views."""
        b = tokens.shape[0]
        h = self.upload.writable()
        m = 2 * MAX_TOKENS + 1
        h[:b] = tokens
        h[MAX_TOKENS : MAX_TOKENS + b] = positions
        h[2 * MAX_TOKENS] = length
        h[m : m + b * b] = mask.reshape(-1)
        self.upload.send(m + b * b)
        return self.views(b)


@dataclass(frozen=True)
class Wanted:
    """What a static forward returns besides the logits: the residual entering each layer in
    ``capture`` (index num_layers: the last layer's output), in layer order, as the eager paths
    give it (EAGLE-3's features), and the final-normed hidden states (EAGLE-1/2's)."""

    capture: tuple[int, ...] = ()
    hidden: bool = False


def static_forward(model, cache, inputs: StepInputs, attention: Attention, wanted: Wanted = Wanted()
                   ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """The verify forward with no shape or host value depending on the step: ([b, V] float32
    logits, the hidden states if wanted, the captured layer inputs).

    ``model``: the LlamaModel (its layers, norms, rotary table and LM head); the layer math is
    engine/models/layer.py's, so this differs from the eager forward only in how K/V are written
    (at the device-side length) and how attention finds them. The captured tensors are the
    stream itself (never written in place), so a graph's outputs stay valid between replays."""
    c = model.config
    b = inputs.tokens.shape[0]
    nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
    eps = c.rms_norm_eps
    slots = inputs.length + inputs.slots
    rot = model.rotary.table[inputs.positions].unsqueeze(1)
    add_mask = _torch_mask(inputs, cache.capacity, c.sliding_window, model.dtype) if attention == "torch" else None
    tree_mask = inputs.mask.to(torch.int8)  # once per forward, not per layer
    x = F.embedding(inputs.tokens, model.embed)
    aux: list[torch.Tensor] = []
    for li, layer in enumerate(model.layers):
        if li in wanted.capture:
            aux.append(x)
        qk, v = layer.project(rms_norm(x, layer.ln_attn, eps), rot, c)
        cache.k[li].index_copy_(1, slots, qk[:, nh:].transpose(0, 1))
        cache.v[li].index_copy_(1, slots, v.transpose(0, 1))
        q = qk[:, :nh]
        if attention == "triton":
            att = tree_attention(q, cache.k[li], cache.v[li], inputs.length, tree_mask, inputs.positions,
                                 model.scale, c.sliding_window)
        else:
            att = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0), cache.k[li].unsqueeze(0), cache.v[li].unsqueeze(0),
                attn_mask=add_mask, scale=model.scale, enable_gqa=nkv != nh,
            )[0].transpose(0, 1)
        x = x + layer.o(att.reshape(b, nh * hd))
        x = x + layer.mlp(rms_norm(x, layer.ln_mlp, eps))
    if len(model.layers) in wanted.capture:
        aux.append(x)
    hidden = rms_norm(x, model.norm, eps)
    return model.lm_head(hidden).float(), (hidden if wanted.hidden else None), aux


def _torch_mask(inputs: StepInputs, capacity: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive [b, capacity] mask over the whole cache, built on the device from the device length
    (the reference attention for CPU tests and GPUs without triton)."""
    b = inputs.tokens.shape[0]
    slots = torch.arange(capacity, device=inputs.tokens.device)
    rel = slots[None, :] - inputs.length  # [1, capacity]: key slot relative to the tree's first slot
    in_tree = (rel >= 0) & (rel < b)
    idx = rel.clamp(0, b - 1).expand(b, capacity)
    allowed = (rel < 0) | (in_tree & (inputs.mask.gather(1, idx) != 0))
    if window:
        key_pos = torch.where(in_tree, inputs.positions[idx[0]][None, :], slots[None, :])
        allowed &= (inputs.positions[:, None] - key_pos) < window
    return torch.zeros(b, capacity, dtype=dtype, device=slots.device).masked_fill_(~allowed, float("-inf"))


class StaticDecoder(CountsGraphs):
    """Runs LlamaModel forwards of up to 64 tokens through bucketed static shapes (graphs on CUDA).

    ``forward`` returns None when a call does not fit (more tokens, no logits asked for, too
    little cache room for the bucket); the model then runs its ordinary eager forward. EAGLE's
    verify forwards (layer inputs or hidden states wanted) are graphs too, one per bucket and
    ``Wanted``: eagerly they cost ~10x a replay on a GPU (session 25, H200: 37 ms a step).
    """

    def __init__(self, model, *, graphs: bool | None = None, attention: Attention | None = None) -> None:
        self.model = model
        self.device = model.device
        cuda = self.device.type == "cuda"
        if graphs is None:
            graphs = graphs_wanted(self.device)
        if graphs and not cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.graphs = graphs
        self.attention: Attention = attention or ("triton" if cuda and gpu.triton_available() else "torch")
        self.buffers = StaticBuffers(self.device)
        self._graphs = GraphSet(graphs)

    def forward(self, tokens: torch.Tensor, cache, positions: torch.Tensor | None, tree_mask: torch.Tensor | None,
                logits: str, wanted: Wanted = Wanted()) -> ForwardOutput | None:
        n = tokens.shape[0]
        if n > MAX_TOKENS or logits == "none":
            return None
        bucket = bucket_for(n)
        L = cache.length
        if L + bucket > cache.capacity:
            return None
        if positions is None:
            positions = torch.arange(L, L + n)
        if tree_mask is None:
            tree_mask = torch.ones(n, n, dtype=torch.bool).tril_()
        self.model.rotary.ensure(cache.capacity + MAX_TOKENS)
        padded = pad_tree(tokens.cpu(), positions.cpu(), tree_mask.cpu(), bucket)
        inputs = self.buffers.load(*padded, L)
        out, hidden, aux = self._run(cache, inputs, bucket, wanted)
        rows = out[:n] if logits == "all" else out[n - 1 : n]
        return ForwardOutput(rows.clone(), hidden[:n].clone() if hidden is not None else None,
                             [a[:n].clone() for a in aux])

    def _run(self, cache, inputs: StepInputs, bucket: int, wanted: Wanted) -> Outputs:
        address = (id(cache), cache.k.data_ptr(), cache.v.data_ptr(), cache.capacity,
                   self.model.rotary.table.data_ptr())
        return self._graphs.run(address, (bucket, wanted),
                                lambda: static_forward(self.model, cache, inputs, self.attention, wanted))
