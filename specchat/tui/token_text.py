"""Making model text safe and visible on a terminal (no Textual imports)."""

from __future__ import annotations

_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def sanitize(text: str) -> str:
    """Model text for the transcript: keep newlines and tabs, show other control characters."""
    if text.isprintable() or all(ch.isprintable() or ch in "\n\t" for ch in text):
        return text
    return "".join(
        ch if ch.isprintable() or ch in "\n\t" else f"\\x{ord(ch):02x}" for ch in text
    )


def visible(piece: str, limit: int = 24) -> str:
    """A token piece for the tree / rejected display: whitespace made visible, controls escaped."""
    if piece == "":
        return "∅"  # a byte of a multi-byte character: it adds no text yet
    out = []
    for ch in piece:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    text = "".join(out)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ, or None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None
