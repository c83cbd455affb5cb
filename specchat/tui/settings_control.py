"""The settings in force and the rules for changing them, shared by the app and the command palette.

Why its own class: the settings panel, the palette and teaching mode all change settings, and each
must see the same answer to "what is in force, what is pending, may this change now". The app
turns the answers into notifications and panel errors; nothing here imports Textual.

* ``settings`` (a :class:`~specchat.tui.pending.PendingChange`): its value is what the engine
  reported in force (Started / ConfigApplied), ``applied``; its pending change is what the user
  asked for and the engine accepted but has not applied yet (it applies at the next step boundary,
  or when the next answer starts), ``pending``;
* ``precision`` (a PendingChange too): the target's arithmetic, outside those settings: the host
  switches it between jobs (``Session.set_precision``, then the conversation read again), and each
  Started reports it;
* ``given``: the knobs the user set (on the command line, in a settings file, then here). A change
  of method keeps them and gives every other knob the new method's default (SpecConfig.with_method):
  switching to a block drafter drafts its chain unless a top-k was asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from engine.config import ConfigError, SpecConfig
from specchat.tui.host_api import Host
from specchat.tui.pending import PendingChange
from specchat.tui.settings_schema import (
    ENGINE_FIELDS,
    FIELDS,
    MODEL_FIELDS,
    UI_FIELDS,
    SettingField,
    applies,
    format_value,
    resolve_name,
    why_not,
)


class SettingsControl:
    """Engine settings as the engine reports them, and the one path by which the UI changes them."""

    def __init__(self, host: Host, config: SpecConfig, *, replay: bool,
                 ui_values: Callable[[], dict[str, Any]], precision: str = "exact",
                 given: Collection[str] | None = None) -> None:
        """``given``: the knobs the user set at launch (None: those ``config`` holds off its method's
        defaults, SpecConfig.chosen_knobs)."""
        self.host = host
        self.settings = PendingChange(config)
        self.given: frozenset[str] = frozenset(config.chosen_knobs() if given is None else given) - {"method"}
        self.precision = PendingChange(precision)
        self.methods: tuple[str, ...] = ()  # what the loaded session can run ("" until loaded)
        self.loaded = False
        self.replay = replay
        self._ui_values = ui_values
        self._restore_adaptive = False  # teaching turned adaptive drafting off; turn it back on after

    @property
    def applied(self) -> SpecConfig:
        """The settings the engine reported in force."""
        return self.settings.value

    @property
    def pending(self) -> SpecConfig | None:
        """The settings the engine accepted and will apply at its next step or answer."""
        return self.settings.pending

    @property
    def in_force(self) -> SpecConfig:
        """The settings the next answer will use: the pending ones if any."""
        return self.settings.wanted

    def current(self, name: str) -> Any:
        if FIELDS[name].scope == "ui":
            return self._ui_values()[name]
        if FIELDS[name].scope == "model":
            return self.precision.wanted
        return getattr(self.in_force, name)

    def ui_values(self) -> dict[str, Any]:
        return self._ui_values()

    def fields(self) -> list[SettingField]:
        """The settings that act on the method in force (knobs of other drafters are left out)."""
        method = self.applied.method
        return [f for f in (*ENGINE_FIELDS, *MODEL_FIELDS, *UI_FIELDS) if applies(f.name, method)]

    def field(self, name: str) -> SettingField:
        """The field a typed name means (aliases allowed); ConfigError names what was typed."""
        resolved = resolve_name(name)
        if resolved is None:
            raise ConfigError(f"unknown setting {name!r}")
        return FIELDS[resolved]

    def loaded_with(self, config: SpecConfig | None, methods: tuple[str, ...]) -> None:
        self.loaded = True
        if config is not None:
            self.settings.settle(config)
        self.methods = methods

    def change(self, name: str, value: Any, *, busy: bool) -> str:
        """Ask the engine for ``name = value``; returns what happened in one line ('' if nothing changed).

        Raises ConfigError, the old settings kept, when the change cannot be made here or the session
        refuses it."""
        if self.replay:
            raise ConfigError("replay: the settings are those recorded; no engine to change")
        if not self.loaded:
            raise ConfigError("the model is still loading")
        if FIELDS[name].scope == "model":
            return self._change_precision(value)
        base = self.in_force
        if not applies(name, base.method):
            raise ConfigError(f"{name} does nothing here: {why_not(name, base.method)}")
        if name == "method" and self.methods and value not in self.methods:
            raise ConfigError(f"method {value!r} cannot run in this session (have: {', '.join(self.methods)}; "
                              "EAGLE, Medusa and standalone need a draft: specchat run --draft PATH)")
        new = base.with_method(value, self.given) if name == "method" else base.replace(**{name: value})
        if new == base:
            self._set_by_user(name)
            return ""
        applied = self.host.update_config(new)
        self._set_by_user(name)
        what = f"{name} = {format_value(value)}"
        brought = [f"{k} {format_value(v)}" for k, v in new.to_dict().items()
                   if k != name and v != getattr(base, k)]
        more = f" (its defaults: {', '.join(brought)})" if brought else ""
        if applied:
            self.settings.ask(new)
            return f"{what} applied{more}"
        self.settings.hold(new)
        if self.pending is None:
            return ""
        when = "at the next step" if busy else "when the next answer starts"
        return f"{what} pending; applies {when}{more}"

    def _set_by_user(self, name: str) -> None:
        """``name`` was set here: a method switch keeps it (a value typed is the user's, equal to the
        default or not, as a flag given on the command line is)."""
        if name != "method":
            self.given |= {name}

    def _change_precision(self, value: str) -> str:
        if value == self.current("precision"):
            return ""
        if self.host.set_precision(value):
            self.precision.ask(value)
            return f"precision = {value} applied; the conversation is read again in it"
        self.precision.hold(value)
        return f"precision = {value} pending; applies when this job ends" if self.precision.pending else ""

    def job_done(self) -> None:
        """A job ended: a precision asked for while it ran is in force now (the host switches
        between jobs, so that a compare's two runs share one)."""
        self.precision.end()

    def reported(self, data: dict[str, Any], precision: str = "") -> bool:
        """The engine says these settings (and precision) are in force; True when that was the
        pending change of settings."""
        if precision:
            self.precision.settle(precision)
        try:
            cfg = SpecConfig.from_dict(data)
        except (ConfigError, TypeError):
            return False
        return self.settings.settle(cfg)

    def teaching(self, on: bool, *, busy: bool) -> None:
        """Teaching mode verifies the drafter's whole proposal (adaptive drafting off), so each step
        shows what the drafter guessed; the user's choice comes back when teaching ends."""
        current = self.in_force
        try:
            if on and current.adaptive_draft:
                self.change("adaptive_draft", False, busy=busy)
                self._restore_adaptive = True
            elif not on and self._restore_adaptive:
                self._restore_adaptive = False
                if not current.adaptive_draft:
                    self.change("adaptive_draft", True, busy=busy)
        except ConfigError:
            pass  # replay, or a session that refuses: teaching works with the settings as they are
