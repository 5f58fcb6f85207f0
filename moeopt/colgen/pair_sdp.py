"""A semidefinite bound on the saving of every slot plan, copies included (`pair_sdp_saving_bound`).

For a plan (``S_g`` the experts on GPU ``g``, an expert on ``c_e >= 1`` GPUs) let
``X_ef = 1`` when experts e and f share some GPU. A token with expert set ``T`` dispatched by any
rule sends each of its experts to one GPU holding it; the experts that go to one GPU share it,
so the block of e (its token's experts on e's GPU) has at most ``n_e(T) = 1 + sum_{f in T, f != e}
X_ef`` members, and at most ``K = min(k, W)``. The token uses
``distinct(T) = sum_{e in T} 1 / |block(e)|``. At every integer ``b`` in ``1 .. K``,
``1 / b >= 1 / K`` and ``1 / b >= l_m(b) = (2m + 1 - b) / (m (m + 1))`` (the secant of ``1 / n``
through m and m + 1, m = 1 .. K - 1), and ``l_m`` decreases, so ``1 / |block(e)| >= l_m(n_e(T))``.
For each expert e any convex combination ``lambda_e`` of these lower bounds holds for all of its
tokens at once; summed over the tokens (weights ``w_t``, ``n_e = sum_{t ni e} w_t``,
``A_ef = sum_{t ni e, f} w_t``), with ``l = alpha_e - beta_e (n - 1)`` the combination,

    sum_t w_t distinct_t >= sum_e alpha_e n_e - sum_e beta_e (A X)_e,
    saving = sum_t w_t (k_t - distinct_t) <= sum_e (1 - alpha_e) n_e + <A' / 2, X>,

``A'_ef = A_ef (beta_e + beta_f)`` (with ``lambda_e`` the secant through 1 and 2 for every
expert: ``saving <= <A / 2, X>``, the pairs of a token's experts that share a GPU). With
``Y = sum_g v_g v_gᵀ`` (``v_g`` GPU g's indicator: ``Y_ef`` the GPUs holding both, ``Y_ee = c_e``)
every plan of ``G x W`` slots satisfies

    Z = [[G Y, c], [cᵀ, 1]] ⪰ 0      (``(zᵀ c)^2 = (sum_g zᵀ v_g)^2 <= G zᵀ Y z``, Cauchy-Schwarz)
    diag(Y) = c,  c >= 1,  sum_e c_e <= G W,  Y >= 0,  sum_{f != e} Y_ef <= (W - 1) c_e,
    0 <= X <= 1,  X <= Y,

so the largest right-hand side over them bounds the saving from above (with the one secant and
no spare slots, ``c = 1``, it is the Frieze-Jerrum relaxation of the grouping:
`moeopt.solvers.grouping_sdp`). SCS solves the relaxation with the per-expert combinations as
variables (an epigraph ``z_e`` above every lower bound) to a work budget (iterations). The
bound reported is recomputed in numpy: ``lambda_e`` from the multipliers of the epigraph rows
(normalized), then ``<A' / 2, X>`` bounded from the multipliers of the other rows (``P >= 0``
on ``X <= Y``, ``N >= 0`` on ``Y >= 0``, ``r >= 0`` on the rows, ``mu`` on the diagonal,
``nu >= 0`` on ``c >= 1``, ``tau >= 0`` on the slots, ``sigma`` on the corner): with
``K' = P + N - sym(r 1ᵀ) + Diag(r + mu)``, ``m = (W - 1) r - mu + nu - tau 1`` and
``C = [[K' / G, m / 2], [mᵀ / 2, -sigma]]``,

    <A' / 2, X> <= sum (A' / 2 - P)^+ + tau G W - sum nu + sigma + T max(0, λ_max(C))

with ``T = G^2 W + 1`` (``tr Z = G sum c + 1``): valid for any multipliers of those signs and
any ``lambda``, hence whatever the solver's accuracy or an iteration budget that stops it early.
``sigma`` is set by a one-dimensional minimization.

Measured (formulations/joint.md, "A semidefinite bound"): on the count-sampled OLMoE layers with
one spare slot per GPU it lifts the bound from 4.36, 2 and 2 distinct GPUs per token to 5.04,
4.39 and 4.17 (the one secant alone: 4.52, 3.12, 2.61; a copied expert's GPUs both count in
``X``, which the per-expert combinations cap); without spare slots it is within 4 % of the best
grouping found on the first layer, about where the pair LP already is. On the synthetic
task-structured layers the relaxation is far from the plans.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from threadpoolctl import threadpool_limits

from moeopt import extras

#: SCS iterations (the bound's work budget) and accuracy target
SDP_ITERATIONS = 5000
SDP_EPS = 1e-6
#: no SDP past this many experts (the model has 2 E^2 variables): 4-6 s per layer at 64 experts on
#: a 2-core machine, 16-29 s at 128 (64 GPUs x 2 slots; 16 GPUs x 8), too slow for a default
SDP_MAX_EXPERTS = 64


def pattern_sizes(patterns: np.ndarray) -> np.ndarray:
    """int ``[M]``: the distinct experts of each sorted top-k set ``patterns [M, k]``."""
    pats = np.asarray(patterns)
    if pats.ndim != 2 or pats.shape[1] == 0:
        return np.zeros(len(pats), dtype=np.int64)
    return 1 + (pats[:, 1:] != pats[:, :-1]).sum(axis=1)


def pair_weights(patterns: np.ndarray, weights: np.ndarray, experts: int) -> sp.csr_matrix:
    """``C [E, E]`` (sparse): ``C_ef = sum_{t ni e, f} w_t`` over distinct top-k sets
    ``patterns [M, k]`` (sorted; repeated experts of a row count once); its diagonal ``C_ee`` is
    the weight of the tokens holding e. The pair bounds' one co-occurrence count."""
    pats = np.asarray(patterns, dtype=np.int64)
    first = np.ones(pats.shape, dtype=bool)
    first[:, 1:] = pats[:, 1:] != pats[:, :-1]  # each distinct expert of a pattern once
    rows = np.repeat(np.arange(len(pats)), first.sum(axis=1))
    inc = sp.csr_matrix((np.ones(rows.size), (rows, pats[first])), shape=(len(pats), experts))
    return (inc.T @ sp.diags(np.asarray(weights, dtype=np.float64)) @ inc).tocsr()


def lagrangian_bound(
    A: np.ndarray,
    gpus: int,
    width: int,
    P: np.ndarray,
    N: np.ndarray,
    r: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    tau: float,
) -> float:
    """The module notes' upper bound on ``<A / 2, X>`` for the multipliers (clipped to their
    signs: any values give a valid bound), ``sigma`` minimized."""
    E = A.shape[0]
    P = np.maximum(0.5 * (P + P.T), 0.0)
    N = np.maximum(0.5 * (N + N.T), 0.0)
    r, nu, tau = np.maximum(r, 0.0), np.maximum(nu, 0.0), max(float(tau), 0.0)
    G, W = gpus, width
    K = P + N - 0.5 * (r[:, None] + r[None, :]) + np.diag(r + mu)
    m = (W - 1) * r - mu + nu - tau
    C = np.zeros((E + 1, E + 1))
    C[:E, :E] = K / G
    C[:E, E] = C[E, :E] = m / 2
    T = G * G * W + 1.0
    base = float(np.maximum(A / 2 - P, 0.0).sum()) + tau * G * W - float(nu.sum())

    def f(sigma: float) -> float:
        C[E, E] = -sigma
        return sigma + T * max(0.0, float(np.linalg.eigvalsh(C)[-1]))

    scale = max(float(np.abs(C).max()) * T, 1.0)
    found = minimize_scalar(f, bounds=(-scale, scale), method="bounded", options={"xatol": 1e-9 * scale})
    return base + min(f(float(found.x)), f(0.0))


def secant_weights(lam: np.ndarray, largest: int) -> tuple[np.ndarray, np.ndarray]:
    """Per expert, the convex combination ``lam [E, largest]`` of the lower bounds of ``1 / n``
    (column 0: ``1 / largest``; column m >= 1: the secant through m and m + 1,
    ``(2m + 1 - n) / (m (m + 1))``) as ``alpha - beta (n - 1)``: ``(alpha [E], beta [E])``."""
    m = np.arange(largest, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(m == 0, 1.0 / largest, 2.0 / (m + 1.0))
        b = np.where(m == 0, 0.0, 1.0 / (m * (m + 1.0)))
    return lam @ a, lam @ b


def pair_sdp_saving_bound(
    patterns: np.ndarray,
    weights: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    *,
    iterations: int = SDP_ITERATIONS,
    time_limit: float | None = None,
    report: dict | None = None,
) -> float:
    """Upper bound on ``sum_t w_t (k_t - distinct_t)`` over every plan of ``gpus x width`` slots
    holding each of ``experts`` experts at least once, under any dispatch (the module notes);
    ``inf`` when it was not computed (past `SDP_MAX_EXPERTS`, no CVXPY, a solver error).
    ``report`` gets ``pair_sdp`` (the solver's status, ``skipped`` or ``capped``), its value
    and seconds."""
    t0 = time.perf_counter()
    rep = report if report is not None else {}
    rep.update(pair_sdp="skipped", pair_sdp_value=None, pair_sdp_seconds=0.0)
    E, G, W = experts, gpus, width
    if E > SDP_MAX_EXPERTS or W <= 1 or E <= 1:
        return math.inf
    try:
        cp = extras.load("cvxpy", "sdp", "joint's semidefinite certificate")
    except extras.MissingExtra:
        return math.inf
    pats = np.asarray(patterns, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    C = pair_weights(pats, w, E)
    n = C.diagonal()
    A = C.toarray()
    np.fill_diagonal(A, 0.0)
    total = float(np.triu(A, 1).sum())
    if total <= 0:
        rep["pair_sdp"] = "trivial"
        return 0.0
    k = int(pattern_sizes(pats).max(initial=1))
    K = max(min(k, W), 2)  # a block holds at most min(k, W) experts
    Z = cp.Variable((E + 1, E + 1), PSD=True)
    X = cp.Variable((E, E), symmetric=True)
    z = cp.Variable(E)
    Y = Z[:E, :E] / G
    c = Z[:E, E]
    link = X <= Y
    nonneg = Y >= 0
    rows = cp.sum(Y, axis=1) - cp.diag(Y) <= (W - 1) * c
    diag = cp.diag(Y) == c
    low = c >= 1
    slots = cp.sum(c) <= G * W
    # z_e >= sum_{t ni e} w_t / |block_t(e)|: its lower bounds, linear in AX
    AX = cp.sum(cp.multiply(A, X), axis=1)
    secants = [z >= n / K] + [z >= (2 * m * n - AX) / (m * (m + 1)) for m in range(1, K)]
    cons = [link, nonneg, rows, diag, low, slots, Z[E, E] == 1, X >= 0, X <= 1, *secants]
    prob = cp.Problem(cp.Maximize(float(n.sum()) - cp.sum(z)), cons)
    opts: dict[str, float | int | bool] = {
        "eps_abs": SDP_EPS,
        "eps_rel": SDP_EPS,
        "max_iters": max(int(iterations), 1),
        "use_indirect": False,
    }
    if time_limit is not None:
        opts["time_limit_secs"] = max(0.2, time_limit - (time.perf_counter() - t0))
    try:
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(solver=cp.SCS, **opts)
    except cp.error.SolverError as exc:
        rep.update(pair_sdp=f"error: {exc}", pair_sdp_seconds=time.perf_counter() - t0)
        return math.inf
    duals = [x.dual_value for x in (link, nonneg, rows, diag, low, slots)]
    weights_m = [x.dual_value for x in secants]
    if any(d is None for d in duals) or any(d is None for d in weights_m):
        rep.update(pair_sdp=str(prob.status), pair_sdp_seconds=time.perf_counter() - t0)
        return math.inf
    P, N, r, mu, nu, tau = (np.asarray(d, dtype=np.float64) for d in duals)
    # each expert's combination of the lower bounds of 1 / n (the secants' multipliers, normalized;
    # any combination is valid), then the pair bound of the weighted pairs at the same multipliers
    lam = np.maximum(np.column_stack([np.asarray(d, dtype=np.float64).ravel() for d in weights_m]), 0.0)
    mass = lam.sum(axis=1, keepdims=True)
    lam = np.where(mass > 1e-12, lam / np.maximum(mass, 1e-300), np.eye(K)[1])
    alpha, beta = secant_weights(lam, K)
    weighted = A * (beta[:, None] + beta[None, :])
    with threadpool_limits(1):
        pairs = min(
            lagrangian_bound(weighted, G, W, P, N, r.ravel(), s * mu.ravel(), nu.ravel(), float(tau))
            for s in (1.0, -1.0)
        )
    bound = float(n @ (1.0 - alpha)) + pairs
    status = str(prob.status)
    if time_limit is not None and time.perf_counter() - t0 >= time_limit:
        status = "capped"
    rep.update(
        pair_sdp=status,
        pair_sdp_value=None if prob.value is None else float(prob.value),
        pair_sdp_seconds=time.perf_counter() - t0,
    )
    return min(bound, total)
