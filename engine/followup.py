"""A follow-up turn's prompt built on the ids the model read and wrote, not on re-encoded text.

Why: the model writes the blank line before a numbered item as one token ("\\n\\n") where the
chat template's text of its answer encodes it as two (SmolLM2's pre-tokenizer splits the
whitespace before a digit), so a follow-up turn's prompt parted from the cached ids at the first
such line of the previous answer and the rest of it was prefilled again: most of a list answer
(170 of its tokens on average, 50 ms before the first token on a 2-core CPU), every turn.
Continuing from the ids the model wrote, as a chat that keeps its context does (llama.cpp's
interactive mode), the cache reuses the whole conversation so far and only the new turn is read.

The text the model reads is the template's either way; the ids differ only where the model chose
another split of the same text. Where that cannot be said (the template renders earlier turns
differently once a later one follows, as templates that drop an answer's reasoning do; an answer
whose ids do not decode to its text; turns dropped to fit the context), the prompt is the
conversation encoded afresh, as before. A conversation reopened from a recording goes on from its
answers' recorded ids (:func:`replay`), so it reads what the live one would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class Spoken:
    """A conversation as the model saw it: its messages up to and including the last answer, the
    template's text of them (the answer's turn left open, as the model wrote it) and the ids the
    model read and wrote for that text."""

    messages: tuple[Message, ...]
    text: str
    ids: tuple[int, ...]


def spoken(tokenizer: Any, messages: Sequence[Message], prompt: Sequence[int], answer: Sequence[int]
           ) -> Spoken | None:
    """The record of a finished turn: ``messages`` end with the answer, ``prompt`` is what the
    model read for the messages before it (encoded from the template's text, or built by
    :func:`follow_up` from the turn before) and ``answer`` the ids it wrote (no stop token).
    None where the answer's ids do not decode to its text (an answer cut inside a character) or
    the tokenizer has no chat template."""
    render = getattr(tokenizer, "apply_chat_template", None)
    if render is None or not messages or messages[-1].get("role") != "assistant":
        return None
    text = messages[-1]["content"]
    if tokenizer.decode(list(answer)) != text:
        return None
    try:
        before = render(list(messages[:-1]), True)
    except ValueError:  # a template that refuses (engine.tokenizer.TokenizerError is one)
        return None
    return Spoken(tuple(dict(m) for m in messages), before + text, (*prompt, *answer))


def follow_up(tokenizer: Any, record: Spoken | None, messages: Sequence[Message]) -> list[int] | None:
    """The prompt for ``messages`` when they go on from ``record``'s conversation: its ids, then
    the rest of the template's text encoded; None when they do not extend it, or when the
    template's text of them does not begin with the recorded text."""
    n = len(record.messages) if record is not None else 0
    if record is None or len(messages) <= n or tuple(messages[:n]) != record.messages:
        return None
    try:
        text = tokenizer.apply_chat_template(list(messages), True)
    except ValueError:
        return None
    if not text.startswith(record.text):
        return None
    return [*record.ids, *tokenizer.encode(text[len(record.text):])]


def replay(tokenizer: Any, messages: Sequence[Message], answers: Sequence[Sequence[int] | None]
           ) -> Spoken | None:
    """The record a live conversation left after ``messages`` (ending with an answer), rebuilt from
    each answer's ids (``answers``: one per assistant message, in order, as a recording holds
    them; None for a turn whose prompt dropped old turns to fit, which left no record): every
    turn's prompt is built as the live turn built it. None where answers are missing or the
    messages do not end with an answer."""
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant or assistant[-1] != len(messages) - 1 or len(answers) < len(assistant):
        return None
    record: Spoken | None = None
    for i, ids in zip(assistant, answers, strict=False):
        before = list(messages[:i])
        prompt = follow_up(tokenizer, record, before)
        if prompt is None and ids is not None:
            try:
                prompt = tokenizer.encode_chat(before)
            except ValueError:
                return None
        record = None if ids is None or prompt is None else spoken(tokenizer, messages[:i + 1], prompt, ids)
    return record
