"""The common prefix of two token sequences: how much of a cache still holds after a history changed.

The session (its KV cache against a new prompt) and every stateful drafter (the n-gram trie, the
EAGLE and standalone draft caches against the history they are reset to) ask this once per turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``.

    Why a bisection on slices rather than a loop over tokens: histories run to thousands of tokens
    and list slices compare at C speed, so this costs a few slice comparisons instead of a Python
    step per token. Any sequence of ints is accepted (it is copied to a list when it is not one).
    """
    a = a if isinstance(a, list) else list(a)
    b = b if isinstance(b, list) else list(b)
    n = min(len(a), len(b))
    if limit is not None:
        n = max(0, min(n, limit))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def chat_preamble(tokenizer: Any, system_prompt: str | None = None) -> list[int]:
    """The tokens every conversation opens with: what two one-message conversations share (the chat
    template's system turn, with ``system_prompt`` if given, and the start of the user's turn).

    A session keeps them cached across conversations (Session.reset). Where the template's last
    characters merge with a message's first, the shared part ends earlier, which only keeps less;
    a tokenizer without a chat template gives none."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    try:
        a, b = (tokenizer.encode_chat([*system, {"role": "user", "content": text}]) for text in ("a", "b"))
    except (AttributeError, ValueError):  # no encode_chat, or no template / one that refuses: keep nothing
        return []
    return a[:common_prefix(a, b, limit=min(len(a), len(b)) - 1)]
