"""The MILP solvers behind moeopt's Pyomo models: ``highs`` (default), ``cbc``, ``glpk``, ``gurobi``,
``cplex``, ``scip``, through Pyomo's own solver interfaces (docs/guides/solvers.md).

Every Pyomo model (``tacg-milp``, ``gem-milp``, the replication bound's cross-check) is solved by
``solve_model``, which hands the same time limit, gaps, tolerances, threads and seed to each
solver under the solver's own option names and reads the answer back into one shape
(``PyomoAnswer``): the termination on moeopt's scale (``moeopt.result.Termination``:
optimal, time limit, infeasible, ... alike for every solver), the incumbent, and a proved bound
where the solver reports one; a solver that reports none (GLPK) gets the objective as its bound
only when it proved optimality.

Which interface each solver goes through (the first one present):

======== ===================================================== ===============================
solver   Pyomo interface                                       time limit option
======== ===================================================== ===============================
highs    ``highs`` (solver API v2; highspy, a core dependency) ``time_limit``
cbc      ``cbc`` (the ``cbc`` executable, a subprocess)        ``-sec``
glpk     ``glpk`` (the ``glpsol`` executable, a subprocess)    ``--tmlim`` (whole seconds)
gurobi   ``gurobi_direct`` (solver API v2; gurobipy)           ``TimeLimit``
cplex    ``cplex_direct`` (cplex), else ``cplex`` (executable) ``timelimit``
scip     ``scip_direct`` (solver API v2; pyscipopt)            ``limits/time``
======== ===================================================== ===============================

Ctrl-C and time limits. HiGHS keeps its own handling (``moeopt.solvers.highs_common.pyomo_highs_solve``:
a child process under the command line, ``cancelSolve`` elsewhere). A solver library that runs
in this process (SCIP, Gurobi, CPLEX) runs the same way as HiGHS under the command line: in a
child process that Ctrl-C kills (``moeopt.interrupt.run_in_child``); elsewhere a solve it
reports as interrupted raises ``moeopt.interrupt.Interrupted``. An executable (CBC, GLPK,
the CPLEX program) is a subprocess of this one, run by Pyomo with ``subprocess.run``, which
kills it when Ctrl-C raises in the waiting thread, and when it outlives its time limit by Pyomo's
grace (one second or 1 %); in a pool worker, which its parent stops with SIGTERM, SIGTERM raises
there too while the executable runs: no solver process outlives the call.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from moeopt import interrupt
from moeopt.errors import InputError
from moeopt.result import Termination, pyomo_termination

#: The solvers a Pyomo model can be solved with (the ``solver`` parameter), the default first.
SOLVERS: tuple[str, ...] = ("highs", "cbc", "glpk", "gurobi", "cplex", "scip")

#: The default solver (HiGHS: highspy is a core dependency).
DEFAULT = "highs"


@dataclass(frozen=True)
class Interface:
    """One way Pyomo reaches a solver.

    Attributes
    ----------
    factory
        Pyomo's name for it (``SolverFactory(factory)``).
    api
        ``"v2"``: Pyomo's solver API v2 (``pyomo.contrib.solver``); ``"legacy"``: ``pyomo.opt``.
    runs
        ``"library"`` (in this process) or ``"executable"`` (a subprocess).
    needs
        What must be installed: a Python module (``module:NAME``) or an executable (``exe:NAME``).
    """

    factory: str
    api: str
    runs: str
    needs: str


#: Interfaces per solver, tried in order.
INTERFACES: dict[str, tuple[Interface, ...]] = {
    "highs": (Interface("highs", "v2", "library", "module:highspy"),),
    "cbc": (Interface("cbc", "legacy", "executable", "exe:cbc"),),
    "glpk": (Interface("glpk", "legacy", "executable", "exe:glpsol"),),
    "gurobi": (Interface("gurobi_direct", "v2", "library", "module:gurobipy"),),
    "cplex": (
        Interface("cplex_direct", "legacy", "library", "module:cplex"),
        Interface("cplex", "legacy", "executable", "exe:cplex"),
    ),
    "scip": (Interface("scip_direct", "v2", "library", "module:pyscipopt"),),
}

#: How to install each solver (``moeopt methods`` and the errors say it).
INSTALL: dict[str, str] = {
    "highs": "highspy, a core dependency: pip install moeopt",
    "cbc": "a cbc executable on PATH (Debian/Ubuntu: apt-get install coinor-cbc; conda: coin-or-cbc)",
    "glpk": "a glpsol executable on PATH (Debian/Ubuntu: apt-get install glpk-utils; conda: glpk)",
    "gurobi": "pip install gurobipy (and a Gurobi licence beyond its size-limited one)",
    "cplex": "pip install cplex (or a cplex executable on PATH; a licence beyond the community edition's limits)",
    "scip": "pip install 'moeopt[scip]' (pyscipopt, which bundles SCIP)",
}

#: Whether a solver reports a proved bound when it stops early (GLPK does not: its bound is the
#: objective, and only when it proved optimality).
REPORTS_BOUND: dict[str, bool] = {
    "highs": True,
    "cbc": True,
    "glpk": False,
    "gurobi": True,
    "cplex": True,
    "scip": True,
}


def check_solver(name: str) -> None:
    """Raise ValueError ("solver must be one of ...") unless ``name`` is in ``SOLVERS``.

    Parameters
    ----------
    name
        The ``solver`` parameter's value.
    """
    if name not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {name!r}")


def _present(needs: str) -> bool:
    """Whether the module or executable ``needs`` (``module:X`` / ``exe:X``) is installed."""
    kind, _, what = needs.partition(":")
    if kind == "exe":
        return shutil.which(what) is not None
    try:
        return importlib.util.find_spec(what) is not None
    except (ImportError, ValueError):
        return False


def _factory(interface: Interface) -> Any:
    """Pyomo's solver object for ``interface``."""
    if interface.api == "v2":
        import pyomo.environ  # noqa: F401  (registers the solver plugins)
        from pyomo.contrib.solver.common.factory import SolverFactory

        return SolverFactory(interface.factory)
    import pyomo.environ as pyo

    return pyo.SolverFactory(interface.factory)


def _usable(interface: Interface) -> bool:
    """Whether Pyomo can run ``interface``: what it needs is installed and Pyomo's own check passes."""
    if not _present(interface.needs):
        return False
    try:
        opt = _factory(interface)
        if interface.api == "v2":
            return bool(opt.available())
        return bool(opt.available(exception_flag=False))
    except Exception:  # noqa: BLE001  (a broken install, a licence problem: unusable)
        interrupt.check()
        return False


def interface(name: str) -> Interface | None:
    """The first usable interface to solver ``name``; None when there is none.

    Parameters
    ----------
    name
        One of ``SOLVERS``.
    """
    check_solver(name)
    return next((i for i in INTERFACES[name] if _usable(i)), None)


def available(name: str) -> bool:
    """Whether solver ``name`` can be used here (its library or executable is present and Pyomo
    accepts it).

    Parameters
    ----------
    name
        One of ``SOLVERS``.

    Returns
    -------
    bool
        False when nothing it needs is installed, or Pyomo's own check fails.
    """
    return interface(name) is not None


def availability() -> list[tuple[str, bool, str]]:
    """``(solver, available, how)`` for every solver: the interface used, or how to install it."""
    rows = []
    for name in SOLVERS:
        found = interface(name)
        how = f"Pyomo '{found.factory}' ({found.runs})" if found is not None else f"missing: {INSTALL[name]}"
        rows.append((name, found is not None, how))
    return rows


def require(name: str, method: str) -> Interface:
    """The interface to solver ``name``, or InputError (exit 2 on the command line) saying how to
    install it.

    Parameters
    ----------
    name
        One of ``SOLVERS``.
    method
        The method asking (for the message).
    """
    try:
        found = interface(name)
    except ValueError as exc:
        raise InputError(None, "method.solver", str(exc).partition(" must ")[2] or str(exc)) from None
    if found is None:
        raise InputError(None, "method.solver", f"{method}: solver {name!r} is not available here; {INSTALL[name]}")
    return found


@dataclass(frozen=True)
class PyomoAnswer:
    """What a solve returned, the same for every solver.

    Attributes
    ----------
    termination
        Why it stopped, on moeopt's scale.
    solver_status
        The interface's own termination-condition name (reports keep it).
    incumbent
        The objective of the solution loaded into the model; None without one.
    bound
        A proved bound on the optimum (the solver's, or the objective when it proved optimality
        and reports no bound); None when not known.
    has_solution
        Whether the model's variables hold the solver's solution.
    warm_start
        Whether the starting values were handed to the solver.
    solver
        The solver (one of ``SOLVERS``) and ``interface`` Pyomo's name for the interface.
    """

    termination: Termination
    solver_status: str
    incumbent: float | None
    bound: float | None
    has_solution: bool
    warm_start: bool
    solver: str
    interface: str


@dataclass(frozen=True)
class SolveOptions:
    """How a model is solved, whatever the solver (each gets them under its own names).

    Attributes
    ----------
    time_limit
        Seconds of solver time.
    threads, seed
        Solver threads and random seed (where the solver has them).
    rel_gap, abs_gap
        Stop when the relative (absolute) gap is at most this (None: the solver's default).
    feasibility_tol
        Primal and integer feasibility tolerance (None: the solver's default).
    tee
        Print the solver's log.
    highs_options
        Extra HiGHS options (``solver_options`` of Pyomo's ``highs``), HiGHS only.
    """

    time_limit: float
    threads: int = 1
    seed: int = 0
    rel_gap: float | None = None
    abs_gap: float | None = None
    feasibility_tol: float | None = None
    tee: bool = False
    highs_options: dict[str, Any] | None = None


def _legacy_options(name: str, o: SolveOptions) -> dict[str, Any]:
    """The solver-specific options of a legacy (``pyomo.opt``) interface."""
    out: dict[str, Any] = {}
    if name == "cbc":  # the time limit goes as Pyomo's ``timelimit`` (-sec)
        out["threads"] = max(1, o.threads)
        out["randomCbcSeed"] = o.seed + 1  # 0 would mean "from the clock"
        if o.rel_gap is not None:
            out["ratioGap"] = o.rel_gap
        if o.abs_gap is not None:
            out["allowableGap"] = o.abs_gap
        if o.feasibility_tol is not None:
            out["primalTolerance"] = o.feasibility_tol
            out["integerTolerance"] = o.feasibility_tol
    elif name == "glpk":  # the time limit goes as Pyomo's ``timelimit`` (--tmlim, whole seconds)
        if o.rel_gap is not None:
            out["mipgap"] = o.rel_gap
    elif name == "cplex":
        out["timelimit"] = o.time_limit
        out["threads"] = max(1, o.threads)
        out["randomseed"] = o.seed
        if o.rel_gap is not None:
            out["mip_tolerances_mipgap"] = o.rel_gap
        if o.abs_gap is not None:
            out["mip_tolerances_absmipgap"] = o.abs_gap
        if o.feasibility_tol is not None:
            out["simplex_tolerances_feasibility"] = o.feasibility_tol
            out["mip_tolerances_integrality"] = o.feasibility_tol
    return out


def _v2_options(name: str, o: SolveOptions) -> dict[str, Any]:
    """``solver_options`` of a v2 interface other than HiGHS (time limit, threads and gaps go
    through Pyomo's common config)."""
    if name == "scip":
        out: dict[str, Any] = {"randomization/randomseedshift": o.seed}
        if o.feasibility_tol is not None:
            out["numerics/feastol"] = o.feasibility_tol
        return out
    if name == "gurobi":
        out = {"Seed": o.seed}
        if o.feasibility_tol is not None:
            out["FeasibilityTol"] = o.feasibility_tol
            out["IntFeasTol"] = o.feasibility_tol
        return out
    return {}


def _objective(model: Any) -> Any:
    """The model's one active objective."""
    import pyomo.environ as pyo

    return next(model.component_data_objects(pyo.Objective, active=True))


def _set_start(model: Any, start: Iterable[tuple[Any, float]] | None) -> bool:
    """Set the starting values on the variables; whether there were any."""
    if start is None:
        return False
    any_value = False
    for var, value in start:
        var.set_value(value, skip_validation=True)
        any_value = True
    return any_value


def _values(model: Any) -> list[float | None]:
    import pyomo.environ as pyo

    return [var.value for var in model.component_data_objects(pyo.Var)]


def _load(model: Any, values: list[float | None]) -> None:
    import pyomo.environ as pyo

    for var, value in zip(model.component_data_objects(pyo.Var), values, strict=True):
        var.set_value(value, skip_validation=True)


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _solve_v2(name: str, face: Interface, model: Any, o: SolveOptions, warm: bool) -> tuple[Any, ...]:
    """Solve through a v2 interface; ``(condition, incumbent, bound, values, warm)``."""
    from pyomo.contrib.solver.common.results import SolutionStatus

    opt = _factory(face)
    kwargs: dict[str, Any] = {
        "load_solutions": False,
        "raise_exception_on_nonoptimal_result": False,
        "tee": o.tee,
        "time_limit": max(0.05, o.time_limit),
        "threads": max(1, o.threads),
        "solver_options": _v2_options(name, o),
    }
    if o.rel_gap is not None:
        kwargs["rel_gap"] = o.rel_gap
    if o.abs_gap is not None:
        kwargs["abs_gap"] = o.abs_gap
    if warm and "warmstart_discrete_vars" in opt.config:
        kwargs["warmstart_discrete_vars"] = True
    else:
        warm = False
    res = opt.solve(model, **kwargs)
    values = None
    if res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal):
        res.solution_loader.load_vars()
        values = _values(model)
    return res.termination_condition.name, res.incumbent_objective, _finite(res.objective_bound), values, warm


def _solve_legacy(name: str, face: Interface, model: Any, o: SolveOptions, warm: bool) -> tuple[Any, ...]:
    """Solve through a legacy interface; ``(condition, incumbent, bound, values, warm)``."""
    import pyomo.environ as pyo

    opt = _factory(face)
    for key, value in _legacy_options(name, o).items():
        opt.options[key] = value
    kwargs: dict[str, Any] = {"load_solutions": False, "tee": o.tee}
    if face.runs == "executable":  # Pyomo passes it on (-sec, --tmlim, set timelimit) and kills the
        # subprocess past it and a grace; GLPK takes whole seconds
        kwargs["timelimit"] = math.ceil(o.time_limit) if name == "glpk" else max(0.05, o.time_limit)
    warm = warm and bool(opt.warm_start_capable())
    if warm:
        kwargs["warmstart"] = True
    try:
        res = opt.solve(model, **kwargs)
    except subprocess.TimeoutExpired:  # past its limit and Pyomo's grace: subprocess.run killed it
        return "maxTimeLimit", None, None, None, warm
    from pyomo.common.log import LoggingIntercept

    condition = str(res.solver.termination_condition)
    values = None
    if len(res.solution) > 0 and condition != "intermediateNonInteger":  # not the relaxation's fractional values
        with LoggingIntercept():  # "loading a SolverResults object with an 'aborted' status": a time limit
            model.solutions.load_from(res)
        values = _values(model)
    minimize = _objective(model).sense == pyo.minimize
    bound = _finite(res.problem.lower_bound if minimize else res.problem.upper_bound)
    incumbent = float(pyo.value(_objective(model))) if values is not None else None
    if name == "cbc" and not minimize and bound is not None and incumbent is not None and bound < incumbent <= -bound:
        # CBC minimizes the negated objective, and Pyomo's reading of its log keeps that sign
        # for the bound of a maximization it stopped early (Pyomo 6.10, CBC 2.10)
        bound = -bound
    return condition, incumbent, bound, values, warm


def _run(name: str, face: Interface, model: Any, o: SolveOptions, warm: bool) -> tuple[Any, ...]:
    """Solve in this process (the body of the child process too)."""
    if face.api == "v2":
        return _solve_v2(name, face, model, o, warm)
    return _solve_legacy(name, face, model, o, warm)


def _solve_highs(model: Any, o: SolveOptions, start: Iterable[tuple[Any, float]] | None) -> PyomoAnswer:
    """HiGHS through Pyomo's v2 ``highs``, with its warm start and its Ctrl-C handling."""
    import pyomo.environ as pyo
    from pyomo.contrib.solver.common.factory import SolverFactory
    from pyomo.contrib.solver.common.results import SolutionStatus

    from moeopt.solvers.highs_common import highs_threads, pyomo_highs_solve, pyomo_highs_start

    opt = SolverFactory("highs")
    warm = start is not None and pyomo_highs_start(opt, model, start)
    kwargs: dict[str, Any] = {
        "raise_exception_on_nonoptimal_result": False,
        "tee": o.tee,
        "time_limit": max(0.05, o.time_limit),
        "threads": highs_threads(o.threads),
    }
    options = dict(o.highs_options or {})
    options.setdefault("random_seed", o.seed)
    if o.rel_gap is not None:
        kwargs["rel_gap"] = o.rel_gap
    if o.abs_gap is not None:
        kwargs["abs_gap"] = o.abs_gap
    if o.feasibility_tol is not None:
        options.setdefault("primal_feasibility_tolerance", o.feasibility_tol)
        options.setdefault("mip_feasibility_tolerance", o.feasibility_tol)
    kwargs["solver_options"] = options
    res = pyomo_highs_solve(opt, model, **kwargs)
    held = res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal)
    if held:
        res.solution_loader.load_vars()
    condition = res.termination_condition.name
    incumbent = None if res.incumbent_objective is None else float(res.incumbent_objective)
    maximize = _objective(model).sense == pyo.maximize
    bound = _finite(res.objective_bound)
    return _answer("highs", "highs", condition, incumbent if held else None, bound, held, warm, maximize)


def _answer(
    name: str,
    factory: str,
    condition: str,
    incumbent: float | None,
    bound: float | None,
    held: bool,
    warm: bool,
    maximize: bool,
) -> PyomoAnswer:
    """The common answer: the termination mapped, the bound trusted only where the solver reports
    one and it lies on the right side of the incumbent (Pyomo reads CBC's bound from its log, with
    a sign that depends on CBC's version for a maximization)."""
    termination = pyomo_termination(condition)
    if bound is not None and incumbent is not None:
        slack = 1e-6 * max(abs(incumbent), 1.0)
        if (bound < incumbent - slack) if maximize else (bound > incumbent + slack):
            bound = None
    if not REPORTS_BOUND[name]:
        bound = incumbent if termination is Termination.OPTIMAL else None
    elif bound is None and termination is Termination.OPTIMAL:
        bound = incumbent
    return PyomoAnswer(termination, condition, incumbent, bound, held, warm, name, factory)


class _Terminated(BaseException):
    """SIGTERM came while a solver executable ran (raised so that ``subprocess.run`` kills it)."""


@contextmanager
def _terminate_kills_the_solver() -> Iterator[None]:
    """In the main thread of a process that SIGTERM would end at once (a pool worker, which its
    parent stops with SIGTERM; a library call), turn SIGTERM into an exception while a solver
    executable runs, so that ``subprocess.run`` kills the solver, then end by SIGTERM as before.
    Under the command line's own handling (or any other handler) the block just runs."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    came: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        came.append(signum)
        raise _Terminated()

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if came:  # the solver is gone: now end as SIGTERM would have
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(128 + signal.SIGTERM)  # not reached: the default action ends the process


def solve_model(
    model: Any, solver: str, options: SolveOptions, *, start: Iterable[tuple[Any, float]] | None = None
) -> PyomoAnswer:
    """Solve the Pyomo ``model`` with ``solver``; its solution (if any) is loaded into ``model``.

    Parameters
    ----------
    model
        A Pyomo ``ConcreteModel`` with one active objective.
    solver
        One of ``SOLVERS``.
    options
        Time limit, gaps, tolerances, threads, seed (``SolveOptions``).
    start
        ``(variable, value)`` pairs of a starting solution, handed to solvers that take one.

    Returns
    -------
    PyomoAnswer
        Termination, incumbent and bound, the same shape for every solver.

    Raises
    ------
    InputError
        When ``solver`` is unknown or not installed (the message says how to install it).
    Interrupted
        On Ctrl-C (or SIGTERM under the command line).
    """
    import pyomo.environ as pyo

    face = require(solver, "solve")
    if solver == "highs":
        return _solve_highs(model, options, start)
    warm = _set_start(model, start)
    in_child = face.runs == "library" and interrupt.active() and threading.current_thread() is threading.main_thread()
    if in_child:  # as HiGHS under the command line: a child process that Ctrl-C kills
        condition, incumbent, bound, values, warm = interrupt.run_in_child(_run, solver, face, model, options, warm)
        if values is not None:
            _load(model, values)
    elif face.runs == "library":
        with interrupt.native():  # a signal that came during the solve is raised when it ends
            condition, incumbent, bound, values, warm = _run(solver, face, model, options, warm)
    else:  # an executable: Ctrl-C raises in this thread, and subprocess.run kills the solver
        with interrupt.native(), _terminate_kills_the_solver():
            condition, incumbent, bound, values, warm = _run(solver, face, model, options, warm)
    if pyomo_termination(condition) is Termination.INTERRUPTED:
        raise interrupt.Interrupted()  # the solver saw Ctrl-C itself (SCIP catches it): not a result
    held = values is not None
    if held:
        incumbent = float(pyo.value(_objective(model)))
    else:
        incumbent = None
    maximize = _objective(model).sense == pyo.maximize
    return _answer(solver, face.factory, condition, incumbent, bound, held, warm, maximize)
