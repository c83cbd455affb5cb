"""engine/outputs.py and the entry point's stdout: nothing replaced that the user did not ask to replace,
a write that fails (a full disk) said in one line with the earlier file intact, a stdout that fails
(``> /dev/full``, a closed pipe) said in one line, never a traceback.

The table rows (tests/bad_input/cases.py) cover each command's refusals; here the helper's own
promises, and the cases a row cannot express (a full disk, a broken stdout).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from heads import write_tiny_model

from engine.outputs import Output, OutputError, check_outputs
from specchat.bench_plot import BENCH_PLOT
from specchat.bench_report import BENCH_JSON
from specchat.cli import main
from specchat.tui.trace import RECORD
from specchat.tune import TUNE_JSON, TUNE_SETTINGS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("outputs") / "model")


def _svg() -> str:
    return '<svg xmlns="http://www.w3.org/2000/svg"></svg>\n'


@pytest.mark.parametrize(("output", "name", "content"), [
    (BENCH_JSON, "notes.json", '{"a": 1}\n'),  # any JSON passed for a report
    (BENCH_PLOT, "picture.svg", _svg()),  # any SVG passed for bench's image
    (TUNE_SETTINGS, "mine.json", '{"num_steps": 3}\n'),  # a hand-written settings file
    (TUNE_JSON, "other.json", json.dumps({"written_by": "specchat bench --json"})),  # another command's report
    (RECORD, "old.jsonl", '{"kind": "header", "format": "specchat-trace"}\n'),  # a trace: unique
])
def test_a_file_the_output_did_not_write_is_replaced_only_with_force(tmp_path: Path, output: Output, name: str,
                                                                      content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(OutputError, match=rf"^{output.flag} .*{name}: that file exists.*; add --force to replace it, "
                                          "or name a new file$"):
        output.check(path)
    assert path.read_text() == content
    output.check(path, force=True)


@pytest.mark.parametrize("output", [BENCH_JSON, TUNE_JSON, TUNE_SETTINGS])
def test_an_earlier_file_of_the_same_output_is_replaced(tmp_path: Path, output: Output) -> None:
    path = output.write_json(tmp_path / "x.json", {"num_steps": 3})
    output.check(path)  # marked as its own: a rerun replaces it without --force
    assert json.loads(path.read_text())["written_by"] == output.mark


def test_an_earlier_image_of_bench_is_replaced(tmp_path: Path) -> None:
    path = BENCH_PLOT.write(tmp_path / "b.svg", BENCH_PLOT.mark_svg(_svg()))
    BENCH_PLOT.check(path)


@pytest.mark.parametrize("content", [
    json.dumps({"written_by": "specchat bench --json "}),  # not exactly the mark
    json.dumps([{"written_by": "specchat bench --json"}]),  # not an object
    json.dumps({"results": {"written_by": "specchat bench --json"}}),  # the mark not at the top
    '{"written_by": "specchat bench --json", ',  # cut short: not JSON
])
def test_the_mark_is_checked_strictly(tmp_path: Path, content: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(OutputError, match="add --force"):
        BENCH_JSON.check(path)


def test_a_mark_below_the_first_line_of_an_image_is_not_ours(tmp_path: Path) -> None:
    path = tmp_path / "x.svg"
    path.write_text(_svg() + BENCH_PLOT.mark_svg(""))
    with pytest.raises(OutputError, match="add --force"):
        BENCH_PLOT.check(path)


def test_tune_settings_load_back_with_their_mark(tmp_path: Path) -> None:
    """The settings file carries tune's mark; ``run --settings`` reads it as before."""
    from specchat.options import load_settings

    path = TUNE_SETTINGS.write_json(tmp_path / "best.json", {"method": "ngram", "num_steps": 3})
    assert load_settings(path) == {"method": "ngram", "num_steps": 3}


@pytest.mark.parametrize("name", ["newdir/", "existing"])
def test_a_folder_is_refused_not_written_as_a_file(tmp_path: Path, name: str) -> None:
    """``--json newdir/`` wrote a file named ``newdir``."""
    (tmp_path / "existing").mkdir()
    with pytest.raises(OutputError, match=r"^--json .* is a folder; name a file \(e\.g\. .*bench\.json\)$"):
        BENCH_JSON.check(f"{tmp_path}/{name}")
    assert not (tmp_path / "newdir").exists()


def test_a_fifo_or_a_device_is_never_opened_or_replaced(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")
    for path in (tmp_path / "pipe.json", Path(os.devnull)):
        with pytest.raises(OutputError, match="not a regular file"):
            BENCH_JSON.check(path, force=True)


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"--json .*x\.json and --save-settings .*x\.json name the same file"):
        check_outputs([(TUNE_JSON, str(tmp_path / "x.json")), (TUNE_SETTINGS, str(tmp_path / "x.json"))])


def _full_disk(*args: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_the_earlier_file_and_no_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write goes to a temporary file renamed over the target: a full disk (here at fsync, where NFS
    and quotas answer) is one line, the earlier file intact, no 0-byte or temporary file left."""
    old = BENCH_JSON.write_json(tmp_path / "b.json", {"results": [1]})
    before = old.read_text()
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(OutputError, match=r"^--json .*b\.json: cannot write it \(No space left on device\); the "
                                          "earlier file is left as it was$"):
        BENCH_JSON.write_json(old, {"results": [2]})
    with pytest.raises(OutputError, match="nothing was written"):
        BENCH_JSON.write_json(tmp_path / "new.json", {"results": [2]})
    assert old.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


def test_bench_on_a_full_disk_says_so_in_one_line(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``bench --json`` on a full disk ended its run with a traceback and a 0-byte file."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again"}) + "\n")
    out = BENCH_JSON.write_json(tmp_path / "b.json", {"results": "earlier"})
    monkeypatch.setattr(os, "fsync", _full_disk)
    assert main(["bench", str(tiny), "--methods", "none", "--prompts", str(prompts), "--max-new-tokens", "2",
                 "--threads", "1", "--json", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specchat")]
    assert err == [f"specchat: error: --json {out}: cannot write it (No space left on device); the earlier file is "
                   "left as it was"], err
    assert json.loads(out.read_text())["results"] == "earlier"


def _specchat(*args: str, stdout: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECCHAT_CALIBRATE": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "specchat", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120, cwd=ROOT)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_full_stdout_is_one_line_and_a_failure() -> None:
    """``specchat export sglang > /dev/full`` ended in a traceback (and exit 1 or 120, from the shutdown flush)."""
    with open("/dev/full", "w") as full:
        proc = _specchat("export", "sglang", stdout=full.fileno())
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["specchat: error: cannot write to standard output (No space left on device); send it where "
                     "there is room, or drop the redirection"], proc.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_generate_to_a_full_stdout_is_one_line(tiny: Path) -> None:
    """The tokens are streamed (flushed as they come): the failure comes mid-answer, still one line."""
    with open("/dev/full", "w") as full:
        proc = _specchat("generate", str(tiny), "--prompt", "hi", "--max-new-tokens", "4", "--threads", "1",
                         stdout=full.fileno())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("specchat")] == [
        "specchat: error: cannot write to standard output (No space left on device); send it where there is room, "
        "or drop the redirection"], proc.stderr


def test_a_closed_pipe_is_quiet_and_a_failure() -> None:
    """``specchat export sglang | head -0``: the reader left; no traceback, no line (as ``cmd | head``
    expects), exit 141 as a shell reports SIGPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _specchat("export", "sglang", stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
