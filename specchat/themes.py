"""specchat's themes: dark, light and colour-blind safe, as Textual ``Theme`` objects.

Token and tree states are theme *variables* (``$tok-draft``, ``$tree-accepted`` ...) used by the
component classes in ``specchat/tui/specchat.tcss``; switching theme re-resolves them, so text
already on screen is recoloured. Every state also has a non-colour cue in the stylesheet
(underline, bold, strike-through, dim) and a glyph in the tree, so no state depends on colour alone.

The colour-blind safe theme uses the Okabe-Ito palette (blue / orange / vermillion; the vermillion
lightened to read at 4.5:1 on the panels), which stays
distinguishable under deuteranopia, protanopia and tritanopia.

This module imports Textual's ``Theme`` only; it is imported by the TUI, never by the headless CLI.
"""

from __future__ import annotations

from textual.theme import Theme

# Variables every theme defines. Defaults apply to themes that do not (e.g. Textual's built-ins
# picked from the command palette), so the app never fails to parse its stylesheet.
VARIABLE_DEFAULTS: dict[str, str] = {
    "tok-draft": "#4EBF71",  # accepted draft token
    "tok-target": "#58A6FF",  # produced by the target (bonus / correction)
    "tok-rejected": "#F47067",  # a draft the target refused
    "tok-user": "#C9D1D9",
    "tree-accepted": "#4EBF71",
    "tree-rejected": "#F47067",
    "tree-unreached": "#848D97",
    "tree-bonus": "#58A6FF",
    "tree-root": "#D29922",
    "tree-prob": "#8B949E",
    "pending": "#D29922",
    "stat-bar": "#4EBF71",
    "stat-bar-empty": "#30363D",
    "label": "#9DA7B3",  # secondary text (stats labels, meta lines): >= 4.5:1 on every panel colour
}

DARK = Theme(
    name="specchat-dark",
    primary="#58A6FF",
    secondary="#8957E5",
    accent="#D29922",
    warning="#D29922",
    error="#E5534B",
    success="#4EBF71",
    foreground="#D0D7DE",
    background="#0D1117",
    surface="#161B22",
    panel="#21262D",
    dark=True,
    variables={
        **VARIABLE_DEFAULTS,
        "footer-key-foreground": "#58A6FF",
    },
)

LIGHT = Theme(
    name="specchat-light",
    primary="#0969DA",
    secondary="#8250DF",
    accent="#9A6700",
    warning="#9A6700",
    error="#CF222E",
    success="#1A7F37",
    foreground="#1F2328",
    background="#FFFFFF",
    surface="#F6F8FA",
    panel="#EAEEF2",
    dark=False,
    variables={
        "tok-draft": "#116329",
        "tok-target": "#0550AE",
        "tok-rejected": "#CF222E",
        "tok-user": "#1F2328",
        "tree-accepted": "#116329",
        "tree-rejected": "#CF222E",
        "tree-unreached": "#626B75",
        "tree-bonus": "#0550AE",
        "tree-root": "#7D4E00",
        "tree-prob": "#57606A",
        "pending": "#7D4E00",
        "stat-bar": "#116329",
        "stat-bar-empty": "#D0D7DE",
        "label": "#57606A",
        "footer-key-foreground": "#0550AE",
    },
)

# Okabe-Ito: blue #0072B2, sky #56B4E9, orange #E69F00, vermillion #D55E00, yellow #F0E442.
COLOURBLIND = Theme(
    name="specchat-colourblind",
    primary="#56B4E9",
    secondary="#CC79A7",
    accent="#F0E442",
    warning="#F0E442",
    error="#D55E00",
    success="#56B4E9",
    foreground="#E6E6E6",
    background="#101418",
    surface="#181D23",
    panel="#232A32",
    dark=True,
    variables={
        "tok-draft": "#56B4E9",
        "tok-target": "#E69F00",
        "tok-rejected": "#F0782A",
        "tok-user": "#E6E6E6",
        "tree-accepted": "#56B4E9",
        "tree-rejected": "#F0782A",
        "tree-unreached": "#8C929A",
        "tree-bonus": "#E69F00",
        "tree-root": "#F0E442",
        "tree-prob": "#A0A6AD",
        "pending": "#F0E442",
        "stat-bar": "#56B4E9",
        "stat-bar-empty": "#333A42",
        "label": "#A9B0B8",
        "footer-key-foreground": "#56B4E9",
    },
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


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast_ratio(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two #RRGGBB colours (1 to 21; 4.5 is the bar for body text)."""
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)
