"""Shared HiGHS plumbing: silent construction and the process-wide thread scheduler.

HiGHS prints a banner on file descriptor 1 when a ``Highs`` object is first built: every
HiGHS user in moeopt builds its solver with :func:`new_highs`, which hides it.

HiGHS's thread scheduler is global to the process.

The first HiGHS solve sizes it; a later solve asking for another thread count fails inside
HiGHS ("the scheduler has already been initialized") and comes back as a time limit without
a solution. Anything may have sized it before (another backend, the user's own HiGHS
code), so every HiGHS call in moeopt goes through :func:`highs_threads`, which resets the
scheduler first; rebuilding a thread pool costs far less than any solve.

The grouping MILP's options and size check (:func:`refuse_large`) live here too, so the
highspy and Pyomo backends share them without importing each other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from moeopt.errors import InputError
from moeopt.grouping import Grouping, pairs

#: HiGHS options of the grouping MILP, shared by the highspy and the Pyomo backends so the
#: two solve the same model to the same tolerances. Plans must meet the load limit within
#: ``grouping.LOAD_TOL = 1e-6``, hence feasibility tolerances below it.
GROUPING_OPTIONS = {
    "mip_rel_gap": 1e-7,
    "mip_abs_gap": 1e-12,
    "primal_feasibility_tolerance": 1e-7,
    "mip_feasibility_tolerance": 1e-7,
}


def highs_threads(threads: int) -> int:
    """Reset HiGHS's global scheduler so the next solve can use ``threads``; return that count."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    return max(1, int(threads))


@contextmanager
def _silence_stdout() -> Iterator[None]:
    """Hide what C code prints on file descriptor 1 (HiGHS prints a banner on its first use)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout: nothing to hide
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def new_highs():
    """A silent ``highspy.Highs``."""
    import highspy

    with _silence_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def cancel_pyomo_highs(opt) -> None:
    """Ask the HiGHS model behind a Pyomo v2 ``highs`` solver to stop (Ctrl-C); nothing when
    Pyomo has not built it yet."""
    model = getattr(opt, "_solver_model", None)
    if model is not None:
        model.cancelSolve()


# ----------------------------------------------------------------------------- grouping MILP size
def estimate_nonzeros(g: Grouping) -> int:
    """Nonzeros of :func:`moeopt.solvers.grouping_highs.build_arrays` without building it."""
    P = len(pairs(g.graph)[0])
    E, G = g.experts, g.groups
    star = 2 if g.limited else 1
    return int(E * G * (2 + g.limited) + 4 * P * G + star * (2 * P + E) * G + E * E * G // 2)


def refuse_large(g: Grouping, time_limit: float, backend: str, rate: float) -> None:
    """Raise InputError when the estimated nonzeros exceed ``rate`` per second of time limit."""
    nnz = estimate_nonzeros(g)
    if nnz > rate * max(time_limit, 1.0):
        raise InputError(
            None,
            None,
            f"{backend}: E={g.experts}, G={g.groups} gives about {nnz} matrix nonzeros, too many for a "
            f"{time_limit:g} s limit (at most {int(rate * max(time_limit, 1.0))}); raise --time-limit, "
            "use 'tacg-cpsat' or the heuristic 'tacg'",
        )
