"""Whether drafting can pay on this machine: the acceptance a drafter would need, from what its steps
cost, against the acceptance it reached (what ``specchat bench`` and the TUI say when it cannot).

The cost model is the adaptive budget's (engine/adaptive.py), with the same prices its depth choice
reads. Take a plain step as the unit: it takes V(1) ms and commits one token. A drafted step with a
chain of d drafts takes D(d) + V(d+1) ms: D(d) drafting d levels (the drafter's own measured cost,
``LevelCost``: a + b * d for a drafter that pays a forward per level, a flat cost for a lookup), V(n)
verifying n tokens (the target's measured verify curve, ``CostModel``). Say each draft is kept with
probability a given that its parent was (the acceptance per draft). The i-th draft is then kept with
probability a^i, and the step commits on average

    E_d(a) = 1 + a + a^2 + ... + a^d

tokens (the target's own token at the end always counts). Drafting beats plain decoding when
E_d(a) / (D(d) + V(d+1)) > 1 / V(1), that is when

    a + a^2 + ... + a^d > D(d) / V(1) + V(d+1) / V(1) - 1 =: k(d),

the drafting cost in plain steps plus what verifying d more tokens adds. The left side rises from 0
(a = 0) to d (a = 1), so at length d the least acceptance that pays is the root a_d of
a + ... + a^d = k(d) when 0 <= k(d) < d; 0 when k(d) < 0 (drafting and verifying cost nothing);
none when k(d) >= d (not even a drafter that is always right pays at that length). The drafter needs
min over d of a_d, at its best length. With one draft, a_1 = k(1) = D(1)/V(1) + V(2)/V(1) - 1:
a draft level that costs 45% of a target step, on a verify curve with V(2) = 1.04 V(1) (the Qwen2.5
1.5B on a 2-core Zen 4), needs an acceptance of 0.45 + 1.04 - 1 = 49%; longer chains need more
there, since each level costs that 45% again.

What a drafter reached is the same a measured: over its last drafted steps, the drafts kept along
the chain of first children of each verified tree, over the drafts tried on it (kept ones and the
first refused one): the maximum-likelihood a of that model.

Left out, on purpose: the catch-up a drafter pays once when it resumes after a pause (it reads the
tokens committed meanwhile in one forward): that is a cost of pausing, not of a drafted step, and a
drafter that pays does not pause.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.events import DraftPayoff

_NEWTON = 60  # iterations at most (from a = 1 Newton's method converges monotonically: the sum is convex)


def chain_gain(a: float, depth: int) -> float:
    """a + a^2 + ... + a^depth: the drafts a chain of ``depth`` keeps on average at acceptance ``a``."""
    total, power = 0.0, 1.0
    for _ in range(depth):
        power *= a
        total += power
    return total


def break_even(extra: float, depth: int) -> float | None:
    """The acceptance a at which a chain of ``depth`` drafts keeps ``extra`` of them on average (the
    k(d) of the module docstring): 0 when ``extra`` <= 0, None when ``extra`` >= ``depth``."""
    if extra <= 0.0:
        return 0.0
    if extra >= depth:
        return None
    a = 1.0
    for _ in range(_NEWTON):
        total, slope, power = 0.0, 0.0, 1.0
        for i in range(1, depth + 1):
            slope += i * power
            power *= a
            total += power
        step = (total - extra) / slope
        a -= step
        if step < 1e-12:
            break
    return min(max(a, 0.0), 1.0)


def chain_step_ms(draft_ms: Callable[[int], float], verify_ms: Callable[[int], float], depth: int) -> float:
    """A drafted step's price with a chain of ``depth`` drafts: D(depth) + V(depth + 1)."""
    return draft_ms(depth) + verify_ms(depth + 1)


def draft_payoff(plain_ms: float, draft_ms: Callable[[int], float], verify_ms: Callable[[int], float],
                 reached: float, max_depth: int) -> DraftPayoff:
    """The payoff of drafting at acceptance ``reached``: ``plain_ms`` is V(1), ``draft_ms(d)`` D(d),
    ``verify_ms(n)`` V(n) (the module docstring's names); chains of 1 to ``max_depth`` drafts."""
    best: tuple[float, int] | None = None
    for depth in range(1, max(max_depth, 1) + 1):
        extra = chain_step_ms(draft_ms, verify_ms, depth) / plain_ms - 1.0
        # solved only where it needs less than the best so far (chain_gain rises with a): a few solves
        if best is not None and chain_gain(best[0], depth) <= extra:
            continue
        needed = break_even(extra, depth)
        if needed is not None and (best is None or needed < best[0]):
            best = (needed, depth)
    return DraftPayoff(draft_share=draft_ms(1) / plain_ms, needed=None if best is None else best[0],
                       depth=0 if best is None else best[1], reached=reached)
