"""Where moeopt's messages go: the one place that decides what is shown on stderr.

Results (tables, summaries, ``wrote FILE`` lines) are printed on stdout by the commands.
Everything else goes to stderr, in three kinds:

* errors: always;
* notes (a plan's colocated copies, an executor the method cannot use, infeasibility
  remarks): unless ``--quiet``;
* progress (per-layer incumbent/bound lines and progress bars): only when stderr is a
  terminal, or with ``--verbose``; never with ``--quiet``. Progress bars, which redraw
  themselves with ``\\r``, are drawn only on a terminal, even with ``--verbose``.

The command line sets the mode once (:func:`configure`); library code asks
:func:`progress`, writes with :func:`note` / :func:`progress_line` and makes its bars with
:func:`bar`. Used as a library (no :func:`configure`), the mode is ``auto``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

__all__ = ["bar", "configure", "mode", "note", "progress", "progress_line", "stderr_is_terminal"]

_MODES = ("auto", "verbose", "quiet")
_mode = "auto"


def configure(*, verbose: bool = False, quiet: bool = False) -> str:
    """Set the output mode from the ``--verbose`` / ``--quiet`` flags (``--quiet`` wins); returns it."""
    global _mode
    _mode = "quiet" if quiet else "verbose" if verbose else "auto"
    return _mode


def mode() -> str:
    """``auto`` (progress on a terminal only), ``verbose`` (progress always) or ``quiet``."""
    return _mode


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (False when redirected to a file or a pipe)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress() -> bool:
    """Whether per-layer progress lines are shown."""
    if _mode == "quiet":
        return False
    return _mode == "verbose" or stderr_is_terminal()


def progress_line(line: str) -> None:
    """Write one progress line to stderr (callers check :func:`progress`, or a ``quiet`` flag)."""
    tqdm.write(line, file=sys.stderr)


def note(line: str) -> None:
    """A note the user must see (on stderr even when it is not a terminal), unless ``--quiet``."""
    if _mode != "quiet":
        tqdm.write(line, file=sys.stderr)


def bar(iterable: Iterable | None = None, *, quiet: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm progress bar on stderr, drawn only on a terminal and when neither ``quiet`` nor
    ``--quiet`` (``\\r`` redraws never reach a file or a pipe)."""
    off = bool(kwargs.pop("disable", False)) or quiet or _mode == "quiet" or not stderr_is_terminal()
    return tqdm(iterable, disable=off, file=sys.stderr, **kwargs)
