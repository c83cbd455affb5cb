"""The invariant linears on the model's CUDA path (fake CUDA, tests/gpu/fake_cuda.py; kernels interpreted).

Which kernels a bf16 model on CUDA runs is decided when its layers are built: by default every
linear (q|k|v, o, gate|up, down, lm_head, and a draft head's, all ``engine.kernels.linear.Linear``)
takes engine/gpu/linear.py's Triton kernel and every norm engine/gpu/rms_norm.py's;
``SPECCHAT_CUDA_LINEAR=cublas`` gives ``F.linear`` and ``F.rms_norm``. The last test is the point
of it all: a token's logits are the same bits verified in a chain of 4 as decoded alone.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.errors import UserError
from engine.gpu.linear import active_name, cuda_linear
from engine.models.llama import LlamaConfig, LlamaModel
from tests.gpu.fake_cuda import fake_cuda
from tests.tiny import hf_model

PROMPT = [1, 10, 11, 12, 13]
CHAIN = [20, 21, 22, 23]


@pytest.fixture
def gpu(interpret, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Fake CUDA with the Triton kernels launched (interpreted)."""
    with fake_cuda(monkeypatch, kernels=True) as state:
        yield state


@functools.cache
def _weights() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    hf, cfg = hf_model("llama", 0, num_hidden_layers=2)
    return cfg, {k: v.detach().clone() for k, v in hf.state_dict().items()}


def bf16_model() -> LlamaModel:
    cfg, sd = _weights()
    return LlamaModel(LlamaConfig.from_dict(cfg), dict(sd), dtype=torch.bfloat16, device="cuda")


def linears(model: LlamaModel) -> list[Any]:
    return [model.lm_head, *(lin for layer in model.layers for lin in layer.linears)]


def test_the_switch_names_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_CUDA_LINEAR", raising=False)
    assert active_name() == "invariant"
    monkeypatch.setenv("SPECCHAT_CUDA_LINEAR", "cuBLAS")
    assert active_name() == "cublas"
    monkeypatch.setenv("SPECCHAT_CUDA_LINEAR", "fast")
    with pytest.raises(UserError, match=r"use invariant .* or cublas"):
        active_name()


def test_bf16_linears_and_norms_take_the_invariant_kernels_by_default(gpu, monkeypatch) -> None:
    monkeypatch.delenv("SPECCHAT_CUDA_LINEAR", raising=False)
    monkeypatch.setenv("SPECCHAT_CUDA_GRAPHS", "0")  # one static forward (a capture runs three)
    model = bf16_model()
    assert model.kernels == "invariant"
    assert {lin.layout for lin in linears(model)} == {"invariant"}
    calls = _count_torch_ops(monkeypatch)
    cache = model.new_cache(64)
    model.forward(torch.tensor(PROMPT), cache)
    layers = model.config.num_layers
    assert gpu.launches["invariant_linear"] == 4 * layers + 1  # qkv, o, gate_up, down a layer; lm_head
    assert gpu.launches["rms_norm"] == 2 * layers + 1
    assert calls == {"linear": 0, "rms_norm": 0}


def test_the_cublas_switch_gives_torch_linears_and_norms(gpu, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CUDA_LINEAR", "cublas")
    monkeypatch.setenv("SPECCHAT_CUDA_GRAPHS", "0")
    model = bf16_model()
    assert model.kernels == "torch"
    assert {lin.layout for lin in linears(model)} == {"torch"}
    calls = _count_torch_ops(monkeypatch)
    model.forward(torch.tensor(PROMPT), model.new_cache(64))
    assert "invariant_linear" not in gpu.launches and "rms_norm" not in gpu.launches
    layers = model.config.num_layers
    assert calls["linear"] == 4 * layers + 1 and calls["rms_norm"] >= 2 * layers + 1  # the mode may count twice


@pytest.mark.parametrize(("linear", "launches"), [("invariant", 1), ("cublas", 0)])
def test_cuda_linear_follows_the_switch(gpu, monkeypatch, linear: str, launches: int) -> None:
    monkeypatch.setenv("SPECCHAT_CUDA_LINEAR", linear)
    x = torch.randn(3, 32).to("cuda", torch.bfloat16)
    w = torch.randn(8, 32).to("cuda", torch.bfloat16)
    y = cuda_linear(x, w)
    assert y.is_cuda and y.shape == (3, 8) and gpu.launches.get("invariant_linear", 0) == launches
    torch.testing.assert_close(y.cpu().float(), (x.cpu().float() @ w.cpu().float().T), rtol=2**-7, atol=1e-2)


def test_fp32_models_keep_cublas(gpu, monkeypatch) -> None:
    """The kernel multiplies 16-bit weights; an fp32 model on CUDA stays on F.linear."""
    monkeypatch.delenv("SPECCHAT_CUDA_LINEAR", raising=False)
    cfg, sd = _weights()
    model = LlamaModel(LlamaConfig.from_dict(cfg), dict(sd), device="cuda")
    assert model.kernels == "torch"


@pytest.mark.parametrize("linear", ["invariant", "cublas"])
def test_a_token_verified_in_a_chain_has_its_decoded_logits(gpu, monkeypatch, linear: str) -> None:
    """Four tokens verified in one forward (bucket 4) against the same four decoded one by one
    (bucket 1): bit-identical logits on the invariant path. On ``cublas`` (here: torch's CPU bf16
    products behind the fake device) nothing promises it, and the test only shows the run. Graphs
    off: a replay re-runs the same launches, and the interpreter is slow. (At this model's widths
    an fp32 reordering rarely crosses a bf16 rounding; tests/gpu/test_invariant_kernels.py shows
    its check catching a K order that follows the row count.)"""
    monkeypatch.setenv("SPECCHAT_CUDA_LINEAR", linear)
    monkeypatch.setenv("SPECCHAT_CUDA_GRAPHS", "0")
    model = bf16_model()
    together = model.new_cache(64)
    model.forward(torch.tensor(PROMPT), together)
    together.commit(len(PROMPT))
    verified = model.forward(torch.tensor(CHAIN), together).logits
    alone = model.new_cache(64)
    model.forward(torch.tensor(PROMPT), alone)
    alone.commit(len(PROMPT))
    decoded = []
    for token in CHAIN:
        decoded.append(model.forward(torch.tensor([token]), alone).logits)
        alone.commit(1)
    same = [torch.equal(verified[i], row[0]) for i, row in enumerate(decoded)]
    if linear == "invariant":
        assert all(same), f"rows whose logits differ: {[i for i, s in enumerate(same) if not s]}"

    assert model._static is not None and not model._static.graphs  # the static path served every forward


def _count_torch_ops(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count F.linear and F.rms_norm calls (the engine looks both up on the module at call time)."""
    calls = {"linear": 0, "rms_norm": 0}
    for name in calls:
        original = getattr(F, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(F, name, counted)
    return calls
