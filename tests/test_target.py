"""Both target backends meet engine.target.TargetModel: the engine reads these members directly,
with no getattr default to hide one a backend lacks, so a missing member fails here by name."""

from __future__ import annotations

import torch

from engine.models.hf import HFModel
from engine.target import TargetCache, TargetModel
from tests.tiny import our_model


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items()
              if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def test_our_forward_and_the_transformers_adapter_have_every_member() -> None:
    ours, hf = our_model("llama")
    for model in (ours, HFModel(hf)):
        missing = sorted(n for n in _members(TargetModel) if not hasattr(model, n))
        assert not missing, f"{type(model).__name__} lacks {missing}"
        cache = model.new_cache(8)
        missing = sorted(n for n in _members(TargetCache) if not hasattr(cache, n))
        assert not missing, f"{type(cache).__name__} lacks {missing}"


def test_what_the_adapter_declares_it_lacks() -> None:
    """One arithmetic, no batch invariance, no stored weights nor native kernel: the session then
    refuses a precision switch and keeps no preamble across conversations."""
    ours, hf = our_model("llama")
    adapter = HFModel(hf)
    assert (adapter.precision, adapter.fast_available, adapter.rows_independent) == ("", False, False)
    assert (adapter.weights, adapter.ops) == ("fp32", None)
    assert adapter.context_limit == ours.context_limit == ours.config.max_position_embeddings
    assert isinstance(adapter.device, torch.device)
