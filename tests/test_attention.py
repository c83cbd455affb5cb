"""The native attention kernels (engine/kernels/attention.c): the query heads of one KV head run together.

The promises: a row's bits do not depend on how many heads share its item (a grouped-query model
gives every head exactly what the same head gets with its K/V copied per head), nor on the thread
count (which changes how a small call splits its groups); the tree entry point and the keyed one
agree when they list the same keys; the result is softmax attention (close to torch's); and an
fp16 cache (the fast precision's) gives the bits of an fp32 cache holding the same rounded values.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels import native

KERNEL = native.load()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no native kernel here")

SHAPES = [(9, 3, 64), (8, 2, 128), (6, 1, 16), (12, 2, 72), (4, 4, 64)]  # heads, KV heads, head dim


def _inputs(nh: int, nkv: int, hd: int, L: int, T: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    cap = L + T + 3
    k = torch.randn(nkv, cap, hd, generator=gen)
    v = torch.randn(nkv, cap, hd, generator=gen)
    q = torch.randn(T, nh, hd, generator=gen)
    parents = [-1] + [(i - 1) // 2 for i in range(1, T)]
    tree = torch.zeros(T, T, dtype=torch.bool)
    depth = [0] * T
    for i in range(T):
        j = i
        while j >= 0:
            tree[i, j] = True
            j = parents[j]
        if i:
            depth[i] = depth[parents[i]] + 1
    return q, k, v, tree, torch.tensor(depth) + L


def _attend(q, k, v, L, tree, positions, window=0, threads=2):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return KERNEL.attention(q, k, v, L, tree, window, positions, 0.125)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("nh,nkv,hd", SHAPES)
@pytest.mark.parametrize("L,T", [(0, 1), (7, 1), (65, 2), (130, 5), (300, 16)])
def test_grouped_heads_equal_each_head_with_its_own_kv_copy(nh: int, nkv: int, hd: int, L: int, T: int) -> None:
    q, k, v, tree, pos = _inputs(nh, nkv, hd, L, T, seed=L + T)
    group = nh // nkv
    grouped = _attend(q, k, v, L, tree, pos)
    alone = _attend(q, k.repeat_interleave(group, 0).contiguous(), v.repeat_interleave(group, 0).contiguous(), L,
                    tree, pos)
    assert torch.equal(grouped, alone)


@pytest.mark.parametrize("wide", [True, False], ids=["16-lane", "8-lane"])
@pytest.mark.parametrize("window", [0, 40])
def test_the_thread_count_does_not_change_a_bit(window: int, wide: bool) -> None:
    """Both loop widths, not only the one this CPU picks: an AVX2 machine would check the 8-lane
    loops and an AVX-512 one the 16-lane loops, so a split bug in one would pass on the other."""
    try:
        KERNEL.use_wide_attention(wide)
        if wide and not KERNEL.attention_wide:
            pytest.skip("no AVX-512F here: only the 8-lane loops run")
        for T in (1, 2, 3, 9):
            q, k, v, tree, pos = _inputs(9, 3, 64, 120, T, seed=T)
            runs = [_attend(q, k, v, 120, tree, pos, window, threads) for threads in (1, 2, 3, 5)]
            assert all(torch.equal(runs[0], r) for r in runs[1:])
    finally:
        KERNEL.choose_variant(native.forced_variant())


def test_keyed_attention_equals_tree_attention_on_the_same_keys() -> None:
    L, T = 97, 6
    q, k, v, tree, pos = _inputs(9, 3, 64, L, T, seed=5)
    by_tree = _attend(q, k, v, L, tree, pos)
    extra = [[L + i for i in range(T) if tree[t, i]] for t in range(T)]
    table = torch.zeros(T, max(map(len, extra)), dtype=torch.int32)
    for t, e in enumerate(extra):
        table[t, :len(e)] = torch.tensor(e, dtype=torch.int32)
    by_keys = KERNEL.keyed_attention(q, k, v, torch.zeros(T, dtype=torch.int64), torch.full((T,), L - 1),
                                     table, torch.tensor([len(e) for e in extra], dtype=torch.int32), 0.125)
    assert torch.equal(by_tree, by_keys)


@pytest.mark.parametrize("nh,nkv,hd", SHAPES)
def test_it_is_softmax_attention(nh: int, nkv: int, hd: int) -> None:
    L, T = 50, 4
    q, k, v, tree, pos = _inputs(nh, nkv, hd, L, T, seed=1)
    visible = torch.cat([torch.ones(T, L, dtype=torch.bool), tree], 1)
    group = nh // nkv
    # the reference in float64: torch's fp32 einsum rounds as the host's BLAS does (by shape, ISA,
    # threads), so a fixed tolerance to it would be a tolerance to the machine
    keys = k[:, :L + T].double().repeat_interleave(group, 0)  # [nh, L+T, hd]
    values = v[:, :L + T].double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hsd->hts", q.double(), keys) * 0.125
    scores = scores.masked_fill(~visible[None], float("-inf"))
    want = torch.einsum("hts,hsd->thd", scores.softmax(-1), values).reshape(T, nh * hd)
    torch.testing.assert_close(_attend(q, k, v, L, tree, pos).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (4, 1, 128), (6, 2, 72)])
@pytest.mark.parametrize("L,T", [(0, 2), (5, 3), (64, 2), (300, 17), (131, 40)])
def test_tree_tokens_sharing_the_cached_keys_get_the_bits_of_one_token_calls(nh: int, nkv: int, hd: int, L: int,
                                                                             T: int) -> None:
    """tree_attention reads the cached K/V once for a run of tree tokens (hd a multiple of 64; 72
    takes the per-token path); every row must equal the call that lists that token's keys alone."""
    q, k, v, tree, pos = _inputs(nh, nkv, hd, L, T, seed=L * 7 + T)
    together = _attend(q, k, v, L, tree, pos)
    for t in range(T):
        keys = [L + i for i in range(T) if tree[t, i]]
        table = torch.tensor([keys], dtype=torch.int32)
        alone = KERNEL.keyed_attention(q[t:t + 1].contiguous(), k, v, torch.zeros(1, dtype=torch.int64),
                                       torch.tensor([L - 1]), table, torch.tensor([len(keys)], dtype=torch.int32),
                                       0.125)
        assert torch.equal(together[t], alone[0]), f"row {t}"


def _one_row(q, k, v, keys: list[int]) -> torch.Tensor:
    """The keyed entry point on one query listing ``keys``: how plain decoding's row is computed."""
    table = torch.tensor([keys], dtype=torch.int32)
    return KERNEL.keyed_attention(q.contiguous(), k, v, torch.zeros(1, dtype=torch.int64), torch.tensor([-1]), table,
                                  torch.tensor([len(keys)], dtype=torch.int32), 0.125)[0]


@pytest.mark.parametrize("kv16", [False, True])
@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (4, 1, 128)])
@pytest.mark.parametrize("L,T", [(0, 2), (0, 17), (0, 115), (5, 40), (300, 16), (64, 33)])
def test_causal_rows_share_the_earlier_new_tokens_and_keep_one_token_bits(nh: int, nkv: int, hd: int, L: int,
                                                                          T: int, kv16: bool) -> None:
    """Causal (a prefill chunk, no tree): a run of tokens reads the new tokens before it with the
    cached ones, once for the run; each row must still equal the one-token call over slots 0..L+t,
    at every thread count (more runs than tokens included) and with the 8-lane loops."""
    q, k, v, _, _ = _inputs(nh, nkv, hd, L, T, seed=L * 3 + T + hd)
    if kv16:
        k, v = k.half(), v.half()
    together = _attend(q, k, v, L, None, None)
    for t in range(T):
        assert torch.equal(together[t], _one_row(q[t:t + 1], k, v, list(range(L + t + 1)))), f"row {t}"
    for threads in (1, 3, 5):
        assert torch.equal(_attend(q, k, v, L, None, None, threads=threads), together)
    try:
        KERNEL.use_wide_attention(False)
        assert torch.equal(_attend(q, k, v, L, None, None), together)
    finally:
        KERNEL.choose_variant(native.forced_variant())


@pytest.mark.parametrize("L,T,window", [(0, 1, 0), (37, 1, 0), (300, 1, 0), (130, 5, 0), (300, 17, 0), (120, 3, 40),
                                        (9, 2, 0)])
@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (4, 1, 128), (6, 2, 72)])
def test_an_fp16_cache_reads_as_the_fp32_cache_of_its_values(nh: int, nkv: int, hd: int, L: int, T: int,
                                                            window: int) -> None:
    """F16C widens each value exactly, so every entry point (one token, a shared-key tree, the
    per-token path, windows, listed keys) must give the fp32 cache's bits on the rounded values."""
    q, k, v, tree, pos = _inputs(nh, nkv, hd, L, T, seed=L + 3 * T)
    k16, v16 = (k * 3).half(), (v * 3).half()
    k32, v32 = k16.float(), v16.float()
    assert torch.equal(_attend(q, k16, v16, L, tree, pos, window), _attend(q, k32, v32, L, tree, pos, window))
    keys = torch.tensor([[L + i for i in range(T) if tree[0, i]]], dtype=torch.int32)
    args = (torch.zeros(1, dtype=torch.int64), torch.tensor([L - 1]), keys,
            torch.tensor([keys.shape[1]], dtype=torch.int32), 0.125)
    assert torch.equal(KERNEL.keyed_attention(q[:1].contiguous(), k16, v16, *args),
                       KERNEL.keyed_attention(q[:1].contiguous(), k32, v32, *args))


@pytest.mark.parametrize("kv16", [False, True])
@pytest.mark.parametrize("nh,nkv,hd,L,T", [(9, 3, 64, 300, 16), (9, 3, 64, 77, 2), (9, 3, 64, 131, 5),
                                           (4, 1, 128, 200, 3), (8, 8, 64, 64, 7), (4, 2, 192, 95, 9)])
def test_the_16_lane_loops_give_the_8_lane_loops_bits(nh: int, nkv: int, hd: int, L: int, T: int,
                                                      kv16: bool) -> None:
    """Where the CPU has AVX-512F a tree's cached keys and values go through 16-lane loops (two
    rows a register, wider value rows); each lane runs the 8-lane loop's FMA chain, so forcing
    the 8-lane loops (as the AVX2 variant runs) must not change a bit, odd row counts included."""
    q, k, v, tree, pos = _inputs(nh, nkv, hd, L, T, seed=L + T + hd)
    if kv16:
        k, v = k.half(), v.half()
    try:
        KERNEL.use_wide_attention(True)
        if not KERNEL.attention_wide:
            pytest.skip("no AVX-512F here: only the 8-lane loops run")
        wide = _attend(q, k, v, L, tree, pos)
        KERNEL.use_wide_attention(False)
        narrow = _attend(q, k, v, L, tree, pos)
    finally:
        KERNEL.choose_variant(native.forced_variant())
    assert torch.equal(wide, narrow)


def test_other_cache_types_are_refused() -> None:
    q, k, v, tree, pos = _inputs(9, 3, 64, 5, 2, seed=0)
    with pytest.raises(TypeError, match="fp32 or fp16"):
        _attend(q, k.bfloat16(), v.bfloat16(), 5, tree, pos)
