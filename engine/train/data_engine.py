"""Self-distilled conversations on the rows engine, with the target's features stored beside them.

The recipe is :mod:`engine.train.data`'s (Magpie user turns, answers half greedy and half
sampled, a fifth with a second turn); what changes is how it runs. Each conversation is a small
state machine of generation requests (user turn, answer, second user turn, second answer) fed to
one :class:`RowEngine`, so a few dozen conversations advance in every forward and a finished
row takes the next request at once. Every answer request keeps the target's EAGLE-3 features,
final hidden state and argmax for each of its positions; they are written with the ids, in bf16,
into shards of the data cache, so the trainer never runs the target.

Conversation ``j`` draws everything from seeds derived from ``j`` alone, so the data does not
depend on the batch it ran in; a resumed run starts after the highest conversation on disk.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.train.data import FEATURE_FILES, HIDDEN_FILES, ChatFormat, DataCache, GenSettings, Sample, answer_tokens
from engine.train.rows import Finished, Request, RowEngine


@dataclass
class _Pending:
    """Finished answers not yet written to a shard."""

    samples: list[Sample] = field(default_factory=list)
    arrays: dict[str, list[np.ndarray]] = field(default_factory=lambda: {"features": [], "hidden": [], "argmax": []})
    conversations: list[int] = field(default_factory=list)

    def add(self, sample: Sample, done: Finished, conversation: int) -> None:
        self.samples.append(sample)
        self.conversations.append(conversation)
        if done.features is not None:
            self.arrays["features"].append(done.features.view(torch.uint16).numpy())
        self.arrays["hidden"].append(done.hidden.view(torch.uint16).numpy())
        self.arrays["argmax"].append(done.argmax.numpy())

    def flush(self, cache: DataCache, index: int) -> None:
        arrays = {k: np.concatenate(v) for k, v in self.arrays.items() if v}
        cache.write(index, self.samples, arrays=arrays, conversations=self.conversations)
        self.__init__()


def _seed(*parts: int) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:6], "little")


class _Conversations:
    """Starts conversation ``j`` on the engine and turns its finished answers into samples."""

    def __init__(self, engine: RowEngine, fmt: ChatFormat, st: GenSettings,
                 prompt_list: Sequence[Sequence[dict[str, str]]], accept: Callable[[Sample, Finished, int], None]
                 ) -> None:
        self.engine, self.fmt, self.st, self.prompt_list, self.accept = engine, fmt, st, prompt_list, accept
        self.live = 0
        self.ended = 0

    def start(self, j: int) -> None:
        st = self.st
        rng = random.Random(st.seed * 1_000_003 + j)
        from_list = bool(self.prompt_list) and rng.random() >= st.magpie_fraction
        history = [dict(m) for m in rng.choice(self.prompt_list)] if from_list else None
        greedy = rng.random() < st.greedy_fraction
        multi = rng.random() < st.multi_turn_fraction
        self.live += 1
        if history is None:
            self._user_turn(j, [], 0, lambda h: self._answer(j, h, greedy, multi, 0))
        else:
            self._answer(j, history, greedy, multi, 0)

    def _submit(self, req: Request) -> bool:
        if len(req.prompt) + req.max_new_tokens > self.engine.cap:
            return False
        self.engine.submit(req)
        return True

    def _end(self) -> None:
        self.live -= 1
        self.ended += 1

    def _user_turn(self, j: int, history: list[dict[str, str]], turn: int,
                   then: Callable[[list[dict[str, str]]], None]) -> None:
        """The model writes the user's message (the Magpie prompt), then ``then(history + user)``."""
        def done(f: Finished) -> None:
            text = self.fmt.tok.decode([t for t in f.new_ids if t not in self.fmt.stop_ids]).strip()
            if f.stopped and text:
                then([*history, {"role": "user", "content": text}])
            else:
                self._end()

        req = Request(self.fmt.user_prefix(history), self.st.max_user_tokens, 1.0, _seed(self.st.seed, j, turn, 0),
                      on_done=done)
        if not self._submit(req):
            self._end()

    def _answer(self, j: int, history: list[dict[str, str]], greedy: bool, multi: bool, turn: int) -> None:
        prompt = self.fmt.answer_prefix(history)

        def done(f: Finished) -> None:
            if f.new_ids:
                self.accept(Sample(f.ids, len(prompt), greedy), f, j)
            if multi and turn == 0:
                text = self.fmt.tok.decode([t for t in f.new_ids if t not in self.fmt.stop_ids]).strip()
                follow = [*history, {"role": "assistant", "content": text}]
                self._user_turn(j, follow, 1, lambda h: self._answer(j, h, greedy, multi, 1))
            else:
                self._end()

        temp = 0.0 if greedy else self.st.temperature
        req = Request(prompt, self.st.max_answer_tokens, temp, _seed(self.st.seed, j, turn, 1), capture=True,
                      on_done=done)
        if not self._submit(req):
            self._end()


def generate_data_rows(model: Any, tokenizer: Any, cache: DataCache, *, token_budget: int, settings: GenSettings,
                       capture_layers: Sequence[int], prompt_list: Sequence[Sequence[dict[str, str]]] = (),
                       rows: int = 24, row_capacity: int = 1024, shard_samples: int = 64,
                       progress: Callable[[int, int], None] | None = None) -> list[Sample]:
    """Generate until the cache holds ``token_budget`` answer tokens; returns every cached sample.

    Deduplicated by content (and greedy answers by prompt), resumed from the shards on disk.
    """
    fmt = ChatFormat(tokenizer)
    samples = cache.samples()
    seen = {s.key for s in samples}
    seen_prompts = {_prompt_key(s) for s in samples if s.greedy}
    have = answer_tokens(samples)
    index = max(cache.shard_indices(), default=-1) + 1
    j = cache.next_conversation()
    pending = _Pending()

    def accept(sample: Sample, done: Finished, conversation: int) -> None:
        nonlocal have
        pkey = _prompt_key(sample)
        if sample.key in seen or (sample.greedy and pkey in seen_prompts):
            return
        seen.add(sample.key)
        if sample.greedy:
            seen_prompts.add(pkey)
        pending.add(sample, done, conversation)
        samples.append(sample)
        have += len(sample.ids) - sample.answer_start

    engine = RowEngine(model, rows=rows, row_capacity=row_capacity, stop_ids=sorted(fmt.stop_ids),
                       capture_layers=capture_layers)
    convs = _Conversations(engine, fmt, settings, prompt_list, accept)
    if progress:
        progress(have, token_budget)
    have0 = have

    def expected() -> float:
        """Answer tokens the live conversations will still add (a running mean per ended one), so
        the last conversations started are about the ones the budget needs: few rows idle at the end."""
        per = (have - have0) / convs.ended if convs.ended and have > have0 else 200.0
        return convs.live * per

    while have < token_budget or engine.busy:
        while have + expected() < token_budget and convs.live < rows + rows // 2:
            convs.start(j)
            j += 1
        if not engine.busy:
            continue
        engine.step()
        if len(pending.samples) >= shard_samples:
            pending.flush(cache, index)
            index += 1
        if progress:
            progress(min(have, token_budget), token_budget)
    if pending.samples:
        pending.flush(cache, index)
    return cache.samples()  # as stored: each with its shard reference


def _prompt_key(s: Sample) -> str:
    return hashlib.sha1(bytes(str(s.ids[:s.answer_start]), "ascii")).hexdigest()


def fill_features(model: Any, cache: DataCache, *, capture_layers: Sequence[int], rows: int = 48,
                  row_capacity: int = 1024, progress: Callable[[int, int], None] | None = None,
                  train_tokens: int | None = None) -> int:
    """Compute and store the features of every shard that has ids but no features (data carried
    from another machine, or written by the one-row path): each conversation is scored in one
    prefill on the rows engine. Returns the number of shards filled.

    ``capture_layers`` empty captures only the last hidden state and the argmax (all a Medusa head
    reads): the same forward, no EAGLE-3 features stored. ``train_tokens``: only the first shards
    (in the cache's order) until they hold that many training answer tokens, for a run that trains
    on no more (Medusa's ``--tokens``): the three shipped data folders are 545 shards, ~110 min
    of prefill on the 2-core VM, where a 3M-token run reads 230 of them."""
    names = FEATURE_FILES if capture_layers else HIDDEN_FILES
    todo, have = [], 0
    for i in cache.shard_indices():
        if train_tokens is not None and have >= train_tokens:
            break
        shard = cache.read(i)
        have += answer_tokens([s for s in shard if not s.held_out])
        if not cache.has_features(shard, names):
            todo.append(i)
    engine = RowEngine(model, rows=rows, row_capacity=row_capacity, stop_ids=(), capture_layers=capture_layers)
    for n, index in enumerate(todo):
        samples = cache.read(index)
        done: dict[int, Finished] = {}
        for j, s in enumerate(samples):
            if len(s.ids) > row_capacity:
                raise ValueError(f"shard {index}: a conversation of {len(s.ids)} tokens does not fit a row of "
                                 f"{row_capacity}")
            engine.submit(Request(s.ids, 0, 0.0, seed=0, capture=True, argmax_from=s.answer_start - 1,
                                  on_done=lambda f, j=j, done=done: done.__setitem__(j, f)))
        engine.run()
        parts = [done[j] for j in range(len(samples))]
        arrays = {"hidden": np.concatenate([f.hidden.view(torch.uint16).numpy() for f in parts]),
                  "argmax": np.concatenate([f.argmax.numpy() for f in parts])}
        if parts and parts[0].features is not None:
            arrays["features"] = np.concatenate([f.features.view(torch.uint16).numpy() for f in parts])
        cache.write_arrays(index, arrays)
        if progress:
            progress(n + 1, len(todo))
    return len(todo)
