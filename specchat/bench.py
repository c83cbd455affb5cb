"""``specchat bench``: every method on every prompt, one process, one model load, same run.

Speedups are ratios of tokens/s measured in this run against the ``none`` baseline, never
against a number from elsewhere. Runs are interleaved prompt by prompt (baseline, then each
method, then the peers) so background noise on the machine lands on every row alike, and each
run is timed alone. ``--rounds N`` runs that whole set N times, the order reversed on even rounds
(bench_rounds.py says why), for machines whose speed moves between runs. Tokens/s counts new
tokens (a final stop token excluded) over wall time from the request to the last token, prefill
included, for every row; our own rows also report decode tokens/s (after the prefill), the number
the prefill of long prompts would otherwise blur.

This module is the runner, read top to bottom in :func:`run_bench`: check the flags, load,
warm up (bench_warmup.py), time in rounds, report (bench_report.py, bench_rounds.py,
bench_bandwidth.py). The peers are in bench_peers.py and llamacpp_peer.py, the cost curve in
bench_cost.py, the draft-training paths in bench_train.py, the chat's streaming in bench_tui.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.methods import reading
from engine.outputs import check_outputs
from engine.prompts import Prompt, load_prompts
from engine.session import WARM_UP_TOKENS
from specchat.bench_bandwidth import (
    baseline_bandwidth,
    decode_bandwidth,
    print_bandwidth,
    probe_after,
    read_probe,
    weights_read_per_token,
)
from specchat.bench_plot import BENCH_PLOT, check_plot_path, write_bench_svg
from specchat.bench_report import (
    BENCH_JSON,
    Row,
    Run,
    StepSplit,
    machine_info,
    mode_parts,
    print_payoffs,
    print_table,
    weights_modes,
)
from specchat.bench_rounds import print_rounds, round_order, row_results
from specchat.bench_warmup import capture_graphs, graph_report, size_cache_for
from specchat.llamacpp_tools import print_tg128
from specchat.options import UsageError, draft_options, given_knobs, make_config

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from engine.read_bandwidth import ReadBandwidth
    from specchat.command_options import BenchOptions, ModelOptions, TuneOptions

PEERS = ("hf", "llamacpp", "llamacpp-tools")


@dataclass
class Plan:
    """What one bench run times: the prompts, the weights modes, a config per method, the peers."""

    prompts: list[Prompt]
    modes: list[str]
    config: SpecConfig  # the flags' settings (loads the sessions; the report's "config")
    configs: dict[str, SpecConfig]  # method -> config, "none" (the baseline) first
    peers: list[str]
    rounds: int  # times the whole set of rows runs (--rounds)

    @property
    def multi(self) -> bool:
        """More than one weights mode: rows are labelled with theirs."""
        return len(self.modes) > 1


@dataclass
class Runner:
    """One row of the table and how to answer a prompt for it, tallying its steps into a split.

    A peer is one more runner: the rounds run it in its turn like any of ours."""

    label: str  # shown in the progress bar: the method, with its mode when there are several
    name: str  # the row's name: a method, or a peer's row ("llamacpp")
    mode: str | None  # our rows' weights mode; None for a peer
    run: Callable[[Prompt, StepSplit], Run]

    def new_row(self) -> Row:
        """This runner's tallies for one round."""
        return Row(self.name, self.mode)


def run_bench(options: BenchOptions) -> int:
    """Route to the other benchmarks, or: plan, load, warm up, time every prompt, report."""
    check_plot_path(options)  # --plot and --json: refused before any work (engine/outputs.py)
    check_rounds(options)
    check_outputs([(BENCH_JSON, options.json_out), (BENCH_PLOT, options.plot)], force=options.force)
    if options.tui is not None:
        from specchat.bench_tui import run_tui_bench

        return run_tui_bench(options)  # checks its flags before loading
    if options.random_weights:
        from specchat.gpu_bench import run_random_bench

        return run_random_bench(options)  # checks its flags before building the model
    if options.data_engine is not None or options.train_speed:
        from specchat.bench_train import run_data_bench, run_train_bench

        return run_data_bench(options) if options.data_engine is not None else run_train_bench(options)
    base_config = make_config(options.spec, method="none", max_new_tokens=256)
    modes = weights_modes(options.target)
    if options.cost_curve:
        from specchat.bench_cost import run_cost_curve

        return run_cost_curve(load_sessions(options, base_config, modes), options)
    plan = plan_bench(options, base_config, modes)
    llama_peer = _open_llamacpp(options.target, plan)
    tools = _open_llamacpp_tools(options, plan)
    _say_how_sampling_compares(plan.config)
    sessions = load_sessions(options, plan.config, modes)
    check_prompts_fit("bench", sessions[modes[0]], plan.prompts, plan.configs.values())
    hf = _open_hf(options.target, plan, sessions[modes[0]])
    peers = [p for p in (llama_peer, tools) if p is not None]
    runners = _runners(plan, sessions, hf, peers)
    probe = read_probe(sessions[modes[0]].model)  # on the engine's threads, before the governor sees a step
    graphs = _warm_up(plan, sessions, hf, peers)
    table, probes = _time_rounds(plan.prompts, runners, plan.rounds, probe,
                                 [tools.tg128] if tools is not None else [])
    _say_empty_answers(plan.prompts, table[0])
    report = _report(options, plan, sessions, table, graphs, probes)
    if tools is not None:
        report["llamacpp_tg128"] = tools.tg
    if options.json_out:  # first: a stdout that fails (> /dev/full) does not lose the run's results
        BENCH_JSON.write_json(options.json_out, report)
    print_table(report)
    print_payoffs(report)
    print_rounds(report)
    print_bandwidth(report)
    print_tg128(report)
    if options.plot:
        print(f"bench: wrote {write_bench_svg(options.plot, report)}")
    return 0


# checking the flags ---------------------------------------------------------------------------
def check_rounds(options: BenchOptions) -> None:
    """``--rounds`` alternates the rows of a prompts bench; the other benchmarks time no rows (refused
    in one line, before any work)."""
    other = options.other_benchmark()
    if options.rounds > 1 and other and other != "--tui":  # --tui refuses it in its own words
        raise UsageError(f"--rounds alternates the rows of a --prompts bench; {other} times no rows (drop --rounds)")


def plan_bench(options: BenchOptions, base_config: SpecConfig, modes: list[str]) -> Plan:
    """The prompts, methods and peers from the flags; refuses a bad one in one line, before loading."""
    if not options.prompts:
        raise UsageError("bench needs --prompts FILE.jsonl (or --cost-curve)")
    prompts = load_prompts(options.prompts, options.limit)
    if not base_config.greedy and base_config.sampling == "coupled" and base_config.seed is None:
        base_config = base_config.replace(seed=0)  # coupled samples are a function of the seed: fix one
    methods = [m.strip() for m in (options.methods or "none,ngram").split(",") if m.strip()]
    methods = ["none"] + [m for m in methods if m != "none"]
    peers = [p.strip() for p in options.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in PEERS:
            raise UsageError(f"unknown peer {peer!r}; available: {', '.join(PEERS)}")
    given = given_knobs(options.spec)  # each row: its method's own defaults for the knobs the flags leave unset
    return Plan(prompts, modes, base_config, {m: base_config.with_method(m, given) for m in methods}, peers,
                options.rounds)


def _say_how_sampling_compares(config: SpecConfig) -> None:
    """With temperature > 0, say what "identical" means for this run."""
    if not config.greedy and config.sampling == "coupled":
        print(f"bench: temperature > 0, coupled sampling with seed {config.seed}: every method must give "
              "the baseline's sample")
    elif not config.greedy:
        print("bench: temperature > 0 with rejection sampling: outputs differ from the baseline's by design")


# loading --------------------------------------------------------------------------------------
def load_sessions(options: BenchOptions | TuneOptions, base_config: SpecConfig, modes: list[str]) -> dict[str, Any]:
    """One session per weights mode, in the order given (``specchat tune`` loads its one here too)."""
    from engine.loader import load_session
    from engine.models.progress import rich_progress

    sessions = {}
    with rich_progress() as progress:
        for mode in modes:
            weights, precision = mode_parts(mode)
            sessions[mode] = load_session(options.target.model, base_config, progress=progress,
                                          **options.target.load_args(weights=weights, precision=precision),
                                          **draft_options(options))
            corpus = sessions[mode].ngram_corpus
            timed = [m.strip().lower() for m in (options.methods or "none,ngram").split(",")]
            # timed with the whole corpus, not while indexing
            if corpus is not None and any(m in reading("ngram_corpus") for m in timed):
                corpus.wait_shown(progress)
    return sessions


def _open_llamacpp(target: ModelOptions, plan: Plan) -> Any:
    """llama.cpp on the same GGUF (before our model loads: a missing package is refused first)."""
    if "llamacpp" not in plan.peers:
        return None
    from specchat.llamacpp_peer import LlamaCppPeer

    return LlamaCppPeer.open(target.model, plan.config.max_new_tokens, target.threads)


def _open_llamacpp_tools(options: BenchOptions, plan: Plan) -> Any:
    """llama.cpp's own programs on the same GGUF (and the --draft GGUF for draft-simple), found
    before our model loads: missing programs are refused first."""
    if "llamacpp-tools" not in plan.peers:
        return None
    from specchat.llamacpp_tools import LlamaCppTools

    return LlamaCppTools.open(options.target.model, options.spec.draft, plan.config.max_new_tokens,
                              options.target.threads)


def _open_hf(target: ModelOptions, plan: Plan, session: Any) -> Any:
    """transformers on the fp32 checkpoint of the same model."""
    if "hf" not in plan.peers:
        return None
    from engine.models.resolve import resolve_model
    from specchat.bench_peers import HFPeer

    path = resolve_model(target.model, revision=target.revision, weights="fp32").path
    return HFPeer(path, session, plan.config.max_new_tokens)


def check_prompts_fit(command: str, session: Any, prompts: list[Prompt], configs: Iterable[SpecConfig]) -> None:
    """Refuse, in one line naming the rows, prompts that do not fit the model's context with room for
    an answer under the most demanding of ``configs`` (the largest tree), as the session would.

    Why after the load, before the warm-up (bench and tune alike): the session refuses such a prompt
    without running it, and a timed row of 0 tokens in 0 s read as a negative decode speed
    "identical" to the baseline's. ``--context-overflow drop_oldest`` is honoured as in a chat: a
    conversation whose oldest turns can be left out fits, and is timed so."""
    from engine.conversation import MIN_ANSWER_ROOM, context_refusal, fit_context

    config = max(configs, key=lambda c: min(c.max_new_tokens, MIN_ANSWER_ROOM) + c.max_tree_tokens)
    limit = session.context_limit
    too_long: list[tuple[Prompt, int]] = []
    for prompt in prompts:
        if prompt.text is not None:
            ids = session.tokenizer.encode(prompt.text)
            refusal = context_refusal(len(ids), config, limit)
        else:
            ids, _, refusal = fit_context(session.tokenizer, prompt.messages or [], config, limit)
        if refusal:
            too_long.append((prompt, len(ids)))
    if not too_long:
        return
    shown = "; ".join(f"{p.where or p.id}, {n} tokens" for p, n in too_long[:3])
    more = f" and {len(too_long) - 3} more" if len(too_long) > 3 else ""
    turns = any(sum(m.get("role") == "user" for m in p.messages or []) > 1 for p, _ in too_long)
    drop = (" (or --context-overflow drop_oldest to leave out a conversation's oldest turns)"
            if turns and config.context_overflow == "refuse" else "")
    rows = "that row" if len(too_long) == 1 else "those rows"
    raise UsageError(f"{command}: {len(too_long)} of {len(prompts)} prompts do not fit the model's context of "
                     f"{limit} tokens with room for an answer ({shown}{more}); shorten or remove {rows}{drop}")


# running --------------------------------------------------------------------------------------
def run_ours(session: Any, prompt: Prompt, config: SpecConfig, split: StepSplit | None = None) -> Run:
    """One answer from our session, timed from the request to the last token (bench and tune alike)."""
    from engine.events import Finished, Started, Step

    session.reset()
    t0 = time.perf_counter()
    if prompt.text is not None:
        events = session.generate_ids(session.tokenizer.encode(prompt.text), config)
    else:
        events = session.generate(prompt.messages, config)
    tokens: list[int] = []
    steps = produced = 0
    prefill_s = seconds = 0.0
    for event in events:
        if isinstance(event, Started):
            prefill_s = event.prefill_ms / 1e3
        elif isinstance(event, Step):
            tokens.extend(c.id for c in event.committed)
            steps += 1
            if split is not None:
                split.add(event)
        elif isinstance(event, Finished):
            if event.error and not tokens:  # refused unrun (check_prompts_fit says it first): never a row
                raise UsageError(f"{prompt.where or prompt.id}: {event.error}")
            seconds = time.perf_counter() - t0
            produced = event.tokens + (event.reason == "stop")  # tau counts a final stop token
    return Run(tokens, steps, produced, seconds, prefill_s)


def _runners(plan: Plan, sessions: dict[str, Any], hf: Any, peers: list[Any]) -> list[Runner]:
    """Every method on every mode (mode by mode, the baseline first), then each peer's rows."""
    runners = []
    for mode in plan.modes:
        for method, config in plan.configs.items():
            runners.append(Runner(f"{method} [{mode}]" if plan.multi else method, method, mode,
                                  lambda p, split, s=sessions[mode], c=config: run_ours(s, p, c, split)))
    if hf is not None:
        runners += [Runner("hf-generate", "hf-generate", None, lambda p, _: hf.run(p, lookup=False)),
                    Runner("hf-prompt-lookup", "hf-prompt-lookup", None, lambda p, _: hf.run(p, lookup=True))]
    first = sessions[plan.modes[0]]
    for peer in peers:  # a llama.cpp peer: its kinds of answer, each a row (peer.kinds, peer.labels())
        runners += [Runner(label, label, None, lambda p, _, peer=peer, kind=kind: peer.run(first, p, kind))
                    for kind, label in zip(peer.kinds, peer.labels(), strict=True)]
    return runners


def _warm_up(plan: Plan, sessions: dict[str, Any], hf: Any, peers: list[Any]) -> dict[str, dict[str, int]]:
    """One short answer per runner, untimed; on CUDA the caches sized and every graph captured.
    A method the session cannot run is refused here (ConfigError, one line), before any timing.
    Returns the graph captures per mode before timing."""
    for mode in plan.modes:  # CUDA: a KV cache that grows mid-bench moves, and its graphs are captured again
        size_cache_for(sessions[mode], plan.prompts, plan.configs.values())
    for mode in plan.modes:
        for config in plan.configs.values():
            run_ours(sessions[mode], plan.prompts[0], config.replace(max_new_tokens=WARM_UP_TOKENS))
    # every bucket of every method, not just those the short answers used
    graphs = {mode: capture_graphs(sessions[mode], plan.configs.values()) for mode in plan.modes}
    if hf is not None:
        hf.warm(plan.prompts[0])
    for peer in peers:
        peer.warm(sessions[plan.modes[0]], plan.prompts[0])
    return graphs


def _time_rounds(prompts: list[Prompt], runners: list[Runner], rounds: int,
                 probe: Callable[[], ReadBandwidth] | None, each_round: Sequence[Callable[[], Any]] = ()
                 ) -> tuple[list[list[Row]], list[list[ReadBandwidth]]]:
    """Every prompt through every runner in turn, ``rounds`` times: returns each round's rows (in the
    runners' order) and, with a ``probe``, each round's read bandwidth probes (at its start, then
    between its prompts: bench_bandwidth.probe_after); ``each_round``: measurements that take no
    prompt (llama-bench's tg128), run after the first probe.

    Within a round, each prompt goes through every runner before the next prompt, so noise on the
    machine lands on all rows alike; round by round the runners' order is reversed (round_order).
    Each row counts its answers equal to the first round's baseline of its own mode (peers: of the
    first mode), so a baseline whose answer changed between rounds is counted too."""
    from rich.progress import Progress

    references: list[dict[str | None, list[int]]] = []  # per prompt: the first round's baselines
    table: list[list[Row]] = []
    probes: list[list[ReadBandwidth]] = []
    # no auto-refresh thread: a thread waking 10 times a second steals a core from the model
    with Progress(transient=True, auto_refresh=False) as bar:
        task = bar.add_task("benchmarking", total=rounds * len(prompts) * len(runners))
        for r in range(rounds):
            where = f"round {r + 1}/{rounds} " if rounds > 1 else ""
            if probe is not None:
                bar.update(task, description=f"{where}read bandwidth")
                bar.refresh()
                probes.append([probe()])
            for measure in each_round:
                bar.update(task, description=f"{where}llama-bench")
                bar.refresh()
                measure()
            rows = [runner.new_row() for runner in runners]
            for p, prompt in enumerate(prompts):
                runs: dict[int, Run] = {}
                for i in round_order(len(runners), r):
                    bar.update(task, description=f"{where}{prompt.id}: {runners[i].label}")
                    runs[i] = runners[i].run(prompt, rows[i].split)
                    bar.advance(task)
                    bar.refresh()
                if probe is not None and probe_after(p, len(prompts)):
                    probes[-1].append(probe())
                if r == 0:
                    references.append(_baselines(runners, runs))
                for i, row in enumerate(rows):
                    row.add(runs[i], references[p])
            table.append(rows)
    return table, probes


def _baselines(runners: list[Runner], runs: dict[int, Run]) -> dict[str | None, list[int]]:
    """One prompt's baseline answers by mode, and under None the first mode's (what peers compare with)."""
    baselines: dict[str | None, list[int]] = {}
    for i, runner in enumerate(runners):
        if runner.name == "none" and runner.mode is not None:
            baselines[runner.mode] = runs[i].tokens
            baselines.setdefault(None, runs[i].tokens)
    return baselines


def _say_empty_answers(prompts: list[Prompt], rows: list[Row]) -> None:
    """One line where the baseline answered nothing (the model stopped at once): those prompts time no
    decoding, so the rows rest on the others (a raw "prompt" row that an instruct model ends at once).
    ``rows``: the first round's."""
    base = next(r for r in rows if r.name == "none" and r.ours)
    empty = [p for p, out in zip(prompts, base.outputs, strict=True) if not out]
    if empty:
        where = ", ".join(p.where or p.id for p in empty[:3]) + (" ..." if len(empty) > 3 else "")
        print(f"bench: warning: the baseline answered nothing to {len(empty)} of {len(prompts)} prompts ({where}): "
              "they time no decoding; a chat model wants \"messages\" rows, not raw \"prompt\" text", file=sys.stderr)


# reporting ------------------------------------------------------------------------------------
def _curve_json(curve: dict[int, float]) -> dict[str, float]:
    """A verify-cost curve (relative cost by tree size) as the JSON report writes it."""
    return {str(n): round(v, 3) for n, v in curve.items()}


def _report(options: BenchOptions, plan: Plan, sessions: dict[str, Any], table: list[list[Row]],
            graphs: dict[str, dict[str, int]], probes: list[list[ReadBandwidth]]) -> dict[str, Any]:
    """The JSON report: machine, model, settings, one result per row (each round's under it, with
    rounds), CUDA graphs, bandwidth."""
    results = row_results(table, plan.modes[0])
    reference = next(r for r in results if r["method"] == "none" and r["mode"] == plan.modes[0])
    first = sessions[plan.modes[0]]
    machine = machine_info(first.model)
    machine["weights"] = {w: {"kernels": getattr(sessions[w].model, "kernels", None),
                              "weight_bytes": getattr(sessions[w].model, "weight_bytes", None)} for w in plan.modes}
    report: dict[str, Any] = {
        "machine": machine, "model": first.model_name, "prompts_file": str(options.prompts),
        "dtype": options.target.dtype, "weights": plan.modes, "max_new_tokens": plan.config.max_new_tokens,
        "config": {k: v for k, v in plan.config.to_dict().items() if k != "method"},
        **({"rounds": plan.rounds} if plan.rounds > 1 else {}),
        "results": results,
    }
    shapes = {w: s.measured_cost_shape for w, s in sessions.items() if getattr(s, "measured_cost_shape", None)}
    if shapes:  # the verify-cost curve each session's budget planned with (measured at its first drafted step)
        report["cost_shapes"] = {w: _curve_json(sh) for w, sh in shapes.items()}
    learned = {w: getattr(s, "learned_cost_curves", {}) for w, s in sessions.items()}
    if any(learned.values()):  # the same curves at the end of the run, as the live steps corrected them
        report["learned_cost_curves"] = {w: {m: _curve_json(c) for m, c in per.items()}
                                         for w, per in learned.items() if per}
    corpus = getattr(first, "ngram_corpus", None)
    if corpus is not None and any(m in reading("ngram_corpus") for m in plan.configs):
        report["ngram_corpus"] = corpus.describe()
    cuda_graphs = graph_report(sessions, graphs)
    if cuda_graphs:
        report["cuda_graphs"] = cuda_graphs
    bandwidth = baseline_bandwidth(first.model, reference["decode_tokens_per_s"], options.peak_bandwidth)
    if bandwidth is not None:
        report["bandwidth"] = bandwidth
    weight_bytes = {w: n for w, s in sessions.items() if (n := weights_read_per_token(s.model)) is not None}
    decode = decode_bandwidth(weight_bytes, results, probes)
    if decode is not None:
        report["decode_bandwidth"] = decode
    return report
