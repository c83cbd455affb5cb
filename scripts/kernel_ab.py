"""Time the fast precision's tile variants against each other, interleaved, in one process.

Why a script rather than two ``bench --cost-curve`` runs with ``SPECCHAT_KERNEL_VARIANT``: on a
shared 2-core VM two runs minutes apart differ by 10-30% (another tenant, the clock), more than
the variants do; here every timed forward alternates variants, so drift lands on both. The
variants give the same bits (tests/test_fast_kernel.py), so only their time differs.

    .venv/bin/python scripts/kernel_ab.py --sizes 1,4,8,12,16,32,64 --reps 30
    .venv/bin/python scripts/kernel_ab.py --variants cpu,attn8 --context 1000   # attention's 16 vs 8 lanes
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    import torch

    from engine.calibrate import binary_tree
    from engine.config import SpecConfig
    from engine.kernels import native
    from engine.loader import load_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8,12,16,32,64", help="tree sizes (tokens a forward)")
    parser.add_argument("--reps", type=int, default=30, help="timed forwards per size and variant")
    parser.add_argument("--context", type=int, default=300, help="cached tokens under the tree")
    parser.add_argument("--variants", default="cpu,avx512",
                        help="cpu (this CPU's pick), avx512 (VNNI, no AMX), avxvnni (as an AVX2 CPU with "
                             "AVX-VNNI), avx2, attn8 (this CPU's pick with attention's 8-lane loops); the "
                             "first is the reference")
    args = parser.parse_args()
    kernel = native.load()
    if kernel is None:
        raise SystemExit(f"no native kernel here: {native.why_not}")
    variants = [v.strip() for v in args.variants.split(",")]
    for v in variants:
        if v not in ("cpu", "attn8", *native.VARIANTS[1:]):
            raise SystemExit(f"--variants: {v!r} is not one of cpu, avx512, avxvnni, avx2, attn8")
    model = load_session(None, SpecConfig(), precision="fast", weights="stored").model
    gen = torch.Generator().manual_seed(0)
    sizes = [int(n) for n in args.sizes.split(",")]
    cache = model.new_cache(args.context + max(sizes) + 8)
    model.forward(torch.randint(0, model.vocab_size, (args.context,), generator=gen), cache, logits="last")
    cache.commit(args.context)
    calls = {}
    for n in sizes:
        tree = binary_tree(n)
        calls[n] = (torch.randint(0, model.vocab_size, (n,), generator=gen), torch.tensor(tree.depths) + args.context,
                    tree.ancestor_mask() if n > 1 else None)
    names = {}
    times: dict[tuple[int, str], list[float]] = {(n, v): [] for n in sizes for v in variants}
    for r in range(args.reps + 1):  # the first round warms every path up and is not kept
        for n in sizes:
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:  # each goes first in turn
                kernel.choose_variant("" if v in ("cpu", "attn8") else v)
                if v == "attn8":
                    kernel.use_wide_attention(False)
                names[v] = f"{kernel.fast_variant}/attn8" if v == "attn8" else str(kernel.fast_variant)
                tokens, positions, mask = calls[n]
                t0 = time.perf_counter()
                model.forward(tokens, cache, positions=positions, tree_mask=mask)
                if r:
                    times[(n, v)].append((time.perf_counter() - t0) * 1e3)
    kernel.choose_variant(native.forced_variant())
    ref = variants[0]
    print(f"median ms of one forward over n tree tokens, {args.context} cached, {args.reps} each, interleaved")
    print("    n  " + "  ".join(f"{v}={names[v]:>10}" for v in variants) + "  " +
          "  ".join(f"{v}/{ref}" for v in variants[1:]))
    for n in sizes:
        med = {v: statistics.median(times[(n, v)]) for v in variants}
        print(f"{n:5d}  " + "  ".join(f"{med[v]:>{len(v) + 11}.2f}" for v in variants) + "  " +
              "  ".join(f"{med[v] / med[ref]:>{len(v) + len(ref) + 1}.3f}" for v in variants[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
