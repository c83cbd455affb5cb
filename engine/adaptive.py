"""Cost-aware draft budgets: verify only as much of the tree as is expected to pay.

Why: on a GPU, verifying 16 tokens costs about what verifying 1 does, so a drafter may propose
freely. On a CPU it does not (measured on a 2-core EPYC: 16 tokens cost ~2x one token), and a
drafter that fires on weak evidence — an n-gram match of one token in free-form text — makes
decoding slower than no speculation at all. Each step we therefore keep the prefix of the
proposed tree (nodes ranked by estimated probability of being accepted) that maximises expected
tokens per unit of verify time, which may be the root alone: a plain decoding step.

Both estimates are learned online, per session:
- acceptance: the conditional probability that a tested node is accepted, by depth, by whether it
  is its parent's first child, and by whether the previous step accepted two drafts or more
  (acceptance comes in runs: while an answer copies from the prompt nearly everything is kept, in
  free text nearly nothing); estimates drift back towards an optimistic prior while unused, so a
  budget that shrank to nothing re-tests the drafter now and then;
- cost: the verify time of an n-node tree, the session's calibrated curve scaled to the live steps
  and corrected where they timed a size (engine/costs.py).

Pruning bounds the verify cost, but the drafting itself is paid before anything is known: a
drafter that rarely lands (a weak EAGLE head on free text) makes every step slower than a plain
one. :class:`DraftGate` compares the measured rate of the last drafted steps (tokens per ms,
drafting included, over a window of up to 32) with plain decoding's (the undrafted steps' where
that is lower than the cost model's price: :meth:`DraftBudget._plain_ms` says why) and pauses
drafting while it loses, retrying after a pause that doubles each time it still loses (4 steps up
to 128), so a useless drafter costs a few percent instead of half the speed, and a drafter that
starts landing again is back within a pause. For a drafter that pays a forward per level,
:meth:`DraftBudget.draft_depth` also picks how many levels to draft (measured on the 2-core VM:
a weak EAGLE-3 head drafts one level in ~2 ms instead of five in ~9 ms, since deeper levels would
mostly be pruned or rejected anyway).

The budget also reckons, from the same prices, whether the drafter can pay on this machine at all
(:meth:`DraftBudget.reckon_payoff`, engine/payoff.py: the acceptance per token a chain would need,
against the one it reaches); where it cannot, the gate's pauses grow longer, and the Step events
say why, for bench and the TUI. A paused step is a plain step: the drafters catch up when
drafting resumes.

Pruning a tree to a subtree that contains the root never changes what greedy verification
outputs, and keeps the target distribution under sampling: this is a speed choice only.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from engine.acceptance import (
    AcceptanceModel,
    ConfidenceModel,
    contested_children,
    first_child_run,
    first_children,
)
from engine.costs import CostModel, LevelCost
from engine.drafters.tree_search import Candidates, StopRule
from engine.events import DraftPayoff
from engine.payoff import chain_step_ms, draft_payoff
from engine.tree import DraftTree

_GATE_WINDOW = 32  # drafted steps the gate judges together (a ratio of sums)
_GATE_PROBE = 8  # drafted steps after a (re)start before the gate judges
# standard errors a window's rate must be below plain decoding's to pause (0 paused a paying EAGLE-3
# head on 17% of MT-bench steps by chance)
_GATE_DOUBT = 1.0
_WIDTH_RETRY, _WIDTH_MAX_WAIT = 32, 256  # drafted steps before the losing width is tried again
_GATE_MARGIN = 1.0  # drafting must keep at least this share of plain decoding's rate (DraftBudget._plain_ms)
# depths whose expected rate is within this share of the best one count as tied: the deepest wins
# (DraftBudget.draft_depth says why)
_DEPTH_TIE = 0.03
_CHEAP_DRAFT = 0.05  # drafting cheaper than this share of a plain step is never paused
_MIN_PAUSE, _MAX_PAUSE = 4, 128  # steps without drafting after a losing drafted step
# the longest pause while the cost model also says the drafter cannot pay at the acceptance it reaches
# (DraftGate.cannot_pay says why)
_HOPELESS_PAUSE = 1024
_REACHED_WINDOW = 64  # drafted steps the acceptance a drafter reached is read over (engine/payoff.py)
_PAYOFF_EVERY = 8  # judged drafted steps between two reckonings of the payoff (and at every pause)
# drafted steps pruned to the root alone in a row before the likeliest draft is verified anyway
# (DraftBudget.prune says why); a 2-node verify costs 0.1-0.4 of a step here, so ~1-2% at worst
_EXPLORE = 16
_PLAIN_WINDOW, _PLAIN_MIN = 16, 4  # undrafted steps the gate's reference is the median of, and the fewest it reads


@dataclass
class RateWindow:
    """The last drafted steps' tokens and times; their rate is a ratio of sums, None until
    ``_GATE_PROBE`` steps are in (one step says little: a draft lands or it does not)."""

    tokens: deque[int] = field(default_factory=lambda: deque(maxlen=_GATE_WINDOW))
    ms: deque[float] = field(default_factory=lambda: deque(maxlen=_GATE_WINDOW))  # drafting + verifying
    drafts_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_GATE_WINDOW))  # drafting alone

    def add(self, tokens: int, draft_ms: float, verify_ms: float) -> None:
        ms = draft_ms + verify_ms
        if len(self.ms) >= 3:  # one step the OS or a cache growth stalled says nothing about the
            # drafter, yet in a ratio of sums it outweighs the rest (a 200 ms step among 7 ms ones
            # made chains look 6x slower than trees): at most 4x the window's median
            cap = 4.0 * statistics.median(self.ms)
            if ms > cap:
                draft_ms, ms = draft_ms * cap / ms, cap
        self.tokens.append(tokens)
        self.ms.append(ms)
        self.drafts_ms.append(draft_ms)

    def clear(self) -> None:
        for window in (self.tokens, self.ms, self.drafts_ms):
            window.clear()

    def __len__(self) -> int:
        return len(self.ms)

    @property
    def rate(self) -> float | None:
        """Tokens per ms over the window."""
        if len(self.ms) < _GATE_PROBE:
            return None
        return sum(self.tokens) / max(1e-3, sum(self.ms))

    @property
    def draft_ms(self) -> float | None:
        return sum(self.drafts_ms) / len(self.drafts_ms) if self.drafts_ms else None

    def stderr(self) -> float:
        """The standard error of :attr:`rate` (a ratio estimator's): how far chance alone moves it.
        Verdicts need more than that, or a drafter that pays would be paused, and a width that
        pays the same swapped, on a window of unlucky steps."""
        rate, n = self.rate, len(self.ms)
        if rate is None or n < 2:
            return math.inf
        spread = sum((t - rate * m) ** 2 for t, m in zip(self.tokens, self.ms, strict=True)) / (n - 1)
        return math.sqrt(spread / n) / (sum(self.ms) / n)

    def beats(self, other: RateWindow) -> bool:
        """Whether this window's rate is above ``other``'s by more than its own chance spread."""
        mine, theirs = self.rate, other.rate
        return mine is not None and (theirs is None or mine - self.stderr() > theirs)


@dataclass
class WidthChoice:
    """Chains or trees, for a drafter that pays per level and is asked for top-k > 1.

    A tree drafts k rows a level and verifies its likeliest nodes; it pays where a node's second
    or third guess lands often enough to cover those rows, which depends on the drafter and the
    text (measured on the 2-core EPYC, MT-bench, the embedded EAGLE-3 head: top-k 4 0.97x and top-k
    2 0.94x our baseline, top-k 1 1.06x, same run). Chains draft unless trees commit more tokens
    per ms beyond chance; trees are tried again for a window after 32 drafted steps, then 64, ...
    up to 256 while they keep losing.

    Trees are judged against the chain inside each tree, on the same steps: a tree's path of first
    children is the very chain a top-1 drafter grows (a node's children depend on its ancestors
    only), so each tree step also says what a chain would have committed (``shadows``: its accepted
    first-child prefix, priced by the chain's level cost and the verify curve at the moment's
    speed). Why paired: windows of the two widths taken at different times compare different text
    as much as widths, so a tree tried on an easy stretch beat the chains measured on a harder one
    by chance (tests/test_adaptive.py builds that case). Session 32 (Zen 5 EPYC, all 80 MT-bench
    prompts, old and new rule interleaved in one process): the same speed (1.221x / 1.227x), chains
    on 44% / 95% of the drafted steps: on that CPU trees and chains pay about the same."""

    windows: dict[int, RateWindow] = field(default_factory=dict)
    shadows: dict[int, RateWindow] = field(default_factory=dict)  # per width: its tree steps' own chains
    current: int = 1
    chosen_for: int = 0  # the top-k both widths were measured for
    trial: int = 0  # drafted steps left on a tree trial (0: none on trial)
    wait: int = _WIDTH_RETRY  # drafted chain steps before trees are tried again
    next_wait: int = _WIDTH_RETRY

    def pick(self, topk: int) -> int:
        if topk <= 1:
            self.current = 1
            return 1
        for width in (topk, 1):  # both measured first, the configured tree first
            if len(self.windows.setdefault(width, RateWindow())) < _GATE_PROBE:
                self.current = width
                return width
        if self.chosen_for != topk:  # both measured (again, for a new top-k): chains unless trees pay more
            self.chosen_for, self.trial, self.next_wait = topk, 0, _WIDTH_RETRY
            self.current = topk if self._trees_pay(topk) else 1
            self.wait = self.next_wait
        elif self.current == 1 and self.trial == 0 and self.wait <= 0:  # a tree trial, from fresh steps
            self.windows[topk].clear()
            self.shadows.setdefault(topk, RateWindow()).clear()
            self.current, self.trial = topk, _GATE_PROBE
        return self.current

    def observe(self, width: int, tokens: int, draft_ms: float, verify_ms: float,
                chain: tuple[int, float, float] | None = None) -> None:
        """A drafted step at ``width``; ``chain``: for a tree step, what its own chain would have
        done (tokens, drafting ms, verifying ms); None: the tree's own numbers stand in."""
        self.windows.setdefault(width, RateWindow()).add(tokens, draft_ms, verify_ms)
        if width != 1:
            self.shadows.setdefault(width, RateWindow()).add(*(chain or (tokens, draft_ms, verify_ms)))
        if self.trial > 0:
            self.trial -= 1
            if self.trial == 0:
                self._settle()
        elif self.chosen_for and self.current == 1:
            self.wait -= 1
        elif self.chosen_for and not self._trees_pay(self.chosen_for):  # trees on, their own chains as good
            self._to_chains()

    def _trees_pay(self, topk: int) -> bool:
        """Whether top-k trees commit more tokens per ms than their own chains on the same steps,
        beyond chance."""
        return self.windows[topk].beats(self.shadows.setdefault(topk, RateWindow()))

    def _to_chains(self) -> None:
        self.current = 1
        self.next_wait = min(_WIDTH_MAX_WAIT, 2 * self.next_wait)
        self.wait = self.next_wait

    def _settle(self) -> None:
        """A tree trial's window is in: trees stay only if they commit more tokens per ms than
        their own chains beyond chance; else chains draft, and the next trial waits longer."""
        if self._trees_pay(self.chosen_for):
            self.next_wait = _WIDTH_RETRY
            self.wait = self.next_wait
        else:
            self._to_chains()


@dataclass
class DraftGate:
    """Whether to draft at all this step (see the module docstring).

    The gate judges a window of drafted steps, never one: a head whose first draft lands 44% of the
    time loses most single steps and still pays over ten, so a one-step verdict paused a drafter
    that paid on most of an answer and kept it paused by chance (session 20: the same code paused
    EAGLE-3 on 66% or 89% of steps). It pauses only when the window loses by more than its own
    chance spread (session 21, 40 MT-bench prompts: paused 17% -> 5% of steps, 1.04x -> 1.09x our
    baseline, the same as an ungated chain). After each pause it drafts ``_GATE_PROBE`` steps
    before the next verdict."""

    window: RateWindow = field(default_factory=lambda: RateWindow())
    pause: int = 0  # steps left without drafting
    next_pause: int = _MIN_PAUSE
    # The first drafted step of an answer, and the first after a pause, also pays the drafter's
    # catch-up (an EAGLE head extends its cache over the prompt or the paused steps): a one-off
    # cost, so that step is not judged.
    settling: bool = True

    @property
    def rate(self) -> float | None:
        return self.window.rate

    def should_draft(self) -> bool:
        if self.pause > 0:
            self.pause -= 1
            return False
        return True

    def observe(self, tokens: int, draft_ms: float, verify_ms: float, plain_ms: float | None) -> bool:
        """A drafted step committed ``tokens``; ``plain_ms``: the estimated time of a plain step.
        Returns whether the step was judged (False for a settling step).

        A window below plain decoding's rate but within its chance spread drafts on without
        resetting the pauses' doubling; only a window at or above that rate does. Why: a losing
        drafter's short windows are often within the spread, and each reset sent it back to
        4-step pauses and another probe (Medusa on MT-bench: 0.92-0.93x -> 0.95x, 40 prompts,
        alternating; EAGLE-3 unchanged)."""
        if self.settling:
            self.settling = False
            return False
        self.window.add(tokens, draft_ms, verify_ms)
        rate, drafting = self.window.rate, self.window.draft_ms
        if plain_ms is None or rate is None or drafting is None:
            return True
        cheap, par = drafting < _CHEAP_DRAFT * plain_ms, _GATE_MARGIN / plain_ms
        if cheap or rate + _GATE_DOUBT * self.window.stderr() >= par:  # not clearly losing: draft on
            if cheap or rate >= par:  # and not losing at all: pauses start short again
                self.next_pause = _MIN_PAUSE
            return True
        self.pause = self.next_pause
        self.next_pause = min(_MAX_PAUSE, 2 * self.next_pause)
        self.window.clear()  # the retry is judged on its own steps
        self.settling = True
        return True

    def cannot_pay(self) -> None:
        """The pause just taken was also the cost model's verdict (engine/payoff.py: the acceptance this
        drafter reaches is below what its costs need): the pauses go on doubling past ``_MAX_PAUSE``,
        to ``_HOPELESS_PAUSE``. Why: each retry drafts a probe of ``_GATE_PROBE`` + 1 steps that lose,
        and pays the drafter's catch-up over the paused tokens (a draft model reads them in one
        forward), so a drafter that cannot pay on this machine, retried after every 128 paused steps,
        drafted 9 of every 137 steps for nothing (at 1024, 9 of 1033); one that reaches its needed
        acceptance is retried as before."""
        self.next_pause = min(_HOPELESS_PAUSE, 2 * self.pause)


class DraftBudget:
    """Chooses whether to draft (:class:`DraftGate`) and how much of each proposed tree to verify."""

    def __init__(self, cost_shape: dict[int, float] | None = None) -> None:
        self.cost = CostModel(shape=cost_shape)  # verify ms by tree size
        # ms by levels drafted (one head forward per level), for each width drafted
        self.draft_costs: dict[int, LevelCost] = {}
        self.acceptance = AcceptanceModel()
        # the same by drafted node: a node pruned before verification counts as not accepted, so a
        # level whose nodes pruning drops is not worth drafting (the depth choice reads this one;
        # `acceptance` alone counts only verified nodes and called such levels as good as any)
        self.drafted = AcceptanceModel()
        # what was drafted, which of its nodes are verified (None: all), and its contested children
        self._proposed: tuple[DraftTree, list[int] | None, frozenset[int]] | None = None
        self.confidence = ConfidenceModel()
        self.gate = DraftGate()
        self.width = WidthChoice()
        self._bare = 0  # drafted steps pruned to the root alone in a row
        self.plain: deque[float] = deque(maxlen=_PLAIN_WINDOW)  # the last undrafted steps' ms
        # whether drafting can pay here (engine/payoff.py), reckoned now and then while it drafts
        self.payoff: DraftPayoff | None = None
        self._trials: deque[tuple[int, int]] = deque(maxlen=_REACHED_WINDOW)  # (kept, tried) per drafted step
        self._drafting: deque[float] = deque(maxlen=_GATE_WINDOW)  # judged steps' drafting ms (lookups' price)
        self._max_levels = 0  # the most levels asked of a drafter that pays per level (draft_depth)
        self._deepest = 0  # the deepest proposal of a drafter that does not
        self._since_payoff = 0

    @property
    def draft_cost(self) -> LevelCost:
        """The drafting cost model of the width drafting now (a level of k rows costs more than one)."""
        return self.draft_costs.setdefault(self.width.current, LevelCost())

    def draft_width(self, topk: int) -> int:
        """The top-k to draft with this step: ``topk`` (a tree) or 1 (a chain), whichever has been
        committing more tokens per ms (:class:`WidthChoice`)."""
        return self.width.pick(topk)

    def restart(self) -> None:
        """A drafter takes over (an answer's first step, or a switch of method): its first drafted
        step also pays for catching up on the history, a one-off cost the gate must not judge."""
        self.gate.settling = True

    def draft_depth(self, max_levels: int) -> int:
        """How many levels a drafter that pays per level (an EAGLE head, a draft model) should grow.

        Pruning only trims what was drafted; the levels themselves are paid first. So pick the
        depth d that maximises expected tokens per ms of the chain of first children, drafting
        (by levels) and verifying (d + 1 nodes) included, where a drafted node that pruning drops
        counts as refused (session 21: levels drafted and then pruned cost 0.3 ms a step for
        nothing). Depths not drafted lately borrow the nearest shallower estimate, and pessimism
        fades back to the prior, so the depth grows again when the drafts start landing.

        Of depths within ``_DEPTH_TIE`` of the best rate, the deepest: the rates come from fading
        averages that move with the text, and neighbouring depths often differ by less than that
        noise, while a deeper ask still ends early on a step whose path the head doubts (the stop
        rule reads the head's own probabilities, which the averages cannot), and a shallower ask
        cannot grow. Measured interleaved in one process (session 32, Zen 5 EPYC, all 80 MT-bench
        prompts, EAGLE-3): 1.184x -> 1.232x (calibration as measured) and 1.267x -> 1.323x (forced
        steep), levels asked 1.4-1.6 -> 2.0-2.1; a static chain of 2 gave 1.250x in the first run.
        """
        self._max_levels = max_levels
        if max_levels <= 1 or not self.draft_cost.ms or self.cost.estimate(1) is None:
            return max_levels
        rates = []
        expected, path = 1.0, 1.0
        for depth in range(1, max_levels + 1):
            path *= self.drafted.get(depth, True)
            expected += path
            rates.append(expected / chain_step_ms(self.draft_cost.estimate, self.cost.estimate, depth))  # type: ignore[arg-type]
        best = max(rates)
        return max(depth for depth, rate in enumerate(rates, start=1) if rate >= (1.0 - _DEPTH_TIE) * best)

    def reached(self) -> float | None:
        """The acceptance per draft of the last drafted steps' chains (engine/payoff.py); None until
        ``_GATE_PROBE`` drafts were tried."""
        kept, tried = sum(k for k, _ in self._trials), sum(t for _, t in self._trials)
        return kept / tried if tried >= _GATE_PROBE else None

    def reckon_payoff(self) -> DraftPayoff | None:
        """Whether drafting can pay here at the acceptance reached (engine/payoff.py), from the verify
        curve and the drafter's own measured cost: a chain's level line where levels were timed (a
        tree's where chains were not: dearer, so never a false "pays"), else the judged steps' mean
        drafting time (a lookup's costs the same at any length). None before both are measured."""
        plain, reached = self._plain_ms(), self.reached()
        if plain is None or reached is None or self.cost.estimate(1) is None:
            return None
        line = next((c for c in (self.draft_costs.get(1), self.draft_costs.get(self.width.current))
                     if c is not None and c.line() is not None), None)
        if line is not None:
            return draft_payoff(plain, line.estimate, self.cost.estimate, reached,  # type: ignore[arg-type]
                                self._max_levels or 1)
        if not self._drafting:
            return None
        flat = statistics.fmean(self._drafting)
        return draft_payoff(plain, lambda _: flat, self.cost.estimate, reached,  # type: ignore[arg-type]
                            max(self._deepest, 1))

    def stop_rule(self) -> StopRule | None:
        """For a drafter that pays per level: stop growing once the next level is worth less than it
        costs (EAGLE-2's confidence-aware stopping, priced). A node one level down is accepted with
        at most P(its parent's path) * P(a node at that depth lands), each accepted token worth a
        plain step's time; it costs a level of drafting and one more node to verify. The likeliest
        frontier path decides, so a confident head drafts deep and a doubtful one stops at the
        first level. None until both costs are measured."""
        plain, level = self.cost.estimate(1), self.draft_cost.per_level()
        if plain is None or level is None:
            return None
        confidence, acceptance, cost = self.confidence, self.drafted, self.cost

        def stop(cands: Candidates, frontier: list[int]) -> bool:
            depth = cands.depth[frontier[0]]  # the frontier's; the next level is one deeper
            gain = max(confidence.path(cands, i) for i in frontier) * acceptance.get(depth + 1, True) * plain
            verify = cost.estimate(depth + 2) - cost.estimate(depth + 1)  # type: ignore[operator]
            return gain < level + max(verify, 0.0)

        return stop

    def prune(self, tree: DraftTree) -> DraftTree:
        """The prefix of ``tree`` (nodes by estimated path probability) that maximises expected
        tokens per ms of verifying, which may be the root alone.

        After ``_EXPLORE`` drafted steps in a row pruned to the root, the likeliest draft is
        verified anyway. Why: the estimates only move where nodes are verified, and the price of a
        second node can sit above what the optimistic prior (50%) would pay for: a calibration
        whose noise put 2 tokens at 1.62x one kept every n-gram tree at its root for a whole run
        (rewrite prompts 0.97x, tau 1.05), though the drafts would have landed 70-90%."""
        contested = contested_children(tree)
        self._proposed = (tree, None, contested)
        if len(tree) == 1:
            return tree
        self._deepest = max(self._deepest, tree.max_depth)
        # path probability of each node = product of conditional acceptances along its path: by the
        # drafter's own probability where it gives one (a head knows which of its drafts are shaky),
        # else by depth and rank
        prob = [1.0] * len(tree)
        seen_parent: set[int] = set()
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            first = parent not in seen_parent
            seen_parent.add(parent)
            accept = (self.confidence.get(tree.draft_probs[i]) if tree.has_probs
                      else self.acceptance.get(tree.depths[i], first, i in contested))
            prob[i] = prob[parent] * accept
        # nodes by probability; ties keep tree order, so parents (never less likely) come first
        order = sorted(range(1, len(tree)), key=lambda i: (-prob[i], i))
        best_n, best_rate, expected = 1, None, 1.0
        base = self.cost.estimate(1)
        if base is None:
            return tree  # nothing measured yet: verify the whole proposal once
        best_rate = 1.0 / base
        for k, node in enumerate(order, start=2):
            expected += prob[node]
            cost = self.cost.estimate(k)
            if cost is not None and expected / cost > best_rate:
                best_n, best_rate = k, expected / cost
        self._bare = 0 if best_n > 1 else self._bare + 1
        if self._bare >= _EXPLORE:  # stuck at the root alone: test the likeliest draft once
            best_n, self._bare = 2, 0
        if best_n == len(tree):
            return tree
        keep = sorted([0, *order[: best_n - 1]])
        self._proposed = (tree, keep, contested)
        return subtree(tree, keep)

    def observe(self, tree: DraftTree, accepted: tuple[int, ...], verify_ms: float,
                draft_ms: float | None = None, levels: int = 0, width: int = 0) -> None:
        """``draft_ms``: the drafting time of a drafted step; None for a step the gate kept plain.
        ``levels``, ``width``: the levels the drafter grew and the top-k it was asked for, when it
        pays per level and the budget chose them (else 0); a tree grown from one forward (a block's
        DDTree) gives its width alone: no levels were paid, so no level line is fitted to its
        forward (the payoff then reads its mean drafting time, the same at any length)."""
        self.cost.observe(len(tree), verify_ms)
        proposed, self._proposed = self._proposed, None
        drafted, keep, contested = proposed if proposed is not None else (tree, None, contested_children(tree))
        # `acceptance` prices trees without the drafter's probabilities only (trees with them are
        # priced by `confidence`): an n-gram drafter's corpus trees carry probabilities, and their
        # landing rate must not become the price of its conversation trees', nor the other way
        by_depth = not tree.has_probs or len(tree) == 1
        if keep is not None and len(keep) == len(tree):  # pruned: map the verified nodes to the proposal's
            # contested as proposed: pruning may have dropped the siblings that made a child contested
            if by_depth:
                self.acceptance.observe(tree, accepted, frozenset(j for j, i in enumerate(keep) if i in contested))
            self.drafted.observe(drafted, tuple(keep[i] for i in accepted), contested)  # what each level delivered
        else:  # verified as drafted (or a plain step, where pessimism fades as in `acceptance`)
            if by_depth:
                self.acceptance.observe(tree, accepted, contested)
            self.drafted.observe(tree, accepted, contested)
        if tree.has_probs or len(tree) == 1:  # a plain step tests nothing: pessimism fades
            self.confidence.observe(tree, accepted)
        if draft_ms is None:
            self.plain.append(verify_ms)
            return
        self._trials.append(first_child_run(tree, accepted))
        judged = self.gate.observe(len(accepted) + 1, draft_ms, verify_ms, self._plain_ms())
        if not judged:  # a settling step's catch-up is not the price of its levels
            return
        self._drafting.append(draft_ms)
        if levels:
            self.draft_cost.observe(levels, draft_ms)
        if width:
            chain = self._own_chain(tree, accepted, draft_ms, verify_ms, levels) if width > 1 else None
            self.width.observe(width, len(accepted) + 1, draft_ms, verify_ms, chain)
        self._since_payoff += 1
        paused = self.gate.pause > 0  # this step's verdict was a pause
        if paused or self._since_payoff >= _PAYOFF_EVERY:
            self._since_payoff = 0
            self.payoff = self.reckon_payoff()
            if paused and self.payoff is not None and not self.payoff.pays:
                self.gate.cannot_pay()

    def _own_chain(self, tree: DraftTree, accepted: tuple[int, ...], draft_ms: float, verify_ms: float,
                   levels: int) -> tuple[int, float, float]:
        """What the chain inside a verified tree would have done on this step: it commits the
        accepted nodes while each is its parent's first child (siblings are in rank order), for
        the chain's drafting cost of the same levels (the tree's own where chains have not been
        timed) and the verify curve's price of levels + 1 nodes at this step's speed. A tree grown
        from one forward (``levels`` 0: a block's DDTree) costs its chain the same forward, and its
        chain is the tree's spine of first children: that many nodes, plus the root, are priced."""
        tokens = 1 + first_child_run(tree, accepted)[0]
        chain_cost = self.draft_costs.get(1)
        chain_draft = chain_cost.estimate(levels) if chain_cost is not None and levels else None
        nodes = (levels or spine_length(tree)) + 1
        tree_price, chain_price = self.cost.estimate(len(tree)), self.cost.estimate(nodes)
        chain_verify = verify_ms * chain_price / tree_price if tree_price and chain_price else verify_ms
        return tokens, draft_ms if chain_draft is None else chain_draft, chain_verify

    def _plain_ms(self) -> float | None:
        """What a plain step costs, for the gate: the cost model's one-token price, or the median of
        the last undrafted steps where that is lower.

        Why not the model's price alone: it is fitted mostly to drafted steps, and on a machine
        where the weights live in a shared cache a verify right after drafting runs slower (the
        Xeon VM: 3.80 against 3.08 ms for one token after EAGLE-3's 0.45 ms of drafting,
        docs/history/benchmarks-sessions.md, "Session 29"), so drafting was judged against a plain step
        slowed by drafting itself. With that reference and a 90% margin, Medusa ran at 0.79-0.80x the
        baseline on MT-bench without being paused; with this one and no margin, 0.92-0.94x (EAGLE-3 the
        same, 0.95-0.98x; at temperature 1.0, 0.93x -> 0.97x). The lower of the two: undrafted steps
        come in pauses, maybe minutes old, and a stale slow stretch must not excuse drafting."""
        est = self.cost.estimate(1)
        if len(self.plain) >= _PLAIN_MIN and est is not None:
            return min(est, statistics.median(self.plain))
        return est


def spine_length(tree: DraftTree) -> int:
    """The nodes on ``tree``'s path of first children from the root (its chain), root excluded."""
    first = first_children(tree)
    node, length = 0, 0
    while node in first:
        node, length = first[node], length + 1
    return length


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes ``keep`` (sorted, root first, closed under parents) as a tree of their own."""
    index = {old: new for new, old in enumerate(keep)}
    proposals = None
    if tree.proposals:
        proposals = {index[i]: q for i, q in tree.proposals.items() if i in index}
    return DraftTree(
        tuple(tree.tokens[i] for i in keep),
        tuple(-1 if i == 0 else index[tree.parents[i]] for i in keep),
        tuple(tree.draft_probs[i] for i in keep),
        proposals=proposals,
        has_probs=tree.has_probs,
        source=tree.source,
        block=tree.block,
    )
