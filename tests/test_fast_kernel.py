"""The fast precision (engine/kernels/fast.c): 8-bit activations, integer products on stored blocks.

The promises: the kernel computes exactly the torch definition in engine/kernels/fast.py, bit
for bit, for every GGUF block format it takes (Q4_0, Q4_1, Q4_K, Q8_0, Q6_K) and any row count;
a row's result does not depend on the rows beside it (batch invariance, what keeps speculation
lossless against the fast baseline); a model in the fast precision gives every token of a
prefill or a rows forward the logits a one-token step gives it; and it stays close to exact.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.kernels import native
from engine.kernels.fast import fast_linear_reference, quantize_activations
from engine.kernels.stored import StoredLinear
from engine.kernels.weights import SCALES_F16, QuantRows, StoredPanels
from engine.models.gguf_weights import load_gguf_state, quant_rows
from engine.models.kv_cache import KVCache
from engine.models.llama import LlamaConfig, LlamaModel
from tests.test_stored_weights import VOCAB, gguf_bytes, write_model_gguf

KERNEL = native.load()
FAST = KERNEL is not None and KERNEL.fast_variant is not None
needs_fast = pytest.mark.skipif(not FAST, reason="no fast kernel here (needs the native kernel: AVX2)")
INT_FORMATS = [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q8_0, Q.Q6_K]


@pytest.fixture(params=INT_FORMATS, ids=lambda q: q.name)
def weight(request):
    rng = np.random.default_rng(2)
    n, k = 37, 512
    data = gguf_bytes(rng.standard_normal((n, k)).astype(np.float32) * 0.1, request.param, rng)
    return quant_rows(data, request.param.name, n, k)


def test_activation_quantization_is_within_half_a_step() -> None:
    x = torch.randn(3, 64) * torch.tensor([1.0, 100.0, 1e-3])[:, None]
    x[0, :32] = 0
    xq, d, sums = quantize_activations(x, 32)
    assert xq.abs().max() <= 127 and torch.equal(sums, xq.view(3, 2, 32).sum(-1))
    assert d[0, 0] == 0 and (xq[0, :32] == 0).all()
    back = xq.view(3, 2, 32).float() * d[..., None]
    assert ((back - x.view(3, 2, 32)).abs() <= d[..., None] / 2 + 1e-12).all()


@needs_fast
@pytest.mark.parametrize("m", [1, 2, 5, 12, 13, 16, 17, 30])
def test_kernel_equals_the_torch_definition_and_is_row_invariant(weight, m: int, kernel_variant: str) -> None:
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, weight.shape[1], generator=gen) * 0.5
    x[0, 32:64] = 0  # a zero block: scale 0
    bias = torch.randn(weight.shape[0], generator=gen)
    panels = StoredPanels.from_rows(weight)
    y = torch.empty(m, weight.shape[0])
    assert KERNEL.stored_linear_fast(x, panels, bias, y, False)
    assert torch.equal(y, fast_linear_reference(x, weight, bias))
    for r in range(m):
        one = torch.empty(1, weight.shape[0])
        KERNEL.stored_linear_fast(x[r:r + 1].contiguous(), panels, bias, one, False)
        assert torch.equal(one[0], y[r])
    acc = torch.ones(m, weight.shape[0])
    KERNEL.stored_linear_fast(x, panels, bias, acc, True)
    assert torch.equal(acc, 1 + y)


@needs_fast
@pytest.mark.parametrize("m", [1, 4, 7, 16, 21])
def test_every_variant_gives_the_same_bits(weight, m: int) -> None:
    """The AVX2 tiles (vpmaddubsw + vpmaddwd), the VNNI ones (vpdpbusd on 16 lanes, or 8 with
    AVX-VNNI) and the AMX ones (tdpbsud, tdpbssd) sum the same exact integers and scale them in the
    same float steps."""
    KERNEL.choose_variant("avxvnni")
    vnni256 = ["avxvnni"] if KERNEL.fast_variant == "avxvnni" else []
    KERNEL.choose_variant("")
    variants = {"amx": ["", "avx512", *vnni256, "avx2"], "avx512vnni": ["", *vnni256, "avx2"],
                "avxvnni": ["", "avx2"]}.get(KERNEL.fast_variant)
    if variants is None:
        pytest.skip("this CPU has only the AVX2 tiles")
    x = torch.randn(m, weight.shape[1], generator=torch.Generator().manual_seed(9)) * 3
    x[:, :32] *= 1e-3  # a small block beside big ones
    panels = StoredPanels.from_rows(weight)
    outs = []
    try:
        for force in variants:
            KERNEL.choose_variant(force)
            y = torch.empty(m, weight.shape[0])
            assert KERNEL.stored_linear_fast(x, panels, None, y, False)
            outs.append(y)
    finally:
        KERNEL.choose_variant(native.forced_variant())
    for y in outs[1:]:
        assert torch.equal(outs[0], y)


@needs_fast
@pytest.mark.parametrize("m", [1, 3, 16, 17])
def test_the_fp16_copies_of_scales_give_the_bits_of_the_fp32_ones(weight, m: int, kernel_variant: str) -> None:
    """The GGUF kinds keep fp16 scales (and offsets), so both products read fp16 copies of them
    (fewer bytes a step); widened they are the same floats, so the outputs do not change."""
    panels = StoredPanels.from_rows(weight)
    if weight.kind in ("q4", "q8") and torch.equal(weight.scales.half().float(), weight.scales):
        assert panels.scale_form == SCALES_F16 and panels.compact_scales.dtype == torch.float16
        assert (panels.compact_offsets is None) == (panels.offsets is None)
    if panels.scale_form != SCALES_F16:
        pytest.skip("this format's scales are not all fp16 values: no fp16 copies")
    wide = dataclasses.replace(panels, compact_scales=None, compact_offsets=None, scale_form=0)
    assert panels.nbytes < wide.nbytes  # what a product reads
    x = torch.randn(m, weight.shape[1], generator=torch.Generator().manual_seed(m)) * 2
    y16, y32 = torch.empty(m, weight.shape[0]), torch.empty(m, weight.shape[0])
    assert KERNEL.stored_linear_fast(x, panels, None, y16, False)
    assert KERNEL.stored_linear_fast(x, wide, None, y32, False)
    assert torch.equal(y16, y32)


@needs_fast
@pytest.mark.parametrize("kind,group", [("q4", 32), ("q4", 64), ("q8", 32), ("q8", 64)])
def test_fp16_copies_in_every_tile(kind: str, group: int, kernel_variant: str) -> None:
    """Groups of 32 take tile_g32, others tile() (and every group the AVX2 tile): each reads the
    fp16 copies to the bits of the torch definition."""
    gen = torch.Generator().manual_seed(group)
    rows = (QuantRows.quantize_q4 if kind == "q4" else QuantRows.quantize_q8)(torch.randn(40, 256, generator=gen),
                                                                              group)
    rows = QuantRows(kind, group, rows.codes, rows.scales.half().float(),
                     None if rows.offsets is None else rows.offsets.half().float())
    panels = StoredPanels.from_rows(rows)
    assert panels.scale_form == SCALES_F16
    for m in (1, 7, 16, 18):
        x = torch.randn(m, 256, generator=gen)
        y = torch.empty(m, 40)
        assert KERNEL.stored_linear_fast(x, panels, None, y, False)
        assert torch.equal(y, fast_linear_reference(x, rows))


def test_scales_that_are_not_fp16_values_get_no_copies() -> None:
    rows = QuantRows.quantize_q4(torch.randn(16, 64, generator=torch.Generator().manual_seed(1)))
    panels = StoredPanels.from_rows(rows)  # the head quantizer keeps Q4_1's fp16 scales and offsets
    assert panels.scale_form == SCALES_F16 and panels.compact_offsets is not None
    assert torch.equal(panels.compact_scales.float(), panels.scales)
    assert torch.equal(panels.compact_offsets.float(), panels.offsets)
    off_grid = rows.scales * (1 + 2**-15)  # between fp16 values
    assert StoredPanels.from_rows(QuantRows("q4", 32, rows.codes, off_grid, rows.offsets)).compact_scales is None
    offsets_off_grid = QuantRows("q4", 32, rows.codes, rows.scales, rows.offsets * (1 + 2**-15))
    assert StoredPanels.from_rows(offsets_off_grid).scale_form == 0  # both copies or neither


@needs_fast
def test_fast_is_close_to_exact(weight) -> None:
    x = torch.randn(4, weight.shape[1])
    exact = x @ weight.dequantize().T
    fast = fast_linear_reference(x, weight)
    assert (fast - exact).abs().max() <= 0.02 * exact.abs().max()


def test_float_kinds_have_no_fast_product() -> None:
    lin = StoredLinear([StoredPanels.from_rows(quant_rows(np.zeros((16, 32), np.float32), "F32", 16, 32)).to_rows()])
    if FAST:
        assert not KERNEL.stored_linear_fast(torch.zeros(1, 32), lin.parts[0], None, torch.empty(1, 16), False)
    with pytest.raises(ValueError, match="no integer product"):
        fast_linear_reference(torch.zeros(1, 32), lin.parts[0].to_rows())


@pytest.fixture(scope="module")
def fast_model(tmp_path_factory) -> LlamaModel:
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    write_model_gguf(path, tied=False)
    config, state = load_gguf_state(path)
    return LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")


@needs_fast
def test_fast_model_rows_equal_one_token_steps(fast_model: LlamaModel, kernel_variant: str) -> None:
    """Prefill of 9 tokens, then plain steps: every row's logits equal the one-token forward's, and
    a rows forward of two sequences gives them too."""
    model = fast_model
    model.precision = "fast"
    try:
        tokens = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0))
        batch = model.forward(tokens, model.new_cache(16)).logits
        cache = model.new_cache(16)
        for i, t in enumerate(tokens.tolist()):
            assert torch.equal(model.forward(torch.tensor([t]), cache).logits[0], batch[i])
            cache.commit(1)
        c = model.config
        rows = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, 32, dtype=model.kv_dtype)
        both = torch.cat([tokens, tokens[:4]])
        seg = torch.tensor([0] * 9 + [16] * 4)
        slots = torch.cat([torch.arange(9), 16 + torch.arange(4)])
        out = model.forward_rows(both, rows, seg, slots, logits_at=torch.arange(13))
        assert torch.equal(out.logits[:9], batch) and torch.equal(out.logits[9:], batch[:4])
        model.precision = "exact"
        exact = model.forward(tokens, model.new_cache(16)).logits
        assert not torch.equal(exact, batch)  # another arithmetic (closeness: test_fast_is_close_to_exact)
    finally:
        model.precision = "exact"


def test_fast_precision_is_refused_where_it_cannot_run(tmp_path: Path) -> None:
    write_model_gguf(tmp_path / "m.gguf", tied=True)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    model = LlamaModel(LlamaConfig.from_dict(config), state, weights="fp32")
    with pytest.raises(ValueError, match="needs stored weights"):
        model.precision = "fast"
    assert model.precision == "exact"
    with pytest.raises(ValueError, match="exact or fast"):
        model.precision = "fp8"


@needs_fast
def test_data_engine_in_fast_precision_matches_the_one_row_path(fast_model: LlamaModel) -> None:
    from engine.train.data import _generate_native
    from engine.train.rows import Request, RowEngine

    model = fast_model
    model.precision = "fast"
    try:
        gen = torch.Generator().manual_seed(3)
        reqs = [Request(torch.randint(3, VOCAB, (n,), generator=gen).tolist(), 10, t, seed=i)
                for i, (n, t) in enumerate([(4, 0.0), (11, 1.0), (2, 0.0)])]
        done = {}
        engine = RowEngine(model, rows=2, row_capacity=32, stop_ids=[2])
        for r in reqs:
            r.on_done = lambda f: done.__setitem__(f.request.seed, f.new_ids)
            engine.submit(r)
        engine.run()
        for r in reqs:
            ref, _ = _generate_native(model, r.prompt, max_new_tokens=10, temperature=r.temperature,
                                      stop_ids=frozenset({2}), generator=torch.Generator().manual_seed(r.seed))
            assert done[r.seed] == ref
    finally:
        model.precision = "exact"


@needs_fast
@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_speculation_in_fast_precision_equals_the_fast_baseline(fast_model: LlamaModel, tmp_path: Path,
                                                                method: str) -> None:
    """Lossless against the baseline of the same precision: trees verified in one forward give the
    tokens plain fast decoding gives (batch invariance), with an n-gram and an EAGLE drafter."""
    from heads import write_head
    from tiny import TinyTokenizer

    from engine.config import SpecConfig
    from engine.drafters.base import NoDrafter
    from engine.drafters.draft_loader import load_draft
    from engine.drafters.ngram import NgramDrafter
    from engine.events import Step
    from engine.session import Session

    model = fast_model
    model.precision = "fast"
    try:
        c = model.config
        tok = TinyTokenizer(vocab_size=c.vocab_size)
        drafters, features = {"none": NoDrafter, "ngram": NgramDrafter}, None
        if method == "eagle":
            cfg = {"hidden_size": c.hidden_size, "num_attention_heads": c.num_heads,
                   "num_key_value_heads": c.num_kv_heads, "vocab_size": c.vocab_size}
            bundle = load_draft(str(write_head(tmp_path / "head", cfg, "eagle")), model, tok)
            drafters["eagle"], features = bundle.factory, bundle.features

        def run(m: str, prompt: list[int]) -> list[int]:
            session = Session(model, tok, SpecConfig(method=m, max_new_tokens=24, adaptive_draft=False,
                                                     num_steps=3, eagle_topk=2, num_draft_tokens=6),
                              drafters=drafters, features=features)
            return [t.id for e in session.generate_ids(prompt) if isinstance(e, Step) for t in e.committed]

        gen = torch.Generator().manual_seed(4)
        for n in (3, 9, 17):
            prompt = torch.randint(3, c.vocab_size, (n,), generator=gen).tolist() * 2
            assert run(method, prompt) == run("none", prompt)
    finally:
        model.precision = "exact"


@pytest.mark.skipif(KERNEL is None, reason="no native kernel")
def test_zero_rows_are_a_no_op_in_both_precisions(weight) -> None:
    panels = StoredPanels.from_rows(weight)
    x = torch.zeros(0, weight.shape[1])
    y = torch.empty(0, weight.shape[0])
    KERNEL.stored_linear(x, panels, None, y, False)  # used to call a null zero-row tile
    if FAST:
        assert KERNEL.stored_linear_fast(x, panels, None, y, False)


def test_q4_quantizer_rounds_to_the_nearest_of_16_levels() -> None:
    """QuantRows.quantize_q4 (Q4_1's recipe, for draft heads): codes 0..15, each value within half
    a step of its block's grid, a block's ends exact; the fast kernel takes its rows."""
    from engine.kernels.weights import QuantRows

    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(4))
    w[5, :32] = 0.25  # a flat block
    q = QuantRows.quantize_q4(w)
    assert q.kind == "q4" and q.codes.dtype == torch.uint8 and int(q.codes.max()) <= 15
    step = q.scales.repeat_interleave(32, dim=1)
    assert bool(((q.dequantize() - w).abs() <= step / 2 + 1e-6).all())
    assert torch.equal(q.dequantize()[5, :32], w[5, :32])
    if FAST:
        x = torch.randn(3, 96)
        y = torch.empty(3, 24)
        assert KERNEL.stored_linear_fast(x, StoredPanels.from_rows(q), None, y, False)
        assert torch.equal(y, fast_linear_reference(x, q))
