"""Developer entry point: ``python -m specchat.tui --fake`` or ``python -m specchat.tui --replay FILE``.

The user-facing commands are ``specchat run`` and ``specchat replay`` (specchat/cli.py); this one
takes the same flags as ``run`` (generated from engine/knobs.py, so it cannot spell them
differently) plus ``--replay FILE`` and replay's playback flags.
"""

from __future__ import annotations

import sys

from engine.errors import UserError
from specchat.cli import add_playback_args, add_run_args
from specchat.options import Parser


def build_parser() -> Parser:
    p = Parser(prog="python -m specchat.tui")
    add_run_args(p)
    p.add_argument("--replay", dest="trace", default=None, help="play a recorded trace")
    add_playback_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(argv)
        from specchat.tui.launch import replay_tui, run_tui

        return replay_tui(args) if args.trace else run_tui(args)
    except UserError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
