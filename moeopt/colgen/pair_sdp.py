"""A semidefinite bound on the saving of every slot plan, copies included (`pair_sdp_saving_bound`).

For a plan (``S_g`` the experts on GPU ``g``, an expert on ``c_e >= 1`` GPUs) let
``X_ef = 1`` when experts e and f share some GPU. A token with expert set ``T`` dispatched by any
rule sends each of its experts to one GPU holding it; the experts that go to one GPU share it,
so the block of e (its token's experts on e's GPU) has at most ``n_e = 1 + sum_{f in T, f != e}
X_ef`` members. The token uses ``distinct(T) = sum_{e in T} 1 / |block(e)| >= sum_e 1 / n_e``, and
``1 / n >= (3 - n) / 2`` at every integer ``n >= 1`` (the secant of ``1 / n`` through 1 and 2), so

    k - distinct(T) <= sum_{e < f in T} X_ef.

Summed over the tokens (weights ``w_t``), the saving of a plan is at most ``<A / 2, X>`` with
``A_ef = sum_{t ni e, f} w_t``. With ``Y = sum_g v_g v_gᵀ`` (``v_g`` GPU g's indicator: ``Y_ef``
the GPUs holding both, ``Y_ee = c_e``) every plan of ``G x W`` slots satisfies

    Z = [[G Y, c], [cᵀ, 1]] ⪰ 0      (``(zᵀ c)^2 = (sum_g zᵀ v_g)^2 <= G zᵀ Y z``, Cauchy-Schwarz)
    diag(Y) = c,  c >= 1,  sum_e c_e <= G W,  Y >= 0,  sum_{f != e} Y_ef <= (W - 1) c_e,
    0 <= X <= 1,  X <= Y,

so ``max <A / 2, X>`` over them bounds the saving from above (without spare slots, ``c = 1``
and it is the Frieze-Jerrum relaxation of the grouping: `moeopt.solvers.grouping_sdp`). SCS
solves it to a work budget (iterations); the bound reported is recomputed in numpy from its
multipliers (``P >= 0`` on ``X <= Y``, ``N >= 0`` on ``Y >= 0``, ``r >= 0`` on the rows,
``mu`` on the diagonal, ``nu >= 0`` on ``c >= 1``, ``tau >= 0`` on the slots, ``sigma`` on
the corner): with ``K = P + N - sym(r 1ᵀ) + Diag(r + mu)``, ``m = (W - 1) r - mu + nu - tau 1`` and
``C = [[K / G, m / 2], [mᵀ / 2, -sigma]]``,

    saving <= sum (A / 2 - P)^+ + tau G W - sum nu + sigma + T max(0, λ_max(C))

with ``T = G^2 W + 1`` (``tr Z = G sum c + 1``): valid for any multipliers of those signs,
hence whatever the solver's accuracy or an iteration budget that stops it early. ``sigma`` is
set by a one-dimensional minimization.

Measured (formulations/joint.md, "A semidefinite bound"): on the count-sampled OLMoE layers with
one spare slot per GPU it lifts the bound from 4.36, 2 and 2 distinct GPUs per token to 4.52,
3.12 and 2.61; without spare slots it is within 4 % of the best grouping found on the first
layer (6.36 against 6.62), about where the pair LP already is; with copies it is far from the
plans (a copied expert's GPUs both count in ``X``), and on the synthetic task-structured layers
the pair relaxation itself is loose (``(c - 1)^+ <= C(c, 2)`` for ``c`` large).
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
from scipy.optimize import minimize_scalar
from threadpoolctl import threadpool_limits

from moeopt import extras

#: SCS iterations (the bound's work budget) and accuracy target
SDP_ITERATIONS = 5000
SDP_EPS = 1e-6
#: no SDP past this many experts (the model has 2 E^2 variables: seconds at 64, minutes at 256)
SDP_MAX_EXPERTS = 128


def pair_matrix(patterns: np.ndarray, weights: np.ndarray, experts: int) -> np.ndarray:
    """``A [E, E]``: ``A_ef = sum_{t ni e, f} w_t`` over distinct top-k sets ``patterns [M, k]``
    (sorted; repeated experts of a row count once), zero diagonal."""
    A = np.zeros((experts, experts))
    k = patterns.shape[1]
    for a in range(k):
        for b in range(a + 1, k):
            e, f = patterns[:, a], patterns[:, b]
            ok = e != f
            np.add.at(A, (e[ok], f[ok]), weights[ok])
    A = A + A.T
    np.fill_diagonal(A, 0.0)
    return A


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
    A = pair_matrix(np.asarray(patterns, dtype=np.int64), np.asarray(weights, dtype=np.float64), E)
    total = float(np.triu(A, 1).sum())
    if total <= 0:
        rep["pair_sdp"] = "trivial"
        return 0.0
    Z = cp.Variable((E + 1, E + 1), PSD=True)
    X = cp.Variable((E, E), symmetric=True)
    Y = Z[:E, :E] / G
    c = Z[:E, E]
    link = X <= Y
    nonneg = Y >= 0
    rows = cp.sum(Y, axis=1) - cp.diag(Y) <= (W - 1) * c
    diag = cp.diag(Y) == c
    low = c >= 1
    slots = cp.sum(c) <= G * W
    cons = [link, nonneg, rows, diag, low, slots, Z[E, E] == 1, X >= 0, X <= 1]
    prob = cp.Problem(cp.Maximize(cp.sum(cp.multiply(A / 2, X))), cons)
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
    if any(d is None for d in duals):
        rep.update(pair_sdp=str(prob.status), pair_sdp_seconds=time.perf_counter() - t0)
        return math.inf
    P, N, r, mu, nu, tau = (np.asarray(d, dtype=np.float64) for d in duals)
    with threadpool_limits(1):
        bound = min(
            lagrangian_bound(A, G, W, P, N, r.ravel(), s * mu.ravel(), nu.ravel(), float(tau)) for s in (1.0, -1.0)
        )
    status = str(prob.status)
    if time_limit is not None and time.perf_counter() - t0 >= time_limit:
        status = "capped"
    rep.update(
        pair_sdp=status,
        pair_sdp_value=None if prob.value is None else float(prob.value),
        pair_sdp_seconds=time.perf_counter() - t0,
    )
    return min(bound, total)
