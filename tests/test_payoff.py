"""Whether drafting can pay here (engine/payoff.py): the break-even acceptance from the cost model, the
budget's reckoning from its measured prices, the gate's longer pauses when it cannot pay, and the
words bench and the stats panel give it."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.adaptive import _HOPELESS_PAUSE, _MAX_PAUSE, DraftBudget
from engine.events import DraftPayoff, Step, event_from_dict, event_to_dict
from engine.payoff import break_even, chain_gain, draft_payoff
from engine.tree import DraftTree
from specchat.bench_report import cannot_pay_line, payoff_fields, print_payoffs

# the Qwen2.5-Coder 1.5B's verify curve on the 2-core Zen 4 (issue 57)
QWEN_CURVE = {1: 1.0, 2: 1.04, 4: 1.20, 8: 2.04, 16: 3.32}


def test_one_draft_needs_its_cost_plus_the_second_token_s_verify_and_two_need_the_quadratic_root() -> None:
    assert break_even(0.49, 1) == pytest.approx(0.49)
    k = 1.02
    assert break_even(k, 2) == pytest.approx((-1 + math.sqrt(1 + 4 * k)) / 2)
    assert break_even(-0.1, 3) == 0.0  # drafting costs nothing: any acceptance pays
    assert break_even(2.0, 2) is None and break_even(2.5, 2) is None  # not even drafts always kept pay


@given(st.floats(0.0, 7.99), st.integers(1, 8))
def test_the_break_even_acceptance_keeps_exactly_the_drafts_it_must(extra: float, depth: int) -> None:
    a = break_even(extra, depth)
    if extra >= depth:
        assert a is None
    else:
        assert a is not None and 0.0 <= a < 1.0 and chain_gain(a, depth) == pytest.approx(extra, abs=1e-9)


@given(st.floats(0.0, 5.0), st.floats(0.0, 2.0), st.floats(0.0, 0.5), st.integers(1, 12))
def test_the_needed_acceptance_is_the_least_over_chain_lengths(intercept, per_level, slope, max_depth) -> None:
    def verify(n: int) -> float:
        return 10.0 * (1.0 + slope * (n - 1))

    def draft(d: int) -> float:
        return intercept + per_level * 10.0 * d

    every = [(a, d) for d in range(1, max_depth + 1)
             if (a := break_even((draft(d) + verify(d + 1)) / 10.0 - 1.0, d)) is not None]
    payoff = draft_payoff(10.0, draft, verify, reached=0.5, max_depth=max_depth)
    if not every:
        assert payoff.needed is None and payoff.depth == 0
    else:
        assert payoff.needed == pytest.approx(min(every)[0], abs=1e-9)


def test_the_qwen_pair_needs_49_percent_with_one_draft() -> None:
    """The module docstring's example: a level at 45% of a target step, V(2) = 1.04 V(1)."""
    def verify(n: int) -> float:
        return 10.0 * (QWEN_CURVE.get(n) or QWEN_CURVE[2] + (n - 2) * 0.08)

    payoff = draft_payoff(10.0, lambda d: 4.5 * d, verify, reached=0.31, max_depth=5)
    assert payoff.depth == 1 and payoff.needed == pytest.approx(0.49)
    assert payoff.draft_share == pytest.approx(0.45) and not payoff.pays
    assert draft_payoff(10.0, lambda d: 4.5 * d, verify, reached=0.9, max_depth=5).pays
    # a level dearer than a whole target step: no acceptance pays at any length
    dear = draft_payoff(10.0, lambda d: 20.0 * d, verify, reached=0.99, max_depth=5)
    assert dear.needed is None and dear.depth == 0 and not dear.pays


def chain(n: int) -> DraftTree:
    return DraftTree(tuple(range(n)), tuple(range(-1, n - 1)), (1.0,) + (0.9,) * (n - 1))


def run_budget(acceptance: float, steps: int = 6000, seed: int = 0) -> tuple[DraftBudget, list[int]]:
    """A drafter of one draft a step at ``acceptance``, each level costing 45% of a 10 ms plain step, on
    the Qwen curve; returns the budget and every pause the gate took."""
    rng = random.Random(seed)
    budget = DraftBudget(cost_shape=dict(QWEN_CURVE))
    pauses: list[int] = []
    for _ in range(steps):
        if budget.gate.should_draft():
            assert budget.draft_depth(1) == 1
            accepted = (1,) if rng.random() < acceptance else ()
            budget.observe(chain(2), accepted, verify_ms=10.4, draft_ms=4.5, levels=1, width=1)
            if budget.gate.pause:
                pauses.append(budget.gate.pause)
        else:
            budget.observe(DraftTree.root_only(1), (), verify_ms=10.0)
    return budget, pauses


def test_a_drafter_that_cannot_pay_is_told_so_and_paused_longer_and_longer() -> None:
    budget, pauses = run_budget(0.2)
    payoff = budget.payoff
    assert payoff is not None and not payoff.pays
    assert payoff.needed == pytest.approx(0.49, abs=0.03) and payoff.draft_share == pytest.approx(0.45, abs=0.03)
    assert payoff.reached == pytest.approx(0.2, abs=0.12)
    # the gate's doubling went past its usual cap, to the longer one, and stayed there
    assert max(pauses) == _HOPELESS_PAUSE and _MAX_PAUSE in pauses and pauses[-1] == _HOPELESS_PAUSE
    assert len(pauses) < 20  # each pause follows a losing probe: few in 6000 steps


def test_a_drafter_that_pays_is_told_so_and_never_paused_past_the_usual_cap() -> None:
    budget, pauses = run_budget(0.9)
    assert budget.payoff is not None and budget.payoff.pays and budget.payoff.reached > 0.8
    assert not pauses or max(pauses) <= _MAX_PAUSE


def test_the_reckoning_needs_measurements_first() -> None:
    budget = DraftBudget(cost_shape=dict(QWEN_CURVE))
    assert budget.reckon_payoff() is None  # nothing timed
    budget.observe(DraftTree.root_only(1), (), verify_ms=10.0)
    assert budget.reckon_payoff() is None  # no draft tried yet
    assert budget.reached() is None


def test_a_step_carries_its_payoff_through_a_trace() -> None:
    payoff = DraftPayoff(draft_share=0.45, needed=0.49, depth=1, reached=0.31)
    step = Step(index=3, tree=chain(2), accepted=(1,), bonus=7, payoff=payoff)
    assert event_from_dict(event_to_dict(step)) == step
    bare = Step(index=3, tree=chain(2))
    assert event_from_dict(event_to_dict(bare)).payoff is None
    from specchat.tui.trace_types import check_record

    check_record(step)
    with pytest.raises(TypeError, match=r"payoff\.needed must be"):
        check_record(Step(payoff=DraftPayoff(needed="half")))  # type: ignore[arg-type]


def test_bench_says_why_a_row_cannot_pay_and_nothing_for_one_that_pays(capsys) -> None:
    losing = payoff_fields(DraftPayoff(draft_share=0.45, needed=0.49, depth=1, reached=0.31))
    assert cannot_pay_line("standalone", losing) == (
        "standalone cannot pay here: its draft step costs 45% of a target step, it would need an acceptance of "
        "49% per token (one draft a step), it reached 31%")
    dear = payoff_fields(DraftPayoff(draft_share=1.44, needed=None, depth=0, reached=0.91))
    assert "no acceptance pays" in cannot_pay_line("standalone", dear)  # type: ignore[operator]
    deep = payoff_fields(DraftPayoff(draft_share=0.1, needed=0.6, depth=3, reached=0.5))
    assert "(a chain of 3)" in cannot_pay_line("eagle3", deep)  # type: ignore[operator]
    paying = payoff_fields(DraftPayoff(draft_share=0.1, needed=0.2, depth=2, reached=0.5))
    assert cannot_pay_line("eagle3", paying) is None and cannot_pay_line("none", None) is None
    report = {"weights": ["stored"], "results": [
        {"method": "none", "mode": "stored", "payoff": None},
        {"method": "eagle3", "mode": "stored", "payoff": paying},
        {"method": "standalone", "mode": "stored", "payoff": losing},
    ]}
    print_payoffs(report)
    assert capsys.readouterr().out.splitlines() == [cannot_pay_line("standalone", losing)]
