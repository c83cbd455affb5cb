"""A new conversation reuses the chat template's preamble from the cache, and only that.

Session.reset keeps the tokens every conversation opens with where the model's rows do not depend
on how a prefill is chunked (our CPU kernels): the next conversation must then give the tokens a
fresh session gives, reuse exactly the preamble (never the previous prompt, or a benchmark's second
method would skip its prefill), and a model without that promise must start from an empty cache.
"""

from __future__ import annotations

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import Started, Step
from engine.prefix import chat_preamble
from engine.session import Session
from tests.drafters import RandomTreeDrafter
from tests.tiny import TinyTokenizer, our_model

PREAMBLE = [1, 40, 41, 42, 43, 0, 44]  # "system turn" and the opening of the user's turn


class TemplateTokenizer(TinyTokenizer):
    """TinyTokenizer with a chat template that opens every conversation with the same tokens."""

    def encode_chat(self, messages) -> list[int]:
        ids = list(PREAMBLE)
        for m in messages:
            ids += [*self.encode(m["content"]), 0]
        return ids


_MODEL = our_model("llama", 0)[0]


def _session(method: str = "none") -> Session:
    return Session(_MODEL, TemplateTokenizer(), SpecConfig(method=method, max_new_tokens=16),
                   drafters={"none": NoDrafter, "standalone": lambda: RandomTreeDrafter(3)})


def _run(s: Session, text: str) -> tuple[int, list[int]]:
    events = list(s.chat(text))
    started = next(e for e in events if isinstance(e, Started))
    return started.reused_tokens, [c.id for e in events if isinstance(e, Step) for c in e.committed]


def test_the_preamble_is_what_two_conversations_share() -> None:
    assert chat_preamble(TemplateTokenizer()) == PREAMBLE
    assert chat_preamble(object()) == []  # no chat template: nothing to keep


def test_a_new_conversation_reuses_the_preamble_and_answers_as_a_fresh_session() -> None:
    assert _MODEL.rows_independent, "the tiny model runs on our native kernels here"
    s = _session("standalone")
    _run(s, "ABCDEFG")
    for text in ("HIJK", "HIJK", "LMNOPQRS"):
        s.reset()
        assert s.context_used == len(PREAMBLE)
        reused, got = _run(s, text)
        assert reused == len(PREAMBLE)  # the preamble, not the previous prompt (the second "HIJK")
        assert got == _run(_session("none"), text)[1]


def test_a_model_without_row_independent_kernels_starts_from_an_empty_cache(monkeypatch) -> None:
    s = _session()
    _run(s, "ABCDEFG")
    monkeypatch.setattr(type(_MODEL), "rows_independent", property(lambda self: False))
    s.reset()
    assert s.context_used == 0
    assert _run(s, "HIJK")[0] == 0


def test_forget_cache_drops_the_preamble_too() -> None:
    s = _session()
    _run(s, "ABCDEFG")
    s.forget_cache()
    assert s.context_used == 0
    assert _run(s, "HIJK")[0] == 0
