"""Training a DFlash drafter on the target's own answers (``specchat train-draft --method dflash``).

The data is the project's self-distilled conversations and what the data engine stored beside
them: the residual streams entering EAGLE-3's capture layers (2, L//2 and L-3) and the target's
argmax after every answer token. The drafter's context reads exactly those layers, so no target
runs again (ids without stored features, as on a GPU, get them from one forward of transformers'
model over a step's conversations: :class:`~engine.train.targets.LiveTarget`). Its labels are the target's
greedy tokens along the greedy path (blocks.py): the drafter learns what greedy verification accepts.

A step takes a batch of conversations (``batch_tokens`` of them, as for EAGLE-3), samples up to
``anchors`` anchors in each answer and runs all of a conversation's blocks in one forward of the
module (model.py's block mask), or, with ``pack_rows``, several conversations' blocks in one forward
(each block seeing only its own conversation's rows: what a GPU needs, where a forward per
conversation is launch overhead, while on a CPU the dense mask's extra columns cost real time). The
loss is the cross entropy over the draft vocabulary at every labelled position, weighted
exp(-(k - 1) / gamma) by position and averaged. The embedding and the
LM head rows are the target's, frozen: why train a copy of rows the target already fits to its own
hidden space, on a few hundred thousand tokens, when the drafter's final norm can learn to land
there; it also halves the LM head's backward, the largest product of a step on a CPU.

Checkpoints, resume in the same batch and anchor order, the deadline, held-out evaluation and the
best-by-tau export are the EAGLE-3 trainer's (engine/train/trainer.py); the export is the
speculators layout (export.py), which ``specchat run --method dflash --draft OUT`` loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.drafters.dflash.blocks import (
    acceptance_counts,
    accepted_runs,
    eligible_anchors,
    greedy_labels,
    position_weights,
    resolve_gamma,
    sample_anchors,
)
from engine.drafters.dflash.export import export_dflash
from engine.drafters.dflash.model import DFlashDraft, DFlashSpec, block_ids, block_positions, packed_block_mask
from engine.models.llama_config import shape_fields
from engine.train.data import Sample, answer_token_counts, answer_tokens
from engine.train.eagle3_head import default_aux_layer_ids, draft_vocab
from engine.train.targets import LiveTarget, StoredTarget, decoder_of
from engine.train.trainer import (
    CheckpointKeeper,
    ResumeError,
    cpu_has_bf16,
    export_if_best,
    finish,
    load_checkpoint,
    lr_at,
    make_optimizer,
    total_steps,
    train_until,
)

Source = StoredTarget | LiveTarget
EVAL_CHUNK = 256  # anchors per forward when evaluating (a conversation's answer is at most a few hundred)


@dataclass
class DFlashSettings:
    block_size: int = 8  # the anchor and block_size - 1 guesses
    draft_layers: int = 1
    draft_vocab_size: int = 8192  # rows of the drafter's own LM head (the most frequent answer tokens)
    intermediate_size: int | None = None  # the draft layers' MLP width (default: the target's)
    anchors: int = 64  # blocks per conversation and step
    loss_decay_gamma: float | None = None  # position k weighs exp(-(k - 1) / gamma); None: block_size / 2
    batch_tokens: int = 1024  # conversation tokens (padded, as EAGLE-3 counts them) per step
    pack_rows: int = 0  # block rows per drafter forward, conversations packed up to it (0: one conversation each)
    lr: float = 6e-4
    warmup_steps: int = 20
    epochs: float = 2.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 20
    eval_every: int = 200  # steps; 0 = only at the end
    max_steps: int | None = None
    max_eval_blocks: int = 10_000  # held-out blocks measured (every anchor of the first held-out answers)
    export_dtype: str = "bfloat16"
    bf16: str = "auto"

    @property
    def gamma(self) -> float:
        return resolve_gamma(self.loss_decay_gamma, self.block_size)

    def use_bf16(self) -> bool:
        return self.bf16 == "on" or (self.bf16 == "auto" and cpu_has_bf16())

    def fingerprint(self) -> dict[str, Any]:
        """What must not change when resuming (schedule lengths may)."""
        return {k: getattr(self, k) for k in ("block_size", "draft_layers", "draft_vocab_size", "intermediate_size",
                                              "anchors", "loss_decay_gamma", "batch_tokens", "seed")}


# the drafter -----------------------------------------------------------------------------------------------
def capture_layers(num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose input residual the context reads: EAGLE-3's (2, L//2, L-3), the
    ones the data engine stores features of, so training needs no target run of its own."""
    return tuple(i + 1 for i in default_aux_layer_ids(num_target_layers, "a DFlash drafter (it reads EAGLE-3's "
                                                                          "layers)"))


def pick_mask_token(samples: Sequence[Sample], vocab_size: int, stop_ids: Sequence[int]) -> int:
    """The token the block's guessed positions are embedded as: the lowest id the data holds least
    often (none of it, in practice), never a stop token. The layout has no embedding of its own
    for it (the target's row is used), so it should be one the drafter never reads as a real token."""
    counts = torch.bincount(torch.tensor([t for s in samples for t in s.ids], dtype=torch.int64),
                            minlength=vocab_size)[:vocab_size].clone()
    counts[[i for i in stop_ids if 0 <= i < vocab_size]] = counts.max() + 1
    return int(torch.argmin(counts))


def drafter_spec(target_config: Any, settings: DFlashSettings, draft_vocab_size: int, mask_token_id: int
                 ) -> DFlashSpec:
    """The drafter's shape: the target's width, heads and RoPE (its positions are the target's),
    ``draft_layers`` layers, EAGLE-3's capture layers."""
    shape = shape_fields(target_config.to_dict())
    if settings.intermediate_size:
        shape["intermediate_size"] = settings.intermediate_size
    return DFlashSpec(**shape, num_layers=settings.draft_layers, block_size=settings.block_size,
                      capture_layers=capture_layers(int(target_config.num_hidden_layers)), mask_token_id=mask_token_id,
                      draft_vocab_size=draft_vocab_size, layout="speculators", source="specchat train-draft")


def spec_from_dict(d: dict[str, Any]) -> DFlashSpec:
    return DFlashSpec(**{**d, "capture_layers": tuple(d["capture_layers"])})


def used_ids(draft: DFlashDraft) -> torch.Tensor:
    """[draft vocabulary] the target id of each LM head row."""
    rows = torch.arange(draft.spec.draft_vocab_size, device=draft.lm_head.weight.device)
    return rows + draft.d2t if hasattr(draft, "d2t") else rows


def draft_index(draft: DFlashDraft) -> torch.Tensor:
    """[target vocabulary] each target id's LM head row, -1 for a token outside the draft vocabulary."""
    used = used_ids(draft)
    index = torch.full((draft.spec.vocab_size,), -1, dtype=torch.int64, device=used.device)
    index[used] = torch.arange(used.numel(), device=used.device)
    return index


def freeze_lm_head(draft: DFlashDraft) -> DFlashDraft:
    assert draft.lm_head is not None
    draft.lm_head.weight.requires_grad_(False)
    return draft


def new_drafter(hf: nn.Module, train_samples: Sequence[Sample], settings: DFlashSettings, stop_ids: Sequence[int]
                ) -> DFlashDraft:
    """A fresh drafter: the draft vocabulary from the answers' token counts (stop ids always in),
    the LM head the target's rows for it and the final norm the target's, the layers random with
    small residual branches (so the first steps do not scramble the stream)."""
    vocab = int(hf.config.vocab_size)
    used = draft_vocab(answer_token_counts(train_samples, vocab), settings.draft_vocab_size, keep=set(stop_ids))
    spec = drafter_spec(hf.config, settings, int(used.numel()), pick_mask_token(train_samples, vocab, stop_ids))
    torch.manual_seed(settings.seed)
    draft = DFlashDraft(spec)
    norm = getattr(decoder_of(hf), "norm", None)
    with torch.no_grad():
        for name, module in draft.named_modules():
            if isinstance(module, nn.Linear) and module is not draft.lm_head:
                small = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, std=(0.1 if small else 1.0) / math.sqrt(module.weight.shape[1]))
        assert draft.lm_head is not None
        draft.lm_head.weight.copy_(hf.get_output_embeddings().weight.detach()[used].float().cpu())
        if norm is not None:
            draft.norm.weight.copy_(norm.weight.detach().float().cpu())
        if hasattr(draft, "d2t"):
            draft.d2t.copy_(used - torch.arange(used.numel()))
    return freeze_lm_head(draft)


# blocks and their forward ----------------------------------------------------------------------------------
@dataclass
class Blocks:
    """One conversation's blocks: the anchors, each position's label and whether it has one."""

    features: torch.Tensor  # [n, feature_width] the target's, as stored
    ids: torch.Tensor  # [n]
    anchors: torch.Tensor  # [N]
    labels: torch.Tensor  # [N, block_size - 1] target ids (-1: none)
    valid: torch.Tensor  # [N, block_size - 1]


def conversation_blocks(sample: Sample, source: Source, spec: DFlashSpec, pick: Callable[[torch.Tensor], torch.Tensor]
                        ) -> Blocks | None:
    """The blocks ``pick`` chooses among the answer's eligible anchors (None when it has none)."""
    return blocks_of(sample, *source.sequence(sample, spec.target_layer_ids), spec, pick)


def blocks_of(sample: Sample, features: torch.Tensor, argmax: torch.Tensor, spec: DFlashSpec,
              pick: Callable[[torch.Tensor], torch.Tensor]) -> Blocks | None:
    """:func:`conversation_blocks` from the target's side of the conversation already computed."""
    argmax = argmax.cpu()
    anchors = pick(eligible_anchors(sample.answer_start, argmax))
    if not anchors.numel():
        return None
    ids = torch.tensor(sample.ids)
    labels, valid = greedy_labels(ids, argmax, anchors, spec.block_size)
    return Blocks(features, ids, anchors, labels, valid)


def block_hidden(draft: DFlashDraft, embed: torch.Tensor, blocks: Blocks, anchors: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """[N, block_size - 1, H] the drafter's final hidden state at every guessed position of the
    blocks at ``anchors`` (default: all of ``blocks``'), one forward over the context they need."""
    return packed_hidden(draft, embed, [(blocks, blocks.anchors if anchors is None else anchors)])


def packed_hidden(draft: DFlashDraft, embed: torch.Tensor, parts: Sequence[tuple[Blocks, torch.Tensor]]
                  ) -> torch.Tensor:
    """:func:`block_hidden` of several conversations' blocks (each ``(blocks, anchors)``) in one
    forward, their rows in that order: each conversation's context rows (those before its last
    anchor) side by side at their own positions, each block seeing only its own conversation's."""
    spec, device = draft.spec, embed.device
    features, context_positions, context_segments, rows, anchors, segments = [], [], [], [], [], []
    for i, (blocks, at) in enumerate(parts):
        at = at.to(device)
        context = int(at.max())  # a block sees the rows before its anchor
        features.append(blocks.features[:context].to(device).float())
        context_positions.append(torch.arange(context, device=device))
        context_segments.append(torch.full((context,), i, device=device))
        rows.append(block_ids(blocks.ids.to(device), at, spec.block_size, spec.mask_token_id))
        anchors.append(at)
        segments.append(torch.full_like(at, i))
    at, positions = torch.cat(anchors), torch.cat(context_positions)
    mask = packed_block_mask(at, torch.cat(segments), spec.block_size, positions, torch.cat(context_segments))
    hidden = draft(torch.cat(features), F.embedding(torch.cat(rows), embed), block_positions(at, spec.block_size),
                   mask, context_positions=positions)
    return hidden.view(at.shape[0], spec.block_size, -1)[:, 1:]


def packs(rows: Sequence[int], max_rows: int) -> list[range]:
    """Consecutive conversations (``rows``: each one's block rows) grouped into forwards of at most
    ``max_rows`` rows (one with more goes alone; ``max_rows`` 0: one conversation a forward)."""
    out: list[range] = []
    start, total = 0, 0
    for i, n in enumerate(rows):
        if i > start and total + n > max_rows:
            out.append(range(start, i))
            start, total = i, 0
        total += n
    return [*out, range(start, len(rows))] if rows else out


# evaluation ------------------------------------------------------------------------------------------------
@torch.no_grad()
def measure_blocks(draft: DFlashDraft, source: Source, embed: torch.Tensor, samples: Sequence[Sample],
                   max_blocks: int = 10_000) -> dict[str, Any]:
    """Greedy block drafting replayed on held-out greedy answers: a block at every anchor (up to
    ``max_blocks``), each position's guess (the LM head's argmax, as a target id) against the
    target's greedy token there. ``acceptance[k-1]``: the share of blocks whose first k guesses
    were all right (among blocks with k labels); ``conditional[k-1]``: the k-th right given the
    first k - 1 were; tau = 1 + the mean accepted run (the target's own token is the 1)."""
    was = draft.training
    draft.eval()
    spec = draft.spec
    used = used_ids(draft)
    counts = torch.zeros(3, spec.drafts, dtype=torch.int64)
    accepted, blocks = 0, 0
    for sample in samples:
        if blocks >= max_blocks:
            break
        if not sample.greedy:
            continue
        left = max_blocks - blocks
        found = conversation_blocks(sample, source, spec, lambda a, left=left: a[:left])
        if found is None:
            continue
        for at in range(0, found.anchors.numel(), EVAL_CHUNK):
            part = slice(at, at + EVAL_CHUNK)
            hidden = block_hidden(draft, embed, found, found.anchors[part])
            guess = used[draft.lm_head(hidden).argmax(-1)].cpu()
            runs = accepted_runs(guess == found.labels[part], found.valid[part])
            counts += acceptance_counts(runs, found.valid[part])
            accepted += int(runs.sum())
            blocks += runs.numel()
    draft.train(was)
    hits, tries, reached = counts.tolist()
    return {"tau": 1.0 + accepted / max(blocks, 1), "blocks": blocks, "block_size": spec.block_size,
            "acceptance": [round(h / t, 4) if t else 0.0 for h, t in zip(hits, tries, strict=True)],
            "conditional": [round(h / r, 4) if r else 0.0 for h, r in zip(hits, reached, strict=True)]}


# the run ---------------------------------------------------------------------------------------------------
@dataclass
class DFlashResult:
    draft: DFlashDraft
    out_dir: Path
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """The anchor draw of one step: a function of where the run is, so a resumed run draws the same."""
    return ((seed * 7919 + epoch) * 1_000_003 + batch) % (2**63)


@dataclass
class _Run:
    """One training run's moving parts; ``state`` is what the checkpoint keeps."""

    draft: DFlashDraft
    opt: torch.optim.Optimizer
    source: Source
    embed: torch.Tensor  # the target's embedding table, on the drafter's device
    settings: DFlashSettings
    state: dict[str, Any]
    total: int
    out: Path
    keeper: CheckpointKeeper
    eval_samples: Sequence[Sample]
    card: dict[str, Any] | None
    verifier: str
    log: Callable[[str], None]
    bar: Any
    ema_loss: float | None = None
    ema_tau: float | None = None
    ema_first: float | None = None

    def __post_init__(self) -> None:
        self.weights = position_weights(self.settings.block_size, self.settings.gamma).to(self.embed.device)
        self.index = draft_index(self.draft)
        self.used = used_ids(self.draft)
        self.bf16 = self.settings.use_bf16()

    def _blocks(self, batch: Sequence[Sample]) -> list[Blocks]:
        """The step's blocks, the target's side of all its conversations computed at once."""
        st, spec = self.settings, self.draft.spec
        gen = torch.Generator().manual_seed(step_seed(st.seed, self.state["epoch"], self.state["batch"]))
        found = (blocks_of(s, features, argmax, spec, lambda a: sample_anchors(a, st.anchors, gen))
                 for s, (features, argmax) in zip(batch, self.source.sequences(batch, spec.target_layer_ids),
                                                  strict=True))
        return [b for b in found if b is not None]

    def step(self, batch: Sequence[Sample]) -> None:
        """One optimizer step: the conversations' blocks in one forward each (or packed, ``pack_rows``
        block rows a forward), their gradients summed (each scaled by the batch's total weight, so
        the loss is the batch's weighted mean whatever the packing)."""
        st, state, device = self.settings, self.state, self.embed.device
        for g in self.opt.param_groups:
            g["lr"] = lr_at(state["step"], st.lr, st.warmup_steps, self.total)
        blocks = self._blocks(batch)
        targets = [torch.where(b.valid, self.index.cpu()[b.labels.clamp(min=0)], -1).to(device) for b in blocks]
        weight = sum(float((self.weights * (t >= 0)).sum()) for t in targets)
        self.opt.zero_grad(set_to_none=True)
        loss_total, counts, accepted, n_blocks = 0.0, torch.zeros(3, st.block_size - 1, dtype=torch.int64), 0, 0
        for group in packs([b.anchors.numel() * st.block_size for b in blocks], st.pack_rows):
            pack = [blocks[i] for i in group]
            labels, valid_cpu = torch.cat([b.labels for b in pack]), torch.cat([b.valid for b in pack])
            target, valid = torch.cat([targets[i] for i in group]), valid_cpu.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
                hidden = packed_hidden(self.draft, self.embed, [(b, b.anchors) for b in pack])
                logits = self.draft.lm_head(hidden[valid])
            labelled = target[valid]
            inside = labelled >= 0
            ce = F.cross_entropy(logits[inside].float(), labelled[inside], reduction="none")
            loss = (ce * self.weights.expand_as(valid)[valid][inside]).sum() / max(weight, 1e-9)
            if loss.requires_grad:
                loss.backward()
            loss_total += float(loss.detach())
            with torch.no_grad():
                right = torch.zeros_like(valid)
                right[valid] = self.used[logits.argmax(-1)] == labels.to(device)[valid]
                runs = accepted_runs(right.cpu(), valid_cpu)
            counts += acceptance_counts(runs, valid_cpu)
            accepted += int(runs.sum())
            n_blocks += runs.numel()
        torch.nn.utils.clip_grad_norm_([p for p in self.draft.parameters() if p.requires_grad], st.grad_clip)
        self.opt.step()
        state["step"] += 1
        state["batch"] += 1
        state["train_tokens"] += answer_tokens(batch)
        state["train_blocks"] += n_blocks
        self._show(loss_total, 1.0 + accepted / max(n_blocks, 1), float(counts[0, 0]) / max(int(counts[1, 0]), 1))

    def _show(self, loss: float, tau: float, first: float) -> None:
        """The progress bar: smoothed loss, first-position acceptance and tau on the training blocks,
        and the last held-out tau."""
        def smooth(old: float | None, new: float) -> float:
            return new if old is None else 0.9 * old + 0.1 * new

        self.ema_loss, self.ema_tau, self.ema_first = (smooth(self.ema_loss, loss), smooth(self.ema_tau, tau),
                                                       smooth(self.ema_first, first))
        held = self.state["history"][-1]["tau"] if self.state["history"] else None
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.ema_loss:.3f}", acc1=f"{self.ema_first:.2f}", tau=f"{self.ema_tau:.2f}",
                             **({"held_tau": f"{held:.3f}"} if held is not None else {}))

    def checkpoint(self) -> None:
        self.keeper.save(self.draft, self.opt, self.state)

    def evaluate(self) -> dict[str, Any]:
        """Held-out tau and acceptance by position now, logged and kept in the history."""
        if not self.eval_samples:
            return {}
        state = self.state
        res = measure_blocks(self.draft, self.source, self.embed, self.eval_samples, self.settings.max_eval_blocks)
        if not res["blocks"]:
            return {}
        res.update(step=state["step"], elapsed_s=round(state["elapsed_s"], 1), train_tokens=state["train_tokens"])
        state["history"].append(res)
        self.log(f"step {state['step']}: held-out tau {res['tau']:.3f} (blocks of {res['block_size']}, "
                 f"{res['blocks']} blocks; acceptance by position " + ", ".join(f"{a:.2f}" for a in res["acceptance"])
                 + "; conditional " + ", ".join(f"{a:.2f}" for a in res["conditional"]) + ")")
        return res

    def export(self, res: dict[str, Any]) -> None:
        def write(info: dict[str, Any]) -> None:
            dtype = getattr(torch, self.settings.export_dtype)
            export_dflash(self.draft, self.out, verifier=self.verifier, dtype=dtype, card=info)

        export_if_best(self, res, write, train_tokens=self.state["train_tokens"],
                       train_blocks=self.state["train_blocks"])


def _start(hf: nn.Module, train_samples: Sequence[Sample], settings: DFlashSettings, stop_ids: Sequence[int],
           ckpt: Path, resume: bool) -> tuple[DFlashDraft, dict[str, Any], dict | None]:
    """The drafter, progress and optimizer state: from the checkpoint with ``resume``, else fresh."""
    if not resume:
        if (ckpt / "progress.json").exists():
            raise ResumeError(f"{ckpt.parent} already holds a training run; pass --resume to continue it or pick a "
                              "new --out")
        draft = new_drafter(hf, train_samples, settings, stop_ids)
        state = {"step": 0, "epoch": 0, "batch": 0, "elapsed_s": 0.0, "train_tokens": 0, "train_blocks": 0,
                 "best_tau": None, "history": [], "fingerprint": settings.fingerprint(), "spec": asdict(draft.spec)}
        return draft, state, None
    sd, opt_state, state = load_checkpoint(ckpt)
    if state.get("fingerprint") != settings.fingerprint():
        raise ResumeError(f"{ckpt} was written with different settings ({state.get('fingerprint')}); "
                          "use the same options, or a new --out folder")
    draft = DFlashDraft(spec_from_dict(state["spec"]))
    draft.load_state_dict(sd)
    return freeze_lm_head(draft), state, opt_state


def train_drafter(hf: nn.Module, train_samples: Sequence[Sample], eval_samples: Sequence[Sample],
                  out_dir: str | Path, settings: DFlashSettings, *, source: Source | None = None, verifier: str = "",
                  stop_ids: Sequence[int] = (), resume: bool = False, card: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print, progress_bar: bool = True, deadline: float | None = None
                  ) -> DFlashResult:
    """Train (or continue) a DFlash drafter for ``hf`` (transformers' model, frozen) and export the
    best-by-held-out-tau drafter to ``out_dir`` in the speculators layout.

    ``source``: where the target's features and argmax come from (default: ``hf`` run on each
    conversation). ``deadline`` (time.time()) stops early after a checkpoint, then evaluates and
    exports; a drafter that cannot be written raises ExportError, its checkpoint kept."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    ckpt = out / "checkpoint"
    draft, state, saved_opt = _start(hf, train_samples, settings, stop_ids, ckpt, resume)
    device = next(hf.parameters()).device
    draft.to(device).train()
    total = total_steps(train_samples, settings)
    bar = tqdm(total=total, initial=min(state["step"], total), desc="training DFlash drafter", unit="step",
               dynamic_ncols=True, disable=not progress_bar)
    opt = make_optimizer((p for p in draft.parameters() if p.requires_grad), settings.lr, saved_opt)
    run = _Run(draft, opt, source or LiveTarget(hf), hf.get_input_embeddings().weight.detach().to(device), settings,
               state, total, out, CheckpointKeeper(ckpt, log), eval_samples, card, verifier, log, bar)
    train_until(run, train_samples, deadline)
    bar.close()
    res = finish(run)
    return DFlashResult(draft, out, state["step"], res, state["history"])


__all__ = ["DFlashResult", "DFlashSettings", "capture_layers", "measure_blocks", "new_drafter", "train_drafter"]
