"""``specchat bench --tui N``: does the chat stream at the engine's own speed?

Each of the N pairs answers one prompt twice, each from a fresh conversation (both prefill cold):
headless (the session's generator drained in this process, as ``bench`` and ``generate`` do), then
through the chat app as ``specchat run`` starts it (the engine in its own process, the interface
in this one, drawing a 120x40 screen with no terminal attached). Each chat answer is compared with
the headless answer just before it, because this kind of machine drifts by up to 40% between
answers; the median of those ratios is the verdict.

Both sides verify the same tree: the adaptive budget is off here, since it sizes trees from the
timings it measures, so two sessions with different histories would do different work and part
for reasons that have nothing to do with streaming. The steps of each pair are compared.

Why a benchmark and not a test: the ratio depends on the host (its cores, what else runs, its
speed between answers). ``tests/tui/test_tui_speed.py`` runs :func:`measure_parity` on the
embedded model and checks what does not depend on it: the same work on both sides, an answer
drawn over several frames.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.events import Finished
from engine.methods import reading
from specchat.options import UsageError, draft_options, make_config

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from specchat.command_options import BenchOptions
    from specchat.tui.app import SpecChatApp

BAR = 0.85  # the chat's aim: within 15% of the engine's own speed (docs/BENCHMARKS.md)
SIZE = (120, 40)  # the screen the app draws (a common terminal; 80x24 draws less)
# used without --prompts: a rewrite, where the chat's n-gram default drafts well and streams fast
DEFAULT_PROMPT = ("Rewrite the following text in the third person, about a woman called Ana. Change only what the "
                  "change of person requires.\n\nI wake up at six every morning and I make a pot of coffee. While "
                  "the coffee brews, I read the news on my phone and I plan my day. Then I walk my dog around the "
                  "park, and when I come back I take a shower and I get ready for work.")


@dataclass(frozen=True)
class Pair:
    """One prompt answered headless, then in the chat."""

    engine_tps: float
    chat_tps: float
    engine_steps: int
    chat_steps: int
    tokens: int  # the chat answer's new tokens
    frames: int  # frames the chat drew while it answered
    elapsed_s: float  # the chat answer's wall time

    @property
    def ratio(self) -> float:
        return self.chat_tps / self.engine_tps

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class Parity:
    """The pairs of one run and what they say."""

    pairs: tuple[Pair, ...]

    @property
    def ratio(self) -> float:
        """The median of the pairs' chat/engine ratios."""
        return statistics.median(p.ratio for p in self.pairs)

    @property
    def same_work(self) -> bool:
        """Every pair's two answers took the same steps (the same trees, verified alike)."""
        return all(p.engine_steps == p.chat_steps for p in self.pairs)

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": [dataclasses.asdict(p) | {"ratio": p.ratio} for p in self.pairs],
                "median_engine_tokens_per_s": statistics.median(p.engine_tps for p in self.pairs),
                "median_chat_tokens_per_s": statistics.median(p.chat_tps for p in self.pairs),
                "median_paired_ratio": self.ratio, "same_work": self.same_work, "bar": BAR}


def chat_app(loader: Callable[..., Any], config: SpecConfig) -> SpecChatApp:
    """The app as ``specchat run`` starts it, minus the terminal: the engine in its own process,
    the default theme, nothing saved to the user's session history."""
    from specchat.tui.app import SpecChatApp
    from specchat.tui.headless import ui_settings

    return SpecChatApp(factory=loader, config=config, ui=ui_settings(save_sessions=False), engine_process=True)


def _headless(session: Any, prompt: str) -> Finished:
    session.reset()
    return [e for e in session.chat(prompt) if isinstance(e, Finished)][-1]


async def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll every 0.2 s, without Pilot's screen round trips: the harness must not compete with the
    app it measures (a user's terminal does not poll the app 100 times a second)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def measure_parity(session: Any, app: SpecChatApp, prompts: Sequence[str], pairs: int,
                         timeout: float = 600.0) -> Parity:
    """``pairs`` answers headless on ``session`` and in ``app``, alternating, prompts in turn.

    Both sides answer once first, unmeasured (kernels, caches, the n-gram corpus; the engine
    process's own). The chat's answers are submitted as Enter in the prompt does, not by a key
    press: after a key Pilot waits for the app to go idle, polling its CPU clock while the answer
    streams, and the harness would compete with what it measures."""
    from specchat.tui.widgets.transcript import AnswerView

    _headless(session, prompts[0])
    done: list[Pair] = []
    async with app.run_test(size=SIZE) as pilot:
        await _wait(lambda: app.loaded or bool(app.load_error), timeout, "the chat's engine to load")
        if app.load_error:
            raise RuntimeError(f"the chat could not load the model: {app.load_error}")

        async def answer(prompt: str) -> tuple[Finished, int]:
            await pilot.press("ctrl+n")  # a fresh conversation, as the headless side's reset
            await _wait(lambda: app.busy_job is None, 60, "the new conversation")
            frames = app.frames
            if not app.submit_prompt(prompt):
                raise RuntimeError("the chat refused the prompt")
            await _wait(lambda: app.busy_job is None, timeout, "the chat's answer")
            finished = app.chat_screen.query(AnswerView).last().finished
            if finished is None:
                raise RuntimeError("the chat's answer did not finish")
            return finished, app.frames - frames

        await answer(prompts[0])
        for n in range(pairs):
            prompt = prompts[n % len(prompts)]
            engine = _headless(session, prompt)
            chat, frames = await answer(prompt)
            done.append(Pair(engine.stats.tokens_per_s, chat.stats.tokens_per_s, engine.stats.steps,
                             chat.stats.steps, chat.tokens, frames, chat.stats.elapsed_s))
    return Parity(tuple(done))


# the command ----------------------------------------------------------------------------------
def check_tui_flags(options: BenchOptions) -> str:
    """The one method timed (not the baseline); refuses what ``--tui`` does not time, in one line."""
    benchmark = dataclasses.replace(options, tui=None).other_benchmark()
    other = benchmark or next((flag for flag, given in (("--peers", options.peers.strip()),
                                                        ("--rounds", options.rounds > 1)) if given), None)
    if other:
        raise UsageError(f"--tui times the chat against the engine, one method in pairs; it does not take {other}")
    from specchat.tui.launch import DEFAULT_METHOD  # the chat's own default

    listed = options.methods or DEFAULT_METHOD
    methods = [m.strip() for m in listed.split(",") if m.strip() and m.strip() != "none"]
    if len(methods) != 1:
        raise UsageError(f"--tui times one method in the chat (e.g. --methods {DEFAULT_METHOD}), not {listed!r}")
    return methods[0]


def _prompts(options: BenchOptions) -> list[str]:
    """Each prompt's first user turn (the chat starts every pair from a fresh conversation)."""
    if not options.prompts:
        return [DEFAULT_PROMPT]
    from engine.prompts import load_prompts

    texts = [chat[0]["content"] for p in load_prompts(options.prompts, options.limit) if (chat := p.chat())]
    if not texts:
        raise UsageError(f"--prompts {options.prompts}: no prompt holds a user turn")
    return texts


def run_tui_bench(options: BenchOptions) -> int:
    """Check the flags, load the headless session, time the pairs, print them (and --json)."""
    from engine.loader import load_session
    from engine.models.progress import rich_progress
    from specchat.bench_report import BENCH_JSON, machine_info, mode_parts, weights_modes
    from specchat.tui.launch import session_loader

    method = check_tui_flags(options)
    modes = weights_modes(options.target)
    if len(modes) > 1:
        raise UsageError(f"--tui runs one weights mode, not {', '.join(modes)}; name one --weights and --precision")
    prompts = _prompts(options)
    config = make_config(options.spec, method=method, max_new_tokens=256).replace(adaptive_draft=False)
    weights, precision = mode_parts(modes[0])
    target = dataclasses.replace(options.target, weights=weights, precision=precision)
    with rich_progress() as progress:
        session = load_session(target.model, config, progress=progress,
                               **target.load_args(), **draft_options(options))
        if session.ngram_corpus is not None and method in reading("ngram_corpus"):  # timed with the whole corpus
            session.ngram_corpus.wait_shown(progress)
    print(f"bench --tui: {method}, {options.tui} pairs, {config.max_new_tokens} new tokens, fixed tree "
          f"(adaptive draft off), chat at {SIZE[0]}x{SIZE[1]} with its engine in its own process", flush=True)
    app = chat_app(session_loader(dataclasses.replace(options, target=target), config), config)
    parity = asyncio.run(measure_parity(session, app, prompts, options.tui))
    report = {"kind": "tui", "method": method, "mode": modes[0], "config": config.to_dict(),
              "machine": machine_info(session.model), **parity.as_dict()}
    if options.json_out:
        BENCH_JSON.write_json(options.json_out, report)
    print_parity(parity)
    return 0


def print_parity(parity: Parity, out=None) -> None:
    out = out or sys.stdout
    print(f"{'pair':>4}  {'engine tok/s':>12}  {'chat tok/s':>10}  {'ratio':>5}  {'steps':>9}  {'frames/s':>8}",
          file=out)
    for n, p in enumerate(parity.pairs, 1):
        steps = f"{p.engine_steps}" if p.engine_steps == p.chat_steps else f"{p.engine_steps}/{p.chat_steps}"
        print(f"{n:>4}  {p.engine_tps:>12.1f}  {p.chat_tps:>10.1f}  {p.ratio:>5.2f}  {steps:>9}  "
              f"{p.frames_per_s:>8.1f}", file=out)
    e = statistics.median(p.engine_tps for p in parity.pairs)
    c = statistics.median(p.chat_tps for p in parity.pairs)
    verdict = "meets" if parity.ratio >= BAR else "misses"
    print(f"median: engine {e:.1f}, chat {c:.1f} tok/s; median paired ratio {parity.ratio:.2f} ({verdict} the "
          f"chat's aim of {BAR}x)", file=out)
    if not parity.same_work:
        print("bench --tui: the two sides verified different trees in some pairs (steps a/b): their speeds "
              "differ for more than streaming", file=out)
