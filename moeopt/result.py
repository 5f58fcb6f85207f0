"""Solver results: why and with what a method stopped, its plan, objective, bound and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from tabulate import tabulate

from moeopt.plan import Plan


class Status(str, Enum):
    """What a result holds: a proved optimum, a feasible plan, or nothing usable."""

    OPTIMAL = "optimal"  # proved optimal (bound closes the gap)
    FEASIBLE = "feasible"  # a plan, no optimality claim (heuristics, early stops)
    TIME_LIMIT = "time_limit"  # an exact solver stopped at its time limit holding a plan
    INFEASIBLE = "infeasible"  # proved that no plan exists
    NO_SOLUTION = "no_solution"  # stopped without any plan (e.g. time limit before one)
    ERROR = "error"

    @property
    def has_plan(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT)


#: Worst-first order used when combining per-layer statuses.
_SEVERITY = [Status.ERROR, Status.INFEASIBLE, Status.NO_SOLUTION, Status.TIME_LIMIT,
             Status.FEASIBLE, Status.OPTIMAL]


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
    per ``sense``) recomputed by :mod:`moeopt.evaluate` on the returned plan; a backend's own
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

    def __post_init__(self) -> None:
        if self.sense not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max', got {self.sense!r}")
        if self.status.has_plan and self.plan is None:
            raise ValueError(f"status {self.status.value} needs a plan")

    @property
    def gap(self) -> float | None:
        return relative_gap(self.objective, self.bound, self.sense)

    def replace(self, **changes: Any) -> Result:
        return replace(self, **changes)

    def summary(self) -> str:
        rows = [
            ("method", self.method),
            ("status", self.status.value),
            (f"objective ({self.objective_name}, {self.sense})", self.objective),
            ("bound", self.bound),
            ("gap", None if self.gap is None else f"{100 * self.gap:.2f} %"),
            ("wall time (s)", round(self.wall_time, 3)),
        ]
        return tabulate([(k, "-" if v is None else v) for k, v in rows], tablefmt="plain")
