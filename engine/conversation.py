"""One conversation and the target's memory of it: the turns, the ids the model read and wrote,
and the KV cache of them (with the feature rows aligned to it), filled by a chunked prefill.

Why together: the next turn's prompt is built on what the cache holds (only the new suffix is
prefilled), and every cut of the conversation (a new one, a restored one, a switch of precision)
is a cut of the cache and of the feature rows at the same length. The speculative step
(engine/step.py) reads and extends the cache; this module decides what it holds between answers.

What a prompt is, before anything touches the cache: :func:`context_refusal` and
:func:`fit_context` say whether it fits the model's context, and which oldest turns to leave out
so that it does, so a refused turn changes nothing.

Why the prefill runs in chunks: a long prompt takes tens of seconds on a CPU; between chunks
cancel() is honoured and progress is reported. A chunk's size follows the measured speed so that
one takes about ``CHUNK_S``. Rows are computed independently of how many share a forward, so
chunking does not change the cached K/V.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch

from engine.api import Message
from engine.config import ConfigError, SpecConfig
from engine.events import PrefillProgress
from engine.features import FeatureCapture, FeatureCaptures
from engine.followup import Spoken, follow_up, replay, spoken
from engine.prefix import chat_preamble, common_prefix
from engine.target import TargetCache, TargetModel

# A turn must leave the answer at least this much room (or max_new_tokens, if smaller).
MIN_ANSWER_ROOM = 64
# Extra KV slots allocated beyond the immediate need, so a conversation grows the cache rarely.
CACHE_SLACK = 256
CHUNK_S = 0.25  # a prefill chunk takes about this long, so cancel() acts within it
CHUNK_MIN, CHUNK_MAX = 16, 4096


def check_answer_length(config: SpecConfig, limit: int) -> None:
    """Refuse an answer longer than the whole context (``--max-new-tokens 10**9``) when the
    settings are taken, with the context's size: such an answer could never end by its length,
    and the cache would be sized for it."""
    if config.max_new_tokens > limit:
        raise ConfigError(f"max_new_tokens={config.max_new_tokens} is more than the model's context of {limit} "
                          f"tokens; use --max-new-tokens {limit} or less")


def context_refusal(prompt_tokens: int, config: SpecConfig, limit: int) -> str:
    """Why a prompt of this length cannot be answered within ``limit`` tokens ("" when it can)."""
    room = min(config.max_new_tokens, MIN_ANSWER_ROOM)
    if prompt_tokens + room + config.max_tree_tokens <= limit:
        return ""
    return (f"the prompt is {prompt_tokens} tokens; with room for an answer it does not fit the model's "
            f"context of {limit} tokens")


def fit_context(tokenizer: Any, messages: list[Message], config: SpecConfig, limit: int
                ) -> tuple[list[int], int, str]:
    """The prompt for ``messages``, the number of oldest messages dropped to fit, and a refusal.

    With ``context_overflow = "drop_oldest"`` the oldest user/assistant turns are left out of
    the prompt (the system prompt and the last message always stay) until it fits.
    """
    prompt = tokenizer.encode_chat(messages)
    refusal = context_refusal(len(prompt), config, limit)
    if not refusal or config.context_overflow != "drop_oldest":
        return prompt, 0, refusal
    head = [m for m in messages[:1] if m.get("role") == "system"]
    body = messages[len(head):]
    dropped = 0
    while refusal and len(body) > 1:
        cut = 2 if len(body) > 2 and body[0].get("role") == "user" else 1
        body = body[cut:]
        dropped += cut
        prompt = tokenizer.encode_chat([*head, *body])
        refusal = context_refusal(len(prompt), config, limit)
    if refusal:
        refusal += " even with every earlier turn dropped"
    return prompt, dropped, refusal


class ChunkedPrefill:
    """Chunked forwards over one target: a prompt's prefill, and the catch-up that gives every
    cached token its target features when a method that reads them starts; ``chunk`` adapts to
    the measured speed."""

    def __init__(self, model: TargetModel) -> None:
        self.model = model
        self.chunk = 64

    def run(self, tokens: list[int], cache: TargetCache, capture: FeatureCapture, cancel: threading.Event
            ) -> Generator[PrefillProgress, None, torch.Tensor | None]:
        """Run ``tokens`` on top of the cache; returns the last token's logits, or None when
        ``cancel`` came first (the cache and the captured features are then as they were)."""
        start = cache.length
        total = len(tokens)
        done = 0
        t0 = time.perf_counter()
        while True:
            if done and cancel.is_set():
                cache.truncate(start)
                capture.store.truncate(start)
                return None
            n = min(self.chunk, total - done)
            last = done + n >= total
            t = time.perf_counter()
            out = self._forward(tokens[done:done + n], cache, capture, "last" if last else "none")
            done += n
            dt = time.perf_counter() - t
            if n == self.chunk and dt > 0:
                self.chunk = max(CHUNK_MIN, min(CHUNK_MAX, int(n * CHUNK_S / dt)))
            if last:
                return out.logits[-1]
            yield PrefillProgress(done=done, total=total, elapsed_ms=(time.perf_counter() - t0) * 1e3)

    def catch_up(self, cached: list[int], cache: TargetCache, capture: FeatureCapture) -> None:
        """Give every cached token its features before a feature-reading drafter starts mid-answer.

        The tokens committed while capture was off are run through the target again on top of the
        prefix that has features (their K/V are recomputed in place). Costs one prefill of those
        tokens, once per switch to such a method."""
        done = capture.store.length
        if done >= len(cached):
            return
        cache.truncate(done)
        while done < len(cached):
            n = min(CHUNK_MAX, len(cached) - done)
            self._forward(cached[done:done + n], cache, capture, "none")
            done += n

    def _forward(self, tokens: list[int], cache: TargetCache, capture: FeatureCapture, logits: str) -> Any:
        out = self.model.forward(torch.tensor(tokens, device=self.model.device), cache, logits=logits,
                                 **capture.forward_kwargs)
        cache.commit(len(tokens))
        capture.keep(out)
        return out


class Conversation:
    """The turns, the record of what the model read and wrote, and the target's KV cache.

    ``cache`` holds the K/V of ``cached`` (in order; the step appends to both), and ``captures``
    one feature row per cached token for each kind a drafter reads (engine/features.py): owned by
    the session's drafters, cut here wherever the cache is cut, so the rows always belong to it.
    """

    def __init__(self, model: TargetModel, tokenizer: Any, system_prompt: str | None,
                 captures: FeatureCaptures) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.messages: list[Message] = []
        self.spoken: Spoken | None = None  # the conversation as the model read and wrote it
        self.cache: TargetCache | None = None
        self.cached: list[int] = []  # tokens whose K/V sit in the cache, in order
        self.prefiller = ChunkedPrefill(model)
        self._captures = captures
        self._preamble: list[int] | None = None  # what every conversation opens with (reset() keeps it)

    @property
    def limit(self) -> int:
        """Tokens the model can attend to: prompt and answer together must fit."""
        return self.model.context_limit

    # -- the turns ------------------------------------------------------------------------------
    def turns(self) -> list[Message]:
        """The messages as the model reads them: the system prompt first, where there is one."""
        if self.system_prompt:
            return [{"role": "system", "content": self.system_prompt}, *self.messages]
        return list(self.messages)

    def prompt(self, messages: list[Message], config: SpecConfig) -> tuple[list[int], int, str]:
        """The prompt for ``messages``: on the ids of the conversation so far where they go on from
        it (engine/followup.py says why), else encoded afresh, dropping old turns where allowed."""
        ids = follow_up(self.tokenizer, self.spoken, messages)
        if ids is not None and not context_refusal(len(ids), config, self.limit):
            return ids, 0, ""
        return fit_context(self.tokenizer, messages, config, self.limit)

    def answered(self, turns: list[Message], answer: str, prompt: list[int], ids: list[int], dropped: int
                 ) -> None:
        """Keep the answer to ``turns`` (read as ``prompt``, written as ``ids``) and the record of
        both, which the next turn's prompt is built on (none where old turns were left out)."""
        self.messages.append({"role": "assistant", "content": answer})
        self.spoken = None if dropped else spoken(self.tokenizer, [*turns, self.messages[-1]], prompt, ids)

    def spoken_ids(self) -> list[int]:
        """The ids the model read and wrote, else the conversation encoded (what a next prompt is
        then built from; a template that drops old turns leaves no record)."""
        if self.spoken is not None:
            return list(self.spoken.ids)
        return self.tokenizer.encode_chat(self.turns()) if self.messages else []

    def reset(self) -> None:
        """A new conversation. The cache keeps the preamble every conversation opens with (~25
        tokens for the embedded model), as SGLang's radix cache does across requests, where the
        model's rows do not depend on how a prefill is chunked (so a kept row has a fresh one's bits)."""
        self.messages.clear()
        self.spoken = None
        self.rewind(self._reusable_preamble())

    def restore(self, messages: list[Message], answers: Sequence[Sequence[int] | None] | None) -> None:
        """Go on from a saved conversation: its messages and, where the recording has them, each
        answer's ids, so the next turn reads what it would have read live (engine/followup.py)."""
        self.reset()
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        if answers is not None:
            self.spoken = replay(self.tokenizer, self.turns(), answers)

    def _reusable_preamble(self) -> int:
        if not self.model.rows_independent:
            return 0
        if self._preamble is None:
            self._preamble = chat_preamble(self.tokenizer, self.system_prompt)
        n = len(self._preamble)
        return n if n and self.cached[:n] == self._preamble else 0

    # -- the cache ------------------------------------------------------------------------------
    def rewind(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (and their feature rows)."""
        length = max(0, min(length, len(self.cached)))
        del self.cached[length:]
        self._captures.truncate(length)
        if self.cache is not None:
            self.cache.truncate(length)

    def drop_cache(self) -> None:
        """Forget the cache itself: the next one is made anew (of the model's kind at that time)."""
        self.rewind(0)
        self.cache = None

    def ensure_capacity(self, needed: int) -> TargetCache:
        if self.cache is None:
            self.cache = self.model.new_cache(needed + CACHE_SLACK)
        elif needed > self.cache.capacity:
            self.cache.grow(needed + CACHE_SLACK)
        return self.cache

    def prefill(self, prompt: list[int], capture: FeatureCapture, room: int, cancel: threading.Event
                ) -> Generator[PrefillProgress, None, tuple[torch.Tensor | None, int]]:
        """Reuse the cached prefix of ``prompt`` and prefill the rest, with ``room`` tokens free
        after it; returns the last prompt token's logits (None when cancelled) and the number of
        tokens reused.

        At least one prompt token is run, for its logits. Where ``capture`` is on (a method that
        reads target features) it also re-runs the cached tokens that have none (committed while a
        method that captured nothing ran)."""
        same = common_prefix(self.cached, prompt, limit=len(prompt) - 1)  # tokens that stay
        reuse = min(same, capture.store.length) if capture.on else same
        self.cached = self.cached[:reuse]
        self._captures.truncate(same)  # others' features of tokens that stay hold (EAGLE-3, Medusa alternating)
        cache = self.ensure_capacity(len(prompt) + room)
        cache.truncate(reuse)
        logits = yield from self.prefiller.run(prompt[reuse:], cache, capture, cancel)
        if logits is not None:
            self.cached.extend(prompt[reuse:])
        else:  # cancelled: the tokens past reuse are gone
            self._captures.truncate(reuse)
        return logits, reuse

    def catch_up(self, capture: FeatureCapture) -> None:
        """Give every cached token ``capture``'s features (a feature-reading drafter starts)."""
        if self.cache is not None:
            self.prefiller.catch_up(self.cached, self.cache, capture)
