"""Any transformers causal LM behind the same interface as our Llama forward.

The fallback for architectures our own forward does not cover: slower (transformers' per-call
overhead, a growing cache) but correct, since trees go in as a custom 4D attention mask with
explicit position ids, and the accepted path is gathered out of the cache after each verify.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from engine.models.layer import ForwardOutput


class HFCache:
    """A transformers DynamicCache plus the committed length, with the KVCache interface."""

    def __init__(self, capacity: int) -> None:
        from transformers import DynamicCache

        self.dc = DynamicCache()
        self.capacity = capacity
        self.length = 0

    def _layers(self):
        return [layer for layer in self.dc.layers if getattr(layer, "keys", None) is not None
                and layer.keys.numel() > 0]

    def commit(self, keep: Sequence[int] | int) -> None:
        start = self.length
        offsets = list(range(keep)) if isinstance(keep, int) else list(keep)
        index = torch.tensor([*range(start), *(start + o for o in offsets)])
        for layer in self._layers():
            if layer.keys.shape[-2] != len(index) or index[-1] != len(index) - 1:
                idx = index.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)
        self.length = start + len(offsets)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length
        self._drop_scratch()

    def _drop_scratch(self) -> None:
        for layer in self._layers():
            layer.keys = layer.keys[..., : self.length, :]
            layer.values = layer.values[..., : self.length, :]

    def grow(self, capacity: int) -> None:
        self.capacity = max(self.capacity, capacity)


class HFModel:
    """A transformers model behind the engine's target protocol (engine/target.py)."""

    precision = ""  # one arithmetic: torch's (the exact/fast switch is our forward's)
    fast_available = False
    rows_independent = False  # torch's products promise no batch invariance
    weights = "fp32"  # transformers' own tensors: no stored (q4/q8) forms for draft heads to match
    ops = None  # no native kernel: heads bound to this target run torch ops
    graph_counts = None  # transformers' own forward: no CUDA graphs of ours

    def __init__(self, model: torch.nn.Module) -> None:
        self.net = model.eval()
        cfg = model.config
        self.config = cfg
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(cfg.vocab_size)
        self.num_layers = int(getattr(cfg, "num_hidden_layers", 0))
        # transformers' configs differ by architecture: one without the field sets no limit here
        self.context_limit = int(getattr(cfg, "max_position_embeddings", None) or 1 << 30)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu", gguf: Path | None = None) -> HFModel:
        """A model folder (safetensors), or with ``gguf`` that GGUF file read by transformers."""
        from transformers import AutoModelForCausalLM

        if gguf is not None:
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype,
                                                         trust_remote_code=False)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True,
                                                         trust_remote_code=False)
        return cls(model.to(device))

    def new_cache(self, capacity: int) -> HFCache:
        return HFCache(capacity)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net.get_output_embeddings()(hidden).float()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: HFCache,
        *,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        logits: Literal["all", "last", "none"] = "all",
        return_hidden: bool = False,
        capture_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        T, L = tokens.shape[0], cache.length
        cache._drop_scratch()  # an earlier forward's uncommitted tree must not stay visible
        if positions is None:
            positions = torch.arange(L, L + T)
        block = tree_mask.cpu() if tree_mask is not None else torch.ones(T, T, dtype=torch.bool).tril_()
        allowed = torch.cat([torch.ones(T, L, dtype=torch.bool), block], dim=1)
        mask = torch.zeros(1, 1, T, L + T, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        want_states = return_hidden or bool(capture_layers)
        out = self.net(
            input_ids=tokens[None].to(self.device),
            position_ids=positions[None].to(self.device),
            attention_mask=mask.to(self.device),
            past_key_values=cache.dc,
            use_cache=True,
            output_hidden_states=want_states,
            logits_to_keep=1 if logits == "last" else 0,
        )
        result = out.logits[0].float() if logits != "none" else None
        states = out.hidden_states if want_states else None
        hidden = states[-1][0] if (return_hidden and states is not None) else None
        aux = [states[i][0] for i in capture_layers] if states is not None else []
        return ForwardOutput(result, hidden, aux)
