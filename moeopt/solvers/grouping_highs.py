"""The grouping MILP built directly with highspy's array API (formulations/tacg.md, section 4).

Columns: binaries ``x[e, k]`` (index ``e G + k``; fixed to 0 for ``k > e`` by symmetry
breaking) and same-group pair variables ``y[p, k]`` in [0, 1] (index ``E G + p G + k``) for
each pair p = (i, j) with positive affinity. Rows: assignment, slots, load limit, the pair
linearization ``y[p, k] <= x[i, k]``, ``y[p, k] <= x[j, k]``, star cuts (``cap - 1``
partners, load of partners within ``L - w[e]``) and value precedence
``x[e, k] <= sum_{e' < e} x[e', k-1]``. The matrix is assembled with numpy in one go.
`moeopt.solvers.grouping_milp` states the same model algebraically in Pyomo.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from moeopt.grouping import Grouping, pairs
from moeopt.outcome import ExactOutcome
from moeopt.result import highs_termination
from moeopt.solvers import HIGHSPY, ExactSettings
from moeopt.solvers import available as solver_available
from moeopt.solvers.highs_common import (  # noqa: F401  (estimate_nonzeros: public here before)
    GROUPING_OPTIONS,
    estimate_nonzeros,
    highs_milp,
    highs_threads,
    refuse_large,
    run_highs,
    set_start,
)

#: matrix nonzeros per second of time limit before refusing: the array build runs at about
#: 2.3M/s, but HiGHS needs time for the root LP of a model that size
NONZEROS_PER_SECOND = 500_000


def available() -> bool:
    """Whether highspy can be used."""
    return solver_available(HIGHSPY)


@dataclass
class MilpArrays:
    """The MILP of a grouping in arrays: ``max c^T v`` s.t. ``row_lo <= A v <= row_hi``."""

    cost: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integer: np.ndarray  # bool per column
    matrix: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    pair_i: np.ndarray
    pair_j: np.ndarray

    @property
    def nonzeros(self) -> int:
        return int(self.matrix.nnz)

    def point(self, home: np.ndarray, groups: int) -> np.ndarray:
        """Column values of the plan ``home`` (x one-hot, y = same group)."""
        E = len(home)
        x = np.zeros((E, groups))
        x[np.arange(E), home] = 1.0
        y = x[self.pair_i] * x[self.pair_j]
        return np.concatenate([x.ravel(), y.ravel()])


def check_size(g: Grouping, time_limit: float) -> None:
    """Refuse (InputError) models too large to build and search within ``time_limit``."""
    refuse_large(g, time_limit, "tacg-highs", NONZEROS_PER_SECOND)


def build_arrays(g: Grouping) -> MilpArrays:
    """Assemble the MILP of ``g`` as sparse arrays (vectorized, no loop over pairs)."""
    E, G, cap = g.experts, g.groups, g.cap
    pi, pj, pw = pairs(g.graph)
    P = len(pi)
    nx = E * G
    ncol = nx + P * G
    X = np.arange(nx).reshape(E, G)
    Y = nx + np.arange(P * G).reshape(P, G)
    cost = np.concatenate([np.zeros(nx), np.repeat(pw, G)])
    col_lo = np.zeros(ncol)
    col_hi = np.ones(ncol)
    ee, kk = np.meshgrid(np.arange(E), np.arange(G), indexing="ij")
    col_hi[X[kk > ee]] = 0.0  # symmetry breaking: expert e uses groups 0..e
    integer = np.zeros(ncol, dtype=bool)
    integer[:nx] = True
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    n = 0

    def block(
        r: np.ndarray, c: np.ndarray, v: np.ndarray, nrows: int, rlo: float | np.ndarray, rhi: float | np.ndarray
    ) -> None:
        nonlocal n
        rows.append(n + r.ravel())
        cols.append(c.ravel())
        vals.append(np.broadcast_to(v, r.shape).ravel().astype(np.float64))
        lo.append(np.broadcast_to(np.asarray(rlo, dtype=np.float64), (nrows,)))
        hi.append(np.broadcast_to(np.asarray(rhi, dtype=np.float64), (nrows,)))
        n += nrows

    # assignment: sum_k x[e, k] = 1
    block(np.repeat(np.arange(E), G), X.ravel(), np.ones(nx), E, 1.0, 1.0)
    # slots: sum_e x[e, k] <= cap
    block(np.tile(np.arange(G), E), X.ravel(), np.ones(nx), G, -np.inf, float(cap))
    if g.limited:
        block(np.tile(np.arange(G), E), X.ravel(), np.repeat(g.load, G), G, -np.inf, g.load_limit)
    if P:
        # pair linearization: y[p, k] - x[i, k] <= 0 and y[p, k] - x[j, k] <= 0
        r = np.arange(P * G)
        for end in (pi, pj):
            block(
                np.concatenate([r, r]),
                np.concatenate([Y.ravel(), X[end].ravel()]),
                np.concatenate([np.ones(P * G), -np.ones(P * G)]),
                P * G,
                -np.inf,
                0.0,
            )
        # star cuts per (e, k): sum_{p ni e} y[p, k] <= (cap - 1) x[e, k]
        ends = np.concatenate([pi, pj])
        other = np.concatenate([pj, pi])
        pp = np.concatenate([np.arange(P), np.arange(P)])
        star_r = (ends[:, None] * G + np.arange(G)[None, :]).ravel()
        star_c = Y[pp].ravel()
        block(
            np.concatenate([star_r, np.arange(nx)]),
            np.concatenate([star_c, X.ravel()]),
            np.concatenate([np.ones(len(star_r)), np.full(nx, -(cap - 1.0))]),
            nx,
            -np.inf,
            0.0,
        )
        if g.limited:
            # sum_{p ni e} w[other] y[p, k] <= (L - w[e]) x[e, k]
            wv = np.repeat(g.load[other], G)
            block(
                np.concatenate([star_r, np.arange(nx)]),
                np.concatenate([star_c, X.ravel()]),
                np.concatenate([wv, -np.repeat(g.load_limit - g.load, G)]),
                nx,
                -np.inf,
                0.0,
            )
    # value precedence: x[e, k] - sum_{k-1 <= f < e} x[f, k-1] <= 0 for 1 <= k <= e
    ek = np.argwhere((kk >= 1) & (kk <= ee))
    if len(ek):
        e_, k_ = ek[:, 0], ek[:, 1]
        cnt = e_ - k_ + 1  # f in k-1 .. e-1
        r = np.repeat(np.arange(len(ek)), cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        f = np.repeat(k_ - 1, cnt) + (np.arange(cnt.sum()) - start)
        block(
            np.concatenate([np.arange(len(ek)), r]),
            np.concatenate([X[e_, k_], X[f, np.repeat(k_ - 1, cnt)]]),
            np.concatenate([np.ones(len(ek)), -np.ones(len(r))]),
            len(ek),
            -np.inf,
            0.0,
        )
    matrix = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, ncol))
    return MilpArrays(cost, col_lo, col_hi, integer, matrix, np.concatenate(lo), np.concatenate(hi), pi, pj)


def build_model(g: Grouping, arrays: MilpArrays | None = None) -> Any:
    """A ``highspy.Highs`` object holding the MILP of ``g`` (not solved)."""
    a = arrays or build_arrays(g)
    return highs_milp(a.cost, a.col_lo, a.col_hi, a.matrix, a.row_lo, a.row_hi, a.integer, maximize=True)


def solve(g: Grouping, settings: ExactSettings) -> ExactOutcome:
    """Solve ``g`` with HiGHS through highspy under ``settings`` (`ExactSettings`)."""
    time_limit, hint = settings.time_limit, settings.hint
    if settings.refuse:
        check_size(g, time_limit)
    t0 = time.perf_counter()
    arrays = build_arrays(g)
    h = build_model(g, arrays)
    build = time.perf_counter() - t0
    h.setOptionValue("output_flag", settings.log)
    h.setOptionValue("time_limit", max(0.1, time_limit - build))
    h.setOptionValue("threads", highs_threads(settings.threads))
    h.setOptionValue("random_seed", settings.seed)
    for option, value in GROUPING_OPTIONS.items():
        h.setOptionValue(option, value)
    warm = hint is not None and set_start(h, arrays.point(g.canonical(hint), g.groups))
    h = run_highs(h)  # h, or its answer read where it ran
    model_status = h.getModelStatus()
    info = h.getInfo()
    bound = float(info.mip_dual_bound)
    home = None
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value[: g.experts * g.groups]).reshape(g.experts, g.groups)
        home = x.argmax(axis=1).astype(np.int64)
    return ExactOutcome.from_termination(
        highs_termination(model_status.name),
        home=home,
        incumbent=float(info.objective_function_value),
        bound=bound if np.isfinite(bound) else None,
        wall_time=time.perf_counter() - t0,
        build_time=build,
        solver_status=h.modelStatusToString(model_status),
        warm_start=warm,
        info={"nonzeros": arrays.nonzeros},
    )
