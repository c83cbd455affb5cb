"""The target features a session keeps per committed token (engine/features.py).

What these hold: a feature row is the same whichever way it is stored (the native decoder's
side-by-side buffer read as one view, or a concatenation), the store keeps exactly the committed
rows (a chain's prefix, a tree's scattered path) and hands back what it stored.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.features import FeatureCapture, FeatureSpec, FeatureStore, _side_by_side
from engine.kernels import native
from tests.tiny import our_model


def _buffer(T: int, n: int, H: int) -> list[torch.Tensor]:
    """n [T, H] views side by side in one [T, n, H] buffer: how decoder.c returns its captures."""
    out = torch.randn(T, n, H)
    return [out[:, c] for c in range(n)]


def test_side_by_side_parts_are_read_as_one_view_equal_to_their_concatenation() -> None:
    parts = _buffer(5, 3, 8)
    joined = _side_by_side(parts)
    assert joined is not None and joined.data_ptr() == parts[0].data_ptr()  # no copy
    assert torch.equal(joined, torch.cat(parts, dim=-1))


@pytest.mark.parametrize("case", ["reordered", "separate", "gap", "one row of many"])
def test_parts_not_side_by_side_are_refused(case: str) -> None:
    parts = _buffer(4, 3, 8)
    if case == "reordered":  # a head that reads its layers in another order than the buffer's
        parts = [parts[1], parts[0], parts[2]]
    elif case == "separate":
        parts = [torch.randn(4, 8) for _ in range(3)]
    elif case == "gap":  # the first and the last of three, the middle one missing
        parts = [parts[0], parts[2]]
    else:
        parts = [p[1:2] for p in parts]
        assert _side_by_side(parts) is not None  # one row: still side by side
        parts = [parts[0], torch.randn(1, 8)]
    assert _side_by_side(parts) is None


def test_extract_is_the_head_order_concatenation_either_way() -> None:
    """EAGLE-3 reads layers low..high (one view) or in another order (a concatenation)."""
    aux = _buffer(3, 3, 4)  # layers 2, 5, 9 in layer order
    out = SimpleNamespace(aux=aux, hidden=None)
    assert torch.equal(FeatureSpec(capture_layers=(2, 5, 9)).extract(out), torch.cat(aux, -1))
    assert torch.equal(FeatureSpec(capture_layers=(9, 2, 5)).extract(out), torch.cat([aux[2], aux[0], aux[1]], -1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.booleans(), st.integers(0, 2**31 - 1)), min_size=1, max_size=40))
def test_the_store_keeps_exactly_the_committed_rows(steps) -> None:
    """Forwards of T rows, each committing row 0 and then either a prefix (a chain) or scattered
    rows (a tree's path); the store grows past its first allocation and holds the same rows as a
    plain list would, and every append returns the rows it stored."""
    store, want = FeatureStore(), []
    for T, chain, seed in steps:
        g = torch.Generator().manual_seed(seed)
        rows = torch.randn(T, 6, generator=g)
        picked = torch.randperm(T - 1, generator=g)[: int(torch.randint(0, T, (), generator=g))] + 1
        index = [0, *range(1, 1 + len(picked))] if chain else [0, *sorted(picked.tolist())]
        got = store.append(rows, index)
        assert torch.equal(got, rows[index])
        want.append(rows[index])
    assert torch.equal(store.rows(), torch.cat(want))


@pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")
def test_the_native_decoders_captures_are_kept_without_a_concatenation() -> None:
    """The fast path is the one taken: EAGLE-3's usual layers come out of decoder.c side by side."""
    model, _ = our_model("llama", num_hidden_layers=3, hidden_size=64, head_dim=16)
    spec = FeatureSpec(capture_layers=(0, 1, 3))
    cache = model.new_cache(32)
    out = model.forward(torch.tensor([3, 5, 7, 9]), cache, **spec.forward_kwargs())
    assert _side_by_side([out.aux[i] for i in range(3)]) is not None
    capture = FeatureCapture(spec)
    capture.set(True)
    kept = capture.keep(out, [0, 2, 3])
    assert torch.equal(kept, torch.cat(out.aux, -1)[[0, 2, 3]])
    assert torch.equal(capture.rows(), kept)
