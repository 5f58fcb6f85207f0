"""The capacity-constrained grouping problem of one layer (SPEC section 3.3).

Partition E experts into G groups (GPUs) of at most ``cap`` experts, each group's load
``sum_{e in g} w[e]`` at most ``load_limit``, maximizing the intra-group affinity
``sum_g sum_{e < e' in g} W[e, e']``. Every heuristic, exact model and bound of TACG works on a
`Grouping`; the objective here is the one [`moeopt.evaluate.grouping_affinity`][]
recomputes on the final plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moeopt.errors import InfeasibleError

#: Absolute slack on the load limit (loads sum to 1): exact backends work with rounded
#: (CP-SAT) or tolerance-checked (HiGHS, 1e-7) loads; every plan is checked against it.
LOAD_TOL = 1e-6
#: The automatic load limit (``eps_load`` unset) sits this factor above the least
#: largest-GPU load any slot-feasible plan can reach.
AUTO_LOAD_SLACK = 1.1


def min_max_load(load: np.ndarray, groups: int, cap: int) -> float:
    """A lower bound on the largest group load of any slot-feasible plan.

    The group holding expert e holds at least ``s = max(1, E - (G-1) cap)`` experts, so it
    carries at least ``w[e]`` plus the ``s - 1`` smallest other loads; some group also
    carries at least the mean ``sum(w) / G``.
    """
    w = np.asarray(load, dtype=np.float64)
    s = max(1, len(w) - (groups - 1) * cap)
    best = w.sum() / groups
    if s > 1:
        srt = np.sort(w)
        small = srt[: s - 1].sum()
        # if e is among the s-1 smallest, the next smallest replaces it
        per = w + np.where(w <= srt[s - 2], small - w + srt[s - 1], small)
        return max(best, float(per.max()))
    return max(best, float(w.max()))


def auto_eps_load(load: np.ndarray, groups: int, cap: int) -> float:
    """A layer's automatic ``eps_load``: ``AUTO_LOAD_SLACK`` times the least reachable
    largest-GPU load, as a fraction above the mean (the default of tacg, hypergraph, metis)."""
    total = float(np.sum(load))
    if total <= 0:
        return 0.0
    return AUTO_LOAD_SLACK * min_max_load(load, groups, cap) * groups / total - 1.0


@dataclass(frozen=True, eq=False)
class Grouping:
    """One layer's grouping problem.

    Attributes
    ----------
    graph
        float ``[E, E]`` symmetric, non-negative affinity W (Ã of SPEC 3.2), zero diagonal.
    load
        float ``[E]`` expert loads w (ubar[l], summing to 1).
    groups
        G, the number of groups (GPUs).
    cap
        slots per group.
    load_limit
        the largest load a group may carry, ``(1 + eps_load) / G``; ``inf`` for none.
    """

    graph: np.ndarray
    load: np.ndarray
    groups: int
    cap: int
    load_limit: float = math.inf

    def __post_init__(self) -> None:
        W = np.asarray(self.graph, dtype=np.float64)
        if W.ndim != 2 or W.shape[0] != W.shape[1]:
            raise ValueError(f"graph must be square, got shape {W.shape}")
        if (W < 0).any():
            raise ValueError("graph must be non-negative")
        W = 0.5 * (W + W.T)
        np.fill_diagonal(W, 0.0)
        object.__setattr__(self, "graph", W)
        object.__setattr__(self, "load", np.asarray(self.load, dtype=np.float64).reshape(-1))
        if len(self.load) != W.shape[0]:
            raise ValueError("load needs one entry per expert")

    @property
    def experts(self) -> int:
        return int(self.graph.shape[0])

    @property
    def limited(self) -> bool:
        """Whether the load limit can bind at all."""
        return bool(np.isfinite(self.load_limit)) and self.load_limit < self.load.sum() + LOAD_TOL

    def replace(self, **changes: Any) -> Grouping:
        return replace(self, **changes)

    def objective(self, home: np.ndarray) -> float:
        """Intra-group affinity of ``home`` (same formula as ``evaluate.grouping_affinity``)."""
        same = home[:, None] == home[None, :]
        return float(np.triu(self.graph * same, k=1).sum())

    def group_loads(self, home: np.ndarray) -> np.ndarray:
        return np.bincount(home, weights=self.load, minlength=self.groups)

    def group_sizes(self, home: np.ndarray) -> np.ndarray:
        return np.bincount(home, minlength=self.groups)

    def violations(self, home: np.ndarray) -> list[str]:
        """What ``home`` breaks (empty when feasible)."""
        home = np.asarray(home)
        out = []
        if home.shape != (self.experts,) or home.min() < 0 or home.max() >= self.groups:
            return [f"home must be {self.experts} ids in [0, {self.groups})"]
        sizes = self.group_sizes(home)
        if (sizes > self.cap).any():
            g = int(sizes.argmax())
            out.append(f"group {g} holds {sizes[g]} experts > cap {self.cap}")
        loads = self.group_loads(home)
        if (loads > self.load_limit + LOAD_TOL).any():
            g = int(loads.argmax())
            out.append(f"group {g} carries load {loads[g]:.6g} > limit {self.load_limit:.6g}")
        return out

    def feasible(self, home: np.ndarray) -> bool:
        return not self.violations(home)

    def min_max_load(self) -> float:
        """A lower bound on the largest group load of any slot-feasible plan (`min_max_load`)."""
        return min_max_load(self.load, self.groups, self.cap)

    def check_load_limit(self, eps_load: float | None = None) -> None:
        """Raise `InfeasibleError` when no plan can meet the load limit."""
        need = self.min_max_load()
        if need > self.load_limit + LOAD_TOL:
            eps_min = need * self.groups - 1.0
            given = "" if eps_load is None else f"eps_load={eps_load:g}: "
            raise InfeasibleError(
                f"infeasible: {given}load limit (1+eps_load)/G = {self.load_limit:.6g} is below "
                f"{need:.6g}, the least largest-group load any plan can reach (hottest expert "
                f"load {self.load.max():.6g}, {self.cap} slots per GPU); use eps_load >= {eps_min:.4g}"
            )

    def canonical(self, home: np.ndarray) -> np.ndarray:
        """Renumber groups by their smallest expert (empty groups last).

        The result satisfies the symmetry breaking of every exact model
        (``x[e, g] <= sum_{e' < e} x[e', g-1]``): CP-SAT ignores hints that violate it.
        """
        home = np.asarray(home, dtype=np.int64)
        first = np.full(self.groups, self.experts, dtype=np.int64)
        np.minimum.at(first, home, np.arange(self.experts))
        order = np.argsort(first, kind="stable")
        rank = np.empty(self.groups, dtype=np.int64)
        rank[order] = np.arange(self.groups)
        return rank[home]


def pairs(graph: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index arrays ``(i, j, weight)`` of the pairs i < j with positive affinity."""
    i, j = np.nonzero(np.triu(graph, k=1) > 0)
    return i, j, graph[i, j]
