"""Pilot tests of the app's start and its edges: loading, key maps and the config file, the prompt box,
the palette, the launch helpers and the title (split from test_tui_app.py, which covers streaming,
the tree, settings, cancel, compare and teaching)."""

from __future__ import annotations

from engine.config import ConfigError
from specchat.tui.app import SpecChatApp
from specchat.tui.headless import SIZE, make_app, make_session, wait_idle, wait_loaded, wait_until
from specchat.tui.screens.help import HelpScreen
from specchat.tui.widgets.transcript import AnswerView, UserTurnView
from tests.tui.helpers import palette, send


# --- loading, keys, config --------------------------------------------------------------------------
async def test_loading_screen_shows_progress_then_failure_message():
    import threading

    gate = threading.Event()

    def factory(progress):
        progress("loading weights", 1, 4)
        gate.wait(5)
        raise RuntimeError("no GPU here; use --device cpu\nsecond line hidden")

    app = SpecChatApp(factory=factory, config=make_session().config)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.loading_screen.stages == ["loading weights"])
        assert "(1/4)" in str(app.loading_screen.query_one("#loading-stage").render())
        gate.set()
        await wait_until(pilot, lambda: app.loading_screen.has_class("-failed"))
        err = str(app.loading_screen.query_one("#loading-error").render())
        assert "RuntimeError: no GPU here; use --device cpu" in err and "second line" not in err
        assert app.submit_prompt("x") is False


async def test_key_bindings_are_remapped_from_the_toml_config(tmp_path, monkeypatch):
    from specchat.tui.userconfig import load_ui_settings

    cfg = tmp_path / "config.toml"
    cfg.write_text('theme = "light"\nbogus = 1\n[keys]\nhelp = "f12"\nnope = "x"\n')
    monkeypatch.setenv("SPECCHAT_CONFIG", str(cfg))
    ui, warnings = load_ui_settings()
    assert ui.theme == "light" and dict(ui.keymap) == {"help": "f12"}
    assert any("bogus" in w for w in warnings) and any("nope" in w for w in warnings)
    app = make_app(ui=ui.replace(cursor_blink=False), warnings=warnings)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.theme == "specchat-light"
        await pilot.press("f1")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen), "f1 was remapped away"
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "`f12`" in app.screen.query_one("#help-text").source


async def test_broken_config_file_falls_back_to_defaults(tmp_path, monkeypatch):
    from specchat.tui.userconfig import load_ui_settings

    cfg = tmp_path / "config.toml"
    cfg.write_text("theme = \n")
    monkeypatch.setenv("SPECCHAT_CONFIG", str(cfg))
    ui, warnings = load_ui_settings()
    assert ui.theme == "dark" and len(warnings) == 1 and str(cfg) in warnings[0]


async def test_prompt_is_multiline_with_history():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        prompt = app.chat_screen.prompt
        await pilot.press("h", "i", "ctrl+j", "y", "o")
        assert prompt.text == "hi\nyo"
        await pilot.press("enter")
        await wait_idle(pilot)
        assert prompt.text == ""
        assert [u.text for u in app.chat_screen.query(UserTurnView)] == ["hi\nyo"]
        await pilot.press("up")
        assert prompt.text == "hi\nyo"
        await pilot.press("down")
        assert prompt.text == ""


async def test_busy_engine_refuses_a_second_prompt_and_new_chat_resets():
    session = make_session(step_delay=0.15)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "one")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None)
        assert app.submit_prompt("two") is False
        session.step_delay = 0
        await wait_idle(pilot)
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        assert session.messages == [] and not list(app.chat_screen.query(AnswerView))


async def test_command_palette_sets_a_value_by_name():
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await palette(pilot, "topk 2", "Set eagle_topk = 2")
        await wait_until(pilot, lambda: app.applied_config.eagle_topk == 2, what="applied")
        assert session.config.eagle_topk == 2


def test_launch_helpers_stay_light_and_read_cli_args():
    import dataclasses
    import subprocess
    import sys

    from tests.parsed import parsed

    code = ("import sys; from specchat.cli import build_parser; from specchat.command_options import options_for; "
            "from specchat.tui.launch import config_from_args; "
            "c = config_from_args(options_for(build_parser().parse_args(['run', '--method', 'EAGLE2', "
            "'--speculative-num-steps', '3']))); "
            "print(c.method, c.num_steps, 'textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["eagle", "3", "False"], "no Textual import before the UI starts"

    from specchat.tui.launch import config_from_args

    options = parsed("run")
    assert config_from_args(options).method == "ngram"
    import pytest

    def given(**knobs):
        return dataclasses.replace(options, spec=dataclasses.replace(options.spec, knobs=knobs))

    with pytest.raises(ConfigError, match="num_draft_tokens"):
        config_from_args(given(num_draft_tokens=1))
    with pytest.raises(ConfigError, match="unknown method"):
        config_from_args(given(method="lookahead"))


async def test_help_opened_while_loading_does_not_break_the_switch_to_chat():
    import threading

    gate = threading.Event()
    session = make_session()

    def factory(progress):
        gate.wait(5)
        return session

    app = SpecChatApp(factory=factory, config=session.config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("f3")  # no compare over a dialog
        assert isinstance(app.screen, HelpScreen)
        gate.set()
        await wait_loaded(pilot)
        assert app.screen is app.chat_screen
        assert app.loading_screen not in app.screen_stack


async def test_title_names_the_fast_precision_and_not_the_exact_one():
    session = make_session()
    for precision, shown in (("fast", True), ("exact", False)):
        app = make_app(session, precision=precision)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(pilot)
            title = str(app.chat_screen.query_one("#title").render())
            assert ("fast precision" in title) is shown and "exact" not in title


def test_title_names_rejection_sampling_where_it_is_in_force() -> None:
    """The title says how a sampled answer is drawn when it is not the default (coupled), so a
    user who switched to rejection sampling sees why the compare view's texts now differ."""
    from engine.config import SpecConfig
    from specchat.tui.widgets.title_bar import config_summary

    assert config_summary(SpecConfig(method="ngram")).endswith("· greedy")
    assert config_summary(SpecConfig(temperature=0.7)).endswith("T 0.7 top-p 1")
    assert config_summary(SpecConfig(temperature=0.7, sampling="rejection")).endswith("T 0.7 top-p 1 rejection")
    assert config_summary(SpecConfig(sampling="rejection")).endswith("· greedy")  # greedy draws nothing
