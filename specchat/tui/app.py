"""The specchat Textual app.

Structure:

* A :class:`Host` (host_api.py: the engine in its own process, or on a thread) owns the session for
  the app's lifetime. The app submits jobs to it and never touches the session's generators.
* Items come back through the host's mailbox; an :class:`EngineWake` message tells the app to drain
  it (at the frame pace, pacing.py). ``_process`` routes records by lane: "chat" to the chat screen,
  "baseline"/"alt"/"spec" to the compare screen (compare_host.py; the speculative sides feed the tree history).
* Settings: :class:`SettingsControl` (settings_control.py) holds what is in force and pending and
  the rules for changing them; the app and the command palette both go through it.
* Screens and the palette talk to the app by message (messages.py), never by calling it; the app
  hands each screen its state as one :class:`AppStatus` value (app_status.py).
* Teaching mode and replay step-through both use the host's step gate.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Collection, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.filter import ANSIToTruecolor, LineFilter
from textual.screen import Screen

from engine.config import ConfigError, SpecConfig
from engine.errors import UserError
from engine.events import ConfigApplied, Finished, PrefillProgress, Started, Step
from specchat.themes import THEMES, VARIABLE_DEFAULTS, pick_theme, resolve_theme_name, theme_colours
from specchat.tui import host_api
from specchat.tui.app_status import AppStatus, precision_line, replay_line, status_line
from specchat.tui.commands import SYSTEM_COMMANDS, SettingsCommands, copy_launch_line
from specchat.tui.compare_host import CompareHost
from specchat.tui.engine_process import make_host
from specchat.tui.host_api import Delivery, GateWaiting, Host, JobDone, Loaded, LoadFailed, LoadProgress, SaveFailed
from specchat.tui.keys import APP_KEYS
from specchat.tui.messages import ChangeSetting, EngineWake, OpenSettings, StatusStale
from specchat.tui.pacing import FrameClock, FramePacer
from specchat.tui.screens.charts import ChartsHost
from specchat.tui.screens.chat import ChatScreen
from specchat.tui.screens.compare import CompareScreen
from specchat.tui.screens.dialogs import ConfirmScreen, SessionsScreen
from specchat.tui.screens.help import HelpScreen
from specchat.tui.screens.loading import LoadingScreen
from specchat.tui.sessions import (
    SavedSession,
    export_files,
    list_sessions,
    load_session,
    new_session_path,
    sessions_dir,
)
from specchat.tui.settings_control import SettingsControl
from specchat.tui.settings_schema import applies, format_value, parse_value
from specchat.tui.terminal import terminal_gone
from specchat.tui.trace import Record, ReplaySource, TraceError
from specchat.tui.userconfig import UISettings
from specchat.tui.widgets.prompt import PromptInput

# The UI drains the engine's mailbox at most this often, and less often when frames are expensive
# (see pacing.py): whatever arrived meanwhile is shown in one repaint, so a fast engine costs the UI
# (and the cores the engine needs) one frame, not one per token.
FRAME_S = 1 / 20
# How much lower than the engine's the event loop's CPU priority is (see host.lower_priority).
UI_NICE = int(os.environ.get("SPECCHAT_UI_NICE", "10"))


class SpecChatApp(ChartsHost, CompareHost, App[int]):
    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {SettingsCommands}
    BINDINGS: ClassVar = [
        Binding(k.key, k.action, k.description, show=k.show, priority=k.priority, id=k.id, tooltip=k.help)
        for k in APP_KEYS
    ]

    def __init__(
        self,
        *,
        factory: host_api.SessionFactory | None,
        config: SpecConfig,
        ui: UISettings | None = None,
        warnings: Sequence[str] = (),
        start_in: str = "chat",
        teach: bool = False,
        record: str | None = None,
        replay: ReplaySource | None = None,
        model_label: str = "",
        draft_model: str = "",
        serve_model: str = "",  # the model as the command line named it: launch lines name it so
        engine_process: bool = False,
        precision: str = "exact",
        given: Collection[str] | None = None,
    ) -> None:
        """``engine_process``: run the engine in its own process (engine_process.py); the factory must pickle.
        ``given``: the settings the user set on the command line, which a method switch keeps (None: those
        ``config`` holds off its method's defaults)."""
        super().__init__()
        self.ui = ui or UISettings()
        self._warnings = list(warnings)
        self.model_name = model_label
        self.draft_model, self.serve_model = draft_model, serve_model
        self.start_in = start_in
        self.teaching = teach or (replay is not None and replay.step)
        self.replay = replay
        self.replay_paused = False
        self.busy_job: int | None = None
        self.gate_waiting = False
        self.load_error = ""
        self.baseline_tps: float | None = None
        self.host: Host = make_host(factory, self._wake, process=engine_process, record_path=record,
                                    replay_speed=replay.speed if replay else 1.0,
                                    ui_thread=threading.get_native_id(), ui_nice=UI_NICE)
        # the engine's arithmetic (exact | fast) is the settings' too: the palette and F2 switch it
        self.settings_control = SettingsControl(self.host, config, replay=replay is not None,
                                                ui_values=self.ui_values, precision=precision, given=given)
        self.host.gate.set_stepping(self.teaching)
        self._stopping = False
        self.frames = 0  # engine output shown so far, in frames (tests check the UI keeps streaming)
        self.frame_clock = FrameClock(FramePacer(min_interval=FRAME_S), self.set_timer, self._drain)
        self.prefill: tuple[int, int] | None = None
        self._new_chat_when_done = False
        self._user_record = record is not None
        if record is None and replay is None and self.ui.save_sessions and factory is not None:
            record = str(new_session_path())
        self.host.record_path = record
        for theme in THEMES:
            self.register_theme(theme)
        name, warning = pick_theme(self.ui.theme, self.available_themes)
        self._warnings += [warning] if warning else []
        self.theme = name
        self.ui = self.ui.replace(theme=name)

    @property
    def applied_config(self) -> SpecConfig:
        """The settings the engine reported in force."""
        return self.settings_control.applied

    @property
    def pending_config(self) -> SpecConfig | None:
        """Settings the engine accepted and applies at the next step (or answer)."""
        return self.settings_control.pending

    @property
    def loaded(self) -> bool:
        return self.settings_control.loaded

    # set-up ----------------------------------------------------------------------------------------
    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's line filters without ``ANSIToTruecolor``.

        Why: that filter rebuilds every strip of every frame to turn ANSI colours into RGB, and our
        themes use none (only the command palette's ``dim`` help text passes through it, which a
        terminal draws dim by itself). At 120x40 on the 2-core dev VM it was a third of a frame's
        CPU (36 -> 23 ms per frame measured), and the UI's CPU is taken from the engine's threads.
        ``NO_COLOR``'s filter stays.
        """
        return [f for f in super().get_line_filters() if not isinstance(f, ANSIToTruecolor)]

    def on_mount(self) -> None:
        if self.ui.keymap:
            self.set_keymap(dict(self.ui.keymap))
        replay = self.replay is not None
        self.chat_screen = ChatScreen(themes=[t.name for t in THEMES], draft_model=self.draft_model,
                                      history=self.ui.tree_history, show_rejected=self.ui.show_rejected,
                                      blink=self.ui.cursor_blink, replay=replay)
        self.compare_screen = CompareScreen(show_rejected=self.ui.show_rejected, blink=self.ui.cursor_blink,
                                            replay=replay)
        self.install_screen(self.chat_screen, "chat")
        self.install_screen(self.compare_screen, "compare")
        what = f"replay of {self.replay.path}" if self.replay else (self.model_name or "the model")
        self.loading_screen = LoadingScreen(what)
        self.push_screen(self.loading_screen)
        for warning in self._warnings:
            self.notify(warning, severity="warning", timeout=8)
        self.run_worker(self.host.run, thread=True, group="engine", name="engine", exit_on_error=False)
        stdin = sys.__stdin__
        if not self.is_headless and stdin is not None and os.isatty(stdin.fileno()):
            self.set_interval(2.0, lambda: self.exit() if terminal_gone(stdin.fileno()) else None)

    def on_unmount(self) -> None:
        self.host.shutdown()

    def _wake(self) -> None:
        # called on the engine thread: post_message only queues (call_soon_threadsafe), never waits
        self.post_message(EngineWake())

    # engine items ------------------------------------------------------------------------------------
    def on_engine_wake(self, _: EngineWake) -> None:
        self.frame_clock.wake(urgent=self.host.mailbox.urgent)

    def _drain(self) -> None:
        if self._exit or self._closing:  # the engine may still report while the app closes its screens
            return
        self.frames += 1
        self.frame_clock.pacer.begin()
        self._process(self.host.drain())
        self.call_after_refresh(self.frame_clock.pacer.end)

    def _process(self, items: Sequence[host_api.Item]) -> None:
        """Show what the engine sent, in order; consecutive records of one lane go to their screen at once."""
        run_lane: str | None = None
        run: list[Record] = []

        def flush() -> None:
            if run and run_lane is not None:
                self._show(run_lane, list(run))
            run.clear()

        for item in items:
            if isinstance(item, Delivery):
                if item.lane != run_lane:
                    flush()
                    run_lane = item.lane
                self._track(item.lane, item.record)
                run.append(item.record)
                continue
            flush()
            if isinstance(item, LoadProgress):
                self.loading_screen.progress(item.stage, item.done, item.total)
            elif isinstance(item, Loaded):
                self._on_loaded(item)
            elif isinstance(item, LoadFailed):
                self.load_error = item.message
                self.loading_screen.failed(item.message)
            elif isinstance(item, JobDone):
                self._job_done(item)
            elif isinstance(item, GateWaiting):
                self.gate_waiting = True
            elif isinstance(item, SaveFailed):  # said once per file: the chat goes on, in memory
                self.notify(item.message(), title="Not saved", severity="warning", timeout=15)
        flush()
        self.refresh_status()

    def _show(self, lane: str, records: list[Record]) -> None:
        """Records to their screen: "chat" to the chat screen, "baseline" and "spec" to the compare screen."""
        if lane == "chat":
            self.chat_screen.show_records(records)
            return
        self.show_compare(lane, records)  # compare_host.py

    def _track(self, lane: str, record: Record) -> None:
        """Follow the settings in force (and the prefill) from what the engine reports."""
        self.charts.add(lane, record)
        if isinstance(record, Step):
            self.gate_waiting = False
            return
        if isinstance(record, PrefillProgress):
            self.prefill = (record.done, record.total)
            return
        if isinstance(record, (Started, Finished)):
            self.prefill = None
        in_force = lane == "chat" or (lane == "spec" and not self.ui.compare)  # not a compare's chosen method
        if isinstance(record, Started) and in_force and record.config:
            self.settings_control.reported(record.config, record.precision)
        elif isinstance(record, ConfigApplied) and self.settings_control.reported(record.config):
            self.notify(f"settings applied at the step boundary (v{record.version})", timeout=3)

    def _on_loaded(self, item: Loaded) -> None:
        if item.model_name:
            self.model_name = item.model_name
        self.settings_control.loaded_with(item.config, item.methods)
        if item.methods and self.chat_screen.ready:
            self.chat_screen.settings.set_methods(item.methods)
        self.check_compare()
        if self.teaching and self.replay is None:
            self.settings_control.teaching(True, busy=self.busy_job is not None)
        typed, send_it = self.loading_screen.typed()
        while len(self.screen_stack) > 2 and self.screen is not self.loading_screen:
            self.pop_screen()  # e.g. the help screen, opened while the model loaded
        self.switch_screen("chat")
        if self.replay is not None:
            self.model_name = self.replay.header.get("model", "") or "trace"
            self.busy_job = self.host.submit(host_api.ReplayJob(self.replay.records))
        elif self.start_in == "compare":
            self.switch_screen("compare")
        if typed.strip() and self.replay is None:
            self.call_after_refresh(self._carry_early_prompt, typed, send_it)

    def _carry_early_prompt(self, typed: str, send_it: bool) -> None:
        """What the user typed on the loading screen lands in the chat prompt (and is sent if asked)."""
        target = self.compare_screen if self.start_in == "compare" else self.chat_screen
        if not target.ready:
            self.call_after_refresh(self._carry_early_prompt, typed, send_it)
            return
        target.query_one(PromptInput).carry(typed, send=send_it)

    def _job_done(self, item: JobDone) -> None:
        self.settings_control.job_done()
        if item.job == self.busy_job:
            self.busy_job = None
            if self._new_chat_when_done:
                self._new_chat_when_done = False
                self.call_after_refresh(self._new_chat)
        self.gate_waiting = False
        if item.error:
            self.notify(f"{item.kind} failed: {item.error}", severity="error", timeout=10)
            self.chat_screen.transcript.add_note(f"error: {item.error}")
        if item.kind == "replay" and not item.error:
            self.notify("replay stopped" if self._stopping else "replay finished", timeout=4)
        self._stopping = False

    # the app's status: title bar, status, stats and teaching panels ------------------------------------
    def on_status_stale(self, _: StatusStale) -> None:
        self.refresh_status()

    def refresh_status(self) -> None:
        """Show the app's state (settings, status, replay, teaching) on the screens."""
        replay = self.replay is not None
        app_status = AppStatus(
            model=self.model_name, applied=self.applied_config, pending=self.pending_config,
            ui_values=self.ui_values(),
            status=status_line(busy=self.busy_job is not None and not replay, prefill=self.prefill,
                               waiting=self.gate_waiting),
            replay=replay_line(speed=self.host.replay_speed, paused=self.replay_paused,
                               stepping=self.teaching) if replay else "",
            context=self.chat_screen.context_line() if self.chat_screen.ready else "",
            precision=precision_line(self.settings_control.precision.value), stepping=self.host.gate.stepping,
            prefill=self.prefill, teaching=self.teaching, waiting=self.gate_waiting, replaying=replay,
        )
        for screen in (self.chat_screen, self.compare_screen):
            if screen.ready:
                screen.show_status(app_status)

    # prompts -------------------------------------------------------------------------------------------
    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        mode: Literal["chat", "compare"] = "compare" if event.prompt.id == "compare-prompt" else "chat"
        if self.submit_prompt(event.text, mode):
            event.prompt.load_text("")

    def submit_prompt(self, text: str, mode: Literal["chat", "compare"] = "chat") -> bool:
        if self.replay is not None:
            self.notify("replay: no model is loaded", severity="warning")
            return False
        if not self.loaded:
            self.notify("the model is still loading; your message is kept", severity="warning")
            return False
        if self.busy_job is not None:
            self.notify("still answering · Esc cancels", severity="warning")
            return False
        if mode == "compare":
            self.compare_screen.stepped = self.host.gate.stepping
        job = (host_api.CompareJob(text, self.compare_methods(), self.settings_control.given) if mode == "compare"
               else host_api.ChatJob(text))
        self.busy_job = self.host.submit(job)
        self.refresh_status()
        return True

    # settings ---------------------------------------------------------------------------------------
    def ui_values(self) -> dict[str, Any]:
        return {"show_rejected": self.ui.show_rejected, "theme": self.theme, "compare": self.ui.compare or "default",
                "precision": self.settings_control.current("precision")}

    def on_change_setting(self, event: ChangeSetting) -> None:
        self.apply_setting(event.name, event.value)

    def on_open_settings(self, event: OpenSettings) -> None:
        self.open_settings(event.field)

    def apply_setting(self, name: str, raw: Any, *, quiet: bool = False) -> str | None:
        """Validate and apply one setting; returns the refusal message (None when accepted)."""
        control = self.settings_control
        try:
            field = control.field(name)
        except ConfigError as exc:
            self.notify(str(exc), severity="error")
            return str(exc)
        try:
            value = parse_value(field, raw)
            if field.scope == "ui":
                self._apply_ui(field.name, value)
                note = ""
            else:
                note = control.change(field.name, value, busy=self.busy_job is not None)
        except ConfigError as exc:
            old = control.current(field.name)
            if self.chat_screen.ready:
                self.chat_screen.settings.show_error(field.name, str(exc), old)
            self.notify(f"refused: {exc} (kept {field.name} = {format_value(old)})", severity="error", timeout=6)
            return str(exc)
        if note and not quiet:
            self.notify(note, timeout=3)
        if self.chat_screen.ready:
            self.chat_screen.settings.clear_error(field.name)
        self.refresh_status()
        return None

    def _apply_ui(self, name: str, value: Any) -> None:
        if name == "theme":
            theme = resolve_theme_name(value)
            if theme not in self.available_themes:
                raise ConfigError(f"unknown theme {value!r}")
            self.theme = theme
            self.ui = self.ui.replace(theme=theme)
        elif name == "show_rejected":
            self.set_show_rejected(bool(value))
        elif name == "compare":
            self.set_compare(value)

    def set_show_rejected(self, on: bool) -> None:
        self.ui = self.ui.replace(show_rejected=on)
        self.chat_screen.set_show_rejected(on)
        self.compare_screen.set_show_rejected(on)

    def open_settings(self, focus: str | None = None) -> None:
        if self.screen is not self.chat_screen:
            if not self.chat_screen.ready or self.screen is self.loading_screen:
                return
            self.switch_screen("chat")
        if focus is not None and not applies(focus, self.settings_control.in_force.method):
            focus = "method"
        self.refresh_status()
        self.chat_screen.open_settings(focus, self.settings_control.methods)

    def watch_theme(self, theme: str) -> None:
        if hasattr(self, "chat_screen") and self.chat_screen.ready:
            self.refresh_status()

    # actions -----------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("toggle_compare", "toggle_settings"):
            # only between the two main screens (not over a dialog, not while loading)
            return self.screen in (getattr(self, "chat_screen", None), getattr(self, "compare_screen", None))
        if action.startswith("replay_"):
            return self.replay is not None
        if action == "new_chat":
            return self.replay is None
        return True

    def action_cancel(self) -> None:
        # Esc closes an open settings panel first (its title says so); a second Esc stops the answer
        if self.chat_screen.ready and self.chat_screen.settings_open and self.screen is self.chat_screen:
            self.chat_screen.close_settings()
            return
        if self.busy_job is not None:
            self.host.cancel()
            self._stopping = True
            self.notify("stopping at the next step (or prefill chunk)", timeout=2)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            keymap = {k.id: k.key for k in APP_KEYS} | dict(self.ui.keymap)
            self.push_screen(HelpScreen(keymap))

    def action_toggle_settings(self) -> None:
        if self.chat_screen.ready and self.chat_screen.settings_open and self.screen is self.chat_screen:
            self.chat_screen.close_settings()
        else:
            self.open_settings("num_steps")

    def action_toggle_compare(self) -> None:
        if not self.chat_screen.ready:
            return
        if self.chat_screen.settings_open:
            self.chat_screen.close_settings()
        self.switch_screen("chat" if self.screen is self.compare_screen else "compare")
        self.refresh_status()

    def action_toggle_teach(self) -> None:
        self.teaching = not self.teaching
        self.host.gate.set_stepping(self.teaching)
        if self.replay is None and self.loaded:
            self.settings_control.teaching(self.teaching, busy=self.busy_job is not None)
        if not self.teaching:
            self.gate_waiting = False
        if self.replay is not None:
            self.replay_paused = False
        self.notify("teaching mode: the engine pauses after every step (F8 next)" if self.teaching
                    else "teaching mode off", timeout=3)
        self.refresh_status()

    def action_toggle_rejected(self) -> None:
        self.set_show_rejected(not self.ui.show_rejected)
        self.notify(f"show rejected drafts: {'on' if self.ui.show_rejected else 'off'}", timeout=2)

    def action_prev_step(self) -> None:
        self.chat_screen.tree.browse(-1)

    def action_next_step(self) -> None:
        tree = self.chat_screen.tree
        if not tree.live:
            tree.browse(1)
        elif self.host.gate.stepping:
            self.gate_waiting = False
            self.host.gate.release()
        self.refresh_status()

    def action_new_chat(self) -> None:
        if self.busy_job is not None:
            self.push_screen(ConfirmScreen("An answer is still running. Stop it and start a new conversation?",
                                           yes="Stop and start anew"), self._confirmed_new_chat)
            return
        self._new_chat()

    def _confirmed_new_chat(self, yes: bool | None) -> None:
        if not yes:
            return
        if self.busy_job is None:
            self._new_chat()
            return
        self._new_chat_when_done = True  # _job_done starts it once the stopped answer is in
        self.host.cancel()

    def _new_chat(self) -> None:
        self.busy_job = self.host.submit(host_api.ResetJob())
        if not self._user_record and self.host.record_path is not None:
            self.host.set_record_path(str(new_session_path()))
        self.chat_screen.new_conversation()

    async def action_quit(self) -> None:
        if self.busy_job is not None and self.replay is None and self.loaded:
            self.push_screen(ConfirmScreen("An answer is still running. Quit anyway? (the conversation so far is "
                                           "saved)", yes="Quit"), self._confirmed_quit)
            return
        self.exit()

    def _confirmed_quit(self, yes: bool | None) -> None:
        if yes:
            self.host.cancel()
            self.exit()

    def action_toggle_panels(self) -> None:
        if self.chat_screen.ready:
            self.chat_screen.toggle_panels()

    # saved sessions and exports -----------------------------------------------------------------------
    async def action_open_sessions(self) -> None:
        if self.replay is not None or not self.loaded:
            self.notify("reopening needs a loaded model", severity="warning")
            return
        if self.busy_job is not None:
            self.notify("still answering · Esc stops it first", severity="warning")
            return
        current, screen = self.host.record_path, self.screen
        # read in a thread: the folder may hold big files, or a file on a stalled disk, and the UI must go on
        found = [s for s in await asyncio.to_thread(list_sessions) if str(s.path) != current]
        if self.busy_job is None and self.screen is screen:  # nothing started, no other screen opened meanwhile
            self.push_screen(SessionsScreen(found, str(sessions_dir())), self._reopen)

    def _reopen(self, saved: SavedSession | None) -> None:
        if saved is None:
            return
        try:
            trace = load_session(saved.path)
        except TraceError as exc:
            self.notify(f"cannot reopen: {exc}", severity="error", timeout=8)
            return
        if self.screen is not self.chat_screen:
            self.switch_screen("chat")
        self.chat_screen.new_conversation()
        # rewriting the file from the records read also drops the damaged lines from it
        self.host.set_record_path(str(saved.path), trace.records)
        self.busy_job = self.host.submit(host_api.RestoreJob(trace.records))
        self.notify(f"reopened {saved.path.name}: the conversation goes on from here", timeout=4)
        if trace.dropped:
            lines = f"{trace.dropped} damaged line{'s' if trace.dropped != 1 else ''}"
            self.notify(f"{saved.path.name}: {lines} left out (cut short while being written, e.g. by a crash); "
                        "every complete record was recovered", severity="warning", timeout=10)

    def action_export(self, what: str = "conversation") -> list[Path]:
        """Export the conversation (or the last answer) as Markdown, HTML and SVG with token colours."""
        turns = self.chat_screen.turns() if self.chat_screen.ready else []
        if not turns:
            self.notify("nothing to export yet", severity="warning")
            return []
        try:
            paths = export_files(turns[-1:] if what == "answer" else turns, theme_colours(self.current_theme),
                                 time.strftime(f"%Y-%m-%d_%H-%M-%S-{what}"), show_rejected=self.ui.show_rejected)
        except UserError as exc:  # a full disk, an exports folder that cannot be written: said, not a crash
            self.notify(f"not exported: {exc}", title="Export", severity="error", timeout=10)
            return []
        self.notify("exported: " + ", ".join(str(p) for p in paths), title="Export", timeout=10)
        return paths

    def action_replay_pause(self) -> None:
        self.replay_paused = not self.replay_paused
        self.host.gate.set_stepping(self.replay_paused or self.teaching)
        self.refresh_status()

    def action_replay_speed(self, factor: float) -> None:
        self.host.replay_speed = max(0.125, min(64.0, self.host.replay_speed * factor))
        self.refresh_status()

    def get_system_commands(self, screen: Screen) -> Any:
        yield from super().get_system_commands(screen)
        for title, help_text, action in SYSTEM_COMMANDS:
            yield SystemCommand(title, help_text, partial(self.run_action, action))
        for theme in THEMES:
            yield SystemCommand(f"Theme: {theme.name}", "Switch colours",
                                partial(self.apply_setting, "theme", theme.name))

    def action_copy_launch(self, server: str) -> None:
        copy_launch_line(self, server, self.applied_config)
