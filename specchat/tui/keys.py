"""Key bindings: one table, each binding with an id that users can remap in the config file.

    [keys]
    next-step = "f8,n"
    settings = "ctrl+s"

Textual applies the remapping through ``App.set_keymap`` (binding id -> keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})


@dataclass(frozen=True)
class KeySpec:
    id: str
    key: str
    action: str
    description: str
    help: str
    show: bool = True
    priority: bool = True


APP_KEYS: tuple[KeySpec, ...] = (
    # Escape is not a priority binding: open dialogs and the command palette close with it first.
    KeySpec("cancel", "escape", "cancel", "Stop", "stop the answer (or the replay) at the next step boundary",
            priority=False),
    KeySpec("help", "f1", "help", "Help", "explain draft, verify, accept, bonus, tau and the knobs"),
    KeySpec("settings", "f2", "toggle_settings", "Settings", "show the settings panel (hot-swap)"),
    KeySpec("compare", "f3", "toggle_compare", "Compare", "baseline and speculative side by side"),
    KeySpec("teach", "f4", "toggle_teach", "Teach", "pause after every step and explain it"),
    KeySpec("show-rejected", "f5", "toggle_rejected", "Rejected", "show refused drafts struck through", show=False),
    KeySpec("panels", "f6", "toggle_panels", "Panels", "show / hide the side panels (tree, stats)"),
    KeySpec("prev-step", "f7", "prev_step", "◀Step", "browse to the previous step's tree", show=False),
    KeySpec("next-step", "f8", "next_step", "Step▶", "next step (teaching: let the engine take one step)"),
    KeySpec("new-chat", "ctrl+n", "new_chat", "New", "start a new conversation", show=False),
    KeySpec("sessions", "ctrl+o", "open_sessions", "Open", "reopen a saved conversation", show=False),
    KeySpec("export", "ctrl+e", "export('conversation')", "Export",
            "export the conversation as Markdown, HTML and SVG", show=False),
    KeySpec("replay-pause", "space", "replay_pause", "Pause", "replay: pause / resume", priority=False),
    KeySpec("replay-slower", "minus", "replay_speed(0.5)", "Slower", "replay: half speed", priority=False),
    KeySpec("replay-faster", "plus,equals_sign", "replay_speed(2.0)", "Faster", "replay: double speed",
            priority=False),
    KeySpec("charts", "f9", "toggle_charts", "Charts",
            "charts: acceptance by depth, tokens per step, the budget's verify-cost curve"),
    KeySpec("quit", "ctrl+q", "quit", "Quit", "leave specchat", show=False),
)

KEY_IDS: frozenset[str] = frozenset(k.id for k in APP_KEYS)
DEFAULT_KEYS: dict[str, str] = {k.id: k.key for k in APP_KEYS}


@lru_cache(maxsize=1)
def _named_keys() -> frozenset[str]:
    """The keys Textual names (textual.keys.Keys without their modifiers: escape, f1..f24, up, pageup...)."""
    from textual.keys import KEY_ALIASES, Keys

    names = {k.value.rpartition("+")[2] for k in Keys} | set(KEY_ALIASES)
    return frozenset(n for n in names if not n.startswith("<"))


def is_key(key: str) -> bool:
    """True when Textual can bind ``key`` (``ctrl+q``, ``f8``, ``n``, ``plus``, ``shift+tab``...).

    Why: Textual takes any string as a binding and never fires it, so ``quit = "ctrl+banana"``
    replaced Ctrl+Q with a key no terminal sends. A character by name counts only when it is
    one a keyboard types (ASCII): ``banana`` names the emoji.
    """
    from textual.keys import REPLACED_KEYS, key_to_character

    *modifiers, base = key.strip().lower().split("+")
    if not base or any(m not in MODIFIERS for m in modifiers):
        return False
    if len(base) == 1 or base in _named_keys():
        return base.isprintable()
    character = key_to_character(REPLACED_KEYS.get(base, base))
    return character is not None and character.isascii() and character.isprintable()


def bad_keys(keys: str) -> list[str]:
    """The keys of a comma list (a ``[keys]`` value) that Textual cannot bind; [] when all are fine."""
    return [k for k in keys.split(",") if not is_key(k)]
