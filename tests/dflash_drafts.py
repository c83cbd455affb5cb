"""Synthetic DFlash drafters in the public layouts, written for tiny targets (no downloads).

* z-lab (``z-lab/Qwen3-8B-DFlash-b16`` and its siblings): config.json is a Qwen3 config of the draft
  layers plus ``architectures: ["DFlashDraftModel"]``, ``auto_map``, ``block_size``,
  ``num_target_layers`` and ``dflash_config: {"mask_token_id", "target_layer_ids"}`` (ids of layer
  *outputs*); model.safetensors holds ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and
  ``layers.N.{input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
  mlp.{gate,up,down}_proj}.weight``, in bf16, no embedding, no LM head.
* speculators (vLLM's export): ``speculators_model_type: "dflash"``, ``architectures:
  ["DFlashSpeculator"]``, the draft layers' config under ``transformer_layer_config``, ``block_size``,
  ``aux_hidden_state_layer_ids`` (layer *inputs*: z-lab's ids + 1), ``mask_token_id``,
  ``draft_vocab_size``, ``target_hidden_size`` and ``speculators_config``; the same weights, plus
  ``lm_head.weight``, ``d2t`` and ``t2d`` for a reduced vocabulary.

Written from those public descriptions by hand (not by specchat's reader run backwards), so a test
that loads them checks the reader against the layouts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

HEAD_DIM = 16  # the draft's own head width (Qwen3 style: q is wider than the hidden state here)


def _draft_layers_config(target: dict[str, Any], layers: int) -> dict[str, Any]:
    H = target["hidden_size"]
    return {
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": 2 * H,
        "num_hidden_layers": layers,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * layers,
        "tie_word_embeddings": True,
        "vocab_size": target["vocab_size"],
        "torch_dtype": "bfloat16",
    }


def zlab_config(target: dict[str, Any], *, layers: int = 2, block: int = 4, ids: list[int] | None = None,
                mask: int | None = None) -> dict[str, Any]:
    cfg = _draft_layers_config(target, layers)
    cfg.update({
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block,
        "num_target_layers": target["num_hidden_layers"],
        "dflash_config": {"mask_token_id": target["vocab_size"] - 1 if mask is None else mask,
                          "target_layer_ids": [1, 3] if ids is None else ids},
    })
    return cfg


def speculators_config(target: dict[str, Any], *, layers: int = 2, block: int = 4, aux: list[int] | None = None,
                       mask: int | None = None, draft_vocab: int | None = None) -> dict[str, Any]:
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": "0.3.0",
        "transformer_layer_config": _draft_layers_config(target, layers),
        "draft_vocab_size": draft_vocab or target["vocab_size"],
        "block_size": block,
        "target_hidden_size": target["hidden_size"],
        "aux_hidden_state_layer_ids": [2, 4] if aux is None else aux,
        "mask_token_id": target["vocab_size"] - 1 if mask is None else mask,
        "sliding_window_non_causal": False,
        "projector_type": "dflash",
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "tiny/target", "architectures": ["LlamaForCausalLM"]},
        },
    }


def dflash_state(target: dict[str, Any], *, layers: int = 2, features: int = 2, seed: int = 0,
                 draft_vocab: int | None = None, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random weights under the public names (``draft_vocab``: a reduced vocabulary's lm_head, d2t, t2d)."""
    gen = torch.Generator().manual_seed(seed)
    H, V = target["hidden_size"], target["vocab_size"]
    q, kv, inter = target["num_attention_heads"] * HEAD_DIM, target["num_key_value_heads"] * HEAD_DIM, 2 * H

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    def norm(width: int) -> torch.Tensor:
        return 1 + torch.randn(width, generator=gen) * 0.1

    sd = {"fc.weight": rand(H, features * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({
            p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
            p + "self_attn.q_proj.weight": rand(q, H), p + "self_attn.k_proj.weight": rand(kv, H),
            p + "self_attn.v_proj.weight": rand(kv, H), p + "self_attn.o_proj.weight": rand(H, q),
            p + "self_attn.q_norm.weight": norm(HEAD_DIM), p + "self_attn.k_norm.weight": norm(HEAD_DIM),
            p + "mlp.gate_proj.weight": rand(inter, H), p + "mlp.up_proj.weight": rand(inter, H),
            p + "mlp.down_proj.weight": rand(H, inter),
        })
    if draft_vocab:
        used = sorted(torch.randperm(V, generator=gen)[:draft_vocab].tolist())
        sd["lm_head.weight"] = rand(draft_vocab, H)
        sd["d2t"] = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.int64)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[used] = True
        sd["t2d"] = t2d
    return sd


def write_dflash(folder: Path, target: dict[str, Any], *, layout: str = "z-lab", layers: int = 2, block: int = 4,
                 ids: list[int] | None = None, mask: int | None = None, draft_vocab: int | None = None, seed: int = 0,
                 state: dict[str, torch.Tensor] | None = None, config: dict[str, Any] | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """A drafter folder (config.json + model.safetensors). ``ids``: z-lab's target_layer_ids (the
    speculators layout gets them + 1); ``state``/``config``: files of one's own (bad inputs)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    n_ids = len(ids) if ids is not None else 2
    if config is None:
        config = zlab_config(target, layers=layers, block=block, ids=ids, mask=mask) if layout == "z-lab" else \
            speculators_config(target, layers=layers, block=block, aux=None if ids is None else [i + 1 for i in ids],
                               mask=mask, draft_vocab=draft_vocab)
    (folder / "config.json").write_text(json.dumps(config))
    sd = state if state is not None else dflash_state(target, layers=layers, features=n_ids, seed=seed,
                                                      draft_vocab=draft_vocab)
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()},
              str(folder / "model.safetensors"))
    return folder
