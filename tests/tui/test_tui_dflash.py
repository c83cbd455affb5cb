"""DFlash in the app (issue 56 item 5): a real session on a tiny random target with a tiny random DFlash
drafter (tests/dflash_drafts.py) drives the tree panel's block view, teaching mode and compare
``dflash,eagle3``; the block view's SVG snapshot comes from the scripted engine (fixed timings).

The block reaches the UI as the event's data (``Step.block``, engine/events.py), asked for with
``Session.report_blocks`` as the app's loader does (specchat/tui/launch.py).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

from engine import methods
from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.draft_loader import load_draft
from engine.events import Step, event_from_dict, event_to_dict
from engine.models.llama import LlamaConfig, LlamaModel
from engine.session import Session
from specchat.tui.app import SpecChatApp
from specchat.tui.headless import ui_settings, wait_idle, wait_loaded, wait_until
from specchat.tui.launch import BLOCK_CANDIDATES
from specchat.tui.teaching import explain_step
from specchat.tui.trace_types import check_record
from tests.dflash_drafts import write_dflash
from tests.heads import write_head
from tests.tiny import TinyTokenizer, family_config, hf_model
from tests.tui.helpers import send

VOCAB = 11  # random drafts over 11 tokens land often enough to show accepted and refused positions
LAYERS = 6
BLOCK = 8
_TMP = Path(tempfile.mkdtemp(prefix="specchat-tui-dflash-"))


class Letters(TinyTokenizer):
    """The tiny tokenizer with a visible letter for every id (the panel shows each candidate's text) and
    no stop token (each answer runs to max_new_tokens: every step has the target's own token)."""

    def __init__(self, vocab_size: int = VOCAB) -> None:
        super().__init__(vocab_size, stop_ids=frozenset())

    def _char(self, i: int) -> str:
        return chr(0x41 + i)


def _target_config() -> dict:
    return {**family_config("llama"), "num_hidden_layers": LAYERS, "vocab_size": VOCAB}


@functools.cache
def _target() -> LlamaModel:
    hf, cfg = hf_model("llama", 0, num_hidden_layers=LAYERS, vocab_size=VOCAB)
    return LlamaModel(LlamaConfig.from_dict(cfg), {k: v.detach().clone() for k, v in hf.state_dict().items()})


@functools.cache
def _bundle(method: str):
    if method == "dflash":
        folder = write_dflash(_TMP / "dflash", _target_config(), block=BLOCK, ids=[1, 3])
    else:
        folder = write_head(_TMP / "eagle3", _target_config(), "eagle3")
    return load_draft(str(folder), _target(), Letters(), method=method)


def session(config: SpecConfig, *, eagle: bool = False, candidates: int = BLOCK_CANDIDATES) -> Session:
    dflash = _bundle("dflash")
    s = Session(_target(), Letters(), config, drafters={"none": NoDrafter, "dflash": dflash.factory},
                features=dflash.features)
    if eagle:
        head = _bundle("eagle3")
        s.set_draft(head.method, head.factory, head.features)
    s.report_blocks(candidates)
    return s


# a chain (tree width 1): the tests read the chain position by position; a DDTree (width > 1) has its own test
CONFIG = SpecConfig(method="dflash", num_draft_tokens=BLOCK, eagle_topk=1, max_new_tokens=48, adaptive_draft=False)
PROMPT = "DEFGHD"


def app_for(s: Session, **kw) -> SpecChatApp:
    kw.setdefault("ui", ui_settings(save_sessions=False))
    return SpecChatApp(factory=lambda progress: s, config=s.config, **kw)


# --- the engine's side: the event carries the block --------------------------------------------------
def test_a_block_step_carries_every_position_with_its_best_guesses_only_when_asked() -> None:
    steps = [e for e in session(CONFIG).chat(PROMPT) if isinstance(e, Step)]
    drafted = steps[1:]
    assert drafted and all(len(s.block) == BLOCK - 1 for s in drafted)  # positions 1..B-1 after the root
    for step in drafted:
        for depth, row in enumerate(step.block, start=1):
            assert len(row) == BLOCK_CANDIDATES
            probs = [c.prob for c in row]
            assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-5
            assert [c.text for c in row] == [chr(0x41 + c.id) for c in row]
            assert row[0].id == step.tree.tokens[depth]  # greedy: the chain is each position's best guess
            assert abs(row[0].prob - step.tree.draft_probs[depth]) < 1e-5
        back = event_from_dict(event_to_dict(step))
        assert back.block == step.block
        check_record(back)  # a trace with blocks replays
    # bench and generate never ask: no top-k, no block in the events
    assert all(not s.block for s in session(CONFIG, candidates=0).chat(PROMPT) if isinstance(s, Step))
    assert "block" not in event_to_dict(steps[0])  # a step without a block writes the trace line as before


def _telling(history) -> int:
    """The history index of a block step with accepted and refused positions (the last one)."""
    found = [i for i, e in enumerate(history) if e.step.block and e.step.accepted_len and e.step.rejected]
    assert found, "no block step accepted and refused positions: the test would show neither"
    return found[-1]


# --- the tree panel ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_tree_panel_shows_the_block_position_by_position(size) -> None:
    app = app_for(session(CONFIG))
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT)
        await wait_idle(pilot)
        if size[0] < 100:
            await pilot.press("f6")  # the side panels stacked under the chat
        panel = app.chat_screen.tree
        history = list(panel.history)
        target = _telling(history)
        panel.browse(target - (len(history) - 1))
        await pilot.pause()
        step, view = history[target].step, panel.view
        kept, lines = step.accepted_len, view.lines
        assert view.step is step and lines[0].startswith("◆ ‹")
        rows = [line for line in lines[1:] if not line.lstrip().startswith("★")]
        assert len(rows) == len(step.block) == BLOCK - 1 and len(lines) == len(rows) + 2
        for depth, (line, row) in enumerate(zip(rows, step.block, strict=True), start=1):
            glyph = "✓" if depth <= kept else "✗" if depth == kept + 1 else "·"
            assert line.startswith(f"{depth} {glyph} "), line
            for cand in row:
                assert f"‹{cand.text}› {cand.prob:.2f}" in line
        own = lines.index(next(line for line in lines if "★" in line))
        assert own == kept + 2, "the target's token right under the refused position"
        assert f"★ ‹{step.committed[-1].text}›  correction" in lines[own]
        # the candidate the tree held at each position is styled as its node: accepted, then refused;
        # the others are dimmed
        content = view.render()
        starts = {span.start: span.style for span in content.spans}
        offsets = [sum(len(line) + 1 for line in lines[:k]) for k in range(len(lines))]
        for depth in range(1, kept + 2):
            line, at = lines[depth], offsets[depth]
            first, second = line.index("‹"), line.index("‹", line.index("‹") + 1)
            assert starts[at + first] == (".tree--accepted" if depth <= kept else ".tree--rejected"), line
            assert starts[at + second] == ".tree--guide", line
        title = str(panel.query_one("#tree-title").render())
        assert f"{BLOCK - 1} guesses in one pass" in title and f"kept {kept}+1" in title


# --- teaching mode -----------------------------------------------------------------------------------
async def test_teaching_explains_the_block_in_plain_words() -> None:
    app = app_for(session(CONFIG), teach=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT)
        for n in range(1, 40):  # step until a block with accepted and refused positions is on screen
            await wait_until(pilot, lambda n=n: app.gate_waiting and len(app.chat_screen.tree.history) >= n,
                             what=f"step {n}")
            step = app.chat_screen.tree.current.step
            if step.block and step.accepted_len and step.rejected:
                break
            await pilot.press("f8")
        else:
            pytest.fail("no block with accepted and refused positions in 40 steps")
        teach = str(app.chat_screen.query_one("#teach").render())
        kept, n = step.accepted_len, len(step.block)
        assert explain_step(step, "dflash") in teach
        assert f"filled a block of {n} guesses in one pass" in teach
        assert methods.get("dflash").teaching in teach  # the registration's sentence
        first = "only the first" if kept == 1 else f"the first {kept}"
        assert f"This block: {n} guesses in one pass, {first} accepted." in teach
        assert f"from {step.block[0][0].prob:.2f} at position 1 to {step.block[-1][0].prob:.2f} at position {n}" \
            in teach or step.block[-1][0].prob >= step.block[0][0].prob
        await pilot.press("f4")
        await wait_idle(pilot)


# --- compare dflash,eagle3, the charts and the method switch -----------------------------------------
async def test_compare_dflash_with_eagle3_side_by_side() -> None:
    s = session(CONFIG, eagle=True)
    app = app_for(s, ui=ui_settings(save_sessions=False, compare="dflash,eagle3"), start_in="compare")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT, "#compare-prompt")
        await wait_idle(pilot)
        screen = app.compare_screen
        a, b = screen.pane("baseline"), screen.pane("spec")
        assert (a.result.method, b.result.method, screen.plain.method) == ("dflash", "eagle3", "none")
        assert a.stream.plain_text == b.stream.plain_text != ""
        assert screen.badge_text.startswith("✓ both identical to the baseline")
        assert "dflash " in screen.badge_text and "eagle3 " in screen.badge_text
        assert [line.split()[0] for line in screen.depth_text.splitlines()[1:]] == ["dflash", "eagle3"]
        # the compare's dflash steps join the tree history with their blocks
        assert any(e.step.block for e in app.chat_screen.tree.history)


async def test_charts_and_the_method_menu_include_dflash() -> None:
    from textual.widgets import Select

    app = app_for(session(CONFIG, eagle=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT)
        await wait_idle(pilot)
        view = app.charts.view()
        assert view.method == "dflash" and view.answer_depth and view.answer_depth[0].depth == 1
        assert len(view.committed) == len(app.chat_screen.tree.history)
        await pilot.press("f9")
        await wait_until(pilot, lambda: getattr(app.screen, "drawn", -1) == app.charts.version, what="charts")
        await pilot.press("f9")
        # F2: the session's methods, generated from the registry (a block drafter loaded: dflash offered)
        await pilot.press("f2")
        await pilot.pause()
        options = [str(o[0]) for o in app.chat_screen.settings.query_one("#set-method", Select)._options]
        assert options == ["none", "eagle3", "dflash"] or set(options) == {"none", "eagle3", "dflash"}
        assert app.apply_setting("method", "eagle3") is None and app.applied_config.method == "eagle3"


def _title(app: SpecChatApp) -> str:
    from specchat.tui.widgets.title_bar import TitleBar

    return str(app.screen.query_one(TitleBar).render())


@pytest.mark.parametrize(("flags", "topk"), [({}, 1), ({"eagle_topk": 3}, 3)], ids=["unset", "topk-flag"])
async def test_a_method_switch_gives_the_knobs_nobody_set_the_new_methods_defaults(flags, topk) -> None:
    """``run --method dflash`` (with or without ``--speculative-eagle-topk 3``): F2's method menu switches
    to eagle3 and back. The knobs nobody set take each method's own defaults (dflash: a chain of a block of
    16), shown in the title bar, the panel and the notice; a flag, or a value set in the palette, is kept."""
    from textual.widgets import Input, Select

    from tests.tui.helpers import palette, spy_notes

    start = SpecConfig.for_method("dflash", flags, base={"max_new_tokens": 48, "adaptive_draft": False})
    app = app_for(session(start, eagle=True), given=frozenset(flags))  # what launch hands the app for the flags
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_loaded(pilot)
        notes = spy_notes(app)
        assert f"dflash · topk {topk} · tokens 16" in _title(app)
        await pilot.press("f2")
        await pilot.pause()
        panel = app.chat_screen.settings

        async def choose(method: str) -> SpecConfig:
            panel.query_one("#set-method", Select).value = method  # what picking it in the menu does
            await wait_until(pilot, lambda: app.applied_config.method == method, what=method)
            await pilot.pause()
            return app.applied_config

        tree = await choose("eagle3")
        assert (tree.eagle_topk, tree.num_draft_tokens, tree.num_steps) == (4 if not flags else topk, 8, 5)
        assert (tree.max_new_tokens, tree.adaptive_draft) == (48, False)  # no method's knobs: kept
        assert f"eagle3 · steps 5 · topk {tree.eagle_topk} · tokens 8" in _title(app)
        assert panel.query_one("#set-num_draft_tokens", Input).value == "8"
        assert any(n.startswith("method = eagle3 applied (its defaults: ") and "num_draft_tokens 8" in n
                   for n in notes), notes
        await palette(pilot, "topk 2", "Set eagle_topk = 2")  # the user's now
        await wait_until(pilot, lambda: app.applied_config.eagle_topk == 2, what="topk 2")
        block = await choose("dflash")
        assert (block.eagle_topk, block.num_draft_tokens) == (2, 16)  # kept; dflash's block again
        assert "dflash · topk 2 · tokens 16" in _title(app)
        await send(pilot, PROMPT)
        await wait_idle(pilot)
        assert app.chat_screen.tree.history  # the swapped settings draft


def test_export_prints_the_servers_block_lines() -> None:
    """SGLang DFLASH, vLLM dflash and llama.cpp draft-dflash, from the registration."""
    from specchat.export import launch_line

    config = SpecConfig(method="dflash", num_draft_tokens=16)
    assert "--speculative-algorithm DFLASH" in launch_line("sglang", config, None, "d").command
    assert '"method": "dflash"' in launch_line("vllm", config, None, "d").command
    assert "--spec-type draft-dflash" in launch_line("llamacpp", config, None, "d").command


@pytest.mark.parametrize("theme", ["dark", "light", "colourblind"])
async def test_the_block_view_reads_at_4_5_to_1_in_every_theme(theme) -> None:
    from tests.tui.test_tui_issue10 import _segments_below_contrast

    app = app_for(session(CONFIG), ui=ui_settings(theme=theme, save_sessions=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT)
        await wait_idle(pilot)
        panel = app.chat_screen.tree
        history = list(panel.history)
        panel.browse(_telling(history) - (len(history) - 1))
        await pilot.pause()
        assert any("✗" in line for line in panel.view.lines)
        bad = _segments_below_contrast(app)
    assert not bad, f"{theme}: text below 4.5:1: " + "; ".join(bad[:12])


async def test_a_tree_grown_from_a_block_is_drawn_as_a_tree_with_the_blocks_rows_under_it() -> None:
    """A DDTree-style step (branches chosen from the block's per-position candidates): the tree as
    EAGLE's are drawn, then one row per position of the block (no second ★: the tree has it)."""
    from engine.events import Candidate, CommittedToken, Finished, Started
    from engine.tree import DraftTree
    from specchat.tui.headless import make_app
    from specchat.tui.scripted import ScriptedSession

    texts = ("◆", "a", "b", "c", "d")
    # root -> a (accepted) -> c, d (refused); root -> b (a sibling of the kept one: never reached)
    tree = DraftTree((0, 1, 2, 3, 4), (-1, 0, 0, 1, 1), (1.0, 0.6, 0.3, 0.5, 0.2))
    block = ((Candidate(1, "a", 0.6), Candidate(2, "b", 0.3)), (Candidate(3, "c", 0.5), Candidate(4, "d", 0.2)),
             (Candidate(5, "e", 0.4), Candidate(6, "f", 0.1)))
    step = Step(index=1, tree=tree, tree_text=texts, accepted=(1,), bonus=7,
                committed=(CommittedToken(1, "draft", "a"), CommittedToken(7, "target", "g")), text="ag", block=block)
    first = Step(index=0, tree=DraftTree.root_only(0), tree_text=("◆",), bonus=0,
                 committed=(CommittedToken(0, "target", "◆"),), text="◆")
    answer = [Started(config=CONFIG.to_dict(), drafter="dflash"), first, step, Finished(text="◆ag", tokens=3)]
    app = make_app(ScriptedSession([answer], config=CONFIG), ui=ui_settings(save_sessions=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "x")
        await wait_idle(pilot)
        panel = app.chat_screen.tree
        panel.browse(-0)
        lines = panel.view.lines
        assert lines[:6] == ["◆ ‹◆›", "├─✓ ‹a›  0.60", "│ ├─✗ ‹c›  0.50", "│ ├─✗ ‹d›  0.20",
                             "│ └─★ ‹g›  correction", "└─· ‹b›  0.30"]
        assert lines[6:] == ["", "the block, position by position:", "1 ✓ ‹a› 0.60  ‹b› 0.30",
                             "2 ✗ ‹c› 0.50  ‹d› 0.20", "3 · ‹e› 0.40  ‹f› 0.10  not checked"]
        assert "3 guesses in one pass · a tree of 4" in str(panel.query_one("#tree-title").render())
        assert "grew a tree of 4 tokens from each position's best guesses" in explain_step(step, "dflash")


def test_the_event_carries_the_blocks_rows_as_data_never_the_drafters_tensor() -> None:
    """A step's tree reaches the UI (a pipe, the tree history) without the block's [rows, vocab]
    log-probabilities: Step.block holds what the panel draws."""
    steps = [e for e in session(CONFIG).chat(PROMPT) if isinstance(e, Step)]
    assert steps[1].block and all(s.tree.block is None for s in steps)


async def test_a_recorded_dflash_answer_replays_its_blocks(tmp_path) -> None:
    from specchat.tui.headless import replay_app

    path = tmp_path / "dflash.jsonl"
    live = app_for(session(CONFIG), record=str(path))
    async with live.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, PROMPT)
        await wait_idle(pilot)
        shown = [e.step.block for e in live.chat_screen.tree.history]
    replay = replay_app(path)
    async with replay.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        history = list(replay.chat_screen.tree.history)
        assert [e.step.block for e in history] == shown and any(shown)
        assert replay.chat_screen.tree.view.lines[1].startswith("1 ")
