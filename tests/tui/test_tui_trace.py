"""specchat/tui/trace.py: JSON-lines traces, and the fixture trace the UI tests play back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.config import SpecConfig
from engine.errors import UserError
from engine.events import ConfigApplied, Finished, Started, Step
from specchat.tui.scripted import synthetic_answer
from specchat.tui.trace import TraceError, TraceWriter, UserTurn, open_trace, read_trace

TRACE = Path(__file__).parent / "fixtures" / "demo.jsonl"


def test_round_trip_keeps_every_field(tmp_path):
    cfg = SpecConfig(method="eagle3", num_draft_tokens=16)
    events = synthetic_answer("Hello there, café ☕ world.\nBye.", seed=3, config=cfg)
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as w:
        w.write(UserTurn(text="hi"))
        for ev in events:
            w.write(ev)
    header, records = read_trace(path)
    assert header["format"] == "specchat-trace"
    assert header["model"] == "fake-model"  # taken from the first Started when not given
    assert header["drafter"] == "eagle3"
    assert header["config"]["num_draft_tokens"] == 16
    assert header["specchat_version"]
    assert records[0] == UserTurn(text="hi")
    assert records[1:] == events  # frozen dataclasses compare field by field


def test_writer_flushes_each_record(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TraceWriter(path, model="m", drafter="ngram")
    w.write(UserTurn(text="a"))
    # readable before close: a crash loses at most the line being written
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["kind"] == "header"
    w.close()


def test_empty_recording_still_has_a_header(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, model="m"):
        pass
    header, records = read_trace(path)
    assert header["model"] == "m" and records == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ('{"kind": "step"}\n', "not a specchat trace"),
        ("not json\n", ":1: not valid JSON"),
        ('{"kind":"header","format":"specchat-trace","format_version":99}\n', "format version 99"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n{"kind":"bogus"}\n',
         ":2: bad 'bogus' record"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n[1, 2]\n', ":2: not a JSON object"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n{"kind":"step","tree":{}}\n',
         ":2: bad 'step' record"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    text = str(info.value)
    assert message in text and str(path) in text and "\n" not in text


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")


def _recorded(path: Path) -> list:
    events = synthetic_answer("One answer, recorded.", seed=1, config=SpecConfig(method="ngram"))
    with TraceWriter(path, model="m", drafter="ngram") as w:
        w.write(UserTurn(text="hi"))
        for ev in events:
            w.write(ev)
    return [UserTurn(text="hi"), *events]


def test_a_line_cut_by_a_crash_is_dropped_and_counted_when_tolerant(tmp_path):
    """A crash while a line was being written leaves half a record at the end: a reopened chat keeps
    every complete record and says how many were lost; a replay (strict) still names the line."""
    path = tmp_path / "cut.jsonl"
    records = _recorded(path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"kind":"user","text":"the next questi')
    trace = open_trace(path, tolerant=True)
    assert trace.records == records and trace.dropped == 1
    with pytest.raises(TraceError, match=r"cut\.jsonl:\d+: not valid JSON"):
        read_trace(path)


def test_tolerant_reading_still_refuses_what_is_not_a_trace(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"kind": "step"}\n')
    with pytest.raises(TraceError, match="not a specchat trace"):
        open_trace(path, tolerant=True)


def test_fixture_trace_is_realistic():
    """The fixture the UI tests replay: branching trees, consistent accepted paths and bonuses."""
    header, records = read_trace(TRACE)
    assert header["drafter"] == "eagle3" and header["model"] == "fake-model"
    turns = [r for r in records if isinstance(r, UserTurn)]
    assert [t.mode for t in turns] == ["chat", "chat", "compare"]
    steps = [r for r in records if isinstance(r, Step)]
    assert any(not s.tree.is_chain for s in steps), "trees must branch"
    assert any(s.rejected for s in steps) and any(s.accepted_len >= 3 for s in steps)
    assert any(len(s.committed) > 1 for s in steps)
    assert any(c.text == "" for s in steps for c in s.committed), "a multi-byte char split over two tokens"
    assert any(isinstance(r, ConfigApplied) for r in records)
    for s in steps:
        drafts = [c for c in s.committed if c.origin == "draft"]
        assert [c.id for c in drafts] == [s.tree.tokens[i] for i in s.accepted]
        assert [c.text for c in drafts] == [s.tree_text[i] for i in s.accepted]
        assert s.committed[-1].origin == "target" and s.committed[-1].id == s.bonus
        assert s.text == "".join(c.text for c in s.committed)
        # greedy consistency: no refused sibling holds the target's token
        assert all(s.tree.tokens[i] != s.bonus for i in s.rejected)
        assert len(s.tree_text) == len(s.tree)
    answers = [r for r in records if isinstance(r, Finished)]
    assert len(answers) == 4 and [isinstance(r, Started) for r in records].count(True) == 4


@pytest.mark.parametrize(("where", "says"), [
    ("/proc/nope/t.jsonl", "cannot create the folder /proc/nope"),
    ("{tmp}", "is a folder"),
    ("{tmp}/new/", "is a folder; name a file"),
    ("{tmp}/notes.txt", "that file exists; add --force to replace it"),
    ("{tmp}/old.jsonl", "that file exists; add --force to replace it"),
])
def test_run_record_is_checked_before_the_app_starts(where, says, tmp_path, monkeypatch, capsys):
    """``run --record /proc/nope/t.jsonl`` made every answer fail once the chat was open: a path that cannot
    take a trace (or a file a recording would destroy) is refused in one line before anything loads."""
    from specchat.cli import main
    from specchat.tui.app import SpecChatApp

    (tmp_path / "notes.txt").write_text("my notes\n")
    with TraceWriter(tmp_path / "old.jsonl") as writer:  # an earlier session's trace: unique, kept
        writer.write(UserTurn(text="hi"))
    monkeypatch.setattr(SpecChatApp, "run", lambda self, *a, **k: pytest.fail("the app started"))
    path = where.format(tmp=tmp_path)
    assert main(["run", "--fake", "--record", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "--record" in err, err
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert read_trace(tmp_path / "old.jsonl")[1], "the earlier trace was replaced"


def test_run_record_makes_a_new_trace_and_replaces_an_earlier_one_only_with_force(tmp_path):
    """A recorded session cannot be made again: ``--record`` over an earlier trace replaced it without a
    word; now it takes ``--force`` (an empty file, holding nothing, may go)."""
    from specchat.tui.trace import check_record_path

    check_record_path(tmp_path / "new.jsonl")
    check_record_path(tmp_path / "deeper" / "new.jsonl")  # its folder is made, as TraceWriter would
    with TraceWriter(tmp_path / "old.jsonl") as writer:
        writer.write(UserTurn(text="hi"))
    with pytest.raises(UserError, match=r"^--record .*old\.jsonl: that file exists; add --force"):
        check_record_path(tmp_path / "old.jsonl")
    check_record_path(tmp_path / "old.jsonl", force=True)
    (tmp_path / "empty.jsonl").write_text("")
    check_record_path(tmp_path / "empty.jsonl")


@pytest.mark.parametrize("field, value, message", [
    (("timing", "verify_ms"), "slow", "timing.verify_ms must be a number, not 'slow'"),
    (("index",), "3", "index must be an integer"),
    (("committed",), [{"id": "7", "origin": "draft", "text": "a"}], "committed[].id must be an integer"),
    (("stats", "tau"), None, "stats.tau must be a number"),
    (("text",), 5, "text must be text"),
])
def test_a_value_of_the_wrong_type_names_its_line(tmp_path, field, value, message):
    """An edited trace (a string where a number belongs) is refused when it is opened, naming the
    line and the field, even by the tolerant reading a replay uses; not a TypeError mid-replay."""
    path = tmp_path / "edited.jsonl"
    _recorded(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line).get("kind") == "step")
    data = json.loads(lines[at])
    target = data
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    lines[at] = json.dumps(data)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for tolerant in (False, True):
        with pytest.raises(TraceError, match=rf"edited\.jsonl:{at + 1}: bad .step. record \(.*{re.escape(message)}"):
            open_trace(path, tolerant=tolerant)
