"""The ``specchat`` command line: the parser and the dispatch (run, serve, generate, bench, tune, export, ...).

Start-up stays light: torch, transformers and textual are imported inside the command that
needs them, so ``specchat --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from engine.errors import UserError
from specchat.options import MAX_THREADS, Parser, UsageError, add_force_flag, add_knob_flags, bounded

EMBEDDED_MODEL = "smollm2-135m"
MAX_PROMPTS = 1_000_000  # --limit: more than any prompt file holds, and refuses a negative or 0
MAX_ROUNDS = 100  # bench --rounds: more than a day of any bench; refuses a typo (1000 for 10)

# command -> (module, function taking the command's options, specchat.command_options.OPTIONS):
# imported only when that command runs, to keep start-up light
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("specchat.generate", "run_generate"),
    "bench": ("specchat.bench", "run_bench"),
    "tune": ("specchat.tune", "run_tune"),
    "export": ("specchat.export", "run_export"),
    "run": ("specchat.tui.launch", "run_tui"),
    "replay": ("specchat.tui.launch", "replay_tui"),
    "serve": ("specchat.serve", "run_serve"),
    "train-draft": ("specchat.train_draft", "run_train_draft"),
}


def _add_model_args(p: argparse.ArgumentParser, *, weights_list: bool = False) -> None:
    """The target's flags. ``weights_list``: --weights takes a comma list (bench and tune measure
    each mode, checked by specchat.bench.weights_modes); elsewhere one of its two choices, refused
    as it is parsed rather than by the loader inside the chat or each served tab."""
    p.add_argument("model", nargs="?", default=None,
                   help=f"model: '{EMBEDDED_MODEL}' (embedded, default), a local folder or a hub id")
    p.add_argument("--revision", default=None, help="hub model: branch, tag or commit (default: main)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bfloat16 on a GPU, float32 on a CPU), float32 (the exact reference) or bfloat16")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--weights", default="stored", choices=None if weights_list else ["stored", "fp32"],
                   help="stored (default: GGUF blocks / bf16 / f16 kept as stored, decoded in the CPU kernels; "
                        "same answers) or fp32 (upcast once; GGUFs via the cached fp32 conversion)")
    p.add_argument("--precision", default="auto",
                   help="auto (default: fast where this CPU runs it, else exact), exact (fp32 arithmetic, the "
                        "reference) or fast (8-bit activations, integer products on the stored blocks; AVX2 or "
                        "AVX-512 VNNI; bf16 weights: bf16 products where the CPU has AVX512_BF16); speculation "
                        "is lossless against the baseline of the same precision")
    p.add_argument("--backend", default="auto", choices=["auto", "specchat", "hf"],
                   help="specchat: our own forward (Llama family, Gemma 3); hf: any transformers causal LM")
    p.add_argument("--threads", type=bounded(int, 1, MAX_THREADS), default=None,
                   help="CPU threads for the model (default: all cores, one fewer while another busy program "
                        "holds a core; answers do not depend on it)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow loading .bin/.pt checkpoints (weights_only=True); safetensors otherwise")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", "--speculative-draft-model-path", dest="draft", default=None,
                   help="EAGLE head or small draft model (folder or hub id); the method is inferred from it")
    p.add_argument("--draft-revision", default=None, help="hub draft: branch, tag or commit")
    p.add_argument("--speculative-token-map", dest="token_map", default=None,
                   help="FR-Spec: frequency-ranked token ids (.pt/.json/.safetensors) restricting an EAGLE-1/2 head")
    p.add_argument("--ngram-corpus", dest="ngram_corpus", default=None, metavar="auto|none|DIR[,DIR]",
                   help="n-gram: where the conversation has no match, draft from the model's own answers: auto "
                        "(those shipped with the embedded model), none, or folders of train-draft shards")
    p.add_argument("--settings", default=None, metavar="FILE",
                   help="a JSON of settings (specchat tune --save-settings writes one); flags given win over it")
    add_knob_flags(p)  # every setting of an answer, from engine/knobs.py


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``specchat run`` (``serve`` takes the same ones and hands them to each session)."""
    _add_model_args(p)
    _add_spec_args(p)
    p.add_argument("--theme", type=_theme, default=None, help="dark, light or colourblind (specchat-* names work too)")
    p.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)  # scripted demo session, no model
    p.add_argument("--compare", nargs="?", const="", default=None, metavar="A,B",
                   help="open in the compare view: the baseline | the method in force, or method A | method B "
                        "(e.g. --compare medusa,eagle3; each also timed against the baseline)")
    p.add_argument("--teach", action="store_true", help="open in step-through teaching mode")
    p.add_argument("--record", default=None, help="write every step to this JSON-lines trace (a new or empty file)")
    add_force_flag(p, "--record file")


def _public_url(text: str) -> str:
    """argparse's type for serve's --public-url: an http(s) address a browser opens, normalised, else
    refused as the flags are parsed, before anything binds (aiohttp is imported only when the flag is given)."""
    from specchat.serve_guard import public_url

    try:
        return public_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _theme(name: str) -> str:
    """argparse's type for --theme: a theme the app has, else refused with the list (textual is
    imported only when the flag is given)."""
    from specchat.themes import unknown_theme

    problem = unknown_theme(name)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return name


def add_playback_args(p: argparse.ArgumentParser) -> None:
    """How a recorded trace plays (``specchat replay``)."""
    p.add_argument("--speed", type=bounded(float, 0, 1000, low_open=True), default=1.0,
                   help="playback speed factor (above 0, up to 1000; default 1)")
    p.add_argument("--step", action="store_true", help="step through with the keyboard")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specchat", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="open the chat TUI")
    add_run_args(run)

    serve = sub.add_parser("serve", help="the chat TUI in a browser (textual-serve), one engine per browser tab")
    add_run_args(serve)  # a served session takes every flag of `run`: specchat.serve writes them back with `run`'s
    serve.set_defaults(run_parser=run)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; anything else lets "
                            "others in: there is no authentication)")
    serve.add_argument("--port", type=bounded(int, 1, 65535), default=8000, help="TCP port (default 8000)")
    serve.add_argument("--max-sessions", dest="max_sessions", type=bounded(int, 1, 1024), default=None, metavar="N",
                       help="browser sessions (engines) at once (default: what this machine's memory and cores "
                            "hold for the model); one more gets a page saying so")
    serve.add_argument("--public-url", dest="public_url", type=_public_url, default=None, metavar="URL",
                       help="the address browsers use, when it is not http://HOST:PORT (a proxy, 0.0.0.0): "
                            "http:// or https://, a host, optional port and path, nothing else")

    gen = sub.add_parser("generate", help="answer one prompt in the terminal, tokens coloured by origin")
    _add_model_args(gen)
    _add_spec_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user message")
    src.add_argument("--prompt-file", help="read the user message from this file (a regular file; one too big "
                     "for the model's context is refused from its size)")
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the text as is")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    bench = sub.add_parser("bench", help="measure methods against the baseline, same run, same process")
    _add_model_args(bench, weights_list=True)
    _add_spec_args(bench)
    bench.add_argument("--prompts", help="JSON-lines prompt file (messages | turns | prompt)")
    bench.add_argument("--methods", default=None,
                       help="comma list; 'none' (baseline) is always run (default: none,ngram with --prompts; "
                            "none with --random-weights)")
    bench.add_argument("--peers", default="",
                       help="comma list of reference implementations: hf (transformers), llamacpp "
                            "(llama-cpp-python), llamacpp-tools (llama.cpp's llama-speculative-simple and llama-bench)")
    bench.add_argument("--limit", type=bounded(int, 1, MAX_PROMPTS), default=None, help="use only the first N prompts")
    bench.add_argument("--rounds", type=bounded(int, 1, MAX_ROUNDS), default=1, metavar="N",
                       help="run every row (each method of each mode, and the peers) N times, alternating their "
                            "order (A B C, then C B A); report each round, the best and the median (default: 1)")
    bench.add_argument("--json", dest="json_out", default=None, help="write results to this JSON file")
    bench.add_argument("--plot", default=None, metavar="FILE.svg",
                       help="also write the table (and the --cost-curve chart) as an SVG image, e.g. for a README")
    bench.add_argument("--cost-curve", action="store_true",
                       help="time one target forward over n new tokens relative to n = 1")
    bench.add_argument("--context", type=bounded(int, 1, 1 << 20), default=300,
                       help="cost curve: cached tokens before the tree")
    bench.add_argument("--data-engine", dest="data_engine", type=bounded(int, 1, 1 << 16), default=None, metavar="N",
                       help="time train-draft's data paths (one row; rows exact; rows fast), N answer tokens each")
    bench.add_argument("--train-speed", dest="train_speed", action="store_true",
                       help="time a training step with the target run per batch vs stored features (fp32, bf16)")
    bench.add_argument("--rows", type=bounded(int, 1, 4096), default=48, help="data engine: conversations per forward")
    bench.add_argument("--random-weights", dest="random_weights", default=None, metavar="SHAPE",
                       help="no checkpoint: a random model of this shape (llama-3.1-8b, smollm2-135m or a "
                            "config.json); reports decode tok/s, bandwidth fraction, cost curve, oracle acceptance")
    bench.add_argument("--peak-bandwidth", dest="peak_bandwidth", type=bounded(float, 0, 1e6, low_open=True),
                       default=None, metavar="GBPS",
                       help="peak memory bandwidth for the bandwidth fraction (default: looked up by GPU name)")
    bench.add_argument("--tui", type=bounded(int, 1, MAX_ROUNDS), default=None, metavar="PAIRS",
                       help="time the chat (the app as `specchat run` starts it, no terminal) against the engine "
                            "headless on one method, PAIRS answers each, alternated; prints the paired ratio")
    add_force_flag(bench, "--json or --plot file", "only an earlier bench's own is replaced")

    tune = sub.add_parser("tune", help="sweep the tree knobs on your prompts; print SGLang and vLLM launch lines")
    _add_model_args(tune, weights_list=True)
    _add_spec_args(tune)
    tune.add_argument("--prompts", required=True, help="JSON-lines prompt file (messages | turns | prompt)")
    tune.add_argument("--methods", default="ngram", help="comma list of methods to tune (default: ngram)")
    tune.add_argument("--grid", default=None,
                      help="knob values to sweep, e.g. 'num_steps=3,4;eagle_topk=1,4' (default: SGLang's ranges)")
    tune.add_argument("--minutes", type=bounded(float, 0, 7 * 24 * 60, low_open=True), default=None,
                      help="time budget: coarse grid first, then refine")
    tune.add_argument("--limit", type=bounded(int, 1, MAX_PROMPTS), default=None, help="use only the first N prompts")
    tune.add_argument("--json", dest="json_out", default=None, help="write everything to this JSON file")
    tune.add_argument("--save-settings", dest="save_settings", default=None, metavar="FILE",
                      help="write the winner's settings for specchat run --settings FILE")
    add_force_flag(tune, "--json or --save-settings file", "only an earlier tune's own is replaced")

    from specchat.export import SERVERS

    export = sub.add_parser("export", help="print the launch line of a server (SGLang, vLLM, llama.cpp's "
                                           "llama-server) for these settings")
    export.add_argument("server", choices=list(SERVERS))
    _add_model_args(export)
    _add_spec_args(export)

    rep = sub.add_parser("replay", help="play a recorded trace in the TUI, no model needed")
    rep.add_argument("trace", help="a trace written by specchat run --record")
    add_playback_args(rep)
    rep.add_argument("--theme", type=_theme, default=None, help="dark, light or colourblind")

    from specchat.train_draft import add_parser as add_train_draft

    add_train_draft(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    stdout = sys.stdout
    sys.stdout = CheckedStdout(stdout)
    try:
        code = _dispatch(build_parser().parse_args(argv))
        sys.stdout.flush()  # a full disk or a closed pipe answers here, not in Python's shutdown (a traceback)
        return code
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return 130
    except UserError as exc:  # one clear line, never a traceback, for the errors users cause
        print(f"specchat: error: {exc}", file=sys.stderr)
        return 2
    except StdoutLost as exc:
        return _stdout_lost(exc.error, stdout)
    finally:
        sys.stdout = stdout


class StdoutLost(Exception):
    """Standard output refused a write (``> /dev/full``, a pipe whose reader left): raised by
    :class:`CheckedStdout` so that it is told apart from a failed write to any other file (our bug)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class CheckedStdout:
    """``sys.stdout`` while a command runs, its write failures raised as :class:`StdoutLost`; everything
    else (fileno, isatty, encoding) is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutLost(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutLost(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_lost(error: OSError, stdout: Any) -> int:
    """Standard output failed: one line on stderr, exit 2 (a closed pipe: no line, as ``cmd | head``
    expects, and 141, as a shell reports SIGPIPE). stdout is pointed at /dev/null so that Python's own
    flush at exit does not add "Exception ignored" and a traceback."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no descriptor (a test's capture): nothing flushes it at exit
        pass
    if isinstance(error, BrokenPipeError):
        return 141
    print(f"specchat: error: cannot write to standard output ({error.strerror or error}); send it where there "
          "is room, or drop the redirection", file=sys.stderr)
    return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command not in COMMANDS:
        raise UsageError(f"unknown command {args.command}")
    from specchat.command_options import options_for
    from specchat.preflight import check_files

    options = options_for(args)  # the Namespace goes no further: each command reads its typed options
    check_files(options)  # what needs only files is refused now, before any model is read
    module, function = COMMANDS[args.command]
    run: Callable[[Any], int] = getattr(importlib.import_module(module), function)
    return run(options)


def _version() -> str:
    from specchat import __version__

    return f"specchat {__version__}"


if __name__ == "__main__":
    sys.exit(main())
