"""Training EAGLE-3 draft heads on a target's own answers (``specchat train-draft``).

``train_head`` is the small API tests and scripts call; ``pipeline`` drives the full command.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.train.data import Sample
from engine.train.eagle3_head import (
    Eagle3Head,
    HeadConfig,
    default_aux_layer_ids,
    draft_vocab,
    export_head,
    load_exported,
    vocab_maps,
)
from engine.train.trainer import TrainResult, TrainSettings, measure_tau, train

__all__ = ["Eagle3Head", "HeadConfig", "Sample", "TrainResult", "TrainSettings", "default_aux_layer_ids",
           "draft_vocab", "export_head", "load_exported", "measure_tau", "train_head", "vocab_maps"]


def _as_sample(s: Any) -> Sample:
    if isinstance(s, Sample):
        return s
    if isinstance(s, tuple) and len(s) == 2:
        return Sample(list(map(int, s[0])), int(s[1]), True)
    return Sample(list(map(int, s)), 1, True)


def train_head(target_model: torch.nn.Module, tokenizer: Any | None, sequences: Sequence[Any], out_dir: str | Path,
               *, steps: int = 300, draft_vocab_size: int | None = None, ttt_steps: int = 3,
               eval_sequences: Sequence[Any] | None = None, lr: float = 3e-3, batch_tokens: int = 256,
               seed: int = 0, resume: bool = False, export_dtype: str = "float32", deadline: float | None = None,
               init_from: str | Path | None = None, **overrides: Any) -> TrainResult:
    """Train an EAGLE-3 head for a (tiny) transformers Llama target in-process and export it.

    ``sequences``: token-id lists (every position trained), ``(ids, answer_start)`` pairs or
    :class:`Sample`. ``eval_sequences`` (same forms, ideally greedy continuations of the target)
    give the held-out tau in the result; by default every 10th sequence is held out.
    Returns a :class:`TrainResult` (the head, ``eval['tau']``); ``out_dir`` holds config.json +
    model.safetensors in the public EAGLE-3 layout and a ``checkpoint/`` to resume from.
    """
    samples = [_as_sample(s) for s in sequences]
    if eval_sequences is None:
        evals = samples[::10]
        trains = [s for i, s in enumerate(samples) if i % 10]
    else:
        evals, trains = [_as_sample(s) for s in eval_sequences], samples
    vocab = int(target_model.config.vocab_size)
    fields: dict[str, Any] = {
        "draft_vocab_size": draft_vocab_size or vocab, "ttt_steps": ttt_steps, "lr": lr, "batch_tokens": batch_tokens,
        "seed": seed, "epochs": 1e9, "max_steps": steps, "warmup_steps": 10, "checkpoint_every": max(1, steps // 4),
        "eval_every": 0, "export_dtype": export_dtype, "bf16": "off",
    }
    settings = TrainSettings(**{**fields, **overrides})
    if tokenizer is not None:
        stops = sorted(tokenizer.stop_token_ids)
    else:
        eos = getattr(target_model.config, "eos_token_id", None)
        stops = list(eos) if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
    return train(target_model, trains, evals, out_dir, settings, stop_ids=stops, resume=resume,
                 log=lambda _m: None, progress_bar=False, deadline=deadline,
                 init_from=init_from)
