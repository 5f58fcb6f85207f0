"""The restricted master of the column generation (highspy): its LP and its MILP over the columns.

Rows: one per expert (``= 1``, ``<= 1`` when groups may be left empty, or ``>= 1`` when an
expert may sit in several columns, e.g. copies) and ``sum x <= G``; one column per group with
its value as objective coefficient. A `ColumnSpace` says which rows and which value
(grouping: `grouping_space`, the intra-group affinity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moeopt.colgen.pricing import group_value
from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.solvers.highs_common import highs_threads, new_highs, set_start

#: expert rows of the master: ``= 1``, ``<= 1`` or ``>= 1``
ROWS = ("partition", "pack", "cover")


@dataclass(frozen=True, eq=False)
class ColumnSpace:
    """What the master needs to know of a set-partitioning-like problem.

    Attributes
    ----------
    experts
        Expert rows (one per expert).
    groups
        G: at most this many columns are chosen (the count row ``sum x <= G``).
    rows
        ``partition`` (``= 1``), ``pack`` (``<= 1``) or ``cover`` (``>= 1``).
    value
        The objective coefficient of each column (a list of sorted expert-id arrays).
    """

    experts: int
    groups: int
    rows: str
    value: Callable[[list[np.ndarray]], np.ndarray]

    def __post_init__(self) -> None:
        if self.rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {self.rows!r}")


def grouping_space(problem: Grouping, partition: bool) -> ColumnSpace:
    """The grouping master: intra-group affinity columns, rows ``= 1`` (or ``<= 1``)."""
    return ColumnSpace(
        problem.experts,
        problem.groups,
        "partition" if partition else "pack",
        lambda groups: np.array([group_value(problem.graph, s) for s in groups]),
    )


def _master_model(space: ColumnSpace) -> Any:
    """A maximizing single-threaded HiGHS model with the master's rows and no columns yet."""
    import highspy

    E = space.experts
    h = new_highs()
    highs_threads(1)
    h.setOptionValue("threads", 1)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    inf = highspy.kHighsInf
    lower = {"partition": 1.0, "pack": -inf, "cover": 1.0}[space.rows]
    upper = {"partition": 1.0, "pack": 1.0, "cover": inf}[space.rows]
    h.addRows(
        E + 1,
        np.concatenate([np.full(E, lower), [-inf]]),
        np.concatenate([np.full(E, upper), [float(space.groups)]]),
        0,
        np.zeros(E + 1, dtype=np.int32),
        np.array([], dtype=np.int32),
        np.array([], dtype=np.float64),
    )
    return h


def _add_columns(h: Any, space: ColumnSpace, groups: list[np.ndarray], *, upper: float) -> np.ndarray:
    """Add one column per group (its expert rows and the count row); returns their values."""
    C, E = len(groups), space.experts
    vals = np.asarray(space.value(groups), dtype=np.float64)
    starts = np.cumsum([0] + [len(s) + 1 for s in groups[:-1]]).astype(np.int32)
    index = np.concatenate([np.append(s, E) for s in groups]).astype(np.int32)
    h.addCols(C, vals, np.zeros(C), np.full(C, upper), len(index), starts, index, np.ones(len(index)))
    return vals


class Master:
    """The restricted master LP in highspy: rows per expert (``= 1``, ``<= 1`` or ``>= 1``) and
    ``sum x <= G``."""

    def __init__(self, space: ColumnSpace) -> None:
        import highspy

        self.space = space
        self.inf = highspy.kHighsInf
        self.h = _master_model(space)
        self.groups: list[np.ndarray] = []
        self.values: list[float] = []
        self.keys: set[bytes] = set()

    def key(self, group: np.ndarray) -> bytes:
        member = np.zeros(self.space.experts, dtype=bool)
        member[group] = True
        return np.packbits(member).tobytes()

    def add(self, groups: list[np.ndarray]) -> int:
        """Add the new ones among ``groups``; return how many were new."""
        new = []
        for s in groups:
            s = np.sort(np.asarray(s, dtype=np.int64))
            k = self.key(s)
            if len(s) == 0 or k in self.keys:
                continue
            self.keys.add(k)
            new.append(s)
        if not new:
            return 0
        vals = _add_columns(self.h, self.space, new, upper=self.inf)
        self.groups.extend(new)
        self.values.extend(vals.tolist())
        return len(new)

    def solve(self) -> tuple[float, np.ndarray, float, np.ndarray]:
        """Solve the LP: value, expert duals pi, the count row's dual mu, and x."""
        self.h.run()
        status = self.h.modelStatusToString(self.h.getModelStatus())
        if status != "Optimal":
            raise RuntimeError(f"restricted master LP: HiGHS status {status}")
        sol = self.h.getSolution()
        dual = np.asarray(sol.row_dual)
        E = self.space.experts
        return (
            float(self.h.getInfo().objective_function_value),
            dual[:E].copy(),
            float(dual[E]),
            np.asarray(sol.col_value),
        )


def restricted_milp(
    problem: Grouping,
    groups: list[np.ndarray],
    partition: bool,
    *,
    time_limit: float | None = None,
    nodes: int | None = None,
    start: np.ndarray | None = None,
    report: dict | None = None,
) -> np.ndarray | None:
    """Best plan made of the given columns (HiGHS MILP, one thread, ``start`` as a warm start);
    None if none found. ``nodes`` (HiGHS ``mip_max_nodes``) bounds its branch and bound by work,
    so that the plan is the same on any machine; ``time_limit`` is an outer cap, and ``report``
    (a dict, if given) gets ``capped``: whether it stopped HiGHS."""
    import highspy

    report = {} if report is None else report
    report["capped"] = False
    E, C = problem.experts, len(groups)
    if C == 0:
        return None
    space = grouping_space(problem, partition)
    h = _master_model(space)
    if time_limit is not None:
        h.setOptionValue("time_limit", max(0.1, float(time_limit)))
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", max(1, int(nodes)))
    h.setOptionValue("mip_rel_gap", 1e-6)
    _add_columns(h, space, groups, upper=1.0)
    h.changeColsIntegrality(C, np.arange(C, dtype=np.int32), np.full(C, highspy.HighsVarType.kInteger))
    if start is not None:
        keys = {np.packbits(np.isin(np.arange(E), s)).tobytes(): c for c, s in enumerate(groups)}
        col = np.zeros(C)
        for g in np.unique(start):
            c = keys.get(np.packbits(start == g).tobytes())
            if c is not None:
                col[c] = 1.0
        set_start(h, col)
    h.run()
    report["capped"] = h.modelStatusToString(h.getModelStatus()) == "Time limit reached"
    if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
        return None
    x = np.asarray(h.getSolution().col_value)
    chosen = [groups[c] for c in np.flatnonzero(x > 0.5)]
    return _plan_of(problem, chosen)


def _plan_of(problem: Grouping, chosen: list[np.ndarray]) -> np.ndarray | None:
    """A plan from disjoint groups: uncovered experts go where slots and load allow (None if stuck)."""
    E, G = problem.experts, problem.groups
    home = np.full(E, -1, dtype=np.int64)
    for g, s in enumerate(chosen[:G]):
        if (home[s] >= 0).any():
            return None
        home[s] = g
    loads = np.bincount(home[home >= 0], weights=problem.load[home >= 0], minlength=G)
    sizes = np.bincount(home[home >= 0], minlength=G)
    for e in np.flatnonzero(home < 0)[np.argsort(-problem.load[home < 0])]:
        gain = np.bincount(home[home >= 0], weights=problem.graph[e, home >= 0], minlength=G)
        fits = (sizes < problem.cap) & (loads + problem.load[e] <= problem.load_limit + LOAD_TOL)
        if not fits.any():
            return None
        g = int(np.flatnonzero(fits)[np.argmax(gain[fits])])
        home[e] = g
        loads[g] += problem.load[e]
        sizes[g] += 1
    return home if problem.feasible(home) else None
