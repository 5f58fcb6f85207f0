"""Exact certificate for the replication step (SPEC section 4, formulations/gesr.md).

For one layer with fixed home GPUs, per-expert loads ``w[e]`` and ``S`` replica slots per
GPU, the MILP

    min z  s.t.  sum_g x[e, g] = w[e],  x[e, g] <= w[e] y[e, g]  (g != home(e)),
                 sum_e y[e, g] <= S,     sum_e x[e, g] <= z,     y binary, x >= 0

chooses which experts to copy where (binary ``y``) and how to split each expert's tokens
among its copies (continuous ``x``). Its optimum ``z*`` is the lowest maximum GPU load any
replica choice within the budget can reach, even with a perfect (fractional) token split, so
``z* / mean - 1`` is a lower bound on the MaxVio of every plan with those homes and that
budget: the guard's integral, online split can only do worse. `build_model` returns
the arrays, `solve_replication_bound` hands them to HiGHS (highspy's array API) and
reads the proved bound, so a time limit still leaves a valid lower bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from moeopt.result import Status, Termination, highs_termination
from moeopt.solvers.highs_common import highs_milp, highs_threads, run_highs, set_start

#: share of the time limit spent looking for a plan that reaches the count bound exactly
FEASIBILITY_SHARE = 0.5

#: what a HiGHS ending holds: optimal, a plan stopped early, proved infeasible, else an error
_STATUS_OF = {
    Termination.OPTIMAL: Status.OPTIMAL,
    Termination.TIME_LIMIT: Status.TIME_LIMIT,
    Termination.ITERATION_LIMIT: Status.TIME_LIMIT,
    Termination.INTERRUPTED: Status.TIME_LIMIT,
    Termination.INFEASIBLE: Status.INFEASIBLE,
}


@dataclass(frozen=True)
class ReplicationModel:
    """Arrays of the replication MILP of one layer, loads normalized by their mean.

    Columns: ``z``, then ``x[p]`` and ``y[p]`` for every candidate pair ``p = (expert, gpu)``
    with ``gpu != home(expert)`` and a positive load. Rows: load of every GPU minus ``z``
    (<= 0), home share of every expert (>= 0), linking ``x[p] - w y[p] <= 0`` and slots.
    """

    pairs: np.ndarray  # int [P, 2] (expert, gpu)
    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integrality: np.ndarray
    matrix: sp.csc_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    mean: float


def build_model(home: np.ndarray, load: np.ndarray, gpus: int, slots: int) -> ReplicationModel:
    """The replication MILP of one layer (vectorized; no loop over pairs).

    Parameters
    ----------
    home
        int ``[E]`` home GPU of each expert.
    load
        float ``[E]`` token-slots routed to each expert, ``w``.
    gpus
        G.
    slots
        S, replica slots per GPU.

    Returns
    -------
    ReplicationModel
    """
    home = np.asarray(home, dtype=np.int64)
    load = np.asarray(load, dtype=np.float64)
    E = len(load)
    mean = float(load.sum()) / gpus
    w = load / mean if mean > 0 else load.copy()
    ee, gg = np.meshgrid(np.arange(E), np.arange(gpus), indexing="ij")
    keep = (gg != home[:, None]) & (w[:, None] > 0) & (slots > 0)
    pairs = np.stack([ee[keep], gg[keep]], axis=1)
    P = len(pairs)
    pe, pg = pairs[:, 0], pairs[:, 1]
    x_col, y_col = 1 + np.arange(P), 1 + P + np.arange(P)
    n_col = 1 + 2 * P
    home_load = np.bincount(home, weights=w, minlength=gpus)
    # rows 0..G-1: load_g - z <= -home_load_g  (written as home_load + inflow - outflow <= z)
    r_load = np.arange(gpus)
    rows = [r_load, pg, home[pe]]
    cols = [np.zeros(gpus, dtype=np.int64), x_col, x_col]
    vals = [-np.ones(gpus), np.ones(P), -np.ones(P)]
    # rows G..G+E-1: outflow of expert e <= w[e]
    rows.append(gpus + pe)
    cols.append(x_col)
    vals.append(np.ones(P))
    # linking rows: x[p] - w[e] y[p] <= 0
    r_link = gpus + E + np.arange(P)
    rows += [r_link, r_link]
    cols += [x_col, y_col]
    vals += [np.ones(P), -w[pe]]
    # slot rows: sum_e y[e, g] <= S
    rows.append(gpus + E + P + pg)
    cols.append(y_col)
    vals.append(np.ones(P))
    n_row = gpus + E + P + gpus
    matrix = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_row, n_col))
    row_upper = np.concatenate([-home_load, w, np.zeros(P), np.full(gpus, float(slots))])
    row_lower = np.full(n_row, -np.inf)
    cost = np.zeros(n_col)
    cost[0] = 1.0
    col_lower = np.zeros(n_col)
    col_upper = np.concatenate([[np.inf], w[pe], np.ones(P)])
    integrality = np.concatenate([np.zeros(1 + P, dtype=np.int64), np.ones(P, dtype=np.int64)])
    return ReplicationModel(pairs, cost, col_lower, col_upper, integrality, matrix, row_lower, row_upper, mean)


@dataclass(frozen=True)
class ReplicationBound:
    """Outcome of the certificate for one layer, in MaxVio units (``max / mean - 1``)."""

    status: Status
    bound: float  # proved lower bound on the MaxVio of any replica choice
    best: float | None  # MaxVio of the best replica choice found (with its optimal split)
    replicas: np.ndarray  # int [R, 2] (expert, gpu) of that choice
    wall_time: float

    @property
    def gap(self) -> float | None:
        return None if self.best is None else max(self.best - self.bound, 0.0)


def solve_replication_bound(
    home: np.ndarray,
    load: np.ndarray,
    gpus: int,
    slots: int,
    *,
    time_limit: float = 10.0,
    hint: np.ndarray | None = None,
    threads: int = 1,
) -> ReplicationBound:
    """Lowest MaxVio any replica choice within ``slots`` per GPU can reach (HiGHS MILP).

    Parameters
    ----------
    home, load, gpus, slots
        As in `build_model`.
    time_limit
        Seconds for HiGHS; at the limit the proved dual bound is returned (still valid).
    hint
        optional int ``[R, 2]`` replicas ``(expert, gpu)`` of a known plan (e.g. GESR's):
        its optimal split is passed to HiGHS as a starting incumbent.
    threads
        HiGHS threads.

    Returns
    -------
    ReplicationBound
    """
    t0 = time.perf_counter()
    load = np.asarray(load, dtype=np.float64)
    home = np.asarray(home, dtype=np.int64)
    if load.sum() <= 0:
        return ReplicationBound(Status.OPTIMAL, 0.0, 0.0, np.zeros((0, 2), np.int64), 0.0)
    m = build_model(home, load, gpus, slots)
    P = len(m.pairs)
    if P == 0:  # no replica can be placed: the base plan's MaxVio is the answer
        vio = float(np.bincount(home, weights=load, minlength=gpus).max() / m.mean - 1.0)
        return ReplicationBound(Status.OPTIMAL, vio, vio, np.zeros((0, 2), np.int64), time.perf_counter() - t0)
    # incumbent: the better of the hint and a load-balancing greedy, each split optimally;
    # when it reaches z = mean (MaxVio 0) it is optimal and HiGHS is not needed
    starts = [balancing_replicas(home, load, gpus, slots)]
    if hint is not None and len(hint):
        starts.append(np.asarray(hint, dtype=np.int64).reshape(-1, 2))
    cols = [c for c in (_hint_solution(m, home, load, gpus, r) for r in starts) if c is not None]
    best_col = min(cols, key=lambda c: c[0]) if cols else None
    if best_col is not None and best_col[0] <= 1.0 + 1e-9:
        reps = m.pairs[best_col[1 + P :] > 0.5]
        return ReplicationBound(Status.OPTIMAL, 0.0, max(best_col[0] - 1.0, 0.0), reps, time.perf_counter() - t0)
    # the count bound (normalized) as the lower bound of z: the LP relaxation alone says mean
    z_floor = replica_count_bound(home, load / m.mean, gpus, slots)
    if best_col is not None and best_col[0] <= z_floor * (1 + 1e-9):
        reps = m.pairs[best_col[1 + P :] > 0.5]
        return ReplicationBound(
            Status.OPTIMAL,
            max(z_floor - 1.0, 0.0),
            max(best_col[0] - 1.0, 0.0),
            reps,
            time.perf_counter() - t0,
        )
    # first a pure feasibility model at z = z_floor (no objective): HiGHS finds a plan that
    # reaches the floor much faster this way than by minimizing z, and such a plan is optimal
    at_floor = replace(
        m,
        cost=np.zeros_like(m.cost),
        col_upper=np.concatenate([[z_floor * (1 + 1e-7)], m.col_upper[1:]]),
    )
    _, _, col = _run_highs(at_floor, z_floor, None, FEASIBILITY_SHARE * time_limit, threads)
    if col is not None:
        reps = m.pairs[col[1 + P :] > 0.5]
        best = float(optimal_split_maxvio(home, reps, load, gpus))
        return ReplicationBound(Status.OPTIMAL, max(z_floor - 1.0, 0.0), best, reps, time.perf_counter() - t0)
    remaining = time_limit - (time.perf_counter() - t0)
    status, bound, col = _run_highs(m, z_floor, best_col, remaining, threads)
    found: float | None = None
    reps = np.zeros((0, 2), np.int64)
    if col is not None:
        reps = m.pairs[col[1 + P :] > 0.5]
        found = float(optimal_split_maxvio(home, reps, load, gpus))
    # z >= z_floor >= mean always holds, whatever HiGHS reports
    bound = max(bound if np.isfinite(bound) else z_floor, z_floor) - 1.0
    bound = max(bound, 0.0)
    return ReplicationBound(status, bound, found, reps, time.perf_counter() - t0)


def _run_highs(
    m: ReplicationModel, z_floor: float, start: np.ndarray | None, time_limit: float, threads: int
) -> tuple[Status, float, np.ndarray | None]:
    """Solve a replication model with HiGHS: (status, proved bound on z, column values)."""
    col_lower = np.concatenate([[z_floor], m.col_lower[1:]])
    h = highs_milp(m.cost, col_lower, m.col_upper, m.matrix, m.row_lower, m.row_upper, m.integrality)
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("threads", highs_threads(threads))
    h.setOptionValue("mip_rel_gap", 1e-6)
    if start is not None:
        set_start(h, start)
    h = run_highs(h)  # h, or its answer read where it ran
    status = _STATUS_OF.get(highs_termination(h.getModelStatus().name), Status.ERROR)
    info = h.getInfo()
    col = None
    if info.primal_solution_status >= 2 or status is Status.OPTIMAL:
        col = np.asarray(h.getSolution().col_value)
    return status, float(info.mip_dual_bound), col


def replica_count_bound(home: np.ndarray, load: np.ndarray, gpus: int, slots: int) -> float:
    """A combinatorial lower bound on the optimal maximum load ``z*`` (same units as ``load``).

    To get from its home load ``H_g`` down to z, GPU g must copy at least ``n_g(z)`` distinct
    experts of its own, the fewest whose loads sum to ``H_g - z`` (a copy of e moves at most
    ``w[e]`` off g, whatever the number of copies); every copy needs a replica slot, so
    ``sum_g n_g(z) <= G S``. The least z passing this count (bisection; the count only falls
    as z grows) bounds ``z*`` from below, and is at least the mean.
    """
    home = np.asarray(home, dtype=np.int64)
    w = np.asarray(load, dtype=np.float64)
    base = np.bincount(home, weights=w, minlength=gpus)
    lo, hi = w.sum() / gpus, float(base.max())
    order = np.lexsort((-w, home))  # by GPU, heaviest first
    sorted_w = w[order]
    start = np.searchsorted(home[order], np.arange(gpus))
    csum = np.cumsum(sorted_w)
    before = np.where(start > 0, csum[np.maximum(start - 1, 0)], 0.0)

    def needed(z: float) -> int:
        total = 0
        for g in np.nonzero(base > z * (1 + 1e-12))[0]:
            own = csum[start[g] : start[g] + np.count_nonzero(home == g)] - before[g]
            total += int(np.searchsorted(own, base[g] - z)) + 1
        return total

    if needed(lo) <= gpus * slots:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if needed(mid) <= gpus * slots:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    return lo


def balancing_replicas(home: np.ndarray, load: np.ndarray, gpus: int, slots: int) -> np.ndarray:
    """A good replica choice for the certificate's incumbent (not GESR: no structure used).

    Bisection on a target maximum load z; for a given z, every GPU above z sheds its excess
    through copies of its heaviest experts onto the GPUs with the most room below z (a free
    replica slot, no copy yet). Returns the replicas ``[R, 2]`` of the lowest z that worked.
    """
    home = np.asarray(home, dtype=np.int64)
    w = np.asarray(load, dtype=np.float64)
    base = np.bincount(home, weights=w, minlength=gpus)
    lo, hi = w.sum() / gpus, float(base.max())
    best = np.zeros((0, 2), dtype=np.int64)
    for it in range(40):
        z = lo if it == 0 else (lo + hi) / 2
        reps = _shed_to(z, home, w, base, gpus, slots)
        if reps is None:
            reps = _pour_to(z, home, w, base, gpus, slots)
        if reps is not None:
            best, hi = reps, z
        elif it:
            lo = z
        if hi - lo <= 1e-6 * max(hi, 1e-12):
            break
    return best


def _shed_to(z: float, home: np.ndarray, w: np.ndarray, base: np.ndarray, gpus: int, slots: int) -> np.ndarray | None:
    """Replicas bringing every GPU to at most ``z`` by greedy shedding, or None."""
    gpu_load = base.copy()
    at_home = w.copy()
    free = np.full(gpus, slots)
    has = np.zeros((len(w), gpus), dtype=bool)
    has[np.arange(len(w)), home] = True
    reps: list[tuple[int, int]] = []
    tol = 1e-9 * max(z, 1e-12)
    for src in np.argsort(-base, kind="stable"):
        mine = np.nonzero(home == src)[0]
        while gpu_load[src] > z + tol:
            # the copy moving the most load: every replica slot is scarce
            room = np.where((free[None, :] > 0) & ~has[mine], z - gpu_load[None, :], 0.0)
            move = np.minimum(np.minimum(at_home[mine][:, None], room), gpu_load[src] - z)
            i, dst = np.unravel_index(int(np.argmax(move)), move.shape)
            t = move[i, dst]
            if t <= tol:
                return None
            e = mine[i]
            at_home[e] -= t
            gpu_load[src] -= t
            gpu_load[dst] += t
            free[dst] -= 1
            has[e, dst] = True
            reps.append((int(e), int(dst)))
    return np.array(reps, dtype=np.int64).reshape(-1, 2)


def _pour_to(z: float, home: np.ndarray, w: np.ndarray, base: np.ndarray, gpus: int, slots: int) -> np.ndarray | None:
    """Replicas bringing every GPU to at most ``z`` by pouring, or None.

    McNaughton's wrap-around: the excess of the GPUs above z (largest first) is poured into
    the room of the GPUs below z (largest room first), receiver after receiver, each chunk
    a copy of the donor's heaviest expert with load left at home and no copy there yet.
    """
    gpu_load = base.copy()
    at_home = w.copy()
    free = np.full(gpus, slots)
    has = np.zeros((len(w), gpus), dtype=bool)
    has[np.arange(len(w)), home] = True
    tol = 1e-9 * max(z, 1e-12)
    receivers = [int(g) for g in np.argsort(base, kind="stable") if base[g] < z - tol]
    reps: list[tuple[int, int]] = []
    ri = 0
    for d in np.argsort(-base, kind="stable"):
        if base[d] <= z + tol:
            break
        own = np.nonzero(home == d)[0]
        own = own[np.argsort(-w[own], kind="stable")]
        while gpu_load[d] > z + tol:
            while ri < len(receivers) and (free[receivers[ri]] == 0 or gpu_load[receivers[ri]] >= z - tol):
                ri += 1
            if ri == len(receivers):
                return None
            r = receivers[ri]
            usable = own[(at_home[own] > tol) & ~has[own, r]]
            if not len(usable):
                return None
            e = int(usable[0])
            t = min(at_home[e], z - gpu_load[r], gpu_load[d] - z)
            at_home[e] -= t
            gpu_load[d] -= t
            gpu_load[r] += t
            free[r] -= 1
            has[e, r] = True
            reps.append((e, r))
    return np.array(reps, dtype=np.int64).reshape(-1, 2)


def _hint_solution(
    m: ReplicationModel, home: np.ndarray, load: np.ndarray, gpus: int, reps: np.ndarray
) -> np.ndarray | None:
    """Column values of the MILP for a given replica set with its optimal split, or None."""
    key = {(int(e), int(g)): i for i, (e, g) in enumerate(m.pairs)}
    idx = [key.get((int(e), int(g))) for e, g in reps]
    if any(i is None for i in idx):
        return None
    z, flows = _split_lp(home, reps, load / m.mean, gpus)
    P = len(m.pairs)
    col = np.zeros(1 + 2 * P)
    col[0] = z
    col[1 + np.asarray(idx, dtype=np.int64)] = flows
    col[1 + P + np.asarray(idx, dtype=np.int64)] = 1.0
    return col


def _split_lp(home: np.ndarray, reps: np.ndarray, w: np.ndarray, gpus: int) -> tuple[float, np.ndarray]:
    """Min-max split of fixed copies: ``(z, flow per replica row)`` by linear programming."""
    R = len(reps)
    home_load = np.bincount(home, weights=w, minlength=gpus)
    if R == 0:
        return float(home_load.max()), np.zeros(0)
    E = len(w)
    re, rg = reps[:, 0], reps[:, 1]
    cols = 1 + np.arange(R)
    rows = np.concatenate([np.arange(gpus), rg, home[re], gpus + re])
    cc = np.concatenate([np.zeros(gpus, dtype=np.int64), cols, cols, cols])
    vv = np.concatenate([-np.ones(gpus), np.ones(R), -np.ones(R), np.ones(R)])
    a = sp.csr_matrix((vv, (rows, cc)), shape=(gpus + E, 1 + R))
    b = np.concatenate([-home_load, w])
    c = np.zeros(1 + R)
    c[0] = 1.0
    res = linprog(c, A_ub=a, b_ub=b, bounds=[(0, None)] * (1 + R), method="highs")
    if res.status != 0:
        raise RuntimeError(f"split LP failed: {res.message}")
    return float(res.x[0]), res.x[1:]


def optimal_split_maxvio(home: np.ndarray, replicas: np.ndarray, load: np.ndarray, gpus: int) -> float:
    """MaxVio of fixed copies when every expert's tokens are split optimally among them.

    Parameters
    ----------
    home
        int ``[E]`` home GPUs.
    replicas
        int ``[R, 2]`` rows ``(expert, gpu)``.
    load
        float ``[E]`` per-expert loads.
    gpus
        G.

    Returns
    -------
    float
        ``min over splits of max_g Load_g / mean_g Load_g - 1``.
    """
    load = np.asarray(load, dtype=np.float64)
    mean = load.sum() / gpus
    if mean <= 0:
        return 0.0
    reps = np.asarray(replicas, dtype=np.int64).reshape(-1, 2)
    z, _ = _split_lp(np.asarray(home, dtype=np.int64), reps, load / mean, gpus)
    return max(z - 1.0, 0.0)


def solve_replication_bound_pyomo(
    home: np.ndarray, load: np.ndarray, gpus: int, slots: int, *, time_limit: float = 10.0, solver: str = "highs"
) -> ReplicationBound:
    """The same MILP written algebraically in Pyomo, solved by ``solver`` (HiGHS by default; one of
    `moeopt.solvers.pyomo_solvers.SOLVERS`).

    A second, independently built backend: no count bound, no incumbent heuristics, so it
    cross-checks `build_model`'s arrays (``tests/test_gesr.py``). Meant for small
    layers; `solve_replication_bound` is the fast path.
    """
    import pyomo.environ as pyo

    from moeopt.solvers.pyomo_solvers import SolveOptions, solve_model

    t0 = time.perf_counter()
    home = np.asarray(home, dtype=np.int64)
    load = np.asarray(load, dtype=np.float64)
    E = len(load)
    mean = load.sum() / gpus
    if mean <= 0:
        return ReplicationBound(Status.OPTIMAL, 0.0, 0.0, np.zeros((0, 2), np.int64), 0.0)
    w = load / mean
    pairs = [(e, g) for e in range(E) for g in range(gpus) if g != home[e] and w[e] > 0 and slots > 0]
    m = pyo.ConcreteModel()
    m.P = pyo.Set(initialize=range(len(pairs)))
    m.x = pyo.Var(m.P, bounds=lambda _, p: (0.0, float(w[pairs[p][0]])))
    m.y = pyo.Var(m.P, domain=pyo.Binary)
    m.z = pyo.Var(bounds=(0.0, None))
    m.objective = pyo.Objective(expr=m.z, sense=pyo.minimize)

    def gpu_load(_, g: int):
        own = sum(float(w[e]) for e in range(E) if home[e] == g)
        out = sum(m.x[p] for p, (e, _g) in enumerate(pairs) if home[e] == g)
        inflow = sum(m.x[p] for p, (_e, gg) in enumerate(pairs) if gg == g)
        return own - out + inflow <= m.z

    m.gpu_load = pyo.Constraint(range(gpus), rule=gpu_load)

    def home_share(_, e: int):
        terms = [m.x[p] for p, (ee, _g) in enumerate(pairs) if ee == e]
        return sum(terms) <= float(w[e]) if terms else pyo.Constraint.Skip

    def slot_limit(_, g: int):
        terms = [m.y[p] for p, (_e, gg) in enumerate(pairs) if gg == g]
        return sum(terms) <= slots if terms else pyo.Constraint.Skip

    m.home_share = pyo.Constraint(range(E), rule=home_share)
    m.link = pyo.Constraint(m.P, rule=lambda _, p: m.x[p] <= float(w[pairs[p][0]]) * m.y[p])
    m.slots = pyo.Constraint(range(gpus), rule=slot_limit)
    answer = solve_model(m, solver, SolveOptions(time_limit=max(0.1, time_limit), rel_gap=1e-7, abs_gap=1e-9))
    optimal = answer.termination is Termination.OPTIMAL
    bound = max(answer.bound - 1.0, 0.0) if answer.bound is not None else 0.0
    best, reps = None, np.zeros((0, 2), np.int64)
    if answer.has_solution:
        reps = np.array([pairs[p] for p in m.P if pyo.value(m.y[p]) > 0.5], dtype=np.int64).reshape(-1, 2)
        best = float(optimal_split_maxvio(home, reps, load, gpus))
    status = Status.OPTIMAL if optimal else Status.TIME_LIMIT
    return ReplicationBound(status, bound, best, reps, time.perf_counter() - t0)
