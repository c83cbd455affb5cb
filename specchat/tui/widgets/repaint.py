"""Repaint a widget whose content changed, and pay for a layout pass only when its size did.

Why: any ``refresh(layout=True)`` makes the screen reflow and repaint every widget (20-30 ms at
120x40 on the 2-core dev VM, measured), and ``Static.update`` asks for one on every call. The
streamed answer, the live tree, the stats and the title change on every frame but change size on
few of them, and on a 2-core machine every millisecond the event loop spends is taken from the
engine's matrix products (issue 10: the TUI must stream at the engine's own speed).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from textual.geometry import Size
from textual.visual import VisualType
from textual.widget import Widget
from textual.widgets import Static


def _auto(widget: Widget, axis: str) -> bool:
    scalar = getattr(widget.styles, axis)
    return scalar is not None and scalar.is_auto


def repaint(widget: Widget) -> None:
    """Refresh ``widget``; lay out again only if its content height (at its width) changed.

    A widget of fixed (or unset: filling) height repaints in place; an auto width always lays out.
    """
    size = widget.content_size
    if not widget.is_mounted or size.width <= 0 or _auto(widget, "width"):
        widget.refresh(layout=True)
        return
    widget.refresh()  # drops the cached render and dimensions, so the height below is the new one's
    if _auto(widget, "height") and widget.get_content_height(size, size, size.width) != size.height:
        widget.refresh(layout=True)


_SHOWN: WeakKeyDictionary[Static, VisualType] = WeakKeyDictionary()  # what update_static last showed


def update_static(static: Static, content: VisualType) -> None:
    """``static.update(content)`` without the layout pass unless its height changes; no-op if unchanged."""
    if static in _SHOWN and _SHOWN[static] == content:
        return
    _SHOWN[static] = content
    static.update(content, layout=False)
    repaint(static)


class StickyHeight(Widget):
    """Base for ``height: auto`` widgets whose height jitters between frames (the live tree, the stats).

    While ``hold_height`` is on (the engine streams), the widget keeps the tallest height it has had
    at its current width until :meth:`unstick` (the answer ends), so a tree one node shorter than
    the last one is drawn with a blank line instead of a reflow of the whole screen. Off (teaching,
    browsing), it is an ordinary auto-height widget.
    """

    _sticky: tuple[int, int] = (0, 0)  # (width, height)
    hold_height: bool = False

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height = super().get_content_height(container, viewport, width)
        w, h = self._sticky
        if self.hold_height and w == width and h > height:
            return h
        self._sticky = (width, height)
        return height

    def unstick(self) -> None:
        if self._sticky != (0, 0):
            self._sticky = (0, 0)
            self.refresh(layout=True)
