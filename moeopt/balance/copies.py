"""Copy counts: water-filling the extra slots to minimize the largest per-copy load."""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import ArrayLike

from moeopt.balance.loads import (
    IntArray,
    _as_load,
)


def copy_counts(load: ArrayLike, copies_total: int, max_copies: int | ArrayLike | None = None) -> IntArray:
    """Copy counts minimizing the largest per-copy load ``max_e load_e / c_e``.

    Parameters
    ----------
    load : array_like of float, shape (E,)
        Expert loads.
    copies_total : int
        ``sum(c)``; at least ``E``.
    max_copies : int or array_like of int, optional
        Upper bound on every ``c_e`` (e.g. ``G`` when copies may not share a GPU). Default: no bound
        beyond ``copies_total - E + 1``.

    Returns
    -------
    ndarray of int, shape (E,)
        ``c`` with ``sum(c) == copies_total`` and ``1 <= c_e <= max_copies``.

    Notes
    -----
    Greedy water-filling, computed in one sort: the extra copies are the ``copies_total - E`` largest
    values of ``{load_e / k : 1 <= k < cap_e}`` (ties: smaller ``k``, then smaller expert id), since the
    greedy step always removes the currently largest such value. Optimal by an exchange argument (see
    the module docstring); ``tests/test_balance_core.py`` checks it against brute force.
    """
    L = _as_load(load)
    E = L.size
    total = int(copies_total)
    if total < E:
        raise ValueError(f"copies_total={total} < number of experts {E}")
    extra = total - E
    cap = np.broadcast_to(np.asarray(extra + 1 if max_copies is None else max_copies, dtype=np.int64), (E,)).copy()
    if np.any(cap < 1):
        raise ValueError("max_copies must be >= 1")
    cap = np.minimum(cap, extra + 1)
    if int(cap.sum()) < total:
        raise ValueError(f"max_copies allows at most {int(cap.sum())} copies, {total} requested")
    counts = np.ones(E, dtype=np.int64)
    if extra == 0:
        return counts
    K = int(cap.max()) - 1
    if E * K <= 4_000_000:
        k = np.arange(1, K + 1, dtype=np.float64)
        vals = L[:, None] / k[None, :]
        valid = np.arange(1, K + 1)[None, :] < cap[:, None]
        ee, kk = np.nonzero(valid)
        v = vals[ee, kk]
        if extra < v.size:  # keep the values >= the extra-th largest, then sort only those
            thr = -np.partition(-v, extra - 1)[extra - 1]
            keep = v >= thr
            ee, kk, v = ee[keep], kk[keep], v[keep]
        order = np.lexsort((ee, kk, -v))[:extra]
        counts += np.bincount(ee[order], minlength=E)
        return counts
    heap = [(-float(L[e]), 1, e) for e in range(E) if cap[e] > 1]  # pragma: no cover - huge inputs only
    heapq.heapify(heap)
    for _ in range(extra):
        _, had, e = heapq.heappop(heap)
        counts[e] += 1
        if counts[e] < cap[e]:
            heapq.heappush(heap, (-float(L[e]) / (had + 1), had + 1, e))
    return counts
