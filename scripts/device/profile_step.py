"""Profile one greedy decode step of a random-weight model (device plan, command 2).

Prints how many kernels one step launches and where its device time goes: the first question
when decode runs far under the bandwidth limit (launch gaps, an unexpected copy, a slow kernel).
The model and step are the ones ``specchat bench --random-weights`` times.

    python3 scripts/device/profile_step.py --shape smollm2-135m --device cuda
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from engine.models.random_init import random_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    device = torch.device(args.device)
    name, model = random_model(args.shape, dtype=getattr(torch, args.dtype), device=device)
    prompt = torch.randint(0, model.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(args.context + 64)
    out = model.forward(prompt, cache, logits="last")
    cache.commit(args.context)
    token = int(out.logits[-1].argmax())
    for _ in range(8):  # warm-up: kernels built, graphs captured
        token = int(model.forward(torch.tensor([token]), cache).logits[0].argmax())
        cache.commit(1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        token = int(model.forward(torch.tensor([token]), cache).logits[0].argmax())
        cache.commit(1)
    events = prof.key_averages()
    sort = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    kernels = sum(e.count for e in events if e.device_type.name == "CUDA") if device.type == "cuda" else 0
    graphs = getattr(getattr(model, "_static", None), "replays", None)
    print(f"{name} {args.dtype} on {device}: one decode step, {kernels} device kernels, graph replays so far {graphs}")
    print(events.table(sort_by=sort, row_limit=14, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
