"""The thread governor: one thread while another program holds a core, all again once it is gone."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from engine.models.gguf_weights import load_gguf_state
from engine.models.llama import LlamaConfig, LlamaModel
from engine.threads import ThreadGovernor
from engine.tree import DraftTree
from tests.test_stored_weights import write_model_gguf


def _run(gov: ThreadGovernor, steps: int, ms_at: dict[int, float]) -> list[int]:
    """``steps`` steps whose time depends on the thread count in force; returns the counts used."""
    used = []
    for _ in range(steps):
        used.append(gov.current)
        gov.observe(ms_at[gov.current])
    return used


def test_a_quiet_machine_keeps_every_thread_after_one_trial() -> None:
    calls: list[int] = []
    gov = ThreadGovernor(2, calls.append)
    used = _run(gov, 300, {2: 5.0, 1: 7.0})
    assert used == [2] * 8 + [1, 2] * 8 + [2] * 276 and calls == [1, 2] * 8


def test_a_trial_compares_pairs_so_the_machines_drift_cannot_decide() -> None:
    """This VM's speed flips by a third between moments. A window on one thread, then one at all
    threads, compared the two moments: a slow phase falling on the second kept one thread for half
    an answer on a quiet machine (session 51). Step by step in pairs, both counts see both phases."""
    gov = ThreadGovernor(2, lambda n: None)
    used = []
    for step in range(400):
        phase = 1.0 if (step // 12) % 2 == 0 else 1.4  # the machine's speed flips every 12 steps
        used.append(gov.current)
        gov.observe({2: 20.0, 1: 27.0}[gov.current] * phase)
    assert used[24:] == [2] * 376


def test_one_thread_must_win_clearly_to_be_kept() -> None:
    """Where both counts run alike, all threads stay: one thread 5% faster is within the noise."""
    gov = ThreadGovernor(2, lambda n: None)
    assert _run(gov, 200, {2: 10.0, 1: 9.5})[24:] == [2] * 176
    gov = ThreadGovernor(2, lambda n: None)
    clear = _run(gov, 200, {2: 10.0, 1: 8.0})
    assert clear[24:56] == [1] * 32 and clear[24:].count(1) > 0.8 * 176  # a later trial agrees


def test_a_stalled_step_ends_a_trial_at_once_even_before_all_threads_ran_quiet() -> None:
    """Started on one thread beside a busy program (the calibration's probe), the first retry's step
    at all threads took 700 ms against one thread's 3.7: a stall, though no quiet time is known."""
    gov = ThreadGovernor(2, lambda n: None)
    gov.start_reduced()
    _run(gov, 32, {2: 7.4, 1: 3.7})
    assert gov.trial is not None and gov.current == 2 and gov.quiet_ms is None
    gov.observe(700.0)
    assert gov.trial is None and gov.current == 1 and gov.owed_ms > 0


def test_one_slow_step_does_not_end_a_trial() -> None:
    """A hiccup (a 59 ms step among 24 ms ones) is not a taken core; a second one is."""
    gov = ThreadGovernor(2, lambda n: None)
    _run(gov, 8, {2: 24.0, 1: 31.0})
    times = iter([31.0, 59.0] + [31.0, 24.0] * 7)
    for _ in range(16):
        gov.observe(next(times))
    assert gov.trial is None and gov.current == 2


def test_a_core_taken_from_the_start_is_found_by_the_window_on_one_thread() -> None:
    """No step at all threads ever looks quiet; the early window on one thread shows the way."""
    gov = ThreadGovernor(2, lambda n: None)
    used = _run(gov, 400, {2: 100.0, 1: 7.0})
    assert used.count(2) <= 8 + 6 and used[-50:].count(1) >= 49  # the first window, then one step a trial


def test_a_core_known_taken_before_the_first_step_starts_on_one_thread() -> None:
    """The calibration's probe found one thread faster: no first window at all threads (eight
    slow steps); all threads are still tried later, and kept once the machine is quiet."""
    calls: list[int] = []
    gov = ThreadGovernor(2, calls.append)
    gov.start_reduced()
    used = _run(gov, 200, {2: 100.0, 1: 7.0})
    assert used[:32] == [1] * 32 and used.count(2) <= 3 and calls[0] == 1
    quiet = _run(gov, 3000, {2: 5.0, 1: 7.0})  # the other program ends
    assert quiet[-100:] == [2] * 100


def test_a_taken_core_drops_to_one_thread_and_retries_all_less_and_less_often() -> None:
    calls: list[int] = []
    gov = ThreadGovernor(2, calls.append)
    _run(gov, 40, {2: 5.0, 1: 7.0})
    used = _run(gov, 2000, {2: 100.0, 1: 7.0})  # a training job starts beside the chat
    assert used[:_first_one(used)] == [2] * _first_one(used) and _first_one(used) <= 8
    assert used.count(2) < 0.15 * len(used) and used[-40:].count(1) >= 30
    trials = [i for i in range(2, len(used)) if used[i] == 2 and used[i - 1] == used[i - 2] == 1]  # a trial's first
    gaps = [b - a for a, b in itertools.pairwise(trials)]
    assert len(trials) >= 3 and gaps == sorted(gaps)  # the retries come less often
    slow = used.count(2) * 100.0
    assert slow / (slow + used.count(1) * 7.0) < 0.12  # trials cost a small share of the time
    after = _run(gov, 1200, {2: 5.0, 1: 7.0})  # the job ends: all threads come back within a wait
    assert after[-100:] == [2] * 100 and calls[-1] == 2


def test_one_stalled_step_drops_to_one_thread_at_once() -> None:
    """Beside a busy 2-thread program a step at all threads took 2.7 s (5-10 ms quiet): waiting for a
    window of eight such steps kept the chat at 0.4 tok/s for 20 s. A step 20 times the quiet time
    is verdict enough; one a few times slower (a hiccup) still waits for its window."""
    gov = ThreadGovernor(2, lambda n: None)
    _run(gov, 40, {2: 5.0, 1: 7.0})
    assert gov.current == 2 and gov.quiet_ms is not None
    gov.observe(40.0)  # 8x: not yet
    assert gov.current == 2
    gov.observe(2700.0)
    assert gov.current == 1 and gov.wait > 0
    quiet = _run(gov, 400, {2: 5.0, 1: 7.0})  # all threads are tried again after the wait, and kept
    assert quiet[-100:] == [2] * 100


def test_trees_are_judged_by_their_relative_cost() -> None:
    """A 16-node verify costs 3.5x a one-token step on a quiet CPU: not a taken core."""
    gov = ThreadGovernor(2, lambda n: None)
    for _ in range(40):
        gov.observe(5.0)
    for _ in range(40):
        gov.observe(17.5, relative=3.5)
    assert gov.current == 2


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_the_thread_count_does_not_change_the_logits(tmp_path: Path, precision: str, kernel_variant: str) -> None:
    """What makes a switch mid-answer safe: the same prefill and tree forward, on the native
    kernels with stored blocks, with 1 and 2 threads, bit for bit. In every tile variant this CPU
    runs (``kernel_variant``: the AVX2 tiles split rows and panels over threads differently from the
    AVX-512 and AMX ones), and only on the native kernels, which promise it: without them torch's
    products split the work by thread count as they like."""
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    model = LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")
    if precision == "fast" and not model.fast_available:
        pytest.skip("no fast kernel on this CPU")
    model.precision = precision
    prompt = torch.tensor([1, 5, 9, 13, 2, 7, 3, 11])
    tree = DraftTree((4, 6, 8, 10), (-1, 0, 0, 1), (1.0,) * 4)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cache = model.new_cache(64)
            first = model.forward(prompt, cache).logits
            cache.commit(len(prompt))
            second = model.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + len(prompt),
                                   tree_mask=tree.ancestor_mask()).logits
            outs.append((first, second))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))


def _first_one(used: list[int]) -> int:
    return used.index(1) if 1 in used else len(used)
