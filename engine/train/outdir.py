"""Whose folder ``train-draft --out`` writes into: a new one, an empty one, or its own earlier output.

The trainer writes ``config.json`` and ``model.safetensors`` (and ``checkpoint/``) into its
output folder, the names every Hugging Face model folder uses: ``train-draft MODEL --out MODEL``
once replaced a model's weights with a draft head's. So a folder is written only when it is new,
empty, or marked as a head's (:data:`MARKER`, written before the first byte of training output).
Heads exported before the marker existed are recognised by the card the trainer puts in their
``config.json`` (``specchat_training``), and an interrupted run by its checkpoint.

A head is costly to make again (hours of training; the shipped one a copy away), so even a folder
of ours is written over only when the user asks: ``--resume`` continues its run, ``--force``
replaces its head (``train-draft --out`` over a copy of the shipped head once replaced it with a
1-step head). A folder holding only the marker (a run stopped before it wrote anything) is reused.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import UserError
from engine.files import read_text
from engine.jsonl import loads
from engine.outputs import FORCE_HINT, OutputError

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


def check_out_folder(out: Path, *, force: bool = False, resume: bool = False) -> None:
    """Refuse, in one line, an existing non-empty folder that is not a head's (even with ``force``), and
    a head's without ``force`` or ``resume``: nothing in it is touched."""
    if not out.is_dir():
        return
    try:
        names = sorted(p.name for p in out.iterdir() if p.name != MARKER)
    except OSError:
        return  # unreadable: the write probe after this says why
    if not names:
        return
    shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    if not is_own_output(out):
        raise ForeignOutError(f"--out {out} holds files train-draft did not write ({shown}); name a new or empty "
                              "folder for the head")
    if not (force or resume):
        raise OutputError(f"--out {out} holds a trained head ({shown}); {FORCE_HINT.replace('file', 'folder')} "
                          "(--resume continues its run)")


def claim(out: Path, method: str) -> None:
    """Mark ``out`` as this command's output (before anything else is written there), so that a later run
    may write into it again (``--resume``, or a new head in place of the old one)."""
    marker = out / MARKER
    if not marker.is_file():
        marker.write_text(json.dumps({"written_by": "specchat train-draft", "method": method}) + "\n",
                          encoding="utf-8")
