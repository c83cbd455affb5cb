"""``specchat train-draft MODEL --out DIR``: train an EAGLE-3 head (Medusa heads, a DFlash drafter) for MODEL on
its own answers.

The heavy lifting is in ``engine.train``; this module turns the command line into settings,
prints where things are kept, and times the run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from engine.errors import MissingFileError
from engine.knobs import KNOBS
from specchat.bench_report import cpu_name_and_flags
from specchat.command_options import TrainDraftOptions
from specchat.options import MAX_THREADS, UsageError, add_force_flag, bounded

# a block's guesses are verified min(--speculative-num-draft-tokens, block) at a time: a larger one never whole
MAX_BLOCK = KNOBS["num_draft_tokens"].high


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-draft", help="train an EAGLE-3 draft head (Medusa heads, a DFlash drafter) for a model "
                                           "on its own answers")
    p.add_argument("model", nargs="?", default=None, help="target model (default: the embedded smollm2-135m)")
    p.add_argument("--out", default=None,
                   help="output folder: config.json + model.safetensors (EAGLE-3 layout); required unless --data-only")
    p.add_argument("--method", default="eagle3", choices=["eagle3", "medusa", "dflash"],
                   help="eagle3: one EAGLE-3 head; medusa: Medusa-1 heads on the target's last hidden state; dflash: "
                        "a block drafter reading EAGLE-3's layers (speculators layout)")
    p.add_argument("--medusa-heads", type=bounded(int, 1, 16), default=None,
                   help="medusa: number of heads (head k guesses k+2 ahead; default 4)")
    p.add_argument("--medusa-train-lm-head", action="store_true",
                   help="medusa: also train the shared lm_head (default: frozen, the target's rows)")
    p.add_argument("--export-layout", default=None, choices=["vllm", "medusa"],
                   help="medusa: vllm (default; one shared lm_head over --draft-vocab-size tokens + token_map, a few "
                        "MB) or medusa (FasterDecoding; a full lm_head copy per head)")
    p.add_argument("--resume", action="store_true", help="continue the run whose checkpoint is in --out")
    add_force_flag(p, "head in --out (one train-draft exported; never other files)",
                   "refused before any work; --resume continues its run")
    p.add_argument("--init-from", default=None,
                   help="start from an exported head's weights and vocabulary (e.g. the shipped one)")
    p.add_argument("--refit-vocab", action="store_true",
                   help="with --init-from: re-pick the draft vocabulary from this data's answer tokens (the "
                        "--draft-vocab-size most frequent), keeping the head's rows for the tokens that stay")
    p.add_argument("--prompts", default=None,
                   help="extra user prompts, JSON lines (messages | turns | prompt); mixed with self-written ones")
    p.add_argument("--no-builtin-prompts", action="store_true", help="do not mix in specchat's own prompt list")
    p.add_argument("--magpie-share", type=bounded(float, 0, 1), default=0.7,
                   help="share of conversations whose first user turn the model writes itself (Magpie); the rest "
                        "come from the prompt lists (0: prompt lists only)")
    p.add_argument("--tokens", type=bounded(int, 1, 10**10), default=300_000,
                   help="answer tokens of self-distilled data to generate (medusa: and to train on)")
    p.add_argument("--draft-vocab-size", type=bounded(int, 1, 1 << 20), default=8192,
                   help="draft vocabulary (most frequent answer tokens; medusa: rows of the shared lm_head; dflash: "
                        "rows of its own lm_head, the target's rows, frozen)")
    p.add_argument("--block-size", type=bounded(int, 2, MAX_BLOCK), default=None,
                   help="dflash: positions of a block, the anchor included (default 8: on a CPU the target's verify "
                        "of 8 tokens still costs little more than a plain step, of 16 2.46x)")
    p.add_argument("--draft-layers", type=bounded(int, 1, 16), default=None, help="dflash: decoder layers (default 1)")
    p.add_argument("--anchors", type=bounded(int, 1, 4096), default=None,
                   help="dflash: blocks per conversation and step, at random answer positions (default 64)")
    p.add_argument("--loss-decay-gamma", type=bounded(float, 0, 1000), default=None,
                   help="dflash: block position k weighs exp(-(k-1)/GAMMA) in the loss (0: all alike; default: "
                        "block size / 2)")
    p.add_argument("--pack-rows", type=bounded(int, 1, 1 << 20), default=None,
                   help="dflash: block rows per drafter forward, several conversations packed into one (each block "
                        "sees only its own conversation); for a GPU, where a forward per conversation (the "
                        "default) is launch overhead")
    p.add_argument("--eval-blocks", type=bounded(int, 1, 10**7), default=None,
                   help="dflash: held-out blocks measured at each evaluation (default 10000)")
    p.add_argument("--ttt-steps", type=bounded(int, 1, 64), default=5,
                   help="training-time-test steps unrolled per position")
    p.add_argument("--intermediate-size", type=bounded(int, 1, 1 << 17), default=None,
                   help="head MLP width (dflash: its layers'; default: the target's)")
    p.add_argument("--epochs", type=bounded(float, 0, 1000, low_open=True), default=2.0)
    p.add_argument("--max-steps", type=bounded(int, 1, 10**9), default=None,
                   help="stop after this many optimizer steps in all")
    p.add_argument("--hours", type=bounded(float, 0, 24 * 365, low_open=True), default=None,
                   help="stop this invocation after N hours (checkpointed; continue with --resume)")
    p.add_argument("--batch-tokens", type=bounded(int, 1, 1 << 24), default=1024,
                   help="padded tokens per optimizer step (medusa: answer positions per step)")
    p.add_argument("--lr", type=bounded(float, 0, 1, low_open=True), default=None,
                   help="peak learning rate (default 5e-4; medusa 1e-3; dflash 6e-4)")
    p.add_argument("--eval-every", type=bounded(int, 1, 10**9), default=200,
                   help="measure held-out tau (dflash: and acceptance by block position) and export every N steps")
    p.add_argument("--checkpoint-every", type=bounded(int, 1, 10**9), default=20)
    p.add_argument("--seed", type=bounded(int, 0, 2**63 - 1), default=0)
    p.add_argument("--import-data", action="append", default=None, metavar="DIR",
                   help="first copy the id shards (batch-*.npz) of DIR into the data cache (e.g. the shipped "
                        "assets/train-data/...; repeat for several folders); their target features are computed "
                        "here")
    p.add_argument("--live-target", action="store_true",
                   help="eagle3, dflash: compute the target's features by running it on each training batch (one "
                        "padded forward), never the data engine's stored ones: what a GPU does anyway (its data "
                        "engine stores none); on a CPU, a dry run of that path")
    p.add_argument("--data-only", action="store_true",
                   help="generate (or extend) the self-distilled data and stop; --out is not written")
    p.add_argument("--gen-batch", type=bounded(int, 1, 4096), default=None,
                   help="conversations per transformers batch when generating on a GPU (default 256; 32 on CPU)")
    p.add_argument("--rows", type=bounded(int, 1, 4096), default=48,
                   help="conversations generated per forward by the CPU data engine (default 48)")
    p.add_argument("--data-precision", default="auto", choices=["auto", "fast", "exact"],
                   help="the data engine's arithmetic (auto: fast where the CPU has it)")
    p.add_argument("--bf16", default="auto", choices=["auto", "on", "off"],
                   help="train the head under bf16 autocast (auto: where the CPU has bf16 dot products)")
    p.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=bounded(int, 1, MAX_THREADS), default=None,
                   help="CPU threads (default: all cores)")
    p.add_argument("--revision", default=None, help="hub model: branch, tag or commit")


def run_train_draft(options: TrainDraftOptions) -> int:
    import torch

    from engine.loader import configure_threads, pick_device
    from engine.train.data import GenSettings, answer_tokens
    from engine.train.pipeline import load_target, prepare_data

    out = check_args(options)  # every refusal before any data is generated or trained
    threads = configure_threads(options.threads)
    device = pick_device(options.device)
    deadline = time.time() + options.hours * 3600 if options.hours else None
    if device.type == "cuda":
        # TF32 products: the data and the target's features differ from fp32 ones only where two
        # tokens are nearly tied, which a draft head cannot tell apart anyway
        torch.set_float32_matmul_precision("high")
    gen_batch = options.gen_batch or (256 if device.type == "cuda" else 32)
    target = load_target(options.model, device=str(device), revision=options.revision)
    print(f"target: {target.name}  device: {device}  threads: {threads}")
    settings = GenSettings(seed=options.seed, batch_size=gen_batch, magpie_fraction=options.magpie_share)
    samples, cache = prepare_data(target, settings, options.tokens, options.prompts,
                                  use_builtin_prompts=not options.no_builtin_prompts, rows=options.rows,
                                  precision=options.data_precision, import_from=options.import_data or (),
                                  hidden_only=options.method == "medusa", budget_features=options.method == "dflash",
                                  features=not options.live_target)
    if options.data_only:
        print(f"data: {len(samples)} conversations, {answer_tokens(samples)} answer tokens in {cache.folder}")
        return 0
    held = [s for s in samples if s.held_out]
    trains = [s for s in samples if not s.held_out]
    print(f"data: {len(trains)} conversations ({answer_tokens(trains)} answer tokens) for training, {len(held)} held "
          f"out; cache {cache.folder}")
    if not trains:
        raise UsageError("no training data was generated; raise --tokens")
    if options.method == "medusa":
        from specchat.train_medusa import train_medusa_heads

        card = _run_card(options, target, cache, trains, held, device, threads)
        return train_medusa_heads(options, out, target, cache, trains, held, card, deadline)
    if options.method == "dflash":
        return _train_dflash(options, out, target, cache, trains, held, device, threads, deadline)
    return _train(options, out, target, cache, trains, held, device, threads, deadline)


def check_args(options: TrainDraftOptions) -> Path:
    """Refuse, in one line, whatever would fail after the data is generated or the head trained:
    bad numbers, a missing --import-data, --init-from or --prompts, a --resume without a
    checkpoint (or a checkpoint without --resume), an output folder that cannot be written or that
    holds files this command did not write (a model's folder), or a head it exported, without --force.
    Returns the output folder, marked as ours."""
    # the parser bounds every number from below (1, or 0 for --magpie-share); two need more
    if options.draft_vocab_size <= 1 or options.batch_tokens < 16:
        raise UsageError("--draft-vocab-size must be positive and above 1, and --batch-tokens at least 16 "
                         f"(got {options.draft_vocab_size} and {options.batch_tokens})")
    if options.magpie_share < 1.0 and options.no_builtin_prompts and options.prompts is None:
        raise UsageError("--magpie-share below 1 needs prompts: drop --no-builtin-prompts or give --prompts FILE")
    if options.method != "medusa" and (options.export_layout or options.medusa_train_lm_head
                                       or options.medusa_heads is not None):
        raise UsageError("--medusa-heads, --export-layout and --medusa-train-lm-head go with --method medusa")
    block_flags = (options.block_size, options.draft_layers, options.anchors, options.loss_decay_gamma,
                   options.pack_rows, options.eval_blocks)
    if options.method != "dflash" and any(v is not None for v in block_flags):
        raise UsageError("--block-size, --draft-layers, --anchors, --loss-decay-gamma, --pack-rows and --eval-blocks "
                         "go with --method dflash")
    if options.method == "medusa" and options.live_target:
        raise UsageError("--live-target goes with --method eagle3 or dflash (Medusa heads read the target's last "
                         "hidden state, computed once for all the data)")
    if options.method != "eagle3" and options.init_from is not None:
        raise UsageError(f"--method {options.method} takes no --init-from (use --resume)")
    if options.refit_vocab and (options.init_from is None or options.method != "eagle3"):
        raise UsageError("--refit-vocab goes with --init-from HEAD (a new EAGLE-3 head picks its vocabulary from "
                         "the data anyway)")
    for folder in options.import_data or ():
        if not Path(folder).is_dir():
            raise MissingFileError(f"--import-data {folder}: no such folder")
    if options.prompts is not None:
        from engine.train.data import load_prompt_list

        load_prompt_list(options.prompts)  # a missing file or a bad line, named before any work
    if options.out is None and not options.data_only:
        raise UsageError("--out is required (the folder the trained head is written to), unless --data-only")
    out = Path(options.out or ".")
    from specchat.preflight import check_train_target

    if options.data_only:
        check_train_target(options)
        return out
    if options.init_from is not None:
        init = Path(options.init_from)
        if not ((init / "config.json").is_file() and (init / "model.safetensors").is_file()):
            raise MissingFileError(f"--init-from {init}: not an exported head (config.json + model.safetensors)")
    has_checkpoint = (out / "checkpoint" / "progress.json").is_file()
    if options.resume and not has_checkpoint:
        raise UsageError(f"--resume: {out} has no checkpoint; run without --resume to start")
    if not options.resume and has_checkpoint:
        raise UsageError(f"{out} already holds a training run; pass --resume to continue it or pick a new --out")
    from engine.train.outdir import check_out_folder, claim  # here: engine.train imports torch

    if options.force and options.resume:
        raise UsageError("--force starts the head afresh and --resume continues it: give one of them")
    # a model's folder (config.json, model.safetensors) is never written over; a head only with --force
    check_out_folder(out, force=options.force, resume=options.resume)
    _check_writable(out)
    check_train_target(options)  # the flags and --out first, then the target's files, before any data is made
    claim(out, options.method)
    return out


def _train(options: TrainDraftOptions, out: Path, target: Any, cache: Any, trains: list, held: list, device: Any,
           threads: int, deadline: float | None) -> int:
    """Train on the generated data and export the head to ``out``; print where it is."""

    from engine.train.targets import StoredTarget
    from engine.train.trainer import TrainSettings, train

    settings = TrainSettings(
        draft_vocab_size=min(options.draft_vocab_size, int(target.hf.config.vocab_size)), ttt_steps=options.ttt_steps,
        intermediate_size=options.intermediate_size, batch_tokens=options.batch_tokens, epochs=options.epochs,
        max_steps=options.max_steps, checkpoint_every=options.checkpoint_every, eval_every=options.eval_every,
        seed=options.seed, export_dtype=options.export_dtype, bf16=options.bf16, refit_vocab=options.refit_vocab,
        **({"lr": options.lr} if options.lr else {}),
    )
    card = {**_run_card(options, target, cache, trains, held, device, threads), "settings": dict(vars(settings))}
    json.dumps(card)  # the card must stay serialisable
    stored = not options.live_target and cache.has_features(trains + held)
    source = StoredTarget(cache, target.hf) if stored else None
    print("training reads the stored target features" if source else "training runs the target on every batch")
    if options.refit_vocab:  # said in the log, since a device run is read from it afterwards
        print(f"draft vocabulary: re-picked from this run's data ({settings.draft_vocab_size} most frequent answer "
              "tokens; a resumed run keeps its checkpoint's)")
    result = train(target.hf, trains, held, out, settings, stop_ids=sorted(target.tokenizer.stop_token_ids),
                   resume=options.resume, card=card, deadline=deadline, init_from=options.init_from, source=source)
    tau = result.eval.get("tau") if result.eval else None
    print(f"done: {result.steps} steps; held-out tau {tau:.3f} (greedy chain of {options.ttt_steps})" if tau is not None
          else f"done: {result.steps} steps")
    print(f"head: {out}/config.json + model.safetensors; use it with --method eagle3 --draft {out}")
    return 0


def _train_dflash(options: TrainDraftOptions, out: Path, target: Any, cache: Any, trains: list, held: list,
                  device: Any, threads: int, deadline: float | None) -> int:
    """Train a DFlash drafter on the first ``--tokens`` answer tokens whose features are stored (the
    data engine fills only those of imported shards; with ``--live-target``, or where none are stored
    as on a GPU, of all the data, the target run on each step) and export it to ``out``; print where it is."""
    from dataclasses import asdict

    from engine.drafters.dflash.train import DFlashSettings, capture_layers, train_drafter
    from engine.train.data import answer_tokens
    from engine.train.targets import StoredTarget
    from specchat.train_medusa import budget

    settings = DFlashSettings(
        block_size=options.block_size or 8, draft_layers=options.draft_layers or 1,
        draft_vocab_size=min(options.draft_vocab_size, int(target.hf.config.vocab_size)),
        intermediate_size=options.intermediate_size, anchors=options.anchors or 64,
        loss_decay_gamma=options.loss_decay_gamma, batch_tokens=options.batch_tokens, pack_rows=options.pack_rows or 0,
        lr=options.lr or 6e-4, epochs=options.epochs, max_steps=options.max_steps,
        checkpoint_every=options.checkpoint_every, eval_every=options.eval_every, seed=options.seed,
        export_dtype=options.export_dtype, bf16=options.bf16, **({"max_eval_blocks": options.eval_blocks}
                                                                   if options.eval_blocks else {}))
    stored = [] if options.live_target else _with_features(cache, trains + held)
    if stored:
        trains, held = [s for s in stored if not s.held_out], [s for s in stored if s.held_out]
    trains = budget(trains, options.tokens)
    layers = list(capture_layers(int(target.hf.config.num_hidden_layers)))
    card = {**_run_card(options, target, cache, trains, held, device, threads), "method": "dflash",
            "settings": {**asdict(settings), "loss_decay_gamma": settings.gamma},
            "target_features": f"the residual streams entering layers {layers} (EAGLE-3's capture layers, "
                               + ("the ones the data engine stores), so training ran no target of its own" if stored
                                  else f"the data engine's), computed by the target's forward over each step's "
                                       f"conversations at once, on {device}"),
            "labels": "the target's greedy token at each block position, along the greedy path from the anchor"}
    json.dumps(card)  # the card must stay serialisable
    source = StoredTarget(cache, target.hf) if stored else None
    print(f"training a DFlash drafter (blocks of {settings.block_size}, {settings.draft_layers} layer(s), "
          f"{settings.draft_vocab_size} draft tokens) on {answer_tokens(trains)} answer tokens ({len(trains)} "
          f"conversations), {len(held)} held out; "
          + ("the stored target features" if source else "the target run on every step's conversations at once")
          + (f"; up to {settings.pack_rows} block rows a drafter forward" if settings.pack_rows else ""))
    result = train_drafter(target.hf, trains, held, out, settings, source=source, verifier=target.name,
                           stop_ids=sorted(target.tokenizer.stop_token_ids), resume=options.resume, card=card,
                           deadline=deadline)
    res = result.eval or {}
    if res:
        print(f"done: {result.steps} steps; held-out tau {res['tau']:.3f} (blocks of {res['block_size']}); "
              "acceptance by position " + ", ".join(f"{a:.3f}" for a in res["acceptance"]))
    else:
        print(f"done: {result.steps} steps")
    print(f"drafter: {out}/config.json + model.safetensors (speculators layout); use it with --method dflash "
          f"--draft {out}")
    return 0


def _with_features(cache: Any, samples: list) -> list:
    """The samples whose shard holds the stored target features (the first --tokens of imported ids
    get them; the rest of a large import need not)."""
    shards: dict[int, bool] = {}
    return [s for s in samples
            if s.ref is not None and shards.setdefault(s.ref[0], cache.has_features([s]))]


def _run_card(options: TrainDraftOptions, target: Any, cache: Any, trains: list, held: list, device: Any,
              threads: int) -> dict[str, Any]:
    """What the exported head's config records about its run: command, data, machine."""
    import torch

    from engine.train.data import answer_tokens

    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return {"target": target.name, "command": _command_line(),
            "data_cache": f"<cache>/train-data/{cache.folder.name}",
            "data": {"conversations": len(trains), "answer_tokens": answer_tokens(trains), "held_out": len(held)},
            "machine": f"{cpu_name_and_flags()[0]}, {os.cpu_count()} cores, {device}{gpu}, torch threads={threads}"}


def _check_writable(out: Path) -> None:
    """Refuse an output folder we cannot write before any data is generated or trained."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name a folder for the head")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".specchat-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to --out {out} ({exc.strerror or exc}); pick a folder you can write") from None


def _command_line(argv: list[str] | None = None) -> str:
    """The command as a head card records it: paths inside the working folder relative to it, other
    absolute paths as ``<name>`` (a card says how a head was trained, never where on the trainer's
    disk: the shipped session-23 head recorded /tmp and /root paths until this)."""
    import shlex
    import sys

    args = sys.argv[1:] if argv is None else argv
    return "specchat " + " ".join(shlex.quote(_shareable(a)) for a in args) if args else "specchat train-draft"


def _shareable(arg: str) -> str:
    flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not value.startswith(("/", "~")):
        return arg
    path = Path(value).expanduser()
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = f"<{path.name}>"
    return f"{flag}{eq}{shown}"
