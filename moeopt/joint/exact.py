"""Exact pricing (the ideal dispatch as an LP, `ExactCost`), the exact MILP over slot
contents, and brute force for tiny layers.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from moeopt.budget import run_interruptible
from moeopt.joint.data import JointLayer
from moeopt.joint.state import Move, SlotState


def _patterns(topk: np.ndarray, family: np.ndarray, families: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted top-k sets ``[M, k]`` and their token counts per family ``[M, F]``."""
    sets = np.sort(topk, axis=1)
    uniq, inv = np.unique(sets, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    w = np.zeros((len(uniq), families))
    np.add.at(w, (inv, family), 1.0)
    return uniq, w


def routings(pattern: np.ndarray, holds: np.ndarray | None, gpus: int) -> np.ndarray:
    """int ``[R, k]``: every assignment of the pattern's experts to GPUs (holders only when
    ``holds [E, G]`` is given)."""
    opts = [np.arange(gpus) if holds is None else np.nonzero(holds[e])[0] for e in pattern]
    return np.array(list(itertools.product(*opts)), dtype=np.int64).reshape(-1, len(pattern))


def _distinct(rows: np.ndarray) -> np.ndarray:
    s = np.sort(rows, axis=1)
    return 1 + (s[:, 1:] != s[:, :-1]).sum(axis=1)


def ideal_dispatch(layer: JointLayer, holds: np.ndarray) -> tuple[float, np.ndarray]:
    """The joint objective of a plan under the ideal dispatch, by one LP per workload.

    Variables: tokens of each pattern on each of its routings (continuous), the excess of
    each GPU over its limit (and over the family cap, `JointLayer.cap_weights`).
    Minimizes distinct GPUs plus ``penalty`` per excess pair, weighted as in J.

    Returns
    -------
    (J, per_workload)
        J and each workload's weighted share of it ``[1 + F]`` (they sum to J).
    """
    from scipy.optimize import linprog

    pats, w = _patterns(layer.topk, layer.family, layer.families)
    G, F = layer.gpus, layer.families
    eps = layer.limits
    weights, capw, caps = layer.workload_weights, layer.cap_weights, layer.cap_limits
    wk = np.concatenate([w.sum(axis=1, keepdims=True), w], axis=1)  # [M, 1+F]
    per = np.zeros(1 + F)
    rts = [routings(p, holds, G) for p in pats]
    for c in range(1 + F):
        ntok = wk[:, c].sum()
        if ntok == 0 or (weights[c] == 0 and capw[c] == 0):
            continue
        live = np.nonzero(wk[:, c] > 0)[0]
        cols, dist = [], []
        for m in live:
            cols.append(rts[m])
            dist.append(_distinct(rts[m]))
        nv = sum(len(r) for r in cols)
        pid = np.concatenate([np.full(len(r), i) for i, r in enumerate(cols)])
        allr = np.concatenate(cols)
        d = np.concatenate(dist).astype(np.float64)
        # equality: tokens of each pattern
        # load rows, one block per tier (the limit, then the family cap where priced):
        # sum of pairs on g - excess_g <= (1 + limit) * mean
        k = allr.shape[1]
        loads = sp.csr_matrix((np.ones(nv * k), (allr.ravel(), np.repeat(np.arange(nv), k))), shape=(G, nv))
        tiers = [(eps[c], weights[c])] + ([(caps[c], capw[c])] if capw[c] > 0 else [])
        T = len(tiers)
        A_ub = sp.hstack([sp.vstack([loads] * T), -sp.identity(T * G)])
        b_ub = np.repeat([(1.0 + lim) * ntok * k / G for lim, _ in tiers], G)
        cost = np.concatenate([weights[c] * d, np.repeat([wt * layer.penalty for _, wt in tiers], G)])
        A_eq = sp.csr_matrix((np.ones(nv), (pid, np.arange(nv))), shape=(len(live), nv + T * G))
        b_eq = wk[live, c]
        res = linprog(
            cost,
            A_ub=sp.csr_matrix(A_ub),
            b_ub=b_ub,
            A_eq=A_eq,
            b_eq=b_eq,
            bounds=(0, None),
            method="highs",
        )
        if res.status != 0:  # pragma: no cover - feasible by construction (excess is free)
            raise RuntimeError(f"ideal dispatch LP: {res.message}")
        per[c] = res.fun / ntok
    return float(per.sum()), per


class ExactCost:
    """The joint objective under the ideal dispatch (an LP per workload): small layers only.

    Prices the layer's tokens as they are (``pair_weight`` is not used: give it the whole
    workload, not a weighted sample)."""

    def __init__(self, layer: JointLayer) -> None:
        self.layer = layer
        self.value = math.inf

    def reset(self, state: SlotState) -> float:
        self.value = ideal_dispatch(self.layer, state.holds)[0]
        return self.value

    def delta(self, state: SlotState, move: Move) -> float:
        trial = state.copy()
        trial.apply(move)
        return ideal_dispatch(self.layer, trial.holds)[0] - self.value


def check_exact_size(layer: JointLayer, max_columns: int = 60_000) -> int:
    """Columns of the exact MILP; raises ValueError when above ``max_columns``."""
    pats, w = _patterns(layer.topk, layer.family, layer.families)
    live = (w > 0).sum(axis=1) + 1  # calibration + the families it appears in
    k = pats.shape[1]
    cols = int((live * layer.gpus**k).sum()) + layer.experts * layer.gpus
    if cols > max_columns:
        raise ValueError(
            f"the exact joint model needs {cols} columns (patterns x G^k routings), more than {max_columns}; "
            "use 'joint' (local search) for this size"
        )
    return cols


@dataclass
class ExactResult:
    """The exact joint model's answer for one layer."""

    slots: np.ndarray | None
    value: float | None
    bound: float | None
    status: str  # optimal / time_limit / no_solution
    wall_time: float


def solve_exact(layer: JointLayer, *, time_limit: float | None = None, max_columns: int = 60_000) -> ExactResult:
    """The joint MILP of one layer (scipy's HiGHS).

    Binary ``y[e, g]`` (e held by g), ``sum_e y[e, g] <= W``, ``sum_g y[e, g] >= 1``; per
    workload and token pattern a continuous number of tokens on each routing (an assignment
    of the pattern's experts to GPUs), allowed only onto holders (``v <= tokens * y``);
    GPU loads minus an excess variable within ``(1 + eps)`` times the mean; objective the
    weighted distinct GPUs per token plus ``penalty`` per excess pair, as `ExactCost`.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    check_exact_size(layer, max_columns)
    pats, w = _patterns(layer.topk, layer.family, layer.families)
    E, G, W, F = layer.experts, layer.gpus, layer.width, layer.families
    k = pats.shape[1]
    allr = routings(np.arange(k), None, G)  # [G^k, k] GPU of each pattern position
    dist = _distinct(allr).astype(np.float64)
    wk = np.concatenate([w.sum(axis=1, keepdims=True), w], axis=1)
    weights, capw, caps = layer.workload_weights, layer.cap_weights, layer.cap_limits
    eps = layer.limits
    ny = E * G
    c_parts = [np.zeros(ny)]
    rows, cols, vals, lo, hi = [], [], [], [], []
    row = 0
    col = ny
    # holder constraints
    for g in range(G):  # capacity
        rows += [row] * E
        cols += [e * G + g for e in range(E)]
        vals += [1.0] * E
        lo.append(-np.inf)
        hi.append(float(W))
        row += 1
    for e in range(E):  # every expert at least one copy
        rows += [row] * G
        cols += [e * G + g for g in range(G)]
        vals += [1.0] * G
        lo.append(1.0)
        hi.append(np.inf)
        row += 1
    nR = len(allr)
    for c in range(1 + F):
        ntok = wk[:, c].sum()
        if ntok == 0 or (weights[c] == 0 and capw[c] == 0):
            continue
        scale = weights[c] / ntok
        live = np.nonzero(wk[:, c] > 0)[0]
        start = col
        for m in live:
            base = col
            c_parts.append(scale * dist)
            # sum over routings = tokens of the pattern
            rows += [row] * nR
            cols += list(range(base, base + nR))
            vals += [1.0] * nR
            lo.append(wk[m, c])
            hi.append(wk[m, c])
            row += 1
            # v[r] <= tokens * y[e_pos, g_pos] for each position (aggregated over routings
            # that put position pos on g: sum_r v[r] <= tokens * y)
            for pos in range(k):
                e = int(pats[m, pos])
                for g in range(G):
                    rs = np.nonzero(allr[:, pos] == g)[0]
                    rows += [row] * (len(rs) + 1)
                    cols += (base + rs).tolist() + [e * G + g]
                    vals += [1.0] * len(rs) + [-wk[m, c]]
                    lo.append(-np.inf)
                    hi.append(0.0)
                    row += 1
            col += nR
        # load rows with excess over the limit (and over the family cap): the pairs each
        # routing puts on g, the same for every tier
        on_gpu = []
        for g in range(G):
            n_on = (allr == g).sum(axis=1)
            nz = np.nonzero(n_on)[0]
            idx = (start + np.arange(len(live))[:, None] * nR + nz[None, :]).ravel()
            on_gpu.append((idx.tolist(), np.tile(n_on[nz].astype(np.float64), len(live)).tolist()))
        tiers = [((1.0 + eps[c]) * ntok * k / G, scale * layer.penalty)]
        if capw[c] > 0:
            tiers.append(((1.0 + caps[c]) * ntok * k / G, capw[c] / ntok * layer.penalty))
        for limit, price in tiers:
            exc = col
            c_parts.append(np.full(G, price))
            col += G
            for g, (idx, coef) in enumerate(on_gpu):
                rows += [row] * (len(idx) + 1)
                cols += idx + [exc + g]
                vals += coef + [-1.0]
                lo.append(-np.inf)
                hi.append(limit)
                row += 1
    c_vec = np.concatenate(c_parts)
    n = len(c_vec)
    A = sp.csr_matrix((vals, (rows, cols)), shape=(row, n))
    integrality = np.zeros(n)
    integrality[:ny] = 1
    ub = np.full(n, np.inf)
    ub[:ny] = 1.0
    options: dict[str, bool | float] = {"disp": False}
    if time_limit is not None:  # the model's build counts
        options["time_limit"] = max(float(time_limit) - (time.perf_counter() - t0), 0.05)
    # SciPy's HiGHS cannot be cancelled: on Ctrl-C the solve is left behind and the run stops
    res = run_interruptible(
        lambda: milp(
            c_vec,
            constraints=LinearConstraint(A, lo, hi),
            integrality=integrality,
            bounds=Bounds(np.zeros(n), ub),
            options=options,
        )
    )
    wall = time.perf_counter() - t0
    bound = getattr(res, "mip_dual_bound", None)
    if res.x is None:
        return ExactResult(None, None, None if bound is None else float(bound), "no_solution", wall)
    y = np.round(res.x[:ny]).reshape(E, G).astype(bool)
    slots = holds_to_slots(y, W)
    status = "optimal" if res.status == 0 else "time_limit"
    value = float(res.fun)
    return ExactResult(
        slots, value, float(bound) if bound is not None else (value if status == "optimal" else None), status, wall
    )


def holds_to_slots(holds: np.ndarray, width: int) -> np.ndarray:
    """int ``[G, W]`` slots from a holder matrix ``[E, G]`` (ascending ids, then empty)."""
    E, G = holds.shape
    slots = np.full((G, width), -1, dtype=np.int64)
    for g in range(G):
        ids = np.nonzero(holds[:, g])[0]
        if len(ids) > width:
            raise ValueError(f"GPU {g} holds {len(ids)} experts, more than {width} slots")
        slots[g, : len(ids)] = ids
    return slots


def fill_slots(holds: np.ndarray, width: int, load: np.ndarray) -> np.ndarray:
    """Fill each GPU's free slots with copies of the heaviest experts it lacks (a copy never
    hurts the ideal dispatch), then return the slots ``[G, W]``."""
    holds = holds.copy()
    G = holds.shape[1]
    order = np.argsort(-load, kind="stable")
    for g in range(G):
        free = width - int(holds[:, g].sum())
        for e in order:
            if free <= 0:
                break
            if not holds[e, g]:
                holds[e, g] = True
                free -= 1
    return holds_to_slots(holds, width)


def brute_force(layer: JointLayer) -> tuple[float, np.ndarray]:
    """The optimum of the joint objective by enumerating every full plan (tiny layers only):
    each GPU holds ``min(W, E)`` distinct experts (more copies never hurt the ideal dispatch),
    every expert at least one copy; each plan priced by `ideal_dispatch`."""
    E, G, W = layer.experts, layer.gpus, layer.width
    size = min(W, E)
    subsets = list(itertools.combinations(range(E), size))
    if len(subsets) ** G > 20_000:
        raise ValueError("brute force is for tiny layers only")
    best, best_slots = math.inf, None
    seen = set()
    for combo in itertools.product(range(len(subsets)), repeat=G):
        key = tuple(sorted(combo))  # GPUs are interchangeable
        if key in seen:
            continue
        seen.add(key)
        holds = np.zeros((E, G), dtype=bool)
        for g, s in enumerate(combo):
            holds[list(subsets[s]), g] = True
        if not holds.any(axis=1).all():
            continue
        v = ideal_dispatch(layer, holds)[0]
        if v < best - 1e-12:
            best, best_slots = v, holds_to_slots(holds, W)
    assert best_slots is not None
    return best, best_slots
