"""The session loop: lossless greedy output, stops, cancel, hot-swap, multi-turn cache reuse."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.answer_stats import RunningTally
from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import ConfigApplied, Finished, Started, Step, StepTiming
from engine.session import Session
from engine.tree import DraftTree
from tests.drafters import RandomTreeDrafter
from tests.tiny import TinyTokenizer, our_model

_MODELS: dict[tuple[str, int], object] = {}


def model(family: str = "llama", seed: int = 0):
    key = (family, seed)
    if key not in _MODELS:
        _MODELS[key] = our_model(family, seed)[0]
    return _MODELS[key]


def tokens_of(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


def baseline(m, prompt, max_new=40, stops=frozenset({2})) -> list[int]:
    s = Session(m, TinyTokenizer(stop_ids=stops), SpecConfig(max_new_tokens=max_new), drafters={"none": NoDrafter})
    return tokens_of(s.generate_ids(prompt))


def oracle_for(prompt, answer) -> dict[tuple[int, ...], int]:
    full = list(prompt) + list(answer)
    return {tuple(full[:i]): full[i] for i in range(1, len(full))}


def spec_session(m, drafter, config, stops=frozenset({2})) -> Session:
    return Session(m, TinyTokenizer(stop_ids=stops), config,
                   drafters={"none": NoDrafter, "standalone": lambda: drafter})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["llama", "qwen2", "qwen3"]),
    seed=st.integers(0, 2),
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=30),
    draft_tokens=st.integers(2, 24),
    hit_rate=st.floats(0.0, 1.0),
    max_new=st.integers(1, 50),
    drafter_seed=st.integers(0, 1000),
    adaptive=st.booleans(),
)
def test_greedy_speculation_is_lossless_for_any_tree(family, seed, prompt, draft_tokens, hit_rate, max_new,
                                                      drafter_seed, adaptive) -> None:
    m = model(family, seed)
    prompt = [1, *prompt]
    want = baseline(m, prompt, max_new)
    drafter = RandomTreeDrafter(drafter_seed, oracle_for(prompt, want), hit_rate)
    # the random drafter ignores eagle_topk; 1 is valid for every tree size
    config = SpecConfig(method="standalone", num_draft_tokens=draft_tokens, max_new_tokens=max_new,
                        adaptive_draft=adaptive, eagle_topk=1)
    got = tokens_of(spec_session(m, drafter, config).generate_ids(prompt))
    assert got == want


def test_oracle_drafts_are_accepted_and_tau_counts_the_bonus() -> None:
    m = model()
    prompt = [1, 10, 11, 12]
    want = baseline(m, prompt, 40)
    drafter = RandomTreeDrafter(0, oracle_for(prompt, want), hit_rate=1.0)
    events = list(spec_session(m, drafter, SpecConfig(method="standalone", num_draft_tokens=8,
                                                     max_new_tokens=40)).generate_ids(prompt))
    steps = [e for e in events if isinstance(e, Step)]
    assert tokens_of(events) == want
    assert any(len(s.accepted) >= 2 for s in steps)
    for s in steps[1:]:
        origins = [c.origin for c in s.committed]
        # accepted drafts come first, the target's bonus token closes the step
        assert origins[: len(s.accepted)] == ["draft"] * min(len(s.accepted), len(origins))
    final = events[-1]
    assert isinstance(final, Finished)
    assert final.stats.tau == pytest.approx((final.tokens + (final.reason == 'stop')) / final.stats.steps)
    assert final.stats.tau > 1.5


def test_running_tally_counts_a_final_stop_in_tau_and_can_replay_recorded_time() -> None:
    """The one definition the session and the app's scripted session share (engine/answer_stats.py)."""
    tally = RunningTally(wall_clock=False)
    tally.add_step(DraftTree.root_only(5), (), 1, 1, StepTiming(verify_ms=20.0))
    tally.add_step(DraftTree.chain(5, [6, 7]), (1,), 1, 2, StepTiming(draft_ms=2.0, verify_ms=18.0))  # bonus = stop
    stats = tally.snapshot()
    assert (stats.tokens, stats.steps, stats.tau) == (2, 2, 1.5)
    assert stats.elapsed_s == pytest.approx(0.04) and stats.tokens_per_s == pytest.approx(50.0)
    assert stats.accept_per_depth == (1.0, 0.0) and (stats.draft_ms, stats.verify_ms) == (2.0, 38.0)


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_max_new_tokens_is_exact_even_when_a_step_accepts_more(max_new: int) -> None:
    m = model()
    prompt = [1, 20, 21, 22, 23]
    want = baseline(m, prompt, max_new, stops=frozenset())
    assert len(want) == max_new
    drafter = RandomTreeDrafter(1, oracle_for(prompt, baseline(m, prompt, 60, frozenset())), hit_rate=1.0)
    events = list(spec_session(m, drafter, SpecConfig(method="standalone", num_draft_tokens=10,
                                                     max_new_tokens=max_new), stops=frozenset()).generate_ids(prompt))
    assert tokens_of(events) == want
    assert events[-1].reason == "length"


def test_stop_token_inside_an_accepted_path_ends_the_answer_there() -> None:
    m = model()
    prompt = [1, 30, 31, 32]
    free = baseline(m, prompt, 30, stops=frozenset())
    stop = free[5]  # pretend the 6th token is a stop token
    want = baseline(m, prompt, 30, stops=frozenset({stop}))
    assert want == free[: free.index(stop)]
    drafter = RandomTreeDrafter(2, oracle_for(prompt, free), hit_rate=1.0)
    events = list(spec_session(m, drafter, SpecConfig(method="standalone", num_draft_tokens=12, max_new_tokens=30),
                               stops=frozenset({stop})).generate_ids(prompt))
    assert tokens_of(events) == want
    assert events[-1].reason == "stop"


def test_events_have_the_contract_shape() -> None:
    m = model()
    s = Session(m, TinyTokenizer(), SpecConfig(max_new_tokens=5), drafters={"none": NoDrafter})
    events = list(s.generate_ids([1, 5, 6]))
    assert isinstance(events[0], Started) and events[0].prompt_tokens == 3
    assert isinstance(events[-1], Finished)
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.index for s in steps] == list(range(len(steps)))
    assert all(len(s.tree_text) == len(s.tree) for s in steps)
    assert all(s.committed[-1].origin == "target" for s in steps if s.committed)


def test_cancel_stops_at_a_step_boundary_and_the_session_stays_usable() -> None:
    m = model()
    s = Session(m, TinyTokenizer(stop_ids=frozenset()), SpecConfig(max_new_tokens=100), drafters={"none": NoDrafter})
    list(s.chat("ABCDE"))
    events = []
    for e in s.chat("FGH"):
        events.append(e)
        if isinstance(e, Step) and e.index == 3:
            s.cancel()
    assert events[-1].reason == "cancelled"
    assert len([e for e in events if isinstance(e, Step)]) == 4
    assert [m_["role"] for m_ in s.messages] == ["user", "assistant", "user", "assistant"]
    after = list(s.chat("IJ"))
    assert after[-1].reason == "length"


def test_cancel_from_another_thread() -> None:
    m = model()
    s = Session(m, TinyTokenizer(stop_ids=frozenset()), SpecConfig(max_new_tokens=500),
                drafters={"none": NoDrafter})
    seen = threading.Event()
    result: list = []

    def worker() -> None:
        for e in s.generate_ids([1, 4, 5]):
            if isinstance(e, Step):
                seen.set()
            result.append(e)

    t = threading.Thread(target=worker)
    t.start()
    assert seen.wait(10)
    s.cancel()
    t.join(10)
    assert not t.is_alive()
    assert result[-1].reason == "cancelled"


def test_hot_swap_applies_at_the_next_step_and_stays_lossless() -> None:
    m = model()
    prompt = [1, 40, 41, 42]
    want = baseline(m, prompt, 40, stops=frozenset())
    drafter = RandomTreeDrafter(3, oracle_for(prompt, want), hit_rate=0.9)
    s = spec_session(m, drafter, SpecConfig(method="standalone", num_draft_tokens=4, eagle_topk=2, max_new_tokens=40,
                                            adaptive_draft=False), stops=frozenset())
    events = []
    for e in s.generate_ids(prompt):
        events.append(e)
        if isinstance(e, Step) and e.index == 2:
            s.update_config(s.config.replace(num_draft_tokens=16))
            assert s.pending_config is not None and s.config.num_draft_tokens == 4
        if isinstance(e, Step) and e.index == 6:
            s.update_config(s.config.replace(method="none"))
    assert tokens_of(events) == want
    applied = [e for e in events if isinstance(e, ConfigApplied)]
    assert [a.config["num_draft_tokens"] for a in applied][:1] == [16]
    assert applied[-1].config["method"] == "none"
    steps = [e for e in events if isinstance(e, Step)]
    assert max(len(st_.tree) for st_ in steps[3:7]) > 4  # the bigger trees were used
    assert all(len(st_.tree) == 1 for st_ in steps[8:])  # then the baseline
    assert s.pending_config is None


def test_invalid_hot_swap_is_refused_and_old_settings_stay() -> None:
    s = Session(model(), TinyTokenizer(), SpecConfig(method="none"), drafters={"none": NoDrafter})
    with pytest.raises(ConfigError, match="num_draft_tokens"):
        s.update_config(s.config.replace(num_draft_tokens=1))
    with pytest.raises(ConfigError, match="not available"):
        s.update_config(s.config.replace(method="eagle3"))
    assert s.config == SpecConfig(method="none")
    assert s.pending_config is None


@pytest.mark.parametrize("method", ["eagle", "eagle3", "standalone", "medusa"])
def test_a_topk_wider_than_the_tree_is_refused_up_front_in_one_line(method: str) -> None:
    """``generate --method eagle3 --speculative-eagle-topk 99999`` used to print one word and hang
    (topk² candidates per level): a level wider than the tree's drafts is refused on construction."""
    with pytest.raises(ConfigError, match=r"eagle_topk=12 .*room for 7 drafts.*eagle_topk 7 or less") as err:
        SpecConfig(method=method, eagle_topk=12)
    assert "\n" not in str(err.value)
    assert SpecConfig(method=method, eagle_topk=7).eagle_topk == 7  # the widest level the tree holds
    assert SpecConfig(method="ngram", eagle_topk=12).eagle_topk == 12  # a knob that does not act there
    with pytest.raises(ConfigError, match=r"eagle_topk must be an integer from 1 to 64"):  # its bound: for all
        SpecConfig(method="ngram", eagle_topk=99999)


def test_a_refused_topk_hot_swap_keeps_the_old_settings() -> None:
    config = SpecConfig(method="standalone", num_draft_tokens=8, eagle_topk=2)
    s = spec_session(model(), RandomTreeDrafter(0), config)
    with pytest.raises(ConfigError, match="eagle_topk"):
        s.update_config(s.config.replace(eagle_topk=99999))
    assert s.config == config and s.pending_config is None


def test_second_turn_reuses_the_cache_and_matches_a_fresh_session() -> None:
    m = model()
    s = Session(m, TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter})
    list(s.chat("ABCD"))
    second = list(s.chat("EFG"))
    started = second[0]
    assert isinstance(started, Started) and started.reused_tokens > 5
    fresh = Session(m, TinyTokenizer(), SpecConfig(max_new_tokens=12), drafters={"none": NoDrafter})
    ref = list(fresh.generate(s.messages[:-1]))
    assert tokens_of(second) == tokens_of(ref)


def test_cache_is_sized_from_the_request_not_the_model_maximum() -> None:
    m = model()
    s = Session(m, TinyTokenizer(), SpecConfig(max_new_tokens=20), drafters={"none": NoDrafter})
    list(s.generate_ids([1, 5, 6, 7]))
    assert s._cache.capacity < 4 + 20 + 1 + 300
    list(s.generate_ids([1, 5, 6, 7], SpecConfig(max_new_tokens=400)))
    assert s._cache.capacity >= 400


def test_sampling_session_is_reproducible_with_a_seed() -> None:
    m = model()
    cfg = SpecConfig(temperature=0.8, seed=7, max_new_tokens=20)
    a = tokens_of(Session(m, TinyTokenizer(), cfg, drafters={"none": NoDrafter}).generate_ids([1, 5]))
    b = tokens_of(Session(m, TinyTokenizer(), cfg, drafters={"none": NoDrafter}).generate_ids([1, 5]))
    assert a == b


def test_generate_does_not_touch_the_conversation() -> None:
    s = Session(model(), TinyTokenizer(), SpecConfig(max_new_tokens=4), drafters={"none": NoDrafter})
    list(s.generate([{"role": "user", "content": "ABC"}]))
    assert s.messages == []
    assert torch.is_tensor(s._cache.k)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["llama", "qwen3"]),
    unit=st.lists(st.integers(3, 96), min_size=1, max_size=6),
    repeats=st.integers(1, 6),
    noise=st.lists(st.integers(3, 96), max_size=8),
    draft_tokens=st.integers(2, 16),
    min_window=st.integers(1, 3),
    extra_window=st.integers(0, 6),
    breadth=st.tuples(st.integers(1, 4), st.integers(0, 6)),
    match_type=st.sampled_from(["BFS", "PROB"]),
    mode=st.sampled_from(["tree", "chain"]),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
)
def test_ngram_speculation_is_lossless(family, unit, repeats, noise, draft_tokens, min_window, extra_window,
                                       breadth, match_type, mode, max_new, adaptive) -> None:
    """Repetitive prompts make the n-gram drafts fire; the output must still be the baseline's."""
    from engine.drafters.ngram import NgramDrafter

    m = model(family, 0)
    prompt = [1, *(unit * repeats), *noise, *unit]
    want = baseline(m, prompt, max_new)
    config = SpecConfig(
        method="ngram", num_draft_tokens=draft_tokens, max_new_tokens=max_new,
        ngram_min_match_window_size=min_window, ngram_max_match_window_size=min_window + extra_window,
        ngram_max_trie_depth=min_window + extra_window + 4,
        ngram_min_bfs_breadth=breadth[0], ngram_max_bfs_breadth=breadth[0] + breadth[1],
        ngram_match_type=match_type, ngram_mode=mode, adaptive_draft=adaptive,
    )
    s = Session(m, TinyTokenizer(), config, drafters={"none": NoDrafter, "ngram": NgramDrafter})
    assert tokens_of(s.generate_ids(prompt)) == want


def test_ngram_multi_turn_with_hot_swaps_matches_the_baseline_conversation() -> None:
    from engine.drafters.ngram import NgramDrafter

    m = model()
    turns = ["ABCABCABC", "DEFDEF", "ABCDEF"]
    base = Session(m, TinyTokenizer(), SpecConfig(max_new_tokens=25), drafters={"none": NoDrafter})
    spec = Session(m, TinyTokenizer(), SpecConfig(method="ngram", num_draft_tokens=6, max_new_tokens=25),
                   drafters={"none": NoDrafter, "ngram": NgramDrafter})
    for i, turn in enumerate(turns):
        want = tokens_of(base.chat(turn))
        got = []
        for e in spec.chat(turn):
            if isinstance(e, Step) and e.index == 2:
                spec.update_config(spec.config.replace(ngram_mode="chain" if i % 2 else "tree",
                                                       num_draft_tokens=4 + 3 * i))
            if isinstance(e, Step):
                got.extend(c.id for c in e.committed)
        assert got == want
    assert spec.messages == base.messages


class _SlowUselessDrafter(RandomTreeDrafter):
    """Always wrong and slow to draft: the adaptive budget should stop calling it most steps."""

    def __init__(self) -> None:
        super().__init__(seed=3, hit_rate=0.0)
        self.calls = 0

    def propose(self, history, root, config, **hints):
        import time

        self.calls += 1
        time.sleep(0.02)
        return super().propose(history, root, config, **hints)


def test_a_drafter_that_does_not_pay_is_paused_and_output_stays_lossless() -> None:
    m = model()
    prompt = [1, 5, 9, 13]
    want = baseline(m, prompt, max_new=200, stops=frozenset())
    drafter = _SlowUselessDrafter()  # the gate judges windows of 8 drafted steps, then pauses 4, 8, 16 ... steps
    s = spec_session(m, drafter, SpecConfig(method="standalone", max_new_tokens=200, num_draft_tokens=4, eagle_topk=2),
                     stops=frozenset())
    events = list(s.generate_ids(prompt))
    assert tokens_of(events) == want
    steps = [e for e in events if isinstance(e, Step) and e.index > 0]
    paused = [e for e in steps if e.draft_paused]
    assert drafter.calls + len(paused) == len(steps)
    assert drafter.calls <= len(steps) // 3
    assert all(e.tree.num_drafts == 0 and e.proposed == 0 for e in paused)
    # with the budget off (teaching), every step drafts
    drafter = _SlowUselessDrafter()
    s = spec_session(m, drafter, SpecConfig(method="standalone", max_new_tokens=10, num_draft_tokens=4, eagle_topk=2,
                                            adaptive_draft=False), stops=frozenset())
    steps = [e for e in s.generate_ids(prompt) if isinstance(e, Step) and e.index > 0]
    assert drafter.calls == len(steps) and not any(e.draft_paused for e in steps)


class _PerLevelDrafter(RandomTreeDrafter):
    """A chain drafter that pays a forward per level (like an EAGLE head) and never lands."""

    pays_per_level = True

    def __init__(self) -> None:
        super().__init__(seed=5, hit_rate=0.0)
        self.asked: list[int] = []

    def propose(self, history, root, config, **hints):
        import time

        self.asked.append(config.num_steps)
        time.sleep(self.seconds(config))
        return DraftTree.chain(root, [self.rng.randrange(self.vocab) for _ in range(config.num_steps)])

    def seconds(self, config) -> float:
        """What drafting these levels costs."""
        return 0.003 * config.num_steps


def test_the_budget_asks_a_per_level_drafter_for_fewer_levels_when_deep_drafts_do_not_pay() -> None:
    m = model()
    prompt = [2, 4, 6, 8]
    want = baseline(m, prompt, max_new=80, stops=frozenset())
    drafter = _PerLevelDrafter()
    config = SpecConfig(method="standalone", max_new_tokens=80, num_steps=5, eagle_topk=1, num_draft_tokens=6)
    s = spec_session(m, drafter, config, stops=frozenset())
    events = list(s.generate_ids(prompt))
    assert tokens_of(events) == want
    drafted = [e for e in events if isinstance(e, Step) and e.index > 0 and not e.draft_paused]
    assert [e.draft_levels for e in drafted] == drafter.asked  # the event reports what was asked
    assert drafter.asked[0] == 5 and min(drafter.asked) == 1
    assert all(e.tree.max_depth <= e.draft_levels for e in drafted)
    # n-gram style drafters (no per-level price) always get the configured depth
    plain = RandomTreeDrafter(seed=5, hit_rate=0.0)
    s = spec_session(m, plain, config, stops=frozenset())
    assert all(e.draft_levels == 0 for e in s.generate_ids(prompt) if isinstance(e, Step))


class _WidthDrafter(_PerLevelDrafter):
    """Per-level, and asked for a tree: every row of a level costs, and only first guesses land."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def propose(self, history, root, config, **hints):
        self.widths.append(config.eagle_topk)
        return super().propose(history, root, config, **hints)

    def seconds(self, config) -> float:
        return 0.002 * config.eagle_topk * config.num_steps


def test_the_budget_drafts_chains_when_wider_levels_only_cost_and_says_so_in_each_step() -> None:
    m = model()
    prompt = [3, 5, 7, 9]
    want = baseline(m, prompt, max_new=150, stops=frozenset())
    drafter = _WidthDrafter()
    config = SpecConfig(method="standalone", max_new_tokens=150, num_steps=3, eagle_topk=4, num_draft_tokens=8)
    s = spec_session(m, drafter, config, stops=frozenset())
    events = list(s.generate_ids(prompt))
    assert tokens_of(events) == want
    drafted = [e for e in events if isinstance(e, Step) and e.index > 0 and not e.draft_paused]
    assert [e.draft_width for e in drafted] == drafter.widths and set(drafter.widths) == {1, 4}
    assert drafter.widths[0] == 4  # the configured tree is measured first
