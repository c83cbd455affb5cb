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
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from safetensors import SafetensorError

from engine.errors import UserError
from engine.files import SMALL_LIMIT, check_regular, read_text
from engine.jsonl import loads
from engine.train.data import Sample, answer_token_counts, iter_batches
from engine.train.eagle3_head import Eagle3Head, HeadConfig, draft_vocab, export_head, load_exported, refit_vocabulary
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
    refit_vocab: bool = False  # with init_from: re-pick the draft vocabulary from this data (refit_vocabulary)

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


class ExportError(UserError):
    """The trained head could not be written to the output folder; the message says where its
    checkpoint is kept and how to export it from there."""


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
def save_checkpoint(folder: Path, head: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
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
        state = loads(read_text(folder / "progress.json", limit=SMALL_LIMIT, what="a progress.json"))
        check_regular(folder / "state.safetensors", what="a safetensors file")
        tensors = load_file(str(folder / "state.safetensors"))
    except (OSError, ValueError, UserError) as e:
        raise ResumeError(f"no usable checkpoint in {folder} ({e}); run without --resume to start afresh") from None
    head_sd = {k[5:]: v for k, v in tensors.items() if k.startswith("head.")}
    opt_state: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, name = k.split(".", 2)
            opt_state.setdefault(idx, {})[name] = v
    return head_sd, opt_state, state


# files written while training: a write that fails here raises one of these
WRITE_ERRORS: tuple[type[Exception], ...] = (OSError, SafetensorError)


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


class CheckpointKeeper:
    """Where the run's checkpoint goes: ``OUT/checkpoint``, or a fresh temporary folder from the
    first time that cannot be written (the folder vanished, the disk filled up).

    Why: hours of training live in the checkpoint, so a failed write there must not end the run
    with nothing kept; the run goes on and says where its checkpoint now is."""

    def __init__(self, folder: Path, log: Callable[[str], None]) -> None:
        self.folder = folder
        self.wanted = folder
        self.log = log

    @property
    def moved(self) -> bool:
        return self.folder != self.wanted

    def save(self, head: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        try:
            save_checkpoint(self.folder, head, opt, state)
        except WRITE_ERRORS as exc:
            if self.moved:
                raise
            self.folder = Path(tempfile.mkdtemp(prefix="specchat-checkpoint-"))
            self.log(f"cannot write the checkpoint to {self.wanted} ({_reason(exc)}); keeping it in {self.folder}")
            save_checkpoint(self.folder, head, opt, state)

    def export_failed(self, out: Path, exc: Exception) -> ExportError:
        """The one-line error for a head that could not be exported: where its checkpoint is, and
        how to export it once ``out`` can be written (the same command with --resume)."""
        where = f"could not write the head to {out} ({_reason(exc)}); the trained head is kept in {self.folder}"
        if not self.moved:
            return ExportError(f"{where}: once {out} can be written, run the same command with --resume")
        return ExportError(f"{where}: copy that folder to OUT/checkpoint and run the same command with "
                           "--resume --out OUT")


# what every draft trainer's run shares -------------------------------------------------------------
class RunState(Protocol):
    """A training run as the shared helpers see it: ``state`` is what its checkpoint keeps
    (``step``, ``epoch``, ``batch``, ``elapsed_s``, ``best_tau``, ``history``), ``total`` its
    optimizer steps, ``card`` what its export records."""

    state: dict[str, Any]
    total: int
    out: Path
    keeper: CheckpointKeeper
    card: dict[str, Any] | None

    def checkpoint(self) -> None: ...


class ScheduledRun(RunState, Protocol):
    """A run :func:`train_until` drives: one optimizer step per batch, evaluations and exports on
    schedule. ``settings`` has ``batch_tokens``, ``seed``, ``checkpoint_every`` and ``eval_every``."""

    settings: Any

    def step(self, batch: Sequence[Sample]) -> None: ...

    def evaluate(self) -> dict[str, Any]: ...

    def export(self, res: dict[str, Any]) -> None: ...


def export_if_best(run: RunState, res: dict[str, Any], write: Callable[[dict[str, Any]], None], **counts: Any
                   ) -> None:
    """``write(info)`` the model to ``run.out`` unless an earlier export measured a better tau;
    ``info`` is the card plus the run's progress (``counts``: what it trained on), also kept in
    ``tau.json``. A failed write keeps the checkpoint and raises ExportError saying where it is;
    the best tau is recorded only once its model is written, so a resumed run exports it again."""
    state = run.state
    best = state.get("best_tau")
    if res and best is not None and res["tau"] < best:
        return
    info = {**(run.card or {}), "steps": state["step"], **counts, "training_time_s": round(state["elapsed_s"]),
            "eval": res or None, "finished": state["step"] >= run.total}
    try:
        write(info)
        (run.out / "tau.json").write_text(json.dumps(info, indent=2) + "\n")
    except WRITE_ERRORS as exc:
        run.checkpoint()
        raise run.keeper.export_failed(run.out, exc) from None
    if res:
        state["best_tau"] = res["tau"]


def finish(run: ScheduledRun) -> dict[str, Any]:
    """The end of every run (its total reached, or its deadline): checkpoint, a last evaluation,
    its export, and a checkpoint that records the export."""
    run.checkpoint()
    res = run.evaluate()
    run.export(res)
    run.checkpoint()
    return res


# the loop ----------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    head: Eagle3Head
    out_dir: Path
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def _data_vocab(hf: torch.nn.Module, train: Sequence[Sample], settings: TrainSettings, stop_ids: Sequence[int]
                ) -> torch.Tensor:
    """The draft vocabulary the data asks for: its most frequent answer tokens, stop ids always in."""
    counts = answer_token_counts(train, int(hf.config.vocab_size))
    return draft_vocab(counts, settings.draft_vocab_size, keep=set(stop_ids))


def build_head(hf: torch.nn.Module, train: Sequence[Sample], settings: TrainSettings, stop_ids: Sequence[int]
               ) -> Eagle3Head:
    """A fresh head: draft vocabulary from the answers' token counts, LM head warm-started."""
    used = _data_vocab(hf, train, settings, stop_ids)
    cfg = HeadConfig.for_target(hf.config, len(used), settings.intermediate_size, settings.aux_layer_ids)
    torch.manual_seed(settings.seed)
    head = Eagle3Head(cfg, used)
    norm = getattr(decoder_of(hf), "norm", None)
    head.reset_parameters_from_target(hf.get_output_embeddings().weight, norm.weight if norm is not None else None)
    return head


class Schedule(Protocol):
    """What a run's length is made of (every trainer's settings have these)."""

    batch_tokens: int
    epochs: float
    max_steps: int | None


def total_steps(train_samples: Sequence[Sample], settings: Schedule) -> int:
    """Optimizer steps of the whole run: ``epochs`` passes over the batches, capped by ``max_steps``."""
    per_epoch = len(list(iter_batches(list(train_samples), settings.batch_tokens, random.Random(0))))
    total = max(1, math.ceil(settings.epochs * per_epoch))
    return total if settings.max_steps is None else min(total, settings.max_steps)


def lr_at(step: int, lr: float, warmup_steps: int, total: int) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak rate at ``total`` (EAGLE and
    Medusa heads alike)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = (step - warmup_steps) / max(1, total - warmup_steps)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _resumed(ckpt: Path, settings: TrainSettings) -> tuple[Eagle3Head, dict[str, dict[str, torch.Tensor]], dict]:
    """The head, optimizer state and progress of the checkpoint in ``ckpt``, if its settings match."""
    head_sd, opt_state, state = load_checkpoint(ckpt)
    if state.get("fingerprint") != settings.fingerprint():
        raise ResumeError(f"{ckpt} was written with different settings ({state.get('fingerprint')}); "
                          "use the same options, or a new --out folder")
    cfg = HeadConfig(**state["head_config"])
    head = Eagle3Head(cfg, torch.arange(cfg.draft_vocab_size) + head_sd["d2t"])
    head.load_state_dict(head_sd)
    return head, opt_state, state


def _fresh(hf: torch.nn.Module, train_samples: Sequence[Sample], settings: TrainSettings, stop_ids: Sequence[int],
           init_from: str | Path | None) -> tuple[Eagle3Head, dict]:
    """A new head (built, or read from an exported one) and the progress of a run at step 0."""
    if init_from is not None:
        head = load_exported(init_from)
        if head.config.vocab_size != int(hf.config.vocab_size) or \
                (head.config.draft_vocab_size != settings.draft_vocab_size and not settings.refit_vocab):
            raise ResumeError(f"{init_from} does not fit: vocabulary {head.config.vocab_size}/"
                              f"{head.config.draft_vocab_size}, want {hf.config.vocab_size}/"
                              f"{settings.draft_vocab_size} (pass the same --draft-vocab-size, or --refit-vocab)")
        if settings.refit_vocab:
            head = refit_vocabulary(head, _data_vocab(hf, train_samples, settings, stop_ids),
                                    hf.get_output_embeddings().weight)
    else:
        head = build_head(hf, train_samples, settings, stop_ids)
    state = {"step": 0, "epoch": 0, "batch": 0, "elapsed_s": 0.0, "train_tokens": 0, "best_tau": None,
             "history": [], "fingerprint": settings.fingerprint(), "head_config": head.config.to_dict()}
    return head, state


def make_optimizer(params: Iterable[torch.nn.Parameter], lr: float, saved: dict[str, dict[str, torch.Tensor]] | None
                   ) -> torch.optim.Optimizer:
    """AdamW over ``params`` (a draft model's trained ones), with a checkpoint's moments when resuming."""
    opt = torch.optim.AdamW(list(params), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    if saved:
        osd = opt.state_dict()
        for idx, st in saved.items():
            osd["state"][int(idx)] = {k: (v if k != "step" else v.float()) for k, v in st.items()}
        opt.load_state_dict(osd)
    return opt


@dataclass
class _Run:
    """One training run's moving parts; ``state`` is what the checkpoint keeps."""

    head: Eagle3Head
    opt: torch.optim.Optimizer
    source: TargetSource
    settings: TrainSettings
    state: dict[str, Any]
    total: int
    out: Path
    keeper: CheckpointKeeper
    eval_samples: Sequence[Sample]
    card: dict[str, Any] | None
    log: Callable[[str], None]
    bar: Any
    bf16: bool = False  # the head's forward under bf16 autocast
    ema: list[float] | None = None
    ema_loss: float | None = None

    def step(self, batch: Sequence[Sample]) -> None:
        """One optimizer step on ``batch``; the progress bar shows smoothed loss and acceptance."""
        st = self.settings
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.state["step"], st.lr, st.warmup_steps, self.total)
        loss, stats, *_ = batch_loss(self.head, self.source, batch, st.ttt_steps, st.step_weight, bf16=self.bf16)
        self.opt.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), st.grad_clip)
            self.opt.step()
        self.state["step"] += 1
        self.state["batch"] += 1
        self.state["train_tokens"] += stats.tokens
        self.ema = stats.acc if self.ema is None else [0.9 * e + 0.1 * a
                                                       for e, a in zip(self.ema, stats.acc, strict=True)]
        self.ema_loss = stats.loss if self.ema_loss is None else 0.9 * self.ema_loss + 0.1 * stats.loss
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.ema_loss:.3f}", acc0=f"{self.ema[0]:.2f}",
                             tau_est=f"{chain_tau(self.ema):.2f}")

    def checkpoint(self) -> None:
        self.keeper.save(self.head, self.opt, self.state)

    def evaluate(self) -> dict[str, Any]:
        """Held-out tau now, logged and kept in the history (empty without held-out samples)."""
        if not self.eval_samples:
            return {}
        state = self.state
        res = measure_tau(self.head, self.source, self.eval_samples, self.settings.ttt_steps)
        res.update(step=state["step"], elapsed_s=round(state["elapsed_s"], 1), train_tokens=state["train_tokens"])
        state["history"].append(res)
        self.log(f"step {state['step']}: held-out tau {res['tau']:.3f} (chain of {res['chain_depth']}, "
                 f"{res['positions']} positions; per-step acceptance "
                 + ", ".join(f"{a:.2f}" for a in res["step_acceptance"]) + ")")
        return res

    def export(self, res: dict[str, Any]) -> None:
        """Write the head to ``out`` unless an earlier export measured a better tau (:func:`export_if_best`)."""
        def write(info: dict[str, Any]) -> None:
            export_head(self.head, self.out, getattr(torch, self.settings.export_dtype), card=info)

        export_if_best(self, res, write, train_tokens=self.state["train_tokens"])


def train(hf: torch.nn.Module, train_samples: Sequence[Sample], eval_samples: Sequence[Sample], out_dir: str | Path,
          settings: TrainSettings, *, stop_ids: Sequence[int] = (), resume: bool = False,
          card: dict[str, Any] | None = None, log: Callable[[str], None] = print, progress_bar: bool = True,
          deadline: float | None = None, init_from: str | Path | None = None,
          source: TargetSource | None = None) -> TrainResult:
    """Train (or continue) a head; export the best-by-tau weights to ``out_dir`` in EAGLE-3 layout.

    ``deadline`` (time.time()) stops early after a checkpoint, then evaluates and exports.
    ``init_from`` starts a new run from an exported head (its weights and draft vocabulary; the
    optimizer starts afresh): how a run continues on a machine that lacks the checkpoint.
    A head that cannot be written raises ExportError, its checkpoint kept (the message says where).
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    ckpt = out / "checkpoint"
    saved_opt = None
    if resume:
        head, saved_opt, state = _resumed(ckpt, settings)
    else:
        if (ckpt / "progress.json").exists():
            raise ResumeError(f"{out} already holds a training run; pass --resume to continue it or pick a new --out")
        head, state = _fresh(hf, train_samples, settings, stop_ids, init_from)
    head.to(next(hf.parameters()).device).train()
    total = total_steps(train_samples, settings)
    bar = tqdm(total=total, initial=min(state["step"], total), desc="training head", unit="step",
               dynamic_ncols=True, disable=not progress_bar)
    run = _Run(head, make_optimizer(head.parameters(), settings.lr, saved_opt), source or LiveTarget(hf), settings,
               state, total, out, CheckpointKeeper(ckpt, log), eval_samples, card, log, bar, settings.use_bf16())
    train_until(run, train_samples, deadline)
    bar.close()
    res = finish(run)
    return TrainResult(head, out, state["step"], res, state["history"])


def train_until(run: ScheduledRun, train_samples: Sequence[Sample], deadline: float | None) -> None:
    """Steps until the run's total or the deadline, epoch by epoch in a seeded batch order (so a
    resumed run takes the batches it would have); checkpoints and evaluations on schedule."""
    state, settings = run.state, run.settings
    t0, elapsed0 = time.monotonic(), state["elapsed_s"]
    while state["step"] < run.total:
        batches = list(iter_batches(list(train_samples), settings.batch_tokens,
                                    random.Random(settings.seed * 7919 + state["epoch"])))
        while state["batch"] < len(batches) and state["step"] < run.total:
            run.step(batches[state["batch"]])
            state["elapsed_s"] = elapsed0 + time.monotonic() - t0
            if state["step"] % settings.checkpoint_every == 0 or state["step"] >= run.total:
                run.checkpoint()
            if settings.eval_every and state["step"] % settings.eval_every == 0 and state["step"] < run.total:
                run.export(run.evaluate())
                run.checkpoint()
            if deadline is not None and time.time() > deadline:
                return
        if state["batch"] >= len(batches):
            state["epoch"] += 1
            state["batch"] = 0
