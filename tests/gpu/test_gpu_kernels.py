"""Each Triton kernel against its torch reference: on CPU tensors under the interpreter where there
is no GPU, compiled on CUDA tensors where there is one (the ``kernel_device`` fixture). Small
shapes: the interpreter runs every program in Python. Inputs are drawn on the host (seeded) and
moved to the device, so both runs check the same cases."""

from __future__ import annotations

import pytest
import torch

from engine.gpu.accept import (
    _tree_tensors,
    _verdict,
    greedy_walk,
    greedy_walk_reference,
    sampling_walk,
    sampling_walk_reference,
    verify_greedy_gpu,
    verify_sampling_gpu,
)
from engine.gpu.kv_compact import compact_kv, compact_kv_reference
from engine.gpu.tree_attention import allowed_keys, tree_attention, tree_attention_reference
from engine.tree import DraftTree
from engine.verify import verify_greedy, verify_sampling
from tests.numerics import assert_rounds_within


def random_tree(n: int, seed: int, vocab: int = 6) -> DraftTree:
    """Random shape, distinct siblings, tokens from a small vocabulary so walks go deep."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    tokens = [int(torch.randint(0, vocab, (1,), generator=g))]
    for i in range(1, n):
        taken = {tokens[j] for j in range(1, i) if parents[j] == parents[i]}
        t = int(torch.randint(0, vocab, (1,), generator=g))
        while t in taken:
            t = (t + 1) % max(vocab, n)
        tokens.append(t)
    return DraftTree(tuple(tokens), tuple(parents), (1.0,) * n)


# ---- tree attention ------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "window"),
                         [(4, 4, 16, None), (4, 2, 24, None), (6, 2, 16, 20), (4, 1, 32, 9)])
def test_tree_attention_matches_reference(kernel_device, dtype, atol, heads, kv_heads, head_dim, window) -> None:
    dev = kernel_device
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    T, L, capacity = 9, 37, 64
    tree = random_tree(T, seed=head_dim)
    q = torch.randn(T, heads, head_dim, generator=g).to(dev, dtype)
    k = torch.randn(kv_heads, capacity, head_dim, generator=g).to(dev, dtype)
    v = torch.randn(kv_heads, capacity, head_dim, generator=g).to(dev, dtype)
    positions = (torch.tensor(tree.depths) + L).to(dev)
    mask = tree.ancestor_mask(dev)
    length = torch.tensor([L], dtype=torch.int32, device=dev)
    out = tree_attention(q, k, v, length, mask, positions, head_dim**-0.5, window)
    ref = tree_attention_reference(q, k, v, L, mask, positions, head_dim**-0.5, window)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)


def test_tree_attention_prefill_is_causal_and_padded_rows_are_ignored(kernel_device) -> None:
    """A causal mask over an empty prefix is a prompt prefill; rows past the tree's real nodes
    (bucket padding: they see only themselves) do not change the real rows."""
    dev = kernel_device
    g = torch.Generator().manual_seed(5)
    T, real, hd = 8, 5, 16
    q = torch.randn(T, 2, hd, generator=g).to(dev)
    k = torch.randn(2, 16, hd, generator=g).to(dev)
    v = torch.randn(2, 16, hd, generator=g).to(dev)
    mask = torch.ones(T, T, dtype=torch.bool).tril_()
    mask[real:] = torch.eye(T, dtype=torch.bool)[real:]
    mask = mask.to(dev)
    positions = torch.arange(T, device=dev)
    zero = torch.tensor([0], dtype=torch.int32, device=dev)
    out = tree_attention(q, k, v, zero, mask, positions, hd**-0.5)
    alone = tree_attention(q[:real].contiguous(), k, v, zero, mask[:real, :real].contiguous(),
                           positions[:real], hd**-0.5)
    torch.testing.assert_close(out[:real], alone, atol=1e-6, rtol=1e-6)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:real].transpose(0, 1), k[:, :real], v[:, :real], is_causal=True, scale=hd**-0.5).transpose(0, 1)
    torch.testing.assert_close(out[:real], ref, atol=1e-5, rtol=1e-5)


SPLIT_SHAPES = [(9, 3, 64), (8, 2, 128)]  # GQA 3 (not a power of two) d64, GQA 4 d128


def _split_case(dev: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, T: int,
                seed: int, capacity: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, heads, head_dim, generator=g).to(dev)
    k = torch.randn(kv_heads, capacity, head_dim, generator=g).to(dev, dtype)
    v = torch.randn(kv_heads, capacity, head_dim, generator=g).to(dev, dtype)
    return q, k, v


def _attention_float64(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int,
                       tree_mask: torch.Tensor, positions: torch.Tensor, scale: float, window: int | None
                       ) -> torch.Tensor:
    """tree_attention_reference's attention in float64 on the CPU (that one computes in fp32, so its
    bits follow the host's BLAS): [T, heads, hd]."""
    T, heads, _ = q.shape
    group = heads // k_cache.shape[0]
    keys = k_cache[:, : length + T].cpu().double().repeat_interleave(group, dim=0)
    values = v_cache[:, : length + T].cpu().double().repeat_interleave(group, dim=0)
    scores = torch.einsum("thd,hsd->hts", q.cpu().double(), keys) * scale
    allowed = allowed_keys(length, tree_mask.cpu(), positions.cpu(), window)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hts,hsd->thd", torch.softmax(scores, dim=-1), values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 29])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SPLIT_SHAPES)
@pytest.mark.parametrize("T", [1, 3, 16])
def test_tree_attention_split_over_chunks_matches_reference(kernel_device, T, heads, kv_heads, head_dim, window,
                                                            dtype) -> None:
    """L = 70 over chunks of 16 keys: five prefix chunks (the last one shared with the tree's
    slots), combined in order; fp32 accumulation, so fp32 rounding away from the torch softmax."""
    dev = kernel_device
    L = 70
    q, k, v = _split_case(dev, heads, kv_heads, head_dim, dtype, T, seed=T * 7 + head_dim)
    tree = random_tree(T, seed=T + head_dim)
    positions = (torch.tensor(tree.depths) + L).to(dev)
    mask = tree.ancestor_mask(dev)
    length = torch.tensor([L], dtype=torch.int32, device=dev)
    out = tree_attention(q, k, v, length, mask, positions, head_dim**-0.5, window, chunk=16)
    # the reference in float64, not fp32 einsums: at 2e-6 the distance to an fp32 reference is partly
    # the host BLAS's own rounding (its kernel by shape, ISA, threads), to the exact result it is ours
    exact = _attention_float64(q, k, v, L, mask, positions, head_dim**-0.5, window)
    assert_rounds_within(out.cpu(), exact, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SPLIT_SHAPES)
def test_tree_attention_is_batch_invariant(kernel_device, heads, kv_heads, head_dim, window, dtype) -> None:
    """A row's bits do not depend on the launch it comes in. Chain: row i of a T-node verify
    launch equals (torch.equal) the T=1 decode launch made after committing nodes 0..i-1 into the
    prefix (length L+i), which is what greedy decoding computes; the tree's slots cross a chunk
    boundary (chunk 16, L = 41, T = 9). Tree: the first 3 nodes of a random 16-node tree give the
    same rows in a T=3 launch as in the T=16 one."""
    dev = kernel_device
    L, T, hd = 41, 9, head_dim
    q, k, v = _split_case(dev, heads, kv_heads, hd, dtype, T, seed=hd + 1)
    chain = torch.ones(T, T, dtype=torch.bool).tril_().to(dev)
    positions = torch.arange(L, L + T, device=dev)
    verify = tree_attention(q, k, v, torch.tensor([L], dtype=torch.int32, device=dev), chain, positions,
                            hd**-0.5, window, chunk=16)
    for i in range(T):
        decode = tree_attention(q[i:i + 1], k, v, torch.tensor([L + i], dtype=torch.int32, device=dev),
                                chain[:1, :1], positions[i:i + 1], hd**-0.5, window, chunk=16)
        assert torch.equal(verify[i], decode[0]), i
    tree = random_tree(16, seed=hd)
    q16, _, _ = _split_case(dev, heads, kv_heads, hd, dtype, 16, seed=hd + 2)
    mask = tree.ancestor_mask(dev)
    pos = (torch.tensor(tree.depths) + L).to(dev)
    length = torch.tensor([L], dtype=torch.int32, device=dev)
    big = tree_attention(q16, k, v, length, mask, pos, hd**-0.5, window, chunk=16)
    small = tree_attention(q16[:3].contiguous(), k, v, length, mask[:3, :3].contiguous(), pos[:3], hd**-0.5,
                           window, chunk=16)
    assert torch.equal(big[:3], small)


# ---- KV compaction -------------------------------------------------------------------------
@pytest.mark.parametrize("offsets", [[0], [0, 1, 2], [0, 2, 5, 6], [0, 3, 4, 9, 10]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_compaction_matches_reference(kernel_device, offsets, dtype) -> None:
    dev = kernel_device
    g = torch.Generator().manual_seed(len(offsets))
    k_ref = torch.randn(3, 2, 24, 12, generator=g).to(dtype)
    v_ref = torch.randn(3, 2, 24, 12, generator=g).to(dtype)
    k, v = k_ref.to(dev), v_ref.to(dev)
    padded = torch.tensor([*offsets] + [0] * (12 - len(offsets)), dtype=torch.int32, device=dev)
    compact_kv(k, v, 7, padded, torch.tensor([len(offsets)], dtype=torch.int32, device=dev))
    compact_kv_reference(k_ref, v_ref, 7, offsets)
    assert torch.equal(k.cpu(), k_ref) and torch.equal(v.cpu(), v_ref)


# ---- acceptance walks ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_greedy_walk_matches_reference_and_verify_greedy(kernel_device, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(3 + 10 * (seed % 3), seed, vocab=4)
    logits = torch.randn(len(tree), 8, generator=g)
    logits[:, :4] += 2.0  # the argmax usually lands in the tree's vocabulary: deep paths
    predicted = logits.argmax(-1)
    tokens, parents = _tree_tensors(tree, kernel_device)
    got = _verdict(greedy_walk(predicted.to(kernel_device), tokens, parents))
    assert got == greedy_walk_reference(predicted.tolist(), tree) == verify_greedy(tree, logits)
    assert verify_greedy_gpu(tree, logits.to(kernel_device)) == got


def test_greedy_walk_root_only_and_64_nodes(kernel_device) -> None:
    root = DraftTree.root_only(5)
    logits = torch.randn(1, 10)
    assert verify_greedy_gpu(root, logits.to(kernel_device)) == verify_greedy(root, logits)
    chain = DraftTree.chain(0, list(range(1, 64)))
    logits = torch.full((64, 70), -1.0)
    logits[torch.arange(64), torch.arange(1, 65)] = 1.0  # the target agrees with the whole chain
    got = verify_greedy_gpu(chain, logits.to(kernel_device))
    assert got == verify_greedy(chain, logits)
    assert len(got.accepted) == 63


def _sampling_case(seed: int, with_q: bool):
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(4 + 4 * (seed % 3), seed, vocab=5)
    V = 40
    bias = 3.0 * (torch.arange(V) < 5)
    probs = torch.softmax(torch.randn(len(tree), V, generator=g) + bias, -1)
    q = torch.softmax(torch.randn(len(tree), V, generator=g) + bias, -1) if with_q else None
    u = torch.rand(len(tree) + 1, generator=g)
    return tree, probs, q, u


@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_sampling_walk_matches_reference(kernel_device, seed, with_q) -> None:
    dev = kernel_device
    tree, probs, q, u = _sampling_case(seed, with_q)
    tokens, parents = _tree_tensors(tree, dev)
    got = _verdict(sampling_walk(probs.to(dev, copy=True), tokens, parents, u.to(dev),
                                 q.to(dev, copy=True) if with_q else None))
    assert got == sampling_walk_reference(probs, tree, u.tolist(), q)


@pytest.mark.parametrize("seed", range(4))
def test_verify_sampling_gpu_draws_its_uniforms_from_the_generator(kernel_device, seed) -> None:
    """The session-facing wrapper: temperature/top-p applied, T+1 uniforms from the (host)
    generator, so a seed fixes the verdict, and it is the reference walk's verdict for those uniforms."""
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(7, seed, vocab=4)
    logits = torch.randn(len(tree), 16, generator=g) + 2.0 * (torch.arange(16) < 4)
    on = logits.to(kernel_device)
    got = verify_sampling_gpu(tree, on, 0.8, 0.9, torch.Generator().manual_seed(seed))
    again = verify_sampling_gpu(tree, on, 0.8, 0.9, torch.Generator().manual_seed(seed))
    uniforms = torch.rand(len(tree) + 1, generator=torch.Generator().manual_seed(seed)).tolist()
    from engine.verify import target_probs

    assert got == again == sampling_walk_reference(target_probs(logits, 0.8, 0.9), tree, uniforms)


@pytest.mark.parametrize("seed", range(20))
def test_sampling_reference_accepts_like_engine_verify(seed) -> None:
    """With the same uniforms, in the same order, the point-mass walk refuses and accepts exactly
    the nodes engine.verify.verify_sampling does (the final draw uses a different sampler)."""
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(6 + seed % 5, seed, vocab=4)
    logits = torch.randn(len(tree), 12, generator=g) + 2.0 * (torch.arange(12) < 4)
    reference = verify_sampling(tree, logits, 1.0, 1.0, torch.Generator().manual_seed(seed))
    uniforms = torch.rand(len(tree) + 1, generator=torch.Generator().manual_seed(seed)).tolist()
    ours = sampling_walk_reference(torch.softmax(logits, -1), tree, uniforms)
    assert ours.accepted == reference.accepted


def test_sampling_walk_keeps_the_target_distribution() -> None:
    """The first committed token is distributed as the target's p at the root: with point-mass
    drafts (any fixed children) and with children drawn from the draft q without replacement
    (the setting the q rule is for). Monte Carlo on the reference walk."""
    p = torch.tensor([0.1, 0.4, 0.2, 0.25, 0.05])
    q = torch.tensor([0.05, 0.1, 0.6, 0.2, 0.05])
    g = torch.Generator().manual_seed(0)
    n = 4000
    for with_q in (False, True):
        counts = torch.zeros(5)
        for _ in range(n):
            if with_q:
                first, second = torch.multinomial(q, 2, replacement=False, generator=g).tolist()
            else:
                first, second = 2, 1
            tree = DraftTree((0, first, second), (-1, 0, 0), (1.0,) * 3)
            draft_q = q.repeat(3, 1) if with_q else None
            verdict = sampling_walk_reference(p.repeat(3, 1), tree, torch.rand(4, generator=g).tolist(), draft_q)
            token = tree.tokens[verdict.accepted[0]] if verdict.accepted else verdict.bonus
            counts[token] += 1
        assert (counts / n - p).abs().max() < 0.03, (with_q, counts / n)


# ---- the same kernels on a GPU -------------------------------------------------------------
def test_kernels_on_cuda(cuda) -> None:
    tree = random_tree(20, 3)
    T, L, hd = len(tree), 100, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, 8, hd, generator=g).to(cuda, torch.bfloat16)
    k = torch.randn(2, 256, hd, generator=g).to(cuda, torch.bfloat16)
    v = torch.randn(2, 256, hd, generator=g).to(cuda, torch.bfloat16)
    positions = (torch.tensor(tree.depths) + L).to(cuda)
    mask = tree.ancestor_mask(cuda)
    out = tree_attention(q, k, v, torch.tensor([L], dtype=torch.int32, device=cuda), mask, positions, hd**-0.5)
    ref = tree_attention_reference(q, k, v, L, mask, positions, hd**-0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    logits = torch.randn(T, 300, generator=g)
    assert verify_greedy_gpu(tree, logits.to(cuda)) == verify_greedy(tree, logits)
    tree_s, probs, qd, u = _sampling_case(1, True)
    tokens, parents = _tree_tensors(tree_s, cuda)
    got = _verdict(sampling_walk(probs.to(cuda), tokens, parents, u.to(cuda), qd.to(cuda)))
    assert got == sampling_walk_reference(probs, tree_s, u.tolist(), qd)


# ---- launch properties (no GPU needed to check them) -----------------------------------------
@pytest.mark.parametrize(("kernel", "arg"), [("greedy", "T"), ("sampling", "T"), ("kv_compact", "start")])
def test_arguments_that_change_every_step_are_not_specialized(monkeypatch, kernel: str, arg: str) -> None:
    """Triton compiles a variant per value class of a specialized int (1, multiples of 16, other):
    the tree size and the committed length change step to step, so specializing them would stall
    the first answers on compiles. Checked on the compiled kind of kernel (decorating compiles
    nothing)."""
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from engine.gpu import accept, kv_compact

    built = {**accept._build(), "kv_compact": kv_compact._build()}[kernel]
    params = {p.name: p for p in built.params}
    assert params[arg].do_not_specialize
    assert not any(p.do_not_specialize for name, p in params.items() if name != arg)


_BIG_COMPACTION = """
import os, sys
import torch
from engine.gpu.kv_compact import compact_kv
dev = torch.device(sys.argv[1])
cap, hd = 75_000_000, 16  # 1.2e9 elements a layer: layer 2 starts past 2**31
k = torch.empty(3, 1, cap, hd, dtype=torch.int8, device=dev)  # on the host, untouched pages cost nothing
v = torch.empty_like(k)
start = cap - 8
row = torch.arange(hd, dtype=torch.int8, device=dev)
k[2, 0, start + 3] = row
v[2, 0, start + 3] = row + 1
compact_kv(k, v, start, torch.tensor([0, 3], dtype=torch.int32, device=dev),
           torch.tensor([2], dtype=torch.int32, device=dev))
assert torch.equal(k[2, 0, start + 1], row) and torch.equal(v[2, 0, start + 1], row + 1)
"""


def test_kv_compaction_addresses_past_two_to_the_31_elements() -> None:
    """An 8B-shaped cache (32 layers x 8 KV heads x 64k slots x 128) puts layers past 2**31
    elements: offsets computed in int32 wrap and the copy lands elsewhere (or faults). Run in a child
    process so a fault fails this test only; on the host the kernel runs under the interpreter."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    if torch.cuda.is_available():
        env.pop("TRITON_INTERPRET", None)
        device = "cuda"
    else:
        env["TRITON_INTERPRET"] = "1"
        device = "cpu"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _BIG_COMPACTION, device], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
