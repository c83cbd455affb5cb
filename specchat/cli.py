"""The ``specchat`` command line: run (the TUI), generate, bench, replay.

Start-up stays light: torch, transformers and textual are imported inside the command that
needs them, so ``specchat --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from engine.errors import UserError

EMBEDDED_MODEL = "smollm2-135m"

# (flag, dest, type, help) — SGLang's names, so tuned values carry over to a deployment.
SPEC_FLAGS: list[tuple[str, str, type, str]] = [
    ("--speculative-num-steps", "num_steps", int, "tree levels drafted per step (EAGLE)"),
    ("--speculative-eagle-topk", "eagle_topk", int, "branching factor of the draft tree (EAGLE)"),
    ("--speculative-num-draft-tokens", "num_draft_tokens", int, "tree size per step, root included"),
    ("--speculative-ngram-min-match-window-size", "ngram_min_match_window_size", int, "n-gram: shortest match"),
    ("--speculative-ngram-max-match-window-size", "ngram_max_match_window_size", int, "n-gram: longest match"),
    ("--speculative-ngram-min-bfs-breadth", "ngram_min_bfs_breadth", int, "n-gram: least branching"),
    ("--speculative-ngram-max-bfs-breadth", "ngram_max_bfs_breadth", int, "n-gram: most branching"),
    ("--speculative-ngram-match-type", "ngram_match_type", str, "n-gram: BFS (recency) or PROB (frequency)"),
    ("--speculative-ngram-max-trie-depth", "ngram_max_trie_depth", int, "n-gram: longest stored suffix"),
    ("--speculative-ngram-capacity", "ngram_capacity", int, "n-gram: trie node budget"),
    ("--speculative-ngram-mode", "ngram_mode", str, "n-gram: tree (SGLang trie) or chain (prompt lookup)"),
]
ALGORITHMS = {"none": "none", "ngram": "ngram", "eagle": "eagle", "eagle3": "eagle3",
              "standalone": "standalone", "eagle2": "eagle"}


class UsageError(UserError):
    """Bad input from the user: printed as one line, exit status 2."""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help=f"model: '{EMBEDDED_MODEL}' (embedded, default), a local folder or a hub id")
    p.add_argument("--revision", default=None, help="hub model: branch, tag or commit (default: main)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bfloat16 on a GPU, float32 on a CPU), float32 (the exact reference) or bfloat16")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--weights", default="stored",
                   help="stored (default: GGUF blocks / bf16 / f16 kept as stored, decoded in the CPU kernels; "
                        "same answers) or fp32 (upcast once; GGUFs via the cached fp32 conversion)")
    p.add_argument("--precision", default="auto",
                   help="auto (default: fast where this CPU runs it, else exact), exact (fp32 arithmetic, the "
                        "reference) or fast (8-bit activations, integer products on the stored blocks; needs "
                        "AVX-512 VNNI); speculation is lossless against the baseline of the same precision")
    p.add_argument("--backend", default="auto", choices=["auto", "specchat", "hf"],
                   help="specchat: our Llama-family forward; hf: any transformers causal LM")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the model (default: all cores; the TUI leaves one for the UI)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow loading .bin/.pt checkpoints (weights_only=True); safetensors otherwise")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", "--speculative-algorithm", dest="method", default=None,
                   help="none | ngram | eagle | eagle3 | standalone")
    p.add_argument("--draft", "--speculative-draft-model-path", dest="draft", default=None,
                   help="EAGLE head or small draft model (folder or hub id); the method is inferred from it")
    p.add_argument("--draft-revision", default=None, help="hub draft: branch, tag or commit")
    p.add_argument("--speculative-token-map", dest="token_map", default=None,
                   help="FR-Spec: frequency-ranked token ids (.pt/.json/.safetensors) restricting an EAGLE-1/2 head")
    for flag, dest, typ, help_ in SPEC_FLAGS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    p.add_argument("--adaptive-draft", dest="adaptive_draft", action=argparse.BooleanOptionalAction, default=None,
                   help="verify only the part of each draft tree expected to pay (default: on)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    p.add_argument("--top-p", dest="top_p", type=float, default=None)
    p.add_argument("--top-k", dest="top_k", type=int, default=None, help="sample among the k likeliest (0 = off)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--sampling", choices=["coupled", "rejection"], default=None,
                   help="temperature > 0: coupled (default; the answer depends only on the seed, not on the "
                        "drafter) or rejection (recursive rejection sampling)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specchat", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="open the chat TUI")
    _add_model_args(run)
    _add_spec_args(run)
    run.add_argument("--theme", default=None, help="dark, light or colourblind (specchat-* names work too)")
    run.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)  # scripted demo session, no model
    run.add_argument("--compare", action="store_true", help="open in side-by-side baseline | speculative mode")
    run.add_argument("--teach", action="store_true", help="open in step-through teaching mode")
    run.add_argument("--record", default=None, help="write every step to this JSON-lines trace")

    gen = sub.add_parser("generate", help="answer one prompt in the terminal, tokens coloured by origin")
    _add_model_args(gen)
    _add_spec_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user message")
    src.add_argument("--prompt-file", help="read the user message from this file")
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the text as is")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    bench = sub.add_parser("bench", help="measure methods against the baseline, same run, same process")
    _add_model_args(bench)
    _add_spec_args(bench)
    bench.add_argument("--prompts", help="JSON-lines prompt file (messages | turns | prompt)")
    bench.add_argument("--methods", default=None,
                       help="comma list; 'none' (baseline) is always run (default: none,ngram with --prompts; "
                            "none with --random-weights)")
    bench.add_argument("--peers", default="", help="comma list of reference implementations: hf, llamacpp")
    bench.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    bench.add_argument("--json", dest="json_out", default=None, help="write results to this JSON file")
    bench.add_argument("--cost-curve", action="store_true",
                       help="time one target forward over n new tokens relative to n = 1")
    bench.add_argument("--context", type=int, default=300, help="cost curve: cached tokens before the tree")
    bench.add_argument("--data-engine", dest="data_engine", type=int, default=None, metavar="N",
                       help="time train-draft's data paths (one row; rows exact; rows fast), N answer tokens each")
    bench.add_argument("--train-speed", dest="train_speed", action="store_true",
                       help="time a training step with the target run per batch vs stored features (fp32, bf16)")
    bench.add_argument("--rows", type=int, default=48, help="data engine: conversations per forward")
    bench.add_argument("--random-weights", dest="random_weights", default=None, metavar="SHAPE",
                       help="no checkpoint: a random model of this shape (llama-3.1-8b, smollm2-135m or a "
                            "config.json); reports decode tok/s, bandwidth fraction, cost curve, oracle acceptance")
    bench.add_argument("--peak-bandwidth", dest="peak_bandwidth", type=float, default=None, metavar="GBPS",
                       help="peak memory bandwidth for the bandwidth fraction (default: looked up by GPU name)")

    rep = sub.add_parser("replay", help="play a recorded trace in the TUI, no model needed")
    rep.add_argument("trace", help="a trace written by specchat run --record")
    rep.add_argument("--speed", type=float, default=1.0, help="playback speed factor")
    rep.add_argument("--step", action="store_true", help="step through with the keyboard")
    rep.add_argument("--theme", default=None, help="dark, light or colourblind")

    from specchat.train_draft import add_parser as add_train_draft

    add_train_draft(sub)
    return parser


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The SpecConfig fields the user set on the command line."""
    out: dict[str, Any] = {}
    method = getattr(args, "method", None)
    if method is not None:
        key = method.lower()
        if key not in ALGORITHMS:
            raise UsageError(f"unknown method {method!r}; choose none, ngram, eagle, eagle3 or standalone")
        out["method"] = ALGORITHMS[key]
    fields = [dest for _, dest, _, _ in SPEC_FLAGS] + ["temperature", "top_p", "top_k", "sampling", "seed",
                                                      "max_new_tokens",
                                                      "adaptive_draft"]
    for dest in fields:
        value = getattr(args, dest, None)
        if value is not None:
            out[dest] = value.upper() if dest == "ngram_match_type" else value
    return out


def make_config(args: argparse.Namespace, **defaults: Any):
    from engine.config import SpecConfig

    overrides = spec_overrides(args)
    if "method" not in overrides and getattr(args, "draft", None) and defaults.get("method") != "none":
        defaults = {**defaults, "method": "none"}  # until load_session infers the method from the draft
    if overrides.get("method") in ("eagle", "eagle3", "standalone") and overrides.get("eagle_topk") == 1 \
            and "num_draft_tokens" not in overrides:
        overrides["num_draft_tokens"] = overrides.get("num_steps", SpecConfig.num_steps) + 1  # SGLang's rule
    return SpecConfig(**{**defaults, **overrides})


def draft_options(args: argparse.Namespace) -> dict[str, Any]:
    """load_session's draft arguments from the command line."""
    explicit = getattr(args, "method", None) is not None
    return {
        "draft": getattr(args, "draft", None),
        "draft_revision": getattr(args, "draft_revision", None),
        "token_map": getattr(args, "token_map", None),
        "method_from_draft": bool(getattr(args, "draft", None)) and not explicit and args.command != "bench",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, never a traceback, for the errors users cause
        if _is_user_error(exc):
            print(f"specchat: error: {exc}", file=sys.stderr)
            return 2
        raise


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "generate":
        from specchat.generate import run_generate

        return run_generate(args)
    if args.command == "bench":
        from specchat.bench import run_bench

        return run_bench(args)
    if args.command == "run":
        from specchat.tui.launch import run_tui

        return run_tui(args)
    if args.command == "train-draft":
        from specchat.train_draft import run_train_draft

        return run_train_draft(args)
    if args.command == "replay":
        from specchat.tui.launch import replay_tui

        return replay_tui(args)
    raise UsageError(f"unknown command {args.command}")


def _is_user_error(exc: Exception) -> bool:
    names = {"UsageError", "ConfigError", "ModelResolutionError", "CheckpointError", "LoadError",
             "UnsupportedModelError", "PromptFileError", "TraceError", "FileNotFoundError", "TokenizerError",
             "GGUFConversionError", "DraftLoadError", "RandomModelError", "ResumeError"}
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def _version() -> str:
    from specchat import __version__

    return f"specchat {__version__}"


if __name__ == "__main__":
    sys.exit(main())
