"""The answer as it streams in, each token styled by where it came from.

Cheap to append: the widget keeps a list of (text, kind) pieces and builds one ``Content`` per
refresh (not per token). Styles are component-class names (``.token--draft`` ...), resolved at
render time from the stylesheet, so a theme switch recolours the whole answer, and "show rejected"
re-renders it with or without the refused drafts. Model text is always plain text, never markup.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from textual.content import Content, Span
from textual.reactive import reactive
from textual.widget import Widget

from engine.events import Step
from specchat.tui.token_text import sanitize
from specchat.tui.widgets.repaint import repaint

Kind = Literal["draft", "target", "rejected", "plain", "marker"]


def _rejected_text(piece: str) -> str:
    return sanitize(piece).replace("\n", "↵") or "∅"


def pieces_of_step(step: Step) -> list[tuple[str, Kind]]:
    """A step's committed text as (text, kind) pieces; refused drafts sit just before the target's token."""
    pieces: list[tuple[str, Kind]] = []
    rejected = [step.tree_text[i] for i in step.rejected if i < len(step.tree_text)]
    if "".join(c.text for c in step.committed) != step.text:
        # a detokeniser that does not attribute text per token: keep the text, lose the split
        origin: Kind = "target" if any(c.origin == "target" for c in step.committed) else "draft"
        pieces.append((sanitize(step.text), origin))
        return pieces
    for tok in step.committed:
        if tok.origin == "target" and rejected:
            # alternatives refused at this position are separated by "|"
            pieces.append(("|".join(_rejected_text(r) for r in rejected), "rejected"))
            rejected = []
        if tok.text:
            pieces.append((sanitize(tok.text), "draft" if tok.origin == "draft" else "target"))
    return pieces


class TokenStream(Widget):
    """Tokens coloured by origin: accepted draft, target (bonus/correction), rejected draft.

    "marker" pieces are UI notes inside the stream (where a settings change took effect).
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "token--draft",
        "token--target",
        "token--rejected",
        "token--plain",
        "token--marker",
    }

    DEFAULT_CSS = """
    TokenStream { height: auto; }
    """

    show_rejected: reactive[bool] = reactive(True)

    def __init__(self, *, show_rejected: bool = True, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.pieces: list[tuple[str, Kind]] = []
        self.token_count = 0
        self._cache: tuple[tuple[int, bool], Content] | None = None
        self.set_reactive(TokenStream.show_rejected, show_rejected)

    # feeding ------------------------------------------------------------------------------------
    def add_step(self, step: Step, refresh: bool = True) -> None:
        self.pieces.extend(pieces_of_step(step))
        self.token_count += len(step.committed)
        if refresh:
            repaint(self)

    def add_text(self, text: str, kind: Kind = "plain") -> None:
        if text:
            self.pieces.append((sanitize(text), kind))
            self.refresh(layout=True)

    def clear(self) -> None:
        self.pieces.clear()
        self.token_count = 0
        self.refresh(layout=True)

    @property
    def plain_text(self) -> str:
        """The answer's text, without rejected drafts or markers."""
        return "".join(t for t, k in self.pieces if k not in ("rejected", "marker"))

    # rendering ----------------------------------------------------------------------------------
    def watch_show_rejected(self) -> None:
        self.refresh(layout=True)

    def build_content(self) -> Content:
        key = (len(self.pieces), self.show_rejected)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        parts: list[str] = []
        spans: list[Span] = []
        offset = 0
        for text, kind in self.pieces:
            if kind == "rejected" and not self.show_rejected:
                continue
            parts.append(text)
            end = offset + len(text)
            if kind != "plain":
                if spans and spans[-1].end == offset and spans[-1].style == f".token--{kind}":
                    # merge runs of one kind; a boundary is still visible through the span ends
                    # of the other kinds, and merging keeps long answers cheap to render
                    spans[-1] = Span(spans[-1].start, end, spans[-1].style)
                else:
                    spans.append(Span(offset, end, f".token--{kind}"))
            offset = end
        content = Content("".join(parts), spans, strip_control_codes=False)
        self._cache = (key, content)
        return content

    def render(self) -> Content:
        return self.build_content()
