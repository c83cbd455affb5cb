"""A preallocated KV cache for one sequence, with tree-aware commit.

Layout: one tensor per K and V, ``[layers, kv_heads, capacity, head_dim]``, so that compacting
the accepted path of a draft tree is a single gather/scatter over all layers at once.

Slots ``[0, length)`` hold committed tokens. A forward writes its T new tokens into the scratch
slots ``[length, length + T)``; :meth:`commit` then keeps the chosen ones (the accepted path,
in order) by moving them down to ``[length, length + n)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    def commit(self, keep: Sequence[int] | int) -> None:
        """Make scratch slots permanent.

        ``keep`` is either a count n (the first n scratch slots, the usual case for a prefill, a
        plain decoding step or an accepted chain prefix) or the list of scratch offsets to keep,
        in order (an accepted tree path). Offsets are relative to ``length``.
        """
        start = self.length
        if isinstance(keep, int):
            n = keep
        else:
            offsets = list(keep)
            n = len(offsets)
            if offsets != list(range(n)) and self.k.is_cuda and _gpu_compaction():
                from engine.gpu.kv_compact import compact_kv

                both = torch.tensor([n, *offsets], dtype=torch.int32).pin_memory().to(self.k.device, non_blocking=True)
                compact_kv(self.k, self.v, start, both[1:], both[:1])  # all layers, one launch
            elif offsets != list(range(n)):
                src = torch.tensor(offsets, device=self.k.device) + start
                # advanced indexing copies the source first, so overlapping moves are safe
                self.k[:, :, start : start + n] = self.k[:, :, src]
                self.v[:, :, start : start + n] = self.v[:, :, src]
        if start + n > self.capacity:
            raise RuntimeError("KV cache overflow")
        self.length = start + n

    def truncate(self, length: int) -> None:
        """Forget everything after ``length`` tokens (a new turn diverging from the cached one)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    def grow(self, capacity: int) -> None:
        """Reallocate to a larger capacity, keeping the committed slots."""
        if capacity <= self.capacity:
            return
        if self.k.is_cuda:  # CUDA graphs are captured per cache address: grow rarely
            capacity = max(capacity, 2 * self.capacity)
        layers, heads, _, dim = self.k.shape
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros((layers, heads, capacity, dim), dtype=old.dtype, device=old.device)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = capacity


def _gpu_compaction() -> bool:
    from engine.gpu import triton_available

    return triton_available()
