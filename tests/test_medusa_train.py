"""``specchat train-draft --method medusa``: last-hidden-state capture, Medusa-1 training, export, resume.

The target is a tiny Llama whose greedy answers walk one 97-token cycle (its layers add nothing
and its lm_head maps each token to its successor): a head that merely repeats the target's own
guess is off by one there, so only training makes the heads right. Its self-distilled answers
come from the rows data engine with only the last hidden state captured. Nothing is downloaded.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import TinyTokenizer, hf_model

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import load_draft
from engine.drafters.medusa_checkpoint import read_medusa, read_medusa_state
from engine.kernels import native
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session
from engine.train.data import FEATURE_FILES, HIDDEN_FILES, DataCache, GenSettings, Sample
from engine.train.data_engine import fill_features, generate_data_rows
from engine.train.medusa_head import export_medusa
from engine.train.medusa_train import MedusaSettings, evaluate_heads, gather_positions, last_hidden, train_medusa
from engine.train.pipeline import import_shards
from engine.train.trainer import ResumeError
from tests.test_train_draft import _CharTokenizer

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")
HEADS = 3
VOCAB = 97
HIDDEN = 128


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    """(transformers' model, ours) with the same weights: the cycle target of test_medusa, built
    on transformers' side too (training reads its lm_head, the capture test its forward)."""
    hf, cfg = hf_model("llama", 3, num_hidden_layers=2, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k].zero_()
    sd["model.norm.weight"].fill_(1.0)
    e = torch.nn.functional.rms_norm(sd["model.embed_tokens.weight"], (HIDDEN,))
    order = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))
    succ = torch.empty(VOCAB, dtype=torch.int64)
    succ[order] = order.roll(-1)
    sd["lm_head.weight"] = torch.zeros(VOCAB, HIDDEN).index_add_(0, succ, e)
    hf.load_state_dict(sd)
    hf.eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    return hf, LlamaModel(LlamaConfig.from_dict(cfg), sd)


@pytest.fixture(scope="module")
def data(target, tmp_path_factory) -> tuple[DataCache, list[Sample], list[Sample]]:
    """Greedy answers from the data engine, capturing only what a Medusa head reads; every 8th held out."""
    _, ours = target
    cache = DataCache(tmp_path_factory.mktemp("medusa-data"), VOCAB)
    settings = GenSettings(max_user_tokens=8, max_answer_tokens=48, greedy_fraction=1.0, multi_turn_fraction=0.0,
                           magpie_fraction=0.0)
    rng = np.random.default_rng(0)  # distinct prompts: greedy answers are deduplicated by prompt
    prompts = [[{"role": "user", "content": "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 6))}]
               for _ in range(400)]
    samples = generate_data_rows(ours, _CharTokenizer(), cache, token_budget=3000, settings=settings,
                                 capture_layers=(), prompt_list=prompts, rows=16, row_capacity=128)
    return cache, [s for i, s in enumerate(samples) if i % 8], samples[::8]


def _settings(**changes) -> MedusaSettings:
    base = dict(num_heads=HEADS, head_vocab_size=90, batch_positions=256, lr=3e-3, warmup_steps=5, epochs=100,
                max_steps=120, checkpoint_every=10, eval_every=0, bf16="off", export_dtype="float32")
    return MedusaSettings(**{**base, **changes})


def _train(target, data, out: Path, resume: bool = False, deadline: float | None = None, **changes):
    hf, _ = target
    cache, trains, held = data
    return train_medusa(hf, trains, held, out, _settings(**changes), cache=cache, stop_ids=[2], log=lambda _m: None,
                        progress_bar=False, resume=resume, deadline=deadline)


@pytest.fixture(scope="module")
def trained(target, data, tmp_path_factory):
    return _train(target, data, tmp_path_factory.mktemp("medusa-heads") / "out")


# capture -------------------------------------------------------------------------------------------------
def test_the_capture_stores_only_the_last_hidden_state_and_it_is_the_targets(target, data) -> None:
    hf, _ = target
    cache, trains, _ = data
    assert cache.has_features(trains, HIDDEN_FILES) and not cache.has_features(trains, FEATURE_FILES)
    for s in trains[:4]:
        pos = gather_positions([s], HEADS, cache=cache)
        first, last = s.answer_start - 1, len(s.ids) - 1
        ref = last_hidden(hf, s.ids)[first:last]  # transformers' final-normed hidden state
        torch.testing.assert_close(pos.hidden.float(), ref, rtol=2e-2, atol=2e-2)
        for k in range(HEADS):  # head k's label at p is the token k+2 ahead, -1 past the end
            want = [s.ids[p + k + 2] if p + k + 2 < len(s.ids) else -1 for p in range(first, last)]
            assert pos.labels[:, k].tolist() == want


def test_ids_without_stored_hidden_states_get_them_from_the_target_in_batches(target, data, tmp_path) -> None:
    """Ids imported on a machine whose rows engine does not run (a GPU: ``--import-data``) have no
    ``hidden`` arrays; the target computes them, several conversations a forward, padded at the
    end, and they match the one-at-a-time forward row for row."""
    hf, _ = target
    cache, _, _ = data
    bare = DataCache(tmp_path / "ids-only", VOCAB)
    assert import_shards(cache.folder, bare) == len(cache.shard_indices())
    samples = [s for s in bare.samples() if not s.held_out][:12]
    assert samples and all(s.ref is not None for s in samples) and not bare.has_features(samples, HIDDEN_FILES)
    # answers of several lengths (cut short), so the batches really pad
    samples = [replace(s, ids=s.ids[:len(s.ids) - 3 * i]) for i, s in enumerate(samples)]
    lengths = {len(s.ids) for s in samples}
    assert len(lengths) > 1 and all(s.answer_start < len(s.ids) - 1 for s in samples)
    got = gather_positions(samples, HEADS, cache=bare, hf=hf, batch_tokens=4 * max(lengths))
    want = torch.cat([last_hidden(hf, s.ids)[s.answer_start - 1:len(s.ids) - 1] for s in samples])
    torch.testing.assert_close(got.hidden.float(), want, rtol=1e-2, atol=1e-2)
    stored = gather_positions(samples, HEADS, cache=cache.__class__(cache.folder, VOCAB))
    assert torch.equal(got.labels, stored.labels)
    with pytest.raises(ValueError, match="no target"):
        gather_positions(samples, HEADS, cache=bare)


def test_filling_a_shard_captures_the_same_hidden_states(target, data) -> None:
    """Ids without arrays (another machine's data) get them from one scoring prefill, hidden only."""
    _, ours = target
    cache, _, _ = data
    index = cache.shard_indices()[0]
    before = {k: np.array(v) for k, v in cache.read_arrays(index).items()}
    for name in HIDDEN_FILES:
        (cache.folder / f"{name}-{index:06d}.npy").unlink()
    assert fill_features(ours, cache, capture_layers=(), rows=4, row_capacity=128) == 1
    after = cache.read_arrays(index)
    assert set(after) == set(HIDDEN_FILES)
    keep = np.ones(len(after["hidden"]), bool)  # a conversation's last token never ran while generating
    keep[np.cumsum([len(s.ids) for s in cache.read(index)]) - 1] = False
    for name in HIDDEN_FILES:
        assert np.array_equal(np.asarray(after[name])[keep], before[name][keep]), name
    assert fill_features(ours, cache, capture_layers=(), rows=4, row_capacity=128) == 0


# training ------------------------------------------------------------------------------------------------
def test_trained_heads_beat_the_untrained_ones_and_the_commonest_token(target, data, trained) -> None:
    _, trains, _ = data
    res = trained.eval
    assert res["tau"] > 1.5, res
    answers = Counter(t for s in trains for t in s.ids[s.answer_start:])
    best_guess = answers.most_common(1)[0][1] / sum(answers.values())
    assert min(res["top1"]) > best_guess + 0.15, (res, best_guess)  # not just the commonest token
    fresh = _train(target, data, trained.out_dir.parent / "untrained", max_steps=0)
    assert fresh.eval["tau"] < res["tau"] - 0.3, (fresh.eval, res)


def _inference_tau(target, head: Path, held: list[Sample]) -> float:
    """Greedy Medusa chains with the exported heads through our loader and session: output equal
    to plain decoding, tau (tokens per target forward) returned."""
    _, ours = target
    bundle = load_draft(str(head), ours, TinyTokenizer(VOCAB))  # method inferred from the checkpoint
    assert bundle.method == "medusa"
    config = SpecConfig(method="medusa", eagle_topk=1, num_steps=HEADS, num_draft_tokens=HEADS + 1,
                        max_new_tokens=40, adaptive_draft=False)
    s = Session(ours, TinyTokenizer(VOCAB), config, drafters={"none": NoDrafter, "medusa": bundle.factory},
                features=bundle.features)
    plain = Session(ours, TinyTokenizer(VOCAB), config.replace(method="none"), drafters={"none": NoDrafter})
    produced = steps = 0
    for sample in held[:8]:
        prompt = sample.ids[:sample.answer_start]
        events = list(s.generate_ids(prompt))
        assert [c.id for e in events if e.kind == "step" for c in e.committed] == [
            c.id for e in plain.generate_ids(prompt) if e.kind == "step" for c in e.committed]
        produced += events[-1].stats.tau * events[-1].stats.steps
        steps += events[-1].stats.steps
    return produced / steps


def test_the_export_drafts_through_our_loader_with_tau_clearly_above_one(target, data, trained) -> None:
    assert _inference_tau(target, trained.out_dir, data[2]) > 1.4


def test_both_layouts_round_trip_through_our_loader(target, trained, tmp_path: Path) -> None:
    hf, ours = target
    heads = trained.heads
    lm = hf.get_output_embeddings().weight.detach()
    loaded = {}
    for layout in ("vllm", "medusa"):
        folder = export_medusa(heads, tmp_path / layout, layout, target_lm_head=lm, dtype=torch.float32)
        spec, weights = read_medusa(json.loads((folder / "config.json").read_text()),
                                    read_medusa_state(folder, allow_pickle=False), target=ours.config)
        assert (spec.layout, spec.num_heads, spec.num_layers) == (layout, HEADS, 1)
        torch.testing.assert_close(weights.blocks[:, 0], heads.weight.detach())
        torch.testing.assert_close(weights.biases[:, 0], heads.bias.detach())
        loaded[layout] = weights
    vllm, fd = loaded["vllm"], loaded["medusa"]
    assert vllm.token_map.tolist() == heads.token_map.tolist() and fd.token_map is None
    for k in range(HEADS):
        torch.testing.assert_close(vllm.lm_heads[k], heads.lm_head.detach())
        torch.testing.assert_close(fd.lm_heads[k][heads.token_map], heads.lm_head.detach())
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[heads.token_map] = False
        torch.testing.assert_close(fd.lm_heads[k][outside], lm[outside])
    assert load_draft(str(tmp_path / "medusa"), ours, TinyTokenizer(VOCAB)).method == "medusa"


def test_resume_continues_the_same_run(target, data, tmp_path: Path) -> None:
    """A run stopped by its deadline after one step, resumed, ends where an unbroken run ends."""
    straight = _train(target, data, tmp_path / "straight", max_steps=20)
    first = _train(target, data, tmp_path / "split", max_steps=20, deadline=time.time())
    assert first.steps == 1
    assert json.loads((tmp_path / "split" / "checkpoint" / "progress.json").read_text())["step"] == 1
    with pytest.raises(ResumeError, match="--resume"):
        _train(target, data, tmp_path / "split", max_steps=20)
    resumed = _train(target, data, tmp_path / "split", max_steps=20, resume=True)
    assert resumed.steps == straight.steps == 20
    for a, b in zip(resumed.heads.parameters(), straight.heads.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with pytest.raises(ResumeError, match="different settings"):
        _train(target, data, tmp_path / "split", max_steps=30, num_heads=2, resume=True)


def test_evaluation_counts_a_chain_only_while_it_is_right(trained) -> None:
    """Labels made from the heads' own guesses: a chain is accepted up to its first wrong or
    missing label, and top-1 counts each head alone."""
    from engine.train.medusa_train import Positions

    heads = trained.heads
    hidden = torch.randn(3, heads.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        guess = heads.to_target_ids(heads(hidden).argmax(-1)).T  # [3, K]
    labels = guess.clone()
    labels[1, 0] = (guess[1, 0] + 1) % VOCAB  # head 0 wrong: nothing accepted, heads 1.. still right alone
    labels[2, 1:] = -1  # the answer ends after head 0's token
    res = evaluate_heads(heads, Positions(hidden.to(torch.bfloat16), labels))
    assert res["positions"] == 3
    assert res["tau"] == pytest.approx(1 + (HEADS + 0 + 1) / 3)
    assert res["top1"] == [pytest.approx(2 / 3, abs=1e-4)] + [1.0] * (HEADS - 1)
    assert res["acceptance"] == [pytest.approx(2 / 3, abs=1e-4)] + [1.0] * (HEADS - 1)


def test_cli_refuses_medusa_flags_without_medusa(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specchat.cli import main

    assert main(["train-draft", "--out", str(tmp_path / "o"), "--export-layout", "medusa", "--tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method medusa" in err
    assert main(["train-draft", "--out", str(tmp_path / "o"), "--method", "medusa", "--medusa-heads", "0"]) == 2
    assert "--medusa-heads" in capsys.readouterr().err
