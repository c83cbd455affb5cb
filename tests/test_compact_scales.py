"""K-quant scales kept factored (engine/kernels/scales.h): an fp16 factor per super-block and an int8
sub-scale per group, as the GGUF file stores them, instead of one fp32 scale (and offset) per group.

The promise: the kernels rebuild each group's fp32 scale as factor * sub, one exact product, so
every product in either precision and every kernel variant gives the bits it gave with the fp32
scales, while a step reads fewer bytes (Q4_K 4.6 bits a weight instead of 6, Q6_K 6.6 instead of
8, its codes kept at 6 bits: kind q6); and the factored form is kept only where it rebuilds every
scale exactly, whatever the file held.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.gpu.bandwidth import weight_bytes_per_token
from engine.kernels import native
from engine.kernels.stored import StoredLinear
from engine.kernels.weights import SCALES_F16, SCALES_FACTORED, QuantRows, StoredPanels, cat_rows
from engine.models.gguf_weights import load_gguf_state, quant_rows
from engine.models.llama import LlamaConfig, LlamaModel
from tests.test_stored_weights import VOCAB, gguf_bytes, reference, write_model_gguf

KERNEL = native.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no native kernel here")
K_QUANTS = {Q.Q4_K: SCALES_FACTORED + 3, Q.Q6_K: SCALES_FACTORED + 4}  # super-blocks of 8 / 16 groups


def _k_quant(qtype: Q, n: int = 37, k: int = 768, seed: int = 5) -> tuple[QuantRows, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = gguf_bytes(rng.standard_normal((n, k)).astype(np.float32) * 0.1, qtype, rng)
    return quant_rows(data, qtype.name, n, k), data


def _fp32_scales(panels: StoredPanels) -> StoredPanels:
    """The same weight as the kernels read it before: fp32 scales and offsets."""
    return dataclasses.replace(panels, compact_scales=None, compact_offsets=None, scale_form=0)


def _unfactored(rows: QuantRows) -> QuantRows:
    return dataclasses.replace(rows, scale_base=None, scale_sub=None, offset_base=None, offset_sub=None)


@pytest.fixture(params=list(K_QUANTS), ids=lambda q: q.name)
def k_quant(request) -> tuple[Q, QuantRows, np.ndarray]:
    rows, data = _k_quant(request.param)
    return request.param, rows, data


def test_k_quants_are_read_factored_and_decode_unchanged(k_quant) -> None:
    qtype, rows, data = k_quant
    panels = StoredPanels.from_rows(rows)
    assert panels.scale_form == K_QUANTS[qtype]
    assert (panels.compact_offsets is None) == (rows.offsets is None)
    dense = reference(data, qtype, rows.shape)
    assert torch.equal(rows.dequantize(), dense) and torch.equal(panels.dequantize(), dense)
    # what a product reads: codes, then one fp16 factor per 256 k and an int8 per group (and again
    # for Q4_K's offsets), where it read an fp32 scale per group
    n_pad, k = 48, rows.shape[1]
    codes = n_pad * k // 2 if qtype == Q.Q4_K else n_pad * k * 3 // 4  # 4 and 6 bits a code
    per_scale = n_pad * (k // 256 * 2 + k // rows.group)
    assert panels.nbytes == codes + per_scale * (2 if qtype == Q.Q4_K else 1)
    assert _fp32_scales(panels).nbytes == codes + n_pad * k // rows.group * 4 * (2 if qtype == Q.Q4_K else 1)
    assert StoredLinear([rows]).nbytes == panels.nbytes
    bits = panels.nbytes * 8 / (n_pad * k)
    assert bits == pytest.approx(4.625 if qtype == Q.Q4_K else 6.5625)


@needs_kernel
@pytest.mark.parametrize("m", range(1, 17))
def test_factored_products_give_the_bits_of_fp32_scales(k_quant, m: int, kernel_variant: str) -> None:
    """Exact and fast, every row count a tile takes (1..16: the one-row pair path, the fused and
    buffered exact tiles, tile_g32 and tile() of the fast ones), written and accumulated."""
    _, rows, _ = k_quant
    factored = StoredPanels.from_rows(rows)
    wide = _fp32_scales(factored)
    n, k = rows.shape
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 2
    x[0, 64:96] = 0  # a zero block: activation scale 0
    bias = torch.randn(n, generator=torch.Generator().manual_seed(100 + m))
    for product in (KERNEL.stored_linear, KERNEL.stored_linear_fast):
        for accumulate in (False, True):
            start = torch.randn(m, n, generator=torch.Generator().manual_seed(m))
            ours, theirs = start.clone(), start.clone()
            for weight, out in ((factored, ours), (wide, theirs)):
                ran = product(x, weight, bias, out, accumulate)  # the exact one returns None, the fast one True
                assert ran is None or ran
            assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), (product.__name__, accumulate)


def test_a_factoring_that_does_not_rebuild_every_scale_is_not_kept() -> None:
    """The reader's factoring is a hint: one sub-scale off, a factor that is no fp16, or a shape
    that does not tile the groups, and the weight keeps its fp32 scales (with the same answers)."""
    rows, _ = _k_quant(Q.Q4_K)
    sub = rows.scale_sub.clone()
    sub[5, 3] += 1
    assert StoredPanels.from_rows(dataclasses.replace(rows, scale_sub=sub)).scale_form == 0
    off = rows.offset_sub.clone()
    off[36, -1] += 1  # the offsets too: both factored or neither
    assert StoredPanels.from_rows(dataclasses.replace(rows, offset_sub=off)).scale_form == 0
    assert StoredPanels.from_rows(dataclasses.replace(rows, offset_base=None)).scale_form == 0
    base = rows.scale_base * (1 + 2**-20)  # between fp16 values
    assert StoredPanels.from_rows(dataclasses.replace(rows, scale_base=base, scales=base.repeat_interleave(
        8, dim=1) * rows.scale_sub.float())).scale_form == 0
    odd = dataclasses.replace(rows, scale_base=rows.scale_base[:, :2])  # 24 groups over 2 bases: 12, no power of 2
    assert StoredPanels.from_rows(odd).scale_form == 0
    assert StoredPanels.from_rows(_unfactored(rows)).scale_form == 0


def test_factored_scales_keep_their_signs_and_zeros() -> None:
    """Q4_K's offset -(dmin * m) is read as (-dmin) * m: the same bits, -0.0 where m is 0 included;
    Q6_K's sub-scales are signed (-128..127)."""
    rows, _ = _k_quant(Q.Q4_K)
    assert bool((rows.offset_sub == 0).any()) and bool((rows.offsets == 0).any())
    assert torch.equal(torch.signbit(rows.offsets), torch.signbit(rows.offset_base.repeat_interleave(8, 1)
                                                                  * rows.offset_sub.float()))
    q6, _ = _k_quant(Q.Q6_K)
    assert int(q6.scale_sub.min()) < 0 < int(q6.scale_sub.max())
    assert StoredPanels.from_rows(q6).scale_form == K_QUANTS[Q.Q6_K]


def test_row_picks_and_fused_parts_keep_the_factoring() -> None:
    """RoPE's row permutation and q|k|v's concatenation act on the factored scales too; parts of
    other formats drop it (the fused weight keeps fp32 scales) rather than mix two layouts."""
    q4k, _ = _k_quant(Q.Q4_K, n=32, k=256)
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    picked = q4k.rows(perm)
    assert torch.equal(picked.scale_sub, q4k.scale_sub[perm]) and torch.equal(picked.offset_base, q4k.offset_base[perm])
    assert StoredPanels.from_rows(picked).scale_form == K_QUANTS[Q.Q4_K]
    fused = cat_rows([q4k, picked])
    assert fused is not None and StoredPanels.from_rows(fused).scale_form == K_QUANTS[Q.Q4_K]
    plain = QuantRows.quantize_q4(torch.randn(16, 256))  # Q4_1-like, no factoring
    mixed = cat_rows([q4k, plain])
    assert mixed is not None and mixed.scale_base is None and StoredPanels.from_rows(mixed).scale_form == 0
    assert StoredPanels.from_rows(plain).scale_form == SCALES_F16  # fp16 copies where there is no factoring


@needs_kernel
def test_the_kernel_refuses_a_scale_form_that_does_not_fit() -> None:
    """stored_linear_fast takes no factored form whose super-blocks do not tile the row (or no form
    at all): the caller then runs the exact kernel."""
    rows, _ = _k_quant(Q.Q4_K, n=16, k=256)
    panels = StoredPanels.from_rows(rows)
    x, y = torch.randn(1, 256), torch.empty(1, 16)
    if KERNEL.fast_variant is None:
        pytest.skip("no fast kernel here")
    assert KERNEL.stored_linear_fast(x, panels, None, y, False)
    assert not KERNEL.stored_linear_fast(x, dataclasses.replace(panels, scale_form=SCALES_FACTORED + 4), None, y,
                                         False)  # 8 groups, super-blocks of 16
    assert not KERNEL.stored_linear_fast(x, dataclasses.replace(panels, scale_form=-1), None, y, False)


def _greedy(model: LlamaModel, prompt: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    cache = model.new_cache(64)
    logits = model.forward(prompt, cache).logits
    cache.commit(len(prompt))
    seen, tokens = [logits], []
    for _ in range(steps):
        tokens.append(int(seen[-1][-1].argmax()))
        seen.append(model.forward(torch.tensor([tokens[-1]]), cache).logits)
        cache.commit(1)
    return tokens, seen


def _q8_codes(rows: QuantRows) -> QuantRows:
    """Q6_K weights as they were read before kind q6: their q8 form."""
    return rows.to_q8() if rows.kind == "q6" else rows


@pytest.mark.parametrize("plain", [_unfactored, _q8_codes], ids=["fp32 scales", "q8 codes"])
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_a_gguf_model_reads_fewer_bytes_for_the_same_tokens_and_logits(tmp_path: Path, precision: str, plain,
                                                                       each_variant: str) -> None:
    """A tiny Q4_K_M-like model (Q4_K, Q6_K lm_head and ffn_down, Q4_1, Q8_0, f16, bf16 beside):
    with factored scales and Q6_K's codes at 6 bits, it reads fewer weight bytes a step, and its
    prefill logits, greedy tokens and each step's logits are those of the same model with fp32
    scales, and of the same model with Q6_K read as 8-bit codes."""
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    plain_state = {k: plain(v) if isinstance(v, QuantRows) else v for k, v in state.items()}
    models = [LlamaModel(LlamaConfig.from_dict(config), dict(s), weights="stored") for s in (state, plain_state)]
    if models[0].weights != "stored":
        pytest.skip("no native kernels: stored weights are dequantized at load")
    if precision == "fast" and (KERNEL is None or KERNEL.fast_variant is None):
        pytest.skip("no fast kernel here")
    forms = {p.scale_form for p in models[0].lm_head.parts} | {p.scale_form for p in models[0].layers[0].down.parts}
    assert forms == {K_QUANTS[Q.Q6_K]}
    assert {p.kind for p in models[0].lm_head.parts} == {"q6"}
    assert weight_bytes_per_token(models[0]) < weight_bytes_per_token(models[1])
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(1))
    runs = []
    for model in models:
        model.precision = precision
        runs.append(_greedy(model, prompt, 12))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
