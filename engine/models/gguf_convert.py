"""Convert a GGUF file of a family we run (llama, mistral, qwen2, qwen3, gemma3) into a plain
Hugging Face folder, its architecture read from the file's ``general.architecture``.

Why convert at all: our engine runs its own PyTorch model code on float32 weights, and a folder
with ``config.json`` + ``model.safetensors`` + tokenizer files is the one format every other part
of the project (checkpoint loader, tokenizer, reference tests against transformers) understands.
The GGUF is dequantized once, so a Q4_1 file becomes exact float32 copies of the quantized
values: the converted model computes what the GGUF computes, not what the original fp16 model did.

Two details matter for correctness:

* llama.cpp's converter reorders the rows of ``attn_q``/``attn_k`` so that its RoPE can rotate
  adjacent pairs (x[2i], x[2i+1]); Hugging Face Llama rotates the two halves of each head
  (x[i], x[i + d/2]). :func:`unpermute_rope_rows` undoes that reordering.
* GGUF stores no ``output.weight`` when the LM head is tied to the embedding, so its absence sets
  ``tie_word_embeddings``.
* llama.cpp stores Gemma's norm weights as ``1 + w``; the Hugging Face checkpoint holds ``w``, so
  the 1 is taken off (as transformers' own GGUF loader does) and the model adds it back.

Which of these apply, and how tensors are named, is per architecture (:data:`GGUF_FAMILIES`); an
architecture we do not run is refused from the metadata alone, before any tensor is read.

The tokenizer is rebuilt with transformers (imported lazily: it is slow to import and only this
one-off step needs it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import UserError
from engine.models.chat_templates import BY_ARCHITECTURE
from engine.models.progress import ProgressCallback, report
from engine.tokenizer import CHAT_END_TOKENS

# Bumped whenever the output of the converter changes, so cached conversions are redone.
CONVERTER_VERSION = 1

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")


@dataclass(frozen=True)
class GGUFFamily:
    """How one GGUF architecture maps onto a Hugging Face checkpoint."""

    model_type: str  # config.json's model_type
    hf_class: str  # transformers' class, for config.json's architectures
    permuted_qk: bool  # llama.cpp reordered q/k rows for its pairwise rotation (llama-style RoPE)
    blocks: Mapping[str, str]  # GGUF block tensor kind -> HF module path inside a layer
    norm_shift: float = 0.0  # GGUF norm weight = HF weight + this (Gemma: 1)


GGUF_FAMILIES: dict[str, GGUFFamily] = {
    "llama": GGUFFamily("llama", "LlamaForCausalLM", True, _BLOCK_NAMES),
    "mistral": GGUFFamily("mistral", "MistralForCausalLM", True, _BLOCK_NAMES),
    "qwen2": GGUFFamily("qwen2", "Qwen2ForCausalLM", False, _BLOCK_NAMES),
    "qwen3": GGUFFamily("qwen3", "Qwen3ForCausalLM", False, _BLOCK_NAMES | _QK_NORMS),
    "gemma3": GGUFFamily("gemma3_text", "Gemma3ForCausalLM", False, _BLOCK_NAMES | _QK_NORMS | _GEMMA_NORMS,
                         norm_shift=1.0),
}
SUPPORTED_ARCHITECTURES = tuple(GGUF_FAMILIES)


class GGUFConversionError(UserError, ValueError):
    """The GGUF cannot be converted; the message says why and what to use instead."""


class ForeignArchitectureError(GGUFConversionError):
    """A GGUF of a family our forward does not run (transformers may: ``--backend hf``)."""


def hf_tensor_name(gguf_name: str, family: GGUFFamily = GGUF_FAMILIES["llama"]) -> str | None:
    """The Hugging Face name of a GGUF tensor in ``family``, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in family.blocks:
        return None
    return f"model.layers.{m.group(1)}.{family.blocks[m.group(2)]}.{m.group(3)}"


def gguf_family(meta: Mapping[str, Any]) -> GGUFFamily:
    """The family ``general.architecture`` names; one line naming the families we run otherwise.
    Called on the metadata alone, so a file we cannot run costs no tensor reading."""
    arch = meta.get("general.architecture")
    family = GGUF_FAMILIES.get(str(arch))
    if family is None:
        route = (f"add --backend hf to run it through transformers, which reads {arch} GGUFs"
                 if transformers_reads(str(arch)) else
                 "transformers cannot read it either: run the model's Hugging Face folder or hub id with --backend hf")
        raise ForeignArchitectureError(
            f"GGUF architecture {arch!r} is not supported: specchat runs {', '.join(GGUF_FAMILIES)} GGUFs; {route}"
        )
    return family


def transformers_reads(arch: str) -> bool:
    """Whether the installed transformers loads GGUFs of this architecture (imported only here,
    on the way to an error or to --backend hf: the import takes seconds)."""
    try:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    except ImportError:
        return False
    return arch in GGUF_CONFIG_MAPPING and arch not in ("general", "tokenizer")


def runs_architecture(path: Path) -> bool:
    """Whether our forward runs this GGUF's family (read from the metadata alone; an unreadable
    file answers True, so that the converter reports what is wrong with it)."""
    from engine.models.gguf_file import GGUFFormatError, read_gguf

    try:
        return str(read_gguf(Path(path)).metadata.get("general.architecture")) in GGUF_FAMILIES
    except GGUFFormatError:
        return True


def hf_names(gguf_names: list[str], family: GGUFFamily) -> dict[str, str]:
    """GGUF tensor name -> HF name for a whole file; refuses tensors the family has no use for."""
    names = {n: hf_tensor_name(n, family) for n in gguf_names}
    unknown = [n for n, hf in names.items() if hf is None]
    if unknown:
        raise GGUFConversionError(
            f"the file has tensors a {family.model_type} model does not use ({', '.join(unknown[:4])}); "
            "the file is damaged or made for a variant specchat does not run"
        )
    return {n: hf for n, hf in names.items() if hf is not None}


def to_hf_values(w: Any, gguf_name: str, family: GGUFFamily, config: Mapping[str, Any]) -> Any:
    """A GGUF tensor's values (numpy rows, or stored rows with a ``rows`` method) as the HF
    checkpoint holds them: q/k rows back in HF's order, Gemma's norm shift taken off."""
    kind = gguf_name.split(".")[-2]
    if family.norm_shift and gguf_name.endswith("norm.weight"):
        return w - np.float32(family.norm_shift)
    if family.permuted_qk and kind in ("attn_q", "attn_k"):
        heads = config["num_attention_heads"] if kind == "attn_q" else config["num_key_value_heads"]
        if isinstance(w, np.ndarray):
            return unpermute_rope_rows(w, heads)
        return w.rows(torch.from_numpy(np.ascontiguousarray(unpermute_rope_rows(np.arange(w.shape[0]), heads))))
    return w


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF -> llama.cpp row order: within each head, interleave the two rotary halves.

    Only the tests and fixture writers need this direction; it is the exact inverse of
    :func:`unpermute_rope_rows`.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp -> HF row order for ``attn_q``/``attn_k`` (weights or biases).

    In GGUF, head h's rows are pairs (r0 of half A, r0 of half B, r1 of A, r1 of B, ...); HF wants
    all of half A then all of half B. ``n_heads`` is the number of heads this projection has
    (query heads for q, key/value heads for k).
    """
    if w.shape[0] % (2 * n_heads):
        raise GGUFConversionError(f"cannot un-permute {w.shape[0]} rows into {n_heads} rotary heads")
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# metadata ---------------------------------------------------------------------------------
def field_value(field: Any) -> Any:
    """Decode one ``GGUFReader`` field into str / int / float / bool / list.

    Written against the reader's stable ``types``/``parts``/``data`` layout rather than
    ``ReaderField.contents()``, which older gguf releases (we allow >= 0.10) lack.
    """
    from gguf import GGUFValueType

    if not field.types:
        return None
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    value = field.parts[field.data[0]].tolist()[0]
    if kind == GGUFValueType.BOOL:
        return bool(value)
    if kind in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        # GGUF stores float32: 1e-5 comes back as 9.999999747378752e-06. The shortest decimal that
        # rounds to the same float32 keeps config.json readable and computes identically.
        return float(str(np.float32(value))) if kind == GGUFValueType.FLOAT32 else float(value)
    return value


def read_metadata(reader: Any, *, with_vocab: bool = False) -> dict[str, Any]:
    """All key/value metadata; the big vocabulary arrays only when ``with_vocab``."""
    big = (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.scores",
    )
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or (key in big and not with_vocab):
            continue
        out[key] = field_value(field)
    return out


def hf_config(meta: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """A transformers config dict (of the family ``general.architecture`` names) built from GGUF
    metadata and tensor shapes."""
    arch = str(meta.get("general.architecture"))
    family = gguf_family(meta)

    def need(key: str) -> Any:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise GGUFConversionError(f"GGUF metadata lacks {arch}.{key}; the file is incomplete")
        return value

    hidden = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    n_kv = int(meta.get(f"{arch}.attention.head_count_kv") or n_heads)
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // n_heads)
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    if rope_dim != head_dim:
        raise GGUFConversionError(
            f"partial rotary embeddings (rope dim {rope_dim} < head dim {head_dim}) are not supported"
        )
    if "model.embed_tokens.weight" not in tensor_shapes:
        raise GGUFConversionError("GGUF has no token_embd.weight tensor")
    vocab = tensor_shapes["model.embed_tokens.weight"][0]

    config: dict[str, Any] = {
        "architectures": [family.hf_class],
        "model_type": family.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta, arch),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "vocab_size": vocab,
        "tie_word_embeddings": "lm_head.weight" not in tensor_shapes,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensor_shapes,
        "mlp_bias": "model.layers.0.mlp.up_proj.bias" in tensor_shapes,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    for ours, key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            config[ours] = int(meta[f"tokenizer.ggml.{key}"])
    config.update(_family_fields(meta, arch, config))
    return config


def _family_fields(meta: Mapping[str, Any], arch: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """What a family's transformers config needs beyond the Llama keys."""
    window = meta.get(f"{arch}.attention.sliding_window")
    if arch == "mistral" and window:
        return {"sliding_window": int(window)}
    if arch in ("qwen2", "qwen3"):
        return {"use_sliding_window": False}
    if arch != "gemma3":
        return {}
    layers = int(config["num_hidden_layers"])
    # llama.cpp writes no pattern for Gemma 3 (it hard-codes every sixth layer global); newer files
    # may carry one, as a period or as one flag per layer (true: sliding)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern") or 6
    if isinstance(pattern, list):
        kinds = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        kinds = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(layers)]
    head_dim = int(config["head_dim"])
    # llama.cpp: queries scaled by 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads)
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == 62 else head_dim
    fields: dict[str, Any] = {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_local_base_freq": 10000.0,  # llama.cpp's fixed base for Gemma 3's sliding layers
        "sliding_window": int(window or 4096),
        "layer_types": kinds,
        "query_pre_attn_scalar": scalar,
    }
    cap = meta.get(f"{arch}.final_logit_softcapping")
    if cap:
        fields["final_logit_softcapping"] = float(cap)
    return fields


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    raise GGUFConversionError(f"rope scaling {kind!r} is not supported by the GGUF converter")


def generation_config(meta: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """eos ids the chat loop must stop on: the GGUF eos plus chat end-of-turn tokens it has."""
    eos: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            eos.append(int(meta[f"tokenizer.ggml.{key}"]))
    index = {tok: i for i, tok in enumerate(tokens) if tok in CHAT_END_TOKENS}
    eos += [index[t] for t in CHAT_END_TOKENS if t in index]
    eos = list(dict.fromkeys(eos))
    out: dict[str, Any] = {}
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        out["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if meta.get("tokenizer.ggml.padding_token_id") is not None:
        out["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    return out


# conversion -------------------------------------------------------------------------------
def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    *,
    progress: ProgressCallback | None = None,
    tokenizer: bool = True,
    description: str = "converting GGUF",
    weights: bool = True,
) -> Path:
    """Write ``model.safetensors`` (fp32), ``config.json``, ``generation_config.json`` and (when
    ``tokenizer``) the tokenizer files for ``gguf_path`` into ``out_dir``; returns ``out_dir``.

    ``out_dir`` is written in place: callers that need atomicity convert into a temporary folder
    and rename it (see engine.models.resolve). Progress ticks once per tensor. ``weights=False``
    writes everything but ``model.safetensors`` (the stored-weights path reads the GGUF itself).
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    _check_architecture(gguf_path, tokenizer=tokenizer)
    try:
        reader = GGUFReader(gguf_path)
    except (OSError, ValueError) as e:
        raise GGUFConversionError(f"{gguf_path} is not a readable GGUF file ({e})") from e
    meta = read_metadata(reader)
    family = gguf_family(meta)
    names = hf_names([t.name for t in reader.tensors], family)
    shapes = {names[t.name]: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    config = hf_config(meta, shapes)

    tensors: dict[str, torch.Tensor] = {}
    total = len(reader.tensors) if weights else 0
    report(progress, description, 0, total)
    for done, t in enumerate(reader.tensors if weights else (), 1):
        try:
            w = dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise GGUFConversionError(f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
        w = to_hf_values(np.asarray(w, dtype=np.float32).reshape(shapes[names[t.name]]), t.name, family, config)
        # copy: the reader's arrays are views into a read-only memory map of the file
        tensors[names[t.name]] = torch.from_numpy(np.array(w, dtype=np.float32, copy=True))
        report(progress, description, done, total)

    out_dir.mkdir(parents=True, exist_ok=True)
    if weights:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    _write_json(out_dir / "config.json", config)

    vocab_field = reader.fields.get("tokenizer.ggml.tokens")
    vocab: list[str] = field_value(vocab_field) if vocab_field is not None else []
    _write_json(out_dir / "generation_config.json", generation_config(meta, vocab))
    if tokenizer:
        if not vocab:
            raise GGUFConversionError(_no_vocabulary(gguf_path))
        report(progress, "building the tokenizer", 0, 1)
        write_tokenizer(gguf_path, out_dir, meta, vocab)
        report(progress, "building the tokenizer", 1, 1)
    return out_dir


def config_from_header(gguf_path: Path) -> dict[str, Any]:
    """The config.json :func:`convert_gguf` writes for ``gguf_path``, from its header alone (our
    fast reader: metadata and tensor shapes, no tensor data, no vocabulary): what the checks made
    before a model loads compare a draft head against. GGUFFormatError / ForeignArchitectureError /
    GGUFConversionError (one line each) for a file that is not one we run."""
    from engine.models.gguf_file import read_gguf

    gguf = read_gguf(Path(gguf_path))
    family = gguf_family(gguf.metadata)
    _check_vocabulary(Path(gguf_path), gguf.metadata)  # convert_gguf would refuse it, after the weights
    names = hf_names([t.name for t in gguf.tensors], family)
    shapes = {names[t.name]: tuple(int(d) for d in reversed(t.shape)) for t in gguf.tensors}
    return hf_config(gguf.metadata, shapes)


def write_transformers_folder(gguf_path: Path, out_dir: Path, *, progress: ProgressCallback | None = None,
                              description: str = "reading the GGUF") -> Path:
    """config.json, generation_config.json and the tokenizer of a GGUF of a family only
    transformers runs (``--backend hf``), written by transformers; it reads the weights from the
    GGUF itself at load. Refuses a family transformers does not read either."""
    import transformers
    from gguf import GGUFReader

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = GGUFReader(gguf_path)
    meta = read_metadata(reader)
    arch = str(meta.get("general.architecture"))
    if not transformers_reads(arch):
        gguf_family(meta)  # the one-line refusal
    report(progress, description, 0, 1)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    finally:
        transformers.logging.set_verbosity(verbosity)
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out_dir))
    vocab_field = reader.fields.get("tokenizer.ggml.tokens")
    vocab: list[str] = field_value(vocab_field) if vocab_field is not None else []
    if not vocab:
        raise GGUFConversionError(_no_vocabulary(gguf_path))
    _write_json(out_dir / "generation_config.json", generation_config(meta, vocab))
    write_tokenizer(gguf_path, out_dir, meta, vocab)
    report(progress, description, 1, 1)
    return out_dir


def _check_architecture(gguf_path: Path, *, tokenizer: bool = True) -> None:
    """Refuse a family we do not run, or (``tokenizer``) a file without a vocabulary, from the metadata
    alone (our fast reader skips the vocabulary; gguf-py's reader, needed for the vocabulary, takes
    seconds on a big one), before any tensor is converted."""
    from engine.models.gguf_file import GGUFFormatError, read_gguf

    try:
        meta = read_gguf(gguf_path).metadata
    except GGUFFormatError as e:  # bounded by the file's size: gguf-py's reader is not (OverflowError)
        raise GGUFConversionError(str(e)) from None
    gguf_family(meta)
    if tokenizer:
        _check_vocabulary(gguf_path, meta)


def _check_vocabulary(gguf_path: Path, meta: dict[str, Any]) -> None:
    """A GGUF must carry its vocabulary (``tokenizer.ggml.tokens``): specchat reads the tokenizer from it.
    Our reader keeps the key of a big array with the value None, a short one as its list."""
    if meta.get("tokenizer.ggml.tokens", []) == []:
        raise GGUFConversionError(_no_vocabulary(gguf_path))


def _no_vocabulary(gguf_path: Path) -> str:
    return (f"{gguf_path.name} has no tokenizer (its metadata holds no vocabulary); use a GGUF file that "
            "includes its vocabulary, or a model folder with tokenizer.json")


def write_tokenizer(gguf_path: Path, out_dir: Path, meta: dict[str, Any], vocab: list[str]) -> None:
    """Rebuild the tokenizer with transformers, then make tokenizer_config.json self-contained.

    A file without a chat template gets its family's (engine/models/chat_templates.py), if fixed.
    transformers >= 5 moves the chat template into chat_template.jinja and names its own backend
    class; we also keep the template (and bos/eos) in tokenizer_config.json and name the class
    ``PreTrainedTokenizerFast`` so that older transformers and other tools read the folder too.
    """
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # it logs every GGUF key it does not map
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tok.save_pretrained(str(out_dir))
    finally:
        transformers.logging.set_verbosity(verbosity)

    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for junk in ("is_local", "local_files_only", "name_or_path", "backend"):
        cfg.pop(junk, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for ours, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= int(token_id) < len(vocab):
            cfg[ours] = vocab[int(token_id)]
    template = meta.get("tokenizer.chat_template") or BY_ARCHITECTURE.get(str(meta.get("general.architecture")))
    if template:
        cfg["chat_template"] = template
        (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    _write_json(path, cfg)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
