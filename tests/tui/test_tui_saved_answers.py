"""What a reopened conversation takes from its recording: the chat turns' messages and the ids each
answer was written with (specchat/tui/sessions.py), so the session goes on as the live one would."""

from __future__ import annotations

from engine.events import CommittedToken, Finished, Started, Step
from specchat.tui.sessions import answer_ids, conversation
from specchat.tui.trace import UserTurn


def _step(*ids: int) -> Step:
    return Step(committed=tuple(CommittedToken(i, "target", chr(0x41 + i)) for i in ids))


RECORDS = [
    UserTurn(text="first"), Started(), _step(4, 5), _step(6), Finished(text="EFG"),
    UserTurn(text="side by side", mode="compare"), Started(), _step(9), Finished(text="J"),  # not the conversation
    UserTurn(text="too long"), Finished(reason="context", text=""),  # refused: never started
    UserTurn(text="second"), Started(dropped_turns=2), _step(7), Finished(text="H"),
    UserTurn(text="third"), Started(), _step(8), Finished(reason="cancelled", text="I"),
    UserTurn(text="cut by a crash"), Started(), _step(10),  # no Finished: left out
]


def test_each_answered_chat_turn_brings_its_answer_and_the_ids_it_was_written_with() -> None:
    assert conversation(RECORDS) == [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "EFG"},
        {"role": "user", "content": "second"}, {"role": "assistant", "content": "H"},
        {"role": "user", "content": "third"}, {"role": "assistant", "content": "I"},
    ]
    # a turn whose prompt left old turns out kept no ids live either (engine/followup.py)
    assert answer_ids(RECORDS) == [[4, 5, 6], None, [8]]
