"""One session's adaptive draft budgets: one per method, all planning with the verify-cost curve
the session measures once (engine/calibrate.py) and each correcting it from its own steps.

Why a class of its own: the budgets and the curve they start from belong together and are
dropped together when what a verify costs changes under them (``Session.set_precision``: the fast
precision's curve is another curve), and the session's step loop only asks for a method's budget.
"""

from __future__ import annotations

from typing import Any

from engine.adaptive import DraftBudget
from engine.threads import ThreadGovernor


class Budgets:
    def __init__(self, model: Any, *, calibrate: bool, threads: ThreadGovernor | None) -> None:
        self.model = model
        # the curve is measured once on a scratch cache when first asked for: loaders of real
        # models ask, tests of the budget's learning do not
        self.calibrates = calibrate
        self._threads = threads
        # per method: acceptance is the drafter's own, and so is the verify cost (an EAGLE-3 target
        # forward also captures features)
        self._budgets: dict[str, DraftBudget] = {}
        self.measured: dict[int, float] | None = None  # the measured curve; None until first needed
        self._tried = False  # measured (or tried to: past its deadline the curve may stay None)

    def get(self, method: str) -> DraftBudget:
        if method not in self._budgets:  # the baseline prunes nothing: it never waits for a calibration
            self._budgets[method] = DraftBudget(self.measured if method == "none" else self.shape())
        return self._budgets[method]

    def shape(self) -> dict[int, float] | None:
        """The relative verify cost by tree size (measured on first use, about a second on the
        embedded model), or None for a session that learns costs from its steps alone."""
        if self.calibrates and not self._tried:
            from engine import calibrate

            self._tried = True
            start = calibrate.now()
            threads = calibrate.threads_for_calibration(self.model)
            if self._threads is not None and threads < self._threads.full:
                self._threads.start_reduced()  # a core is taken already: the first steps need not find out
            # the thread probe's forwards count against the same deadline: start-up waits for both
            left = max(calibrate.CALIBRATION_DEADLINE_S - (calibrate.now() - start), 0.0)
            self.measured = calibrate.verify_cost_shape(self.model, threads=threads, deadline_s=left)
        return self.measured

    def learned(self) -> dict[str, dict[int, float]]:
        """Each method's curve as its budget plans with it now: the measured one, corrected where
        the live steps timed a size often enough (engine/costs.py); methods whose steps have not
        corrected it yet are left out."""
        return {m: dict(b.cost.curve) for m, b in self._budgets.items() if b.cost.curve}

    def forget_learning(self) -> None:
        """Forget what each method's budget learned from its steps; the measured curve stays."""
        self._budgets.clear()

    def clear(self) -> None:
        """Forget every budget and the measured curve: the next ones start from a new measurement."""
        self._budgets.clear()
        self.measured = None
        self._tried = False
