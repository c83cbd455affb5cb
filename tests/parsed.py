"""The typed options a command line parses to, as the CLI's dispatch builds them (for tests)."""

from __future__ import annotations

from typing import Any

from specchat.cli import build_parser
from specchat.command_options import options_for


def parsed(*argv: str) -> Any:
    """``parsed("run", "--fake")``: the RunOptions ``specchat run --fake`` hands its command."""
    return options_for(build_parser().parse_args(list(argv)))
