"""Two speculative methods in one session, compared on one prompt (issue 21): an EAGLE-3 head and
Medusa heads read different target states, and both must give the baseline's greedy answer from
the same cache state, in any order, warm or cold, and when one is hot-swapped for the other
mid-answer. The host's compare job (method A against method B, each against the baseline) is
checked here too, without a UI."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_eagle import bundle as eagle_bundle
from test_eagle import head_dir as eagle_dir
from test_eagle import target, tokens_of
from test_medusa import bundle as medusa_bundle
from test_medusa import head_dir as medusa_dir
from tiny import TinyTokenizer

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.ngram import NgramDrafter
from engine.events import Started, Step
from engine.session import Session
from specchat.tui.host import EngineHost, wait_items
from specchat.tui.host_api import CompareJob, Delivery, JobDone

# whole trees verified (the adaptive budget off), so both heads draft on every step
TWO = SpecConfig(method="eagle3", num_steps=3, num_draft_tokens=8, adaptive_draft=False)
PROMPTS = st.lists(st.integers(3, 96), min_size=1, max_size=12)


@functools.cache
def heads():
    return eagle_bundle("eagle3", "specforge", 40), medusa_bundle("vllm", None)


def two_head_session(config: SpecConfig) -> Session:
    """The way a session gets both: one head at load, the other installed beside it."""
    eagle, medusa = heads()
    s = Session(target(), TinyTokenizer(), config, drafters={"none": NoDrafter, "ngram": NgramDrafter,
                                                             "eagle3": eagle.factory}, features=eagle.features)
    s.set_draft(medusa.method, medusa.factory, medusa.features)
    return s


def answer(s: Session, prompt: list[int], method: str, max_new: int) -> list[int]:
    events = list(s.generate_ids(prompt, s.config.replace(method=method, max_new_tokens=max_new)))
    assert any(isinstance(e, Started) for e in events)
    return tokens_of(events)


def test_each_head_reads_its_own_features() -> None:
    eagle, medusa = heads()
    assert eagle.features != medusa.features  # layers' residuals vs the last hidden state
    s = two_head_session(TWO.replace(eagle_topk=2))
    assert set(s.methods) == {"none", "ngram", "eagle3", "medusa"}
    for method in ("medusa", "eagle3", "medusa"):
        events = list(s.generate_ids([1, 5, 6, 7, 8], s.config.replace(method=method, max_new_tokens=10)))
        assert any(len(e.tree) > 1 for e in events if isinstance(e, Step)), method


def test_alternating_heads_keep_each_others_features_of_the_tokens_that_stay() -> None:
    """An EAGLE-3 turn after a Medusa turn (and back) reuses the shared prompt: each prefill keeps
    the other head's features of the tokens it does not change (they used to be wiped, so the two
    re-prefilled everything on every switch), and every answer is still the baseline's."""
    s = two_head_session(TWO.replace(max_new_tokens=8))
    prompt = [1, 5, 6, 7, 8, 9, 10, 11, 12]
    want = answer(s, prompt, "none", 8)
    reused = []
    for method in ("eagle3", "medusa", "eagle3", "medusa"):
        events = list(s.generate_ids(prompt, s.config.replace(method=method)))
        reused.append(next(e.reused_tokens for e in events if isinstance(e, Started)))
        assert tokens_of(events) == want, method
    assert reused[2:] == [len(prompt) - 1] * 2, reused


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=PROMPTS, order=st.permutations(["none", "medusa", "eagle3", "ngram"]), warm=st.booleans(),
       topk=st.sampled_from([1, 4]))
def test_both_sides_of_a_comparison_give_the_baseline_answer_from_the_same_cache(prompt, order, warm, topk) -> None:
    s = two_head_session(TWO.replace(eagle_topk=topk))
    head = [1, 4, 9]
    if warm:  # a conversation before: the compare starts from a warm cache, as the host's does
        list(s.generate_ids(head, s.config.replace(method=order[-1], max_new_tokens=4)))
    mark = s.context_used if warm else 0
    answers = {}
    for method in order:
        s.rewind_cache(min(mark, s.context_used))
        answers[method] = answer(s, head + prompt, method, 12)
    assert answers["medusa"] == answers["none"] == answers["eagle3"] == answers["ngram"]


def test_a_hot_swap_between_the_two_heads_mid_answer_stays_lossless() -> None:
    s = two_head_session(TWO.replace(eagle_topk=2, max_new_tokens=24))
    s.update_config(s.config.replace(method="medusa"))
    plain = Session(target(), TinyTokenizer(), SpecConfig(max_new_tokens=24), drafters={"none": NoDrafter})
    for turn, text in enumerate(("ABCD", "EFG", "HIJ")):
        events = []
        for i, event in enumerate(s.chat(text)):
            events.append(event)
            if i in (3, 7):  # eagle3 <-> medusa at step boundaries
                nxt = "eagle3" if s.config.method == "medusa" else "medusa"
                s.update_config(s.config.replace(method=nxt))
        assert tokens_of(events) == tokens_of(plain.chat(text)), turn


def test_the_host_compares_method_a_with_method_b_and_each_with_the_baseline() -> None:
    s = two_head_session(TWO.replace(method="ngram", eagle_topk=2, max_new_tokens=16))
    host = EngineHost(lambda progress: s, lambda: None)
    import threading

    thread = threading.Thread(target=host.run, daemon=True)
    thread.start()
    try:
        for n in range(3):  # the order rotates from one compare to the next
            job = host.submit(CompareJob("ABCD", ("medusa", "eagle3")))
            items = wait_items(host, lambda got, j=job: any(isinstance(i, JobDone) and i.job == j for i in got))
            assert [i.error for i in items if isinstance(i, JobDone) and i.job == job] == [""]
            lanes: dict[str, list[int]] = {}
            methods: dict[str, str] = {}
            for item in items:
                if isinstance(item, Delivery) and isinstance(item.record, Step):
                    lanes.setdefault(item.lane, []).extend(c.id for c in item.record.committed)
                if isinstance(item, Delivery) and isinstance(item.record, Started):
                    methods[item.lane] = item.record.drafter
            assert methods == {"baseline": "none", "alt": "medusa", "spec": "eagle3"}, n
            assert lanes["alt"] == lanes["baseline"] == lanes["spec"] and lanes["baseline"]
            assert s.config.method == "ngram" and s.messages == []  # a compare changes neither
    finally:
        host.shutdown()
        thread.join(timeout=5)


def test_bench_rows_report_acceptance_per_depth_for_each_method() -> None:
    from engine.events import Finished
    from engine.prompts import Prompt
    from specchat.bench import run_ours
    from specchat.bench_report import Row, depth_cells

    s = two_head_session(TWO.replace(eagle_topk=2, max_new_tokens=24))
    prompt = Prompt("p1", messages=[{"role": "user", "content": "ABCDEFG"}])
    shares = {}
    for method in ("none", "medusa", "eagle3"):
        config = s.config.replace(method=method)
        row = Row(method, "stored")
        row.add(run_ours(s, prompt, config, row.split), {None: []})
        result = row.result(row, "stored")
        s.reset()
        fin = [e for e in s.generate(prompt.messages, config) if isinstance(e, Finished)][-1]
        assert result["accept_by_depth"] == [round(x, 3) for x in fin.stats.accept_per_depth], method
        shares[method] = result["accept_by_depth"]
    assert shares["none"] == [] and depth_cells(shares["none"]) == "-"
    for method in ("medusa", "eagle3"):  # both drafted: at least depth 1 was tried
        assert len(shares[method]) >= 1 and all(0 <= x <= 1 for x in shares[method])
        assert depth_cells(shares[method]).split()[0] == f"{shares[method][0]:.0%}"


def ship(monkeypatch, method: str, shipped: dict) -> None:
    """``method``'s registration with ``shipped`` as its shipped heads, for this test."""
    import dataclasses

    from engine import methods

    spec = methods.get(method)
    draft = dataclasses.replace(spec.draft, shipped=shipped)
    monkeypatch.setitem(methods._REGISTRY, method, dataclasses.replace(spec, draft=draft))


def test_the_loader_installs_the_shipped_heads_the_compare_asks_for(monkeypatch) -> None:
    """``specchat run --compare medusa,eagle3`` on the embedded model: both shipped heads in one session
    (a tiny target and synthetic heads stand in for the embedded model and its assets)."""
    import engine.loader as loader

    fake = loader.LoadedModel(target(), TinyTokenizer(), "tiny", "", "specchat", "embedded", "tiny-key")
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: fake)
    ship(monkeypatch, "eagle3", {"tiny-key": eagle_dir("eagle3", "specforge", 40)})
    ship(monkeypatch, "medusa", {"tiny-key": medusa_dir("vllm", None)})
    plain = loader.load_session(None, SpecConfig(method="ngram"))
    assert set(plain.methods) == {"none", "ngram", "eagle3"}  # Medusa only when asked for
    s = loader.load_session(None, TWO.replace(method="ngram", max_new_tokens=12), also=("medusa", "eagle3"))
    assert set(s.methods) == {"none", "ngram", "eagle3", "medusa"}
    want = answer(s, [1, 5, 6, 7], "none", 12)
    assert answer(s, [1, 5, 6, 7], "medusa", 12) == want == answer(s, [1, 5, 6, 7], "eagle3", 12)
    medusa_first = loader.load_session(None, SpecConfig(method="medusa"))  # its shipped head, no --draft
    assert set(medusa_first.methods) == {"none", "ngram", "medusa"}


def test_the_chat_loads_every_shipped_head_so_any_method_can_be_switched_to(monkeypatch) -> None:
    """``specchat run --method eagle3`` on the embedded model: the TUI's session holds the shipped Medusa
    heads too, so the settings (F2) and the palette can switch to medusa while chatting, and the
    other way round (before, a session offered only the head it started with)."""
    import engine.loader as loader
    from specchat.tui.launch import config_from_args, session_loader
    from tests.parsed import parsed

    fake = loader.LoadedModel(target(), TinyTokenizer(), "tiny", "", "specchat", "embedded", "tiny-key")
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: fake)
    ship(monkeypatch, "eagle3", {"tiny-key": eagle_dir("eagle3", "specforge", 40)})
    ship(monkeypatch, "medusa", {"tiny-key": medusa_dir("vllm", None)})
    for method in ("eagle3", "medusa", "none"):
        options = parsed("run", "--method", method)
        config = config_from_args(options).replace(max_new_tokens=12, adaptive_draft=False)
        session = session_loader(options, config)(progress=None)
        assert set(session.methods) == {"none", "ngram", "eagle3", "medusa"}, method
        assert session.config.method == method
        want = answer(session, [1, 5, 6, 7], "none", 12)
        assert answer(session, [1, 5, 6, 7], "medusa", 12) == want == answer(session, [1, 5, 6, 7], "eagle3", 12)
