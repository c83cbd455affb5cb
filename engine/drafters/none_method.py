"""The baseline's registration: no drafter (``NoDrafter``, base.py), a root-only tree each step."""

from __future__ import annotations

from engine.method_spec import MethodSpec

NONE = MethodSpec("none", note="the baseline", drafter="engine.drafters.base:NoDrafter")

METHODS = (NONE,)
