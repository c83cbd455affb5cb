"""The transformers fallback: same interface, same answers as our forward, trees included."""

from __future__ import annotations

import torch

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import Step
from engine.models.hf import HFModel
from engine.session import Session
from engine.tree import DraftTree
from tests.drafters import RandomTreeDrafter
from tests.tiny import TinyTokenizer, our_model


def test_tree_forward_and_commit_match_our_forward() -> None:
    ours, hf = our_model("qwen2")
    adapter = HFModel(hf)
    prefix = torch.randint(3, 97, (15,), generator=torch.Generator().manual_seed(0))
    tree = DraftTree((5, 6, 7, 8, 9), (-1, 0, 0, 2, 2), (1.0,) * 5)
    results = []
    for model in (ours, adapter):
        cache = model.new_cache(64)
        model.forward(prefix, cache, logits="none")
        cache.commit(15)
        logits = model.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + 15,
                               tree_mask=tree.ancestor_mask()).logits
        cache.commit([0, 2, 4])
        after = model.forward(torch.tensor([11]), cache).logits
        results.append((logits, after))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-4, rtol=1e-4)


def test_speculation_through_the_adapter_is_lossless() -> None:
    _, hf = our_model("llama")
    adapter = HFModel(hf)
    prompt = [1, 8, 9, 10, 11]
    base = Session(adapter, TinyTokenizer(), SpecConfig(max_new_tokens=24), drafters={"none": NoDrafter})
    want = [c.id for e in base.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]
    full = prompt + want
    oracle = {tuple(full[:i]): full[i] for i in range(1, len(full))}
    spec = Session(adapter, TinyTokenizer(), SpecConfig(method="standalone", num_draft_tokens=6, max_new_tokens=24),
                   drafters={"none": NoDrafter, "standalone": lambda: RandomTreeDrafter(0, oracle, 0.8)})
    got = [c.id for e in spec.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]
    assert got == want


def test_auto_precision_runs_a_family_only_transformers_runs_in_exact(tmp_path, monkeypatch) -> None:
    """``--precision auto`` (the default) picks what the model can run: for a family our forward
    does not run it is exact on transformers' forward, not "use --precision exact" (the fast
    precision was settled before the loader knew the model needed transformers)."""
    import engine.models.families
    from engine.loader import load_model
    from engine.models.llama_config import UnsupportedModelError
    from tests.heads import write_tiny_model

    folder = write_tiny_model(tmp_path / "m", layers=2)

    def not_ours(raw):
        raise UnsupportedModelError("not a family specchat runs (pretend)")

    monkeypatch.setattr(engine.models.families, "model_for_config", not_ours)
    loaded = load_model(str(folder), device="cpu", threads=1, precision="auto")
    assert loaded.backend == "hf" and isinstance(loaded.model, HFModel)
