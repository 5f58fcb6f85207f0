"""`joint`'s dispatch choice: the rule a plan runs under, chosen on the whole calibration trace by
the one scorer (`moeopt.evaluate.evaluate`): the engine's rule when the plan was made for one;
else the online guard (``locality``) with the smallest λ whose calibration MaxVio is within
``eps`` (fewest remote GPUs), guarded for single task families, else the most balanced of the
guard and ``lp``. Also how the restarts are seeded and ranked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt.budget import Budget
from moeopt.evaluate import evaluate
from moeopt.plan import Dispatch, Plan

if TYPE_CHECKING:
    from moeopt.methods.joint import JointParams
    from moeopt.registry import Problem
    from moeopt.trace import Trace


#: λ values of the guard tried when ``lam`` is not fixed (ascending). Not below 1: at λ < 1
#: the guard hardly reacts to load, and a shift to one task family stays unbalanced
#: (benchmark: worst single-family MaxVio 1.1-1.7 at λ 0.25-0.5, mostly 0.6-1.2 at λ >= 1)
LAM_GRID = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


#: bisection steps on log λ between two grid values
REFINE_STEPS = 2


#: the family guard raises λ while a single family's calibration MaxVio exceeds the most
#: balanced guard's by more than this fraction (``family_guard``) ...
FAMILY_SLACK = 0.1


#: ... but not past this much more communication (relative) than the mixture's choice
FAMILY_COMM_SLACK = 0.02


@dataclass
class DispatchChoice:
    """The dispatch picked for a plan and what each rule tried scored on calibration."""

    dispatch: Dispatch
    comm: float
    maxvio: float
    met: bool
    tried: list[dict]
    worst_family_maxvio: float | None = None  # on the calibration trace's families (family guard)
    #: the budget, not the search's own end, stopped the choice (the λ then depends on the machine)
    capped: bool = False
    #: the chosen dispatch's calibration remote GPUs per token and MaxVio, layer by layer
    comm_per_layer: list[float] | None = None
    maxvio_per_layer: list[float] | None = None


def choose_dispatch(
    plan: Plan, trace: Trace, problem: Problem, params: JointParams, budget: Budget | None = None
) -> DispatchChoice:
    """The plan's dispatch: fewest remote GPUs per token on the calibration trace subject to
    calibration MaxVio <= ``eps``, both scored by `moeopt.evaluate.evaluate`.

    The guard's MaxVio falls and its communication rises with λ, so the smallest feasible λ
    of the grid is found by bisection, then refined by bisection on log λ; without a feasible
    one, the most balanced of the largest λ and ``lp`` is kept. Once ``budget`` has too little
    left for another scoring (as long as the last one took) the bisection stops at the best λ
    found so far (``capped``).
    """
    budget = budget or Budget()
    cluster = problem.instance.cluster
    tried: list[dict] = []
    cache: dict[tuple, dict] = {}
    pace = {"seconds": 0.0, "capped": False}  # the last scoring's wall time

    def late() -> bool:
        """No time left for another scoring: the choice stops here (and says so)."""
        if budget.remaining() < pace["seconds"]:
            pace["capped"] = True
        return bool(pace["capped"])

    def score(d: Dispatch) -> dict:
        key = (d.kind, d.lam, d.dense_layers, d.tp_size)
        if key not in cache:
            t0 = time.perf_counter()
            m = evaluate(plan.with_dispatch(d), trace, cluster)
            pace["seconds"] = time.perf_counter() - t0
            cache[key] = {
                "kind": d.kind,
                "lam": d.lam if d.kind == "locality" else None,
                "comm_per_token": m["comm_per_token"],
                "maxvio": m["maxvio"],
                "dispatch": d,
                "per_layer": (m.get("comm_per_layer"), m["maxvio_per_layer"]),
            }
            tried.append({k: v for k, v in cache[key].items() if k not in ("dispatch", "per_layer")})
        return cache[key]

    tol = 1e-9
    if params.engine_rule is not None:  # the engine's rule: nothing to choose
        r = score(params.rule_dispatch(problem))
        return _choice(r, r["maxvio"] <= params.eps + tol, tried)
    if params.lam is not None:
        r = score(params.guard(params.lam))
        return _choice(r, r["maxvio"] <= params.eps + tol, tried)
    lo, hi = 0, len(LAM_GRID) - 1
    if score(params.guard(LAM_GRID[hi]))["maxvio"] <= params.eps + tol:
        while lo < hi and not late():  # smallest feasible index
            mid = (lo + hi) // 2
            if score(params.guard(LAM_GRID[mid]))["maxvio"] <= params.eps + tol:
                hi = mid
            else:
                lo = mid + 1
        if hi > 0:  # refine in log space between the last infeasible and the first feasible λ
            a, b = float(LAM_GRID[hi - 1]), float(LAM_GRID[hi])
            for _ in range(REFINE_STEPS):
                if late():
                    break
                geo = math.sqrt(a * b)
                if score(params.guard(geo))["maxvio"] <= params.eps + tol:
                    b = geo
                else:
                    a = geo
    elif params.dispatch == "auto":
        score(Dispatch(kind="lp"))
    feasible = [r for r in cache.values() if r["maxvio"] <= params.eps + tol]
    if feasible:
        best = min(feasible, key=lambda r: (r["comm_per_token"], r["maxvio"]))
        if params.family_guard and best["kind"] == "locality":
            best = _family_guard(plan, best, trace, cluster, params, score, late)
    else:
        best = min(cache.values(), key=lambda r: (r["maxvio"], r["comm_per_token"]))
    return _choice(best, bool(feasible), tried, bool(pace["capped"]))


def _choice(r: dict, met: bool, tried: list[dict], capped: bool = False) -> DispatchChoice:
    """The `DispatchChoice` of one scored dispatch ``r`` (`choose_dispatch`'s cache entry)."""
    comm, vio = r["per_layer"]
    return DispatchChoice(
        r["dispatch"], r["comm_per_token"], r["maxvio"], met, tried, r.get("worst_family_maxvio"), capped, comm, vio
    )


def _family_guard(
    plan: Plan, best: dict, trace: Trace, cluster: Any, params: JointParams, score: Any, late: Any
) -> dict:
    """Raise the guard's λ (doubling) while a single family's calibration MaxVio stays more than
    ``FAMILY_SLACK`` (relative) above the most balanced guard's (the largest λ of the grid), as
    long as the mixture stays within ``eps`` and the calibration communication within
    ``FAMILY_COMM_SLACK`` of the mixture's choice.

    λ is chosen on the mixture; on one family's own tokens (the shift a deployment sees) the
    guard at that λ can leave a GPU far hotter than a larger λ would, for little communication
    (benchmark: qwen1.5-moe, 2 replica slots, eps 0.06: worst held-out family MaxVio 1.44 at
    λ = 1, 1.03 at λ = 4, remote GPUs per token +0.3 %). ``late()``: whether the time left is too
    short for another scoring (`choose_dispatch`).
    """
    names = trace.family_names if len(trace.family_names) > 1 else []
    families = [f for f in (trace.only_family(n) for n in names) if f.tokens > 0]
    if not families or late():  # nothing to guard, or no time left to score the families
        return best
    worst_of: dict[float, float] = {}

    def worst(lam: float) -> float:
        if lam not in worst_of:
            p = plan.with_dispatch(params.guard(lam))
            worst_of[lam] = max(float(evaluate(p, f, cluster)["maxvio"]) for f in families)
        return worst_of[lam]

    top = float(LAM_GRID[-1])
    ref = worst(top)
    lam = float(best["lam"])
    comm_cap = (1.0 + FAMILY_COMM_SLACK) * best["comm_per_token"]
    while worst(lam) > (1.0 + FAMILY_SLACK) * ref + 1e-9 and lam < top and not late():
        lam = min(2.0 * lam, top)
        r = score(params.guard(lam))
        if r["maxvio"] > params.eps + 1e-9 or r["comm_per_token"] > comm_cap:
            break
        best = r
    best["worst_family_maxvio"] = worst(float(best["lam"]))
    return best


def restart_seed(seed: int, r: int) -> int:
    """The seed of ``joint``'s restart ``r`` (the run's own seed for the first)."""
    return seed if r == 0 else int(np.random.SeedSequence([seed, r]).generate_state(1)[0])


def _restart_rank(choice: DispatchChoice) -> tuple:
    """Restarts are ranked: within ``eps`` first, then fewest calibration remote GPUs per token
    (within) or the smallest MaxVio (over)."""
    return (0, choice.comm, choice.maxvio) if choice.met else (1, choice.maxvio, choice.comm)


def ladder_limits(
    searched: np.ndarray,
    limits: np.ndarray,
    reached: np.ndarray,
    within: np.ndarray,
    over: np.ndarray,
    span: tuple[float, float],
) -> np.ndarray:
    """The next search limits of a ladder (SGLang ``lp``): each layer's search, priced with every
    copy's even share, ends below ``limits`` on the rule's own split (it balances each batch), so
    the next search of a layer runs at the limit ``searched`` scaled by how far its plan's
    calibration MaxVio ``reached`` came under (or over) ``limits``; once one limit has given a plan
    within and another one over (``within`` the largest such limit so far, ``over`` the smallest,
    NaN: none), between them (geometric mean). Clipped to ``span`` times ``limits``.

    Updates ``within`` and ``over`` in place."""
    ok = reached <= limits + 1e-9
    within[ok] = np.fmax(within[ok], searched[ok])
    over[~ok] = np.fmin(over[~ok], searched[~ok])
    step = searched * limits / np.maximum(reached, 1e-3 * limits)
    bracket = ~np.isnan(within) & ~np.isnan(over) & (within < over)
    nxt = np.where(bracket, np.sqrt(np.where(bracket, within * over, 1.0)), step)
    return np.clip(nxt, span[0] * limits, span[1] * limits)


def mix_layers(comm: np.ndarray, vio: np.ndarray, eps: float) -> np.ndarray:
    """Per layer, the restart whose plan of that layer to keep (``comm``, ``vio``: ``[R, L]``
    calibration remote GPUs per token and MaxVio of each restart's layers): the fewest remote GPUs
    per token (summed over layers) with the mean MaxVio over layers within ``eps``, a multiple-choice
    knapsack solved exactly by HiGHS (`scipy.optimize.milp`; ``R * L`` binaries), else the most
    balanced plan of each layer."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    R, L = comm.shape
    cols = np.arange(L)
    least = np.argmin(vio, axis=0)
    budget = eps * L + 1e-9
    if vio[least, cols].sum() > budget:
        return least
    one = np.kron(np.eye(L), np.ones(R))  # x[l * R + r]: layer l from restart r, one per layer
    cap = budget
    for _ in range(4):  # HiGHS holds the knapsack row to its tolerance: tighten by what it overshot
        knap = LinearConstraint(vio.T.reshape(1, -1), -np.inf, cap)
        res = milp(
            comm.T.ravel(),
            constraints=[LinearConstraint(one, 1, 1), knap],
            integrality=np.ones(R * L),
            bounds=Bounds(0, 1),
        )
        if res.x is None:
            break
        pick = res.x.reshape(L, R).argmax(axis=1)
        over = vio[pick, cols].sum() - budget
        if over <= 0:
            return pick
        cap -= over + 1e-9
    return least
