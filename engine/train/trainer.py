"""Training an EAGLE-3 head with training-time test (TTT) on the target's own data.

The target's features and labels come from a :class:`~engine.train.targets.TargetSource`: the
ones the data engine stored beside the ids (the target never runs during training), or, for
data without them, transformers' model run on every batch. Loss per TTT step i is the soft cross
entropy against the target's next-token distribution restricted to the draft vocabulary
(renormalised), weighted 0.8**i; positions whose target argmax is outside the draft vocabulary,
and tokens that are not part of an answer, are masked.

Checkpoints (weights + optimizer state in safetensors, progress in JSON) are written every few
steps into ``OUT/checkpoint``; ``resume=True`` continues from there, in the same batch order.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.errors import UserError
from engine.train.data import Sample, iter_batches
from engine.train.head import Eagle3Head, HeadConfig, draft_vocab, export_head, load_exported
from engine.train.targets import LiveTarget, TargetSource, decoder_of


@dataclass
class TrainSettings:
    draft_vocab_size: int = 8192
    ttt_steps: int = 5
    intermediate_size: int | None = None  # default: the target's
    batch_tokens: int = 1024  # padded tokens per batch
    lr: float = 5e-4
    warmup_steps: int = 20
    epochs: float = 2.0
    step_weight: float = 0.8  # loss weight of TTT step i is step_weight**i
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 20  # steps
    eval_every: int = 200  # steps; 0 = only at the end
    max_steps: int | None = None  # stop after this many steps in total (tests, time-boxed runs)
    aux_layer_ids: list[int] | None = None
    export_dtype: str = "bfloat16"
    bf16: str = "auto"  # the head's forward under bf16 autocast: "auto" (where the CPU has bf16 dot products), on, off

    def use_bf16(self) -> bool:
        if self.bf16 in ("on", "off"):
            return self.bf16 == "on"
        return cpu_has_bf16()

    def fingerprint(self) -> dict[str, Any]:
        """What must not change when resuming (schedule lengths may)."""
        return {k: getattr(self, k) for k in ("draft_vocab_size", "ttt_steps", "intermediate_size",
                                              "batch_tokens", "seed", "aux_layer_ids")}


def cpu_has_bf16() -> bool:
    """AVX-512 BF16 or AMX: where bf16 matrix products run faster than fp32 on this CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


class ResumeError(UserError, ValueError):
    """A checkpoint that cannot be continued with these settings; the message says why."""


# one batch ---------------------------------------------------------------------------------------
@dataclass
class BatchStats:
    loss: float
    acc: list[float]  # per TTT step: draft argmax == target argmax, among valid positions
    counts: list[int]
    tokens: int


def _pad(batch: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T = max(len(s.ids) for s in batch)
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    lengths = torch.tensor([len(s.ids) for s in batch])
    starts = torch.tensor([s.answer_start for s in batch])
    for r, s in enumerate(batch):
        ids[r, :len(s.ids)] = torch.tensor(s.ids)
    return ids, lengths, starts


def batch_loss(head: Eagle3Head, source: TargetSource, batch: Sequence[Sample], steps: int, step_weight: float,
               *, bf16: bool = False, full_logits: bool = False
               ) -> tuple[torch.Tensor, BatchStats, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """TTT loss of one batch. Also returns per-step draft logits and the ids/validity for eval.

    ``bf16``: the head's forward (and so its backward) under CPU bf16 autocast. The head's LM head,
    half of its arithmetic, runs only at positions some TTT step is trained on (answer tokens);
    ``full_logits`` returns every position's logits [B, N, Vd] instead (evaluation)."""
    device = head.d2t.device
    ids, lengths, starts = _pad(batch)
    ids, lengths, starts = ids.to(device), lengths.to(device), starts.to(device)
    B, T = ids.shape
    N = T - 1
    embeds, feats, probs, inside = source.batch(head, batch, ids)
    p = torch.arange(N, device=device)
    keep = None
    if not full_logits:  # some step i predicts an answer token p + 2 + i
        keep = (p[None, :] + 2 < lengths[:, None]) & (p[None, :] + 1 + steps >= starts[:, None])
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = head.ttt_forward(embeds.float(), feats.float(), steps, keep=keep)
    Vd = probs.shape[-1]
    probs = torch.cat([probs, probs.new_zeros(B, steps + 1, Vd)], dim=1)
    inside = torch.cat([inside, inside.new_zeros(B, steps + 1)], dim=1)
    total = torch.zeros((), device=device)
    acc, counts = [], []
    for i, lg in enumerate(logits):
        tok_pos = p + 2 + i  # the token predicted
        in_answer = (tok_pos[None, :] < lengths[:, None]) & (tok_pos[None, :] >= starts[:, None])
        valid = in_answer & inside[:, 1 + i:1 + i + N]
        tp = probs[:, 1 + i:1 + i + N][valid]  # [n, Vd], positions in row-major order
        lg = lg[valid[keep]] if keep is not None else lg[valid]  # valid is inside keep: the same order
        n = int(valid.sum())
        counts.append(n)
        if n:
            ce = -(tp * F.log_softmax(lg.float(), dim=-1)).sum(-1)
            total = total + (step_weight**i) * ce.mean()
            acc.append(float((lg.argmax(-1) == tp.argmax(-1)).float().mean()))
        else:
            acc.append(0.0)
    stats = BatchStats(float(total.detach()), acc, counts, int((lengths - starts).sum()))
    return total, stats, logits, ids, (lengths, starts)


def chain_tau(acc: Sequence[float]) -> float:
    """Expected tokens per target forward for a top-1 chain of len(acc) drafts when draft step i
    is accepted with conditional probability acc[i] (bonus token included)."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau


@torch.no_grad()
def measure_tau(head: Eagle3Head, source: TargetSource | torch.nn.Module, samples: Sequence[Sample], steps: int,
                batch_tokens: int = 2048) -> dict[str, Any]:
    """Greedy chain speculation replayed on held-out greedy answers.

    On a greedy answer the next ground-truth token *is* the target's argmax, so while the draft
    agrees with it the draft's next input equals its own prediction, exactly as at inference. The
    accepted run at position p is the number of leading TTT steps whose draft argmax (mapped to a
    target id) equals the answer's token; tau = 1 + mean run over every answer position.
    """
    if isinstance(source, torch.nn.Module):
        source = LiveTarget(source)
    head.eval()
    runs_total, positions = 0.0, 0
    hits = [0] * steps
    tries = [0] * steps
    for batch in iter_batches(list(samples), batch_tokens, random.Random(0)):
        _, _, logits, ids, (lengths, starts) = batch_loss(head, source, batch, steps, 1.0, full_logits=True)
        B, T = ids.shape
        N = T - 1
        p = torch.arange(N, device=ids.device)
        padded = torch.cat([ids, ids.new_zeros(B, steps + 1)], dim=1)
        alive = (p[None, :] + 2 < lengths[:, None]) & (p[None, :] + 2 >= starts[:, None])
        positions += int(alive.sum())
        run = torch.zeros(B, N, device=ids.device)
        for i, lg in enumerate(logits):
            pred = head.used_ids[lg.argmax(-1)]
            tok_pos = p + 2 + i
            ok = (pred == padded[:, 2 + i:2 + i + N]) & (tok_pos[None, :] < lengths[:, None])
            tries[i] += int(alive.sum())
            alive = alive & ok
            hits[i] += int(alive.sum())
            run += alive.float()
        runs_total += float(run.sum())
    head.train()
    cond = [hits[i] / tries[i] if tries[i] else 0.0 for i in range(steps)]
    return {"tau": 1.0 + runs_total / max(positions, 1), "positions": positions, "chain_depth": steps,
            "step_acceptance": cond}


# checkpoints -------------------------------------------------------------------------------------
def save_checkpoint(folder: Path, head: Eagle3Head, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"head.{k}": v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    osd = opt.state_dict()
    for idx, st in osd["state"].items():
        for name, val in st.items():
            t = val if torch.is_tensor(val) else torch.tensor(val)
            tensors[f"opt.{idx}.{name}"] = t.detach().cpu().contiguous()
    save_file(tensors, str(folder / "state.safetensors.part"))
    os.replace(folder / "state.safetensors.part", folder / "state.safetensors")
    (folder / "progress.json.part").write_text(json.dumps(state, indent=2))
    os.replace(folder / "progress.json.part", folder / "progress.json")


def load_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], dict]:
    from safetensors.torch import load_file

    try:
        state = json.loads((folder / "progress.json").read_text())
        tensors = load_file(str(folder / "state.safetensors"))
    except (OSError, ValueError) as e:
        raise ResumeError(f"no usable checkpoint in {folder} ({e}); run without --resume to start afresh") from None
    head_sd = {k[5:]: v for k, v in tensors.items() if k.startswith("head.")}
    opt_state: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, name = k.split(".", 2)
            opt_state.setdefault(idx, {})[name] = v
    return head_sd, opt_state, state


# the loop ----------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    head: Eagle3Head
    out_dir: Path
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def build_head(hf: torch.nn.Module, train: Sequence[Sample], settings: TrainSettings, stop_ids: Sequence[int]
               ) -> Eagle3Head:
    """A fresh head: draft vocabulary from the answers' token counts, LM head warm-started."""
    vocab = int(hf.config.vocab_size)
    counts = torch.zeros(vocab, dtype=torch.int64)
    for s in train:
        counts += torch.bincount(torch.tensor(s.ids[s.answer_start:]), minlength=vocab)[:vocab]
    used = draft_vocab(counts, settings.draft_vocab_size, keep=set(stop_ids))
    cfg = HeadConfig.for_target(hf.config, len(used), settings.intermediate_size, settings.aux_layer_ids)
    torch.manual_seed(settings.seed)
    head = Eagle3Head(cfg, used)
    norm = getattr(decoder_of(hf), "norm", None)
    head.reset_parameters_from_target(hf.get_output_embeddings().weight, norm.weight if norm is not None else None)
    return head


def train(hf: torch.nn.Module, train_samples: Sequence[Sample], eval_samples: Sequence[Sample], out_dir: str | Path,
          settings: TrainSettings, *, stop_ids: Sequence[int] = (), resume: bool = False,
          card: dict[str, Any] | None = None, log: Callable[[str], None] = print, progress_bar: bool = True,
          deadline: float | None = None, init_from: str | Path | None = None,
          source: TargetSource | None = None) -> TrainResult:
    """Train (or continue) a head; export the best-by-tau weights to ``out_dir`` in EAGLE-3 layout.

    ``deadline`` (time.time()) stops early after a checkpoint, then evaluates and exports.
    ``init_from`` starts a new run from an exported head (its weights and draft vocabulary; the
    optimizer starts afresh): how a run continues on a machine that lacks the checkpoint.
    """
    from tqdm.auto import tqdm

    source = source or LiveTarget(hf)
    bf16 = settings.use_bf16()
    out = Path(out_dir)
    ckpt = out / "checkpoint"
    device = next(hf.parameters()).device
    if resume:
        head_sd, opt_state, state = load_checkpoint(ckpt)
        if state.get("fingerprint") != settings.fingerprint():
            raise ResumeError(f"{ckpt} was written with different settings ({state.get('fingerprint')}); "
                              "use the same options, or a new --out folder")
        cfg = HeadConfig(**state["head_config"])
        head = Eagle3Head(cfg, torch.arange(cfg.draft_vocab_size) + head_sd["d2t"])
        head.load_state_dict(head_sd)
    else:
        if (ckpt / "progress.json").exists():
            raise ResumeError(f"{out} already holds a training run; pass --resume to continue it or pick a new --out")
        if init_from is not None:
            head = load_exported(init_from)
            if head.config.vocab_size != int(hf.config.vocab_size) or \
                    head.config.draft_vocab_size != settings.draft_vocab_size:
                raise ResumeError(f"{init_from} does not fit: vocabulary {head.config.vocab_size}/"
                                  f"{head.config.draft_vocab_size}, want {hf.config.vocab_size}/"
                                  f"{settings.draft_vocab_size} (pass the same --draft-vocab-size)")
        else:
            head = build_head(hf, train_samples, settings, stop_ids)
        state = {"step": 0, "epoch": 0, "batch": 0, "elapsed_s": 0.0, "train_tokens": 0, "best_tau": None,
                 "history": [], "fingerprint": settings.fingerprint(), "head_config": head.config.to_dict()}
    head.to(device).train()
    opt = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if resume:
        osd = opt.state_dict()
        for idx, st in opt_state.items():
            osd["state"][int(idx)] = {k: (v if k != "step" else v.float()) for k, v in st.items()}
        opt.load_state_dict(osd)

    per_epoch = len(list(iter_batches(list(train_samples), settings.batch_tokens, random.Random(0))))
    total = max(1, math.ceil(settings.epochs * per_epoch))
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    bar = tqdm(total=total, initial=min(state["step"], total), desc="training head", unit="step",
               dynamic_ncols=True, disable=not progress_bar)
    ema: list[float] | None = None
    ema_loss = None
    t0 = time.monotonic()
    elapsed0 = state["elapsed_s"]

    def lr_at(step: int) -> float:
        if step < settings.warmup_steps:
            return settings.lr * (step + 1) / settings.warmup_steps
        frac = (step - settings.warmup_steps) / max(1, total - settings.warmup_steps)
        return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def evaluate() -> dict[str, Any]:
        if not eval_samples:
            return {}
        res = measure_tau(head, source, eval_samples, settings.ttt_steps)
        res.update(step=state["step"], elapsed_s=round(state["elapsed_s"], 1), train_tokens=state["train_tokens"])
        state["history"].append(res)
        log(f"step {state['step']}: held-out tau {res['tau']:.3f} (chain of {res['chain_depth']}, "
            f"{res['positions']} positions; per-step acceptance "
            + ", ".join(f"{a:.2f}" for a in res["step_acceptance"]) + ")")
        return res

    def export(res: dict[str, Any]) -> None:
        best = state.get("best_tau")
        if res and best is not None and res["tau"] < best:
            return
        if res:
            state["best_tau"] = res["tau"]
        info = {**(card or {}), "steps": state["step"], "train_tokens": state["train_tokens"],
                "training_time_s": round(state["elapsed_s"]), "eval": res or None,
                "finished": state["step"] >= total}
        export_head(head, out, getattr(torch, settings.export_dtype), card=info)
        (out / "tau.json").write_text(json.dumps(info, indent=2) + "\n")

    stopped_early = False
    while state["step"] < total:
        batches = list(iter_batches(list(train_samples), settings.batch_tokens,
                                    random.Random(settings.seed * 7919 + state["epoch"])))
        while state["batch"] < len(batches) and state["step"] < total:
            batch = batches[state["batch"]]
            for g in opt.param_groups:
                g["lr"] = lr_at(state["step"])
            loss, stats, *_ = batch_loss(head, source, batch, settings.ttt_steps, settings.step_weight, bf16=bf16)
            opt.zero_grad(set_to_none=True)
            if loss.requires_grad:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), settings.grad_clip)
                opt.step()
            state["step"] += 1
            state["batch"] += 1
            state["train_tokens"] += stats.tokens
            state["elapsed_s"] = elapsed0 + time.monotonic() - t0
            ema = stats.acc if ema is None else [0.9 * e + 0.1 * a for e, a in zip(ema, stats.acc, strict=True)]
            ema_loss = stats.loss if ema_loss is None else 0.9 * ema_loss + 0.1 * stats.loss
            bar.update(1)
            bar.set_postfix(loss=f"{ema_loss:.3f}", acc0=f"{ema[0]:.2f}", tau_est=f"{chain_tau(ema):.2f}")
            if state["step"] % settings.checkpoint_every == 0 or state["step"] >= total:
                save_checkpoint(ckpt, head, opt, state)
            if settings.eval_every and state["step"] % settings.eval_every == 0 and state["step"] < total:
                export(evaluate())
                save_checkpoint(ckpt, head, opt, state)
            if deadline is not None and time.time() > deadline:
                stopped_early = True
                break
        if stopped_early:
            break
        if state["batch"] >= len(batches):
            state["epoch"] += 1
            state["batch"] = 0
    bar.close()
    save_checkpoint(ckpt, head, opt, state)
    res = evaluate()
    export(res)
    save_checkpoint(ckpt, head, opt, state)
    return TrainResult(head, out, state["step"], res, state["history"])

