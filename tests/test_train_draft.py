"""specchat train-draft: features, vocabulary maps, TTT training, export layout, resume, data cache.

Every target here is a tiny random Llama built in the test (8 layers, so the default EAGLE-3
layers 2/4/5 are distinct); nothing is downloaded.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.errors import UserError
from engine.models.llama import LlamaConfig, LlamaModel
from engine.train import load_exported, train_head
from engine.train.data import DataCache, GenSettings, Sample, generate_batch, generate_data
from engine.train.eagle3_head import (
    EXPORT_KEYS,
    Eagle3Head,
    HeadConfig,
    default_aux_layer_ids,
    draft_vocab,
    refit_vocabulary,
    vocab_maps,
)
from engine.train.targets import target_features
from engine.train.trainer import ResumeError
from tests.tiny import family_config, hf_model

VOCAB = 64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these tensors are tiny, and on a shared 2-core machine a second thread
    only adds OpenMP barrier waits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_target(std: float = 0.1, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = family_config("llama")
    cfg.update(num_hidden_layers=8, vocab_size=VOCAB)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
            p.requires_grad_(False)
    return hf, cfg


@pytest.fixture(scope="module")
def target():
    return _tiny_target()


@pytest.fixture(scope="module")
def greedy_data(target):
    """Greedy continuations of random prompts: the target's own answers."""
    hf, _ = target
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (6,), generator=g).tolist() for _ in range(120)]
    res = generate_batch(hf, prompts, max_new_tokens=40, temperatures=[0.0] * len(prompts),
                         stop_ids=frozenset({2}), generator=g)
    return [(p + ids, len(p)) for p, (ids, _) in zip(prompts, res, strict=True)]


def test_features_equal_our_forward_capture(target) -> None:
    hf, cfg = target
    ours = LlamaModel(LlamaConfig.from_dict(cfg), {k: v.clone() for k, v in hf.state_dict().items()})
    ids = default_aux_layer_ids(8)
    tokens = torch.randint(0, VOCAB, (25,), generator=torch.Generator().manual_seed(3))
    out = ours.forward(tokens, ours.new_cache(32), capture_layers=[i + 1 for i in ids], return_hidden=True)
    embeds, feats, hidden = target_features(hf, tokens[None], ids)
    torch.testing.assert_close(feats[0], torch.cat(out.aux, dim=-1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hidden[0], out.hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(embeds[0], ours.embed_tokens(tokens))


def test_default_layers_follow_eagle3() -> None:
    assert default_aux_layer_ids(30) == [1, 14, 26]  # inputs of layers 2, 15, 27 (SmolLM2-135M)
    assert default_aux_layer_ids(32) == [1, 15, 28]  # Llama-3.1-8B: inputs of 2, 16, 29
    with pytest.raises(ValueError, match="at least 5 layers"):
        default_aux_layer_ids(4)


def test_draft_vocab_and_maps() -> None:
    counts = torch.zeros(20, dtype=torch.int64)
    counts[[3, 7, 9, 15, 16]] = torch.tensor([50, 10, 10, 40, 1])
    used = draft_vocab(counts, 4, keep={2})
    assert used.tolist() == [2, 3, 7, 15]  # stop token kept, ties (7 vs 9) to the lower id, ascending
    d2t, t2d = vocab_maps(used, 20)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(4) + d2t).tolist() == used.tolist()
    assert bool((d2t[1:] >= d2t[:-1]).all()) and int(d2t.min()) >= 0
    assert t2d.nonzero().flatten().tolist() == used.tolist()
    with pytest.raises(ValueError):
        vocab_maps(torch.tensor([5, 3]), 20)


def test_tiny_head_learns_the_target(target, greedy_data, tmp_path: Path) -> None:
    """A few hundred steps on CPU: the held-out chain tau is clearly above a guess."""
    hf, _ = target
    res = train_head(hf, None, greedy_data, tmp_path / "head", steps=300)
    answers = Counter(t for ids, start in greedy_data for t in ids[start:])
    best_guess = answers.most_common(1)[0][1] / sum(answers.values())  # always drafting the commonest token
    assert res.eval["tau"] > 1.8, res.eval
    assert res.eval["step_acceptance"][0] > 2 * best_guess, (res.eval, best_guess)
    # the exported head, loaded by the inference side, speculates on the same target: features,
    # token pairing and d2t are wired alike in training and inference
    _check_inference_tau(hf, tmp_path / "head", greedy_data)


def _check_inference_tau(hf, head_dir: Path, data) -> None:
    from tiny import TinyTokenizer

    from engine.config import SpecConfig
    from engine.drafters.base import NoDrafter
    from engine.drafters.draft_loader import load_draft
    from engine.models.llama import LlamaConfig, LlamaModel
    from engine.session import Session

    model = LlamaModel(LlamaConfig.from_dict(hf.config.to_dict()),
                       {k: v.detach().clone() for k, v in hf.state_dict().items()})
    bundle = load_draft(str(head_dir), model, TinyTokenizer(VOCAB))
    config = SpecConfig(method="eagle3", eagle_topk=1, num_steps=4, num_draft_tokens=5, max_new_tokens=40,
                        adaptive_draft=False)
    s = Session(model, TinyTokenizer(VOCAB), config, drafters={"none": NoDrafter, "eagle3": bundle.factory},
                features=bundle.features)
    plain = Session(model, TinyTokenizer(VOCAB), config.replace(method="none"), drafters={"none": NoDrafter})
    produced = steps = 0
    for ids, start in data[-10:]:
        events = list(s.generate_ids(ids[:start]))
        assert [c.id for e in events if e.kind == "step" for c in e.committed] == [
            c.id for e in plain.generate_ids(ids[:start]) if e.kind == "step" for c in e.committed]
        produced += events[-1].stats.tau * events[-1].stats.steps
        steps += events[-1].stats.steps
    assert produced / steps > 1.5


def test_export_layout_round_trips(target, greedy_data, tmp_path: Path) -> None:
    hf, _ = target
    out = tmp_path / "head"
    res = train_head(hf, None, greedy_data, out, steps=3, draft_vocab_size=40, export_dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    for key, value in {"model_type": "llama", "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": 40,
                       "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                       "intermediate_size": 64, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                       "rope_theta": 10000.0}.items():
        assert config[key] == value, key
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    sd = load_file(str(out / "model.safetensors"))
    assert set(sd) == set(EXPORT_KEYS)
    H, V, Vd = 32, VOCAB, 40
    shapes = {"fc.weight": (H, 3 * H), "midlayer.self_attn.q_proj.weight": (32, 2 * H),
              "midlayer.self_attn.k_proj.weight": (16, 2 * H), "midlayer.self_attn.v_proj.weight": (16, 2 * H),
              "midlayer.self_attn.o_proj.weight": (H, 32), "midlayer.mlp.gate_proj.weight": (64, H),
              "midlayer.mlp.down_proj.weight": (H, 64), "norm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
              "lm_head.weight": (Vd, H), "d2t": (Vd,), "t2d": (V,)}
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert all(sd[k].dtype == torch.bfloat16 for k in EXPORT_KEYS if k not in ("d2t", "t2d"))
    assert int(sd["t2d"].sum()) == Vd and 2 in (torch.arange(Vd) + sd["d2t"]).tolist()  # eos kept
    back = load_exported(out)
    for k, v in res.head.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point()
                                   else v)


def test_resume_continues_where_it_stopped(target, greedy_data, tmp_path: Path) -> None:
    hf, _ = target
    straight = train_head(hf, None, greedy_data, tmp_path / "a", steps=12, checkpoint_every=1)
    # a run that stops after its first step (deadline passed), then a resumed one
    first = train_head(hf, None, greedy_data, tmp_path / "b", steps=12, checkpoint_every=1, deadline=time.time())
    assert first.steps == 1
    progress = json.loads((tmp_path / "b" / "checkpoint" / "progress.json").read_text())
    assert progress["step"] == 1
    resumed = train_head(hf, None, greedy_data, tmp_path / "b", steps=12, checkpoint_every=1, resume=True)
    assert resumed.steps == 12
    for k, v in straight.head.state_dict().items():
        torch.testing.assert_close(resumed.head.state_dict()[k], v, atol=1e-6, rtol=1e-5)
    with pytest.raises(ResumeError, match="already holds"):
        train_head(hf, None, greedy_data, tmp_path / "b", steps=12)
    with pytest.raises(ResumeError, match="different settings"):
        train_head(hf, None, greedy_data, tmp_path / "b", steps=12, ttt_steps=2, resume=True)
    # a fresh run may start from an exported head (another machine, no checkpoint)
    warm = train_head(hf, None, greedy_data, tmp_path / "d", steps=1, init_from=tmp_path / "a")
    assert warm.steps == 1 and torch.equal(warm.head.d2t, straight.head.d2t)
    with pytest.raises(ResumeError, match="does not fit"):
        train_head(hf, None, greedy_data, tmp_path / "e", steps=1, draft_vocab_size=20, init_from=tmp_path / "a")
    with pytest.raises(ResumeError, match="no usable checkpoint"):
        train_head(hf, None, greedy_data, tmp_path / "c", steps=12, resume=True)


def test_refit_vocabulary_keeps_the_body_and_the_rows_that_stay(target) -> None:
    """Rows of tokens in both vocabularies are copied; a new token's row is the target's row through
    the map the shared tokens fit (exact here: the old rows are a linear image of the target's)."""
    hf, _ = target
    W = hf.get_output_embeddings().weight.detach()
    H = W.shape[1]
    old = torch.arange(4, 52)  # 48 rows > hidden 32: the map is determined
    head = Eagle3Head(HeadConfig.for_target(hf.config, old.numel()), old)
    M = torch.randn(H, H, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        head.lm_head.weight.copy_(W[old] @ M)
    new = torch.tensor([0, 2, *range(10, 40), 55, 60, 63])
    out = refit_vocabulary(head, new, W)
    assert out.config.draft_vocab_size == new.numel() and torch.equal(out.used_ids, new)
    assert torch.equal(out.t2d.nonzero().flatten(), new)
    for k, v in head.state_dict().items():
        if k not in ("lm_head.weight", "d2t", "t2d"):
            assert torch.equal(out.state_dict()[k], v), k
    rows = out.lm_head.weight.detach()
    for j, tok in enumerate(new.tolist()):
        if 4 <= tok < 52:
            assert torch.equal(rows[j], head.lm_head.weight[tok - 4].detach())
        else:
            torch.testing.assert_close(rows[j], W[tok] @ M, atol=2e-2, rtol=2e-2)


def test_refit_vocab_picks_the_datas_tokens_when_continuing(target, greedy_data, tmp_path: Path) -> None:
    hf, _ = target
    first = train_head(hf, None, greedy_data[:40], tmp_path / "a", steps=2, draft_vocab_size=24)
    trains = [Sample(ids, start, True) for i, (ids, start) in enumerate(greedy_data) if i % 10]
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    for smp in trains:
        counts += torch.bincount(torch.tensor(smp.ids[smp.answer_start:]), minlength=VOCAB)
    want = draft_vocab(counts, 30, keep={2})
    warm = train_head(hf, None, greedy_data, tmp_path / "b", steps=1, draft_vocab_size=30, init_from=tmp_path / "a",
                      refit_vocab=True)
    assert torch.equal(warm.head.used_ids, want) and not torch.equal(warm.head.used_ids, first.head.used_ids)
    assert load_exported(tmp_path / "b").config.draft_vocab_size == 30


def _no_space(*_args, **_kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_an_export_failure_keeps_the_trained_head(target, greedy_data, tmp_path: Path, monkeypatch) -> None:
    """The disk fills up as the head is written: the error says where the trained head is kept,
    and the same run with --resume exports it (no step is trained again)."""
    import engine.train.trainer as trainer
    from engine.errors import UserError
    from engine.train.trainer import ExportError

    hf, _ = target
    out = tmp_path / "head"
    monkeypatch.setattr(trainer, "export_head", _no_space)
    with pytest.raises(ExportError) as err:
        train_head(hf, None, greedy_data, out, steps=4, draft_vocab_size=40)
    assert isinstance(err.value, UserError) and str(out / "checkpoint") in str(err.value)
    assert "No space left" in str(err.value) and "--resume" in str(err.value)
    assert json.loads((out / "checkpoint" / "progress.json").read_text())["step"] == 4
    monkeypatch.undo()
    resumed = train_head(hf, None, greedy_data, out, steps=4, draft_vocab_size=40, resume=True)
    assert resumed.steps == 4 and (out / "model.safetensors").is_file()
    assert torch.equal(load_exported(out).d2t, resumed.head.d2t)


def test_an_unwritable_checkpoint_folder_moves_the_checkpoint(target, greedy_data, tmp_path: Path,
                                                             monkeypatch) -> None:
    """OUT/checkpoint cannot be written (here: a file is in the way) and then the export fails
    too: the checkpoint went to a temporary folder, and the error names it."""
    import tempfile

    import engine.train.trainer as trainer
    from engine.train.trainer import ExportError

    hf, _ = target
    out = tmp_path / "head"
    out.mkdir()
    (out / "checkpoint").write_text("in the way")
    monkeypatch.setattr(trainer, "export_head", _no_space)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the rescue folder lands in the test's
    with pytest.raises(ExportError) as err:
        train_head(hf, None, greedy_data, out, steps=3, draft_vocab_size=40)
    rescue = Path(str(err.value).split("kept in ")[1].split(":")[0])
    assert rescue.parent == tmp_path and json.loads((rescue / "progress.json").read_text())["step"] == 3
    assert "copy that folder to OUT/checkpoint" in str(err.value)


def test_cli_refuses_an_unwritable_out_before_loading_the_target(tmp_path: Path, monkeypatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``train-draft --out /proc/nope`` (a folder that cannot be made) and ``--out FILE`` end in one
    line before the target loads or any data is generated."""
    import engine.train.pipeline as pipeline
    from specchat.cli import main

    def no_work(*_args, **_kwargs):
        raise AssertionError("work began before --out was checked")

    monkeypatch.setattr(pipeline, "load_target", no_work)
    monkeypatch.setattr(pipeline, "prepare_data", no_work)
    for out, needle in (("/proc/nope", "cannot write to --out /proc/nope"), (str(tmp_path), None)):
        if needle is None:
            (tmp_path / "f").write_text("")
            out, needle = str(tmp_path / "f"), "is a file"
        assert main(["train-draft", "smollm2-135m", "--out", out]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and needle in err[0], err


class _CharTokenizer:
    """Chat template over single-character tokens: 3 = user, 4 = assistant, 2 = end of turn."""

    stop_token_ids = frozenset({2})

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(("\x03" if m["role"] == "user" else "\x04") + m["content"] + "\x02" for m in messages)
        return text + ("\x04" if add_generation_prompt else "")

    def encode(self, text):
        return [ord(c) if ord(c) < 5 else 5 + ord(c) % (VOCAB - 5) for c in text]

    def decode(self, ids):
        return "".join(chr(i) if i < 5 else chr(ord("a") + (i - 5) % 26) for i in ids)


def test_data_cache_generates_dedups_and_resumes(target, tmp_path: Path) -> None:
    hf, _ = target
    tok = _CharTokenizer()
    settings = GenSettings(batch_size=6, max_user_tokens=8, max_answer_tokens=12, multi_turn_fraction=0.5)
    prompts = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]]
    cache = DataCache(tmp_path / "data", VOCAB)
    samples = generate_data(hf, tok, cache, token_budget=30, settings=settings, prompt_list=prompts)
    assert sum(len(s.ids) - s.answer_start for s in samples) >= 30
    assert len({tuple(s.ids) for s in samples}) == len(samples)  # deduplicated
    for s in samples:  # every answer follows the template's assistant marker
        assert s.ids[s.answer_start - 1] == 4 and 0 < s.answer_start < len(s.ids)
    shards = cache.shard_indices()
    assert cache.samples() == samples  # compact on disk, read back identically
    with np.load(cache.folder / f"batch-{shards[0]:06d}.npz") as z:
        assert z["ids"].dtype == np.uint16  # two bytes a token for vocabularies below 65536
    # a second call with the same budget generates nothing; a larger one appends shards
    again = generate_data(hf, tok, cache, token_budget=30, settings=settings, prompt_list=prompts)
    assert again == samples and cache.shard_indices() == shards
    more = generate_data(hf, tok, cache, token_budget=60, settings=settings, prompt_list=prompts)
    assert more[: len(samples)] == samples and len(cache.shard_indices()) > len(shards)


def test_a_magpie_share_of_zero_answers_only_the_prompt_list(target, tmp_path: Path) -> None:
    """``--magpie-share 0``: every conversation opens with a listed prompt (task-style data), none
    with a user turn the model wrote itself."""
    hf, _ = target
    tok = _CharTokenizer()
    settings = GenSettings(batch_size=6, max_user_tokens=8, max_answer_tokens=12, multi_turn_fraction=0.0,
                           magpie_fraction=0.0)
    prompts = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]]
    samples = generate_data(hf, tok, DataCache(tmp_path / "data", VOCAB), token_budget=30, settings=settings,
                            prompt_list=prompts)
    listed = [tok.encode(tok.apply_chat_template(p)) for p in prompts]
    assert samples and all(s.ids[:s.answer_start] in listed for s in samples)


def test_importing_two_folders_numbered_alike_keeps_both_and_adds_nothing_twice(tmp_path: Path) -> None:
    """The CPU's and the GPU's data are both numbered from batch-000000: an import keeps every
    shard (renumbering a taken name) and a second import of the same folders copies nothing."""
    from engine.train.pipeline import import_shards

    def folder(name: str, first: int) -> Path:
        src = DataCache(tmp_path / name, VOCAB)
        for i in range(3):
            src.write(i, [Sample(list(range(first + 10 * i, first + 10 * i + 8)), 2, greedy=True)], conversations=[i])
        return src.folder

    cpu, gpu = folder("cpu", 0), folder("gpu", 500)
    cache = DataCache(tmp_path / "cache", VOCAB)
    assert import_shards(cpu, cache) == 3 and import_shards(gpu, cache) == 3
    assert cache.shard_indices() == list(range(6))
    firsts = sorted(s.ids[0] for s in cache.samples())
    assert firsts == [0, 10, 20, 500, 510, 520]
    assert import_shards(cpu, cache) == 0 and import_shards(gpu, cache) == 0
    assert not list(cache.folder.glob(".import-*"))  # no half-copied file left behind


def test_sample_held_out_split_is_stable() -> None:
    samples = [Sample(list(range(i, i + 10)), 3, greedy=True) for i in range(400)]
    held = [s for s in samples if s.held_out]
    assert 5 < len(held) < 60
    assert not any(Sample(s.ids, s.answer_start, greedy=False).held_out for s in samples)


def test_cli_refuses_bad_runs_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specchat.cli import main

    assert main(["train-draft", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "has no checkpoint" in capsys.readouterr().err
    assert main(["train-draft", "--out", str(tmp_path / "x"), "--tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tokens: must be an integer from 1" in err
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "progress.json").write_text("{}")
    assert main(["train-draft", "--out", str(tmp_path / "run")]) == 2
    assert "pass --resume" in capsys.readouterr().err


def _naive_chain_logits(head, embeds, feats, steps):
    """The inference contract, one node at a time: the node at depth i over index p reads token
    x_{p+1+i} and its parent's pre-norm output, sits at RoPE position p+i and attends to the
    committed entries 0..p and to its own ancestors (depths 1..i-1) and itself."""
    c, m = head.config, head.midlayer
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    T = embeds.shape[0]

    def entry(e, h, pos):
        a = torch.cat([m.input_layernorm(e), m.hidden_norm(h)])
        q = head._rope(m.self_attn.q_proj(a).view(1, nh, 1, hd), torch.tensor([pos]))[0, :, 0]
        k = head._rope(m.self_attn.k_proj(a).view(1, nkv, 1, hd), torch.tensor([pos]))[0, :, 0]
        return q, k.repeat_interleave(nh // nkv, 0), m.self_attn.v_proj(a).view(nkv, hd).repeat_interleave(nh // nkv, 0)

    def finish(h, q, keys, values):
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, torch.stack(keys)) * hd**-0.5, dim=-1)
        h1 = h + m.self_attn.o_proj(torch.einsum("hn,nhd->hd", w, torch.stack(values)).reshape(-1))
        g = h1 + m.mlp(m.post_attention_layernorm(h1))
        return g, head.lm_head(head.norm(g))

    base = [entry(embeds[p + 1], head.fc(feats[p]), p) for p in range(T - 1)]
    out = torch.full((steps, T - 1, c.draft_vocab_size), float("nan"))
    for p in range(T - 1):
        keys, values = [b[1] for b in base[: p + 1]], [b[2] for b in base[: p + 1]]
        h, (q, _, _) = head.fc(feats[p]), base[p]
        for i in range(steps):
            if i:
                if p + 1 + i >= T:
                    break
                q, k, v = entry(embeds[p + 1 + i], h, p + i)
                keys, values = [*keys, k], [*values, v]
            h, logits = finish(h, q, keys, values)
            out[i, p] = logits
    return out


def test_ttt_forward_is_the_inference_contract() -> None:
    from engine.train.eagle3_head import Eagle3Head, HeadConfig

    cfg = HeadConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                     vocab_size=30, draft_vocab_size=12, aux_layer_ids=[1, 3, 4])
    torch.manual_seed(0)
    head = Eagle3Head(cfg, torch.arange(0, 24, 2))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        embeds, feats = torch.randn(1, 9, 16), torch.randn(1, 9, 48)
        fast = head.ttt_forward(embeds, feats, 3)
        ref = _naive_chain_logits(head, embeds[0], feats[0], 3)
    for i, lg in enumerate(fast):
        rows = ~torch.isnan(ref[i, :, 0])
        torch.testing.assert_close(lg[0][rows], ref[i][rows], atol=1e-5, rtol=1e-5)


def test_our_engine_generates_the_same_greedy_data_as_transformers(target) -> None:
    """Data generation on our LlamaModel (the CPU default) follows the batched path's rules."""
    from engine.models.llama import LlamaConfig, LlamaModel

    hf, cfg = target
    ours = LlamaModel(LlamaConfig.from_dict(cfg), {k: v.clone() for k, v in hf.state_dict().items()})
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (5,), generator=g).tolist() for _ in range(8)]
    stops = frozenset({2, 7})
    kwargs = {"max_new_tokens": 24, "temperatures": [0.0] * 8, "stop_ids": stops}
    want = generate_batch(hf, prompts, generator=torch.Generator().manual_seed(0), **kwargs)
    got = generate_batch(ours, prompts, generator=torch.Generator().manual_seed(0), **kwargs)
    assert sum(a == b for a, b in zip(want, got, strict=True)) >= 7  # fp32 rounding may flip a near-tie
    for ids, stopped in got:
        assert len(ids) <= 24 and stopped == (ids[-1] in stops)
        assert not any(t in stops for t in ids[:-1])
    sampled = {"max_new_tokens": 24, "temperatures": [1.0] * 8, "stop_ids": stops}
    a = generate_batch(ours, prompts, generator=torch.Generator().manual_seed(5), **sampled)
    b = generate_batch(ours, prompts, generator=torch.Generator().manual_seed(5), **sampled)
    assert a == b and a != got


def test_the_recorded_command_names_no_machine_paths(monkeypatch, tmp_path: Path) -> None:
    """What a head card records: paths in the working folder relative to it, others by name."""
    from specchat.train_draft import _command_line

    monkeypatch.chdir(tmp_path)
    line = _command_line(["train-draft", "m", "--import-data", "/tmp/newshards", f"--out={tmp_path}/heads/x",
                          "--init-from", "assets/head", "--lr", "2e-4"])
    assert line == "specchat train-draft m --import-data '<newshards>' --out=heads/x --init-from assets/head --lr 2e-4"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_an_existing_model_folder_is_refused_and_left_byte_identical(tmp_path: Path, monkeypatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``train-draft MODEL --out MODEL`` once replaced the model's config.json and model.safetensors with the
    head's: a folder holding files train-draft did not write is refused in one line, before the target loads."""
    import engine.train.pipeline as pipeline
    from specchat.cli import main

    def no_work(*_args, **_kwargs):
        raise AssertionError("work began before --out was checked")

    monkeypatch.setattr(pipeline, "load_target", no_work)
    monkeypatch.setattr(pipeline, "prepare_data", no_work)
    hf, _ = hf_model("llama")
    model = tmp_path / "model"
    hf.save_pretrained(model)
    before = _tree(model)
    capsys.readouterr()  # save_pretrained's progress bar
    for method, force in (("eagle3", []), ("medusa", []), ("eagle3", ["--force"])):  # --force: only a head of ours
        assert main(["train-draft", str(model), "--out", str(model), "--method", method, *force]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "did not write" in err[0] and "config.json" in err[0], err
    assert _tree(model) == before


def test_out_a_new_empty_or_own_folder_is_accepted(tmp_path: Path) -> None:
    """A new or empty folder is claimed (marked as a head's); a marked one, a head exported before the marker
    (its config.json card) and an interrupted run's checkpoint count as train-draft's own output."""
    from engine.train.outdir import MARKER, check_out_folder, claim, is_own_output

    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    check_out_folder(new)
    check_out_folder(empty)
    claim(empty, "eagle3")
    assert is_own_output(empty) and json.loads((empty / MARKER).read_text())["method"] == "eagle3"
    check_out_folder(empty)  # only its marker: a run stopped before it wrote anything, reused
    (empty / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"holds a trained head \(config\.json\); add --force to replace it"):
        check_out_folder(empty)  # a head of its own: costly to make again, replaced only when asked
    check_out_folder(empty, force=True)
    check_out_folder(empty, resume=True)
    old_head = tmp_path / "old"
    old_head.mkdir()
    (old_head / "config.json").write_text(json.dumps({"specchat_training": {"steps": 3}}))
    assert is_own_output(old_head)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert not is_own_output(foreign)
    with pytest.raises(UserError, match=r"notes\.txt"):
        check_out_folder(foreign)
    interrupted = tmp_path / "interrupted"  # a run stopped before its first export: --resume continues it
    (interrupted / "checkpoint").mkdir(parents=True)
    (interrupted / "checkpoint" / "progress.json").write_text("{}")
    check_out_folder(interrupted, resume=True)
