"""``specchat train-draft MODEL --method medusa``: Medusa-1 heads from the same self-distilled data.

``specchat.train_draft`` parses the command, checks it and prepares the data (the data engine
stores the target's last hidden states); this module turns the flags into
:class:`~engine.train.medusa_train.MedusaSettings`, trains and says where the heads are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.train.data import Sample, answer_tokens
from specchat.command_options import TrainDraftOptions


def budget(samples: list[Sample], tokens: int) -> list[Sample]:
    """The first samples (in the cache's order) holding ``tokens`` answer tokens: ``--tokens``
    bounds the training data even when the cache holds more."""
    out, have = [], 0
    for s in samples:
        if have >= tokens:
            break
        out.append(s)
        have += len(s.ids) - s.answer_start
    return out


def train_medusa_heads(options: TrainDraftOptions, out: Path, target: Any, cache: Any, trains: list[Sample],
                       held: list[Sample], card: dict[str, Any], deadline: float | None) -> int:
    from engine.train.medusa_train import MedusaSettings, settings_dict, train_medusa

    settings = MedusaSettings(
        num_heads=options.medusa_heads or 4,
        head_vocab_size=min(options.draft_vocab_size, int(target.hf.config.vocab_size)),
        train_lm_head=options.medusa_train_lm_head, batch_positions=options.batch_tokens, lr=options.lr or 1e-3,
        epochs=options.epochs, max_steps=options.max_steps, checkpoint_every=options.checkpoint_every,
        eval_every=options.eval_every, seed=options.seed, export_layout=options.export_layout or "vllm",
        export_dtype=options.export_dtype, bf16=options.bf16)
    trains = budget(trains, options.tokens)
    card = {**card, "method": "medusa", "settings": settings_dict(settings),
            "data": {**card["data"], "conversations": len(trains), "answer_tokens": answer_tokens(trains)}}
    json.dumps(card)  # the card must stay serialisable
    print(f"training {settings.num_heads} Medusa heads on {answer_tokens(trains)} answer tokens "
          f"({len(trains)} conversations)")
    result = train_medusa(target.hf, trains, held, out, settings, cache=cache,
                          stop_ids=sorted(target.tokenizer.stop_token_ids), resume=options.resume, card=card,
                          deadline=deadline)
    res = result.eval or {}
    if res:
        print(f"done: {result.steps} steps; held-out tau {res['tau']:.3f} (greedy chain of {settings.num_heads}); "
              "per-head top-1 " + ", ".join(f"{a:.3f}" for a in res["top1"]))
    else:
        print(f"done: {result.steps} steps")
    print(f"heads: {out} ({settings.export_layout} layout); use them with --method medusa --draft {out}")
    return 0
