"""A command's JSON report: stamped with the version (and commit), written by ``--report``,
printed by ``--json`` in place of the human-readable text on stdout."""

from __future__ import annotations

import argparse
import json
from typing import Any

from moeopt import console
from moeopt.io import write_json
from moeopt.io.files import _jsonable
from moeopt.version import provenance

__all__ = ["emit", "stamped", "wrote"]


def stamped(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``moeopt_version`` and, from a git checkout, ``git_commit``
    (``moeopt.version.provenance``) after its own keys (their documented order kept)."""
    return {**report, **provenance()}


def emit(args: argparse.Namespace, report: dict[str, Any], text: str | None) -> dict[str, Any]:
    """Write ``report`` to ``--report`` (when given) and print it on stdout with ``--json``,
    else print ``text`` (None: nothing). Returns the stamped report.

    With ``--json`` stdout holds the report alone, as ``--report`` writes it (the same JSON):
    progress and notes stay on stderr.
    """
    report = stamped(report)
    if getattr(args, "report", None):
        write_json(args.report, report)
    if getattr(args, "json", False):
        print(json.dumps(_jsonable(report), indent=1), flush=True)  # the text write_json writes
    elif text is not None:
        print(text)
    return report


def wrote(args: argparse.Namespace, line: str) -> None:
    """A ``wrote FILE ...`` line: on stdout, on stderr with ``--json`` (stdout holds the report
    alone), nothing with ``--quiet``."""
    if getattr(args, "quiet", False):
        return
    if getattr(args, "json", False):
        console.note(line)
    else:
        print(line)
