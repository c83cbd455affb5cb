"""A drafter's CUDA graphs are captured once per draft, not once per prompt (engine/gpu/graphs.py,
DraftMemory), on the fake CUDA device (tests/gpu/fake_cuda.py counts every capture).

The session makes its drafters afresh for every conversation (the bench resets before each prompt),
and a drafter's graphs are captured per draft cache address: before DraftMemory every prompt
captured them all again (on a GPU tens of ms to seconds each, inside the bench's timed rows). Here:
the graphs survive a reset and serve the next prompts; ``Session.capture_graphs`` captures every
graph the configured methods replay, so neither a new prompt nor a hot-swap captures mid-answer;
another draft releases the old one's graphs; the answers stay the baseline's throughout.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import DraftBundle, load_draft
from engine.events import ConfigApplied, Finished, Step
from engine.session import Session
from tests.gpu.fake_cuda import fake_cuda
from tests.gpu.test_gpu_step import PROMPT, _head_dir, llama
from tests.tiny import TinyTokenizer

TOKENS = 10
PROMPTS = [PROMPT, [1, 20, 21, 22, 20, 21], [1, 30, 31, 32, 33, 34, 35, 30, 31, 32, 33]]
# a DFlash chain of 5 guesses (block 8) and EAGLE-3 trees of 3 levels, top-k 2
SETTINGS = {"dflash": {"eagle_topk": 1, "num_draft_tokens": 6},
            "eagle3": {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 6}}


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with fake_cuda(monkeypatch, kernels=False) as state:
        yield state


def config(method: str, adaptive: bool = False) -> SpecConfig:
    return SpecConfig(method=method, max_new_tokens=TOKENS, adaptive_draft=adaptive, **SETTINGS.get(method, {}))


def bundle(method: str, target: Any) -> DraftBundle:
    return load_draft(str(_head_dir(method)), target, TinyTokenizer(), method=method)


def drafting_session(method: str, made: list[Any] | None = None) -> tuple[Session, DraftBundle]:
    """A greedy session on the device with ``method``'s drafter (each one made kept in ``made``)."""
    target = llama("cuda")
    draft = bundle(method, target)

    def factory() -> Any:
        drafter = draft.factory()
        if made is not None:
            made.append(drafter)
        return drafter

    return Session(target, TinyTokenizer(stop_ids=frozenset()), config(method),
                   drafters={"none": NoDrafter, method: factory}, features=draft.features), draft


def answer(s: Session, prompt: list[int], start: SpecConfig | None = None, swap: SpecConfig | None = None
           ) -> list[int]:
    """A new conversation's answer to ``prompt`` under ``start`` (None: the settings in force);
    ``swap``: hot-swapped in after its first step."""
    s.reset()
    if start is not None:
        s.update_config(start)
    tokens: list[int] = []
    applied: list[str] = []
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            tokens += [c.id for c in event.committed]
            if swap is not None and event.index == 1:
                s.update_config(swap)
        applied += [event.config["method"]] if isinstance(event, ConfigApplied) else []
        assert not isinstance(event, Finished) or not event.error
    assert applied == ([swap.method] if swap is not None else [])
    return tokens


def baseline(prompts: list[list[int]]) -> list[list[int]]:
    s = Session(llama("cuda"), TinyTokenizer(stop_ids=frozenset()), config("none"), drafters={"none": NoDrafter})
    return [answer(s, p) for p in prompts]


def captures_each(gpu: Any, s: Session, runs: list[Callable[[], list[int]]]) -> tuple[list[list[int]], list[int]]:
    """Each run's answer and the graphs the device captured during it."""
    answers, captured = [], []
    for run in runs:
        before = gpu.captures
        answers.append(run())
        captured.append(gpu.captures - before)
    return answers, captured


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_a_drafters_graphs_serve_every_prompt_after_the_first(gpu, method: str) -> None:
    """The same prompt three times, the session reset before each (as the bench does): the first
    answer captures the drafter's graphs and the next two replay them, capturing nothing (each new
    drafter takes its predecessor's memory); the answers are the baseline's; the session's counts
    are every capture the device saw, the drafter's included."""
    want = baseline([PROMPT])[0]
    start = gpu.captures
    made: list[Any] = []
    s, _ = drafting_session(method, made)
    answers, captured = captures_each(gpu, s, [lambda: answer(s, PROMPT)] * 3)
    assert answers == [want] * 3
    assert captured[1:] == [0, 0], f"captures per prompt: {captured}"
    counts, target = s.graph_counts, s.model.graph_counts
    assert counts is not None and target is not None
    assert counts.captures == gpu.captures - start and counts.captures > target.captures  # the drafter's too
    assert len(made) >= 3 and all(d.memory is made[0].memory for d in made)


def test_the_warm_up_captures_what_new_prompts_and_hot_swaps_replay(gpu) -> None:
    """Session.capture_graphs with the bench's methods (the baseline, DFlash, EAGLE-3; the adaptive
    budget on, which may ask a drafter for any width and depth): then new prompts with each drafter,
    and answers hot-swapped from one method to another after their first step, capture nothing.
    The answers are the baseline's."""
    prompts = PROMPTS + PROMPTS[:2]
    want = baseline(prompts)
    s, _ = drafting_session("dflash")
    eagle3 = bundle("eagle3", s.model)
    s.set_draft("eagle3", eagle3.factory, eagle3.features)
    methods = [config(m, adaptive=True) for m in ("none", "dflash", "eagle3")]
    assert s.capture_graphs(methods) > 0
    none, dflash, eagle = methods
    runs = [
        lambda: answer(s, prompts[0], dflash),
        lambda: answer(s, prompts[1], none, swap=dflash),
        lambda: answer(s, prompts[2], dflash, swap=eagle),
        lambda: answer(s, prompts[3], eagle, swap=dflash),
        lambda: answer(s, prompts[4], eagle),
    ]
    answers, captured = captures_each(gpu, s, runs)
    assert answers == want
    assert captured == [0] * len(runs), f"graphs captured mid-answer: {captured}"


def test_another_draft_releases_the_old_drafts_graphs(gpu) -> None:
    """Installing another draft for the method lets the old drafter's graphs and cache go (no GPU
    memory kept for a draft no longer used); the new draft's drafter captures its own (another
    runner: the old graphs are not its), and the session's counts stay "so far"."""
    made: list[Any] = []
    s, _ = drafting_session("dflash", made)
    want = baseline([PROMPT])[0]
    assert answer(s, PROMPT) == want
    graphs = weakref.ref(made[-1].memory.graphs)
    before = s.graph_counts
    assert graphs() is not None and before is not None
    other = bundle("dflash", s.model)
    s.set_draft("dflash", other.factory, other.features)
    made.clear()
    gc.collect()
    assert graphs() is None, "the replaced draft's graphs are still held"
    counts = s.graph_counts
    assert counts is not None and counts.captures == before.captures
    start = gpu.captures
    assert answer(s, PROMPT) == want
    assert gpu.captures > start  # the new draft's own graphs
