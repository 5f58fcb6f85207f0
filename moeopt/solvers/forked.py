"""Native calls that cannot be interrupted, run where a time limit can stop them: a forked child, killed at a deadline.

Some library calls (Mt-KaHyPar's ``partition``) run in native code with no time limit, no
callback and no way to stop them from Python: a call that takes longer than the time left
would overrun the time limit by as much as it likes. `call_before` runs such a call in
a child process forked from this one (so it starts at once, with this process's memory, and
nothing is pickled but the answer) and kills the child (``SIGKILL``) when the deadline comes:
the caller gets no answer and carries on without it, within its limit.

It is `moeopt.interrupt.call_in_child` (the child that Ctrl-C kills, as
`moeopt.interrupt.run_in_child` runs it) with a deadline: signals blocked across the fork,
the child ignores Ctrl-C and ends in `os._exit`, and the kill is the stop hook of an
`moeopt.interrupt.native` block, so that Ctrl-C or SIGTERM kills the child too and
nothing is left behind.

Forking is safe only when the library has not started its own threads in this process (a
forked copy of a thread pool does not run): callers use it only where they know it has not
(``moeopt.solvers.partitioners.initialized``), and only on POSIX.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from moeopt import interrupt

__all__ = ["call_before", "can_fork"]

T = TypeVar("T")


def can_fork() -> bool:
    """Whether `call_before` can run a call in a forked child here (POSIX)."""
    return sys.platform != "win32" and hasattr(os, "fork")


def call_before(deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T | None, bool]:
    """``fn(*args, **kwargs)`` in a forked child: ``(value, True)`` if it answered before
    ``deadline`` (a `time.perf_counter` value), ``(None, False)`` if it was killed then.

    An exception in the child is raised again here; a child that ends without an answer raises
    RuntimeError. A signal while waiting kills the child and raises
    `moeopt.interrupt.Interrupted` (through `moeopt.interrupt.native`).
    """
    return interrupt.call_in_child(fn, *args, deadline=deadline, **kwargs)
