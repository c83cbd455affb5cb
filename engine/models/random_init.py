"""Randomly initialised Llama-family models built from a config alone: GPU numbers (bandwidth,
verify cost, graph replay) depend on shapes, not on trained weights, so they can be measured
without downloading 16 GB. Also what the CPU tests use to check that path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engine.errors import UserError
from engine.files import SMALL_LIMIT, UnreadableFileError, read_text
from engine.jsonl import loads
from engine.models.llama import LlamaConfig, LlamaModel

# config.json fields of well-known shapes (public architecture numbers, no weights)
NAMED_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
    "smollm2-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    },
}


class RandomModelError(UserError, ValueError):
    """The --random-weights argument is neither a known shape nor a readable config.json."""


def random_config(spec: str) -> tuple[str, dict[str, Any]]:
    """(name, config dict) from a shape name in NAMED_SHAPES or a path to a config.json."""
    if spec in NAMED_SHAPES:
        return spec, dict(NAMED_SHAPES[spec])
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise RandomModelError(f"{spec!r} is neither a shape name ({', '.join(NAMED_SHAPES)}) nor a config.json")
    try:
        name = path.parent.name if path.name == "config.json" else path.stem
        return name or spec, loads(read_text(path, limit=SMALL_LIMIT, what="a config.json"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, UnreadableFileError) as exc:
        raise RandomModelError(f"cannot read {path}: {exc}") from None


def random_state_dict(config: LlamaConfig, dtype: torch.dtype, device: torch.device | str, seed: int = 0
                      ) -> dict[str, torch.Tensor]:
    """HF-named tensors with N(0, 0.02) weights and unit norms, made directly on the device."""
    g = torch.Generator(device=device).manual_seed(seed)
    c = config

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    hd, q, kv = c.head_dim, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    sd = {"model.embed_tokens.weight": w(c.vocab_size, c.hidden_size), "model.norm.weight": ones(c.hidden_size)}
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = w(c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": w(q, c.hidden_size), p + "self_attn.k_proj.weight": w(kv, c.hidden_size),
            p + "self_attn.v_proj.weight": w(kv, c.hidden_size), p + "self_attn.o_proj.weight": w(c.hidden_size, q),
            p + "mlp.gate_proj.weight": w(c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": w(c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": w(c.hidden_size, c.intermediate_size),
            p + "input_layernorm.weight": ones(c.hidden_size),
            p + "post_attention_layernorm.weight": ones(c.hidden_size),
        })
        if c.model_type == "qwen2":  # Qwen2 has q/k/v biases
            sd.update({p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                       p + "self_attn.v_proj.bias": w(kv)})
        if c.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = ones(hd)
            sd[p + "self_attn.k_norm.weight"] = ones(hd)
    return sd


def parameter_bytes(config: LlamaConfig, dtype: torch.dtype) -> int:
    """What the weights of this shape take in ``dtype``."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
    tables = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return (c.num_layers * per_layer + tables + c.hidden_size) * torch.empty((), dtype=dtype).element_size()


def free_bytes(device: torch.device) -> int | None:
    """Memory free on the device (GPU) or available to processes (Linux host), if known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def random_model(spec: str, *, dtype: torch.dtype, device: torch.device | str, seed: int = 0
                 ) -> tuple[str, LlamaModel]:
    """(name, model) for a shape name or config.json path, with random weights. Refused before
    anything is allocated when the weights cannot fit."""
    name, raw = random_config(spec)
    config = LlamaConfig.from_dict(raw)
    device = torch.device(device)
    need, free = parameter_bytes(config, dtype), free_bytes(device)
    if free is not None and need * 1.1 > free:
        raise RandomModelError(f"{name} needs {need / 2**30:.1f} GiB of weights in {str(dtype).replace('torch.', '')}"
                               f" but {device} has {free / 2**30:.1f} GiB free; use a smaller shape, "
                               "--dtype bfloat16 or a bigger device")
    state = random_state_dict(config, dtype, device, seed)
    return name, LlamaModel(config, state, dtype=dtype, device=device, consume=True)
