"""Whole-layer planning: copy counts, packing and search, flat or hierarchical (per node)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from moeopt.balance.copies import copy_counts
from moeopt.balance.layout import _Layout
from moeopt.balance.loads import DEFAULT_ITERATIONS, FloatArray, IntArray, _as_load, _cap, _check_shape, _node_shape
from moeopt.balance.packing import _ils, pack


def _plan_flat(
    L: FloatArray, G: int, W: int, allow: bool, seed: int, iterations: int, smooth_moves: int, lookahead: int = 4
) -> IntArray:
    E = L.size
    P = G * W
    cap = _cap(E, G, W, allow)
    c = copy_counts(L, P, cap)
    e_items = np.repeat(np.arange(E), c)
    w_items = (L / c)[e_items]
    items = pack(w_items, e_items, G, W, allow, seed=seed, iterations=0, smooth_moves=smooth_moves)
    lay = _Layout(e_items[items], None, E, allow=allow, load=L, cap=cap)
    rng = np.random.default_rng([seed, 1])
    lay = _ils(lay, rng, iterations, max_moves=4 * P, smooth_moves=smooth_moves, lookahead=lookahead)
    return lay.e


def _plan_hierarchical(
    L: FloatArray,
    G: int,
    W: int,
    n: int,
    allow: bool,
    seed: int,
    iterations: int,
    smooth_moves: int,
    lookahead: int = 4,
) -> IntArray:
    E = L.size
    N, per_node = _node_shape(E, G, W, n, allow)
    Ep = N * per_node
    # pad with < N zero-load dummies sharing one id, so no node gets two: every node then holds
    # floor(E/N) or ceil(E/N) experts
    wpad = np.concatenate([L, np.zeros(Ep - E)])
    ids = np.concatenate([np.arange(E), np.full(Ep - E, E)])
    nodes = pack(wpad, ids, N, per_node, False, seed=seed, iterations=iterations // 2 + 1)
    out = np.empty((G, W), dtype=np.int64)
    for k in range(N):
        members = np.sort(nodes[k][nodes[k] < E])
        sub = _plan_flat(L[members], n, W, allow, seed + k, iterations, smooth_moves, lookahead)
        out[k * n : (k + 1) * n] = members[sub]
    return out


def plan_layer(
    load: ArrayLike,
    G: int,
    W: int,
    *,
    allow_colocated: bool = False,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    gpus_per_node: int | None = None,
    hierarchical: bool = False,
    smooth_moves: int = 0,
    lookahead: int = 4,
) -> IntArray:
    """Plan one layer: copy counts, packing, joint swap/replace search.

    Parameters
    ----------
    load : array_like of float, shape (E,)
        Expert loads of the layer.
    G, W : int
        GPUs and slots per GPU (``G * W >= E``).
    allow_colocated : bool
        Allow two copies of one expert on one GPU.
    seed : int
        Seed of the perturbation rounds; same inputs and seed give the same plan.
    iterations : int
        Perturbation rounds of the iterated local search.
    gpus_per_node : int, optional
        GPUs per node; used with ``hierarchical``.
    hierarchical : bool
        Keep every expert's copies inside one node (EPLB's hierarchical constraint).
    smooth_moves : int
        Cap on sum-of-squares smoothing swaps per plateau (0: off; more time, rarely better than
        more ``iterations``).
    lookahead : int
        Count changes tried with a swap-descent lookahead at the end (0: off).

    Returns
    -------
    ndarray of int, shape (G, W)
        Expert id per slot; every expert has at least one copy; no colocated copies unless
        ``allow_colocated``. Never worse than LPT on the water-filled copy counts.
    """
    L = _as_load(load)
    _check_shape(L.size, G, W, allow_colocated)
    if hierarchical:
        if not gpus_per_node:
            raise ValueError("hierarchical=True needs gpus_per_node")
        return _plan_hierarchical(
            L, G, W, int(gpus_per_node), allow_colocated, seed, iterations, smooth_moves, lookahead
        )
    return _plan_flat(L, G, W, allow_colocated, seed, iterations, smooth_moves, lookahead)


def plan_layers(loads: ArrayLike, G: int, W: int, **kwargs: Any) -> IntArray:
    """`plan_layer` for every layer of ``loads[L, E]``; returns ``slots[L, G, W]``.

    Layer ``l`` uses seed ``seed + l`` so layers are independent but the whole result is
    deterministic.
    """
    arr = _as_load(loads, ndim=2)
    seed = int(kwargs.pop("seed", 0))
    return np.stack([plan_layer(arr[l], G, W, seed=seed + l, **kwargs) for l in range(arr.shape[0])])
