"""The speculative step, top to bottom: one answer's prefill, then per step
draft -> verify -> accept -> commit -> emit, as events.

This is the module to read for how specchat decodes; it reads like gpt-fast's
``speculative_decode``. :meth:`SpecLoop.run` is the answer; :meth:`SpecLoop.step` is one step:

* ``draft``   the drafter proposes a tree rooted at the last token the target produced, pruned by
              the adaptive budget (or the root alone while the budget pauses drafting);
* ``verify``  one target forward over the whole tree (a chain as plain positions, a tree with its
              ancestor mask);
* ``accept``  the picker walks the tree against the target's logits: the accepted path and the
              target's own next token (the bonus), greedy or sampled (engine/verify.py);
* ``commit``  root and accepted path into the KV cache (the cache compacts the branch into
              place), the drafter observes them, the bonus becomes the next root;
* ``emit``    the Step event of what the forward produced, honouring stops exactly as the
              baseline does.

The baseline is the same loop with the ``none`` drafter (a tree of the root alone), so baseline
and speculative runs share every line that could make their outputs differ. Where the CPU and
the GPU differ (the forward, the cache's compaction, the device walk of a verdict) is behind the
target (engine/target.py) and the verify functions, never in this loop. What one step hands the
next lives in one :class:`AnswerState`; what outlives an answer lives in the session's parts
(engine/conversation.py, engine/drafting.py, engine/budgets.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from engine import methods
from engine.adaptive import DraftBudget
from engine.answer_stats import RunningTally
from engine.budgets import Budgets
from engine.config import SpecConfig
from engine.conversation import Conversation
from engine.drafters.base import Drafter, NoDrafter
from engine.drafters.tree_search import cancellable
from engine.drafting import Drafters
from engine.events import (
    Candidate,
    CommittedToken,
    ConfigApplied,
    Event,
    Finished,
    FinishReason,
    Origin,
    PrefillProgress,
    Started,
    Step,
    StepTiming,
)
from engine.target import TargetModel
from engine.threads import ThreadGovernor
from engine.tree import DraftTree, Verdict
from engine.verify import Picker


@dataclass
class AnswerState:
    """What one answer carries from step to step: the settings, the drafter, and what the last
    forward produced (``tree``, ``verdict``, ``pending``), emitted at the top of the next step."""

    config: SpecConfig
    fixed: bool  # generate() with its own config: hot-swapped settings do not apply
    root: int  # the token the next tree grows from: produced, not yet in the cache
    tally: RunningTally
    decoder: Any  # the tokenizer's incremental decoder
    timing: StepTiming
    tree: DraftTree
    verdict: Verdict
    pending: list[tuple[int, Origin]]  # tokens the last forward produced, not yet emitted
    proposed: int = 1  # nodes the drafter proposed, before pruning
    drafted: bool = True  # False: the budget paused drafting this step
    levels: int = 0  # levels asked of a drafter that pays per level (0: not such a drafter)
    width: int = 0  # top-k the budget chose for such a drafter (0: not chosen)
    grown: int = 0  # levels such a drafter actually grew (its confidence may stop it early)
    index: int = 0  # the next Step's index
    text: list[str] = field(default_factory=list)
    finished: FinishReason | None = None
    method: str | None = None  # the method whose drafter and budget are in use
    drafter: Drafter = field(default_factory=NoDrafter)
    budget: DraftBudget = field(default_factory=DraftBudget)
    # the last (settings, levels, top-k) the budget asked of the drafter, and that request: a validated
    # copy of the settings costs as much as a tenth of a drafted level, and mostly repeats
    asked: tuple[SpecConfig, int, int, SpecConfig] | None = None


class SpecLoop:
    """One answer at a time over a session's parts: the target, the conversation's cache, the
    drafters, the picker and the budgets. ``take_pending`` applies hot-swapped settings (under the
    session's lock) and returns them, or None; ``cancel`` stops the answer at a step boundary."""

    def __init__(self, *, model: TargetModel, tokenizer: Any, conversation: Conversation, drafters: Drafters,
                 picker: Picker, budgets: Budgets, threads: ThreadGovernor | None, cancel: threading.Event,
                 take_pending: Callable[[], SpecConfig | None]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.conversation = conversation
        self.drafters = drafters
        self.picker = picker
        self.budgets = budgets
        # one thread while another program holds a core (engine/threads.py); None: the count is fixed
        self.threads = threads
        self.cancel = cancel
        self.take_pending = take_pending
        # candidates per position a Step reports of a block drafted in one pass (Step.block); 0: none
        self.block_candidates = 0

    # -- the answer --------------------------------------------------------------------------------
    def run(self, prompt: list[int], override: SpecConfig | None, dropped_turns: int, model_name: str
            ) -> Iterator[Event]:
        """Prefill, then per step: emit what the last forward produced, take hot-swapped settings,
        draft, verify, commit. The prefill's own next token is emitted as step 0."""
        t0 = time.perf_counter()
        config = override or self.drafters.config
        logits, reused = yield from self.prefill(prompt, config)
        if logits is None:
            yield Finished(reason="cancelled", text="", tokens=0, stats=RunningTally(started=t0).snapshot())
            return
        answer = self.begin(prompt, logits, config, fixed=override is not None, t0=t0)
        # the cost shape if measured (a baseline answer never pays for measuring it)
        yield Started(prompt_tokens=len(prompt), reused_tokens=reused, prefill_ms=answer.timing.verify_ms,
                      config=config.to_dict(), model=model_name, drafter=config.method, precision=self.model.precision,
                      context_limit=self.conversation.limit, dropped_turns=dropped_turns,
                      cost_shape=tuple(sorted((self.budgets.measured or {}).items())))
        while True:
            yield self.emit(answer)
            if answer.finished is None and self.cancel.is_set():
                answer.finished = "cancelled"
            if answer.finished is not None:
                break
            applied = self.hot_swap(answer)
            if applied is not None:
                yield applied
            self.use_drafter(answer)
            self.step(answer)
        tail = answer.decoder.flush()
        if tail:
            answer.text.append(tail)
        yield Finished(reason=answer.finished, text="".join(answer.text), tokens=answer.tally.tokens,
                       stats=answer.tally.snapshot())

    def prefill(self, prompt: list[int], config: SpecConfig
                ) -> Generator[PrefillProgress, None, tuple[torch.Tensor | None, int]]:
        """The prompt into the cache, capturing the features ``config``'s method reads
        (Conversation.prefill): the last prompt token's logits (None when cancelled), tokens reused."""
        capture = self.drafters.use_capture(config.method)
        # never more than the context holds, whatever max_new_tokens says (an answer stops there)
        room = min(config.max_new_tokens, max(self.conversation.limit - len(prompt), 0)) + config.max_tree_tokens
        return (yield from self.conversation.prefill(prompt, capture, room, self.cancel))

    def begin(self, prompt: list[int], logits: torch.Tensor, config: SpecConfig, *, fixed: bool, t0: float
              ) -> AnswerState:
        """The answer's state after the prefill: its first token (the root of the first tree) is
        pending, as if a root-only step had produced it."""
        self.picker.new_answer()
        root = self.picker.first_token(logits, config, len(prompt))
        return AnswerState(config=config, fixed=fixed, root=root, tally=RunningTally(started=t0),
                           decoder=self.tokenizer.incremental_decoder(prompt[-8:]),
                           timing=StepTiming(verify_ms=(time.perf_counter() - t0) * 1e3),
                           tree=DraftTree.root_only(prompt[-1]), verdict=Verdict((), root),
                           pending=[(root, "target")])

    def hot_swap(self, answer: AnswerState) -> ConfigApplied | None:
        """Hot-swapped settings take effect at a step boundary (not in a generate() with its own)."""
        if answer.fixed or self.drafters.pending is None:
            return None
        config = self.take_pending()
        if config is None:
            return None
        answer.config = config
        return ConfigApplied(version=self.drafters.version, config=config.to_dict())

    def use_drafter(self, answer: AnswerState) -> None:
        """Draft with the method in force: on its first step (or a switch) its drafter takes the
        history, with target features caught up when it reads them, and its budget restarts."""
        method = answer.config.method
        if answer.method == method:
            return
        answer.method, answer.drafter, answer.budget = method, self.drafters.get(method), self.budgets.get(method)
        capture = self.drafters.use_capture(method)
        if capture.on:
            self.conversation.catch_up(capture)
        answer.drafter.reset(self.conversation.cached, capture.rows())
        answer.budget.restart()

    # -- one step ----------------------------------------------------------------------------------
    def step(self, answer: AnswerState) -> None:
        """Draft, verify with one target forward, accept, commit; what it produced waits for :meth:`emit`."""
        config, budget = answer.config, answer.budget
        gated = config.adaptive_draft and config.method != "none"  # "none" has no drafting to pause
        t_draft = time.perf_counter()
        tree = self.draft(answer, gated)
        t_verify = time.perf_counter()
        out, start = self.verify(config, tree)
        verdict = self.picker.verdict(tree, out.logits, config, start)  # accept
        t_commit = time.perf_counter()
        if self.threads is not None:
            self.threads.observe((t_commit - t_verify) * 1e3, budget.cost.relative(len(tree)) if budget.cost.shape
                                 else 1.0)
        self.commit(answer, tree, out, verdict)
        t_done = time.perf_counter()
        # the budget prices a tree by all it costs once drafted: the forward, and the commit (a
        # branch's K/V moved into place, features kept), which grows with the tree too
        budget.observe(tree, verdict.accepted, (t_done - t_verify) * 1e3,
                       (t_verify - t_draft) * 1e3 if gated and answer.drafted else None, answer.grown, answer.width)
        answer.timing = StepTiming(draft_ms=(t_verify - t_draft) * 1e3, verify_ms=(t_commit - t_verify) * 1e3,
                                   other_ms=(t_done - t_commit) * 1e3)

    def draft(self, answer: AnswerState, gated: bool) -> DraftTree:
        """This step's tree: the drafter's proposal pruned by the adaptive budget, or the root
        alone while the budget pauses drafting (it has recently cost more than it saved)."""
        config, budget, drafter = answer.config, answer.budget, answer.drafter
        answer.drafted = not gated or budget.gate.should_draft()
        answer.levels = answer.width = answer.grown = 0
        if not answer.drafted:
            answer.proposed = 0
            return DraftTree.root_only(answer.root)
        ask = self.ask(answer)
        tree = drafter.propose(self.conversation.cached, answer.root, ask, noise=self.picker.noise(config),
                               stop=cancellable(budget.stop_rule() if gated else None, self.cancel))
        answer.proposed = len(tree)
        if answer.levels:
            answer.grown = max(tree.depths)
        if answer.proposed > config.max_tree_tokens:
            raise RuntimeError(f"drafter {drafter.name} proposed {answer.proposed} nodes (> {config.max_tree_tokens})")
        return budget.prune(tree) if config.adaptive_draft else tree

    @staticmethod
    def ask(answer: AnswerState) -> SpecConfig:
        """The settings the drafter drafts this step with: with the adaptive budget, a drafter that
        pays per level gets the top-k (a chain or a tree) and the depth that pay; a tree searched
        over one forward (a block's DDTree) the top-k alone (its forward costs the same at any depth)."""
        config, budget, drafter = answer.config, answer.budget, answer.drafter
        if not config.adaptive_draft:
            return config
        if drafter.pays_per_level:  # a chain or a tree, and as deep as pays
            answer.width = budget.draft_width(config.tree_width)
            answer.levels = budget.draft_depth(config.num_steps)
        elif methods.one_pass_tree(answer.method):  # a chain or a tree; its depth is the prune's
            answer.width = budget.draft_width(config.tree_width)
        else:
            return config
        levels = answer.levels or config.num_steps
        if (levels, answer.width) == (config.num_steps, config.tree_width):
            return config
        last = answer.asked
        if last is None or last[0] is not config or last[1:3] != (levels, answer.width):
            last = answer.asked = (config, levels, answer.width, config.replace(num_steps=levels,
                                                                                eagle_topk=answer.width))
        return last[3]

    @staticmethod
    def may_ask(config: SpecConfig, drafter: Drafter) -> list[SpecConfig]:
        """Every setting :meth:`ask` may give ``drafter`` under ``config``: the budget's widths (the
        tree's top-k or a chain) and, for a drafter that pays per level, its depths (1 to
        ``num_steps``). What a warm-up captures the drafter's graphs for (Session.capture_graphs)."""
        pays, one_pass = drafter.pays_per_level, methods.one_pass_tree(config.method)
        if not config.adaptive_draft or not (pays or one_pass):
            return [config]
        levels = range(1, config.num_steps + 1) if pays else (config.num_steps,)
        return [config.replace(num_steps=d, eagle_topk=w) for w in sorted({1, config.tree_width}) for d in levels]

    def verify(self, config: SpecConfig, tree: DraftTree) -> tuple[Any, int]:
        """One target forward over the whole tree; returns its output and the cache position of
        the tree's root."""
        conversation = self.conversation
        cache = conversation.ensure_capacity(len(conversation.cached) + 1 + config.max_tree_tokens)
        start = cache.length
        tokens = torch.tensor(tree.tokens)  # host tensors: the model sends them over with its own copy
        if tree.is_chain:
            out = self.model.forward(tokens, cache, **self.drafters.capture.forward_kwargs)
        else:
            out = self.model.forward(tokens, cache, positions=torch.tensor([start + d for d in tree.depths]),
                                     tree_mask=tree.ancestor_mask(), **self.drafters.capture.forward_kwargs)
        return out, start

    def commit(self, answer: AnswerState, tree: DraftTree, out: Any, verdict: Verdict) -> None:
        """Root and accepted path into the cache (and the drafter); the bonus is the next root."""
        conversation = self.conversation
        rows = [0, *verdict.accepted]
        conversation.cache.commit(rows)
        kept = [answer.root, *(tree.tokens[i] for i in verdict.accepted)]
        conversation.cached.extend(kept)
        answer.drafter.observe(kept, self.drafters.capture.keep(out, rows))
        answer.tree, answer.verdict, answer.root = tree, verdict, verdict.bonus
        answer.pending = [(tree.tokens[i], "draft") for i in verdict.accepted] + [(verdict.bonus, "target")]
        if len(conversation.cached) + 1 >= conversation.limit:
            answer.finished = "context"

    def emit(self, answer: AnswerState) -> Step:
        """The Step event of what the last forward produced, honouring stops exactly like the
        baseline: a stop token ends the answer uncommitted, max_new_tokens cuts inside a path."""
        committed: list[CommittedToken] = []
        produced = 0
        for token, origin in answer.pending:
            produced += 1
            if token in self.tokenizer.stop_token_ids:
                answer.finished = "stop"
                break
            committed.append(CommittedToken(token, origin, answer.decoder.push(token)))
            if answer.tally.tokens + len(committed) >= answer.config.max_new_tokens:
                answer.finished = "length"
                break
        answer.tally.add_step(answer.tree, answer.verdict.accepted, len(committed), produced, answer.timing)
        text = "".join(c.text for c in committed)
        answer.text.append(text)
        tree = answer.tree
        block = self.block_guesses(tree)
        if tree.block is not None:  # the event carries its rows as data: the drafter's tensor stays here
            tree = dataclasses.replace(tree, block=None)
        step = Step(index=answer.index, tree=tree, tree_text=tuple(self.tokenizer.piece(t) for t in tree.tokens),
                    accepted=answer.verdict.accepted, bonus=answer.verdict.bonus, committed=tuple(committed),
                    text=text, timing=answer.timing, stats=answer.tally.snapshot(),
                    config_version=self.drafters.version, proposed=answer.proposed,
                    draft_paused=not answer.drafted, draft_levels=answer.levels, draft_width=answer.width,
                    payoff=answer.budget.payoff, block=block)
        answer.index += 1
        return step

    def block_guesses(self, tree: DraftTree) -> tuple[tuple[Candidate, ...], ...]:
        """Every position of the block ``tree`` was drafted from, its best candidates with their text,
        when the session was asked for them (Session.report_blocks) and the drafter drafted a block."""
        if not self.block_candidates or tree.block is None:
            return ()
        piece = self.tokenizer.piece
        return tuple(tuple(Candidate(t, piece(t), round(p, 6)) for t, p in row)
                     for row in tree.block.top(self.block_candidates))


def refused(message: str) -> Iterator[Event]:
    """The whole answer to a prompt that does not fit: nothing is run, nothing changes."""
    yield Finished(reason="context", text="", tokens=0, error=message)
