"""The session's CUDA path on a claimed CUDA device (tests/gpu/fake_cuda.py), with no GPU present.

Issue 18, item 2: device bugs of the GPU path must fail in CI, which has no GPU. Under
``fake_cuda`` the model, caches, drafters and every tensor the engine puts on ``cuda`` report
``cuda:0``; ops follow CUDA's device rules; CUDA graphs are captured and replayed (emulated, host
syncs inside raise); Triton kernels are launched (device arguments checked, then interpreted).
The first tests prove the mode catches each bug class (so the engine tests cannot pass vacuously);
the rest drive the real Session through static decode with graphs, tree verification, EAGLE and
standalone drafting, both samplers at temperature > 0 and KV compaction, and compare the answers
with the CPU path's where the two must agree.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import engine.gpu.static as static
from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.standalone import StandaloneDrafter
from engine.events import Finished, Step
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session
from engine.verify import draw
from tests.gpu.fake_cuda import (
    DeviceMismatchError,
    FakeCudaTensor,
    GeneratorDeviceError,
    HostSyncError,
    capture_region,
    fake_cuda,
)
from tests.tiny import TinyTokenizer, hf_model

PROMPT = [1, 10, 11, 12, 13]
EAGLE_LAYERS = 6  # EAGLE-3 heads read layers (2, 3, 5) of the target (see tests/test_eagle.py)


@pytest.fixture
def gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake CUDA device, Triton kernels interpreted where triton can be (else the engine's torch
    paths, as on a GPU machine without triton)."""
    try:
        request.getfixturevalue("interpret")
        kernels = True
    except pytest.skip.Exception:
        kernels = False
    with fake_cuda(monkeypatch, kernels=kernels) as state:
        yield state


@functools.cache
def _weights(seed: int, layers: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    hf, cfg = hf_model("llama", seed, num_hidden_layers=layers)
    return cfg, {k: v.detach().clone() for k, v in hf.state_dict().items()}


def llama(device: str, seed: int = 0, layers: int = 2) -> LlamaModel:
    """A tiny random Llama (tests/tiny.py) on ``device``; the same weights on every device."""
    cfg, sd = _weights(seed, layers)
    return LlamaModel(LlamaConfig.from_dict(cfg), dict(sd), device=device)


def answer(session: Session, prompt: list[int] = PROMPT) -> list[int]:
    events = list(session.generate_ids(prompt))
    assert isinstance(events[-1], Finished) and not events[-1].error
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


def standalone_session(target: LlamaModel, draft: LlamaModel, config: SpecConfig) -> Session:
    return Session(target, TinyTokenizer(), config,
                   drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, 97)})


# ---- the mode catches each bug class ---------------------------------------------------------------
def test_pytorch_fake_tensor_mode_checks_devices_but_has_no_values() -> None:
    """Why fake_cuda is not simply FakeTensorMode: it does make ``cuda`` tensors without a GPU and
    refuses a host tensor beside them and ``.item()``, but it has no values for the session loop
    (and, on a CPU-only build, cannot index a ``cuda`` tensor with a tensor: every forward does)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    with FakeTensorMode():
        x = torch.zeros(4, device="cuda")
        assert x.device.type == "cuda"
        with pytest.raises(RuntimeError, match=r"same device|different devices"):
            _ = x + torch.zeros(4)
        with pytest.raises(DataDependentOutputException):
            x.sum().item()


def _add_host_bias(x: torch.Tensor) -> torch.Tensor:
    """A deliberately wrong helper: the bias is made on the host."""
    return x + torch.ones(x.shape[-1])


def test_a_host_tensor_meeting_a_device_tensor_raises(gpu) -> None:
    x = torch.zeros(3, 4, device="cuda")
    assert isinstance(x, FakeCudaTensor) and x.is_cuda and x.device == torch.device("cuda", 0)
    with pytest.raises(DeviceMismatchError, match=r"same device|different devices"):
        _add_host_bias(x)
    with pytest.raises(DeviceMismatchError):
        F.embedding(torch.tensor([0, 1]), x)  # host ids into a device table
    with pytest.raises(DeviceMismatchError):
        x.index_copy_(0, torch.tensor([0]), x[:1])
    with pytest.raises(DeviceMismatchError):
        x[torch.tensor([0], device="cuda")] = torch.ones(1, 4)
    # what CUDA allows stays allowed: host scalars, host indices, copies in either direction
    assert (x + torch.tensor(2.0)).is_cuda
    assert x[torch.tensor([0, 2])].shape == (2, 4)
    assert not x.cpu().is_cuda and x.to("cpu").device.type == "cpu"
    x[0:1] = torch.ones(1, 4)
    assert x.sum().item() == 4.0


def test_a_host_generator_with_device_tensors_raises(gpu) -> None:
    probs = torch.softmax(torch.zeros(2, 5, device="cuda"), dim=-1)
    host_gen = torch.Generator().manual_seed(0)
    with pytest.raises(GeneratorDeviceError, match="'cuda' device type for generator"):
        torch.multinomial(probs, 1, generator=host_gen)
    with pytest.raises(GeneratorDeviceError):
        torch.rand(3, device="cuda", generator=host_gen)
    with pytest.raises(GeneratorDeviceError):
        torch.zeros(3, device="cuda").uniform_(generator=host_gen)
    # the engine's way: draw on the generator's device and bring the sample back
    sample = draw(probs, host_gen)
    assert sample.is_cuda and sample.shape == (2, 1)


SYNCS: dict[str, Callable[[torch.Tensor], Any]] = {
    "item": lambda t: t[0].item(),
    "int": lambda t: int(t[0]),
    "float": lambda t: float(t[0]),
    "bool": lambda t: bool(t[0] > 0),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "to_host": lambda t: t.to("cpu"),
    "copy_to_host": lambda t: torch.empty(4).copy_(t),
    "nonzero": lambda t: t.nonzero(),
    "bool_mask": lambda t: t[t > 0],
    "host_index": lambda t: t[torch.tensor([0, 1])],
    "to_device": lambda t: t + torch.ones(4).to("cuda"),
    "host_factory": lambda t: t + torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda"),
    "event_sync": lambda t: torch.cuda.Event().synchronize(),
    "device_sync": lambda t: torch.cuda.synchronize(t.device),  # a timing's end (engine/calibrate.py's sync)
}


@pytest.mark.parametrize("sync", sorted(SYNCS))
def test_a_host_sync_inside_a_graph_capture_raises(gpu, sync: str) -> None:
    t = torch.arange(4, device="cuda").float()
    SYNCS[sync](t)  # fine outside a capture
    with pytest.raises(HostSyncError), capture_region():
        SYNCS[sync](t)


def test_a_kernel_launched_with_a_host_tensor_raises(gpu) -> None:
    if not gpu.kernels:
        pytest.skip("triton's interpreter is not available here")
    from engine.gpu.accept import greedy_walk

    predicted = torch.tensor([5, 6], device="cuda")
    parents = torch.tensor([-1, 0], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cannot be accessed from Triton"):
        greedy_walk(predicted, torch.tensor([4, 5]), parents)  # tokens left on the host
    out = greedy_walk(predicted, torch.tensor([4, 5], device="cuda"), parents)
    assert out.is_cuda and out.tolist() == [1, 6, 1, 0]


def test_graph_replay_reruns_device_ops_with_the_scalars_of_capture_time(gpu) -> None:
    """The emulated graph is faithful where graphs bite: a device input read at replay time
    follows the step, a Python int baked in at capture does not (as on a GPU)."""
    length = torch.tensor([3], device="cuda")
    out_dev = torch.zeros(2, device="cuda", dtype=torch.int64)
    out_baked = torch.zeros(2, device="cuda", dtype=torch.int64)
    step_value = 3
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_dev.copy_(length + torch.arange(2, device="cuda"))
        out_baked.copy_(torch.arange(step_value, step_value + 2, device="cuda"))
    length.fill_(7)
    step_value = 7
    graph.replay()
    assert out_dev.tolist() == [7, 8]
    assert out_baked.tolist() == [3, 4]  # stale: the bug a captured forward must not have


def test_a_host_sync_in_the_captured_forward_fails_the_session(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's static forward really runs inside a capture: one that reads the prefix length
    on the host (a typical slip) fails the session instead of passing."""
    real = static.static_forward

    def reads_length(model, cache, inputs, *rest):
        int(inputs.length)
        return real(model, cache, inputs, *rest)

    monkeypatch.setattr(static, "static_forward", reads_length)
    session = Session(llama("cuda"), TinyTokenizer(), SpecConfig(max_new_tokens=4), drafters={"none": NoDrafter})
    with pytest.raises(HostSyncError):
        answer(session)


def _draw_on_the_probs_device(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """engine.verify.draw as it was before issue 18's fixes: the host generator meets device probs."""
    return torch.multinomial(probs, 1, generator=generator)


def _scores_with_host_noise(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                            noise: torch.Tensor) -> torch.Tensor:
    """engine.sampling.perturbed_scores without moving the (host) Gumbel noise to the logits' device."""
    from engine.verify import target_probs

    return torch.log(target_probs(logits, temperature, top_p, top_k).clamp_min(0)) + noise


@pytest.mark.parametrize(("bug", "sampling", "error"), [
    ("host_generator", "rejection", GeneratorDeviceError),
    ("host_noise", "coupled", DeviceMismatchError),
])
def test_reintroduced_device_bugs_fail_the_session(gpu, monkeypatch: pytest.MonkeyPatch, bug: str, sampling: str,
                                                    error: type[Exception]) -> None:
    """Two device bugs of the kind issue 18 fixed by reading, put back: each fails a session run."""
    import engine.drafters.tree_search
    import engine.sampling
    import engine.verify

    if bug == "host_generator":
        monkeypatch.setattr(engine.verify, "draw", _draw_on_the_probs_device)
        monkeypatch.setattr(engine.drafters.tree_search, "draw", _draw_on_the_probs_device)
    else:
        monkeypatch.setattr(engine.sampling, "perturbed_scores", _scores_with_host_noise)
    config = SpecConfig(method="standalone", num_steps=2, eagle_topk=1, num_draft_tokens=3, temperature=0.8,
                        sampling=sampling, seed=1, max_new_tokens=6, adaptive_draft=False)
    with pytest.raises(error):
        answer(standalone_session(llama("cuda"), llama("cuda"), config))


# ---- the engine's CUDA path -------------------------------------------------------------------------
def test_static_decode_with_graphs_equals_the_cpu_answer(gpu) -> None:
    want = answer(Session(llama("cpu"), TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter}))
    model = llama("cuda")
    assert model.embed.is_cuda and model._static is not None and model._static.graphs
    session = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter})
    assert answer(session) == want
    assert model._static.captures >= 1 and model._static.replays >= len(want) - 1
    assert session._cache.k.is_cuda
    if gpu.kernels:
        assert model._static.attention == "triton" and gpu.launches.get("tree_attention")
        assert gpu.launches.get("accept.greedy")


@pytest.mark.parametrize(("temperature", "sampling", "topk", "top_k"), [
    (0.0, "coupled", 2, 0), (0.8, "coupled", 2, 0), (0.8, "rejection", 2, 0), (0.8, "rejection", 1, 0),
    (0.8, "rejection", 2, 20),  # a top-k cut keeps verification off the device walk: the host walk on device logits
])
def test_standalone_tree_drafting_and_verification(gpu, temperature: float, sampling: str, topk: int,
                                                   top_k: int) -> None:
    """A standalone draft (the target's own weights, so paths are long and branchy): greedy and
    coupled sampling must give the CPU path's answer exactly; rejection sampling draws its uniforms
    differently on the device walk, so there it must run and reproduce with its seed."""
    config = SpecConfig(method="standalone", num_steps=3, eagle_topk=topk, num_draft_tokens=6, top_k=top_k,
                        temperature=temperature, sampling=sampling, seed=5, max_new_tokens=16, adaptive_draft=False)
    got = answer(standalone_session(llama("cuda"), llama("cuda"), config))
    assert len(got) == 16
    if sampling == "coupled":
        # the CPU reference: plain host tensors (the mode leaves calls that do not name cuda alone)
        assert got == answer(standalone_session(llama("cpu"), llama("cpu"), config))
    else:
        assert answer(standalone_session(llama("cuda"), llama("cuda"), config)) == got
    if gpu.kernels and topk > 1:  # chains (topk 1) keep a prefix of their slots: nothing to compact
        assert gpu.launches.get("kv_compact"), "no tree path was compacted on the device"
    if gpu.kernels and temperature == 0.0:
        assert gpu.launches.get("accept.greedy")
    if gpu.kernels and sampling == "rejection" and topk > 1 and not top_k:  # point-mass trees: the device walk
        assert gpu.launches.get("accept.sampling")


@functools.cache
def _head_dir(kind: str) -> Path:
    from tests.heads import write_head

    target = {**_weights(0, EAGLE_LAYERS)[0]}
    folder = Path(tempfile.mkdtemp(prefix=f"specchat-fake-cuda-{kind}-"))
    return write_head(folder, target, kind, layout="sglang" if kind == "eagle" else "specforge",
                      draft_vocab=40 if kind == "eagle3" else None)


@pytest.mark.parametrize(("kind", "temperature", "sampling"), [
    ("eagle3", 0.0, "coupled"), ("eagle3", 0.8, "rejection"), ("eagle", 0.8, "coupled"),
])
def test_eagle_drafting_on_the_device(gpu, kind: str, temperature: float, sampling: str) -> None:
    """EAGLE heads on the device: target features captured in the verify forward, head cache and
    tree search on the device, d2t mapping (EAGLE-3), num_steps 3 and topk 2."""
    from engine.drafters.draft_loader import load_draft

    config = SpecConfig(method=kind, num_steps=3, eagle_topk=2, num_draft_tokens=6, temperature=temperature,
                        sampling=sampling, seed=3, max_new_tokens=12, adaptive_draft=False)

    def run(device: str) -> tuple[list[int], object]:
        target = llama(device, layers=EAGLE_LAYERS)
        b = load_draft(str(_head_dir(kind)), target, TinyTokenizer())
        tokenizer = TinyTokenizer(stop_ids=frozenset())  # a sampled stop token would end the answer early
        return answer(Session(target, tokenizer, config, drafters={"none": NoDrafter, kind: b.factory},
                              features=b.features)), target

    got, target = run("cuda")
    assert len(got) == 12
    if sampling == "coupled":
        assert run("cpu")[0] == got
    # the verify forwards that capture the head's features are graph replays too (eagerly they
    # took 37 ms a step on an H200 instead of ~3)
    wanted = [w for _, w in target._static._graphs.captured()]
    assert any(w.capture for w in wanted) if kind == "eagle3" else any(w.hidden for w in wanted)
    assert target._static.replays >= 3



def test_eagle_drafting_waits_on_the_device_a_few_times_a_level(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host sync or host<->device copy in drafting drains the GPU's queue, and a level's
    kernels are small, so syncs set a level's time on a GPU (an EAGLE-3 step drafted for 19.9 ms
    on the H200 of session 25). Greedy, a tree of 3 levels and top-k 2: one wait a tree (reading the
    chosen tree; 21 a propose before the host data went over asynchronously, one a level before the
    search ran on the device), plus now and then one for a growing rotary table or cache."""
    from engine.drafters.draft_loader import load_draft
    from engine.drafters.eagle import EagleDrafter

    state = gpu
    counts: list[int] = []  # waits per propose
    propose = EagleDrafter.propose

    def counted(self, history, root, config, **kw):
        before = state.syncs
        tree = propose(self, history, root, config, **kw)
        counts.append(state.syncs - before)
        return tree

    monkeypatch.setattr(EagleDrafter, "propose", counted)
    config = SpecConfig(method="eagle3", num_steps=3, eagle_topk=2, num_draft_tokens=6, max_new_tokens=12,
                        adaptive_draft=False)
    target = llama("cuda", layers=EAGLE_LAYERS)
    b = load_draft(str(_head_dir("eagle3")), target, TinyTokenizer())
    answer(Session(target, TinyTokenizer(), config, drafters={"none": NoDrafter, "eagle3": b.factory},
                   features=b.features))
    assert len(counts) >= 3  # the answer drafted (every propose grows all num_steps levels: no budget)
    assert sum(counts) / len(counts) <= 1.5
