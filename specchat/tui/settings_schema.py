"""One schema for every setting the UI can change: the settings panel and the command palette are
both generated from it, and values are parsed here (no Textual imports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine import methods
from engine.config import DRAFT_KNOBS, ConfigError, knobs_for
from engine.knobs import KNOBS, Knob

FieldKind = Literal["int", "float", "choice", "bool", "text"]


@dataclass(frozen=True)
class SettingField:
    name: str
    label: str
    kind: FieldKind
    scope: Literal["engine", "model", "ui"] = "engine"
    choices: tuple[str, ...] = ()
    help: str = ""


def _field(knob: Knob) -> SettingField:
    """A panel row and palette setting from the knob's one declaration (engine/knobs.py)."""
    kind: FieldKind = "bool" if knob.kind is bool else "choice" if knob.choices else \
        "int" if knob.kind is int else "float"
    return SettingField(knob.name, knob.label or knob.name, kind, choices=knob.choices, help=knob.help)


# the knobs with a label, in their declared order: the rows of the panel and the palette's settings
ENGINE_FIELDS: tuple[SettingField, ...] = tuple(_field(k) for k in KNOBS.values() if k.label is not None)

# the target's own arithmetic: not part of an answer's settings (SpecConfig), switched by the session
# between answers (Session.set_precision), after which the conversation is read again in it
MODEL_FIELDS: tuple[SettingField, ...] = (
    SettingField("precision", "precision", "choice", scope="model", choices=("exact", "fast"),
                 help="CPU arithmetic: exact (fp32) or fast (8-bit or bf16 products); the conversation is "
                      "read again in it"),
)

UI_FIELDS: tuple[SettingField, ...] = (
    SettingField("show_rejected", "show rejected", "bool", scope="ui", help="refused drafts, struck through"),
    SettingField("theme", "theme", "choice", scope="ui", help="colours (every state also has a glyph/style)"),
)

# set from the command palette ("compare medusa,eagle3") and --compare A,B; not a row of the panel
COMPARE_FIELD = SettingField("compare", "compare", "text", scope="ui",
                             help="the compare view's two methods, A,B (e.g. medusa,eagle3; 'default': the "
                                  "baseline vs the method in force)")

FIELDS: dict[str, SettingField] = {f.name: f for f in (*ENGINE_FIELDS, *MODEL_FIELDS, *UI_FIELDS, COMPARE_FIELD)}

# short names accepted in the command palette ("topk 2", "steps=3")
ALIASES: dict[str, str] = {
    "topk": "eagle_topk",
    "k": "eagle_topk",
    "steps": "num_steps",
    "depth": "num_steps",
    "draft_tokens": "num_draft_tokens",
    "tokens": "num_draft_tokens",
    "temp": "temperature",
    "t": "temperature",
    "rejected": "show_rejected",
    "adaptive": "adaptive_draft",
    "overflow": "context_overflow",
    "vs": "compare",
}


def applies(name: str, method: str) -> bool:
    """Whether setting ``name`` acts on ``method`` (drafting knobs act only on their drafters)."""
    return name not in DRAFT_KNOBS or name in knobs_for(method)


def why_not(name: str, method: str) -> str:
    """One line: why ``name`` is greyed out for ``method``."""
    users = [m for m in methods.names() if m != "none" and name in knobs_for(m)]
    if method == "none":
        return f"not used by the baseline (no drafter); acts on {', '.join(users)}"
    return f"not used by {method}; acts on {', '.join(users)}"


def example_value(field: SettingField, current: Any = None) -> str:
    """A value to show in 'type NAME VALUE' hints that fits the field (not 'method 3')."""
    if field.kind == "choice":
        options = [c for c in field.choices if c != current] or list(field.choices)
        return options[0] if options else "dark"
    if field.kind == "bool":
        return "off" if current else "on"
    if field.kind == "text":
        return "medusa,eagle3"
    if field.kind == "float":
        return "0.7"
    return "3"


def resolve_name(name: str) -> str | None:
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    return key if key in FIELDS else None


def parse_value(field: SettingField, raw: Any) -> Any:
    """Text (or a widget's value) -> a typed value; raises ConfigError with a one-line message."""
    if field.kind == "int":
        if isinstance(raw, bool):
            raise ConfigError(f"{field.name} must be an integer, got {raw!r}")
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw).strip())
        except ValueError:
            raise ConfigError(f"{field.name} must be an integer, got {str(raw).strip()!r}") from None
    if field.kind == "float":
        try:
            return float(str(raw).strip())
        except ValueError:
            raise ConfigError(f"{field.name} must be a number, got {str(raw).strip()!r}") from None
    if field.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "on", "yes"):
            return True
        if text in ("0", "false", "off", "no"):
            return False
        raise ConfigError(f"{field.name} must be on or off, got {str(raw).strip()!r}")
    value = str(raw).strip()
    if field.choices and value not in field.choices:
        raise ConfigError(f"{field.name} must be one of {', '.join(field.choices)}; got {value!r}")
    return value


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
