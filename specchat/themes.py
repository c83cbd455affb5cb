"""specchat's themes: dark, light and colour-blind safe, as Textual ``Theme`` objects.

Token and tree states are theme *variables* (``$tok-draft``, ``$tree-accepted`` ...) used by the
component classes in ``specchat/tui/specchat.tcss``; switching theme re-resolves them, so text
already on screen is recoloured. Every state also has a non-colour cue in the stylesheet
(underline, bold, strike-through, dim) and a glyph in the tree, so no state depends on colour alone.

The colour-blind safe theme uses the Okabe-Ito palette (blue / orange / vermillion; the vermillion
lightened to read at 4.5:1 on the panels), which stays
distinguishable under deuteranopia, protanopia and tritanopia.

This module imports Textual's ``Theme`` only; it is imported by the TUI, and by the command line only to
check a ``--theme`` given (see specchat.cli._theme).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.theme import BUILTIN_THEMES, Theme


@dataclass(frozen=True)
class Palette:
    """The colours of the token and tree states of one theme; :meth:`variables` spreads them over the
    stylesheet's variables. Why: each state has one colour in every widget (an accepted draft is the
    same colour in the stream, the tree and the acceptance bar), so a theme names it once."""

    accepted: str  # an accepted draft token ($tok-draft, $tree-accepted, $stat-bar)
    target: str  # produced by the target: bonus / correction ($tok-target, $tree-bonus)
    rejected: str  # a draft the target refused ($tok-rejected, $tree-rejected)
    user: str
    unreached: str  # tree nodes past the first refusal
    root: str  # the tree's root, and pending settings ($tree-root, $pending)
    prob: str  # draft probabilities in the tree
    bar_empty: str
    label: str  # secondary text (stats labels, meta lines): >= 4.5:1 on every panel colour
    footer_key: str

    def variables(self) -> dict[str, str]:
        return {
            "tok-draft": self.accepted,
            "tok-target": self.target,
            "tok-rejected": self.rejected,
            "tok-user": self.user,
            "tree-accepted": self.accepted,
            "tree-rejected": self.rejected,
            "tree-unreached": self.unreached,
            "tree-bonus": self.target,
            "tree-root": self.root,
            "tree-prob": self.prob,
            "pending": self.root,
            "stat-bar": self.accepted,
            "stat-bar-empty": self.bar_empty,
            "label": self.label,
        }


DARK_PALETTE = Palette(accepted="#4EBF71", target="#58A6FF", rejected="#F47067", user="#C9D1D9",
                       unreached="#848D97", root="#D29922", prob="#8B949E", bar_empty="#30363D",
                       label="#9DA7B3", footer_key="#58A6FF")

# Variables every theme defines. Defaults apply to themes that do not (e.g. Textual's built-ins
# picked from the command palette), so the app never fails to parse its stylesheet.
VARIABLE_DEFAULTS: dict[str, str] = DARK_PALETTE.variables()


def _theme(name: str, palette: Palette, **colours: Any) -> Theme:
    return Theme(name=name, variables={**palette.variables(), "footer-key-foreground": palette.footer_key},
                 **colours)


DARK = _theme(
    "specchat-dark", DARK_PALETTE,
    primary="#58A6FF", secondary="#8957E5", accent="#D29922", warning="#D29922", error="#E5534B",
    success="#4EBF71", foreground="#D0D7DE", background="#0D1117", surface="#161B22", panel="#21262D", dark=True,
)

LIGHT = _theme(
    "specchat-light",
    Palette(accepted="#116329", target="#0550AE", rejected="#CF222E", user="#1F2328", unreached="#626B75",
            root="#7D4E00", prob="#57606A", bar_empty="#D0D7DE", label="#57606A", footer_key="#0550AE"),
    primary="#0969DA", secondary="#8250DF", accent="#9A6700", warning="#9A6700", error="#CF222E",
    success="#1A7F37", foreground="#1F2328", background="#FFFFFF", surface="#F6F8FA", panel="#EAEEF2", dark=False,
)

# Okabe-Ito: blue #0072B2, sky #56B4E9, orange #E69F00, vermillion #D55E00, yellow #F0E442.
COLOURBLIND = _theme(
    "specchat-colourblind",
    Palette(accepted="#56B4E9", target="#E69F00", rejected="#F0782A", user="#E6E6E6", unreached="#8C929A",
            root="#F0E442", prob="#A0A6AD", bar_empty="#333A42", label="#A9B0B8", footer_key="#56B4E9"),
    primary="#56B4E9", secondary="#CC79A7", accent="#F0E442", warning="#F0E442", error="#D55E00",
    success="#56B4E9", foreground="#E6E6E6", background="#101418", surface="#181D23", panel="#232A32", dark=True,
)

THEMES: tuple[Theme, ...] = (DARK, LIGHT, COLOURBLIND)

ALIASES: dict[str, str] = {
    "dark": DARK.name,
    "light": LIGHT.name,
    "colourblind": COLOURBLIND.name,
    "colorblind": COLOURBLIND.name,
    "cb": COLOURBLIND.name,
    "specchat-cb": COLOURBLIND.name,
    "specchat-colorblind": COLOURBLIND.name,
}

DEFAULT_THEME = DARK.name


def resolve_theme_name(name: str | None) -> str:
    """Map a short name (dark, light, colourblind) to the registered theme name."""
    if not name:
        return DEFAULT_THEME
    return ALIASES.get(name.lower(), name)


def pick_theme(name: str | None, available: set[str] | dict[str, Theme]) -> tuple[str, str]:
    """The registered theme for a configured name, and a warning ('' if none) when it is unknown."""
    theme = resolve_theme_name(name)
    if theme in available:
        return theme, ""
    return DEFAULT_THEME, f"unknown theme {name!r}; using {DEFAULT_THEME}"


def unknown_theme(name: str) -> str:
    """'' when ``name`` names a theme the app registers (ours, by short or full name, or one of
    Textual's built-ins), else the line that says what to use. Why: ``--theme`` is refused at the
    command line, before the chat opens, rather than warned about inside it."""
    if resolve_theme_name(name) in {t.name for t in THEMES} | set(BUILTIN_THEMES):
        return ""
    return (f"unknown theme {name!r}; choose dark, light or colourblind, or one of Textual's: "
            f"{', '.join(sorted(BUILTIN_THEMES))}")


def theme_colours(theme: Theme) -> dict[str, str]:
    """Every colour an export needs (the state variables, foreground and background) of ``theme``."""
    variables = {**VARIABLE_DEFAULTS, **theme.variables}
    return {**variables, "foreground": theme.foreground or "#D0D7DE", "background": theme.background or "#000000"}


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast_ratio(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two #RRGGBB colours (1 to 21; 4.5 is the bar for body text)."""
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)
