"""Medusa-1 heads as a trainable module, and their export in the two public Medusa layouts.

Head k is one residual block ``x + SiLU(W_k x + b_k)`` on the target's last hidden state (after
its final norm) followed by an lm_head; it guesses the token k+2 places ahead (the target's own
lm_head guesses k+1). Why one *shared* lm_head over a *truncated* vocabulary: on a CPU the
lm_head is nearly all of a head's cost, to train and to run, and 4 full 49152-row copies are
226 MB; one frozen copy of the target's rows for the most frequent answer tokens (vLLM's
``original_lm_head`` + ``truncated_vocab_size`` + ``token_map``) trains only the small blocks,
ships in a few MB and drafts with one product for all heads.

Exports: ``vllm`` (config.json + model.safetensors: ``blocks.{k}.layers.0.weight|bias``,
``lm_head.weight`` [Vh, H], ``token_map``) and ``medusa`` (FasterDecoding: config.json +
medusa_lm_head.safetensors with ``{k}.0.linear.weight|bias`` and ``{k}.1.weight`` [V, H], a
full-vocabulary copy per head: the target's lm_head with the trained rows written in).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

ExportLayout = Literal["vllm", "medusa"]
EXPORT_LAYOUTS: tuple[str, ...] = ("vllm", "medusa")


@dataclass
class MedusaHeadConfig:
    num_heads: int
    hidden_size: int
    vocab_size: int  # the target's
    head_vocab_size: int  # rows of the shared lm_head (== vocab_size: no truncation)
    train_lm_head: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def frequent_tokens(counts: torch.Tensor, size: int, keep: set[int] = frozenset()) -> torch.Tensor:
    """The ``size`` most frequent token ids (``keep`` always in), sorted: the heads' vocabulary."""
    order = torch.argsort(counts, descending=True, stable=True).tolist()
    chosen = [t for t in keep if 0 <= t < counts.numel()][:size]
    seen = set(chosen)
    for t in order:
        if len(chosen) >= size:
            break
        if t not in seen:
            chosen.append(t)
            seen.add(t)
    return torch.tensor(sorted(chosen), dtype=torch.int64)


class MedusaTrainHeads(nn.Module):
    """K residual blocks (stacked, one batched product) and one shared lm_head over ``token_map``."""

    def __init__(self, config: MedusaHeadConfig, token_map: torch.Tensor) -> None:
        super().__init__()
        K, H = config.num_heads, config.hidden_size
        self.config = config
        # Medusa's init: zero weights, so every head starts as the target's own next-token guess
        self.weight = nn.Parameter(torch.zeros(K, H, H))
        self.bias = nn.Parameter(torch.zeros(K, H))
        self.lm_head = nn.Parameter(torch.zeros(len(token_map), H), requires_grad=config.train_lm_head)
        t2d = torch.full((config.vocab_size,), -1, dtype=torch.int64)
        t2d[token_map] = torch.arange(len(token_map))
        self.register_buffer("token_map", token_map.to(torch.int64).clone())
        self.register_buffer("t2d", t2d)

    def init_lm_head(self, target_lm_head: torch.Tensor) -> None:
        """Medusa-1: the lm_head starts as (and, frozen, stays) the target's rows."""
        with torch.no_grad():
            self.lm_head.copy_(target_lm_head[self.token_map.to(target_lm_head.device)].float())

    def blocks(self, hidden: torch.Tensor) -> torch.Tensor:
        """[K, N, H]: every head's residual block on the same hidden states [N, H]."""
        x = hidden.unsqueeze(0).expand(self.config.num_heads, -1, -1)
        return x + F.silu(torch.baddbmm(self.bias[:, None, :], x, self.weight.transpose(1, 2)))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[K, N, Vh] logits over the head vocabulary."""
        return self.blocks(hidden) @ self.lm_head.T

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.token_map[draft_ids]


# export ----------------------------------------------------------------------------------------------
def _atomic_save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    part = path.with_name(path.name + ".part")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(part), metadata={"format": "pt"})
    os.replace(part, path)


def _atomic_json(obj: dict[str, Any], path: Path) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(part, path)


def export_medusa(heads: MedusaTrainHeads, out_dir: str | Path, layout: ExportLayout = "vllm", *,
                  target_lm_head: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                  card: dict[str, Any] | None = None) -> Path:
    """Write the heads to ``out_dir`` in ``layout``; files are replaced atomically.

    ``medusa`` (FasterDecoding) has no token map, so each head gets a full-vocabulary lm_head:
    ``target_lm_head`` [V, H] with the head vocabulary's rows replaced by the trained ones."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    c = heads.config
    cast = {k: v.detach().to("cpu", dtype) for k, v in (("w", heads.weight), ("b", heads.bias),
                                                        ("lm", heads.lm_head))}
    name = str(dtype).removeprefix("torch.")
    if layout == "vllm":
        tensors = {f"blocks.{k}.layers.0.weight": cast["w"][k] for k in range(c.num_heads)}
        tensors |= {f"blocks.{k}.layers.0.bias": cast["b"][k] for k in range(c.num_heads)}
        tensors["lm_head.weight"] = cast["lm"]
        if c.head_vocab_size < c.vocab_size:
            tensors["token_map"] = heads.token_map.cpu()
        config: dict[str, Any] = {
            "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size, "truncated_vocab_size": c.head_vocab_size, "num_heads": c.num_heads,
            "num_hidden_layers": 1, "original_lm_head": True, "medusa_fc_bias": True, "max_paths": 64, "topk": 10,
            "torch_dtype": name}
        weights_file = out / "model.safetensors"
    elif layout == "medusa":
        if target_lm_head is None:
            raise ValueError("the FasterDecoding layout needs the target's lm_head for its full-vocabulary copies")
        full = target_lm_head.detach().to("cpu", dtype).clone()
        full[heads.token_map.cpu()] = cast["lm"]
        tensors = {}
        for k in range(c.num_heads):
            tensors[f"{k}.0.linear.weight"] = cast["w"][k]
            tensors[f"{k}.0.linear.bias"] = cast["b"][k]
            tensors[f"{k}.1.weight"] = full
        tensors = {k: v.clone() for k, v in tensors.items()}  # safetensors refuses shared storage
        config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": 1, "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size, "torch_dtype": name}
        weights_file = out / "medusa_lm_head.safetensors"
    else:
        raise ValueError(f"unknown Medusa layout {layout!r}; use one of {', '.join(EXPORT_LAYOUTS)}")
    if card:
        config["specchat_training"] = card
    _atomic_save(tensors, weights_file)
    _atomic_json(config, out / "config.json")
    return out
