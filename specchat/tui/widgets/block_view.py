"""A block drafted in one pass, drawn position by position (the tree panel's rows for ``Step.block``).

A block drafter fills every position after the root in one forward, each position guessed
without seeing the guesses before it, so the panel shows the block as the drafter saw it: one row
per position with its best candidates and their probabilities, the row's fate in the same glyphs
and colours as a tree's nodes:

    ◆ ‹·the›
    1 ✓ ‹·cat› 0.91  ‹·dog› 0.04  ‹·a› 0.02     accepted (the candidate the tree held: highlighted)
    2 ✗ ‹·sat› 0.40  ‹·ran› 0.30  ‹·is› 0.10    the first position the target refused
      ★ ‹·ran›  correction · its guess 2          the target's own token, and where the drafter ranked it
    3 · ‹·on› 0.30  ‹·in› 0.20  ‹·at› 0.10       never reached
    4 · ‹·the› 0.22  ...  not checked           not in the verified tree (the budget cut it)

A candidate the tree held at that depth takes its node's state; the others are dimmed. Nothing
here names a method: what is drawn is the event's data (engine/events.py, ``Step.block``).
"""

from __future__ import annotations

from engine.events import Candidate, Step
from specchat.tui.token_text import visible

Segment = tuple[str, str]  # text, component class
Line = list[Segment]

_LABEL = 12  # characters of a candidate's text shown (a long piece would wrap the row)


def label(text: str) -> str:
    shown = visible(text)
    return f"‹{shown if len(shown) <= _LABEL else shown[:_LABEL - 1] + '…'}›"


def ordinal_guess(row: tuple[Candidate, ...], token: int) -> str:
    """`` · its guess 2`` where ``token`` is among the row's candidates, else ``""``."""
    rank = next((r for r, c in enumerate(row) if c.id == token), None)
    return "" if rank is None else f" · its guess {rank + 1}"


def row_state(step: Step, depth: int) -> str:
    """The fate of the block's position ``depth`` (1-based): accepted, refused (the first position
    the target turned down), unreached, or pruned (deeper than the verified tree: the adaptive budget
    cut it, or a tree grown from the block left it out)."""
    kept = step.accepted_len
    if depth <= kept:
        return "accepted"
    if depth == kept + 1 and step.rejected:
        return "rejected"
    return "pruned" if depth > step.tree.max_depth else "unreached"


def _node_states(step: Step, states: dict[int, str]) -> dict[tuple[int, int], str]:
    """(depth, token) -> the state of a tree node holding it, the most telling first."""
    rank = {"accepted": 0, "rejected": 1, "unreached": 2, "root": 3}
    out: dict[tuple[int, int], str] = {}
    tree = step.tree
    for i in range(1, len(tree)):
        key = (tree.depths[i], tree.tokens[i])
        if key not in out or rank[states[i]] < rank[out[key]]:
            out[key] = states[i]
    return out


GLYPH = {"accepted": "✓", "rejected": "✗", "unreached": "·", "pruned": "·"}


def block_shape(step: Step) -> str:
    """The panel title's word on a block: ``7 guesses in one pass``, with how many the budget let
    through to the verify, or the tree grown from them."""
    n, drafts = len(step.block), step.tree.num_drafts
    shape = f"{n} guess{'es' if n != 1 else ''} in one pass"
    if not step.tree.is_chain:
        return f"{shape} · a tree of {drafts}"
    return shape if drafts == n else f"{shape} · {drafts} checked"


def block_lines(step: Step, states: dict[int, str], *, own: tuple[str, str, int] | None) -> list[Line]:
    """One line per position of ``step.block`` (``states``: the tree nodes' states), and the target's
    own token (``own``: its text, "correction" or "bonus", its id) right after the last position the
    tree decided (the refused one, or the last accepted), or None where the tree drawn above shows it."""
    held = _node_states(step, states)
    width = len(str(len(step.block)))
    kept = step.accepted_len
    after = kept + 1 if own is not None and own[1] == "correction" else kept
    lines: list[Line] = []
    if own is not None and after == 0:
        lines.append(_own_line(step, width, own))
    for depth, row in enumerate(step.block, start=1):
        state = row_state(step, depth)
        style = ".tree--unreached" if state == "pruned" else f".tree--{state}"
        line: Line = [(f"{depth:>{width}} ", ".tree--guide"), (f"{GLYPH[state]} ", style)]
        for n, cand in enumerate(row):
            mine = held.get((depth, cand.id))
            if n:
                line.append(("  ", ".tree--guide"))
            line.append((label(cand.text), f".tree--{mine}" if mine else ".tree--guide"))
            line.append((f" {cand.prob:.2f}", ".tree--prob"))
        if state == "pruned" and depth == step.tree.max_depth + 1:
            line.append(("  not checked", ".tree--prob"))
        lines.append(line)
        if own is not None and depth == after:
            lines.append(_own_line(step, width, own))
    return lines


def _own_line(step: Step, width: int, own: tuple[str, str, int]) -> Line:
    """The target's token, and how the drafter ranked it at that position (the one after the kept)."""
    text, kind, token = own
    kept = step.accepted_len
    rank = ordinal_guess(step.block[kept], token) if kept < len(step.block) else ""
    return [(" " * (width + 1), ".tree--guide"), (f"★ {label(text)}", ".tree--bonus"),
            (f"  {kind}{rank}", ".tree--prob")]
