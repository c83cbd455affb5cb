"""Session.warm_up: the chat pays the first answer's one-time costs while its user types, and the
answers that follow are a fresh session's, token for token.

Why it matters: the first answer after a load paid the verify-cost calibration (about 2 s on the
embedded model where it is measured lazily), the first forwards' one-time costs and the thread
governor's first exploration; in a first compare all of that fell on the baseline, which runs first,
and inflated the speed-up. The warm-up must not be seen in any answer: not in its tokens, its random
state, the conversation or what the budgets learn.
"""

from __future__ import annotations

import threading

import pytest

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.ngram import NgramDrafter
from engine.events import Started, Step
from engine.session import Session
from engine.threads import ThreadGovernor
from specchat.tui.host import EngineHost, wait_items
from specchat.tui.host_api import HOST_JOB, ChatJob, JobDone, Loaded
from tests.test_session_preamble import PREAMBLE, TemplateTokenizer
from tests.tiny import our_model

_MODEL = our_model("llama", 0)[0]


def _session(calibrate: bool = False, threads: ThreadGovernor | None = None, **cfg) -> Session:
    config = SpecConfig(**{"method": "ngram", "max_new_tokens": 24, **cfg})
    return Session(_MODEL, TemplateTokenizer(), config, drafters={"none": NoDrafter, "ngram": NgramDrafter},
                   calibrate_costs=calibrate, threads=threads)


def _answer(session: Session, text: str) -> tuple[Started, list[int]]:
    events = list(session.chat(text))
    started = next(e for e in events if isinstance(e, Started))
    return started, [c.id for e in events if isinstance(e, Step) for c in e.committed]


# rejection sampling draws by the tree, which the adaptive budget sizes from wall-clock timings: fixed here
@pytest.mark.parametrize("cfg", [{}, {"temperature": 0.9, "seed": 7, "sampling": "rejection", "adaptive_draft": False},
                                 {"temperature": 0.9, "seed": 7, "sampling": "coupled"}],
                         ids=["greedy", "rejection-seeded", "coupled-seeded"])
def test_answers_after_a_warm_up_are_a_fresh_sessions(cfg: dict) -> None:
    fresh, warmed = _session(**cfg), _session(**cfg)
    warmed.warm_up()
    for text in ("abcabc", "bcd"):  # two turns: the second reads the first from the cache
        assert _answer(warmed, text)[1] == _answer(fresh, text)[1]
    assert warmed.messages == fresh.messages


def test_a_warm_up_leaves_a_fresh_conversation_with_its_preamble_cached() -> None:
    session = _session(calibrate=True)
    session.warm_up()
    assert session.messages == [] and session.context_used == len(PREAMBLE)
    assert session.measured_cost_shape is not None  # the calibration was paid here
    assert session.learned_cost_curves == {}  # the scratch steps taught the budgets nothing
    started, _ = _answer(session, "abc")
    assert started.reused_tokens == len(PREAMBLE) and started.cost_shape  # the first answer starts warm


def test_a_warm_up_runs_the_thread_governors_first_exploration() -> None:
    counts: list[int] = []
    governor = ThreadGovernor(full=2, set_threads=counts.append)
    session = _session(threads=governor)
    session.warm_up()
    # the trial ran (one thread and all in turn) and reached its verdict (which one depends on the host)
    assert counts[:2] == [1, 2] and governor.explored and governor.trial is None
    assert counts[-1] == governor.current


def test_a_warm_up_leaves_a_conversation_under_way_alone() -> None:
    session = _session()
    _answer(session, "abc")
    messages, used = session.messages, session.context_used
    session.warm_up()
    assert session.messages == messages and session.context_used == used


def test_the_host_warms_up_before_the_first_job() -> None:
    session = _session()
    host = EngineHost(lambda progress: session, lambda: None)
    threading.Thread(target=host.run, daemon=True).start()
    seen: list = []
    try:
        seen += wait_items(host, lambda items: any(isinstance(i, Loaded) for i in items))  # as the app waits
        job = host.submit(ChatJob("abc"))
        seen += wait_items(host, lambda items: any(isinstance(i, JobDone) and i.job == job for i in seen + items))
        assert [(i.job, i.kind, i.error) for i in seen if isinstance(i, JobDone)] == [
            (HOST_JOB, "warm", ""), (job, "chat", "")]
    finally:
        host.shutdown()
