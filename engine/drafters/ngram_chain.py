"""The prompt-lookup index of the n-gram drafter's chain mode (engine/drafters/ngram.py).

Split from the trie's module because the two structures share nothing but their drafter.
"""

from __future__ import annotations

from array import array


class ChainIndex:
    """Last end position of every n-gram (``min_n <= n <= max_n``) of a token list.

    ``prev`` remembers, per (position, n), the previous end position of the same n-gram, so a
    truncation restores the index exactly in O(removed tokens * n-gram sizes). Memory grows with
    the history (like the target's KV cache, which is far larger per token) and is not bounded by
    ``ngram_capacity``.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.clear()

    def clear(self) -> None:
        self.length = 0  # tokens indexed
        self.last: dict[tuple[int, ...], int] = {}
        # prev[(i - 0) * width + (n - min_n)]: previous end of the n-gram ending at i, or -1
        self._prev = array("q")

    def extend(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions ``self.length .. upto-1`` of ``tokens``."""
        last = self.last
        prev = self._prev
        lo, hi = self.min_n, self.max_n
        for i in range(self.length, upto):
            for n in range(lo, hi + 1):
                if n > i + 1:
                    prev.append(-1)  # keep the stride; this n-gram does not exist
                    continue
                key = tuple(tokens[i - n + 1 : i + 1])
                prev.append(last.get(key, -1))
                last[key] = i
        self.length = max(self.length, upto)

    def truncate(self, tokens: list[int], length: int) -> None:
        """Forget positions >= ``length`` (``tokens`` still holds them when this is called)."""
        if length >= self.length:
            return
        last = self.last
        prev = self._prev
        lo, hi = self.min_n, self.max_n
        width = hi - lo + 1
        for i in range(self.length - 1, length - 1, -1):
            for n in range(lo, min(hi, i + 1) + 1):
                key = tuple(tokens[i - n + 1 : i + 1])
                p = prev[i * width + n - lo]
                if p < 0:
                    del last[key]
                else:
                    last[key] = p
        del prev[length * width :]
        self.length = length

    def lookup(self, tokens: list[int], root: int) -> tuple[int, int] | None:
        """(end position, n) of the most recent occurrence of the longest suffix n-gram of
        ``tokens + [root]`` inside ``tokens``, or None."""
        L = len(tokens)
        last = self.last
        for n in range(min(self.max_n, L + 1), self.min_n - 1, -1):
            e = last.get((*tokens[L - n + 1 :], root) if n > 1 else (root,))
            if e is not None:
                return e, n
        return None
