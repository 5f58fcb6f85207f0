"""The semidefinite relaxation of the grouping problem: a bound that stays close for large groups.

A plan's colocation matrix ``X[i, j] = 1`` when experts i and j share a GPU (``X[i, i] = 1``)
is a sum of ``v vᵀ`` over the at most G groups' indicator vectors, so (formulations/tacg.md,
section 9)

    max <W / 2, X>
    s.t. diag(X) = 1,  X >= 0,  X 1 <= cap 1     (= when E = G cap: every group is full)
         X w <= limit 1                           (with a load limit)
         G X - 1 1ᵀ  ⪰ 0                          (at most G groups: Frieze and Jerrum)

holds at every plan, so its optimum bounds the best affinity from above. The solver (SCS, a
first-order conic solver, through CVXPY) returns an approximate optimum after a fixed number of
iterations (its work budget: the same multipliers, hence the same bound, on a busy machine as on
an idle one; a time limit is only an outer cap, reported when it stops SCS); the bound reported is
recomputed from its multipliers in numpy: for any ``y, z, N >= 0`` (free ``y`` for equality
rows) and any ``mu``, with ``M = W / 2 + N - sym(y 1ᵀ) - sym(z wᵀ) - Diag(mu)``,

    affinity(plan) <= cap Σ y + limit Σ z + Σ mu + (E (G - 1) λ_max(M) + 1ᵀ M 1) / G,

(the plan's ``X`` has ``diag = 1`` and ``G X - 1 1ᵀ ⪰ 0`` with trace ``E (G - 1)``), so the bound
is valid whatever the solver's accuracy or a time limit that stops it early; it is close to
the SDP value when the multipliers are near optimal.

Where the triangle LP (`moeopt.solvers.grouping_triangle`) needs many cutting rounds on
groups of 8 and 16 experts, the semidefinite constraint captures much of the same structure in
one solve: on the count-sampled DeepSeek-V3 layer at E = 128, G = 16, the gap to the best
plan is 4.1 % in 9 s against the triangle LP's 6.3 % in 60 s.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from moeopt import extras
from moeopt.grouping import LOAD_TOL, Grouping

#: SCS's accuracy targets (its default 1e-4 leaves more on the table at E = 256)
SCS_EPS = 1e-5
#: SCS iterations by default: the bound's work budget (at E = 256 about 35 ms each on a 2-core
#: machine, at E = 128 about 5 ms). On the certificates benchmark's E = 256, G = 16 cells the bound
#: at 1000 iterations was 4.84 % (synthetic) and 7.73 % (count-sampled) above the best plan, at
#: 2000 iterations 4.10 % and 7.73 %
SCS_ITERATIONS = 1500
#: L-BFGS-B iterations of each stage of the multipliers' polish (`polish`), by default
POLISH_ITERATIONS = 200
#: under a time limit, the share of it SCS may use (model building included); the polish the rest
SCS_SHARE = 0.5
#: SCS's least time limit, when building the model took its share
MIN_SCS_SECONDS = 0.2
#: the soft maximum's temperatures, in units of the largest entry of ``M``
POLISH_TEMPERATURES = (1e-3, 1e-4)
#: no polish when SCS converged and the recomputed bound is within this share of its value
POLISH_SLACK = 1e-3


@dataclass
class SdpResult:
    """The semidefinite relaxation's outcome.

    Attributes
    ----------
    bound
        Upper bound on the affinity of every plan (recomputed from the multipliers; ``inf``
        when the solver returned none).
    sdp_value
        The solver's own value (for information; not a bound unless solved exactly).
    status
        The solver's status (``optimal``, ``optimal_inaccurate``, ...).
    seconds
        Wall time (model building and solve).
    iterations
        SCS iterations run.
    capped
        Whether the time limit, not the work budgets (SCS's iterations, the polish's), stopped
        SCS or the polish: the bound is still valid but depends on the machine's speed.
    """

    bound: float
    sdp_value: float | None
    status: str
    seconds: float
    iterations: int = 0
    capped: bool = False

    def record(self) -> dict:
        return {
            "bound": self.bound,
            "sdp_value": self.sdp_value,
            "status": self.status,
            "seconds": self.seconds,
            "iterations": self.iterations,
            "capped": self.capped,
        }


@dataclass(frozen=True)
class LoadStructure:
    """What the load limit alone says about every plan (formulations/tacg.md, section 9).

    Attributes
    ----------
    conflict
        bool ``[E, E]``: pairs whose loads together exceed the limit, never on one GPU.
    labels
        Experts heavier than half the limit (pairwise in conflict: at most one per GPU), in
        increasing index; empty unless there are 2 to G of them.
    exact
        Whether there are exactly G labels: then every GPU holds exactly one.
    edges
        ``(a, b)``, ``a < b``: the pairs of unlabelled experts with affinity and no conflict,
        the pairs whose colocation the label rows bound.
    """

    conflict: np.ndarray
    labels: np.ndarray
    exact: bool
    edges: tuple[np.ndarray, np.ndarray]

    def conflict_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(i, j)``, ``i < j``: the conflicting pairs, in the order of ``StructureDuals.zero``."""
        i, j = np.nonzero(np.triu(self.conflict, 1))
        return i, j

    @classmethod
    def empty(cls, experts: int) -> LoadStructure:
        """No conflict, no label: the plain relaxation."""
        none = np.zeros(0, dtype=np.int64)
        return cls(np.zeros((experts, experts), dtype=bool), none, False, (none, none))


def load_structure(problem: Grouping) -> LoadStructure:
    """The conflicts and labels of ``problem``'s load limit (none without a limit)."""
    E = problem.experts
    if not problem.limited:
        return LoadStructure.empty(E)
    w, top = problem.load, problem.load_limit + LOAD_TOL
    conflict = w[:, None] + w[None, :] > top
    np.fill_diagonal(conflict, False)
    labels = np.flatnonzero(2 * w > top)
    if not 2 <= len(labels) <= problem.groups:
        labels = np.zeros(0, dtype=np.int64)
    free = np.ones(E, dtype=bool)
    free[labels] = False
    a, b = np.nonzero(np.triu((problem.graph > 0) & ~conflict & free[:, None] & free[None, :], 1))
    return LoadStructure(conflict, labels, len(labels) == problem.groups, (a, b))


def _add_pairs(A: np.ndarray, i: np.ndarray, j: np.ndarray, c: np.ndarray) -> None:
    """Add the linear term ``sum c X[i, j]`` to ``<A, X>`` (half on each side)."""
    np.add.at(A, (i, j), 0.5 * c)
    np.add.at(A, (j, i), 0.5 * c)


@dataclass
class StructureDuals:
    """Multipliers of the load-structure rows (shapes from `LoadStructure`; ``m`` edges,
    ``k`` labels): ``zero`` of ``X_ij <= 0`` per conflicting pair ``i < j``; ``gamma`` of
    ``X_ab <= sum_h T_abh + T_ab0`` per edge; ``alpha``, ``beta`` (``[m, k]``) of
    ``T_abh <= X_ah`` and ``T_abh <= X_bh``; ``alpha0``, ``beta0`` of ``T_ab0 <= 1 - s_a`` and
    ``T_ab0 <= 1 - s_b`` (``s_i = sum_h X_ih``; only without ``exact``); ``rho`` of
    ``s_i <= 1`` per unlabelled expert (``s_i = 1`` with ``exact``: any sign). All others
    are ``>= 0``."""

    zero: np.ndarray
    gamma: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    alpha0: np.ndarray
    beta0: np.ndarray
    rho: np.ndarray


def structure_terms(problem: Grouping, structure: LoadStructure, duals: StructureDuals) -> tuple[np.ndarray, float]:
    """The load-structure rows' part of the Lagrangian: ``(A, constant)``, ``A`` added to
    ``M`` and ``constant`` to the bound of `dual_bound`. Valid for every choice of
    ``duals``: signs are clipped, and ``alpha``, ``alpha0`` are raised until the lifted
    ``T >= 0`` drop out (their coefficients ``gamma - alpha - beta`` must be ``<= 0``)."""
    E = problem.experts
    K = structure.labels
    a, b = structure.edges
    A = np.zeros((E, E))
    _add_pairs(A, *structure.conflict_pairs(), -np.maximum(np.asarray(duals.zero, dtype=np.float64), 0.0))
    if not len(K):
        return A, 0.0
    gamma = np.maximum(np.asarray(duals.gamma, dtype=np.float64), 0.0)
    beta = np.maximum(np.asarray(duals.beta, dtype=np.float64), 0.0)
    alpha = np.maximum(np.maximum(np.asarray(duals.alpha, dtype=np.float64), 0.0), gamma[:, None] - beta)
    rho = np.asarray(duals.rho, dtype=np.float64)
    alpha0 = beta0 = np.zeros(len(a))  # the T0 rows exist only without exact labels
    if not structure.exact:
        rho = np.maximum(rho, 0.0)
        beta0 = np.maximum(np.asarray(duals.beta0, dtype=np.float64), 0.0)
        alpha0 = np.maximum(np.maximum(np.asarray(duals.alpha0, dtype=np.float64), 0.0), gamma - beta0)
    k = len(K)
    rest = np.setdiff1d(np.arange(E), K)
    _add_pairs(A, a, b, -gamma)
    # X_ah and X_bh appear in the T rows (alpha, beta) and, through s_a and s_b, in the T0 rows
    _add_pairs(A, np.repeat(a, k), np.tile(K, len(a)), (alpha - alpha0[:, None]).ravel())
    _add_pairs(A, np.repeat(b, k), np.tile(K, len(b)), (beta - beta0[:, None]).ravel())
    _add_pairs(A, np.repeat(rest, k), np.tile(K, len(rest)), -np.repeat(rho, k))
    return A, float(rho.sum() + alpha0.sum() + beta0.sum())


def dual_bound(
    problem: Grouping,
    y: np.ndarray,
    z: np.ndarray,
    N: np.ndarray,
    mu: np.ndarray,
    *,
    full: bool,
    extra: np.ndarray | None = None,
    constant: float = 0.0,
) -> float:
    """The bound for given multipliers: ``y`` of the row sums (free when ``full``, else >= 0),
    ``z >= 0`` of the load rows, ``N >= 0`` of ``X >= 0``, ``mu`` of the diagonal (free), and
    the load-structure rows' ``extra`` and ``constant`` (`structure_terms`). Valid for
    every choice (multipliers of the wrong sign are clipped)."""
    y = np.asarray(y, dtype=np.float64) if full else np.maximum(np.asarray(y, dtype=np.float64), 0.0)
    z = np.maximum(np.asarray(z, dtype=np.float64), 0.0)
    N = np.maximum(np.asarray(N, dtype=np.float64), 0.0)
    M, value = _lagrangian(problem, y, z, N, np.asarray(mu, dtype=np.float64), extra, constant)
    top = float(np.linalg.eigvalsh(M)[-1])
    return _bound(problem, M, value, top)


def _lagrangian(
    problem: Grouping,
    y: np.ndarray,
    z: np.ndarray,
    N: np.ndarray,
    mu: np.ndarray,
    extra: np.ndarray | None,
    constant: float,
) -> tuple[np.ndarray, float]:
    """``M`` (symmetrized) and the constant part of the bound, the multipliers taken as they
    are (their signs must already be right)."""
    W, w = problem.graph, problem.load
    M = 0.5 * (W - np.diag(np.diag(W))) + N - 0.5 * (y[:, None] + y[None, :]) - np.diag(mu)
    value = problem.cap * y.sum() + mu.sum() + constant
    if extra is not None:
        M = M + extra
    if problem.limited:
        M = M - 0.5 * (z[:, None] * w[None, :] + w[:, None] * z[None, :])
        value += problem.load_limit * z.sum()
    return 0.5 * (M + M.T), float(value)


def _bound(problem: Grouping, M: np.ndarray, value: float, top: float) -> float:
    """The bound from ``M``, its largest eigenvalue ``top`` (or an upper bound on it) and the
    constant part: ``max <M, X>`` over ``diag X = 1, G X - 1 1ᵀ ⪰ 0`` is at most
    ``(E (G - 1) top + 1ᵀ M 1) / G``."""
    E, G = len(M), problem.groups
    return float(value + (E * (G - 1) * top + M.sum()) / G)


class _Deadline(Exception):
    pass


def polish(
    problem: Grouping,
    y: np.ndarray,
    z: np.ndarray,
    N: np.ndarray,
    mu: np.ndarray,
    *,
    full: bool,
    conflict: np.ndarray,
    extra: np.ndarray,
    constant: float,
    deadline: float | None = None,
    iterations: int = POLISH_ITERATIONS,
    report: dict | None = None,
) -> float:
    """Improve the multipliers ``y, z, N, mu`` (the structure rows' part ``extra, constant``
    kept) by minimizing the bound of `dual_bound` from the solver's, ``iterations`` L-BFGS-B
    iterations per stage (the work budget), ``deadline`` (``time.perf_counter()``) an outer cap;
    ``report`` (a dict, if given) gets ``capped``: whether the deadline stopped a stage.

    SCS stopped by its clock leaves multipliers whose recomputed bound is well above its own
    value (the ``λ_max`` term pays for every residual, times ``E (G - 1) / G``). The bound is
    convex in the multipliers; L-BFGS-B minimizes it with ``λ_max`` smoothed to a soft maximum
    of the eigenvalues (the temperature lowered in stages), ``N >= 0`` and ``z >= 0`` as box
    constraints, and ``N`` of any sign on the ``conflict`` pairs (``X = 0`` there). Every
    evaluation also gives the exact bound at its point; the least is returned, recomputed by
    `dual_bound` (so the bound stays valid however the search went)."""
    from scipy.optimize import minimize

    w, G, cap = problem.load, problem.groups, problem.cap
    E = len(w)
    iu, ju = np.triu_indices(E, 1)
    limit = problem.load_limit if problem.limited else 0.0
    free = conflict[iu, ju]
    x0 = np.concatenate(
        [
            y if full else np.maximum(y, 0.0),
            np.maximum(z, 0.0) if problem.limited else np.zeros(E),
            mu,
            np.maximum(0.5 * (N + N.T), 0.0)[iu, ju],
        ]
    )
    lower = np.concatenate(
        [np.full(E, -np.inf if full else 0.0), np.zeros(E), np.full(E, -np.inf), np.where(free, -np.inf, 0.0)]
    )
    bounds = list(zip(lower, np.full(len(lower), np.inf), strict=True))

    def build(x: np.ndarray) -> tuple[np.ndarray, float]:
        Nx = np.zeros((E, E))
        Nx[iu, ju] = Nx[ju, iu] = x[3 * E :]
        return _lagrangian(problem, x[:E], x[E : 2 * E], Nx, x[2 * E : 3 * E], extra, constant)

    best: dict[str, Any] = {"value": np.inf, "x": x0}

    def fun(x: np.ndarray, tau: float, stop: float | None) -> tuple[float, np.ndarray]:
        if stop is not None and time.perf_counter() > stop:
            raise _Deadline
        M, value = build(x)
        lam, V = np.linalg.eigh(M)
        top = lam[-1]
        exact = _bound(problem, M, value, top)
        if exact < best["value"]:
            best.update(value=exact, x=x.copy())
        p = np.exp((lam - top) / tau)
        soft = top + tau * np.log(p.sum())
        p /= p.sum()
        Q = (E * (G - 1) * (V * p) @ V.T + 1.0) / G  # the gradient of the bound in M
        grad = np.concatenate(
            [cap - Q.sum(axis=1), limit - Q @ w if problem.limited else np.zeros(E), 1.0 - np.diag(Q), 2.0 * Q[iu, ju]]
        )
        return _bound(problem, M, value, soft), grad

    scale = max(float(np.abs(build(x0)[0]).max()), 1e-300)
    report = {} if report is None else report
    report["capped"] = False
    for k, tau in enumerate(POLISH_TEMPERATURES):  # under a deadline each stage gets its share of the time left
        stop = None
        if deadline is not None:
            stop = time.perf_counter() + (deadline - time.perf_counter()) / (len(POLISH_TEMPERATURES) - k)
        try:
            minimize(
                fun,
                best["x"],
                args=(tau * scale, stop),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": max(int(iterations), 1), "maxfun": 2 * max(int(iterations), 1)},
            )
        except _Deadline:
            report["capped"] = True
    x = best["x"]
    nn = x[3 * E :]
    Np = np.zeros((E, E))
    Np[iu, ju] = np.maximum(nn, 0.0)  # N >= 0 in dual_bound; the conflicts' negative part goes to extra
    Nf = np.zeros((E, E))
    Nf[iu, ju] = np.minimum(nn, 0.0)
    return dual_bound(
        problem, x[:E], x[E : 2 * E], Np + Np.T, x[2 * E : 3 * E], full=full, extra=extra + Nf + Nf.T, constant=constant
    )


def _structure_rows(X, structure: LoadStructure, E: int) -> dict[str, list]:
    """The load-structure rows of `StructureDuals` as CVXPY constraints, all of the
    form ``expression <= 0`` or ``>= 0`` (no equality: their multipliers' signs are then
    CVXPY's documented ones)."""
    cp = extras.load("cvxpy", "sdp", "the SDP certificate (certificate: sdp or auto)")

    out: dict[str, list] = {}
    ci, cj = structure.conflict_pairs()
    if len(ci):
        out["zero"] = [X[ci, cj] <= 0]
    K = structure.labels
    if not len(K):
        return out
    a, b = structure.edges
    rest = np.setdiff1d(np.arange(E), K)
    s_rest = cp.sum(X[rest, :][:, K], axis=1)
    out["rho"] = [s_rest <= 1] + ([s_rest >= 1] if structure.exact else [])
    if len(a):
        m, k = len(a), len(K)
        T = cp.Variable((m, k), nonneg=True)
        lifted = cp.sum(T, axis=1)
        out["alpha"] = [T <= X[a, :][:, K]]
        out["beta"] = [T <= X[b, :][:, K]]
        if not structure.exact:
            T0 = cp.Variable(m, nonneg=True)
            lifted = lifted + T0
            out["alpha0"] = [T0 <= 1 - cp.sum(X[a, :][:, K], axis=1)]
            out["beta0"] = [T0 <= 1 - cp.sum(X[b, :][:, K], axis=1)]
        out["gamma"] = [X[a, b] <= lifted]
    return out


def _structure_duals(rows: dict[str, list], structure: LoadStructure) -> StructureDuals:
    """The solver's multipliers of `_structure_rows` (zeros where a row is absent or
    the solver returned none)."""
    m, k = len(structure.edges[0]), len(structure.labels)
    rest = structure.conflict.shape[0] - k
    shapes = {
        "zero": (len(structure.conflict_pairs()[0]),),
        "gamma": (m,),
        "alpha": (m, k),
        "beta": (m, k),
        "alpha0": (m,),
        "beta0": (m,),
        "rho": (rest if k else 0,),
    }
    values = {}
    for name, shape in shapes.items():
        cons = rows.get(name, [])
        duals = [
            np.zeros(shape) if c.dual_value is None else np.asarray(c.dual_value, dtype=np.float64).reshape(shape)
            for c in cons
        ]
        # s <= 1 and s >= 1 (exact labels): the multiplier of s = 1 is their difference
        values[name] = duals[0] - duals[1] if len(duals) == 2 else duals[0] if duals else np.zeros(shape)
    return StructureDuals(**values)


@threadpool_limits.wrap(limits=1, user_api="blas")
def sdp_bound(
    problem: Grouping,
    seconds: float | None = None,
    *,
    iterations: int = SCS_ITERATIONS,
    polish_iterations: int = POLISH_ITERATIONS,
    structured: bool = True,
) -> SdpResult:
    """Upper bound on the affinity of every plan by the semidefinite relaxation.

    Parameters
    ----------
    problem
        The grouping problem (E experts, G groups of at most ``cap``, optional load limit).
    seconds
        Outer wall-clock cap of the whole bound (None: none): model building (about a second at
        E = 256), SCS (`SCS_SHARE` of it, at least `MIN_SCS_SECONDS`) and the polish
        of its multipliers. ``capped`` in the result when it stopped SCS or the polish.
    iterations
        SCS iterations at most: the bound's work budget (the same bound on any machine).
    polish_iterations
        L-BFGS-B iterations of each stage of the polish (`polish`).
    structured
        Add the load structure's rows (`load_structure`: conflicting pairs apart, one
        label per GPU); ``False`` gives the plain relaxation, for comparison.

    Returns
    -------
    SdpResult
        Its ``bound`` is valid however the solve ended.

    Notes
    -----
    Runs with one BLAS thread: the polish's eigendecompositions are as fast on one (E <= 256),
    two threads spinning against other work on a busy machine are ten times slower, and one
    thread gives the same bits in a worker process (which has one) as here.
    """
    cp = extras.load("cvxpy", "sdp", "the SDP certificate (certificate: sdp or auto)")

    t0 = time.perf_counter()
    W, w, G, cap = problem.graph, problem.load, problem.groups, problem.cap
    E = len(w)
    total = float(np.triu(W, 1).sum())
    if E <= 1 or cap <= 1 or total <= 0:  # no pair can share a GPU, or no pair has affinity (W >= 0)
        return SdpResult(0.0, None, "trivial", time.perf_counter() - t0)
    full = E == G * cap
    X = cp.Variable((E, E), symmetric=True)
    one = np.ones(E)
    diag = cp.diag(X) == 1
    nonneg = X >= 0
    rows = X @ one == cap if full else X @ one <= cap
    psd = G * X - np.ones((E, E)) >> 0
    cons = [diag, nonneg, rows, psd]
    load = None
    if problem.limited:
        load = X @ w <= problem.load_limit
        cons.append(load)
    structure = load_structure(problem) if structured else LoadStructure.empty(E)
    rows_of = _structure_rows(X, structure, E)
    cons.extend(c for group in rows_of.values() for c in group)
    C = 0.5 * (W - np.diag(np.diag(W)))
    prob = cp.Problem(cp.Maximize(cp.sum(cp.multiply(C, X))), cons)
    deadline = None if seconds is None else t0 + seconds
    capped = False
    ran = 0
    try:
        with warnings.catch_warnings():  # "solution may be inaccurate": the status says so, and the bound is valid
            warnings.simplefilter("ignore", UserWarning)
            # compile first (about a second at E = 256), so that SCS's limit counts it
            data, chain, inverse = prob.get_problem_data(cp.SCS)
            # the single-threaded direct solver (QDLDL): a threaded one (MKL's) need not give the
            # same bits twice, and the bound must
            opts: dict[str, float | int | bool] = {
                "eps_abs": SCS_EPS,
                "eps_rel": SCS_EPS,
                "max_iters": max(int(iterations), 1),
                "use_indirect": False,
            }
            if seconds is not None:
                opts["time_limit_secs"] = max(MIN_SCS_SECONDS, SCS_SHARE * seconds - (time.perf_counter() - t0))
            raw = chain.solve_via_data(prob, data, solver_opts=opts)
            prob.unpack_results(raw, chain, inverse)
            info = raw.get("info", {}) if isinstance(raw, dict) else {}
            ran = int(info.get("iter", 0))
            # SCS stopped before its iterations and before converging: its time limit did
            capped = seconds is not None and ran < iterations and "time" in str(info.get("status", "")).lower()
    except cp.error.SolverError as exc:
        return SdpResult(np.inf, None, f"error: {exc}", time.perf_counter() - t0, ran, capped)
    status = str(prob.status)
    if nonneg.dual_value is None or rows.dual_value is None or diag.dual_value is None:
        return SdpResult(np.inf, None, status, time.perf_counter() - t0, ran, capped)
    N = np.asarray(nonneg.dual_value, dtype=np.float64)
    y = np.asarray(rows.dual_value, dtype=np.float64).ravel()
    mu = np.asarray(diag.dual_value, dtype=np.float64).ravel()
    z = np.zeros(E) if load is None else np.asarray(load.dual_value, dtype=np.float64).ravel()
    extra, constant = structure_terms(problem, structure, _structure_duals(rows_of, structure))
    # CVXPY's sign conventions for equality rows depend on how it canonicalizes the problem:
    # every sign gives a valid bound, so keep the smallest (the structure rows are all
    # inequalities, whose multipliers CVXPY returns >= 0)
    signs = (1.0, -1.0)
    tried = {
        (sy, sm): dual_bound(problem, sy * y, z, N, sm * mu, full=full, extra=extra, constant=constant)
        for sy in (signs if full else (1.0,))
        for sm in signs
    }
    (sy, sm), bound = min(tried.items(), key=lambda kv: kv[1])
    value = None if prob.value is None else float(prob.value)
    converged = status == "optimal" and value is not None and bound <= value + POLISH_SLACK * max(abs(value), 1e-12)
    if np.isfinite(bound) and not converged and polish_iterations > 0:
        if deadline is not None and time.perf_counter() >= deadline:
            capped = True  # no time left for the polish
        else:
            report: dict = {}
            polished = polish(
                problem,
                sy * y,
                z,
                N,
                sm * mu,
                full=full,
                conflict=structure.conflict,
                extra=extra,
                constant=constant,
                deadline=deadline,
                iterations=polish_iterations,
                report=report,
            )
            capped = capped or bool(report["capped"])
            bound = min(bound, polished)
    bound = min(bound, total)  # the affinity of all pairs: a plan cannot exceed it
    return SdpResult(bound, value, status, time.perf_counter() - t0, ran, capped)
