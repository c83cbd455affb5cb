"""The embedded model end to end (slow: converts SmolLM2 once, then decodes on the CPU)."""

from __future__ import annotations

import json

import pytest

from engine.config import SpecConfig
from engine.events import Step

pytestmark = pytest.mark.slow

PROMPTS = [
    "Rewrite the following text in the third person, about a man called Tom.\n\n"
    "I wake up at six every morning and I make a pot of coffee. Then I walk my dog around the park.",
    "Write a short poem about the sea.",
]


@pytest.fixture(scope="module")
def session():
    from engine.loader import load_session

    return load_session(None, SpecConfig(max_new_tokens=64))


def _tokens(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_ngram_equals_baseline_on_the_embedded_model(session, prompt: str, mode: str) -> None:
    messages = [{"role": "user", "content": prompt}]
    base = _tokens(session.generate(messages, session.config.replace(method="none")))
    spec = _tokens(session.generate(messages, session.config.replace(method="ngram", ngram_mode=mode)))
    assert len(base) > 10
    assert spec == base


def test_ngram_drafts_from_the_shipped_corpus_and_equals_baseline(session) -> None:
    """Free text matches little of its own conversation: the model's past answers draft. (A prompt
    no other test answers: the trie keeps what it counted, so a repeated answer drafts itself.)"""
    assert session.ngram_corpus is not None and session.ngram_corpus.wait(timeout=600) is not None
    messages = [{"role": "user", "content": "Give me three tips for a good night's sleep."}]
    base = _tokens(session.generate(messages, session.config.replace(method="none")))
    events = list(session.generate(messages, session.config.replace(method="ngram")))
    assert _tokens(events) == base
    steps = [e for e in events if isinstance(e, Step)]
    assert any(e.tree.source == "corpus" and len(e.tree) > 1 for e in steps)
    assert any(e.tree.source == "corpus" and e.accepted for e in steps)  # and some of its drafts land


def test_generate_cli_json(capsys) -> None:
    from specchat.cli import main

    assert main(["generate", "--prompt", PROMPTS[0], "--max-new-tokens", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) >= {"text", "tokens", "steps", "tau", "tokens_per_s"}
    assert out["tokens"] and out["steps"] <= len(out["tokens"]) + 1


def test_bench_cli_json(tmp_path) -> None:
    from specchat.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": PROMPTS[0]}]}) + "\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--prompts", str(prompts), "--methods", "none,ngram", "--max-new-tokens", "24",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "model", "results"}
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {"none", "ngram"}
    assert rows["none"]["speedup"] == 1.0 and rows["ngram"]["identical_to_baseline"]
    assert all(r["tokens_per_s"] > 0 and r["prompts"] == 1 for r in rows.values())
    assert "n-grams" in report["ngram_corpus"]  # timed with the whole corpus indexed, not while indexing


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "standalone"])
def test_bench_draft_methods_on_the_embedded_model(tmp_path, kind: str) -> None:
    """A random head (or draft model) written for the embedded model: bench's exactness check holds."""
    from heads import write_random_drafts

    from engine.models.resolve import resolve_model
    from specchat.cli import main

    drafts = write_random_drafts(resolve_model(None).path, tmp_path / "drafts")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": PROMPTS[0]}]}) + "\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--draft", str(drafts[kind]), "--prompts", str(prompts), "--methods", f"none,{kind}",
                 "--max-new-tokens", "24", "--json", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"none", kind} and rows[kind]["identical_to_baseline"]
