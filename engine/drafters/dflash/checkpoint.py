"""Reading DFlash drafters in their public layouts, and refusing one made for another target.

Two layouts, the same weights (``fc``, ``hidden_norm``, ``layers.N.{input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.*}``, ``norm``;
no embedding, no LM head: the target's are used):

* **z-lab** (``z-lab/*-DFlash*`` on the hub, what SGLang's DFLASH and the reference load):
  config.json is a Qwen3 config of the draft layers with ``architectures: ["DFlashDraftModel"]``,
  ``block_size`` (also read from ``dflash_config``, as SGLang does), ``num_target_layers`` and
  ``dflash_config: {target_layer_ids, mask_token_id}``; a target layer id names the layer whose
  *output* is read (HF's ``hidden_states[id + 1]``), and without ids z-lab's default spread is used.
* **speculators** (vLLM's ``speculators`` export): ``speculators_model_type: "dflash"``, the draft
  layers' config under ``transformer_layer_config``, ``block_size``, ``mask_token_id``,
  ``aux_hidden_state_layer_ids`` (layer *inputs*: z-lab's ids + 1, as vLLM converts them),
  ``target_hidden_size``, ``draft_vocab_size``; a reduced vocabulary adds ``lm_head.weight`` and
  ``d2t`` (draft index + d2t = target id).

Every check runs from config.json and the weights' headers, before the target loads, and refuses
in one line what would not draft for this target: another width, vocabulary or layer count, layer
ids past the target's, no mask token, and the variants specchat does not run (sliding-window or
causal draft layers, DFlash2's selector, Domino, DSpark's anchor-first blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.drafters.dflash.model import DFlashSpec, default_target_layer_ids, weight_shapes
from engine.drafters.eagle_checkpoint import DraftLoadError
from engine.models.llama_config import ModelConfigError, shape_fields
from engine.models.rope import rope_inv_freq

Z_LAB = "z-lab"
SPECULATORS = "speculators"
# frozen copies of the target's tensors (or implied by others) a checkpoint may carry: never used
_IGNORED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight", "t2d")


def is_dflash_config(config: Mapping[str, Any]) -> bool:
    """Whether config.json is a DFlash drafter's, in either layout (DFlash2 and other variants are
    claimed too, so that they are refused by name rather than taken for a language model)."""
    archs = " ".join(str(a) for a in config.get("architectures") or [])
    return ("DFlash" in archs or "dflash_config" in config
            or str(config.get("speculators_model_type", "")).lower() == "dflash")


def layout_of(config: Mapping[str, Any]) -> str:
    return SPECULATORS if str(config.get("speculators_model_type", "")).lower() == "dflash" else Z_LAB


def read_dflash(config: Mapping[str, Any], state: Mapping[str, torch.Tensor], target: Any, source: str
                ) -> tuple[DFlashSpec, dict[str, torch.Tensor]]:
    """The drafter's spec and weights, checked against ``target`` (a LlamaConfig); DraftLoadError
    (one line) at the first thing that does not fit. ``state`` may hold meta tensors (shapes read
    from the safetensors headers): then only the shapes are checked."""
    layout = layout_of(config)
    _refuse_variants(config, layout, source)
    weights = {_strip(k): v for k, v in state.items() if _strip(k) not in _IGNORED}
    spec = _spec(config, layout, weights, target, source)
    _check_fit(spec, config, target, source)
    _check_weights(spec, weights, source)
    return spec, weights


def _strip(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def _dflash_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = config.get("dflash_config")
    return cfg if isinstance(cfg, Mapping) else {}


def _draft_config(config: Mapping[str, Any], layout: str) -> Mapping[str, Any]:
    """The draft layers' own config: the file itself (z-lab) or its transformer_layer_config."""
    if layout == Z_LAB:
        return config
    inner = config.get("transformer_layer_config")
    if not isinstance(inner, Mapping):
        raise DraftLoadError("config.json has no transformer_layer_config; it is not a complete speculators "
                             "DFlash export")
    return inner


def _refuse_variants(config: Mapping[str, Any], layout: str, source: str) -> None:
    """DFlash relatives whose forward differs from the one specchat runs, named in one line."""
    dflash = {**_dflash_config(config), **(config if layout == SPECULATORS else {})}
    draft = _draft_config(config, layout)
    archs = " ".join(str(a) for a in config.get("architectures") or [])
    variant = ""
    if "DFlash2" in archs or dflash.get("selector_rank") or dflash.get("conv_kernel_size"):
        variant = "a DFlash2 drafter (a candidate selector and convolutions)"
    elif dflash.get("projector_type") not in (None, "dflash"):
        variant = f"a {dflash['projector_type']} drafter (projector_type {dflash['projector_type']!r})"
    elif dflash.get("sample_from_anchor") is True:
        variant = "a drafter whose anchor position is sampled too (DSpark's block layout, sample_from_anchor)"
    elif "sliding_attention" in (draft.get("layer_types") or []) or dflash.get("use_swa"):
        variant = "a drafter with sliding-window layers"
    elif dflash.get("causal") is True or draft.get("is_causal") is True:
        variant = "a drafter with causal attention inside the block"
    elif dflash.get("attention_sink_bias"):
        variant = "a drafter with attention sinks"
    elif str(draft.get("hidden_act", "silu")) != "silu":
        variant = f"a drafter with {draft['hidden_act']} activations"
    if variant:
        raise DraftLoadError(f"{source} is {variant}; specchat runs DFlash drafters of the z-lab / speculators "
                             "layout only (full bidirectional attention over the block, SiLU MLPs)")


def _spec(config: Mapping[str, Any], layout: str, weights: Mapping[str, torch.Tensor], target: Any,
          source: str) -> DFlashSpec:
    try:
        return _read_spec(config, layout, weights, target, source)
    except DraftLoadError:
        raise
    except ModelConfigError as e:  # a zero width, heads that do not divide it, ...
        raise DraftLoadError(f"{source}/{e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise DraftLoadError(f"{source}/config.json lacks or mangles {e}; is it a DFlash drafter's config?") from None


def _read_spec(config: Mapping[str, Any], layout: str, weights: Mapping[str, torch.Tensor], target: Any,
               source: str) -> DFlashSpec:
    draft = _draft_config(config, layout)
    dflash = _dflash_config(config)
    shape = shape_fields(draft, vocab_size=target.vocab_size, max_positions=target.max_position_embeddings)
    rope_inv_freq(shape["head_dim"], shape["rope_theta"], shape["rope_scaling"], shape["max_position_embeddings"])
    num_layers = int(draft["num_hidden_layers"])
    block = dflash.get("block_size", config.get("block_size"))
    if block is None:
        raise DraftLoadError(f"{source}/config.json names no block_size; is it a DFlash drafter's config?")
    if layout == SPECULATORS:
        aux = config.get("aux_hidden_state_layer_ids")
        if not aux:
            raise DraftLoadError(f"{source}/config.json names no aux_hidden_state_layer_ids (the target layers "
                                 "the drafter reads)")
        capture = tuple(_int(i, "aux_hidden_state_layer_ids") for i in aux)
        mask = config.get("mask_token_id")
    else:
        ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
        if ids is None:
            ids = default_target_layer_ids(_num_target_layers(config) or target.num_layers, num_layers)
        capture = tuple(_int(i, "target_layer_ids") + 1 for i in ids)
        mask = dflash.get("mask_token_id", config.get("mask_token_id"))
    if mask is None:
        raise DraftLoadError(f"{source}/config.json names no mask_token_id (dflash_config.mask_token_id): the "
                             "drafter's mask token is not known")
    lm_head = weights.get("lm_head.weight")
    reduced = config.get("draft_vocab_size")
    if lm_head is None and isinstance(reduced, int) and 0 < reduced < shape["vocab_size"]:
        raise DraftLoadError(f"{source} has a reduced draft vocabulary ({reduced} of {shape['vocab_size']}) but no "
                             "lm_head.weight; re-export it with its lm_head and d2t")
    return DFlashSpec(
        **shape, num_layers=num_layers, block_size=_int(block, "block_size"), capture_layers=capture,
        mask_token_id=_int(mask, "mask_token_id"), attention_bias=bool(draft.get("attention_bias", False)),
        draft_vocab_size=int(lm_head.shape[0]) if lm_head is not None else 0, layout=layout, source=source)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} (not an integer: {value!r})")
    return value


def _num_target_layers(config: Mapping[str, Any]) -> int | None:
    n = _dflash_config(config).get("num_target_layers", config.get("num_target_layers"))
    return None if n is None else _int(n, "num_target_layers")


def _check_fit(spec: DFlashSpec, config: Mapping[str, Any], target: Any, source: str) -> None:
    """The drafter against the target: its width, vocabulary, layers and mask token."""
    made_for = "; this drafter was made for another model"
    if spec.hidden_size != target.hidden_size:
        raise DraftLoadError(f"{source} has hidden size {spec.hidden_size} but the target has {target.hidden_size}"
                             f"{made_for}")
    width = config.get("target_hidden_size")
    if width is not None and width != target.hidden_size:
        raise DraftLoadError(f"{source} reads target features of width {width} but the target's hidden size is "
                             f"{target.hidden_size}{made_for}")
    if spec.vocab_size != target.vocab_size:
        raise DraftLoadError(f"{source} has vocabulary size {spec.vocab_size} but the target has "
                             f"{target.vocab_size}{made_for}")
    layers = _num_target_layers(config)
    if layers is not None and layers != target.num_layers:
        raise DraftLoadError(f"{source} was made for a target of {layers} layers; the target has "
                             f"{target.num_layers}{made_for}")
    if not spec.capture_layers:
        raise DraftLoadError(f"{source}/config.json lists no target layers to read")
    low = 0 if spec.layout == SPECULATORS else 1  # z-lab ids are layer outputs (0..L-1), speculators' inputs
    if any(not low <= c <= target.num_layers for c in spec.capture_layers):
        ids = list(spec.capture_layers) if spec.layout == SPECULATORS else list(spec.target_layer_ids)
        name = "aux_hidden_state_layer_ids" if spec.layout == SPECULATORS else "target_layer_ids"
        raise DraftLoadError(f"{source}: {name} {ids} name layers the target does not have (it has "
                             f"{target.num_layers}){made_for}")
    if not 0 <= spec.mask_token_id < target.vocab_size:
        raise DraftLoadError(f"{source}: mask_token_id {spec.mask_token_id} is outside the target's vocabulary "
                             f"(0..{target.vocab_size - 1}){made_for}")
    if spec.block_size < 2:
        raise DraftLoadError(f"{source}: block_size {spec.block_size} drafts nothing (a block is the anchor and "
                             "at least one position to guess)")
    if spec.draft_vocab_size > spec.vocab_size:
        raise DraftLoadError(f"{source}: its lm_head has {spec.draft_vocab_size} rows, more than the vocabulary "
                             f"({spec.vocab_size})")


def _check_weights(spec: DFlashSpec, weights: Mapping[str, torch.Tensor], source: str) -> None:
    expected = weight_shapes(spec)
    missing = [k for k in expected if k not in weights]
    if missing:
        raise DraftLoadError(f"{source} is missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}; "
                             f"it is not a complete DFlash drafter of {spec.num_layers} layers")
    unknown = sorted(k for k in weights if k not in expected)
    if unknown:
        raise DraftLoadError(f"{source} has weights a DFlash drafter does not have ({', '.join(unknown[:3])}); "
                             "is it the right file?")
    for key, shape in expected.items():
        if tuple(weights[key].shape) != shape:
            raise DraftLoadError(f"{source}: {key} has shape {tuple(weights[key].shape)}, expected {shape} from its "
                                 "config.json")
    d2t = weights.get("d2t")
    if d2t is not None and not d2t.is_meta:  # checked from the header: the values are read at load
        ids = d2t.long() + torch.arange(spec.draft_vocab_size)
        if int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size:
            raise DraftLoadError(f"{source}: d2t maps draft ids outside the vocabulary; the file is corrupt")
