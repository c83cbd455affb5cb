"""``specchat generate``: one answer in the terminal, each token coloured by where it came from."""

from __future__ import annotations

import json
import os
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


# A token is a few bytes of text (3-5 for prose, fewer for CJK); no real prompt averages more than this,
# so a file bigger than this many bytes for every token of the context cannot fit, and is refused from
# its size alone, before the model loads, instead of after tokenizing all of it (49 s for 21 MB).
PROMPT_BYTES_PER_TOKEN = 32
PROMPT_FILE_LIMIT = 64 * 2**20  # read at most this much where the context is not known yet (a hub id)


def prompt_cannot_fit(nbytes: int, context: int) -> str:
    """Why a prompt of ``nbytes`` bytes cannot fit a context of ``context`` tokens ("" when it may)."""
    if nbytes <= PROMPT_BYTES_PER_TOKEN * context:
        return ""
    from engine.files import size_words

    return (f"the prompt is {size_words(nbytes)}, more than a context of {context:,} tokens can hold "
            f"(over {PROMPT_BYTES_PER_TOKEN} bytes a token); shorten it")


def check_prompt_file_size(options: GenerateOptions, context: int | None) -> None:
    """Refuse ``--prompt-file`` from its size when the model's ``context`` is known (the preflight, from
    config.json or the GGUF header); anything else about the file is left to :func:`read_prompt`."""
    import stat

    if options.prompt_file is None or context is None:
        return
    try:
        info = os.stat(options.prompt_file)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and (why := prompt_cannot_fit(info.st_size, context)):
        raise UsageError(f"--prompt-file {options.prompt_file}: {why}")


def read_prompt(options: GenerateOptions) -> str:
    """The user message from --prompt or --prompt-file; a missing, unreadable or empty one is refused,
    and so is a FIFO or a device (never opened for a blocking read) or a file over 64 MiB."""
    from engine.files import FileTooLargeError, UnreadableFileError, read_text

    if options.prompt is not None:
        text = options.prompt
    else:
        path = Path(str(options.prompt_file))
        try:
            text = read_text(path, limit=PROMPT_FILE_LIMIT, what="a text file")
        except MissingFileError as exc:  # a dangling link or a loop: the reader's own words
            raise MissingFileError(f"--prompt-file {exc}" if path.is_symlink() else
                                   f"prompt file {path} does not exist") from None
        except IsADirectoryError:
            raise UsageError(f"--prompt-file {path} is a folder; name a text file") from None
        except FileTooLargeError:
            raise UsageError(f"--prompt-file {path}: over {PROMPT_FILE_LIMIT // 2**20} MiB, more than any "
                             "model's context holds; shorten it") from None
        except UnreadableFileError as exc:  # a FIFO or a device would block or never end
            raise UsageError(f"--prompt-file {exc}") from None
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
    if why := prompt_cannot_fit(len(prompt.encode("utf-8", "surrogatepass")), session.context_limit):
        raise UsageError(why)  # a context known only now (a hub model, --backend hf): still before tokenizing
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
