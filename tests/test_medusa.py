"""Medusa heads: both public layouts load, misfits are refused before anything changes, drafting is
lossless (greedy and sampling), trees have the asked shape, and the heads are wired to the right position."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch
from heads import write_head
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from medusa_heads import MEDUSA_LAYOUTS, medusa_config, medusa_state, write_medusa_head
from test_eagle import baseline, target, target_config, tokens_of
from tiny import TinyTokenizer, hf_model

from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import load_draft
from engine.drafters.eagle_checkpoint import DraftLoadError
from engine.drafters.medusa import MC_SIM_7B_63, MedusaDrafter, MedusaHeads, cartesian_paths, static_paths
from engine.drafters.medusa_checkpoint import read_medusa
from engine.drafters.ngram import NgramDrafter
from engine.events import Step
from engine.features import FeatureSpec
from engine.methods import draft_methods
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session

HEADS = 3
_TMP = Path(tempfile.mkdtemp(prefix="specchat-medusa-"))
# (layout, truncated vocabulary): vLLM's token_map case beside the two full-vocabulary layouts
VARIANTS = [("medusa", None), ("vllm", None), ("vllm", 40)]


@functools.cache
def head_dir(layout: str, truncated: int | None = None, layers: int = 1, seed: int = 0) -> Path:
    return write_medusa_head(_TMP / f"{layout}-{truncated}-{layers}-{seed}", target_config(), layout, heads=HEADS,
                             layers=layers, truncated=truncated, seed=seed)


@functools.cache
def bundle(layout: str, truncated: int | None = None, layers: int = 1):
    return load_draft(str(head_dir(layout, truncated, layers)), target(), TinyTokenizer())


def medusa_session(b, config: SpecConfig, **drafters) -> Session:
    return Session(target(), TinyTokenizer(), config, drafters={"none": NoDrafter, "medusa": b.factory, **drafters},
                   features=b.features)


def steps_of(session: Session, prompt: list[int]) -> list[Step]:
    return [e for e in session.generate_ids(prompt) if isinstance(e, Step)]


# loading ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "truncated", "layers"), [(*v, 1) for v in VARIANTS] + [("medusa", None, 2)])
def test_both_public_layouts_load_as_medusa_and_read_the_final_hidden_state(layout, truncated, layers) -> None:
    b = bundle(layout, truncated, layers)
    assert b.method == "medusa" and "medusa" in draft_methods()
    assert b.features == FeatureSpec(final_hidden=True)  # the vector the target's lm_head reads
    drafter = b.factory()
    assert isinstance(drafter, MedusaDrafter) and drafter.needs_features
    assert drafter.heads.num_heads == HEADS and drafter.heads.spec.num_layers == layers
    assert drafter.heads.vocab_size == (truncated or target().config.vocab_size)
    assert f"{HEADS} heads of {layers} block{'s' if layers > 1 else ''}" in b.description
    # --method medusa given explicitly loads the same
    assert load_draft(str(head_dir(layout, truncated, layers)), target(), TinyTokenizer(), method="medusa").method \
        == "medusa"


def test_the_files_have_the_published_names_and_keys() -> None:
    from safetensors import safe_open

    fd = head_dir("medusa")
    assert sorted(p.name for p in fd.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    with safe_open(str(fd / "medusa_lm_head.safetensors"), "pt") as f:
        assert set(f.keys()) == {f"{i}.0.linear.{w}" for i in range(HEADS) for w in ("weight", "bias")} \
            | {f"{i}.1.weight" for i in range(HEADS)}
    with safe_open(str(head_dir("vllm", 40) / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == {f"blocks.{i}.layers.0.weight" for i in range(HEADS)} \
            | {f"lm_heads.{i}.weight" for i in range(HEADS)} | {"token_map"}


def test_medusa2_prefixed_keys_and_vllm_original_lm_head_load(tmp_path: Path) -> None:
    cfg = target_config()
    sd = {f"medusa_head.{k}": v for k, v in medusa_state(cfg, "medusa", heads=2).items()}
    assert load_draft(str(write_medusa_head(tmp_path / "m2", cfg, "medusa", heads=2, state=sd)), target(),
                      TinyTokenizer()).method == "medusa"
    # vLLM's original_lm_head: one lm_head shared by all heads; here the target's own, which the heads
    # then run through the target's layer (one product for every head)
    shared = medusa_state(cfg, "vllm", heads=2)
    for i in range(2):
        shared.pop(f"lm_heads.{i}.weight")
    shared["lm_head.weight"] = target().lm_head.dense_weight.clone()
    b = load_draft(str(write_medusa_head(tmp_path / "orig", cfg, "vllm", heads=2, state=shared,
                                         config_changes={"original_lm_head": True})), target(), TinyTokenizer())
    heads = b.factory().heads
    assert heads.shared and heads.uses_target_lm_head and heads.lm_layers == []
    config = SpecConfig(method="medusa", eagle_topk=2, num_steps=2, num_draft_tokens=6, max_new_tokens=20)
    assert tokens_of(medusa_session(b, config).generate_ids([1, 5, 6, 7])) == list(baseline((1, 5, 6, 7), 20))


def test_pickled_heads_need_the_flag(tmp_path: Path) -> None:
    for layout in MEDUSA_LAYOUTS:
        folder = write_medusa_head(tmp_path / layout, target_config(), layout, pickle=True)
        with pytest.raises(DraftLoadError, match="--allow-pickle") as err:
            load_draft(str(folder), target(), TinyTokenizer())
        assert "\n" not in str(err.value)
        assert load_draft(str(folder), target(), TinyTokenizer(), allow_pickle=True).method == "medusa"


def test_the_wrong_method_names_the_right_one() -> None:
    with pytest.raises(DraftLoadError, match="use --method medusa"):
        load_draft(str(head_dir("medusa")), target(), TinyTokenizer(), method="eagle3")
    eagle3 = write_head(_TMP / "eagle3-for-medusa", target_config(), "eagle3")
    with pytest.raises(DraftLoadError, match="EAGLE-3 head; use --method eagle3"):
        load_draft(str(eagle3), target(), TinyTokenizer(), method="medusa")


def _misfit(tmp_path: Path, case: str) -> tuple[str, dict]:
    """A head folder that does not fit the target, and the load_draft keywords to try it with."""
    cfg = target_config()
    if case == "width":
        return str(write_medusa_head(tmp_path / case, target_config(hidden_size=48), "medusa")), {}
    if case == "vocab":
        return str(write_medusa_head(tmp_path / case, target_config(vocab_size=50), "vllm")), {}
    if case == "vocab_fd":
        return str(write_medusa_head(tmp_path / case, target_config(vocab_size=50), "medusa")), {}
    if case == "pickle":
        return str(write_medusa_head(tmp_path / case, cfg, "medusa", pickle=True)), {}
    sd = medusa_state(cfg, "vllm" if case in ("no_token_map", "extra_head") else "medusa", layers=2)
    layout = "vllm" if case in ("no_token_map", "extra_head") else "medusa"
    changes: dict = {}
    if case == "missing_block":
        sd.pop("1.1.linear.weight")
    elif case == "missing_lm_head":
        sd.pop("2.2.weight")
    elif case == "shape":
        sd["0.0.linear.bias"] = torch.zeros(7)
    elif case == "unknown":
        sd["0.0.linear.scale"] = torch.zeros(3)
    elif case == "no_token_map":
        changes = {"truncated_vocab_size": 40}
    elif case == "extra_head":
        changes = {"num_heads": 2}
    return str(write_medusa_head(tmp_path / case, cfg, layout, layers=2, state=sd, config_changes=changes)), {}


@pytest.mark.parametrize(("case", "needle"), [
    ("width", "hidden size 48 but the target has 32"),
    ("vocab", "vocabulary size 50 but the target has 97"),
    ("vocab_fd", "vocabulary size 50 but the target has 97"),
    ("pickle", "--allow-pickle"),
    ("missing_block", "missing 1.1.linear.weight"),
    ("missing_lm_head", "missing 2.2.weight"),
    ("shape", "0.0.linear.bias has shape (7,)"),
    ("unknown", "does not have (0.0.linear.scale)"),
    ("no_token_map", "no token_map"),
    ("extra_head", "more heads than its config's 2"),
])
def test_a_misfit_head_is_refused_in_one_line_and_the_session_is_unchanged(tmp_path: Path, case: str,
                                                                           needle: str) -> None:
    s = Session(target(), TinyTokenizer(), SpecConfig(method="ngram", max_new_tokens=8),
                drafters={"none": NoDrafter, "ngram": NgramDrafter})
    first = tokens_of(s.chat("ABCD"))
    before = (s.methods, s.config, s.messages, s.context_used)
    path, kw = _misfit(tmp_path, case)
    with pytest.raises(DraftLoadError) as err:
        load_draft(path, target(), TinyTokenizer(), **kw)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert (s.methods, s.config, s.messages, s.context_used) == before
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=8), drafters={"none": NoDrafter})
    assert [first, tokens_of(s.chat("EFG"))] == [tokens_of(plain.chat("ABCD")), tokens_of(plain.chat("EFG"))]


def test_a_good_head_hot_swapped_into_a_running_chat_drafts_and_stays_lossless() -> None:
    s = Session(target(), TinyTokenizer(), SpecConfig(method="ngram", max_new_tokens=12),
                drafters={"none": NoDrafter, "ngram": NgramDrafter})
    first = tokens_of(s.chat("ABCD"))
    b = bundle("vllm", 40)
    s.set_draft(b.method, b.factory, b.features)
    s.update_config(s.config.replace(method="medusa"))
    events = list(s.chat("EFG"))
    assert any(len(e.tree) > 1 for e in events if isinstance(e, Step))
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter})
    assert [first, tokens_of(events)] == [tokens_of(plain.chat("ABCD")), tokens_of(plain.chat("EFG"))]


def test_config_refuses_a_bad_tree_kind_and_a_topk_beyond_the_head_vocabulary() -> None:
    with pytest.raises(ConfigError, match="medusa_tree must be one of dynamic, static"):
        SpecConfig(method="medusa", medusa_tree="fixed")  # type: ignore[arg-type]
    b = bundle("vllm", 40)
    s = medusa_session(b, SpecConfig(method="medusa", eagle_topk=4, num_draft_tokens=64, max_new_tokens=2))
    with pytest.raises(ConfigError, match="vocabulary of 40"):
        s.update_config(s.config.replace(eagle_topk=50))
    assert s.config.eagle_topk == 4 and s.pending_config is None


# trees ----------------------------------------------------------------------------------------------------
def test_the_static_tree_is_the_papers_list_trimmed() -> None:
    assert len(MC_SIM_7B_63) == 63 and len(set(MC_SIM_7B_63)) == 63
    assert static_paths(100, 4, 97) == list(MC_SIM_7B_63)
    assert static_paths(5, 4, 97) == [(0,), (0, 0), (1,), (0, 1), (2,)]
    two = static_paths(63, 2, 97)  # depth capped by the heads run: deeper paths are left out
    assert max(map(len, two)) == 2 and all(p[:-1] in {(), *two} for p in two)
    assert all(max(p) < 3 for p in static_paths(63, 4, 3))  # ranks capped by the head vocabulary


@settings(max_examples=60, deadline=None)
@given(levels=st.lists(st.lists(st.floats(-8.0, 0.0), min_size=1, max_size=4), min_size=1, max_size=4),
       drafts=st.integers(1, 40))
def test_the_dynamic_tree_is_the_best_part_of_the_cartesian_product(levels, drafts) -> None:
    """Best first equals brute force: the kept nodes score (sum of log-probabilities along the path)
    at least as well as every node left out, and each comes after its parent."""
    import itertools

    scores = [sorted(level, reverse=True) for level in levels]  # each head's candidates in rank order
    paths = cartesian_paths(scores, drafts)
    every = [p for d in range(1, len(scores) + 1) for p in itertools.product(*(range(len(s)) for s in scores[:d]))]

    def score(path: tuple[int, ...]) -> float:
        return sum(scores[d][r] for d, r in enumerate(path))

    assert len(paths) == min(drafts, len(every)) and len(set(paths)) == len(paths)
    assert all(p[:-1] == () or p[:-1] in paths[:i] for i, p in enumerate(paths))
    left_out = [score(p) for p in every if p not in set(paths)]
    assert not left_out or min(score(p) for p in paths) >= max(left_out) - 1e-9


@pytest.mark.parametrize("tree_kind", ["dynamic", "static"])
def test_trees_have_the_requested_shape_and_real_probabilities(tree_kind: str) -> None:
    b = bundle("medusa")
    config = SpecConfig(method="medusa", eagle_topk=3, num_steps=5, num_draft_tokens=12, max_new_tokens=8,
                        adaptive_draft=False, medusa_tree=tree_kind)
    for step in steps_of(medusa_session(b, config), [1, 5, 6, 7])[1:]:
        tree = step.tree
        assert len(tree) == 12 and tree.max_depth <= HEADS  # num_steps 5 is capped by the 3 heads
        for kids in tree.children():
            assert len({tree.tokens[c] for c in kids}) == len(kids)  # siblings differ
            if tree_kind == "dynamic":
                assert len(kids) <= 3
        assert all(0.0 < p <= 1.0 for p in tree.draft_probs[1:]) and len(set(tree.draft_probs[1:])) > 1
        if tree_kind == "static":
            depths = [len(p) for p in static_paths(11, HEADS, 97)]
            assert list(tree.depths[1:]) == depths


def test_a_level_is_one_heads_candidates_whatever_the_parent() -> None:
    """Medusa guesses ignore their parent: every depth-d node of a tree has the same children."""
    b = bundle("medusa")
    config = SpecConfig(method="medusa", eagle_topk=2, num_steps=2, num_draft_tokens=7, max_new_tokens=6,
                        adaptive_draft=False)
    for step in steps_of(medusa_session(b, config), [1, 5, 6, 7])[1:]:
        tree = step.tree
        kids = [sorted(tree.tokens[c] for c in tree.children()[i]) for i in range(1, len(tree)) if tree.depths[i] == 1]
        assert len(kids) == 2 and kids[0] == kids[1]


def test_topk_one_is_a_chain_of_num_steps_capped_by_the_heads() -> None:
    b = bundle("vllm")
    for steps, length in ((2, 3), (5, HEADS + 1)):
        config = SpecConfig(method="medusa", eagle_topk=1, num_steps=steps, num_draft_tokens=32, max_new_tokens=8,
                            adaptive_draft=False)
        assert all(e.tree.is_chain and len(e.tree) == length for e in steps_of(medusa_session(b, config),
                                                                               [1, 5, 6, 7])[1:])


# lossless greedy drafting ---------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    variant=st.sampled_from(VARIANTS),
    tree_kind=st.sampled_from(["dynamic", "static"]),
    topk=st.sampled_from([1, 4]),
    steps=st.sampled_from([1, 3, 5]),
    draft_tokens=st.integers(2, 32),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
    swap_at=st.integers(0, 12),
    swap=st.sampled_from([None, (4, 3, 32), (1, 1, 2), (1, 5, 6), "static", "dynamic", "ngram", "none"]),
)
def test_greedy_medusa_equals_plain_decoding(variant, tree_kind, topk, steps, draft_tokens, prompt, max_new,
                                             adaptive, swap_at, swap) -> None:
    b = bundle(*variant)
    topk = min(topk, draft_tokens - 1)  # a level wider than the tree is refused
    config = SpecConfig(method="medusa", eagle_topk=topk, num_steps=steps, num_draft_tokens=draft_tokens,
                        max_new_tokens=max_new, adaptive_draft=adaptive, medusa_tree=tree_kind)
    s = medusa_session(b, config, ngram=NgramDrafter)
    out: list[int] = []
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            assert len(event.tree) <= max(draft_tokens, 32)
            if event.index == swap_at and swap is not None:
                if swap in ("static", "dynamic"):
                    s.update_config(config.replace(medusa_tree=swap))
                elif isinstance(swap, str):
                    s.update_config(config.replace(method=swap))
                else:
                    k, n, t = swap
                    s.update_config(config.replace(eagle_topk=k, num_steps=n, num_draft_tokens=t))
    assert tuple(out) == baseline(tuple(prompt), max_new)


def test_multi_turn_and_method_switches_keep_the_last_hidden_state_in_step() -> None:
    b = bundle("medusa")
    spec = medusa_session(b, SpecConfig(method="medusa", max_new_tokens=15), ngram=NgramDrafter)
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=15), drafters={"none": NoDrafter})
    for turn, method in zip(["ABCD", "EFGABC", "HIJ", "ABCDEF"], ["medusa", "ngram", "medusa", "none"], strict=True):
        spec.update_config(spec.config.replace(method=method))
        assert tokens_of(spec.chat(turn)) == tokens_of(plain.chat(turn))
    assert spec.messages == plain.messages


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    variant=st.sampled_from(VARIANTS),
    tree_kind=st.sampled_from(["dynamic", "static"]),
    topk=st.sampled_from([1, 3]),
    draft_tokens=st.sampled_from([2, 8, 32]),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=16),
    temperature=st.sampled_from([0.6, 1.0, 1.5]),
    top_p=st.sampled_from([1.0, 0.9]),
    seed=st.integers(0, 10_000),
)
def test_coupled_sampling_gives_the_baselines_sample(variant, tree_kind, topk, draft_tokens, prompt, temperature,
                                                     top_p, seed) -> None:
    b = bundle(*variant)
    topk = min(topk, draft_tokens - 1)
    common = {"max_new_tokens": 30, "temperature": temperature, "top_p": top_p, "seed": seed}
    plain = Session(target(), TinyTokenizer(), SpecConfig(**common), drafters={"none": NoDrafter})
    config = SpecConfig(method="medusa", eagle_topk=topk, num_steps=3, num_draft_tokens=draft_tokens,
                        medusa_tree=tree_kind, **common)
    assert tokens_of(medusa_session(b, config).generate_ids(prompt)) == tokens_of(plain.generate_ids(prompt))


# lossless sampling: chi-square against the exact distribution ------------------------------------------------
@pytest.mark.parametrize(("sampling", "topk", "tokens", "tree_kind", "temperature", "top_k"), [
    ("rejection", 1, 4, "dynamic", 1.0, 0),  # a chain of drafts sampled from the heads, min(1, p/q)
    ("rejection", 2, 6, "dynamic", 0.8, 3),  # a tree: point-mass drafts, target top-k
    ("coupled", 2, 6, "static", 1.0, 0),  # the paper's tree ranked by the Gumbel-perturbed scores
])
def test_medusa_sampling_keeps_the_target_distribution(sampling, topk, tokens, tree_kind, temperature,
                                                       top_k) -> None:
    from test_tree_sampling import NEW, SAMPLES, V, chi_square_p, exact, sample_answers
    from test_tree_sampling import target as small_target

    m = small_target()
    cfg = {**target_config(), "vocab_size": V}
    # heads that mostly know the answer: their lm_heads are the target's, so drafts are often accepted
    lm = [m.lm_head.dense_weight.clone() for _ in range(HEADS)]
    spec, weights = read_medusa(medusa_config(cfg, "medusa", heads=HEADS),
                                medusa_state(cfg, "medusa", heads=HEADS, seed=5, scale=0.05, lm_heads=lm),
                                target=m.config)
    heads = MedusaHeads(spec, weights, m)
    config = SpecConfig(method="medusa", eagle_topk=topk, num_steps=HEADS, num_draft_tokens=tokens,
                        max_new_tokens=NEW, temperature=temperature, top_k=top_k, seed=1234, adaptive_draft=False,
                        sampling=sampling, medusa_tree=tree_kind)
    s = Session(m, TinyTokenizer(vocab_size=V, stop_ids=frozenset()), config,
                drafters={"none": NoDrafter, "medusa": lambda: MedusaDrafter(heads)},
                features=FeatureSpec(final_hidden=True))
    counts = sample_answers(s, config)
    assert chi_square_p(counts, exact(temperature, 1.0, top_k), SAMPLES) > 1e-3


# wiring: heads built to know the target's future ----------------------------------------------------------
def _cycle_target(hidden: int = 128) -> LlamaModel:
    """A target whose layers add nothing and whose lm_head maps each token to its successor on one
    97-long cycle, so its greedy answer never repeats a token; wide enough that the normalised
    embeddings are nearly orthogonal and a head can look up the successor several steps ahead."""
    hf, cfg = hf_model("llama", 3, num_hidden_layers=2, vocab_size=97, hidden_size=hidden, intermediate_size=64)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k].zero_()
    sd["model.norm.weight"].fill_(1.0)
    e = torch.nn.functional.rms_norm(sd["model.embed_tokens.weight"], (hidden,))
    order = torch.randperm(97, generator=torch.Generator().manual_seed(0))
    succ = torch.empty(97, dtype=torch.int64)
    succ[order] = order.roll(-1)
    sd["lm_head.weight"] = torch.zeros(97, hidden).index_add_(0, succ, e)
    return LlamaModel(LlamaConfig.from_dict(cfg), sd)


def _oracle_heads(t: LlamaModel, shift: int) -> MedusaHeads:
    """Head i's lm_head matches the last hidden state of token x with f^(i + shift)(x): shift 2 is
    right (the hidden state at the last verified position predicted the root, f(x); head 0 guesses the
    token after it), shift 1 is the classic off-by-one (head 0 re-guessing the root)."""
    H, V = t.config.hidden_size, t.config.vocab_size
    e = torch.nn.functional.rms_norm(t.embed.float(), (H,))
    f = t.lm_head(e).argmax(-1)
    lm = []
    for i in range(HEADS):
        ahead = torch.arange(V)
        for _ in range(i + shift):
            ahead = f[ahead]
        lm.append(torch.zeros(V, H).index_add_(0, ahead, e))
    cfg = {"hidden_size": H, "vocab_size": V}
    sd = medusa_state(cfg, "medusa", heads=HEADS, lm_heads=lm)
    for k in sd:
        if ".linear." in k:
            sd[k].zero_()  # blocks that pass the hidden state through: x + SiLU(0) = x
    spec, weights = read_medusa(medusa_config(cfg, "medusa", heads=HEADS), sd, target=t.config)
    return MedusaHeads(spec, weights, t)


@pytest.mark.parametrize("tree_kind", ["dynamic", "static"])
def test_heads_that_know_the_future_are_accepted_and_off_by_one_heads_are_not(tree_kind: str) -> None:
    t = _cycle_target()

    def tau(heads: MedusaHeads) -> float:
        cfg = SpecConfig(method="medusa", max_new_tokens=60, adaptive_draft=False, eagle_topk=1, num_steps=HEADS,
                         num_draft_tokens=HEADS + 1 if tree_kind == "dynamic" else 8, medusa_tree=tree_kind)
        s = Session(t, TinyTokenizer(stop_ids=frozenset()), cfg,
                    drafters={"none": NoDrafter, "medusa": lambda: MedusaDrafter(heads)},
                    features=FeatureSpec(final_hidden=True))
        return list(s.generate_ids([1, 7, 30, 12, 55]))[-1].stats.tau

    assert tau(_oracle_heads(t, 2)) > HEADS + 0.5
    assert tau(_oracle_heads(t, 1)) < 1.6


@functools.cache
def _cycle_case() -> tuple[LlamaModel, MedusaHeads]:
    t = _cycle_target()
    return t, _oracle_heads(t, 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree_kind=st.sampled_from(["dynamic", "static"]),
    topk=st.sampled_from([1, 4]),
    draft_tokens=st.integers(2, 32),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=12),
    max_new=st.integers(1, 40),
    swap_at=st.integers(0, 8),
    swap=st.sampled_from([None, (1, 2, 3), (4, 3, 32), "static", "dynamic", "none"]),
)
def test_greedy_stays_plain_when_most_drafts_are_accepted(tree_kind, topk, draft_tokens, prompt, max_new, swap_at,
                                                          swap) -> None:
    """Heads that know the future: long accepted paths, cut by the token budget and by hot-swaps."""
    t, heads = _cycle_case()
    topk = min(topk, draft_tokens - 1)
    config = SpecConfig(method="medusa", eagle_topk=topk, num_steps=HEADS, num_draft_tokens=draft_tokens,
                        max_new_tokens=max_new, medusa_tree=tree_kind)
    tok = TinyTokenizer(stop_ids=frozenset())
    s = Session(t, tok, config, drafters={"none": NoDrafter, "medusa": lambda: MedusaDrafter(heads)},
                features=FeatureSpec(final_hidden=True))
    out: list[int] = []
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            if event.index == swap_at and swap is not None:
                if swap in ("static", "dynamic", "none"):
                    s.update_config(config.replace(**({"method": "none"} if swap == "none" else {"medusa_tree": swap})))
                else:
                    k, n, tokens = swap
                    s.update_config(config.replace(eagle_topk=k, num_steps=n, num_draft_tokens=tokens))
    plain = Session(t, tok, SpecConfig(max_new_tokens=max_new), drafters={"none": NoDrafter})
    assert out == tokens_of(plain.generate_ids(prompt))


def test_heads_on_a_stored_target_run_8_bit_codes_and_stay_lossless() -> None:
    from engine.kernels.stored import StoredLinear

    hf, cfg = hf_model("llama", 0, num_hidden_layers=6)
    stored = LlamaModel(LlamaConfig.from_dict(cfg), {k: v.detach().clone() for k, v in hf.state_dict().items()},
                        weights="stored")
    if stored.weights != "stored":
        pytest.skip("no native kernels on this machine: stored weights are dequantized at load")
    b = load_draft(str(head_dir("medusa")), stored, TinyTokenizer())
    heads = b.factory().heads
    assert len(heads.lm_layers) == HEADS
    assert all(isinstance(w, StoredLinear) and w.parts[0].kind == "q8" for w in heads.lm_layers)
    prompt = [5, 17, 3, 44, 9]
    base = Session(stored, TinyTokenizer(), SpecConfig(max_new_tokens=30), drafters={"none": NoDrafter})
    for tree_kind in ("dynamic", "static"):
        spec = Session(stored, TinyTokenizer(), SpecConfig(method="medusa", max_new_tokens=30, medusa_tree=tree_kind),
                       drafters={"none": NoDrafter, "medusa": b.factory}, features=b.features)
        assert tokens_of(spec.generate_ids(prompt)) == tokens_of(base.generate_ids(prompt))


@pytest.mark.parametrize("truncated", [None, 40])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_kernels_picks_are_the_tensor_paths(truncated: int | None, temperature: float) -> None:
    """Each head's candidates taken in the native kernel (one call for greedy, one a head for
    coupled noise) are the torch path's: the same target ids in the same order, the same
    log-probabilities up to the kernels' exp."""
    from engine.drafters.tree_search import coupled_scores
    from engine.sampling import GumbelNoise

    hf, cfg = hf_model("llama", 0, num_hidden_layers=2)
    stored = LlamaModel(LlamaConfig.from_dict(cfg), {k: v.detach().clone() for k, v in hf.state_dict().items()},
                        weights="stored")
    if getattr(stored, "ops", None) is None:
        pytest.skip("no native kernels on this machine")
    directory = write_medusa_head(_TMP / f"kernel-{truncated}", cfg, "vllm", heads=HEADS, truncated=truncated)
    drafter = load_draft(str(directory), stored, TinyTokenizer()).factory()
    heads = drafter.heads
    assert heads.kernel is not None
    config = SpecConfig(method="medusa", temperature=temperature, seed=1)
    noise = GumbelNoise(3, stored.config.vocab_size) if temperature else None
    for seed in range(4):
        hidden = torch.randn(cfg["hidden_size"], generator=torch.Generator().manual_seed(seed))
        width = [4, 2, 3]
        got = drafter._ranked(heads.logits(hidden, HEADS), width,
                              coupled_scores(config, noise, 10, heads.vocab_ids, heads.kernel))
        heads.kernel, kernel = None, heads.kernel
        want = drafter._ranked(heads.logits(hidden, HEADS), width, coupled_scores(config, noise, 10, heads.vocab_ids))
        heads.kernel = kernel
        assert [ids for ids, _ in got] == [ids for ids, _ in want]
        assert [len(ids) for ids, _ in got] == width
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a == pytest.approx(b, abs=1e-5)


def test_each_head_gets_its_own_blocks_and_lm_head() -> None:
    """The batched blocks and the per-head lm_head products equal each head computed on its own."""
    heads = bundle("medusa").factory().heads
    hidden = torch.randn(target().config.hidden_size, generator=torch.Generator().manual_seed(3))
    got = heads.log_probs(hidden, HEADS)
    x = hidden.expand(HEADS, -1)
    x = x + torch.nn.functional.silu(torch.einsum("khd,kd->kh", heads.blocks[:, 0], x) + heads.biases[:, 0])
    lm = torch.stack([w.dense_weight for w in heads.lm_layers])
    want = torch.log_softmax(torch.einsum("kvh,kh->kv", lm, x), dim=-1)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(heads.log_probs(hidden, 2), want[:2], atol=1e-4)


# the command line ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A complete tiny model folder, and FasterDecoding / vLLM heads that fit it."""
    import json

    from heads import write_tiny_model

    root = tmp_path_factory.mktemp("medusa-cli")
    model = write_tiny_model(root / "model")
    cfg = json.loads((model / "config.json").read_text())
    return (model, write_medusa_head(root / "fd", cfg, "medusa", heads=4),
            write_medusa_head(root / "vllm", cfg, "vllm", heads=4, truncated=200))


def _generate(capsys, *args: str) -> dict:
    import json

    from specchat.cli import main

    assert main(["generate", *args, "--prompt", "the world again", "--max-new-tokens", "20", "--json",
                 "--threads", "1"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_infers_medusa_from_the_heads_and_matches_the_baseline(tiny_model, capsys) -> None:
    model, fd, vllm = tiny_model
    base = _generate(capsys, str(model), "--method", "none")
    for heads in (fd, vllm):
        out = _generate(capsys, str(model), "--draft", str(heads))
        assert out["method"] == "medusa" and out["tokens"] == base["tokens"]
    out = _generate(capsys, str(model), "--method", "medusa", "--draft", str(fd), "--speculative-medusa-tree",
                    "static", "--speculative-num-draft-tokens", "12")
    assert out["method"] == "medusa" and out["tokens"] == base["tokens"]


def test_misfit_heads_end_in_one_line_on_the_command_line(tiny_model, capsys, tmp_path: Path) -> None:
    from specchat.cli import main

    model, fd, _ = tiny_model
    import json

    cfg = json.loads((model / "config.json").read_text())
    wide = write_medusa_head(tmp_path / "wide", {**cfg, "hidden_size": 48}, "medusa")
    gen = ["generate", str(model), "--prompt", "hi", "--max-new-tokens", "4"]
    for argv, needle in (([*gen, "--draft", str(wide)], "hidden size 48 but the target has 32"),
                         ([*gen, "--method", "eagle3", "--draft", str(fd)], "--method medusa"),
                         ([*gen, "--method", "medusa"], "needs --draft")):
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("specchat: error:") and needle in err[0], err


def test_bench_runs_medusa_beside_the_baseline_and_ngram(tiny_model, tmp_path: Path) -> None:
    import json

    from specchat.cli import main

    model, _, vllm = tiny_model
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["the world", "again and again"]) + "\n")
    out = tmp_path / "medusa.json"
    assert main(["bench", str(model), "--draft", str(vllm), "--methods", "none,ngram,medusa", "--prompts",
                 str(prompts), "--max-new-tokens", "16", "--json", str(out), "--threads", "1"]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"none", "ngram", "medusa"}
    assert all(r["identical_to_baseline"] for r in rows.values())
    assert rows["medusa"]["draft_ms_per_step"] > 0
