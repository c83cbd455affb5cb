"""The decoding loop: prefill, then draft -> one verify forward -> accept -> commit, as events.

One Session holds one conversation: its messages, the target KV cache of everything said so far
(reused by the next turn: only the new suffix is prefilled), and the drafters. The baseline is
the same loop with the ``none`` drafter, so baseline and speculative runs share every line that
could make their outputs differ.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from engine.adaptive import DraftBudget
from engine.config import ConfigError, SpecConfig
from engine.drafters.base import Drafter, NoDrafter
from engine.events import (
    CommittedToken,
    ConfigApplied,
    Event,
    Finished,
    PrefillProgress,
    RunningStats,
    Started,
    Step,
    StepTiming,
)
from engine.features import FeatureSpec, FeatureStore
from engine.sampling import GumbelNoise, coupled_predictions, perturbed_scores
from engine.tree import DraftTree
from engine.verify import Verdict, sample_from, target_probs, verify_greedy, verify_predicted, verify_sampling

Message = dict[str, str]
DrafterFactory = Callable[[], Drafter]

# Extra KV slots allocated beyond the immediate need, so a conversation grows the cache rarely.
_CACHE_SLACK = 256
# Prefill runs in chunks sized so one takes about this long: cancel() acts between chunks.
_PREFILL_CHUNK_S = 0.25
_PREFILL_CHUNK_MIN, _PREFILL_CHUNK_MAX = 16, 4096
# A turn must leave the answer at least this much room (or max_new_tokens, if smaller).
_MIN_ANSWER_ROOM = 64


def default_drafters() -> dict[str, DrafterFactory]:
    from engine.drafters.ngram import NgramDrafter

    return {"none": NoDrafter, "ngram": NgramDrafter}


@dataclass
class _Tally:
    """Running statistics of one answer."""

    started: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    produced: int = 0  # tokens the forwards produced, a final stop token included (for tau)
    steps: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    attempts: list[int] = field(default_factory=list)  # per depth: steps that could accept there
    accepts: list[int] = field(default_factory=list)

    def add_step(self, tree: DraftTree, verdict: Verdict, new_tokens: int, produced: int, timing: StepTiming
                 ) -> None:
        self.steps += 1
        self.tokens += new_tokens
        self.produced += produced
        self.draft_ms += timing.draft_ms
        self.verify_ms += timing.verify_ms
        # depth d+1 was attempted if the path reached depth d and the node there has children
        path = (0, *verdict.accepted)
        has_children = set(tree.parents[1:])
        for d, node in enumerate(path):
            if node not in has_children:
                break
            while len(self.attempts) <= d:
                self.attempts.append(0)
                self.accepts.append(0)
            self.attempts[d] += 1
            if d < len(verdict.accepted):
                self.accepts[d] += 1

    def snapshot(self) -> RunningStats:
        elapsed = time.perf_counter() - self.started
        return RunningStats(
            tokens=self.tokens,
            steps=self.steps,
            elapsed_s=elapsed,
            tokens_per_s=self.tokens / elapsed if elapsed > 0 else 0.0,
            tau=self.produced / self.steps if self.steps else 0.0,
            accept_per_depth=tuple(a / t for a, t in zip(self.accepts, self.attempts, strict=True) if t),
            draft_ms=self.draft_ms,
            verify_ms=self.verify_ms,
        )


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
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_path = model_path  # the resolved folder, for tools that load the same weights again
        self._factories = drafters if drafters is not None else default_drafters()
        self._drafters: dict[str, Drafter] = {}
        self._config = config or SpecConfig()
        self._check_available(self._config)
        self._pending: SpecConfig | None = None
        self._config_version = 0
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._busy = False
        self._system_prompt = system_prompt
        self._messages: list[Message] = []
        self._cache = None
        self._cached: list[int] = []  # tokens whose K/V sit in the cache, in order
        self._generator = torch.Generator(device="cpu")
        self._reseed(self._config)
        # adaptive budgets, one per method: acceptance is the drafter's own, and so is the verify
        # cost (an EAGLE-3 target forward also captures features)
        self._budgets: dict[str, DraftBudget] = {}
        self._noise_stream: GumbelNoise | None = None
        self._answer_seed = 0
        # target states the drafters read (EAGLE heads), one row per cached token. They are
        # captured only while the method in force reads them (see _set_capture): capturing costs
        # every forward a copy per layer and keeps CUDA forwards off their CUDA-graph path.
        self._feature_spec = features
        self._features = FeatureStore()
        self._capturing = False
        self._forward_kwargs: dict[str, object] = {}
        self._prefill_chunk = 64  # adapted to the measured speed, see _prefill

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
        self._features.truncate(length)
        if self._cache is not None:
            self._cache.truncate(length)

    def update_config(self, config: SpecConfig) -> None:
        config.validate()
        self._check_available(config)
        with self._lock:
            if self._busy:
                self._pending = config
            else:
                self._apply(config)

    def cancel(self) -> None:
        self._cancel.set()

    def set_draft(self, method: str, factory: DrafterFactory, features: FeatureSpec | None) -> None:
        """Install a draft loaded with engine.drafters.loading.load_draft (which validates it first,
        so a bad head never gets here and the old drafter stays). Not while an answer streams.

        A head that reads other target features than the cached ones makes the next turn prefill
        the conversation again, so every cached token has the features it needs.
        """
        with self._lock:
            if self._busy:
                raise RuntimeError("stop the answer before loading another draft")
            self._factories = {**self._factories, method: factory}
            self._drafters.pop(method, None)
            if features != self._feature_spec:
                self._feature_spec = features
                self._set_capture(False)  # the next answer decides, for its method
                self._features.truncate(0)
                self._cached.clear()
                if self._cache is not None:
                    self._cache.truncate(0)

    def reset(self) -> None:
        self._messages.clear()
        self._cached.clear()
        self._features.truncate(0)
        if self._cache is not None:
            self._cache.truncate(0)
        self._drafters.clear()

    def restore(self, messages: list[Message]) -> None:
        """Go on from a saved conversation: its messages, an empty cache (the next turn prefills them)."""
        self.reset()
        self._messages = [{"role": m["role"], "content": m["content"]} for m in messages]

    def chat(self, user_text: str) -> Iterator[Event]:
        self._messages.append({"role": "user", "content": user_text})
        answer: list[str] = []
        started = False
        for event in self.generate(self._conversation()):
            if isinstance(event, Started):
                started = True
            elif isinstance(event, Step):
                answer.append(event.text)
            elif isinstance(event, Finished):
                answer = [event.text]
            yield event
        if not started:
            # refused (context) or cancelled during the prefill: the conversation is as before the turn
            self._messages.pop()
            return
        self._messages.append({"role": "assistant", "content": "".join(answer)})

    def generate(self, messages: list[Message], config: SpecConfig | None = None) -> Iterator[Event]:
        if config is not None:
            config.validate()
            self._check_available(config)
        prompt, dropped, refusal = self._fit_context(messages, config or self._config)
        if refusal:
            return _refused(refusal)
        return self.generate_ids(prompt, config, dropped_turns=dropped)

    def generate_ids(self, prompt: Sequence[int], config: SpecConfig | None = None, *, dropped_turns: int = 0
                     ) -> Iterator[Event]:
        """Answer a raw token prompt (benchmarks with a ``prompt`` field, tests)."""
        if not prompt:
            raise ValueError("the prompt is empty")
        refusal = self._context_refusal(len(prompt), config or self._config)
        if refusal:
            return _refused(refusal)
        return self._generate_ids(list(prompt), config, dropped_turns)

    def _generate_ids(self, prompt: list[int], config: SpecConfig | None, dropped_turns: int) -> Iterator[Event]:
        with self._lock:
            if self._busy:
                raise RuntimeError("this session is already generating")
            self._busy = True
            self._cancel.clear()
        try:
            yield from self._run(prompt, config, dropped_turns)
        finally:
            with self._lock:
                self._busy = False
                if self._pending is not None:
                    self._apply(self._pending)

    # -- internals ------------------------------------------------------------------------------
    def _conversation(self) -> list[Message]:
        if self._system_prompt:
            return [{"role": "system", "content": self._system_prompt}, *self._messages]
        return list(self._messages)

    def _check_available(self, config: SpecConfig) -> None:
        if config.method not in self._factories:
            have = ", ".join(self._factories)
            hint = " (load a draft with --draft)" if config.method in ("eagle", "eagle3", "standalone") else ""
            raise ConfigError(f"method {config.method!r} is not available in this session{hint}; have: {have}")

    def _apply(self, config: SpecConfig) -> None:
        if config.seed != self._config.seed:
            self._reseed(config)
        self._config = config
        self._pending = None
        self._config_version += 1

    def _reseed(self, config: SpecConfig) -> None:
        self._generator.manual_seed(config.seed if config.seed is not None else random.getrandbits(63))

    def _budget(self, method: str) -> DraftBudget:
        if method not in self._budgets:
            self._budgets[method] = DraftBudget()
        return self._budgets[method]

    def _drafter(self, method: str) -> Drafter:
        if method not in self._drafters:
            self._drafters[method] = self._factories[method]()
        return self._drafters[method]

    def _ensure_capacity(self, needed: int) -> None:
        if self._cache is None:
            self._cache = self.model.new_cache(needed + _CACHE_SLACK)
        elif needed > self._cache.capacity:
            self._cache.grow(needed + _CACHE_SLACK)

    def _noise(self, config: SpecConfig) -> GumbelNoise | None:
        """The coupled-sampling noise for this answer (None when greedy or rejection sampling).
        With a seed it is a function of the seed alone, so every answer to the same prompt, with any
        drafter, is the same sample; without one each answer draws a fresh stream."""
        if config.greedy or config.sampling != "coupled":
            return None
        seed = config.seed if config.seed is not None else self._answer_seed
        if self._noise_stream is None or self._noise_stream.seed != seed:
            self._noise_stream = GumbelNoise(seed, self.model.vocab_size)
        return self._noise_stream

    def _first_token(self, logits: torch.Tensor, config: SpecConfig, position: int) -> int:
        if config.greedy:
            return int(logits.argmax())
        noise = self._noise(config)
        if noise is not None:
            scores = perturbed_scores(logits, config.temperature, config.top_p, config.top_k, noise.at(position))
            return int(scores.argmax())
        return sample_from(target_probs(logits, config.temperature, config.top_p, config.top_k), self._generator)

    # -- context and prefill (kept out of the step loop) ------------------------------------------
    def _context_refusal(self, prompt_tokens: int, config: SpecConfig) -> str:
        """Why a prompt of this length cannot be answered ("" when it can)."""
        limit = self._cache_limit()
        room = min(config.max_new_tokens, _MIN_ANSWER_ROOM)
        if prompt_tokens + room + config.max_tree_tokens <= limit:
            return ""
        return (f"the prompt is {prompt_tokens} tokens; with room for an answer it does not fit the model's "
                f"context of {limit} tokens")

    def _fit_context(self, messages: list[Message], config: SpecConfig) -> tuple[list[int], int, str]:
        """The prompt for ``messages``, the number of oldest messages dropped to fit, and a refusal.

        With ``context_overflow = "drop_oldest"`` the oldest user/assistant turns are left out of
        the prompt (the system prompt and the last message always stay) until it fits.
        """
        prompt = self.tokenizer.encode_chat(messages)
        refusal = self._context_refusal(len(prompt), config)
        if not refusal or config.context_overflow != "drop_oldest":
            return prompt, 0, refusal
        head = [m for m in messages[:1] if m.get("role") == "system"]
        body = messages[len(head):]
        dropped = 0
        while refusal and len(body) > 1:
            cut = 2 if len(body) > 2 and body[0].get("role") == "user" else 1
            body = body[cut:]
            dropped += cut
            prompt = self.tokenizer.encode_chat([*head, *body])
            refusal = self._context_refusal(len(prompt), config)
        if refusal:
            refusal += " even with every earlier turn dropped"
        return prompt, dropped, refusal

    def _prefill(self, tokens: list[int], cache) -> Generator[PrefillProgress, None, torch.Tensor | None]:
        """Run ``tokens`` through the target on top of the cache, in chunks; returns the last
        token's logits, or None when cancel() came first (the cache is then as it was before).

        Why chunks: a long prompt takes tens of seconds on a CPU; between chunks cancel() is
        honoured and progress is reported. A chunk's size follows the measured speed so that one
        takes about _PREFILL_CHUNK_S. Rows are computed independently of how many share a forward,
        so chunking does not change the cached K/V.
        """
        start = cache.length
        device = self.model.device
        total = len(tokens)
        done = 0
        t0 = time.perf_counter()
        logits = None
        while done < total:
            if done and self._cancel.is_set():
                cache.truncate(start)
                self._features.truncate(start)
                return None
            n = min(self._prefill_chunk, total - done)
            last = done + n >= total
            t = time.perf_counter()
            out = self.model.forward(torch.tensor(tokens[done:done + n], device=device), cache,
                                     logits="last" if last else "none", **self._forward_kwargs)
            cache.commit(n)
            self._keep_features(out, None)
            done += n
            dt = time.perf_counter() - t
            if n == self._prefill_chunk and dt > 0:
                scaled = int(n * _PREFILL_CHUNK_S / dt)
                self._prefill_chunk = max(_PREFILL_CHUNK_MIN, min(_PREFILL_CHUNK_MAX, scaled))
            if last:
                logits = out.logits[-1]
            else:
                yield PrefillProgress(done=done, total=total, elapsed_ms=(time.perf_counter() - t0) * 1e3)
        return logits

    def _run(self, prompt: list[int], override: SpecConfig | None, dropped_turns: int = 0) -> Iterator[Event]:
        t0 = time.perf_counter()
        config = override or self._config
        # Reuse the cached prefix; at least one prompt token is run to get the next-token logits.
        # A method that reads target features also re-runs the cached tokens that have none (they
        # were committed while another method ran, which captured nothing).
        self._set_capture(self._needs_features(config.method))
        limit = len(prompt) - 1
        if self._capturing:
            limit = min(limit, self._features.length)
        reuse = _common_prefix(self._cached, prompt, limit=limit)
        self._cached = self._cached[:reuse]
        self._features.truncate(reuse)
        budget = len(prompt) + config.max_new_tokens + config.max_tree_tokens
        self._ensure_capacity(budget)
        cache = self._cache
        cache.truncate(reuse)
        last_logits = yield from self._prefill(prompt[reuse:], cache)
        if last_logits is None:
            yield Finished(reason="cancelled", text="", tokens=0, stats=_Tally(started=t0).snapshot())
            return
        self._cached.extend(prompt[reuse:])
        self._answer_seed = int(torch.randint(0, 2**62, (), generator=self._generator))
        root = self._first_token(last_logits, config, len(prompt))
        prefill_ms = (time.perf_counter() - t0) * 1e3
        yield Started(prompt_tokens=len(prompt), reused_tokens=reuse, prefill_ms=prefill_ms,
                      config=config.to_dict(), model=self.model_name, drafter=config.method,
                      context_limit=self._cache_limit(), dropped_turns=dropped_turns)

        tally = _Tally(started=t0)
        decoder = self.tokenizer.incremental_decoder(prompt[-8:])
        stops = self.tokenizer.stop_token_ids
        text: list[str] = []
        step_index = 0
        finished: str | None = None
        # The prefill produced the first token: report it as step 0 (root = last prompt token).
        pending_tokens = [(root, "target")]
        tree, verdict = DraftTree.root_only(prompt[-1]), Verdict((), root)
        timing = StepTiming(verify_ms=prefill_ms)
        proposed = 1
        drafted = True
        levels = 0
        drafter = None
        while True:
            # ---- emit what the last forward produced, honouring stops exactly like the baseline
            committed: list[CommittedToken] = []
            produced = 0
            for token, origin in pending_tokens:
                produced += 1
                if token in stops:
                    finished = "stop"
                    break
                piece = decoder.push(token)
                committed.append(CommittedToken(token, origin, piece))
                if tally.tokens + len(committed) >= config.max_new_tokens:
                    finished = "length"
                    break
            tally.add_step(tree, verdict, len(committed), produced, timing)
            step_text = "".join(c.text for c in committed)
            text.append(step_text)
            yield Step(
                index=step_index, tree=tree, tree_text=tuple(self.tokenizer.piece(t) for t in tree.tokens),
                accepted=verdict.accepted, bonus=verdict.bonus, committed=tuple(committed), text=step_text,
                timing=timing, stats=tally.snapshot(), config_version=self._config_version, proposed=proposed,
                draft_paused=not drafted, draft_levels=levels,
            )
            step_index += 1
            if finished is None and self._cancel.is_set():
                finished = "cancelled"
            if finished is not None:
                break
            # ---- step boundary: hot-swapped settings take effect here
            if override is None and self._pending is not None:
                with self._lock:
                    if self._pending is not None:
                        self._apply(self._pending)
                        config = self._config
                        yield ConfigApplied(version=self._config_version, config=config.to_dict())
            if drafter is None or drafter.name != config.method:
                drafter = self._drafter(config.method)
                self._set_capture(self._needs_features(config.method))
                if self._capturing:
                    self._catch_up_features()
                if drafter.needs_features:
                    drafter.reset(self._cached, self._features.rows())
                else:
                    drafter.reset(self._cached)
                budget = self._budget(config.method)
                budget.gate.settling = True  # the new drafter's first step catches up on the history
            self._ensure_capacity(len(self._cached) + 1 + config.max_tree_tokens)
            cache = self._cache

            # ---- draft
            t_draft = time.perf_counter()
            noise = self._noise(config)
            if hasattr(drafter, "noise"):
                drafter.noise = noise
            gated = config.adaptive_draft and config.method != "none"  # "none" has no drafting to pause
            if hasattr(drafter, "stop"):  # grow levels only while the drafter's confidence pays for them
                drafter.stop = budget.stop_rule() if gated else None
            drafted = not gated or budget.gate.should_draft()
            levels = 0  # levels asked of a drafter that pays per level, under the adaptive budget
            if drafted:
                ask = config
                if config.adaptive_draft and getattr(drafter, "pays_per_level", False):
                    levels = budget.draft_depth(config.num_steps)
                    if levels != config.num_steps:
                        ask = config.replace(num_steps=levels)
                tree = drafter.propose(self._cached, root, ask)
                proposed = len(tree)
                if proposed > config.max_tree_tokens:
                    raise RuntimeError(f"drafter {drafter.name} proposed {proposed} nodes "
                                       f"(> {config.max_tree_tokens})")
                if config.adaptive_draft:
                    tree = budget.prune(tree)
            else:  # drafting is paused: it has recently cost more than it saved
                tree, proposed = DraftTree.root_only(root), 0
            t_verify = time.perf_counter()

            # ---- verify: one target forward over the whole tree
            L = cache.length
            tokens = torch.tensor(tree.tokens)  # host tensors: the model sends them over with its own copy
            if tree.is_chain:
                out = self.model.forward(tokens, cache, **self._forward_kwargs)
            else:
                positions = torch.tensor(tree.depths) + L
                out = self.model.forward(tokens, cache, positions=positions, tree_mask=tree.ancestor_mask(),
                                         **self._forward_kwargs)
            if config.greedy:
                verdict = verify_greedy(tree, out.logits)
            elif noise is not None:
                verdict = verify_predicted(tree, coupled_predictions(
                    out.logits, tree.depths, L, noise, config.temperature, config.top_p, config.top_k))
            else:
                verdict = verify_sampling(tree, out.logits, config.temperature, config.top_p, self._generator,
                                           config.top_k)
            t_commit = time.perf_counter()
            budget.observe(tree, verdict.accepted, (t_commit - t_verify) * 1e3,
                           (t_verify - t_draft) * 1e3 if gated and drafted else None, levels)

            # ---- commit: root + accepted path into the cache; the bonus is the next root
            cache.commit([0, *verdict.accepted])
            kept = [root, *(tree.tokens[i] for i in verdict.accepted)]
            self._cached.extend(kept)
            kept_features = self._keep_features(out, [0, *verdict.accepted])
            if drafter.needs_features:
                drafter.observe(kept, kept_features)
            else:
                drafter.observe(kept)
            pending_tokens = [(tree.tokens[i], "draft") for i in verdict.accepted] + [(verdict.bonus, "target")]
            root = verdict.bonus
            if len(self._cached) + 1 >= self._cache_limit():
                finished = "context"
            timing = StepTiming(
                draft_ms=(t_verify - t_draft) * 1e3,
                verify_ms=(t_commit - t_verify) * 1e3,
                other_ms=(time.perf_counter() - t_commit) * 1e3,
            )
        tail = decoder.flush()
        if tail:
            text.append(tail)
        yield Finished(reason=finished, text="".join(text), tokens=tally.tokens, stats=tally.snapshot())

    def _needs_features(self, method: str) -> bool:
        """Whether forwards must capture target features while ``method`` drafts."""
        return self._feature_spec is not None and bool(self._drafter(method).needs_features)

    def _set_capture(self, on: bool) -> None:
        """Capture features in the target's forwards from now on, or stop.

        Why not always when a head is loaded: the embedded model ships an EAGLE-3 head that is
        loaded for every method (so eagle3 can be chosen mid-chat), and capturing for the
        baseline or n-gram would tax each of their forwards (and keep CUDA off its CUDA graphs).
        While off, the feature store keeps its rows for the cached prefix it still covers; turning
        it on again goes with :meth:`_catch_up_features` (or a prefill from the store's length)."""
        self._capturing = on
        self._forward_kwargs = self._feature_spec.forward_kwargs() if on and self._feature_spec else {}

    def _catch_up_features(self) -> None:
        """Give every cached token its features before a feature-reading drafter starts mid-answer.

        The tokens committed while capture was off are run through the target again on top of the
        prefix that has features (their K/V are recomputed in place: rows do not depend on how many
        share a forward). Costs one prefill of those tokens, once per switch to such a method."""
        start = self._features.length
        if start >= len(self._cached):
            return
        cache = self._cache
        cache.truncate(start)
        device = self.model.device
        done = start
        while done < len(self._cached):
            n = min(_PREFILL_CHUNK_MAX, len(self._cached) - done)
            out = self.model.forward(torch.tensor(self._cached[done:done + n], device=device), cache,
                                     logits="none", **self._forward_kwargs)
            cache.commit(n)
            self._keep_features(out, None)
            done += n

    def _keep_features(self, out, rows: list[int] | None) -> torch.Tensor | None:
        """Store the features of the forward's rows now committed (all rows, or ``rows``)."""
        if self._feature_spec is None or not self._capturing:
            return None
        feats = self._feature_spec.extract(out)
        if rows is not None:
            feats = feats[rows]
        self._features.append(feats)
        return feats

    def _cache_limit(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", 1 << 30)


def _refused(message: str) -> Iterator[Event]:
    """The whole answer to a prompt that does not fit: nothing is run, nothing changes."""
    yield Finished(reason="context", text="", tokens=0, error=message)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
