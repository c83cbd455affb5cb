"""The chat screen: transcript and prompt on the left; draft tree, teaching notes, stats and
settings on the right. It only *shows* records and the app's state (:class:`AppStatus`); the app decides
what to do with the engine."""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from engine.events import ConfigApplied, Finished, PrefillProgress, Started, Step
from specchat.tui.app_status import AppStatus
from specchat.tui.messages import StatusStale
from specchat.tui.screens import NARROW
from specchat.tui.teaching import explain_step
from specchat.tui.trace import Record, UserTurn
from specchat.tui.widgets.draft_tree import DraftTreePanel, HistoryEntry
from specchat.tui.widgets.prompt import PromptInput
from specchat.tui.widgets.repaint import repaint
from specchat.tui.widgets.settings_panel import SettingsPanel
from specchat.tui.widgets.stats_panel import StatsView
from specchat.tui.widgets.title_bar import TitleBar
from specchat.tui.widgets.transcript import AnswerView, Transcript, UserTurnView

# while an answer streams, the live tree and the stats are redrawn this often (the text every frame)
SIDE_PANELS_S = 0.5


def answer_method(ev: Started) -> str:
    return str(ev.config.get("method") or ev.drafter or "")


class ChatScreen(Screen):
    def __init__(self, *, themes: list[str], draft_model: str, history: int, show_rejected: bool,
                 blink: bool, replay: bool) -> None:
        super().__init__(id="chat")
        self._themes = themes
        self._draft_model = draft_model
        self._history = history
        self.show_rejected = show_rejected
        self._blink = blink
        self._replay = replay
        self.answer: AnswerView | None = None
        self.answers = 0
        self.method = ""
        self.ready = False  # composed and mounted: records can be shown
        self._answer_open = False  # a Started came and its Finished not yet
        self._app_status: AppStatus | None = None  # the app's state as last shown
        self._held: list[list[Record]] = []  # records that came before the screen was composed

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Transcript(id="transcript")
                placeholder = (
                    "replay: no model loaded · Space pauses · +/- speed · F8 steps"
                    if self._replay
                    else "Ask something · Enter sends · Ctrl+J new line · F1 help"
                )
                yield PromptInput(id="prompt", placeholder=placeholder, blink=self._blink)
            with Vertical(id="side"):
                yield DraftTreePanel(history=self._history, id="tree")
                yield Static("", id="teach")
                with Vertical(id="stats-box"):
                    yield Static(Content.styled("Stats", "bold"), classes="panel-title")
                    yield StatsView(id="stats")
                yield SettingsPanel(self._themes, self._draft_model, id="settings", blink=self._blink)
        yield Footer()

    def on_mount(self) -> None:
        if self._replay:
            self.query_one(PromptInput).disabled = True
        self.ready = True
        if self._held:
            self.call_after_refresh(self._show_held)

    def _show_held(self) -> None:
        held, self._held = self._held, []
        for records in held:
            self._show_records(records)
        self.post_message(StatusStale())

    def on_screen_resume(self) -> None:
        prompt = self.query_one(PromptInput)
        if not prompt.disabled and not self.has_class("-settings"):
            prompt.focus()
        self.post_message(StatusStale())

    # the app's state -----------------------------------------------------------------------------
    def show_status(self, app_status: AppStatus) -> None:
        self._app_status = app_status
        self.query_one(TitleBar).show(app_status)
        stats = self.stats
        if stats.state.stepping != app_status.stepping or stats.state.prefill != app_status.prefill:
            stats.state.stepping = app_status.stepping
            stats.state.prefill = app_status.prefill
            stats.refresh(layout=True)
        if self.settings.display:
            self.settings.show_values(app_status.applied, app_status.pending, app_status.ui_values)
        self.show_teaching()

    def context_line(self) -> str:
        """How full the context is ("ctx 1,234/8,192"), once a model has said its limit."""
        st = self.stats.state
        return f"ctx {st.context_used:,}/{st.context_limit:,}" if st.context_limit else ""

    # the side panels -----------------------------------------------------------------------------
    @property
    def settings_open(self) -> bool:
        return self.has_class("-settings")

    def open_settings(self, focus: str | None, methods: tuple[str, ...]) -> None:
        """Show the settings panel with the values of the app status last shown, ``focus`` focused."""
        self.set_class(True, "-settings")
        settings = self.settings
        if methods:
            settings.set_methods(methods)
        if self._app_status is not None:
            settings.show_values(self._app_status.applied, self._app_status.pending, self._app_status.ui_values)
        if focus:
            self.call_after_refresh(lambda: settings.query_one(f"#set-{focus}").focus())

    def close_settings(self) -> None:
        self.set_class(False, "-settings")
        if self.is_current and not self.prompt.disabled:
            self.prompt.focus()

    def toggle_panels(self) -> None:
        """Side panels: hidden by default on a narrow screen (F6 stacks them under the chat)."""
        if self.has_class("-narrow"):
            self.set_class(not self.has_class("-side-open"), "-side-open")
        else:
            self.set_class(not self.has_class("-side-closed"), "-side-closed")

    def show_panels(self) -> None:
        """Open the side panels however they were hidden (F6, a narrow screen)."""
        self.set_class(True, "-side-open")
        self.set_class(False, "-side-closed")

    def set_baseline_tps(self, tps: float) -> None:
        """A compare run's measured baseline speed, for the stats panel's speed-up."""
        self.stats.state.baseline_tps = tps
        self.stats.refresh(layout=True)

    # parts --------------------------------------------------------------------------------------
    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def tree(self) -> DraftTreePanel:
        return self.query_one(DraftTreePanel)

    @property
    def stats(self) -> StatsView:
        return self.query_one(StatsView)

    @property
    def settings(self) -> SettingsPanel:
        return self.query_one(SettingsPanel)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    # records from the engine (lane "chat") -----------------------------------------------------
    _side_due = 0.0

    def show_records(self, records: Sequence[Record]) -> None:
        """Show the chat lane's records; until the screen is composed they wait, in order."""
        if not self.ready or self._held:
            self._held.append(list(records))
            return
        self._show_records(records)

    def _show_records(self, records: Sequence[Record]) -> None:
        steps: list[Step] = []
        entries: list[HistoryEntry] = []
        stats = self.stats.state

        def flush() -> None:
            if steps and self.answer is not None:
                self.answer.add_steps(list(steps))
            steps.clear()

        for rec in records:
            if isinstance(rec, Step):
                steps.append(rec)
                stats.add(rec)
                entries.append(HistoryEntry(f"answer {self.answers}", self.method, rec, stats.prompt_tokens))
                continue
            flush()
            if isinstance(rec, UserTurn):
                self.transcript.add_user(rec.text)
                self._answer_open = False
            elif isinstance(rec, PrefillProgress):
                stats.prefill = (rec.done, rec.total)
            elif isinstance(rec, Started):
                self.answers += 1
                self._answer_open = True
                self.method = answer_method(rec)
                self.answer = self.transcript.add_answer(label="assistant", show_rejected=self.show_rejected)
                self.answer.started(rec)
                self.tree.follow_live()
                self.tree.view.unstick()
                self.stats.unstick()
                stats.reset_answer()
                stats.started(rec)
                if rec.dropped_turns:
                    self.transcript.add_note(
                        f"{rec.dropped_turns} oldest message{'s' if rec.dropped_turns != 1 else ''} left out of "
                        "the prompt so it fits the context (settings: context overflow)")
            elif isinstance(rec, ConfigApplied):
                stats.config_in_force(rec.config)
                if self.answer is not None and self.answer.finished is None:
                    self.answer.stream.add_text(" ⚙ new settings from here ", "marker")
            elif isinstance(rec, Finished):
                stats.prefill = None
                if not self._answer_open:
                    self._not_answered(rec)
                    continue
                self._answer_open = False
                if self.answer is not None:
                    self.answer.finish(rec, stepped=stats.stepped)
                stats.finish(rec)
        flush()
        # while the engine streams, the tree and stats keep their tallest height (no reflow per frame)
        hold = self._answer_open and not stats.stepping
        self.tree.view.hold_height = hold and self.tree.live
        self.stats.hold_height = hold
        # ... and are redrawn a few times a second, not every frame: nobody reads 30 trees a second,
        # and they cost most of a frame; the answer's text streams at the frame rate
        now = time.monotonic()
        show = not hold or now >= self._side_due
        if entries:
            self.tree.add_steps(entries, show=show)
        if not hold:
            self.tree.view.unstick()
            self.stats.unstick()
        if show:
            self._side_due = now + SIDE_PANELS_S
            repaint(self.stats)

    def _not_answered(self, rec: Finished) -> None:
        """A turn that ended before its answer started: refused for the context, or cancelled in prefill."""
        if rec.reason == "context":
            self.transcript.add_note(
                f"not sent: {rec.error}. Ctrl+N starts a new conversation; or shorten the message, or set "
                "context overflow to drop_oldest (F2).", classes="note -error")
        elif rec.reason == "cancelled":
            self.transcript.add_note("cancelled during the prefill; the conversation is as it was before this "
                                     "message")
        else:
            self.transcript.add_note(f"no answer: {rec.reason} {rec.error}".strip())

    def add_spec_steps(self, entries: list[HistoryEntry]) -> None:
        """Steps of a compare run's speculative side join the tree history too."""
        self.tree.add_steps(entries)

    def set_show_rejected(self, on: bool) -> None:
        self.show_rejected = on
        for view in self.query(AnswerView):
            view.stream.show_rejected = on

    def new_conversation(self) -> None:
        self.transcript.remove_children()
        self.answer = None
        self._answer_open = False
        self.tree.clear()
        self.stats.state.reset_answer()
        self.stats.state.stats = None
        self.stats.state.context_used = 0
        self.tree.view.unstick()
        self.stats.unstick()

    def turns(self) -> list:
        """What the transcript shows, as exportable turns (question, label, coloured pieces)."""
        from specchat.tui.sessions import Turn

        out: list[Turn] = []
        user = ""
        for child in self.transcript.children:
            if isinstance(child, UserTurnView):
                user = child.text
            elif isinstance(child, AnswerView):
                out.append(Turn(user, child.label, tuple(child.stream.pieces)))
        return out

    def on_resize(self, event) -> None:
        narrow = event.size.width < NARROW
        if narrow != self.has_class("-narrow"):
            self.set_class(narrow, "-narrow")

    # teaching ------------------------------------------------------------------------------------
    def on_draft_tree_panel_browsed(self, _: DraftTreePanel.Browsed) -> None:
        self.show_teaching()

    def show_teaching(self) -> None:
        """The teaching panel explains the step the tree shows, while the app's status says teaching."""
        app_status = self._app_status
        on = app_status is not None and app_status.teaching
        if on and not self.has_class("-teaching"):
            self.show_panels()  # teaching explains each step in the side panels (F4 or --teach)
        self.set_class(on, "-teaching")
        if app_status is None or not on:
            return
        panel = self.query_one("#teach", Static)
        entry = self.tree.current
        if entry is None:
            body = "Teaching mode: send a prompt; the engine will pause after every step and this panel " \
                   "will explain it in plain words."
        else:
            body = explain_step(entry.step, entry.method, prompt_tokens=entry.prompt_tokens)
        if not self.tree.live:
            hint = "browsing an earlier step · F8 forward · F7 back · End: live"
        elif app_status.waiting:
            hint = "‖ paused · F8 next step · F7 back · F4 ends teaching"
        else:
            hint = "F8 next step · F7 back · F1 explains the words"
        panel.update(Content.assemble((hint, "bold"), "\n", ("Teaching · ", "bold"), body))
