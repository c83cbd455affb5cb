"""Where training reads the target's side of a batch: features, embeddings and labels.

Two sources with one method, ``batch(head, samples, ids) -> (embeds, features, probs, inside)``:

* :class:`StoredTarget` reads what the data engine stored beside the ids (bf16 features and final
  hidden states, the full-vocabulary argmax) from memory-mapped shards: training never runs the
  target, which on a CPU was most of a step's time.
* :class:`LiveTarget` runs transformers' model on every batch, for data that has no stored
  features (the transformers generation path, older caches).

``probs`` is the target's next-token distribution over the draft vocabulary (renormalised),
``inside`` whether its argmax over the full vocabulary lies in the draft vocabulary.

A block drafter reads per conversation instead: ``sequences(samples, aux_layer_ids) ->
[(features, argmax)]``, the same features and the target's argmax after each token, for a step's
conversations at once (``LiveTarget``: one padded forward of the target for all of them, which on a
GPU is what keeps it busy; ``sequence`` is the one-conversation case).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from engine.train.data import DataCache, Sample
from engine.train.eagle3_head import Eagle3Head

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
ARGMAX_CHUNK = 512  # rows of hidden states per product with the full LM head (49,152 columns for SmolLM2)


class TargetSource(Protocol):
    def batch(self, head: Eagle3Head, samples: Sequence[Sample], ids: torch.Tensor) -> Batch:
        """(embeds [B,T,H], features [B,T,F], probs [B,T,Vd], inside [B,T]) for right-padded ids."""
        ...


def decoder_of(hf: torch.nn.Module) -> torch.nn.Module:
    return hf.get_decoder() if hasattr(hf, "get_decoder") else hf.model


@torch.no_grad()
def target_features(hf: torch.nn.Module, ids: torch.Tensor, aux_layer_ids: Sequence[int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(embeds [B,T,H], features [B,T,3H], final normed hidden [B,T,H]) for right-padded ``ids``.

    features = concat of the residual streams entering layers ids+1 (low, mid, high), exactly what
    ``LlamaModel.forward(capture_layers=[i + 1 for i in ids]).aux`` returns. Right padding needs no
    attention mask: a causal query never sees the pads after it.
    """
    out = decoder_of(hf)(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states  # hs[k] = residual entering layer k (k < L)
    feats = torch.cat([hs[i + 1] for i in aux_layer_ids], dim=-1)
    return hs[0], feats, out.last_hidden_state


def answer_rows(samples: Sequence[Sample], T: int, device: torch.device) -> torch.Tensor:
    """[B, T] bool: the positions whose next token is an answer token (the only labels training reads)."""
    q = torch.arange(T, device=device)
    starts = torch.tensor([s.answer_start for s in samples], device=device)
    lengths = torch.tensor([len(s.ids) for s in samples], device=device)
    return (q[None, :] >= starts[:, None] - 1) & (q[None, :] < lengths[:, None] - 1)


@torch.no_grad()
def draft_labels(hidden: torch.Tensor, head_weight: torch.Tensor, rows: torch.Tensor, chunk: int = 512
                 ) -> torch.Tensor:
    """softmax over the draft vocabulary of ``hidden [B,T,H] @ head_weight[Vd,H].T`` at ``rows``
    ([B, T] bool), zero elsewhere."""
    B, T, _ = hidden.shape
    flat = hidden[rows]
    out = torch.zeros(B, T, head_weight.shape[0], device=hidden.device)
    if flat.shape[0]:
        out[rows] = torch.cat([torch.softmax(flat[s:s + chunk].float() @ head_weight.T, dim=-1)
                               for s in range(0, flat.shape[0], chunk)])
    return out


class LiveTarget:
    """transformers' model run on every batch (no gradients)."""

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf

    def sequence(self, sample: Sample, aux_layer_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [n, F], argmax [n]) of one conversation from one forward of the target."""
        return self.sequences([sample], aux_layer_ids)[0]

    @torch.no_grad()
    def sequences(self, samples: Sequence[Sample], aux_layer_ids: Sequence[int]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(features [n, F], argmax [n]) of each conversation, from one forward of the target over
        all of them right-padded (a causal query never sees the pads after it, so each row's
        features are its own conversation's; only the products' shapes differ from one forward
        each). The argmax is taken at the real tokens only, ``ARGMAX_CHUNK`` rows a product, and
        comes back on the CPU (where the labels are made) in one copy for the batch."""
        device = next(self.hf.parameters()).device
        lengths = [len(s.ids) for s in samples]
        ids = torch.zeros(len(samples), max(lengths), dtype=torch.long)
        for r, s in enumerate(samples):
            ids[r, :lengths[r]] = torch.tensor(s.ids)
        _, feats, hidden = target_features(self.hf, ids.to(device), aux_layer_ids)
        real = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        flat = hidden[real.to(device)]
        w = self.hf.get_output_embeddings().weight
        top = torch.cat([(flat[s:s + ARGMAX_CHUNK] @ w.T).argmax(-1) for s in range(0, flat.shape[0], ARGMAX_CHUNK)])
        tops = top.cpu().split(lengths)
        return [(feats[r, :n], tops[r]) for r, n in enumerate(lengths)]

    @torch.no_grad()
    def batch(self, head: Eagle3Head, samples: Sequence[Sample], ids: torch.Tensor) -> Batch:
        embeds, feats, hidden = target_features(self.hf, ids, head.config.aux_layer_ids)
        w = self.hf.get_output_embeddings().weight
        B, T, H = hidden.shape
        flat = hidden.reshape(B * T, H)
        inside = torch.cat([head.t2d[(flat[s:s + ARGMAX_CHUNK] @ w.T).argmax(-1)]
                            for s in range(0, B * T, ARGMAX_CHUNK)]).view(B, T)
        rows = answer_rows(samples, T, ids.device)
        return embeds, feats, draft_labels(hidden, w[head.used_ids], rows), inside


class StoredTarget:
    """Features, hidden states and argmax from the data cache's shards; the target's embedding
    table and LM head (from ``hf``, fp32) for the embeddings and the labels."""

    def __init__(self, cache: DataCache, hf: torch.nn.Module) -> None:
        self.cache = cache
        self.embed = hf.get_input_embeddings().weight.detach()
        self.lm_head = hf.get_output_embeddings().weight.detach()
        self._arrays: dict[int, dict[str, np.ndarray]] = {}
        self._head_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def _shard(self, index: int) -> dict[str, np.ndarray]:
        if index not in self._arrays:
            self._arrays[index] = self.cache.read_arrays(index)
        return self._arrays[index]

    def _rows(self, head: Eagle3Head) -> torch.Tensor:
        used = head.used_ids
        if self._head_rows is None or not torch.equal(self._head_rows[0], used):
            self._head_rows = (used.clone(), self.lm_head[used.to(self.lm_head.device)].contiguous())
        return self._head_rows[1]

    def sequence(self, sample: Sample, aux_layer_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [n, F] bf16, argmax [n], -1 where the data engine computed none) of one
        conversation, as stored; ``aux_layer_ids`` must be the ones the data was made with (the
        data cache's folder name holds them: the width is checked here)."""
        assert sample.ref is not None, "a sample without stored features"
        arrs = self._shard(sample.ref[0])
        at, n = sample.ref[1], len(sample.ids)
        feats = torch.from_numpy(np.array(arrs["features"][at:at + n])).view(torch.bfloat16)
        if feats.shape[1] != len(aux_layer_ids) * self.embed.shape[1]:
            raise ValueError(f"stored features of width {feats.shape[1]} are not the {len(aux_layer_ids)} layers "
                             f"{list(aux_layer_ids)} asked for")
        return feats, torch.from_numpy(np.asarray(arrs["argmax"][at:at + n], dtype=np.int64))

    def sequences(self, samples: Sequence[Sample], aux_layer_ids: Sequence[int]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`sequence` of each (reading stored rows gains nothing from a batch)."""
        return [self.sequence(s, aux_layer_ids) for s in samples]

    @torch.no_grad()
    def batch(self, head: Eagle3Head, samples: Sequence[Sample], ids: torch.Tensor) -> Batch:
        B, T = ids.shape
        first = self._shard(samples[0].ref[0])
        F_ = first["features"].shape[1]
        H = first["hidden"].shape[1]
        feats = torch.zeros(B, T, F_, dtype=torch.bfloat16)
        hidden = torch.zeros(B, T, H, dtype=torch.bfloat16)
        top = torch.full((B, T), -1, dtype=torch.int64)
        for r, s in enumerate(samples):
            assert s.ref is not None, "a sample without stored features"
            arrs = self._shard(s.ref[0])
            at, n = s.ref[1], len(s.ids)
            feats[r, :n] = torch.from_numpy(np.array(arrs["features"][at:at + n])).view(torch.bfloat16)
            hidden[r, :n] = torch.from_numpy(np.array(arrs["hidden"][at:at + n])).view(torch.bfloat16)
            top[r, :n] = torch.from_numpy(np.asarray(arrs["argmax"][at:at + n], dtype=np.int64))
        device = head.d2t.device
        ids, top = ids.to(device), top.to(device)
        embeds = F.embedding(ids, self.embed.to(device))
        probs = draft_labels(hidden.to(device), self._rows(head).to(device), answer_rows(samples, T, device))
        inside = head.t2d[top.clamp(min=0)] & (top >= 0)
        return embeds, feats.to(device), probs, inside
