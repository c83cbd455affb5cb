"""Reading EAGLE draft heads in their public layouts, and refusing heads that do not fit the target.

Three layouts are accepted (key names after an optional ``model.`` prefix is stripped):

* EAGLE-1/2 (yuhuili ``EAGLE-*``, ``lmsys/sglang-EAGLE-*``): ``fc`` over concat(embedding,
  feature), one decoder layer ``layers.0.*`` without an input norm; logits come from the
  target's LM head, the feature is the target's last hidden state after its final norm.
* EAGLE-3 (yuhuili ``EAGLE3-*`` and SpecForge/SGLang): ``fc`` over three target features,
  ``midlayer.*`` with ``input_layernorm``/``hidden_norm``, its own ``norm`` and ``lm_head`` over
  the draft vocabulary, ``d2t``/``t2d``; optional ``fc_norm.{0,1,2}`` and ``target_hidden_size``.

Every check runs before anything is built, so a head that does not fit is refused with one line
naming the mismatch and a running session keeps its old drafter. The target's embedding is
always used, even when a checkpoint carries a copy (EAGLE-1 checkpoints often do).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from engine.errors import UserError
from engine.files import JSON_LIMIT, read_text
from engine.jsonl import loads
from engine.models.llama_config import DecoderShape, ModelConfigError, shape_fields

HeadKind = Literal["eagle", "eagle3"]


class DraftLoadError(UserError, RuntimeError):
    """A draft model or head that cannot be used with this target; the message says why and what to do."""


@dataclass(frozen=True, kw_only=True)
class HeadSpec(DecoderShape):
    """The shape and meaning of one EAGLE head, read from its config.json and weights.

    ``vocab_size`` is the target vocabulary the head was trained for; ``draft_vocab_size`` the rows
    of its own lm_head (EAGLE-3), equal to ``vocab_size`` for EAGLE-1/2."""

    kind: HeadKind
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] = ()  # EAGLE-3: "output of layer i" ids, low/mid/high
    fc_bias: bool = False
    fc_norm: bool = False
    source: str = ""

    def capture_layers(self) -> tuple[int, ...]:
        """Target layers whose *input* residual the head reads (output of layer i = input of i+1)."""
        return tuple(i + 1 for i in self.aux_layer_ids)


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default low/mid/high features: inputs of layers 2, L//2, L-3 (as output ids)."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def is_eagle_config(config: Mapping[str, Any]) -> bool:
    archs = " ".join(config.get("architectures") or [])
    return "Eagle" in archs or "draft_vocab_size" in config or "eagle_config" in config


def guess_kind(config: Mapping[str, Any], keys: set[str]) -> HeadKind | None:
    """eagle / eagle3 from the weights (config names are not reliable across exporters)."""
    stripped = {_strip(k) for k in keys}
    if any(k.startswith("midlayer.") for k in stripped):
        return "eagle3"
    if "fc.weight" in stripped and any(k.startswith("layers.0.") for k in stripped):
        return "eagle"
    if "Eagle3" in " ".join(config.get("architectures") or []):
        return "eagle3"
    return None


def _strip(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def read_head(config: Mapping[str, Any], state: Mapping[str, torch.Tensor], *, kind: HeadKind | None,
              target: Any, source: str = "") -> tuple[HeadSpec, dict[str, torch.Tensor]]:
    """Validate a head against ``target`` (a LlamaConfig) and return its spec and weights.

    Raises DraftLoadError naming the first mismatch. ``kind`` None infers it from the weights.
    """
    weights = {_strip(k): v for k, v in state.items()}
    found = guess_kind(config, set(weights))
    if found is None:
        if "embed_tokens.weight" in weights and any(k.startswith("layers.") for k in weights):
            raise DraftLoadError(f"{source} is a full language model, not an EAGLE head; use --method standalone")
        raise DraftLoadError(f"{source} is not an EAGLE head (no fc.weight with layers.0.* or midlayer.* weights)")
    if kind is not None and kind != found:
        raise DraftLoadError(f"{source} holds an {kind_label(found)} head, not {kind_label(kind)}; "
                             f"use --method {found}")
    spec = _spec_from_config(config, weights, found, target, source)
    _check_weights(spec, weights, target, source)
    weights.pop("embed_tokens.weight", None)  # a frozen copy of the target's: always use the target's
    weights.pop("t2d", None)  # implied by d2t
    return spec, weights


def kind_label(kind: HeadKind) -> str:
    return {"eagle": "EAGLE-1/2", "eagle3": "EAGLE-3"}[kind]


def _spec_from_config(config: Mapping[str, Any], weights: Mapping[str, torch.Tensor], kind: HeadKind, target: Any,
                      source: str) -> HeadSpec:
    try:
        return _read_spec(config, weights, kind, target, source)
    except ModelConfigError as e:  # a zero width, heads that do not divide it, ...
        raise DraftLoadError(f"{source}/{e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise DraftLoadError(f"{source}/config.json lacks or mangles {e}; is it an EAGLE head's config?") from None


def _read_spec(config: Mapping[str, Any], weights: Mapping[str, torch.Tensor], kind: HeadKind, target: Any,
               source: str) -> HeadSpec:
    shape = shape_fields(config, vocab_size=target.vocab_size, max_positions=2048)
    eagle_cfg = config.get("eagle_config") or {}
    aux: tuple[int, ...] = ()
    draft_vocab = shape["vocab_size"]
    if kind == "eagle3":
        ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        aux = tuple(int(i) for i in ids) if ids else default_aux_layer_ids(target.num_layers)
        lm = weights.get("lm_head.weight")
        draft_vocab = int(config.get("draft_vocab_size") or (lm.shape[0] if lm is not None else draft_vocab))
    return HeadSpec(
        **shape, kind=kind, draft_vocab_size=draft_vocab,
        target_hidden_size=int(config.get("target_hidden_size") or target.hidden_size), aux_layer_ids=aux,
        fc_bias="fc.bias" in weights, fc_norm=any(k.startswith("fc_norm.") for k in weights), source=source,
    )


def _expected_shapes(spec: HeadSpec) -> dict[str, tuple[int, ...]]:
    H, I = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    if spec.kind == "eagle":
        p, att_in = "layers.0.", H
        shapes: dict[str, tuple[int, ...]] = {"fc.weight": (H, 2 * H)}
    else:
        p, att_in = "midlayer.", 2 * H
        shapes = {
            "fc.weight": (H, 3 * spec.target_hidden_size),
            p + "input_layernorm.weight": (H,),
            p + "hidden_norm.weight": (H,),
            "norm.weight": (H,),
            "lm_head.weight": (spec.draft_vocab_size, H),
        }
    shapes.update({
        p + "self_attn.q_proj.weight": (q, att_in),
        p + "self_attn.k_proj.weight": (kv, att_in),
        p + "self_attn.v_proj.weight": (kv, att_in),
        p + "self_attn.o_proj.weight": (H, q),
        p + "mlp.gate_proj.weight": (I, H),
        p + "mlp.up_proj.weight": (I, H),
        p + "mlp.down_proj.weight": (H, I),
        p + "post_attention_layernorm.weight": (H,),
    })
    return shapes


def _optional_shapes(spec: HeadSpec) -> dict[str, tuple[int, ...]]:
    H = spec.hidden_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    p = "layers.0." if spec.kind == "eagle" else "midlayer."
    out: dict[str, tuple[int, ...]] = {
        "fc.bias": (H,),
        p + "self_attn.q_proj.bias": (q,),
        p + "self_attn.k_proj.bias": (kv,),
        p + "self_attn.v_proj.bias": (kv,),
        "embed_tokens.weight": (spec.vocab_size, H),
    }
    if spec.kind == "eagle3":
        out["d2t"] = (spec.draft_vocab_size,)
        out["t2d"] = (spec.vocab_size,)
        for i in range(len(spec.aux_layer_ids)):
            out[f"fc_norm.{i}.weight"] = (spec.target_hidden_size,)
    return out


def _check_weights(spec: HeadSpec, weights: Mapping[str, torch.Tensor], target: Any, source: str) -> None:
    # fit to the target
    if spec.hidden_size != target.hidden_size:
        raise DraftLoadError(f"{source} has hidden size {spec.hidden_size} but the target has {target.hidden_size}; "
                             "this head was trained for another model")
    if spec.target_hidden_size != target.hidden_size:
        raise DraftLoadError(f"{source} reads target features of width {spec.target_hidden_size} but the target's "
                             f"hidden size is {target.hidden_size}; this head was trained for another model")
    if spec.vocab_size != target.vocab_size:
        raise DraftLoadError(f"{source} has vocabulary size {spec.vocab_size} but the target has "
                             f"{target.vocab_size}; this head was trained for another model")
    required, optional = _expected_shapes(spec), _optional_shapes(spec)
    missing = [k for k in required if k not in weights]
    if missing:
        raise DraftLoadError(f"{source} is missing {', '.join(missing[:3])}"
                             f"{' …' if len(missing) > 3 else ''}; it is not a complete {kind_label(spec.kind)} head")
    unknown = sorted(k for k in weights if k not in required and k not in optional)
    if unknown:
        raise DraftLoadError(f"{source} has weights an {kind_label(spec.kind)} head does not have "
                             f"({', '.join(unknown[:3])}); is it the right file?")
    for key, shape in {**required, **optional}.items():
        if key in weights and tuple(weights[key].shape) != shape:
            raise DraftLoadError(f"{source}: {key} has shape {tuple(weights[key].shape)}, expected {shape} "
                                 "from its config.json")
    if spec.kind == "eagle3":
        if len(spec.aux_layer_ids) != 3:
            raise DraftLoadError(f"{source}: eagle_aux_hidden_state_layer_ids must list 3 layers, "
                                 f"got {list(spec.aux_layer_ids)}")
        bad = [i for i in spec.aux_layer_ids if not 0 <= i + 1 <= target.num_layers]
        if bad:
            raise DraftLoadError(f"{source}: eagle_aux_hidden_state_layer_ids {list(spec.aux_layer_ids)} name layers "
                                 f"the target does not have (it has {target.num_layers})")
        if spec.draft_vocab_size > spec.vocab_size:
            raise DraftLoadError(f"{source}: draft_vocab_size {spec.draft_vocab_size} exceeds the vocabulary "
                                 f"({spec.vocab_size})")
        if spec.draft_vocab_size < spec.vocab_size:
            if "d2t" not in weights:
                raise DraftLoadError(f"{source} has a reduced draft vocabulary ({spec.draft_vocab_size} of "
                                     f"{spec.vocab_size}) but no d2t map; re-export the head with d2t")
            if weights["d2t"].is_meta:  # checked from the header: the values are read at load
                return
            ids = weights["d2t"].long() + torch.arange(spec.draft_vocab_size)
            if int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size:
                raise DraftLoadError(f"{source}: d2t maps draft ids outside the vocabulary; the file is corrupt")


# -- token maps (FR-Spec) -------------------------------------------------------------------------------
def load_token_map(path: str | Path, vocab_size: int, *, allow_pickle: bool = True) -> torch.Tensor:
    """FR-Spec's frequency-ranked target ids (most frequent first), as int64.

    ``.json`` (a list), ``.safetensors`` (one 1-D integer tensor) or ``.pt`` (a pickled list or
    tensor: loaded with ``weights_only=True``, which unpickles only plain containers and tensors).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DraftLoadError(f"token map {path} does not exist; pass a .pt, .json or .safetensors file of token ids")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            ids = torch.tensor(loads(read_text(path, limit=JSON_LIMIT, what="a token map")), dtype=torch.int64)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = list(load_file(str(path)).values())
            if len(tensors) != 1:
                raise DraftLoadError(f"token map {path} must hold exactly one tensor, found {len(tensors)}")
            ids = tensors[0].to(torch.int64)
        elif suffix in (".pt", ".pth"):
            if not allow_pickle:
                raise DraftLoadError(f"token map {path} is a pickle; use a .json or .safetensors copy")
            obj = torch.load(path, map_location="cpu", weights_only=True)
            ids = torch.as_tensor(obj, dtype=torch.int64)
        else:
            raise DraftLoadError(f"token map {path}: unknown format {suffix!r}; use .pt, .json or .safetensors")
    except DraftLoadError:
        raise
    except Exception as e:  # malformed JSON, a pickle that is not a list of ints, ...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DraftLoadError(f"token map {path} could not be read ({reason})") from None
    if ids.dim() != 1 or ids.numel() == 0:
        raise DraftLoadError(f"token map {path} must be a non-empty list of token ids")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftLoadError(f"token map {path} has ids outside the target vocabulary (0..{vocab_size - 1})")
    if len(set(ids.tolist())) != ids.numel():
        raise DraftLoadError(f"token map {path} lists some token ids twice")
    return ids
