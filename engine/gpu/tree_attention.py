"""Tree attention over the KV cache: the verify (and decode) forward's attention, split over the keys.

Every query row is one draft-tree node (or a prompt token). It sees the whole committed prefix
(slots ``[0, L)``), and among the tree's own slots ``[L, L+T)`` only its ancestors and itself
(the ancestor mask), with an optional sliding window over positions. GQA: the ``G`` query heads
sharing a KV head are the rows of one program, so each K/V block is read once for the ``G`` heads.

Why split over the keys (flash-decoding): at decode (T=1) one program per KV head walked the whole
prefix, i.e. 3 to 8 programs on a 132-SM GPU, so long contexts ran on a handful of SMs. Here the
slots ``[0, L+T)`` are cut into chunks of ``CHUNK`` keys and one program per (tree node, KV head,
chunk) computes its rows' running max ``m``, sum ``l`` and unnormalised ``acc`` over that chunk;
a second kernel combines the chunks of every row in chunk order and normalises.

Why fixed chunks and one tree node per program: batch invariance. The engine's greedy speculative
output must equal plain decoding token for token, so a row's attention must be bit-identical
whether it comes in a T=1 decode launch or a T=64 verify launch. So nothing a row computes depends
on T, on L's value or on the other rows: chunks are cut at fixed multiples of ``CHUNK`` of the
*absolute* slot (a tree slot in a verify launch is in the same chunk as the same slot once it is
committed and decoded over), a program's rows are always the ``G`` heads of one node (never a
tile shared with other nodes), keys are reduced in the same ``BLOCK_N`` blocks from the chunk's
start, and ``T`` is not specialised, so T=1 and T=64 run the same binary. A key a row may not see
adds exact zeros (``exp(-inf) = 0``, max unchanged), so the blocks and chunks past the row's last
visible key, or before its window, change none of its bits. The score and value products are an
elementwise multiply and ``tl.sum`` over fp32 registers (no ``tl.dot``: it needs 16 rows, which
would waste 12 of 16 at G=4, and its reduction order is the compiler's to choose per tile shape).
bf16 K/V are upcast; triton's CPU interpreter computes bf16 dots wrongly, so no tensor-core path.

The prefix length is read from a device tensor, not passed as a Python int: the same launch is
replayed by a CUDA graph step after step while the cache grows underneath it, so the grid spans
the cache's capacity and the chunks past ``L+T`` exit at once (the combine stops at ``L+T``).
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 256  # keys per split: a constant (never a function of T or L), see the module docstring
BLOCK_N = 16  # keys per inner block: [G, BLOCK_N, head_dim] fp32 products stay in registers


def _build() -> dict[str, Any]:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["T"])
    def tree_attention_split_kernel(
        Q, K, V, MASK, POS, LEN, PM, PL, PACC,
        stride_qt, stride_qh, stride_kh, stride_ks,
        T, n_chunks, window, scale,
        GROUP: tl.constexpr, GP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, WINDOWED: tl.constexpr,
    ):
        t = tl.program_id(0)  # one tree node per program: its G heads are the rows
        c = tl.program_id(1)
        kvh = tl.program_id(2)
        L = tl.load(LEN)
        n_keys = L + T
        c0 = c * CHUNK
        if c0 >= n_keys:
            return  # past L+T (the grid spans the capacity): the combine never reads it
        g = tl.arange(0, GP)
        g_ok = g < GROUP
        h = kvh * GROUP + g
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q = tl.load(Q + t * stride_qt + h[:, None] * stride_qh + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        m_i = tl.full([GP], -1.0e30, tl.float32)  # finite: a fully masked block gives p = 0, not NaN
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, BLOCK_D], tl.float32)
        lo = c0
        if WINDOWED:  # blocks wholly before the window are exact no-ops: skip them
            q_pos = tl.load(POS + t)
            lo = tl.maximum(lo, tl.maximum(q_pos - window + 1, 0) // BLOCK_N * BLOCK_N)
        else:
            q_pos = 0
        hi = tl.minimum(c0 + CHUNK, n_keys)
        k_base = K + kvh * stride_kh
        v_base = V + kvh * stride_kh
        for start in range(lo, hi, BLOCK_N):
            s = start + tl.arange(0, BLOCK_N)
            key_ok = s < n_keys
            in_tree = (s >= L) & key_ok
            j = s - L
            tree_ok = tl.load(MASK + t * T + j, mask=in_tree, other=0) != 0
            visible = (s < L) | tree_ok
            if WINDOWED:
                k_pos = tl.where(in_tree, tl.load(POS + j, mask=in_tree, other=0), s)
                visible = visible & ((q_pos - k_pos) < window)
            k = tl.load(k_base + s[:, None] * stride_ks + d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GP, BLOCK_N]
            scores = tl.where(visible[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + s[:, None] * stride_ks + d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        part = ((t * tl.num_programs(2) + kvh) * n_chunks + c) * GP + g
        tl.store(PM + part, m_i)
        tl.store(PL + part, l_i)
        tl.store(PACC + part[:, None] * BLOCK_D + d[None, :], acc)

    @triton.jit(do_not_specialize=["T"])
    def tree_attention_combine_kernel(
        O, LEN, PM, PL, PACC,
        stride_ot, stride_oh,
        T, n_chunks,
        GROUP: tl.constexpr, GP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        kvh = tl.program_id(0)
        t = tl.program_id(1)
        g = tl.arange(0, GP)
        d = tl.arange(0, BLOCK_D)
        n_keys = tl.load(LEN) + T
        m = tl.full([GP], -1.0e30, tl.float32)
        l_sum = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, BLOCK_D], tl.float32)
        base = (t * tl.num_programs(0) + kvh) * n_chunks
        for c in range(0, tl.cdiv(n_keys, CHUNK)):  # in chunk order, for every T alike
            part = (base + c) * GP + g
            m_c = tl.load(PM + part)
            m_new = tl.maximum(m, m_c)
            a = tl.exp(m - m_new)
            b = tl.exp(m_c - m_new)
            l_sum = l_sum * a + tl.load(PL + part) * b
            acc = acc * a[:, None] + tl.load(PACC + part[:, None] * BLOCK_D + d[None, :]) * b[:, None]
            m = m_new
        out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        h = kvh * GROUP + g
        tl.store(O + t * stride_ot + h[:, None] * stride_oh + d[None, :], out.to(O.dtype.element_ty),
                 mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :])

    return {"split": tree_attention_split_kernel, "combine": tree_attention_combine_kernel}


def _build_split() -> Any:
    return _build()["split"]


def _build_combine() -> Any:
    return _build()["combine"]


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
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Attention of T new rows over the committed prefix plus the tree (Triton, split over keys).

    q: [T, heads, head_dim]; k_cache, v_cache: one layer, [kv_heads, capacity, head_dim], the T
    new keys already written at slots ``[L, L+T)``; length: int32 [1] on the device, L;
    tree_mask: [T, T] (nonzero = may attend), positions: [T] int64. Returns [T, heads, head_dim]
    in q's dtype. ``chunk``: keys per split (a power of two, at least 16; small in tests). A row's
    result is bit-identical across launches (any T) that use the same ``chunk``.
    """
    import triton

    from engine.gpu import kernel

    T, heads, hd = q.shape
    kv_heads, capacity = k_cache.shape[0], k_cache.shape[1]
    group = heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    mask = tree_mask if tree_mask.dtype == torch.int8 else tree_mask.to(torch.int8)
    gp = triton.next_power_of_2(group)
    block_d = max(16, triton.next_power_of_2(hd))
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    block_n = min(BLOCK_N, chunk)
    # the grid spans the capacity (L lives on the device and grows under a replayed CUDA graph);
    # chunks past L+T return at once. Partials: [T, kv_heads, n_chunks, GP(, BLOCK_D)] fp32, i.e.
    # 4 MiB at T=64, 8 KV heads, d128, capacity 1024 (linear in the capacity).
    n_chunks = triton.cdiv(capacity, chunk)
    part_m = torch.empty(T * kv_heads * n_chunks * gp, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(part_m.numel() * block_d, dtype=torch.float32, device=q.device)
    # Sized so ptxas spills nothing (scripts/triton_report.py compiles every launched shape for sm_90
    # and sm_80; tests/gpu/test_compile_sm90.py keeps it so): the [GP, BLOCK_N, BLOCK_D] fp32 product
    # is 32 registers a thread at G=4 d128 over 8 warps (4 warps spilled at bf16). The node is the
    # fastest grid axis: the T programs reading one chunk of one KV head run side by side and share
    # it through L2 (a program per node reads the chunk once per node, not once per row tile).
    kernel("tree_attention", _build_split)[(T, n_chunks, kv_heads)](
        q, k_cache, v_cache, mask.contiguous(), positions, length, part_m, part_l, part_acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        T, n_chunks, window or 0, scale,
        GROUP=group, GP=gp, HEAD_DIM=hd, BLOCK_D=block_d, BLOCK_N=block_n, CHUNK=chunk,
        WINDOWED=bool(window), num_warps=8, num_stages=1,
    )
    kernel("tree_attention_combine", _build_combine)[(kv_heads, T)](
        out, length, part_m, part_l, part_acc, out.stride(0), out.stride(1), T, n_chunks,
        GROUP=group, GP=gp, HEAD_DIM=hd, BLOCK_D=block_d, CHUNK=chunk, num_warps=4, num_stages=1,
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
