"""The triangle relaxation of the grouping problem: a pair LP tightened by cutting planes.

One variable per expert pair, ``y[i, j] = 1`` when i and j share a GPU (formulations/tacg.md,
section 8):

    max sum_{i<j} W[i, j] y[i, j]
    s.t. sum_j y[i, j] <= cap - 1               (= when E = G cap: every group is full)
         sum_j w_j y[i, j] <= limit - w_i       (with a load limit)
         y[i, j] + y[i, k] - y[j, k] <= 1       (triangle: colocation is transitive)
         sum_{t in T} y[i, t] - a sum_{t < t' in T} y[t, t'] <= r_a(T)   (star cuts)
         0 <= y <= 1

with ``r_a(T) = max_r (r - a r (r - 1) / 2)`` over the numbers r of T's experts that can share
i's GPU (at most ``cap - 1``, ``|T|`` and what fits i's load limit). Every plan meets all rows,
so the LP value bounds the best affinity from above. There are ``3 C(E, 3)`` triangles: they
and the star cuts are separated from each LP solution (the most violated first) and rows that
went slack are dropped every few rounds.

The bound reported is not the LP value as HiGHS prints it but a Lagrangian bound recomputed
from the LP's row duals in numpy, ``sum_j max(0, c_j - A_j^T l) + sum_r l_r b_r`` (``b_r`` the
row bound on ``l_r``'s side), valid for any multipliers, so solver tolerances or a solve cut
short by the clock cannot make it too small.

The pair model complements column generation (`moeopt.colgen`): the set-partitioning LP
is the stronger relaxation but its pricing is a quadratic knapsack over groups of ``cap``
experts, which stops being exact in time past cap 8; the triangle LP does not grow with cap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from moeopt.grouping import Grouping
from moeopt.solvers.highs_common import highs_threads, new_highs

#: star-cut weights a: 1 is the 2-partition inequality sum y_it - sum y_tt' <= 1; smaller ones
#: act when many of T may share i's GPU
STAR_WEIGHTS = (1.0, 0.5)
#: cuts added per round (the most violated)
TRIANGLES_PER_ROUND = 5000
STARS_PER_ROUND = 1000
#: drop the cuts with slack above this every PURGE_EVERY rounds
PURGE_SLACK = 1e-4
PURGE_EVERY = 3
#: stop when the bound gained less than this (relative) in STALL_ROUNDS rounds
STALL_GAIN = 1e-5
STALL_ROUNDS = 10
VIOLATION = 1e-6
#: cutting rounds (LP solves) at most: the bound's work budget, so that it is the same on any machine
TRIANGLE_ROUNDS = 60
#: HiGHS simplex iterations of one round's LP at most (its work budget)
TRIANGLE_LP_ITERATIONS = 1_000_000


@dataclass
class TriangleResult:
    """The triangle relaxation's outcome.

    Attributes
    ----------
    bound
        Upper bound on the affinity of every plan (the best Lagrangian bound over the rounds).
    lp_value
        The last LP optimum (HiGHS's value, for information).
    rounds
        LP solves.
    cuts
        Cut rows added in all (triangles and stars, before purging).
    converged
        No violated cut was left (the relaxation is solved; more time would not help).
    seconds
        Wall time.
    capped
        Whether the time limit, not the work budget (rounds, LP iterations) or convergence,
        stopped it: the bound is still valid but depends on the machine's speed.
    history
        ``(seconds, bound)`` after every round.
    """

    bound: float
    lp_value: float | None
    rounds: int
    cuts: int
    converged: bool
    seconds: float
    history: list[tuple[float, float]] = field(default_factory=list)
    capped: bool = False

    def record(self) -> dict:
        """The run's numbers as a JSON-ready dict (history left out)."""
        return {
            "bound": self.bound,
            "seconds": self.seconds,
            "converged": self.converged,
            "rounds": self.rounds,
            "cuts": self.cuts,
            "lp_value": self.lp_value,
            "capped": self.capped,
        }


class _PairLP:
    """The pair LP in highspy: its base rows (degree, load) and the cuts of the moment."""

    def __init__(self, problem: Grouping) -> None:
        import highspy

        E, cap = problem.experts, problem.cap
        self.iu, self.ju = np.triu_indices(E, 1)
        n = len(self.iu)
        self.index = np.full((E, E), -1, dtype=np.int64)
        self.index[self.iu, self.ju] = np.arange(n)
        self.index[self.ju, self.iu] = np.arange(n)
        self.cost = problem.graph[self.iu, self.ju].copy()
        self.inf = highspy.kHighsInf
        self.h = new_highs()
        self.timed_out = False  # the last solve stopped at its time limit
        highs_threads(1)
        self.h.setOptionValue("threads", 1)
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        self.h.addVars(n, np.zeros(n), np.ones(n))
        self.h.changeColsCost(n, np.arange(n, dtype=np.int32), self.cost)
        others = ~np.eye(E, dtype=bool)
        rows = self.index[others].reshape(E, E - 1)  # row i: the pairs (i, j), j != i
        full = E == problem.groups * cap  # every group holds exactly cap experts
        self.add(rows, np.ones((E, E - 1)), np.full(E, (cap - 1.0) if full else -self.inf), np.full(E, cap - 1.0))
        if problem.limited:
            vals = np.broadcast_to(problem.load, (E, E))[others].reshape(E, E - 1)
            self.add(rows, vals, np.full(E, -self.inf), problem.load_limit - problem.load)
        self.base = self.h.getNumRow()

    def add(self, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, up: np.ndarray) -> None:
        """Rows of one width: ``cols``/``vals`` ``[m, width]``, bounds ``[m]``."""
        m, width = cols.shape
        if m == 0:
            return
        self.h.addRows(
            m,
            np.asarray(lo, dtype=np.float64),
            np.asarray(up, dtype=np.float64),
            m * width,
            np.arange(0, m * width, width, dtype=np.int32),
            cols.ravel().astype(np.int32),
            vals.ravel().astype(np.float64),
        )

    def solve(
        self, seconds: float | None, iterations: int = TRIANGLE_LP_ITERATIONS
    ) -> tuple[np.ndarray | None, float | None, float | None]:
        """Solve within ``iterations`` simplex iterations (and ``seconds``, None: no limit);
        returns the pair values (None without a solution), the LP value when proved optimal, and
        the Lagrangian bound from the row duals (None without duals)."""
        import highspy

        if seconds is not None:  # HiGHS's time limit counts the object's whole run time, every earlier solve included
            self.h.setOptionValue("time_limit", self.h.getRunTime() + max(float(seconds), 0.01))
        self.h.setOptionValue("simplex_iteration_limit", int(iterations))
        self.h.run()
        status = self.h.getModelStatus()
        self.timed_out = status == highspy.HighsModelStatus.kTimeLimit
        optimal = status == highspy.HighsModelStatus.kOptimal
        sol = self.h.getSolution()
        y = np.asarray(sol.col_value) if sol.value_valid else None
        bound = self._dual_bound(np.asarray(sol.row_dual)) if sol.dual_valid else None
        value = float(self.h.getInfo().objective_function_value) if optimal else None
        return y, value, bound

    def _dual_bound(self, dual: np.ndarray) -> float:
        """``max c y`` over ``lo <= A y <= up, 0 <= y <= 1`` is at most ``sum_j max(0, c_j -
        (A^T l)_j) + sum_r max(l_r up_r, l_r lo_r)`` for every ``l`` (infinite sides dropped by
        clipping l): valid whatever the sign convention or accuracy of the duals, so both signs
        are tried and the smaller kept."""
        lp = self.h.getLp()
        a = lp.a_matrix_
        A = sp.csc_matrix(
            (np.asarray(a.value_), np.asarray(a.index_), np.asarray(a.start_)), shape=(lp.num_row_, lp.num_col_)
        )
        lo, up = np.asarray(lp.row_lower_), np.asarray(lp.row_upper_)
        best = np.inf
        for sign in (1.0, -1.0):
            lam = sign * dual
            lam = np.where((lam > 0) & ~np.isfinite(up), 0.0, lam)
            lam = np.where((lam < 0) & ~np.isfinite(lo), 0.0, lam)
            side = np.where(lam > 0, lam * np.where(np.isfinite(up), up, 0.0), lam * np.where(np.isfinite(lo), lo, 0.0))
            reduced = self.cost - A.T @ lam
            best = min(best, float(np.maximum(reduced, 0.0).sum() + side.sum()))
        return best

    def purge(self, slack: float) -> None:
        """Drop the cut rows (not the base rows) whose activity is ``slack`` below their bound."""
        sol = self.h.getSolution()
        if not sol.value_valid:
            return
        act = np.asarray(sol.row_value)[self.base :]
        up = np.asarray(self.h.getLp().row_upper_)[self.base :]
        drop = np.flatnonzero(up - act > slack) + self.base
        if len(drop):
            self.h.deleteRows(len(drop), drop.astype(np.int32))


def _matrix(lp: _PairLP, y: np.ndarray, experts: int) -> np.ndarray:
    Y = np.zeros((experts, experts))
    Y[lp.iu, lp.ju] = y
    return Y + Y.T


def violated_triangles(Y: np.ndarray, most: int) -> np.ndarray:
    """int ``[m, 3]`` rows ``(i, j, k)`` with ``Y[i,j] + Y[i,k] - Y[j,k] > 1``, most violated first."""
    E = len(Y)
    found, score = [], []
    for i in range(E):
        V = Y[i][:, None] + Y[i][None, :] - Y - 1.0
        V[i, :] = V[:, i] = -1.0
        a, b = np.nonzero(np.triu(V, 1) > VIOLATION)
        if len(a):
            found.append(np.stack([np.full(len(a), i), a, b], axis=1))
            score.append(V[a, b])
    if not found:
        return np.zeros((0, 3), dtype=np.int64)
    tri, viol = np.concatenate(found), np.concatenate(score)
    return tri[np.argsort(-viol, kind="stable")[:most]]


def star_rhs(weight: float, members: int) -> float:
    """``max_r (r - weight r (r - 1) / 2)`` over ``r = 0 .. members``."""
    r = np.arange(members + 1)
    return float((r - weight * r * (r - 1) / 2).max())


def violated_stars(Y: np.ndarray, problem: Grouping, weights: tuple[float, ...], most: int) -> list[tuple]:
    """Star cuts ``(i, T, weight, rhs)`` violated by ``Y``, most violated first: T grown greedily
    from i's partners by ``Y[i, t] - weight * sum_{t' in T} Y[t, t']``."""
    E, cap = problem.experts, problem.cap
    cuts = []
    order = np.argsort(-Y, axis=1, kind="stable")
    for weight in weights:
        for i in range(E):
            members: list[int] = []
            pull = np.zeros(E)
            for t in order[i]:
                if Y[i, t] <= VIOLATION:
                    break
                if t != i and Y[i, t] - pull[t] > VIOLATION:
                    members.append(int(t))
                    pull += weight * Y[:, t]
            if len(members) < 2:
                continue
            T = np.array(members)
            lhs = Y[i, T].sum() - weight * np.triu(Y[np.ix_(T, T)], 1).sum()
            r = min(len(T), cap - 1)
            if problem.limited:  # the most of T that fit beside i under the load limit
                room = problem.load_limit - problem.load[i]
                r = min(r, int(np.searchsorted(np.cumsum(np.sort(problem.load[T])), room + 1e-12, side="right")))
            rhs = star_rhs(weight, r)
            if lhs > rhs + VIOLATION:
                cuts.append((lhs - rhs, i, T, weight, rhs))
    cuts.sort(key=lambda c: -c[0])
    return [c[1:] for c in cuts[:most]]


def triangle_bound(
    problem: Grouping,
    seconds: float | None = None,
    *,
    rounds: int = TRIANGLE_ROUNDS,
    weights: tuple[float, ...] = STAR_WEIGHTS,
    say: Callable[[str], None] | None = None,
) -> TriangleResult:
    """Upper bound on the affinity of every plan by the triangle relaxation with cutting planes.

    Parameters
    ----------
    problem
        The grouping problem (E experts, G groups of at most ``cap``, optional load limit).
    seconds
        Outer wall-clock cap (None: none); the best bound so far is returned when it runs out
        (``capped``).
    rounds
        Cutting rounds at most (each LP within `TRIANGLE_LP_ITERATIONS`): the work budget,
        so that the bound is the same on any machine.
    weights
        Star-cut weights (empty: triangles only).
    say
        Progress lines (one per round), or None.

    Returns
    -------
    TriangleResult
        The bound (valid at every round) and the run's record.
    """
    t0 = time.perf_counter()
    E = problem.experts
    total = float(np.triu(problem.graph, 1).sum())
    if problem.cap < 2 or E < 2:  # no two experts share a GPU: no affinity at all
        return TriangleResult(0.0, 0.0, 0, 0, True, time.perf_counter() - t0, [(0.0, 0.0)])
    lp = _PairLP(problem)
    budget = rounds
    bound, value, rounds, cuts, converged, capped = total, None, 0, 0, False, False
    history: list[tuple[float, float]] = []
    while rounds < budget:
        left = None if seconds is None else seconds - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            capped = True
            break
        y, lp_value, dual_bound = lp.solve(left)
        capped = lp.timed_out
        rounds += 1
        if dual_bound is not None:
            bound = min(bound, dual_bound)
        value = lp_value if lp_value is not None else value
        history.append((time.perf_counter() - t0, bound))
        if say is not None:
            say(f"triangle round {rounds}: bound {bound:.6g}, {lp.h.getNumRow() - lp.base} cuts")
        if y is None or lp_value is None:  # the LP's limits stopped it: keep the bound so far
            break
        if len(history) > STALL_ROUNDS and history[-STALL_ROUNDS - 1][1] - bound <= STALL_GAIN * abs(bound):
            break
        if rounds % PURGE_EVERY == 0:
            lp.purge(PURGE_SLACK)
        Y = _matrix(lp, y, E)
        tri = violated_triangles(Y, TRIANGLES_PER_ROUND)
        if len(tri):
            i, j, k = tri.T
            cols = np.stack([lp.index[i, j], lp.index[i, k], lp.index[j, k]], axis=1)
            lp.add(cols, np.tile([1.0, 1.0, -1.0], (len(tri), 1)), np.full(len(tri), -lp.inf), np.ones(len(tri)))
        stars = violated_stars(Y, problem, weights, STARS_PER_ROUND) if weights else []
        for i, T, weight, rhs in stars:
            a, b = np.triu_indices(len(T), 1)
            cols = np.concatenate([lp.index[i, T], lp.index[T[a], T[b]]])[None, :]
            vals = np.concatenate([np.ones(len(T)), np.full(len(a), -weight)])[None, :]
            lp.add(cols, vals, np.array([-lp.inf]), np.array([rhs]))
        cuts += len(tri) + len(stars)
        if not len(tri) and not stars:
            converged = True
            break
    return TriangleResult(bound, value, rounds, cuts, converged, time.perf_counter() - t0, history, capped)
