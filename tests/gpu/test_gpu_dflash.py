"""The DFlash drafter's device path (engine/drafters/dflash/graphs.py, device_tree.py) on the fake
CUDA device: the block forward and the greedy pick replayed from graphs, the answers and the trees
those of the CPU path, and DDTree's device search the host heap's for any table (hypothesis).

The answer alone cannot show a stale graph (verification makes any draft lossless), so the trees
are compared too: replayed from graphs captured at other steps (other lengths, anchors and
context rows), the device path gives, step by step, the trees of the host path on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.dflash.ddtree import Offers, ddtree
from engine.drafters.dflash.device_tree import ddtree_rows, level_sizes, tree_from_rows
from engine.drafters.draft_loader import load_draft
from engine.events import Step
from engine.session import Session
from tests.gpu.fake_cuda import fake_cuda
from tests.gpu.test_gpu_step import PROMPT, _head_dir, llama
from tests.tiny import TinyTokenizer


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with fake_cuda(monkeypatch, kernels=False) as state:
        yield state


def session(topk: int, *, on_device: bool = True) -> Session:
    """A greedy session on the device: dflash (block 8) drafting 5 tokens, as a chain (top-k 1) or
    a DDTree of width ``topk``; ``on_device`` False: the host path (an eager forward, the heap)."""
    # adaptive drafting off: its gate judges measured wall-clock rates, so with it on the two paths
    # could prune or pause different steps and the trees would depend on the host's timing
    config = SpecConfig(method="dflash", num_steps=3, eagle_topk=topk, num_draft_tokens=6, max_new_tokens=10,
                        adaptive_draft=False)
    target = llama("cuda")
    bundle = load_draft(str(_head_dir("dflash")), target, TinyTokenizer(), method="dflash")

    def factory() -> Any:
        drafter = bundle.factory()
        drafter.on_device = on_device
        return drafter

    return Session(target, TinyTokenizer(stop_ids=frozenset()), config,
                   drafters={"none": NoDrafter, "dflash": factory}, features=bundle.features)


def _steps(s: Session, turns: int = 2) -> list[Step]:
    return [e for _ in range(turns) for e in s.generate_ids(PROMPT) if isinstance(e, Step)]


def _tokens(steps: list[Step]) -> list[int]:
    return [c.id for e in steps for c in e.committed]


@pytest.mark.parametrize("topk", [1, 2, 3], ids=["chain", "ddtree-2", "ddtree-3"])
def test_greedy_dflash_replays_its_graphs_and_gives_the_cpu_trees_and_the_baseline(gpu, topk: int) -> None:
    """Token for token the baseline's answer on the device; every step's tree the host path's (the
    eager forward and the heap, or the host chain, on the same device: a CPU session prunes its
    trees by the CPU's costs); the block forward captured once per bucket, then replayed."""
    base = _tokens(_steps(_baseline()))
    before_caps, before_replays = gpu.captures, gpu.replays
    on_device = _steps(session(topk))
    assert _tokens(on_device) == base
    host = _steps(session(topk, on_device=False))
    assert [(e.tree.tokens, e.tree.parents) for e in on_device] == [(e.tree.tokens, e.tree.parents) for e in host]
    # the probabilities to float32 rounding (the graph attends over the whole cache through a mask)
    assert [p for e in on_device for p in e.tree.draft_probs] == pytest.approx(
        [p for e in host for p in e.tree.draft_probs], rel=1e-4)
    assert any(not e.tree.is_chain for e in on_device) == (topk > 1)
    assert gpu.captures > before_caps
    # the drafter's and the target's replays: at least one block per step past the captures
    assert gpu.replays - before_replays >= len(on_device)


def _baseline() -> Session:
    config = SpecConfig(method="none", max_new_tokens=10)
    return Session(llama("cuda"), TinyTokenizer(stop_ids=frozenset()), config, drafters={"none": NoDrafter})


def test_each_step_reports_its_own_blocks_guesses(gpu) -> None:
    """The block's rows are the graph's tensors, rewritten by the next replay: the step reads their
    guesses (Step.block, what the tree panel shows) before that, so each step's are its own block's,
    the host path's step by step."""
    def guesses(on_device: bool) -> list[tuple]:
        s = session(2, on_device=on_device)
        s.report_blocks(3)
        return [tuple(tuple(c.id for c in row) for row in e.block) for e in _steps(s, turns=1)]

    on_device = guesses(True)
    assert sum(bool(g) for g in on_device) >= 5 and len(set(on_device)) > 2
    assert on_device == guesses(False)


# -- DDTree's device search against the host heap ---------------------------------------------------
# log-probabilities drawn from a few values, so ties between paths (and within a row) are common
_VALUES = st.sampled_from([0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -7.0])


@st.composite
def tables(draw) -> tuple[list[list[float]], int]:
    depth, width = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    rows = [sorted(draw(st.lists(_VALUES, min_size=width, max_size=width)), reverse=True) for _ in range(depth)]
    return rows, draw(st.integers(0, 70))


@settings(max_examples=400, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_the_device_search_is_the_host_heaps_tree(table, seed: int) -> None:
    """Random per-position top-k tables, budgets and widths, with ties: the same nodes in the same
    order, the same parents, tokens and probabilities as ddtree.ddtree's heap."""
    logp, budget = table
    values = torch.tensor(logp, dtype=torch.float32)
    ids = torch.randint(0, 1000, values.shape, generator=torch.Generator().manual_seed(seed))
    host = ddtree(5, Offers(ids.tolist(), values.tolist()), budget)
    rows = ddtree_rows(ids, values, budget)
    assert tree_from_rows(5, rows.tolist()) == host
    assert rows.shape[1] == min(budget, sum(level_sizes(len(logp), len(logp[0]), 10**9)))


def test_the_device_search_replays_from_a_graph_with_new_values(gpu) -> None:
    """Captured once on one table, replayed on another: the heap's tree of the new one (nothing
    read from the host inside, no value baked in)."""
    gen = torch.Generator().manual_seed(0)
    depth, width, budget = 5, 3, 12
    values = torch.zeros(depth, width, device="cuda")
    ids = torch.zeros(depth, width, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = ddtree_rows(ids, values, budget)
    for _ in range(3):
        table = torch.randn(depth, width, generator=gen).abs().neg().sort(dim=-1, descending=True).values
        tokens = torch.randint(0, 97, (depth, width), generator=gen)
        values.copy_(table.to("cuda"))
        ids.copy_(tokens.to("cuda"))
        graph.replay()
        assert tree_from_rows(3, rows.tolist()) == ddtree(3, Offers(tokens.tolist(), table.tolist()), budget)
