"""What every CUDA-graph user of the engine shares: inputs sent from pinned memory in one copy,
graphs captured on first use per shape and dropped when the memory they read moves, and the
memory a drafter's graphs were captured on, kept from one conversation to the next.

Why shared: the target's verify (engine/gpu/static.py) and the drafters' (EAGLE's
engine/drafters/eagle_graphs.py, a block drafter's forward, a standalone draft model's own static
decoder) all replay graphs whose inputs are device buffers at fixed addresses, filled each step
from the host without a wait, and whose captured kernels read caches and tables that move when
they grow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

if TYPE_CHECKING:
    from engine.models.kv_cache import KVCache


@dataclass(frozen=True)
class GraphCounts:
    """Graphs so far (a model's verify graphs, a drafter's, a session's together): how many were
    captured, how many runs replayed one (the bench reports both, and warns of a capture inside a
    timed run)."""

    captures: int
    replays: int

    def __add__(self, other: GraphCounts) -> GraphCounts:
        return GraphCounts(self.captures + other.captures, self.replays + other.replays)


def graphs_wanted(device: torch.device) -> bool:
    """Graphs on a CUDA device unless ``SPECCHAT_CUDA_GRAPHS=0`` (eager static forwards, for debugging)."""
    return device.type == "cuda" and os.environ.get("SPECCHAT_CUDA_GRAPHS", "1") != "0"


class PinnedUpload:
    """A device int64 buffer at a fixed address and its pinned host twin: the host writes a step's
    values into ``host`` and :meth:`send` queues one non-blocking copy (no host wait)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.device = device
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.device_buffer = torch.zeros(size, dtype=torch.int64, device=device)
        # the pinned host tensor is rewritten only after the previous step's copy has left it
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def writable(self) -> torch.Tensor:
        """The host tensor, once the last copy out of it has left. The step's one host wait (reading
        the verdict) has nearly always let it leave already: ask first (no wait), wait only when not."""
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()
        return self.host

    def send(self, used: int) -> None:
        """Queue the copy of the first ``used`` values to the device."""
        self.device_buffer[:used].copy_(self.host[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


class GraphSet:
    """CUDA graphs captured on first use, one per key, replayed after. ``address`` names the memory
    the captured kernels read besides their inputs (caches, tables): when it changes, every graph is
    dropped and captured again on its next use. ``enabled`` False runs the body eagerly (CPU tests,
    ``SPECCHAT_CUDA_GRAPHS=0``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._graphs: dict[Hashable, tuple[Any, Any]] = {}
        self._address: Hashable = None
        self._pool: Any = None
        self.replays = 0  # runs served from a captured graph (for tests and the bench)
        self.captures = 0

    def captured(self) -> list[Hashable]:
        """The keys of the graphs captured for the current address (tests, the bench)."""
        return list(self._graphs)

    def run(self, address: Hashable, key: Hashable, body: Callable[[], Any]) -> Any:
        """``body()``'s outputs: from the graph captured for ``key`` (captured now if new). The body
        must read only device tensors at fixed addresses and write its results into tensors it makes
        (or into fixed ones); the outputs returned are the same tensors at every replay."""
        if not self.enabled:
            return body()
        if address != self._address:
            self._graphs.clear()
            self._pool = None
            self._address = address
        if key not in self._graphs:
            self._graphs[key] = self._capture(body)
        graph, output = self._graphs[key]
        graph.replay()
        self.replays += 1
        return output

    def _capture(self, body: Callable[[], Any]) -> tuple[Any, Any]:
        """Warm up on a side stream (builds the Triton kernels, cuBLAS handles), then capture."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            output = body()
        self.captures += 1
        return graph, output


class CountsGraphs:
    """A holder of one :class:`GraphSet` (``self._graphs``) whose counts the tests and the bench read."""

    _graphs: GraphSet

    @property
    def replays(self) -> int:
        """Runs served from a captured graph."""
        return self._graphs.replays

    @property
    def captures(self) -> int:
        return self._graphs.captures


G = TypeVar("G", bound=CountsGraphs)
# a draft cache's rows past the conversation in one step: up to 64 new rows (a bucket's, padded) and
# a drafted block or an EAGLE tree's scratch rows after them
_STEP_ROWS = 128


@dataclass
class DraftMemory(Generic[G]):
    """A drafter's graphs and the draft KV cache they read, which outlive the drafter.

    Why: the session makes its drafters afresh for every conversation (engine/drafting.py,
    ``Drafters.forget``: the bench resets before each prompt), and graphs are captured per cache
    address, so a drafter with a cache of its own captured every graph again on every prompt (tens
    of ms to seconds each on a GPU, inside the timed rows). The next drafter of the same draft takes
    its predecessor's memory over instead (``owner``: the weights both run, so the graphs are
    theirs); what the cache holds is the old conversation's and is cut away by the new drafter's
    first ``reset``. A drafter of another draft never does, and the memory goes with the draft."""

    owner: object  # what the graphs run: a drafter's weights (an EAGLE head, a block drafter's, a draft model)
    cache: KVCache
    graphs: G | None = None  # made on the first on-device draft (a draft model's: its static decoder)

    def counts(self) -> GraphCounts:
        graphs = self.graphs
        return GraphCounts(0, 0) if graphs is None else GraphCounts(graphs.captures, graphs.replays)

    def reserve(self, tokens: int) -> None:
        """Room now for a conversation of ``tokens`` and a step's rows past it: a cache that grows
        later moves, and every graph reading it is captured again."""
        self.cache.grow(tokens + _STEP_ROWS)


@runtime_checkable
class KeepsGraphs(Protocol):
    """A drafter whose graphs and draft cache live in ``memory``, handed from one drafter of a draft
    to the next (engine/drafting.py): the EAGLE, block and standalone drafters."""

    memory: DraftMemory[Any]
