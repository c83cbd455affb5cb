"""``specchat bench``'s bandwidth lines: each baseline's decode as GB/s of weights read, against the
machine's read bandwidth measured in the same run and, where one is known, a datasheet peak.

Why: at batch 1 a plain decode step reads every weight once, so its GB/s over what the memory can
deliver says how much is left to win without drafting at all, and it is the one number of a row
that does not move with the machine's speed (both halves of the ratio move together). The probe is
engine/read_bandwidth.py; bench.py runs it at the start of each round and between its prompts
(:func:`probe_after`), beside the rows it divides, and a round's reference is the mean of its probes.

Why a mean of probes through the round rather than one at its start: a probe takes a tenth of a
second and a round minutes, and this VM's memory reads fast in bursts. One probe a round caught a
burst (80.4 GB/s, against 41-47 in the other rounds, session 51) while the decode, averaged over the
whole round, could not, so best over best said 61% where one-token forwards timed between two
probes read 83-93% of their mean (docs/history/session-51.md). The fastest single probe is still
reported beside it.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from engine.read_bandwidth import ReadBandwidth


def read_probe(model: Any) -> Callable[[], ReadBandwidth] | None:
    """The probe bench runs each round, on the threads in force now (the engine's, as loaded): for our
    models on a CPU only. A GPU has its datasheet peak (:func:`baseline_bandwidth`), and a
    transformers model no count of the bytes its step reads. The probe reads at least as many bytes
    as a step of ``model`` does, so that no more of them can sit in a cache than of the weights."""
    import torch

    from engine.read_bandwidth import measure_read_bandwidth

    device = getattr(model, "device", None)
    if not hasattr(model, "layers") or device is None or device.type != "cpu":
        return None
    return functools.partial(measure_read_bandwidth, torch.get_num_threads(),
                             at_least=weights_read_per_token(model) or 0)


def weights_read_per_token(model: Any) -> int | None:
    """Bytes of weights one decode step of ``model`` reads; None for a model that is not ours."""
    from engine.gpu.bandwidth import weight_bytes_per_token

    return weight_bytes_per_token(model) if hasattr(model, "layers") else None


PROBES_A_ROUND = 8  # probes between a round's prompts, at most, besides the one at its start


def probe_after(prompt: int, prompts: int) -> bool:
    """Whether bench probes after the round's ``prompt``-th prompt (0-based) of ``prompts``: evenly,
    at most :data:`PROBES_A_ROUND` times a round, the last after the round's last prompt."""
    every = -(-prompts // PROBES_A_ROUND)
    return (prompt + 1) % every == 0 or prompt == prompts - 1


def decode_bandwidth(weight_bytes: dict[str, int], results: list[dict[str, Any]],
                     probes: Sequence[Sequence[ReadBandwidth]]) -> dict[str, Any] | None:
    """The report's ``decode_bandwidth``: per mode whose weights are counted (``weight_bytes``), its
    baseline's GB/s of weights read in each round and at best; with ``probes`` (a round's probes
    each) the measured read bandwidth (each round's mean), each round's share of it and best over
    best, and the share of the fastest single probe. None where no baseline decoded anything."""
    means = [statistics.fmean(p.gbps for p in taken) for taken in probes]
    fastest = max((p.gbps for taken in probes for p in taken), default=0.0)
    baselines: dict[str, Any] = {}
    for result in results:
        mode = result.get("mode")
        if result["method"] != "none" or mode not in weight_bytes:
            continue
        rates = [r["decode_tokens_per_s"] for r in result.get("rounds") or [result]]
        gbps = [round(weight_bytes[mode] * rate / 1e9, 3) if rate else None for rate in rates]
        if not any(gbps):
            continue
        entry: dict[str, Any] = {"weight_bytes": weight_bytes[mode], "gbps_by_round": gbps,
                                 "best_gbps": max(g for g in gbps if g)}
        if probes:
            entry["share_by_round"] = [round(g / m, 4) if g else None for g, m in zip(gbps, means, strict=True)]
            entry["share"] = round(entry["best_gbps"] / max(means), 4)
            entry["share_of_fastest_probe"] = round(entry["best_gbps"] / fastest, 4)
            entry["fits_cache"] = probes[0][0].fits_cache(weight_bytes[mode])
        baselines[mode] = entry
    if not baselines:
        return None
    out: dict[str, Any] = {"baselines": baselines}
    if probes:
        measured = probes[0][0].to_dict()
        del measured["gbps"]  # by round, below
        out["measured_read"] = {**measured, "gbps_by_round": [round(m, 3) for m in means],
                                "best_gbps": round(max(means), 3),
                                "probes_by_round": [[round(p.gbps, 3) for p in taken] for taken in probes],
                                "fastest_probe_gbps": round(fastest, 3)}
    return out


def decode_bandwidth_lines(section: dict[str, Any] | None) -> list[str]:
    """One line per baseline: "baseline: x GB/s of weights read = y% of measured read bandwidth
    z GB/s", with the rounds' shares where there were several, and a word where the weights fit in
    the last-level cache (which reads faster than memory: a share above 100% is no error)."""
    if not section:
        return []
    probe = section.get("measured_read")
    baselines = section["baselines"]
    lines = []
    for mode, b in baselines.items():
        who = "baseline" if len(baselines) == 1 else f"baseline ({mode})"
        text = f"{who}: {b['best_gbps']:.1f} GB/s of weights read"
        if probe is not None:
            text += f" = {b['share']:.1%} of measured read bandwidth {probe['best_gbps']:.1f} GB/s"
            taken = [len(r) for r in probe.get("probes_by_round", [])]  # absent in reports before session 51
            notes = [f"the mean of {max(taken)} probes through a round"] if taken and max(taken) > 1 else []
            if len(b["gbps_by_round"]) > 1:
                shares = " ".join("-" if s is None else f"{s:.0%}" for s in b["share_by_round"])
                notes.append(f"best of {len(b['gbps_by_round'])} rounds each; by round {shares}")
            if notes:
                text += f" ({'; '.join(notes)})"
            if probe.get("fastest_probe_gbps", probe["best_gbps"]) > probe["best_gbps"]:
                text += (f"; {b['share_of_fastest_probe']:.1%} of the fastest single probe "
                         f"({probe['fastest_probe_gbps']:.1f} GB/s)")
            if b["fits_cache"]:
                text += (f"; its {_size(b['weight_bytes'])} of weights fit in the "
                         f"{probe['l3_bytes'] / 2**20:.0f} MiB last-level cache, which reads faster than memory")
        lines.append(text)
    return lines


def _size(nbytes: int) -> str:
    """Bytes for a line: "1.12 GB", "261.8 kB" (a tiny test model's)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale / 10:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 1e3:.1f} kB"


def baseline_bandwidth(model: Any, decode_tokens_per_s: float | None, peak_gbps: float | None) -> dict | None:
    """The baseline's fraction of the memory-bandwidth limit: on a GPU (peak looked up by name) or
    wherever ``--peak-bandwidth`` is given; None for models that are not ours or no decode rate."""
    from engine.gpu.bandwidth import bandwidth_report, peak_bandwidth_gbps

    weight_bytes = weights_read_per_token(model)
    if not decode_tokens_per_s or weight_bytes is None:
        return None
    device = getattr(model, "device", None)
    if peak_gbps is None and device is not None and device.type == "cuda":
        import torch

        peak_gbps = peak_bandwidth_gbps(torch.cuda.get_device_name(device))
    if peak_gbps is None:
        return None
    return bandwidth_report(weight_bytes, 1e3 / decode_tokens_per_s, peak_gbps)


def print_bandwidth(report: dict[str, Any]) -> None:
    """The bandwidth lines: each baseline against the measured read bandwidth, and the first one's
    share of a peak figure where one is known."""
    for line in decode_bandwidth_lines(report.get("decode_bandwidth")):
        print(line)
    bandwidth = report.get("bandwidth")
    if bandwidth is not None and bandwidth["fraction_of_limit"] is not None:
        print(f"baseline: {bandwidth['achieved_gbps']:.0f} GB/s of weights streamed, "
              f"{bandwidth['fraction_of_limit']:.1%} of the {bandwidth['peak_gbps']:.0f} GB/s peak "
              f"(limit {bandwidth['limit_tokens_per_s']:.0f} tok/s)")
