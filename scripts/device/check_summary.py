"""check.sh's one JSON: every section's exit code, seconds and own JSON, with the numbers issue 51
judges pulled to the top (identical answers and speed-ups per method, the 8B-shaped baseline's
fraction of the HBM limit and verify(64)/verify(1) per linear), so a session reads one file.

    python3 scripts/device/check_summary.py FOLDER OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def sections(folder: Path) -> dict[str, dict[str, Any]]:
    """sections.tsv's rows (name, rc or 'skipped', seconds[, reason]) with each section's JSON."""
    out: dict[str, dict[str, Any]] = {}
    for line in (folder / "sections.tsv").read_text().splitlines():
        name, rc, seconds, *reason = line.split("\t")
        row: dict[str, Any] = {"rc": None if rc == "skipped" else int(rc), "seconds": float(seconds)}
        if reason:
            row["skipped"] = reason[0]
        path = folder / f"{name}.json"
        if path.is_file():
            try:
                row["result"] = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                row["result_error"] = str(e)
        out[name] = row
    return out


def headline(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The judged numbers where the sections produced them (None where they did not)."""
    found: dict[str, Any] = {}
    for name, row in rows.items():
        result = row.get("result")
        if not isinstance(result, dict):
            continue
        if name.startswith("random-"):
            curve = result.get("cost_curve") or [{}]
            base = result.get("baseline") or result.get("bandwidth") or {}
            found[name] = {"fraction_of_limit": _find(result, "fraction_of_limit"),
                           "tokens_per_s": _find(base, "tokens_per_s") or _find(result, "tokens_per_s"),
                           "verify_max_over_1": curve[-1].get("relative"), "verify_max_n": curve[-1].get("n")}
        elif name.startswith("embedded-"):
            found[name] = {m: {"speedup": _find(r, "speedup"), "identical": _find(r, "identical")}
                           for m, r in _methods(result).items()}
    return found


def _methods(result: dict[str, Any]) -> dict[str, Any]:
    rows = result.get("methods") or result.get("results") or {}
    if isinstance(rows, list):
        return {str(r.get("method", i)): r for i, r in enumerate(rows) if isinstance(r, dict)}
    return rows if isinstance(rows, dict) else {}


def _find(tree: Any, key: str) -> Any:
    """The first value under ``key`` anywhere in a JSON tree (the bench's layouts differ by kind)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            got = _find(item, key)
            if got is not None:
                return got
    return None


def main(folder: str, out: str) -> int:
    rows = sections(Path(folder))
    machine = Path(folder) / "machine.txt"
    report = {"device": os.environ.get("DEVICE", ""), "dry": os.environ.get("DRY", "0") == "1",
              "linear_switch": "SPECCHAT_CUDA_LINEAR", "machine": machine.read_text() if machine.is_file() else "",
              "headline": headline(rows), "sections": rows}
    Path(out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    failed = [n for n, r in rows.items() if r["rc"] not in (0, None)]
    print(f"check.json: {len(rows)} sections, failed: {', '.join(failed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
