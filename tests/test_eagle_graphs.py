"""EAGLE's greedy draft as graphs (engine/drafters/eagle_graphs.py), run eagerly on the CPU: the
static bodies (catch-up padded to a bucket, every tree level over the whole head cache through a
device-built mask) draft the trees of the host search, and the answer stays the baseline's."""

from __future__ import annotations

import pytest
import torch
from test_eagle import baseline, bundle, target, tokens_of
from tiny import TinyTokenizer

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.eagle import EagleDrafter
from engine.events import Step
from engine.session import Session


def _trees_and_tokens(kind: str, vocab: int | None, on_device: bool, prompts: list[list[int]],
                      config: SpecConfig) -> tuple[list[tuple], list[list[int]], list[EagleDrafter]]:
    b = bundle(kind, "sglang" if kind == "eagle" else "specforge", vocab)
    made: list[EagleDrafter] = []

    def factory() -> EagleDrafter:
        d = b.factory()
        d.on_device = on_device
        made.append(d)
        return d

    s = Session(target(), TinyTokenizer(), config, drafters={"none": NoDrafter, kind: factory}, features=b.features)
    trees, answers = [], []
    for prompt in prompts:
        events = list(s.generate_ids(prompt))
        trees += [(e.tree.tokens, e.tree.parents) for e in events if isinstance(e, Step)]
        answers.append(tokens_of(events))
    return trees, answers, made


@pytest.mark.parametrize(("kind", "vocab"), [("eagle", None), ("eagle3", 40)])
@pytest.mark.parametrize(("steps", "topk", "drafts"), [(3, 2, 6), (4, 3, 10), (3, 1, 4)])
def test_the_static_draft_grows_the_host_searchs_trees(kind: str, vocab: int | None, steps: int, topk: int,
                                                       drafts: int) -> None:
    """Same trees step by step as the host search (same head, same histories), and the baseline's
    answer; a prompt longer than the largest bucket (70 tokens) catches up eagerly."""
    config = SpecConfig(method=kind, num_steps=steps, eagle_topk=topk, num_draft_tokens=drafts, max_new_tokens=12,
                        adaptive_draft=False)
    prompts = [[1, 5, 6, 7, 5, 6], [1, *range(3, 73)]]
    host, host_answers, _ = _trees_and_tokens(kind, vocab, False, prompts, config)
    static, answers, made = _trees_and_tokens(kind, vocab, True, prompts, config)
    assert made and all(d.memory.graphs is not None for d in made), "the static draft did not run"
    assert answers == host_answers
    assert answers[0] == list(baseline(tuple(prompts[0]), 12))
    assert static == host


def test_the_device_draft_takes_the_sessions_stop_cancel_first_rule_left_to_the_budgets_depth() -> None:
    """Under the session's stop (a cancel and the adaptive budget's per-level rule) the device draft
    still runs: a cancel set before the tree drafts the root alone; the rule, which would read the
    candidates every level, is not asked (the budget's depth, picked before the step, bounds the
    levels). Any other stop callable keeps the host search."""
    import threading

    from engine.drafters.tree_search import Cancellable, levels_on_device

    config = SpecConfig(method="eagle", num_steps=3, eagle_topk=2, num_draft_tokens=6, adaptive_draft=False)
    b = bundle("eagle", "sglang", None)
    history = [1, 5, 6, 7]

    def fresh() -> EagleDrafter:
        d = b.factory()
        d.on_device = True
        d.reset(history, target().forward(torch.tensor(history), target().new_cache(16), return_hidden=True).hidden)
        return d

    asked: list[int] = []

    def rule(cands, frontier) -> bool:
        asked.append(1)
        return True

    cancel = threading.Event()
    d = fresh()
    tree = d.propose(history, 9, config, stop=Cancellable(rule, cancel))
    assert not asked and d.memory.graphs is not None and max(tree.depths) == 3
    cancel.set()
    assert fresh().propose(history, 9, config, stop=Cancellable(rule, cancel)).tokens == (9,)
    assert levels_on_device(None) and not levels_on_device(rule)
