"""One clock for every phase of a solve: the time budget and the Ctrl-C hook of native solvers.

Two limits bound a run. ``--layer-time-limit T`` is seconds per layer for the whole pipeline of
a layer (warm start, search, exact solve, certificate); ``--time-limit S`` is seconds for the
whole run. ``moeopt.execute`` gives each layer, when it starts, the smaller of ``T`` and its
share of what is left of ``S`` (``share``: what is left divided over the layers still to
plan), starts a ``Budget`` of it and passes it in the method's
``moeopt.registry.Context`` (methods that plan all layers at once get ``min(L x T, S)``);
each phase takes its share of what is left (``Budget.child``, ``Budget.cap``), so the
phases together never exceed the layer's limit, and the layers together never exceed ``S``.
The run's deadline is a wall-clock time (``deadline_after``), so that worker processes
and Ray tasks measure their share against the same clock.

Searches are bounded by work (rounds, moves, evaluations) so that a seed fixes their result;
the budget is only a cap, and a search that hits it says so (termination ``time_limit``).

``run_interruptible`` lets Ctrl-C reach a solver that runs in native code (CP-SAT,
HiGHS), where Python's own SIGINT handler only runs once the call returns: the solver is asked
to stop through its own API (``moeopt.interrupt``) and ``KeyboardInterrupt`` is raised,
so an interrupt is never mistaken for a time limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar, overload

from moeopt import interrupt

__all__ = ["MIN_SHARE", "Budget", "deadline_after", "deferred_interrupt", "run_interruptible", "share"]

T = TypeVar("T")


class Budget:
    """A deadline on the monotonic clock, started at construction.

    Parameters
    ----------
    seconds
        Seconds from now; None or ``inf``: no limit.
    deadline
        An absolute ``time.perf_counter`` value instead of ``seconds`` (used by ``child``).
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


#: The least a layer is given once a total limit is spent (a method still returns its fastest
#: plan; the run then reports by how much it overran, ``stats.time_limit_exceeded_s``).
MIN_SHARE = 0.01


def deadline_after(seconds: float | None) -> float | None:
    """The wall-clock time (``time.time``) ``seconds`` from now; None for no limit (None or ``inf``).

    Wall-clock rather than ``time.perf_counter``: the deadline crosses processes (a worker
    pool, Ray tasks) and each compares it with its own clock.
    """
    if seconds is None or math.isinf(seconds):
        return None
    if not seconds >= 0:
        raise ValueError(f"a time limit must be a number >= 0, got {seconds!r}")
    return time.time() + seconds


def share(limit: float | None, deadline: float | None, left: int, width: int = 1) -> float | None:
    """Seconds one item of a run (a layer, a method of ``compare``, a point of a frontier) may take.

    The smaller of the item's own ``limit`` and what is left until ``deadline`` shared over the
    rounds still to run: ``left`` items (this one included) on ``width`` parallel workers take
    ``ceil(left / width)`` rounds. Time an item leaves unused goes to the items after it, and the
    last round gets all that is left, so the items together end by the deadline (each keeping
    its share). The share is never below ``MIN_SHARE``.

    Parameters
    ----------
    limit
        The item's own limit in seconds (``--layer-time-limit``); None: none.
    deadline
        The run's deadline (``deadline_after`` of ``--time-limit``); None: none.
    left
        Items not yet started, this one included (>= 1).
    width
        Items that run at the same time (workers).

    Returns
    -------
    float or None
        Seconds, or None when neither limit is given.
    """
    if deadline is None:
        return limit
    rounds = max(math.ceil(max(left, 1) / max(width, 1)), 1)
    part = max(max(deadline - time.time(), 0.0) / rounds, MIN_SHARE)
    return part if limit is None else min(limit, part)


def run_interruptible(solve: Callable[[], T], stop: Callable[[], object] | None = None) -> T:
    """``solve()``, a native solver's call, such that Ctrl-C (or SIGTERM) stops it at once and
    raises ``moeopt.interrupt.Interrupted`` (a ``KeyboardInterrupt``).

    The call runs in this thread; ``stop()`` (CP-SAT's ``stop_search``, HiGHS's ``cancelSolve``)
    is registered with ``moeopt.interrupt``, whose watcher calls it when a signal comes, so
    the solver returns, its threads joined, and the interrupt is raised instead of a result
    that would look like a time limit. A call without ``stop`` runs in a child process that a
    signal kills, under the command line (``moeopt.interrupt.call``).
    """
    return interrupt.call(solve, stop)


#: Hold Ctrl-C back while a block runs (e.g. starting worker processes), then raise it:
#: ``moeopt.interrupt.deferred``.
deferred_interrupt = interrupt.deferred
