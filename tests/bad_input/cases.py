"""The bad-input table: each row an argv, the files it needs, the one line and exit code it must get.

Why a table: issue 50 tried ~110 bad inputs by hand; as rows they are re-tried on every ``make test``,
and a new one is a line here. test_bad_input.py runs each row (see its docstring for what is checked).
Rows whose behaviour is still wrong carry ``xfail="issue 50: ..."`` with the behaviour we want.
"""

from __future__ import annotations

from dataclasses import dataclass

import builders as b
from builders import Make

# the placeholders an argv may hold
TMP = "{tmp}"  # the case's own folder (its files are made there)
MODEL = "{model}"  # a tiny random model folder, shared by all cases
PORT = "{port}"  # a TCP port free when the case starts (serve binds it before checking anything else)


@dataclass(frozen=True)
class Case:
    """A bad input and the one line it must get.

    ``message``: a regex searched in the single error line on stderr. ``loads_model``: whether the
    target's weights may be read before the refusal (False: they must not be; see guards.py).
    ``xfail``: why this case does not pass yet ("issue 50: ..."); it is then a strict xfail, so a
    fix that makes it pass says so by failing the suite until the marker goes.
    ``subprocess``: run it as ``python -m specchat`` rather than through ``specchat.cli.main``.
    ``cpu_only``: the input is bad only where no CUDA GPU is visible (``--device cuda``).
    """

    id: str
    argv: tuple[str, ...]
    message: str
    code: int = 2
    files: tuple[Make, ...] = ()
    loads_model: bool = False
    xfail: str = ""
    subprocess: bool = False
    env: tuple[tuple[str, str], ...] = ()
    timeout: int = 20  # seconds; longer is a hang
    cpu_only: bool = False


def case(id: str, argv: str | tuple[str, ...], message: str, **kwargs) -> Case:
    """A Case; a str argv is split on spaces (use a tuple for an argument with a space in it)."""
    return Case(id, tuple(argv.split()) if isinstance(argv, str) else argv, message, **kwargs)


PROMPTS = b.jsonl("p.jsonl", {"prompt": "hello"})
TRACE = b.trace("t.jsonl")
M = MODEL
# the behaviour wanted where issue 50 found it wrong, and where this suite found more
LATE = "issue 50: refused clearly, but only after the target model loaded"
BOUNDS = "issue 50: knob bounds"
NEW = "new in the bad-input suite: "
GGUF_BAD = r"(is not a (readable )?GGUF file|cannot be read)"  # a damaged GGUF, named by our reader or gguf-py

GLOBAL = [
    case("global-no-command", (), r"required: command"),
    case("global-unknown-command", "bogus", r"invalid choice: 'bogus'"),
    case("global-unknown-flag", "--bogus", r"required: command"),
    case("global-unknown-command-entry-point", "bogus", r"invalid choice: 'bogus'", subprocess=True),
    case("global-unknown-flag-after-command", "export sglang --bogus", r"unrecognized arguments: --bogus"),
]

RUN = [
    case("run-unknown-flag", "run --bogus", r"unrecognized arguments: --bogus"),
    case("run-unknown-method", f"run {M} --method magic", r"unknown method 'magic'"),
    case("run-no-gpu", f"run {M} --device cuda", r"no CUDA GPU is visible; use --device cpu", cpu_only=True),
    case("run-bad-dtype", f"run {M} --dtype int3", r"unknown dtype 'int3'"),
    case("run-bad-precision", f"run {M} --precision turbo", r"unknown --precision 'turbo'"),
    case("run-bad-backend", f"run {M} --backend nope", r"argument --backend: invalid choice"),
    case("run-threads-not-a-number", f"run {M} --threads x", r"argument \-\-threads: must be an integer from 1 to"),
    case("run-seed-not-a-number", f"run {M} --seed x", r"argument \-\-seed: must be an integer from 0 to 9_223_372_036_854_775_80"),
    case("run-bad-sampling", f"run {M} --sampling x", r"argument \-\-sampling: unknown sampling 'x'; choose coupled, rejection"),
    case("run-compare-unknown-method", f"run {M} --compare magic,ngram", r"unknown method 'magic'"),
    case("run-compare-same-method", f"run {M} --compare ngram,ngram", r"two different methods"),
    case("run-compare-three", f"run {M} --compare a,b,c", r"compare takes two methods"),
    case("run-negative-temperature", f"run {M} --temperature -1", r"argument \-\-temperature: must be a number from 0 to 10"),
    case("run-nan-temperature", f"run {M} --temperature nan", r"argument \-\-temperature: must be a number from 0 to 10"),
    case("run-inf-temperature", f"run {M} --temperature inf", r"argument \-\-temperature: must be a number from 0 to 10"),
    case("run-top-p-above-one", f"run {M} --top-p 2", r"argument \-\-top\-p: must be a number above 0 and up to 1"),
    case("run-top-p-nan", f"run {M} --top-p nan", r"argument \-\-top\-p: must be a number above 0 and up to 1"),
    case("run-negative-top-k", f"run {M} --top-k -1", r"argument \-\-top\-k: must be an integer from 0 to 262_144"),
    case("run-topk-zero", f"run {M} --speculative-eagle-topk 0", r"argument \-\-speculative\-eagle\-topk: must be an integer from 1 to 64"),
    case("run-draft-tokens-one", f"run {M} --speculative-num-draft-tokens 1",
         r"argument \-\-speculative\-num\-draft\-tokens: must be an integer from 2 to "),
    case("run-draft-tokens-huge", f"run {M} --speculative-num-draft-tokens 99999", r"argument \-\-speculative\-num\-draft\-tokens: must be an integer from 2 to "),
    case("run-num-steps-zero", f"run {M} --speculative-num-steps 0", r"argument \-\-speculative\-num\-steps: must be an integer from 1 to 32"),
    case("run-max-new-tokens-zero", f"run {M} --max-new-tokens 0", r"argument \-\-max\-new\-tokens: must be an integer from 1 to 1_048_576"),
    case("run-max-new-tokens-negative", f"run {M} --max-new-tokens -5", r"argument \-\-max\-new\-tokens: must be an integer from 1 to 1_048_576"),
    case("run-bad-match-type", f"run {M} --speculative-ngram-match-type XYZ", r"argument \-\-speculative\-ngram\-match\-type: unknown ngram_match_type 'XYZ"),
    case("run-bad-ngram-mode", f"run {M} --speculative-ngram-mode zig", r"argument \-\-speculative\-ngram\-mode: unknown ngram_mode 'zig'; choose tr"),
    case("run-bad-medusa-tree", f"run {M} --speculative-medusa-tree x", r"argument \-\-speculative\-medusa\-tree: unknown medusa_tree 'x'; choose dy"),
    case("run-ngram-capacity-negative", f"run {M} --speculative-ngram-capacity -1", r"argument \-\-speculative\-ngram\-capacity: must be an integer from 1000 to"),
    case("run-ngram-window-zero", f"run {M} --speculative-ngram-min-match-window-size 0",
         r"argument \-\-speculative\-ngram\-min\-match\-window\-size: must be an integer"),
    case("run-ngram-window-crossed",
         f"run {M} --speculative-ngram-min-match-window-size 5 --speculative-ngram-max-match-window-size 2",
         r"ngram_max_match_window_size must be >= ngram_min_match_window_size"),
    case("run-ngram-trie-depth-zero", f"run {M} --speculative-ngram-max-trie-depth 0",
         r"argument \-\-speculative\-ngram\-max\-trie\-depth: must be an integer from 2"),
    case("run-ngram-breadth-zero", f"run {M} --speculative-ngram-min-bfs-breadth 0",
         r"argument \-\-speculative\-ngram\-min\-bfs\-breadth: must be an integer from "),
    case("run-fast-with-fp32", f"run {M} --precision fast --weights fp32", r"--precision fast needs .*stored weights"),
    case("run-fast-with-bf16", f"run {M} --precision fast --dtype bfloat16", r"--precision fast needs"),
    case("run-fast-with-hf", f"run {M} --precision fast --backend hf", r"--precision fast needs"),
    case("run-settings-missing", f"run {M} --settings {TMP}/none.json", r"--settings .*none\.json: no such file"),
    case("run-settings-not-json", f"run {M} --settings {TMP}/s.json", r"s\.json: not JSON",
         files=(b.text("s.json", "{not json"),)),
    case("run-settings-a-list", f"run {M} --settings {TMP}/s.json", r"write one JSON object of settings",
         files=(b.text("s.json", "[1, 2]"),)),
    case("run-settings-unknown-field", f"run {M} --settings {TMP}/s.json", r"unknown setting 'bogus'",
         files=(b.json_file("s.json", {"bogus": 1}),)),
    case("run-settings-wrong-type", f"run {M} --settings {TMP}/s.json", r"num_steps takes an integer, not 'x'",
         files=(b.json_file("s.json", {"num_steps": "x"}),)),
    case("run-settings-bool-for-int", f"run {M} --settings {TMP}/s.json", r"num_steps takes an integer, not True",
         files=(b.json_file("s.json", {"num_steps": True}),)),
    case("run-settings-out-of-range", f"run {M} --settings {TMP}/s.json", r"\-\-settings ",
         files=(b.json_file("s.json", {"temperature": -3}),)),
    case("run-settings-unknown-method", f"run {M} --settings {TMP}/s.json", r"unknown method 'magic'",
         files=(b.json_file("s.json", {"method": "magic"}),)),
    case("run-settings-not-utf8", f"run {M} --settings {TMP}/s.json", r"s\.json: cannot read it",
         files=(b.text("s.json", b"\xff\xfe\x00"),)),
    case("run-settings-a-folder", f"run {M} --settings {TMP}/d", r"--settings .*d: cannot read it",
         files=(b.folder("d"),)),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("run-num-steps-huge", f"run {M} --speculative-num-steps 99999", r"num_steps", xfail=BOUNDS),
    case("run-topk-huge", f"run {M} --speculative-eagle-topk 99999", r"eagle_topk", xfail=BOUNDS),
    case("run-settings-num-steps-huge", f"run {M} --settings {TMP}/s.json", r"num_steps",
         files=(b.json_file("s.json", {"num_steps": 99999}),)),
    case("run-threads-zero", f"run {M} --threads 0", r"threads"),
    case("run-threads-negative", f"run {M} --threads -3", r"threads"),
    case("run-max-new-tokens-huge", f"run {M} --max-new-tokens 1000000000000", r"max.new.tokens"),
    case("run-record-unwritable", f"run {M} --record /proc/nope/t.jsonl", r"record"),
    case("run-record-a-folder", f"run {M} --record {TMP}", r"record"),
    case("run-missing-draft", f"run {M} --draft {TMP}/nohead", r"nohead"),
    case("run-device-garbage", f"run {M} --device nope", r"device"),
    case("run-weights-garbage", f"run {M} --weights int8", r"weights",
         xfail=NEW + "run --weights int8 opens the chat; refused only by the loader inside it"),
    case("run-theme-unknown", f"run {M} --theme nope", r"theme",
         xfail=NEW + "run --theme nope opens the chat (a warning inside it), never refused at the command line"),
    case("run-missing-model", "run /no/such/model", r"no such file or folder",
         xfail=NEW + "run /no/such/model opens the chat before saying the model does not exist"),
]

GENERATE = [
    case("generate-no-prompt", f"generate {M}", r"one of the arguments --prompt --prompt-file is required"),
    case("generate-two-prompts", f"generate {M} --prompt a --prompt-file b", r"not allowed with argument --prompt"),
    case("generate-empty-prompt", ("generate", M, "--prompt", ""), r"the prompt is empty"),
    case("generate-blank-prompt", ("generate", M, "--prompt", "   "), r"the prompt is empty"),
    case("generate-prompt-file-missing", f"generate {M} --prompt-file {TMP}/none.txt",
         r"prompt file .*none\.txt does not exist"),
    case("generate-prompt-file-empty", f"generate {M} --prompt-file {TMP}/e.txt", r"the prompt is empty",
         files=(b.text("e.txt", ""),)),
    case("generate-prompt-file-not-utf8", f"generate {M} --prompt-file {TMP}/b.txt", r"cannot read the prompt file",
         files=(b.text("b.txt", b"\xff\xfe\xfa"),)),
    case("generate-unknown-method", f"generate {M} --prompt hi --method magic", r"unknown method 'magic'"),
    case("generate-bad-dtype", f"generate {M} --prompt hi --dtype int3", r"unknown dtype 'int3'"),
    case("generate-no-gpu", f"generate {M} --prompt hi --device cuda:0", r"no CUDA GPU is visible", cpu_only=True),
    case("generate-bad-weights", f"generate {M} --prompt hi --weights int8", r"--weights must be stored or fp32"),
    case("generate-bad-precision", f"generate {M} --prompt hi --precision turbo", r"--precision must be auto, exact"),
    case("generate-fast-with-fp32", f"generate {M} --prompt hi --precision fast --weights fp32",
         r"--precision fast needs"),
    case("generate-negative-temperature", f"generate {M} --prompt hi --temperature -1", r"argument \-\-temperature: must be a number from 0 to 10"),
    case("generate-topk-zero", f"generate {M} --prompt hi --speculative-eagle-topk 0", r"argument \-\-speculative\-eagle\-topk: must be an integer from 1 to 64"),
    case("generate-model-missing", "generate /no/such/folder --prompt hi", r"no such file or folder: /no/such/folder"),
    case("generate-model-unknown-name", "generate no-such-model --prompt hi", r"unknown model 'no-such-model'"),
    case("generate-hub-id-offline", "generate HuggingFaceTB/no-such-model-xyz --prompt hi",
         r"not in the local Hugging Face cache"),
    case("generate-model-empty-folder", f"generate {TMP}/empty --prompt hi", r"has no config\.json",
         files=(b.folder("empty"),)),
    case("generate-model-no-weights", f"generate {TMP}/m --prompt hi", r"has no weights",
         files=(b.model_copy("m", drop=("model.safetensors",)),)),
    case("generate-model-no-config", f"generate {TMP}/m --prompt hi", r"has no config\.json",
         files=(b.model_copy("m", drop=("config.json",)),)),
    case("generate-model-no-tokenizer", f"generate {TMP}/m --prompt hi", r"has no tokenizer\.json",
         files=(b.model_copy("m", drop=("tokenizer.json",)),)),
    case("generate-model-config-not-json", f"generate {TMP}/m --prompt hi", r"config",
         files=(b.model_copy("m"), b.text("m/config.json", "{oops"))),
    case("generate-model-a-text-file", f"generate {TMP}/x.txt --prompt hi", r"x\.txt is a file",
         files=(b.text("x.txt", "hi"),)),
    case("generate-gguf-not-gguf", f"generate {TMP}/x.gguf --prompt hi", r"x\.gguf " + GGUF_BAD,
         files=(b.text("x.gguf", "not a gguf"),)),
    case("generate-gguf-bad-magic", f"generate {TMP}/x.gguf --prompt hi", GGUF_BAD,
         files=(b.gguf("x.gguf", magic=b"GGUX"),)),
    case("generate-gguf-empty", f"generate {TMP}/x.gguf --prompt hi", GGUF_BAD,
         files=(b.text("x.gguf", b""),)),
    case("generate-safetensors-garbage", f"generate {TMP}/m --prompt hi", r"is not a valid safetensors file",
         files=(b.model_copy("m", weights=b"garbage"),), loads_model=True),
    case("generate-safetensors-bad-header", f"generate {TMP}/m --prompt hi", r"not a valid safetensors file",
         files=(b.model_copy("m", weights=b"\x10\x00\x00\x00\x00\x00\x00\x00garbage"),), loads_model=True),
    case("generate-draft-without-weights", f"generate {M} --prompt hi --draft {TMP}/h", r"has no weights",
         files=(b.text("h/config.json", "{}"),), loads_model=True),
    case("generate-draft-wrong-method", f"generate {M} --prompt hi --draft {TMP}/h --method medusa",
         r"is an EAGLE-3 head; use --method eagle3", files=(b.head("h"),), loads_model=True),
    case("generate-token-map-not-json",
         f"generate {M} --prompt hi --method eagle --draft {TMP}/h --speculative-token-map {TMP}/m.json",
         r"token map .*m\.json could not be read", files=(b.head("h", kind="eagle"), b.text("m.json", "{bad")),
         loads_model=True),
    case("generate-token-map-outside-vocab",
         f"generate {M} --prompt hi --method eagle --draft {TMP}/h --speculative-token-map {TMP}/m.json",
         r"ids outside the target vocabulary", files=(b.head("h", kind="eagle"), b.json_file("m.json", [999999])),
         loads_model=True),
    case("generate-corpus-no-shards", f"generate {M} --prompt hi --ngram-corpus {TMP}/c", r"no batch-\*\.npz shards",
         files=(b.folder("c"),), loads_model=True),
    case("generate-corpus-garbage-shard", f"generate {M} --prompt hi --ngram-corpus {TMP}/c",
         r"batch-0\.npz is not a data shard", files=(b.text("c/batch-0.npz", "garbage"),), loads_model=True),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("generate-prompt-file-a-folder", f"generate {M} --prompt-file {TMP}/d", r"folder|directory|regular file",
         files=(b.folder("d"),)),
    case("generate-prompt-file-a-fifo", f"generate {M} --prompt-file {TMP}/p", r"regular file|pipe|FIFO|fifo",
         files=(b.fifo("p"),)),
    case("generate-prompt-too-long", f"generate {M} --prompt-file {TMP}/long.txt --max-new-tokens 4",
         r"context|too long", files=(b.text("long.txt", "hello world " * 400),), loads_model=True),
    case("generate-max-new-tokens-huge", f"generate {M} --prompt hi --max-new-tokens 1000000000000",
         r"max.new.tokens", loads_model=True),
    case("generate-threads-zero", f"generate {M} --prompt hi --threads 0", r"threads"),
    case("generate-num-steps-huge", f"generate {M} --prompt hi --method eagle3 --speculative-num-steps 99999",
         r"num_steps", xfail="issue 50: --speculative-num-steps 99999 drafts 99,999 levels a step (a hang)"),
    case("generate-settings-num-steps-huge", f"generate {M} --prompt hi --settings {TMP}/s.json", r"num_steps",
         files=(b.json_file("s.json", {"num_steps": 99999}),)),
    case("generate-missing-draft", f"generate {M} --prompt hi --draft {TMP}/nohead", r"nohead"),
    case("generate-eagle3-without-draft", f"generate {M} --prompt hi --method eagle3", r"needs --draft"),
    case("generate-head-wrong-width", f"generate {M} --prompt hi --method eagle3 --draft {TMP}/h",
         r"hidden size 64", files=(b.head("h", hidden=64),)),
    case("generate-pickle-head", f"generate {M} --prompt hi --method eagle --draft {TMP}/h", r"--allow-pickle",
         files=(b.head("h", kind="eagle", pickle=True),)),
    case("generate-missing-corpus", f"generate {M} --prompt hi --ngram-corpus {TMP}/nocorpus", r"nocorpus"),
    case("generate-missing-token-map",
         f"generate {M} --prompt hi --method eagle --draft {TMP}/h --speculative-token-map {TMP}/nomap.pt",
         r"nomap\.pt", files=(b.head("h", kind="eagle"),)),
    case("generate-gguf-huge-tensor-count", f"generate {TMP}/x.gguf --prompt hi", r"x\.gguf",
         files=(b.gguf("x.gguf", n_tensors=2**40),)),
    case("generate-gguf-huge-kv-count", f"generate {TMP}/x.gguf --prompt hi", r"x\.gguf",
         files=(b.gguf("x.gguf", n_kv=2**40),)),
    case("generate-gguf-unknown-version", f"generate {TMP}/x.gguf --prompt hi", r"version",
         files=(b.gguf("x.gguf", version=9),),
         xfail=NEW + "a GGUF of version 9 is called 'architecture None is not supported'"),
    case("generate-config-hidden-size-zero", f"generate {TMP}/m --prompt hi", r"hidden_size",
         files=(b.model_copy("m", {"hidden_size": 0}),), loads_model=True),
    case("generate-config-hidden-size-negative", f"generate {TMP}/m --prompt hi", r"hidden_size",
         files=(b.model_copy("m", {"hidden_size": -32}),), loads_model=True),
    case("generate-config-heads-do-not-divide", f"generate {TMP}/m --prompt hi", r"num_attention_heads|hidden_size",
         files=(b.model_copy("m", {"num_attention_heads": 5}),), loads_model=True),
    case("generate-config-unknown-type", f"generate {TMP}/m --prompt hi", r"banana",
         files=(b.model_copy("m", {"model_type": "banana"}),), loads_model=True,
         xfail="issue 50: nonsense config values (a misleading 'use --precision exact')"),
    case("generate-config-unknown-type-exact", f"generate {TMP}/m --prompt hi --precision exact", r"banana",
         files=(b.model_copy("m", {"model_type": "banana"}),), loads_model=True,
         xfail="issue 50: nonsense config values (then a transformers traceback)"),
    case("generate-config-no-hidden-size", f"generate {TMP}/m --prompt hi --precision exact", r"hidden_size",
         files=(b.model_copy("m", {"hidden_size": None}),), loads_model=True),
    case("generate-config-vocab-a-string", f"generate {TMP}/m --prompt hi --precision exact", r"vocab_size",
         files=(b.model_copy("m", {"vocab_size": "lots"}),), loads_model=True,
         xfail="issue 50: nonsense config values (vocab_size 'lots': a traceback)"),
    case("generate-config-more-layers-than-weights", f"generate {TMP}/m --prompt hi", r"layers|model\.layers\.2",
         files=(b.model_copy("m", {"num_hidden_layers": 7}),), loads_model=True,
         xfail=NEW + "config.json says 7 layers, the weights hold 2: a KeyError traceback"),
    case("generate-config-vocab-smaller-than-weights", f"generate {TMP}/m --prompt hi --max-new-tokens 2",
         r"vocab", files=(b.model_copy("m", {"vocab_size": 10}),), loads_model=True,
         xfail=NEW + "config.json vocab_size 10 beside 273-row embeddings answers with no warning"),
    case("generate-device-garbage", f"generate {M} --prompt hi --device nope", r"device"),
]

BENCH = [
    case("bench-no-prompts", f"bench {M}", r"bench needs --prompts"),
    case("bench-prompts-missing", f"bench {M} --prompts {TMP}/none.jsonl", r"none\.jsonl: no such file"),
    case("bench-prompts-empty", f"bench {M} --prompts {TMP}/e.jsonl", r"holds no prompts",
         files=(b.text("e.jsonl", ""),)),
    case("bench-prompts-not-json", f"bench {M} --prompts {TMP}/e.jsonl", r"e\.jsonl:1: not valid JSON",
         files=(b.text("e.jsonl", "not json\n"),)),
    case("bench-prompts-no-field", f"bench {M} --prompts {TMP}/e.jsonl", r"no 'messages', 'turns' or 'prompt'",
         files=(b.jsonl("e.jsonl", {"foo": 1}),)),
    case("bench-prompts-no-messages", f"bench {M} --prompts {TMP}/e.jsonl", r"'messages' must be a list",
         files=(b.jsonl("e.jsonl", {"messages": []}),)),
    case("bench-prompts-messages-a-string", f"bench {M} --prompts {TMP}/e.jsonl", r"'messages' must be a list",
         files=(b.jsonl("e.jsonl", {"messages": "hi"}),)),
    case("bench-prompts-row-a-list", f"bench {M} --prompts {TMP}/e.jsonl", r"not a JSON object",
         files=(b.jsonl("e.jsonl", [1, 2]),)),
    case("bench-prompts-no-turns", f"bench {M} --prompts {TMP}/e.jsonl", r"'turns' must be a non-empty list",
         files=(b.jsonl("e.jsonl", {"turns": []}),)),
    case("bench-prompts-prompt-a-number", f"bench {M} --prompts {TMP}/e.jsonl", r"e\.jsonl:1",
         files=(b.jsonl("e.jsonl", {"prompt": 5}),)),
    case("bench-prompts-bad-second-line", f"bench {M} --prompts {TMP}/e.jsonl", r"e\.jsonl:2",
         files=(b.jsonl("e.jsonl", {"prompt": "ok"}, "{not json}"),)),
    case("bench-prompts-a-folder", f"bench {M} --prompts {TMP}/d", r"is a folder, not a JSON-lines file",
         files=(b.folder("d"),)),
    case("bench-prompts-not-utf8", f"bench {M} --prompts {TMP}/b.jsonl", r"not a UTF-8 text file",
         files=(b.text("b.jsonl", b"\xff\xfe{}"),)),
    case("bench-unknown-method", f"bench {M} --prompts {TMP}/p.jsonl --methods magic", r"unknown method 'magic'",
         files=(PROMPTS,)),
    case("bench-unknown-peer", f"bench {M} --prompts {TMP}/p.jsonl --peers vllm", r"unknown peer 'vllm'",
         files=(PROMPTS,)),
    case("bench-limit-zero", f"bench {M} --prompts {TMP}/p.jsonl --limit 0", r"argument \-\-limit: must be an integer from 1 to 1_000_000", files=(PROMPTS,)),
    case("bench-bad-weights", f"bench {M} --prompts {TMP}/p.jsonl --weights int8", r"--weights takes stored, fp32",
         files=(PROMPTS,)),
    case("bench-empty-weights", f"bench {M} --prompts {TMP}/p.jsonl --weights ,", r"--weights takes", files=(PROMPTS,)),
    case("bench-auto-among-precisions", f"bench {M} --prompts {TMP}/p.jsonl --precision auto,fast",
         r"--precision auto stands alone", files=(PROMPTS,)),
    case("bench-bad-precision", f"bench {M} --prompts {TMP}/p.jsonl --precision turbo", r"--precision takes",
         files=(PROMPTS,)),
    case("bench-fast-with-fp32", f"bench {M} --prompts {TMP}/p.jsonl --precision fast --weights fp32",
         r"drop fp32 from --weights", files=(PROMPTS,)),
    case("bench-json-a-folder", f"bench {M} --prompts {TMP}/p.jsonl --json {TMP}", r"--json .* is a folder",
         files=(PROMPTS,)),
    case("bench-json-under-a-file", f"bench {M} --prompts {TMP}/p.jsonl --json {TMP}/p.jsonl/x.json",
         r"is a file, not a folder", files=(PROMPTS,)),
    case("bench-plot-not-svg", f"bench {M} --prompts {TMP}/p.jsonl --plot {TMP}/x.png", r"name a \.svg file",
         files=(PROMPTS,)),
    case("bench-random-weights-unknown", "bench --random-weights banana", r"'banana' is neither a shape name"),
    case("bench-random-weights-bad-config", f"bench --random-weights {TMP}/c.json", r"cannot read .*c\.json",
         files=(b.text("c.json", "{bad"),)),
    case("bench-random-weights-missing-config", f"bench --random-weights {TMP}/c.json", r"is neither a shape name"),
    case("bench-data-engine-zero", f"bench {M} --data-engine 0", r"argument \-\-data\-engine: must be an integer from 1 to 65536"),
    case("bench-data-engine-negative", f"bench {M} --data-engine -3", r"argument \-\-data\-engine: must be an integer from 1 to 65536"),
    case("bench-unknown-method-in-settings", f"bench {M} --prompts {TMP}/p.jsonl --settings {TMP}/s.json",
         r"unknown method 'magic'", files=(PROMPTS, b.json_file("s.json", {"method": "magic"}))),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("bench-prompts-a-fifo", f"bench {M} --prompts {TMP}/p", r"regular file|pipe|FIFO|fifo",
         files=(b.fifo("p"),), timeout=2, xfail=NEW + "--prompts naming a FIFO hangs"),
    case("bench-prompt-empty-string", f"bench {M} --prompts {TMP}/e.jsonl", r"e\.jsonl:1",
         files=(b.jsonl("e.jsonl", {"prompt": ""}),),
         xfail=NEW + "a prompt file row {\"prompt\": \"\"}: a ValueError traceback after the load"),
    case("bench-cost-curve-negative-context", f"bench {M} --cost-curve --context -5", r"context"),
    case("bench-peak-bandwidth-negative", f"bench {M} --prompts {TMP}/p.jsonl --peak-bandwidth -1",
         r"peak.bandwidth", files=(PROMPTS,)),
    case("bench-data-engine-few-layers", f"bench {M} --data-engine 4", r"layers", loads_model=True),
    case("bench-threads-zero", f"bench {M} --prompts {TMP}/p.jsonl --threads 0", r"threads", files=(PROMPTS,)),
    case("bench-max-new-tokens-huge", f"bench {M} --prompts {TMP}/p.jsonl --max-new-tokens 1000000000000",
         r"max.new.tokens", files=(PROMPTS,), loads_model=True),
    case("bench-eagle3-without-draft", f"bench {M} --prompts {TMP}/p.jsonl --methods eagle3", r"eagle3",
         files=(PROMPTS,), xfail=LATE + " (--methods eagle3 and no head)"),
]

TUNE = [
    case("tune-no-prompts", f"tune {M}", r"required: --prompts"),
    case("tune-prompts-missing", f"tune {M} --prompts {TMP}/none.jsonl", r"none\.jsonl: no such file"),
    case("tune-prompts-empty", f"tune {M} --prompts {TMP}/e.jsonl", r"holds no prompts",
         files=(b.text("e.jsonl", ""),)),
    case("tune-grid-unknown-knob", f"tune {M} --prompts {TMP}/p.jsonl --grid bogus=1", r"--grid: unknown knob 'bogus'",
         files=(PROMPTS,)),
    case("tune-grid-no-values", f"tune {M} --prompts {TMP}/p.jsonl --grid num_steps", r"num_steps needs values",
         files=(PROMPTS,)),
    case("tune-grid-empty-values", f"tune {M} --prompts {TMP}/p.jsonl --grid num_steps=", r"num_steps needs values",
         files=(PROMPTS,)),
    case("tune-grid-not-integers", f"tune {M} --prompts {TMP}/p.jsonl --grid num_steps=a,b --methods eagle3",
         r"num_steps takes integers, not 'a'", files=(PROMPTS,)),
    case("tune-grid-knob-twice", f"tune {M} --prompts {TMP}/p.jsonl --grid num_steps=3;num_steps=4 --methods eagle3",
         r"num_steps is given twice", files=(PROMPTS,)),
    case("tune-grid-empty", f"tune {M} --prompts {TMP}/p.jsonl --grid ;", r"--grid is empty", files=(PROMPTS,)),
    case("tune-grid-knob-unused", f"tune {M} --prompts {TMP}/p.jsonl --grid num_steps=3",
         r"num_steps acts on none of ngram", files=(PROMPTS,)),
    case("tune-unknown-method", f"tune {M} --prompts {TMP}/p.jsonl --methods magic", r"unknown method 'magic'",
         files=(PROMPTS,)),
    case("tune-only-baseline", f"tune {M} --prompts {TMP}/p.jsonl --methods none", r"tune needs a method to tune",
         files=(PROMPTS,)),
    case("tune-no-methods", f"tune {M} --prompts {TMP}/p.jsonl --methods ,", r"tune needs a method", files=(PROMPTS,)),
    case("tune-temperature", f"tune {M} --prompts {TMP}/p.jsonl --temperature 0.7", r"drop --temperature",
         files=(PROMPTS,)),
    case("tune-minutes-zero", f"tune {M} --prompts {TMP}/p.jsonl --minutes 0", r"argument \-\-minutes: must be a number above 0 and up to 10080",
         files=(PROMPTS,)),
    case("tune-minutes-negative", f"tune {M} --prompts {TMP}/p.jsonl --minutes -1", r"argument \-\-minutes: must be a number above 0 and up to 10080",
         files=(PROMPTS,)),
    case("tune-two-weights-modes", f"tune {M} --prompts {TMP}/p.jsonl --weights stored,fp32",
         r"tune measures one weights mode", files=(PROMPTS,)),
    case("tune-json-a-folder", f"tune {M} --prompts {TMP}/p.jsonl --json {TMP}", r"is a folder; name a file",
         files=(PROMPTS,)),
    case("tune-save-settings-unwritable", f"tune {M} --prompts {TMP}/p.jsonl --save-settings /proc/nope/s.json",
         r"cannot create the folder /proc/nope", files=(PROMPTS,)),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("tune-minutes-nan", f"tune {M} --prompts {TMP}/p.jsonl --minutes nan", r"minutes", files=(PROMPTS,)),
    case("tune-save-settings-a-folder", f"tune {M} --prompts {TMP}/p.jsonl --save-settings {TMP}",
         r"--save-settings .*folder", files=(PROMPTS,)),
    case("tune-grid-num-steps-huge", f"tune {M} --prompts {TMP}/p.jsonl --methods eagle3 --grid num_steps=99999",
         r"num_steps", files=(PROMPTS,), xfail=BOUNDS + " (tune's --grid)"),
    case("tune-threads-zero", f"tune {M} --prompts {TMP}/p.jsonl --threads 0", r"threads", files=(PROMPTS,)),
]

EXPORT = [
    case("export-no-server", "export", r"required: server"),
    case("export-unknown-server", "export nginx", r"argument server: invalid choice: 'nginx'"),
    case("export-unknown-method", "export sglang --method magic", r"unknown method 'magic'"),
    case("export-draft-without-method", "export sglang --draft foo", r"add --method eagle, eagle3"),
    case("export-num-steps-zero", "export sglang --method eagle3 --speculative-num-steps 0",
         r"argument \-\-speculative\-num\-steps: must be an integer from 1 to 32"),
    case("export-topk-over-tree", "export vllm --method eagle3 --speculative-eagle-topk 99999",
         r"argument \-\-speculative\-eagle\-topk: must be an integer from 1 to 64"),
    case("export-draft-tokens-huge", "export vllm --method eagle3 --speculative-num-draft-tokens 99999",
         r"argument \-\-speculative\-num\-draft\-tokens: must be an integer from 2 to "),
    case("export-negative-temperature", "export vllm --temperature -1", r"argument \-\-temperature: must be a number from 0 to 10"),
    case("export-bad-ngram-mode", "export sglang --speculative-ngram-mode zig", r"argument \-\-speculative\-ngram\-mode: unknown ngram_mode 'zig'; choose tr"),
    case("export-settings-not-json", f"export sglang --settings {TMP}/s.json", r"not JSON",
         files=(b.text("s.json", "nope"),)),
    case("export-settings-unknown-field", f"export sglang --settings {TMP}/s.json", r"unknown setting 'bogus'",
         files=(b.json_file("s.json", {"bogus": 1}),)),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("export-num-steps-huge", "export sglang --method eagle3 --speculative-num-steps 99999", r"num_steps",
         xfail="issue 50: export sglang --speculative-num-steps 99999 prints that launch line"),
    case("export-settings-num-steps-huge", f"export sglang --settings {TMP}/s.json", r"num_steps",
         files=(b.json_file("s.json", {"method": "eagle3", "num_steps": 99999}),)),
]

REPLAY = [
    case("replay-no-trace", "replay", r"required: trace"),
    case("replay-missing", f"replay {TMP}/none.jsonl", r"none\.jsonl: no such file"),
    case("replay-empty", f"replay {TMP}/e.jsonl", r"empty file, not a specchat trace", files=(b.text("e.jsonl", ""),)),
    case("replay-garbage", f"replay {TMP}/e.jsonl", r"no whole JSON record in it",
         files=(b.text("e.jsonl", "garbage\n"),)),
    case("replay-binary", f"replay {TMP}/e.jsonl", r"not a specchat trace",
         files=(b.text("e.jsonl", b"\x00\xff\xfe x"),)),
    case("replay-no-header", f"replay {TMP}/e.jsonl", r"line 1 is not a specchat-trace header",
         files=(b.jsonl("e.jsonl", {"kind": "step"}),)),
    case("replay-a-folder", f"replay {TMP}/d", r"is a folder, not a JSON-lines file", files=(b.folder("d"),)),
    case("replay-future-version", f"replay {TMP}/t.jsonl", r"trace format version 99",
         files=(b.trace("t.jsonl", header={"kind": "header", "format": "specchat-trace", "format_version": 99}),)),
    case("replay-negative-speed", f"replay {TMP}/t.jsonl --speed -2", r"argument \-\-speed: must be a number above 0 and up to 1000", files=(TRACE,)),
    case("replay-speed-not-a-number", f"replay {TMP}/t.jsonl --speed x", r"argument \-\-speed: must be a number above 0 and up to 1000",
         files=(TRACE,)),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("replay-speed-zero", f"replay {TMP}/t.jsonl --speed 0", r"speed", files=(TRACE,)),
    case("replay-speed-nan", f"replay {TMP}/t.jsonl --speed nan", r"speed", files=(TRACE,)),
    case("replay-speed-inf", f"replay {TMP}/t.jsonl --speed inf", r"speed", files=(TRACE,)),
    case("replay-string-for-a-number", f"replay {TMP}/t.jsonl", r"t\.jsonl",
         files=(b.trace("t.jsonl", {"kind": "started", "prompt_tokens": "lots"}),)),
    case("replay-a-fifo", f"replay {TMP}/p", r"regular file|pipe|FIFO|fifo", files=(b.fifo("p"),), timeout=2,
         xfail=NEW + "replay of a FIFO hangs"),
    case("replay-theme-unknown", f"replay {TMP}/t.jsonl --theme nope", r"theme", files=(TRACE,),
         xfail=NEW + "replay --theme nope opens the replay (a warning inside it)"),
]

SERVE = [
    case("serve-port-zero", f"serve {M} --port 0", r"argument \-\-port: must be an integer from 1 to 65535"),
    case("serve-port-too-big", f"serve {M} --port 70000", r"argument \-\-port: must be an integer from 1 to 65535"),
    case("serve-port-negative", f"serve {M} --port -1", r"argument \-\-port: must be an integer from 1 to 65535"),
    case("serve-port-not-a-number", f"serve {M} --port http", r"argument \-\-port: must be an integer from 1 to 65535"),
    case("serve-host-not-here", f"serve {M} --host 192.0.2.1 --port {PORT}", r"is not an address of this machine"),
    case("serve-host-v6-not-here", f"serve {M} --host ::99 --port {PORT}", r"::99"),
    case("serve-max-sessions-zero", f"serve {M} --max-sessions 0 --port {PORT}", r"argument \-\-max\-sessions: must be an integer from 1 to 1024"),
    case("serve-max-sessions-negative", f"serve {M} --max-sessions -2 --port {PORT}", r"argument \-\-max\-sessions: must be an integer from 1 to 1024"),
    case("serve-unknown-method", f"serve {M} --method magic --port {PORT}", r"unknown method 'magic'"),
    case("serve-bad-precision", f"serve {M} --precision turbo --port {PORT}", r"unknown --precision 'turbo'"),
    case("serve-compare-unknown", f"serve {M} --compare x,y --port {PORT}", r"unknown method 'x'"),
    case("serve-model-missing", f"serve /no/such/model --port {PORT}", r"no such file or folder: /no/such/model"),
    case("serve-model-empty-folder", f"serve {TMP}/empty --port {PORT}", r"has no config\.json",
         files=(b.folder("empty"),)),
    case("serve-bad-dtype", f"serve {M} --dtype int3 --port {PORT}", r"unknown dtype 'int3'"),
    case("serve-settings-a-list", f"serve {M} --settings {TMP}/s.json --port {PORT}", r"write one JSON object",
         files=(b.text("s.json", "[]"),)),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("serve-device-garbage", f"serve {M} --device nope --port {PORT}", r"device"),
    case("serve-weights-garbage", f"serve {M} --weights int8 --port {PORT}", r"weights",
         xfail=NEW + "serve --weights int8 starts the server; each tab then fails to load"),
    case("serve-num-steps-huge", f"serve {M} --speculative-num-steps 99999 --port {PORT}", r"num_steps", xfail=BOUNDS),
    case("serve-threads-zero", f"serve {M} --threads 0 --port {PORT}", r"threads"),
    case("serve-record-unwritable", f"serve {M} --record /proc/nope/t.jsonl --port {PORT}", r"record"),
]

OUT = f"--out {TMP}/o"
TRAIN_DRAFT = [
    case("train-draft-no-out", f"train-draft {M}", r"--out is required"),
    case("train-draft-tokens-zero", f"train-draft {M} {OUT} --tokens 0", r"argument \-\-tokens: must be an integer from 1 to 10_000_000_000"),
    case("train-draft-vocab-one", f"train-draft {M} {OUT} --draft-vocab-size 1", r"must be positive"),
    case("train-draft-ttt-zero", f"train-draft {M} {OUT} --ttt-steps 0", r"argument \-\-ttt\-steps: must be an integer from 1 to 64"),
    case("train-draft-batch-tokens-small", f"train-draft {M} {OUT} --batch-tokens 8", r"batch-tokens at least 16"),
    case("train-draft-rows-zero", f"train-draft {M} {OUT} --rows 0", r"argument \-\-rows: must be an integer from 1 to 4096"),
    case("train-draft-gen-batch-zero", f"train-draft {M} {OUT} --gen-batch 0", r"argument \-\-gen\-batch: must be an integer from 1 to 4096"),
    case("train-draft-magpie-above-one", f"train-draft {M} {OUT} --magpie-share 2", r"argument \-\-magpie\-share: must be a number from 0 to 1"),
    case("train-draft-magpie-nan", f"train-draft {M} {OUT} --magpie-share nan", r"argument \-\-magpie\-share: must be a number from 0 to 1"),
    case("train-draft-magpie-without-prompts", f"train-draft {M} {OUT} --magpie-share 0.5 --no-builtin-prompts",
         r"needs prompts"),
    case("train-draft-layout-without-medusa", f"train-draft {M} {OUT} --export-layout vllm",
         r"go with --method medusa"),
    case("train-draft-lm-head-without-medusa", f"train-draft {M} {OUT} --medusa-train-lm-head",
         r"go with --method medusa"),
    case("train-draft-medusa-no-heads", f"train-draft {M} {OUT} --method medusa --medusa-heads 0",
         r"argument \-\-medusa\-heads: must be an integer from 1 to 16"),
    case("train-draft-medusa-init-from", f"train-draft {M} {OUT} --method medusa --init-from {TMP}/x",
         r"takes no --init-from"),
    case("train-draft-refit-without-init", f"train-draft {M} {OUT} --refit-vocab",
         r"--refit-vocab goes with --init-from"),
    case("train-draft-import-data-missing", f"train-draft {M} {OUT} --import-data {TMP}/nodata",
         r"--import-data .*nodata: no such folder"),
    case("train-draft-prompts-missing", f"train-draft {M} {OUT} --prompts {TMP}/none.jsonl",
         r"none\.jsonl: no such file"),
    case("train-draft-prompts-not-json", f"train-draft {M} {OUT} --prompts {TMP}/b.jsonl",
         r"b\.jsonl:1: not valid JSON",
         files=(b.text("b.jsonl", "{bad\n"),)),
    case("train-draft-init-from-missing", f"train-draft {M} {OUT} --init-from {TMP}/nohead", r"not an exported head"),
    case("train-draft-resume-nothing", f"train-draft {M} {OUT} --resume", r"has no checkpoint"),
    case("train-draft-checkpoint-without-resume", f"train-draft {M} {OUT}", r"already holds a training run",
         files=(b.text("o/checkpoint/progress.json", "{}"),)),
    case("train-draft-out-a-file", f"train-draft {M} --out {TMP}/f.txt", r"f\.txt is a file",
         files=(b.text("f.txt", "x"),)),
    case("train-draft-out-unwritable", f"train-draft {M} --out /proc/nope/out",
         r"cannot write to --out /proc/nope/out"),
    case("train-draft-unknown-method", f"train-draft {M} {OUT} --method eagle4", r"--method: invalid choice: 'eagle4'"),
    case("train-draft-bad-export-dtype", f"train-draft {M} {OUT} --export-dtype int8",
         r"--export-dtype: invalid choice"),
    case("train-draft-bad-bf16", f"train-draft {M} {OUT} --bf16 maybe", r"--bf16: invalid choice"),
    case("train-draft-bad-data-precision", f"train-draft {M} {OUT} --data-precision turbo",
         r"--data-precision: invalid choice"),
    case("train-draft-tokens-not-a-number", f"train-draft {M} {OUT} --tokens x", r"argument \-\-tokens: must be an integer from 1 to 10_000_000_000"),
    case("train-draft-no-gpu", f"train-draft {M} {OUT} --device cuda", r"no CUDA GPU is visible", cpu_only=True),
    case("train-draft-model-missing", f"train-draft /no/such/model {OUT}", r"no such file or folder: /no/such/model"),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    case("train-draft-out-a-model", f"train-draft {M} --out {TMP}/m", r"out|model", files=(b.model_copy("m"),)),
    case("train-draft-max-steps-negative", f"train-draft {M} {OUT} --max-steps -5", r"max.steps"),
    case("train-draft-threads-zero", f"train-draft {M} {OUT} --threads 0", r"threads"),
    case("train-draft-few-layers", f"train-draft {M} {OUT} --tokens 50", r"layers", loads_model=True, timeout=8),
    case("train-draft-epochs-negative", f"train-draft {M} {OUT} --epochs -1", r"epochs"),
    case("train-draft-lr-negative", f"train-draft {M} {OUT} --lr -1", r"\blr\b|learning rate"),
    case("train-draft-hours-negative", f"train-draft {M} {OUT} --hours -1", r"hours"),
    case("train-draft-eval-every-zero", f"train-draft {M} {OUT} --eval-every 0", r"eval.every"),
    case("train-draft-checkpoint-every-zero", f"train-draft {M} {OUT} --checkpoint-every 0", r"checkpoint.every"),
    case("train-draft-intermediate-size-zero", f"train-draft {M} {OUT} --intermediate-size 0", r"intermediate.size"),
    case("train-draft-device-garbage", f"train-draft {M} {OUT} --device nope", r"device"),
]

CASES: list[Case] = [*GLOBAL, *RUN, *GENERATE, *BENCH, *TUNE, *EXPORT, *REPLAY, *SERVE, *TRAIN_DRAFT]


@dataclass(frozen=True)
class ConfigCase:
    """A bad line in the user's config file (specchat/tui/userconfig.py): never an exit, but one warning
    that names it, and the setting it tried to change left at its default (``binding``: a key binding id
    that must not be taken from the file)."""

    id: str
    toml: str
    warning: str
    binding: str = ""
    xfail: str = ""


CONFIG_CASES: list[ConfigCase] = [
    ConfigCase("config-not-toml", "theme = ", r"using defaults"),
    ConfigCase("config-unknown-setting", "bogus = 1", r"unknown setting 'bogus' ignored"),
    ConfigCase("config-wrong-type", 'cursor_blink = "yes"', r"cursor_blink must be bool"),
    ConfigCase("config-int-as-bool", "tree_history = true", r"tree_history must be int"),
    ConfigCase("config-tree-history-zero", "tree_history = 0", r"tree_history must be >= 1"),
    ConfigCase("config-keys-not-a-table", 'keys = "ctrl+q"', r"\[keys\] must be a table"),
    ConfigCase("config-unknown-binding", '[keys]\nbogus = "ctrl+x"', r"unknown binding id 'bogus'"),
    ConfigCase("config-empty-binding", '[keys]\nquit = " "', r"keys\.quit must be a non-empty string", binding="quit"),
    ConfigCase("config-binding-not-a-string", "[keys]\nquit = 5", r"keys\.quit must be a non-empty string",
               binding="quit"),
    ConfigCase("config-not-utf8", "\udcff", r"using defaults"),
    # wrong once (issue 50): strict xfails until fixed, then plain cases
    ConfigCase("config-key-does-not-exist", '[keys]\nquit = "ctrl+banana"', r"ctrl\+banana", binding="quit"),
]
