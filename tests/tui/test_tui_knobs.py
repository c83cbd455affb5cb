"""The palette and the settings panel refuse a knob out of its bounds (engine/knobs.py) in one
line and keep the old value: ``num_steps 99999`` typed mid-chat used to make Esc useless."""

from __future__ import annotations

import pytest

from specchat.tui.headless import SIZE, make_app, make_session, wait_loaded
from tests.tui.helpers import palette


@pytest.mark.parametrize(("typed", "name", "needle"), [
    ("num_steps 99999", "num_steps", "num_steps must be an integer from 1 to 32 (--speculative-num-steps)"),
    ("topk 65", "eagle_topk", "eagle_topk must be an integer from 1 to 64"),
    ("num_draft_tokens 100000", "num_draft_tokens", "num_draft_tokens must be an integer from 2 to 64"),
    ("temperature nan", "temperature", "temperature must be a number from 0 to 10"),
    ("max_new_tokens 1000000000000", "max_new_tokens", "max_new_tokens must be an integer from 1 to 1_048_576"),
])
async def test_the_palette_refuses_a_value_out_of_bounds_and_keeps_the_old_one(typed: str, name: str,
                                                                                needle: str) -> None:
    session = make_session()
    app = make_app(session)
    messages: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        before = app.applied_config
        real_notify = app.notify

        def notify(message, *args, **kwargs):
            messages.append(str(message))
            return real_notify(message, *args, **kwargs)

        app.notify = notify  # type: ignore[method-assign]
        await palette(pilot, typed, f"Set {name} = ")
        await pilot.pause()
        refusals = [m for m in messages if m.startswith("refused:")]
        assert len(refusals) == 1 and needle in refusals[0] and "\n" not in refusals[0], messages
        assert f"kept {name} = {getattr(before, name):g}" in refusals[0] if isinstance(getattr(before, name), float) \
            else f"kept {name} = {getattr(before, name)}" in refusals[0]
        assert app.applied_config == before and app.pending_config is None and session.config == before
