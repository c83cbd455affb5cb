"""The specchat Textual app.

Structure:

* :class:`EngineHost` (host.py) runs on one thread worker for the app's lifetime and owns the
  session. The app submits jobs to it and never touches the session's generators.
* Items come back through the host's mailbox; a single :class:`EngineWake` message tells the app
  to drain it. ``_process`` routes records by lane: "chat" to the chat screen, "baseline"/"spec"
  to the compare screen (the speculative side also feeds the tree history).
* Settings: ``applied_config`` is what the engine reported in force (Started / ConfigApplied),
  ``pending_config`` what the user asked for and the engine accepted but has not applied yet.
* Teaching mode and replay step-through both use the host's step gate.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.filter import ANSIToTruecolor, LineFilter
from textual.message import Message
from textual.screen import Screen

from engine.config import ConfigError, SpecConfig
from engine.events import ConfigApplied, Finished, PrefillProgress, Started, Step
from engine.trace import Record, UserTurn
from specchat.themes import THEMES, VARIABLE_DEFAULTS, resolve_theme_name
from specchat.tui.commands import SettingsCommands
from specchat.tui.engine_process import ProcessHost
from specchat.tui.host import (
    Delivery,
    EngineHost,
    GateWaiting,
    Item,
    JobDone,
    Loaded,
    LoadFailed,
    LoadProgress,
    SessionFactory,
)
from specchat.tui.keys import APP_KEYS
from specchat.tui.pacing import FramePacer
from specchat.tui.screens.chat import ChatScreen
from specchat.tui.screens.compare import CompareScreen
from specchat.tui.screens.dialogs import ConfirmScreen, SessionsScreen
from specchat.tui.screens.help import HelpScreen
from specchat.tui.screens.loading import LoadingScreen
from specchat.tui.settings_schema import FIELDS, applies, format_value, parse_value, resolve_name, why_not
from specchat.tui.terminal import terminal_gone
from specchat.tui.userconfig import UISettings
from specchat.tui.widgets.draft_tree import DraftTreePanel, HistoryEntry
from specchat.tui.widgets.prompt import PromptInput
from specchat.tui.widgets.settings_panel import SettingsPanel
from specchat.tui.widgets.title_bar import TitleBar


class EngineWake(Message):
    """Something is waiting in the engine host's mailbox."""


# The UI drains the engine's mailbox at most this often, and less often when frames are expensive
# (see pacing.py): whatever arrived meanwhile is shown in one repaint, so a fast engine costs the UI
# (and the cores the engine needs) one frame, not one per token.
FRAME_S = 1 / 20
# How much lower than the engine's the event loop's CPU priority is (see host.lower_priority).
UI_NICE = int(os.environ.get("SPECCHAT_UI_NICE", "10"))
NARROW = 100  # columns below which the side panels collapse (F6 shows them, stacked)


@dataclass(frozen=True)
class ReplaySource:
    path: str
    header: dict[str, Any]
    records: tuple[Record, ...]
    speed: float = 1.0
    step: bool = False


class SpecChatApp(App[int]):
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
        factory: SessionFactory | None,
        config: SpecConfig,
        ui: UISettings | None = None,
        warnings: Sequence[str] = (),
        start_in: str = "chat",
        teach: bool = False,
        record: str | None = None,
        replay: ReplaySource | None = None,
        model_label: str = "",
        draft_model: str = "",
        engine_process: bool = False,
        precision: str = "exact",
    ) -> None:
        """``engine_process``: run the engine in its own process (engine_process.py); the factory must pickle."""
        super().__init__()
        self.ui = ui or UISettings()
        self._warnings = list(warnings)
        self.applied_config = config
        self.pending_config: SpecConfig | None = None
        self.model_name = model_label
        self.precision = precision  # the engine's arithmetic (exact | fast), fixed for the app's life
        self.draft_model = draft_model
        self.start_in = start_in
        self.teaching = teach or (replay is not None and replay.step)
        self.replay = replay
        self.replay_paused = False
        self.busy_job: int | None = None
        self.gate_waiting = False
        self.loaded = False
        self.load_error = ""
        self.baseline_tps: float | None = None
        # the event loop yields the CPU to an engine process (see host.lower_priority); a thread host
        # (replays, scripted tests, SPECCHAT_ENGINE_PROCESS=0 for debugging) keeps its priority, so a
        # test process or a replay is not left with a lowered priority for no engine
        process = engine_process and factory is not None
        self.host: EngineHost | ProcessHost = (ProcessHost if process else EngineHost)(
            factory, self._wake, record_path=record, replay_speed=replay.speed if replay else 1.0,  # type: ignore[arg-type]
            ui_thread=threading.get_native_id(), ui_nice=UI_NICE if process else 0)
        self.host.gate.set_stepping(self.teaching)
        self._stopping = False
        self._backlog: list[tuple[str, list[Record]]] = []
        self.pacer = FramePacer(min_interval=FRAME_S)
        self.frames = 0  # engine output shown so far, in frames (tests check the UI keeps streaming)
        self._drain_timer = None
        self.methods: tuple[str, ...] = ()
        self.prefill: tuple[int, int] | None = None
        self._teach_restore_adaptive = False
        self._new_chat_when_done = False
        self._user_record = record is not None
        if record is None and replay is None and self.ui.save_sessions and factory is not None:
            from specchat.tui.sessions import new_session_path

            record = str(new_session_path())
        self.host.record_path = record
        for theme in THEMES:
            self.register_theme(theme)
        name = resolve_theme_name(self.ui.theme)
        if name not in self.available_themes:
            self._warnings.append(f"unknown theme {self.ui.theme!r}; using {resolve_theme_name(None)}")
            name = resolve_theme_name(None)
        self.theme = name
        self.ui = self.ui.replace(theme=name)

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
        themes = [t.name for t in THEMES]
        self.chat_screen = ChatScreen(
            themes=themes, draft_model=self.draft_model, history=self.ui.tree_history,
            show_rejected=self.ui.show_rejected, blink=self.ui.cursor_blink, replay=self.replay is not None,
        )
        self.compare_screen = CompareScreen(
            show_rejected=self.ui.show_rejected, blink=self.ui.cursor_blink, replay=self.replay is not None
        )
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
        wait = 0.0 if self.host.mailbox.urgent else self.pacer.wait()
        if wait > 0:
            if self._drain_timer is None:
                self._drain_timer = self.set_timer(wait, self._drain_on_time)
            return
        if self._drain_timer is not None:  # an urgent item overtakes the frame pacing
            self._drain_timer.stop()
            self._drain_timer = None
        self._drain()

    def _drain_on_time(self) -> None:
        self._drain_timer = None
        self._drain()

    def _drain(self) -> None:
        if self._exit or self._closing:  # the engine may still report while the app closes its screens
            return
        self.frames += 1
        self.pacer.begin()
        self._process(self.host.drain())
        self.call_after_refresh(self.pacer.end)

    def _process(self, items: Sequence[Item]) -> None:
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
        flush()
        self._refresh_chrome()

    def _show(self, lane: str, records: list[Record]) -> None:
        if self.replay is not None and lane != "chat" and any(isinstance(r, UserTurn) for r in records) and \
                self.screen is self.chat_screen:
            self.switch_screen("compare")
        screen = self.chat_screen if lane == "chat" else self.compare_screen
        if not screen.ready or self._backlog:
            # a screen that is not composed yet gets its records when it is (order kept)
            self._backlog.append((lane, records))
            self.call_after_refresh(self._flush_backlog)
            return
        self._show_now(lane, records)

    def _flush_backlog(self) -> None:
        while self._backlog:
            lane, records = self._backlog[0]
            screen = self.chat_screen if lane == "chat" else self.compare_screen
            if not screen.ready:
                self.call_after_refresh(self._flush_backlog)
                return
            self._backlog.pop(0)
            self._show_now(lane, records)
        self._refresh_chrome()

    def _show_now(self, lane: str, records: list[Record]) -> None:
        if lane == "chat":
            self.chat_screen.show_records(records)
            return
        self.compare_screen.show_records(lane, records)
        if lane == "spec":
            method = self.applied_config.method
            entries = [HistoryEntry("compare", method, r) for r in records if isinstance(r, Step)]
            if entries and self.chat_screen.ready:
                self.chat_screen.add_spec_steps(entries)
        if lane == "baseline":
            fin = next((r for r in records if isinstance(r, Finished)), None)
            if fin is not None and fin.reason == "stop" and fin.stats.tokens_per_s and \
                    not self.compare_screen.stepped:
                self.baseline_tps = fin.stats.tokens_per_s
                if self.chat_screen.ready:
                    self.chat_screen.stats.state.baseline_tps = self.baseline_tps
                    self.chat_screen.stats.refresh(layout=True)

    def _track(self, lane: str, record: Record) -> None:
        """Follow the settings in force (and the prefill) from what the engine reports."""
        if isinstance(record, Step):
            self.gate_waiting = False
            return
        if isinstance(record, PrefillProgress):
            self.prefill = (record.done, record.total)
            return
        if isinstance(record, (Started, Finished)):
            self.prefill = None
        if isinstance(record, Started) and lane != "baseline" and record.config:
            self._applied(record.config, announce=False)
        elif isinstance(record, ConfigApplied):
            self._applied(record.config, announce=True, version=record.version)

    def _applied(self, data: dict[str, Any], *, announce: bool, version: int = 0) -> None:
        try:
            cfg = SpecConfig.from_dict(data)
        except (ConfigError, TypeError):
            return
        self.applied_config = cfg
        if self.pending_config is not None and self.pending_config == cfg:
            self.pending_config = None
            if announce:
                self.notify(f"settings applied at the step boundary (v{version})", timeout=3)

    def _on_loaded(self, item: Loaded) -> None:
        self.loaded = True
        if item.model_name:
            self.model_name = item.model_name
        if item.config is not None:
            self.applied_config = item.config
        self.methods = item.methods
        if self.methods and self.chat_screen.ready:
            self.chat_screen.settings.set_methods(self.methods)
        if self.teaching and self.replay is None:
            self._teaching_drafts(True)
        typed, send_it = self.loading_screen.typed()
        while len(self.screen_stack) > 2 and self.screen is not self.loading_screen:
            self.pop_screen()  # e.g. the help screen, opened while the model loaded
        self.switch_screen("chat")
        if self.replay is not None:
            self.model_name = self.replay.header.get("model", "") or "trace"
            self.busy_job = self.host.submit("replay", records=self.replay.records)
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
        prompt = target.query_one(PromptInput)
        if send_it and self.submit_prompt(typed.strip("\n"), "compare" if target is self.compare_screen else "chat"):
            return
        prompt.load_text(typed)
        prompt.move_cursor(prompt.document.end)

    def _job_done(self, item: JobDone) -> None:
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

    def refresh_chrome(self) -> None:
        self._refresh_chrome()

    def _refresh_chrome(self) -> None:
        replay = ""
        if self.replay is not None:
            state = "paused" if self.replay_paused else ("step-through" if self.teaching else "▶")
            replay = f"REPLAY ×{self.host.replay_speed:g} {state}"
        status = "answering… Esc stops" if self.busy_job is not None and self.replay is None else ""
        if self.prefill is not None:
            status = f"reading the prompt {self.prefill[0]:,}/{self.prefill[1]:,} · Esc stops"
        if self.gate_waiting:
            status = "‖ paused · F8 next step"
        context = ""
        if self.chat_screen.ready:
            st = self.chat_screen.stats.state
            if st.context_limit:
                context = f"ctx {st.context_used:,}/{st.context_limit:,}"
        precision = "" if self.precision == "exact" else f"{self.precision} precision"
        for screen in (self.chat_screen, self.compare_screen):
            if screen.ready:
                screen.query_one(TitleBar).show(model=self.model_name, applied=self.applied_config,
                                                pending=self.pending_config, status=status, replay=replay,
                                                context=context, precision=precision)
        if self.chat_screen.ready:
            stats = self.chat_screen.stats
            if stats.state.stepping != self.host.gate.stepping or stats.state.prefill != self.prefill:
                stats.state.stepping = self.host.gate.stepping
                stats.state.prefill = self.prefill
                stats.refresh(layout=True)
            settings = self.chat_screen.settings
            if settings.display:
                settings.show_values(self.applied_config, self.pending_config, self.ui_values())
            self.chat_screen.show_teaching(self.teaching, waiting=self.gate_waiting, replay=self.replay is not None)

    def on_draft_tree_panel_browsed(self, _: DraftTreePanel.Browsed) -> None:
        if self.teaching:
            self.chat_screen.show_teaching(True, waiting=self.gate_waiting, replay=self.replay is not None)

    # prompts -------------------------------------------------------------------------------------------
    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        mode = "compare" if event.prompt.id == "compare-prompt" else "chat"
        if self.submit_prompt(event.text, mode):
            event.prompt.load_text("")

    def submit_prompt(self, text: str, mode: str = "chat") -> bool:
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
        self.busy_job = self.host.submit(mode, text)
        self._refresh_chrome()
        return True

    # settings ---------------------------------------------------------------------------------------
    def ui_values(self) -> dict[str, Any]:
        return {"show_rejected": self.ui.show_rejected, "theme": self.theme}

    def on_settings_panel_change(self, event: SettingsPanel.Change) -> None:
        self.apply_setting(event.name, event.value)

    def apply_setting(self, name: str, raw: Any, *, quiet: bool = False) -> str | None:
        """Validate and apply one setting; returns the refusal message (None when accepted)."""
        resolved = resolve_name(name)
        if resolved is None:
            self.notify(f"unknown setting {name!r}", severity="error")
            return f"unknown setting {name!r}"
        name = resolved
        field = FIELDS[name]
        try:
            value = parse_value(field, raw)
            if field.scope == "ui":
                self._apply_ui(name, value)
            else:
                self._apply_engine(name, value, quiet=quiet)
        except ConfigError as exc:
            message = str(exc)
            old = self.ui_values()[name] if field.scope == "ui" else getattr(
                self.pending_config or self.applied_config, name)
            if self.chat_screen.ready:
                self.chat_screen.settings.show_error(name, message, old)
            self.notify(f"refused: {message} (kept {name} = {format_value(old)})", severity="error", timeout=6)
            return message
        if self.chat_screen.ready:
            self.chat_screen.settings.clear_error(name)
        self._refresh_chrome()
        return None

    def _apply_engine(self, name: str, value: Any, *, quiet: bool = False) -> None:
        if self.replay is not None:
            raise ConfigError("replay: the settings are those recorded; no engine to change")
        if not self.loaded:
            raise ConfigError("the model is still loading")
        base = self.pending_config or self.applied_config
        if not applies(name, base.method):
            raise ConfigError(f"{name} does nothing here: {why_not(name, base.method)}")
        if name == "method" and self.methods and value not in self.methods:
            raise ConfigError(f"method {value!r} cannot run in this session (have: {', '.join(self.methods)}; "
                              "EAGLE and standalone need a draft model: specchat run --draft PATH)")
        new = base.replace(**{name: value})
        if new == base:
            return
        self.host.update_config(new)  # raises ConfigError if the session refuses; old settings stay
        session = self.host.session
        if session.pending_config is None and session.config == new:
            # an idle session applies at once (no event comes for it)
            self.applied_config, self.pending_config = new, None
            if not quiet:
                self.notify(f"{name} = {format_value(value)} applied", timeout=3)
            return
        self.pending_config = None if new == self.applied_config else new
        if self.pending_config is not None and not quiet:
            when = "at the next step" if self.busy_job is not None else "when the next answer starts"
            self.notify(f"{name} = {format_value(value)} pending; applies {when}", timeout=3)

    def _apply_ui(self, name: str, value: Any) -> None:
        if name == "theme":
            theme = resolve_theme_name(value)
            if theme not in self.available_themes:
                raise ConfigError(f"unknown theme {value!r}")
            self.theme = theme
            self.ui = self.ui.replace(theme=theme)
        elif name == "show_rejected":
            self.set_show_rejected(bool(value))

    def set_show_rejected(self, on: bool) -> None:
        self.ui = self.ui.replace(show_rejected=on)
        self.chat_screen.set_show_rejected(on)
        self.compare_screen.set_show_rejected(on)

    def open_settings(self, focus: str | None = None) -> None:
        if self.screen is not self.chat_screen:
            if not self.chat_screen.ready or self.screen in (self.loading_screen,):
                return
            self.switch_screen("chat")
        self.chat_screen.set_class(True, "-settings")
        if self.methods:
            self.chat_screen.settings.set_methods(self.methods)
        if focus is not None and not applies(focus, (self.pending_config or self.applied_config).method):
            focus = "method"
        settings = self.chat_screen.settings
        settings.show_values(self.applied_config, self.pending_config, self.ui_values())
        if focus:
            self.call_after_refresh(lambda: settings.query_one(f"#set-{focus}").focus())

    def close_settings(self) -> None:
        self.chat_screen.set_class(False, "-settings")
        if self.screen is self.chat_screen:
            prompt = self.chat_screen.prompt
            if not prompt.disabled:
                prompt.focus()

    def watch_theme(self, theme: str) -> None:
        if hasattr(self, "chat_screen") and self.chat_screen.ready:
            self._refresh_chrome()

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
        if self.chat_screen.ready and self.chat_screen.has_class("-settings") and self.screen is self.chat_screen:
            self.close_settings()
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
        if self.chat_screen.ready and self.chat_screen.has_class("-settings") and \
                self.screen is self.chat_screen:
            self.close_settings()
        else:
            self.open_settings("num_steps")

    def action_toggle_compare(self) -> None:
        if not self.chat_screen.ready:
            return
        if self.chat_screen.has_class("-settings"):
            self.close_settings()
        self.switch_screen("chat" if self.screen is self.compare_screen else "compare")
        self._refresh_chrome()

    def _teaching_drafts(self, on: bool) -> None:
        """Teaching mode verifies the drafter's whole proposal (adaptive drafting off), so each step
        shows what the drafter guessed; the user's choice comes back when teaching ends."""
        current = self.pending_config or self.applied_config
        if on and current.adaptive_draft:
            if self.apply_setting("adaptive_draft", False, quiet=True) is None:
                self._teach_restore_adaptive = True
        elif not on and self._teach_restore_adaptive:
            self._teach_restore_adaptive = False
            if not current.adaptive_draft:
                self.apply_setting("adaptive_draft", True, quiet=True)

    def action_toggle_teach(self) -> None:
        self.teaching = not self.teaching
        self.host.gate.set_stepping(self.teaching)
        if self.replay is None and self.loaded:
            self._teaching_drafts(self.teaching)
        if self.teaching and self.chat_screen.ready and self.size.width < NARROW:
            self.chat_screen.set_class(True, "-side-open")
        if not self.teaching:
            self.gate_waiting = False
        if self.replay is not None:
            self.replay_paused = False
        self.notify("teaching mode: the engine pauses after every step (F8 next)" if self.teaching
                    else "teaching mode off", timeout=3)
        self._refresh_chrome()

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
        self._refresh_chrome()

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
        self.busy_job = self.host.submit("reset")
        if not self._user_record and self.host.record_path is not None:
            from specchat.tui.sessions import new_session_path

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
        """Side panels: hidden by default below NARROW columns (F6 stacks them under the chat)."""
        if not self.chat_screen.ready:
            return
        screen = self.chat_screen
        if screen.has_class("-narrow"):
            screen.set_class(not screen.has_class("-side-open"), "-side-open")
        else:
            screen.set_class(not screen.has_class("-side-closed"), "-side-closed")

    # saved sessions and exports -----------------------------------------------------------------------
    def action_open_sessions(self) -> None:
        from specchat.tui.sessions import list_sessions, sessions_dir

        if self.replay is not None or not self.loaded:
            self.notify("reopening needs a loaded model", severity="warning")
            return
        if self.busy_job is not None:
            self.notify("still answering · Esc stops it first", severity="warning")
            return
        current = self.host.record_path
        found = [s for s in list_sessions() if str(s.path) != current]
        self.push_screen(SessionsScreen(found, str(sessions_dir())), self._reopen)

    def _reopen(self, saved) -> None:
        from specchat.tui.sessions import TraceError, load_session

        if saved is None:
            return
        try:
            records = load_session(saved.path)
        except TraceError as exc:
            self.notify(f"cannot reopen: {exc}", severity="error", timeout=8)
            return
        if self.screen is not self.chat_screen:
            self.switch_screen("chat")
        self.chat_screen.new_conversation()
        self.host.set_record_path(str(saved.path), records)
        self.busy_job = self.host.submit("restore", records=records)
        self.notify(f"reopened {saved.path.name}: the conversation goes on from here", timeout=4)

    def theme_colours(self) -> dict[str, str]:
        theme = self.current_theme
        variables = {**VARIABLE_DEFAULTS, **theme.variables}
        return {**variables, "foreground": theme.foreground or "#D0D7DE",
                "background": theme.background or "#000000"}

    def action_export(self, what: str = "conversation") -> list[Path]:
        """Export the conversation (or the last answer) as Markdown, HTML and SVG with token colours."""
        from specchat.tui.sessions import export_files

        turns = self.chat_screen.turns() if self.chat_screen.ready else []
        if not turns:
            self.notify("nothing to export yet", severity="warning")
            return []
        if what == "answer":
            turns = turns[-1:]
        stem = time.strftime(f"%Y-%m-%d_%H-%M-%S-{what}")
        paths = export_files(turns, self.theme_colours(), stem, show_rejected=self.ui.show_rejected)
        self.notify("exported: " + ", ".join(str(p) for p in paths), title="Export", timeout=10)
        return paths

    def action_replay_pause(self) -> None:
        self.replay_paused = not self.replay_paused
        self.host.gate.set_stepping(self.replay_paused or self.teaching)
        self._refresh_chrome()

    def action_replay_speed(self, factor: float) -> None:
        self.host.replay_speed = max(0.125, min(64.0, self.host.replay_speed * factor))
        self._refresh_chrome()

    def get_system_commands(self, screen: Screen) -> Any:
        yield from super().get_system_commands(screen)
        commands: list[tuple[str, str, Callable[[], object]]] = [
            ("Settings", "Open the settings panel (hot-swap tree knobs)", self.action_toggle_settings),
            ("Compare mode", "Baseline and speculative side by side", self.action_toggle_compare),
            ("Teaching mode", "Pause after every step and explain it", self.action_toggle_teach),
            ("Show/hide rejected drafts", "Struck-through refused drafts in the stream",
             self.action_toggle_rejected),
            ("Help: how speculative decoding works", "Draft, verify, accept, bonus, tau, knobs", self.action_help),
            ("SGLang launch flags", "The settings in force, as SGLang server arguments", self.show_sglang_args),
            ("Side panels", "Show / hide the draft tree and stats (F6)", self.action_toggle_panels),
            ("Reopen a saved conversation", "Conversations are saved as you go (Ctrl+O)",
             self.action_open_sessions),
            ("Export conversation", "Markdown, plus HTML and SVG with the token colours (Ctrl+E)",
             lambda: self.action_export("conversation")),
            ("Export last answer", "Markdown, plus HTML and SVG with the token colours",
             lambda: self.action_export("answer")),
        ]
        for title, help_text, callback in commands:
            yield SystemCommand(title, help_text, callback)
        for theme in THEMES:
            yield SystemCommand(f"Theme: {theme.name}", "Switch colours", lambda t=theme.name: self.apply_setting(
                "theme", t))

    def show_sglang_args(self) -> None:
        args = " ".join(self.applied_config.sglang_args()) or "(baseline: no speculative flags)"
        self.notify(args, title="SGLang launch flags", timeout=15)
