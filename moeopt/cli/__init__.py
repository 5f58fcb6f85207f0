"""moeopt: place the experts of a Mixture-of-Experts model on GPUs; solve, score, compare and plot plans.

Results go to stdout; progress (per-layer lines; bars on a terminal, a line a minute elsewhere) and
notes to stderr unless --quiet (see moeopt.console). Ctrl-C (SIGINT) or SIGTERM stops the run
through the solver's own API (moeopt.interrupt): no output file, `interrupted` on stderr, exit
130 (SIGINT) or 143 (SIGTERM)."""

from __future__ import annotations

import argparse
import os
import sys

from moeopt import console, interrupt
from moeopt.cli.parser import _parser, build_parser, check_outputs, one_line
from moeopt.errors import MoeoptError
from moeopt.outputs import all_or_none

__all__ = ["build_parser", "main", "one_line"]


def main(argv: list[str] | None = None) -> int:
    try:
        parser = _parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before the handler is in place (building the parser imports)
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    console.configure(verbose=getattr(args, "verbose", False), quiet=getattr(args, "quiet", False))
    with interrupt.handling():  # SIGINT / SIGTERM stop the solver, then raise Interrupted here
        try:
            return _run(args)
        except KeyboardInterrupt:  # every output was discarded on the way (all_or_none)
            print("interrupted", file=sys.stderr, flush=True)
            return interrupt.exit_code()


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command: its exit code (2 for a user error, one line on stderr)."""
    try:
        check_outputs(args)
        with all_or_none():  # every output file is written, or none
            return int(args.func(args))
    except MoeoptError as exc:
        interrupt.check()  # a library that turned Ctrl-C into an error (an import can) is not wrong input
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `moeopt ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (keep the interpreter's flush at exit quiet)
        return 0
    except Exception:
        interrupt.check()  # any error while a signal is pending is the interrupt's doing
        raise
