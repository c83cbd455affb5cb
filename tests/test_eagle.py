"""EAGLE-1/2 and EAGLE-3 heads: loading the public layouts, refusing bad heads, lossless drafting, wiring."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
import torch
from heads import EAGLE1_LAYOUTS, EAGLE3_LAYOUTS, head_config, head_state, write_head
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import TinyTokenizer, family_config, hf_model

from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import load_draft
from engine.drafters.eagle import EagleDrafter
from engine.drafters.eagle_checkpoint import DraftLoadError, HeadSpec, load_token_map, read_head
from engine.drafters.eagle_head import EagleHead
from engine.events import Finished, Step
from engine.features import FeatureSpec
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session

LAYERS = 6  # the yuhuili EAGLE-3 layout names no layers: its defaults need a target of >= 4 layers
LAYOUTS = [("eagle", lay) for lay in EAGLE1_LAYOUTS] + [("eagle3", lay) for lay in EAGLE3_LAYOUTS]
_TMP = Path(tempfile.mkdtemp(prefix="specchat-heads-"))


def target_config(**changes) -> dict:
    return {**family_config("llama"), "num_hidden_layers": LAYERS, **changes}


@functools.cache
def target(seed: int = 0) -> LlamaModel:
    hf, cfg = hf_model("llama", seed, num_hidden_layers=LAYERS)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return LlamaModel(LlamaConfig.from_dict(cfg), sd)


@functools.cache
def head_dir(kind: str, layout: str, draft_vocab: int | None = None, seed: int = 0) -> Path:
    folder = _TMP / f"{kind}-{layout}-{draft_vocab}-{seed}"
    pickle = kind == "eagle" and layout == "yuhuili"
    return write_head(folder, target_config(), kind, layout=layout, draft_vocab=draft_vocab, seed=seed, pickle=pickle)


@functools.cache
def bundle(kind: str, layout: str, draft_vocab: int | None = None):
    return load_draft(str(head_dir(kind, layout, draft_vocab)), target(), TinyTokenizer(), allow_pickle=True)


def tokens_of(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


@functools.cache
def baseline(prompt: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    s = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=max_new), drafters={"none": NoDrafter})
    return tuple(tokens_of(s.generate_ids(list(prompt))))


def eagle_session(b, config: SpecConfig) -> Session:
    return Session(target(), TinyTokenizer(), config, drafters={"none": NoDrafter, b.method: b.factory},
                   features=b.features)


# loading --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "layout"), LAYOUTS)
def test_every_public_layout_loads_and_names_its_method(kind: str, layout: str) -> None:
    b = bundle(kind, layout, 40 if kind == "eagle3" else None)
    assert b.method == kind
    if kind == "eagle":
        assert b.features == FeatureSpec(final_hidden=True)
    elif layout == "yuhuili":  # no eagle_config: EAGLE's default inputs of layers 2, L//2, L-3
        assert b.features.capture_layers == (2, LAYERS // 2, LAYERS - 3)
    else:  # eagle_aux_hidden_state_layer_ids [1, 2, 4] are outputs of those layers = inputs of the next
        assert b.features.capture_layers == (2, 3, 5)
    tree = b.factory()
    assert isinstance(tree, EagleDrafter)


def test_pickle_head_needs_the_flag() -> None:
    with pytest.raises(DraftLoadError, match="--allow-pickle"):
        load_draft(str(head_dir("eagle", "yuhuili")), target(), TinyTokenizer())


def _bad(tmp_path: Path, **kw) -> str:
    kind = kw.pop("kind", "eagle3")
    draft_vocab = kw.pop("draft_vocab", None)
    state = head_state(target_config(), kind, draft_vocab=draft_vocab)
    edit = kw.pop("edit", None)
    if edit:
        edit(state)
    return str(write_head(tmp_path / "bad", target_config(), kind, state=state, draft_vocab=draft_vocab, **kw))


@pytest.mark.parametrize(("case", "needle"), [
    ("width", "hidden size 48"),
    ("missing_fc", "missing fc.weight"),
    ("missing_lm_head", "missing lm_head.weight"),
    ("vocab", "vocabulary size 50"),
    ("unknown_key", "does not have"),
    ("no_d2t", "no d2t"),
    ("layers", "layers the target does not have"),
    ("shape", "has shape"),
])
def test_a_head_that_does_not_fit_is_refused_in_one_line(tmp_path: Path, case: str, needle: str) -> None:
    if case == "width":
        cfg = target_config(hidden_size=48)
        path = str(write_head(tmp_path / "w", cfg, "eagle3"))
    elif case == "missing_fc":
        path = _bad(tmp_path, edit=lambda s: s.pop("fc.weight"))
    elif case == "missing_lm_head":
        path = _bad(tmp_path, edit=lambda s: s.pop("lm_head.weight"))
    elif case == "vocab":
        cfg = target_config(vocab_size=50)
        path = str(write_head(tmp_path / "v", cfg, "eagle3"))
    elif case == "unknown_key":
        path = _bad(tmp_path, edit=lambda s: s.__setitem__("midlayer.extra.weight", torch.zeros(3)))
    elif case == "no_d2t":
        path = _bad(tmp_path, draft_vocab=40, edit=lambda s: s.pop("d2t"))
    elif case == "layers":
        path = _bad(tmp_path, config_changes={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}})
    else:
        path = _bad(tmp_path, edit=lambda s: s.__setitem__("norm.weight", torch.ones(7)))
    with pytest.raises(DraftLoadError) as err:
        load_draft(path, target(), TinyTokenizer())
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_a_full_model_is_not_an_eagle_head(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    hf, cfg = hf_model("llama", 0, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(DraftLoadError, match="full language model"):
        load_draft(str(tmp_path), target(), TinyTokenizer(), method="eagle3")


def test_the_wrong_kind_names_the_right_method() -> None:
    with pytest.raises(DraftLoadError, match="--method eagle3"):
        load_draft(str(head_dir("eagle3", "specforge")), target(), TinyTokenizer(), method="eagle")


def test_eagle3_rope_comes_from_the_draft_config() -> None:
    spec, _ = read_head(head_config(target_config(rope_theta=500000.0), "eagle3"),
                        head_state(target_config(), "eagle3"), kind=None, target=target().config)
    assert spec.rope_theta == 10000.0  # not the target's 500000


# lossless greedy drafting -------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    reduced_vocab=st.booleans(),
    topk=st.sampled_from([1, 3]),
    steps=st.sampled_from([1, 4]),
    draft_tokens=st.sampled_from([2, 8, 32]),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
    swap_at=st.integers(0, 12),
    swap=st.sampled_from([None, (3, 4, 32), (1, 1, 2), (1, 4, 5), "ngram", "none"]),
)
def test_greedy_eagle_equals_plain_decoding(layout, reduced_vocab, topk, steps, draft_tokens, prompt, max_new,
                                            adaptive, swap_at, swap) -> None:
    kind, lay = layout
    b = bundle(kind, lay, 40 if (kind == "eagle3" and reduced_vocab) else None)
    topk = min(topk, draft_tokens - 1)  # a level wider than the tree is refused
    config = SpecConfig(method=kind, eagle_topk=topk, num_steps=steps, num_draft_tokens=draft_tokens,
                        max_new_tokens=max_new, adaptive_draft=adaptive)
    from engine.drafters.ngram import NgramDrafter

    s = Session(target(), TinyTokenizer(), config,
                drafters={"none": NoDrafter, "ngram": NgramDrafter, kind: b.factory}, features=b.features)
    out: list[int] = []
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            assert len(event.tree) <= max(draft_tokens, 32)
            if event.index == swap_at and swap is not None:
                if isinstance(swap, str):
                    s.update_config(config.replace(method=swap))
                else:
                    k, n, t = swap
                    s.update_config(config.replace(eagle_topk=k, num_steps=n, num_draft_tokens=t))
    assert tuple(out) == baseline(tuple(prompt), max_new)


def test_a_topk_beyond_the_heads_vocabulary_is_refused_before_any_work() -> None:
    """A head with a 40-token draft vocabulary cannot branch 50 ways: refused when the session is
    made and as a hot-swap (the old settings stay), before a forward runs."""
    b = bundle("eagle3", "specforge", 40)
    wide = SpecConfig(method="eagle3", eagle_topk=50, num_draft_tokens=64)
    with pytest.raises(ConfigError, match="eagle_topk=50 is more than the draft head's vocabulary of 40"):
        eagle_session(b, wide)
    s = eagle_session(b, SpecConfig(method="eagle3", eagle_topk=40, num_draft_tokens=64, max_new_tokens=2))
    with pytest.raises(ConfigError, match="vocabulary of 40"):
        s.update_config(wide)
    assert s.config.eagle_topk == 40 and s.pending_config is None and s.context_used == 0


def test_trees_have_the_requested_shape_and_real_probabilities() -> None:
    b = bundle("eagle3", "specforge", 40)
    config = SpecConfig(method="eagle3", eagle_topk=3, num_steps=4, num_draft_tokens=10, max_new_tokens=6,
                        adaptive_draft=False)
    steps = [e for e in eagle_session(b, config).generate_ids([1, 5, 6, 7]) if isinstance(e, Step)][1:]
    for step in steps:
        tree = step.tree
        assert len(tree) == 10
        assert tree.max_depth <= 4
        for kids in tree.children():
            assert len(kids) <= 3
            assert len({tree.tokens[c] for c in kids}) == len(kids)  # siblings differ
        probs = tree.draft_probs[1:]
        assert all(0.0 < p <= 1.0 for p in probs) and len(set(probs)) > 1


def test_topk_one_is_a_chain_of_num_steps() -> None:
    b = bundle("eagle", "sglang")
    config = SpecConfig(method="eagle", eagle_topk=1, num_steps=5, num_draft_tokens=32, max_new_tokens=8,
                        adaptive_draft=False)
    steps = [e for e in eagle_session(b, config).generate_ids([1, 5, 6, 7]) if isinstance(e, Step)][1:]
    assert all(e.tree.is_chain and len(e.tree) == 6 for e in steps)


def test_multi_turn_and_method_switches_keep_the_draft_cache_in_step() -> None:
    b = bundle("eagle3", "specforge", 40)
    from engine.drafters.ngram import NgramDrafter

    drafters = {"none": NoDrafter, "ngram": NgramDrafter, "eagle3": b.factory}
    spec = Session(target(), TinyTokenizer(), SpecConfig(method="eagle3", max_new_tokens=15), drafters=drafters,
                   features=b.features)
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=15), drafters={"none": NoDrafter})
    for turn, method in zip(["ABCD", "EFGABC", "HIJ", "ABCDEF"], ["eagle3", "ngram", "eagle3", "none"],
                            strict=True):
        spec.update_config(spec.config.replace(method=method))
        a = tokens_of(spec.chat(turn))
        b_ = tokens_of(plain.chat(turn))
        assert a == b_
    assert spec.messages == plain.messages


# wiring: a head built to copy the target ------------------------------------------------------------------
def _bigram_target(vocab: int = 97) -> LlamaModel:
    """A target whose layers add nothing: its next token depends on the current token only."""
    hf, cfg = hf_model("llama", 3, num_hidden_layers=LAYERS, vocab_size=vocab)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k].zero_()
    sd["model.norm.weight"].fill_(1.0)
    return LlamaModel(LlamaConfig.from_dict(cfg), sd)


def _copy_head_eagle1(t: LlamaModel) -> tuple[HeadSpec, dict[str, torch.Tensor]]:
    """fc passes the embedding through and the layer adds nothing, so g = embed(x_{p+1}) and the
    target's own LM head ranks exactly as the target does for x_{p+1}: a perfect drafter, *if* the
    head pairs each feature with the next token."""
    cfg = target_config(vocab_size=t.config.vocab_size)
    sd = head_state(cfg, "eagle", layout="sglang", bias=False)
    H = t.config.hidden_size
    sd["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)
    sd["layers.0.self_attn.o_proj.weight"].zero_()
    sd["layers.0.mlp.down_proj.weight"].zero_()
    return read_head(head_config(cfg, "eagle", bias=False), sd, kind=None, target=t.config)


class _ShiftedDrafter(EagleDrafter):
    """The classic wiring bug: pairing the feature at p with the token at p instead of p+1."""

    def _entry_tokens(self, first: int, root: int) -> list[int]:
        return self._tokens[first:]


def _tau(t: LlamaModel, head: EagleHead, drafter_cls=EagleDrafter, **config) -> float:
    cfg = SpecConfig(method="eagle", max_new_tokens=60, adaptive_draft=False, **config)
    s = Session(t, TinyTokenizer(stop_ids=frozenset()), cfg,
                drafters={"none": NoDrafter, "eagle": lambda: drafter_cls(head, "eagle")},
                features=FeatureSpec(final_hidden=True))
    events = list(s.generate_ids([1, 7, 30, 12, 55]))
    assert isinstance(events[-1], Finished)
    return events[-1].stats.tau


def test_a_head_that_copies_the_target_is_accepted_and_a_shifted_one_is_not() -> None:
    t = _bigram_target()
    spec, weights = _copy_head_eagle1(t)
    head = EagleHead(spec, weights, t)
    assert _tau(t, head, eagle_topk=1, num_steps=4, num_draft_tokens=5) > 4.0
    assert _tau(t, head, eagle_topk=3, num_steps=3, num_draft_tokens=8) > 2.5  # reranking may drop depth 3
    assert _tau(t, head, _ShiftedDrafter, eagle_topk=1, num_steps=4, num_draft_tokens=5) < 1.6


def _copy_head_eagle3(t: LlamaModel, used: list[int], d2t_error: bool) -> EagleHead:
    """Depth-1 copy for EAGLE-3: sharp self-attention carries norm(embed(x_{p+1})) to the output and
    the head's lm_head holds the target's rows for the draft vocabulary ``used``."""
    H, nh = t.config.hidden_size, t.config.num_heads
    cfg = target_config(vocab_size=t.config.vocab_size, num_key_value_heads=nh)
    hcfg = head_config(cfg, "eagle3", draft_vocab=len(used), aux_ids=[1, 2, 4])
    sd = head_state(cfg, "eagle3", draft_vocab=len(used), vocab_ids=used)
    eye_first = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)
    sd["fc.weight"].zero_()
    sd["midlayer.self_attn.q_proj.weight"] = 30 * eye_first
    sd["midlayer.self_attn.k_proj.weight"] = 30 * eye_first
    sd["midlayer.self_attn.v_proj.weight"] = eye_first.clone()
    sd["midlayer.self_attn.o_proj.weight"] = torch.eye(H)
    sd["midlayer.mlp.down_proj.weight"].zero_()
    for name in ("midlayer.input_layernorm.weight", "norm.weight"):
        sd[name] = torch.ones(H)
    sd["lm_head.weight"] = t.lm_head.dense_weight[used].clone()
    if d2t_error:  # draft id i names the wrong target token
        n = len(used)
        sd["d2t"] = torch.tensor([used[(i + 7) % n] - i for i in range(n)])
    spec, weights = read_head(hcfg, sd, kind=None, target=t.config)
    return EagleHead(spec, weights, t)


def test_eagle3_d2t_maps_draft_ids_to_target_ids() -> None:
    t = _bigram_target()
    V = t.config.vocab_size
    # the draft vocabulary: every token the target ever predicts, plus padding
    nxt = t.lm_head(torch.nn.functional.rms_norm(t.embed, (t.config.hidden_size,))).argmax(-1)
    used = sorted(set(nxt.tolist()) | set(range(0, V, 5)))

    def tau(head: EagleHead) -> float:
        cfg = SpecConfig(method="eagle3", max_new_tokens=60, adaptive_draft=False, eagle_topk=1, num_steps=1,
                         num_draft_tokens=2)
        s = Session(t, TinyTokenizer(stop_ids=frozenset()), cfg,
                    drafters={"none": NoDrafter, "eagle3": lambda: EagleDrafter(head)},
                    features=FeatureSpec(capture_layers=head.spec.capture_layers()))
        return list(s.generate_ids([1, 7, 30, 12, 55]))[-1].stats.tau

    assert tau(_copy_head_eagle3(t, used, d2t_error=False)) > 1.9
    assert tau(_copy_head_eagle3(t, used, d2t_error=True)) < 1.3


# FR-Spec ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "pt", "safetensors"])
def test_token_map_restricts_an_eagle1_head(tmp_path: Path, fmt: str) -> None:
    hot = [5, 9, 3, 40, 41, 42, 60, 2]
    path = tmp_path / f"map.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(hot))
    elif fmt == "pt":
        torch.save(hot, path)
    else:
        from safetensors.torch import save_file

        save_file({"ids": torch.tensor(hot)}, str(path))
    assert load_token_map(path, 97).tolist() == hot
    b = load_draft(str(head_dir("eagle", "sglang")), target(), TinyTokenizer(), token_map=str(path))
    config = SpecConfig(method="eagle", eagle_topk=3, num_steps=3, num_draft_tokens=8, max_new_tokens=20,
                        adaptive_draft=False)
    events = list(eagle_session(b, config).generate_ids([1, 5, 6, 7]))
    drafted = {tok for e in events if isinstance(e, Step) for tok in e.tree.tokens[1:]}
    assert drafted and drafted <= set(hot)
    assert tuple(tokens_of(events)) == baseline((1, 5, 6, 7), 20)


@pytest.mark.parametrize(("content", "needle"), [("[1, 1]", "twice"), ("[500]", "outside"), ("{", "could not")])
def test_bad_token_maps_are_refused(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "map.json"
    path.write_text(content)
    with pytest.raises(DraftLoadError, match=needle):
        load_token_map(path, 97)


def test_token_map_is_refused_for_eagle3(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(DraftLoadError, match="EAGLE-1/2"):
        load_draft(str(head_dir("eagle3", "specforge")), target(), TinyTokenizer(), token_map=str(path))


def test_a_bad_draft_leaves_the_session_as_it_was_and_a_good_one_is_installed(tmp_path: Path) -> None:
    from engine.drafters.ngram import NgramDrafter

    s = Session(target(), TinyTokenizer(), SpecConfig(method="ngram", max_new_tokens=8),
                drafters={"none": NoDrafter, "ngram": NgramDrafter})
    first = tokens_of(s.chat("ABCD"))
    bad = _bad(tmp_path, edit=lambda st_: st_.pop("norm.weight"))
    with pytest.raises(DraftLoadError):
        load_draft(bad, target(), TinyTokenizer())
    assert s.methods == ("none", "ngram") and s.config.method == "ngram"
    good = bundle("eagle3", "specforge", 40)
    s.set_draft(good.method, good.factory, good.features)
    s.update_config(s.config.replace(method="eagle3"))
    second = tokens_of(s.chat("EFG"))
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=8), drafters={"none": NoDrafter})
    assert [tokens_of(plain.chat("ABCD")), tokens_of(plain.chat("EFG"))] == [first, second]


@pytest.mark.parametrize("topk", [1, 3])
def test_seeded_sampling_with_a_head_reproduces(topk: int) -> None:
    b = bundle("eagle3", "specforge", 40)
    config = SpecConfig(method="eagle3", eagle_topk=topk, num_steps=3, num_draft_tokens=6, max_new_tokens=30,
                        temperature=0.9, top_p=0.95, seed=6)  # 30 tokens before a stop
    runs = [tokens_of(eagle_session(b, config).generate_ids([1, 5, 6, 7])) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 30
    other = tokens_of(eagle_session(b, config.replace(seed=8)).generate_ids([1, 5, 6, 7]))
    assert other != runs[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    topk=st.sampled_from([1, 3]),
    steps=st.sampled_from([1, 4]),
    draft_tokens=st.sampled_from([2, 8, 32]),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=16),
    adaptive=st.booleans(),
    temperature=st.sampled_from([0.6, 1.0, 1.5]),
    top_p=st.sampled_from([1.0, 0.9]),
    seed=st.integers(0, 10_000),
)
def test_coupled_sampling_gives_the_baselines_sample_whatever_the_drafter(layout, topk, steps, draft_tokens, prompt,
                                                                          adaptive, temperature, top_p,
                                                                          seed) -> None:
    kind, lay = layout
    b = bundle(kind, lay, 40 if kind == "eagle3" else None)
    topk = min(topk, draft_tokens - 1)  # a level wider than the tree is refused
    common = {"max_new_tokens": 30, "temperature": temperature, "top_p": top_p, "seed": seed}
    plain = Session(target(), TinyTokenizer(), SpecConfig(**common), drafters={"none": NoDrafter})
    config = SpecConfig(method=kind, eagle_topk=topk, num_steps=steps, num_draft_tokens=draft_tokens,
                        adaptive_draft=adaptive, **common)
    assert tokens_of(eagle_session(b, config).generate_ids(prompt)) == tokens_of(plain.generate_ids(prompt))


def test_a_bf16_head_on_a_stored_target_keeps_16_bit_weights_and_drafts_the_same(monkeypatch) -> None:
    """With SPECCHAT_HEAD_WEIGHTS=stored a 16-bit head stays 16-bit (half the bytes per drafted
    level); our kernels widen bf16 exactly and run the same FMA chains: bit-identical drafts."""
    from engine.kernels.stored import StoredLinear

    monkeypatch.setenv("SPECCHAT_HEAD_WEIGHTS", "stored")

    hf, cfg = hf_model("llama", 0, num_hidden_layers=LAYERS)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    fp32_target = LlamaModel(LlamaConfig.from_dict(cfg), dict(sd))
    stored_target = LlamaModel(LlamaConfig.from_dict(cfg), dict(sd), weights="stored")
    hcfg = head_config(cfg, "eagle3", draft_vocab=40, aux_ids=[1, 2, 4])
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
             for k, v in head_state(cfg, "eagle3", draft_vocab=40).items()}
    spec, weights = read_head(hcfg, state, kind=None, target=fp32_target.config)
    plain, stored = EagleHead(spec, weights, fp32_target), EagleHead(spec, weights, stored_target)
    if stored_target.weights != "stored":
        pytest.skip("no native kernels on this machine: stored weights are dequantized at load")
    assert isinstance(stored.gate_up, StoredLinear) and stored.gate_up.nbytes * 2 == plain.gate_up.nbytes
    T = 5
    tokens = torch.tensor([3, 9, 27, 4, 11])
    stream = torch.randn(T, 3 * cfg["hidden_size"], generator=torch.Generator().manual_seed(1))
    outs = []
    for head in (plain, stored):
        g = head.forward(tokens, stream, torch.arange(T), head.new_cache(16), 0)
        outs.append((g, head.log_probs(g)))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("setting,kind", [(None, "q4"), ("q8", "q8")])
def test_a_head_on_a_stored_target_runs_on_4_bit_codes_by_default_8_bit_when_asked_and_stays_lossless(
        monkeypatch: pytest.MonkeyPatch, setting: str | None, kind: str) -> None:
    from engine.kernels.stored import StoredLinear

    if setting is None:
        monkeypatch.delenv("SPECCHAT_HEAD_WEIGHTS", raising=False)
    else:
        monkeypatch.setenv("SPECCHAT_HEAD_WEIGHTS", setting)

    hf, cfg = hf_model("llama", 0, num_hidden_layers=LAYERS)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    stored_target = LlamaModel(LlamaConfig.from_dict(cfg), dict(sd), weights="stored")
    if stored_target.weights != "stored":
        pytest.skip("no native kernels on this machine: stored weights are dequantized at load")
    b = load_draft(str(head_dir("eagle3", "specforge", 40)), stored_target, TinyTokenizer())
    drafter = b.factory()
    assert isinstance(drafter.head.lm_head, StoredLinear) and drafter.head.lm_head.parts[0].kind == kind
    base = Session(stored_target, TinyTokenizer(), SpecConfig(max_new_tokens=40), drafters={"none": NoDrafter})
    spec = Session(stored_target, TinyTokenizer(), SpecConfig(method="eagle3", max_new_tokens=40, adaptive_draft=False),
                   drafters={"none": NoDrafter, "eagle3": b.factory}, features=b.features)
    prompt = [5, 17, 3, 44, 9]
    assert tokens_of(spec.generate_ids(prompt)) == tokens_of(base.generate_ids(prompt))


# features are captured only while a head drafts -----------------------------------------------------------
def _spy_forwards(monkeypatch: pytest.MonkeyPatch, model: LlamaModel) -> list[tuple[int, ...]]:
    """Record the capture layers every target forward is asked for."""
    seen: list[tuple[int, ...]] = []
    real = model.forward

    def forward(*args, **kwargs):
        seen.append(tuple(kwargs.get("capture_layers", ())) + (("hidden",) if kwargs.get("return_hidden") else ()))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    return seen


def test_a_loaded_head_captures_nothing_while_another_method_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded model's head is loaded for every method (load_session) so eagle3 can be chosen
    mid-chat; the baseline's and n-gram's forwards must not capture its layers (a copy per layer, and
    on CUDA no CUDA graphs). Switched to eagle3 mid-answer, the tokens committed without features are
    run again and the answer stays the plain one."""
    b = bundle("eagle3", "specforge", 40)
    from engine.drafters.ngram import NgramDrafter

    model = target()
    want = list(baseline((1, 5, 6, 7, 5, 6), 24))
    seen = _spy_forwards(monkeypatch, model)
    for method in ("none", "ngram"):
        seen.clear()
        s = Session(model, TinyTokenizer(), SpecConfig(method=method, max_new_tokens=24),
                    drafters={"none": NoDrafter, "ngram": NgramDrafter, "eagle3": b.factory}, features=b.features)
        assert tokens_of(s.generate_ids([1, 5, 6, 7, 5, 6])) == want
        assert seen and not any(seen), method
    seen.clear()
    s = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=24),
                drafters={"none": NoDrafter, "eagle3": b.factory}, features=b.features)
    out: list[int] = []
    for event in s.generate_ids([1, 5, 6, 7, 5, 6]):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            if event.index == 3:
                captured_before = len(seen)
                s.update_config(s.config.replace(method="eagle3"))
    assert out == want
    assert not any(seen[:captured_before]) and all(seen[captured_before:])
    assert set(seen[captured_before]) == set(b.features.capture_layers)


def test_a_turn_switched_to_eagle3_prefills_the_tokens_that_have_no_features(monkeypatch) -> None:
    """A turn that starts on eagle3 after a baseline turn re-runs the cached conversation with
    capture on (no cached token has features); the next baseline turn captures nothing again."""
    from engine.events import Started

    b = bundle("eagle3", "specforge", 40)
    model = target()
    plain = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=10), drafters={"none": NoDrafter})
    want = [tokens_of(plain.chat(turn)) for turn in ("ABCD", "EFG", "HI")]
    seen = _spy_forwards(monkeypatch, model)
    s = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=10),
                drafters={"none": NoDrafter, "eagle3": b.factory}, features=b.features)
    got, reused = [], []
    for turn, method in (("ABCD", "none"), ("EFG", "eagle3"), ("HI", "none")):
        s.update_config(s.config.replace(method=method))
        seen.clear()
        events = list(s.chat(turn))
        got.append(tokens_of(events))
        reused += [e.reused_tokens for e in events if isinstance(e, Started)]
        assert seen and (all(seen) if method == "eagle3" else not any(seen)), method
    assert got == want
    assert reused[1] == 0 and reused[2] > 0
