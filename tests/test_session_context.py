"""Chunked prefill (progress, cancel between chunks), the context limit (refuse / drop oldest
turns), and the knob table shared by the CLI and the TUI."""

from __future__ import annotations

from engine.config import METHOD_KNOBS, SpecConfig, knobs_for
from engine.drafters.base import NoDrafter
from engine.drafters.ngram import NgramDrafter
from engine.events import Finished, PrefillProgress, Started, Step, event_from_dict, event_to_dict
from engine.session import Session
from engine.tree import DraftTree
from tests.tiny import TinyTokenizer, our_model

_M = {}


def model():
    if "m" not in _M:
        _M["m"] = our_model("llama", 0)[0]
    return _M["m"]


def session(**cfg) -> Session:
    cfg.setdefault("max_new_tokens", 12)
    return Session(model(), TinyTokenizer(stop_ids=frozenset()), SpecConfig(**cfg),
                   drafters={"none": NoDrafter, "ngram": NgramDrafter})


def tokens_of(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


PROMPT = [1, *range(3, 90), *range(3, 90), 5, 6, 7]  # 181 tokens


def test_chunked_prefill_reports_progress_and_gives_the_same_answer():
    whole = session()
    whole._prefiller.chunk = 4096
    ref = list(whole.generate_ids(PROMPT))
    assert not any(isinstance(e, PrefillProgress) for e in ref)

    chunked = session()
    chunked._prefiller.chunk = 16
    events = list(chunked.generate_ids(PROMPT))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert progress, "a long prompt in small chunks reports progress"
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert all(p.total == len(PROMPT) for p in progress) and progress[-1].done < len(PROMPT)
    assert isinstance(events[len(progress)], Started)
    assert tokens_of(events) == tokens_of(ref)
    # the event survives a trace round trip
    assert event_from_dict(event_to_dict(progress[0])) == progress[0]


def test_cancel_during_prefill_leaves_the_conversation_as_before():
    s = session()
    first = list(s.chat("HELLO"))
    assert isinstance(first[-1], Finished) and first[-1].reason != "cancelled"
    messages, cached = s.messages, list(s._cached)
    s._prefiller.chunk = 16
    gen = s.chat("X" * 150)
    got = [next(gen)]
    assert isinstance(got[0], PrefillProgress)
    s.cancel()
    got += list(gen)
    assert isinstance(got[-1], Finished) and got[-1].reason == "cancelled"
    assert not any(isinstance(e, Started) for e in got)
    assert s.messages == messages
    assert s._cache.length == len(s._cached) <= len(cached)
    assert s._cached == cached[: len(s._cached)]
    # the conversation goes on as if the cancelled turn never happened
    again = list(s.chat("WORLD"))
    fresh = session()
    list(fresh.chat("HELLO"))
    assert tokens_of(again) == tokens_of(fresh.chat("WORLD"))


def test_a_turn_that_does_not_fit_is_refused_and_nothing_changes():
    s = session()  # the tiny model's context is 512 tokens
    list(s.chat("A" * 200))
    messages = s.messages
    events = list(s.chat("B" * 300))
    assert len(events) == 1 and isinstance(events[0], Finished)
    assert events[0].reason == "context" and "context of 512 tokens" in events[0].error
    assert s.messages == messages


def test_drop_oldest_leaves_out_earlier_turns_to_fit():
    s = session(context_overflow="drop_oldest")
    list(s.chat("A" * 200))
    list(s.chat("C" * 100))
    events = list(s.chat("B" * 300))
    started = next(e for e in events if isinstance(e, Started))
    assert started.dropped_turns >= 2 and started.context_limit == 512
    assert started.prompt_tokens <= 512 - 64
    assert isinstance(events[-1], Finished) and events[-1].reason in ("length", "stop")
    assert s.messages[-1]["role"] == "assistant" and len(s.messages) == 6  # the history itself is kept
    # a single message too long for the context is refused even so
    refused = list(s.chat("D" * 600))
    assert refused[-1].reason == "context" and "every earlier turn dropped" in refused[-1].error


def test_rewind_cache_keeps_a_prefix():
    s = session()
    list(s.chat("HELLO"))
    s.rewind_cache(3)
    assert s.context_used == 3 == s._cache.length


def test_knobs_by_method():
    assert knobs_for("none") == ()
    assert "ngram_min_match_window_size" in knobs_for("ngram") and "eagle_topk" not in knobs_for("ngram")
    for method in ("eagle", "eagle3", "standalone", "medusa"):
        assert {"num_steps", "eagle_topk", "num_draft_tokens"} <= set(knobs_for(method))
    assert set(METHOD_KNOBS) == {"none", "ngram", "eagle", "eagle3", "standalone", "medusa", "dflash"}
    assert "medusa_tree" in knobs_for("medusa") and "medusa_tree" not in knobs_for("eagle3")
    # a block: its size, and the width of the DDTree grown from it (1: a chain); never a tree's levels
    assert knobs_for("dflash") == ("eagle_topk", "num_draft_tokens", "adaptive_draft")


def test_ngram_drafts_say_they_have_no_probabilities():
    d = NgramDrafter()
    history = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    d.reset(history)
    tree = d.propose(history, 7, SpecConfig(method="ngram"))
    assert len(tree) > 1 and tree.has_probs is False
    chain = d.propose(history, 7, SpecConfig(method="ngram", ngram_mode="chain"))
    assert chain.has_probs is False
    assert DraftTree.from_dict(tree.to_dict()).has_probs is False
    assert DraftTree.from_dict({k: v for k, v in tree.to_dict().items() if k != "has_probs"}).has_probs
