"""Where moeopt's messages go: the one place that decides what is shown on stderr.

Results (tables, summaries, ``wrote FILE`` lines) are printed on stdout by the commands.
Everything else goes to stderr, in three kinds:

* errors: always;
* notes (an unreachable target, a fallback, a time limit that cut a search short, a plan's
  colocated copies, an executor the method cannot use): unless ``--quiet``, each once;
* progress: unless ``--quiet``, on any stderr. Per-layer lines (incumbent, bound, time) are
  written as they come. A progress bar redraws itself with ``\\r`` on a terminal; on a file or
  a pipe (a log, a batch job) it becomes a line instead, at most one a minute
  (`LINE_EVERY`; every step with ``--verbose``), so that a long run is never silent:
  ``joint: 12/58 layers, 6m 02s, about 23m 10s left``.

The command line sets the mode once (`configure`); library code asks
`progress`, writes with `note` / `progress_line` and makes its bars with
`bar`. Used as a library (no `configure`), the mode is ``auto``, and
[`moeopt.solve.solve`][] is quiet unless asked (``quiet=False``).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any

from tqdm.auto import tqdm

__all__ = [
    "LINE_EVERY",
    "LineBar",
    "bar",
    "configure",
    "mode",
    "note",
    "progress",
    "progress_line",
    "result_notes",
    "stderr_is_terminal",
]

_MODES = ("auto", "verbose", "quiet")
_mode = "auto"

#: Seconds between two lines of a progress bar on a stderr that is not a terminal.
LINE_EVERY = 60.0

#: Notes shown since `configure` (without their ``note:`` prefix): each is shown once.
_shown: set[str] = set()


def configure(*, verbose: bool = False, quiet: bool = False) -> str:
    """Set the output mode from the ``--verbose`` / ``--quiet`` flags (``--quiet`` wins); returns it."""
    global _mode
    _mode = "quiet" if quiet else "verbose" if verbose else "auto"
    _shown.clear()
    return _mode


def mode() -> str:
    """``auto`` (progress lines; bars on a terminal, a line a minute elsewhere), ``verbose``
    (the same, a line per bar step elsewhere) or ``quiet`` (no progress, no notes)."""
    return _mode


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (False when redirected to a file or a pipe)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress() -> bool:
    """Whether per-layer progress lines are shown: unless ``--quiet``, on any stderr."""
    return _mode != "quiet"


def progress_line(line: str) -> None:
    """Write one progress line to stderr (callers check `progress`, or a ``quiet`` flag)."""
    tqdm.write(line, file=sys.stderr)


def note(line: str) -> None:
    """A note the user must see (on stderr even when it is not a terminal), unless ``--quiet``."""
    _shown.add(line.removeprefix("note: "))
    if _mode != "quiet":
        tqdm.write(line, file=sys.stderr)


def result_notes(stats: Mapping[str, Any], method: str | None = None) -> list[str]:
    """The lines (``note: METHOD: ...``) of a result's ``stats['note']`` that no `note` has shown.

    Methods store what a user should act on (an unreachable target and what would reach it, a
    fallback, a time limit that cut a search short) in ``stats['note']``, a string (parts joined
    by ``; ``) or one per layer; the parts a method already printed are left out. A note that
    does not start with the ``method``'s name is prefixed with it (``compare`` runs several).
    """
    value = stats.get("note")
    items = value if isinstance(value, list) else [value]
    lines: list[str] = []
    for text in items:
        if not isinstance(text, str):
            continue
        for shown in sorted(_shown, key=len, reverse=True):
            if shown:
                text = text.replace(shown, "")
        text = text.strip(" ;")
        while "; ; " in text:
            text = text.replace("; ; ", "; ")
        named = method is None or text.startswith(method)
        line = f"note: {text}" if named else f"note: {method}: {text}"
        if text and line not in lines:
            lines.append(line)
    return lines


class LineBar:
    """A progress bar for a stderr that is not a terminal: a line now and then, never ``\\r``.

    Takes tqdm's arguments and offers what moeopt uses of it (iteration, `update`,
    `close`, a context manager). A line is written when a step ends and ``every`` seconds
    have passed since the last one, and by a timer while one step runs longer than that.

    Parameters
    ----------
    iterable, total, desc, unit
        As for tqdm.
    every
        Seconds between two lines (0: a line per step).
    """

    disable = False

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        total: int | None = None,
        desc: str | None = None,
        unit: str = "it",
        every: float = LINE_EVERY,
        **_: Any,
    ) -> None:
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.iterable = iterable
        self.total = total
        self.desc = desc or "progress"
        self.unit = unit
        self.every = every
        self.n = 0
        self.start = self.last = time.monotonic()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._timer: threading.Thread | None = None
        if every > 0:  # the timer holds the bar weakly: a bar dropped without close() goes quiet
            self._timer = threading.Thread(
                target=_tick, args=(weakref.ref(self), self._closed), name="moeopt-progress", daemon=True
            )
            self._timer.start()

    def __del__(self) -> None:
        self._closed.set()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            return
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        """The bar as one line: ``desc: n/total units, elapsed[, about ... left]``."""
        elapsed = time.monotonic() - self.start
        units = self.unit if self.unit.endswith("s") else f"{self.unit}s"
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        text = f"{self.desc}: {done} {units}, {_duration(elapsed)}"
        if self.total and 0 < self.n < self.total:
            text += f", about {_duration(elapsed / self.n * (self.total - self.n))} left"
        return text

    def _say(self) -> None:
        self.last = time.monotonic()
        progress_line(self.line())

    def update(self, n: int = 1) -> None:
        """``n`` more steps done: a line if ``every`` seconds passed since the last one."""
        with self._lock:
            self.n += n
            if not self._closed.is_set() and time.monotonic() - self.last >= self.every:
                self._say()

    def _due(self) -> None:
        """A line if ``every`` seconds passed since the last one (the timer's call)."""
        with self._lock:
            if not self._closed.is_set() and time.monotonic() - self.last >= self.every:
                self._say()

    def close(self) -> None:
        """Stop the timer; no final line (the caller prints what the run gave)."""
        self._closed.set()
        timer, self._timer = self._timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.join()


def _tick(ref: weakref.ReferenceType[LineBar], closed: threading.Event) -> None:
    """A `LineBar`'s timer: a line while a step runs longer than its ``every`` seconds;
    ends when the bar is closed or gone."""
    while True:
        line_bar = ref()
        if line_bar is None:
            return
        delay = max(line_bar.every - (time.monotonic() - line_bar.last), 0.05)
        del line_bar
        if closed.wait(delay):
            return
        line_bar = ref()
        if line_bar is None:
            return
        line_bar._due()
        del line_bar


def _duration(seconds: float) -> str:
    """``42s``, ``6m 02s`` or ``1h 05m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def bar(iterable: Iterable | None = None, *, quiet: bool = False, **kwargs: Any) -> tqdm | LineBar:
    """A progress bar on stderr: tqdm's on a terminal; elsewhere a `LineBar` (a line a
    minute, a line per step with ``--verbose``); disabled (a tqdm that draws nothing) with
    ``quiet``, ``--quiet`` or ``disable=True``."""
    off = bool(kwargs.pop("disable", False)) or quiet or _mode == "quiet"
    if off or stderr_is_terminal():
        return tqdm(iterable, disable=off, file=sys.stderr, **kwargs)
    return LineBar(iterable, every=0.0 if _mode == "verbose" else LINE_EVERY, **kwargs)
