"""Which two methods the compare view runs: method A against method B on the same prompt.

The default is the question the view was built for: the baseline (``none``) against the method in
force. ``compare medusa,eagle3`` in the command palette, or ``specchat run --compare medusa,eagle3``,
asks another ("which method for my prompts?"); the baseline then runs too, so each side also has
its speed-up against plain decoding. A choice the session cannot run (a Medusa method without a
Medusa head loaded) is refused in one line before anything runs, and the previous choice stays.

No Textual imports: parsed and checked here, shown by the compare screen.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine import methods as registry
from engine.config import ConfigError

DEFAULT = ""  # the baseline against the method in force


def parse_pair(text: str, methods: Sequence[str] = ()) -> str:
    """``text`` as the canonical ``A,B`` (or :data:`DEFAULT`); ConfigError in one line when it names
    an unknown method, the same method twice, or a method ``methods`` (the session's) lacks.

    Accepted: ``medusa,eagle3``, ``medusa eagle3``, ``medusa vs eagle3``, one method (the
    baseline against it), ``default`` or nothing (the baseline against the method in force).
    """
    names = [n for n in re.split(r"[\s,]+|\bvs\b", text.strip().lower()) if n]
    if not names or names == ["default"]:
        return DEFAULT
    if len(names) == 1:
        names = ["none", *names]
    if len(names) != 2:
        raise ConfigError(f"compare takes two methods, e.g. 'compare medusa,eagle3'; got {text.strip()!r}")
    for name in names:
        if registry.get(name) is None:
            raise ConfigError(f"compare: unknown method {name!r}; methods: {', '.join(registry.names())}")
        if methods and name not in methods:
            raise ConfigError(f"compare: {name} cannot run in this session (have: {', '.join(methods)}); "
                              "EAGLE, Medusa and standalone need their draft: specchat run --draft PATH")
    a, b = names
    if a == b:
        raise ConfigError(f"compare: pick two different methods (both are {a})")
    if b == "none":  # the baseline is always method A, on the left
        a, b = b, a
    return f"{a},{b}"


def pair_methods(pair: str, in_force: str) -> tuple[str, str]:
    """The methods a compare runs now: (A, B) from a canonical pair, or the default."""
    if not pair:
        return "none", in_force
    a, _, b = pair.partition(",")
    return a, b


def pair_label(pair: str, in_force: str) -> str:
    """For the settings and the title: ``medusa vs eagle3``."""
    a, b = pair_methods(pair, in_force)
    return f"{a} vs {b}"
