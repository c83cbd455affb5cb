"""Many independent generations in one forward: the engine behind ``train-draft``'s data.

Why: a one-token forward of a small model on a CPU leaves most of the arithmetic units idle
(the weights stream once for one row), so one conversation at a time wastes the machine. Here a
fixed number of *rows* share one KV cache tensor, each owning a range of its slots; every step
runs one forward over the next prompt chunk of newly admitted requests and the last token of
every decoding row (:meth:`LlamaModel.forward_rows`), so the matrix products see many rows.
A finished row's slots go to the next waiting request at once (continuous batching).

Exactness: the rows forward gives every token the logits a one-sequence forward gives it, and
each request samples from its own generator, so a request's output does not depend on what
else is in the batch (tests/test_data_engine.py checks it against the one-row path).

The target's EAGLE features (the residual streams entering the captured layers, the final
normed hidden state) and its full-vocabulary argmax are kept for every position of a request
that asks for them, in bf16, so training never runs the target again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from engine.kernels.native import row_argmax
from engine.models.kv_cache import KVCache
from engine.train.data import draw_rows


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    temperature: float  # 0: greedy
    seed: int  # the request's own sampling generator (batch-independent results)
    capture: bool = False  # keep features / hidden / argmax of every position
    on_done: Callable[[Finished], None] | None = None
    tag: object = None  # the caller's bookkeeping
    # max_new_tokens 0 scores a finished conversation instead: no sampling, the argmax after each
    # position from argmax_from on (to the second-to-last) kept with the features
    argmax_from: int | None = None

    @property
    def scoring(self) -> bool:
        return self.max_new_tokens == 0


@dataclass
class Finished:
    request: Request
    new_ids: list[int]
    stopped: bool  # ended at a stop token (kept in new_ids)
    features: torch.Tensor | None = None  # [n, F] bf16 for the n = len(prompt) + len(new_ids) tokens
    hidden: torch.Tensor | None = None  # [n, H] bf16, final norm applied
    argmax: torch.Tensor | None = None  # [n] int32: target argmax after each token (-1: not computed)

    @property
    def ids(self) -> list[int]:
        return [*self.request.prompt, *self.new_ids]


@dataclass
class _Row:
    req: Request
    gen: torch.Generator
    done_prompt: int = 0  # prompt tokens already in the cache
    new: list[int] = field(default_factory=list)
    argmax: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens whose K/V is in the cache."""
        return self.done_prompt + max(len(self.new) - 1, 0)


class RowEngine:
    """Continuous batching of requests over ``rows`` cache rows of ``row_capacity`` slots each."""

    def __init__(self, model, *, rows: int, row_capacity: int, stop_ids: Sequence[int],
                 capture_layers: Sequence[int] = (), prefill_tokens: int = 256) -> None:
        if not model.runs_rows:
            raise RuntimeError("the data engine needs our native CPU decoder")
        c = model.config
        self.model = model
        self.rows = rows
        self.cap = row_capacity
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.capture_layers = tuple(capture_layers)
        # the forward captures each layer once, in layer order; a head may ask for one twice
        unique = sorted(set(self.capture_layers))
        self._aux_order = [unique.index(i) for i in self.capture_layers]
        self.prefill_tokens = prefill_tokens
        self.cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, rows * row_capacity, dtype=model.kv_dtype)
        feat = c.hidden_size * len(self.capture_layers)
        self._feat = torch.zeros(rows, row_capacity, feat, dtype=torch.bfloat16) if feat else None
        self._hid = torch.zeros(rows, row_capacity, c.hidden_size, dtype=torch.bfloat16)
        self._slots: list[_Row | None] = [None] * rows
        self._waiting: deque[Request] = deque()
        self.forwards = 0
        self.tokens_run = 0

    # ------------------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        if not req.prompt:
            raise ValueError("a request needs at least one prompt token")
        if len(req.prompt) + req.max_new_tokens > self.cap:
            raise ValueError(f"a request of {len(req.prompt)} + {req.max_new_tokens} tokens does not fit a row of "
                             f"{self.cap}")
        self._waiting.append(req)

    @property
    def busy(self) -> bool:
        return bool(self._waiting) or any(r is not None for r in self._slots)

    def run(self) -> None:
        """Step until every submitted request (and any its callbacks submit) has finished."""
        while self.busy:
            self.step()

    def step(self) -> list[Finished]:
        """Admit, run one forward over every row's next tokens, sample, retire finished rows."""
        self._admit()
        tokens, seg, slots, owners, want = self._gather()
        at = torch.tensor([i for i, _, _ in want], dtype=torch.long)
        out = self.model.forward_rows(torch.tensor(tokens), self.cache, torch.tensor(seg), torch.tensor(slots),
                                      logits_at=at, capture_layers=sorted(set(self.capture_layers)))
        self.forwards += 1
        self.tokens_run += len(tokens)
        self._keep_features(out, owners, slots)
        finished = []
        for (_, r, sample), best, nxt in zip(want, row_argmax(out.logits), self._sample(out.logits, want),
                                             strict=True):
            row = self._slots[r]
            assert row is not None
            row.argmax.append(best)
            if not sample:
                continue
            nxt = best if nxt is None else nxt
            row.new.append(nxt)
            if nxt in self.stop_ids or len(row.new) >= row.req.max_new_tokens:
                finished.append(self._retire(r, stopped=nxt in self.stop_ids))
        for r, row in enumerate(self._slots):
            if row is not None and row.req.scoring and row.done_prompt == len(row.req.prompt):
                finished.append(self._retire(r, stopped=False))
        for f in finished:
            if f.request.on_done is not None:
                f.request.on_done(f)
        return finished

    # ------------------------------------------------------------------------------------------
    def _admit(self) -> None:
        for r in range(self.rows):
            if self._slots[r] is None and self._waiting:
                req = self._waiting.popleft()
                self._slots[r] = _Row(req, torch.Generator().manual_seed(req.seed))

    def _gather(self) -> tuple[list[int], list[int], list[int], list[int], list[tuple[int, int, bool]]]:
        """This step's tokens: one per decoding row, then prompt chunks within the prefill budget.
        Returns tokens, seg, slots, the row of each token, and (token index, row, sample) for the
        tokens whose logits are wanted: a decoding row's, the last prompt token of a row that
        then samples, and a scored conversation's positions from its argmax_from on."""
        tokens, seg, slots, owners, want = [], [], [], [], []
        budget = self.prefill_tokens
        for r, row in enumerate(self._slots):
            if row is None or row.done_prompt < len(row.req.prompt):
                continue
            want.append((len(tokens), r, True))
            tokens.append(row.new[-1])
            seg.append(r * self.cap)
            slots.append(r * self.cap + row.length)
            owners.append(r)
        for r, row in enumerate(self._slots):
            if row is None or row.done_prompt >= len(row.req.prompt) or budget <= 0:
                continue
            start, req = row.done_prompt, row.req
            chunk = req.prompt[start:start + budget]
            if req.scoring and req.argmax_from is not None:
                want += [(len(tokens) + i, r, False) for i in range(len(chunk))
                         if req.argmax_from <= start + i < len(req.prompt) - 1]
            budget -= len(chunk)
            tokens += chunk
            seg += [r * self.cap] * len(chunk)
            slots += [r * self.cap + start + i for i in range(len(chunk))]
            owners += [r] * len(chunk)
            row.done_prompt += len(chunk)
            if row.done_prompt == len(req.prompt) and not req.scoring:
                want.append((len(tokens) - 1, r, True))
        return tokens, seg, slots, owners, want

    def _keep_features(self, out, owners: list[int], slots: list[int]) -> None:
        rows = torch.tensor(owners)
        pos = torch.tensor(slots) - rows * self.cap
        self._hid[rows, pos] = out.hidden.to(torch.bfloat16)
        if self._feat is not None:
            self._feat[rows, pos] = torch.cat([out.aux[i] for i in self._aux_order], dim=-1).to(torch.bfloat16)

    def _sample(self, logits: torch.Tensor, want: list[tuple[int, int, bool]]) -> list[int | None]:
        """The one-row path's rule for each wanted row: None (take the argmax) at temperature 0 or
        when not sampling, else :func:`~engine.train.data.draw`, all sampled rows at once."""
        rows = [(j, self._slots[r]) for j, (_, r, sample) in enumerate(want)
                if sample and self._slots[r].req.temperature > 0]
        out: list[int | None] = [None] * len(want)
        if rows:
            idx = torch.tensor([j for j, _ in rows])
            picks = draw_rows(logits[idx], [row.req.temperature for _, row in rows], [row.gen for _, row in rows])
            for (j, _), pick in zip(rows, picks, strict=True):
                out[j] = pick
        return out

    def _retire(self, r: int, *, stopped: bool) -> Finished:
        row = self._slots[r]
        assert row is not None
        self._slots[r] = None
        done = Finished(row.req, row.new, stopped)
        if row.req.capture:
            n = len(row.req.prompt) + len(row.new)
            have = row.length  # a sampled last token never ran
            hid = torch.zeros(n, self._hid.shape[-1], dtype=torch.bfloat16)
            hid[:have] = self._hid[r, :have]
            done.hidden = hid
            if self._feat is not None:
                feat = torch.zeros(n, self._feat.shape[-1], dtype=torch.bfloat16)
                feat[:have] = self._feat[r, :have]
                done.features = feat
            arg = torch.full((n,), -1, dtype=torch.int32)
            first = row.req.argmax_from if row.req.scoring else len(row.req.prompt) - 1
            if row.argmax:
                arg[first:first + len(row.argmax)] = torch.tensor(row.argmax, dtype=torch.int32)
            done.argmax = arg
        return done
