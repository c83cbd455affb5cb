"""Prompt files: JSON lines of ``messages``, ``turns`` (MT-bench) or ``prompt`` (raw text).

Why in the engine: ``specchat bench`` times answers to them and ``specchat train-draft`` mixes
them into its training data, and ``engine.train`` must not import the app. One parser means one
set of accepted forms and one way to fail: the file and line named in a single line the user
can act on (:class:`PromptFileError`, a UserError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.errors import UserError
from engine.jsonl import JsonLinesError, read_jsonl

Messages = list[dict[str, str]]


class PromptFileError(UserError, ValueError):
    """A prompt file line that is not a usable prompt; names the file and line."""


class _ChatTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Messages) -> list[int]: ...


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat messages (the chat template applies) or raw text (continued as is)."""

    id: str
    messages: Messages | None = None
    text: str | None = None
    where: str = field(default="", compare=False)  # "file:line", for a refusal that names the row

    def ids(self, tokenizer: _ChatTokenizer) -> list[int]:
        """The token ids the model reads: the raw text, or the messages through the chat template."""
        return tokenizer.encode(self.text) if self.text is not None else tokenizer.encode_chat(self.messages or [])

    def chat(self) -> Messages:
        """The prompt as a conversation that ends on a user turn (raw text becomes that turn);
        empty when it holds no user turn. Training regenerates the answer, so turns after the
        last user message are dropped."""
        if self.text is not None:
            return [{"role": "user", "content": self.text}]
        msgs = list(self.messages or [])
        while msgs and msgs[-1]["role"] != "user":
            msgs.pop()
        return msgs


def parse_prompt(row: dict[str, Any], where: str, default_id: str) -> Prompt:
    """One prompt-file object as a :class:`Prompt`; ``where`` ("file:line") prefixes any error.

    ``messages`` must be a list of {role, content} objects; ``turns`` a list of strings, of which
    the first is the user message (MT-bench's second turn depends on the first answer);
    ``prompt`` a string, continued without a chat template.
    """
    pid = str(row.get("id", row.get("question_id", default_id)))
    if "messages" in row:
        msgs = row["messages"]
        if not (isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in msgs)):
            raise PromptFileError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        return Prompt(pid, messages=[{"role": str(m["role"]), "content": m["content"]} for m in msgs], where=where)
    if "turns" in row:
        turns = row["turns"]
        if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
            raise PromptFileError(f"{where}: 'turns' must be a non-empty list of strings")
        return Prompt(pid, messages=[{"role": "user", "content": turns[0]}], where=where)
    if isinstance(row.get("prompt"), str):
        if not row["prompt"].strip():  # no tokens to continue: refused here, not after the model loads
            raise PromptFileError(f"{where}: 'prompt' is empty")
        return Prompt(pid, text=row["prompt"], where=where)
    raise PromptFileError(f"{where}: no 'messages', 'turns' or 'prompt' field")


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """The prompts of a JSON-lines file, in order (the first ``limit`` of them when given).

    Raises MissingFileError for a missing file and PromptFileError for a bad line or a file
    without prompts."""
    try:
        lines = read_jsonl(path)
    except JsonLinesError as exc:
        raise PromptFileError(str(exc)) from None
    rows = lines.rows[:limit] if limit is not None else lines.rows
    prompts = [parse_prompt(row, f"{lines.path}:{lineno}", str(lineno)) for lineno, row in rows]
    if not prompts:
        raise PromptFileError(f"{lines.path} holds no prompts")
    return prompts
