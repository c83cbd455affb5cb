"""Writing a trained DFlash drafter in the speculators layout, the one checkpoint.py reads back.

Why the speculators layout (vLLM's ``speculators`` export) rather than z-lab's: it is the public
layout with a reduced draft vocabulary (``draft_vocab_size``, ``lm_head.weight`` over those rows and
``d2t``: draft index + d2t = target id), which a CPU drafter needs: an LM head over the target's
whole vocabulary (49,152 rows for SmolLM2) at every block position would cost more than a target
step. ``aux_hidden_state_layer_ids`` are the target layers whose *input* residual the context reads
(z-lab's target_layer_ids + 1), as vLLM and checkpoint.py read them; ``t2d`` is written for vLLM
(specchat derives it). The training card goes under ``specchat_training``, as for EAGLE-3 heads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from engine.drafters.dflash.model import DFlashDraft, DFlashSpec, weight_shapes
from engine.train.outdir import CARD_KEY

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def layers_config(spec: DFlashSpec, dtype: str) -> dict[str, Any]:
    """``transformer_layer_config``: the draft layers as a Qwen3 config (q/k norms, SiLU, full attention)."""
    return {
        "model_type": "qwen3", "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "attention_bias": spec.attention_bias, "attention_dropout": 0.0,
        "max_position_embeddings": spec.max_position_embeddings, "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta, "rope_scaling": spec.rope_scaling, "use_sliding_window": False,
        "sliding_window": None, "layer_types": ["full_attention"] * spec.num_layers, "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def speculators_config(spec: DFlashSpec, verifier: str, dtype: str) -> dict[str, Any]:
    """config.json of the speculators layout for ``spec`` (``verifier``: the target's name)."""
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": layers_config(spec, dtype),
        "draft_vocab_size": spec.draft_vocab_size or spec.vocab_size,
        "block_size": spec.block_size,
        "target_hidden_size": spec.hidden_size,
        "aux_hidden_state_layer_ids": list(spec.capture_layers),
        "mask_token_id": spec.mask_token_id,
        "sliding_window_non_causal": False,
        "projector_type": "dflash",
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": spec.drafts}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier},
        },
        "torch_dtype": dtype,
    }


def export_tensors(draft: DFlashDraft, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's public weights (model.py's ``weight_shapes``) in ``dtype``, ``d2t`` as int64
    and, with a reduced vocabulary, ``t2d`` (bool over the target's vocabulary)."""
    sd = draft.state_dict()
    spec = draft.spec
    out = {k: sd[k].detach().to("cpu", dtype if sd[k].is_floating_point() else sd[k].dtype).contiguous()
           for k in weight_shapes(spec)}
    if "d2t" in out:
        used = out["d2t"] + torch.arange(spec.draft_vocab_size)
        t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
        t2d[used] = True
        out["t2d"] = t2d
    return out


def export_dflash(draft: DFlashDraft, out_dir: str | Path, *, verifier: str, dtype: torch.dtype = torch.bfloat16,
                  card: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors (each replaced atomically) into ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(export_tensors(draft, dtype), str(out / "model.safetensors.part"), metadata={"format": "pt"})
    os.replace(out / "model.safetensors.part", out / "model.safetensors")
    config = speculators_config(draft.spec, verifier, DTYPE_NAMES[dtype])
    if card:
        config[CARD_KEY] = card
    (out / "config.json.part").write_text(json.dumps(config, indent=2) + "\n")
    os.replace(out / "config.json.part", out / "config.json")
    return out
