"""Install the DFlash drafter a lent GPU trained (``lease15.sh d``) into the repository's assets.

The call returns the drafter as ``drafter.safetensors.part-*`` (one call's files are 16 MiB at most),
``drafter.sha256`` and ``drafter-config.json`` (its card under ``specchat_training``). This joins the
parts, refuses them unless the whole file's sha256 is the one the machine computed, checks that the
config is a DFlash drafter's whose tensors are the ones the safetensors file holds, then replaces
``config.json``, ``model.safetensors`` and the card (``README.md``, written from the training card:
shape, data, machine, held-out tau and acceptance by position) in the drafter's folder.

    .venv/bin/python scripts/device/install_dflash.py /work/.device/.../files [--into assets/dflash-smollm2-135m]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

CARD_KEY = "specchat_training"
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "dflash-smollm2-135m"
BENCH = ("specchat bench --prompts ../shared/bench/mt_bench.jsonl --methods none,eagle3,dflash --max-new-tokens 128 "
         "--json bench-out/dflash-gpu.json")


def joined(source: Path, into: Path) -> Path:
    """The parts joined into ``into/model.safetensors.part``, checked against drafter.sha256."""
    parts = sorted(source.glob("drafter.safetensors.part-*"))
    if not parts:
        sys.exit(f"install_dflash: no drafter.safetensors.part-* in {source}")
    want = (source / "drafter.sha256").read_text().split()[0]
    whole = into / "model.safetensors.part"
    h = hashlib.sha256()
    with whole.open("wb") as out:
        for part in parts:
            data = part.read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != want:
        whole.unlink()
        sys.exit(f"install_dflash: checksum mismatch: the {len(parts)} parts give {h.hexdigest()}, "
                 f"drafter.sha256 says {want}")
    return whole


def checked_config(source: Path, weights: Path) -> dict[str, Any]:
    """drafter-config.json, if it is a DFlash drafter's and names the tensors ``weights`` holds."""
    from safetensors import safe_open

    config = json.loads((source / "drafter-config.json").read_text())
    if config.get("speculators_model_type") != "dflash":
        sys.exit("install_dflash: drafter-config.json is not a DFlash drafter's (speculators_model_type)")
    layers = config["transformer_layer_config"]["num_hidden_layers"]
    with safe_open(str(weights), "pt") as f:
        names = set(f.keys())
    wanted = {"fc.weight", "lm_head.weight", *(f"layers.{i}.self_attn.q_proj.weight" for i in range(layers))}
    if not wanted <= names or f"layers.{layers}.self_attn.q_proj.weight" in names:
        sys.exit(f"install_dflash: the weights are not the {layers}-layer drafter drafter-config.json describes")
    return config


def card(config: dict[str, Any]) -> str:
    """README.md for the drafter, from its config and training card."""
    t, layer = config.get(CARD_KEY) or {}, config["transformer_layer_config"]
    settings, data, ev = t.get("settings", {}), t.get("data", {}), t.get("eval") or {}
    block, vocab = config["block_size"], config["draft_vocab_size"]
    acceptance = " ".join(f"{a:.3f}" for a in ev.get("acceptance", [])) or "not measured"
    conditional = " ".join(f"{a:.3f}" for a in ev.get("conditional", [])) or "not measured"
    tau = f"**{ev['tau']:.3f}**" if "tau" in ev else "not measured"
    first = f"{ev['acceptance'][0]:.0%}" if ev.get("acceptance") else "?"
    layers = layer["num_hidden_layers"]
    rows = [
        ("files", "`config.json` (`DFlashSpeculator`, `speculators_model_type: \"dflash\"`, the speculators layout), "
                  "`model.safetensors` (`fc`, `hidden_norm`, `layers.N.*`, `norm`, `lm_head` over the draft "
                  "vocabulary, `d2t`, `t2d`)"),
        ("shape", f"{layers} Qwen3-style layer{'s' if layers > 1 else ''} (q/k norms, SiLU MLP): hidden "
                  f"{layer['hidden_size']}, {layer['num_attention_heads']}/{layer['num_key_value_heads']} heads, "
                  f"head_dim {layer['head_dim']}, intermediate {layer['intermediate_size']}, RoPE theta "
                  f"{layer['rope_theta']:g} (the target's); block size {block} (the anchor and {block - 1} "
                  f"guesses); draft vocabulary {vocab:,} of {layer['vocab_size']:,} (the most frequent answer "
                  f"tokens, `d2t`); mask token {config['mask_token_id']} (the data's rarest token)"),
        ("target features", f"`aux_hidden_state_layer_ids` {config['aux_hidden_state_layer_ids']}: "
                            + t.get("target_features", "the residual streams entering those layers")),
        ("labels", t.get("labels", "the target's greedy token at each block position")),
        ("loss", f"cross entropy over the draft vocabulary, position k weighted exp(-(k-1)/"
                 f"{settings.get('loss_decay_gamma', block / 2):g}); the LM head rows are the target's, frozen; "
                 f"{settings.get('anchors', '?')} random anchors per answer and step"),
        ("this run", f"`{t.get('command', 'specchat train-draft --method dflash')}`: {t.get('steps', '?')} steps "
                     f"({'finished' if t.get('finished') else 'stopped at its time limit'}), "
                     f"{t.get('train_tokens', 0):,} answer tokens and {t.get('train_blocks', 0):,} blocks seen, "
                     f"{t.get('training_time_s', '?')} s of training, lr {settings.get('lr', '?')}, "
                     f"{settings.get('batch_tokens', '?')} tokens a step"),
        ("data", f"{data.get('answer_tokens', 0):,} training answer tokens ({data.get('conversations', 0):,} "
                 f"conversations; {data.get('held_out', 0):,} greedy answers held out, chosen by content), "
                 "self-distilled by the target: `assets/train-data/` (docs/training.md)"),
        ("machine", t.get("machine", "?")),
        ("held-out tau", f"{tau} (blocks of {block} replayed at every anchor of the held-out answers, "
                         f"{ev.get('blocks', 0):,} blocks)"),
        ("held-out acceptance by position", f"{acceptance} (the share of blocks whose first k guesses all "
                                            f"equal the target's greedy tokens, k = 1..{block - 1}); "
                                            f"conditional {conditional}"),
        ("in the engine", f"not measured yet: `{BENCH}` (scripts/device/README.md)"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"""# DFlash drafter for SmolLM2-135M-Instruct (specchat's embedded model)

A block drafter (docs/methods.md, "DFlash"): one forward of its {layers} layer{'s' if layers > 1 else ''} over
[anchor, mask × {block - 1}] reads the target's features of every token before the anchor and proposes the
{block - 1} tokens after it at once, through its own LM head over {vocab:,} tokens. Held-out tau {tau}; its
first guess is kept {first} of the time. Use it with `--method dflash --draft assets/dflash-smollm2-135m`.

| | |
|---|---|
{table}

Installed from a lent GPU's `scripts/device/lease15.sh d` by `scripts/device/install_dflash.py`, which
wrote this card from the training card in `config.json` (`{CARD_KEY}`).

## Training it again

On a lent GPU: two stash calls, then `bash scripts/device/lease15.sh d` carrying `assets/train-data` and
`.whl/site` (scripts/device/README.md). The command it ran is the one above (`this run`).

## Licence and provenance

- **Licence**: Apache-2.0, as specchat ([LICENSE](../../LICENSE)).
- **Base model**: a drafter for [SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)
  (Hugging Face, HuggingFaceTB; Apache-2.0). Its LM head rows, final norm's start, embeddings and
  features come from that model.
- **Training data**: only SmolLM2-135M-Instruct's own answers, generated by this project
  (`assets/train-data/`, whose cards say how), to prompts written by the model itself (Magpie) and by
  this project. No MT-bench question and no third-party dataset was used.
- **Method**: DFlash (z-lab), trained as SpecForge and vLLM's speculators train it (anchored
  blocks, position-decayed cross entropy), written for specchat; no third-party code.
- **Made by** specchat's `train-draft --method dflash` on the machine named above.
"""


def install(source: Path, into: Path) -> dict[str, Any]:
    """Replace ``into``'s drafter with the one in ``source``; returns its config."""
    into.mkdir(parents=True, exist_ok=True)
    weights = joined(source, into)
    try:
        config = checked_config(source, weights)
    except BaseException:
        weights.unlink()
        raise
    os.replace(weights, into / "model.safetensors")
    (into / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (into / "README.md").write_text(card(config))
    return config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="the folder the call's files came back to (files_at)")
    p.add_argument("--into", type=Path, default=SHIPPED, help="the drafter's folder (default: the shipped one)")
    args = p.parse_args(argv)
    config = install(args.source, args.into)
    ev = (config.get(CARD_KEY) or {}).get("eval") or {}
    print(f"installed into {args.into}: held-out tau {ev.get('tau', float('nan')):.3f}, acceptance by position "
          f"{ev.get('acceptance')}")
    print(f"next: {BENCH} (issue 56 asks dflash >= 1.5x), then commit the folder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
