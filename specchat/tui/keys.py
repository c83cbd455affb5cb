"""Key bindings: one table, each binding with an id that users can remap in the config file.

    [keys]
    next-step = "f8,n"
    settings = "ctrl+s"

Textual applies the remapping through ``App.set_keymap`` (binding id -> keys).
"""

from __future__ import annotations

from dataclasses import dataclass


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
