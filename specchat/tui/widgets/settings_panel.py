"""The settings panel, generated from the schema: edit a value, press Enter, it is hot-swapped.

Engine settings go through ``SpecConfig.replace`` (validation) and ``session.update_config``; a
refused value shows its one-line reason in the row and the field goes back to the value in force.
An accepted change is marked pending until the engine reports it applied (``ConfigApplied``).
"""

from __future__ import annotations

from typing import Any

from textual import on
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.widgets import Input, Label, Select, Static, Switch

from engine.config import SpecConfig
from specchat.tui.messages import ChangeSetting
from specchat.tui.settings_schema import (
    ENGINE_FIELDS,
    MODEL_FIELDS,
    UI_FIELDS,
    SettingField,
    applies,
    format_value,
    why_not,
)


class SettingsPanel(VerticalScroll):
    """The settings of the method in force as widgets; a change is posted as :class:`ChangeSetting`."""

    def __init__(self, themes: list[str], draft_model: str = "", id: str | None = None, blink: bool = True) -> None:
        super().__init__(id=id)
        self._blink = blink
        self._themes = themes
        self._draft_model = draft_model
        self._shown: dict[str, Any] = {}
        self._methods: tuple[str, ...] = ()
        self._method = ""

    def compose(self):
        yield Static("Settings · Enter applies · Esc closes", classes="panel-title")
        for field in (*ENGINE_FIELDS, *MODEL_FIELDS, *UI_FIELDS):
            with Horizontal(classes="setting-row", id=f"row-{field.name}"):
                yield Label(field.label, classes="setting-label")
                yield self._editor(field)
            yield Static("", id=f"status-{field.name}", classes="setting-status")
        with Horizontal(classes="setting-row"):
            yield Label("draft model", classes="setting-label")
            yield Label(self._draft_model or "(drafter's default)", id="draft-model", classes="setting-readonly")
        yield Static(Content("changing the draft model needs a restart"), classes="setting-note")

    def _editor(self, field: SettingField):
        wid = f"set-{field.name}"
        if field.kind == "bool":
            return Switch(id=wid)
        if field.kind == "choice":
            options = self._themes if field.name == "theme" else list(field.choices)
            return Select([(o, o) for o in options], id=wid, allow_blank=False, compact=True)
        editor = Input(id=wid, compact=True, select_on_focus=True)
        editor.cursor_blink = self._blink
        return editor

    # showing values ------------------------------------------------------------------------------
    def set_methods(self, methods: tuple[str, ...]) -> None:
        """Offer only the methods the session can build (no EAGLE without a draft model)."""
        if methods and methods != self._methods:
            self._methods = tuple(methods)
            select = self.query_one("#set-method", Select)
            with self.prevent(Select.Changed):
                select.set_options([(m, m) for m in methods])
            self._shown.pop("method", None)

    def show_values(self, applied: SpecConfig, pending: SpecConfig | None, ui: dict[str, Any]) -> None:
        current = pending or applied
        method_changed = current.method != self._method
        self._method = current.method
        for field in ENGINE_FIELDS:
            value = getattr(current, field.name)
            self._set_editor(field, value)
            status = self.query_one(f"#status-{field.name}", Static)
            usable = applies(field.name, current.method)
            row = self.query_one(f"#row-{field.name}")
            if row.has_class("-unused") == usable or method_changed:
                row.set_class(not usable, "-unused")
                self.query_one(f"#set-{field.name}").disabled = not usable
                status.set_class(not usable, "-unused")
                if not usable:
                    status.update(why_not(field.name, current.method))
                elif not status.has_class("-pending") and not status.has_class("-error"):
                    status.update("")
            if not usable:
                continue
            if pending is not None and getattr(pending, field.name) != getattr(applied, field.name):
                status.update(Content.assemble(
                    ("◌ pending", "bold"), f" (in force: {format_value(getattr(applied, field.name))})"))
                status.set_class(True, "-pending")
                status.set_class(False, "-error")
            elif status.has_class("-pending"):
                status.update("")
                status.set_class(False, "-pending")
        for field in (*MODEL_FIELDS, *UI_FIELDS):  # values the app keeps (precision: the settings control)
            self._set_editor(field, ui[field.name])

    def _set_editor(self, field: SettingField, value: Any) -> None:
        editor = self.query_one(f"#set-{field.name}")
        if self._shown.get(field.name) == value:
            return
        self._shown[field.name] = value
        if isinstance(editor, Input):
            if not editor.has_focus:
                editor.value = format_value(value)
        elif isinstance(editor, Switch):
            with self.prevent(Switch.Changed):
                editor.value = bool(value)
        elif isinstance(editor, Select):
            with self.prevent(Select.Changed):
                editor.value = value

    def show_error(self, name: str, message: str, value: Any) -> None:
        if not self.query(f"#status-{name}"):  # a palette-only setting (compare): the toast says it
            return
        status = self.query_one(f"#status-{name}", Static)
        status.update(Content.assemble(("✗ refused: ", "bold"), message))
        status.set_class(True, "-error")
        status.set_class(False, "-pending")
        self._shown.pop(name, None)
        editor = self.query_one(f"#set-{name}")
        if isinstance(editor, Input):
            # the value in force, selected: the next keystroke replaces it (never "3" + refused "7")
            editor.value = format_value(value)
            editor.select_all()
            self._shown[name] = value
        elif isinstance(editor, Select):
            with self.prevent(Select.Changed):
                editor.value = value
            self._shown[name] = value

    def clear_error(self, name: str) -> None:
        if not self.query(f"#status-{name}"):
            return
        status = self.query_one(f"#status-{name}", Static)
        if status.has_class("-error"):
            status.update("")
            status.set_class(False, "-error")

    # edits ---------------------------------------------------------------------------------------
    @on(Input.Submitted)
    def _input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        name = (event.input.id or "").removeprefix("set-")
        self._shown.pop(name, None)
        self.post_message(ChangeSetting(name, event.value))

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        event.stop()
        name = (event.select.id or "").removeprefix("set-")
        # ignore the value a Select reports when it is built, before show_values() ran
        if event.value is Select.NULL or name not in self._shown or self._shown[name] == event.value:
            return
        self.post_message(ChangeSetting(name, event.value))

    @on(Switch.Changed)
    def _switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        name = (event.switch.id or "").removeprefix("set-")
        if name not in self._shown or self._shown[name] == event.value:
            return
        self.post_message(ChangeSetting(name, event.value))
