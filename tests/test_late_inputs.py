"""Bad input met only once the model is read: each one line that says what to do, never a bare
assertion or an allocation sized by a number the user typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from heads import write_tiny_model

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import Started
from engine.session import Session
from specchat.cli import main
from tests.tiny import TinyTokenizer, our_model


def test_generate_with_a_prompt_longer_than_the_context_says_both_lengths(tmp_path: Path, capsys) -> None:
    model = write_tiny_model(tmp_path / "model")  # a context of 512 tokens
    assert main(["generate", str(model), "--prompt", "word " * 700, "--max-new-tokens", "4", "--threads", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("specchat: error: the prompt is "), err
    assert "context of 512 tokens" in err[0] and "shorten the prompt" in err[0]


def test_the_cache_never_exceeds_the_context_whatever_max_new_tokens_says() -> None:
    """The session sizes its KV cache by min(context, prompt + max_new_tokens), so even a value
    past the flag bounds (set here behind the config's back) cannot allocate petabytes."""
    net = our_model("llama", 0)[0]
    config = SpecConfig(method="none", max_new_tokens=12)
    session = Session(net, TinyTokenizer(stop_ids=frozenset()), config, drafters={"none": NoDrafter})
    object.__setattr__(config, "max_new_tokens", 10**12)  # after the session's own check refused no such value
    events = session.generate_ids([1, 5, 6, 7])
    assert any(isinstance(e, Started) for e in events)
    limit = net.config.max_position_embeddings
    assert session._cache.capacity <= limit + config.max_tree_tokens + 256
    events.close()


@pytest.mark.parametrize("errno_error", [True, False])
def test_a_full_disk_under_the_cache_says_so(tmp_path: Path, monkeypatch, errno_error: bool) -> None:
    """Converting the embedded model into a full cache: an OSError(ENOSPC) and the tokenizers
    library's plain Exception("No space left on device") both end in the disk-space line."""
    import errno

    from engine.models import gguf_convert
    from engine.models.resolve import ModelResolutionError, resolve_model

    def full(*args, **kwargs):
        if errno_error:
            raise OSError(errno.ENOSPC, "No space left on device")
        raise Exception("No space left on device (os error 28)")  # what tokenizers' Rust code raises

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_convert, "write_tokenizer", full)
    with pytest.raises(ModelResolutionError, match="no space left on the disk") as info:
        resolve_model(None, weights="stored")
    assert "SPECCHAT_CACHE_DIR" in str(info.value)


def test_bench_drops_a_conversations_oldest_turns_where_the_flag_says_so(tmp_path: Path) -> None:
    """--context-overflow drop_oldest means in bench what it means in a chat: the conversation that
    bench refuses with the default (tests/bad_input: bench-conversation-too-long) is timed with its
    oldest turns left out, never as a row of 0 tokens."""
    import json

    model = write_tiny_model(tmp_path / "model")  # a context of 512 tokens
    turns = [{"role": "user", "content": "word " * 700}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "hi"}]
    (tmp_path / "p.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    out = tmp_path / "r.json"
    assert main(["bench", str(model), "--prompts", str(tmp_path / "p.jsonl"), "--max-new-tokens", "4", "--threads",
                 "1", "--context-overflow", "drop_oldest", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert all(r["tokens"] > 0 and r["decode_tokens_per_s"] > 0 for r in rows), rows


def test_an_answer_that_stops_at_once_makes_no_negative_rate_and_is_said(capsys) -> None:
    """A prompt the model ends at once (a raw "prompt" row to an instruct model): 0 tokens, and bench's row
    had decode tok/s below zero beside "identical". Now the rate is absent and one warning says why."""
    from engine.prompts import Prompt
    from specchat.bench import _say_empty_answers
    from specchat.bench_report import Row, Run

    row = Row("none", "stored")
    row.add(Run([], 1, 1, 0.02, 0.01), {"stored": [], None: []})
    row.add(Run([5, 6, 7], 2, 3, 0.05, 0.01), {"stored": [5, 6, 7], None: [5, 6, 7]})
    assert row.decode_tokens_per_s == pytest.approx(2 / (0.07 - 0.02))  # the empty answer decodes nothing
    empty = Row("none", "stored")
    empty.add(Run([], 1, 1, 0.02, 0.01), {"stored": [], None: []})
    assert empty.decode_tokens_per_s is None and empty.result(empty, "stored")["decode_tokens_per_s"] is None
    prompts = [Prompt("a", text="hi", where="p.jsonl:1"), Prompt("b", text="ho", where="p.jsonl:2")]
    _say_empty_answers(prompts, [row])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered nothing to 1 of 2 prompts (p.jsonl:1)" in err
