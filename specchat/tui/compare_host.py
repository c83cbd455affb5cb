"""The app's side of the compare view: which two methods it runs, and where their records go.

A mixin of the app (as the charts are), so the app module stays one screen's worth of wiring: the
choice of method A and method B is a UI setting (``compare`` in the palette, ``--compare A,B``),
checked against the methods the loaded session can run, refused in one line with the previous
choice kept (compare_pair.py); records of the "baseline", "alt" (A) and "spec" (B) lanes go to the
compare screen, the speculative sides' steps also to the tree history, the baseline's speed to the
stats panel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.events import Finished, Started, Step
from specchat.tui.compare_pair import parse_pair
from specchat.tui.trace import Record, UserTurn
from specchat.tui.widgets.draft_tree import HistoryEntry

if TYPE_CHECKING:
    from specchat.tui.screens.chat import ChatScreen
    from specchat.tui.screens.compare import CompareScreen
    from specchat.tui.settings_control import SettingsControl
    from specchat.tui.userconfig import UISettings


class CompareHost:
    """Mixed into the app: see the module docstring."""

    if TYPE_CHECKING:
        ui: UISettings
        replay: Any
        screen: Any
        chat_screen: ChatScreen
        compare_screen: CompareScreen
        settings_control: SettingsControl
        baseline_tps: float | None

        def switch_screen(self, screen: Any) -> Any: ...

        def apply_setting(self, name: str, raw: Any, *, quiet: bool = False) -> str | None: ...

    def compare_methods(self) -> tuple[str, ...]:
        """What a compare job is asked to run: (A, B), or () for the baseline vs the method in force."""
        return tuple(self.ui.compare.split(",")) if self.ui.compare else ()

    def set_compare(self, value: Any) -> None:
        """The ``compare`` setting: raises ConfigError (the previous choice kept) for a pair the
        session cannot run."""
        self.ui = self.ui.replace(compare=parse_pair(str(value), self.settings_control.methods))
        self.compare_screen.expect(self.compare_methods())

    def check_compare(self) -> None:
        """Once the session is loaded: a ``--compare`` pair it cannot run is refused (one line) and
        the compare view falls back to the baseline against the method in force."""
        if self.ui.compare:
            pair, self.ui = self.ui.compare, self.ui.replace(compare="")
            self.apply_setting("compare", pair)

    def show_compare(self, lane: str, records: list[Record]) -> None:
        """A compare lane's records to the compare screen, and what the other panels take of them."""
        if self.replay is not None and self.screen is self.chat_screen and \
                any(isinstance(r, UserTurn) for r in records):
            self.switch_screen("compare")
        self.compare_screen.show_records(lane, records)
        if lane in ("spec", "alt"):
            started = next((r.drafter for r in records if isinstance(r, Started)), "")
            method = started or self.compare_screen.lane_method(lane) or self.settings_control.applied.method
            entries = [HistoryEntry("compare", method, r) for r in records if isinstance(r, Step)]
            if entries and self.chat_screen.ready:
                self.chat_screen.add_spec_steps(entries)
        if lane == "baseline":
            fin = next((r for r in records if isinstance(r, Finished)), None)
            if fin is not None and fin.reason == "stop" and fin.stats.tokens_per_s and \
                    not self.compare_screen.stepped:
                self.baseline_tps = fin.stats.tokens_per_s
                if self.chat_screen.ready:
                    self.chat_screen.set_baseline_tps(self.baseline_tps)
