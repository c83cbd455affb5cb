"""Whether a prompt fits the model's context, and which oldest turns to leave out so that it does.

Kept apart from the step loop: this runs once per turn, before anything touches the cache, so a
refused turn changes nothing.
"""

from __future__ import annotations

from typing import Any

from engine.api import Message
from engine.config import ConfigError, SpecConfig

# A turn must leave the answer at least this much room (or max_new_tokens, if smaller).
MIN_ANSWER_ROOM = 64


def check_answer_length(config: SpecConfig, limit: int) -> None:
    """Refuse an answer longer than the whole context (``--max-new-tokens 10**9``) when the
    settings are taken, with the context's size: such an answer could never end by its length,
    and the cache would be sized for it."""
    if config.max_new_tokens > limit:
        raise ConfigError(f"max_new_tokens={config.max_new_tokens} is more than the model's context of {limit} "
                          f"tokens; use --max-new-tokens {limit} or less")


def context_refusal(prompt_tokens: int, config: SpecConfig, limit: int) -> str:
    """Why a prompt of this length cannot be answered within ``limit`` tokens ("" when it can)."""
    room = min(config.max_new_tokens, MIN_ANSWER_ROOM)
    if prompt_tokens + room + config.max_tree_tokens <= limit:
        return ""
    return (f"the prompt is {prompt_tokens} tokens; with room for an answer it does not fit the model's "
            f"context of {limit} tokens")


def fit_context(tokenizer: Any, messages: list[Message], config: SpecConfig, limit: int
                ) -> tuple[list[int], int, str]:
    """The prompt for ``messages``, the number of oldest messages dropped to fit, and a refusal.

    With ``context_overflow = "drop_oldest"`` the oldest user/assistant turns are left out of
    the prompt (the system prompt and the last message always stay) until it fits.
    """
    prompt = tokenizer.encode_chat(messages)
    refusal = context_refusal(len(prompt), config, limit)
    if not refusal or config.context_overflow != "drop_oldest":
        return prompt, 0, refusal
    head = [m for m in messages[:1] if m.get("role") == "system"]
    body = messages[len(head):]
    dropped = 0
    while refusal and len(body) > 1:
        cut = 2 if len(body) > 2 and body[0].get("role") == "user" else 1
        body = body[cut:]
        dropped += cut
        prompt = tokenizer.encode_chat([*head, *body])
        refusal = context_refusal(len(prompt), config, limit)
    if refusal:
        refusal += " even with every earlier turn dropped"
    return prompt, dropped, refusal
