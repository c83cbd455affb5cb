"""engine/trace.py: JSON-lines traces, and the fixture trace the UI tests play back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import SpecConfig
from engine.events import ConfigApplied, Finished, Started, Step
from engine.trace import TraceError, TraceWriter, UserTurn, read_trace
from specchat.tui.fake import synthetic_answer

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
        ("not json\n", "line 1 is not JSON"),
        ('{"kind":"header","format":"specchat-trace","format_version":99}\n', "format version 99"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n{"kind":"bogus"}\n',
         "line 2: bad 'bogus' record"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n[1, 2]\n', "line 2 is not a JSON object"),
        ('{"kind":"header","format":"specchat-trace","format_version":1}\n{"kind":"step","tree":{}}\n',
         "line 2: bad 'step' record"),
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
