"""Load bounds the cross-layer certificate uses (`moeopt.methods.crosslayer.maxvio_budget_bound`)."""

from __future__ import annotations

import math

import numpy as np


def least_largest_load(load: np.ndarray, G: int, S: int) -> float:
    """A lower bound on the largest GPU load of every single-copy plan of ``G x S`` slots (loads
    ``[E]``): exact with two slots per GPU and no spare slot (the heaviest expert with the
    lightest, the second with the second lightest, and so on, is a best pairing), else
    `moeopt.grouping.min_max_load`."""
    from moeopt.grouping import min_max_load

    if S == 2 and len(load) == 2 * G:
        w = np.sort(np.asarray(load, dtype=np.float64))
        return float((w + w[::-1]).max())
    return min_max_load(load, G, S)


def cheapest_levels(cost: np.ndarray, spend: np.ndarray, budget: float) -> float:
    """``min sum_l cost[l, max(k_l, k_{l-1})]`` (``k_{-1} = k_0``) over the level tuples with
    ``sum_l spend[l, k_l] <= budget`` (``cost``, ``spend``: ``[L, levels]``; ``inf`` if none fits).

    Exact, by dynamic programming over the layers: per level of the last layer, the pairs (spent,
    cost) that no other pair beats on both, so the work grows with those fronts, not with
    ``levels ** L``.
    """
    L, K = cost.shape
    tol = 1e-12
    front = [np.array([[spend[0, k], cost[0, k]]]) for k in range(K)]
    for l in range(1, L):
        nxt = []
        for k in range(K):
            parts = [f + np.array([spend[l, k], cost[l, max(k, j)]]) for j, f in enumerate(front) if len(f)]
            pairs = np.concatenate(parts) if parts else np.zeros((0, 2))
            pairs = pairs[pairs[:, 0] <= budget + tol]
            pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]  # by spent, then cost
            keep = pairs[:, 1] < np.minimum.accumulate(np.r_[np.inf, pairs[:-1, 1]])  # strictly cheaper
            nxt.append(pairs[keep])
        front = nxt
    fits = [f[f[:, 0] <= budget + tol, 1] for f in front]
    return float(min((x.min() for x in fits if len(x)), default=math.inf))


def largest_loads(homes: np.ndarray, loads: list[np.ndarray], G: int) -> list[float]:
    """Each layer's largest GPU load (``homes [L, E]``, ``loads`` per layer)."""
    return [float(np.bincount(h, weights=w, minlength=G).max()) for h, w in zip(homes, loads, strict=True)]
