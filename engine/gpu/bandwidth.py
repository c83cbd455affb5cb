"""How close a decode step gets to the memory-bandwidth limit.

At batch 1 every generated token streams every weight once, so the best possible time per token
is (weight bytes) / (peak bandwidth); the fraction of that limit a baseline reaches is the honest
measure of how much launch overhead and Python are left. Peak numbers are the vendors' datasheet
figures; ``--peak-bandwidth`` overrides them (and supplies one for a CPU).
"""

from __future__ import annotations

# (substring of torch.cuda.get_device_name(), GB/s); first match wins, so a name that holds another
# comes before it ("GH200" before "H200", "A100" before "A10"): tests/gpu/test_gpu_bench.py checks
PEAK_BANDWIDTH_GBPS: tuple[tuple[str, float], ...] = (
    ("GH200", 4000.0),  # the 96 GB HBM3 Grace Hopper; torch names it "NVIDIA GH200 480GB"
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM (HBM3), "NVIDIA H100 80GB HBM3"
    ("B200", 8000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40 GB SXM and PCIe
    ("L40S", 864.0),
    ("L40", 864.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("L4", 300.0),
    ("RTX 6000 Ada", 960.0),
    ("RTX A6000", 768.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
    ("T4", 320.0),
    ("V100", 900.0),
)


def peak_bandwidth_gbps(device_name: str) -> float | None:
    """The datasheet peak of a GPU by its torch device name, or None if unknown."""
    for pattern, gbps in PEAK_BANDWIDTH_GBPS:
        if pattern.lower() in device_name.lower():
            return gbps
    return None


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every layer's matrices, norms and the LM head (the
    embedding table contributes one row, ignored); stored matrices count their stored bytes."""
    total = 0
    linears = [model.lm_head]
    for layer in model.layers:
        linears += [layer.qkv, layer.o, layer.gate_up, layer.down]
        for norm in (layer.ln_attn, layer.ln_mlp, layer.q_norm, layer.k_norm):
            if norm is not None:
                total += norm.numel() * norm.element_size()
    element = model.dtype.itemsize  # a dense matrix's width (stored weights have no dense model.embed)
    for lin in linears:
        stored = hasattr(lin, "parts")  # a StoredLinear: its blocks (GGUF, bf16) as the kernel reads them
        total += lin.nbytes if stored else lin.out_features * lin.in_features * element
        bias = getattr(lin, "_bias", None)
        if bias is not None:
            total += bias.numel() * bias.element_size()
    return total + model.norm.numel() * model.norm.element_size()


def bandwidth_report(weight_bytes: int, ms_per_token: float, peak_gbps: float | None) -> dict[str, float | None]:
    """Achieved GB/s, the limit in tokens/s, and the fraction of it reached."""
    achieved = weight_bytes / (ms_per_token / 1e3) / 1e9
    limit = peak_gbps * 1e9 / weight_bytes if peak_gbps else None
    return {
        "weight_bytes": weight_bytes,
        "weight_gb": round(weight_bytes / 1e9, 4),
        "ms_per_token": round(ms_per_token, 3),
        "achieved_gbps": round(achieved, 3),
        "peak_gbps": peak_gbps,
        "limit_tokens_per_s": round(limit, 1) if limit else None,
        "fraction_of_limit": round(achieved / peak_gbps, 5) if peak_gbps else None,
    }
