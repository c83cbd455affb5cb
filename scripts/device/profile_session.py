"""Profile whole speculative steps of a real session: where a method's step time goes.

Session 25's first GPU run (H200, embedded model, bf16) found EAGLE-3 at 19.9 ms of drafting and
37 ms of verifying a step against 2.7 ms for a plain step; the verify half was the eager forward
(fixed: features are captured in graph replays now). This script answers the rest on the next
lent GPU: one warm-up answer, then one profiled answer; it prints the steps, the host syncs per
step (``aten::item``/``_local_scalar_dense``, ``cudaStreamSynchronize``), the ops with the most
host time and, on a GPU, the kernels with the most device time.

    python3 scripts/device/profile_session.py --method eagle3 --device cuda --dtype bfloat16
    python3 scripts/device/profile_session.py --method eagle3 --device cpu --tokens 16   # a dry run
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from engine.config import SpecConfig
from engine.events import Step
from engine.loader import load_session

PROMPT = [{"role": "user", "content": "Explain why the sky is blue in three sentences."}]


def answer(session, config: SpecConfig) -> int:
    steps = 0
    for event in session.generate(PROMPT, config):
        steps += isinstance(event, Step)
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--weights", default="fp32", help="fp32 on a GPU; stored runs our CPU kernels")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    config = SpecConfig.for_method(args.method, {"max_new_tokens": args.tokens})  # the method's own defaults
    session = load_session(args.model, config, dtype=args.dtype, device=args.device, weights=args.weights)
    answer(session, config)  # warm-up: kernels built, graphs captured, costs measured
    session.reset()
    cuda = torch.device(args.device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        steps = answer(session, config)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    counts = {e.key: e.count for e in events}
    syncs = {k: counts.get(k, 0) for k in ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize",
                                           "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaGraphLaunch")}
    print(f"{args.method} {args.dtype} on {args.device}: {steps} steps in {wall * 1e3:.1f} ms "
          f"({wall * 1e3 / max(steps, 1):.2f} ms a step, profiler on)")
    print("per step: " + ", ".join(f"{k} {v / max(steps, 1):.1f}" for k, v in syncs.items()))
    print(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    if cuda:
        print(events.table(sort_by="device_time_total", row_limit=12, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
