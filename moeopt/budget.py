"""One clock for every phase of a solve: the time budget and the Ctrl-C hook of native solvers.

``--time-limit T`` is seconds per layer for the whole pipeline of a layer (warm start, search,
exact solve, certificate). :mod:`moeopt.execute` starts a :class:`Budget` of ``T`` when a layer
starts (``L x T`` for methods that plan all layers at once) and passes it in the method's
:class:`~moeopt.registry.Context`; each phase takes its share of what is left
(:meth:`Budget.child`, :meth:`Budget.cap`), so the phases together never exceed the layer's ``T``.

Searches are bounded by work (rounds, moves, evaluations) so that a seed fixes their result;
the budget is only a cap, and a search that hits it says so (termination ``time_limit``).

:func:`run_interruptible` lets Ctrl-C reach a solver that runs in native code (CP-SAT,
HiGHS), where Python's own SIGINT handler only runs once the call returns: the solver is asked
to stop and :class:`KeyboardInterrupt` is raised, so an interrupt is never mistaken for a time
limit.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

__all__ = ["Budget", "deferred_interrupt", "run_interruptible"]

T = TypeVar("T")

#: Seconds to wait for a stopped solver to return before leaving it behind.
STOP_WAIT = 0.8


class Budget:
    """A deadline on the monotonic clock, started at construction.

    Parameters
    ----------
    seconds
        Seconds from now; None or ``inf``: no limit.
    deadline
        An absolute :func:`time.perf_counter` value instead of ``seconds`` (used by :meth:`child`).
    """

    __slots__ = ("deadline", "start")

    def __init__(self, seconds: float | None = None, *, deadline: float | None = None) -> None:
        self.start = time.perf_counter()
        if seconds is not None and math.isinf(seconds) and seconds > 0:
            seconds = None  # no limit
        if seconds is not None:
            if not seconds >= 0:
                raise ValueError(f"a time budget must be a number >= 0, got {seconds!r}")
            deadline = self.start + seconds if deadline is None else min(deadline, self.start + seconds)
        self.deadline: float | None = deadline

    def __repr__(self) -> str:
        return "Budget(unlimited)" if self.deadline is None else f"Budget(remaining={self.remaining():.3f} s)"

    @property
    def limited(self) -> bool:
        return self.deadline is not None

    def elapsed(self) -> float:
        """Seconds since this budget started."""
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        """Seconds left (``inf`` without a limit, 0 once expired)."""
        if self.deadline is None:
            return math.inf
        return max(self.deadline - time.perf_counter(), 0.0)

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def child(self, fraction: float = 1.0, *, most: float | None = None) -> Budget:
        """A budget of ``fraction`` of what is left now (at most ``most`` seconds), ending no
        later than this one. Unlimited stays unlimited unless ``most`` is given."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        if self.deadline is None:
            return Budget(most)
        seconds = fraction * self.remaining()
        if most is not None:
            seconds = min(seconds, most)
        return Budget(seconds, deadline=self.deadline)

    @overload
    def cap(self, seconds: float, *, floor: float = 0.0) -> float: ...
    @overload
    def cap(self, seconds: None = None, *, floor: float = 0.0) -> float | None: ...
    def cap(self, seconds: float | None = None, *, floor: float = 0.0) -> float | None:
        """``min(seconds, remaining())`` for a solver's own time limit, not below ``floor``
        (backends refuse 0); None when both are unlimited."""
        left = self.remaining()
        if seconds is None and math.isinf(left):
            return None
        return max(min(math.inf if seconds is None else seconds, left), floor)


def run_interruptible(solve: Callable[[], T], stop: Callable[[], object] | None = None) -> T:
    """``solve()`` such that Ctrl-C stops it within about a second and raises KeyboardInterrupt.

    A native solver (CP-SAT, HiGHS) runs in C++ and Python's SIGINT handler only runs once
    the call returns. Here the call runs in a helper thread while this (main) thread waits;
    on SIGINT, ``stop()`` (e.g. CP-SAT's ``stop_search`` or HiGHS's ``cancelSolve``) ends the
    search, and :class:`KeyboardInterrupt` is raised instead of returning a result that would
    look like a time limit. Without ``stop`` the helper is abandoned (a daemon thread).

    Outside the main thread, or where SIGINT is not Python's default handler (pool workers
    ignore it: their parent stops them), ``solve()`` simply runs here.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return solve()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = solve()
        except BaseException as exc:  # noqa: BLE001  (raised again in the caller's thread)
            box["error"] = exc

    helper = threading.Thread(target=target, name="moeopt-solve", daemon=True)
    helper.start()
    try:
        while helper.is_alive():
            helper.join(0.05)
    except KeyboardInterrupt:
        if stop is not None:
            stop()
            helper.join(STOP_WAIT)
        raise
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


@contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C back while the block runs (e.g. starting worker processes, which a signal
    must not leave half started), then raise :class:`KeyboardInterrupt` if one came.

    Nothing changes outside the main thread or where SIGINT is not Python's default handler.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    hit: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit:
        raise KeyboardInterrupt
