"""DFlash block drafting: the public layouts load, a drafter for another target is refused, the block
forward is z-lab's, and drafting is lossless with one drafter forward per step.

The drafters are random (tests/dflash_drafts.py writes them in the z-lab and speculators layouts);
targets with small vocabularies make random drafts land often enough to exercise accepted paths.
"""

from __future__ import annotations

import functools
import itertools
import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dflash_drafts import HEAD_DIM, dflash_state, speculators_config, write_dflash, zlab_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_precision_switch import needs_fast, stored_model
from tiny import TinyTokenizer, family_config, hf_model

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.dflash.drafter import DFlashDrafter
from engine.drafters.dflash.model import DFlashDraft, block_ids, block_mask, block_positions
from engine.drafters.draft_loader import DraftLoadError, check_draft, load_draft
from engine.events import Step
from engine.features import FeatureSpec
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session

LAYERS = 6
_TMP = Path(tempfile.mkdtemp(prefix="specchat-dflash-"))


def target_config(vocab: int = 97) -> dict:
    return {**family_config("llama"), "num_hidden_layers": LAYERS, "vocab_size": vocab}


@functools.cache
def _hf_and_target(vocab: int) -> tuple[torch.nn.Module, LlamaModel]:
    hf, cfg = hf_model("llama", 0, num_hidden_layers=LAYERS, vocab_size=vocab)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return hf, LlamaModel(LlamaConfig.from_dict(cfg), sd)


def target(vocab: int = 97) -> LlamaModel:
    return _hf_and_target(vocab)[1]


@functools.cache
def drafter_dir(layout: str = "z-lab", vocab: int = 97, block: int = 4, draft_vocab: int | None = None,
                ids: tuple[int, ...] | None = (1, 3), layers: int = 2) -> Path:
    folder = _TMP / f"{layout}-{vocab}-{block}-{draft_vocab}-{ids}-{layers}"
    if ids is None:  # z-lab without target_layer_ids: its default spread, written from the config
        cfg = zlab_config(target_config(vocab), layers=layers, block=block)
        del cfg["dflash_config"]["target_layer_ids"]
        return write_dflash(folder, target_config(vocab), layers=layers, config=cfg)
    return write_dflash(folder, target_config(vocab), layout=layout, block=block, draft_vocab=draft_vocab,
                        ids=list(ids), layers=layers)


@functools.cache
def bundle(layout: str = "z-lab", vocab: int = 97, block: int = 4, draft_vocab: int | None = None,
           ids: tuple[int, ...] | None = (1, 3)):
    return load_draft(str(drafter_dir(layout, vocab, block, draft_vocab, ids)), target(vocab), TinyTokenizer(vocab))


def tokens_of(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


def plain(vocab: int, config: SpecConfig, prompt: list[int]) -> list[int]:
    s = Session(target(vocab), TinyTokenizer(vocab), config.replace(method="none"), drafters={"none": NoDrafter})
    return tokens_of(s.generate_ids(prompt))


def dflash_session(b, vocab: int, config: SpecConfig, made: list[DFlashDrafter] | None = None) -> Session:
    """A session with the n-gram, baseline and ``b``'s drafters; ``made`` collects each DFlash drafter
    the session makes (to look inside it)."""
    from engine.drafters.ngram import NgramDrafter

    def factory() -> DFlashDrafter:
        drafter = b.factory()
        if made is not None:
            made.append(drafter)
        return drafter

    return Session(target(vocab), TinyTokenizer(vocab), config,
                   drafters={"none": NoDrafter, "ngram": NgramDrafter, "dflash": factory}, features=b.features)


# loading -------------------------------------------------------------------------------------------------
LAYOUTS = [("z-lab", None), ("speculators", None), ("speculators", 40)]


@pytest.mark.parametrize(("layout", "draft_vocab"), LAYOUTS)
def test_every_public_layout_is_told_apart_and_loads_with_its_target_layers(layout: str, draft_vocab) -> None:
    """z-lab's ids [1, 3] name layer outputs and the speculators export's [2, 4] layer inputs: both are
    the residual entering target layers 2 and 4, read in that order."""
    folder = drafter_dir(layout, draft_vocab=draft_vocab)
    assert check_draft(str(folder), target().config) == ("dflash", folder)  # from the files: no --method
    b = bundle(layout, draft_vocab=draft_vocab)
    assert b.method == "dflash" and b.features == FeatureSpec(capture_layers=(2, 4))
    drafter = b.factory()
    spec = drafter.runner.spec
    assert isinstance(drafter, DFlashDrafter) and spec.layout == layout
    assert (spec.block_size, spec.num_layers, spec.mask_token_id, spec.target_layer_ids) == (4, 2, 96, (1, 3))
    assert spec.rope_theta == 1e6 and spec.head_dim == HEAD_DIM  # the draft's own config, never the target's
    assert drafter.runner.vocab_size == (draft_vocab or 97)
    assert "block 4, target layers [1, 3]" in b.description


def test_z_lab_without_layer_ids_reads_its_default_spread() -> None:
    """No target_layer_ids: z-lab's rule for a 2-layer drafter of a 6-layer target, layers 1 and L - 3."""
    b = bundle(ids=None)
    assert b.features == FeatureSpec(capture_layers=(2, 4))


def test_z_labs_default_spread_is_the_published_one() -> None:
    from engine.drafters.dflash.model import default_target_layer_ids

    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # z-lab/Qwen3-4B-DFlash-b16's config
    assert default_target_layer_ids(28, 1) == (14,)


def _refusal(tmp_path: Path, case: str) -> Path:
    cfg_t = target_config()
    if case == "hidden":
        return write_dflash(tmp_path / "d", {**cfg_t, "hidden_size": 48})
    if case == "vocab":
        return write_dflash(tmp_path / "d", {**cfg_t, "vocab_size": 50})
    if case == "target layers":
        return write_dflash(tmp_path / "d", {**cfg_t, "num_hidden_layers": 36})
    if case == "ids":
        cfg = zlab_config(cfg_t)
        cfg["dflash_config"]["target_layer_ids"] = [1, 6]
        return write_dflash(tmp_path / "d", cfg_t, config=cfg)
    if case == "aux ids":
        return write_dflash(tmp_path / "d", cfg_t, layout="speculators",
                            config=speculators_config(cfg_t, aux=[2, 7]))
    if case == "no mask":
        cfg = zlab_config(cfg_t)
        del cfg["dflash_config"]["mask_token_id"]
        return write_dflash(tmp_path / "d", cfg_t, config=cfg)
    if case == "mask outside":
        return write_dflash(tmp_path / "d", cfg_t, mask=97)
    if case == "no block":
        cfg = zlab_config(cfg_t)
        del cfg["block_size"]
        return write_dflash(tmp_path / "d", cfg_t, config=cfg)
    if case == "sliding":
        cfg = zlab_config(cfg_t)
        cfg["layer_types"] = ["sliding_attention", "full_attention"]
        return write_dflash(tmp_path / "d", cfg_t, config=cfg)
    if case == "dflash2":
        cfg = zlab_config(cfg_t)
        cfg["architectures"] = ["DFlash2DraftModel"]
        return write_dflash(tmp_path / "d", cfg_t, config=cfg)
    if case == "anchor sampled":
        return write_dflash(tmp_path / "d", cfg_t, layout="speculators",
                            config={**speculators_config(cfg_t), "sample_from_anchor": True})
    state = dflash_state(cfg_t)
    if case == "missing":
        del state["layers.1.self_attn.k_norm.weight"]
    elif case == "unknown":
        state["layers.0.extra.weight"] = torch.zeros(3)
    elif case == "shape":
        state["fc.weight"] = torch.zeros(32, 3 * 32)
    elif case == "no d2t":
        state = dflash_state(cfg_t, draft_vocab=40)
        del state["d2t"]
        return write_dflash(tmp_path / "d", cfg_t, layout="speculators", draft_vocab=40, state=state)
    return write_dflash(tmp_path / "d", cfg_t, state=state)


REFUSALS = [
    ("hidden", "hidden size 48 but the target has 32; this drafter was made for another model"),
    ("vocab", "vocabulary size 50 but the target has 97"),
    ("target layers", "made for a target of 36 layers; the target has 6"),
    ("ids", r"target_layer_ids [1, 6] name layers the target does not have (it has 6)"),
    ("aux ids", r"aux_hidden_state_layer_ids [2, 7] name layers the target does not have"),
    ("no mask", "names no mask_token_id"),
    ("mask outside", "mask_token_id 97 is outside the target's vocabulary"),
    ("no block", "names no block_size"),
    ("sliding", "is a drafter with sliding-window layers; specchat runs DFlash drafters"),
    ("dflash2", "is a DFlash2 drafter"),
    ("anchor sampled", "anchor position is sampled too"),
    ("missing", "is missing layers.1.self_attn.k_norm.weight"),
    ("unknown", "has weights a DFlash drafter does not have (layers.0.extra.weight)"),
    ("shape", "fc.weight has shape (32, 96), expected (32, 64)"),
    ("no d2t", "is missing d2t"),
]


@pytest.mark.parametrize(("case", "needle"), REFUSALS)
def test_a_drafter_that_does_not_fit_is_refused_in_one_line_from_its_files(tmp_path: Path, case: str,
                                                                          needle: str) -> None:
    """From config.json and the safetensors header alone (what runs before the target loads), and again
    by the loader."""
    folder = _refusal(tmp_path, case)
    for check in (lambda: check_draft(str(folder), target().config),
                  lambda: load_draft(str(folder), target(), TinyTokenizer())):
        with pytest.raises(DraftLoadError) as err:
            check()
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_wrong_method_names_the_right_one(tmp_path: Path) -> None:
    from heads import write_head

    with pytest.raises(DraftLoadError, match="holds a dflash draft, not an eagle3 draft; use --method dflash"):
        check_draft(str(drafter_dir()), target().config, method="eagle3")
    head = write_head(tmp_path / "h", target_config(), "eagle3")
    with pytest.raises(DraftLoadError, match="is not a dflash draft"):
        check_draft(str(head), target().config, method="dflash")


# the block forward ---------------------------------------------------------------------------------------
def _zlab_reference(cfg: dict, sd: dict[str, torch.Tensor], features: torch.Tensor, embeds: torch.Tensor
                    ) -> torch.Tensor:
    """The block's hidden states as z-lab's model.py computes them, transcribed with transformers'
    Qwen3 rotary embedding and rotate_half: fc + hidden_norm over the context; per layer q from the
    normed block, k = k_norm(k_proj([context; normed block])), v likewise, RoPE at positions
    0..S-1 then S..S+B-1, attention with no mask, o_proj, the MLP; the final norm."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, rotate_half

    w = {k: v.float() for k, v in sd.items()}
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    S, B = features.shape[0], embeds.shape[0]
    rope = Qwen3RotaryEmbedding(Qwen3Config(hidden_size=cfg["hidden_size"], num_attention_heads=nh, head_dim=hd,
                                            rope_theta=cfg["rope_theta"], max_position_embeddings=4096))
    cos, sin = (t[0] for t in rope(embeds[None], torch.arange(S + B)[None]))

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    ctx = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    h = embeds
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        both = torch.cat([ctx, x])
        q = rms((x @ w[p + "self_attn.q_proj.weight"].T).view(B, nh, hd), w[p + "self_attn.q_norm.weight"])
        k = rms((both @ w[p + "self_attn.k_proj.weight"].T).view(S + B, nkv, hd), w[p + "self_attn.k_norm.weight"])
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(S + B, nkv, hd)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q = q * cos[S:] + rotate_half(q) * sin[S:]
        k = k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        att = torch.softmax(q @ k.transpose(1, 2) * hd**-0.5, dim=-1) @ v
        h = h + att.transpose(0, 1).reshape(B, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(h, w[p + "post_attention_layernorm.weight"])
        h = h + (F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["norm.weight"])


def _files(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def _hf_features(tokens: list[int], ids: tuple[int, ...]) -> torch.Tensor:
    """z-lab's context features from transformers' own target: hidden_states[id + 1] side by side."""
    hf, _ = _hf_and_target(97)
    with torch.no_grad():
        states = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1][0] for i in ids], dim=-1)


def test_the_block_forward_is_z_labs_over_the_target_layers_it_names() -> None:
    """The features the session captures for ids [1, 3] are transformers' hidden_states[2] and [4], and
    the block's hidden states over them are z-lab's forward, to fp32 rounding."""
    tokens = [5, 17, 3, 44, 9, 5, 17, 60]
    b = bundle()
    drafter = b.factory()
    out = target().forward(torch.tensor(tokens), target().new_cache(16), **b.features.forward_kwargs())
    ours = b.features.extract(out)
    torch.testing.assert_close(ours, _hf_features(tokens, (1, 3)), atol=1e-4, rtol=1e-4)
    cfg, sd = _files(drafter_dir())
    hidden = drafter.runner.forward(ours, drafter.cache, tokens[-1])
    mask_rows = target().embed_tokens(torch.tensor([96] * 3))
    embeds = torch.cat([target().embed_tokens(torch.tensor(tokens[-1:])), mask_rows])
    torch.testing.assert_close(hidden, _zlab_reference(cfg, sd, ours, embeds), atol=1e-4, rtol=1e-4)
    assert drafter.cache.length == len(tokens)  # the context rows stay, the block's do not


def test_the_training_forward_is_the_inference_forward_and_blocks_see_only_their_own_context() -> None:
    """DFlashDraft (the module a trainer optimises, named by the public keys) loads the checkpoint as its
    state_dict and computes what the runner computes; a batch of blocks under block_mask equals each
    block run alone over the context before its anchor."""
    _, sd = _files(drafter_dir())
    drafter = bundle().factory()
    module = DFlashDraft(drafter.runner.spec)
    module.load_state_dict({k: v.float() for k, v in sd.items()})
    tokens = torch.tensor([5, 17, 3, 44, 9, 5, 17, 60, 8, 30])
    features = _hf_features(tokens.tolist(), (1, 3))
    embed = target().embed_tokens
    anchors = torch.tensor([2, 5, 8])
    ids = block_ids(tokens, anchors, 4, 96)
    assert ids.tolist()[:4] == [3, 96, 96, 96]
    batch = module(features, embed(ids), block_positions(anchors, 4), block_mask(anchors, 4, len(tokens)))
    for i, a in enumerate(anchors.tolist()):
        alone = module(features[:a], embed(ids[4 * i: 4 * i + 4]), torch.arange(a, a + 4))
        torch.testing.assert_close(batch[4 * i: 4 * i + 4], alone, atol=1e-5, rtol=1e-5)
        runner = drafter.runner.forward(features[:a], drafter.runner.new_cache(16), int(tokens[a]))
        torch.testing.assert_close(runner, alone.detach(), atol=1e-4, rtol=1e-4)
    batch.sum().backward()  # the forward is differentiable: a trainer can use it as is
    assert module.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0


# lossless drafting ---------------------------------------------------------------------------------------
VOCAB = 11  # random drafts over 11 tokens land often enough to exercise accepted blocks


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS[:2]),
    block=st.sampled_from([2, 4, 8]),
    draft_tokens=st.sampled_from([2, 3, 8, 16]),
    prompt=st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
    swap_at=st.integers(0, 8),
    swap=st.sampled_from([None, 2, 6, "ngram", "none"]),
)
def test_greedy_dflash_equals_plain_decoding(layout, block, draft_tokens, prompt, max_new, adaptive, swap_at,
                                             swap) -> None:
    b = bundle(layout, VOCAB, block)
    config = SpecConfig(method="dflash", eagle_topk=1, num_draft_tokens=draft_tokens, max_new_tokens=max_new,
                        adaptive_draft=adaptive)  # width 1: a chain (tests/test_ddtree.py: the trees)
    s = dflash_session(b, VOCAB, config)
    out: list[int] = []
    largest = min(max(draft_tokens, swap if isinstance(swap, int) else 0), block)
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            if not isinstance(swap, str) or event.index <= swap_at:  # still dflash's tree
                assert len(event.tree) <= largest and event.tree.is_chain
            if event.index == swap_at and swap is not None:
                change = {"method": swap} if isinstance(swap, str) else {"num_draft_tokens": swap}
                s.update_config(config.replace(**change))
    assert out == plain(VOCAB, config, prompt)


def test_a_block_is_one_forward_and_a_chain_of_its_guesses_with_their_probabilities() -> None:
    """Without the budget every step after the first drafts min(num_draft_tokens, block) - 1 tokens
    from exactly one drafter forward (none of the target's), whatever the block size."""
    b = bundle("z-lab", VOCAB, 8)
    config = SpecConfig(method="dflash", eagle_topk=1, num_draft_tokens=6, max_new_tokens=40, adaptive_draft=False)
    made: list[DFlashDrafter] = []
    s = dflash_session(b, VOCAB, config, made)
    before = b.factory().runner.forwards  # the runner is the bundle's, shared by the tests that use it
    steps = [e for e in s.generate_ids([3, 4, 5, 6]) if isinstance(e, Step)]
    (drafter,) = made
    assert drafter.runner.forwards - before == len(steps) - 1  # step 0 is the prefill's token
    accepted = 0
    for step in steps[1:]:
        assert step.tree.is_chain and len(step.tree) == 6 and step.draft_levels == 0
        assert all(0.0 < p <= 1.0 for p in step.tree.draft_probs[1:])
        accepted += len(step.accepted)
    assert accepted > 0  # some blocks landed: the accepted paths were exercised
    block = drafter.last_block
    assert block.logp.shape == (5, VOCAB)  # the block's per-position distributions, a DDTree's offers
    torch.testing.assert_close(block.logp.exp().sum(-1), torch.ones(5))


def test_with_the_budget_a_block_is_run_only_for_the_steps_it_drafts() -> None:
    """A step the budget pauses runs no block; its committed rows join the cache with the next block."""
    b = bundle("z-lab", VOCAB, 4)
    made: list[DFlashDrafter] = []
    s = dflash_session(b, VOCAB, SpecConfig(method="dflash", max_new_tokens=30), made)
    before = b.factory().runner.forwards  # the bundle's runner, shared
    steps = [e for e in s.generate_ids([3, 4, 5, 6]) if isinstance(e, Step)]
    (drafter,) = made
    drafted = sum(1 for e in steps[1:] if not e.draft_paused)
    assert drafter.runner.forwards - before == drafted
    assert tokens_of_steps(steps) == plain(VOCAB, s.config, [3, 4, 5, 6])


def tokens_of_steps(steps: list[Step]) -> list[int]:
    return [c.id for e in steps for c in e.committed]


def test_multi_turn_and_method_switches_keep_the_context_cache_in_step() -> None:
    b = bundle("z-lab", VOCAB, 4)
    spec = dflash_session(b, VOCAB, SpecConfig(method="dflash", max_new_tokens=15, adaptive_draft=False))
    base = Session(target(VOCAB), TinyTokenizer(VOCAB), SpecConfig(max_new_tokens=15), drafters={"none": NoDrafter})
    for turn, method in zip(["DEFG", "EFGDE", "HIJ", "DEFGHI"], ["dflash", "ngram", "dflash", "none"], strict=True):
        spec.update_config(spec.config.replace(method=method))
        assert tokens_of(spec.chat(turn)) == tokens_of(base.chat(turn))
    assert spec.messages == base.messages


def _committed_features(vocab: int, b, tokens: list[int]) -> torch.Tensor:
    out = target(vocab).forward(torch.tensor(tokens), target(vocab).new_cache(len(tokens) + 4),
                                **b.features.forward_kwargs())
    return b.features.extract(out)


def _assert_cache_is_a_fresh_one(drafter: DFlashDrafter, features: torch.Tensor, anchor: int) -> None:
    n = features.shape[0]
    assert drafter.cache.length == n
    fresh = drafter.runner.new_cache(n + 8)
    drafter.runner.forward(features, fresh, anchor)
    torch.testing.assert_close(drafter.cache.k[:, :, :n], fresh.k[:, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(drafter.cache.v[:, :, :n], fresh.v[:, :, :n], atol=1e-5, rtol=1e-5)


def test_the_context_cache_after_accepts_rejects_and_truncation_equals_a_recompute() -> None:
    """Step by step (each adding the committed rows of accepted and rejected blocks), then cut back by
    truncate, then reset to a history that shares a prefix: the cache's rows are what one forward over
    all the committed tokens' features writes."""
    b = bundle("z-lab", VOCAB, 4)
    made: list[DFlashDrafter] = []
    s = dflash_session(b, VOCAB, SpecConfig(method="dflash", num_draft_tokens=4, max_new_tokens=30,
                                            adaptive_draft=False), made)
    steps = [e for e in s.generate_ids([3, 4, 5, 6]) if isinstance(e, Step)]
    (drafter,) = made
    assert {len(e.accepted) for e in steps[1:]} - {0}, "no block was accepted: the test would not exercise it"
    assert 0 in {len(e.accepted) for e in steps[1:]}, "no block was refused"
    history = list(drafter._tokens)  # what the target's cache holds: the prompt and the committed tokens
    features = _committed_features(VOCAB, b, history)
    root = steps[-1].bonus
    drafter.propose(history, root, s.config)  # the last commit's rows join the cache
    _assert_cache_is_a_fresh_one(drafter, features, root)
    drafter.truncate(len(history) - 5)
    drafter.propose(history[:-5], history[-5], s.config)
    _assert_cache_is_a_fresh_one(drafter, features[:-5], history[-5])
    kept = drafter.cache.k[:, :, :6].clone()
    other = [*history[:6], 9, 10, 3]
    drafter.reset(other, _committed_features(VOCAB, b, other))
    assert drafter.cache.length == 6 and torch.equal(drafter.cache.k[:, :, :6], kept)  # the shared prefix kept
    drafter.propose(other, 4, s.config)
    _assert_cache_is_a_fresh_one(drafter, _committed_features(VOCAB, b, other), 4)


def test_a_drafter_out_of_step_with_its_features_says_so() -> None:
    drafter = bundle().factory()
    with pytest.raises(ValueError, match="one target feature per history token"):
        drafter.reset([1, 2, 3], torch.zeros(2, 64))
    drafter.reset([1, 2, 3], torch.zeros(3, 64))
    drafter.observe([4], torch.zeros(1, 64))
    drafter._tokens.append(5)  # a token the drafter was never given features for
    with pytest.raises(RuntimeError, match="out of step"):
        drafter.propose([1, 2, 3, 4, 5], 6, SpecConfig(method="dflash"))


@pytest.mark.parametrize("draft_vocab", [None, 6])
def test_seeded_coupled_sampling_gives_the_baselines_sample(draft_vocab) -> None:
    b = bundle("speculators" if draft_vocab else "z-lab", VOCAB, 4, draft_vocab)
    common = {"max_new_tokens": 30, "temperature": 0.9, "top_p": 0.95, "seed": 6}
    config = SpecConfig(method="dflash", num_draft_tokens=4, **common)
    got = tokens_of(dflash_session(b, VOCAB, config).generate_ids([3, 4, 5]))
    assert got == plain(VOCAB, config, [3, 4, 5])


@needs_fast
def test_the_fast_precision_drafts_on_4_bit_codes_and_stays_its_baselines_answer(tmp_path: Path) -> None:
    """A stored-weights target: the drafter's matrices are q4 codes run by the fast products, and greedy
    speculation equals plain decoding in the same (fast) arithmetic, and in exact."""
    from test_stored_weights import VOCAB as STORED_VOCAB

    from engine.kernels.stored import StoredLinear

    model = stored_model(tmp_path)
    cfg = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": STORED_VOCAB,
           "num_hidden_layers": 2}
    folder = write_dflash(tmp_path / "d", cfg, ids=[0, 1], block=6)
    b = load_draft(str(folder), model, TinyTokenizer(STORED_VOCAB))
    runner = b.factory().runner
    assert isinstance(runner.layers[0].qkv, StoredLinear) and runner.layers[0].qkv.parts[0].kind == "q4"
    assert runner.layers[0].qkv.fast
    prompt = [5, 17, 3, 44, 9, 5, 17]
    tok = TinyTokenizer(STORED_VOCAB, stop_ids=frozenset())
    for precision, width in itertools.product(("fast", "exact"), (1, 3)):  # a chain and a DDTree
        model.precision = precision
        config = SpecConfig(method="dflash", max_new_tokens=30, eagle_topk=width, num_draft_tokens=6,
                            adaptive_draft=False)
        spec = Session(model, tok, config, drafters={"none": NoDrafter, "dflash": b.factory}, features=b.features)
        base = Session(model, tok, config.replace(method="none"), drafters={"none": NoDrafter})
        assert tokens_of(spec.generate_ids(prompt)) == tokens_of(base.generate_ids(prompt)), (precision, width)


def test_every_forward_of_a_dflash_answer_captures_the_layers_the_drafter_names(monkeypatch) -> None:
    """The prefill and each verify capture the residual entering target layers 2 and 4 (z-lab's ids 1
    and 3), and the baseline's forwards capture nothing."""
    b = bundle("z-lab", VOCAB, 4)
    model = target(VOCAB)
    seen: list[tuple[int, ...]] = []
    real = model.forward

    def forward(*args, **kwargs):
        seen.append(tuple(kwargs.get("capture_layers", ())))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    config = SpecConfig(method="dflash", max_new_tokens=12, adaptive_draft=False)
    tokens_of(dflash_session(b, VOCAB, config).generate_ids([3, 4, 5]))
    assert seen and set(seen) == {(2, 4)}
    seen.clear()
    tokens_of(dflash_session(b, VOCAB, config.replace(method="none")).generate_ids([3, 4, 5]))
    assert seen and set(seen) == {()}


def test_generate_and_bench_take_a_dflash_drafter_from_the_command_line(tmp_path: Path, capsys) -> None:
    """``--draft DIR`` alone infers dflash from the drafter's config.json; the answers are the baseline's."""
    from heads import write_tiny_model

    from specchat.cli import main

    model = write_tiny_model(tmp_path / "model")
    draft = write_dflash(tmp_path / "drafter", json.loads((model / "config.json").read_text()), ids=[1, 3], block=6)

    def generate(*args: str) -> dict:
        assert main(["generate", str(model), *args, "--prompt", "the world again", "--max-new-tokens", "20",
                     "--json", "--threads", "1"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    base, out = generate("--method", "none"), generate("--draft", str(draft))
    assert out["method"] == "dflash" and out["tokens"] == base["tokens"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["the world", "again and again"]) + "\n")
    report = tmp_path / "bench.json"
    assert main(["bench", str(model), "--draft", str(draft), "--methods", "none,dflash", "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--json", str(report), "--threads", "1"]) == 0
    rows = {r["method"]: r for r in json.loads(report.read_text())["results"]}
    assert set(rows) == {"none", "dflash"} and all(r["identical_to_baseline"] for r in rows.values())
    assert rows["dflash"]["mean_draft_levels"] == 0  # one forward a block: no levels to count
