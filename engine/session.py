"""The decoding loop: prefill, then per step draft -> one verify forward -> commit -> emit, as events.

One Session holds one conversation: its messages, the target KV cache of everything said so far
(reused by the next turn: only the new suffix is prefilled), and the drafters. The baseline is
the same loop with the ``none`` drafter, so baseline and speculative runs share every line that
could make their outputs differ.

The loop (:meth:`Session._run`) reads top to bottom like gpt-fast's speculative step: each
function below it does one part of a step, and what a step hands to the next lives in one
:class:`AnswerState`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from engine.adaptive import DraftBudget
from engine.answer import AnswerState
from engine.api import Message
from engine.budgets import Budgets
from engine.config import ConfigError, SpecConfig
from engine.context import check_answer_length, context_refusal, fit_context
from engine.drafters.base import Drafter, NoDrafter
from engine.drafters.tree_search import cancellable
from engine.events import (
    CommittedToken,
    ConfigApplied,
    Event,
    Finished,
    PrefillProgress,
    Started,
    Step,
    StepTiming,
)
from engine.features import FeatureCaptures, FeatureSpec
from engine.followup import Spoken, follow_up, replay, spoken
from engine.picking import Picker
from engine.prefill import ChunkedPrefill
from engine.prefix import chat_preamble, common_prefix
from engine.stats import RunningTally
from engine.threads import ThreadGovernor
from engine.tree import DraftTree, Verdict

DrafterFactory = Callable[[], Drafter]

# Extra KV slots allocated beyond the immediate need, so a conversation grows the cache rarely.
_CACHE_SLACK = 256


def default_drafters() -> dict[str, DrafterFactory]:
    from engine.drafters.ngram import NgramDrafter

    return {"none": NoDrafter, "ngram": NgramDrafter}


class Session:
    """A conversation with one target model; see engine.api.SessionAPI for the contract."""

    def __init__(
        self,
        model,  # LlamaModel or HFModel: new_cache(), forward()
        tokenizer,  # engine.tokenizer.Tokenizer
        config: SpecConfig | None = None,
        *,
        model_name: str = "model",
        model_path: str = "",
        drafters: dict[str, DrafterFactory] | None = None,
        system_prompt: str | None = None,
        features: FeatureSpec | None = None,
        calibrate_costs: bool = False,
        threads: ThreadGovernor | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_path = model_path  # the resolved folder, for tools that load the same weights again
        self._factories = drafters if drafters is not None else default_drafters()
        self._drafters: dict[str, Drafter] = {}
        self._config = config or SpecConfig()
        self._check(self._config)
        self._pending: SpecConfig | None = None
        self._pending_precision: str | None = None  # set_precision() while an answer streams
        self._config_version = 0
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._busy = False
        self._system_prompt = system_prompt
        self._messages: list[Message] = []
        self._spoken: Spoken | None = None  # the conversation as the model read and wrote it
        self._cache = None
        self._cached: list[int] = []  # tokens whose K/V sit in the cache, in order
        self._picker = Picker(model, self._config.seed)  # how kept tokens are chosen, and its random state
        self._costs = Budgets(model, calibrate=calibrate_costs, threads=threads)  # adaptive budgets
        self._preamble: list[int] | None = None  # what every conversation opens with (reset() keeps it)
        # target states the drafters read (EAGLE and Medusa heads), one row per cached token,
        # captured only while a method that reads them drafts (engine/features.py says why): one
        # store per kind of state, so an EAGLE-3 head and Medusa heads can share one session
        self._default_features = features  # what a feature-reading drafter reads unless set_draft says
        self._features: dict[str, FeatureSpec | None] = {}
        self._captures = FeatureCaptures()
        self._capture = self._captures.off  # the capture of the method drafting now
        self._prefiller = ChunkedPrefill(model)
        # one thread while another program holds a core (engine/threads.py); None: the count is fixed
        self._threads = threads
        self.draft_description = ""  # what the loader loaded as a draft, one line for the UI
        self.ngram_corpus: Any = None  # the n-gram drafter's corpus (a CorpusHandle), set by the loader

    # -- the SessionAPI -----------------------------------------------------------------------
    @property
    def config(self) -> SpecConfig:
        return self._config

    @property
    def pending_config(self) -> SpecConfig | None:
        return self._pending

    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self._messages]

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._factories)

    @property
    def context_limit(self) -> int:
        """Tokens the model can attend to: prompt and answer together must fit."""
        return self._cache_limit()

    @property
    def context_used(self) -> int:
        """Tokens of the conversation whose K/V are cached (what the next turn builds on)."""
        return len(self._cached)

    def rewind_cache(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (compare: both runs start from one state)."""
        if self._busy:
            raise RuntimeError("cannot rewind the cache while generating")
        length = max(0, min(length, len(self._cached)))
        del self._cached[length:]
        self._captures.truncate(length)
        if self._cache is not None:
            self._cache.truncate(length)

    def update_config(self, config: SpecConfig) -> None:
        self._checked(config)
        with self._lock:
            if self._busy:
                self._pending = config
            else:
                self._apply(config)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def precision(self) -> str:
        """The target's arithmetic, "exact" or "fast" (LlamaModel.precision); "" where it has one."""
        return getattr(self.model, "precision", "")

    def check_precision(self, precision: str) -> None:
        """Raise ConfigError (one line) where this session's target cannot run ``precision``."""
        if not self.precision:
            raise ConfigError("this backend computes in one precision; specchat's own forward has exact and fast")
        if precision not in ("exact", "fast"):
            raise ConfigError(f"precision is exact or fast, not {precision!r}")
        if precision == "fast" and not self.model.fast_available:
            raise ConfigError("the fast precision needs stored weights and our native kernel (a CPU with AVX2)")

    def set_precision(self, precision: str) -> bool:
        """Switch the target's arithmetic: True if done now, False if it waits for the answer streaming
        to end. It drops the KV cache (computed, and in fast stored, in the other arithmetic), the
        drafters' state and the cost curves: the next answer reads the conversation again in the new
        precision. Raises ConfigError, nothing changed, where it cannot run."""
        self.check_precision(precision)
        with self._lock:
            self._pending_precision = precision if self._busy else None
            if not self._busy:
                self._apply_precision(precision)
            return not self._busy

    def reread(self) -> None:
        """Read the conversation so far into the (emptied) cache now, and measure the verify-cost
        curve where the budget will want it, so the next answer after set_precision() prefills only
        its own turn and is timed as any other."""
        with self._working():
            if self._config.method != "none" and self._config.adaptive_draft:
                self.cost_shape()
            # the ids the model read and wrote, else the conversation encoded (what a next prompt
            # is then built from; a template that drops old turns leaves no record)
            if self._spoken is not None:
                ids = list(self._spoken.ids)
            else:
                ids = self.tokenizer.encode_chat(self._conversation()) if self._messages else []
            if ids and not self._cached and len(ids) < self._cache_limit():
                for _ in self._prefill_prompt(ids, self._config):
                    pass

    def set_draft(self, method: str, factory: DrafterFactory, features: FeatureSpec | None) -> None:
        """Install a draft loaded with engine.drafters.loading.load_draft (which validates it first,
        so a bad head never gets here and the old drafter stays). Not while an answer streams.

        The drafters already installed keep theirs: a head that reads other target features than
        the cached ones gets its own store, filled by a catch-up when its method first drafts.
        """
        with self._lock:
            if self._busy:
                raise RuntimeError("stop the answer before loading another draft")
            self._factories = {**self._factories, method: factory}
            self._features[method] = features
            self._drafters.pop(method, None)

    def reset(self) -> None:
        """A new conversation. The cache keeps the preamble every conversation opens with (~25
        tokens for the embedded model), as SGLang's radix cache does across requests, where the
        model's rows do not depend on how a prefill is chunked (so a kept row has a fresh one's bits)."""
        self._messages.clear()
        self._spoken = None
        self.rewind_cache(self._reusable_preamble())
        self._drafters.clear()

    def forget_cache(self) -> None:
        """Empty the cache, preamble included (for callers that write their own tokens into it)."""
        self.rewind_cache(0)

    def _reusable_preamble(self) -> int:
        if not getattr(self.model, "rows_independent", False):
            return 0
        if self._preamble is None:
            self._preamble = chat_preamble(self.tokenizer, self._system_prompt)
        n = len(self._preamble)
        return n if n and self._cached[:n] == self._preamble else 0

    def restore(self, messages: list[Message], answers: Sequence[Sequence[int] | None] | None = None) -> None:
        """Go on from a saved conversation: its messages and, where the recording has them, each
        answer's ids, so the next turn reads what it would have read live (engine/followup.py);
        the next turn prefills all but the preamble."""
        self.reset()
        self._messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        if answers is not None:
            self._spoken = replay(self.tokenizer, self._conversation(), answers)

    def chat(self, user_text: str) -> Iterator[Event]:
        self._messages.append({"role": "user", "content": user_text})
        conversation = self._conversation()
        prompt, dropped, refusal = self._prompt(conversation, self._config)
        answer: list[str] = []
        ids: list[int] = []
        started = False
        for event in _refused(refusal) if refusal else self.generate_ids(prompt, dropped_turns=dropped):
            if isinstance(event, Started):
                started = True
            elif isinstance(event, Step):
                answer.append(event.text)
                ids.extend(c.id for c in event.committed)
            elif isinstance(event, Finished):
                answer = [event.text]
            yield event
        if not started:
            # refused (context) or cancelled during the prefill: the conversation is as before the turn
            self._messages.pop()
            return
        self._messages.append({"role": "assistant", "content": "".join(answer)})
        self._spoken = None if dropped else spoken(self.tokenizer, [*conversation, self._messages[-1]], prompt, ids)

    def generate(self, messages: list[Message], config: SpecConfig | None = None) -> Iterator[Event]:
        prompt, dropped, refusal = self._prompt(messages, self._checked(config))
        if refusal:
            return _refused(refusal)
        return self.generate_ids(prompt, config, dropped_turns=dropped)

    def _prompt(self, messages: list[Message], config: SpecConfig) -> tuple[list[int], int, str]:
        """The prompt for ``messages``: on the ids of the conversation so far where they go on from
        it (engine/followup.py says why), else encoded afresh, dropping old turns where allowed."""
        ids = follow_up(self.tokenizer, self._spoken, messages)
        if ids is not None and not context_refusal(len(ids), config, self._cache_limit()):
            return ids, 0, ""
        return fit_context(self.tokenizer, messages, config, self._cache_limit())

    def generate_ids(self, prompt: Sequence[int], config: SpecConfig | None = None, *, dropped_turns: int = 0
                     ) -> Iterator[Event]:
        """Answer a raw token prompt (benchmarks with a ``prompt`` field, tests)."""
        if not prompt:
            raise ValueError("the prompt is empty")
        refusal = context_refusal(len(prompt), self._checked(config), self._cache_limit())
        if refusal:
            return _refused(refusal)
        return self._generate_ids(list(prompt), config, dropped_turns)

    def _generate_ids(self, prompt: list[int], config: SpecConfig | None, dropped_turns: int) -> Iterator[Event]:
        with self._working():
            yield from self._run(prompt, config, dropped_turns)

    @contextmanager
    def _working(self) -> Iterator[None]:
        """The session busy with one thing at a time (an answer, a re-read); what was asked for
        meanwhile (settings, a precision) applies when it ends."""
        with self._lock:
            if self._busy:
                raise RuntimeError("this session is already generating")
            self._busy = True
            self._cancel.clear()
        try:
            yield
        finally:
            with self._lock:
                self._busy = False
                if self._pending is not None:
                    self._apply(self._pending)
                if self._pending_precision is not None:
                    self._apply_precision(self._pending_precision)

    # -- internals ------------------------------------------------------------------------------
    def _conversation(self) -> list[Message]:
        if self._system_prompt:
            return [{"role": "system", "content": self._system_prompt}, *self._messages]
        return list(self._messages)

    def _checked(self, config: SpecConfig | None) -> SpecConfig:
        """The settings for an answer or a hot-swap: ``config`` validated and checked against this
        session's drafters (raising ConfigError before anything changes), or those in force."""
        if config is None:
            return self._config
        config.validate()
        self._check(config)
        return config

    def _check(self, config: SpecConfig) -> None:
        """Refuse a method this session cannot run, or settings its drafter cannot honour (a top-k
        beyond the draft vocabulary), up front: a refused hot-swap leaves the old settings."""
        if config.method not in self._factories:
            have = ", ".join(self._factories)
            drafts = ("eagle", "eagle3", "standalone", "medusa")
            hint = " (load a draft with --draft)" if config.method in drafts else ""
            raise ConfigError(f"method {config.method!r} is not available in this session{hint}; have: {have}")
        check_answer_length(config, self._cache_limit())
        self._drafter(config.method).check(config)

    def _apply(self, config: SpecConfig) -> None:
        if config.seed != self._config.seed:
            self._picker.reseed(config.seed)
        self._config = config
        self._pending = None
        self._config_version += 1

    def _apply_precision(self, precision: str) -> None:
        self._pending_precision = None
        if precision != self.model.precision:
            self.model.precision = precision
            self.rewind_cache(0)
            self._cache = None  # a cache of the new kind
            self._drafters.clear()
            self._costs.clear()  # the new precision's verify costs, measured again

    def _budget(self, method: str) -> DraftBudget:
        return self._costs.get(method)

    @property
    def calibrates(self) -> bool:
        """Whether this session measures its verify-cost curve (``SPECCHAT_CALIBRATE=0``: not)."""
        return self._costs.calibrates

    @property
    def measured_cost_shape(self) -> dict[int, float] | None:
        return self._costs.measured  # None before a budget first needed it

    @property
    def learned_cost_curves(self) -> dict[str, dict[int, float]]:
        return self._costs.learned()  # Budgets.learned

    def cost_shape(self) -> dict[int, float] | None:
        """The relative verify cost by tree size, measured on first use (Budgets.shape)."""
        return self._costs.shape()

    def _drafter(self, method: str) -> Drafter:
        if method not in self._drafters:
            self._drafters[method] = self._factories[method]()
        return self._drafters[method]

    def _ensure_capacity(self, needed: int) -> None:
        if self._cache is None:
            self._cache = self.model.new_cache(needed + _CACHE_SLACK)
        elif needed > self._cache.capacity:
            self._cache.grow(needed + _CACHE_SLACK)

    # -- the step loop -----------------------------------------------------------------------------
    def _run(self, prompt: list[int], override: SpecConfig | None, dropped_turns: int = 0) -> Iterator[Event]:
        """Prefill, then per step: emit what the last forward produced, take hot-swapped settings,
        draft, verify, commit. The prefill's own next token is emitted as step 0."""
        t0 = time.perf_counter()
        config = override or self._config
        logits, reused = yield from self._prefill_prompt(prompt, config)
        if logits is None:
            yield Finished(reason="cancelled", text="", tokens=0, stats=RunningTally(started=t0).snapshot())
            return
        answer = self._begin(prompt, logits, config, fixed=override is not None, t0=t0)
        # the cost shape if measured (a baseline answer never pays for measuring it)
        yield Started(prompt_tokens=len(prompt), reused_tokens=reused, prefill_ms=answer.timing.verify_ms,
                      config=config.to_dict(), model=self.model_name, drafter=config.method, precision=self.precision,
                      context_limit=self._cache_limit(), dropped_turns=dropped_turns,
                      cost_shape=tuple(sorted((self._costs.measured or {}).items())))
        while True:
            yield self._emit(answer)
            if answer.finished is None and self._cancel.is_set():
                answer.finished = "cancelled"
            if answer.finished is not None:
                break
            applied = self._take_pending(answer)
            if applied is not None:
                yield applied
            self._use_drafter(answer)
            self._step(answer)
        tail = answer.decoder.flush()
        if tail:
            answer.text.append(tail)
        yield Finished(reason=answer.finished, text="".join(answer.text), tokens=answer.tally.tokens,
                       stats=answer.tally.snapshot())

    def _prefill_prompt(self, prompt: list[int], config: SpecConfig
                        ) -> Generator[PrefillProgress, None, tuple[torch.Tensor | None, int]]:
        """Reuse the cached prefix of ``prompt`` and prefill the rest; returns the last prompt
        token's logits (None when cancelled) and the number of tokens reused.

        At least one prompt token is run, for its logits. A method that reads target features
        also re-runs the cached tokens that have none (committed while a method that captured
        nothing ran)."""
        self._use_capture(config.method)
        same = common_prefix(self._cached, prompt, limit=len(prompt) - 1)  # tokens that stay
        reuse = min(same, self._capture.store.length) if self._capture.on else same
        self._cached = self._cached[:reuse]
        self._captures.truncate(same)  # others' features of tokens that stay hold (EAGLE-3, Medusa alternating)
        self._ensure_capacity(min(len(prompt) + config.max_new_tokens, self._cache_limit()) + config.max_tree_tokens)
        self._cache.truncate(reuse)
        logits = yield from self._prefiller.run(prompt[reuse:], self._cache, self._capture, self._cancel)
        if logits is not None:
            self._cached.extend(prompt[reuse:])
        else:  # cancelled: the tokens past reuse are gone
            self._captures.truncate(reuse)
        return logits, reuse

    def _begin(self, prompt: list[int], logits: torch.Tensor, config: SpecConfig, *, fixed: bool, t0: float
               ) -> AnswerState:
        """The answer's state after the prefill: its first token (the root of the first tree) is
        pending, as if a root-only step had produced it."""
        self._picker.new_answer()
        root = self._picker.first_token(logits, config, len(prompt))
        return AnswerState(config=config, fixed=fixed, root=root, tally=RunningTally(started=t0),
                       decoder=self.tokenizer.incremental_decoder(prompt[-8:]),
                       timing=StepTiming(verify_ms=(time.perf_counter() - t0) * 1e3),
                       tree=DraftTree.root_only(prompt[-1]), verdict=Verdict((), root), pending=[(root, "target")])

    def _emit(self, answer: AnswerState) -> Step:
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
        step = Step(index=answer.index, tree=tree, tree_text=tuple(self.tokenizer.piece(t) for t in tree.tokens),
                    accepted=answer.verdict.accepted, bonus=answer.verdict.bonus, committed=tuple(committed),
                    text=text, timing=answer.timing, stats=answer.tally.snapshot(),
                    config_version=self._config_version, proposed=answer.proposed,
                    draft_paused=not answer.drafted, draft_levels=answer.levels, draft_width=answer.width)
        answer.index += 1
        return step

    def _take_pending(self, answer: AnswerState) -> ConfigApplied | None:
        """Hot-swapped settings take effect at a step boundary (not in a generate() with its own)."""
        if answer.fixed or self._pending is None:
            return None
        with self._lock:
            if self._pending is None:
                return None
            self._apply(self._pending)
        answer.config = self._config
        return ConfigApplied(version=self._config_version, config=answer.config.to_dict())

    def _use_drafter(self, answer: AnswerState) -> None:
        """Draft with the method in force: on its first step (or a switch) its drafter takes the
        history, with target features caught up when it reads them, and its budget restarts."""
        method = answer.config.method
        if answer.method == method:
            return
        answer.method, answer.drafter, answer.budget = method, self._drafter(method), self._budget(method)
        self._use_capture(method)
        if self._capture.on:
            self._prefiller.catch_up(self._cached, self._cache, self._capture)
        answer.drafter.reset(self._cached, self._capture.rows())
        answer.budget.restart()

    def _step(self, answer: AnswerState) -> None:
        """Draft, verify with one target forward, commit; what it produced waits for :meth:`_emit`."""
        config, budget = answer.config, answer.budget
        gated = config.adaptive_draft and config.method != "none"  # "none" has no drafting to pause
        t_draft = time.perf_counter()
        tree = self._draft(answer, gated)
        t_verify = time.perf_counter()
        out, verdict = self._verify(config, tree)
        t_commit = time.perf_counter()
        if self._threads is not None:
            self._threads.observe((t_commit - t_verify) * 1e3, budget.cost.relative(len(tree)) if budget.cost.shape
                                  else 1.0)
        self._commit(answer, tree, out, verdict)
        t_done = time.perf_counter()
        # the budget prices a tree by all it costs once drafted: the forward, and the commit (a
        # branch's K/V moved into place, features kept), which grows with the tree too
        budget.observe(tree, verdict.accepted, (t_done - t_verify) * 1e3,
                       (t_verify - t_draft) * 1e3 if gated and answer.drafted else None, answer.grown, answer.width)
        answer.timing = StepTiming(draft_ms=(t_verify - t_draft) * 1e3, verify_ms=(t_commit - t_verify) * 1e3,
                                   other_ms=(t_done - t_commit) * 1e3)

    def _draft(self, answer: AnswerState, gated: bool) -> DraftTree:
        """This step's tree: the drafter's proposal pruned by the adaptive budget, or the root
        alone while the budget pauses drafting (it has recently cost more than it saved)."""
        config, budget, drafter = answer.config, answer.budget, answer.drafter
        answer.drafted = not gated or budget.gate.should_draft()
        answer.levels = answer.width = answer.grown = 0
        if not answer.drafted:
            answer.proposed = 0
            return DraftTree.root_only(answer.root)
        ask = config
        if config.adaptive_draft and drafter.pays_per_level:  # a chain or a tree, and as deep as pays
            answer.width = budget.draft_width(config.eagle_topk)
            answer.levels = budget.draft_depth(config.num_steps)
            if (answer.levels, answer.width) != (config.num_steps, config.eagle_topk):
                last = answer.asked
                if last is None or last[0] is not config or last[1:3] != (answer.levels, answer.width):
                    last = answer.asked = (config, answer.levels, answer.width,
                                           config.replace(num_steps=answer.levels, eagle_topk=answer.width))
                ask = last[3]
        tree = drafter.propose(self._cached, answer.root, ask, noise=self._picker.noise(config),
                               stop=cancellable(budget.stop_rule() if gated else None, self._cancel))
        answer.proposed = len(tree)
        if answer.levels:
            answer.grown = max(tree.depths)
        if answer.proposed > config.max_tree_tokens:
            raise RuntimeError(f"drafter {drafter.name} proposed {answer.proposed} nodes (> {config.max_tree_tokens})")
        return budget.prune(tree) if config.adaptive_draft else tree

    def _verify(self, config: SpecConfig, tree: DraftTree) -> tuple[Any, Verdict]:
        """One target forward over the whole tree, and the path the target keeps of it."""
        self._ensure_capacity(len(self._cached) + 1 + config.max_tree_tokens)
        cache = self._cache
        start = cache.length
        tokens = torch.tensor(tree.tokens)  # host tensors: the model sends them over with its own copy
        if tree.is_chain:
            out = self.model.forward(tokens, cache, **self._capture.forward_kwargs)
        else:
            out = self.model.forward(tokens, cache, positions=torch.tensor([start + d for d in tree.depths]),
                                     tree_mask=tree.ancestor_mask(), **self._capture.forward_kwargs)
        return out, self._picker.verdict(tree, out.logits, config, start)

    def _commit(self, answer: AnswerState, tree: DraftTree, out: Any, verdict: Verdict) -> None:
        """Root and accepted path into the cache (and the drafter); the bonus is the next root."""
        rows = [0, *verdict.accepted]
        self._cache.commit(rows)
        kept = [answer.root, *(tree.tokens[i] for i in verdict.accepted)]
        self._cached.extend(kept)
        answer.drafter.observe(kept, self._capture.keep(out, rows))
        answer.tree, answer.verdict, answer.root = tree, verdict, verdict.bonus
        answer.pending = [(tree.tokens[i], "draft") for i in verdict.accepted] + [(verdict.bonus, "target")]
        if len(self._cached) + 1 >= self._cache_limit():
            answer.finished = "context"

    # -- target features ---------------------------------------------------------------------------
    def _use_capture(self, method: str) -> None:
        """Forwards capture the target features ``method``'s drafter reads from now on (nothing for
        a drafter that reads none); the other stores keep their rows for the prefix they cover."""
        spec = self._features.get(method, self._default_features) if self._drafter(method).needs_features else None
        capture = self._captures.get(spec)
        if capture is not self._capture:
            self._capture.set(False)
            self._capture = capture
        capture.set(spec is not None)

    def _cache_limit(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", 1 << 30)


def _refused(message: str) -> Iterator[Event]:
    """The whole answer to a prompt that does not fit: nothing is run, nothing changes."""
    yield Finished(reason="context", text="", tokens=0, error=message)
