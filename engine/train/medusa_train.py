"""Training Medusa-1 heads on the target's own answers: frozen target, per-head losses weighted by depth.

The only target output a Medusa head reads is the last hidden state (the input of the target's
lm_head, after its final norm), which the data engine already stores beside the ids (``hidden``
arrays); so training gathers those rows once into memory and never runs the target (ids
imported without them, as on a GPU, get them from one pass of the target first:
:func:`gather_positions`). Position p of an answer trains head k to guess ``ids[p + k + 2]``
(hard labels, the Medusa-1 recipe; the target's own lm_head guesses ``ids[p + 1]``), cross
entropy over the heads' vocabulary, weighted
``head_weight ** k``; labels outside that vocabulary, or past the conversation's end, are masked.

Checkpoints (weights + optimizer state + progress) go to ``OUT/checkpoint`` as for EAGLE-3 and
``resume=True`` continues in the same shuffled order. Held-out greedy answers give each head's
top-1 accuracy and the chain a greedy top-1 Medusa draft would get accepted (tau).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.train.data import DataCache, Sample, answer_token_counts
from engine.train.medusa_head import ExportLayout, MedusaHeadConfig, MedusaTrainHeads, export_medusa, frequent_tokens
from engine.train.targets import decoder_of
from engine.train.trainer import (
    WRITE_ERRORS,
    CheckpointKeeper,
    ResumeError,
    chain_tau,
    cpu_has_bf16,
    load_checkpoint,
    lr_at,
)


@dataclass
class MedusaSettings:
    num_heads: int = 4
    head_vocab_size: int = 8192  # the shared lm_head's rows (most frequent answer tokens); the vocabulary = none cut
    train_lm_head: bool = False  # Medusa-1 keeps it frozen (then only the blocks train)
    batch_positions: int = 1024
    lr: float = 1e-3
    warmup_steps: int = 20
    epochs: float = 1.0
    head_weight: float = 0.8  # loss weight of head k is head_weight**k
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    eval_every: int = 500  # steps; 0 = only at the end
    max_steps: int | None = None
    max_eval_positions: int = 50_000
    export_layout: ExportLayout = "vllm"
    export_dtype: str = "bfloat16"
    bf16: str = "auto"

    def use_bf16(self) -> bool:
        return self.bf16 == "on" or (self.bf16 == "auto" and cpu_has_bf16())

    def fingerprint(self) -> dict[str, Any]:
        """What must not change when resuming (schedule lengths may)."""
        return {k: getattr(self, k) for k in ("num_heads", "head_vocab_size", "train_lm_head", "batch_positions",
                                              "seed")}


# positions ---------------------------------------------------------------------------------------------
@dataclass
class Positions:
    """Every trained position of some answers: the target's hidden state and the K tokens after the next."""

    hidden: torch.Tensor  # [N, H] bf16
    labels: torch.Tensor  # [N, K] target ids; -1 past the conversation's end

    def __len__(self) -> int:
        return self.hidden.shape[0]


def _labels(ids: Sequence[int], first: int, last: int, heads: int) -> np.ndarray:
    """[last - first, heads]: ids[p + k + 2] for p in first..last-1, -1 past the end."""
    arr = np.asarray(ids, dtype=np.int64)
    p = np.arange(first, last)[:, None] + np.arange(heads)[None, :] + 2
    return np.where(p < len(arr), arr[np.minimum(p, len(arr) - 1)], -1)


def _span(s: Sample) -> tuple[int, int]:
    """Positions p whose next token ids[p+1] is an answer token (and whose hidden state is stored:
    the conversation's last token never ran)."""
    return s.answer_start - 1, len(s.ids) - 1


def gather_positions(samples: Sequence[Sample], heads: int, *, cache: DataCache | None = None,
                     hf: torch.nn.Module | None = None, limit: int | None = None,
                     batch_tokens: int = 16384) -> Positions:
    """The answers' positions, hidden states read from ``cache``'s shards where they were stored,
    else computed by ``hf`` (transformers' model; ids imported without features, as on a GPU,
    where the rows engine that stores them does not run), at most ``limit`` positions."""
    spans: list[tuple[Sample, int, int]] = []
    n = 0
    for s in samples:
        first, last = _span(s)
        if limit is not None:
            last = min(last, first + limit - n)
        if last <= first:
            continue
        spans.append((s, first, last))
        n += last - first
        if limit is not None and n >= limit:
            break
    if not spans:
        return Positions(torch.zeros(0, 0, dtype=torch.bfloat16), torch.zeros(0, heads, dtype=torch.int64))
    hidden: list[torch.Tensor | None] = [None] * len(spans)
    arrays: dict[int, dict[str, np.ndarray]] = {}
    missing = []
    for i, (s, first, last) in enumerate(spans):
        if s.ref is not None and cache is not None:
            shard, at = s.ref
            if shard not in arrays:
                arrays[shard] = cache.read_arrays(shard)
            if "hidden" in arrays[shard]:
                rows = np.array(arrays[shard]["hidden"][at + first:at + last])
                hidden[i] = torch.from_numpy(rows).view(torch.bfloat16)
                continue
        missing.append(i)
    if missing:
        if hf is None:
            raise ValueError("a sample without stored hidden states and no target to compute them")
        computed = last_hidden_batched(hf, [spans[i][0].ids[:spans[i][2]] for i in missing], batch_tokens,
                                       torch.bfloat16)
        for i, h in zip(missing, computed, strict=True):
            hidden[i] = h[spans[i][1]:]
    labels = [torch.from_numpy(_labels(s.ids, first, last, heads)) for s, first, last in spans]
    return Positions(torch.cat(hidden), torch.cat(labels))  # type: ignore[arg-type]


@torch.no_grad()
def last_hidden(hf: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """[T, H] the target's final-normed hidden states (the input of its lm_head) for one sequence."""
    device = next(hf.parameters()).device
    out = decoder_of(hf)(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    return out.last_hidden_state[0].float().cpu()


@torch.no_grad()
def last_hidden_batched(hf: torch.nn.Module, sequences: Sequence[Sequence[int]], batch_tokens: int = 16384,
                        dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """:func:`last_hidden` of many sequences, several per forward (sorted by length, padded at the
    end, which a causal model never attends to): one forward per conversation would be 35,739
    forwards of a few hundred tokens for the shipped data, each too small to fill a GPU. The
    padding changes which kernels run, not what they compute, so rows agree with the
    one-at-a-time forward to float rounding (tested). ``dtype``: what the rows are kept in (bf16
    for training: 7M answer tokens are 8 GB of bf16 rows)."""
    device = next(hf.parameters()).device
    decoder = decoder_of(hf)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[torch.Tensor | None] = [None] * len(sequences)
    at = 0
    while at < len(order):
        longest = len(sequences[order[at]])
        group = [order[at]]
        while at + len(group) < len(order):
            nxt = len(sequences[order[at + len(group)]])
            if (len(group) + 1) * max(longest, nxt) > batch_tokens:
                break
            group.append(order[at + len(group)])
            longest = max(longest, nxt)
        ids = torch.zeros(len(group), longest, dtype=torch.long)
        mask = torch.zeros(len(group), longest, dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, :len(sequences[i])] = torch.tensor(list(sequences[i]))
            mask[row, :len(sequences[i])] = 1
        states = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
        states = states.to(dtype).cpu()
        for row, i in enumerate(group):
            out[i] = states[row, :len(sequences[i])]
        at += len(group)
    return out  # type: ignore[return-value]


# loss and evaluation ---------------------------------------------------------------------------------------
def medusa_loss(heads: MedusaTrainHeads, hidden: torch.Tensor, labels: torch.Tensor, head_weight: float,
                *, bf16: bool = False) -> tuple[torch.Tensor, list[float]]:
    """Depth-weighted cross entropy of a batch; also each head's top-1 accuracy among its valid labels."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and hidden.device.type == "cpu"):
        logits = heads(hidden.float())
    draft = torch.where(labels >= 0, heads.t2d[labels.clamp(min=0)], -1)  # [N, K] head-vocabulary ids
    total = torch.zeros((), device=hidden.device)
    acc = []
    for k in range(heads.config.num_heads):
        valid = draft[:, k] >= 0
        if not bool(valid.any()):
            acc.append(0.0)
            continue
        lg = logits[k][valid].float()
        total = total + head_weight**k * F.cross_entropy(lg, draft[valid, k])
        acc.append(float((lg.argmax(-1) == draft[valid, k]).float().mean()))
    return total, acc


@torch.no_grad()
def evaluate_heads(heads: MedusaTrainHeads, positions: Positions, batch: int = 4096) -> dict[str, Any]:
    """Top-1 per head and the greedy top-1 chain replayed on held-out greedy answers.

    On a greedy answer ids[p + k + 2] *is* the target's choice once the chain up to it was
    accepted, so a chain of heads 0..K-1 at p keeps its leading correct guesses: tau = 1 + their
    mean number (the target's own token is the 1). ``top1[k]``: head k right, whatever the heads
    before it did; ``acceptance[k]``: right given heads 0..k-1 were."""
    K = heads.config.num_heads
    right = torch.zeros(K, dtype=torch.int64)
    tries = torch.zeros(K, dtype=torch.int64)
    hits = torch.zeros(K, dtype=torch.int64)
    reach = torch.zeros(K, dtype=torch.int64)
    accepted = 0
    was = heads.training
    heads.eval()
    device = heads.weight.device
    for s in range(0, len(positions), batch):
        labels = positions.labels[s:s + batch].to(device)
        pred = heads.to_target_ids(heads(positions.hidden[s:s + batch].to(device).float()).argmax(-1)).T  # [n, K]
        ok = (pred == labels) & (labels >= 0)
        right += ok.sum(0).cpu()
        tries += (labels >= 0).sum(0).cpu()
        alive = torch.ones(len(labels), dtype=torch.bool, device=device)
        for k in range(K):
            alive = alive & (labels[:, k] >= 0)
            reach[k] += int(alive.sum())
            alive = alive & ok[:, k]
            hits[k] += int(alive.sum())
            accepted += int(alive.sum())
    heads.train(was)
    n = len(positions)
    return {"tau": 1.0 + accepted / max(n, 1), "positions": n,
            "top1": [round(float(r) / max(int(t), 1), 4) for r, t in zip(right, tries, strict=True)],
            "acceptance": [round(float(h) / max(int(r), 1), 4) for h, r in zip(hits, reach, strict=True)]}


# the run ---------------------------------------------------------------------------------------------------
@dataclass
class MedusaResult:
    heads: MedusaTrainHeads
    out_dir: Path
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def build_heads(hf: torch.nn.Module, train_samples: Sequence[Sample], settings: MedusaSettings,
                stop_ids: Sequence[int]) -> MedusaTrainHeads:
    """Fresh heads: the vocabulary from the answers' token counts, the lm_head the target's rows."""
    vocab = int(hf.config.vocab_size)
    counts = answer_token_counts(train_samples, vocab)
    size = min(settings.head_vocab_size, vocab)
    token_map = torch.arange(vocab) if size == vocab else frequent_tokens(counts, size, set(stop_ids))
    cfg = MedusaHeadConfig(settings.num_heads, int(hf.config.hidden_size), vocab, size, settings.train_lm_head)
    heads = MedusaTrainHeads(cfg, token_map)
    heads.init_lm_head(hf.get_output_embeddings().weight.detach())
    return heads



def _order(n: int, settings: MedusaSettings, epoch: int) -> torch.Tensor:
    """The shuffled position order of an epoch (seeded: a resumed run takes the batches it would have)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(settings.seed * 7919 + epoch))


def _optimizer(heads: MedusaTrainHeads, settings: MedusaSettings, saved: dict[str, dict[str, torch.Tensor]] | None
               ) -> torch.optim.Optimizer:
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if saved:
        osd = opt.state_dict()
        for idx, st in saved.items():
            osd["state"][int(idx)] = {k: (v if k != "step" else v.float()) for k, v in st.items()}
        opt.load_state_dict(osd)
    return opt


def _start(hf: torch.nn.Module, train_samples: Sequence[Sample], settings: MedusaSettings, stop_ids: Sequence[int],
           ckpt: Path, resume: bool) -> tuple[MedusaTrainHeads, dict[str, Any], dict | None]:
    """Heads, progress and optimizer state: from the checkpoint with ``resume``, else fresh."""
    if not resume:
        if (ckpt / "progress.json").exists():
            raise ResumeError(f"{ckpt.parent} already holds a training run; pass --resume to continue it or pick a "
                              "new --out")
        heads = build_heads(hf, train_samples, settings, stop_ids)
        state = {"step": 0, "epoch": 0, "batch": 0, "elapsed_s": 0.0, "train_positions": 0, "best_tau": None,
                 "history": [], "fingerprint": settings.fingerprint(), "head_config": heads.config.to_dict()}
        return heads, state, None
    sd, opt_state, state = load_checkpoint(ckpt)
    if state.get("fingerprint") != settings.fingerprint():
        raise ResumeError(f"{ckpt} was written with different settings ({state.get('fingerprint')}); "
                          "use the same options, or a new --out folder")
    heads = MedusaTrainHeads(MedusaHeadConfig(**state["head_config"]), sd["token_map"])
    heads.load_state_dict(sd)
    return heads, state, opt_state


class _Run:
    """One training run's moving parts; ``state`` is what the checkpoint keeps."""

    def __init__(self, heads: MedusaTrainHeads, opt: torch.optim.Optimizer, settings: MedusaSettings,
                 state: dict[str, Any], out: Path, keeper: CheckpointKeeper, held: Positions,
                 target_lm_head: torch.Tensor, card: dict[str, Any] | None, log: Callable[[str], None]) -> None:
        self.heads, self.opt, self.settings, self.state, self.out = heads, opt, settings, state, out
        self.keeper, self.held, self.target_lm_head, self.card, self.log = keeper, held, target_lm_head, card, log

    def step(self, hidden: torch.Tensor, labels: torch.Tensor, total: int) -> list[float]:
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.state["step"], self.settings.lr, self.settings.warmup_steps, total)
        device = self.heads.weight.device  # positions stay in host memory (8 GB of bf16 for 7M): a batch goes over
        hidden, labels = hidden.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss, acc = medusa_loss(self.heads, hidden, labels, self.settings.head_weight, bf16=self.settings.use_bf16())
        self.opt.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.heads.parameters(), self.settings.grad_clip)
            self.opt.step()
        self.state["step"] += 1
        self.state["batch"] += 1
        self.state["train_positions"] += len(labels)
        return acc

    def checkpoint(self) -> None:
        self.keeper.save(self.heads, self.opt, self.state)  # type: ignore[arg-type]

    def evaluate(self) -> dict[str, Any]:
        if not len(self.held):
            return {}
        st = self.state
        res = evaluate_heads(self.heads, self.held)
        res.update(step=st["step"], elapsed_s=round(st["elapsed_s"], 1), train_positions=st["train_positions"])
        st["history"].append(res)
        self.log(f"step {st['step']}: held-out tau {res['tau']:.3f} ({res['positions']} positions); per-head top-1 "
                 + ", ".join(f"{a:.3f}" for a in res["top1"]) + "; chain acceptance "
                 + ", ".join(f"{a:.3f}" for a in res["acceptance"]))
        return res

    def export(self, res: dict[str, Any]) -> None:
        """Write the heads unless an earlier export measured a better tau (a failed write keeps the
        checkpoint and raises ExportError saying where it is)."""
        best = self.state.get("best_tau")
        if res and best is not None and res["tau"] < best:
            return
        st = self.state
        info = {**(self.card or {}), "steps": st["step"], "train_positions": st["train_positions"],
                "training_time_s": round(st["elapsed_s"]), "eval": res or None}
        try:
            export_medusa(self.heads, self.out, self.settings.export_layout, target_lm_head=self.target_lm_head,
                          dtype=getattr(torch, self.settings.export_dtype), card=info)
        except WRITE_ERRORS as exc:
            self.checkpoint()
            raise self.keeper.export_failed(self.out, exc) from None
        if res:
            st["best_tau"] = res["tau"]


def total_steps(n_positions: int, settings: MedusaSettings) -> int:
    per_epoch = max(1, math.ceil(n_positions / settings.batch_positions))
    total = max(1, math.ceil(settings.epochs * per_epoch))
    return total if settings.max_steps is None else min(total, settings.max_steps)


def train_medusa(hf: torch.nn.Module, train_samples: Sequence[Sample], eval_samples: Sequence[Sample],
                 out_dir: str | Path, settings: MedusaSettings, *, cache: DataCache | None = None,
                 stop_ids: Sequence[int] = (), resume: bool = False, card: dict[str, Any] | None = None,
                 log: Callable[[str], None] = print, progress_bar: bool = True, deadline: float | None = None
                 ) -> MedusaResult:
    """Train (or continue) Medusa heads for ``hf`` (transformers' model, frozen) and export the
    best-by-held-out-tau heads to ``out_dir`` in ``settings.export_layout``.

    Hidden states come from ``cache``'s shards where the samples have them, else from ``hf``.
    ``deadline`` (time.time()) stops early after a checkpoint, then evaluates and exports."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    ckpt = out / "checkpoint"
    heads, state, saved_opt = _start(hf, train_samples, settings, stop_ids, ckpt, resume)
    heads.to(next(hf.parameters()).device)  # a GPU trains them too, not only the hidden states' pass
    K = settings.num_heads
    t_load = time.monotonic()
    data = gather_positions(train_samples, K, cache=cache, hf=hf)
    held = gather_positions([s for s in eval_samples if s.greedy], K, cache=cache, hf=hf,
                            limit=settings.max_eval_positions)
    log(f"positions: {len(data)} for training, {len(held)} held out (read in {time.monotonic() - t_load:.0f} s)")
    if not len(data):
        raise ResumeError("no answer positions to train on; generate more data (raise --tokens)")
    total = total_steps(len(data), settings)
    run = _Run(heads, _optimizer(heads, settings, saved_opt), settings, state, out, CheckpointKeeper(ckpt, log),
               held, hf.get_output_embeddings().weight.detach(), card, log)
    bar = tqdm(total=total, initial=min(state["step"], total), desc="training Medusa heads", unit="step",
               dynamic_ncols=True, disable=not progress_bar)
    ema: list[float] | None = None
    t0, elapsed0 = time.monotonic(), state["elapsed_s"]
    B = settings.batch_positions
    stop = False
    while state["step"] < total and not stop:
        order = _order(len(data), settings, state["epoch"])
        batches = math.ceil(len(data) / B)
        while state["batch"] < batches and state["step"] < total:
            idx = order[state["batch"] * B:(state["batch"] + 1) * B]
            acc = run.step(data.hidden[idx], data.labels[idx], total)
            state["elapsed_s"] = elapsed0 + time.monotonic() - t0
            ema = acc if ema is None else [0.9 * e + 0.1 * a for e, a in zip(ema, acc, strict=True)]
            bar.update(1)
            bar.set_postfix(top1=" ".join(f"{a:.2f}" for a in ema), tau_est=f"{chain_tau(ema):.2f}")
            if state["step"] % settings.checkpoint_every == 0:
                run.checkpoint()
            if settings.eval_every and state["step"] % settings.eval_every == 0 and state["step"] < total:
                run.export(run.evaluate())
                run.checkpoint()
            if deadline is not None and time.time() > deadline:
                stop = True
                break
        if state["batch"] >= batches:
            state["epoch"] += 1
            state["batch"] = 0
    bar.close()
    run.checkpoint()
    res = run.evaluate()
    run.export(res)
    run.checkpoint()
    return MedusaResult(heads, out, state["step"], res, state["history"])


def settings_dict(settings: MedusaSettings) -> dict[str, Any]:
    return asdict(settings)
