"""Synthetic Medusa heads in the two public layouts, written for tiny targets (no downloads).

Key names, file names and config fields are those of the published checkpoints
(engine/drafters/medusa_checkpoint.py cites them): FasterDecoding/Medusa writes
``medusa_lm_head.safetensors`` (older heads: the pickle ``medusa_lm_head.pt``) with
``{i}.{j}.linear.weight|bias`` and ``{i}.{L}.weight``, and a config with ``medusa_num_heads`` /
``medusa_num_layers``; vLLM's layout is ``model.safetensors`` with ``blocks.{i}.layers.{j}.weight``,
``lm_heads.{i}.weight`` and, with ``truncated_vocab_size``, a ``token_map``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

MEDUSA_LAYOUTS = ("medusa", "vllm")


def medusa_config(target: dict[str, Any], layout: str, *, heads: int = 3, layers: int = 1,
                  truncated: int | None = None, bias: bool = False) -> dict[str, Any]:
    if layout == "medusa":  # what FasterDecoding's MedusaConfig.save_pretrained writes
        return {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny-llama",
                "transformers_version": "4.41.0"}
    cfg: dict[str, Any] = {"model_type": "medusa", "architectures": ["MedusaModel"],
                           "hidden_size": target["hidden_size"], "vocab_size": target["vocab_size"],
                           "num_heads": heads, "num_hidden_layers": layers, "max_paths": 64, "topk": 10,
                           "medusa_fc_bias": bias}
    if truncated is not None:
        cfg["truncated_vocab_size"] = truncated
    return cfg


def medusa_state(target: dict[str, Any], layout: str, *, heads: int = 3, layers: int = 1, seed: int = 0,
                 truncated: int | None = None, bias: bool | None = None, scale: float = 0.3,
                 lm_heads: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Random weights (or the given lm_heads, [V, H] each) named as ``layout`` names them.
    ``bias`` None: FasterDecoding heads have block biases (nn.Linear's default), vLLM's do not."""
    gen = torch.Generator().manual_seed(seed)
    H, V = target["hidden_size"], target["vocab_size"]
    bias = layout == "medusa" if bias is None else bias
    sd: dict[str, torch.Tensor] = {}
    used = None
    if truncated is not None:
        used = torch.randperm(V, generator=gen)[:truncated].sort().values
        sd["token_map"] = used
    for i in range(heads):
        for j in range(layers):
            w = torch.randn(H, H, generator=gen) * scale
            b = torch.randn(H, generator=gen) * 0.1
            if layout == "medusa":
                sd[f"{i}.{j}.linear.weight"] = w
                if bias:
                    sd[f"{i}.{j}.linear.bias"] = b
            else:
                sd[f"blocks.{i}.layers.{j}.weight"] = w
                if bias:
                    sd[f"blocks.{i}.layers.{j}.bias"] = b
        lm = lm_heads[i] if lm_heads is not None else torch.randn(V, H, generator=gen) * scale
        if used is not None:
            lm = lm[used]
        sd[f"{i}.{layers}.weight" if layout == "medusa" else f"lm_heads.{i}.weight"] = lm.clone()
    return sd


def write_medusa_head(folder: Path, target: dict[str, Any], layout: str, *, heads: int = 3, layers: int = 1,
                      seed: int = 0, truncated: int | None = None, pickle: bool = False,
                      state: dict[str, torch.Tensor] | None = None,
                      config_changes: dict[str, Any] | None = None) -> Path:
    """A head folder: config.json + medusa_lm_head.safetensors (FasterDecoding; .pt with ``pickle``)
    or model.safetensors (vLLM; pytorch_model.bin with ``pickle``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = medusa_config(target, layout, heads=heads, layers=layers, truncated=truncated)
    cfg.update(config_changes or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = state if state is not None else medusa_state(target, layout, heads=heads, layers=layers, seed=seed,
                                                       truncated=truncated)
    name = "medusa_lm_head" if layout == "medusa" else None
    if pickle:
        torch.save(sd, folder / (f"{name}.pt" if name else "pytorch_model.bin"))
    else:
        save_file({k: v.contiguous() for k, v in sd.items()},
                  str(folder / (f"{name}.safetensors" if name else "model.safetensors")))
    return folder
