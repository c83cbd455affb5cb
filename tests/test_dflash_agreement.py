"""The trainer's block forward and the engine's agree: what a DFlash drafter learns is what it drafts.

A tiny random target and a drafter made by the trainer's own ``new_drafter`` (its draft vocabulary,
``d2t`` and mask token; its layers re-randomised so that the context, the positions and every norm
weigh in), exported and loaded as ``--method dflash --draft OUT`` loads it. The session answers
greedily with a chain of the whole block; every block it ran is recorded (its anchor position,
root and log-probabilities). The trainer then replays the same conversation as it trains on it:
the target's features of the whole token sequence (``LiveTarget``, transformers' forward), every
recorded anchor in one forward under ``block_mask``, labels from ``greedy_labels``. Per anchor
(the first step, after multi-token commits, after a prompt that extends the history):

* the log-probabilities of every block position agree in fp32, and so do the guessed target ids;
* the features the session committed are the trainer's rows, row for row;
* the length the verifier accepted is the trainer's accepted run against its greedy labels.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from tiny import TinyTokenizer, hf_model

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.dflash.blocks import accepted_runs, greedy_labels
from engine.drafters.dflash.drafter import DFlashDrafter
from engine.drafters.dflash.export import export_dflash
from engine.drafters.dflash.train import Blocks, DFlashSettings, block_hidden, new_drafter, used_ids
from engine.drafters.draft_loader import load_draft
from engine.events import Step
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session
from engine.train.data import Sample
from engine.train.targets import LiveTarget

VOCAB, LAYERS, BLOCK, DRAFT_VOCAB, STOP = 13, 8, 5, 10, 2


@functools.cache
def _target(seed: int) -> tuple[torch.nn.Module, LlamaModel]:
    hf, cfg = hf_model("llama", seed, num_hidden_layers=LAYERS, vocab_size=VOCAB)
    return hf, LlamaModel(LlamaConfig.from_dict(cfg), {k: v.detach().clone() for k, v in hf.state_dict().items()})


def _drafter(hf: torch.nn.Module, seed: int, out: Path):
    """The trainer's fresh drafter with every weight but the (target's) LM head rows re-randomised,
    exported in fp32 and loaded back by the engine's loader."""
    g = torch.Generator().manual_seed(seed)
    samples = [Sample(torch.randint(3, VOCAB, (24,), generator=g).tolist(), 8, True) for _ in range(8)]
    settings = DFlashSettings(block_size=BLOCK, draft_vocab_size=DRAFT_VOCAB, bf16="off", export_dtype="float32")
    draft = new_drafter(hf, samples, settings, stop_ids=[STOP])
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "lm_head" in name:
                continue
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    draft.eval()
    export_dflash(draft, out, verifier="tiny", dtype=torch.float32)
    return draft, load_draft(str(out), _target(seed)[1], TinyTokenizer(VOCAB))


def _recording(bundle, made: list[DFlashDrafter], blocks: list[tuple[int, int, torch.Tensor]],
               rows: dict[int, torch.Tensor]):
    """The bundle's factory, its drafters recording (position, root, log-probabilities) of each block
    and the feature row each context position joined the cache with."""
    def factory() -> DFlashDrafter:
        drafter = bundle.factory()
        run = drafter.block

        def block(root: int, count: int):
            first = drafter.cache.length
            if drafter._pending:
                rows.update(enumerate(torch.cat(drafter._pending).clone(), start=first))
            out = run(root, count)
            blocks.append((out.position, root, out.logp.clone()))
            return out

        drafter.block = block  # type: ignore[method-assign]
        made.append(drafter)
        return drafter
    return factory


def _answer(session: Session, prompt: list[int]) -> list[Step]:
    return [e for e in session.generate_ids(prompt) if isinstance(e, Step)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engines_blocks_are_the_trainers_at_every_anchor(seed: int, tmp_path: Path) -> None:
    torch.manual_seed(seed)
    hf, model = _target(seed)
    draft, bundle = _drafter(hf, seed, tmp_path / "drafter")
    assert bundle.features.capture_layers == draft.spec.capture_layers == (2, 4, 5)
    made: list[DFlashDrafter] = []
    blocks: list[tuple[int, int, torch.Tensor]] = []
    rows: dict[int, torch.Tensor] = {}
    config = SpecConfig(method="dflash", eagle_topk=1, num_draft_tokens=BLOCK, max_new_tokens=40,
                        adaptive_draft=False)
    session = Session(model, TinyTokenizer(VOCAB, stop_ids=frozenset()), config,
                      drafters={"none": NoDrafter, "dflash": _recording(bundle, made, blocks, rows)},
                      features=bundle.features)
    g = torch.Generator().manual_seed(100 + seed)
    prompt = torch.randint(3, VOCAB, (7,), generator=g).tolist()
    steps = _answer(session, prompt)
    first = [*prompt, *(c.id for s in steps for c in s.committed)]
    # a second prompt extending the first answer: the drafter keeps the shared prefix's rows
    more = [*first, *torch.randint(3, VOCAB, (4,), generator=g).tolist()]
    second = _answer(session, more)
    (drafter,) = made
    ids = [*more, *(c.id for s in second for c in s.committed)]
    accepted = [len(s.accepted) for s in [*steps, *second] if s.tree is not None and len(s.tree) > 1]
    assert max(accepted) >= 2, "no multi-token commit: the test would not exercise the context's update"
    assert len(blocks) == len(accepted)

    # the trainer's side: the whole sequence's features, every recorded anchor in one forward
    source = LiveTarget(hf)
    sample = Sample(ids, len(prompt), True)
    features, argmax = source.sequence(sample, draft.spec.target_layer_ids)
    assert len(rows) >= drafter.cache.length - 1  # every context row the blocks read (re-read rows: the last)
    scale = float(features.abs().max())  # fp32 rounding of a residual stream this large
    for p, row in rows.items():
        torch.testing.assert_close(row, features[p], atol=2e-5 * scale, rtol=0, msg=f"features of token {p}")
    anchors = torch.tensor([n for n, _, _ in blocks])
    assert [ids[n] for n, _, _ in blocks] == [root for _, root, _ in blocks]  # the root is the anchor token
    tokens = torch.tensor(ids)
    labels, valid = greedy_labels(tokens, argmax, anchors, BLOCK)
    with torch.no_grad():
        hidden = block_hidden(draft, hf.get_input_embeddings().weight, Blocks(features, tokens, anchors, labels, valid))
        logp = torch.log_softmax(draft.lm_head(hidden), dim=-1)
    used = used_ids(draft)
    for i, (n, _, engine) in enumerate(blocks):
        torch.testing.assert_close(engine, logp[i], atol=2e-5, rtol=1e-5, msg=f"block at {n}")
        assert drafter.runner.to_target(engine.argmax(-1)).tolist() == used[logp[i].argmax(-1)].tolist()
    runs = accepted_runs(used[logp.argmax(-1)] == labels, valid)
    full = valid.all(dim=1)  # blocks whose every position has a label: the verifier's count is the run
    assert [a for a, f in zip(accepted, full.tolist(), strict=True) if f] == runs[full].tolist()
