"""Whole-model load-balance planner: every layer at once, vectorized over layers with numpy.

Same problem and plan format as `moeopt.balance` (one MoE layer: ``E`` experts with loads, ``G``
GPUs of exactly ``W`` slots, ``even`` dispatch, objective the largest GPU load), solved for ``L``
layers together: arrays are shaped ``[L, ...]`` and the Python loops run over item ranks and search
rounds, never over layers, experts or GPUs.

Algorithm (`plan_layers_fast`)
-----------------------------------
1. **Copy counts** (`copy_counts_batch`): per layer exactly `moeopt.balance.copy_counts`
   (the ``R = G*W - E`` extra copies are the ``R`` largest values of ``{load_e / k}``, ties: smaller
   ``k``, then smaller ``e``). Only ``k <= K`` is materialized, ``K`` from the bound
   ``load_e / k >= total / P`` that every selected value meets when no cap binds; a layer whose
   largest left-out value could still be selected is recomputed by the per-layer function, so the
   result is always identical to it.
2. **LPT packing** (`moeopt.packing.lpt_pack_batch`, in the one packing module): heaviest item
   first (copies of one expert adjacent), onto the lightest GPU with a free slot that does not hold
   the expert; one step per item rank, vectorized over layers. Identical to
   `moeopt.packing.lpt_pack` (same order and tie-breaks); a layer where some item finds no
   admissible GPU is re-packed by that function (which repairs).
3. **Swap descent** (`swap_descent_batch`): every round, for every active layer its heaviest GPU
   ``b``: every exchange of one of ``b``'s ``W`` items with an item on one of the ``partners``
   lightest GPUs is scored at once, for all active layers together, as an ``[A, W, partners * W]``
   array of new pair maxima (colocation masks included); layers where none improves score the
   exchanges with every other GPU. The best exchange that brings both GPUs strictly below ``b``'s
   load is applied. A layer stops when no exchange with any GPU improves (a local optimum of the
   max-GPU swap neighbourhood), when its MaxVio reaches ``target``, or after ``max_rounds`` rounds.
   Deterministic: no randomness, no wall clock. Looking at the lightest GPUs first takes about 60 %
   of the time of scoring all ``P`` partners every round and ends at an equally good local optimum
   on the bundled DeepSeek-V3 loads.
   With ``spread`` (the ``balance`` method's default) the start is
   `moeopt.packing.spread_pack_batch` instead (every GPU gets ``floor`` or ``ceil`` of
   ``M / G`` of the ``M`` copies of replicated experts) and exchanges stay within a class
   (replicated copies with replicated copies, single with single), so that spread holds to the
   end; a layer that ends above plain LPT's largest GPU load gets the plain descent from LPT.
   Why: formulations/balance.md ("Spreading the replicated copies"). It costs about 1.5x the
   plain path's time.
4. Optional **connect** (``connect``, the ``balance`` method's default under ``lp`` dispatch):
   `connect_copies_batch` exchanges copies of replicated experts, closest per-copy loads
   first, until every layer's copy graph (GPUs joined by shared experts) is connected, then a swap
   descent over single copies only repairs the loads (the replicated copies, and so the graph,
   stay). Under ``lp`` a GPU hands load only along that graph. On the bundled DeepSeek-V3 files
   (plan on one, score on the other) held-out ``lp`` MaxVio drops 4-16 %, for about 15-20 ms more;
   a layer that ends above plain LPT's largest GPU load keeps its plan without it.
   Or optional **group spread** (``groups``, the ``balance`` method's default when the model has
   expert groups and the plan is not connected): `moeopt.balance.groups.group_spread_batch`
   exchanges copies of about equal load so every GPU holds its share of every router group's load
   (group-limited routers shift load by group), every GPU at or below the larger of the layer's
   largest load and ``mean * (1 + group_slack * LPT's MaxVio)``; with it, the spread descent stops at
   that level (the exchanges may fill each layer up to it anyway).
5. Optional **polish** (``polish_above``, one level or one per layer): layers whose MaxVio is
   still above it are re-planned by `moeopt.balance.plan_layer` (better of LPT/differencing starts,
   replace moves, iterated local search); its plan is kept only where it is better (with
   ``groups``, its groups spread again). It costs about 25 ms per layer: on the bundled
   DeepSeek-V3 loads at 64 x 5 it lowers the mean MaxVio from about 0.00075 to 0.0004 for 30x the
   time, so it is off by default. Where it pays is few slots per GPU and skewed loads: the
   water-filled counts make every copy of a hot expert about as heavy as the largest, and with
   ``W = 2`` more than ``G`` copies heavier than half a GPU's share must then share GPUs two by
   two; the replace moves change the counts. The ``balance`` method polishes the layers whose
   MaxVio lies more than `POLISH_GAP` above their lower bound (DeepSeek-V3-shaped synthetic
   loads at 256 x 2: mean MaxVio 0.37 -> 0.05 in sample, 0.42 -> 0.13 held out).

On the bundled DeepSeek-V3 loads (58 layers, 256 experts) the whole model takes 0.025-0.045 s of one
core at 64 x 5 and 32 x 9, with mean MaxVio about 0.0007 / 0.0002 (with ``spread``: 0.04-0.06 s,
0.0013 / 0.0003), against about 0.02 / 0.007 for DeepSeek's EPLB (global policy), which takes
0.06-0.14 s of CPU in the same process.

This path keeps its own batched kernels rather than the per-layer slot state and driver of
`moeopt.moves` (objects per layer would bring back the Python loop over layers) for its swap
descent; its LPT is the one packing module's (`moeopt.packing`).

Every layer's plan is never worse than LPT on the water-filled copy counts (the descent starts from
exactly that plan and only applies strictly improving exchanges).
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from moeopt.balance.copies import copy_counts
from moeopt.balance.groups import DEFAULT_GROUP_SLACK, group_spread_batch
from moeopt.balance.loads import (
    _RTOL,
    DEFAULT_ITERATIONS,
    FloatArray,
    IntArray,
    _as_load,
    _cap,
    _check_shape,
    _node_shape,
)
from moeopt.balance.planner import plan_layer
from moeopt.packing import lpt_and_spread_pack_batch, lpt_pack_batch

__all__ = [
    "connect_copies_batch",
    "copy_counts_batch",
    "copy_graph_batch",
    "gpu_loads_batch",
    "lpt_pack_batch",
    "maxvio_batch",
    "plan_layers_fast",
    "plan_layers_hierarchical_fast",
    "swap_descent_batch",
]


#: relative tolerance (times the mean GPU load) for a strict improvement; as in moeopt.balance
_TOL = _RTOL * 8
#: weight that makes an exchange inadmissible (finite, so no inf - inf)
_HUGE = 1e300
#: with connect: the spread descent stops at this fraction of LPT's MaxVio (per layer)
CONNECT_TARGET = 0.05
#: lightest GPUs searched first by the swap descent
DEFAULT_PARTNERS = 8


def _as_loads(loads: ArrayLike) -> FloatArray:
    return _as_load(loads, ndim=2)


def _copies_batch(flat: IntArray, E: int) -> IntArray:
    """int ``[L, E]``: copies of every expert in ``flat[L, P]`` (one bincount for all layers)."""
    nL = flat.shape[0]
    return np.bincount((np.arange(nL)[:, None] * E + flat).ravel(), minlength=nL * E).reshape(nL, E)


def gpu_loads_batch(slots: ArrayLike, loads: ArrayLike) -> FloatArray:
    """float ``[L, G]``: per-GPU loads of ``slots[L, G, W]`` under ``even`` dispatch."""
    s = np.asarray(slots, dtype=np.int64)
    Ld = np.asarray(loads, dtype=np.float64)
    nL, E = Ld.shape
    flat = s.reshape(nL, -1)
    c = _copies_batch(flat, E)
    share = Ld / np.maximum(c, 1)
    return np.take_along_axis(share, flat, axis=1).reshape(s.shape).sum(axis=2)


def maxvio_batch(slots: ArrayLike, loads: ArrayLike) -> FloatArray:
    """float ``[L]``: MaxVio (``max / mean - 1``, 0 for an empty layer) of every layer."""
    gl = gpu_loads_batch(slots, loads)
    mean = gl.mean(axis=1)
    safe = np.where(mean > 0, mean, 1.0)
    return np.where(mean > 0, gl.max(axis=1) / safe - 1.0, 0.0)


# --------------------------------------------------------------------------------------------------
# copy counts
# --------------------------------------------------------------------------------------------------


def copy_counts_batch(loads: ArrayLike, copies_total: int, max_copies: int | None = None) -> IntArray:
    """`moeopt.balance.copy_counts` for every row of ``loads[L, E]``; int ``[L, E]``.

    ``max_copies`` is one bound for every expert (default ``copies_total - E + 1``). The result equals
    the per-layer function's row by row, ties included.
    """
    Ld = _as_loads(loads)
    nL, E = Ld.shape
    total = int(copies_total)
    if total < E:
        raise ValueError(f"copies_total={total} < number of experts {E}")
    R = total - E
    cap = R + 1 if max_copies is None else min(int(max_copies), R + 1)
    if cap < 1:
        raise ValueError("max_copies must be >= 1")
    if cap * E < total:
        raise ValueError(f"max_copies allows at most {cap * E} copies, {total} requested")
    counts = np.ones((nL, E), dtype=np.int64)
    if R == 0 or nL == 0:
        return counts
    tot = Ld.sum(axis=1)
    pos = tot > 0
    # every selected value is >= total / P when no cap binds: k <= load_e * P / total
    kneed = int(np.floor((Ld[pos].max(axis=1) * total / tot[pos]).max())) + 1 if pos.any() else 1
    K = max(1, min(cap - 1, max(kneed, -(-R // E))))
    k = np.arange(1, K + 1, dtype=np.float64)
    vals = (Ld[:, None, :] / k[None, :, None]).reshape(nL, K * E)  # flat order: k, then e (tie order)
    if R < vals.shape[1]:
        thr = -np.partition(-vals, R - 1, axis=1)[:, R - 1]
        gt = vals > thr[:, None]
        need = R - gt.sum(axis=1)
        eq = vals == thr[:, None]
        sel = gt | eq
        tie = np.flatnonzero(eq.sum(axis=1) > need)  # more ties at the threshold than copies left
        if tie.size:
            sel[tie] = gt[tie] | (eq[tie] & (np.cumsum(eq[tie], axis=1) <= need[tie, None]))
    else:
        thr = np.full(nL, -np.inf)
        sel = np.ones(vals.shape, dtype=bool)
    counts += sel.reshape(nL, K, E).sum(axis=1)
    if K < cap - 1:  # a left-out value load_e / (K + 1) above the threshold: recompute that layer
        bad = np.flatnonzero((Ld.max(axis=1) / (K + 1) > thr) | (counts.sum(axis=1) != total))
        for l in bad:
            counts[l] = copy_counts(Ld[l], total, cap)
    return counts


# --------------------------------------------------------------------------------------------------
# LPT packing
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# swap descent
# --------------------------------------------------------------------------------------------------


def swap_descent_batch(
    slots: ArrayLike,
    loads: ArrayLike,
    *,
    allow_colocated: bool = False,
    target: float | ArrayLike | None = None,
    max_rounds: int | None = None,
    partners: int | None = DEFAULT_PARTNERS,
    classes: ArrayLike | None = None,
) -> tuple[IntArray, IntArray]:
    """Max-GPU swap descent on every layer at once (copy counts fixed).

    Every round, for every active layer, its heaviest GPU ``b`` looks for the best exchange of one of
    its items with an item on one of the ``partners`` lightest other GPUs, and on all other GPUs when
    none of those gives an improving exchange; the best exchange is applied when both GPUs end
    strictly below ``b``'s load. A layer stops when it has no improving exchange (a local optimum of
    the max-GPU swap neighbourhood), when its MaxVio is ``<= target``, or after ``max_rounds``
    rounds.

    Parameters
    ----------
    slots : array_like of int, shape (L, G, W)
        Start plans (every expert at least one copy; no colocated copies unless
        ``allow_colocated``).
    loads : array_like of float, shape (L, E)
    allow_colocated : bool
        Allow exchanges that put two copies of one expert on one GPU.
    target : float or array_like of float, shape (L,), optional
        A layer stops once its MaxVio is ``<= target`` (one value, or one per layer).
    max_rounds : int, optional
        Cap on rounds, i.e. exchanges per layer (default ``4 * G * W``).
    partners : int, optional
        Lightest GPUs searched first (``None``: all at once). Only the path changes, not the
        stopping rule.
    classes : array_like of int, shape (L, E), optional
        A class per expert; only items of one class are exchanged, so every GPU keeps its number
        of items of each class (the spread of multi-copy experts, `spread_pack_batch`).

    Returns
    -------
    (slots, swaps) : int ``[L, G, W]`` and int ``[L]`` (exchanges applied per layer)
    """
    Ld = _as_loads(loads)
    e = np.array(slots, dtype=np.int64)
    if e.ndim != 3 or e.shape[0] != Ld.shape[0]:
        raise ValueError(f"slots must be [L, G, W] with L = {Ld.shape[0]}, got shape {e.shape}")
    nL, G, W = e.shape
    P = G * W
    E = Ld.shape[1]
    if e.size and (e.min() < 0 or e.max() >= E):
        raise ValueError("slot holds an expert id outside [0, E)")
    cnt = _copies_batch(e.reshape(nL, P), E)
    if np.any(cnt < 1):
        raise ValueError("a layer has an expert without a copy")
    if not allow_colocated and W > 1:
        srt = np.sort(e, axis=2)
        if (srt[:, :, 1:] == srt[:, :, :-1]).any():
            raise ValueError("start plan has colocated copies; pass allow_colocated=True")
    w = np.take_along_axis(Ld / cnt, e.reshape(nL, P), axis=1).reshape(nL, G, W)
    s = w.sum(axis=2)
    mean = s.mean(axis=1)
    tol = _TOL * np.maximum(mean, 1e-300)
    stop = mean * (1.0 + np.asarray(target, dtype=np.float64)) if target is not None else np.full(nL, -np.inf)
    rounds = 4 * P if max_rounds is None else int(max_rounds)
    swaps = np.zeros(nL, dtype=np.int64)
    act = np.flatnonzero(mean > 0)
    Q = G - 1 if partners is None else max(1, min(int(partners), G - 1))
    ef, wf, sf = e.reshape(-1), w.reshape(-1), s.reshape(-1)  # flat views
    e2, w2 = e.reshape(nL * G, W), w.reshape(nL * G, W)  # rows = (layer, GPU)
    pres = None  # pres[(layer * G + GPU) * E + x]: the GPU holds expert x
    if not allow_colocated:
        pres = np.zeros(nL * G * E, dtype=bool)
        pres[(np.arange(nL * G)[:, None] * E + e2).ravel()] = True
    c2 = None  # class of every slot's expert, rows = (layer, GPU); exchanges keep it (same class)
    if classes is not None:
        cl = np.asarray(classes, dtype=np.int64)
        if cl.shape != (nL, E):
            raise ValueError(f"classes must be [L, E] = [{nL}, {E}], got shape {cl.shape}")
        c2 = np.take_along_axis(cl, e.reshape(nL, P), axis=1).reshape(nL * G, W)
        if c2.size:  # compared every round: the narrowest type that holds the classes is faster
            c2 = c2.astype(np.promote_types(np.min_scalar_type(c2.min()), np.min_scalar_type(c2.max())))
    for _ in range(rounds):
        if act.size == 0:
            break
        sA = s[act]  # [A, G]
        b = sA.argmax(axis=1)
        ra = np.arange(act.size)
        sb = sA[ra, b]
        keep = sb > stop[act]
        if not keep.all():
            act, sA, b, sb, ra = act[keep], sA[keep], b[keep], sb[keep], ra[: int(keep.sum())]
            if act.size == 0:
                break
        sA[ra, b] = np.inf  # b is no partner of itself
        fb = act * G + b  # flat (layer, GPU) row of b
        i, g2, j, v = _best_swaps(e2, w2, pres, act, fb, sA, sb, Q, c2)
        ok = v < sb - tol[act]
        if Q < G - 1 and not ok.all():  # nothing among the lightest GPUs: try all of them
            n = np.flatnonzero(~ok)
            i[n], g2[n], j[n], v[n] = _best_swaps(e2, w2, pres, act[n], fb[n], sA[n], sb[n], G - 1, c2)
            ok = v < sb - tol[act]
        if not ok.all():
            act, b, fb, i, g2, j = act[ok], b[ok], fb[ok], i[ok], g2[ok], j[ok]
            if act.size == 0:
                break
        p1 = fb * W + i  # flat slot on b
        p2 = (act * G + g2) * W + j  # flat partner slot
        x1, x2 = ef[p1], ef[p2]
        ef[p1], ef[p2] = x2, x1
        y1, y2 = wf[p1], wf[p2]
        wf[p1], wf[p2] = y2, y1
        f2 = act * G + g2
        sf[fb] += y2 - y1
        sf[f2] += y1 - y2
        if pres is not None:
            pres[fb * E + x1] = False
            pres[f2 * E + x2] = False
            pres[fb * E + x2] = True
            pres[f2 * E + x1] = True
        swaps[act] += 1
    return e, swaps


def _best_swaps(
    e2: IntArray,
    w2: FloatArray,
    pres: NDArray[np.bool_] | None,
    act: IntArray,
    fb: IntArray,
    sA: FloatArray,
    sb: FloatArray,
    Q: int,
    c2: IntArray | None = None,
) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
    """Best exchange of an item of GPU row ``fb[a]`` (layer ``act[a]``) with an item of another GPU.

    ``e2``/``w2`` are experts/weights with rows = (layer, GPU), ``pres`` the flat presence matrix
    (``None``: colocation allowed); ``sA[a]`` the layer's GPU loads with ``inf`` at the source.
    Partners: the ``Q`` lightest GPUs (all when ``Q >= G - 1``); ``c2`` (optional, like ``e2``): the
    class of every slot's expert, only items of one class are exchanged. Returns ``(slot on the source,
    partner GPU, partner slot, new pair maximum)``, each ``[A]``.
    """
    A, G = sA.shape
    W = e2.shape[1]
    ra = np.arange(A)
    if Q >= G - 1:
        cand = np.broadcast_to(np.arange(G), (A, G))
        sc = sA
        rows = (act * G)[:, None] + cand
    else:
        cand = np.argpartition(sA, Q - 1, axis=1)[:, :Q]
        sc = sA[ra[:, None], cand]
        rows = (act * G)[:, None] + cand
    Qn = cand.shape[1]
    wc = w2[rows]  # [A, Q, W]
    wb = w2[fb]  # [A, W]
    if pres is None:
        d = wc.reshape(A, 1, Qn * W) - wb[:, :, None]  # [A, W, Q*W]
        part = sc[:, None, :, None]  # the partner GPU's load, broadcast over both items
    else:
        E = pres.size // e2.shape[0]
        # a partner item whose expert is on the source gets a huge weight (d + sb huge); a GPU that
        # holds a source item's expert gets an infinite load for that item
        inb = pres[(fb * E)[:, None, None] + e2[rows]]  # [A, Q, W]
        onp = pres[(rows * E)[:, None, :] + e2[fb][:, :, None]]  # [A, W, Q]
        d = np.where(inb, _HUGE, wc).reshape(A, 1, Qn * W) - wb[:, :, None]
        part = np.where(onp, np.inf, sc[:, None, :])[:, :, :, None]
    val = (part - d.reshape(A, W, Qn, W)).reshape(A, W, Qn * W)  # the partner loses d
    d += sb[:, None, None]  # the source gains d
    np.maximum(val, d, out=val)
    if c2 is not None:  # an exchange across classes is inadmissible
        np.putmask(val, c2[fb][:, :, None] != c2[rows].reshape(A, 1, Qn * W), np.inf)
    val = val.reshape(A, -1)
    k = val.argmin(axis=1)
    i, r = np.divmod(k, Qn * W)
    q, j = np.divmod(r, W)
    return i, cand[ra, q], j, val[ra, k]


def copy_graph_batch(slots: ArrayLike, counts: ArrayLike) -> tuple[IntArray, IntArray, NDArray[np.bool_]]:
    """The copy graph of every layer: GPUs joined by the experts they share.

    As a bipartite graph (a node per GPU and per expert, an edge per copy of a replicated
    expert), every layer at once (one block per layer). Returns the component of every GPU
    ``[L, G]``, the number of components per layer ``[L]``, and per slot ``[L, G * W]`` whether its
    copy is a non-tree edge of a spanning forest: such a copy lies on a cycle, so moving it away
    leaves its component connected.
    """
    ef = np.asarray(slots, dtype=np.int64)
    nL, G, W = ef.shape
    ef = ef.reshape(nL, G * W)
    cnt = np.asarray(counts, dtype=np.int64)
    E = cnt.shape[1]
    V = G + E
    multi = (np.take_along_axis(cnt, ef, axis=1) >= 2).ravel()
    lay = np.repeat(np.arange(nL), G * W)
    u = (lay * V + np.tile(np.repeat(np.arange(G), W), nL))[multi]
    v = (lay * V + G + ef.ravel())[multi]
    N = nL * V
    # one edge per (GPU, expert): a colocated copy is a parallel edge, on a cycle of two
    srt = np.sort(ef.reshape(nL * G, W), axis=1)
    if W > 1 and (srt[:, 1:] == srt[:, :-1]).any():
        first = np.unique(u * N + v, return_index=True)[1]
    else:
        first = np.arange(u.size)
    # distinct weights 1..m: the spanning forest's data names its edges
    graph = coo_matrix((np.arange(1, first.size + 1, dtype=np.float64), (u[first], v[first])), shape=(N, N)).tocsr()
    _, label = connected_components(graph, directed=False)
    tree = np.zeros(first.size, dtype=bool)
    tree[minimum_spanning_tree(graph).data.astype(np.int64) - 1] = True
    in_tree = np.zeros(u.size, dtype=bool)
    in_tree[first] = tree
    off_tree = np.zeros(nL * G * W, dtype=bool)
    off_tree[np.flatnonzero(multi)] = ~in_tree
    glab = label.reshape(nL, V)[:, :G]
    srt = np.sort(glab, axis=1)
    return glab, 1 + (srt[:, 1:] != srt[:, :-1]).sum(axis=1), off_tree.reshape(nL, G * W)


def connect_copies_batch(slots: ArrayLike, loads: ArrayLike) -> tuple[IntArray, IntArray]:
    """Exchange copies of replicated experts until every layer's copy graph is connected.

    Under ``lp`` dispatch a GPU hands load only to GPUs it shares an expert with, and through
    them further along the copy graph (GPUs joined by shared experts); a component of that graph
    balances only within itself. With ``R`` redundant copies the graph can be connected when
    ``R >= G - 1`` (a spanning tree uses ``G - 1``), but packing for balance alone leaves about
    seven components per DeepSeek-V3 layer at ``R = G``.

    On the bipartite GPU-expert graph of `copy_graph_batch` with a spanning forest F: the
    exchange of a copy ``p`` = (GPU a, expert x) off F (component A) with a copy ``q`` = (GPU b,
    expert y) of component B != A (no colocation) merges A and B: A stays spanned by F without
    ``p``; (b, x) joins B's part holding b to A and (a, y) joins A to B's part holding y. F minus
    ``q`` plus (b, x) and, when ``q`` was on F, (a, y) spans the merged component, so every other
    copy off F stays off it and (a, y) is off it when ``q`` was: the forest is kept up to date
    without recomputing it. Every step applies, per layer, the exchange with the closest per-copy
    loads; a layer stops when connected or when no such exchange exists. Single copies never
    move, so the loads change only by the exchanged copies' differences (a single-copy descent
    repairs them, `plan_layers_fast`).

    Returns the slots ``[L, G, W]`` and the exchanges per layer ``[L]`` (each merged two
    components).
    """
    ef = np.array(slots, dtype=np.int64)
    nL, G, W = ef.shape
    P = G * W
    Ld = _as_loads(loads)
    E = Ld.shape[1]
    cnt = _copies_batch(ef.reshape(nL, P), E)
    glab, n, off_tree = copy_graph_batch(ef, cnt)
    ef = ef.reshape(nL, P)
    share = Ld / cnt
    gof = np.repeat(np.arange(G), W)
    pres = _copies_batch(ef.reshape(nL * G, W), E).ravel()  # copies of expert x on GPU g: [(layer * G + g) * E + x]
    multi = np.take_along_axis(cnt, ef, axis=1) >= 2
    swaps = np.zeros(nL, dtype=np.int64)
    while True:  # a pass over the copies off the forest; the next pass sees those the exchanges added
        act = np.flatnonzero((n > 1) & off_tree.any(axis=1))
        if act.size == 0:
            break
        K, M = int(off_tree[act].sum(axis=1).max()), int(multi[act].sum(axis=1).max())
        pk = np.argsort(~off_tree[act], axis=1, kind="stable")[:, :K]  # slots of copies off the forest
        qm = np.argsort(~multi[act], axis=1, kind="stable")[:, :M]  # slots of replicated copies
        alive = (
            np.take_along_axis(off_tree[act], pk, axis=1)[:, :, None]
            & np.take_along_axis(multi[act], qm, axis=1)[:, None, :]
        )
        alive &= pk[:, :, None] != qm[:, None, :]
        gp, gq = gof[pk], gof[qm]
        merged_any = False
        while True:
            r = np.flatnonzero(alive.any(axis=(1, 2)))  # rows (layers of act) with candidates left
            if r.size == 0:
                break
            lay_r, pk_r, qm_r, gp_r, gq_r = act[r], pk[r], qm[r], gp[r], gq[r]
            efr = ef[lay_r]
            xp, xq = np.take_along_axis(efr, pk_r, axis=1), np.take_along_axis(efr, qm_r, axis=1)
            cp_, cq = np.take_along_axis(glab[lay_r], gp_r, axis=1), np.take_along_axis(glab[lay_r], gq_r, axis=1)
            rowp, rowq = (lay_r[:, None] * G + gp_r) * E, (lay_r[:, None] * G + gq_r) * E
            ok = alive[r] & (cp_[:, :, None] != cq[:, None, :])
            ok &= pres[rowp[:, :, None] + xq[:, None, :]] == 0  # q's expert not on p's GPU
            ok &= pres[rowq[:, None, :] + xp[:, :, None]] == 0  # and p's not on q's
            diff = np.abs(share[lay_r[:, None], xp][:, :, None] - share[lay_r[:, None], xq][:, None, :])
            cost = np.where(ok, diff, np.inf).reshape(r.size, K * M)
            k = cost.argmin(axis=1)
            found = np.isfinite(cost[np.arange(r.size), k])
            alive[r[~found]] = False
            if not found.any():
                break
            merged_any = True
            a, k = r[found], k[found]
            i, j = np.divmod(k, M)
            lay, p1, p2 = act[a], pk[a, i], qm[a, j]
            x1, x2 = ef[lay, p1], ef[lay, p2]
            g1, g2 = gof[p1], gof[p2]
            ef[lay, p1], ef[lay, p2] = x2, x1
            r1, r2 = (lay * G + g1) * E, (lay * G + g2) * E
            pres[r1 + x1] -= 1
            pres[r2 + x2] -= 1
            pres[r1 + x2] += 1
            pres[r2 + x1] += 1
            # the forest: (g2, x1) joins it; (g1, x2) is off it when q was
            off_tree[lay, p1] = off_tree[lay, p2]
            off_tree[lay, p2] = False
            alive[a] &= ((pk[a] != p1[:, None]) & (pk[a] != p2[:, None]))[:, :, None]
            c1, c2 = glab[lay, g1], glab[lay, g2]
            glab[lay] = np.where(glab[lay] == c2[:, None], c1[:, None], glab[lay])
            n[lay] -= 1
            swaps[lay] += 1
            alive[a] &= (n[lay] > 1)[:, None, None]
        if not merged_any:
            break
    return ef.reshape(nL, G, W), swaps


# --------------------------------------------------------------------------------------------------
# whole model
# --------------------------------------------------------------------------------------------------


def plan_layers_fast(
    loads: ArrayLike,
    G: int,
    W: int,
    *,
    allow_colocated: bool = False,
    target: float | None = None,
    max_rounds: int | None = None,
    partners: int | None = DEFAULT_PARTNERS,
    polish_above: float | ArrayLike | None = None,
    polish_iterations: int = DEFAULT_ITERATIONS,
    polish_deadline: float | None = None,
    spread: bool = False,
    spread_budget: float = 0.1,
    connect: bool = False,
    counts: ArrayLike | None = None,
    groups: ArrayLike | None = None,
    group_slack: float = DEFAULT_GROUP_SLACK,
) -> IntArray:
    """Plan every layer of ``loads[L, E]`` at once; returns expert ids ``slots[L, G, W]``.

    Parameters
    ----------
    loads : array_like of float, shape (L, E)
        Expert loads per layer.
    G, W : int
        GPUs and slots per GPU (``G * W >= E``).
    allow_colocated : bool
        Allow two copies of one expert on one GPU.
    target : float, optional
        MaxVio at which a layer's swap descent stops (default: descend to a local optimum).
    max_rounds : int, optional
        Cap on swap rounds (exchanges per layer), default ``4 * G * W``.
    partners : int, optional
        Lightest GPUs the swap descent searches first (``None``: all GPUs every round).
    polish_above : float or array_like of float, shape (L,), optional
        Layers whose MaxVio is still above this (one level, or one per layer) are re-planned by
        `moeopt.balance.plan_layer` (``iterations=polish_iterations``, seed = layer index) and the
        better plan is kept; with ``groups`` its groups are spread again. Default: no polish.
        Not with ``connect`` (the re-planned copies would not keep the copy graph connected).
    polish_iterations : int
        Perturbation rounds of the per-layer planner used by the polish.
    polish_deadline : float, optional
        ``time.perf_counter()`` past which no further layer is polished (the layers furthest
        above their level go first).
    spread : bool
        Spread the copies of replicated experts evenly over the GPUs (every GPU
        ``floor(M / G)`` or ``ceil(M / G)`` of the ``M``): `moeopt.packing.spread_pack_batch`
        start, then the swap descent exchanges only copies of replicated experts among themselves
        and single copies among themselves. Every GPU keeps load it can share when the loads shift
        (see the module notes); a layer where this ends above plain LPT's largest GPU load is
        planned without it.
    spread_budget : float
        With ``spread`` or ``connect``: the mean MaxVio over layers stays within this fraction of plain LPT's
        (about EPLB's) where the plain descent can keep it there: the layers where they cost the
        most in sample are planned without them until it does.
    connect : bool
        Connect every layer's copy graph (`connect_copies_batch`), then repair the loads by
        a swap descent over single copies only (the replicated copies, and so the graph, stay),
        for ``lp`` dispatch: a connected plan can move load between any two GPUs. A layer that
        ends above plain LPT's largest GPU load keeps its plan without it.
    counts : array_like of int, shape (L, E), optional
        The water-filled copy counts (`copy_counts_batch` of ``loads`` with ``G * W`` copies
        and the colocation cap), when the caller has computed them already.
    groups : array_like of int, shape (E,), optional
        The router's expert groups (`moeopt.balance.groups.expert_groups`): after the
        search, copies of about equal load are exchanged so every GPU holds its share of every
        group's load (`moeopt.balance.groups.group_spread_batch`), every GPU staying at or
        below the larger of its layer's largest load and ``mean * (1 + group_slack * LPT's
        MaxVio)``. Not with ``connect``.
    group_slack : float
        See ``groups``.

    Returns
    -------
    ndarray of int, shape (L, G, W)
        Every slot filled, every expert at least one copy, no colocated copies unless
        ``allow_colocated``; deterministic; each layer never worse than LPT on the water-filled
        copy counts.
    """
    Ld = _as_loads(loads)
    nL, E = Ld.shape
    _check_shape(E, G, W, allow_colocated)
    if not spread_budget >= 0:
        raise ValueError(f"spread_budget must be >= 0, got {spread_budget}")
    cap = _cap(E, G, W, allow_colocated)
    c = copy_counts_batch(Ld, G * W, cap) if counts is None else np.asarray(counts, dtype=np.int64)
    if spread:  # LPT (the reference every layer must meet) and the spread start in one pass
        start, spread_start, ok = lpt_and_spread_pack_batch(Ld, c, G, W, allow_colocated)
    else:
        start = lpt_pack_batch(Ld, c, G, W, allow_colocated)
    descend = partial(
        swap_descent_batch, allow_colocated=allow_colocated, target=target, max_rounds=max_rounds, partners=partners
    )
    plain_plan: IntArray | None = None  # the plain descent from LPT, computed once when needed

    def plain() -> IntArray:
        nonlocal plain_plan
        if plain_plan is None:
            plain_plan, _ = descend(start, Ld)
        return plain_plan

    if groups is not None and connect:
        raise ValueError("groups does not go with connect (exchanges would cut the copy graph)")
    if polish_above is not None and connect:
        raise ValueError("polish_above does not go with connect (re-planned layers would cut the copy graph)")

    def polish(plans: IntArray) -> IntArray:
        if polish_above is None:
            return plans
        return _polish(
            plans,
            Ld,
            G,
            W,
            allow_colocated,
            polish_above,
            polish_iterations,
            groups=groups,
            group_slack=group_slack,
            deadline=polish_deadline,
        )

    if not (spread or connect or groups is not None) or nL == 0:
        out = plain()
        return polish(out)
    lpt_mv = maxvio_batch(start, Ld)
    budget = spread_budget * lpt_mv.sum() if np.isfinite(spread_budget) else np.inf
    if spread:
        # with connect, the descent only brings each layer within a small fraction of LPT's MaxVio:
        # the single-copy repair after connecting descends to the same level again
        first = None if not connect else np.maximum(CONNECT_TARGET * lpt_mv, 0.0 if target is None else target)
        if groups is not None:  # the group exchanges may fill each layer up to this anyway
            first = np.maximum(group_slack * lpt_mv, 0.0 if target is None else target)
        out, _ = swap_descent_batch(
            spread_start,
            Ld,
            allow_colocated=allow_colocated,
            target=target if first is None else first,
            max_rounds=max_rounds,
            partners=partners,
            classes=(c >= 2).astype(np.int64),
        )
        # never worse than LPT: a layer above plain LPT's largest GPU load is planned without spreading
        mv = maxvio_batch(out, Ld)
        back = ~ok | (mv > lpt_mv)
        if back.any():
            out[back] = plain()[back]
            mv[back] = maxvio_batch(out[back], Ld[back])
    else:
        out = plain().copy()
        mv = maxvio_batch(out, Ld)
    if connect and W > 1:
        joined, _ = connect_copies_batch(out, Ld)
        # repair by single copies only (a replicated expert is a class of its own, so its copies stay),
        # until each layer is back at its balance before connecting
        frozen = np.where(c >= 2, 1 + np.arange(E)[None, :], 0)
        joined, _ = swap_descent_batch(
            joined,
            Ld,
            allow_colocated=allow_colocated,
            target=mv if target is None else np.maximum(mv, target),
            max_rounds=max_rounds,
            partners=partners,
            classes=frozen,
        )
        joined_mv = maxvio_batch(joined, Ld)
        take = joined_mv <= lpt_mv
        out[take], mv[take] = joined[take], joined_mv[take]
    if groups is not None:
        # the spread of replicated copies stays (exchanges within a class)
        cls = (c >= 2).astype(np.int64) if spread else None
        out, _ = group_spread_batch(
            out, Ld, groups, slack=group_slack * lpt_mv, classes=cls, allow_colocated=allow_colocated
        )
        mv = maxvio_batch(out, Ld)
    # in sample, the mean MaxVio stays within spread_budget of LPT's: where spreading or connecting
    # costs more, the layers where it costs most get the plain descent
    if mv.sum() > budget:
        alt = plain()
        alt_mv = maxvio_batch(alt, Ld)
        gain = mv - alt_mv
        for l in np.argsort(-gain, kind="stable"):
            if mv.sum() <= budget or gain[l] <= 0:
                break
            out[l], mv[l] = alt[l], alt_mv[l]
    return polish(out)


def _polish(
    out: IntArray,
    Ld: FloatArray,
    G: int,
    W: int,
    allow_colocated: bool,
    above: float | ArrayLike,
    iterations: int,
    *,
    groups: ArrayLike | None = None,
    group_slack: float = DEFAULT_GROUP_SLACK,
    deadline: float | None = None,
) -> IntArray:
    """Layers of ``out`` with MaxVio above ``above`` (one level or one per layer) re-planned by
    `moeopt.balance.plan_layer` (seed = layer index), the better plan kept, furthest above
    first until ``deadline``; with ``groups``, the re-planned layers' groups spread again
    (within ``group_slack`` times their new MaxVio)."""
    mv = maxvio_batch(out, Ld)
    excess = mv - np.broadcast_to(np.asarray(above, dtype=np.float64), mv.shape)
    taken = []
    for l in np.argsort(-excess, kind="stable"):
        if excess[l] <= 0 or (deadline is not None and time.perf_counter() > deadline):
            break
        alt = plan_layer(Ld[l], G, W, allow_colocated=allow_colocated, seed=int(l), iterations=iterations)
        if maxvio_batch(alt[None], Ld[l : l + 1])[0] < mv[l]:
            out[l] = alt
            taken.append(int(l))
    if groups is not None and taken:
        idx = np.array(sorted(taken), dtype=np.int64)
        out[idx], _ = group_spread_batch(
            out[idx],
            Ld[idx],
            groups,
            slack=group_slack * maxvio_batch(out[idx], Ld[idx]),
            allow_colocated=allow_colocated,
        )
    return out


def plan_layers_hierarchical_fast(
    loads: ArrayLike,
    G: int,
    W: int,
    gpus_per_node: int,
    *,
    allow_colocated: bool = False,
    spread: bool = False,
    connect: bool = False,
) -> IntArray:
    """`plan_layers_fast` under EPLB's hierarchical constraint (every expert's copies in one
    node of ``gpus_per_node`` GPUs); returns ``slots[L, G, W]``.

    The experts are split over the ``N`` nodes, ``floor`` or ``ceil`` of ``E / N`` per node, by LPT and
    the swap descent on the expert loads (every layer at once), then every (layer, node)
    sub-problem is planned by `plan_layers_fast` at once (two batches when the nodes hold
    two expert counts).
    """
    Ld = _as_loads(loads)
    nL, E = Ld.shape
    n = int(gpus_per_node)
    N, per_node = _node_shape(E, G, W, n, allow_colocated)
    # experts to nodes, every layer at once: LPT then swap descent with exactly per_node items per
    # node; the N * per_node - E < N padding items are copies of one zero-load dummy expert, so no
    # node gets two of them and every node holds floor or ceil of E / N real experts
    pad = N * per_node - E
    node_load = np.concatenate([Ld, np.zeros((nL, 1))], axis=1) if pad else Ld
    counts = np.ones(node_load.shape, dtype=np.int64)
    if pad:
        counts[:, E] = pad
    nodes, _ = swap_descent_batch(lpt_pack_batch(node_load, counts, N, per_node), node_load)
    # per (layer, node): its experts ascending, the dummy (id E) last
    nodes = np.sort(nodes.reshape(nL * N, per_node), axis=1)
    out = np.empty((nL * N, n, W), dtype=np.int64)
    sizes = (nodes < E).sum(axis=1)
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        mem = nodes[rows, :size]  # [R, size]
        sub_load = np.take_along_axis(Ld[rows // N], mem, axis=1)
        # no in-sample budget per node: a node's LPT says little about the layer's balance
        sub = plan_layers_fast(
            sub_load, n, W, allow_colocated=allow_colocated, spread=spread, spread_budget=np.inf, connect=connect
        )
        out[rows] = np.take_along_axis(mem[:, None, :], sub.reshape(len(rows), 1, n * W), axis=2).reshape(-1, n, W)
    return out.reshape(nL, G, W)
