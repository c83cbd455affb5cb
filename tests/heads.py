"""Synthetic EAGLE heads in the public layouts, written for tiny targets (no downloads).

Key names and shapes are exactly those of the published checkpoints (ENGINE_NOTES sections 1-2):
yuhuili EAGLE-1/2 (``fc`` + ``layers.0.*``, often with a copy of the embedding, pickle),
sglang-EAGLE (the same as safetensors), yuhuili EAGLE-3 and SpecForge EAGLE-3 (``midlayer.*``,
``norm``, ``lm_head``, ``d2t``, ``t2d``; SpecForge adds ``eagle_config`` and may add ``fc_norm``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

EAGLE3_LAYOUTS = ("yuhuili", "specforge", "specforge_fc_norm")
EAGLE1_LAYOUTS = ("yuhuili", "sglang")


def _rand(gen: torch.Generator, *shape: int, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def head_config(target: dict[str, Any], kind: str, *, draft_vocab: int | None = None,
                aux_ids: list[int] | None = None, layout: str = "specforge", bias: bool = True) -> dict[str, Any]:
    H = target["hidden_size"]
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": 2 * H,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": target["vocab_size"],
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if kind == "eagle3":
        cfg["architectures"] = ["LlamaForCausalLMEagle3"]
        cfg["draft_vocab_size"] = draft_vocab or target["vocab_size"]
        if layout.startswith("specforge"):
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids or [1, 2, 4],
                                   "use_aux_hidden_state": True}
    else:
        cfg["architectures"] = ["LlamaForCausalLM"]
        cfg["rope_theta"] = 10000.0
        if not bias:
            cfg["bias"] = False
    return cfg


def head_state(target: dict[str, Any], kind: str, *, draft_vocab: int | None = None, seed: int = 0,
               layout: str = "specforge", bias: bool = True, with_embed: bool = False,
               vocab_ids: list[int] | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    H, V = target["hidden_size"], target["vocab_size"]
    nh, nkv = target["num_attention_heads"], target["num_key_value_heads"]
    hd = H // nh
    inter = 2 * H
    att_in = 2 * H if kind == "eagle3" else H
    p = "midlayer." if kind == "eagle3" else "layers.0."
    sd = {
        p + "self_attn.q_proj.weight": _rand(gen, nh * hd, att_in),
        p + "self_attn.k_proj.weight": _rand(gen, nkv * hd, att_in),
        p + "self_attn.v_proj.weight": _rand(gen, nkv * hd, att_in),
        p + "self_attn.o_proj.weight": _rand(gen, H, nh * hd),
        p + "mlp.gate_proj.weight": _rand(gen, inter, H),
        p + "mlp.up_proj.weight": _rand(gen, inter, H),
        p + "mlp.down_proj.weight": _rand(gen, H, inter),
        p + "post_attention_layernorm.weight": 1 + _rand(gen, H, scale=0.1),
    }
    if kind == "eagle3":
        Vd = draft_vocab or V
        sd.update({
            "fc.weight": _rand(gen, H, 3 * H),
            p + "input_layernorm.weight": 1 + _rand(gen, H, scale=0.1),
            p + "hidden_norm.weight": 1 + _rand(gen, H, scale=0.1),
            "norm.weight": 1 + _rand(gen, H, scale=0.1),
            "lm_head.weight": _rand(gen, Vd, H),
        })
        if Vd < V or layout == "yuhuili":
            used = sorted(vocab_ids) if vocab_ids is not None else sorted(
                torch.randperm(V, generator=gen)[:Vd].tolist())
            sd["d2t"] = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.int64)
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[used] = True
            sd["t2d"] = t2d
        if layout == "specforge_fc_norm":
            for i in range(3):
                sd[f"fc_norm.{i}.weight"] = 1 + _rand(gen, H, scale=0.1)
    else:
        sd["fc.weight"] = _rand(gen, H, 2 * H)
        if bias:
            sd["fc.bias"] = _rand(gen, H, scale=0.1)
        if with_embed:
            sd["embed_tokens.weight"] = _rand(gen, V, H)
    return sd


def write_head(folder: Path, target: dict[str, Any], kind: str, *, layout: str = "specforge",
               draft_vocab: int | None = None, seed: int = 0, aux_ids: list[int] | None = None,
               pickle: bool = False, state: dict[str, torch.Tensor] | None = None,
               config_changes: dict[str, Any] | None = None) -> Path:
    """Write a head folder (config.json + model.safetensors, or pytorch_model.bin with ``pickle``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    bias = layout != "sglang"
    cfg = head_config(target, kind, draft_vocab=draft_vocab, aux_ids=aux_ids, layout=layout, bias=bias)
    cfg.update(config_changes or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = state if state is not None else head_state(
        target, kind, draft_vocab=draft_vocab, seed=seed, layout=layout, bias=bias,
        with_embed=kind == "eagle" and layout == "yuhuili")
    if pickle:
        torch.save(sd, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    return folder


def write_tiny_model(folder: Path, *, vocab: int = 300, layers: int = 6, seed: int = 0, hidden: int = 32,
                     intermediate: int = 64) -> Path:
    """A complete tiny Llama model folder: config.json, model.safetensors and a byte-level BPE tokenizer."""
    from safetensors.torch import save_file
    from test_tokenizer import write_tiny
    from tiny import hf_model

    write_tiny(folder)
    hf, cfg = hf_model("llama", seed, num_hidden_layers=layers, vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=intermediate, eos_token_id=None, bos_token_id=None)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(folder / "model.safetensors"))
    return folder


def write_random_standalone(folder: Path, model_dir: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0
                            ) -> Path:
    """A small random Llama with ``model_dir``'s tokenizer and vocabulary (a standalone draft for tests
    and benchmarks of the drafting machinery: its drafts are rarely right)."""
    import shutil

    from safetensors.torch import save_file

    base = json.loads((model_dir / "config.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab", "merges"))
                            or f.suffix == ".jinja"):
            shutil.copy(f, folder / f.name)
    cfg = {**base, "num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": 2 * hidden,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hidden // 2, "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(seed)
    V, H, I, hd = cfg["vocab_size"], hidden, 2 * hidden, hidden // 2
    sd = {"model.embed_tokens.weight": _rand(gen, V, H), "model.norm.weight": torch.ones(H)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": _rand(gen, 2 * hd, H), p + "self_attn.k_proj.weight": _rand(gen, hd, H),
            p + "self_attn.v_proj.weight": _rand(gen, hd, H), p + "self_attn.o_proj.weight": _rand(gen, H, 2 * hd),
            p + "mlp.gate_proj.weight": _rand(gen, I, H), p + "mlp.up_proj.weight": _rand(gen, I, H),
            p + "mlp.down_proj.weight": _rand(gen, H, I),
            p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
        })
    save_file(sd, str(folder / "model.safetensors"))
    return folder


def write_random_drafts(model_dir: Path, out: Path, *, draft_vocab: int = 8192, seed: int = 0) -> dict[str, Path]:
    """Random EAGLE-1/2 and EAGLE-3 heads and a standalone draft that fit the model in ``model_dir``."""
    target = json.loads((model_dir / "config.json").read_text())
    vocab = min(draft_vocab, target["vocab_size"])
    return {
        "eagle": write_head(out / "eagle", target, "eagle", layout="sglang", seed=seed),
        "eagle3": write_head(out / "eagle3", target, "eagle3", layout="specforge", draft_vocab=vocab, seed=seed,
                             aux_ids=[1, target["num_hidden_layers"] // 2 - 1, target["num_hidden_layers"] - 4]),
        "standalone": write_random_standalone(out / "standalone", model_dir, seed=seed),
    }
