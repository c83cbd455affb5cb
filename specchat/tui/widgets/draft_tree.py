"""The draft tree of one step, drawn as an indented tree.

Each node shows its token (escaped, whitespace visible), its draft probability and its fate:

    ◆ ‹·the›                    root (the last token the target produced)
    ├─✓ ‹·cat›  0.91            accepted (highlighted); no numbers for drafters without probabilities
    │ ├─✓ ‹·sat›  0.84
    │ │ ├─✗ ‹·down›  0.40       refused by the target at the next position
    │ │ │ └─· ‹·on›  0.30       never reached (dimmed)
    │ │ └─★ ‹·on›  correction   the target's own token (a correction, or a bonus where drafts ran out)
    │ └─· ‹·ran›  0.08
    └─· ‹·dog›  0.05

Glyphs (✓ ✗ · ★) carry the state without colour; colours come from component classes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content, Span
from textual.message import Message
from textual.widgets import Static

from engine.events import Step
from specchat.tui.token_text import visible
from specchat.tui.widgets.block_view import Line, block_lines, block_shape
from specchat.tui.widgets.repaint import StickyHeight, repaint, update_static

NodeState = str  # "root" | "accepted" | "rejected" | "unreached"


def node_states(step: Step) -> dict[int, NodeState]:
    accepted = set(step.accepted)
    rejected = set(step.rejected)
    states: dict[int, NodeState] = {0: "root"}
    for i in range(1, len(step.tree)):
        states[i] = "accepted" if i in accepted else "rejected" if i in rejected else "unreached"
    return states


class DraftTreeView(StickyHeight):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "tree--root",
        "tree--accepted",
        "tree--rejected",
        "tree--unreached",
        "tree--bonus",
        "tree--prob",
        "tree--guide",
    }

    DEFAULT_CSS = """
    DraftTreeView { height: auto; }
    """

    GLYPH: ClassVar[dict[str, str]] = {"root": "◆", "accepted": "✓", "rejected": "✗", "unreached": "·", "bonus": "★"}

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.step: Step | None = None
        self.states: dict[int, NodeState] = {}
        self.lines: list[str] = []  # plain text of each drawn line (tests, teaching)

    def show(self, step: Step | None) -> None:
        if step is self.step:
            return
        self.step = step
        self.states = node_states(step) if step is not None else {}
        repaint(self)

    def render(self) -> Content:
        step = self.step
        if step is None:
            self.lines = []
            return Content("no step yet", [Span(0, 11, ".tree--unreached")])
        lines = self._block(step) if step.block and step.tree.is_chain else self._tree(step)
        if step.block and not step.tree.is_chain:  # a tree grown from a block: the block under it
            lines += [[("", "")], [("the block, position by position:", ".tree--prob")], *self._block(step, own=False)]
        return self._content(lines)

    def _own(self, step: Step) -> tuple[str, str]:
        """The target's own token after the accepted path: its text, and "correction" where it refused
        the drafts at that position or "bonus" where the drafts ran out."""
        last = step.accepted[-1] if step.accepted else 0
        refused = any(p == last for p in step.tree.parents)
        return (step.committed[-1].text if step.committed else "", "correction" if refused else "bonus")

    def _root(self, step: Step) -> Line:
        texts = step.tree_text
        return [("", ""), (f"{self.GLYPH['root']} ‹{visible(texts[0]) if texts else '?'}›", ".tree--root")]

    def _block(self, step: Step, own: bool = True) -> list[Line]:
        """The block drafted in one pass, one row per position (widgets/block_view.py); with ``own``,
        the root first and the target's token after the position it took."""
        text, kind = self._own(step)
        mine = (text, kind, step.bonus) if own and step.committed else None
        rows = block_lines(step, self.states, own=mine)
        return [self._root(step), *rows] if own else rows

    def _tree(self, step: Step) -> list[Line]:
        tree = step.tree
        texts = step.tree_text
        children = tree.children()
        last = step.accepted[-1] if step.accepted else 0
        bonus_text, own = self._own(step)
        has_probs = tree.has_probs
        rows: list[Line] = [self._root(step)]

        def label(i: int) -> str:
            return f"‹{visible(texts[i]) if i < len(texts) else '?'}›"

        def walk(node: int, guide: str) -> None:
            kids: list[int | None] = list(children[node])
            if node == last and step.committed:
                kids.append(None)  # the target's token, drawn as the last child of the accepted path
            for n, kid in enumerate(kids):
                end = n == len(kids) - 1
                branch = (guide + ("└─" if end else "├─"), ".tree--guide")
                if kid is None:
                    rows.append([branch, (f"{self.GLYPH['bonus']} ‹{visible(bonus_text)}›", ".tree--bonus"),
                                 (f"  {own}", ".tree--prob")])
                    continue
                state = self.states[kid]
                prob = f"  {tree.draft_probs[kid]:.2f}" if has_probs else ""
                rows.append([branch, (f"{self.GLYPH[state]} {label(kid)}", f".tree--{state}"), (prob, ".tree--prob")])
                walk(kid, guide + ("  " if end else "│ "))

        walk(0, "")
        return rows

    def _content(self, rows: list[Line]) -> Content:
        """The lines as one Content with a span per styled segment (``self.lines``: their plain text)."""
        parts: list[str] = []
        spans: list[Span] = []
        offset = 0
        for row in rows:
            line = ""
            for text, style in row:
                if text:
                    if style:
                        spans.append(Span(offset, offset + len(text), style))
                    offset += len(text)
                    line += text
            parts.append(line)
            offset += 1  # the newline
        self.lines = parts
        return Content("\n".join(parts), spans, strip_control_codes=False)


@dataclass(frozen=True)
class HistoryEntry:
    answer: str  # which answer: "answer 3", "compare"
    method: str
    step: Step
    prompt_tokens: int = 0  # of the answer's prompt (the prefill step explains it)


class DraftTreePanel(Vertical, can_focus=True):
    """The live tree plus a history of recent steps, browsable with left/right."""

    BINDINGS: ClassVar = [
        Binding("left", "browse(-1)", "Prev step", show=False, id="tree-prev"),
        Binding("right", "browse(1)", "Next step", show=False, id="tree-next"),
        Binding("end", "live", "Live", show=False, id="tree-live"),
    ]

    class Browsed(Message):
        """The browsed step changed (teaching panel follows it)."""

        def __init__(self, entry: HistoryEntry | None, live: bool) -> None:
            super().__init__()
            self.entry = entry
            self.live = live

    def __init__(self, history: int = 64, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history: deque[HistoryEntry] = deque(maxlen=history)
        self.cursor: int | None = None  # index into history while browsing; None = live

    def compose(self):
        yield Static("Draft tree", id="tree-title", classes="panel-title")
        with VerticalScroll(id="tree-scroll"):
            yield DraftTreeView(id="tree-view")

    @property
    def view(self) -> DraftTreeView:
        return self.query_one(DraftTreeView)

    @property
    def live(self) -> bool:
        return self.cursor is None

    @property
    def current(self) -> HistoryEntry | None:
        if not self.history:
            return None
        return self.history[-1] if self.cursor is None else self.history[self.cursor]

    def add_steps(self, entries: list[HistoryEntry], show: bool = True) -> None:
        """Keep the steps in the history; ``show=False`` leaves the drawing for a later call."""
        if not entries:
            return
        before = len(self.history)
        self.history.extend(entries)
        if self.cursor is not None:
            # keep pointing at the same step while new ones arrive (and old ones fall off)
            dropped = before + len(entries) - len(self.history)
            self.cursor = max(0, self.cursor - dropped)
        if show:
            self._update()

    def clear(self) -> None:
        self.history.clear()
        self.cursor = None
        self._update()

    def follow_live(self) -> None:
        """A new answer starts: stop browsing, show its steps as they come."""
        if self.cursor is not None:
            self.cursor = None
            self._update()

    def on_key(self, event) -> None:
        # typing while the tree has focus goes to the prompt instead of vanishing
        if event.is_printable and event.character:
            prompt = self.screen.query("PromptInput").first()
            if prompt is not None and not prompt.disabled:
                event.stop()
                prompt.focus()
                prompt.insert(event.character)

    def action_browse(self, delta: int) -> None:
        self.browse(delta)

    def action_live(self) -> None:
        self.cursor = None
        self._update()

    def browse(self, delta: int) -> bool:
        """Move the cursor; returns False when already at the newest step (going forward)."""
        if not self.history:
            return False
        idx = len(self.history) - 1 if self.cursor is None else self.cursor
        new = max(0, min(len(self.history) - 1, idx + delta))
        at_end = new == len(self.history) - 1
        moved = new != idx
        self.cursor = None if at_end else new
        self._update()
        return moved

    def _update(self) -> None:
        entry = self.current
        if self.cursor is not None:  # browsing: each step at its own height
            self.view.hold_height = False
        self.view.show(entry.step if entry else None)
        title = self.query_one("#tree-title", Static)
        if entry is None:
            update_static(title, Content("Draft tree"))
        else:
            step = entry.step
            if self.cursor is None:
                where = ("live", "")
            else:
                back = len(self.history) - 1 - self.cursor
                where = (f"◀ {back} step{'s' if back != 1 else ''} back · End: live", "italic")
            what = "prefill" if step.index == 0 else f"step {step.index}"
            drafts = step.tree.num_drafts
            shape = block_shape(step) if step.block else (
                f"{drafts} draft{'s' if drafts != 1 else ''} · depth {step.tree.max_depth}"
                if not step.draft_paused else "drafting paused")
            # the n-gram drafter's other source, last: the line may wrap in a narrow panel
            origin = " · from past answers" if step.tree.source == "corpus" and drafts else ""
            update_static(title, Content.assemble(
                    ("Draft tree", "bold"),
                    " · ",
                    where,
                    "\n",
                    f"{entry.answer} · {what} · {shape} · kept {step.accepted_len}+1{origin}",
            ))
        self.post_message(self.Browsed(entry, self.cursor is None))
