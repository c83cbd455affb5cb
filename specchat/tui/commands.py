"""Command palette: type a setting and a value ("num_steps 3", "topk=2", "method ngram")."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from specchat.tui.settings_schema import (
    ENGINE_FIELDS,
    FIELDS,
    UI_FIELDS,
    applies,
    example_value,
    format_value,
    resolve_name,
)

if TYPE_CHECKING:
    from specchat.tui.app import SpecChatApp


class SettingsCommands(Provider):
    """Context-aware: offers 'set NAME = VALUE' for what was typed, and the current values."""

    @property
    def _app(self) -> SpecChatApp:
        return cast("SpecChatApp", self.app)

    def _current(self, name: str) -> object:
        app = self._app
        if FIELDS[name].scope == "ui":
            return app.ui_values()[name]
        return getattr(app.pending_config or app.applied_config, name)

    def _fields(self):
        """The settings that act on the method in force (knobs of other drafters are left out)."""
        method = self._app.applied_config.method
        return [f for f in (*ENGINE_FIELDS, *UI_FIELDS) if applies(f.name, method)]

    async def discover(self) -> Hits:
        for field in self._fields()[:6]:
            current = self._current(field.name)
            yield DiscoveryHit(
                f"{field.name} = {format_value(current)}",
                partial(self._app.open_settings, field.name),
                help=f"{field.help} — type e.g. '{field.name} {example_value(field, current)}' to change",
            )

    async def search(self, query: str) -> Hits:
        text = query.replace("=", " ").split()
        if len(text) >= 2:
            name = resolve_name(text[0])
            if name is not None:
                value = " ".join(text[1:])
                yield Hit(
                    1.0,
                    f"Set {name} = {value}",
                    partial(self._app.apply_setting, name, value),
                    text=f"Set {name} = {value}",
                    help=f"now {format_value(self._current(name))}; {FIELDS[name].help}",
                )
                return
        matcher = self.matcher(query)
        for field in self._fields():
            current = self._current(field.name)
            label = f"{field.name} = {format_value(current)}"
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._app.open_settings, field.name), text=label,
                          help=f"{field.help} — type e.g. '{field.name} {example_value(field, current)}' to change")
