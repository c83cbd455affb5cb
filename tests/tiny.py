"""Tiny random models of each supported family, built in-process (no downloads).

Each factory returns (hf_model, config_dict): the transformers model in eval mode, fp32, and the
config.json-style dict our loader reads. Sizes are tiny so the whole suite stays fast on 2 cores.
"""

from __future__ import annotations

from typing import Any

import torch

FAMILIES = ("llama", "llama3_scaled", "mistral", "qwen2", "qwen3", "smollm2_tied")

_BASE: dict[str, Any] = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def family_config(family: str) -> dict[str, Any]:
    cfg = dict(_BASE)
    if family == "llama":
        cfg.update(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    elif family == "llama3_scaled":
        cfg.update(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
                   rope_theta=500000.0,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    elif family == "mistral":
        cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], tie_word_embeddings=False,
                   sliding_window=24, head_dim=8)
    elif family == "qwen2":
        cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False,
                   use_sliding_window=False)
    elif family == "qwen3":
        cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True,
                   head_dim=16, attention_bias=False)
    elif family == "smollm2_tied":
        cfg.update(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
                   num_attention_heads=4, num_key_value_heads=1)
    else:
        raise KeyError(family)
    return cfg


def hf_model(family: str, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``overrides`` change config fields (e.g. num_hidden_layers, vocab_size)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**family_config(family), **overrides}
    hf_cfg = AutoConfig.for_model(**cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").float().eval()
    # transformers initialises some weights (norms, biases) to constants: make them random too so
    # the comparison exercises every parameter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model, cfg


def our_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any):
    """(our LlamaModel, hf model) sharing the same random weights."""
    from engine.models.llama import LlamaConfig, LlamaModel

    hf, cfg = hf_model(family, seed, **overrides)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return LlamaModel(LlamaConfig.from_dict(cfg), sd, dtype=dtype), hf


class TinyTokenizer:
    """A stand-in for engine.tokenizer.Tokenizer over a tiny vocabulary: token i is one character.

    Token 2 is the stop token; the chat template is a plain concatenation. Enough for engine tests
    that care about ids, not language.
    """

    def __init__(self, vocab_size: int = 97, stop_ids: frozenset[int] = frozenset({2})) -> None:
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_ids

    def _char(self, i: int) -> str:
        return chr(0x41 + i) if i >= 3 else ""

    def encode(self, text: str) -> list[int]:
        return [(ord(ch) - 0x41) % self.vocab_size for ch in text]

    def decode(self, ids) -> str:
        return "".join(self._char(i) for i in ids)

    def encode_chat(self, messages) -> list[int]:
        ids = [1]
        for m in messages:
            ids += [*self.encode(m["content"]), 0]
        return ids

    def piece(self, token_id: int) -> str:
        return self._char(token_id)

    def incremental_decoder(self, context=()):
        tok = self

        class _Dec:
            def push(self, token_id: int) -> str:
                return tok._char(token_id)

            def flush(self) -> str:
                return ""

        return _Dec()


def check_incremental_decoding(model: Any) -> None:
    """30 random ids: one prefill of 20 then ten one-token steps give the logits one forward over
    all 30 gives (to fp32 rounding: the two runs order their sums differently)."""
    ids = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(2))
    full = model.forward(ids, model.new_cache(64)).logits
    cache = model.new_cache(64)
    model.forward(ids[:20], cache, logits="none")
    cache.commit(20)
    rows = []
    for t in range(20, 30):
        rows.append(model.forward(ids[t : t + 1], cache).logits[0])
        cache.commit(1)
    torch.testing.assert_close(torch.stack(rows), full[20:], atol=1e-4, rtol=1e-4)
