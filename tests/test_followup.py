"""A follow-up turn goes on from the ids the model read and wrote (engine/followup.py).

The tokenizer below has the quirk that matters: one token the model writes decodes to text that
encodes as two other tokens (as SmolLM2 writes "\\n\\n1." with one token for the blank line where
the text encodes it as two), so re-encoding the conversation parts from the cached ids there.
"""

from __future__ import annotations

import pytest

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import Started, Step
from engine.followup import follow_up, replay, spoken
from engine.prefix import common_prefix
from engine.session import Session
from tests.drafters import RandomTreeDrafter
from tests.tiny import TinyTokenizer, our_model

_MODEL = our_model("llama", 0)[0]
_ROLES = {"system": "S", "user": "U", "assistant": "W"}


class MergingTokenizer(TinyTokenizer):
    """Token ``merged`` reads "DD", which encodes as two tokens 3; a ChatML-like template in letters."""

    def __init__(self, merged: int = -1, short_history: bool = False) -> None:
        super().__init__(stop_ids=frozenset())
        self.merged = merged
        self.short_history = short_history  # the template cuts earlier answers (as some drop reasoning)

    def _char(self, i: int) -> str:
        return "DD" if i == self.merged else super()._char(i)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        out = []
        for i, m in enumerate(messages):
            content = m["content"]
            if self.short_history and m["role"] == "assistant" and i < len(messages) - 1:
                content = content[:2]
            out.append(_ROLES[m["role"]] + content + "X")
        return "".join(out) + ("W" if add_generation_prompt else "")

    def encode_chat(self, messages) -> list[int]:
        return self.encode(self.apply_chat_template(messages))


def _session(tok: MergingTokenizer, method: str = "none") -> Session:
    return Session(_MODEL, tok, SpecConfig(method=method, max_new_tokens=12),
                   drafters={"none": NoDrafter, "standalone": lambda: RandomTreeDrafter(3)})


def _turn(s: Session, text: str) -> tuple[Started, list[int]]:
    events = list(s.chat(text))
    ids = [c.id for e in events if isinstance(e, Step) for c in e.committed]
    return next(e for e in events if isinstance(e, Started)), ids


@pytest.fixture(scope="module")
def merged() -> int:
    """A token the tiny model writes in its answer to "HELLO" (not its last: the quirk then sits
    inside the answer, with answer tokens after it)."""
    _, ids = _turn(_session(MergingTokenizer()), "HELLO")
    return ids[len(ids) // 2]


def test_a_follow_up_reuses_the_whole_conversation(merged: int) -> None:
    tok = MergingTokenizer(merged)
    s = _session(tok)
    first, answer = _turn(s, "HELLO")
    assert merged in answer
    conversation = [*s.messages, {"role": "user", "content": "MORE"}]
    afresh = tok.encode_chat(conversation)
    spoken_ids = [*tok.encode_chat(s.messages[:1]), *answer]
    assert common_prefix(afresh, spoken_ids) < len(spoken_ids) - 1  # re-encoding parts at the merged token
    second, _ = _turn(s, "MORE")
    assert second.reused_tokens >= first.prompt_tokens + len(answer) - 1  # all but the last token never run
    assert second.prompt_tokens == len(spoken_ids) + len(tok.encode("XUMOREXW"))


def test_the_follow_up_answer_is_the_baseline_on_the_same_ids(merged: int) -> None:
    """Speculation stays lossless on the new prompt: a drafting session's second answer is the
    baseline session's, and a fresh session given the same ids answers the same."""
    tok = MergingTokenizer(merged)
    runs = {}
    for method in ("none", "standalone"):
        s = _session(tok, method)
        _turn(s, "HELLO")
        runs[method] = _turn(s, "MORE")[1]
        prompt = follow_up(tok, s._spoken, [*s.messages, {"role": "user", "content": "AGAIN"}])
        assert prompt is not None and prompt[:len(s._spoken.ids)] == list(s._spoken.ids)
    assert runs["none"] == runs["standalone"]


def test_a_compare_run_goes_on_from_the_conversation_too(merged: int) -> None:
    """generate() with the conversation plus a new turn (what the app's compare runs) takes the same prompt."""
    tok = MergingTokenizer(merged)
    s = _session(tok)
    _turn(s, "HELLO")
    events = list(s.generate([*s.messages, {"role": "user", "content": "MORE"}]))
    started = next(e for e in events if isinstance(e, Started))
    assert started.reused_tokens > len(tok.encode_chat(s.messages[:1]))
    assert started.prompt_tokens == len(s._spoken.ids) + len(tok.encode("XUMOREXW"))


def test_a_reopened_conversation_reads_what_the_live_one_would_have(merged: int) -> None:
    """Restored with its answers' recorded ids, a conversation's next turn takes the live session's
    prompt and answer; restored from its messages alone, the conversation is encoded afresh."""
    tok = MergingTokenizer(merged)
    live = _session(tok)
    answers = [_turn(live, "HELLO")[1], _turn(live, "MORE")[1]]
    messages = live.messages
    started, third = _turn(live, "AGAIN")
    reopened = _session(tok)
    reopened.restore(messages, answers)
    assert reopened._spoken == replay(tok, messages, answers) and reopened._spoken is not None
    again, third_reopened = _turn(reopened, "AGAIN")
    assert (again.prompt_tokens, third_reopened) == (started.prompt_tokens, third)
    plain = _session(tok)
    plain.restore(messages)  # no ids: encoded afresh
    afresh, _ = _turn(plain, "AGAIN")
    assert afresh.prompt_tokens == len(tok.encode_chat([*messages, {"role": "user", "content": "AGAIN"}]))
    assert replay(tok, messages, answers[:1]) is None  # an answer's ids missing
    assert replay(tok, messages, [answers[0], None]) is None  # the last turn dropped old ones: no record


def test_an_edited_conversation_is_encoded_afresh(merged: int) -> None:
    tok = MergingTokenizer(merged)
    s = _session(tok)
    _turn(s, "HELLO")
    edited = [{"role": "user", "content": "HELLP"}, *s.messages[1:]]
    assert follow_up(tok, s._spoken, [*edited, {"role": "user", "content": "X"}]) is None
    assert follow_up(tok, s._spoken, s.messages) is None  # nothing new to answer


def test_a_template_that_renders_earlier_turns_anew_gets_the_conversation_encoded_afresh(merged: int) -> None:
    tok = MergingTokenizer(merged, short_history=True)
    s = _session(tok)
    _turn(s, "HELLO")
    conversation = [*s.messages, {"role": "user", "content": "MORE"}]
    assert follow_up(tok, s._spoken, conversation) is None
    started, _ = _turn(s, "MORE")
    assert started.prompt_tokens == len(tok.encode_chat(conversation))


def test_nothing_is_recorded_where_the_ids_do_not_read_as_the_answer() -> None:
    tok = MergingTokenizer(5)
    messages = [{"role": "user", "content": "HI"}, {"role": "assistant", "content": "DDE"}]
    prompt = tok.encode_chat(messages[:1])
    assert spoken(tok, messages, prompt, [5, 4]) is not None  # "DD" + "E"
    assert spoken(tok, messages, prompt, [5, 5]) is None  # reads "DDDD"
    assert spoken(TinyTokenizer(), messages, prompt, [5, 4]) is None  # no chat template
