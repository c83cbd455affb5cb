"""``specchat bench --rounds N``: every row timed N times, the order alternated, and what the rounds say.

Why rounds: the machines we measure on change speed between runs (a VM whose plain step took 26 ms
in three runs of one command and 33 ms in three others, issue 57), so one run's ratio can be the
machine's drift rather than the method's. bench.py runs the whole set of rows once per round,
reversing their order on even rounds; this module turns the rounds' tallies into the report: per
row each round's result, the best round and the median, the ratio against the baseline per round
and best-of-rounds, identity over every round, and one warning when two rounds of a row disagree
by more than the difference reported between the rows.

Everything past :func:`row_results` reads the JSON results (``results[i]["rounds"]``), so a report
loaded from ``--json`` gives the same table and warning as the run that wrote it.
"""

from __future__ import annotations

import statistics
from typing import Any

from specchat.bench_report import Row, differs_by_design

# a row's rate and its ratio against the baseline, the decode first (it leaves the prefill out)
RATES = (("decode_tokens_per_s", "decode_speedup"), ("tokens_per_s", "speedup"))


def round_order(runners: int, round_index: int) -> list[int]:
    """The runners' order in round ``round_index`` (0 is the first): the table's order in odd rounds
    (the 1st, 3rd ...), reversed in even ones: A B C, C B A, A B C ...

    Why reversed rather than repeated: within a prompt the rows run one after another, so under a
    drift that keeps one direction (the machine slowing as it warms, the host's load rising) the
    row that always runs first is always timed on the faster machine. Reversed, every row's mean
    place in the sequence is the same over each pair of rounds (A at 1 and 3, C at 3 and 1 of A B C,
    C B A), so a linear drift falls on all rows alike; an odd count of rounds leaves one round
    unpaired, so even counts are the ones to use for ratios (the README's example says 4)."""
    order = list(range(runners))
    return order if round_index % 2 == 0 else order[::-1]


def round_results(rows: list[Row], reference_mode: str) -> list[dict[str, Any]]:
    """One round's JSON results: each row against the baseline of its mode (peers: of the first)."""
    baselines = {row.weights: row for row in rows if row.name == "none" and row.ours}
    reference = baselines[reference_mode]
    return [row.result(baselines.get(row.weights, reference), reference_mode) for row in rows]


def row_results(table: list[list[Row]], reference_mode: str) -> list[dict[str, Any]]:
    """The report's results from ``table[round][row]``: one round's as they always were; with more,
    per row the best round's result with best-of-rounds rates and ratios, the medians, identity
    over every round and each round's own result under ``"rounds"`` (:func:`across_rounds`)."""
    per_round = [round_results(rows, reference_mode) for rows in table]
    if len(table) == 1:
        return per_round[0]
    first = table[0]
    out = []
    reference = _baseline_index(first, reference_mode)
    for i, row in enumerate(first):
        base = _baseline_index(first, row.weights if row.ours else reference_mode)
        rounds = [rows[i] for rows in table]
        out.append(across_rounds([r[i] for r in per_round], [r[base] for r in per_round], reference_mode,
                                 identical=_same_every_round(rounds, first[base]),
                                 same_as_reference=_same_every_round(rounds, first[reference])))
    return out


def _baseline_index(rows: list[Row], mode: str) -> int:
    """Where in ``rows`` the baseline of ``mode`` is."""
    return next(i for i, r in enumerate(rows) if r.name == "none" and r.weights == mode)


def _same_every_round(rounds: list[Row], baseline: Row) -> int:
    """Prompts whose answer equals ``baseline``'s (the first round's) in every round."""
    return sum(all(r.outputs[p] == want for r in rounds) for p, want in enumerate(baseline.outputs))


def across_rounds(rounds: list[dict[str, Any]], base_rounds: list[dict[str, Any]], reference_mode: str, *,
                  identical: int, same_as_reference: int) -> dict[str, Any]:
    """A row's result over its rounds (``rounds``: its per-round results, ``base_rounds``: its baseline's).

    The fields of one round's result are those of the best round (by :func:`rate_key`), but the
    rates are each the best of the rounds and the ratios best over best (``decode_speedup``: this
    row's best decode tok/s over its baseline's best), with ``median_*`` beside them (the ratio's
    median is that of the per-round ratios); ``identical_prompts`` counts the prompts whose answer
    equalled the first round's baseline in every round."""
    key = rate_key(rounds)
    best = max(range(len(rounds)), key=lambda r: rounds[r][key] or 0.0)
    out = dict(rounds[best])
    for rate, ratio in RATES:
        mine = [r[rate] for r in rounds if r[rate]]
        theirs = [r[rate] for r in base_rounds if r[rate]]
        ratios = [r[ratio] for r in rounds if r[ratio]]
        out[rate] = max(mine) if mine else None
        out[ratio] = round(max(mine) / max(theirs), 3) if mine and theirs else None
        out[f"median_{rate}"] = round(statistics.median(mine), 2) if mine else None
        out[f"median_{ratio}"] = round(statistics.median(ratios), 3) if ratios else None
    out.update({"identical_prompts": identical, "identical_to_baseline": identical == out["prompts"],
                f"identical_to_{reference_mode}_baseline": same_as_reference,
                "best_round": best + 1, "spread": spread(rounds, key), "rounds": rounds})
    return out


def rate_key(rounds: list[dict[str, Any]]) -> str:
    """The rate a row's rounds are compared by: decode tok/s where every round has one, else tok/s
    (the peers, which report no prefill apart)."""
    return "decode_tokens_per_s" if all(r.get("decode_tokens_per_s") for r in rounds) else "tokens_per_s"


def spread(rounds: list[dict[str, Any]], key: str) -> float | None:
    """How far a row's rounds disagree: (fastest - slowest) / slowest of ``key``; None under two rounds."""
    rates = [r[key] for r in rounds if r.get(key)]
    if len(rates) < 2:
        return None
    return round((max(rates) - min(rates)) / min(rates), 4)


def _baseline_of(result: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The baseline result ``result`` is compared with: its mode's, a peer's the first one."""
    bases = [r for r in results if r["method"] == "none" and r.get("mode")]
    if result.get("mode") is None:
        return bases[0] if bases else None
    return next((r for r in bases if r["mode"] == result["mode"]), None)


def _label(result: dict[str, Any], multi: bool) -> str:
    return f"{result['method']} ({result['mode']})" if multi and result.get("mode") else result["method"]


def disagreements(results: list[dict[str, Any]]) -> str | None:
    """One warning line naming the rows whose difference from their baseline is within the noise:
    two rounds of the row, or of its baseline, disagree by more than the row's best-of-rounds ratio
    differs from 1 (baseline rounds 20% apart, n-gram 1.10x: the 10% may be the machine). None when
    every difference stands out of its rounds' spread, or there are no rounds."""
    multi = len({r["mode"] for r in results if r.get("mode")}) > 1
    noisy = []
    for result in results:
        base = _baseline_of(result, results)
        if "rounds" not in result or base is None or (result["method"] == "none" and result.get("mode")):
            continue  # one round, or a baseline (compared with nothing)
        key = rate_key(result["rounds"])
        ratio = result[dict(RATES)[key]]
        mine, theirs = spread(result["rounds"], key), spread(base["rounds"], key)
        if ratio is None or mine is None or theirs is None:
            continue
        differ = abs(ratio - 1)
        if max(mine, theirs) > differ:
            noisy.append(f"{_label(result, multi)} vs {_label(base, multi)} (rounds {mine:.0%} and {theirs:.0%} "
                         f"apart, rows {differ:.0%})")
    if not noisy:
        return None
    return ("bench: warning: rounds of a row disagree by more than the rows differ, so these ratios are within "
            "the machine's noise: " + "; ".join(noisy))


def rounds_table(report: dict[str, Any]) -> Any:
    """Each row's rate by round, best, median and spread, and its ratio to the baseline by round and
    best over best, as a rich Table (printed after the main table when there are rounds)."""
    from rich.table import Table

    results = report["results"]
    count = report["rounds"]
    multi = len(report.get("weights") or ()) > 1
    differs = differs_by_design(report)
    peers = any(rate_key(r["rounds"]) != "decode_tokens_per_s" for r in results)
    table = Table(title=f"decode tok/s by round ({count} rounds; order A B C in odd rounds, C B A in even ones)",
                  caption="*: tok/s from the request (a peer reports no prefill apart)" if peers else None)
    for col in ("method", *(f"r{i + 1}" for i in range(count)), "best", "median", "spread", "x baseline by round",
                "best/best", "identical"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
    for r in results:
        key = rate_key(r["rounds"])
        ratio = dict(RATES)[key]
        table.add_row(
            _label(r, multi) + ("" if key == "decode_tokens_per_s" else " *"),
            *(_cell(x[key]) for x in r["rounds"]), _cell(r[key]), _cell(r[f"median_{key}"]),
            "-" if r["spread"] is None else f"{r['spread']:.0%}",
            " ".join("-" if x[ratio] is None else f"{x[ratio]:.2f}" for x in r["rounds"]),
            "-" if r[ratio] is None else f"{r[ratio]:.2f}x",
            "-" if differs and r["method"] != "none" else f"{r['identical_prompts']}/{r['prompts']}",
        )
    return table


def _cell(value: float | None) -> str:
    return "-" if not value else f"{value:.2f}"


def print_rounds(report: dict[str, Any]) -> None:
    """With rounds: the rounds table on stdout, and the disagreement warning (if any) on stderr."""
    import sys

    from rich.console import Console

    if report.get("rounds", 1) < 2:
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(rounds_table(report))
    warning = disagreements(report["results"])
    if warning:
        print(warning, file=sys.stderr)
