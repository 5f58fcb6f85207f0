"""Native calls that cannot be interrupted, run where a time limit can stop them: a forked child, killed at a deadline.

Some library calls (Mt-KaHyPar's ``partition``) run in native code with no time limit, no
callback and no way to stop them from Python: a call that takes longer than the time left
would overrun the time limit by as much as it likes. `call_before` runs such a call in
a child process forked from this one (so it starts at once, with this process's memory, and
nothing is pickled but the answer) and kills the child (``SIGKILL``) when the deadline comes:
the caller gets no answer and carries on without it, within its limit.

It is `moeopt.interrupt.run_in_child` (the child that Ctrl-C kills) with a deadline: the
same precautions (signals blocked across the fork, the child ignores Ctrl-C and ends in
`os._exit`), and the kill is registered as the stop hook of an
`moeopt.interrupt.native` block, so that Ctrl-C or SIGTERM kills the child too and
nothing is left behind.

Forking is safe only when the library has not started its own threads in this process (a
forked copy of a thread pool does not run): callers use it only where they know it has not
(``moeopt.solvers.partitioners.initialized``), and only on POSIX.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from moeopt import interrupt

__all__ = ["call_before", "can_fork"]

T = TypeVar("T")


def can_fork() -> bool:
    """Whether `call_before` can run a call in a forked child here (POSIX)."""
    return sys.platform != "win32" and hasattr(os, "fork")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(fn: Callable[..., Any], args: tuple, kwargs: dict, read_fd: int, write_fd: int, mask: set[int]) -> None:
    """Body of the forked child: run the call, send back ``("ok", value)`` or ``("error", exc)``,
    end in `os._exit` (never run on into the parent's code)."""
    status = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides, and kills this process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_fd)
        try:
            reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001  (raised again in the parent)
            reply = ("error", exc)
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001  (an exception that does not pickle: its text)
            error = RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}") if reply[0] == "error" else exc
            data = pickle.dumps(("error", error), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]
        status = 0
    finally:
        os._exit(status)


def call_before(deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T | None, bool]:
    """``fn(*args, **kwargs)`` in a forked child: ``(value, True)`` if it answered before
    ``deadline`` (a `time.perf_counter` value), ``(None, False)`` if it was killed then.

    An exception in the child is raised again here; a child that ends without an answer raises
    RuntimeError. A signal while waiting kills the child and raises
    `moeopt.interrupt.Interrupted` (through `moeopt.interrupt.native`).
    """
    read_fd, write_fd = os.pipe()
    # no signal handler may run in the child before it has its own: SIGINT and SIGTERM wait,
    # blocked in this thread, until the fork is done
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pid, status, done, answered = -1, 0, False, False
    chunks: list[bytes] = []
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child: coverage does not follow it)
            _child(fn, args, kwargs, read_fd, write_fd, mask)
        os.close(write_fd)
        write_fd = -1
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal that came meanwhile acts now
        with interrupt.native(lambda: _kill(pid)):
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                ready, _, _ = select.select([read_fd], [], [], min(left, interrupt.POLL))
                if not ready:
                    continue
                data = os.read(read_fd, 1 << 20)
                if not data:
                    answered = True
                    break
                chunks.append(data)
        done = True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        if pid > 0:
            if not (done and answered):  # the deadline came, or a signal: the child goes now
                _kill(pid)
            _, status = os.waitpid(pid, 0)
    if not answered:
        return None, False
    if not chunks:
        name = getattr(fn, "__name__", "a call")
        raise RuntimeError(f"the child process that ran {name} ended without an answer (wait status {status})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise value
    result: T = value
    return result, True
