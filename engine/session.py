"""A conversation with one target model: the SessionAPI the app uses, over the parts that do the work.

The session only composes and guards. Each concern has an owner:

* :class:`engine.conversation.Conversation`: the turns, the ids the model read and wrote, and the
  KV cache of them (reused by the next turn: only the new suffix is prefilled);
* :class:`engine.drafting.Drafters`: the installed drafters, the settings in force and those
  waiting to be hot-swapped in, and the target features the drafters read;
* :class:`engine.precision.PrecisionSwitch`: the target's arithmetic and a switch waiting for
  the answer to end;
* :class:`engine.budgets.Budgets`: the verify-cost calibration and the adaptive draft budgets;
* :class:`engine.step.SpecLoop`: one answer, prefill then draft -> verify -> accept -> commit ->
  emit per step (the module to read for how specchat decodes).

What the session adds is the threading contract (engine/api.py): one thing runs at a time, and
what is asked for meanwhile (settings, a precision) waits for a step boundary or for the end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from engine.adaptive import DraftBudget
from engine.api import Message
from engine.budgets import Budgets
from engine.calibrate import sync
from engine.config import SpecConfig
from engine.conversation import Conversation, context_refusal
from engine.drafting import DrafterFactory, Drafters, default_drafters
from engine.events import Event, Finished, Started, Step
from engine.features import FeatureSpec
from engine.gpu.graphs import GraphCounts, KeepsGraphs
from engine.gpu.static import BUCKETS
from engine.precision import PrecisionSwitch
from engine.step import SpecLoop, refused
from engine.target import TargetModel
from engine.threads import EXPLORE_STEPS, ThreadGovernor
from engine.verify import Picker

__all__ = ["WARM_UP_TOKENS", "DrafterFactory", "Session", "default_drafters"]

WARM_UP_TOKENS = 8  # a warm-up answer's length (bench warms up with as many: specchat/bench.py)
_WARM_UP_BASELINE_TURNS = 4  # the most baseline scratch turns a warm-up asks for the thread governor


class Session:
    """A conversation with one target model; see engine.api.SessionAPI for the contract."""

    def __init__(
        self,
        model: TargetModel,  # LlamaModel or HFModel
        tokenizer: Any,  # engine.tokenizer.Tokenizer
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
        self.draft_description = ""  # what the loader loaded as a draft, one line for the UI
        self.ngram_corpus: Any = None  # the n-gram drafter's corpus (a CorpusHandle), set by the loader
        config = config or SpecConfig()
        self._drafters = Drafters(drafters, config, features, context_limit=model.context_limit)
        self._conversation = Conversation(model, tokenizer, system_prompt, self._drafters.captures)
        self._precision = PrecisionSwitch(model)
        self._costs = Budgets(model, calibrate=calibrate_costs, threads=threads)  # adaptive budgets
        self._picker = Picker(model, config.seed)  # how kept tokens are chosen, and its random state
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._busy = False
        self._loop = SpecLoop(model=model, tokenizer=tokenizer, conversation=self._conversation,
                              drafters=self._drafters, picker=self._picker, budgets=self._costs, threads=threads,
                              cancel=self._cancel, take_pending=self._take_pending)

    def report_blocks(self, candidates: int) -> None:
        """From the next step on, a step drafted as a block in one pass (a block drafter) carries its
        ``candidates`` best guesses at every position (Step.block; 0: none, the default). The app asks
        for them (its tree panel and teaching mode show them); bench and generate do not, so they do
        not pay for a top-k over the block's rows."""
        if candidates < 0:
            raise ValueError("candidates must be >= 0")
        self._loop.block_candidates = candidates

    # -- settings ---------------------------------------------------------------------------------
    @property
    def config(self) -> SpecConfig:
        return self._drafters.config

    @property
    def pending_config(self) -> SpecConfig | None:
        return self._drafters.pending

    @property
    def methods(self) -> tuple[str, ...]:
        return self._drafters.methods

    def update_config(self, config: SpecConfig) -> None:
        self._drafters.checked(config)
        with self._lock:
            if self._busy:
                self._drafters.pending = config
            else:
                self._apply(config)

    def set_draft(self, method: str, factory: DrafterFactory, features: FeatureSpec | None) -> None:
        """Install a draft loaded with engine.drafters.draft_loader.load_draft (which validates it first,
        so a bad head never gets here and the old drafter stays). Not while an answer streams."""
        with self._lock:
            if self._busy:
                raise RuntimeError("stop the answer before loading another draft")
            self._drafters.install(method, factory, features)

    def cancel(self) -> None:
        self._cancel.set()

    # -- precision ----------------------------------------------------------------------------------
    @property
    def precision(self) -> str:
        """The target's arithmetic, "exact" or "fast" (LlamaModel.precision); "" where it has one."""
        return self._precision.current

    def check_precision(self, precision: str) -> None:
        """Raise ConfigError (one line) where this session's target cannot run ``precision``."""
        self._precision.check(precision)

    def set_precision(self, precision: str) -> bool:
        """Switch the target's arithmetic: True if done now, False if it waits for the answer streaming
        to end. It drops the KV cache (computed, and in fast stored, in the other arithmetic), the
        drafters' state and the cost curves: the next answer reads the conversation again in the new
        precision. Raises ConfigError, nothing changed, where it cannot run."""
        self._precision.check(precision)
        with self._lock:
            self._precision.pending = precision if self._busy else None
            if not self._busy:
                self._switch_precision(precision)
            return not self._busy

    # -- the conversation and its cache -----------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self._conversation.messages]

    @property
    def context_limit(self) -> int:
        """Tokens the model can attend to: prompt and answer together must fit."""
        return self._conversation.limit

    @property
    def context_used(self) -> int:
        """Tokens of the conversation whose K/V are cached (what the next turn builds on)."""
        return len(self._conversation.cached)

    def rewind_cache(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (compare: both runs start from one state)."""
        self._idle()
        self._conversation.rewind(length)

    def forget_cache(self) -> None:
        """Empty the cache, preamble included (for callers that write their own tokens into it)."""
        self.rewind_cache(0)

    # -- CUDA graphs: what a benchmark settles before it times ------------------------------------------
    @property
    def graph_counts(self) -> GraphCounts | None:
        """The CUDA graphs captured and replayed so far, the target's verify graphs and the drafters'
        together; None where the target runs eagerly (CPU)."""
        target = self.model.graph_counts
        return None if target is None else target + self._drafters.graph_counts()

    def reserve(self, tokens: int) -> None:
        """Room in the KV caches (the target's, the drafters') for ``tokens`` now. Graphs are
        captured per cache address, and a cache grows when an answer needs more room: growing later
        recaptures every graph that reads it there."""
        self._idle()
        self._conversation.ensure_capacity(tokens)
        self._drafters.reserve(tokens)

    def capture_graphs(self, configs: Sequence[SpecConfig] = ()) -> int:
        """Capture every CUDA graph an answer under one of ``configs`` (default: the settings in force)
        replays, so that none is captured inside an answer, a hot-swap's included; returns how many
        were captured here (0 where the target runs eagerly).

        Graphs are captured the first time a shape runs (engine/gpu/graphs.py), and an adaptive
        tree's size varies step by step, so a short warm-up answer reaches only some. Here every
        tree-size bucket (1, 2, ... 64) runs: the verify forward with the features each method's
        drafter reads (another set of features is another graph), then the drafter over that many
        new rows, once for each setting the adaptive budget may ask of it (SpecLoop.may_ask), so a
        drafter that keeps its graphs (DraftMemory) captures them all. The forwards run on the
        emptied cache (K/V land in slots the next prefill overwrites), the drafters are forgotten
        after (their graphs kept), and the cache is emptied again."""
        before = self.graph_counts
        if before is None:
            return 0
        by_features: dict[FeatureSpec | None, list[SpecConfig]] = {}  # one verify sweep per set of features
        for config in [self._drafters.checked(c) for c in configs] or [self.config]:
            by_features.setdefault(self._drafters.features_of(config.method), []).append(config)
        self.forget_cache()
        cache = self._conversation.ensure_capacity(BUCKETS[-1])
        self._drafters.reserve(cache.capacity)  # graphs for conversations as long as the target's cache holds
        for group in by_features.values():
            self._capture_for(group)
        sync(self.model)
        self._drafters.forget()
        self.forget_cache()
        after = self.graph_counts
        return after.captures - before.captures if after is not None else 0

    def _capture_for(self, configs: list[SpecConfig]) -> None:
        """Each bucket's verify forward with the features ``configs``' drafters read, then each of
        those drafters that keeps its graphs over that many new rows, in every setting it may be asked."""
        capture = self._drafters.use_capture(configs[0].method)
        runs = []
        for config in configs:
            drafter = self._drafters.get(config.method)
            if isinstance(drafter, KeepsGraphs):
                runs += [(drafter, settings) for settings in SpecLoop.may_ask(config, drafter)]
        for b in BUCKETS:
            out = self.model.forward(torch.zeros(b, dtype=torch.int64), self._conversation.cache,
                                     positions=torch.arange(b), tree_mask=torch.ones(b, b, dtype=torch.bool).tril_(),
                                     **capture.forward_kwargs)
            features = capture.spec.extract(out) if capture.on and capture.spec is not None else None
            for drafter, settings in runs:
                # b new rows: a feature reader runs one per token it has no row for (a block
                # drafter's context rows, EAGLE's entries), a draft model those tokens and the root
                history = [0] * (b if drafter.needs_features else b - 1)
                drafter.truncate(0)
                drafter.reset(history, features)
                drafter.propose(history, 0, settings)

    def reset(self) -> None:
        """A new conversation (the cache keeps the preamble every conversation opens with:
        Conversation.reset); the drafters start afresh."""
        self._idle()
        self._conversation.reset()
        self._drafters.forget()

    def restore(self, messages: list[Message], answers: Sequence[Sequence[int] | None] | None = None) -> None:
        """Go on from a saved conversation: its messages and, where the recording has them, each
        answer's ids, so the next turn reads what it would have read live (engine/followup.py);
        the next turn prefills all but the preamble."""
        self._idle()
        self._drafters.forget()
        self._conversation.restore(messages, answers)

    def reread(self) -> None:
        """Read the conversation so far into the (emptied) cache now, and measure the verify-cost
        curve where the budget will want it, so the next answer after set_precision() prefills only
        its own turn and is timed as any other."""
        with self._working():
            config = self._drafters.config
            if config.method != "none" and config.adaptive_draft:
                self.cost_shape()
            ids = self._conversation.spoken_ids()
            if ids and not self._conversation.cached and len(ids) < self._conversation.limit:
                for _ in self._loop.prefill(ids, config):
                    pass

    def warm_up(self) -> None:
        """Pay now, once, what the first answer after a load would pay: the verify-cost calibration
        (a drafting method's first step waits for it: about 2 s on the embedded model, inside the
        first answer's time) and the first forwards' one-time costs (the cache's pages, the kernels'
        first calls: about 60 ms of the first step). The chat calls this while its user types.

        It answers a scratch turn with the method in force (:data:`WARM_UP_TOKENS` long), then with
        the baseline for as many steps as the thread governor's first exploration takes (a window
        at all threads, then a trial of one thread against all, engine/threads.py: else the first
        answer runs the trial; a model that ends the turn sooner is asked again, a few times at
        most), greedy, and throws the answers away: the conversation (the cache keeps the preamble, as after
        reset()), the drafters, the budgets' learning (a cold step's timings would mislead them) and
        the random state are then as a fresh session's. A session that already holds a conversation
        is left alone."""
        if self._conversation.messages:
            return
        with self._working():
            config = self._drafters.config
            governor = self._loop.threads
            try:
                if config.method == "none" or self._scratch_turn(config.replace(max_new_tokens=WARM_UP_TOKENS)):
                    # a chatty model ends "Hello." in a few tokens: the baseline's turn is asked
                    # again until the governor's first exploration is over
                    baseline = config.replace(method="none", max_new_tokens=max(WARM_UP_TOKENS, EXPLORE_STEPS + 1))
                    for _ in range(_WARM_UP_BASELINE_TURNS):
                        if not self._scratch_turn(baseline) or governor is None or governor.explored_first:
                            break
            finally:
                self._conversation.reset()
                self._drafters.forget()
                self._costs.forget_learning()
                self._picker.reseed(config.seed)

    def _scratch_turn(self, config: SpecConfig) -> bool:
        """Answer "Hello." greedy in ``config`` and throw the answer away (the caller resets);
        False where the context is too small for a scratch turn (nothing to warm)."""
        scratch = config.replace(temperature=0.0)
        prompt, _, refusal = self._conversation.prompt([{"role": "user", "content": "Hello."}], scratch)
        if refusal:
            return False
        for _ in self._loop.run(prompt, scratch, 0, self.model_name):
            pass
        return True

    # -- answers ----------------------------------------------------------------------------------
    def chat(self, user_text: str) -> Iterator[Event]:
        conversation = self._conversation
        conversation.messages.append({"role": "user", "content": user_text})
        turns = conversation.turns()
        prompt, dropped, refusal = conversation.prompt(turns, self._drafters.config)
        answer: list[str] = []
        ids: list[int] = []
        started = False
        for event in refused(refusal) if refusal else self.generate_ids(prompt, dropped_turns=dropped):
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
            conversation.messages.pop()
            return
        conversation.answered(turns, "".join(answer), prompt, ids, dropped)

    def generate(self, messages: list[Message], config: SpecConfig | None = None) -> Iterator[Event]:
        prompt, dropped, refusal = self._conversation.prompt(messages, self._drafters.checked(config))
        if refusal:
            return refused(refusal)
        return self.generate_ids(prompt, config, dropped_turns=dropped)

    def generate_ids(self, prompt: Sequence[int], config: SpecConfig | None = None, *, dropped_turns: int = 0
                     ) -> Iterator[Event]:
        """Answer a raw token prompt (benchmarks with a ``prompt`` field, tests)."""
        if not prompt:
            raise ValueError("the prompt is empty")
        refusal = context_refusal(len(prompt), self._drafters.checked(config), self._conversation.limit)
        if refusal:
            return refused(refusal)
        return self._generate_ids(list(prompt), config, dropped_turns)

    def _generate_ids(self, prompt: list[int], config: SpecConfig | None, dropped_turns: int) -> Iterator[Event]:
        with self._working():
            yield from self._loop.run(prompt, config, dropped_turns, self.model_name)

    # -- costs --------------------------------------------------------------------------------------
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

    # -- one thing at a time -----------------------------------------------------------------------
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
                if self._drafters.pending is not None:
                    self._apply(self._drafters.pending)
                if self._precision.pending is not None:
                    self._switch_precision(self._precision.pending)

    def _idle(self) -> None:
        if self._busy:
            raise RuntimeError("cannot rewind the cache while generating")

    def _take_pending(self) -> SpecConfig | None:
        """The hot-swapped settings applied at a step boundary (SpecLoop.hot_swap), or None."""
        with self._lock:
            if self._drafters.pending is None:
                return None
            self._apply(self._drafters.pending)
        return self._drafters.config

    def _apply(self, config: SpecConfig) -> None:
        if config.seed != self._drafters.config.seed:
            self._picker.reseed(config.seed)
        self._drafters.apply(config)

    def _switch_precision(self, precision: str) -> None:
        """The new arithmetic drops what was computed in the old: the cache (of the new kind when
        next made), the drafters' state, and the verify costs (measured again)."""
        if self._precision.switch(precision):
            self._conversation.drop_cache()
            self._drafters.forget()
            self._costs.clear()

    # -- what tests reach into (kept while they do; the bench and the calibration use the public API above,
    # tests/test_architecture.py keeps them there) ----------------------------------------------------
    @property
    def _cache(self) -> Any:
        return self._conversation.cache

    @property
    def _cached(self) -> list[int]:
        return self._conversation.cached

    @property
    def _spoken(self) -> Any:
        return self._conversation.spoken

    @property
    def _prefiller(self) -> Any:
        return self._conversation.prefiller

    def _budget(self, method: str) -> DraftBudget:
        return self._costs.get(method)

