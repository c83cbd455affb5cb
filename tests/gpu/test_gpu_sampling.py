"""Drafting and rejection sampling with the model on a CUDA device: host-side seeds and host-made
tensors must meet the model's device tensors without a device error, and a seed must still fix the
answer. Skipped without a GPU (the CPU paths are covered by tests/test_tree_sampling.py and
tests/test_verify.py); on a GPU machine these run the very code the engine runs there."""

from __future__ import annotations

import torch

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.standalone import StandaloneDrafter
from engine.drafters.tree_search import Candidates, Sampling, grow_tree
from engine.events import Step
from engine.session import Session
from engine.verify import draw, sample_from
from tests.tiny import TinyTokenizer, hf_model


def _grow(device: torch.device, topk: int, sampling: Sampling | None):
    """A 3-level tree over fixed random log-probs on ``device``."""
    g = torch.Generator().manual_seed(0)
    table = torch.log_softmax(torch.randn(64, 50, generator=g), -1).to(device)

    def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
        return table[torch.tensor([cands.tokens[i] for i in frontier], device=device) % 64]

    tree, _, _ = grow_tree(7, table[7], expand, lambda ids: ids, num_steps=3, topk=topk, num_draft_tokens=8,
                           sampling=sampling)
    return tree


def test_tree_search_on_cuda_matches_the_host(cuda) -> None:
    """Levels >= 2 add the parents' scores (a host list) to device log-probs."""
    got = _grow(cuda, 2, None)
    want = _grow(torch.device("cpu"), 2, None)
    assert got.tokens == want.tokens and got.parents == want.parents


def test_sampled_chains_on_cuda_draw_from_the_host_generator(cuda) -> None:
    """Rejection sampling's chain drafts: q on the device, the seeded generator on the host."""
    def run(device: torch.device):
        sampling = Sampling(lambda lp: lp.exp(), lambda q: q, torch.Generator().manual_seed(3))
        return _grow(device, 1, sampling)

    got, want = run(cuda), run(torch.device("cpu"))
    assert got.tokens == want.tokens
    assert all(q.device.type == "cuda" for q in got.proposals.values())


def test_draw_with_a_host_generator_on_cuda_probs(cuda) -> None:
    probs = torch.softmax(torch.randn(4, 30, generator=torch.Generator().manual_seed(1)), -1)
    got = draw(probs.to(cuda), torch.Generator().manual_seed(5))
    assert got.device.type == "cuda"
    assert got.cpu().tolist() == draw(probs, torch.Generator().manual_seed(5)).tolist()
    assert sample_from(probs[0].to(cuda), torch.Generator().manual_seed(6)) == \
        sample_from(probs[0], torch.Generator().manual_seed(6))


def test_seeded_rejection_sampling_with_a_draft_model_on_cuda_reproduces(cuda) -> None:
    """The first token (session), the chain drafts (tree search) and the residual draws (verify)
    all sample with the session's host generator."""
    from engine.models.llama import LlamaConfig, LlamaModel

    def load(seed: int, layers: int) -> LlamaModel:
        hf, cfg = hf_model("llama", seed, num_hidden_layers=layers)
        return LlamaModel(LlamaConfig.from_dict(cfg), dict(hf.state_dict()), device=cuda)

    target, draft = load(0, 2), load(1, 1)
    prompt = [1, 5, 9, 14, 5, 9, 22]

    def answer(method: str, topk: int, seed: int) -> list[int]:
        config = SpecConfig(method=method, sampling="rejection", temperature=0.9, top_p=0.95, seed=seed,
                            eagle_topk=topk, num_steps=3, num_draft_tokens=6, max_new_tokens=24,
                            adaptive_draft=False)
        s = Session(target, TinyTokenizer(), config,
                    drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, 97)})
        return [c.id for e in s.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]

    for method, topk in (("none", 1), ("standalone", 1), ("standalone", 2)):
        first = answer(method, topk, 7)
        assert len(first) == 24 and answer(method, topk, 7) == first, (method, topk)
