"""The rows data engine: many conversations per forward, features stored, training from them.

The promises: a token in a rows forward gets exactly the logits, hidden state and captured
features of a one-sequence forward (prefill chunks and decoding rows mixed, sliding windows
included); a request's output is the one-row path's output, whatever else shares the batch
(greedy and sampled); the stored features are the target's, so training on them equals
training on features computed live (up to bf16 storage); generation resumes and deduplicates.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.kernels import native
from engine.models.kv_cache import KVCache
from engine.models.llama import LlamaConfig, LlamaModel
from engine.train.data import HIDDEN_FILES, DataCache, GenSettings, _generate_native, answer_tokens, draw, iter_batches
from engine.train.data_engine import generate_data_rows
from engine.train.eagle3_head import default_aux_layer_ids
from engine.train.rows import Request, RowEngine
from engine.train.targets import LiveTarget, StoredTarget
from engine.train.trainer import TrainSettings, batch_loss, build_head
from tests.test_train_draft import VOCAB, _CharTokenizer, _tiny_target
from tests.tiny import our_model

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("family", ["llama", "mistral", "smollm2_tied"])
def test_rows_forward_equals_one_sequence_forwards(family: str) -> None:
    """Four sequences (one longer than mistral's window of 24) prefilled in one rows call, then
    one decoding token each in a second call."""
    model, _ = our_model(family, num_hidden_layers=3, hidden_size=64, head_dim=16)
    c = model.config
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 97, (n,), generator=gen) for n in (5, 30, 1, 17)]
    nxt = torch.randint(0, 97, (len(seqs),), generator=gen)
    cap = 40
    big = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, cap * len(seqs))
    seg = torch.cat([torch.full((len(s),), r * cap) for r, s in enumerate(seqs)])
    slots = torch.cat([torch.arange(len(s)) + r * cap for r, s in enumerate(seqs)])
    toks = torch.cat(seqs)
    pre = model.forward_rows(toks, big, seg, slots, logits_at=torch.arange(len(toks)), capture_layers=(1,))
    base = torch.arange(len(seqs)) * cap
    step = model.forward_rows(nxt, big, base, base + torch.tensor([len(s) for s in seqs]),
                              logits_at=torch.arange(len(seqs)), capture_layers=(1,))
    at = 0
    for r, s in enumerate(seqs):
        cache = model.new_cache(64)
        ref = model.forward(s, cache, capture_layers=(1,), return_hidden=True)
        cache.commit(len(s))
        ref_step = model.forward(nxt[r:r + 1], cache, capture_layers=(1,))
        n = len(s)
        assert torch.equal(pre.logits[at:at + n], ref.logits)
        assert torch.equal(pre.hidden[at:at + n], ref.hidden)
        assert torch.equal(pre.aux[0][at:at + n], ref.aux[0])
        assert torch.equal(step.logits[r], ref_step.logits[0])
        assert torch.equal(step.aux[0][r], ref_step.aux[0][0])
        at += n


def test_row_engine_requests_match_the_one_row_path() -> None:
    """Greedy and sampled requests, more of them than rows, prompts in several prefill chunks:
    each equals the one-row generator with the request's seed, and its stored features, hidden
    states and argmax equal a one-sequence forward over the finished conversation."""
    model, _ = our_model("llama", num_hidden_layers=3, hidden_size=64, head_dim=16)
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 20, 0.0), (40, 7, 1.0), (1, 30, 0.7), (17, 12, 0.0), (9, 25, 1.0), (3, 3, 0.0)]
    reqs = [Request(torch.randint(3, 97, (n,), generator=gen).tolist(), m, t, seed=i, capture=True)
            for i, (n, m, t) in enumerate(shapes)]
    done = {}
    engine = RowEngine(model, rows=3, row_capacity=64, stop_ids=[2], capture_layers=(1, 3), prefill_tokens=16)
    for r in reqs:
        r.on_done = lambda f: done.__setitem__(f.request.seed, f)
        engine.submit(r)
    engine.run()
    assert engine.forwards < sum(len(r.prompt) + r.max_new_tokens for r in reqs) / 2  # rows shared forwards
    for r in reqs:
        ref, stopped = _generate_native(model, r.prompt, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                                        stop_ids=frozenset({2}), generator=torch.Generator().manual_seed(r.seed))
        f = done[r.seed]
        assert (f.new_ids, f.stopped) == (ref, stopped)
        n = len(f.ids) - 1  # the last token was sampled, never run
        out = model.forward(torch.tensor(f.ids[:-1]), model.new_cache(80), capture_layers=(1, 3), return_hidden=True)
        assert torch.equal(f.hidden[:n], out.hidden.to(torch.bfloat16))
        assert torch.equal(f.features[:n], torch.cat(out.aux, -1).to(torch.bfloat16))
        first = len(r.prompt) - 1
        assert torch.equal(f.argmax[first:n].long(), out.logits.argmax(-1)[first:])
        assert (f.argmax[:first] == -1).all()


def test_row_engine_refuses_a_request_that_does_not_fit() -> None:
    model, _ = our_model("llama", num_hidden_layers=2, hidden_size=64, head_dim=16)
    engine = RowEngine(model, rows=2, row_capacity=16, stop_ids=[2])
    with pytest.raises(ValueError, match="does not fit"):
        engine.submit(Request(list(range(3, 13)), 10, 0.0, seed=0))


def test_draw_follows_the_distribution() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    counts = np.bincount([draw(logits, 1.0, gen) for _ in range(4000)], minlength=4) / 4000
    assert np.allclose(counts, torch.softmax(logits, 0).numpy(), atol=0.03)


@pytest.fixture(scope="module")
def engine_target():
    hf, cfg = _tiny_target()
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return hf, LlamaModel(LlamaConfig.from_dict(cfg), sd)


def _generate(engine_target, folder: Path, budget: int):
    _, model = engine_target
    settings = GenSettings(max_user_tokens=8, max_answer_tokens=12, multi_turn_fraction=0.5)
    prompts = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]]
    cache = DataCache(folder, VOCAB)
    samples = generate_data_rows(model, _CharTokenizer(), cache, token_budget=budget, settings=settings,
                                 capture_layers=[i + 1 for i in default_aux_layer_ids(8)], prompt_list=prompts, rows=4,
                                 row_capacity=64, shard_samples=5)
    return samples, cache


def test_rows_data_generates_dedups_resumes_and_stores_features(engine_target, tmp_path: Path) -> None:
    samples, cache = _generate(engine_target, tmp_path / "d", 40)
    assert sum(len(s.ids) - s.answer_start for s in samples) >= 40
    assert len({tuple(s.ids) for s in samples}) == len(samples)
    assert all(s.ids[s.answer_start - 1] == 4 for s in samples)
    assert cache.has_features(samples)
    shards = cache.shard_indices()
    arrays = cache.read_arrays(shards[0])
    hidden = engine_target[1].config.hidden_size
    assert arrays["features"].shape[1] == 3 * hidden and arrays["hidden"].shape[1] == hidden
    assert arrays["features"].shape[0] == sum(len(s.ids) for s in cache.read(shards[0]))
    again, _ = _generate(engine_target, tmp_path / "d", 40)  # nothing more to do
    assert again == samples and cache.shard_indices() == shards
    more, _ = _generate(engine_target, tmp_path / "d", 80)  # resumes after the last conversation
    assert more[:len(samples)] == samples and len(more) > len(samples)
    assert len({tuple(s.ids) for s in more}) == len(more)


def test_stored_features_equal_the_live_target(engine_target, tmp_path: Path) -> None:
    """What training reads from the shards is what transformers' target computes (bf16 apart),
    and one training step's loss agrees."""
    hf, _ = engine_target
    samples, cache = _generate(engine_target, tmp_path / "d", 60)
    head = build_head(hf, samples, TrainSettings(draft_vocab_size=32), stop_ids=[2])
    batch = next(iter(iter_batches(samples, 256, random.Random(0))))
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(s.ids) for s in batch], batch_first=True)
    live = LiveTarget(hf).batch(head, batch, ids)
    stored = StoredTarget(cache, hf).batch(head, batch, ids)
    lengths = [len(s.ids) for s in batch]
    for r, n in enumerate(lengths):
        m = n - 1  # the stored rows stop before each conversation's last token
        torch.testing.assert_close(stored[0][r, :n], live[0][r, :n])
        torch.testing.assert_close(stored[1][r, :m].float(), live[1][r, :m].float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(stored[2][r, :m], live[2][r, :m], rtol=5e-2, atol=1e-2)
        start = batch[r].answer_start - 1
        assert torch.equal(stored[3][r, start:m], live[3][r, start:m])
    loss_live = batch_loss(head, LiveTarget(hf), batch, 2, 0.8)[0].detach()
    loss_stored = batch_loss(head, StoredTarget(cache, hf), batch, 2, 0.8)[0].detach()
    assert abs(float(loss_live) - float(loss_stored)) < 0.02 * float(loss_live)


def test_cli_refuses_an_unwritable_out_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specchat.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train-draft", "--out", str(blocker / "sub"), "--tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write to --out" in err
    assert main(["train-draft", "--tokens", "10"]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_features_are_filled_for_shards_that_lack_them(engine_target, tmp_path: Path) -> None:
    """Ids carried without their features (another machine, the one-row path) get them from one
    scoring prefill per conversation: the same arrays the generating run stored."""
    from engine.train.data_engine import fill_features

    samples, cache = _generate(engine_target, tmp_path / "d", 40)
    shards = cache.shard_indices()
    before = {i: {k: np.array(v) for k, v in cache.read_arrays(i).items()} for i in shards}
    for i in shards:
        for name in ("features", "hidden", "argmax"):
            (cache.folder / f"{name}-{i:06d}.npy").unlink()
    assert not cache.has_features(samples)
    capture = [i + 1 for i in default_aux_layer_ids(8)]
    assert fill_features(engine_target[1], cache, capture_layers=capture, rows=3, row_capacity=64) == len(shards)
    assert cache.has_features(cache.samples())
    for i in shards:
        after = cache.read_arrays(i)
        ends = np.cumsum([len(s.ids) for s in cache.read(i)]) - 1  # each conversation's last token:
        keep = np.ones(len(after["argmax"]), bool)                  # the generating run never ran it
        keep[ends] = False
        for name in ("features", "hidden", "argmax"):
            assert np.array_equal(np.asarray(after[name])[keep], before[i][name][keep]), name
    assert fill_features(engine_target[1], cache, capture_layers=capture, rows=3, row_capacity=64) == 0


def test_features_are_filled_only_as_far_as_the_training_budget(engine_target, tmp_path: Path) -> None:
    """A run that trains on its first ``train_tokens`` (Medusa's --tokens) fills the shards that
    hold them, in the cache's order, and no later ones; a larger budget fills the rest."""
    from engine.train.data_engine import fill_features

    _, cache = _generate(engine_target, tmp_path / "d", 40)
    shards = cache.shard_indices()
    assert len(shards) >= 2
    for i in shards:
        for name in HIDDEN_FILES:
            (cache.folder / f"{name}-{i:06d}.npy").unlink()
    first = cache.read(shards[0])
    budget = answer_tokens([s for s in first if not s.held_out])
    assert fill_features(engine_target[1], cache, capture_layers=(), rows=3, row_capacity=64,
                         train_tokens=budget) == 1
    assert cache.has_features(first, HIDDEN_FILES)
    assert not cache.has_features(cache.read(shards[1]), HIDDEN_FILES)
    assert fill_features(engine_target[1], cache, capture_layers=(), rows=3, row_capacity=64,
                         train_tokens=budget + 1) == 1
    assert cache.has_features(cache.read(shards[1]), HIDDEN_FILES)


def test_a_rows_step_of_prompt_chunks_only_wants_no_logits() -> None:
    """A step where every row is still reading its prompt asks for no logits (an empty LM-head
    call crashed the exact kernel once: it has no zero-row tile)."""
    model, _ = our_model("llama", num_hidden_layers=2, hidden_size=64, head_dim=16)
    c = model.config
    cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, 32)
    out = model.forward_rows(torch.tensor([5, 6, 7]), cache, torch.zeros(3, dtype=torch.long), torch.arange(3),
                             logits_at=torch.zeros(0, dtype=torch.long))
    assert out.logits.shape == (0, c.vocab_size) and out.hidden.shape == (3, c.hidden_size)
    lin = model.lm_head
    assert lin(torch.zeros(0, c.hidden_size)).shape == (0, c.vocab_size)
