"""``specchat bench``'s warm-up: nothing that happens once lands inside a timed prompt.

Every runner answers once, untimed, before the timed runs. On CUDA the warm-up also sizes each
session's KV cache for the longest prompt and captures the verify forward's CUDA graph of every
tree-size bucket (engine/gpu/static.py captures one per bucket on first use, per cache address),
so neither a capture, a Triton compile nor a cache reallocation lands inside a timed prompt.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.calibrate import sync
from engine.prompts import Prompt


def size_cache_for(session: Any, prompts: list[Prompt], configs: Iterable[Any]) -> None:
    """CUDA: allocate the session's KV cache for the longest prompt's answer and tree now.

    Graphs are captured per cache address, and the session grows its cache when a prompt needs
    more room; growing inside a timed run would recapture every bucket there. On CPU (no graphs)
    nothing is done: the cache grows as it always has, and tests pay nothing for tokenising."""
    if getattr(session.model, "_static", None) is None:
        return
    configs = list(configs)
    room = max(c.max_new_tokens for c in configs) + max(c.max_tree_tokens for c in configs)
    session._ensure_capacity(max(len(p.ids(session.tokenizer)) for p in prompts) + room)


def capture_verify_graphs(session: Any) -> dict[str, int]:
    """CUDA: capture the verify forward's graph of every tree-size bucket (1, 2, ... 64) on the
    session's KV cache before timing, and build their Triton kernels.

    engine/gpu/static.py captures one graph per bucket the first time a forward of that size
    runs; the short warm-up answers reach only some buckets (an adaptive tree's size varies step
    by step), so the rest would be captured inside a timed prompt. One verify-shaped forward per
    bucket on the empty cache captures them all (K/V land in scratch slots that the next prefill
    overwrites; the session's cache is emptied after). Returns {"captured": graphs captured here, "total":
    captures so far}; zeros where the model has no static decoder (CPU, --backend hf)."""
    import torch

    from engine.gpu.static import BUCKETS

    model = session.model
    static = getattr(model, "_static", None)
    if static is None:
        return {"captured": 0, "total": 0}
    session.forget_cache()
    cache = session._cache
    before = static.captures
    # EAGLE's verify forwards capture target features: their graphs are their own (engine/gpu/static.py)
    features = session._capture.forward_kwargs
    if cache is not None:
        for b in BUCKETS:
            if b > cache.capacity:
                break
            model.forward(torch.zeros(b, dtype=torch.int64), cache, positions=torch.arange(b),
                          tree_mask=torch.ones(b, b, dtype=torch.bool).tril_(), **features)
        sync(model)
    session.forget_cache()
    return {"captured": static.captures - before, "total": static.captures}


def graph_report(sessions: dict[str, Any], before_timing: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per mode with CUDA graphs: captures before timing, by the bucket sweep, while timing (each
    printed as a warning: those prompts are slower), and replays."""
    out: dict[str, dict[str, int]] = {}
    for mode, warm in before_timing.items():
        static = getattr(sessions[mode].model, "_static", None)
        if static is None:
            continue
        timed = static.captures - warm["total"]
        out[mode] = {"captured_before_timing": warm["total"], "captured_by_bucket_sweep": warm["captured"],
                     "captured_while_timing": timed, "replays": static.replays}
        if timed:
            print(f"bench: {timed} CUDA graph capture(s) happened inside timed runs ({mode}); those prompts are slower")
    return out
