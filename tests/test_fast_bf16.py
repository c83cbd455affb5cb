"""The fast precision on bf16 weights (engine/kernels/fast_bf16.c): activations rounded to bf16,
products by vdpbf16ps where the CPU has AVX512_BF16, the exact kernel elsewhere.

The promises, as for the integer products (tests/test_fast_kernel.py): the kernel computes the
torch definition in engine/kernels/fast.py bit for bit, a row's result does not depend on the rows
beside it, a bf16 model in the fast precision gives a tree's rows the logits one-token steps give
them, so speculation equals the fast baseline; and an AVX2-class pick keeps the exact kernel.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import native
from engine.kernels.fast import fast_bf16_reference
from engine.kernels.stored import StoredLinear
from engine.kernels.weights import QuantRows, StoredPanels
from engine.models.llama import LlamaConfig, LlamaModel

KERNEL = native.load()
BF16 = KERNEL is not None and KERNEL.fast_bf16
needs_bf16 = pytest.mark.skipif(not BF16, reason="no bf16 products here (needs AVX512_BF16 and the native kernel)")


def bf16_rows(n: int, k: int, seed: int) -> QuantRows:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return QuantRows.from_tensor(w.to(torch.bfloat16))


@needs_bf16
@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 33])
@pytest.mark.parametrize("k", [64, 72, 30])  # 72, 30: a tail of the 16-value rounding loop
def test_kernel_equals_the_torch_definition_and_is_row_invariant(m: int, k: int) -> None:
    rows = bf16_rows(37, k, m)
    panels = StoredPanels.from_rows(rows)
    gen = torch.Generator().manual_seed(k + m)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]
    x[0, :8] = 0
    bias = torch.randn(37, generator=gen)
    y = torch.full((m, 37), float("nan"))
    assert KERNEL.stored_linear_fast(x, panels, bias, y, False)
    assert torch.equal(y, fast_bf16_reference(x, rows, bias))
    for r in range(m):  # each row alone: the same bits as among the others
        one = torch.empty(1, 37)
        assert KERNEL.stored_linear_fast(x[r:r + 1].contiguous(), panels, bias, one, False)
        assert torch.equal(one[0], y[r])
    acc = torch.ones(m, 37)
    KERNEL.stored_linear_fast(x, panels, bias, acc, True)
    assert torch.equal(acc, 1 + y)


@needs_bf16
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 40), pairs=st.integers(1, 60), n=st.integers(1, 40), seed=st.integers(0, 2**16),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_any_shape_is_the_definition_and_each_row_its_own(m: int, pairs: int, n: int, seed: int, scale: float) -> None:
    """The lossless invariant's root, as a property: whatever the rows, depth and width, each row of
    a call equals that row alone, and both equal the torch definition."""
    rows = bf16_rows(n, 2 * pairs, seed)
    panels = StoredPanels.from_rows(rows)
    x = torch.randn(m, 2 * pairs, generator=torch.Generator().manual_seed(seed)) * scale
    y = torch.empty(m, n)
    assert KERNEL.stored_linear_fast(x, panels, None, y, False)
    assert torch.equal(y, fast_bf16_reference(x, rows))
    r = seed % m
    alone = torch.empty(1, n)
    KERNEL.stored_linear_fast(x[r:r + 1].contiguous(), panels, None, alone, False)
    assert torch.equal(alone[0], y[r])


@needs_bf16
def test_a_column_slice_of_a_wider_output_is_written_in_place() -> None:
    """How StoredLinear writes a part of fused q|k|v: a view with a row stride wider than n."""
    rows = bf16_rows(20, 32, 1)
    x = torch.randn(3, 32)
    out = torch.zeros(3, 50)
    assert KERNEL.stored_linear_fast(x, StoredPanels.from_rows(rows), None, out[:, 10:30], False)
    assert torch.equal(out[:, 10:30], fast_bf16_reference(x, rows))
    assert not out[:, :10].any() and not out[:, 30:].any()


@needs_bf16
def test_stored_linear_takes_the_bf16_products_only_in_the_fast_precision() -> None:
    rows = bf16_rows(24, 48, 2)
    lin = StoredLinear([rows])
    x = torch.randn(4, 48)
    exact = lin(x)
    lin.fast = True
    assert torch.equal(lin(x), fast_bf16_reference(x, rows))
    assert not torch.equal(lin(x), exact)


def test_fast_bf16_is_close_to_exact() -> None:
    rows = bf16_rows(64, 256, 3)
    x = torch.randn(5, 256)
    exact = x @ rows.dequantize().T
    assert (fast_bf16_reference(x, rows) - exact).abs().max() <= 0.01 * exact.abs().max()


def test_the_reference_reads_bf16_denormals_as_zero() -> None:
    tiny = torch.tensor([[1e-39, 1.0]]).to(torch.bfloat16)  # a bf16 denormal, then a normal value
    rows = QuantRows.from_tensor(tiny)
    assert fast_bf16_reference(torch.tensor([[1e30, 2.0]]), rows).item() == 2.0
    with pytest.raises(ValueError, match="bf16 weights"):
        fast_bf16_reference(torch.zeros(1, 2), QuantRows.from_tensor(torch.zeros(1, 2)))


@pytest.mark.skipif(KERNEL is None, reason="no native kernel")
def test_odd_k_and_avx2_class_picks_keep_the_exact_kernel() -> None:
    """Nothing written, False returned: the caller runs the exact product (stored.c)."""
    odd = StoredPanels.from_rows(bf16_rows(16, 33, 4))
    y = torch.full((2, 16), 7.0)
    assert not KERNEL.stored_linear_fast(torch.randn(2, 33), odd, None, y, False)
    assert (y == 7).all()
    even = StoredPanels.from_rows(bf16_rows(16, 32, 5))
    try:
        for force in ("avx2", "avxvnni"):
            KERNEL.choose_variant(force)
            assert not KERNEL.fast_bf16
            assert not KERNEL.stored_linear_fast(torch.randn(2, 32), even, None, y, False)
    finally:
        KERNEL.choose_variant(native.forced_variant())


def tiny_llama(matrices: torch.dtype) -> LlamaModel:
    """The tiny random Llama with stored weights, its matrices in ``matrices`` (bf16: as a bf16 hub
    checkpoint loads)."""
    from tiny import hf_model

    hf, cfg = hf_model("llama", seed=5)
    sd = {k: v.detach().to(matrices) if v.dim() == 2 else v.detach().clone() for k, v in hf.state_dict().items()}
    return LlamaModel(LlamaConfig.from_dict(cfg), sd, weights="stored")


@pytest.fixture(scope="module")
def bf16_model() -> LlamaModel:
    return tiny_llama(torch.bfloat16)


@needs_bf16
def test_bf16_model_rows_equal_one_token_steps_and_take_the_bf16_products(bf16_model: LlamaModel) -> None:
    model = bf16_model
    assert {p.kind for lin in model._linears() for p in lin.parts} == {"bf16"}
    tokens = torch.randint(3, model.vocab_size, (9,), generator=torch.Generator().manual_seed(0))
    model.precision = "fast"
    try:
        batch = model.forward(tokens, model.new_cache(16)).logits
        cache = model.new_cache(16)
        for i, t in enumerate(tokens.tolist()):
            assert torch.equal(model.forward(torch.tensor([t]), cache).logits[0], batch[i])
            cache.commit(1)
        KERNEL.choose_variant("avx2")  # the same precision with the exact products on bf16 weights
        assert not torch.equal(model.forward(tokens, model.new_cache(16)).logits, batch)
    finally:
        KERNEL.choose_variant(native.forced_variant())
        model.precision = "exact"


@needs_bf16
def test_speculation_on_a_bf16_model_equals_the_fast_baseline(bf16_model: LlamaModel) -> None:
    """Greedy n-gram trees verified in one forward give the tokens plain fast decoding gives, on
    prompts that repeat themselves so that drafts are proposed, verified and accepted."""
    from tiny import TinyTokenizer

    from engine.config import SpecConfig
    from engine.drafters.base import NoDrafter
    from engine.drafters.ngram import NgramDrafter
    from engine.events import Step
    from engine.session import Session

    model = bf16_model
    model.precision = "fast"
    try:
        tok = TinyTokenizer(vocab_size=model.vocab_size)

        def run(m: str, prompt: list[int]) -> tuple[list[int], int]:
            session = Session(model, tok, SpecConfig(method=m, max_new_tokens=24, adaptive_draft=False),
                              drafters={"none": NoDrafter, "ngram": NgramDrafter})
            steps = [e for e in session.generate_ids(prompt) if isinstance(e, Step)]
            return [t.id for s in steps for t in s.committed], sum(s.accepted_len for s in steps)

        gen = torch.Generator().manual_seed(6)
        accepted = 0
        for n in (3, 9, 17):
            prompt = torch.randint(3, model.vocab_size, (n,), generator=gen).tolist() * 3
            ids, acc = run("ngram", prompt)
            assert ids == run("none", prompt)[0]
            accepted += acc
        assert accepted > 0  # trees of several tokens were verified, not only the root
    finally:
        model.precision = "exact"


@needs_bf16
def test_the_bench_title_names_the_bf16_products(bf16_model: LlamaModel) -> None:
    from specchat.bench_report import machine_info, variant_words

    assert bf16_model.stored_kinds == {"bf16"}
    words = variant_words(machine_info(bf16_model))
    assert words.endswith(f"fast: {KERNEL.fast_variant}+bf16")
    assert "+bf16" not in variant_words(machine_info(tiny_llama(torch.float32)))
