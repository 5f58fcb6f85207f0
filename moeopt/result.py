"""Solver results: why and with what a method stopped, its plan, objective, bound and metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from moeopt.plan import Plan
from moeopt.services import services
from moeopt.version import provenance


class Termination(str, Enum):
    """Why a solve stopped (apart from what it holds: `Status`)."""

    OPTIMAL = "optimal"  # the backend proved optimality
    COMPLETED = "completed"  # a heuristic ran its search to its end (no optimality claim)
    TIME_LIMIT = "time_limit"
    ITERATION_LIMIT = "iteration_limit"  # node, iteration, solution or objective limit
    INTERRUPTED = "interrupted"  # Ctrl-C or a callback
    INFEASIBLE = "infeasible"  # proved that no plan exists
    ERROR = "error"  # the backend failed, or reported a state we cannot trust


#: HiGHS model status names (``highspy.HighsModelStatus``) -> termination.
HIGHS_TERMINATION: dict[str, Termination] = {
    "kOptimal": Termination.OPTIMAL,
    "kTimeLimit": Termination.TIME_LIMIT,
    "kIterationLimit": Termination.ITERATION_LIMIT,
    "kSolutionLimit": Termination.ITERATION_LIMIT,
    "kObjectiveBound": Termination.ITERATION_LIMIT,
    "kObjectiveTarget": Termination.ITERATION_LIMIT,
    "kInterrupt": Termination.INTERRUPTED,
    "kHighsInterrupt": Termination.INTERRUPTED,
    "kInfeasible": Termination.INFEASIBLE,
    "kUnboundedOrInfeasible": Termination.INFEASIBLE,
    "kUnbounded": Termination.ERROR,
    "kNotset": Termination.ERROR,
    "kLoadError": Termination.ERROR,
    "kModelError": Termination.ERROR,
    "kPresolveError": Termination.ERROR,
    "kSolveError": Termination.ERROR,
    "kPostsolveError": Termination.ERROR,
    "kModelEmpty": Termination.ERROR,
    "kMemoryLimit": Termination.ERROR,
    "kUnknown": Termination.ERROR,
}

#: Pyomo solver API v2 ``TerminationCondition`` names -> termination.
PYOMO_TERMINATION: dict[str, Termination] = {
    "convergenceCriteriaSatisfied": Termination.OPTIMAL,
    "maxTimeLimit": Termination.TIME_LIMIT,
    "iterationLimit": Termination.ITERATION_LIMIT,
    "objectiveLimit": Termination.ITERATION_LIMIT,
    "minStepLength": Termination.ITERATION_LIMIT,
    "interrupted": Termination.INTERRUPTED,
    "provenInfeasible": Termination.INFEASIBLE,
    "locallyInfeasible": Termination.INFEASIBLE,
    "infeasibleOrUnbounded": Termination.INFEASIBLE,
    "unbounded": Termination.ERROR,
    "error": Termination.ERROR,
    "licensingProblems": Termination.ERROR,
    "emptyModel": Termination.ERROR,
    "unknown": Termination.ERROR,
}

#: CP-SAT status names -> termination. ``FEASIBLE`` and ``UNKNOWN`` say only that the search
#: stopped early: `cpsat_termination` tells a time limit from an interrupt.
CPSAT_TERMINATION: dict[str, Termination] = {
    "OPTIMAL": Termination.OPTIMAL,
    "INFEASIBLE": Termination.INFEASIBLE,
    "MODEL_INVALID": Termination.ERROR,
    "FEASIBLE": Termination.TIME_LIMIT,
    "UNKNOWN": Termination.TIME_LIMIT,
}


def highs_termination(name: str) -> Termination:
    """Termination of a HiGHS model status name (unknown names are errors)."""
    return HIGHS_TERMINATION.get(name, Termination.ERROR)


#: Pyomo's legacy (``pyomo.opt``) ``TerminationCondition`` names -> termination: the interfaces of
#: CBC, GLPK and CPLEX report these (`moeopt.solvers.pyomo_solvers`). ``maxTimeLimit``,
#: ``unbounded``, ``error``, ``licensingProblems`` and ``unknown`` are spelled as in API v2.
PYOMO_LEGACY_TERMINATION: dict[str, Termination] = {
    "optimal": Termination.OPTIMAL,
    "globallyOptimal": Termination.OPTIMAL,
    "locallyOptimal": Termination.ERROR,  # no proof for a MILP
    "maxIterations": Termination.ITERATION_LIMIT,
    "maxEvaluations": Termination.ITERATION_LIMIT,
    "minFunctionValue": Termination.ITERATION_LIMIT,
    "userInterrupt": Termination.INTERRUPTED,
    "resourceInterrupt": Termination.INTERRUPTED,
    "infeasible": Termination.INFEASIBLE,
    "invalidProblem": Termination.ERROR,
    "solverFailure": Termination.ERROR,
    "internalSolverError": Termination.ERROR,
    "intermediateNonInteger": Termination.TIME_LIMIT,  # stopped (by time) before an integer solution: none kept
    "noSolution": Termination.ERROR,
    "feasible": Termination.TIME_LIMIT,  # a plan without proof: moeopt sets no limit but time (GLPK's time limit)
    "other": Termination.ERROR,
}


def pyomo_termination(name: str) -> Termination:
    """Termination of a Pyomo termination-condition name, solver API v2 or legacy (unknown names
    are errors): the same scale for every solver behind a Pyomo model."""
    return PYOMO_TERMINATION.get(name, PYOMO_LEGACY_TERMINATION.get(name, Termination.ERROR))


def cpsat_termination(name: str, wall_time: float, time_limit: float) -> Termination:
    """Termination of a CP-SAT status name: an early stop before the time limit was an interrupt."""
    out = CPSAT_TERMINATION.get(name, Termination.ERROR)
    if out is Termination.TIME_LIMIT and wall_time < 0.95 * time_limit:
        return Termination.INTERRUPTED
    return out


_TERMINATION_SEVERITY = [
    Termination.ERROR,
    Termination.INFEASIBLE,
    Termination.INTERRUPTED,
    Termination.ITERATION_LIMIT,
    Termination.TIME_LIMIT,
    Termination.COMPLETED,
    Termination.OPTIMAL,
]


#: Relative gap under which a plan counts as optimal: the exact models' own precision (CP-SAT
#: works on latencies and affinities rounded to about 7 significant digits).
OPTIMALITY_TOLERANCE = 1e-5


def bound_closes(objective: float, bound: float) -> bool:
    """Whether ``bound`` proves ``objective`` optimal, to `OPTIMALITY_TOLERANCE`."""
    return abs(bound - objective) <= OPTIMALITY_TOLERANCE * max(abs(bound), abs(objective), 1e-12)


def combine_termination(values: Sequence[Termination | None]) -> Termination:
    """The termination of a multi-layer solve: the worst of its layers (None: not known, skipped;
    a `Result`'s termination is never None)."""
    known = [v for v in values if v is not None]
    return min(known, key=_TERMINATION_SEVERITY.index) if known else Termination.COMPLETED


class Status(str, Enum):
    """What a result holds: a proved optimum, a feasible plan, or nothing usable.

    ``TIME_LIMIT`` is a feasible plan from an exact solve that stopped early, for whatever
    reason; `Result.termination` says which (time limit, interrupt, iteration limit).
    """

    OPTIMAL = "optimal"  # proved optimal (bound closes the gap)
    FEASIBLE = "feasible"  # a plan, no optimality claim (heuristics, early stops)
    TIME_LIMIT = "time_limit"  # an exact solver stopped at its time limit holding a plan
    INFEASIBLE = "infeasible"  # proved that no plan exists
    NO_SOLUTION = "no_solution"  # stopped without any plan (e.g. time limit before one)
    ERROR = "error"

    @property
    def has_plan(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT)

    @property
    def solution(self) -> str:
        """What the result holds, in one word: ``optimal``, ``feasible`` or ``none``."""
        return "optimal" if self is Status.OPTIMAL else "feasible" if self.has_plan else "none"


#: The termination a status implies when a method does not say (heuristics complete).
_DEFAULT_TERMINATION = {
    "optimal": Termination.OPTIMAL,
    "feasible": Termination.COMPLETED,
    "time_limit": Termination.TIME_LIMIT,
    "infeasible": Termination.INFEASIBLE,
    "no_solution": Termination.TIME_LIMIT,
    "error": Termination.ERROR,
}


#: Worst-first order used when combining per-layer statuses.
_SEVERITY = [Status.ERROR, Status.INFEASIBLE, Status.NO_SOLUTION, Status.TIME_LIMIT, Status.FEASIBLE, Status.OPTIMAL]


def combine_status(statuses: list[Status]) -> Status:
    """The status of a multi-layer result: the worst of its layers."""
    return min(statuses, key=_SEVERITY.index) if statuses else Status.FEASIBLE


def relative_gap(objective: float | None, bound: float | None, sense: str) -> float | None:
    """``|bound - objective| / max(|objective|, 1e-9)`` in the direction of ``sense``."""
    if objective is None or bound is None:
        return None
    diff = (objective - bound) if sense == "min" else (bound - objective)
    return max(diff, 0.0) / max(abs(objective), 1e-9)


@dataclass(frozen=True, eq=False)
class Result:
    """A method's answer.

    ``objective`` is the method's own objective (``objective_name``, minimized or maximized
    per ``sense``) recomputed by `moeopt.evaluate` on the returned plan; a backend's own
    number, where there is one, sits in ``stats['solver_objective']``. ``bound`` is a proved
    bound on the optimum (exact solvers and certified heuristics), ``metrics`` the evaluator's
    metrics on the evaluation workload.
    """

    method: str
    status: Status
    plan: Plan | None
    objective: float | None = None
    bound: float | None = None
    sense: str = "min"
    objective_name: str = ""
    wall_time: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    termination: Termination | None = None  # why it stopped; default: implied by ``status``
    instance: str = ""  # the name of the instance solved (set by `moeopt.solve`)

    def __post_init__(self) -> None:
        if self.sense not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max', got {self.sense!r}")
        if self.status.has_plan and self.plan is None:
            raise ValueError(f"status {self.status.value} needs a plan")
        if self.termination is None:
            object.__setattr__(self, "termination", _DEFAULT_TERMINATION[self.status.value])
        if self.objective is not None and self.bound is not None:
            tol = 1e-6 * max(1.0, abs(self.objective))
            wrong = self.bound > self.objective + tol if self.sense == "min" else self.bound < self.objective - tol
            if wrong:
                side = "above" if self.sense == "min" else "below"
                raise ValueError(
                    f"{self.method}: bound {self.bound} is {side} the objective {self.objective} "
                    f"of a {'minimization' if self.sense == 'min' else 'maximization'}: not a valid bound"
                )

    @property
    def gap(self) -> float | None:
        return relative_gap(self.objective, self.bound, self.sense)

    def replace(self, **changes: Any) -> Result:
        return replace(self, **changes)

    def summary(self) -> str:
        """One line: method, termination, what the result holds, objective, bound, gap, time
        (``-`` for a missing value); ``moeopt solve`` prints it first."""

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.4f}"

        assert self.termination is not None  # __post_init__ sets it
        return (
            f"{self.method}: {self.termination.value}, {self.status.solution} plan"
            f"; objective {self.objective_name} = {fmt(self.objective)}"
            f"; bound {fmt(self.bound)}; gap {fmt(None if self.gap is None else 100 * self.gap)} %"
            f"; {self.wall_time:.2f} s"
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON values: the content of ``moeopt solve --report``.

        Keys: ``instance``, ``method``, ``params``, ``status``, ``termination``, ``solution``,
        ``objective_name``, ``sense``, ``objective``, ``bound``, ``gap``, ``wall_time``,
        ``metrics``, ``stats``, then ``moeopt_version`` and, from a git checkout,
        ``git_commit`` (``moeopt.version.provenance``, as every report of the command line);
        numpy values become numbers and lists, NaN and infinities
        null (`jsonable`). The plan is not part of it: write it with
        `moeopt.write_plan` or `Plan.to_engine`.
        """
        assert self.termination is not None  # __post_init__ sets it
        report = {
            "instance": self.instance,
            "method": self.method,
            "params": self.params,
            "status": self.status.value,
            "termination": self.termination.value,
            "solution": self.status.solution,
            "objective_name": self.objective_name,
            "sense": self.sense,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            "wall_time": self.wall_time,
            "metrics": self.metrics,
            "stats": self.stats,
        }
        return dict(jsonable({**report, **provenance()}))

    def to_json(self, path: str | Path | None = None) -> str:
        """The result as indented JSON text (`to_dict`); written to ``path`` (atomically)
        when given, byte for byte what ``moeopt solve --report`` writes.

        Parameters
        ----------
        path
            The file to write, or None to only return the text.

        Returns
        -------
        str
            The JSON text.
        """
        text = json_text(self.to_dict())
        if path is not None:
            services().write_text(path, text)
        return text


def jsonable(x: Any) -> Any:
    """``x`` with plain JSON values only: numpy arrays as lists, numpy scalars as numbers, tuples
    as lists, paths as strings, mapping keys as strings, NaN and infinities as None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Enum):
        return x.value
    if isinstance(x, Path):
        return str(x)
    return x


def json_text(data: Any) -> str:
    """The JSON text of every report moeopt writes: `jsonable` values, indented by one."""
    return json.dumps(jsonable(data), indent=1) + "\n"
