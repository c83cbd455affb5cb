"""``specchat bench --random-weights``: models from a config alone, the bandwidth arithmetic, and the
whole report on CPU with a tiny config (the same code measures the GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.gpu.bandwidth import bandwidth_report, peak_bandwidth_gbps, weight_bytes_per_token
from engine.models.random_init import NAMED_SHAPES, RandomModelError, random_config, random_model
from specchat.cli import main
from tests.tiny import family_config


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(family_config("qwen2")))
    return path


def test_shapes_by_name_and_by_config(tiny_config) -> None:
    name, cfg = random_config("llama-3.1-8b")
    assert name == "llama-3.1-8b" and cfg["hidden_size"] == 4096 and cfg["num_key_value_heads"] == 8
    assert random_config(str(tiny_config))[0] == "tiny"
    assert random_config(str(tiny_config.parent))[1]["model_type"] == "qwen2"
    with pytest.raises(RandomModelError, match="neither a shape name"):
        random_config("no-such-shape")
    assert set(NAMED_SHAPES) >= {"llama-3.1-8b", "smollm2-135m"}


def test_peak_bandwidth_by_gpu_name() -> None:
    assert peak_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert peak_bandwidth_gbps("NVIDIA H100 PCIe") == 2000
    assert peak_bandwidth_gbps("NVIDIA H200") == 4800
    assert peak_bandwidth_gbps("NVIDIA A100-SXM4-80GB") == 2039
    assert peak_bandwidth_gbps("NVIDIA A100-PCIE-40GB") == 1555
    assert peak_bandwidth_gbps("Some Future GPU") is None


def test_weight_bytes_count_every_matrix_once(tiny_config) -> None:
    _, model = random_model(str(tiny_config), dtype=torch.float32, device="cpu")
    c = model.config
    per_layer = (c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim  # q, k, v
                 + (c.num_kv_heads * 2 + c.num_heads) * c.head_dim  # qwen2 q/k/v biases
                 + c.num_heads * c.head_dim * c.hidden_size  # o
                 + 3 * c.hidden_size * c.intermediate_size  # gate, up, down
                 + 2 * c.hidden_size)  # norms
    want = 4 * (c.num_layers * per_layer + c.vocab_size * c.hidden_size + c.hidden_size)
    assert weight_bytes_per_token(model) == want
    report = bandwidth_report(10**9, 2.0, 1000.0)  # 1 GB in 2 ms = 500 GB/s of a 1000 GB/s peak
    assert report["achieved_gbps"] == 500 and report["fraction_of_limit"] == 0.5
    assert report["limit_tokens_per_s"] == 1000


def test_bench_bandwidth_line_needs_a_peak_on_cpu(tiny_config) -> None:
    from specchat.bench import baseline_bandwidth

    _, model = random_model(str(tiny_config), dtype=torch.float32, device="cpu")
    assert baseline_bandwidth(model, 50.0, None) is None  # no GPU name to look up, no flag
    assert baseline_bandwidth(model, None, 31.0) is None
    report = baseline_bandwidth(model, 50.0, 31.0)
    assert report["ms_per_token"] == 20.0 and report["weight_bytes"] == weight_bytes_per_token(model)


def test_random_weights_bench_on_cpu(tiny_config, tmp_path, capsys) -> None:
    out = tmp_path / "report.json"
    rc = main(["bench", "--random-weights", str(tiny_config), "--device", "cpu", "--dtype", "float32",
               "--context", "20", "--max-new-tokens", "17", "--peak-bandwidth", "31", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["model"] == "tiny (random weights)" and report["dtype"] == "float32"
    assert [r["n"] for r in report["cost_curve"]] == [1, 2, 4, 8, 16, 32, 64]
    assert report["oracle"]["offered"] == 14 and report["oracle"]["rate"] == 1.0  # fp32: every draft kept
    assert report["baseline"]["deterministic"]
    bandwidth = report["bandwidth"]
    assert bandwidth["peak_gbps"] == 31 and bandwidth["ms_per_token"] > 0
    assert bandwidth["fraction_of_limit"] == pytest.approx(bandwidth["achieved_gbps"] / 31, abs=1e-4)
    assert bandwidth["achieved_gbps"] == pytest.approx(
        bandwidth["weight_bytes"] / bandwidth["ms_per_token"] / 1e6, rel=0.01, abs=1e-3)
    assert "fraction of the limit" in capsys.readouterr().out


def test_parameter_bytes_of_the_8b_shape_and_a_refusal_when_it_cannot_fit(monkeypatch) -> None:
    from engine.models import random_init
    from engine.models.llama import LlamaConfig

    config = LlamaConfig.from_dict(random_config("llama-3.1-8b")[1])
    assert random_init.parameter_bytes(config, torch.bfloat16) == 2 * 8_030_261_248  # Llama-3.1-8B's count
    monkeypatch.setattr(random_init, "free_bytes", lambda device: 2**30)
    with pytest.raises(RandomModelError, match=r"needs 15.0 GiB .* bfloat16 but cpu has 1.0 GiB free"):
        random_model("llama-3.1-8b", dtype=torch.bfloat16, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_random_weights_bench_on_cuda_without_a_gpu_says_so(capsys) -> None:
    assert main(["bench", "--random-weights", "llama-3.1-8b", "--device", "cuda"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_random_weights_bench_refuses_an_unknown_shape(capsys) -> None:
    assert main(["bench", "--random-weights", "llama-9000", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specchat: error:") and "llama-3.1-8b" in err and "\n" not in err
