"""engine.prefix.common_prefix: the one common-prefix rule of the session and every drafter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.prefix import common_prefix

tokens = st.lists(st.integers(0, 3), max_size=40)


def naive(a: list[int], b: list[int], limit: int | None) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n] and (limit is None or n < limit):
        n += 1
    return n


@given(tokens, tokens, st.one_of(st.none(), st.integers(-2, 50)))
def test_common_prefix_is_the_naive_loop(a: list[int], b: list[int], limit: int | None) -> None:
    assert common_prefix(a, b, limit) == naive(a, b, limit)


@given(tokens, tokens)
def test_any_sequence_of_ints_compares_by_value(a: list[int], b: list[int]) -> None:
    """A tuple and a list holding the same ints share their prefix (list == tuple is always False)."""
    assert common_prefix(tuple(a), b) == common_prefix(a, tuple(b)) == naive(a, b, None)
