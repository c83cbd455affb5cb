"""Standalone draft models: losslessness, a compacted draft cache, loading and the tokenizer check."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from heads import write_tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenizer import write_tiny
from tiny import TinyTokenizer, our_model

from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import load_draft
from engine.drafters.eagle_checkpoint import DraftLoadError
from engine.drafters.standalone import StandaloneDrafter
from engine.events import Step
from engine.session import Session


@functools.cache
def model(seed: int, layers: int = 2):
    return our_model("llama", seed, num_hidden_layers=layers)[0]


def tokens_of(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


def session(target, draft, config: SpecConfig, stops=frozenset({2})) -> Session:
    return Session(target, TinyTokenizer(stop_ids=stops), config,
                   drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, 97)})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    draft_seed=st.sampled_from([0, 1]),  # seed 0 is the target itself: long accepted paths
    topk=st.sampled_from([1, 3]),
    steps=st.sampled_from([1, 4]),
    draft_tokens=st.sampled_from([2, 8, 32]),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=20),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
)
def test_greedy_standalone_equals_plain_decoding(draft_seed, topk, steps, draft_tokens, prompt, max_new,
                                                 adaptive) -> None:
    target = model(0)
    plain = Session(target, TinyTokenizer(), SpecConfig(max_new_tokens=max_new), drafters={"none": NoDrafter})
    topk = min(topk, draft_tokens - 1)  # a level wider than the tree is refused
    config = SpecConfig(method="standalone", eagle_topk=topk, num_steps=steps, num_draft_tokens=draft_tokens,
                        max_new_tokens=max_new, adaptive_draft=adaptive)
    spec = session(target, model(draft_seed, 1 if draft_seed else 2), config)
    assert tokens_of(spec.generate_ids(prompt)) == tokens_of(plain.generate_ids(prompt))


def test_a_draft_equal_to_the_target_is_always_right_so_the_compacted_cache_is_too() -> None:
    """With the target as its own draft every greedy chain is accepted; any stale or misplaced
    entry in the compacted draft cache would show up as a refusal."""
    target = model(0)
    config = SpecConfig(method="standalone", eagle_topk=1, num_steps=4, num_draft_tokens=5, max_new_tokens=41,
                        adaptive_draft=False)
    drafter = StandaloneDrafter(target, 97)
    s = Session(target, TinyTokenizer(stop_ids=frozenset()), config,
                drafters={"none": NoDrafter, "standalone": lambda: drafter})
    events = list(s.generate_ids([1, 5, 9, 14]))
    steps = [e for e in events if isinstance(e, Step)][1:]
    assert all(len(e.accepted) == 4 for e in steps[:-1])
    assert events[-1].stats.tau > 4.5
    # the accepted path's scratch entries were moved into place, so only the root runs each step
    assert drafter.cache.length == len(drafter._tokens) - 1


def test_a_topk_beyond_the_draft_models_vocabulary_is_refused_before_any_work() -> None:
    """topk 120 (with a tree of 128 tokens) used to reach the drafter, which refused it against its vocabulary
    (97 tokens); now the bound (at most 64, engine/knobs.py) refuses it in SpecConfig, before any
    session, and the drafter's check stays for vocabularies under 64. A hot-swap keeps the old settings."""
    with pytest.raises(ConfigError, match=r"eagle_topk must be an integer from 1 to 64 .*got 120"):
        SpecConfig(method="standalone", eagle_topk=120, num_draft_tokens=64)
    s = session(model(0), model(1, 1), SpecConfig(method="standalone", num_draft_tokens=64))
    with pytest.raises(ConfigError, match="from 1 to 64"):
        s.update_config(s.config.replace(eagle_topk=120))
    assert s.config.eagle_topk == 4 and s.pending_config is None and s.context_used == 0


def test_trees_from_a_draft_model_hold_real_probabilities() -> None:
    config = SpecConfig(method="standalone", eagle_topk=3, num_steps=3, num_draft_tokens=9, max_new_tokens=5,
                        adaptive_draft=False)
    events = list(session(model(0), model(1, 1), config).generate_ids([1, 5, 9]))
    tree = [e for e in events if isinstance(e, Step)][1].tree
    assert len(tree) == 9 and tree.max_depth <= 3
    assert all(0 < p <= 1 for p in tree.draft_probs) and len(set(tree.draft_probs[1:])) > 1


def test_multi_turn_with_a_standalone_draft() -> None:
    target = model(0)
    spec = session(target, model(1, 1), SpecConfig(method="standalone", max_new_tokens=12))
    plain = Session(target, TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter})
    for turn in ["ABCD", "EFG", "ABCDEFG"]:
        assert tokens_of(spec.chat(turn)) == tokens_of(plain.chat(turn))


def test_load_a_standalone_draft_with_the_same_tokenizer(tmp_path: Path) -> None:
    from engine.loader import load_model

    target = load_model(str(write_tiny_model(tmp_path / "target", seed=0)), device="cpu")
    draft_dir = write_tiny_model(tmp_path / "draft", seed=1, layers=1)
    bundle = load_draft(str(draft_dir), target.model, target.tokenizer)
    assert bundle.method == "standalone" and bundle.features is None
    assert "1 layers" in bundle.description


def test_a_draft_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    from engine.loader import load_model

    target = load_model(str(write_tiny_model(tmp_path / "target", seed=0)), device="cpu")
    draft_dir = write_tiny_model(tmp_path / "draft", seed=1, layers=1)
    write_tiny(draft_dir, eos_token="<|endoftext|>")  # other stop token: another vocabulary in effect
    with pytest.raises(DraftLoadError, match="different tokenizer"):
        load_draft(str(draft_dir), target.model, target.tokenizer)


@pytest.mark.parametrize("weights", ["stored", "fp32"])
def test_a_gguf_draft_keeps_its_weights_as_stored_like_its_target(tmp_path: Path, weights: str) -> None:
    """A GGUF draft for a target on stored weights is read in place, its blocks kept, and drafts in the
    fast precision where this CPU has it (drafts are verified); under an fp32 target it is upcast as
    the target is. On main the draft was always upcast: the Qwen2.5-Coder 0.5B then streamed ~2 GB a
    level where its 1.5B target streams ~1.1 GB a whole step, so it could never pay."""
    from test_gguf_convert import write_tiny_gguf

    from engine.loader import load_model

    write_tiny_gguf(tmp_path / "target.gguf")
    write_tiny_gguf(tmp_path / "draft.gguf")
    target = load_model(str(tmp_path / "target.gguf"), device="cpu", weights=weights)
    bundle = load_draft(str(tmp_path / "draft.gguf"), target.model, target.tokenizer)
    draft = bundle.factory().model
    assert target.model.weights == weights and draft.weights == weights
    assert draft.precision == ("fast" if weights == "stored" and draft.fast_available else "exact")
    assert bool(draft.stored_kinds) == (weights == "stored")  # GGUF blocks kept, not upcast


@pytest.mark.parametrize("codes", ["q4", "stored"])
def test_a_stored_draft_model_is_narrowed_to_4_bit_codes_and_stays_lossless(tmp_path: Path, monkeypatch,
                                                                           codes: str) -> None:
    """Under a target on stored weights a draft model's matrices become 4-bit codes (its Q8_0, F16 and
    F32 blocks here; the Qwen2.5-Coder 0.5B's 487 MB a level became ~307 MB), as a draft head's do,
    unless ``SPECCHAT_HEAD_WEIGHTS`` keeps the file's; either way the answer is the baseline's."""
    from test_gguf_convert import write_tiny_gguf

    from engine.loader import load_model

    monkeypatch.setenv("SPECCHAT_HEAD_WEIGHTS", codes)
    write_tiny_gguf(tmp_path / "target.gguf")
    write_tiny_gguf(tmp_path / "draft.gguf")
    target = load_model(str(tmp_path / "target.gguf"), device="cpu", weights="stored")
    bundle = load_draft(str(tmp_path / "draft.gguf"), target.model, target.tokenizer)
    kinds = bundle.factory().model.stored_kinds
    assert (kinds == {"q4"}) if codes == "q4" else ({"q8", "f16"} <= kinds)
    config = SpecConfig(method="standalone", max_new_tokens=16, adaptive_draft=False)
    spec = Session(target.model, target.tokenizer, config, drafters={"standalone": bundle.factory})
    plain = Session(target.model, target.tokenizer, SpecConfig(max_new_tokens=16), drafters={"none": NoDrafter})
    for prompt in ([1, 5, 9], [3, 4, 5, 6, 7]):
        assert tokens_of(spec.generate_ids(prompt)) == tokens_of(plain.generate_ids(prompt))


def test_checking_a_gguf_draft_before_the_load_converts_nothing(tmp_path: Path, monkeypatch) -> None:
    """The pre-flight check reads the draft GGUF's header in place: no fp32 safetensors appear (it
    used to convert the whole file, ~2 GB for the Qwen2.5-Coder 0.5B, before a load that now reads
    the blocks as stored)."""
    from test_gguf_convert import write_tiny_gguf

    from engine.drafters.draft_loader import check_draft
    from engine.preflight import target_config

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    write_tiny_gguf(tmp_path / "target.gguf")
    write_tiny_gguf(tmp_path / "draft.gguf")
    kind, folder = check_draft(str(tmp_path / "draft.gguf"), target_config(str(tmp_path / "target.gguf")))
    assert kind == "standalone" and (folder / "config.json").is_file()
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
