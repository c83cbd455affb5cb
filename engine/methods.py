"""The method registry: every drafting method's one declaration (engine/method_spec.py), in order.

Each method declares a ``MethodSpec`` beside its code (``engine/drafters/<method>_method.py``);
this module collects them, and everything that lists methods asks here: the ``--method`` choices
and aliases (engine/knobs.py), the knobs that act on each (engine/config.py), which take a draft
and how it is found and loaded (engine/drafters/draft_loader.py, engine/loader.py), the session's
default drafters (engine/drafting.py), the launch lines (specchat/export.py), the settings panel
and palette (from the knobs), teaching mode's sentence, bench --random-weights' refusals.

A new method: its module, one line below. ``register`` adds one at run time (a plugin, a test),
before the modules that build their tables from the registry are imported (the parser's choices
are made once).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.drafters import eagle_method, medusa_method, ngram_method, none_method, standalone_method
from engine.drafters.dflash import method as dflash_method
from engine.method_spec import MethodSpec

__all__ = ["MethodSpec", "all_methods", "chain_drafts", "chain_size", "draft_methods", "get", "names", "register"]

_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    """Add ``spec`` (a new name goes last; a registered name is replaced in place)."""
    taken = {a for m in _REGISTRY.values() if m.name != spec.name for a in (m.name, *m.aliases)}
    clash = taken & {spec.name, *spec.aliases}
    if clash:
        raise ValueError(f"method name {sorted(clash)[0]!r} is registered already")
    _REGISTRY[spec.name] = spec


@contextmanager
def registered(spec: MethodSpec) -> Iterator[MethodSpec]:
    """``spec`` registered for the block, the registry as it was afterwards (tests)."""
    before = dict(_REGISTRY)
    register(spec)
    try:
        yield spec
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(before)


for _spec in (*none_method.METHODS, *ngram_method.METHODS, *eagle_method.METHODS, *standalone_method.METHODS,
              *medusa_method.METHODS, *dflash_method.METHODS):
    register(_spec)


def all_methods() -> tuple[MethodSpec, ...]:
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """Every method's name, in registration order (the baseline first)."""
    return tuple(_REGISTRY)


def get(name: str) -> MethodSpec | None:
    return _REGISTRY.get(name)


def draft_methods() -> tuple[str, ...]:
    """The methods that take ``--draft``."""
    return tuple(m.name for m in _REGISTRY.values() if m.takes_draft)


def llamacpp_methods() -> tuple[str, ...]:
    """The methods llama.cpp runs too (a ``--spec-type`` of its own)."""
    return tuple(m.name for m in _REGISTRY.values() if m.llamacpp)


def tree_methods() -> tuple[str, ...]:
    """The methods that grow a tree of ``tree_width`` over ``num_steps`` levels."""
    return tuple(m.name for m in _REGISTRY.values() if m.tree)


def reading(knob: str) -> tuple[str, ...]:
    """The methods ``knob`` acts on (``ngram_corpus``: those given the n-gram corpus)."""
    return tuple(m.name for m in _REGISTRY.values() if knob in m.knobs)


def one_pass_tree(name: str | None) -> bool:
    """Whether method ``name`` searches its tree of ``tree_width`` over one drafter forward
    (MethodSpec.one_pass_tree)."""
    spec = _REGISTRY.get(name or "")
    return spec is not None and spec.one_pass_tree


def takes_draft(name: str) -> bool:
    spec = _REGISTRY.get(name)
    return spec is not None and spec.takes_draft


def is_tree(name: str | None) -> bool:
    spec = _REGISTRY.get(name or "")
    return spec is not None and spec.tree


def aliases() -> dict[str, str]:
    """Every name ``--method`` takes (lower case) -> the method: the names, then the aliases."""
    out = {m.name: m.name for m in _REGISTRY.values()}
    out.update({a: m.name for m in _REGISTRY.values() for a in m.aliases})
    return out


def chain_size(num_steps: int) -> int:
    """SGLang's rule for a tree method at top-k 1: a chain of ``num_steps`` drafts, so the tree holds
    ``num_steps + 1`` tokens, the root included (used where the tree size is left unset, and as the
    most a chain can hold)."""
    return num_steps + 1


def chain_drafts(name: str, num_steps: int, num_draft_tokens: int) -> int:
    """Drafts a server's chain of method ``name`` holds (vLLM's num_speculative_tokens, llama.cpp's
    --spec-draft-n-max): ``num_steps`` for a tree method (its chain is top-k 1), else the tree size
    without the root (n-gram's lookup, a block drafter's guesses)."""
    return num_steps if is_tree(name) else num_draft_tokens - 1


def listed(items: tuple[str, ...] | list[str], last: str = "or") -> str:
    """``a, b, c or d``: how messages list methods."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"
