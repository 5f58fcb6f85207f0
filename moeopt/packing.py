"""Packing by load: the one home of longest-processing-time (LPT) packing.

Homes (one expert per slot, at most ``slots`` per GPU):

* `balanced_homes`: LPT, heaviest expert first onto the least-loaded (or, with speeds,
  earliest-finishing) GPU with a free slot (the greedy baseline's, GEM's and load repair's start);
* `round_robin_lpt`: LPT in rounds of G (every GPU gets one expert per round), the
  start of the engine's balanced start (`moeopt.heuristics.local_search.balanced_start`);
* `first_fit`: capacity-aware first fit that keeps each expert in a preferred GPU
  when that GPU has a slot and room under a load limit (the ``repair=false`` ablation of TACG).

These return homes ``[E]`` with at most ``slots`` experts per GPU.

Slot tables (exactly ``W`` items per bin, the balance planner's copies):

* `lpt_pack`: LPT of items (expert copies) into ``G`` bins of exactly ``W`` slots, no two
  copies of one expert in a bin (the balance planner's start, and the reference of
  `moeopt.balance.batch.lpt_pack_batch`); it picks the lightest admissible bin from a
  heap of bin sums (the per-item ``argmin`` of `_heaviest_first` is 9x slower there, on
  the 320 items of a DeepSeek-V3 layer at 64 x 5), and a colocation left over is removed by
  `moeopt.moves.slots.WeightedSlots.repair` (or the items are dealt round-robin);
* `lpt_pack_batch`: the same LPT for every layer at once (one ``argmin`` over the GPUs
  per item rank, vectorized over layers: the balance planner's fast path), layers it cannot
  pack re-packed by `lpt_pack`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from moeopt.moves.slots import IntArray, WeightedSlots, presence


def balanced_homes(load: np.ndarray, gpus: int, slots: int, speed: np.ndarray | None = None) -> np.ndarray:
    """Longest-processing-time packing: heaviest expert first onto the least-loaded GPU.

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    gpus, slots
        G and slots per GPU (``gpus * slots >= E``).
    speed
        Optional float ``[G]`` GPU speeds: the GPU chosen is the one finishing earliest,
        ``(load_g + w) / speed_g``.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes; ties go to the lowest GPU id.
    """
    speed = np.ones(gpus) if speed is None else np.asarray(speed, dtype=np.float64)

    def earliest_finish(e: int, w: float, loads: np.ndarray, free: np.ndarray) -> int:
        return int(np.argmin(np.where(free, (loads + w) / speed, np.inf)))

    return _heaviest_first(load, gpus, slots, earliest_finish)


def _heaviest_first(
    load: np.ndarray, gpus: int, slots: int, choose: Callable[[int, float, np.ndarray, np.ndarray], int]
) -> np.ndarray:
    """Greedy packing: experts by decreasing load (stable), each onto ``choose(e, w_e, loads,
    free)``, a GPU among those with a free slot (``free`` bool ``[G]``, ``loads`` so far)."""
    load = np.asarray(load, dtype=np.float64)
    home = np.empty(len(load), dtype=np.int64)
    loads = np.zeros(gpus)
    sizes = np.zeros(gpus, dtype=np.int64)
    for e in np.argsort(-load, kind="stable"):
        g = choose(int(e), float(load[e]), loads, sizes < slots)
        home[e] = g
        loads[g] += load[e]
        sizes[g] += 1
    return home


def round_robin_lpt(load: np.ndarray, gpus: int, slots: int) -> np.ndarray:
    """LPT in rounds of G: heaviest expert first, every GPU gets one expert per round.

    Within a round the heaviest expert goes to the least-loaded GPU with a free slot, so heavy
    experts are paired with light ones, which plain LPT under slot limits misses (the start of
    `moeopt.heuristics.local_search.balanced_start`).

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    gpus, slots
        G and slots per GPU (``gpus * slots >= E``).

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes within the slot capacities.
    """
    load = np.asarray(load, dtype=np.float64)
    if len(load) > gpus * slots:
        raise ValueError(f"round_robin_lpt: {len(load)} experts do not fit {gpus} GPUs x {slots} slots")
    home = np.empty(len(load), dtype=np.int64)
    gl = np.zeros(gpus)
    order = np.argsort(-load, kind="stable")
    # every round but the last gives each GPU one expert, so at round r every GPU holds r < slots:
    # all GPUs are open, the least loaded first (round 0: all empty, in GPU order)
    for start in range(0, len(load), gpus):
        chunk = order[start : start + gpus]
        dest = np.argsort(gl, kind="stable")[: len(chunk)] if start else np.arange(len(chunk))
        home[chunk] = dest
        gl[dest] += load[chunk]  # distinct GPUs within a round
    return home


def first_fit(load: np.ndarray, preferred: np.ndarray, gpus: int, slots: int, limit: float = np.inf) -> np.ndarray:
    """Capacity-aware first fit: heaviest expert first into its preferred GPU when that GPU has
    a slot and room under ``limit``, else into the least-loaded GPU with a slot and room (or,
    when none has room, the least-loaded GPU with a slot).

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    preferred
        int ``[E]`` each expert's preferred GPU (e.g. its spectral cluster).
    gpus, slots
        G and slots per GPU.
    limit
        Largest load a GPU should carry (tolerance included); the result may exceed it when
        no GPU with a slot has room (a load repair follows).

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes within the slot capacities.
    """

    def preferred_or_least_loaded(e: int, w: float, loads: np.ndarray, free: np.ndarray) -> int:
        g = int(preferred[e])
        if free[g] and loads[g] + w <= limit:
            return g
        fits = free & (loads + w <= limit)
        pool = fits if fits.any() else free
        return int(np.flatnonzero(pool)[np.argmin(loads[pool])])

    return _heaviest_first(load, gpus, slots, preferred_or_least_loaded)


def check_items(w: ArrayLike, e: ArrayLike, G: int, W: int) -> tuple[np.ndarray, IntArray, int]:
    """Checked item weights and experts for ``G x W`` slots, and the number of experts."""
    wa = np.asarray(w, dtype=np.float64)
    ea = np.asarray(e, dtype=np.int64)
    if wa.ndim != 1:
        raise ValueError(f"items_weight must have 1 dimension, got shape {wa.shape}")
    if not np.all(np.isfinite(wa)) or np.any(wa < 0):
        raise ValueError("items_weight must be finite and >= 0")
    if ea.shape != wa.shape:
        raise ValueError("items_weight and items_expert must have the same shape")
    if wa.size != G * W:
        raise ValueError(f"need exactly G*W = {G * W} items, got {wa.size}")
    if ea.size and ea.min() < 0:
        raise ValueError("expert ids must be >= 0")
    return wa, ea, int(ea.max()) + 1 if ea.size else 0


def _round_robin(w: np.ndarray, e: IntArray, G: int, W: int) -> IntArray:
    """Items grouped by expert dealt round-robin: always feasible when every expert has <= G items."""
    order = np.lexsort((e, -w))
    out = np.empty((G, W), dtype=np.int64)
    out[np.arange(G * W) % G, np.arange(G * W) // G] = order
    return out


def repair_colocation(out: IntArray, w: np.ndarray, e: IntArray, E: int) -> IntArray:
    """Items per bin ``out [G, W]`` without two items of one expert in a bin: unchanged when it
    has none, else repaired by swaps (`repair`) or,
    when those get stuck, the items dealt round-robin."""
    if not np.any(presence(e[out], E) > 1):
        return out
    G, W = out.shape
    bins = WeightedSlots(e[out], w[out], E, item=out)
    return bins.placed if bins.repair() else _round_robin(w, e, G, W)


def lpt_pack(
    items_weight: ArrayLike, items_expert: ArrayLike, G: int, W: int, allow_colocated: bool = False
) -> IntArray:
    """Plain LPT for exactly ``W`` items per bin.

    Heaviest item first (copies of one expert adjacent) onto the lightest bin that has a free slot
    and does not hold that expert. If no such bin is left, the lightest bin with a free slot takes
    it and colocations are then removed by swaps (`repair_colocation`).

    Parameters
    ----------
    items_weight : array_like of float, shape (G*W,)
    items_expert : array_like of int, shape (G*W,)
    G, W : int
    allow_colocated : bool

    Returns
    -------
    ndarray of int, shape (G, W)
        Item indices per bin.
    """
    w, e, E = check_items(items_weight, items_expert, G, W)
    order = np.lexsort((e, -w)).tolist()
    wl, el = w.tolist(), e.tolist()
    heap = [(0.0, g) for g in range(G)]  # (bin sum, bin) of bins with a free slot
    fill = [0] * G
    has: list[set[int]] = [set() for _ in range(G)]
    out = np.empty((G, W), dtype=np.int64)
    for it in order:
        x = el[it]
        skipped = []
        while heap:
            sm, g = heapq.heappop(heap)
            if allow_colocated or x not in has[g]:
                break
            skipped.append((sm, g))
        else:  # every bin with a free slot holds x: take the lightest, repaired below
            sm, g = skipped.pop(0)
        for item in skipped:
            heapq.heappush(heap, item)
        out[g, fill[g]] = it
        fill[g] += 1
        has[g].add(x)
        if fill[g] < W:
            heapq.heappush(heap, (sm + wl[it], g))
    return out if allow_colocated else repair_colocation(out, w, e, E)


def _items_batch(loads: NDArray[np.float64], counts: IntArray, P: int) -> tuple[IntArray, NDArray[np.float64]]:
    """Expert id ``[L, P]`` and weight ``[L, P]`` of every copy, in LPT order (weight desc, expert asc)."""
    nL, E = loads.shape
    ids = np.repeat(np.tile(np.arange(E), nL), counts.ravel()).reshape(nL, P)
    share = loads / counts
    w = np.take_along_axis(share, ids, axis=1)
    order = np.lexsort((ids, -w), axis=-1)
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(w, order, axis=1)


def _check_batch(loads: ArrayLike, counts: ArrayLike, G: int, W: int) -> tuple[NDArray[np.float64], IntArray]:
    Ld = np.asarray(loads, dtype=np.float64)
    if Ld.ndim != 2:
        raise ValueError(f"load must have 2 dimension(s), got shape {Ld.shape}")
    if Ld.shape[-1] < 1:
        raise ValueError("load must have at least one expert")
    if not np.all(np.isfinite(Ld)) or np.any(Ld < 0):
        raise ValueError("load must be finite and >= 0")
    c = np.asarray(counts, dtype=np.int64)
    P = G * W
    if c.shape != Ld.shape or np.any(c.sum(axis=1) != P) or np.any(c < 1):
        raise ValueError(f"counts must be [L, E] >= 1 summing to G*W = {P} per layer")
    return Ld, c


def lpt_pack_batch(loads: ArrayLike, counts: ArrayLike, G: int, W: int, allow_colocated: bool = False) -> IntArray:
    """LPT of the copies given by ``counts[L, E]`` into ``G x W`` slots, every layer at once.

    Returns expert ids ``[L, G, W]``; layer by layer the same bins as
    ``e[lpt_pack(w, e, G, W, allow_colocated)]`` with ``e = repeat(arange(E), counts[l])`` (slot
    order inside a bin is fill order).
    """
    Ld, c = _check_batch(loads, counts, G, W)
    es, ws = _items_batch(Ld, c, G * W)
    return _fill_batch(Ld, c, es, ws, G, W, allow_colocated)[0]


def _fill_batch(
    Ld: NDArray[np.float64],
    c: IntArray,
    es: IntArray,
    ws: NDArray[np.float64],
    G: int,
    W: int,
    allow_colocated: bool,
    multi: NDArray[np.bool_] | None = None,
    cap: IntArray | None = None,
) -> tuple[IntArray, NDArray[np.bool_]]:
    """Items ``es``/``ws [L, P]`` in their order, each onto the lightest admissible GPU of its layer
    (a free slot, not its expert's GPU, and, for an item with ``multi``, fewer than ``cap`` such
    items there); returns expert ids ``[L, G, W]`` and the layers where some item found no
    admissible GPU, which are re-packed by the per-layer LPT (`lpt_pack`, which repairs)."""
    nL, E = Ld.shape
    P = G * W
    # sk: bin sums, inf once a bin is full; has2[(l, x), g]: GPU g of layer l holds expert x
    sk = np.zeros(nL * G)
    fill = np.zeros(nL * G, dtype=np.int64)
    held = np.zeros(nL * G, dtype=np.int64)  # items with ``multi`` per GPU
    full_inf = np.where(np.arange(P + 2) >= W, np.inf, 0.0)  # added when a bin gets its W-th item
    gsel = np.empty((nL, P), dtype=np.int64)
    arG = np.arange(nL) * G
    arE = np.arange(nL) * E
    has2 = None if allow_colocated else np.zeros((nL * E, G), dtype=bool)
    for r in range(P):
        key = sk.reshape(nL, G)
        m = None if multi is None or cap is None or not multi[:, r].any() else multi[:, r]
        if m is not None and cap is not None:
            key = np.where(m[:, None] & (held.reshape(nL, G) >= cap[:, r, None]), np.inf, key)
        if has2 is not None:
            rowx = arE + es[:, r]
            key = np.where(has2[rowx], np.inf, key)
        g = key.argmin(axis=1)
        gsel[:, r] = g
        idx = arG + g
        cnt = fill[idx] + 1
        fill[idx] = cnt
        if m is not None:
            held[idx] += m
        sk[idx] += ws[:, r] + full_inf[cnt]
        if has2 is not None:
            has2[rowx, g] = True
    # a layer where some item found no admissible GPU (argmin of an all-inf row) overfills a bin or
    # colocates: re-pack it with the per-layer LPT, which repairs
    order = np.argsort(gsel, axis=1, kind="stable")  # items grouped by GPU, in fill order
    out = np.take_along_axis(es, order, axis=1).reshape(nL, G, W)
    bad = (fill.reshape(nL, G) != W).any(axis=1)
    if not allow_colocated and W > 1:
        srt = np.sort(out, axis=2)
        bad |= (srt[:, :, 1:] == srt[:, :, :-1]).any(axis=(1, 2))
    for l in np.flatnonzero(bad):
        e = np.repeat(np.arange(E), c[l])
        out[l] = e[lpt_pack((Ld[l] / c[l])[e], e, G, W, allow_colocated)]
    return out, bad


def spread_pack_batch(
    loads: ArrayLike, counts: ArrayLike, G: int, W: int, allow_colocated: bool = False
) -> tuple[IntArray, NDArray[np.bool_]]:
    """LPT with the copies of replicated experts spread evenly over the GPUs, every layer at once.

    The ``M`` copies of experts with two copies or more are placed first, heaviest first, in
    rounds of ``G``: round ``k`` admits a GPU only while it holds at most ``k`` of them, so every
    GPU ends with ``floor(M / G)`` or ``ceil(M / G)``; then the single copies, heaviest first onto
    the lightest GPU with a free slot. Every GPU then holds a share of load it can hand to another
    GPU when the loads shift (``lp`` dispatch) or that is split with other GPUs (``even``).

    Returns expert ids ``[L, G, W]`` and a flag per layer: False where some item found no
    admissible GPU; that layer is plain LPT (`lpt_pack`) instead.
    """
    Ld, c = _check_batch(loads, counts, G, W)
    es, ws = _items_batch(Ld, c, G * W)
    s_es, s_ws, s_multi, cap = _spread_order(c, es, ws, G)
    out, bad = _fill_batch(Ld, c, s_es, s_ws, G, W, allow_colocated, s_multi, cap)
    return out, ~bad


def lpt_and_spread_pack_batch(
    loads: ArrayLike, counts: ArrayLike, G: int, W: int, allow_colocated: bool = False
) -> tuple[IntArray, IntArray, NDArray[np.bool_]]:
    """`lpt_pack_batch` and `spread_pack_batch` of the same copies, packed in one pass
    (the two packings are rows of one batch, so the per-item loop runs once)."""
    Ld, c = _check_batch(loads, counts, G, W)
    nL = Ld.shape[0]
    es, ws = _items_batch(Ld, c, G * W)
    s_es, s_ws, s_multi, cap = _spread_order(c, es, ws, G)
    out, bad = _fill_batch(
        np.concatenate([Ld, Ld]),
        np.concatenate([c, c]),
        np.concatenate([es, s_es]),
        np.concatenate([ws, s_ws]),
        G,
        W,
        allow_colocated,
        np.concatenate([np.zeros_like(s_multi), s_multi]),  # LPT's rows: no item counts against a cap
        np.concatenate([cap, cap]),
    )
    return out[:nL], out[nL:], ~bad[nL:]


def _spread_order(
    c: IntArray, es: IntArray, ws: NDArray[np.float64], G: int
) -> tuple[IntArray, NDArray[np.float64], NDArray[np.bool_], IntArray]:
    """The spread packing's item order (replicated copies first, each part in LPT order), which
    items are replicated copies, and the most of them a GPU may hold when each is placed."""
    multi = np.take_along_axis(c, es, axis=1) >= 2
    first = np.argsort(~multi, axis=1, kind="stable")
    s_multi = np.take_along_axis(multi, first, axis=1)
    cap = (np.cumsum(s_multi, axis=1) - 1) // G + 1  # round of a replicated copy: at most this many per GPU
    return np.take_along_axis(es, first, axis=1), np.take_along_axis(ws, first, axis=1), s_multi, cap
