"""What a verify costs by tree size on this machine: the curve the adaptive budget plans with.

Why measure instead of learning it all from the answer's own steps: a budget that knows only the
sizes it happened to verify must guess the rest, and a straight line through a few points misses
the real curve on a CPU (flat while the weights' stream from memory dominates, then steep once the
arithmetic does: 16 tokens cost ~3x one, 64 cost ~10x). Every new size it tried then cost a lost
step, and which sizes it tried depended on timing noise, so the same code pruned differently from
run to run. The shape of the curve is a property of the kernels and the model, stable where the
machine's absolute speed drifts, so it is measured once per session on a scratch cache and the
budget learns its scale from live steps, and its shape only where the steps have timed a size often
enough to outvote a noisy calibration (:class:`engine.costs.CostModel`).

``bench --cost-curve`` reports the same measurement.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.tree import DraftTree

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# the calibration's bound in wall time (seconds): about a second on a quiet 2-core machine; beside a
# busy program it used to take minutes, and the chat waited for it
CALIBRATION_DEADLINE_S = 4.0
_MIN_SIZES = 3  # sizes a curve needs to be worth planning with (else the steps teach the costs)
# a one-token warm-up forward this slow (seconds) at all threads: a core is taken, measure on one
_PROBE_SLOW_S = 1.0
# all threads this many times slower than one: a core is taken (beside a training job, 10x and
# more; on a quiet machine one thread is the slower, so noise alone never crosses it)
_BUSY = 1.5


def now() -> float:
    """The calibration's clock, in seconds (looked up at each call, so a test can stand in for it)."""
    return time.perf_counter()


def sync(model: Any) -> None:
    """Wait for the GPU, so a timing covers the work and not only its launch."""
    device = getattr(model, "device", None)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def binary_tree(n: int) -> DraftTree:
    """n nodes, node i's parent (i - 1) // 2: the shape a top-2 drafter makes."""
    return DraftTree(tuple(range(n)), tuple([-1] + [(i - 1) // 2 for i in range(1, n)]), (1.0,) * n)


@torch.inference_mode()
def measure_verify_costs(model: Any, context: int, sizes: tuple[int, ...], reps: int | None = None,
                         seed: int = 0, deadline_s: float | None = None,
                         clock: Callable[[], float] | None = None) -> dict[int, float]:
    """Median milliseconds of one target forward over an n-node tree on top of ``context`` cached
    tokens, for each n in ``sizes``. ``reps``:
    timed forwards per size (default: more for small trees, whose timings are the noisiest relative
    to their size). The sizes take turns, round by round, so a slow stretch of the machine lands on
    several sizes' samples rather than on all of one size's.

    ``deadline_s``: stop once this many seconds (of ``clock``) have passed, and return the sizes
    timed so far (small ones first: each size is warmed and timed in the first round, in order).
    Why: beside another busy program a forward can take a hundred times its quiet time, and the
    chat sat minutes at "measuring verify costs" before it opened. ``clock``: seconds (default
    :func:`now`; tests pass a fake one)."""
    clock = clock or now
    start = clock()

    def late() -> bool:
        return deadline_s is not None and clock() - start > deadline_s

    cache = model.new_cache(context + max(sizes) + 8)
    gen = torch.Generator().manual_seed(seed)
    if context:
        model.forward(torch.randint(0, model.vocab_size, (context,), generator=gen), cache, logits="last")
        cache.commit(context)
    wanted = {n: reps or max(3, 24 // n) for n in sizes}  # three at least: a median that drops one spike
    times: dict[int, list[float]] = {n: [] for n in sizes}
    calls: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
    for r in range(max(wanted.values())):
        for n in sizes:
            if r >= wanted[n]:
                continue
            if late():
                return {m: statistics.median(t) for m, t in times.items() if t}
            if n not in calls:
                calls[n] = _tree_call(model, n, context, gen)
                model.forward(calls[n][0], cache, positions=calls[n][1], tree_mask=calls[n][2])  # warm
            tokens, positions, mask = calls[n]
            sync(model)
            t0 = time.perf_counter()
            model.forward(tokens, cache, positions=positions, tree_mask=mask)
            sync(model)
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(times[n]) for n in sizes}


def _tree_call(model: Any, n: int, context: int, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens, positions, tree mask) of a random n-node binary tree after ``context`` tokens."""
    tree = binary_tree(n)
    tokens = torch.randint(0, model.vocab_size, (n,), generator=gen)
    return tokens, torch.tensor(tree.depths) + context, tree.ancestor_mask() if n > 1 else None


def relative_shape(costs: dict[int, float]) -> dict[int, float]:
    """Costs relative to the smallest size, made non-decreasing from below: each size gets the least
    cost measured at it or any larger size. Why from below: noise only ever makes a forward slower
    (another program, a page fault), so a size measured dearer than a bigger one was disturbed; the
    upper envelope let one such spike lift every larger size (seen on the 2-core EPYC: a slow
    4-node sample priced 4-8 nodes at 2.5x one token for a whole session against 1.15x measured,
    and the budget pruned every tree to 3 nodes)."""
    sizes = sorted(costs)
    low = float("inf")
    floor: dict[int, float] = {}
    for n in reversed(sizes):
        low = min(low, costs[n])
        floor[n] = low
    base = floor[sizes[0]]
    return {n: floor[n] / base for n in sizes}


def verify_cost_shape(model: Any, context: int = 256, threads: int | None = None,
                      deadline_s: float | None = CALIBRATION_DEADLINE_S,
                      clock: Callable[[], float] | None = None) -> dict[int, float] | None:
    """The relative verify-cost curve the adaptive budget extrapolates with (about a second on the
    embedded model on a 2-core CPU: 12 sizes, ~90 forwards, most of them small). The median of
    each size's forwards, not the quickest: on a shared machine a one-token forward also runs fast
    now and then (3.9 against a 4.5 ms median), and the whole curve is relative to it.

    ``threads``: measure on this many (default: :func:`threads_for_calibration`'s choice).
    ``deadline_s``: the measurement's bound in wall time; past it, the sizes timed so far make the
    curve (the budget extrapolates the rest along its last segment, and the live steps correct it,
    engine/costs.py), or None where fewer than :data:`_MIN_SIZES` were (the budget then learns
    every cost from the steps, as a session without calibration does). Answers never depend on it:
    the budget only chooses how much of a draft to verify."""
    threads = threads or threads_for_calibration(model)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        costs = measure_verify_costs(model, context, CALIBRATION_SIZES, deadline_s=deadline_s, clock=clock)
    finally:
        torch.set_num_threads(before)
    return relative_shape(costs) if len(costs) >= _MIN_SIZES else None


@torch.inference_mode()
def threads_for_calibration(model: Any, probes: int = 3) -> int:
    """All threads, or one where one thread runs a one-token forward clearly faster (another
    program holds a core: every OpenMP barrier then waits a scheduler slice for the displaced thread).

    Why: the calibration runs ~90 forwards before the first answer, up to 64 tokens each. Beside a
    training job on the 2-core VM it took minutes at two threads and the TUI sat at "loading" all
    that time (engine/threads.py governs the steps after it, not this). The probe costs a few
    one-token forwards; one thread's curve has the shape the governor will run at anyway."""
    full = torch.get_num_threads()
    device = getattr(model, "device", None)
    if full <= 1 or (device is not None and torch.device(device).type != "cpu"):
        return full
    cache = model.new_cache(probes * 2 + 2)
    token = torch.zeros(1, dtype=torch.int64)

    def median_ms(threads: int) -> float:
        torch.set_num_threads(threads)
        times = []
        for _ in range(probes):
            t0 = time.perf_counter()
            model.forward(token, cache, logits="last")
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    try:
        t0 = time.perf_counter()
        model.forward(token, cache, logits="last")  # warm
        if time.perf_counter() - t0 > _PROBE_SLOW_S:  # one token took that long: no time for more probes
            return 1
        at_full, at_one = median_ms(full), median_ms(1)
    finally:
        torch.set_num_threads(full)
    return 1 if at_one * _BUSY < at_full else full
