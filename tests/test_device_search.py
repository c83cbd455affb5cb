"""The device tree search (engine/drafters/device_search.py) grows the host search's tree."""

from __future__ import annotations

import pytest
import torch

from engine.drafters.device_search import Frontier, grow_tree_on_device
from engine.drafters.tree_search import Candidates, grow_tree

VOCAB = 50


def _logp(seed: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(rows, VOCAB, generator=g) * 3, dim=-1)


@pytest.mark.parametrize(("steps", "topk", "drafts"), [(1, 2, 4), (3, 2, 6), (4, 3, 10), (3, 1, 4), (5, 4, 40)])
def test_the_device_search_grows_the_host_searchs_tree(steps: int, topk: int, drafts: int) -> None:
    """Same tree for the same log-probabilities: each level's rows are a function of the node's path,
    so both searches see the same numbers; ids map through a permutation (a head vocabulary)."""
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(9))

    def row_of(path: tuple[int, ...]) -> torch.Tensor:
        return _logp(hash(path) % 10_000, 1)[0]

    paths: dict[int, tuple[int, ...]] = {}  # host candidate -> its path of target ids

    def host_expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
        for i in frontier:
            paths[i] = tuple(cands.tokens[a] for a in cands.ancestors(i))
        return torch.stack([row_of(paths[i]) for i in frontier])

    device_paths: list[tuple[int, ...]] = []

    def device_expand(f: Frontier) -> torch.Tensor:
        nonlocal device_paths
        tokens = f.tokens.tolist()
        parents = [()] * len(tokens) if f.parent_rows is None else [device_paths[r] for r in f.parent_rows.tolist()]
        device_paths = [(*p, t) for p, t in zip(parents, tokens, strict=True)]
        return torch.stack([row_of(p) for p in device_paths])

    root_logp = _logp(1, 1)[0]
    host, _, _ = grow_tree(7, root_logp, host_expand, lambda ix: perm[ix], num_steps=steps, topk=topk,
                           num_draft_tokens=drafts)
    device = grow_tree_on_device(7, root_logp, device_expand, lambda ix: perm[ix], num_steps=steps, topk=topk,
                                 num_draft_tokens=drafts)
    assert device.tokens == host.tokens
    assert device.parents == host.parents
    assert device.draft_probs == pytest.approx(host.draft_probs, rel=1e-6)


def test_a_budget_of_the_root_alone_drafts_nothing() -> None:
    tree = grow_tree_on_device(3, _logp(0, 1)[0], lambda f: pytest.fail("expanded"), lambda ix: ix, num_steps=3,
                               topk=2, num_draft_tokens=1)
    assert tree.tokens == (3,)
