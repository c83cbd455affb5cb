"""A follow-up turn's prompt built on the ids the model read and wrote, not on re-encoded text.

Why: the model writes a paragraph break as one token ("\\n\\n") where the chat template's text of
its answer encodes as two (the pre-tokenizer splits whitespace before a word), so a follow-up
turn's prompt parted from the cached ids at the first blank line of the previous answer and the
rest of it was prefilled again: most of an ordinary answer, every turn. Continuing from the ids
the model wrote, as a chat that keeps its context does (llama.cpp's interactive mode), the cache
reuses the whole conversation so far and only the new turn is prefilled.

The text the model reads is the template's either way; the ids differ only where the model chose
another split of the same text. Where that cannot be said (the template renders earlier turns
differently once a later one follows, as templates that drop an answer's reasoning do; an answer
whose ids do not decode to its text; turns dropped to fit the context), the prompt is the
conversation encoded afresh, as before. A conversation reopened from a file is encoded afresh.
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
