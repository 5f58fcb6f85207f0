"""Shared HiGHS plumbing: silent construction and the process-wide thread scheduler.

HiGHS prints a banner on file descriptor 1 when a ``Highs`` object is first built: every
HiGHS user in moeopt builds its solver with `new_highs`, which hides it.

HiGHS's thread scheduler is global to the process.

The first HiGHS solve sizes it; a later solve asking for another thread count fails inside
HiGHS ("the scheduler has already been initialized") and comes back as a time limit without
a solution. Anything may have sized it before (another backend, the user's own HiGHS
code), so every HiGHS call in moeopt goes through `highs_threads`, which resets the
scheduler first; rebuilding a thread pool costs far less than any solve.

The assembly of a MILP from arrays (`highs_milp`), the hand-over of a starting plan
(`set_start`, and `pyomo_highs_start` for Pyomo's HiGHS interface), the grouping
MILP's options and its size check (`refuse_large`) live here too, so the backends share
them without importing each other.

Ctrl-C: every HiGHS MILP runs through `run_highs` (highspy) or
`pyomo_highs_solve` (Pyomo), which run it where a signal stops it at once: a child
process under the command line, or here with HiGHS's interrupt callback and ``cancelSolve``
(`moeopt.interrupt`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp

from moeopt import interrupt
from moeopt.budget import run_interruptible
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


def highs_milp(
    cost: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
    matrix: sp.spmatrix,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    integer: np.ndarray,
    *,
    maximize: bool = False,
) -> Any:
    """A silent ``highspy.Highs`` holding ``min (max) cost^T v`` s.t. ``row_lower <= matrix v <= row_upper``.

    Parameters
    ----------
    cost, col_lower, col_upper
        float ``[n]``: objective and column bounds.
    matrix
        ``[m, n]`` constraint matrix (any scipy sparse format; passed column-wise).
    row_lower, row_upper
        float ``[m]``: row bounds (``-inf``/``inf`` for none).
    integer
        ``[n]``: true (non-zero) for integer columns.
    maximize
        Maximize instead of minimize.
    """
    import highspy

    csc = sp.csc_matrix(matrix)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = csc.shape[1], csc.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, col_lower, col_upper
    lp.row_lower_, lp.row_upper_ = row_lower, row_upper
    if maximize:
        lp.sense_ = highspy.ObjSense.kMaximize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
    lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
    lp.a_matrix_.index_ = csc.indices.astype(np.int32)
    lp.a_matrix_.value_ = csc.data
    kind = highspy.HighsVarType
    lp.integrality_ = [kind.kInteger if v else kind.kContinuous for v in np.asarray(integer).tolist()]
    h = new_highs()
    h.passModel(lp)
    return h


def set_start(h: Any, values: np.ndarray) -> bool:
    """Hand HiGHS the column values ``values`` as its starting solution; whether it took them."""
    import highspy

    sol = highspy.HighsSolution()
    sol.col_value = np.asarray(values, dtype=np.float64).tolist()
    sol.value_valid = True
    return bool(h.setSolution(sol) == highspy.HighsStatus.kOk)


def pyomo_highs_start(opt: Any, model: Any, values: Iterable[tuple[Any, float]]) -> bool:
    """Hand a starting plan to the HiGHS model behind a Pyomo v2 ``highs`` solver.

    Pyomo's HiGHS interface has no public warm start (Pyomo 6.10: no ``warmstart`` option,
    no accessor for the highspy model or the column of a variable), so this is the one place
    that reaches into its private attributes: load ``model`` into ``opt`` (the later
    ``opt.solve(model)`` reuses it unchanged), then give HiGHS the ``(variable, value)`` pairs
    directly. Returns False, starting nothing, when the attributes are not there (another
    Pyomo version) or HiGHS refuses the values.
    """
    try:
        opt.set_instance(model)
        highs = opt._solver_model
        column = opt._pyomo_var_to_solver_var_map
        start = np.zeros(highs.getNumCol())
        for var, value in values:
            start[column[id(var)]] = value
    except (AttributeError, KeyError, TypeError):
        return False
    return set_start(highs, start)


@dataclass(frozen=True)
class SolvedHighs:
    """What a ``Highs`` holds after ``run()``, read in the child process that ran it
    (`run_highs`): the same four methods callers read, with the same values."""

    model_status: Any  # highspy.HighsModelStatus
    status_text: str
    info: SimpleNamespace  # every public field of highspy.HighsInfo
    solution: SimpleNamespace  # col_value, value_valid

    def getModelStatus(self) -> Any:
        return self.model_status

    def modelStatusToString(self, status: Any) -> str:
        return self.status_text

    def getInfo(self) -> SimpleNamespace:
        return self.info

    def getSolution(self) -> SimpleNamespace:
        return self.solution


def _run_and_read(h: Any) -> SolvedHighs:
    """Run ``h`` and read its answer (in the child process of `run_highs`)."""
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    sol = h.getSolution()
    return SolvedHighs(
        status,
        h.modelStatusToString(status),
        SimpleNamespace(**{k: getattr(info, k) for k in dir(info) if not k.startswith("_")}),
        SimpleNamespace(col_value=list(sol.col_value), value_valid=bool(sol.value_valid)),
    )


def run_highs(h: Any) -> Any:
    """``h.run()`` such that Ctrl-C stops it; returns what to read the answer from (``h``, or
    a `SolvedHighs` with ``getModelStatus``, ``getInfo``, ``getSolution``).

    HiGHS's interrupt callback (``cancelSolve``) is not consulted while a MIP solves its root
    LP, which can take most of the time limit. Under the command line the run therefore goes
    to a child process that Ctrl-C kills (`moeopt.interrupt.run_in_child`); elsewhere
    (a library call; pool and Ray workers are stopped by their parent) it runs here with the
    interrupt callback on (highspy's ``HandleUserInterrupt``: a flag check, the search is
    unchanged) and ``cancelSolve`` as the stop hook. Same model, options and seed: same answer.
    """
    if interrupt.active() and threading.current_thread() is threading.main_thread():
        return interrupt.run_in_child(_run_and_read, h)
    h.HandleUserInterrupt = True
    run_interruptible(h.run, h.cancelSolve)
    return h


@dataclass(frozen=True)
class _VarValues:
    """Loads variable values into a Pyomo model, in ``component_data_objects`` order (the
    ``solution_loader`` of `SolvedPyomo`)."""

    model: Any
    values: list[float | None] | None

    def load_vars(self) -> None:
        import pyomo.environ as pyo

        if self.values is None:
            raise RuntimeError("no solution to load")
        for var, value in zip(self.model.component_data_objects(pyo.Var), self.values, strict=True):
            var.set_value(value, skip_validation=True)


@dataclass(frozen=True)
class SolvedPyomo:
    """The fields of a Pyomo v2 ``Results`` that moeopt reads, from the child process that solved
    (`pyomo_highs_solve`); ``solution_loader.load_vars()`` sets the model's values here."""

    termination_condition: Any
    solution_status: Any
    incumbent_objective: float | None
    objective_bound: float | None
    solution_loader: _VarValues


def _solve_and_read(opt: Any, model: Any, options: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """Solve with Pyomo's HiGHS and read the answer (in the child process of `pyomo_highs_solve`)."""
    import pyomo.environ as pyo
    from pyomo.contrib.solver.common.results import SolutionStatus

    res = opt.solve(model, load_solutions=False, **options)
    values = None
    held = res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal)
    if held or res.incumbent_objective is not None:
        res.solution_loader.load_vars()
        values = [var.value for var in model.component_data_objects(pyo.Var)]
    return res.termination_condition, res.solution_status, res.incumbent_objective, res.objective_bound, values


def pyomo_highs_solve(opt: Any, model: Any, **options: Any) -> Any:
    """``opt.solve(model, load_solutions=False, **options)`` with Pyomo's HiGHS, such that
    Ctrl-C stops it: in a child process that Ctrl-C kills under the command line (HiGHS does
    not look at its interrupt callback during a MIP's root LP; see `run_highs`), whose
    answer comes back as a `SolvedPyomo`; elsewhere here, with `cancel_pyomo_highs`
    as the stop hook, returning Pyomo's own results."""
    if interrupt.active() and threading.current_thread() is threading.main_thread():
        term, status, incumbent, bound, values = interrupt.run_in_child(_solve_and_read, opt, model, options)
        return SolvedPyomo(term, status, incumbent, bound, _VarValues(model, values))
    return run_interruptible(lambda: opt.solve(model, load_solutions=False, **options), lambda: cancel_pyomo_highs(opt))


def cancel_pyomo_highs(opt) -> None:
    """Ask the HiGHS model behind a Pyomo v2 ``highs`` solver to stop (Ctrl-C); nothing when
    Pyomo has not built it yet."""
    model = getattr(opt, "_solver_model", None)
    if model is not None:
        model.cancelSolve()


# ----------------------------------------------------------------------------- grouping MILP size
def estimate_nonzeros(g: Grouping) -> int:
    """Nonzeros of `moeopt.solvers.grouping_highs.build_arrays` without building it."""
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
            f"{time_limit:g} s limit (at most {int(rate * max(time_limit, 1.0))}); raise --layer-time-limit, "
            "use 'tacg-cpsat' or the heuristic 'tacg'",
        )
