"""Check a trace record's field values against its dataclass's annotations.

Why: a trace is a file a user (or anyone) can edit. ``event_from_dict`` builds the events with the
values as they are, so a string where a number belongs (``"verify_ms": "slow"``) used to pass the
reading and end the replay later in a raw TypeError, far from the line at fault. Checking every
field against the type the engine declares for it (the events' annotations, read once) refuses
such a record when the trace is opened, naming the field; the trace reader adds the line.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal


def check_record(record: object) -> None:
    """TypeError naming the first field of ``record`` (a dataclass, nested ones included) whose
    value does not have its annotated type: ``timing.verify_ms must be a number, not 'slow'``."""
    _check_dataclass(record, "")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_dataclass(obj: object, where: str) -> None:
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if f.name in hints:
            _check(getattr(obj, f.name), hints[f.name], f"{where}{f.name}")


def _check(value: Any, hint: Any, name: str) -> None:
    problem = _mismatch(value, hint, name)
    if problem:
        raise TypeError(problem)


def _mismatch(value: Any, hint: Any, name: str) -> str:
    """Why ``value`` does not fit ``hint`` ("" when it does)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return ""
    if origin is Literal:
        return "" if value in args else f"{name} must be one of {', '.join(map(repr, args))}, not {value!r}"
    if origin in (typing.Union, types.UnionType):
        found = [_mismatch(value, a, name) for a in args]
        return "" if "" in found else found[0]
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            return f"{name} must be an object, not {value!r}"
        _check_dataclass(value, f"{name}.")
        return ""
    if origin is tuple:
        if not isinstance(value, tuple):
            return f"{name} must be a list, not {value!r}"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return f"{name} must have {len(items)} entries, not {len(value)}"
        return next((m for v, h in zip(value, items, strict=True) if (m := _mismatch(v, h, f"{name}[]"))), "")
    return _scalar_mismatch(value, origin or hint, name)


def _scalar_mismatch(value: Any, kind: Any, name: str) -> str:
    if kind is type(None):  # the None of an optional field: any other value is the other type's to check
        return "" if value is None else f"{name} must be null, not {value!r}"
    if kind is bool:
        return "" if isinstance(value, bool) else f"{name} must be true or false, not {value!r}"
    if kind is int:
        return "" if isinstance(value, int) and not isinstance(value, bool) else \
            f"{name} must be an integer, not {value!r}"
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return "" if ok else f"{name} must be a number, not {value!r}"
    if kind is str:
        return "" if isinstance(value, str) else f"{name} must be text, not {value!r}"
    if isinstance(kind, type) and kind in (dict, list):
        return "" if isinstance(value, kind) else f"{name} must be a{'n object' if kind is dict else ' list'}, " \
                                                  f"not {value!r}"
    return ""  # mappings of tensors and the like: never written to a trace
