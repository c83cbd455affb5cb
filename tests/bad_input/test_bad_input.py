"""Every row of cases.py: the exit code, ONE line on stderr matching the row, no traceback, no work.

How a row runs: in this process through ``specchat.cli.main(argv)`` (fast: no interpreter start),
stdout and stderr captured at the file descriptors, a SIGALRM after the row's timeout (a hang is a
failure, not a stuck suite); or, for a row marked ``subprocess``, as ``python -c`` with the same
trip-wires. The trip-wires (guards.py) fail a row whose refusal comes after the target's weights were
read (unless the row allows it) or after the TUI or the server started.

What "one line" means: argparse's own refusals print their usage block first, and a model loaded by
transformers draws a progress bar; those are left out, then exactly one non-empty line must remain.
A bare exception escaping ``main`` is reported as Python would (traceback, exit 1), so it fails the
row on both counts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import guards
import pytest
from builders import Where
from cases import CASES, CONFIG_CASES, MODEL, PORT, TMP, Case, ConfigCase

ROOT = Path(__file__).resolve().parents[2]


class Hang(Exception):
    """The row ran past its timeout."""


def _params() -> list:
    ids = [c.id for c in CASES]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    assert not dupes, f"case ids used twice: {dupes}"
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
            for c in CASES]


@pytest.mark.parametrize("case", _params())
def test_bad_input(case: Case, tmp_path: Path, tiny_model: Path, capfd: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    if case.cpu_only and _gpu_visible():
        pytest.skip("a CUDA GPU is visible: this input is not bad here")
    where = Where(tmp_path / "case", tiny_model)
    where.tmp.mkdir()
    for make in case.files:
        make(where)
    port = str(_free_port()) if any(PORT in a for a in case.argv) else ""
    argv = [a.replace(TMP, str(where.tmp)).replace(MODEL, str(where.model)).replace(PORT, port) for a in case.argv]
    monkeypatch.chdir(where.tmp)
    for name, value in case.env:
        monkeypatch.setenv(name, value.replace(TMP, str(where.tmp)))
    if case.subprocess:
        code, out, err, seen = _run_subprocess(case, argv)
    else:
        code, out, err, seen = _run_in_process(case, argv, capfd, monkeypatch)
    check(case, code, out, err, seen)


def test_the_table_covers_every_command() -> None:
    """At least 100 rows, and rows for every command of the parser and for the global flags."""
    from specchat.cli import COMMANDS

    assert len(CASES) >= 100
    covered = {c.argv[0] if c.argv and not c.argv[0].startswith("-") else "" for c in CASES}
    assert {"", *COMMANDS} <= covered | {""}, sorted(set(COMMANDS) - covered)
    assert any(not c.argv or c.argv[0].startswith("-") for c in CASES), "no row for the global flags"


def check(case: Case, code: int | None, out: str, err: str, seen: list[str]) -> None:
    """The row's promise: refused before work, in one line, with its exit code and no traceback."""
    assert not seen, f"{seen[0]} before the input was refused\nstderr: {err[-2000:]}"
    assert "Traceback" not in err + out, f"a traceback:\n{err[-3000:]}"
    lines = message_lines(err)
    assert len(lines) == 1, f"want one line on stderr, got {len(lines)}:\n{err[-2000:]}\nstdout: {out[-500:]}"
    assert re.search(case.message, lines[0]), f"{lines[0]!r} does not match {case.message!r}"
    assert code == case.code, f"exit {code}, want {case.code}: {lines[0]}"


PROGRESS = re.compile(r"\d+%\|")  # a tqdm bar (transformers' "Loading weights"): progress, not a message


def message_lines(err: str) -> list[str]:
    """stderr's non-empty lines, argparse's usage block and progress bars left out."""
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)]
    if lines and lines[0].startswith("usage:"):
        lines = lines[1:]
        while lines and lines[0][:1].isspace():
            lines = lines[1:]
    return lines


def _run_in_process(case: Case, argv: list[str], capfd: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> tuple[int | None, str, str, list[str]]:
    from specchat.cli import main

    seen = guards.Seen()
    guards.install(monkeypatch.setattr, seen, weights=not case.loads_model)
    capfd.readouterr()
    code: int | None = None
    previous = signal.signal(signal.SIGALRM, _raise_hang)
    signal.alarm(case.timeout)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except guards.Tripped:
        pass  # seen.events says what
    except Hang:
        pytest.fail(f"no answer within {case.timeout} s (a hang)")
    except Exception:
        traceback.print_exc()  # as an uncaught exception would end `specchat`
        code = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capfd.readouterr()
    return code, out, err, seen.events


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _free_port() -> int:
    """A port nothing listens on now (the kernel's pick for port 0)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _raise_hang(signum: int, frame: object) -> None:
    raise Hang


def _run_subprocess(case: Case, argv: list[str]) -> tuple[int | None, str, str, list[str]]:
    script = (f"import sys; sys.path[:0] = {[str(ROOT), str(Path(__file__).parent)]!r}; import guards; "
              f"guards.install_for_subprocess(weights={not case.loads_model}); "
              "from specchat.cli import main; sys.exit(main(sys.argv[1:]))")
    try:
        proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                              timeout=case.timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer within {case.timeout} s (a hang)")
    wires = (guards.LOADED, guards.TUI, guards.SERVER, guards.EMBEDDED)
    seen = [what for what in wires if f"bad-input guard: {what}" in proc.stderr]
    return proc.returncode, proc.stdout, proc.stderr, seen


def _config_params() -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
            for c in CONFIG_CASES]


@pytest.mark.parametrize("case", _config_params())
def test_bad_config_line(case: ConfigCase, tmp_path: Path) -> None:
    """A bad config line: one warning naming it, the default kept, never an exception."""
    from specchat.tui.userconfig import load_ui_settings

    path = tmp_path / "config.toml"
    path.write_bytes(case.toml.encode("utf-8", "surrogateescape"))
    ui, warnings = load_ui_settings(path)
    assert len(warnings) == 1, warnings
    assert re.search(case.warning, warnings[0]), f"{warnings[0]!r} does not match {case.warning!r}"
    assert case.binding not in ui.keymap, f"{case.binding} = {ui.keymap.get(case.binding)!r} taken from the file"
