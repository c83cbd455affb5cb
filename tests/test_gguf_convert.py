"""engine.models.gguf_convert: GGUF -> safetensors/config/tokenizer.

Fast tests write a tiny random llama GGUF (F32 plus one F16 and one Q8_0 tensor, and a tiny
byte-level BPE vocabulary) and check the conversion against the weights it was built from; the
q/k row permutation is checked against RoPE itself. The slow test converts the embedded SmolLM2
GGUF and compares every tensor with what transformers' own GGUF loader produces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.models.gguf_convert import (
    GGUFConversionError,
    convert_gguf,
    hf_tensor_name,
    permute_rope_rows,
    unpermute_rope_rows,
)
from engine.tokenizer import Tokenizer, _unicode_to_byte

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 32, 4, 2, 2, 64
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> list[str]:
    byte_chars = sorted(_unicode_to_byte(), key=_unicode_to_byte().__getitem__)
    return [*SPECIALS, *byte_chars, *(a + b for a, b in MERGES)]


def hf_weights(vocab: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with Hugging Face names and layouts."""
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    w = {"model.embed_tokens.weight": r(vocab, HIDDEN), "model.norm.weight": r(HIDDEN)}
    if not tied:
        w["lm_head.weight"] = r(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = r(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = r(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = r(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = r(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = r(FFN, HIDDEN)
        w[p + "mlp.up_proj.weight"] = r(FFN, HIDDEN)
        w[p + "mlp.down_proj.weight"] = r(HIDDEN, FFN)
        w[p + "input_layernorm.weight"] = r(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = r(HIDDEN)
    return w


GGUF_NAME = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip
QUANTIZED = {
    "model.layers.1.mlp.down_proj.weight": gguf.GGMLQuantizationType.Q8_0,
    "model.layers.0.mlp.up_proj.weight": gguf.GGMLQuantizationType.F16,
}


def to_gguf_name(hf: str) -> str:
    glob = {v: k for k, v in {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
            "model.norm.weight", "output.weight": "lm_head.weight"}.items()}  # fmt: skip
    if hf in glob:
        return glob[hf]
    _, _, layer, *mid, kind = hf.split(".")
    return f"blk.{layer}.{GGUF_NAME['.'.join(mid)]}.{kind}"


def write_tiny_gguf(
    path: Path,
    *,
    tied: bool = True,
    tokenizer: bool = True,
    arch: str = "llama",
    extra: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny llama GGUF the way llama.cpp's converter would; returns the HF-layout weights
    each converted tensor must equal (quantized ones as dequantized)."""
    vocab = tiny_vocab()
    weights = hf_weights(len(vocab), tied)
    expected: dict[str, np.ndarray] = {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(vocab))
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab)
        w.add_token_types([3] * len(SPECIALS) + [1] * (len(vocab) - len(SPECIALS)))
        w.add_token_merges([f"{a} {b}" for a, b in MERGES])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML)
    for hf, arr in weights.items():
        stored = arr
        if ".q_proj." in hf:  # llama.cpp's converter reorders q/k rows for its RoPE layout
            stored = permute_rope_rows(arr, HEADS)
        elif ".k_proj." in hf:
            stored = permute_rope_rows(arr, KV_HEADS)
        qtype = QUANTIZED.get(hf)
        if qtype is None:
            w.add_tensor(to_gguf_name(hf), stored)
            expected[hf] = arr
        else:
            q = gguf.quants.quantize(stored, qtype)
            w.add_tensor(to_gguf_name(hf), q, raw_dtype=qtype)
            expected[hf] = gguf.quants.dequantize(q, qtype).reshape(arr.shape)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


# names and permutation ---------------------------------------------------------------------
def test_names() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.3.attn_norm.weight") == "model.layers.3.input_layernorm.weight"
    assert hf_tensor_name("blk.1.ffn_down.weight") == "model.layers.1.mlp.down_proj.weight"
    assert hf_tensor_name("rope_freqs.weight") is None
    assert hf_tensor_name("blk.1.ffn_gate_exps.weight") is None


@pytest.mark.parametrize(("heads", "head_dim", "cols"), [(1, 2, 3), (4, 8, 5), (3, 64, 0), (9, 64, 7)])
def test_unpermute_inverts_permute(heads: int, head_dim: int, cols: int) -> None:
    rng = np.random.default_rng(heads)
    shape = (heads * head_dim, cols) if cols else (heads * head_dim,)
    w = rng.standard_normal(shape).astype(np.float32)
    assert np.array_equal(unpermute_rope_rows(permute_rope_rows(w, heads), heads), w)
    if head_dim > 2:
        assert not np.array_equal(permute_rope_rows(w, heads), w)


def _rope_halves(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    """Hugging Face RoPE on one head: dimension i pairs with i + d/2."""
    d = x.shape[0]
    theta = pos * base ** (-np.arange(d // 2) * 2 / d)
    a, b = x[: d // 2], x[d // 2 :]
    return np.concatenate([a * np.cos(theta) - b * np.sin(theta), b * np.cos(theta) + a * np.sin(theta)])


def _rope_adjacent(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    """llama.cpp's (normal-mode) RoPE on one head: dimension 2i pairs with 2i + 1."""
    d = x.shape[0]
    theta = pos * base ** (-np.arange(d // 2) * 2 / d)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = a * np.cos(theta) - b * np.sin(theta)
    out[1::2] = b * np.cos(theta) + a * np.sin(theta)
    return out


def test_permutation_maps_hf_rope_onto_llamacpp_rope() -> None:
    """The reason for the permutation: llama.cpp's RoPE on GGUF-ordered rows equals HF's RoPE on
    HF-ordered rows, up to the same reordering, so q.k products (and attention) agree."""
    rng = np.random.default_rng(0)
    heads, head_dim, hidden = 3, 16, 24
    w_hf = rng.standard_normal((heads * head_dim, hidden))
    x = rng.standard_normal(hidden)
    w_gguf = permute_rope_rows(w_hf, heads)
    for pos in (0, 1, 7, 100):
        q_hf = (w_hf @ x).reshape(heads, head_dim)
        q_gg = (w_gguf @ x).reshape(heads, head_dim)
        hf_rot = np.concatenate([_rope_halves(h, pos, 10000.0) for h in q_hf])
        gg_rot = np.concatenate([_rope_adjacent(h, pos, 10000.0) for h in q_gg])
        np.testing.assert_allclose(unpermute_rope_rows(gg_rot, heads), hf_rot, rtol=1e-10, atol=1e-10)


# conversion of a tiny GGUF -------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_convert_weights_and_config(tmp_path: Path, tied: bool) -> None:
    expected = write_tiny_gguf(tmp_path / "tiny.gguf", tied=tied, tokenizer=False)
    calls: list[tuple[str, int, int]] = []
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", tokenizer=False,
                       progress=lambda d, i, n: calls.append((d, i, n)))  # fmt: skip
    state = load_file(str(out / "model.safetensors"))
    assert state.keys() == expected.keys()
    for name, arr in expected.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], torch.from_numpy(arr)), name
    n = len(expected)
    assert calls[0][1:] == (0, n) and calls[-1][1:] == (n, n) and len(calls) == n + 1

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is tied
    want = {
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "max_position_embeddings": 256,
        "vocab_size": len(tiny_vocab()), "torch_dtype": "float32",
    }  # fmt: skip
    assert {k: config[k] for k in want} == want
    assert not (out / "tokenizer.json").exists()


def test_convert_with_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    write_tiny_gguf(tmp_path / "tiny.gguf")
    calls: list[tuple[str, int, int]] = []
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=lambda *a: calls.append(a))
    assert calls[-2:] == [("building the tokenizer", 0, 1), ("building the tokenizer", 1, 1)]
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHATML
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["bos_token"] == "<|im_start|>"
    assert (out / "chat_template.jinja").read_text() == CHATML

    tok = Tokenizer.from_dir(out)
    assert tok.stop_token_ids == frozenset({2})
    ids = tok.encode(" the in a")
    assert [tok.backend.id_to_token(i) for i in ids] == ["Ġthe", "Ġ", "in", "Ġa"]
    assert tok.decode(ids) == " the in a"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_matches_transformers_gguf_loader(tmp_path: Path) -> None:
    """transformers reads the same tiny GGUF into the same tensors (an independent check of the
    name mapping and of the q/k un-permutation)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    write_tiny_gguf(tmp_path / "tiny.gguf", tied=False)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", tokenizer=False)
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    theirs = model.state_dict()
    ours = load_file(str(out / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_unsupported_architecture(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", tokenizer=False, arch="gemma")
    with pytest.raises(GGUFConversionError, match="architecture 'gemma' is not supported"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", tokenizer=False)


def test_unknown_tensor(tmp_path: Path) -> None:
    extra = {"rope_freqs.weight": np.ones(HEAD_DIM // 2, dtype=np.float32)}
    write_tiny_gguf(tmp_path / "tiny.gguf", tokenizer=False, extra=extra)
    with pytest.raises(GGUFConversionError, match=r"rope_freqs\.weight"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", tokenizer=False)


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(GGUFConversionError, match=r"not a (readable )?GGUF"):  # our reader speaks first now
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out")


# the embedded SmolLM2 --------------------------------------------------------------------------
def _embedded_gguf() -> Path:
    from engine.models.resolve import ModelResolutionError, embedded_gguf

    try:
        return embedded_gguf()[0]
    except ModelResolutionError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_embedded_conversion_matches_transformers(tmp_path_factory: pytest.TempPathFactory) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.models.resolve import resolve_model

    src = _embedded_gguf()
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECCHAT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "specchat-cache"))
    ticks: list[tuple[str, int, int]] = []
    try:
        out = resolve_model(None, progress=lambda d, i, n: ticks.append((d, i, n))).path
    finally:
        mp.undo()
    if ticks:  # converted here rather than by an earlier test of this session
        assert ticks[-1] == ("building the tokenizer", 1, 1)
        assert [t for t in ticks if t[1:] == (272, 272)]  # one tick per tensor

    ours = load_file(str(out / "model.safetensors"))
    reference: dict[str, Any] = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name).state_dict()
    reference.pop("lm_head.weight")  # tied: the same tensor as the embedding
    assert ours.keys() == reference.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name

    ours_cfg = AutoConfig.from_pretrained(str(out))
    ref_cfg = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):  # fmt: skip
        assert getattr(ours_cfg, key) == getattr(ref_cfg, key), key
    assert ours_cfg.rms_norm_eps == pytest.approx(ref_cfg.rms_norm_eps, rel=1e-6)
    theta = getattr(ours_cfg, "rope_theta", None) or ours_cfg.rope_parameters["rope_theta"]
    assert theta == 100000.0
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
