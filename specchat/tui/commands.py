"""Command palette: type a setting and a value ("num_steps 3", "topk=2", "method ngram").

The provider reads the settings from the app's :class:`SettingsControl` and asks for changes by
message, so it needs nothing else of the app (and does not import it).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.message import Message

from specchat.export import SERVERS
from specchat.tui.messages import ChangeSetting, OpenSettings
from specchat.tui.settings_control import SettingsControl
from specchat.tui.settings_schema import FIELDS, SettingField, example_value, format_value, resolve_name

if TYPE_CHECKING:
    from engine.config import SpecConfig

# The app's own palette entries: (title, help, action run by ``App.run_action``).
SYSTEM_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("Settings", "Open the settings panel (hot-swap tree knobs)", "toggle_settings"),
    ("Compare mode", "Two methods side by side (type 'compare medusa,eagle3' to choose them)", "toggle_compare"),
    ("Teaching mode", "Pause after every step and explain it", "toggle_teach"),
    ("Show/hide rejected drafts", "Struck-through refused drafts in the stream", "toggle_rejected"),
    ("Help: how speculative decoding works", "Draft, verify, accept, bonus, tau, knobs", "help"),
    *((f"Copy {shown} launch line", f"The settings in force as a {shown} launch line, to the clipboard",
       f"copy_launch('{server}')") for server, shown in SERVERS.items()),
    ("Side panels", "Show / hide the draft tree and stats (F6)", "toggle_panels"),
    ("Charts", "Acceptance by depth, tokens per step, the learned verify cost (F9)", "toggle_charts"),
    ("Reopen a saved conversation", "Conversations are saved as you go (Ctrl+O)", "open_sessions"),
    ("Export conversation", "Markdown, plus HTML and SVG with the token colours (Ctrl+E)",
     "export('conversation')"),
    ("Export last answer", "Markdown, plus HTML and SVG with the token colours", "export('answer')"),
)


class CopiesLines(Protocol):
    """What copying a launch line needs of the app: its model, its draft, the clipboard, a toast."""

    serve_model: str  # as named on the command line ("" for the embedded model)
    draft_model: str

    def copy_to_clipboard(self, text: str) -> None: ...

    def notify(self, message: str, *, title: str = "", timeout: float | None = None, markup: bool = True) -> None: ...


def copy_launch_line(app: CopiesLines, server: str, config: SpecConfig) -> str:
    """Copy the launch line of ``server`` (a key of SERVERS) for ``config`` and show it, with what does
    not carry over (a terminal without clipboard support still shows the line to select)."""
    from specchat.export import launch_line

    line = launch_line(server, config, app.serve_model or None, app.draft_model or None)
    app.copy_to_clipboard(line.command)
    notes = "".join(f"\n· {note}" for note in line.notes)
    app.notify(f"{line.command}{notes}", title=f"{line.server} launch line (copied)", timeout=30, markup=False)
    return line.command


class HasSettings(Protocol):
    """What the palette needs of its app."""

    settings_control: SettingsControl

    def post_message(self, message: Message) -> bool: ...


class SettingsCommands(Provider):
    """Context-aware: offers 'set NAME = VALUE' for what was typed, and the current values."""

    @property
    def _owner(self) -> HasSettings:
        return cast(HasSettings, self.app)

    @property
    def _control(self) -> SettingsControl:
        return self._owner.settings_control

    def _fields(self) -> list[SettingField]:
        return self._control.fields()

    def _open(self, name: str) -> None:
        self._owner.post_message(OpenSettings(name))

    def _set(self, name: str, value: str) -> None:
        self._owner.post_message(ChangeSetting(name, value))

    def _hint(self, field: SettingField, current: object) -> str:
        return f"{field.help} — type e.g. '{field.name} {example_value(field, current)}' to change"

    async def discover(self) -> Hits:
        for field in self._fields()[:6]:
            current = self._control.current(field.name)
            yield DiscoveryHit(f"{field.name} = {format_value(current)}", partial(self._open, field.name),
                               help=self._hint(field, current))

    async def search(self, query: str) -> Hits:
        text = query.replace("=", " ").split()
        if len(text) >= 2:
            name = resolve_name(text[0])
            if name is not None:
                value = " ".join(text[1:])
                yield Hit(
                    1.0,
                    f"Set {name} = {value}",
                    partial(self._set, name, value),
                    text=f"Set {name} = {value}",
                    help=f"now {format_value(self._control.current(name))}; {FIELDS[name].help}",
                )
                return
        matcher = self.matcher(query)
        for field in self._fields():
            current = self._control.current(field.name)
            label = f"{field.name} = {format_value(current)}"
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._open, field.name), text=label,
                          help=self._hint(field, current))
