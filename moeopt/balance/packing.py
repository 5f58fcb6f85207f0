"""Packing the copies into G bins of exactly W slots: LPT, balanced differencing, iterated local search."""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import linear_sum_assignment

from moeopt.balance.layout import _Layout
from moeopt.balance.loads import DEFAULT_ITERATIONS, FloatArray, IntArray
from moeopt.moves.driver import iterate
from moeopt.packing import check_items, lpt_pack, repair_colocation


def _kk_pack(w: FloatArray, e: IntArray, G: int, W: int, E: int, allow: bool) -> IntArray:
    """Balanced largest differencing (Karmarkar--Karp) for ``G`` bins of exactly ``W`` items."""
    order = np.lexsort((e, -w))
    mean = float(w.mean()) if w.size else 1.0
    wn = w / (mean if mean > 0 else 1.0)
    heap: list[tuple[float, int, IntArray]] = []
    for r in range(W):
        part = order[r * G : (r + 1) * G][:, None]
        sw = wn[part].sum(axis=1)
        heap.append((-(float(sw.max() - sw.min())), r, part))
    heapq.heapify(heap)
    tick = W
    rows = np.arange(G)[:, None]
    while len(heap) > 1:
        _, _, A = heapq.heappop(heap)
        _, _, B = heapq.heappop(heap)
        sa, sb = wn[A].sum(axis=1), wn[B].sum(axis=1)
        cost = (sa[:, None] + sb[None, :]) ** 2
        if not allow:
            pb = np.zeros((G, E), dtype=bool)
            pb[rows, e[B]] = True
            conflict = pb[:, e[A]].any(axis=2).T  # [bin of A, bin of B]
            cost = cost + conflict * (1.0 + float(cost.max())) * 4.0
        r, c = linear_sum_assignment(cost)
        C = np.concatenate([A[r], B[c]], axis=1)
        sc = wn[C].sum(axis=1)
        heapq.heappush(heap, (-(float(sc.max() - sc.min())), tick, C))
        tick += 1
    out = heap[0][2]
    return out if allow else repair_colocation(out, w, e, E)


def _ils(
    lay: _Layout,
    rng: np.random.Generator,
    iterations: int,
    *,
    max_moves: int,
    smooth_moves: int,
    replace_every: int = 0,
    lookahead: int = 4,
    lookahead_rounds: int = 2,
) -> _Layout:
    """Descent, then iterated local search keeping the best layout (by largest bin):
    `moeopt.moves.driver.iterate` over `_Perturbed`.

    Perturbation rounds use swaps only (replace moves every ``replace_every`` rounds, 0 = never);
    the best layout gets a final joint (swap + replace) descent, then up to ``lookahead_rounds``
    rounds of replace-with-lookahead (the ``lookahead`` most promising count changes, each repaired
    by a swap descent, the best kept if it lowers the maximum).
    """
    space = _Perturbed(max_moves, smooth_moves, replace_every)
    best, _, _ = iterate(space, lay, rng, rounds=iterations, tol=lay.tol)
    if iterations:
        best.joint_descent(max_moves, smooth_moves)
    if best.load is not None:
        for _ in range(lookahead_rounds):
            nxt = best.replace_lookahead(lookahead, max_moves)
            if nxt is None:
                break
            best = nxt
            best.joint_descent(max_moves, smooth_moves)
    return best


class _Perturbed:
    """The layout as a `Landscape`: joint descent (replace moves at
    the start and every ``replace_every`` rounds), random swaps among the heaviest GPU and a
    few others as the kick (more GPUs and swaps in later rounds), the largest GPU load."""

    def __init__(self, max_moves: int, smooth_moves: int, replace_every: int) -> None:
        self.max_moves, self.smooth_moves, self.replace_every = max_moves, smooth_moves, replace_every

    def descend(self, lay: _Layout, round: int) -> _Layout:
        every = self.replace_every
        lay.joint_descent(
            self.max_moves, self.smooth_moves, replace=round < 0 or (every > 0 and (round + 1) % every == 0)
        )
        return lay

    def kick(self, lay: _Layout, rng: np.random.Generator, round: int) -> _Layout:
        cur = lay.copy()
        cur.perturb(rng, n_bins=2 + round % 3, n_swaps=2 + round % 4)
        return cur

    def value(self, lay: _Layout) -> float:
        return float(lay.s.max())


def pack(
    items_weight: ArrayLike,
    items_expert: ArrayLike,
    G: int,
    W: int,
    allow_colocated: bool = False,
    *,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    max_moves: int | None = None,
    smooth_moves: int = 0,
) -> IntArray:
    """Partition ``G*W`` items into ``G`` bins of exactly ``W`` items minimizing the largest bin sum.

    Parameters
    ----------
    items_weight : array_like of float, shape (G*W,)
        Item weights (per-copy loads).
    items_expert : array_like of int, shape (G*W,)
        Expert id of every item; two items of one expert never share a bin unless
        ``allow_colocated``. Every expert must have at most ``G`` items then.
    G, W : int
        Bins and items per bin.
    allow_colocated : bool
    seed : int
        Seed of the perturbation rounds (the result is a deterministic function of the inputs).
    iterations : int
        Perturbation rounds of the iterated local search (0: LPT/KK start plus descent).
    max_moves : int, optional
        Cap on swaps per descent (default ``4 * G * W``).
    smooth_moves : int
        Cap on sum-of-squares smoothing swaps per plateau (0 disables smoothing).

    Returns
    -------
    ndarray of int, shape (G, W)
        Item indices per bin. Never worse (largest bin) than `lpt_pack`.
    """
    w, e, E = check_items(items_weight, items_expert, G, W)
    if not allow_colocated and E and np.bincount(e).max() > G:
        raise ValueError("an expert has more than G items; set allow_colocated=True")
    starts = [lpt_pack(w, e, G, W, allow_colocated), _kk_pack(w, e, G, W, E, allow_colocated)]
    sums = [float(w[s].sum(axis=1).max()) for s in starts]
    start = starts[int(np.argmin(sums))]
    lay = _Layout(e[start], w[start], E, allow=allow_colocated, item=start)
    rng = np.random.default_rng(seed)
    lay = _ils(lay, rng, iterations, max_moves=max_moves or 4 * G * W, smooth_moves=smooth_moves)
    return lay.placed
