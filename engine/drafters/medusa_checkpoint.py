"""Reading Medusa heads in their two public layouts, and refusing heads that do not fit the target.

* FasterDecoding/Medusa (Medusa-1 and Medusa-2 heads): ``config.json`` with ``medusa_num_heads``,
  ``medusa_num_layers`` and ``base_model_name_or_path``; weights in ``medusa_lm_head.safetensors``
  (or the older pickle ``medusa_lm_head.pt``) named by the ``nn.Sequential`` of each head:
  ``{i}.{j}.linear.weight`` / ``{i}.{j}.linear.bias`` for its ``medusa_num_layers`` residual blocks
  and ``{i}.{L}.weight`` for its own lm_head (no bias), L = ``medusa_num_layers``. A Medusa-2
  export of the head alone may prefix them with ``medusa_head.``.
* vLLM (``MedusaConfig``, ``model_type: medusa``): ``num_heads``, ``num_hidden_layers``,
  ``hidden_size``, ``vocab_size``, optional ``truncated_vocab_size`` with a ``token_map`` tensor (the
  draft vocabulary's target ids), ``medusa_fc_bias`` and ``original_lm_head`` (one shared lm_head);
  weights ``blocks.{i}.layers.{j}.weight`` (``.bias``), ``lm_heads.{i}.weight`` (or ``lm_head.weight``),
  optionally under ``medusa_heads.``.

Both mean the same computation: head i is ``x <- x + SiLU(W_j x + b_j)`` for each block j, then its
lm_head; it reads the target's last hidden state (after the final norm) and guesses the token i+1
places after the next one. Every check runs before anything is built, so a head that does not fit
is refused with one line naming the mismatch and a running session keeps its old drafter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from engine.drafters.eagle_checkpoint import DraftLoadError

MedusaLayout = Literal["medusa", "vllm"]  # FasterDecoding / vLLM
MEDUSA_FILE = "medusa_lm_head.safetensors"
MEDUSA_PICKLE = "medusa_lm_head.pt"
_FD_KEY = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")
_VLLM_KEY = re.compile(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)|lm_heads\.(\d+)\.weight|token_map")


@dataclass(frozen=True)
class MedusaSpec:
    """What one Medusa checkpoint is: its layout, how many heads of how many blocks, and its vocabulary."""

    layout: MedusaLayout
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int  # the target vocabulary the heads were trained for
    head_vocab: int  # rows of each lm_head (vLLM's truncated_vocab_size; else vocab_size)
    source: str = ""


@dataclass
class MedusaWeights:
    """The heads' weights stacked for batched products (one call for all heads, no per-head loop)."""

    blocks: torch.Tensor  # [K, L, H, H] residual-block weights
    biases: torch.Tensor  # [K, L, H] (zeros where the checkpoint has none)
    lm_heads: torch.Tensor  # [K, Vh, H]
    token_map: torch.Tensor | None  # [Vh] target ids of the head vocabulary, None = identity


def is_medusa_config(config: Mapping[str, Any]) -> bool:
    archs = " ".join(config.get("architectures") or [])
    return "medusa_num_heads" in config or config.get("model_type") == "medusa" or "Medusa" in archs


def medusa_layout(keys: set[str]) -> MedusaLayout | None:
    """Which public layout the weight names follow (None: not a Medusa head)."""
    stripped = {_strip(k) for k in keys}
    fd = [k for k in stripped if _FD_KEY.fullmatch(k)]
    if any(k.endswith(".linear.weight") for k in fd) or (stripped and len(fd) == len(stripped)):
        return "medusa"
    if any(k.startswith(("blocks.", "lm_heads.")) for k in stripped):
        return "vllm"
    return None


def _strip(key: str) -> str:
    for prefix in ("medusa_head.", "medusa_heads."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def read_medusa_state(folder: Path, *, allow_pickle: bool, header: bool = False) -> dict[str, torch.Tensor]:
    """The head's tensors: ``medusa_lm_head.safetensors``, else the folder's ``model.safetensors``
    (vLLM), else a pickle (``medusa_lm_head.pt``) only with ``allow_pickle``, loaded weights-only.
    ``header``: ``meta`` tensors read from the files' headers (checking before the target loads)."""
    from engine.models.checkpoint import CheckpointError, load_state_dict, read_state_header, safetensors_header

    path = folder / MEDUSA_FILE
    try:
        if path.is_file():
            if header:
                return safetensors_header(path)
            from safetensors.torch import load_file

            return load_file(str(path))
        return (read_state_header if header else load_state_dict)(folder, allow_pickle=allow_pickle)
    except CheckpointError as e:
        raise DraftLoadError(str(e)) from None
    except Exception as e:  # SafetensorError comes from Rust without a stable base class
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DraftLoadError(f"{path} is not a valid safetensors file ({reason}); re-download it") from None


def read_medusa(config: Mapping[str, Any], state: Mapping[str, torch.Tensor], *, target: Any, source: str = ""
                ) -> tuple[MedusaSpec, MedusaWeights]:
    """Validate a Medusa checkpoint against ``target`` (a LlamaConfig); raise DraftLoadError naming
    the first mismatch, or return its spec and stacked weights (float32, on the CPU)."""
    weights = {_strip(k): v for k, v in state.items()}
    if "lm_head.weight" in weights and "lm_heads.0.weight" not in weights:  # vLLM's original_lm_head
        weights["lm_heads.0.weight"] = weights.pop("lm_head.weight")
    layout = medusa_layout(set(weights))
    if layout is None:
        raise DraftLoadError(f"{source} is not a Medusa head (no {{i}}.{{j}}.linear.weight or blocks.{{i}}.layers.* "
                             "weights)")
    spec = _spec(config, weights, layout, target, source)
    unknown = sorted(k for k in weights if not (_FD_KEY if layout == "medusa" else _VLLM_KEY).fullmatch(k))
    if unknown:
        raise DraftLoadError(f"{source} has weights a Medusa head does not have ({', '.join(unknown[:3])}); "
                             "is it the right file?")
    block, bias, lm = _names(spec, config)
    K, L = spec.num_heads, spec.num_layers
    wanted = [block(i, j) for i in range(K) for j in range(L)] + [lm(i) for i in range(K)]
    missing = [k for k in wanted if k not in weights]
    if missing:
        raise DraftLoadError(f"{source} is missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}; "
                             f"its config says {K} heads of {L} block{'s' if L != 1 else ''}")
    extra = sorted(k for k in weights if _index(k) is not None and _index(k) >= K)  # type: ignore[operator]
    if extra:
        raise DraftLoadError(f"{source} has weights for more heads than its config's {K} ({extra[0]}); "
                             "fix num_heads in its config.json")
    H = spec.hidden_size
    token_map = _token_map(spec, weights, source)
    for key in [block(i, j) for i in range(K) for j in range(L)]:
        _shape(weights, key, (H, H), source)
    for key in [bias(i, j) for i in range(K) for j in range(L)]:
        if key in weights:
            _shape(weights, key, (H,), source)
    lm_rows = []
    for i in range(K):
        w = weights[lm(i)]
        if layout == "vllm" and token_map is not None and w.shape[0] == spec.vocab_size:
            w = w[token_map]  # vLLM slices a full-vocabulary lm_head with the token map
        _shape({lm(i): w}, lm(i), (spec.head_vocab, H), source)
        lm_rows.append(w)

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float32)

    blocks = torch.stack([torch.stack([f32(weights[block(i, j)]) for j in range(L)]) if L else torch.zeros(0, H, H)
                          for i in range(K)])
    biases = torch.stack([torch.stack([f32(weights[bias(i, j)]) if bias(i, j) in weights else torch.zeros(H)
                                       for j in range(L)]) if L else torch.zeros(0, H) for i in range(K)])
    return spec, MedusaWeights(blocks, biases, torch.stack([f32(w) for w in lm_rows]), token_map)


def _spec(config: Mapping[str, Any], weights: Mapping[str, torch.Tensor], layout: MedusaLayout, target: Any,
          source: str) -> MedusaSpec:
    """Heads, blocks and widths from config.json (FasterDecoding configs name no widths: the weights do)."""
    if layout == "medusa":
        heads, layers = config.get("medusa_num_heads"), config.get("medusa_num_layers", 1)
    else:  # vLLM's MedusaConfig reads any "num..heads" / "num..layers" key as these two
        heads = _num_key(config, "heads", "num_heads")
        layers = _num_key(config, "layers", "num_hidden_layers")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise DraftLoadError(f"{source}/config.json names no number of heads (medusa_num_heads or num_heads); "
                             "is it a Medusa head's config?")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise DraftLoadError(f"{source}/config.json has a bad number of blocks per head: {layers!r}")
    lm0 = weights.get(f"0.{layers}.weight" if layout == "medusa" else "lm_heads.0.weight",
                      weights.get("lm_head.weight"))
    block0 = weights.get("0.0.linear.weight" if layout == "medusa" else "blocks.0.layers.0.weight")
    width = lm0 if lm0 is not None else block0
    hidden = int(config.get("hidden_size") or (width.shape[-1] if width is not None else target.hidden_size))
    if hidden != target.hidden_size:
        raise DraftLoadError(f"{source} has hidden size {hidden} but the target has {target.hidden_size}; "
                             "these heads were trained for another model")
    vocab = int(config.get("vocab_size") or (lm0.shape[0] if lm0 is not None else 0)) if layout == "vllm" else \
        int(lm0.shape[0]) if lm0 is not None else target.vocab_size
    if vocab != target.vocab_size:
        raise DraftLoadError(f"{source} has vocabulary size {vocab} but the target has {target.vocab_size}; "
                             "these heads were trained for another model")
    head_vocab = int(config.get("truncated_vocab_size") or vocab) if layout == "vllm" else vocab
    if not 1 <= head_vocab <= vocab:
        raise DraftLoadError(f"{source}: truncated_vocab_size {head_vocab} must be between 1 and the vocabulary "
                             f"({vocab})")
    return MedusaSpec(layout, heads, layers, hidden, vocab, head_vocab, source)


def _num_key(config: Mapping[str, Any], what: str, default: str) -> Any:
    if default in config:
        return config[default]
    return next((v for k, v in config.items() if "num" in k and what in k), 1 if what == "layers" else None)


def _names(spec: MedusaSpec, config: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """Key-name functions (block(i, j), bias(i, j), lm(i)) for the checkpoint's layout."""
    L = spec.num_layers
    if spec.layout == "medusa":
        return (lambda i, j: f"{i}.{j}.linear.weight", lambda i, j: f"{i}.{j}.linear.bias",
                lambda i: f"{i}.{L}.weight")
    shared = bool(config.get("original_lm_head", False))
    return (lambda i, j: f"blocks.{i}.layers.{j}.weight", lambda i, j: f"blocks.{i}.layers.{j}.bias",
            (lambda i: "lm_heads.0.weight") if shared else (lambda i: f"lm_heads.{i}.weight"))


def _index(key: str) -> int | None:
    """The head a key belongs to (None for shared tensors)."""
    m = re.match(r"(?:blocks\.|lm_heads\.)?(\d+)\.", key)
    return int(m.group(1)) if m else None


def _shape(weights: Mapping[str, torch.Tensor], key: str, shape: tuple[int, ...], source: str) -> None:
    if tuple(weights[key].shape) != shape:
        raise DraftLoadError(f"{source}: {key} has shape {tuple(weights[key].shape)}, expected {shape} from its "
                             "config and the target")


def _token_map(spec: MedusaSpec, weights: Mapping[str, torch.Tensor], source: str) -> torch.Tensor | None:
    """vLLM's draft vocabulary (target ids), required when truncated_vocab_size < vocab_size."""
    if spec.head_vocab == spec.vocab_size:
        return None
    ids = weights.get("token_map")
    if ids is None:
        raise DraftLoadError(f"{source} has truncated_vocab_size {spec.head_vocab} < {spec.vocab_size} but no "
                             "token_map tensor; re-export the heads with their token_map")
    ids = ids.to(torch.int64).flatten()
    if ids.numel() != spec.head_vocab:
        raise DraftLoadError(f"{source}: token_map has {ids.numel()} ids but truncated_vocab_size is "
                             f"{spec.head_vocab}")
    if ids.is_meta:  # checked from the header: the values are read at load
        return ids
    if int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size or len(set(ids.tolist())) != ids.numel():
        raise DraftLoadError(f"{source}: token_map holds ids outside the vocabulary or repeats one; the file is "
                             "corrupt")
    return ids
