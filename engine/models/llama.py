"""Our own forward for the Llama family: Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2.

Why not transformers' modules: speculative decoding needs a forward over an arbitrary draft
tree on top of a cached prefix (positions = prefix length + depth, an ancestor mask), the
hidden states EAGLE heads read, and as little per-call overhead as possible, since on a CPU the
cost of verifying a tree decides whether speculation pays at all. The layer weights are fused
(q|k|v, gate|up) so each layer is three matrix products and a handful of elementwise ops.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from engine.errors import UserError
from engine.kernels import native
from engine.kernels.decoder import NativeDecoder, layer_runs
from engine.kernels.linear import Linear
from engine.kernels.stored import QuantRows, StoredEmbedding, StoredLinear
from engine.models.kv_cache import KVCache
from engine.models.rope import RotaryTable, apply_rotary_interleaved, interleave_halves, rope_inv_freq

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
WeightsMode = Literal["stored", "fp32"]


class UnsupportedModelError(UserError, ValueError):
    """The checkpoint is not a Llama-family model our forward runs."""


@dataclass(frozen=True)
class LlamaConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    sliding_window: int | None = None
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
        try:
            return cls._from_dict(d)
        except KeyError as exc:
            raise UnsupportedModelError(f"config.json lacks {exc.args[0]!r}; is it a complete model config?") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, UnsupportedModelError):
                raise
            raise UnsupportedModelError(f"config.json has an invalid value ({exc})") from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
        model_type = str(d.get("model_type", "")).lower()
        if model_type not in SUPPORTED_TYPES:
            archs = ", ".join(d.get("architectures") or []) or model_type or "unknown"
            raise UnsupportedModelError(
                f"model type {archs!r} is not one of the Llama family ({', '.join(SUPPORTED_TYPES)}); "
                "use --backend hf to run it through transformers"
            )
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        theta = d.get("rope_theta") or rope.get("rope_theta") or 10000.0
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        sliding = d.get("sliding_window") if d.get("use_sliding_window", model_type == "mistral") else None
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            rope_scaling=dict(scaling) if scaling else None,
            sliding_window=int(sliding) if sliding else None,
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_ids,
            bos_token_id=d.get("bos_token_id"),
        )


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # [T, V] float32, or [1, V] when only the last row was asked for
    hidden: torch.Tensor | None = None  # [T, H] last layer after the final norm (EAGLE-1/2 feature)
    aux: list[torch.Tensor] = field(default_factory=list)  # residual entering each captured layer


class _Layer:
    __slots__ = ("down", "gate_up", "k_norm", "ln_attn", "ln_mlp", "o", "q_norm", "qkv")

    def __init__(self, sd: Mapping[str, Any], prefix: str, config: LlamaConfig, dtype: torch.dtype,
                 device: torch.device, stored: bool = False) -> None:
        hd = config.head_dim
        heads = {"q": config.num_heads, "k": config.num_kv_heads}

        def w(name: str) -> Any:
            t = as_weight(sd[prefix + name], stored and name.endswith("_proj.weight"), dtype, device)
            # q/k rows (and biases, and q/k norm weights) go into the rotation-friendly order
            proj = name.split(".")[1][0] if name.startswith("self_attn.") else ""
            if proj in heads and (name.endswith("_proj.weight") or name.endswith("_proj.bias")):
                return interleave_rows(t, heads[proj], hd)
            if proj in heads and name.endswith("_norm.weight"):
                return interleave_halves(t, 1, hd)
            return t

        def maybe(name: str) -> torch.Tensor | None:
            return w(name) if prefix + name in sd else None

        att = "self_attn."
        qkv_w = [w(att + "q_proj.weight"), w(att + "k_proj.weight"), w(att + "v_proj.weight")]
        biases = [maybe(att + f"{p}_proj.bias") for p in "qkv"]
        qkv_b = None
        if any(b is not None for b in biases):
            rows = [w(att + f"{p}_proj.weight").shape[0] for p in "qkv"]
            qkv_b = torch.cat([b if b is not None else torch.zeros(r, dtype=dtype, device=device)
                               for b, r in zip(biases, rows, strict=True)])
        self.qkv = make_linear(qkv_w, qkv_b)
        self.o = make_linear([w(att + "o_proj.weight")], maybe(att + "o_proj.bias"))
        self.q_norm = maybe(att + "q_norm.weight")
        self.k_norm = maybe(att + "k_norm.weight")
        gate_up_b = maybe("mlp.gate_proj.bias")
        if gate_up_b is not None:
            gate_up_b = torch.cat([gate_up_b, w("mlp.up_proj.bias")])
        self.gate_up = make_linear([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")], gate_up_b)
        self.down = make_linear([w("mlp.down_proj.weight")], maybe("mlp.down_proj.bias"))
        self.ln_attn = w("input_layernorm.weight")
        self.ln_mlp = w("post_attention_layernorm.weight")


class LlamaModel:
    """A Llama-family causal LM for batch size 1, driven by the session with a KVCache."""

    def __init__(self, config: LlamaConfig, state_dict: MutableMapping[str, Any], *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 consume: bool = False, weights: WeightsMode = "fp32") -> None:
        """Build from an HF-named state dict. ``consume=True`` empties ``state_dict`` layer by layer
        as the fused copies are made, so peak memory stays near one copy of the weights.

        ``weights="stored"`` keeps matrix weights in their stored format (GGUF blocks given as
        ``QuantRows`` values, bf16/f16 tensors) for the decode-in-register kernels; it applies on
        CPU with fp32 activations and gives the same logits as ``"fp32"`` (the weights upcast
        once). Elsewhere stored weights are dequantized at load."""
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        stored = weights == "stored" and self.device.type == "cpu" and dtype == torch.float32
        self.weights: WeightsMode = "stored" if stored else "fp32"
        sd = _strip_prefixes(state_dict)
        if consume:
            state_dict.clear()
        missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in sd]
        if not config.tie_word_embeddings and "lm_head.weight" not in sd:
            missing.append("lm_head.weight")
        if missing:
            raise UnsupportedModelError(f"checkpoint is missing {', '.join(missing)}")
        embed = sd["model.embed_tokens.weight"]
        self.embed: torch.Tensor | None = None  # dense fp32 table (fp32 mode only)
        self._stored_embed: StoredEmbedding | None = None
        if stored:
            rows = embed if isinstance(embed, QuantRows) else QuantRows.from_tensor(embed)
            self._stored_embed = StoredEmbedding(rows)
        else:
            self.embed = as_weight(embed, False, dtype, self.device)
        self.layers = []
        for i in range(config.num_layers):
            prefix = f"model.layers.{i}."
            self.layers.append(_Layer(sd, prefix, config, dtype, self.device, stored))
            if consume:
                for key in [k for k in sd if k.startswith(prefix)]:
                    del sd[key]
        self.norm = as_weight(sd["model.norm.weight"], False, dtype, self.device)
        if stored:
            head = self._stored_embed.rows if config.tie_word_embeddings else as_weight(sd["lm_head.weight"], True,
                                                                                          dtype, self.device)
            self.lm_head: Linear | StoredLinear = make_linear([head], None)
        else:
            head = self.embed if config.tie_word_embeddings else as_weight(sd["lm_head.weight"], False, dtype,
                                                                            self.device)
            self.lm_head = Linear(head)
        inv_freq, att_factor = rope_inv_freq(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        self.rotary = RotaryTable(inv_freq, att_factor, self.device)
        self.scale = config.head_dim**-0.5
        self._ops = self._native_ops()
        # all layers in one native call per forward; SPECCHAT_NATIVE_DECODER=0 keeps the per-op path
        self._decoder = (NativeDecoder.for_model(self, self._ops)
                         if self._ops is not None and os.environ.get("SPECCHAT_NATIVE_DECODER", "1") != "0"
                         else None)
        self._precision = "exact"
        self._static = None  # CUDA: bucketed static-shape forwards replayed from CUDA graphs
        if self.device.type == "cuda":
            from engine.gpu.static import StaticDecoder

            self._static = StaticDecoder(self)

    def _native_ops(self) -> native.NativeKernel | None:
        """Our CPU kernels for norms, activation and attention, where every shape suits them."""
        c = self.config
        per_layer = [(layer.qkv, layer.o, layer.gate_up, layer.down) for layer in self.layers]
        linears = [self.lm_head, *(lin for group in per_layer for lin in group)]
        fits = (
            all(lin.layout == "native" for lin in linears)
            and c.hidden_size % 8 == 0
            and c.intermediate_size % 8 == 0
            and c.head_dim % 8 == 0
        )
        return native.load() if fits else None

    @property
    def precision(self) -> str:
        """"exact" (fp32 arithmetic, the reference) or "fast" (8-bit activations, integer products
        on the stored q4/q8 blocks: engine/kernels/fast.c); both batch-invariant."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        if value not in ("exact", "fast"):
            raise ValueError(f"precision is exact or fast, not {value!r}")
        if value == "fast" and not self.fast_available:
            raise ValueError("the fast precision needs stored weights and a CPU with AVX-512 VNNI; use exact")
        self._precision = value
        on = value == "fast"
        for lin in [self.lm_head, *(x for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up,
                                                                         layer.down))]:
            if isinstance(lin, StoredLinear):
                lin.fast = on
        if self._decoder is not None:
            self._decoder.fast = on

    @property
    def fast_available(self) -> bool:
        return self.weights == "stored" and self._ops is not None and self._ops.fast_variant is not None

    @property
    def kernels(self) -> str:
        """Which compute path this model runs: 'native' (our CPU kernels), 'blocked' (torch ops
        with the column-blocked matrix products) or 'torch'."""
        return "native" if self._ops is not None else self.lm_head.layout

    # -------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        if self._static is not None:
            from engine.gpu.static import cuda_capacity

            capacity = cuda_capacity(capacity)
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, capacity, dtype=self.dtype, device=self.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._stored_embed is not None:
            return self._stored_embed(tokens).to(tokens.device)
        return F.embedding(tokens, self.embed)

    @property
    def weight_bytes(self) -> int:
        """Bytes of matrix weights one token's forward streams (layers + LM head)."""
        lins = [self.lm_head, *(lin for layer in self.layers for lin in (layer.qkv, layer.o, layer.gate_up,
                                                                           layer.down))]
        return sum(lin.nbytes for lin in lins)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head to post-norm hidden states (what EAGLE-1/2 heads feed)."""
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        logits: Literal["all", "last", "none"] = "all",
        return_hidden: bool = False,
        capture_layers: Sequence[int] = (),
        prefix_mask: torch.Tensor | None = None,
    ) -> ForwardOutput:
        """Run T new tokens on top of the cache's committed prefix.

        tokens: [T] int64. positions: [T] (default: prefix length + 0..T-1). tree_mask: [T, T] bool,
        row i true at the nodes token i may attend to among the new ones (default: causal).
        K/V of the new tokens land in the cache's scratch slots; the caller commits the kept ones.
        prefix_mask: [T, L] bool, which cached entries each new token sees (default: all). Draft
        models growing a tree level by level use it to hide sibling branches' scratch entries.
        """
        if self._static is not None and not return_hidden and not capture_layers and prefix_mask is None:
            out = self._static.forward(tokens, cache, positions, tree_mask, logits)
            if out is not None:
                return out
        c = self.config
        tokens = tokens.to(self.device)
        T = tokens.shape[0]
        L = cache.length
        if cache.capacity < L + T:
            raise RuntimeError(f"KV cache full ({L} + {T} > {cache.capacity})")
        if positions is None:
            positions = torch.arange(L, L + T, device=self.device)
        positions = positions.to(self.device)
        self.rotary.ensure(int(positions.max()) + 1)
        rot = self.rotary.lookup(positions)
        if self._ops is not None and prefix_mask is None:
            mask, causal = None, False
            tree_u8 = tree_mask.to("cpu", torch.bool).contiguous() if tree_mask is not None else None
            window = self.config.sliding_window or 0
            positions = positions.to("cpu", torch.int64).contiguous()
        else:
            mask, causal = self._attention_mask(T, L, positions, tree_mask, prefix_mask)
            tree_u8 = window = None

        x = self.embed_tokens(tokens)  # [T, H]
        if self._decoder is not None and prefix_mask is None:
            return self._native_forward(x, cache, rot, tree_u8, positions, logits, return_hidden, capture_layers)
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        k_end = (nh + nkv) * hd
        eps = c.rms_norm_eps
        aux: list[torch.Tensor] = []
        capture = set(capture_layers)
        ops = self._ops
        for li, layer in enumerate(self.layers):
            if li in capture:
                aux.append(x.clone() if ops is not None else x)
            h = self._rms_norm(x, layer.ln_attn)
            qkv = layer.qkv(h)
            qk = qkv[:, :k_end].view(T, nh + nkv, hd)
            if layer.q_norm is not None:
                qk = torch.cat([F.rms_norm(qk[:, :nh], (hd,), layer.q_norm, eps),
                                F.rms_norm(qk[:, nh:], (hd,), layer.k_norm, eps)], dim=1)
            qk = apply_rotary_interleaved(qk, rot)  # [T, nh + nkv, hd]
            cache.k[li, :, L : L + T] = qk[:, nh:].transpose(0, 1)
            cache.v[li, :, L : L + T] = qkv[:, k_end:].view(T, nkv, hd).transpose(0, 1)
            if ops is not None:
                if mask is None and not causal:
                    att = ops.attention(qk[:, :nh], cache.k[li], cache.v[li], L, tree_u8, window, positions,
                                        self.scale)
                else:
                    att = self._sdpa(qk[:, :nh], cache.k[li, :, : L + T], cache.v[li, :, : L + T], mask, causal)
                layer.o.add_into(x, att)  # x += o(att), in place (x is this forward's own tensor)
                h = self._rms_norm(x, layer.ln_mlp)
                layer.down.add_into(x, ops.silu_mul(layer.gate_up(h)))
                continue
            att = self._sdpa(qk[:, :nh], cache.k[li, :, : L + T], cache.v[li, :, : L + T], mask, causal)
            x = x + layer.o(att)
            h = self._rms_norm(x, layer.ln_mlp)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        if c.num_layers in capture:
            aux.append(x)
        return self._output(x, aux, logits, return_hidden)

    def _native_forward(self, x: torch.Tensor, cache: KVCache, rot: torch.Tensor, tree: torch.Tensor | None,
                        positions: torch.Tensor, logits: Literal["all", "last", "none"], return_hidden: bool,
                        capture_layers: Sequence[int]) -> ForwardOutput:
        """The layers in native runs (decoder.c), split where a captured layer's input is copied out."""
        x = x.float().contiguous()
        rot = rot.reshape(x.shape[0], -1).contiguous()
        capture = set(capture_layers)
        aux: list[torch.Tensor] = []
        for start, stop in layer_runs(self.config.num_layers, capture_layers):
            if start in capture:
                aux.append(x.clone())
            self._decoder.run(x, cache, rot, tree, positions, start, stop)
        if self.config.num_layers in capture:
            aux.append(x)
        return self._output(x, aux, logits, return_hidden)

    @property
    def runs_rows(self) -> bool:
        """Whether :meth:`forward_rows` can run here (it needs the native decoder)."""
        return self._decoder is not None

    @torch.inference_mode()
    def forward_rows(self, tokens: torch.Tensor, cache: KVCache, seg: torch.Tensor, slots: torch.Tensor, *,
                     logits_at: torch.Tensor, capture_layers: Sequence[int] = ()) -> ForwardOutput:
        """Tokens of many independent sequences in one forward (the training-data engine).

        Each sequence owns a range of ``cache``'s slots starting at ``seg[t]``; token t is written
        at ``slots[t]``, sits at position ``slots[t] - seg[t]`` and attends to its own sequence's
        slots up to itself. Every token's result is bit-identical to what a one-sequence forward
        computes for it (same kernels, same keys in the same order). ``logits_at``: the token
        indices whose logits are wanted; ``hidden`` (final-normed) and ``aux`` cover every token.
        """
        if self._decoder is None:
            raise RuntimeError("forward_rows needs the native CPU decoder")
        seg = seg.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        positions = (slots - seg).contiguous()
        self.rotary.ensure(int(positions.max()) + 1)
        x = self.embed_tokens(tokens).float().contiguous()
        rot = self.rotary.lookup(positions).reshape(x.shape[0], -1).contiguous()
        capture = set(capture_layers)
        aux: list[torch.Tensor] = []
        for start, stop in layer_runs(self.config.num_layers, capture_layers):
            if start in capture:
                aux.append(x.clone())
            self._decoder.run_rows(x, cache.k, cache.v, rot, positions, seg, slots, start, stop)
        if self.config.num_layers in capture:
            aux.append(x)
        hidden = self._rms_norm(x, self.norm)
        if logits_at.numel() == 0:  # a step of prompt chunks only
            return ForwardOutput(torch.empty(0, self.config.vocab_size), hidden, aux)
        return ForwardOutput(self.lm_head(hidden[logits_at].contiguous()).float(), hidden, aux)

    def _output(self, x: torch.Tensor, aux: list[torch.Tensor], logits: Literal["all", "last", "none"],
                return_hidden: bool) -> ForwardOutput:
        """Final norm and the LM head on the residual stream after the last layer."""
        hidden = self._rms_norm(x, self.norm)
        out_logits = None
        if logits == "all":
            out_logits = self.lm_head(hidden).float()
        elif logits == "last":
            out_logits = self.lm_head(hidden[-1:]).float()
        return ForwardOutput(out_logits, hidden if return_hidden else None, aux)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        eps = self.config.rms_norm_eps
        if self._ops is not None:
            return self._ops.rms_norm(x, weight, eps)
        return F.rms_norm(x, (self.config.hidden_size,), weight, eps)

    def _sdpa(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
              causal: bool) -> torch.Tensor:
        """q: [T, nh, hd], keys/values: [nkv, L+T, hd] -> [T, nh*hd]."""
        T, nh, hd = q.shape
        att = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=self.scale, enable_gqa=keys.shape[0] != nh,
        )  # [1, nh, T, hd]
        return att[0].transpose(0, 1).reshape(T, nh * hd)

    def _attention_mask(self, T: int, L: int, positions: torch.Tensor, tree_mask: torch.Tensor | None,
                        prefix_mask: torch.Tensor | None = None) -> tuple[torch.Tensor | None, bool]:
        """Additive float mask [T, L+T], or None with is_causal for the cheap cases."""
        window = self.config.sliding_window
        windowed = window is not None and int(positions.max()) >= window
        if not windowed and tree_mask is None and prefix_mask is None:
            if T == 1:
                return None, False
            if L == 0:
                return None, True
        block = tree_mask if tree_mask is not None else torch.ones(T, T, dtype=torch.bool).tril_()
        prefix = prefix_mask.cpu() if prefix_mask is not None else torch.ones(T, L, dtype=torch.bool)
        allowed = torch.cat([prefix, block.cpu()], dim=1)
        if windowed:
            key_pos = torch.cat([torch.arange(L), positions.cpu()])
            allowed &= (positions.cpu()[:, None] - key_pos[None, :]) < window
        # an additive float mask, built once per forward: a bool mask is converted in every layer
        mask = torch.zeros(T, L + T, dtype=self.dtype).masked_fill_(~allowed, float("-inf"))
        return mask.to(self.device), False


def as_weight(t: Any, keep_stored: bool, dtype: torch.dtype, device: torch.device) -> Any:
    """A state-dict value as the model holds it: QuantRows (stored mode, matrix weights; bf16/f16
    tensors are kept as 2-byte rows), else a dense tensor of ``dtype`` on ``device``."""
    if keep_stored:
        return t if isinstance(t, QuantRows) else QuantRows.from_tensor(t)
    if isinstance(t, QuantRows):
        t = t.dequantize()
    return t.to(device=device, dtype=dtype)


def interleave_rows(t: Any, num_heads: int, head_dim: int) -> Any:
    if isinstance(t, QuantRows):
        return t.rows(interleave_halves(torch.arange(t.shape[0]), num_heads, head_dim))
    return interleave_halves(t, num_heads, head_dim)


def make_linear(parts: list[Any], bias: torch.Tensor | None) -> Linear | StoredLinear:
    """One layer from weights stacked by rows: fp32 panels for tensors, stored panels for QuantRows."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return Linear(parts[0] if len(parts) == 1 else torch.cat(parts), bias)
    return StoredLinear([p if isinstance(p, QuantRows) else QuantRows.from_tensor(p) for p in parts], bias)


def _strip_prefixes(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept checkpoints saved with or without the ``model.`` prefix on the body."""
    if any(k.startswith("model.") for k in sd):
        return dict(sd)
    return {(k if k.startswith("lm_head") else "model." + k): v for k, v in sd.items()}
