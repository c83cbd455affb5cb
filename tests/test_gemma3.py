"""Our Gemma 3 forward against transformers' Gemma3ForCausalLM, tree rows against plain decoding,
and greedy speculation (n-gram, standalone) against the baseline on it.

Tiny random models built here: a window of 6 over 40 tokens and a local/global layer pattern, so
both kinds of layer (and their two RoPE bases) decide the logits."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import TinyTokenizer, check_incremental_decoding

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.ngram import NgramDrafter
from engine.drafters.standalone import StandaloneDrafter
from engine.events import Step
from engine.kernels import native
from engine.models.families import model_for_config
from engine.models.gemma3 import Gemma3Config, Gemma3Model, Gemma3NativePath, Gemma3TorchPath
from engine.models.llama_config import UnsupportedModelError
from engine.session import Session
from engine.tree import DraftTree


def gemma_config(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_local_base_freq": 100.0, "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        "query_pre_attn_scalar": 12, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }
    return cfg | overrides


def hf_gemma(seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = gemma_config(**overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), attn_implementation="eager")
    model = model.float().eval()
    with torch.no_grad():  # transformers zeroes Gemma's norms (1 + 0): make every weight random
        for name, p in model.named_parameters():
            p.copy_((0.2 if "norm" in name else 0.3) * torch.randn_like(p))
    return model, cfg


def ours_and_hf(seed: int = 0, **overrides: Any) -> tuple[Gemma3Model, torch.nn.Module]:
    hf, cfg = hf_gemma(seed, **overrides)
    config, cls = model_for_config(cfg)
    assert cls is Gemma3Model
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return cls(config, sd), hf


@functools.cache
def cached_model(seed: int = 0, layers: int = 4) -> Gemma3Model:
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"][:layers]
    return ours_and_hf(seed, num_hidden_layers=layers, layer_types=kinds)[0]


@pytest.fixture(params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setenv(native.ENV_SWITCH, "torch")
    elif native.load() is None:
        pytest.skip(f"native kernels unavailable: {native.why_not}")
    return request.param


# attn_logit_softcapping is carried by Gemma 3 configs but applied by neither transformers nor us
CAPPED = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}


# the config ----------------------------------------------------------------------------------
def test_layer_pattern_and_rope_bases_are_read_like_transformers() -> None:
    from transformers import Gemma3TextConfig

    raw = gemma_config(num_hidden_layers=13, layer_types=None, sliding_window_pattern=6, rope_theta=5e5)
    ours = Gemma3Config.from_dict(raw)
    theirs = Gemma3TextConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    assert list(ours.layer_types) == theirs.layer_types
    assert ours.layer_types.count("full_attention") == 2
    assert (ours.rope_theta, ours.rope_local_theta) == (5e5, 100.0)
    # transformers 5 writes the two bases into rope_parameters, keyed by layer type: read back the same
    again = Gemma3Config.from_dict(theirs.to_dict())
    assert (again.rope_theta, again.rope_local_theta, again.layer_types) == (5e5, 100.0, ours.layer_types)


def test_configs_we_do_not_run_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="activation"):
        Gemma3Config.from_dict(gemma_config(hidden_activation="relu"))
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        Gemma3Config.from_dict(gemma_config(layer_types=["sliding_attention"]))
    with pytest.raises(UnsupportedModelError, match="gemma3_text"):
        model_for_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})


# the forward ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, CAPPED], ids=["plain", "softcapped"])
def test_prefill_logits_match_transformers(kernels: str, overrides: dict[str, Any]) -> None:
    ours, hf = ours_and_hf(**overrides)
    expected = Gemma3NativePath if kernels == "native" else Gemma3TorchPath
    assert isinstance(ours._path, expected)
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    out = ours.forward(ids, ours.new_cache(64))
    torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=1e-4)


def test_every_gemma_ingredient_matters() -> None:
    """Change one piece (the window, the local base, the query scalar) and the logits move: the
    match above is not luck of a config where a piece does nothing."""
    _, hf = ours_and_hf()
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    for variant in ({"sliding_window": 64}, {"rope_local_base_freq": 10000.0}, {"query_pre_attn_scalar": 16}):
        other, _ = ours_and_hf(**variant)
        assert not torch.allclose(other.forward(ids, other.new_cache(64)).logits, ref, atol=1e-3)


def test_incremental_decoding_matches_one_shot(kernels: str) -> None:
    ours, _ = ours_and_hf()
    check_incremental_decoding(ours)


def _random_tree(n: int, seed: int) -> DraftTree:
    """Parents among the last three nodes: branchy, and deeper than the window of 6."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(max(0, i - 3), i, (1,), generator=g)) for i in range(1, n)]
    tokens = [int(t) for t in torch.randint(3, 97, (n,), generator=g)]
    return DraftTree(tuple(tokens), tuple(parents), (1.0,) * n)


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_rows_equal_each_path_decoded_token_by_token(kernels: str, seed: int) -> None:
    """A tree node's logits are those of decoding its path one token at a time: bit for bit on our
    kernels (what makes greedy speculation lossless), closely on torch's. The tree is deeper than
    the window, so windowed attention inside the tree is exercised too."""
    ours, _ = ours_and_hf(seed)
    prefix = torch.randint(3, 97, (20,), generator=torch.Generator().manual_seed(seed))
    tree = _random_tree(14, seed)
    cache = ours.new_cache(64)
    ours.forward(prefix, cache, logits="none")
    cache.commit(len(prefix))
    tree_logits = ours.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + len(prefix),
                               tree_mask=tree.ancestor_mask()).logits
    assert max(tree.depths) >= 6
    for node in range(len(tree)):
        step_cache = ours.new_cache(64)
        ours.forward(prefix, step_cache, logits="none")
        step_cache.commit(len(prefix))
        for i in [0, *tree.path_to(node)]:
            out = ours.forward(torch.tensor([tree.tokens[i]]), step_cache).logits[-1]
            step_cache.commit(1)
        if kernels == "native":
            assert torch.equal(tree_logits[node], out), f"node {node}"
        else:
            torch.testing.assert_close(tree_logits[node], out, atol=1e-4, rtol=1e-4)


# speculation on it ---------------------------------------------------------------------------
def tokens_of(events: Any) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


def baseline(model: Gemma3Model, prompt: list[int], max_new: int) -> list[int]:
    s = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=max_new), drafters={"none": NoDrafter})
    return tokens_of(s.generate_ids(prompt))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    unit=st.lists(st.integers(3, 96), min_size=1, max_size=6),
    repeats=st.integers(1, 6),
    draft_tokens=st.integers(2, 16),
    mode=st.sampled_from(["tree", "chain"]),
    max_new=st.integers(1, 30),
)
def test_greedy_ngram_speculation_equals_the_baseline(unit: list[int], repeats: int, draft_tokens: int, mode: str,
                                                      max_new: int) -> None:
    m = cached_model()
    prompt = [1, *(unit * repeats), *unit]
    config = SpecConfig(method="ngram", num_draft_tokens=draft_tokens, max_new_tokens=max_new, ngram_mode=mode)
    s = Session(m, TinyTokenizer(), config, drafters={"none": NoDrafter, "ngram": NgramDrafter})
    assert tokens_of(s.generate_ids(prompt)) == baseline(m, prompt, max_new)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(3, 96), min_size=1, max_size=12), max_new=st.integers(1, 24),
       topk=st.sampled_from([1, 3]))
def test_greedy_standalone_drafting_with_a_gemma_draft_equals_the_baseline(prompt: list[int], max_new: int,
                                                                          topk: int) -> None:
    target, draft = cached_model(0), cached_model(1, layers=2)
    config = SpecConfig(method="standalone", eagle_topk=topk, num_steps=3, num_draft_tokens=8,
                        max_new_tokens=max_new)
    s = Session(target, TinyTokenizer(), config,
                drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, 97)})
    assert tokens_of(s.generate_ids(prompt)) == baseline(target, prompt, max_new)


# loading -------------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", ["stored", "fp32"])
def test_a_safetensors_folder_loads_as_gemma3(tmp_path, weights: str) -> None:
    """The loader picks the model class from config.json's model_type (engine/models/families.py)."""
    import json

    from safetensors.torch import save_file
    from test_tokenizer import write_tiny

    from engine.loader import load_model

    hf, cfg = hf_gemma(3, vocab_size=300)
    write_tiny(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load_model(str(tmp_path), device="cpu", weights=weights, threads=1)
    assert loaded.backend == "specchat" and isinstance(loaded.model, Gemma3Model)
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(loaded.model.forward(ids, loaded.model.new_cache(32)).logits, ref,
                               atol=1e-4, rtol=1e-4)


def test_embed_rows_keep_gemmas_scale() -> None:
    """The one-call lookup the native EAGLE head reads must be the scaled embedding, not the base class's."""
    model = cached_model()
    tokens = torch.tensor([3, 1, 4])
    assert torch.equal(model.embed_rows(tokens), model.embed_tokens(tokens).float())
