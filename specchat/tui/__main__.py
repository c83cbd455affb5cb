"""Developer entry point: ``python -m specchat.tui --fake`` or ``python -m specchat.tui --replay FILE``.

The user-facing commands are ``specchat run`` and ``specchat replay`` (specchat/cli.py); this one
exists so the UI can be tried without a model or before the CLI is wired.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specchat.tui")
    p.add_argument("model", nargs="?")
    p.add_argument("--fake", action="store_true", help="scripted demo session, no model")
    p.add_argument("--replay", dest="trace", help="play a recorded trace")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--step", action="store_true", help="replay step by step")
    p.add_argument("--method")
    p.add_argument("--num-steps", type=int)
    p.add_argument("--eagle-topk", type=int)
    p.add_argument("--num-draft-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--theme")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--teach", action="store_true")
    p.add_argument("--record")
    args = p.parse_args(argv)

    from specchat.tui.launch import replay_tui, run_tui

    if args.trace:
        return replay_tui(args)
    return run_tui(args)


if __name__ == "__main__":
    sys.exit(main())
