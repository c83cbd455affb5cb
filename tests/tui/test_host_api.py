"""Both hosts have the surface the app types them by, and both sessions the surface a host needs.

Static-ish on purpose: every member of the Protocol exists on each implementation, a method with a
signature a caller of the Protocol can use (same parameters, in order, of the same kinds, with the
same defaults; an implementation may add optional ones after them), a property as a property or an
attribute. A host or session that drifts fails here, naming the member, instead of at a user's call.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import pytest

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.session import Session
from specchat.tui.engine_process import ProcessHost
from specchat.tui.headless import CONFIG
from specchat.tui.host import EngineHost
from specchat.tui.host_api import Gate, Host, HostedSession, Inbox
from specchat.tui.scripted import ScriptedLoader, ScriptedSession
from tests.tiny import TinyTokenizer, our_model


def protocol_members(proto: type) -> dict[str, Any]:
    """Name -> what the Protocol declares (a function, a property, or an annotation for a plain attribute)."""
    members: dict[str, Any] = {}
    for cls in reversed(proto.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        members.update({name: annotation for name, annotation in getattr(cls, "__annotations__", {}).items()})
        members.update({name: value for name, value in vars(cls).items()
                        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))})
    return members


def _parameters(fn: Any) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def signature_gaps(proto: type, impl: object) -> list[str]:
    """What ``impl`` lacks of ``proto``, one line per member (empty: it satisfies it)."""
    gaps = []
    for name, declared in protocol_members(proto).items():
        if not hasattr(impl, name):
            gaps.append(f"{name}: missing")
            continue
        if not inspect.isfunction(declared):
            if callable(getattr(type(impl), name, None)) and not isinstance(getattr(type(impl), name), property):
                gaps.append(f"{name}: a method where the Protocol has a value")
            continue
        have = getattr(type(impl), name, None)
        if not inspect.isfunction(have):
            gaps.append(f"{name}: not a method")
            continue
        want, got = _parameters(declared), _parameters(have)
        shape = [(p.name, p.kind, p.default) for p in want]
        if [(p.name, p.kind, p.default) for p in got[: len(want)]] != shape or any(
                p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                for p in got[len(want):]):
            gaps.append(f"{name}: {inspect.signature(have)} is not {inspect.signature(declared)}")
    return gaps


def test_the_checker_names_a_missing_member_and_a_changed_signature() -> None:
    class Half:
        model_name = "x"

        def chat(self, text: str) -> None: ...  # renamed parameter

    gaps = signature_gaps(HostedSession, Half())
    assert "reset: missing" in gaps and any(g.startswith("chat: ") for g in gaps)
    assert not any(g.startswith("model_name") for g in gaps)


def _real_session() -> Session:
    model = our_model("llama", 0)[0]
    return Session(model, TinyTokenizer(), SpecConfig(method="none"), drafters={"none": NoDrafter})


@pytest.mark.parametrize("make", [_real_session, lambda: ScriptedSession(config=CONFIG)], ids=["Session", "scripted"])
def test_both_sessions_have_what_a_host_needs(make) -> None:
    session = make()
    assert signature_gaps(HostedSession, session) == []
    assert isinstance(session, HostedSession)


def test_both_hosts_have_what_the_app_needs() -> None:
    thread_host = EngineHost(None, lambda: None)
    process_host = ProcessHost(ScriptedLoader(CONFIG), lambda: None)
    try:
        for host in (thread_host, process_host):
            assert signature_gaps(Host, host) == [], type(host).__name__
            assert signature_gaps(Inbox, host.mailbox) == [] and signature_gaps(Gate, host.gate) == []
            assert isinstance(host, Host)
    finally:
        process_host.shutdown()
