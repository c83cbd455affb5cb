"""The EAGLE-3 draft head as a trainable module, and its export in the public EAGLE-3 layout.

Parameter names equal the public checkpoint keys (``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d``), so export is a dtype cast and the file loads in SGLang,
vLLM and our own loader without a name map. The target's embedding is passed in, never stored.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import MissingFileError, UserError
from engine.files import SMALL_LIMIT, read_text
from engine.jsonl import loads

MIN_EAGLE3_LAYERS = 5  # low/mid/high features need layers 2, L//2 and L-3 apart


class TargetTooSmallError(UserError, ValueError):
    """The target has too few layers for the head asked for; the message says how many it needs."""


def default_aux_layer_ids(num_layers: int, reader: str = "an EAGLE-3 head") -> list[int]:
    """Low/mid/high target layers, "output of layer i" convention (SpecForge's default).

    The features are the residual stream entering layers ids+1 = (2, L//2, L-3), EAGLE-3's choice.
    ``reader``: what reads them, as the refusal of a too shallow target names it.
    """
    if num_layers < MIN_EAGLE3_LAYERS:
        raise TargetTooSmallError(f"{reader} needs a target with at least {MIN_EAGLE3_LAYERS} layers (this "
                                  f"one has {num_layers}); pick a deeper model, or train Medusa heads "
                                  "(--method medusa)")
    return [1, num_layers // 2 - 1, num_layers - 4]


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layer_ids: list[int]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int, intermediate_size: int | None = None,
                   aux_layer_ids: list[int] | None = None) -> HeadConfig:
        """Match the target's width and attention shape (the target embedding feeds the head)."""
        c = target_config
        heads = int(c.num_attention_heads)
        return cls(
            hidden_size=int(c.hidden_size),
            intermediate_size=int(intermediate_size or c.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
            vocab_size=int(c.vocab_size),
            draft_vocab_size=int(draft_vocab_size),
            aux_layer_ids=list(aux_layer_ids or default_aux_layer_ids(int(c.num_hidden_layers))),
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-5)),
            max_position_embeddings=int(getattr(c, "max_position_embeddings", 4096)),
        )

    def to_public(self, dtype: str) -> dict[str, Any]:
        """config.json in the EAGLE-3 layout SGLang / SpecForge / our loader read."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                             "use_aux_hidden_state": True},
            **self.extra,
        }

    @classmethod
    def from_public(cls, d: dict[str, Any]) -> HeadConfig:
        heads = int(d["num_attention_heads"])
        eagle = d.get("eagle_config") or {}
        return cls(
            hidden_size=int(d["hidden_size"]), intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=heads, num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            vocab_size=int(d["vocab_size"]), draft_vocab_size=int(d["draft_vocab_size"]),
            aux_layer_ids=list(eagle.get("eagle_aux_hidden_state_layer_ids") or []),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)), rope_theta=float(d.get("rope_theta") or 10000.0),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Attn(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        H, nh, nkv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        H, eps = c.hidden_size, c.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(H, eps=eps)
        self.hidden_norm = nn.RMSNorm(H, eps=eps)
        self.self_attn = _Attn(c)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.mlp = _MLP(c)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Eagle3Head(nn.Module):
    """One decoder layer over (target embedding, feature) pairs, unrolled for training-time test."""

    def __init__(self, c: HeadConfig, used_ids: torch.Tensor) -> None:
        super().__init__()
        self.config = c
        H = c.hidden_size
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = nn.RMSNorm(H, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        d2t, t2d = vocab_maps(used_ids, c.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    @property
    def used_ids(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, heads, N, hd], pos [N]: HF rotate-half RoPE at the draft's own theta."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return x * ang.cos() + _rotate_half(x) * ang.sin()

    def ttt_forward(self, embeds: torch.Tensor, features: torch.Tensor, steps: int,
                    keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits [B, N, Vd] for TTT steps 0..steps-1, N = T - 1 draft positions; with ``keep``
        ([B, N] bool) only the kept positions' logits, [K, Vd] in row-major order.

        embeds [B, T, H]: target embedding of x_0..x_{T-1}; features [B, T, 3H] (f_0..f_{T-1}).
        Index p at step i reads token x_{p+1+i} (zero past the end; masked by the caller) and, for
        i = 0, fc(f_p), else its own previous pre-norm output; it sits at RoPE position p+i and
        attends to step-0 keys 0..p plus its own keys from steps 1..i; it predicts x_{p+2+i}.
        """
        c, m = self.config, self.midlayer  # norms get fp32 inputs: under bf16 autocast a bf16 input
        B, T, H = embeds.shape             # with an fp32 weight misses torch's fused RMS norm
        N = T - 1
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        rep = nh // nkv
        scale = hd**-0.5
        h = self.fc(features[:, :N])
        pad = embeds.new_zeros(B, steps, H)
        emb_all = torch.cat([embeds, pad], dim=1)
        causal = torch.ones(N, N, dtype=torch.bool, device=embeds.device).tril()
        base = torch.arange(N, device=embeds.device)
        k0 = v0 = None
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        out = []
        for i in range(steps):
            e = emb_all[:, 1 + i:1 + i + N]
            a = torch.cat([m.input_layernorm(e.float()), m.hidden_norm(h.float())], dim=-1)
            att = m.self_attn
            q = att.q_proj(a).view(B, N, nh, hd).transpose(1, 2)
            k = att.k_proj(a).view(B, N, nkv, hd).transpose(1, 2)
            v = att.v_proj(a).view(B, N, nkv, hd).transpose(1, 2)
            pos = base + i
            q, k = self._rope(q, pos), self._rope(k, pos)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            if i == 0:
                k0, v0 = k, v
                scores = torch.matmul(q, k0.transpose(-1, -2)) * scale
                scores = scores.masked_fill(~causal, float("-inf"))
                o = torch.matmul(torch.softmax(scores, dim=-1), v0)
            else:
                diag_k.append(k)
                diag_v.append(v)
                s0 = (torch.matmul(q, k0.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
                sd = torch.stack([(q * kj).sum(-1) for kj in diag_k], dim=-1) * scale  # [B, nh, N, i]
                w = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
                o = torch.matmul(w[..., :N], v0) + (w[..., N:, None] * torch.stack(diag_v, dim=-2)).sum(-2)
            h1 = h + att.o_proj(o.transpose(1, 2).reshape(B, N, nh * hd))
            g = h1 + m.mlp(m.post_attention_layernorm(h1.float()))
            out.append(self.lm_head(self.norm((g if keep is None else g[keep]).float())))
            h = g
        return out

    def reset_parameters_from_target(self, target_lm_head: torch.Tensor, target_norm: torch.Tensor | None) -> None:
        """Start the draft's LM head from the target's rows for the draft vocabulary (a warm start:
        the head's output lives in the target's residual space, so this is already a fair guess)."""
        with torch.no_grad():
            self.lm_head.weight.copy_(target_lm_head[self.used_ids.to(target_lm_head.device)].to(self.lm_head.weight))
            if target_norm is not None:
                self.norm.weight.copy_(target_norm.to(self.norm.weight))
            for lin in (self.fc, self.midlayer.self_attn.q_proj, self.midlayer.self_attn.k_proj,
                        self.midlayer.self_attn.v_proj, self.midlayer.mlp.gate_proj, self.midlayer.mlp.up_proj):
                nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.weight.shape[1]))
            # residual branches start small so the first steps do not scramble the stream
            for lin in (self.midlayer.self_attn.o_proj, self.midlayer.mlp.down_proj):
                nn.init.normal_(lin.weight, std=0.1 / math.sqrt(lin.weight.shape[1]))


# vocabulary maps ---------------------------------------------------------------------------------
def draft_vocab(counts: torch.Tensor, size: int, keep: set[int] | frozenset[int] = frozenset()) -> torch.Tensor:
    """The ``size`` most frequent target ids (``keep`` always in), sorted ascending by id."""
    vocab = counts.shape[0]
    size = min(size, vocab)
    score = counts.double().clone()
    for k in keep:
        score[k] = float("inf")
    # a stable sort keeps ties in id order, so the choice is deterministic
    order = torch.argsort(-score, stable=True)[:size]
    return torch.as_tensor(order, dtype=torch.int64).sort().values


def refit_vocabulary(head: Eagle3Head, used_ids: torch.Tensor, target_lm_head: torch.Tensor,
                     ridge: float = 1e-3) -> Eagle3Head:
    """The same head over another draft vocabulary ``used_ids`` (sorted target ids): its body as
    is, its LM head rows kept for the tokens that stay, and for the new ones the target's rows
    mapped into the head's space by a linear map fitted (ridge least squares) on the tokens in both.

    Why: a head continued with ``--init-from`` keeps the vocabulary its first run chose from that
    run's little data. The shipped head's 8,192 tokens covered 90.7% of the 7.1M answer tokens it
    was later trained on and 87.8% of the MT-bench answers; the 8,192 most frequent answer tokens
    cover 95.9% and 92.4%, and a draft outside the vocabulary is never accepted. The new rows need
    a start that does not steal the argmax: the target's own rows (cosine 0.32 to the head's
    trained ones) took the head's replayed MT-bench tau from 2.24 to 1.31, the mapped rows (cosine
    0.96 on the shared tokens) keep 2.24; training then teaches them (the body never learned the
    positions whose answer was outside the old vocabulary)."""
    new = torch.as_tensor(used_ids, dtype=torch.int64).cpu()
    old = head.used_ids.cpu()
    out = Eagle3Head(replace(head.config, draft_vocab_size=int(new.numel())), new)
    body = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = out.load_state_dict(body, strict=False)
    assert set(missing) == {"lm_head.weight", "d2t", "t2d"} and not unexpected, (missing, unexpected)
    rows = head.lm_head.weight.detach().float().cpu()
    W = target_lm_head.detach().float().cpu()
    X = W[old]
    gram = X.T @ X
    lam = ridge * float(gram.diagonal().mean())
    A = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0]), X.T @ rows)  # W[t] @ A ~ the head's row of t
    fresh = W[new] @ A
    where = torch.full((int(W.shape[0]),), -1, dtype=torch.int64)
    where[old] = torch.arange(old.numel())
    at = where[new]
    stays = at >= 0
    fresh[stays] = rows[at[stays]]
    with torch.no_grad():
        out.lm_head.weight.copy_(fresh)
    return out.to(head.d2t.device)


def vocab_maps(used_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t (int64 [Vd], target = draft + d2t[draft]) and t2d (bool [V]) for sorted ``used_ids``."""
    used = torch.as_tensor(used_ids, dtype=torch.int64)
    if used.numel() > 1 and not bool((used[1:] > used[:-1]).all()):
        raise ValueError("draft vocabulary ids must be strictly ascending")
    d2t = used - torch.arange(used.numel(), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


# export ------------------------------------------------------------------------------------------
EXPORT_KEYS = (
    "fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "norm.weight", "lm_head.weight", "d2t", "t2d",
)


def export_head(head: Eagle3Head, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                card: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors (EAGLE-3 layout); files are replaced atomically."""
    import os

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = head.state_dict()
    tensors = {k: (sd[k].detach().to("cpu", dtype).contiguous() if sd[k].is_floating_point()
                   else sd[k].detach().cpu().contiguous()) for k in EXPORT_KEYS}
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
    save_file(tensors, str(out / "model.safetensors.part"), metadata={"format": "pt"})
    os.replace(out / "model.safetensors.part", out / "model.safetensors")
    cfg = head.config.to_public(name)
    if card:
        cfg["specchat_training"] = card
    (out / "config.json.part").write_text(json.dumps(cfg, indent=2) + "\n")
    os.replace(out / "config.json.part", out / "config.json")
    return out


def load_exported(folder: str | Path) -> Eagle3Head:
    """Read back an exported head (fp32), for tests and for continuing from an export."""
    from safetensors.torch import load_file

    folder = Path(folder)
    missing = [name for name in ("config.json", "model.safetensors") if not (folder / name).is_file()]
    if missing:
        raise MissingFileError(f"{folder} is not an exported head: no {' or '.join(missing)} in it")
    text = read_text(folder / "config.json", limit=SMALL_LIMIT, what="a head's config.json")
    cfg = HeadConfig.from_public(loads(text))
    sd = load_file(str(folder / "model.safetensors"))
    used = torch.arange(cfg.draft_vocab_size) + sd["d2t"]
    head = Eagle3Head(cfg, used)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
    return head
