"""The n-gram drafter's corpus: exact counts, best-first trees, the cached index, and lossless drafting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.corpus_files import CorpusHandle, read_documents, shard_files
from engine.drafters.eagle_checkpoint import DraftLoadError
from engine.drafters.ngram import NgramDrafter
from engine.drafters.ngram_corpus import _MUL, CorpusIndex, context_hashes, hash_slots
from engine.session import Session
from tests.test_session import baseline, model, tokens_of
from tests.tiny import TinyTokenizer

docs_strategy = st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=40), min_size=1, max_size=6)


def brute_force(docs: list[list[int]], max_n: int) -> dict[tuple[int, ...], Counter]:
    """Every n-gram's continuations within each document, counted the obvious way."""
    table: dict[tuple[int, ...], Counter] = {}
    for doc in docs:
        for end in range(len(doc) - 1):  # doc[end] ends the n-gram, doc[end + 1] follows it
            for n in range(1, min(max_n, end + 1) + 1):
                table.setdefault(tuple(doc[end - n + 1: end + 1]), Counter())[doc[end + 1]] += 1
    return table


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, max_n=st.integers(1, 4), top=st.integers(1, 3), min_count=st.integers(1, 3))
def test_the_index_holds_exactly_the_counted_continuations(docs, max_n, top, min_count) -> None:
    index = CorpusIndex.build([np.array(d) for d in docs], max_n=max_n, top=top, min_count=min_count)
    table = brute_force(docs, max_n)
    kept = 0
    for gram, counts in table.items():
        want = sorted(((-c, t) for t, c in counts.items() if c >= min_count))[:top]
        row, order = index.find(list(gram))
        if not want:  # nothing seen often enough: the n-gram is not in the index (a shorter one may be)
            assert order < len(gram)
            continue
        kept += 1
        assert order == len(gram)
        assert index.tokens[row].tolist() == [t for _, t in want] + [-1] * (top - len(want))
        assert index.counts[row].tolist() == [-c for c, _ in want] + [0] * (top - len(want))
        assert int(index.totals[row]) == sum(counts.values())
    assert len(index) == kept  # nothing else: no n-gram across two documents


def test_context_hashes_are_the_builders() -> None:
    index = CorpusIndex.build([np.array([5, 6, 7, 8, 5, 6, 7, 9])], max_n=3, min_count=1)
    row, order = index.find([1, 5, 6, 7])  # the longest n-gram held: 5 6 7
    assert order == 3 and row == index.find([5, 6, 7])[0]
    assert index.continuations([5, 6, 7]) == [(8, 1 / 3), (9, 1 / 3)]  # seen once each in 2 (+1)
    assert len(context_hashes([1, 2, 3], 5)) == 3 and index.find([42]) == (-1, 0)


def test_the_tree_is_best_first_with_the_corpus_probabilities() -> None:
    # after 1: 2 (x4) or 3 (x2); after 1 2: 4 (x4); after 1 3: 5 (x2)
    docs = [np.array([1, 2, 4])] * 4 + [np.array([1, 3, 5])] * 2
    index = CorpusIndex.build(docs, max_n=2, min_count=1)
    tree = index.tree([9], 1, max_drafts=4)
    assert tree.tokens == (1, 2, 4, 3, 5)  # by path probability: 2 (.57), 4 (.57 * .8), 3 (.29), 5
    assert tree.parents == (-1, 0, 1, 0, 3)
    assert tree.draft_probs[1] == pytest.approx(4 / 7) and tree.draft_probs[2] == pytest.approx(4 / 5)
    assert tree.has_probs
    chain = index.tree([9], 1, max_drafts=4, width=1)
    assert chain.tokens == (1, 2, 4)  # nothing follows 2 4
    assert index.tree([9], 1, max_drafts=1).tokens == (1, 2)
    assert index.tree([9], 7, max_drafts=4).tokens == (7,)  # 7 never seen: the root alone
    assert index.tree([9], 1, max_drafts=4, min_path=0.4).tokens == (1, 2, 4)  # 3's path: 0.29


@settings(max_examples=80, deadline=None)
@given(docs=docs_strategy, max_n=st.integers(1, 5), top=st.integers(1, 3), min_count=st.integers(1, 2),
       context=st.lists(st.integers(0, 7), min_size=1, max_size=6), max_drafts=st.integers(0, 12),
       width=st.sampled_from([None, 1, 2]), min_path=st.sampled_from([0.0, 0.02, 0.3]))
def test_the_native_tree_is_the_python_tree(docs, max_n, top, min_count, context, max_drafts, width, min_path) -> None:
    from engine.kernels import native

    if native.load() is None:
        pytest.skip("no native kernel here: the Python tree is the one that runs")
    index = CorpusIndex.build([np.array(d) for d in docs], max_n=max_n, top=top, min_count=min_count)
    history, root = context[:-1], context[-1]
    tail = history[max(0, len(history) - max_n + 1):] if max_n > 1 else []
    native = index.tree(history, root, max_drafts, width=width, min_path=min_path)
    python = index.tree_python(tail, root, max_drafts, width=width, min_path=min_path)
    assert (native.tokens, native.parents, native.draft_probs) == (python.tokens, python.parents, python.draft_probs)
    assert native.source == python.source == "corpus"


@given(keys=st.sets(st.integers(0, 2**64 - 1), max_size=300))
def test_every_key_sits_on_its_probe_chain(keys) -> None:
    """What corpus.c's lookup relies on: from a key's home slot, linear probing meets the key's row
    before any empty slot, and the table keeps a free slot (so a missing key's probe ends)."""
    arr = np.array(sorted(keys), dtype=np.uint64)
    slots = hash_slots(arr)
    bits = len(slots).bit_length() - 1
    assert len(slots) == 1 << bits and (slots == -1).sum() >= len(slots) // 2
    assert sorted(slots[slots >= 0].tolist()) == list(range(len(arr)))
    for row, key in enumerate(arr.tolist()):
        s = ((key * _MUL) & (2**64 - 1)) >> (64 - bits)
        while slots[s] != row:
            assert slots[s] >= 0
            s = (s + 1) % len(slots)


def write_shards(folder: Path, docs: list[list[int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.concatenate([np.array(d, dtype=np.uint16) for d in docs])
    np.savez(folder / "batch-000000.npz", ids=ids, lengths=np.array([len(d) for d in docs], dtype=np.int32))


def test_the_handle_builds_once_then_reads_the_cached_index(tmp_path: Path) -> None:
    write_shards(tmp_path / "data", [[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6, 4, 5, 6]])
    handle = CorpusHandle([tmp_path / "data"], 100, tmp_path / "cache")
    assert handle.index is None and "not indexed yet" in handle.describe()
    index = handle.wait(timeout=60)
    assert index is not None and index.continuations([1, 2])[0][0] == 3
    assert len(list((tmp_path / "cache").glob("ngram-*.safetensors"))) == 1
    again = CorpusHandle([tmp_path / "data"], 100, tmp_path / "cache")
    assert again.ready and again.index is not None and len(again.index) == len(index)
    assert "n-grams" in again.describe()
    cached = next((tmp_path / "cache").glob("ngram-*.safetensors"))
    loaded = CorpusIndex.load(cached)
    assert np.array_equal(loaded.keys, index.keys) and np.array_equal(loaded.counts, index.counts)
    cached.write_bytes(cached.read_bytes()[:100])  # a truncated cache file is rebuilt, not fatal
    rebuilt = CorpusHandle([tmp_path / "data"], 100, tmp_path / "cache")
    assert not rebuilt.ready and rebuilt.wait(timeout=60) is not None
    assert CorpusIndex.load(cached).keys.tolist() == index.keys.tolist()


def test_bad_corpus_folders_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftLoadError, match=r"no batch-\*\.npz shards") as e:
        shard_files([tmp_path / "empty"])
    assert "\n" not in str(e.value)
    write_shards(tmp_path / "big", [[1, 2, 60000]])
    with pytest.raises(DraftLoadError, match="another model"):
        CorpusHandle([tmp_path / "big"], 49152, None)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "batch-000000.npz").write_bytes(b"not a zip")
    with pytest.raises(DraftLoadError, match="not a data shard"):
        read_documents(shard_files([tmp_path / "junk"]), 100)


class _Ready:
    def __init__(self, index: CorpusIndex | None) -> None:
        self.index = index


def test_the_drafter_takes_the_corpus_where_the_conversation_matches_nothing() -> None:
    index = CorpusIndex.build([np.array([7, 8, 9, 10])] * 3, max_n=2, min_count=1)
    drafter = NgramDrafter(corpus=_Ready(index))
    config = SpecConfig(method="ngram", num_draft_tokens=4)
    drafter.reset([1, 2, 3, 4])
    assert drafter.propose([1, 2, 3, 4], 7, config).tokens == (7, 8, 9, 10)  # no match here: the corpus
    assert drafter.propose([1, 2, 3, 4], 7, config.replace(ngram_corpus=False)).tokens == (7,)
    assert drafter.propose([1, 2, 3, 4], 7, config.replace(ngram_mode="chain")).tokens == (7, 8, 9, 10)
    drafter.reset([1, 2, 3, 4, 7, 8, 5, 1, 2])
    # "1 2" matches two tokens: the conversation's own tree, without probabilities
    tree = drafter.propose(drafter.tokens, 3, config)
    assert tree.tokens[:2] == (3, 4) and not tree.has_probs
    assert NgramDrafter(corpus=_Ready(None)).propose([5], 7, config).tokens == (7,)  # still indexing


def test_at_a_one_token_match_the_source_that_has_been_landing_drafts() -> None:
    """The conversation drafts first; once the target has said what the corpus proposed and not
    what the conversation did, the corpus drafts at the next one-token match."""
    index = CorpusIndex.build([np.array([7, 8, 9, 10])] * 3, max_n=2, min_count=1)
    drafter = NgramDrafter(corpus=_Ready(index))
    config = SpecConfig(method="ngram", num_draft_tokens=4)
    history = [1, 2, 3, 4, 7, 8, 5, 1]
    drafter.reset(history)
    first = drafter.propose(history, 7, config)  # "7" matches one token of the conversation (7 -> 8 5 1)
    assert first.tokens == (7, 8, 5, 1) and first.source == ""
    drafter.observe([7, 8])  # the target kept 8 and then said 9: the corpus's 8 9 10 was righter
    history += [7, 8]
    assert drafter.propose(history, 9, config).source == "corpus"  # "8 9": no match at all
    drafter.observe([9, 10])
    history += [9, 10]
    again = drafter.propose(history, 7, config)  # "10 7" is new, "7" is a one-token match again
    assert again.tokens == (7, 8, 9, 10) and again.source == "corpus"


def test_paired_scores_walk_each_tree_as_the_verifier_would() -> None:
    from engine.drafters.ngram_source import SourceChoice, committed_along
    from engine.tree import DraftTree

    tree = DraftTree((5, 6, 7, 8, 9), (-1, 0, 1, 0, 3), (1.0,) * 5)  # 5 -> 6 -> 7 and 5 -> 8 -> 9
    assert committed_along(tree, [8, 9, 1]) == 2 and committed_along(tree, [6, 9]) == 1
    assert committed_along(tree, [1]) == 0 and committed_along(tree, [6]) == 1  # capped at what is known
    choice = SourceChoice()
    conversation, corpus = DraftTree.chain(5, [6, 7]), DraftTree.chain(5, [8, 9])
    assert choice.choose(3, conversation, corpus) is conversation
    choice.score([0, 0, 0, 5, 8], 9)  # root 5 at position 3, then the target said 8 9
    assert choice.corpus > choice.conversation
    assert choice.choose(3, conversation, corpus) is corpus
    before = (choice.conversation, choice.corpus)
    choice.score([0, 0], 1)  # cut back below the pair's root since: nothing is learnt
    choice.forget()
    choice.score([0, 0, 0, 5, 6, 7], 1)
    assert (choice.conversation, choice.corpus) == before


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(3, 96), min_size=1, max_size=20),
    noise=st.lists(st.lists(st.integers(3, 96), min_size=2, max_size=30), max_size=4),
    draft_tokens=st.integers(2, 12),
    mode=st.sampled_from(["tree", "chain"]),
    adaptive=st.booleans(),
    max_new=st.integers(1, 30),
    temperature=st.sampled_from([0.0, 0.0, 0.8]),
)
def test_drafting_from_the_corpus_is_lossless(prompt, noise, draft_tokens, mode, adaptive, max_new,
                                              temperature) -> None:
    """A corpus holding the baseline's own answer (drafts that land) and noise (drafts that do not);
    greedy, or coupled sampling with a seed (the same sample as the baseline's)."""
    m = model("llama", 0)
    sampled = SpecConfig(max_new_tokens=max_new, temperature=temperature, seed=3)
    want = tokens_of(Session(m, TinyTokenizer(), sampled, drafters={"none": NoDrafter}).generate_ids([1, *prompt]))
    if temperature == 0.0:
        assert want == baseline(m, [1, *prompt], max_new)
    index = CorpusIndex.build([np.array([1, *prompt, *want]), *(np.array(d) for d in noise)], min_count=1)
    config = sampled.replace(method="ngram", num_draft_tokens=draft_tokens, ngram_mode=mode, adaptive_draft=adaptive)
    s = Session(m, TinyTokenizer(), config,
                drafters={"none": NoDrafter, "ngram": lambda: NgramDrafter(corpus=_Ready(index))})
    assert tokens_of(s.generate_ids([1, *prompt])) == want


def test_auto_finds_the_data_train_draft_generated_for_these_weights(tmp_path: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    from engine.loader import LoadedModel, open_corpus
    from engine.models.resolve import weights_id

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    (model / "model.safetensors").write_bytes(b"x" * 10)
    loaded = LoadedModel(SimpleNamespace(config=SimpleNamespace(vocab_size=100)), None, "m", str(model), "specchat")
    assert open_corpus("auto", loaded) is None  # nothing generated yet
    data = tmp_path / "cache" / "train-data" / "0123456789abcdef"
    write_shards(data, [[1, 2, 3, 1, 2, 3]])
    (data / "settings.json").write_text(f'{{"model_id": "{weights_id(model)}"}}')
    other = tmp_path / "cache" / "train-data" / "fedcba9876543210"  # another model's data
    write_shards(other, [[4, 5, 6]])
    (other / "settings.json").write_text('{"model_id": "somebody-else"}')
    handle = open_corpus("auto", loaded)
    assert handle is not None and handle.folders == [data]
    assert open_corpus("none", loaded) is None
    assert open_corpus(str(other), loaded).folders == [other]  # named folders, whatever their model
    embedded = SimpleNamespace(config=SimpleNamespace(vocab_size=49152))
    shipped = LoadedModel(embedded, None, "m", "", "specchat", key="smollm2-135m")
    assert [f.name for f in open_corpus("auto", shipped).folders] == [
        "smollm2-135m", "smollm2-135m-gpu", "smollm2-135m-tasks"]


def test_auto_finds_a_ggufs_data_whichever_form_of_its_weights_wrote_or_reads_it(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """A GGUF's fp32 conversion and its stored form (config and tokenizer only) share one weights
    id, so data ``train-draft`` wrote on one form is found by ``auto`` on the other (it was not: the
    id came from the safetensors' sizes, and a stored folder has none). Data written under the fp32
    form's former id is still found, and ``--resume`` goes on in its folder."""
    from test_gguf_convert import write_tiny_gguf

    from engine.drafters.corpus_files import generated_corpus
    from engine.models.resolve import resolve_model, weights_id, weights_ids
    from engine.train.data import GenSettings
    from engine.train.pipeline import Target, data_folder

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(cache))
    write_tiny_gguf(tmp_path / "a.gguf")
    write_tiny_gguf(tmp_path / "b.gguf", tied=False)  # another file: another id
    fp32 = resolve_model(str(tmp_path / "a.gguf")).path
    stored = resolve_model(str(tmp_path / "a.gguf"), weights="stored").path
    other = resolve_model(str(tmp_path / "b.gguf"), weights="stored").path
    assert fp32 != stored and weights_id(fp32) == weights_id(stored) != weights_id(other)
    current, former = weights_ids(fp32)
    assert weights_ids(stored) == (current,)

    for name, model_id in (("new", current), ("old", former)):
        data = cache / "train-data" / name
        write_shards(data, [[1, 2, 3]])
        (data / "settings.json").write_text(f'{{"model_id": "{model_id}"}}')
    assert [f.name for f in generated_corpus(stored, cache)] == ["new"]
    assert [f.name for f in generated_corpus(fp32, cache)] == ["new", "old"]
    assert generated_corpus(other, cache) == []

    settings = GenSettings()
    target = Target(None, None, "a", current, former_ids=(former,))
    assert data_folder(target, settings).name == settings.digest(current)  # nothing written yet
    (cache / "train-data" / settings.digest(former)).mkdir()
    assert data_folder(target, settings).name == settings.digest(former)  # resumed where it was


def test_the_bench_row_says_how_much_the_corpus_drafted() -> None:
    from types import SimpleNamespace

    from engine.events import StepTiming
    from engine.tree import DraftTree
    from specchat.bench_report import StepSplit

    def step(tree: DraftTree, accepted: tuple[int, ...]) -> SimpleNamespace:
        return SimpleNamespace(timing=StepTiming(draft_ms=0.1, verify_ms=4.0), draft_levels=0, draft_paused=False,
                               draft_width=0, tree=tree, accepted=accepted, payoff=None)

    split = StepSplit()
    split.add(step(DraftTree((1, 2, 3), (-1, 0, 1), (1.0, 0.6, 0.5), source="corpus"), (1,)))
    split.add(step(DraftTree((1, 2, 3), (-1, 0, 1), (1.0, 1.0, 1.0), has_probs=False), (1, 2)))
    split.add(step(DraftTree.root_only(4), ()))
    fields = split.fields()
    assert fields["corpus_step_share"] == round(1 / 3, 3) and fields["corpus_draft_share"] == round(1 / 3, 3)
    plain = StepSplit()
    plain.add(step(DraftTree.root_only(4), ()))
    assert plain.fields()["corpus_step_share"] is None and plain.fields()["corpus_draft_share"] is None


def test_a_session_that_starts_on_ngram_indexes_its_corpus_behind_the_loading_screen(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Not beside the first answers (a background build there halves their speed on 2 cores); a
    session that starts on another method builds nothing until n-grams first draft."""
    import engine.loader
    from engine.loader import LoadedModel, load_session
    from tests.tiny import our_model

    tiny = our_model("llama", 0)[0]  # first: its kernel from the suite's cache, not built afresh under tmp_path
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECCHAT_CALIBRATE", "0")
    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: LoadedModel(tiny, TinyTokenizer(), "tiny", "",
                                                                                 "specchat"))
    write_shards(tmp_path / "data", [[5, 6, 7, 5, 6, 7, 5, 6, 7]])
    seen: list[str] = []
    s = load_session("tiny", SpecConfig(method="ngram"), ngram_corpus=str(tmp_path / "data"),
                     progress=lambda what, done, total: seen.append(what))
    assert s.ngram_corpus.ready and "indexing the n-gram corpus (once per machine)" in seen
    write_shards(tmp_path / "other", [[8, 9, 10, 8, 9, 10]])
    quiet = load_session("tiny", SpecConfig(method="none"), ngram_corpus=str(tmp_path / "other"))
    assert not quiet.ngram_corpus.ready and "not indexed yet" in quiet.ngram_corpus.describe()
    list(quiet.generate_ids([1, 8, 9], SpecConfig(method="ngram", max_new_tokens=4)))  # the drafter is made
    assert quiet.ngram_corpus.wait(timeout=60) is not None
