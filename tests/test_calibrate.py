"""The measured verify-cost curve (engine/calibrate.py) and how the budget plans with it."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.adaptive import DraftBudget
from engine.calibrate import CALIBRATION_SIZES, measure_verify_costs, relative_shape, threads_for_calibration
from engine.config import SpecConfig
from engine.costs import CostModel
from engine.events import Started, Step
from engine.session import Session
from engine.tree import DraftTree
from tests.tiny import TinyTokenizer, our_model

CPU_SHAPE = {1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0, 16: 3.4, 32: 6.2, 64: 11.0}  # measured, fast precision, 2 cores


@given(st.dictionaries(st.integers(1, 64), st.floats(0.1, 100.0), min_size=1, max_size=12))
def test_a_shape_starts_at_one_and_never_falls(costs) -> None:
    shape = relative_shape(costs)
    sizes = sorted(shape)
    assert shape[sizes[0]] == 1.0
    assert all(shape[a] <= shape[b] for a, b in itertools.pairwise(sizes))
    # the lower envelope: no size is priced above what it, or any larger size, was measured at
    low = min(costs.values())
    assert all(shape[n] <= costs[n] / low * (1 + 1e-12) for n in sizes)


def test_one_slow_sample_does_not_lift_the_larger_sizes() -> None:
    """Noise only slows a forward down: a spike at 4 nodes (another program took the core) is
    priced at what 6 nodes cost, and 6 and up keep their own measurements."""
    costs = {1: 4.8, 2: 5.0, 4: 12.0, 6: 6.3, 8: 7.4, 16: 13.7}
    shape = relative_shape(costs)
    assert shape[4] == pytest.approx(6.3 / 4.8) and shape[8] == pytest.approx(7.4 / 4.8)
    assert shape[16] == pytest.approx(13.7 / 4.8)


def test_every_size_follows_the_measured_curve_at_the_level_every_step_refreshes() -> None:
    cost = CostModel(shape=CPU_SHAPE)
    assert cost.estimate(4) is None  # nothing timed yet: no level to scale
    cost.observe(1, 5.0)
    assert cost.estimate(16) == pytest.approx(5.0 * 3.4)
    assert cost.estimate(12) == pytest.approx(5.0 * (2.0 + 0.5 * 1.4))  # between 8 and 16
    assert cost.estimate(96) == pytest.approx(5.0 * (11.0 + 32 / 32 * 4.8))  # along the last segment
    cost.observe(8, 12.0)  # this machine runs trees dearer than the calibration said: 2 ms more at 8
    extra = 2.0 / 7  # two sizes, two unknowns: 5 ms a token on the curve, 2/7 ms a node beyond it
    assert cost.estimate(1) == pytest.approx(5.0) and cost.estimate(8) == pytest.approx(12.0)
    assert cost.estimate(16) == pytest.approx(5.0 * 3.4 + 15 * extra)
    for _ in range(60):  # the conversation grew: 4 ms a token on the curve, nothing beyond it
        cost.observe(1, 4.0)
        cost.observe(4, 4.0 * 1.3)
    # within the 1% a correction of the curve from the steps must move a price before it is taken
    assert cost.estimate(1) == pytest.approx(4.0, rel=0.01) and cost.estimate(16) == pytest.approx(4.0 * 3.4, rel=0.01)


def test_a_line_through_cheap_small_trees_keeps_trees_the_measured_curve_prunes() -> None:
    """The case calibration is for: only small trees have been verified, where a CPU's curve is
    flat; a line through them calls a 16-node tree cheap, the measured curve knows it is not."""
    tree = DraftTree.chain(7, list(range(10, 25)))  # 16 nodes
    kept = {}
    for name, shape in (("line", None), ("measured", CPU_SHAPE)):
        budget = DraftBudget(shape)
        budget.cost.observe(1, 5.0)
        budget.cost.observe(2, 5.5)
        budget.acceptance.rate = {(d, True, False): 0.95 for d in range(1, 20)}
        kept[name] = len(budget.prune(tree))
    assert kept["line"] == 16
    assert 2 < kept["measured"] < 16


def test_measured_costs_cover_every_size_and_the_session_calibrates_once() -> None:
    model, tok = our_model("llama", 0)[0], TinyTokenizer(stop_ids=frozenset())
    costs = measure_verify_costs(model, 16, (1, 3, 8), reps=2)
    assert sorted(costs) == [1, 3, 8] and all(ms > 0 for ms in costs.values())
    plain = Session(model, tok, SpecConfig(method="ngram"))
    assert plain.cost_shape() is None  # a session not asked to calibrate learns from its steps alone
    session = Session(model, tok, SpecConfig(method="ngram", max_new_tokens=12), calibrate_costs=True)
    shape = session.cost_shape()
    assert shape is not None and sorted(shape) == list(CALIBRATION_SIZES) and shape[1] == 1.0
    assert session.cost_shape() is shape  # measured once
    baseline = Session(model, tok, SpecConfig(method="none", max_new_tokens=12))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]

    def answer(s: Session) -> list[int]:
        return [c.id for e in s.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]

    assert answer(session) == answer(baseline)
    started = next(e for e in session.generate_ids(prompt) if isinstance(e, Started))
    assert started.cost_shape == tuple(sorted(shape.items()))  # what the charts draw the budget's curve with
    assert next(e for e in baseline.generate_ids(prompt) if isinstance(e, Started)).cost_shape == ()


def test_a_baseline_answer_never_waits_for_the_calibration() -> None:
    """The app loads a `--method none` session without calibrating; its first answer measured the
    curve (a second of forwards on the embedded model, inside the answer's time) for a budget that
    prunes nothing. A speculative method later still gets its calibration."""
    model, tok = our_model("llama", 0)[0], TinyTokenizer(stop_ids=frozenset())
    session = Session(model, tok, SpecConfig(method="none", max_new_tokens=6), calibrate_costs=True)
    list(session.generate_ids([5, 6, 7, 5, 6, 7]))
    assert session.measured_cost_shape is None
    list(session.generate_ids([5, 6, 7, 5, 6, 7], SpecConfig(method="ngram", max_new_tokens=6)))
    assert session.measured_cost_shape is not None


class _Contended:
    """A model whose forwards stall at more than one thread, as OpenMP does beside a busy program."""

    device = torch.device("cpu")

    def __init__(self, busy: bool) -> None:
        self.busy = busy
        self.threads_seen: list[int] = []

    def new_cache(self, capacity: int) -> object:
        return object()

    def forward(self, tokens, cache, logits="all") -> None:
        threads = torch.get_num_threads()
        self.threads_seen.append(threads)
        time.sleep(0.004 if self.busy and threads > 1 else 0.002 if threads == 1 else 0.001)


@pytest.mark.parametrize("busy", [False, True])
def test_calibration_runs_on_one_thread_where_all_threads_are_slower(busy: bool) -> None:
    """Beside a program holding a core, every barrier of a multi-threaded forward waits: the
    ~90 calibration forwards then took minutes and the TUI sat at "loading"."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = _Contended(busy)
        assert threads_for_calibration(model) == (1 if busy else 2)
        assert torch.get_num_threads() == 2 and set(model.threads_seen) == {1, 2}
    finally:
        torch.set_num_threads(before)


class _FakeClock:
    """Seconds that pass only when the model runs a forward (``per_forward`` each)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _slowed(model, clock: _FakeClock, per_forward: float) -> list[int]:
    """Make each forward of ``model`` advance ``clock``; returns the list of tree sizes run."""
    sizes: list[int] = []
    forward = model.forward

    def slow(tokens, *args, **kwargs):
        clock.now += per_forward
        sizes.append(int(tokens.numel()))
        return forward(tokens, *args, **kwargs)

    model.forward = slow
    return sizes


def test_the_calibration_stops_at_its_deadline_with_the_sizes_timed_so_far() -> None:
    """Beside a busy program every forward is slow: the measurement stops at its deadline (the chat
    sat minutes at "measuring verify costs") and plans with the small sizes it timed, in order."""
    from engine.calibrate import verify_cost_shape

    model = our_model("llama", 0)[0]
    clock = _FakeClock()
    ran = _slowed(model, clock, per_forward=0.5)
    shape = verify_cost_shape(model, context=8, threads=1, deadline_s=4.0, clock=clock)
    assert len(ran) <= 1 + 4.0 / 0.5 + 1  # the context, then forwards until the deadline has passed
    assert shape is not None and sorted(shape) == [1, 2, 3, 4] and shape[1] == 1.0
    clock.now, ran[:] = 0.0, []
    assert verify_cost_shape(model, context=8, threads=1, deadline_s=1.0, clock=clock) is None  # too few sizes
    assert len(ran) <= 4


def test_a_session_whose_calibration_ran_out_of_time_answers_the_same(monkeypatch) -> None:
    """Past the deadline the budget plans with what was timed (or learns from its steps): the
    answer is the target's own either way; and a failed calibration is not retried every step."""
    import engine.calibrate

    tok = TinyTokenizer(stop_ids=frozenset())
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    quiet = Session(our_model("llama", 0)[0], tok, SpecConfig(method="ngram", max_new_tokens=16),
                    calibrate_costs=False)
    reference = [c.id for e in quiet.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]
    for per_forward in (0.5, 5.0):  # a partial curve; no curve at all
        model = our_model("llama", 0)[0]
        clock = _FakeClock()
        _slowed(model, clock, per_forward)
        monkeypatch.setattr(engine.calibrate, "now", clock)
        # the thread probe's forwards (none at one thread) would take their share of the deadline
        monkeypatch.setattr(engine.calibrate, "threads_for_calibration", lambda model, probes=3: 1)
        busy = Session(model, tok, SpecConfig(method="ngram", max_new_tokens=16), calibrate_costs=True)
        busy.cost_shape()
        monkeypatch.undo()
        assert clock.now <= engine.calibrate.CALIBRATION_DEADLINE_S + 2 * per_forward + 1.0
        before = clock.now
        answer = [c.id for e in busy.generate_ids(prompt) if isinstance(e, Step) for c in e.committed]
        assert answer == reference
        assert (busy.measured_cost_shape is None) == (per_forward == 5.0)
        assert clock.now - before < 40 * per_forward  # the answer's own forwards, no second calibration


def test_the_thread_probe_spends_the_same_deadline(monkeypatch) -> None:
    """Start-up waits for the thread probe and the calibration together: what the probe took is
    taken from the calibration's 4 s, so a slow probe leaves the curve to the live steps."""
    import engine.calibrate

    model = our_model("llama", 0)[0]
    clock = _FakeClock()
    _slowed(model, clock, 0.5)

    def slow_probe(model, probes=3):
        clock.now += engine.calibrate.CALIBRATION_DEADLINE_S - 0.2  # the probe used nearly all of it
        return 1

    monkeypatch.setattr(engine.calibrate, "now", clock)
    monkeypatch.setattr(engine.calibrate, "threads_for_calibration", slow_probe)
    session = Session(model, TinyTokenizer(stop_ids=frozenset()), SpecConfig(method="ngram", max_new_tokens=8),
                      calibrate_costs=True)
    session.cost_shape()
    assert session.measured_cost_shape is None  # no room left for three sizes
    assert clock.now <= engine.calibrate.CALIBRATION_DEADLINE_S + 2 * 0.5 + 1.0
