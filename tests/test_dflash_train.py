"""``specchat train-draft --method dflash``: blocks and labels, training, resume, export, the command.

The target is a tiny random Llama of 8 layers (EAGLE-3's capture layers 2, 4 and 5 are distinct),
its greedy answers the data; nothing is downloaded. Labels, acceptance counts and anchors are
checked on hand-made cases; training against the loss it lowers; resume against an unbroken run;
the export against the DFlash loader and its inference forward (the drafter that loads guesses what
the trained one guessed); the command end to end on imported ids, the rows engine filling only the
first ``--tokens`` of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.drafters.dflash.blocks import (
    acceptance_counts,
    accepted_runs,
    eligible_anchors,
    greedy_labels,
    position_weights,
    resolve_gamma,
    sample_anchors,
)
from engine.drafters.dflash.model import weight_shapes
from engine.drafters.dflash.train import (
    DFlashSettings,
    block_hidden,
    capture_layers,
    conversation_blocks,
    draft_index,
    measure_blocks,
    new_drafter,
    packed_hidden,
    packs,
    pick_mask_token,
    train_drafter,
    used_ids,
)
from engine.train.data import DataCache, Sample, generate_batch
from engine.train.targets import LiveTarget
from engine.train.trainer import ResumeError
from tests.test_train_draft import VOCAB, _tiny_target

STOP = 2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return _tiny_target()


@pytest.fixture(scope="module")
def data(target) -> tuple[list[Sample], list[Sample]]:
    """Greedy answers of the target to random prompts; every 8th held out."""
    hf, _ = target
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (6,), generator=g).tolist() for _ in range(64)]
    res = generate_batch(hf, prompts, max_new_tokens=32, temperatures=[0.0] * len(prompts),
                         stop_ids=frozenset({STOP}), generator=g)
    samples = [Sample(p + ids, len(p), True) for p, (ids, _) in zip(prompts, res, strict=True)]
    return [s for i, s in enumerate(samples) if i % 8], samples[::8]


def _settings(**changes) -> DFlashSettings:
    base = dict(block_size=4, draft_vocab_size=48, anchors=12, batch_tokens=256, lr=3e-3, warmup_steps=3,
                epochs=100, max_steps=24, checkpoint_every=4, eval_every=0, bf16="off", export_dtype="float32")
    return DFlashSettings(**{**base, **changes})


def _train(target, data, out: Path, **kw):
    hf, _ = target
    trains, held = data
    settings = _settings(**{k: kw.pop(k) for k in list(kw) if hasattr(DFlashSettings, k)})
    return train_drafter(hf, trains, held, out, settings, verifier="tiny", stop_ids=[STOP], log=lambda _m: None,
                         progress_bar=False, **kw)


@pytest.fixture(scope="module")
def trained(target, data, tmp_path_factory):
    return _train(target, data, tmp_path_factory.mktemp("dflash-trained") / "out", max_steps=40)


# blocks and labels ---------------------------------------------------------------------------------------
def test_labels_follow_the_greedy_path_from_the_anchor_and_stop_at_the_end() -> None:
    # argmax[p]: the target's token after p; ids follow it except at position 5 (a sampled token)
    ids = torch.tensor([9, 9, 10, 11, 12, 30, 14, 15, 16])
    argmax = torch.tensor([-1, 10, 11, 12, 13, 14, 15, 16, -1])  # 13 after 4, but 30 was written
    labels, valid = greedy_labels(ids, argmax, torch.tensor([2, 5, 7]), 4)
    # anchor 2: labels after 2, 3, 4 = 11, 12, 13 (ids[3], ids[4] follow; the label at 4 is still the argmax)
    assert labels[0].tolist() == [11, 12, 13] and valid[0].tolist() == [True, True, True]
    # anchor 5: the argmax after 5 is 14, ids[6] = 14 follows; 15 after 6 -> then 16 after 7
    assert labels[1].tolist() == [14, 15, 16] and valid[1].all()
    # anchor 7: one label (after 7), then the conversation ends
    assert labels[2].tolist() == [16, -1, -1] and valid[2].tolist() == [True, False, False]
    # an anchor before the sampled token: its labels stop after the deviation
    labels, valid = greedy_labels(ids, argmax, torch.tensor([3]), 4)
    assert labels.tolist() == [[12, 13, -1]] and valid.tolist() == [[True, True, False]]


def test_anchors_are_answer_tokens_with_a_label_and_draws_are_seeded() -> None:
    argmax = torch.tensor([-1, -1, -1, 5, 6, 7, 8, -1])
    assert eligible_anchors(3, argmax).tolist() == [3, 4, 5, 6]
    eligible = torch.arange(10, 40)
    a = sample_anchors(eligible, 8, torch.Generator().manual_seed(1))
    b = sample_anchors(eligible, 8, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.numel() == 8 and bool((a[1:] > a[:-1]).all())
    assert torch.equal(sample_anchors(eligible[:5], 8, torch.Generator()), eligible[:5])


def test_runs_and_acceptance_count_only_leading_right_guesses() -> None:
    correct = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]]).bool()
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]]).bool()
    runs = accepted_runs(correct, valid)
    assert runs.tolist() == [2, 1, 0, 2]
    hits, tries, reached = acceptance_counts(runs, valid).tolist()
    assert hits == [3, 2, 0] and tries == [4, 4, 3] and reached == [4, 3, 1]


def test_position_weights_decay_and_default_gamma() -> None:
    w = position_weights(8, 4.0)
    assert w[0] == 1 and torch.allclose(w[1:] / w[:-1], torch.full((6,), float(torch.exp(torch.tensor(-0.25)))))
    assert torch.equal(position_weights(5, 0.0), torch.ones(4))
    assert resolve_gamma(None, 8) == 4 and resolve_gamma(None, 16) == 8 and resolve_gamma(2.5, 8) == 2.5


# the drafter ---------------------------------------------------------------------------------------------
def test_a_new_drafter_reads_eagle3s_layers_and_starts_from_the_targets_rows(target, data) -> None:
    hf, cfg = target
    trains, _ = data
    draft = new_drafter(hf, trains, _settings(), [STOP])
    spec = draft.spec
    assert spec.capture_layers == capture_layers(8) == (2, 4, 5)  # the data engine's EAGLE-3 features
    assert spec.hidden_size == cfg["hidden_size"] and spec.rope_theta == cfg["rope_theta"]
    used = used_ids(draft)
    assert STOP in used.tolist() and used.numel() == 48 and bool((used[1:] > used[:-1]).all())
    torch.testing.assert_close(draft.lm_head.weight, hf.lm_head.weight[used])
    assert not draft.lm_head.weight.requires_grad  # frozen: the target's rows
    assert draft_index(draft)[used].tolist() == list(range(48))
    seen = torch.bincount(torch.tensor([t for s in trains for t in s.ids]), minlength=VOCAB)
    others = [t for t in range(VOCAB) if t != STOP]
    assert spec.mask_token_id != STOP and seen[spec.mask_token_id] == seen[others].min()  # the rarest token
    assert pick_mask_token([Sample([0, 1, 3], 1, True)], 5, [2]) == 4  # 2 never, though unseen


def _loss(draft, source, embed, samples, block_size: int) -> float:
    """The weighted cross entropy over every block of ``samples`` (the training loss, all anchors)."""
    index, w = draft_index(draft), position_weights(block_size, block_size / 2)
    total, weight = 0.0, 0.0
    with torch.no_grad():
        for s in samples:
            b = conversation_blocks(s, source, draft.spec, lambda a: a)
            if b is None:
                continue
            target = torch.where(b.valid, index[b.labels.clamp(min=0)], -1)
            logits = draft.lm_head(block_hidden(draft, embed, b))
            keep = target >= 0
            ce = F.cross_entropy(logits[keep], target[keep], reduction="none")
            total += float((ce * w.expand_as(keep)[keep]).sum())
            weight += float(w.expand_as(keep)[keep].sum())
    return total / weight


def test_the_batched_target_gives_each_conversation_its_own_forwards_features(target, data) -> None:
    """A GPU step's target: one right-padded forward over conversations of different lengths gives
    each the features and argmax of a forward over it alone (only the products' shapes differ)."""
    hf, _ = target
    trains, _ = data
    source = LiveTarget(hf)
    batch = [trains[0], Sample(trains[1].ids[:20], trains[1].answer_start, True), trains[2]]
    assert len({len(s.ids) for s in batch}) == 2  # padding is exercised
    layers = capture_layers(8)
    for s, (features, argmax) in zip(batch, source.sequences(batch, layers), strict=True):
        alone, top = source.sequence(s, layers)
        assert features.shape == alone.shape == (len(s.ids), 3 * hf.config.hidden_size)
        torch.testing.assert_close(features, alone, atol=1e-5, rtol=1e-5)
        assert torch.equal(argmax, top)


def test_packs_group_consecutive_conversations_up_to_the_row_budget() -> None:
    assert packs([3, 4, 10, 2, 2], 8) == [range(0, 2), range(2, 3), range(3, 5)]
    assert packs([3, 4], 0) == [range(0, 1), range(1, 2)] and packs([], 8) == []


def test_packed_blocks_are_each_conversations_own_forward(target, data) -> None:
    """Several conversations' blocks in one forward (each at its own positions, seeing only its own
    rows) give what a forward per conversation gives; a packed run trains the same drafter."""
    hf, _ = target
    trains, _ = data
    draft, source = new_drafter(hf, trains, _settings(), [STOP]), LiveTarget(hf)
    embed = hf.get_input_embeddings().weight
    parts = [conversation_blocks(s, source, draft.spec, lambda a: a[::3]) for s in trains[:4]]
    with torch.no_grad():
        packed = packed_hidden(draft, embed, [(b, b.anchors) for b in parts])
        alone = torch.cat([block_hidden(draft, embed, b) for b in parts])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_a_packed_run_trains_the_drafter_a_forward_per_conversation_does(target, data, tmp_path: Path) -> None:
    one = _train(target, data, tmp_path / "one", max_steps=6)
    packed = _train(target, data, tmp_path / "packed", max_steps=6, pack_rows=10_000)
    for (k, a), b in zip(packed.draft.state_dict().items(), one.draft.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=k)


def test_training_lowers_the_loss_and_raises_held_out_acceptance(target, data, trained) -> None:
    hf, _ = target
    trains, held = data
    fresh = new_drafter(hf, trains, _settings(), [STOP])
    source, embed = LiveTarget(hf), hf.get_input_embeddings().weight
    before, after = _loss(fresh, source, embed, trains[:12], 4), _loss(trained.draft, source, embed, trains[:12], 4)
    assert after < 0.8 * before
    start, end = measure_blocks(fresh, source, embed, held), trained.eval
    assert end["tau"] > start["tau"] and end["acceptance"][0] > start["acceptance"][0]
    assert end["blocks"] == start["blocks"] > 0 and len(end["acceptance"]) == 3
    # cumulative acceptance never rises with the position; tau is 1 + the accepted guesses
    assert end["acceptance"] == sorted(end["acceptance"], reverse=True)
    assert end["tau"] >= 1 + end["acceptance"][0]


def test_resume_continues_in_the_same_order_and_ends_with_the_same_weights(target, data, tmp_path: Path) -> None:
    straight = _train(target, data, tmp_path / "straight", max_steps=10)
    first = _train(target, data, tmp_path / "split", max_steps=10, deadline=time.time())
    assert first.steps == 1
    assert json.loads((tmp_path / "split" / "checkpoint" / "progress.json").read_text())["step"] == 1
    with pytest.raises(ResumeError, match="already holds"):
        _train(target, data, tmp_path / "split", max_steps=10)
    resumed = _train(target, data, tmp_path / "split", max_steps=10, resume=True)
    assert resumed.steps == straight.steps == 10
    for (k, a), b in zip(resumed.draft.state_dict().items(), straight.draft.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=k)
    with pytest.raises(ResumeError, match="different settings"):
        _train(target, data, tmp_path / "split", max_steps=10, block_size=5, resume=True)


# the export ----------------------------------------------------------------------------------------------
def test_the_export_is_the_speculators_layout_the_loader_reads(trained, target, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from engine.drafters.dflash.checkpoint import read_dflash
    from engine.models.llama import LlamaConfig

    _, cfg = target
    out = trained.out_dir
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    spec = trained.draft.spec
    assert config["speculators_model_type"] == "dflash" and config["architectures"] == ["DFlashSpeculator"]
    assert config["aux_hidden_state_layer_ids"] == [2, 4, 5] and config["draft_vocab_size"] == 48
    assert config["block_size"] == 4 and config["mask_token_id"] == spec.mask_token_id
    shapes = weight_shapes(spec)
    assert {k: tuple(v.shape) for k, v in tensors.items() if k != "t2d"} == shapes
    assert tensors["t2d"].sum() == 48 and tensors["t2d"][used_ids(trained.draft)].all()
    card = config["specchat_training"]
    assert card["steps"] == 40 and card["eval"]["acceptance"] == trained.eval["acceptance"]
    read, weights = read_dflash(config, tensors, LlamaConfig.from_dict(cfg), str(out))
    assert read.capture_layers == spec.capture_layers and read.draft_vocab_size == 48 and read.block_size == 4
    assert read.layout == "speculators" and read.mask_token_id == spec.mask_token_id
    trained_sd = trained.draft.state_dict()
    assert all(torch.equal(weights[k], trained_sd[k]) for k in shapes)  # float32: the trained weights exactly


def test_the_loaded_drafter_guesses_what_the_trained_one_did_and_greedy_stays_the_baselines(
        trained, target, data) -> None:
    from tiny import TinyTokenizer

    from engine.config import SpecConfig
    from engine.drafters.base import NoDrafter
    from engine.drafters.draft_loader import load_draft
    from engine.events import Step
    from engine.models.llama import LlamaConfig, LlamaModel
    from engine.session import Session

    hf, cfg = target
    _, held = data
    model = LlamaModel(LlamaConfig.from_dict(cfg), {k: v.detach().clone() for k, v in hf.state_dict().items()})
    bundle = load_draft(str(trained.out_dir), model, TinyTokenizer(VOCAB))
    assert bundle.method == "dflash" and bundle.features.capture_layers == (2, 4, 5)
    runner = bundle.factory().runner
    draft, source = trained.draft, LiveTarget(hf)
    for s in held[:3]:
        b = conversation_blocks(s, source, draft.spec, lambda a: a[:4])
        assert b is not None
        want = used_ids(draft)[draft.lm_head(block_hidden(draft, hf.get_input_embeddings().weight, b)).argmax(-1)]
        for row, a in enumerate(b.anchors.tolist()):
            hidden = runner.forward(b.features[:a].float(), runner.new_cache(64), s.ids[a])
            got = runner.to_target(runner.log_probs(hidden[1:]).argmax(-1))
            assert got.tolist() == want[row].tolist()

    def tokens(session: Session) -> list[int]:
        return [c.id for e in session.generate_ids(held[0].ids[:held[0].answer_start]) if isinstance(e, Step)
                for c in e.committed]

    config = SpecConfig(method="dflash", max_new_tokens=24)
    spec = Session(model, TinyTokenizer(VOCAB), config, drafters={"none": NoDrafter, "dflash": bundle.factory},
                   features=bundle.features)
    base = Session(model, TinyTokenizer(VOCAB), config.replace(method="none"), drafters={"none": NoDrafter})
    assert tokens(spec) == tokens(base)


# the command ---------------------------------------------------------------------------------------------
def test_train_draft_dflash_end_to_end_fills_only_the_features_it_trains_on(tmp_path: Path, monkeypatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Imported ids: the rows engine stores features for the first --tokens only, training reads
    them (never the rest), and the export loads for the target as --method dflash --draft OUT."""
    from heads import write_tiny_model

    from engine.kernels import native
    from specchat.cli import main

    if native.load() is None:
        pytest.skip(f"no native kernel: {native.why_not}")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = write_tiny_model(tmp_path / "model", layers=8, vocab=300)
    ids = DataCache(tmp_path / "ids", 300)
    g = torch.Generator().manual_seed(0)
    for shard in range(4):
        ids.write(shard, [Sample(torch.randint(3, 300, (40,), generator=g).tolist(), 8, True) for _ in range(10)],
                  conversations=range(shard * 10, shard * 10 + 10))
    out = tmp_path / "drafter"
    argv = ["train-draft", str(model), "--method", "dflash", "--out", str(out), "--import-data", str(ids.folder),
            "--tokens", "600", "--block-size", "4", "--draft-vocab-size", "120", "--anchors", "8", "--max-steps", "4",
            "--batch-tokens", "128", "--eval-every", "2", "--checkpoint-every", "2", "--threads", "1",
            "--bf16", "off", "--rows", "4"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "the stored target features" in text and "--method dflash --draft" in text
    cache = DataCache(next((tmp_path / "cache" / "train-data").iterdir()), 300)
    filled = [i for i in cache.shard_indices() if cache.has_features(cache.read(i))]
    need, have = [], 0  # the first shards whose training answers hold the 600 tokens
    for i in cache.shard_indices():
        if have < 600:
            need.append(i)
            have += sum(len(s.ids) - s.answer_start for s in cache.read(i) if not s.held_out)
    assert filled == need and len(need) < 4
    card = json.loads((out / "config.json").read_text())["specchat_training"]
    trained_on = sum(len(s.ids) - s.answer_start for i in need for s in cache.read(i) if not s.held_out)
    assert card["method"] == "dflash" and 600 <= card["data"]["answer_tokens"] <= trained_on and card["steps"] == 4
    assert card["settings"]["block_size"] == 4 and "EAGLE-3's capture layers" in card["target_features"]
    from engine.drafters.draft_loader import load_draft
    from engine.loader import load_model

    bundle = load_draft(str(out), load_model(str(model), threads=1).model, None)
    assert bundle.method == "dflash" and bundle.features.capture_layers == (2, 4, 5)
    # the same command again continues only with --resume
    assert main(argv) == 2
    assert "--resume" in capsys.readouterr().err
