"""GGUF files read by their metadata: ``general.architecture`` picks the family, the tensor names
and the value conventions; a family we do not run is refused before any tensor is read; Gemma's
SentencePiece vocabulary and chat template come from the file.

The GGUFs are written here, from tiny random transformers models, the way llama.cpp's converter
writes them (its tensor names spelled out below, not taken from the code under test), and read
back into our forward, whose logits must equal transformers' on the original weights.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gemma3 import hf_gemma
from tiny import hf_model

from engine.models.families import model_for_config
from engine.models.gemma3 import Gemma3Model
from engine.models.gguf_convert import GGUFConversionError, convert_gguf, permute_rope_rows
from engine.models.gguf_weights import load_gguf_state
from engine.models.llama import LlamaModel
from engine.tokenizer import Tokenizer

# llama.cpp's names (gguf-py's TENSOR_NAMES) for the HF modules of a layer
LLAMACPP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}  # fmt: skip
GEMMA3 = LLAMACPP | {
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}  # fmt: skip
GLOBALS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def gguf_name(hf: str, arch: str) -> str:
    if hf in GLOBALS:
        return GLOBALS[hf]
    _, _, layer, *module, kind = hf.split(".")
    return f"blk.{layer}.{(GEMMA3 if arch.startswith('gemma') else LLAMACPP)['.'.join(module)]}.{kind}"


def write_gguf(path: Path, arch: str, model: torch.nn.Module, cfg: dict[str, Any], *,
               vocab: list[tuple[str, float, int]] | None = None, extra: dict[str, np.ndarray] | None = None) -> None:
    """``model``'s weights as llama.cpp writes them for ``arch``: q/k rows reordered for llama-style
    RoPE (llama, mistral), Gemma's norms stored as 1 + w, no output.weight when tied."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if vocab:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list([t for t, _, _ in vocab])
        w.add_token_scores([s for _, s, _ in vocab])
        w.add_token_types([k for _, _, k in vocab])
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        arr = t.detach().numpy().astype(np.float32)
        if arch in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
            arr = permute_rope_rows(arr, heads if ".q_proj." in name else kv)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            arr = arr + np.float32(1)
        w.add_tensor(gguf_name(name, arch), arr)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_gemma(**overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """What a Gemma 3 GGUF can describe: llama.cpp's fixed pattern (every sixth layer global), local
    base 10000, queries scaled by the head size."""
    return hf_gemma(0, num_hidden_layers=6, layer_types=None, rope_local_base_freq=10000.0,
                    query_pre_attn_scalar=16, rope_theta=1e6, **overrides)


IDS = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(4))


def our_logits(path: Path) -> tuple[torch.Tensor, LlamaModel]:
    config, state = load_gguf_state(path)
    parsed, cls = model_for_config(config)
    model = cls(parsed, state, weights="stored")
    return model.forward(IDS, model.new_cache(40)).logits, model


def their_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS[None]).logits[0]


# families by metadata --------------------------------------------------------------------------
def test_a_gemma3_gguf_runs_on_our_gemma_forward(tmp_path: Path) -> None:
    hf, cfg = tiny_gemma()
    write_gguf(tmp_path / "g.gguf", "gemma3", hf, cfg)
    logits, ours = our_logits(tmp_path / "g.gguf")
    assert isinstance(ours, Gemma3Model)
    assert list(ours.config.layer_types) == hf.config.layer_types and ours.config.sliding_window == 6
    torch.testing.assert_close(logits, their_logits(hf), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_ggufs_are_read_by_their_architecture(tmp_path: Path, family: str) -> None:
    """qwen2/qwen3 files keep HF's q/k row order (llama.cpp rotates them NeoX-style), llama and
    mistral files reorder them; qwen2 has q/k/v biases, qwen3 q/k norms."""
    hf, cfg = hf_model(family)
    write_gguf(tmp_path / "m.gguf", family, hf, cfg)
    logits, ours = our_logits(tmp_path / "m.gguf")
    assert type(ours) is LlamaModel and ours.config.model_type == family
    torch.testing.assert_close(logits, their_logits(hf), atol=1e-4, rtol=1e-4)


def test_a_gemma3_gguf_converts_to_a_folder_transformers_runs(tmp_path: Path) -> None:
    """The --backend hf route (and --weights fp32): the converted folder is a Gemma3ForCausalLM
    whose weights equal those transformers' own GGUF loader reads."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    hf, cfg = tiny_gemma()
    write_gguf(tmp_path / "g.gguf", "gemma3", hf, cfg)
    out = convert_gguf(tmp_path / "g.gguf", tmp_path / "out", tokenizer=False)
    folder = transformers.AutoModelForCausalLM.from_pretrained(str(out)).float().eval()
    assert type(folder).__name__ == "Gemma3ForCausalLM"
    torch.testing.assert_close(their_logits(folder), their_logits(hf), atol=1e-4, rtol=1e-4)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="g.gguf").state_dict()
    for name, tensor in folder.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


# refusals ----------------------------------------------------------------------------------------
def test_an_architecture_we_do_not_run_is_refused_before_any_tensor_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.models import gguf_weights
    from engine.models.resolve import ModelResolutionError, resolve_model

    hf, cfg = hf_model("llama")
    write_gguf(tmp_path / "phi.gguf", "phi3", hf, cfg)

    def no_tensors(*_: Any, **__: Any) -> None:
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(gguf_weights, "quant_rows", no_tensors)
    monkeypatch.setattr(gguf, "GGUFReader", no_tensors)  # the converter's slow reader: never reached
    want = (r"architecture 'phi3' is not supported: specchat runs llama, mistral, qwen2, qwen3, gemma3 GGUFs"
            ".*--backend hf")
    with pytest.raises(GGUFConversionError, match=want):
        load_gguf_state(tmp_path / "phi.gguf")
    with pytest.raises(GGUFConversionError, match=want):
        convert_gguf(tmp_path / "phi.gguf", tmp_path / "out")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelResolutionError, match=r"^cannot use phi\.gguf: GGUF architecture 'phi3'") as info:
        resolve_model(str(tmp_path / "phi.gguf"), weights="stored")
    assert "\n" not in str(info.value) and "convert" not in str(info.value)


def test_a_tensor_the_family_does_not_use_is_named(tmp_path: Path) -> None:
    hf, cfg = tiny_gemma()
    write_gguf(tmp_path / "g.gguf", "gemma3", hf, cfg, extra={"blk.0.ffn_gate_exps.weight": np.ones(4, np.float32)})
    with pytest.raises(GGUFConversionError, match=r"tensors a gemma3_text model does not use \(blk\.0\.ffn_gate_exps"):
        load_gguf_state(tmp_path / "g.gguf")


# Gemma's SentencePiece vocabulary ---------------------------------------------------------------
SPECIALS = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 2),
            ("<start_of_turn>", 0.0, 3), ("<end_of_turn>", 0.0, 3)]
BYTES = [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
CHARS = ["▁", "a", "b", "c"]
PIECES = ["ab", "bc", "abc", "▁a", "▁ab", "ca", "aa", "▁abc", "cab", "▁▁"]  # earlier = merged first


def gemma_vocab() -> list[tuple[str, float, int]]:
    chars = [(c, -100.0 - i, 1) for i, c in enumerate(CHARS)]
    pieces = [(p, -1.0 - i, 1) for i, p in enumerate(PIECES)]
    return [*SPECIALS, *BYTES, *chars, *pieces]


def sentencepiece_bpe(text: str, vocab: list[tuple[str, float, int]]) -> list[int]:
    """SentencePiece's BPE, written out: spaces become ▁, characters outside the vocabulary fall
    back to their UTF-8 bytes, then the adjacent pair whose join scores highest merges, leftmost
    first, until no join is in the vocabulary."""
    ids = {t: i for i, (t, _, kind) in enumerate(vocab) if kind == 1}
    score = {t: s for t, s, kind in vocab if kind == 1}
    pieces = list(text.replace(" ", "▁"))
    while True:
        joins = [(score[a + b], -i) for i, (a, b) in enumerate(itertools.pairwise(pieces)) if a + b in score]
        if not joins:
            break
        i = -max(joins)[1]
        pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
    out: list[int] = []
    for p in pieces:
        out += [ids[p]] if p in ids else [len(SPECIALS) + b for b in p.encode()]
    return out


@pytest.fixture(scope="module")
def gemma_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("tok")
    hf, cfg = tiny_gemma(vocab_size=len(gemma_vocab()))
    write_gguf(tmp / "g.gguf", "gemma3", hf, cfg, vocab=gemma_vocab())
    return Tokenizer.from_dir(convert_gguf(tmp / "g.gguf", tmp / "out", weights=False))


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc é", max_size=16))
def test_the_gguf_vocabulary_tokenizes_as_sentencepiece_does(gemma_tokenizer: Tokenizer, text: str) -> None:
    ids = gemma_tokenizer.encode(text)
    assert ids == sentencepiece_bpe(text, gemma_vocab())
    assert gemma_tokenizer.decode(ids) == text


def test_the_chat_template_and_stop_tokens_come_with_the_vocabulary(gemma_tokenizer: Tokenizer) -> None:
    """The file carries no template (like the published Gemma 3 270M): Gemma 3's own is used."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc"},
                {"role": "assistant", "content": "ab"}, {"role": "user", "content": "ca"}]
    assert gemma_tokenizer.apply_chat_template(messages) == (
        "<bos><start_of_turn>user\nbe brief\n\nabc<end_of_turn>\n<start_of_turn>model\nab<end_of_turn>\n"
        "<start_of_turn>user\nca<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = gemma_tokenizer.encode_chat([{"role": "user", "content": "ab"}])
    assert ids[:2] == [2, 4] and 5 in ids  # <bos> <start_of_turn> ... <end_of_turn>
    assert {1, 5} <= gemma_tokenizer.stop_token_ids


# --backend hf for a family only transformers runs ------------------------------------------------
def test_a_family_transformers_reads_runs_with_backend_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 2 is not ours; transformers reads its GGUFs: refused on our forward with the route,
    run through transformers with --backend hf (config, tokenizer and weights from the file)."""
    transformers = pytest.importorskip("transformers")
    from engine.loader import load_model
    from engine.models.hf import HFModel
    from engine.models.resolve import ModelResolutionError

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    cfg = {"vocab_size": len(gemma_vocab()), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 8, "tie_word_embeddings": True}
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model("gemma2", **cfg), attn_implementation="eager").float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    write_gguf(tmp_path / "g2.gguf", "gemma2", hf, cfg, vocab=gemma_vocab())
    with pytest.raises(ModelResolutionError, match="add --backend hf to run it through transformers"):
        load_model(str(tmp_path / "g2.gguf"), device="cpu", threads=1)
    loaded = load_model(str(tmp_path / "g2.gguf"), device="cpu", backend="hf", threads=1)
    assert loaded.backend == "hf" and isinstance(loaded.model, HFModel)
    assert loaded.tokenizer.encode(" abc") == sentencepiece_bpe(" abc", gemma_vocab())
    assert type(loaded.model.net).__name__ == "Gemma2ForCausalLM"
    theirs = hf.state_dict()
    for name, tensor in loaded.model.net.state_dict().items():  # the weights are the file's
        torch.testing.assert_close(tensor, theirs[name], atol=1e-6, rtol=1e-6)
    out = loaded.model.forward(IDS % len(gemma_vocab()), loaded.model.new_cache(40)).logits
    assert out.shape == (len(IDS), len(gemma_vocab())) and bool(out.isfinite().all())


def test_a_family_nobody_here_reads_says_so(tmp_path: Path) -> None:
    hf, cfg = hf_model("llama")
    write_gguf(tmp_path / "x.gguf", "rwkv9", hf, cfg)
    with pytest.raises(GGUFConversionError, match="transformers cannot read it either"):
        load_gguf_state(tmp_path / "x.gguf")
