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
to stop through its own API (:mod:`moeopt.interrupt`) and :class:`KeyboardInterrupt` is raised,
so an interrupt is never mistaken for a time limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar, overload

from moeopt import interrupt

__all__ = ["Budget", "deferred_interrupt", "run_interruptible"]

T = TypeVar("T")


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
    """``solve()``, a native solver's call, such that Ctrl-C (or SIGTERM) stops it at once and
    raises :class:`~moeopt.interrupt.Interrupted` (a :class:`KeyboardInterrupt`).

    The call runs in this thread; ``stop()`` (CP-SAT's ``stop_search``, HiGHS's ``cancelSolve``)
    is registered with :mod:`moeopt.interrupt`, whose watcher calls it when a signal comes, so
    the solver returns, its threads joined, and the interrupt is raised instead of a result
    that would look like a time limit. A call without ``stop`` runs in a child process that a
    signal kills, under the command line (:func:`moeopt.interrupt.call`).
    """
    return interrupt.call(solve, stop)


#: Hold Ctrl-C back while a block runs (e.g. starting worker processes), then raise it:
#: :func:`moeopt.interrupt.deferred`.
deferred_interrupt = interrupt.deferred
