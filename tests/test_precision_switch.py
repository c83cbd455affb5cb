"""Switching the target's arithmetic while chatting (``Session.set_precision``, the TUI's precision
setting): the conversation is read again in the new precision, so the next answer is the one a
conversation held in that precision from the start would give; a switch asked for while an answer
streams waits for it; what cannot run is refused in one line with nothing changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, SpecConfig
from engine.events import Started, Step
from engine.kernels import native
from engine.models.gguf_weights import load_gguf_state
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session
from tests.test_stored_weights import VOCAB, write_model_gguf

KERNEL = native.load()
needs_fast = pytest.mark.skipif(KERNEL is None or KERNEL.fast_variant is None,
                                reason="no fast kernel here (needs the native kernel: AVX2)")
CONFIG = SpecConfig(method="ngram", max_new_tokens=12, adaptive_draft=False)


def stored_model(tmp_path: Path, weights: str = "stored") -> LlamaModel:
    write_model_gguf(tmp_path / "m.gguf", tied=False)
    config, state = load_gguf_state(tmp_path / "m.gguf")
    return LlamaModel(LlamaConfig.from_dict(config), state, weights=weights)


def turn(session: Session, text: str) -> tuple[Started, list[int]]:
    events = list(session.chat(text))
    started = next(e for e in events if isinstance(e, Started))
    return started, [t.id for e in events if isinstance(e, Step) for t in e.committed]


def tokenizer():
    from tiny import TinyTokenizer

    return TinyTokenizer(vocab_size=VOCAB, stop_ids=frozenset())


@needs_fast
def test_the_next_answer_is_the_new_precisions_own(tmp_path: Path) -> None:
    model = stored_model(tmp_path)
    session = Session(model, tokenizer(), CONFIG)
    started, first = turn(session, "abcabc")
    assert started.precision == "exact" and session.context_used > 0
    assert session.set_precision("fast") is True
    assert session.precision == model.precision == "fast" and session.context_used == 0  # the cache is dropped
    started, second = turn(session, "bcd")
    assert started.precision == "fast" and started.reused_tokens == 0  # the whole conversation read again
    fresh = Session(model, tokenizer(), CONFIG)  # held in fast from the start, the same first answer
    fresh.restore(session.messages[:2], answers=[first])
    assert turn(fresh, "bcd")[1] == second
    assert session.set_precision("exact") is True
    exact = Session(model, tokenizer(), CONFIG)
    exact.restore(session.messages, answers=[first, second])
    assert turn(session, "cde")[1] == turn(exact, "cde")[1]


@needs_fast
def test_a_switch_during_an_answer_waits_for_it_to_end(tmp_path: Path) -> None:
    model = stored_model(tmp_path)
    session = Session(model, tokenizer(), CONFIG)
    events = session.chat("abcabc")
    assert isinstance(next(e for e in events if isinstance(e, Started)), Started)
    assert session.set_precision("fast") is False
    assert model.precision == "exact"  # the answer streaming keeps its arithmetic
    rest = list(events)
    assert rest and model.precision == "fast" and session.context_used == 0


def test_what_cannot_run_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    model = stored_model(tmp_path, weights="fp32")
    session = Session(model, tokenizer(), CONFIG)
    turn(session, "abc")
    cached = session.context_used
    with pytest.raises(ConfigError, match="needs stored weights"):
        session.set_precision("fast")
    with pytest.raises(ConfigError, match="exact or fast"):
        session.set_precision("fp8")
    assert session.precision == "exact" and session.context_used == cached
    assert session.set_precision("exact") is True and session.context_used == cached  # no switch: cache kept


@needs_fast
def test_the_budgets_measure_the_new_precisions_costs(tmp_path: Path) -> None:
    model = stored_model(tmp_path)
    session = Session(model, tokenizer(), CONFIG.replace(adaptive_draft=True), calibrate_costs=True)
    turn(session, "abcabc")
    assert session.measured_cost_shape is not None
    session.set_precision("fast")
    assert session.measured_cost_shape is None and session.learned_cost_curves == {}
    turn(session, "bcd")
    assert session.measured_cost_shape is not None  # measured again, in fast


@needs_fast
def test_reread_reads_the_conversation_before_the_next_answer(tmp_path: Path) -> None:
    """What the TUI's host runs right after a switch: the next answer then prefills only its own
    turn, and is the same answer as without the re-read."""
    model = stored_model(tmp_path)
    session = Session(model, tokenizer(), CONFIG)
    _, first = turn(session, "abcabc")
    session.set_precision("fast")
    session.reread()
    assert session.context_used > len(first)  # the prompt and the answer, in fast
    started, second = turn(session, "bcd")
    assert started.precision == "fast" and started.reused_tokens > len(first)  # the first turn was read already
    lazy = Session(model, tokenizer(), CONFIG)
    lazy.restore(session.messages[:2], answers=[first])
    assert turn(lazy, "bcd")[1] == second
