"""A scripted session for tests and demos: the SessionAPI, with no model behind it.

``ScriptedSession`` replays scripted answers (lists of events, made by :func:`synthetic_answer` or
read from a trace) through the same generator API as the real session, and honours ``cancel()`` and
``update_config()`` at step boundaries, as the real one does. It also records how long its consumer
held each ``yield``, which is how the tests show that the UI never slows the engine thread down.

:func:`synthetic_answer` turns a text into realistic speculative steps: a branching draft tree per
step, an accepted path, rejected siblings, a bonus token, multi-token and multi-byte text, timing
and running statistics computed the way the engine defines them.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.answer_stats import RunningTally
from engine.config import ConfigError, SpecConfig
from engine.events import (
    Candidate,
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
from engine.tree import DraftTree
from specchat.tui.pending import PendingChange

Message = dict[str, str]

_PIECE = re.compile(r"\n|[ ]?[A-Za-z']+|[ ]?[0-9]+|[ ]?[^\sA-Za-z0-9]|[ ]+")
_DECOYS = (" the", " a", " of", " and", " to", " is", " in", ",", ".", " it", " that", " for", " on")


def tokenize(text: str) -> list[str]:
    """A toy tokenizer: words with their leading space, digits, punctuation, newlines."""
    pieces = _PIECE.findall(text)
    assert "".join(pieces) == text, "toy tokenizer must cover the text"
    return pieces


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) % 49_000 + 100


def _add(stats: RunningTally, tree: DraftTree, accepted: Sequence[int], committed: int, timing: StepTiming
         ) -> RunningStats:
    """One scripted step into ``stats`` (a ``RunningTally(wall_clock=False)``: a scripted answer is
    generated at once, so its time is its steps' timings). Every token a scripted step produces is
    committed: no stop token. Rounded, so a recorded demo trace stays readable and diffable."""
    stats.add_step(tree, accepted, committed, committed, timing)
    s = stats.snapshot()
    return dataclasses.replace(
        s, elapsed_s=round(s.elapsed_s, 6), tokens_per_s=round(s.tokens_per_s, 3), tau=round(s.tau, 4),
        accept_per_depth=tuple(round(a, 4) for a in s.accept_per_depth), draft_ms=round(s.draft_ms, 3),
        verify_ms=round(s.verify_ms, 3))


def _draft_probs(method: str) -> bool:
    """Whether ``method``'s drafts carry probabilities (its registration says; n-gram's do not)."""
    from engine.methods import get

    spec = get(method)
    return spec is None or spec.draft_probs


def _drafts_a_block(method: str) -> bool:
    """Whether ``method``'s drafter fills a block in one pass (its registration says)."""
    from engine.methods import get

    spec = get(method)
    return spec is not None and spec.block


Rows = tuple[tuple[Candidate, ...], ...]


def _block_rows(rng: random.Random, texts: list[str], truth: str, refused: int) -> tuple[list[float], Rows]:
    """A block drafter's chain (``texts``: root first) as its one pass saw it: each position's guess
    with two others, the confidence falling along the block; at the refused position the true piece
    (depth ``refused``) is sometimes the drafter's second guess. Returns the chain's probabilities
    (root first) and the rows."""
    probs = [1.0]
    rows = []
    for depth, text in enumerate(texts[1:], start=1):
        p = round(0.92 * 0.82 ** (depth - 1) * rng.uniform(0.85, 1.0), 4)
        probs.append(p)
        others = [d for d in _DECOYS if d not in (text, truth)]
        rng.shuffle(others)
        second = truth if depth == refused and truth and truth != text and rng.random() < 0.6 else others.pop()
        q = round(min(0.9 * p, (1 - p) * rng.uniform(0.3, 0.7)), 4)  # the rest of the probability, shared
        r = round(min(q, 1 - p - q) * rng.uniform(0.3, 0.8), 4)
        rows.append((Candidate(token_id(text), text, p), Candidate(token_id(second), second, q),
                     Candidate(token_id(others[0]), others[0], r)))
    return probs, tuple(rows)


def _split_multibyte(pieces: list[str]) -> list[str]:
    """Emulate byte-level tokens: a multi-byte character arrives as two tokens, the first adds ""."""
    out: list[str] = []
    for piece in pieces:
        if any(ord(ch) > 0x7FF for ch in piece):
            out.extend(["", piece])
        else:
            out.append(piece)
    return out


def synthetic_answer(
    text: str,
    *,
    seed: int = 0,
    method: str = "ngram",
    config: SpecConfig | None = None,
    model: str = "fake-model",
    prompt_tokens: int = 24,
    verify_ms: float = 18.0,
    draft_ms: float = 1.5,
    hot_swap: tuple[int, SpecConfig] | None = None,
) -> list[Event]:
    """Speculative steps producing ``text``: Started, Step..., Finished.

    ``hot_swap=(k, new_config)`` applies ``new_config`` before step k (a ConfigApplied event, and
    later steps carry config_version 1 and the new tree shape).
    """
    rng = random.Random(seed)
    config = config or SpecConfig(method=method)  # type: ignore[arg-type]
    pieces = _split_multibyte(tokenize(text))
    version = 0
    events: list[Event] = [
        Started(prompt_tokens=prompt_tokens, prefill_ms=round(verify_ms * 1.6, 3), config=config.to_dict(),
                model=model, drafter=config.method,
                # the shape of the verify timings below (1 + 1% per node), as the engine calibrates one
                cost_shape=tuple((n, round((1 + 0.01 * n) / 1.01, 4)) for n in (1, 2, 4, 8, 16, 32, 64)))
    ]
    stats = RunningTally(wall_clock=False)
    root, root_text = token_id("\n"), "\n"
    # step 0, as the engine reports it: the prefill's own next token, no draft
    first = CommittedToken(id=token_id(pieces[0]), origin="target", text=pieces[0])
    timing0 = StepTiming(verify_ms=round(verify_ms * 1.6, 3))
    tree0 = DraftTree.root_only(root)
    events.append(Step(index=0, tree=tree0, tree_text=(root_text,), accepted=(), bonus=first.id,
                       committed=(first,), text=first.text, timing=timing0,
                       stats=_add(stats, tree0, (), 1, timing0)))
    root, root_text = first.id, first.text
    running = events[-1].stats  # a one-token answer has no step after the prefill's
    pos = 1
    index = 1
    while pos < len(pieces):
        if hot_swap is not None and index == hot_swap[0]:
            config = hot_swap[1]
            version += 1
            events.append(ConfigApplied(version=version, config=config.to_dict()))
        block = _drafts_a_block(config.method)
        budget = max(1, config.num_draft_tokens - 1)
        # a block drafter's chain fills the block (its num_steps and top-k do not act on it)
        depth_cap = budget if block else max(1, config.num_steps)
        topk = 1 if block else max(1, config.eagle_topk)
        remaining = len(pieces) - pos
        # how many drafts the target will accept this step (0 .. depth_cap), biased towards 1..3
        accept = min(rng.choice((0, 1, 1, 2, 2, 3, 3, 4, 5, 5)), depth_cap, budget, remaining - 1)
        tokens, parents, probs, texts, path = _grow_tree(
            rng, root, root_text, pieces, pos, accept, depth_cap, topk, budget
        )
        committed_pieces = pieces[pos : pos + accept + 1]
        committed = tuple(
            CommittedToken(id=token_id(p), origin="draft" if i < accept else "target", text=p)
            for i, p in enumerate(committed_pieces)
        )
        has_probs = _draft_probs(config.method)
        if not has_probs:
            probs = [1.0] * len(probs)  # n-gram lookup has no distribution (DraftTree docs)
        rows: Rows = ()
        if block:
            probs, rows = _block_rows(rng, texts, pieces[pos + accept] if pos + accept < len(pieces) else "",
                                      accept + 1)
        tree = DraftTree(tuple(tokens), tuple(parents), tuple(probs), has_probs=has_probs)
        timing = StepTiming(
            draft_ms=round(draft_ms * (0.6 + 0.1 * tree.num_drafts) * rng.uniform(0.9, 1.1), 3),
            verify_ms=round(verify_ms * (1 + 0.01 * len(tree)) * rng.uniform(0.95, 1.05), 3),
            other_ms=round(rng.uniform(0.2, 0.5), 3),
        )
        running = _add(stats, tree, path, len(committed), timing)
        events.append(
            Step(
                index=index,
                tree=tree,
                tree_text=tuple(texts),
                accepted=tuple(path),
                bonus=committed[-1].id,
                committed=committed,
                text="".join(c.text for c in committed),
                timing=timing,
                stats=running,
                config_version=version,
                block=rows,
            )
        )
        root, root_text = committed[-1].id, committed[-1].text
        pos += len(committed)
        index += 1
    events.append(Finished(reason="stop", text="".join(pieces), tokens=stats.tokens, stats=running))
    return events


def _grow_tree(
    rng: random.Random,
    root: int,
    root_text: str,
    pieces: list[str],
    pos: int,
    accept: int,
    depth_cap: int,
    topk: int,
    budget: int,
) -> tuple[list[int], list[int], list[float], list[str], list[int]]:
    """A tree whose main branch carries ``accept`` correct drafts, then a wrong guess and its subtree.

    Built level by level, so parents precede children. Siblings never hold the true next piece, so
    a greedy verifier would pick exactly the main branch's first ``accept`` nodes.
    """
    tokens, parents, probs, texts = [root], [-1], [1.0], [root_text]
    path: list[int] = []
    frontier = [0]  # nodes of the previous level
    main = 0  # the drafter's favourite node at the previous level
    for depth in range(depth_cap):
        truth = pieces[pos + depth] if pos + depth < len(pieces) else None
        level: list[int] = []
        new_main = -1
        for parent in frontier:
            if parent == main:
                width = min(topk, 1 + (rng.random() < 0.7) + (rng.random() < 0.35))
            else:
                width = min(topk, int(rng.random() < 0.45))
            used: set[str] = set()
            for k in range(width):
                favourite = parent == main and k == 0
                # keep room for the main branch's remaining accepted drafts
                reserve = 0 if favourite else max(0, accept - depth - 1)
                if len(tokens) - 1 + reserve >= budget:
                    break
                if favourite and depth < accept:
                    piece, p = pieces[pos + depth], rng.uniform(0.55, 0.97)
                elif favourite:
                    piece = rng.choice([d for d in _DECOYS if d != truth])
                    p = rng.uniform(0.35, 0.7)
                else:
                    piece = rng.choice([d for d in _DECOYS if d not in used and d != truth])
                    p = rng.uniform(0.02, 0.25)
                used.add(piece)
                tokens.append(token_id(piece))
                parents.append(parent)
                probs.append(round(p, 4))
                texts.append(piece)
                node = len(tokens) - 1
                level.append(node)
                if favourite:
                    new_main = node
                    if depth < accept:
                        path.append(node)
        if not level:
            break
        frontier, main = level, new_main
    assert len(path) == accept, "the main branch must hold every accepted draft"
    return tokens, parents, probs, texts, path


def baseline_answer(answer: Sequence[Event], *, verify_ms: float = 16.0, seed: int = 1) -> list[Event]:
    """The same text decoded with no drafter: one target token per step, a root-only tree."""
    rng = random.Random(seed)
    tokens = [c for ev in answer if isinstance(ev, Step) for c in ev.committed]
    started = next((ev for ev in answer if isinstance(ev, Started)), Started())
    cfg = dict(started.config)
    cfg["method"] = "none"
    out: list[Event] = [dataclasses.replace(started, config=cfg, drafter="none")]
    stats = RunningTally(wall_clock=False)
    root, root_text = token_id("\n"), "\n"
    running = RunningStats()
    for i, tok in enumerate(tokens):
        tree = DraftTree.root_only(root)
        timing = StepTiming(0.0, round(verify_ms * rng.uniform(0.95, 1.05), 3), round(rng.uniform(0.1, 0.3), 3))
        running = _add(stats, tree, (), 1, timing)
        c = CommittedToken(id=tok.id, origin="target", text=tok.text)
        out.append(
            Step(index=i, tree=tree, tree_text=(root_text,), accepted=(), bonus=tok.id, committed=(c,),
                 text=tok.text, timing=timing, stats=running)
        )
        root, root_text = tok.id, tok.text
    text = "".join(t.text for t in tokens)
    out.append(Finished(reason="stop", text=text, tokens=len(tokens), stats=running))
    return out


DEMO_ANSWERS = (
    "Speculative decoding lets a small, fast drafter guess several tokens ahead. The big model then "
    "checks every guess in one forward pass and keeps the longest prefix it agrees with, plus one "
    "token of its own.\n\nThe output is exactly what the big model would have written alone — just "
    "faster. Café au lait ☕ costs the same either way.",
    "A draft tree holds several guesses at once: at each level the drafter keeps its top-k "
    "candidates, so one wrong guess does not waste the whole draft.\n\n- num_steps: how deep\n"
    "- eagle_topk: how wide\n- num_draft_tokens: how many in total",
    "Tau is the mean number of tokens each target forward produces. With tau = 3 the big model runs "
    "a third as often, and the answer arrives about that much sooner when verifying is cheap.",
)


def demo_answers(config: SpecConfig | None = None) -> list[list[Event]]:
    config = config or SpecConfig(method="ngram")
    return [synthetic_answer(text, seed=i, method=config.method, config=config) for i, text in enumerate(DEMO_ANSWERS)]


def split_answers(events: Sequence[Any]) -> list[list[Event]]:
    """Group a flat event list (e.g. a trace's records) into answers: Started ... Finished."""
    answers: list[list[Event]] = []
    current: list[Event] | None = None
    for ev in events:
        if isinstance(ev, Started):
            current = [ev]
            answers.append(current)
        elif current is not None and isinstance(ev, (Step, ConfigApplied, Finished, PrefillProgress)):
            current.append(ev)
            if isinstance(ev, Finished):
                current = None
    return answers


class ScriptedSession:
    """A :class:`~specchat.tui.host_api.HostedSession` over scripted answers; ``chat`` cycles through them
    (tests/tui/test_host_api.py checks it has every member the real session has, with its signature).

    ``step_delay``: seconds to sleep per step (a stand-in for GPU time); ``None`` uses each step's
    recorded timing scaled by ``time_scale``.
    """

    def __init__(
        self,
        answers: Sequence[Sequence[Event]] | None = None,
        *,
        config: SpecConfig | None = None,
        model_name: str = "fake-model",
        step_delay: float | None = 0.0,
        time_scale: float = 1.0,
        refuse_methods: dict[str, str] | None = None,
        precision: str = "exact",
    ) -> None:
        config = config or SpecConfig(method="ngram")
        self._answers = [list(a) for a in (answers or demo_answers(config))]
        self.model_name = model_name
        self.step_delay = step_delay
        self.time_scale = time_scale
        # methods this fake engine refuses, as the real one does without a draft model: method -> message
        self.refuse_methods = dict(refuse_methods or {})
        # like the engine: hot-swapped settings wait for the next step, a precision for the answer's end
        self._version = 0
        self._settings = PendingChange(config, self._count_version)
        self._precision = PendingChange(precision)  # what its Started events report
        self._cancel = threading.Event()
        self._messages: list[Message] = []
        self._turn = 0
        # instrumentation: seconds the consumer held each yield, and the thread that consumed
        self.yield_gaps: list[float] = []
        self.threads: set[int] = set()
        self.runs: list[float] = []  # seconds from the first to the last event of each answer
        self.calls: list[tuple[str, str]] = []
        self._started = False

    @classmethod
    def from_trace(cls, path: str, **kwargs: Any) -> ScriptedSession:
        from specchat.tui.trace import read_trace

        header, records = read_trace(path)
        cfg = SpecConfig.from_dict(header.get("config") or {}) if header.get("config") else None
        kwargs.setdefault("model_name", header.get("model") or "trace")
        return cls(split_answers(records), config=cfg, **kwargs)

    # SessionAPI ----------------------------------------------------------------------------
    @property
    def config(self) -> SpecConfig:
        return self._settings.value

    @property
    def pending_config(self) -> SpecConfig | None:
        return self._settings.pending

    @property
    def precision(self) -> str:
        return self._precision.value

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)

    def cancel(self) -> None:
        self._cancel.set()

    def update_config(self, config: SpecConfig) -> None:
        if not isinstance(config, SpecConfig):
            raise ConfigError(f"expected a SpecConfig, got {type(config).__name__}")
        config.validate()
        if config.method in self.refuse_methods:
            raise ConfigError(self.refuse_methods[config.method])
        self._settings.ask(config)  # like the engine: an idle session applies at once, without an event

    def check_precision(self, precision: str) -> None:
        if precision not in ("exact", "fast"):
            raise ConfigError(f"precision is exact or fast, not {precision!r}")

    def set_precision(self, precision: str) -> bool:
        self.check_precision(precision)
        return self._precision.ask(precision)  # like the engine: at once when idle, else when the answer ends

    def reset(self) -> None:
        self._messages.clear()
        self._turn = 0

    def reread(self) -> None:
        """Nothing to read again: a scripted session keeps no cache."""

    def rewind_cache(self, length: int) -> None:
        """Nothing to cut back: a scripted session keeps no cache (compare runs start alike anyway)."""

    def warm_up(self) -> None:
        """Nothing to warm: a scripted session pays no first-answer costs."""

    def restore(self, messages: list[Message], answers: Sequence[Sequence[int] | None] | None = None) -> None:
        self.reset()
        self._messages = [dict(m) for m in messages]

    @property
    def methods(self) -> tuple[str, ...]:
        """What this fake engine can run (the refused ones left out, like a session without a draft)."""
        from engine.methods import names

        return tuple(m for m in names() if m not in self.refuse_methods)

    def chat(self, user_text: str) -> Iterator[Event]:
        self.calls.append(("chat", user_text))
        self._messages.append({"role": "user", "content": user_text})
        answer = self._answers[self._turn % len(self._answers)]
        self._turn += 1
        text_parts: list[str] = []
        self._started = False
        yield from self._play(answer, None, text_parts)
        if not self._started:  # refused or cancelled in the prefill: as before the turn, like the engine
            self._messages.pop()
            return
        self._messages.append({"role": "assistant", "content": "".join(text_parts)})

    def generate(self, messages: list[Message], config: SpecConfig | None = None) -> Iterator[Event]:
        self.calls.append(("generate", config.method if config else "session"))
        answer = self._answers[self._turn % len(self._answers)]
        if config is not None and config.method == "none":
            answer = baseline_answer(answer)
        elif config is not None and isinstance(answer[0], Started) and config.method != answer[0].drafter:
            # another method (compare A vs B): the same text, drafted with that method's own trees
            seed = sum(map(ord, config.method))
            answer = synthetic_answer(getattr(answer[-1], "text", ""), seed=seed, config=config)
        yield from self._play(answer, config, [])

    # the step loop ---------------------------------------------------------------------------
    def _count_version(self, _: SpecConfig) -> None:
        self._version += 1

    def _apply_pending(self) -> ConfigApplied | None:
        applied = self._settings.take()
        if applied is None:
            return None
        return ConfigApplied(version=self._version, config=applied.to_dict())

    def _yield(self, ev: Event) -> Iterator[Event]:
        self.threads.add(threading.get_ident())
        t0 = time.perf_counter()
        yield ev
        self.yield_gaps.append(time.perf_counter() - t0)

    def _play(self, answer: Sequence[Event], config: SpecConfig | None, text_parts: list[str]) -> Iterator[Event]:
        self._settings.begin()
        self._precision.begin()
        t0 = time.perf_counter()
        try:
            yield from self._play_steps(answer, config, text_parts)
            self.runs.append(time.perf_counter() - t0)
        finally:
            self._settings.end()
            self._precision.end()

    def _play_steps(
        self, answer: Sequence[Event], config: SpecConfig | None, text_parts: list[str]
    ) -> Iterator[Event]:
        self._cancel.clear()
        fixed = config is not None  # generate() with an explicit config ignores hot swaps
        tokens = 0
        stats = RunningStats()
        for ev in answer:
            if isinstance(ev, PrefillProgress):
                if self._cancel.is_set():  # like the engine: cancel acts between prefill chunks
                    yield from self._yield(Finished(reason="cancelled", text="", tokens=0, stats=stats))
                    return
                delay = self.step_delay if self.step_delay is not None else ev.elapsed_ms / 1000 * self.time_scale
                if delay > 0:
                    time.sleep(delay)
                yield from self._yield(ev)
            elif isinstance(ev, Started):
                self._started = True
                cfg = (config or self._settings.value).to_dict()
                yield from self._yield(dataclasses.replace(ev, config=cfg, model=self.model_name,
                                                           precision=self.precision))
            elif isinstance(ev, Step):
                if self._cancel.is_set():
                    yield from self._yield(
                        Finished(reason="cancelled", text="".join(text_parts), tokens=tokens, stats=stats)
                    )
                    return
                if not fixed:
                    applied = self._apply_pending()
                    if applied is not None:
                        yield from self._yield(applied)
                self._sleep(ev)
                text_parts.append(ev.text)
                tokens += len(ev.committed)
                stats = ev.stats
                yield from self._yield(dataclasses.replace(ev, config_version=self._version))
            elif isinstance(ev, Finished):
                yield from self._yield(ev)
                return
        yield from self._yield(Finished(reason="stop", text="".join(text_parts), tokens=tokens, stats=stats))

    def _sleep(self, step: Step) -> None:
        delay = self.step_delay if self.step_delay is not None else step.timing.total_ms / 1000 * self.time_scale
        if delay > 0:
            time.sleep(delay)


@dataclass(frozen=True)
class ScriptedLoader:
    """A picklable session factory for scripted sessions (``--fake``, and tests of the engine process).

    ``load_s`` spreads four loading stages over that many seconds; ``fail`` makes loading raise
    that message, and ``crash`` makes the process exit hard (tests of a dying engine).
    """

    config: SpecConfig
    step_delay: float | None = None
    time_scale: float = 1.0
    load_s: float = 0.6
    refuse_methods: tuple[tuple[str, str], ...] = ()
    fail: str = ""
    crash: bool = False

    def __call__(self, progress: Callable[[str, int, int], None]) -> ScriptedSession:
        stages = ("resolving the model", "reading the tokenizer", "loading weights", "warming up")
        for i, stage in enumerate(stages, 1):
            progress(stage, i, len(stages))
            time.sleep(self.load_s / len(stages))
        if self.crash:
            os._exit(3)
        if self.fail:
            raise RuntimeError(self.fail)
        return ScriptedSession(demo_answers(self.config), config=self.config, model_name="fake-model",
                               step_delay=self.step_delay, time_scale=self.time_scale,
                               refuse_methods=dict(self.refuse_methods))
