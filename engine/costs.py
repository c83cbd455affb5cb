"""What verifying a tree and drafting its levels cost: the prices the adaptive budget plans with.

Why a module of its own: the budget (engine/adaptive.py) decides; these models only learn, from
the live steps' timings, what each choice costs. The verify cost's shape comes from the session's
calibration (engine/calibrate.py), its level from the steps, and, where the steps have timed a size
often enough, its shape there too (:meth:`CostModel.observe` says why).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

from engine.calibrate import relative_shape

_COST_LEARN = 0.2  # weight of a new timing in the per-size cost average
_LEVEL_FADE = 0.95  # weight of a step's timing against the next one's in the fading fits
# The live correction of the calibrated curve (CostModel.observe):
_SHAPE_WINDOW = 16  # a size's last timings, whose median is its live price (one slow step is not)
_LEVEL_LEARN = 0.2  # weight of a step in the running level its timing is read against
_SHAPE_MIN = 6  # timings a size, and the one-token step, need before they correct the calibration
_SHAPE_PRIOR = 4  # the calibration's weight against a size's live timings, counted in timings
_SHAPE_EVERY = 8  # steps between two corrections (each re-reads the fit's recent steps)
_RECENT = 64  # steps the fit is re-read from when the curve moves (older ones weigh under 4%)
_MOVED = 0.01  # a correction that moves no size's price by more than this share is not taken


def _fade_in(sums: list[float], terms: tuple[float, ...]) -> list[float]:
    """Least-squares sums with older observations fading: each weighs ``_LEVEL_FADE`` times the next."""
    return [_LEVEL_FADE * v + t for v, t in zip(sums, terms, strict=True)]


@dataclass
class CostModel:
    """Milliseconds as a function of a size n: a verify's tree size (root included), or the
    number of levels a drafter grew.

    ``shape``: the relative cost by size measured for this session (engine/calibrate.py), or
    None. With it, every size is the measured curve scaled to the live steps, plus what each node
    costs live beyond it (:meth:`fit`): the steps give the level, the calibration the shape, and
    where the steps timed a size often enough, the shape there too (``curve``, :meth:`observe`).
    Without it, a size seen keeps its own average, and the others lie on a least-squares line
    through the sizes seen."""

    ms: dict[int, float] = field(default_factory=dict)
    lone_slope: float = 0.05  # with one size seen: relative cost per extra unit (verify: CPU-typical)
    shape: dict[int, float] | None = None
    # the shape corrected by the live timings (None until they say anything)
    curve: dict[int, float] | None = None
    # with a shape: fading sums for ms = scale * curve(n) + extra * (n - 1), over every step timed
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # aa, ab, bb, ay, by
    # each size's last timings over the calibration's price at the level of the moment, and the
    # last steps' (size, ms) the sums are re-read from
    live: dict[int, deque[float]] = field(default_factory=dict, repr=False)
    level: float | None = field(default=None, repr=False)  # a running ms / shape(n): one token's ms lately
    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=_RECENT), repr=False)
    # fit()'s answer until the next step: a drafted step asks for a dozen estimates
    _fitted: tuple[float, float] | None = field(default=None, init=False, repr=False, compare=False)
    # (curve, its sizes sorted): the curve changes rarely, and relative() runs a dozen times a step
    _sizes: tuple[dict[int, float], list[int]] | None = field(default=None, init=False, repr=False, compare=False)
    _shape_sizes: tuple[dict[int, float], list[int]] | None = field(default=None, init=False, repr=False,
                                                                     compare=False)
    _since: int = field(default=0, init=False, repr=False, compare=False)  # steps since the last correction

    def observe(self, n: int, ms: float) -> None:
        """Take a live verify of n nodes that took ``ms``.

        With a calibrated shape, the live timings also correct it every ``_SHAPE_EVERY`` steps
        (:meth:`_correct`). Why: the calibration is a second of forwards at load, and now and then
        the machine's noise lands on a few sizes (a run on the Xeon VM measured 2 tokens at 1.62x
        one where its neighbours measured 1.11-1.24x); scaling can only move the whole curve, so
        the budget priced a second node above what a chat draft earns for the whole process, and
        every method's tau fell to ~1.0 (about one process in ten). The budget still verifies a
        size it overprices when a draft is sure enough, or when it retries after a run of bare
        steps (DraftBudget.prune), and those timings now fix its price."""
        old = self.ms.get(n)
        self.ms[n] = ms if old is None else old + _COST_LEARN * (ms - old)
        if not self.shape:
            return
        # each timing against the calibrated price at the level of the moment: sizes timed at
        # different times (a longer context, a slower stretch of the machine) stay comparable
        calibrated = ms / self._calibrated(n)
        if self.level is not None:
            self.live.setdefault(n, deque(maxlen=_SHAPE_WINDOW)).append(calibrated / self.level)
        self.level = calibrated if self.level is None else self.level + _LEVEL_LEARN * (calibrated - self.level)
        self.recent.append((n, ms))
        self._fitted = None
        self._since += 1
        if self._since >= _SHAPE_EVERY:
            self._since = 0
            if self._correct():  # the curve moved: re-read the recent steps on it
                self.sums = [0.0] * 5
                for size, t in self.recent:
                    self._add(size, t)
                return
        self._add(n, ms)

    def _add(self, n: int, ms: float) -> None:
        a, b = self.relative(n), float(n - 1)
        self.sums = _fade_in(self.sums, (a * a, a * b, b * b, a * ms, b * ms))

    def fit(self) -> tuple[float, float] | None:
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> tuple[float, float] | None:
        """(ms of a one-token step, ms each extra node costs beyond the calibrated curve), or None
        before any step. The extra term is what a live verify adds per node that the calibration's
        bare forward does not (capturing features, an argmax per row, bookkeeping: ~5% of a step a
        node on the 2-core EPYC); it stays 0 until the sizes verified vary."""
        aa, ab, bb, ay, by = self.sums
        if aa <= 0:
            return None
        det = aa * bb - ab * ab
        if bb > 1e-9 and det > 1e-6 * aa * bb:
            scale, extra = (ay * bb - by * ab) / det, (aa * by - ab * ay) / det
            if extra >= 0:
                return scale, extra
        return ay / aa, 0.0

    def estimate(self, n: int) -> float | None:
        if self.shape:  # every size from one fit that every step refreshes: per-size averages of
            # sizes the budget stopped choosing go stale, and a stale price keeps them unchosen
            fit = self.fit()
            return None if fit is None else max(1e-3, fit[0] * self.relative(n) + fit[1] * (n - 1))
        if n in self.ms:
            return max(1e-3, self.ms[n])
        if not self.ms:
            return None
        # least-squares line through the sizes seen; with one size, assume the CPU-typical slope
        xs, ys = zip(*sorted(self.ms.items()), strict=True)
        if len(xs) == 1:
            s = self.lone_slope
            return max(1e-3, ys[0] * (1.0 + s * (n - 1)) / (1.0 + s * (xs[0] - 1)))
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
        return max(1e-3, my + slope * (n - mx))

    def relative(self, n: int) -> float:
        """The curve at n, relative to one token: the calibration's, corrected where the live steps
        timed it (:meth:`observe`); linear between sizes, beyond the largest along the last two's line."""
        curve = self.curve or self.shape
        assert curve
        if self._sizes is None or self._sizes[0] is not curve:
            self._sizes = (curve, sorted(curve))
        return _interpolate(curve, self._sizes[1], n)

    def _correct(self) -> bool:
        """Re-read the curve from the live timings; True when it moved.

        Each size timed at least ``_SHAPE_MIN`` times (and the one-token step as often) gets the
        factor between its live price and the calibration's, relative to one token's (medians of
        its last ``_SHAPE_WINDOW`` timings, each read against the running level of its moment, over
        one token's), shrunk towards 1 by ``_SHAPE_PRIOR`` timings' worth of trust in the
        calibration; sizes between two timed ones take the interpolated factor, sizes beyond the
        largest timed one its factor where that is below 1 and the calibration's price otherwise.
        Why lean towards the cheaper: a size priced too low gets chosen, timed and corrected; a
        size priced too high is never chosen again (DraftBudget.prune's retry is the last resort)."""
        assert self.shape
        one = self.live.get(1)
        if one is None or len(one) < _SHAPE_MIN:
            return False
        base = statistics.median(one)
        factors = {1: 1.0}
        for n, times in self.live.items():
            if n > 1 and len(times) >= _SHAPE_MIN:
                trust = len(times) / (len(times) + _SHAPE_PRIOR)
                factors[n] = 1.0 - trust + trust * statistics.median(times) / base
        curve = None
        if len(factors) > 1:
            timed = sorted(factors)
            last = timed[-1]
            curve = {n: self._calibrated(n) * _interpolate(factors, timed, n)
                     for n in sorted(set(self.shape) | set(timed)) if n <= last}
            for n in sorted(self.shape):  # beyond: see the docstring, and never below the last timed size
                if n > last:
                    curve[n] = max(self.shape[n] * min(1.0, factors[last]), curve[last])
            curve = relative_shape(curve)
        if not _moved(self.curve, curve):
            return False
        self.curve = curve
        return True

    def _calibrated(self, n: int) -> float:
        """The calibration's price at n, relative to one token (not the corrected curve's)."""
        assert self.shape
        if self._shape_sizes is None or self._shape_sizes[0] is not self.shape:
            self._shape_sizes = (self.shape, sorted(self.shape))
        return _interpolate(self.shape, self._shape_sizes[1], n)


@dataclass
class LevelCost:
    """Milliseconds to draft a number of levels: a line a + b * levels, fitted by least squares over
    the drafted steps with older ones fading (each weighs ``_LEVEL_FADE`` times the next).

    Why a fit over steps, not an average per level count: the budget mostly drafts the depth it
    believes pays, so an average for another depth goes stale, and a stale price would keep that
    depth unchosen. Until the levels drafted vary, the line goes through the origin and the mean."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # weight, x, y, xx, xy
    ms: dict[int, float] = field(default_factory=dict)  # the last average per level count (for display)

    def observe(self, levels: int, ms: float) -> None:
        old = self.ms.get(levels)
        self.ms[levels] = ms if old is None else old + _COST_LEARN * (ms - old)
        self.sums = _fade_in(self.sums, (1.0, levels, ms, levels * levels, levels * ms))

    def line(self) -> tuple[float, float] | None:
        """(intercept, ms per level), or None before any step."""
        w, sx, sy, sxx, sxy = self.sums
        if w <= 0:
            return None
        mx, my = sx / w, sy / w
        var = sxx / w - mx * mx
        if var < 0.05:  # (nearly) one level count seen: proportional to levels
            return 0.0, my / max(mx, 1.0)
        slope = max(0.0, (sxy / w - mx * my) / var)
        return my - slope * mx, slope

    def estimate(self, levels: int) -> float | None:
        fit = self.line()
        return None if fit is None else max(1e-3, fit[0] + fit[1] * levels)

    def per_level(self) -> float | None:
        fit = self.line()
        return None if fit is None else fit[1]


def _interpolate(points: dict[int, float], sizes: list[int], n: int) -> float:
    """``points`` at n: linear between its sizes (``sizes``, sorted); below the first, the first;
    beyond the last along the line through the last two (the verify curve is close to linear
    there: arithmetic-bound)."""
    if n in points or len(sizes) == 1 or n < sizes[0]:
        return points.get(n, points[sizes[0]] if n < sizes[0] else points[sizes[-1]])
    i = min(bisect.bisect(sizes, n), len(sizes) - 1)  # sizes[i - 1] < n < sizes[i], or beyond the last
    lo, hi = sizes[i - 1], sizes[i]
    return points[lo] + (n - lo) / (hi - lo) * (points[hi] - points[lo])


def _moved(old: dict[int, float] | None, new: dict[int, float] | None) -> bool:
    """Whether a correction changes some size's price by more than ``_MOVED`` (each taken one costs a
    re-read of the recent steps, and the medians shift a little at every correction)."""
    if old is None or new is None or old.keys() != new.keys():
        return old != new
    return any(abs(new[n] - old[n]) > _MOVED * old[n] for n in old)
