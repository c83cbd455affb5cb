"""``specchat generate``: one answer in the terminal, each token coloured by where it came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import MissingFileError
from specchat.options import UsageError, draft_options, make_config

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from specchat.command_options import GenerateOptions, ModelOptions

# Accepted draft tokens vs tokens the target produced itself (bonus / correction).
DRAFT_STYLE = "bold green"
TARGET_STYLE = "bright_white"


def generate_config(options: GenerateOptions) -> SpecConfig:
    """``generate``'s config: the shared mapping (specchat.options) over its defaults (n-gram, 256 tokens)."""
    return make_config(options.spec, method="ngram", max_new_tokens=256)


def read_prompt(options: GenerateOptions) -> str:
    """The user message from --prompt or --prompt-file; a missing, unreadable or empty one is refused."""
    if options.prompt is not None:
        text = options.prompt
    else:
        path = Path(str(options.prompt_file))
        if path.is_dir():
            raise UsageError(f"--prompt-file {path} is a folder; name a text file")
        if not path.exists():
            raise MissingFileError(f"prompt file {path} does not exist")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise UsageError(f"--prompt-file {path} is not a regular file; name a text file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the prompt file {path} ({getattr(exc, 'strerror', None) or exc})") from None
    if not text.strip():
        raise UsageError("the prompt is empty; pass some text with --prompt or --prompt-file")
    return text


def _one_weights(target: ModelOptions) -> str:
    weights = target.weights or "stored"
    if weights not in ("stored", "fp32"):
        raise UsageError(f"--weights must be stored or fp32, not {weights!r}")
    return weights


def _one_precision(target: ModelOptions) -> str:
    precision = target.precision or "auto"
    if precision not in ("auto", "exact", "fast"):
        raise UsageError(f"--precision must be auto, exact or fast, not {precision!r}")
    return precision


def run_generate(options: GenerateOptions) -> int:
    from rich.console import Console
    from rich.text import Text

    from engine.events import Finished, Started, Step
    from engine.loader import load_session
    from engine.models.progress import rich_progress

    config = generate_config(options)
    prompt = read_prompt(options)
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    with rich_progress() as progress:
        target = options.target
        session = load_session(target.model, config, progress=progress, **draft_options(options),
                               **target.load_args(weights=_one_weights(target), precision=_one_precision(target)))
    config = session.config
    if options.raw:
        events = session.generate_ids(_raw_ids(session.tokenizer, prompt))
    else:
        events = session.generate([{"role": "user", "content": prompt}])

    tokens: list[int] = []
    started: Started | None = None
    finished: Finished | None = None
    for event in events:
        if isinstance(event, Started):
            started = event
        elif isinstance(event, Step):
            tokens.extend(c.id for c in event.committed)
            if not options.json:
                piece = Text()
                for c in event.committed:
                    piece.append(c.text, style=DRAFT_STYLE if c.origin == "draft" else TARGET_STYLE)
                out.print(piece, end="")
        elif isinstance(event, Finished):
            finished = event
    if finished is None or started is None:  # refused before any forward: the prompt does not fit
        why = finished.error if finished is not None and finished.error else "the answer did not start"
        raise UsageError(f"{why}; shorten the prompt (or pick a model with a longer context)")
    stats = finished.stats
    if options.json:
        print(json.dumps({
            "text": finished.text, "tokens": tokens, "steps": stats.steps, "tau": round(stats.tau, 4),
            "tokens_per_s": round(stats.tokens_per_s, 3), "finish_reason": finished.reason,
            "method": config.method, "model": session.model_name,
        }))
        return 0
    out.print()
    legend = "" if not sys.stdout.isatty() else f"  [{DRAFT_STYLE}]accepted draft[/] [{TARGET_STYLE}]target[/]"
    err.print(
        f"[dim]{stats.tokens} tokens, {stats.steps} steps, tau {stats.tau:.2f}, "
        f"{stats.tokens_per_s:.1f} tok/s, {config.method}, stop: {finished.reason}[/]{legend}"
    )
    return 0


def _raw_ids(tokenizer: Any, prompt: str) -> list[int]:
    """``--raw`` text as the model reads a document: after the tokens its tokenizer puts in front (a
    BOS for Gemma, which answers garbage without one), unless the text already starts with them;
    never with what it appends (an EOS would end the answer before it starts)."""
    plain = tokenizer.encode(prompt)
    full = tokenizer.encode(prompt, add_special_tokens=True)
    front = next((k for k in range(len(full) - len(plain) + 1) if full[k:k + len(plain)] == plain), 0)
    prefix = full[:front]
    return plain if plain[:len(prefix)] == prefix else prefix + plain
