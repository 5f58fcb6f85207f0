"""moeopt: place the experts of a Mixture-of-Experts model on GPUs; solve, score, compare and plot plans.

Results go to stdout; progress (per-layer lines, bars) to stderr on a terminal or with --verbose;
notes to stderr unless --quiet (see moeopt.console)."""

from __future__ import annotations

import os
import sys

from moeopt import console
from moeopt.cli.parser import _parser, build_parser, check_outputs, one_line
from moeopt.errors import MoeoptError
from moeopt.outputs import all_or_none

__all__ = ["build_parser", "main", "one_line"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console.configure(verbose=getattr(args, "verbose", False), quiet=getattr(args, "quiet", False))
    try:
        check_outputs(args)
        with all_or_none():  # every output file is written, or none
            return int(args.func(args))
    except MoeoptError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `moeopt ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (keep the interpreter's flush at exit quiet)
        return 0
