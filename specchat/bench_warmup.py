"""``specchat bench``'s warm-up: nothing that happens once lands inside a timed prompt.

Every runner answers once, untimed, before the timed runs. On CUDA the warm-up also sizes each
session's KV caches (the target's and the drafters') for the longest prompt and captures every CUDA
graph the timed methods replay: the verify forward's of every tree-size bucket with each method's
features, and each drafter's own, which then serve every prompt (``Session.reserve``,
``Session.capture_graphs``), so neither a capture, a Triton compile nor a cache reallocation lands
inside a timed prompt. Everything here goes through the session's public API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.prompts import Prompt
from engine.session import Session


def size_cache_for(session: Session, prompts: list[Prompt], configs: Iterable[Any]) -> None:
    """CUDA: allocate the session's KV cache for the longest prompt's answer and tree now (graphs are
    captured per cache address). Where the target runs eagerly (CPU) nothing is done: the cache grows
    as it always has, and tests pay nothing for tokenising."""
    if session.graph_counts is None:
        return
    configs = list(configs)
    room = max(c.max_new_tokens for c in configs) + max(c.max_tree_tokens for c in configs)
    session.reserve(max(len(p.ids(session.tokenizer)) for p in prompts) + room)


def capture_graphs(session: Session, configs: Iterable[Any]) -> dict[str, int]:
    """CUDA: every graph an answer under ``configs`` replays, captured before timing
    (Session.capture_graphs). Returns {"captured": graphs captured here, "total": captures so far};
    zeros where the target has no graphs (CPU, --backend hf)."""
    captured = session.capture_graphs(list(configs))
    counts = session.graph_counts
    return {"captured": captured, "total": counts.captures if counts is not None else 0}


def graph_report(sessions: dict[str, Session], before_timing: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per mode with CUDA graphs: captures before timing, by the bucket sweep, while timing (each
    printed as a warning: those prompts are slower), and replays."""
    out: dict[str, dict[str, int]] = {}
    for mode, warm in before_timing.items():
        counts = sessions[mode].graph_counts
        if counts is None:
            continue
        timed = counts.captures - warm["total"]
        out[mode] = {"captured_before_timing": warm["total"], "captured_by_bucket_sweep": warm["captured"],
                     "captured_while_timing": timed, "replays": counts.replays}
        if timed:
            print(f"bench: {timed} CUDA graph capture(s) happened inside timed runs ({mode}); those prompts are slower")
    return out
