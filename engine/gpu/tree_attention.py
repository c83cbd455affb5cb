"""Tree attention over the KV cache: the verify forward's attention in one kernel per layer.

Every query row is one draft-tree node (or a prompt token). It sees the whole committed prefix
(slots ``[0, L)``), and among the tree's own slots ``[L, L+T)`` only its ancestors and itself
(the ancestor mask), with an optional sliding window over positions. GQA: the ``G`` query heads
sharing a KV head are stacked as rows of one tile, so each K/V block is read once per tile of
rows, not once per query head, and the scores are one ``tl.dot``. bf16 K/V are upcast and multiplied in
full fp32: triton's CPU interpreter computes bf16 dots wrongly, so a tensor-core bf16 variant could
not be tested here; it is a follow-up to make (and measure) where a GPU is lent.

The prefix length is read from a device tensor, not passed as a Python int: the same launch is
replayed by a CUDA graph step after step while the cache grows underneath it.
"""

from __future__ import annotations

import torch


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def tree_attention_kernel(
        Q, K, V, O, MASK, POS, LEN,
        stride_qt, stride_qh, stride_kh, stride_ks, stride_ot, stride_oh,
        T, window, scale,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        kvh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = (tree node r // G, head r % G)
        t = rows // GROUP
        h = kvh * GROUP + rows % GROUP
        row_ok = t < T
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        L = tl.load(LEN)
        q = tl.load(Q + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        q_pos = tl.load(POS + t, mask=row_ok, other=0)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: a fully masked block gives p = 0, not NaN
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        n_keys = L + T
        lo = 0
        if WINDOWED:
            lowest = tl.min(tl.where(row_ok, q_pos, 1 << 62), axis=0)
            lo = tl.maximum(lowest - window + 1, 0) // BLOCK_N * BLOCK_N
        k_base = K + kvh * stride_kh
        v_base = V + kvh * stride_kh
        for start in range(lo, n_keys, BLOCK_N):
            s = start + tl.arange(0, BLOCK_N)
            in_prefix = s < L
            in_tree = (s >= L) & (s < n_keys)
            j = s - L
            tree_ok = tl.load(MASK + t[:, None] * T + j[None, :],
                              mask=row_ok[:, None] & in_tree[None, :], other=0) != 0
            visible = (in_prefix[None, :] | tree_ok) & row_ok[:, None]
            if WINDOWED:
                k_pos = tl.where(in_prefix, s, tl.load(POS + j, mask=in_tree, other=0))
                visible = visible & ((q_pos[:, None] - k_pos[None, :]) < window)
            key_ok = s < n_keys
            k = tl.load(k_base + s[:, None] * stride_ks + d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + s[:, None] * stride_ks + d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(O + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    return tree_attention_kernel


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of T new rows over the committed prefix plus the tree (Triton).

    q: [T, heads, head_dim]; k_cache, v_cache: one layer, [kv_heads, capacity, head_dim], the T
    new keys already written at slots ``[L, L+T)``; length: int32 [1] on the device, L;
    tree_mask: [T, T] (nonzero = may attend), positions: [T] int64. Returns [T, heads, head_dim]
    in q's dtype.
    """
    import triton

    from engine.gpu import kernel

    T, heads, hd = q.shape
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    mask = tree_mask if tree_mask.dtype == torch.int8 else tree_mask.to(torch.int8)
    rows = T * group
    block_d = max(16, triton.next_power_of_2(hd))
    # Tiles sized so ptxas spills nothing (scripts/triton_report.py compiles every launched shape for
    # sm_90 and sm_80; tests/gpu/test_compile_sm90.py keeps it so). The fp32 "ieee" dots are FMA
    # loops whose operands sit in registers, about BLOCK_M x BLOCK_D of them per thread group:
    # 64 rows spilled kilobytes per thread at head_dim 128, so the tile stays at 16 x 128 or
    # 32 x 64, with 8 warps and no software pipelining (a pipelined bf16 load, upcast in registers,
    # spilled too). Rows are independent and a skipped key block is fully masked, so the tile size
    # changes no row's arithmetic (on a GPU at most the order of a 32-key block's fp32 sums).
    block_m = 32 if rows > 16 and block_d <= 64 else 16
    grid = (triton.cdiv(rows, block_m), kv_heads)
    kernel("tree_attention", _build)[grid](
        q, k_cache, v_cache, out, mask.contiguous(), positions, length,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        T, window or 0, scale,
        GROUP=group, HEAD_DIM=hd, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=32, WINDOWED=bool(window),
        num_warps=8, num_stages=1,
    )
    return out


def allowed_keys(length: int, tree_mask: torch.Tensor, positions: torch.Tensor, window: int | None,
                 capacity: int | None = None) -> torch.Tensor:
    """[T, capacity or L+T] bool: which cache slots each row may attend to (the reference's mask)."""
    T = tree_mask.shape[0]
    width = capacity if capacity is not None else length + T
    slots = torch.arange(width, device=tree_mask.device)
    allowed = torch.zeros(T, width, dtype=torch.bool, device=tree_mask.device)
    allowed[:, :length] = True
    allowed[:, length:length + T] = tree_mask.bool()
    if window:
        key_pos = slots.clone()
        key_pos[length:length + T] = positions
        allowed &= (positions[:, None] - key_pos[None, :]) < window
    return allowed


def tree_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """The same attention in plain torch, fp32 softmax (what the kernel is tested against)."""
    T, heads, _ = q.shape
    group = heads // k_cache.shape[0]
    keys = k_cache[:, : length + T].float().repeat_interleave(group, dim=0)  # [heads, L+T, hd]
    values = v_cache[:, : length + T].float().repeat_interleave(group, dim=0)
    scores = torch.einsum("thd,hsd->hts", q.float(), keys) * scale
    allowed = allowed_keys(length, tree_mask, positions, window)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    out = torch.einsum("hts,hsd->thd", torch.softmax(scores, dim=-1), values)
    return out.to(q.dtype)
