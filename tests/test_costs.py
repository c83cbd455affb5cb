"""The live correction of the calibrated verify-cost curve (engine/costs.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import SpecConfig
from engine.costs import _SHAPE_EVERY, _SHAPE_MIN, CostModel
from engine.session import Session
from tests.tiny import TinyTokenizer, our_model

# a calibration the machine's noise landed on: 2 tokens at 1.62x one where the steps run them at 1.2x
NOISY = {1: 1.0, 2: 1.62, 3: 1.84, 4: 1.91, 6: 2.07, 8: 2.23, 12: 2.76, 16: 3.07, 32: 5.48, 64: 11.67}
TRUE = {1: 1.0, 2: 1.2, 3: 1.55, 4: 1.7, 6: 1.95, 8: 2.2, 12: 2.8, 16: 3.2, 32: 6.0, 64: 12.5}


def test_steps_that_time_a_size_often_enough_fix_its_price() -> None:
    """One token and a 2-node tree alternate at their true prices: the 2-node price comes down
    to the steps' (up to the calibration's remaining weight), the scale stays one token's."""
    cost = CostModel(shape=dict(NOISY))
    for _ in range(40):
        cost.observe(1, 3.0)
        cost.observe(2, 3.0 * TRUE[2])
    ratio = cost.estimate(2) / cost.estimate(1)
    assert 1.2 <= ratio < 1.3  # was 1.62
    assert cost.estimate(1) == pytest.approx(3.0, rel=0.05)  # the fit splits what trust leaves over
    assert cost.curve is not None and cost.curve[2] == pytest.approx(ratio, rel=0.02)


def test_nothing_moves_before_a_size_and_one_token_are_timed_often_enough() -> None:
    cost = CostModel(shape=dict(NOISY))
    for _ in range(_SHAPE_MIN - 1):  # one short of the minimum, over more than one correction
        cost.observe(1, 3.0)
        cost.observe(2, 3.6)
    for _ in range(_SHAPE_EVERY):
        cost.observe(4, 5.1)
    assert cost.curve is None
    assert cost.relative(2) == NOISY[2]


def test_one_slow_step_is_not_a_price() -> None:
    """A size's live price is the median of its last timings: a step the OS stalled moves nothing."""
    cost = CostModel(shape=dict(NOISY))
    for i in range(32):
        cost.observe(1, 3.0)
        cost.observe(2, 40.0 if i == 30 else 3.6)
    assert cost.curve is not None and cost.curve[2] < 1.3


def test_sizes_beyond_the_timed_ones_lean_cheaper_but_never_below_them() -> None:
    """Past the largest timed size the calibration's price, times that size's factor where it is
    below 1 (a size priced too low gets chosen and timed; one priced too high is never chosen)."""
    cost = CostModel(shape=dict(NOISY))
    for _ in range(24):
        cost.observe(1, 3.0)
        cost.observe(2, 3.6)
    factor = cost.curve[2] / NOISY[2]
    assert factor < 1
    assert cost.curve[16] == pytest.approx(NOISY[16] * factor, rel=1e-6)
    dearer = CostModel(shape=dict(TRUE))  # the steps run 2 nodes dearer than calibrated
    for _ in range(24):
        dearer.observe(1, 3.0)
        dearer.observe(2, 3.0 * 1.5)
    assert dearer.curve[2] > TRUE[2] and dearer.curve[16] == pytest.approx(TRUE[16], rel=1e-6)
    assert dearer.curve[3] >= dearer.curve[2]


@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8, 16]), st.floats(1.0, 50.0)), min_size=1, max_size=120))
def test_the_corrected_curve_starts_at_one_never_falls_and_prices_every_size(steps) -> None:
    cost = CostModel(shape=dict(NOISY))
    for n, ms in steps:
        cost.observe(n, ms)
    curve = cost.curve or NOISY
    sizes = sorted(curve)
    assert curve[sizes[0]] == 1.0
    assert all(curve[a] <= curve[b] for a, b in itertools.pairwise(sizes))
    assert all(cost.estimate(n) > 0 for n in range(1, 70))


def test_a_session_reports_each_methods_corrected_curve() -> None:
    """What `bench --json` records as ``learned_cost_curves``: per method, the curve its budget
    plans with now, once the steps have corrected it (methods not yet corrected are left out)."""
    model, tok = our_model("llama", 0)[0], TinyTokenizer(stop_ids=frozenset())
    session = Session(model, tok, SpecConfig(method="ngram"))
    session._costs.measured = dict(NOISY)  # as if calibrated (a real calibration's values are noise here)
    assert session.learned_cost_curves == {}
    cost = session._budget("ngram").cost
    session._budget("eagle3")  # a budget without corrected steps
    for _ in range(_SHAPE_EVERY * 2):
        cost.observe(1, 3.0)
        cost.observe(2, 3.6)
    learned = session.learned_cost_curves
    assert set(learned) == {"ngram"} and learned["ngram"] == cost.curve and learned["ngram"][2] < NOISY[2]


def test_a_correction_that_moves_no_price_by_1_percent_is_not_taken() -> None:
    """Each taken correction re-reads the recent steps; the medians shift a little at every one."""
    cost = CostModel(shape=dict(NOISY))
    for _ in range(24):
        cost.observe(1, 3.0)
        cost.observe(2, 3.6)
    taken = cost.curve
    for _ in range(_SHAPE_EVERY):
        cost.observe(1, 3.0 * 1.004)
        cost.observe(2, 3.6)
    assert cost.curve is taken
    for _ in range(_SHAPE_EVERY * 2):  # 2 nodes now 8% dearer: taken
        cost.observe(1, 3.0)
        cost.observe(2, 3.6 * 1.08)
    assert cost.curve is not taken and cost.curve[2] > taken[2] * 1.01
