"""What one exact solve of one layer returns, for every backend (grouping and GEM alike).

A backend reports *why* it stopped ([`Termination`][moeopt.result.Termination], mapped from its own
codes by one dict per backend in [`moeopt.result`][]) and *what it holds* (a plan or not);
`exact_status` turns the two into the [`Status`][moeopt.result.Status] of the layer, so
that every backend states it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moeopt.result import Status, Termination, relative_gap


def exact_status(termination: Termination, has_plan: bool) -> Status:
    """The status of an exact solve that stopped for ``termination``, holding a plan or not.

    Parameters
    ----------
    termination
        Why the backend stopped.
    has_plan
        Whether it holds a feasible plan.

    Returns
    -------
    Status
        INFEASIBLE when it proved that no plan exists; OPTIMAL when it proved its plan
        optimal; TIME_LIMIT for a plan from an early stop (whatever stopped it); NO_SOLUTION
        without a plan, or ERROR when the backend failed.
    """
    if termination is Termination.INFEASIBLE:
        return Status.INFEASIBLE
    if not has_plan:
        return Status.ERROR if termination is Termination.ERROR else Status.NO_SOLUTION
    return Status.OPTIMAL if termination is Termination.OPTIMAL else Status.TIME_LIMIT


@dataclass(frozen=True, eq=False, kw_only=True)
class ExactOutcome:
    """What an exact backend returns for one layer.

    Attributes
    ----------
    status
        What it holds: OPTIMAL, TIME_LIMIT (a plan, stopped early), NO_SOLUTION, INFEASIBLE
        or ERROR (see `exact_status`).
    home
        int ``[E]`` the plan (the GPU or group of each expert), None without one.
    incumbent
        The backend's own objective of ``home`` (None without a plan): a report, never the
        result's objective, which [`moeopt.evaluate`][] recomputes.
    bound
        The backend's proved bound on the optimum (upper for ``sense="max"``, lower for
        ``"min"``), None without one.
    sense
        ``"max"`` (grouping affinity) or ``"min"`` (GEM straggler latency).
    wall_time
        Seconds for build and search.
    build_time
        Seconds of those spent building the model.
    termination
        Why the backend stopped.
    solver_status
        The backend's own word for how it stopped (kept in reports' stats).
    warm_start
        Whether the backend accepted the hint as a starting plan.
    info
        Backend-specific numbers (model size, ...).
    """

    status: Status
    home: np.ndarray | None
    incumbent: float | None
    bound: float | None
    sense: str = "max"
    wall_time: float = 0.0
    build_time: float = 0.0
    termination: Termination = Termination.COMPLETED
    solver_status: str = ""
    warm_start: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sense not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max', got {self.sense!r}")
        if self.status.has_plan != (self.home is not None):
            given = "a plan" if self.home is not None else "no plan"
            raise ValueError(f"status {self.status.value} does not match {given}")

    @classmethod
    def from_termination(
        cls,
        termination: Termination,
        *,
        home: np.ndarray | None,
        incumbent: float | None,
        bound: float | None,
        **rest: Any,
    ) -> ExactOutcome:
        """The outcome of a backend that stopped for ``termination`` holding ``home`` (or None).

        The status follows from the two (`exact_status`); a proof of infeasibility
        carries no plan and no bound. ``rest`` are the other fields.
        """
        status = exact_status(termination, home is not None)
        if not status.has_plan:
            home, incumbent = None, None
        if status is Status.INFEASIBLE:
            bound = None
        return cls(status=status, home=home, incumbent=incumbent, bound=bound, termination=termination, **rest)

    @property
    def optimal(self) -> bool:
        """Whether the backend proved its plan optimal."""
        return self.status is Status.OPTIMAL

    @property
    def gap(self) -> float | None:
        """The backend's relative gap between ``incumbent`` and ``bound`` (None without both)."""
        return relative_gap(self.incumbent, self.bound, self.sense)
