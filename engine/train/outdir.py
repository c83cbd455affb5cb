"""Whose folder ``train-draft --out`` writes into: a new one, an empty one, or its own earlier output.

The trainer writes ``config.json`` and ``model.safetensors`` (and ``checkpoint/``) into its
output folder, the names every Hugging Face model folder uses: ``train-draft MODEL --out MODEL``
once replaced a model's weights with a draft head's. So a folder is written only when it is new,
empty, or marked as a head's (:data:`MARKER`, written before the first byte of training output).
Heads exported before the marker existed are recognised by the card the trainer puts in their
``config.json`` (``specchat_training``), and an interrupted run by its checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import UserError
from engine.files import read_text
from engine.jsonl import loads

MARKER = "specchat-draft.json"
CARD_KEY = "specchat_training"
CONFIG_CAP = 4 * 2**20  # a head's config.json is a few kB; a bigger file is not one of ours
SHOWN = 3  # files named in the refusal


class ForeignOutError(UserError):
    """``--out`` names a folder holding files that ``train-draft`` did not write."""


def is_own_output(folder: Path) -> bool:
    """True when ``folder`` holds an earlier ``train-draft`` run's output (marker, card or checkpoint)."""
    if (folder / MARKER).is_file() or (folder / "checkpoint" / "progress.json").is_file():
        return True
    config = folder / "config.json"
    try:
        return CARD_KEY in loads(read_text(config, limit=CONFIG_CAP))
    except (OSError, ValueError, TypeError, UserError):  # missing, not a regular file, too big, not JSON
        return False


def check_out_folder(out: Path) -> None:
    """Refuse, in one line, an existing non-empty folder that is not a head's: nothing in it is touched."""
    if not out.is_dir() or is_own_output(out):
        return
    try:
        names = sorted(p.name for p in out.iterdir())
    except OSError:
        return  # unreadable: the write probe after this says why
    if names:
        shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
        raise ForeignOutError(f"--out {out} holds files train-draft did not write ({shown}); name a new or empty "
                              "folder for the head")


def claim(out: Path, method: str) -> None:
    """Mark ``out`` as this command's output (before anything else is written there), so that a later run
    may write into it again (``--resume``, or a new head in place of the old one)."""
    marker = out / MARKER
    if not marker.is_file():
        marker.write_text(json.dumps({"written_by": "specchat train-draft", "method": method}) + "\n",
                          encoding="utf-8")
