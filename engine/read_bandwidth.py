"""How fast this machine reads memory, measured now: the ceiling of a batch-1 decode on a CPU.

Why measure: at batch 1 every generated token streams every weight once, so a plain decode can go
no faster than (weight bytes) / (read bandwidth). A GPU has a datasheet figure for that bandwidth
(engine/gpu/bandwidth.py); a CPU, least of all a virtual machine's share of one, has none worth
trusting: the same 2-core VM read weights at 26 ms a step in one run and 33 ms in the next (issue
57). So the bench measures the ceiling in the same run, in the same machine state as the rows it
divides, and reports the baseline as a share of it ("x GB/s = y% of measured read bandwidth
z GB/s", specchat/bench_bandwidth.py).

What it measures: the best of a few passes of one streaming read, a torch sum over a buffer far
larger than the last-level cache (so it comes from memory, not the L3), on the thread count the
engine's forwards use, each pass timed alone. "Far larger" is at least 1 GiB and the model's weights,
whatever sysfs says of the cache: a VM's sysfs gives the cache of its own slice (32 MiB on the Zen 5
guests), not what it shares on the host. On that guest the probe once read 87 GB/s over 4 x 32 MiB,
the speed it reads 16 MiB at (93 GB/s), while the 1.5B model's decode never moved (session 46); a
buffer the size of the weights is read from where the weights are read from.

A sum reads with wide vector loads and does one add a value, so it is bound by memory, as the
decode's matrix-vector products are; it stands for what those products could read at most. It is a
measurement, not a bound: a model whose weights fit in the L3 (the 135M model on a 260 MB-L3 Xeon)
can read faster than memory, and its share then exceeds 100% (:attr:`ReadBandwidth.l3_bytes` lets a
report say so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

_CACHE_DIR = Path("/sys/devices/system/cpu")
_CACHE_MULTIPLE = 8  # the buffer spans this many last-level caches (all of them, every socket)
_MIN_BUFFER = 1 << 30  # bytes, however small the cache says it is (see the module's docstring)
_MAX_BUFFER = 4 << 30  # bytes, however large the cache (a few passes stay under a second)
_MEMORY_SHARE = 4  # and at most this fraction of the memory available now
PASSES = 5  # the best pass is the machine's speed; the others catch a pass the host interrupted


@dataclass(frozen=True)
class ReadBandwidth:
    """One probe: the best pass's GB/s (1e9 bytes a second), the buffer read, the last-level cache it
    outsizes (0 where the system does not say), the threads and passes it took."""

    gbps: float
    buffer_bytes: int
    l3_bytes: int
    threads: int
    passes: int

    def fits_cache(self, nbytes: int) -> bool:
        """Whether ``nbytes`` (a model's weights) fit in the last-level cache, so that reading them
        may beat this probe."""
        return 0 < nbytes <= self.l3_bytes

    def to_dict(self) -> dict[str, float | int]:
        return {"gbps": round(self.gbps, 3), "buffer_bytes": self.buffer_bytes, "l3_bytes": self.l3_bytes,
                "threads": self.threads, "passes": self.passes}


def last_level_cache_bytes(root: Path = _CACHE_DIR) -> int:
    """Bytes of the highest-level CPU cache summed over its instances (one per CCX or socket), read
    from sysfs; 0 where sysfs does not say (then the buffer is the minimum size)."""
    instances: dict[tuple[int, str], int] = {}  # (level, the CPUs sharing it) -> bytes
    for index in root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            instances[(level, shared)] = _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
    if not instances:
        return 0
    top = max(level for level, _ in instances)
    return sum(size for (level, _), size in instances.items() if level == top)


def _size_bytes(text: str) -> int:
    """sysfs's cache size ("32768K", "1M") in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


def buffer_bytes(l3_bytes: int, available: int | None, at_least: int = 0) -> int:
    """The probe's buffer: several last-level caches and at least ``at_least`` bytes (the weights a
    step reads), within [1 GiB, 4 GiB] and a quarter of the memory available (a machine short of
    memory gets a smaller probe, never a swapped one)."""
    size = min(max(_CACHE_MULTIPLE * l3_bytes, _MIN_BUFFER, at_least), _MAX_BUFFER)
    if available is not None:
        size = min(size, available // _MEMORY_SHARE)
    return max(size, 1 << 20) // 64 * 64


def measure_read_bandwidth(threads: int | None = None, passes: int = PASSES, nbytes: int | None = None,
                           clock: Callable[[], float] = time.perf_counter, at_least: int = 0) -> ReadBandwidth:
    """The best of ``passes`` timed sums over a buffer of ``nbytes`` (default: :func:`buffer_bytes`
    of ``at_least``),
    on ``threads`` torch threads (default: the count in force), which are restored after. The buffer
    is written before the first pass (its pages are mapped, not faulted in while timed) and freed
    after the last."""
    if passes < 1:
        raise ValueError(f"passes must be 1 or more, not {passes}")
    l3 = last_level_cache_bytes()
    values = (nbytes if nbytes is not None else buffer_bytes(l3, available_memory_bytes(), at_least)) // 4
    if values < 1:
        raise ValueError(f"the buffer must hold at least 4 bytes, not {nbytes}")
    size = 4 * values
    before = torch.get_num_threads()
    threads = threads or before
    torch.set_num_threads(threads)
    try:
        buffer = torch.ones(values, dtype=torch.float32)
        best = float("inf")
        for _ in range(passes):
            t0 = clock()
            float(buffer.sum())
            best = min(best, clock() - t0)
        del buffer
    finally:
        torch.set_num_threads(before)
    return ReadBandwidth(size / max(best, 1e-9) / 1e9, size, l3, threads, passes)
