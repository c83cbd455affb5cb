"""The one-call native decoder (engine/kernels/decoder.c) against the per-op forward.

The promise: running all layers in one native call changes nothing but the time. Logits, the
captured layer inputs (EAGLE-3 features) and the KV cache are bit-identical to the per-op path
for prefill, a draft tree and plain decoding, with fp32 and stored-format weights, biases and
sliding windows; models the native decoder cannot run (q/k norms) keep the per-op path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.kernels import native
from engine.models.gguf_weights import load_gguf_state
from engine.models.llama import LlamaConfig, LlamaModel
from engine.models.paths import NativeDecoderPath, NativeOpsPath
from engine.tree import DraftTree
from tests.test_stored_weights import VOCAB, write_model_gguf
from tests.tiny import our_model

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")


def _steps(model: LlamaModel, vocab: int) -> dict[str, object]:
    """Prefill (with captures), a tree with mixed depths, then plain decoding of two tokens."""
    gen = torch.Generator().manual_seed(1)
    cache = model.new_cache(64)
    last = model.config.num_layers
    prefill = model.forward(torch.randint(0, vocab, (13,), generator=gen), cache, capture_layers=(0, 1, last),
                            return_hidden=True)
    cache.commit(13)
    tree = DraftTree((5, 6, 7, 8, 9, 10), (-1, 0, 0, 1, 1, 3), (1.0,) * 6)
    tokens, positions = torch.tensor(tree.tokens), torch.tensor(tree.depths) + 13
    verify = model.forward(tokens, cache, positions=positions, tree_mask=tree.ancestor_mask(), capture_layers=(1,))
    cache.commit([0, 1, 3])
    plain = [model.forward(torch.tensor([t]), cache, logits="last") for t in (11, 12)]
    for _ in plain:
        cache.commit(1)
    return {
        "logits": [prefill.logits, verify.logits, *(p.logits for p in plain)],
        "hidden": prefill.hidden,
        "aux": [*prefill.aux, *verify.aux],
        "kv": (cache.k[:, :, : cache.length].clone(), cache.v[:, :, : cache.length].clone()),
    }


def _assert_paths_equal(model: LlamaModel, vocab: int) -> None:
    assert isinstance(model._path, NativeDecoderPath)
    fast = _steps(model, vocab)
    decoder, model._path = model._path, NativeOpsPath(model.config, model.layers, model.ops)
    try:
        slow = _steps(model, vocab)
    finally:
        model._path = decoder
    for a, b in zip(fast["logits"], slow["logits"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(fast["hidden"], slow["hidden"])
    assert len(fast["aux"]) == len(slow["aux"]) == 4
    assert all(torch.equal(a, b) for a, b in zip(fast["aux"], slow["aux"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(fast["kv"], slow["kv"], strict=True))


@pytest.mark.parametrize("family", ["llama", "llama3_scaled", "mistral", "qwen2", "smollm2_tied"])
def test_native_decoder_equals_per_op_forward(family: str) -> None:
    # head_dim 16: with 8, torch multiplies the rotation's complex numbers in a scalar loop that
    # fuses a*c - b*d into an FMA, so the per-op path itself rounds differently by shape; from 16
    # on it runs the vectorized product, the plain two-rounding formula decoder.c computes.
    model, _ = our_model(family, num_hidden_layers=3, hidden_size=64, head_dim=16)
    _assert_paths_equal(model, 97)


def test_native_decoder_equals_per_op_forward_on_stored_gguf_weights(tmp_path: Path) -> None:
    """Q4_K/Q6_K/Q4_1/Q4_0/Q8_0/bf16/f16/f32 layers, q|k|v split into parts of mixed formats."""
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    model = LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")
    assert model.weights == "stored"
    _assert_paths_equal(model, VOCAB)


def test_native_decoder_equals_per_op_forward_in_the_fast_precision(tmp_path: Path) -> None:
    """The fast precision's fp16 KV cache: decoder.c rounds each K/V value with F16C where the
    per-op path assigns fp32 rows into the fp16 tensor (torch's rounding): the same bits, and the
    same attention over them."""
    if native.load().fast_variant is None:
        pytest.skip("no fast kernel on this CPU")
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    model = LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")
    model.precision = "fast"
    assert model.new_cache(8).k.dtype == torch.float16
    _assert_paths_equal(model, VOCAB)


def test_a_cache_made_for_the_other_precision_is_refused(tmp_path: Path) -> None:
    if native.load().fast_variant is None:
        pytest.skip("no fast kernel on this CPU")
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    model = LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")
    exact_cache = model.new_cache(8)
    model.precision = "fast"
    with pytest.raises(ValueError, match="new_cache"):
        model.forward(torch.tensor([1, 2]), exact_cache)
    fast_cache = model.new_cache(8)
    model.precision = "exact"
    with pytest.raises(ValueError, match="new_cache"):
        model.forward(torch.tensor([1, 2]), fast_cache)


def test_q_k_norm_models_keep_the_per_op_path() -> None:
    model, _ = our_model("qwen3")
    assert type(model._path) is NativeOpsPath
    assert model.forward(torch.tensor([3, 4, 5]), model.new_cache(8)).logits.shape == (3, 97)


def test_switch_turns_the_native_decoder_off(monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_NATIVE_DECODER", "0")
    model, _ = our_model("llama")
    assert type(model._path) is NativeOpsPath and model.kernels == "native"
