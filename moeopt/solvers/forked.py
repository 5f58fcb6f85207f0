"""Native calls that cannot be interrupted, run where they can be stopped: a forked child, killed at a deadline.

Some library calls (Mt-KaHyPar's ``partition``) run in native code with no time limit, no
callback and no way to stop them from Python: a call that takes longer than the time left
would overrun ``--time-limit`` by as much as it likes. :func:`call_before` runs such a call in
a child process forked from this one (so it starts at once, with this process's memory, and
nothing is pickled but the answer) and kills the child (``SIGKILL``) when the deadline comes:
the caller gets None and carries on without the answer, within its limit.

Forking is safe only when the library has not started its own threads in this process (a
forked copy of a thread pool does not run): :func:`call_before` is used only where the caller
knows it has not (``moeopt.solvers.partitioners.initialized``), and only on POSIX; elsewhere the
call runs here, unstoppable, and its overrun is what the report shows.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["can_fork", "call_before"]

T = TypeVar("T")

#: seconds between two looks at the child (and at Ctrl-C)
POLL = 0.01


def can_fork() -> bool:
    """Whether :func:`call_before` can run a call in a forked child here (POSIX with ``fork``)."""
    return sys.platform != "win32" and "fork" in multiprocessing.get_all_start_methods()


def _child(conn: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:  # pragma: no cover  (child)
    try:
        # the parent handles Ctrl-C and kills this process: the child never handles a signal itself
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        conn.send(("value", fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001  (sent back and raised again in the parent)
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001  (an exception that does not pickle: its text)
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers, no flushing of the parent's buffers


def call_before(deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T | None, bool]:
    """``fn(*args, **kwargs)`` in a forked child; ``(value, True)`` if it returned before
    ``deadline`` (a :func:`time.perf_counter` value), ``(None, False)`` if it was killed then.

    An exception in the child is raised again here. Ctrl-C (KeyboardInterrupt) while waiting
    kills the child and propagates, so that no process is left behind.
    """
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
    child.start()
    send.close()
    try:
        while True:
            left = deadline - time.perf_counter()
            if receive.poll(max(min(left, POLL), 0.0)):
                try:
                    kind, value = receive.recv()
                except EOFError:  # the child died without an answer (killed from outside, crashed)
                    raise RuntimeError(f"{getattr(fn, '__name__', 'call')}: the child process died") from None
                if kind == "error":
                    raise value
                return value, True
            if left <= 0:
                return None, False
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
