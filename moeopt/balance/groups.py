"""Spreading every expert group's load over the GPUs, for balance that holds when the loads shift.

Models with group-limited routing (DeepSeek-V3 / R1: 256 routed experts in ``n_group = 8`` groups of
32 consecutive ids, each token choosing its experts inside 4 of the 8 groups) shift load between
workloads *by group*: on the bundled DeepSeek-V3 recordings (prefill vs decode) the group of an
expert explains 19 % of the variance of its log-load shift that is left after the regression to the
mean (chance: 2.7 %), and the groups' shares of a layer's load move by 15 % on average. A plan
packed for the calibration loads alone gives some GPUs much more of one group's load than others
(the largest per-GPU deviation from the GPU's fair share of every group is about half the mean GPU
load), so a group that grows on the other workload overloads them.

`group_spread_batch` keeps each layer's balance on the calibration loads (every GPU's load stays
at or below ``cap``: the larger of the plan's own largest GPU load and ``mean * (1 + slack)``) and
lowers ``Q = sum_g sum_k (S[g, k] - S_k / G) ** 2``, where ``S[g, k]`` is GPU ``g``'s load from group
``k`` and ``S_k`` the group's total, by exchanging two items (copies) of about equal load between two
GPUs. Exchanges that keep the cap pair items close in the loads' sorted order: only pairs at most
``window`` ranks apart are scored (on the DeepSeek-V3 loads every exchange a search over all pairs
applies is within 12 ranks). Every round scores all those pairs of every layer at once, as
``[L, P, window]`` arrays, and applies up to ``picks`` improving exchanges per layer on disjoint GPU
pairs, best first. Copy counts, the colocation rule and (with ``classes``) the number of items of
every class per GPU are kept.

Measured on the DeepSeek-V3 files (plan on one, score on the other, ``even`` dispatch; 8 groups):
held-out MaxVio is formulations/balance.md's table ("Spreading the expert groups").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from moeopt.balance.loads import FloatArray, IntArray

#: every GPU's load may rise to ``mean * (1 + DEFAULT_GROUP_SLACK * LPT's MaxVio)`` (in sample, the
#: plan stays far below EPLB's MaxVio, which is about LPT's)
DEFAULT_GROUP_SLACK = 0.05
#: items at most this many ranks apart (in each layer's sorted per-copy loads) are exchanged
DEFAULT_WINDOW = 4
#: candidates per layer and round, best first, each re-checked before it is applied
DEFAULT_PICKS = 48
#: rounds of scoring
DEFAULT_ROUNDS = 1


def expert_groups(experts: int, groups: int) -> IntArray:
    """int ``[E]``: the group of every expert when ``groups`` groups hold consecutive ids
    (DeepSeek-V3's router: expert ``e`` is in group ``e // (E / n_group)``)."""
    if groups < 1 or experts % groups:
        raise ValueError(f"{groups} expert groups must divide {experts} experts")
    return np.arange(experts, dtype=np.int64) // (experts // groups)


def group_imbalance(slots: ArrayLike, loads: ArrayLike, groups: ArrayLike) -> FloatArray:
    """float ``[L]``: the largest per-GPU distance ``sqrt(sum_k (S[g, k] - S_k / G) ** 2)`` over the
    mean GPU load (0: every GPU holds its fair share of every group's load)."""
    s = np.asarray(slots, dtype=np.int64)
    Ld = np.asarray(loads, dtype=np.float64)
    grp = np.asarray(groups, dtype=np.int64)
    nL, G, W = s.shape
    E = Ld.shape[1]
    NG = int(grp.max()) + 1
    flat = s.reshape(nL, -1)
    c = np.bincount((np.arange(nL)[:, None] * E + flat).ravel(), minlength=nL * E).reshape(nL, E)
    w = np.take_along_axis(Ld / np.maximum(c, 1), flat, axis=1)
    cell = (np.arange(nL)[:, None] * G + np.repeat(np.arange(G), W)[None, :]) * NG + grp[flat]
    S = np.bincount(cell.ravel(), w.ravel(), minlength=nL * G * NG).reshape(nL, G, NG)
    D = S - S.sum(axis=1, keepdims=True) / G
    mean = Ld.sum(axis=1) / G
    dist = np.sqrt((D**2).sum(axis=2)).max(axis=1)
    return np.divide(dist, mean, out=np.zeros(nL), where=mean > 0)


def group_spread_batch(
    slots: ArrayLike,
    loads: ArrayLike,
    groups: ArrayLike,
    *,
    slack: float | ArrayLike = 0.0,
    classes: ArrayLike | None = None,
    allow_colocated: bool = False,
    window: int = DEFAULT_WINDOW,
    picks: int = DEFAULT_PICKS,
    rounds: int = DEFAULT_ROUNDS,
) -> tuple[IntArray, IntArray]:
    """Exchange copies of about equal load so every GPU holds its share of every group's load.

    Parameters
    ----------
    slots : array_like of int, shape (L, G, W)
        Plans (copy counts are read from them and kept).
    loads : array_like of float, shape (L, E)
        Calibration loads (``even`` dispatch: a copy carries ``load / copies``).
    groups : array_like of int, shape (E,)
        Group of every expert (`expert_groups`).
    slack : float or array_like of float, shape (L,)
        Every GPU's load stays ``<= max(its layer's largest GPU load, mean * (1 + slack))``.
    classes : array_like of int, shape (L, E), optional
        Only items of one class are exchanged (e.g. replicated with replicated, so the spread of
        multi-copy experts holds).
    allow_colocated : bool
        Allow exchanges that put two copies of one expert on one GPU.
    window, picks, rounds : int
        Pairs at most ``window`` ranks apart in the sorted loads; up to ``picks`` exchanges per layer
        and round; rounds (a layer stops early when nothing improves).

    Returns
    -------
    (slots, exchanges) : int ``[L, G, W]`` and int ``[L]``
        Every GPU at or below the cap, the group imbalance ``Q`` never higher; deterministic.
    """
    e = np.array(slots, dtype=np.int64)
    Ld = np.asarray(loads, dtype=np.float64)
    grp = np.asarray(groups, dtype=np.int64)
    if e.ndim != 3 or e.shape[0] != Ld.shape[0]:
        raise ValueError(f"slots must be [L, G, W] with L = {Ld.shape[0]}, got shape {e.shape}")
    nL, G, W = e.shape
    E = Ld.shape[1]
    P = G * W
    if grp.shape != (E,):
        raise ValueError(f"groups must be [E] = [{E}], got shape {grp.shape}")
    exchanges = np.zeros(nL, dtype=np.int64)
    if nL == 0 or G < 2 or P < 2:
        return e, exchanges
    NG = int(grp.max()) + 1
    K = max(1, min(int(window), P - 1))
    ar = np.arange(nL)
    flat = e.reshape(nL, P)
    cnt = np.bincount((ar[:, None] * E + flat).ravel(), minlength=nL * E).reshape(nL, E)
    w_slot = np.take_along_axis(Ld / np.maximum(cnt, 1), flat, axis=1)
    # items by rank in each layer's sorted per-copy loads: weight, expert, group, class fixed; GPU moves
    order = np.argsort(w_slot, axis=1, kind="stable")
    w = np.take_along_axis(w_slot, order, axis=1)  # [L, P]
    ex = np.take_along_axis(flat, order, axis=1)
    kk = grp[ex]
    gpu = order // W
    cls = None if classes is None else np.take_along_axis(np.asarray(classes, dtype=np.int64), ex, axis=1)
    s = np.zeros((nL, G))
    np.add.at(s, (ar[:, None], gpu), w)
    S = np.bincount(((ar[:, None] * G + gpu) * NG + kk).ravel(), w.ravel(), minlength=nL * G * NG)
    S = S.reshape(nL, G, NG)
    mean = Ld.sum(axis=1) / G
    cap = np.maximum(s.max(axis=1), mean * (1.0 + np.asarray(slack, dtype=np.float64)))
    tol = 1e-12 * np.maximum(mean, 1e-300) ** 2
    pres = None  # pres[l, g, x]: GPU g of layer l holds expert x
    if not allow_colocated:
        pres = np.zeros((nL, G, E), dtype=bool)
        pres[ar[:, None], gpu, ex] = True
    # candidate pairs (r, r + d), d = 1..K, as fixed rank pairs [P, K] (past the end: masked)
    r = np.arange(P)[:, None]
    t = r + np.arange(1, K + 1)[None, :]
    inside = t < P
    t = np.minimum(t, P - 1)
    same_item = (ex[:, r] == ex[:, t]) | ~inside[None]  # [L, P, K]
    if cls is not None:
        same_item |= cls[:, r] != cls[:, t]
    wi, wj = w[:, r], w[:, t]
    ki, kj = kk[:, r], kk[:, t]
    # the quadratic term: 2 (wj - wi)^2 when both items are of one group, else 2 wi^2 + 2 wj^2
    quad = 2 * (wi * wi + wj * wj)
    quad -= np.where(ki == kj, 4 * wi * wj, 0.0)
    M = max(int(picks), 1)  # best candidates per layer taken per round, best first
    M = min(M, P * K)
    lg0 = (ar * G)[:, None, None]  # flat (layer, GPU) row offset
    pres_f = None if pres is None else pres.reshape(-1)
    dw = wj - wi  # the first item's GPU gains dw, the second's loses it
    wi2, wj2 = 2 * wi, 2 * wj
    cap3, tol3 = cap[:, None, None], -tol[:, None, None]
    sf = s.reshape(-1)
    Sf = S.reshape(-1)
    active = np.ones(nL, dtype=bool)
    for _ in range(max(int(rounds), 0)):
        if not active.any():
            break
        la = lg0 + gpu[:, r]  # [L, P, K] flat (layer, GPU) rows of the two items
        lb = lg0 + gpu[:, t]
        ok = la != lb
        ok &= ~same_item
        ok &= sf[la] + dw <= cap3
        ok &= sf[lb] - dw <= cap3
        laN, lbN = la * NG, lb * NG
        # the linear term (the groups' means cancel; the same when both items are of one group)
        dQ = wi2 * (Sf[lbN + ki] - Sf[laN + ki])
        dQ += wj2 * (Sf[laN + kj] - Sf[lbN + kj])
        dQ += quad
        ok &= dQ < tol3
        ok &= active[:, None, None]
        dQ = np.where(ok, dQ, np.inf).reshape(nL, P * K)
        # the M best candidates per layer, best first; the picks take them in order on untouched GPUs
        top = np.argpartition(dQ, M - 1, axis=1)[:, :M] if M < P * K else np.broadcast_to(np.arange(P * K), (nL, M))
        tv = np.take_along_axis(dQ, top, axis=1)
        srt = np.argsort(tv, axis=1, kind="stable")
        top, tv = np.take_along_axis(top, srt, axis=1), np.take_along_axis(tv, srt, axis=1)
        ci, cd = np.divmod(top, K)
        cj = t[ci, cd]
        # what does not change within the round, for all candidates at once ([L, M])
        cx, cy = np.take_along_axis(w, ci, axis=1), np.take_along_axis(w, cj, axis=1)
        cki, ckj = np.take_along_axis(kk, ci, axis=1), np.take_along_axis(kk, cj, axis=1)
        cxi, cxj = np.take_along_axis(ex, ci, axis=1), np.take_along_axis(ex, cj, axis=1)
        cquad = np.take_along_axis(quad.reshape(nL, P * K), top, axis=1)
        row = (ar * G)[:, None]
        live_m = np.isfinite(tv)
        taken = np.zeros(nL, dtype=np.int64)
        # take the candidates best first, each re-checked on the current plan (earlier exchanges of
        # this round may have moved its items or changed its GPUs' loads): exact gain, cap, colocation
        for m in range(M):
            live = live_m[:, m]
            if not live.any():
                break
            ls = ar[live]
            i, j = ci[live, m], cj[live, m]
            fa, fb = row[live, 0] + gpu[ls, i], row[live, 0] + gpu[ls, j]  # flat (layer, GPU) rows
            x, y = cx[live, m], cy[live, m]  # item i -> GPU b, item j -> GPU a
            ki_, kj_ = cki[live, m], ckj[live, m]
            gain = 2 * x * (Sf[fb * NG + ki_] - Sf[fa * NG + ki_]) + 2 * y * (Sf[fa * NG + kj_] - Sf[fb * NG + kj_])
            gain += cquad[live, m]
            d = y - x
            go = (fa != fb) & (gain < -tol[ls]) & (sf[fa] + d <= cap[ls]) & (sf[fb] - d <= cap[ls])
            xi, xj = cxi[live, m], cxj[live, m]
            if pres_f is not None:  # no colocated copies
                go &= ~pres_f[fa * E + xj] & ~pres_f[fb * E + xi]
            if not go.any():
                continue
            ls, i, j, fa, fb, x, y, d = ls[go], i[go], j[go], fa[go], fb[go], x[go], y[go], d[go]
            ki_, kj_, xi, xj = ki_[go], kj_[go], xi[go], xj[go]
            sf[fa] += d
            sf[fb] -= d
            Sf[fa * NG + ki_] -= x
            Sf[fa * NG + kj_] += y
            Sf[fb * NG + kj_] -= y
            Sf[fb * NG + ki_] += x
            if pres_f is not None:
                pres_f[fa * E + xi] = False
                pres_f[fb * E + xj] = False
                pres_f[fb * E + xi] = True
                pres_f[fa * E + xj] = True
            gpu[ls, i], gpu[ls, j] = fb - ls * G, fa - ls * G
            taken[ls] += 1
        moved = taken > 0
        exchanges += taken
        active &= moved
    out = np.empty((nL, P), dtype=np.int64)
    # rebuild the slot table: every GPU's items in rank order
    key = gpu * P + np.arange(P)[None, :]
    srt = np.argsort(key, axis=1, kind="stable")
    out[:] = np.take_along_axis(ex, srt, axis=1)
    out = out.reshape(nL, G, W)
    out[exchanges == 0] = e[exchanges == 0]  # a layer without exchanges keeps its slot order
    return out, exchanges
