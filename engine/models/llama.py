"""Our own forward for the Llama family: Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2.

Why not transformers' modules: speculative decoding needs a forward over an arbitrary draft
tree on top of a cached prefix (positions = prefix length + depth, an ancestor mask), the
hidden states EAGLE heads read, and as little per-call overhead as possible, since on a CPU the
cost of verifying a tree decides whether speculation pays at all.

The model picks how its layers run once, at construction (engine/models/paths.py: one native
call, our kernels op by op, or torch ops), and on CUDA puts the static-shape forward
(engine/gpu/static.py) in front; ``forward`` then reads the same whatever runs: the new tokens'
positions, the embedding, the layers, the final norm and the LM head.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F

from engine.gpu.graphs import GraphCounts
from engine.gpu.static import StaticDecoder, Wanted, cuda_capacity
from engine.kernels.linear import Linear
from engine.kernels.stored import StoredEmbedding, StoredLinear
from engine.kernels.weights import QuantRows
from engine.models.kv_cache import KVCache
from engine.models.layer import ForwardOutput, LayerWeights, as_weight, make_linear
from engine.models.llama_config import LlamaConfig, ModelConfigError, UnsupportedModelError
from engine.models.paths import NativeDecoderPath, Span, TorchPath, native_ops, pick_path
from engine.models.rope import RotaryTable

WeightsMode = Literal["stored", "fp32"]
LogitsWanted = Literal["all", "last", "none"]


class LlamaModel:
    """A Llama-family causal LM for batch size 1, driven by the session with a KVCache.

    Other families (engine/models/gemma3.py) subclass it: ``layer_type`` builds their layers,
    :meth:`_make_path` picks their layer path, ``static_decoder`` says whether CUDA's static-shape
    forward (Llama-shaped) may stand in front."""

    layer_type: type[LayerWeights] = LayerWeights
    static_decoder = True

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
        _check_complete(config, sd)
        self._load_embedding(sd["model.embed_tokens.weight"], stored)
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            prefix = f"model.layers.{i}."
            self.layers.append(self.layer_type(sd, prefix, config, dtype, self.device, stored))
            if consume:
                for key in [k for k in sd if k.startswith(prefix)]:
                    del sd[key]
        self.norm = as_weight(sd["model.norm.weight"], False, dtype, self.device)
        self.lm_head = self._load_lm_head(sd.get("lm_head.weight"), stored)
        self.rotary = RotaryTable.for_shape(config, self.device)
        self.scale = config.head_dim**-0.5
        # our CPU kernels where every shape suits them; the layer path is chosen once, here
        self.ops = native_ops(config, self.layers, self.lm_head)
        self._path = self._make_path()
        self._precision = "exact"
        # CUDA: bucketed static-shape forwards replayed from CUDA graphs, in front of the layer path
        self._static = StaticDecoder(self) if self.device.type == "cuda" and self.static_decoder else None

    def _make_path(self) -> TorchPath:
        """The layer path (paths.py): the fastest that runs this model here."""
        return pick_path(self.config, self.layers, self.ops, self.dtype, self.device)

    def _load_embedding(self, embed: Any, stored: bool) -> None:
        self.embed: torch.Tensor | None = None  # dense table (fp32 mode)
        self._stored_embed: StoredEmbedding | None = None  # stored rows (stored mode)
        if stored:
            rows = embed if isinstance(embed, QuantRows) else QuantRows.from_tensor(embed)
            self._stored_embed = StoredEmbedding(rows)
        else:
            self.embed = as_weight(embed, False, self.dtype, self.device)

    def _load_lm_head(self, weight: Any, stored: bool) -> Linear | StoredLinear:
        """The LM head: its own weight, or the embedding's (tied)."""
        if self.config.tie_word_embeddings:
            return make_linear([self._stored_embed.rows], None) if stored else Linear(self.embed)
        return make_linear([as_weight(weight, stored, self.dtype, self.device)], None)

    # -- what the session and the bench ask ------------------------------------------------
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
            raise ValueError("the fast precision needs stored weights and our native kernel (AVX2); use exact")
        self._precision = value
        on = value == "fast"
        for lin in self._linears():
            if isinstance(lin, StoredLinear):
                lin.fast = on
        self._path.set_fast(on)

    @property
    def fast_available(self) -> bool:
        return self.weights == "stored" and self.ops is not None and self.ops.fast_variant is not None

    @property
    def kernels(self) -> str:
        """Which compute path this model runs: 'native' (our CPU kernels), 'blocked' (torch ops
        with the column-blocked matrix products), 'invariant' (CUDA bf16/fp16: the batch-invariant
        Triton linears and norms, engine/gpu/linear.py) or 'torch' (cuBLAS on a GPU)."""
        return "native" if self.ops is not None else self.lm_head.layout

    @property
    def rows_independent(self) -> bool:
        """Whether every row's result is the same however many rows share a forward (our native
        kernels, both precisions): then K/V cached by one prefill equal what another would write, and a
        session may reuse them across conversations. torch's and cuBLAS's products promise no such thing."""
        return self.kernels == "native"

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def context_limit(self) -> int:
        """Tokens the model attends to (engine/target.py)."""
        return self.config.max_position_embeddings

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def weight_bytes(self) -> int:
        """Bytes of matrix weights one token's forward streams (layers + LM head)."""
        return sum(lin.nbytes for lin in self._linears())

    @property
    def stored_kinds(self) -> frozenset[str]:
        """The stored formats of the matrix weights ("q4", "q8", "bf16", ...; empty for fp32 panels):
        which products the fast precision runs, as the bench title reports."""
        return frozenset(p.kind for lin in self._linears() if isinstance(lin, StoredLinear) for p in lin.parts)

    def _linears(self) -> list[Linear | StoredLinear]:
        return [self.lm_head, *(lin for layer in self.layers for lin in layer.linears)]

    @property
    def graph_counts(self) -> GraphCounts | None:
        """The static decoder's graphs captured and replayed; None where the forward runs eagerly (CPU)."""
        static = self._static
        return None if static is None else GraphCounts(static.captures, static.replays)

    @property
    def static_graphs(self) -> StaticDecoder | None:
        """The static decoder (its graphs); None where the forward runs eagerly (CPU). A standalone
        drafter keeps it with its cache (engine/gpu/graphs.py, DraftMemory)."""
        return self._static

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        if self._static is not None:
            capacity = cuda_capacity(capacity)
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, capacity, dtype=self.kv_dtype, device=self.device)

    @property
    def kv_dtype(self) -> torch.dtype:
        """What the KV cache holds: fp16 in the fast precision, else the model's dtype.

        Why fp16 there: one step's attention reads every cached K/V row of every layer (46 KB a
        token for the 135M model in fp32), so past ~1,000 cached tokens the cache outweighs the
        4-bit weights a step streams: a one-token step cost 5.5 ms at 300 cached tokens and 13.9
        at 2,400. Each K/V value is rounded once, when written, whatever the batch, so the fast
        precision stays batch-invariant and speculation lossless against its own baseline."""
        return torch.float16 if self._precision == "fast" else self.dtype

    def _check_cache(self, cache: KVCache) -> None:
        """Refuse a cache made for the other precision (its K/V would be read in another format
        than this precision defines)."""
        if cache.k.dtype != self.kv_dtype:
            raise ValueError(f"this KV cache holds {cache.k.dtype} values, the {self._precision} precision uses "
                             f"{self.kv_dtype}: make the cache with new_cache() after choosing the precision")

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._stored_embed is not None:
            return self._stored_embed(tokens).to(tokens.device)
        return F.embedding(tokens, self.embed)

    def embed_rows(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """``embed_tokens`` of host ``tokens`` (a list, or a 1-D int64 tensor) as fp32 [T, H],
        contiguous, in as few torch operations as the weights allow (the native EAGLE head's input,
        once a level)."""
        host = not isinstance(tokens, torch.Tensor) or (tokens.dtype == torch.int64 and tokens.device.type == "cpu")
        if self._stored_embed is not None and host:
            rows = self._stored_embed.flat(tokens)
            if rows is not None:
                return rows
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens, dtype=torch.int64)
        return self.embed_tokens(ids).float().contiguous()

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head to post-norm hidden states (what EAGLE-1/2 heads feed)."""
        return self.lm_head(hidden).float()

    # -- the forward -----------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, *, positions: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, logits: LogitsWanted = "all", return_hidden: bool = False,
                capture_layers: Sequence[int] = (), prefix_mask: torch.Tensor | None = None) -> ForwardOutput:
        """Run T new tokens on top of the cache's committed prefix.

        tokens: [T] int64. positions: [T] (default: prefix length + 0..T-1). tree_mask: [T, T] bool,
        row i true at the nodes token i may attend to among the new ones (default: causal).
        K/V of the new tokens land in the cache's scratch slots; the caller commits the kept ones.
        prefix_mask: [T, L] bool, which cached entries each new token sees (default: all). Draft
        models growing a tree level by level use it to hide sibling branches' scratch entries.
        """
        if self._static is not None and prefix_mask is None:
            wanted = Wanted(tuple(sorted(set(capture_layers))), return_hidden)
            replayed = self._static.forward(tokens, cache, positions, tree_mask, logits, wanted)
            if replayed is not None:  # None: the call does not fit a bucket; run it eagerly
                return replayed
        tokens = tokens.to(self.device)
        self._check_cache(cache)
        span = self._span(tokens.shape[0], cache, positions, tree_mask, prefix_mask)
        x, aux = self._path.run(self.embed_tokens(tokens), cache, span, capture_layers)
        return self._output(x, aux, logits, return_hidden)

    def _span(self, T: int, cache: KVCache, positions: torch.Tensor | None, tree_mask: torch.Tensor | None,
              prefix_mask: torch.Tensor | None) -> Span:
        """Where the T new tokens sit (default: right after the committed prefix) and their rotations."""
        L = cache.length
        if cache.capacity < L + T:
            raise RuntimeError(f"KV cache full ({L} + {T} > {cache.capacity})")
        if positions is None:
            positions = torch.arange(L, L + T, device=self.device)
        positions = positions.to(self.device)
        self.rotary.ensure(int(positions.max()) + 1)
        return Span(L, positions, self.rotary.lookup(positions), tree_mask, prefix_mask)

    def _output(self, x: torch.Tensor, aux: list[torch.Tensor], logits: LogitsWanted,
                return_hidden: bool) -> ForwardOutput:
        """Final norm and the LM head on the residual stream after the last layer."""
        hidden = self._path.rms_norm(x, self.norm)
        rows = {"all": hidden, "last": hidden[-1:], "none": None}[logits]
        out_logits = self.logits_from_hidden(rows) if rows is not None else None
        return ForwardOutput(out_logits, hidden if return_hidden else None, aux)

    @property
    def runs_rows(self) -> bool:
        """Whether :meth:`forward_rows` can run here (it needs the native decoder)."""
        return isinstance(self._path, NativeDecoderPath)

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
        if not isinstance(self._path, NativeDecoderPath):
            raise RuntimeError("forward_rows needs the native CPU decoder")
        self._check_cache(cache)
        seg = seg.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        positions = (slots - seg).contiguous()
        self.rotary.ensure(int(positions.max()) + 1)
        x = self.embed_tokens(tokens).float().contiguous()
        x, aux = self._path.run_rows(x, cache, self.rotary.lookup(positions), positions, seg, slots, capture_layers)
        hidden = self._path.rms_norm(x, self.norm)
        if logits_at.numel() == 0:  # a step of prompt chunks only
            return ForwardOutput(torch.empty(0, self.config.vocab_size), hidden, aux)
        return ForwardOutput(self.lm_head(hidden[logits_at].contiguous()).float(), hidden, aux)


def _check_complete(config: LlamaConfig, sd: MutableMapping[str, Any]) -> None:
    """Refuse, in one line, weights that do not fill the config's shape: a KeyError deep in a layer,
    or an answer decoded with the wrong vocabulary, is what a config.json edited apart from its
    weights gave otherwise."""
    missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in sd]
    if not config.tie_word_embeddings and "lm_head.weight" not in sd:
        missing.append("lm_head.weight")
    if missing:
        raise UnsupportedModelError(f"checkpoint is missing {', '.join(missing)}")
    absent = next((i for i in range(config.num_layers) if f"model.layers.{i}.self_attn.q_proj.weight" not in sd), None)
    if absent is not None:
        raise ModelConfigError(f"the weights have no model.layers.{absent}.self_attn.q_proj.weight, but config.json's "
                               f"num_hidden_layers is {config.num_layers}; fix num_hidden_layers or the weights")
    rows = sd["model.embed_tokens.weight"].shape[0]
    if rows != config.vocab_size:
        raise ModelConfigError(f"config.json's vocab_size is {config.vocab_size} but the embedding has {rows} rows; "
                               "fix vocab_size or the weights")


def _strip_prefixes(sd: MutableMapping[str, Any]) -> dict[str, Any]:
    """Accept checkpoints saved with or without the ``model.`` prefix on the body."""
    if any(k.startswith("model.") for k in sd):
        return dict(sd)
    return {(k if k.startswith("lm_head") else "model." + k): v for k, v in sd.items()}
