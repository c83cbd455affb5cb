"""The user's UI preferences: one TOML file under the XDG config dir, one immutable object.

Path: ``$SPECCHAT_CONFIG`` if set, else ``$XDG_CONFIG_HOME/specchat/config.toml`` (platformdirs).
Example::

    theme = "colourblind"      # dark | light | colourblind | any registered theme name
    show_rejected = false      # F5 toggles
    cursor_blink = true
    save_sessions = true       # conversations saved under the user data dir
    tree_history = 64          # steps kept for browsing with prev/next

    [keys]                     # binding id = keys (comma separated); see specchat/tui/keys.py
    next-step = "f8,n"

A broken file never stops the app: defaults are used and the problem is reported in one line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specchat.tui.keys import DEFAULT_KEYS, KEY_IDS, bad_keys

ENV_VAR = "SPECCHAT_CONFIG"


@dataclass(frozen=True)
class UISettings:
    theme: str = "dark"
    show_rejected: bool = False  # F5 shows the refused drafts; off, the answer reads as plain text
    cursor_blink: bool = True
    tree_history: int = 64
    save_sessions: bool = True  # record every conversation under the user data dir (Ctrl+O reopens)
    compare: str = ""  # the compare view's "A,B" (compare_pair.py); "": the baseline vs the method in force
    keymap: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def replace(self, **changes: Any) -> UISettings:
        return dataclasses.replace(self, **changes)


def config_path() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("specchat")) / "config.toml"


def _load_toml(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def load_ui_settings(path: Path | None = None) -> tuple[UISettings, list[str]]:
    """Read the config file; returns the settings and one-line warnings (never raises)."""
    from engine.files import SMALL_LIMIT, read_text

    path = path or config_path()
    if not path.exists() and not path.is_symlink():
        return UISettings(), []
    try:  # a FIFO or a device is refused unread: the app would freeze before its first frame
        data = _load_toml(read_text(path, limit=SMALL_LIMIT, what="a TOML config file"))
    except ImportError:
        return UISettings(), [f"{path}: TOML needs Python 3.11+ or the 'tomli' package; using defaults"]
    except Exception as exc:  # TOMLDecodeError, OSError, UnicodeDecodeError, UnreadableFileError, RecursionError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        first = first.removeprefix(f"{path}: ")  # our file reader names the path already
        return UISettings(), [f"{path}: {first}; using defaults"]

    warnings: list[str] = []
    values: dict[str, Any] = {}
    types = {"theme": str, "show_rejected": bool, "cursor_blink": bool, "tree_history": int, "save_sessions": bool,
             "compare": str}
    for key, value in data.items():
        if key == "keys":
            continue
        expected = types.get(key)
        if expected is None:
            warnings.append(f"{path}: unknown setting {key!r} ignored")
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            warnings.append(f"{path}: {key} must be {expected.__name__}, got {value!r}; ignored")
        else:
            values[key] = value
    if "tree_history" in values and values["tree_history"] < 1:
        warnings.append(f"{path}: tree_history must be >= 1; ignored")
        del values["tree_history"]

    keymap: dict[str, str] = {}
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        warnings.append(f"{path}: [keys] must be a table; ignored")
        keys = {}
    for binding_id, value in keys.items():
        if binding_id not in KEY_IDS:
            warnings.append(f"{path}: unknown binding id {binding_id!r}; known: {', '.join(sorted(KEY_IDS))}")
        elif not isinstance(value, str) or not value.strip():
            warnings.append(f"{path}: keys.{binding_id} must be a non-empty string")
        elif bad := bad_keys(value.replace(" ", "")):
            warnings.append(f"{path}: keys.{binding_id} = {value!r}: {', '.join(map(repr, bad))} is not a key "
                            f"(e.g. ctrl+q, f8, n, plus); {binding_id} stays on {DEFAULT_KEYS[binding_id]}")
        else:
            keymap[binding_id] = value.replace(" ", "")
    return UISettings(**values, keymap=MappingProxyType(keymap)), warnings
