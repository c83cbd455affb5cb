"""A paused drafter costs nothing (issue 57, item 3): while the adaptive budget pauses drafting, a step
runs what a plain step runs, and the drafter catches up only when drafting resumes, in one forward.

The gate's verdicts are scripted here (``DraftGate.should_draft`` replaced by a list of answers), so
the pauses fall where a test puts them, whatever the machine's timings; the forwards of the target
and of each drafter's model are counted per step. Each ``Step`` event describes the step run just
before it, so what was recorded between two events belongs to the second one's step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_eagle import bundle as eagle_bundle
from test_eagle import target
from test_medusa import bundle as medusa_bundle
from tiny import TinyTokenizer, our_model

from engine.adaptive import DraftGate
from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.ngram import NgramDrafter
from engine.drafters.ngram_trie import NgramTrie
from engine.drafters.standalone import StandaloneDrafter
from engine.events import Step
from engine.session import Session

PROMPT = [1, 5, 9, 14, 5, 9, 14, 5, 9]
# drafted, a pause of five, drafted twice, a pause of two, then drafting on
PATTERN = [True, False, False, False, False, False, True, True, False, False, True]


@functools.cache
def draft_model():
    return our_model("llama", 1, num_hidden_layers=1)[0]


def scripted(monkeypatch: pytest.MonkeyPatch, answers: Iterable[bool]) -> None:
    """The gate drafts or pauses as ``answers`` say, step by step, then drafts."""
    it: Iterator[bool] = iter(answers)
    monkeypatch.setattr(DraftGate, "should_draft", lambda self: next(it, True))


def record(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, log: list, describe: Callable[..., Any]) -> None:
    """Append ``describe(*args, **kwargs)`` to ``log`` on every call of ``owner.name``."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log.append(describe(*args, **kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def target_call(tokens: Any, cache: Any, **kwargs: Any) -> tuple[int, tuple[str, ...]]:
    """A target forward as its shape: rows, and the arguments beyond the tokens and the cache."""
    return tokens.shape[0], tuple(sorted(kwargs))


def per_step(session: Session, events: Iterable[Any], *logs: list) -> list[tuple[Step, int, list[list]]]:
    """Each Step with the cached tokens before the step it describes and what each log recorded in it."""
    out: list[tuple[Step, int, list[list]]] = []
    marks, cached = [0] * len(logs), 0
    for event in events:
        if isinstance(event, Step):
            now = [len(log) for log in logs]
            out.append((event, cached, [log[m:n] for log, m, n in zip(logs, marks, now, strict=True)]))
            marks, cached = now, len(session._cached)
    return out


def tokens_of(steps: list[tuple[Step, int, list[list]]]) -> list[int]:
    return [c.id for e, _, _ in steps for c in e.committed]


def plain_steps(monkeypatch: pytest.MonkeyPatch, max_new: int) -> list[tuple[Step, int, list[list]]]:
    log: list = []
    plain = Session(target(), TinyTokenizer(stop_ids=frozenset()), SpecConfig(max_new_tokens=max_new),
                    drafters={"none": NoDrafter})
    record(monkeypatch, target(), "forward", log, target_call)
    steps = per_step(plain, plain.generate_ids(PROMPT), log)
    monkeypatch.undo()
    return steps


def paused_runs(steps: list[tuple[Step, int, list[list]]]) -> Iterator[tuple[int, tuple[Step, int, list[list]]]]:
    """Each drafted step after the first, with the number of paused steps just before it."""
    paused = 0
    for item in steps[2:]:
        if item[0].draft_paused:
            paused += 1
            continue
        yield paused, item
        paused = 0


def test_a_paused_standalone_drafter_runs_nothing_and_catches_up_in_one_forward(monkeypatch) -> None:
    plain = plain_steps(monkeypatch, 40)
    drafter = StandaloneDrafter(draft_model(), 97)
    config = SpecConfig(method="standalone", eagle_topk=1, num_steps=3, num_draft_tokens=4, max_new_tokens=40)
    spec = Session(target(), TinyTokenizer(stop_ids=frozenset()), config,
                   drafters={"none": NoDrafter, "standalone": lambda: drafter})
    calls: list = []
    drafts: list = []
    record(monkeypatch, target(), "forward", calls, target_call)
    record(monkeypatch, drafter.model, "forward",
           drafts, lambda tokens, cache, **kw: (tokens.shape[0], cache.length, kw.get("prefix_mask") is None))
    scripted(monkeypatch, PATTERN)
    steps = per_step(spec, spec.generate_ids(PROMPT), calls, drafts)
    assert tokens_of(steps) == tokens_of(plain)
    assert sum(e.draft_paused for e, _, _ in steps) == PATTERN.count(False)
    for (event, _, (target_calls, draft_calls)), (_, _, (plain_calls,)) in zip(steps[1:], plain[1:], strict=False):
        if event.draft_paused:  # exactly a plain step: one forward of the root, nothing else, no draft model
            assert target_calls == plain_calls == [(1, ())] and draft_calls == []
    resumed = 0
    for paused, (event, cached, (_, draft_calls)) in paused_runs(steps):
        rows, at, _ = draft_calls[0]
        # the catch-up: every token the draft cache lacks (the paused ones among them) and the root, one forward
        assert rows == cached - at + 1 and rows >= paused + 1
        # then a chain's levels, each a plain decoding step of the draft model (no prefix mask)
        assert all(r == 1 and plain_path for r, _, plain_path in draft_calls[1:])
        assert 1 <= len(draft_calls) <= max(event.draft_levels, 1)  # the stop rule may end it early
        resumed += paused > 0
    assert resumed == 2  # both pauses were followed by a drafted step


def test_a_paused_eagle_head_runs_nothing_while_the_target_keeps_its_features(monkeypatch) -> None:
    """What a paused EAGLE step adds to a plain one is the target's features (a copy of a few rows the
    forward computes anyway), which the head's catch-up reads; without them resuming would cost a
    second target forward over the paused tokens (Conversation.catch_up)."""
    b = eagle_bundle("eagle3", "specforge")
    drafter = b.factory()
    config = SpecConfig(method="eagle3", eagle_topk=1, num_steps=3, num_draft_tokens=4, max_new_tokens=40)
    spec = Session(target(), TinyTokenizer(stop_ids=frozenset()), config,
                   drafters={"none": NoDrafter, "eagle3": lambda: drafter}, features=b.features)
    calls: list = []
    runs: list = []
    record(monkeypatch, target(), "forward", calls, target_call)
    record(monkeypatch, drafter.head, "run", runs, lambda tokens, *a, **kw: len(tokens))
    scripted(monkeypatch, PATTERN)
    steps = per_step(spec, spec.generate_ids(PROMPT), calls, runs)
    assert tokens_of(steps) == tokens_of(plain_steps(monkeypatch, 40))
    for event, _, (target_calls, head_runs) in steps[1:]:
        if event.draft_paused:
            assert head_runs == [] and target_calls == [(1, ("capture_layers", "return_hidden"))]
    for paused, (_, _, (_, head_runs)) in paused_runs(steps):
        assert head_runs[0] >= paused + 1  # the head's entries for every paused position, in one call


def test_a_paused_medusa_drafter_runs_no_head(monkeypatch) -> None:
    b = medusa_bundle("medusa")
    drafter = b.factory()
    config = SpecConfig(method="medusa", num_steps=3, eagle_topk=1, num_draft_tokens=4, max_new_tokens=40)
    spec = Session(target(), TinyTokenizer(stop_ids=frozenset()), config,
                   drafters={"none": NoDrafter, "medusa": lambda: drafter}, features=b.features)
    calls: list = []
    heads: list = []
    record(monkeypatch, target(), "forward", calls, target_call)
    record(monkeypatch, drafter.heads, "logits", heads, lambda hidden, n: n)
    scripted(monkeypatch, PATTERN)
    steps = per_step(spec, spec.generate_ids(PROMPT), calls, heads)
    assert tokens_of(steps) == tokens_of(plain_steps(monkeypatch, 40))
    for event, _, (target_calls, head_calls) in steps[1:]:
        if event.draft_paused:
            assert head_calls == [] and target_calls == [(1, ("capture_layers", "return_hidden"))]
        else:
            assert len(head_calls) == 1  # every level in one call, from the last committed hidden state


def test_a_paused_ngram_drafter_inserts_nothing_until_it_drafts_again(monkeypatch) -> None:
    config = SpecConfig(method="ngram", num_draft_tokens=4, max_new_tokens=40, ngram_corpus=False)
    spec = Session(target(), TinyTokenizer(stop_ids=frozenset()), config,
                   drafters={"none": NoDrafter, "ngram": NgramDrafter})
    calls: list = []
    inserts: list = []
    record(monkeypatch, target(), "forward", calls, target_call)
    record(monkeypatch, NgramTrie, "extend", inserts, lambda self, tokens: len(tokens))
    scripted(monkeypatch, PATTERN)
    steps = per_step(spec, spec.generate_ids(PROMPT), calls, inserts)
    assert tokens_of(steps) == tokens_of(plain_steps(monkeypatch, 40))
    for event, _, (target_calls, step_inserts) in steps[1:]:
        if event.draft_paused:
            assert step_inserts == [] and target_calls == [(1, ())]
    for paused, (_, _, (_, step_inserts)) in paused_runs(steps):
        assert len(step_inserts) == 1 and step_inserts[0] >= paused  # the paused tokens, in one insertion


def _session(method: str) -> Session:
    config = SpecConfig(method=method, num_steps=3, num_draft_tokens=6, eagle_topk=2, max_new_tokens=30)
    drafters: dict[str, Any] = {"none": NoDrafter}
    features = None
    if method == "standalone":
        drafters["standalone"] = lambda: StandaloneDrafter(draft_model(), 97)
    elif method == "ngram":
        drafters["ngram"] = NgramDrafter
    else:
        b = eagle_bundle("eagle3", "specforge") if method == "eagle3" else medusa_bundle("medusa")
        drafters[method], features = b.factory, b.features
    return Session(target(), TinyTokenizer(), config, drafters=drafters, features=features)


@functools.cache
def _baseline(prompt: tuple[int, ...]) -> list[int]:
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=30), drafters={"none": NoDrafter})
    return [c.id for e in plain.generate_ids(list(prompt)) if isinstance(e, Step) for c in e.committed]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["standalone", "ngram", "eagle3", "medusa"]),
       pattern=st.lists(st.booleans(), max_size=30),
       prompt=st.lists(st.integers(3, 96), min_size=1, max_size=12))
def test_greedy_output_is_the_baselines_whatever_the_pauses(monkeypatch, method, pattern, prompt) -> None:
    """Pauses and resumes anywhere (a tree of top-k 2, the budget on): the answer is the baseline's."""
    with monkeypatch.context() as patch:
        scripted(patch, pattern)
        events = _session(method).generate_ids(prompt)
        assert [c.id for e in events if isinstance(e, Step) for c in e.committed] == _baseline(tuple(prompt))
