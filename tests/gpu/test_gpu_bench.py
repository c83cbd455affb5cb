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
    assert peak_bandwidth_gbps("NVIDIA GH200 480GB") == 4000  # not the H200's 4800


def test_no_gpu_name_is_shadowed_by_an_earlier_one() -> None:
    """First match wins, so a pattern that holds an earlier one ("GH200" holds "H200") would never
    be reached: every name in the table must be found as itself."""
    from engine.gpu.bandwidth import PEAK_BANDWIDTH_GBPS

    for name, gbps in PEAK_BANDWIDTH_GBPS:
        assert peak_bandwidth_gbps(f"NVIDIA {name}") == gbps, name


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
    from specchat.bench_bandwidth import baseline_bandwidth

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
    # the report rounds ms_per_token to the microsecond and GB/s to the MB/s: the rate lies within both
    # roundings (a tiny model streams ~0.05 GB/s, so the second is ~1% of it, more on a faster host)
    ms, nbytes = bandwidth["ms_per_token"], bandwidth["weight_bytes"]
    low, high = nbytes / (ms + 5e-4) / 1e6, nbytes / max(ms - 5e-4, 1e-9) / 1e6
    assert low - 5e-4 <= bandwidth["achieved_gbps"] <= high + 5e-4
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


# -- drafting cost on a random target (issue 18) ----------------------------------------------------
@pytest.fixture
def tiny6_config(tmp_path):
    """A tiny target deep enough for an EAGLE-3 head (it reads 3 of at least 5 layers)."""
    path = tmp_path / "tiny6" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**family_config("llama"), "num_hidden_layers": 6}))
    return path


def _random_bench(config, *flags: str) -> list[str]:
    return ["bench", "--random-weights", str(config), "--device", "cpu", "--dtype", "float32", "--context", "20",
            "--max-new-tokens", "9", "--threads", "1", *flags]


def test_random_weights_bench_times_a_random_eagle3_head(tiny6_config, tmp_path, capsys) -> None:
    from engine.config import SpecConfig

    out = tmp_path / "fresh" / "deeper" / "report.json"  # the folders do not exist yet
    assert main(_random_bench(tiny6_config, "--methods", "none,eagle3", "--json", str(out))) == 0
    report = json.loads(out.read_text())
    assert report["methods"] == ["none", "eagle3"]
    drafting = report["drafting"]
    assert drafting["method"] == "eagle3" and drafting["head"].startswith("random EAGLE-3 head")
    chain, tree = drafting["chain"], drafting["tree"]
    defaults = SpecConfig()
    assert (chain["topk"], chain["num_steps"], chain["num_draft_tokens"]) == (1, defaults.num_steps,
                                                                              defaults.num_steps + 1)
    assert (tree["topk"], tree["num_steps"], tree["num_draft_tokens"]) == (defaults.eagle_topk, defaults.num_steps,
                                                                           defaults.num_draft_tokens)
    base_ms = report["baseline"]["ms_per_token"]
    for row in (chain, tree):
        assert row["ms_per_step"] > 0
        assert row["ms_per_level"] == pytest.approx(row["ms_per_step"] / row["num_steps"], abs=1e-4)
        assert row["level_vs_token"] == pytest.approx(row["ms_per_level"] / base_ms, rel=1e-3, abs=1e-4)
    printed = capsys.readouterr().out
    assert "eagle3 draft level, chain (topk 1)" in printed and "level / baseline token" in printed


def test_random_weights_bench_times_a_given_head_with_the_tree_flags(tiny6_config, tmp_path) -> None:
    from heads import write_head

    target = json.loads(tiny6_config.read_text())
    head = write_head(tmp_path / "eagle-head", target, "eagle", layout="sglang")
    out = tmp_path / "report.json"
    flags = ["--draft", str(head), "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
             "--speculative-num-draft-tokens", "6", "--json", str(out)]
    assert main(_random_bench(tiny6_config, *flags)) == 0  # the method is inferred from the head
    report = json.loads(out.read_text())
    drafting = report["drafting"]
    assert report["methods"] == ["none", "eagle"] and drafting["method"] == "eagle"
    assert (drafting["tree"]["topk"], drafting["tree"]["num_steps"], drafting["tree"]["num_draft_tokens"]) == (2, 3, 6)
    assert (drafting["chain"]["topk"], drafting["chain"]["num_steps"]) == (1, 3)


def test_a_plain_random_weights_run_times_no_drafter(tiny_config, tmp_path) -> None:
    """No --methods under --random-weights: the baseline alone (none,ngram is the prompt benches' default)."""
    out = tmp_path / "report.json"
    assert main(["bench", "--random-weights", str(tiny_config), "--device", "cpu", "--dtype", "float32",
                 "--context", "12", "--max-new-tokens", "9", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["methods"] == ["none"] and "drafting" not in report


@pytest.mark.parametrize("flags,needle", [
    (["--methods", "none,ngram,eagle3"], "cannot measure ngram"),
    (["--methods", "ngram"], "cannot measure ngram"),
    (["--methods", "none,ngram"], "cannot measure ngram"),  # asked for explicitly: never silently ignored
    (["--method", "standalone"], "cannot measure standalone"),
    (["--method", "eagle"], "EAGLE-3 heads only"),
    (["--methods", "eagle,eagle3", "--draft", "somewhere"], "one EAGLE head per run"),
    (["--methods", "none", "--draft", "somewhere"], "timed by an EAGLE method"),
    (["--methods", "magic"], "unknown method 'magic'"),
    (["--methods", "eagle3", "--temperature", "0.8"], "decodes greedily"),
    (["--methods", "eagle3", "--speculative-token-map", "map.pt"], "--draft PATH"),
    (["--prompts", "p.jsonl"], "--prompts needs a real checkpoint"),
    (["--peers", "hf", "--train-speed"], "--peers, --train-speed need a real checkpoint"),
])
def test_random_weights_refuses_what_it_cannot_measure_before_building(tiny6_config, monkeypatch, capsys,
                                                                       flags: list[str], needle: str) -> None:
    from engine.models import random_init

    def no_model(*args, **kwargs):
        raise AssertionError("the flags must be refused before a model is built")

    monkeypatch.setattr(random_init, "random_model", no_model)
    assert main(_random_bench(tiny6_config, *flags)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("specchat: error:") and needle in err[0], err


def test_a_random_eagle3_head_needs_five_target_layers(tiny_config, capsys) -> None:
    assert main(_random_bench(tiny_config, "--methods", "none,eagle3")) == 2
    assert "at least 5 needed" in capsys.readouterr().err


def test_random_weights_json_path_is_checked_before_building(tiny6_config, tmp_path, monkeypatch, capsys) -> None:
    from engine.models import random_init

    monkeypatch.setattr(random_init, "random_model", lambda *a, **k: pytest.fail("built before the --json check"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(_random_bench(tiny6_config, "--json", str(blocker / "sub" / "x.json"))) == 2
    assert f"{blocker} is a file, not a folder" in capsys.readouterr().err
    assert main(_random_bench(tiny6_config, "--json", str(tmp_path))) == 2
    assert "is a folder" in capsys.readouterr().err


def test_the_random_eagle3_head_fits_its_target_in_the_public_layout(tiny6_config, tmp_path) -> None:
    from engine.drafters.eagle_checkpoint import read_head
    from engine.models.checkpoint import load_state_dict
    from engine.models.llama import LlamaConfig
    from specchat.gpu_bench import write_random_eagle3_head

    target = json.loads(tiny6_config.read_text())
    folder = write_random_eagle3_head(target, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 97
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]  # EAGLE-3's defaults for 6
    spec, _ = read_head(config, load_state_dict(folder), kind="eagle3", target=LlamaConfig.from_dict(target))
    assert spec.hidden_size == 32 and spec.intermediate_size == 64 and spec.num_kv_heads == 2


def test_the_cuda_warm_up_sizes_the_cache_and_runs_every_verify_bucket(tiny_config) -> None:
    """specchat bench's CUDA warm-up, checked on CPU through the eager static decoder: the session's
    KV cache is sized for the longest prompt's answer and tree, and one forward of every bucket
    runs (on CUDA each captures its graph) before timing, once for the two methods that read no
    target features; the session is left empty. A CPU model (no static decoder) gets neither."""
    from engine.config import SpecConfig
    from engine.drafters.base import NoDrafter
    from engine.drafters.ngram import NgramDrafter
    from engine.events import Step
    from engine.gpu.static import BUCKETS, StaticDecoder
    from engine.prompts import Prompt
    from engine.session import Session
    from specchat.bench_warmup import capture_graphs, size_cache_for
    from tests.tiny import TinyTokenizer

    _, model = random_model(str(tiny_config), dtype=torch.float32, device="cpu")
    session = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=8),
                      drafters={"none": NoDrafter, "ngram": NgramDrafter})
    prompts = [Prompt("short", text="hi"), Prompt("long", messages=[{"role": "user", "content": "x" * 50}])]
    configs = [SpecConfig(max_new_tokens=40), SpecConfig(method="ngram", num_draft_tokens=12, max_new_tokens=40)]
    size_cache_for(session, prompts, configs)
    assert session._cache is None  # CPU: the cache grows as it always did
    assert capture_graphs(session, configs) == {"captured": 0, "total": 0}

    model._static = StaticDecoder(model, graphs=False)
    seen: list[int] = []
    run = model._static._run

    def recording_run(cache, inputs, bucket: int, wanted):
        seen.append(bucket)
        return run(cache, inputs, bucket, wanted)

    model._static._run = recording_run
    size_cache_for(session, prompts, configs)
    longest = len(TinyTokenizer().encode_chat(prompts[1].messages))
    assert session._cache.capacity >= longest + 40 + 12
    assert capture_graphs(session, configs) == {"captured": 0, "total": 0}  # eager: nothing to capture on CPU
    assert seen == list(BUCKETS) and session._cache.length == 0
    steps = [e for e in session.generate_ids([1, 5, 9], SpecConfig(max_new_tokens=4)) if isinstance(e, Step)]
    assert steps  # the session answers as before


def test_weight_bytes_of_stored_weights(tiny_config) -> None:
    """Stored weights (bf16 here; GGUF blocks alike) have no dense embedding table to take a width
    from: each stored matrix counts the bytes its kernel reads (``bench --peak-bandwidth N`` on a CPU
    ended in an AttributeError on ``model.embed``)."""
    from engine.kernels.stored import StoredLinear
    from engine.models.llama import LlamaModel
    from engine.models.random_init import random_state_dict
    from specchat.bench_bandwidth import baseline_bandwidth

    _, dense = random_model(str(tiny_config), dtype=torch.float32, device="cpu")
    state = random_state_dict(dense.config, torch.bfloat16, "cpu")
    stored = LlamaModel(dense.config, state, dtype=torch.float32, device="cpu", weights="stored")
    assert stored.embed is None and stored.weights == "stored"

    def matrices(model: LlamaModel) -> list:
        return [model.lm_head, *(m for layer in model.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))]

    assert all(isinstance(m, StoredLinear) for m in matrices(stored))
    dense_matrix_bytes = sum(4 * m.out_features * m.in_features for m in matrices(dense))
    want = weight_bytes_per_token(dense) - dense_matrix_bytes + sum(m.nbytes for m in matrices(stored))
    assert weight_bytes_per_token(stored) == want < weight_bytes_per_token(dense)
    assert baseline_bandwidth(stored, 50.0, 31.0)["weight_bytes"] == want
