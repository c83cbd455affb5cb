"""The shape of a Llama-family decoder, read from a Hugging Face ``config.json``.

Why a module of its own: a target model (:class:`LlamaConfig`) and an EAGLE head (its
``HeadSpec``, engine/drafters/eagle_checkpoint.py) are both Llama decoder layers with a rotary
table, described by the same config.json keys. :class:`DecoderShape` holds those fields and
:func:`shape_fields` reads them once, so the two readers cannot drift apart (an EAGLE head's
default RoPE base, a Qwen ``head_dim``, a ``rope_parameters`` block). It needs no torch, so a
head's spec can be checked before anything heavy is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import UserError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(UserError, ValueError):
    """The checkpoint is not a Llama-family model our forward runs."""


class ModelConfigError(UnsupportedModelError):
    """A config.json of a family we run, with a missing or nonsense value (a zero width, heads
    that do not divide the hidden size). A class of its own because the loader must not hand such
    a config to transformers (``--backend hf``) as it does a foreign family: it is broken, not foreign."""


# config.json's names for the DecoderShape / LlamaConfig fields, for the messages
_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
         "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
         "max_position_embeddings": "max_position_embeddings", "rope_theta": "rope_theta",
         "num_layers": "num_hidden_layers"}


def _culprit(d: Mapping[str, Any]) -> str:
    """" for KEY (VALUE)" naming the first shape field of ``d`` that is no number, so the message
    says which line of config.json to fix ("" where none is: the conversion said more)."""
    for key in (*_KEYS.values(), "rms_norm_eps"):
        value = d.get(key)
        if value is not None and not _is_number(value):
            return f" for {key} ({value!r})"
    return ""


def _is_number(value: Any) -> bool:
    """A number, or text int()/float() read as one ("64" is as good as 64 to the conversion)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _check_positive(obj: object, fields: tuple[str, ...]) -> None:
    """ModelConfigError naming the first of ``fields`` that is not > 0 (what a garbled or
    hand-edited config.json holds; our forward would otherwise answer garbage or crash later)."""
    for name in fields:
        value = getattr(obj, name)
        if not value > 0:  # also catches NaN
            raise ModelConfigError(f"config.json: {_KEYS[name]} must be > 0 (it is {value}); "
                                   "the model's config.json is damaged: re-download or fix it")


@dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """What a Llama decoder layer and its rotary table need: widths, heads, norm epsilon, RoPE."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
                               "head_dim", "max_position_embeddings", "rope_theta"))
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(f"config.json: num_attention_heads {self.num_heads} is not a multiple of "
                                   f"num_key_value_heads {self.num_kv_heads}; the model's config.json is damaged")
        if not self.rms_norm_eps >= 0:
            raise ModelConfigError(f"config.json: rms_norm_eps must be >= 0 (it is {self.rms_norm_eps})")


def shape_fields(d: Mapping[str, Any], *, vocab_size: int | None = None, max_positions: int = 4096
                 ) -> dict[str, Any]:
    """The :class:`DecoderShape` fields of a config.json, as keyword arguments.

    ``vocab_size``: the value to use when the config has none (None: the key is required);
    ``max_positions``: the default context length. A missing required key raises KeyError, a
    mangled value TypeError/ValueError; each caller words those for its own kind of file. The
    RoPE base defaults to 10000 (EAGLE-3 training configs set none: never the target's)."""
    heads = int(d["num_attention_heads"])
    hidden = int(d["hidden_size"])
    if not d.get("head_dim") and heads > 0 and hidden % heads:
        raise ModelConfigError(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                               "(and no head_dim is given); the model's config.json is damaged")
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    return {
        "vocab_size": int(d["vocab_size"]) if vocab_size is None else int(d.get("vocab_size") or vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(d["intermediate_size"]),
        "num_heads": heads,
        "num_kv_heads": int(d.get("num_key_value_heads") or heads),
        "head_dim": int(d.get("head_dim") or (hidden // heads if heads > 0 else 0)),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(d.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        "max_position_embeddings": int(d.get("max_position_embeddings", max_positions)),
        "rope_scaling": dict(scaling) if scaling else None,
    }


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderShape):
    """A target model's config: the decoder shape plus the stack and the vocabulary's specials."""

    model_type: str
    num_layers: int
    tie_word_embeddings: bool
    sliding_window: int | None = None
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, ("num_layers",))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
        try:
            return cls._from_dict(d)
        except KeyError as exc:
            raise ModelConfigError(f"config.json lacks {exc.args[0]!r}; is it a complete model config?") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, UnsupportedModelError):
                raise
            raise ModelConfigError(f"config.json has an invalid value{_culprit(d)} ({exc})") from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
        model_type = str(d.get("model_type", "")).lower()
        if model_type not in SUPPORTED_TYPES:
            archs = ", ".join(d.get("architectures") or []) or model_type or "unknown"
            raise UnsupportedModelError(
                f"model type {archs!r} is not one of the Llama family ({', '.join(SUPPORTED_TYPES)}); "
                "use --backend hf to run it through transformers"
            )
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        sliding = d.get("sliding_window") if d.get("use_sliding_window", model_type == "mistral") else None
        return cls(
            **shape_fields(d),
            model_type=model_type,
            num_layers=int(d["num_hidden_layers"]),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            sliding_window=int(sliding) if sliding else None,
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_ids,
            bos_token_id=d.get("bos_token_id"),
        )
