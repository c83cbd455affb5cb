"""KV compaction of the accepted path: scratch slots -> contiguous committed slots, all layers in
one launch.

After a verify forward the tree's K/V sit in scratch slots ``[L, L+T)`` in node order; the kept
nodes (root, then the accepted path) must end up at ``[L, L+n)``. One program per (layer, KV head,
K-or-V) walks the path in order. The path is topologically ordered, so offsets[i] >= i and a slot
is only overwritten after every read of it; the copy is safe in place without a staging buffer.
The path and its length are read from device tensors, so the launch needs no host value the
acceptance kernel has not already left on the device.
"""

from __future__ import annotations

import torch


def _build():
    import triton
    import triton.language as tl

    # ``start`` (the committed length) changes every step: not specialized, so its value (1, a
    # multiple of 16) never triggers a recompile mid-answer.
    @triton.jit(do_not_specialize=["start"])
    def kv_compact_kernel(K, V, OFFSETS, COUNT, start, heads, stride_kl, stride_kh, stride_ks,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        # offsets in int64: program ids are int32 and layer * stride_kl passes 2**31 elements for
        # an 8B-shaped cache (32 layers x 8 heads x 64k slots x 128) long before memory runs out
        pid = tl.program_id(0).to(tl.int64)  # (layer, kv head)
        which = tl.program_id(1)  # 0: K, 1: V
        layer = pid // heads
        head = pid % heads
        base = tl.where(which == 0, K, V) + layer * stride_kl + head * stride_kh
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        first = start.to(tl.int64)
        n = tl.load(COUNT)
        for i in range(0, n):
            src = first + tl.load(OFFSETS + i).to(tl.int64)
            row = tl.load(base + src * stride_ks + d, mask=d_ok)
            tl.store(base + (first + i) * stride_ks + d, row, mask=d_ok)

    return kv_compact_kernel


def compact_kv(k: torch.Tensor, v: torch.Tensor, start: int, offsets: torch.Tensor, count: torch.Tensor) -> None:
    """Move scratch slots ``start + offsets[i]`` to ``start + i`` for i < count, in place (Triton).

    k, v: [layers, kv_heads, capacity, head_dim], same strides; offsets: int32 [>= count],
    increasing, offsets[0] == 0; count: int32 [1] on the device.
    """
    import triton

    from engine.gpu import kernel

    layers, heads, _, hd = k.shape
    assert k.stride() == v.stride() and k.stride(3) == 1, "K and V must share a contiguous layout"
    launch = kernel("kv_compact", _build)[(layers * heads, 2)]
    launch(k, v, offsets, count, start, heads, k.stride(0), k.stride(1), k.stride(2),
           HEAD_DIM=hd, BLOCK_D=triton.next_power_of_2(hd))


def compact_kv_reference(k: torch.Tensor, v: torch.Tensor, start: int, offsets: list[int]) -> None:
    """The same move in torch (what KVCache.commit does on CPU)."""
    src = torch.tensor(offsets, device=k.device) + start
    n = len(offsets)
    k[:, :, start : start + n] = k[:, :, src]
    v[:, :, start : start + n] = v[:, :, src]
