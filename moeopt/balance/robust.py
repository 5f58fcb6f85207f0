"""Robust mode: one plan for several load snapshots (mean or worst per-step largest load)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from moeopt.balance.loads import (
    _RTOL,
    DEFAULT_ITERATIONS,
    FloatArray,
    IntArray,
    _as_load,
    _cap,
    _check_shape,
    gpu_loads,
)
from moeopt.balance.planner import plan_layer
from moeopt.moves.driver import Moves, descend
from moeopt.moves.slots import SlotTable

#: the per-step objectives of robust mode: the mean or the worst over the snapshots
Objective = Literal["mean", "worst"]


def _step_scale(S: FloatArray, G: int, normalize: bool) -> FloatArray:
    if not normalize:
        return np.ones(S.shape[0])
    mean = S.sum(axis=1) / G
    return np.where(mean > 0, 1.0 / np.where(mean > 0, mean, 1.0), 0.0)


def robust_objective(
    slots: ArrayLike,
    step_loads: ArrayLike,
    objective: Objective = "mean",
    *,
    normalize: bool = True,
) -> float:
    """Mean (or worst) over steps of the per-step largest GPU load under ``even`` dispatch.

    Parameters
    ----------
    slots : array_like of int, shape (G, W)
    step_loads : array_like of float, shape (T, E)
    objective : {"mean", "worst"}
    normalize : bool
        Divide each step's loads by that step's mean GPU load (then the per-step value is
        ``1 + MaxVio_t``; steps without load count as 1).

    Returns
    -------
    float
    """
    S = _as_load(step_loads, ndim=2)
    gl = gpu_loads(slots, S)
    G = gl.shape[1]
    v = gl.max(axis=1) * _step_scale(S, G, normalize)
    if normalize:
        v = np.where(S.sum(axis=1) > 0, v, 1.0)
    return float(v.mean() if objective == "mean" else v.max())


class _RobustLayout(SlotTable):
    """Slots evaluated on every step at once (a `SlotTable`):
    ``Lg[t, g]`` = scaled load of GPU ``g`` in step ``t``."""

    __slots__ = ("S", "T", "cap", "allow", "worst", "share", "Lg", "tol")
    _shared = ("gf", "S")

    def __init__(self, slots: IntArray, S: FloatArray, cap: int, allow: bool, worst: bool) -> None:
        super().__init__(slots, S.shape[1])
        self.S = S  # [T, E], already scaled per step
        self.T = S.shape[0]
        self.cap, self.allow, self.worst = cap, allow, worst
        self.refresh()
        self.tol = _RTOL * 64 * max(float(self.Lg.mean()), 1e-300)

    def refresh(self) -> None:
        self.share = self.S / self.c  # [T, E]
        self.Lg = self.share[:, self.e].sum(axis=2)  # [T, G]

    def agg(self, stepmax: FloatArray, axis: int = 0) -> FloatArray:
        return stepmax.max(axis=axis) if self.worst else stepmax.mean(axis=axis)

    def value(self) -> float:
        return float(self.agg(self.Lg.max(axis=1)))

    def _rest(self, b: int) -> FloatArray:
        """``rest[t, g]`` = max over GPUs other than ``b`` and ``g`` of ``Lg[t, :]``."""
        Lg = self.Lg
        k = min(3, self.G)
        idx = np.argsort(-Lg, axis=1, kind="stable")[:, :k]
        val = np.take_along_axis(Lg, idx, axis=1)
        if k < 3:
            pad = 3 - k
            idx = np.concatenate([idx, np.full((self.T, pad), -1)], axis=1)
            val = np.concatenate([val, np.full((self.T, pad), -np.inf)], axis=1)
        g = np.arange(self.G)[None, :]
        out = np.full((self.T, self.G), -np.inf)
        done = np.zeros((self.T, self.G), dtype=bool)
        for r in range(3):
            ir = idx[:, r : r + 1]
            take = ~done & (ir != b) & (ir != g)
            out = np.where(take, val[:, r : r + 1], out)
            done |= take
        return out

    def critical(self, n: int) -> IntArray:
        """GPUs most often at the per-step maximum (the worst step's maximum first when ``worst``)."""
        am = np.argmax(self.Lg, axis=1)
        freq = np.bincount(am, weights=self.Lg.max(axis=1), minlength=self.G)
        order = np.argsort(-freq, kind="stable")
        if self.worst:
            top = am[int(np.argmax(self.Lg.max(axis=1)))]
            order = np.concatenate([[top], order[order != top]])
        return order[: min(n, self.G)]

    def best_swap(self, b: int, cur: float) -> tuple[float, int, int] | None:
        val = self.swap_values(b)
        k = int(np.argmin(val))
        v = float(val.flat[k])
        return (v, k // val.shape[1], k % val.shape[1]) if v < cur - self.tol else None

    def swap_values(self, b: int) -> FloatArray:
        """float ``[W, P]``: the objective after slot ``i`` of GPU ``b`` swaps with flat slot
        ``j``; ``inf`` where the swap is not allowed (same GPU, a new colocated copy)."""
        wb = self.share[:, self.e[b]]  # [T, W]
        wf = self.share[:, self.e.ravel()]  # [T, P]
        d = wf[:, None, :] - wb[:, :, None]  # [T, W, P]
        nb = self.Lg[:, b][:, None, None] + d
        no = self.Lg[:, self.gf][:, None, :] - d
        rest = self._rest(b)[:, self.gf][:, None, :]
        val = self.agg(np.maximum(np.maximum(nb, no), rest))  # [W, P]
        bad = np.broadcast_to(self.gf[None, :] == b, val.shape)
        if not self.allow:
            ef = self.e.ravel()
            bad = bad | (self.M[b, ef] > 0)[None, :] | (self.M[self.gf[None, :], self.e[b][:, None]] > 0)
        else:
            bad = bad | (self.e.ravel()[None, :] == self.e[b][:, None])
        return np.asarray(np.where(bad, np.inf, val))

    def _replace_values(self, g: IntArray, a: IntArray, x: IntArray) -> FloatArray:
        """Objective after each replacement (slot on GPU ``g[k]`` holding ``a[k]`` becomes ``x[k]``)."""
        S, c, M = self.S, self.c, self.M
        old_a = S[:, a] / c[a]  # [T, K]
        new_a = S[:, a] / np.maximum(c[a] - 1, 1)
        old_x = S[:, x] / c[x]
        new_x = S[:, x] / (c[x] + 1)
        # [T, K, G]: every GPU's load, then the few (candidate, GPU) pairs a replacement changes
        # (the holders of a and of x) added in place, not a dense K x G multiply per expert (a
        # sparse form without the [T, K, G] array was slower: many small numpy calls)
        K = a.size
        tot = np.repeat(self.Lg[:, None, :], K, axis=1)
        for e, d in ((a, new_a - old_a), (x, new_x - old_x)):
            hk, hg = np.nonzero(M[:, e].T)
            tot[:, hk, hg] += d[:, hk] * M[hg, e[hk]]
        kk = np.arange(K)
        tot[:, kk, g] += new_x - new_a
        return self.agg(tot.max(axis=2))

    def best_replace(self, b: int, cur: float, n_x: int = 16, n_donor: int = 48) -> tuple[float, int, int, int] | None:
        cands = self.replace_candidates(b, n_x, n_donor)
        if cands is None:
            return None
        g, i, a, x = cands
        vals = self._replace_values(g, a, x)
        k = int(np.argmin(vals))
        v = float(vals[k])
        return (v, int(g[k]), int(i[k]), int(x[k])) if v < cur - self.tol else None

    def replace_candidates(
        self, b: int, n_x: int = 16, n_donor: int = 48
    ) -> tuple[IntArray, IntArray, IntArray, IntArray] | None:
        """The replacements worth scoring around GPU ``b`` (GPU, slot, expert it holds, expert
        it takes): a slot of ``b`` whose expert has other copies takes one of the ``n_x``
        hottest experts per copy that can take one more, or an expert on ``b`` gets a copy at
        one of the ``n_donor`` cheapest donor slots elsewhere; None when there is none."""
        c = self.c
        give = c >= 2
        take = c < self.cap
        pooled = self.S.sum(axis=0)
        cand: list[tuple[IntArray, IntArray, IntArray, IntArray]] = []  # gpu, slot, a, x
        # (i) donor slot on b -> one of the hottest receivable experts
        ii = np.flatnonzero(give[self.e[b]])
        hot = np.argsort(-(pooled / c), kind="stable")
        hot = hot[take[hot]]
        if not self.allow:
            hot = hot[self.M[b, hot] == 0]
        hot = hot[:n_x]
        if ii.size and hot.size:
            I, X = np.meshgrid(ii, hot, indexing="ij")
            A = self.e[b][I]
            keep = (A != X).ravel()
            cand.append((np.full(keep.sum(), b), I.ravel()[keep], A.ravel()[keep], X.ravel()[keep]))
        # (ii) an expert on b gains a copy at a cheap donor slot elsewhere
        xs = np.unique(self.e[b][take[self.e[b]]])
        ef = self.e.ravel()
        jj = np.flatnonzero(give[ef] & (self.gf != b))
        if xs.size and jj.size:
            jj = jj[np.argsort((pooled / (c * np.maximum(c - 1, 1)))[ef[jj]], kind="stable")[:n_donor]]
            X, J = np.meshgrid(xs, jj, indexing="ij")
            A = ef[J]
            keep = A != X
            if not self.allow:
                keep &= self.M[self.gf[J], X] == 0
            keep = keep.ravel()
            Jr = J.ravel()[keep]
            cand.append((self.gf[Jr], Jr % self.W, A.ravel()[keep], X.ravel()[keep]))
        if not cand:
            return None
        g = np.concatenate([t[0] for t in cand])
        if g.size == 0:
            return None
        return (
            g,
            np.concatenate([t[1] for t in cand]),
            np.concatenate([t[2] for t in cand]),
            np.concatenate([t[3] for t in cand]),
        )

    def swap(self, g1: int, i1: int, g2: int, i2: int) -> tuple[int, int]:
        e1, e2 = super().swap(g1, i1, g2, i2)
        d = self.share[:, e2] - self.share[:, e1]
        self.Lg[:, g1] += d
        self.Lg[:, g2] -= d
        return e1, e2

    def replace(self, g: int, i: int, x: int) -> int:
        a = super().replace(g, i, x)
        self.refresh()
        return a

    def best_step(self, n_try: int) -> tuple[str, int, int, int, int] | None:
        """The best swap or replacement at the first of the ``n_try`` `critical` GPUs that
        has an improving one: ``("swap", g1, i1, g2, i2)`` or ``("replace", g, i, x, 0)``."""
        cur = self.value()
        for b in self.critical(n_try):
            mv = self.best_swap(int(b), cur)
            rp = self.best_replace(int(b), cur)
            if rp is not None and (mv is None or rp[0] < mv[0]):
                _, g, i, x = rp
                return "replace", g, i, x, 0
            if mv is not None:
                _, i, j = mv
                return "swap", int(b), i, j // self.W, j % self.W
        return None

    def apply(self, step: tuple[str, int, int, int, int]) -> None:
        kind, a, i, b, j = step
        if kind == "swap":
            self.swap(a, i, b, j)
        else:
            self.replace(a, i, b)

    def search(self, max_moves: int, n_try: int, deadline: float | None = None) -> None:
        """Descent (`moeopt.moves.driver.descend`) over `best_step`, until ``deadline``
        (`time.perf_counter`; None: none)."""
        descend(self, Moves(lambda lay: lay.best_step(n_try), _RobustLayout.apply), max_moves, deadline)


def plan_layer_robust(
    step_loads: ArrayLike,
    G: int,
    W: int,
    objective: Objective = "mean",
    *,
    normalize: bool = True,
    allow_colocated: bool = False,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    max_moves: int | None = None,
    n_try: int = 3,
    start: IntArray | None = None,
    deadline: float | None = None,
) -> IntArray:
    """Plan one layer for per-step loads, minimizing the mean (or worst) per-step largest GPU load.

    Parameters
    ----------
    step_loads : array_like of float, shape (T, E)
        Per-step (or per-snapshot) expert loads of the layer.
    G, W : int
    objective : {"mean", "worst"}
        Aggregate over steps of the per-step maximum.
    normalize : bool
        Score each step relative to its own mean GPU load (``1 + MaxVio_t``), so heavy steps do not
        dominate; ``False`` uses raw loads.
    allow_colocated : bool
    seed, iterations : int
        Passed to `plan_layer` for the pooled start.
    max_moves : int, optional
        Cap on accepted moves (default ``2 * G * W``).
    n_try : int
        Number of critical GPUs (most often at the maximum) tried per move.
    start : ndarray of int, shape (G, W), optional
        The pooled plan to start from, when the caller has it (default: ``plan_layer`` on the
        pooled loads with ``seed`` and ``iterations``).
    deadline : float, optional
        `time.perf_counter` time after which the descent takes no further move (its plan so far
        is returned, never worse than the pooled start); None: none.

    Returns
    -------
    ndarray of int, shape (G, W)
        Never worse than the pooled plan (``start``, default ``plan_layer(step_loads.sum(0))``) on
        `robust_objective`: only strictly improving moves are accepted.
    """
    S = _as_load(step_loads, ndim=2)
    E = S.shape[1]
    _check_shape(E, G, W, allow_colocated)
    if start is None:
        pooled = plan_layer(S.sum(axis=0), G, W, allow_colocated=allow_colocated, seed=seed, iterations=iterations)
    else:
        pooled = np.asarray(start, dtype=np.int64)
    if S.sum() <= 0:
        return pooled
    Ss = S * _step_scale(S, G, normalize)[:, None]
    lay = _RobustLayout(pooled, Ss, _cap(E, G, W, allow_colocated), allow_colocated, objective == "worst")
    lay.search(max_moves if max_moves is not None else 2 * G * W, n_try, deadline)
    out = lay.e
    worse = robust_objective(out, S, objective=objective, normalize=normalize) > robust_objective(
        pooled, S, objective=objective, normalize=normalize
    )
    if worse:  # pragma: no cover - safety net
        return pooled
    return out


#: the relative drop in mean per-step MaxVio on the held-out half that makes robust planning pay
#: (below it the difference is the noise of the split)
ROBUST_MARGIN = 0.03


def robust_pays(
    step_loads: ArrayLike,
    G: int,
    W: int,
    *,
    allow_colocated: bool = False,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    margin: float = ROBUST_MARGIN,
    deadline: float | None = None,
) -> bool:
    """Whether planning on the snapshots beats planning on their pooled loads on later ones.

    The snapshots (in time order) are cut in two halves: a robust plan and a pooled plan are
    made on the first, and both are scored on the second by the mean per-step objective
    (`robust_objective`). Robust planning pays when the snapshots differ in a way that
    repeats (e.g. bursts of task families); on noise alone it fits the noise and loses.

    Parameters
    ----------
    step_loads : array_like of float, shape (T, E)
        Snapshots in time order; fewer than 4 never pay.
    G, W : int
    allow_colocated : bool
    seed, iterations : int
        Passed to the planners.
    margin : float
        Relative improvement the robust plan needs on the second half.
    deadline : float, optional
        `time.perf_counter` time after which the robust plan's descent stops (the test then
        judges the plan it has; None: none).

    Returns
    -------
    bool
    """
    S = _as_load(step_loads, ndim=2)
    T = S.shape[0]
    if T < 4 or S.sum() <= 0:
        return False
    first, second = S[: T // 2], S[T // 2 :]
    if first.sum() <= 0 or second.sum() <= 0:
        return False
    pooled = plan_layer(first.sum(axis=0), G, W, allow_colocated=allow_colocated, seed=seed, iterations=iterations)
    robust = plan_layer_robust(first, G, W, "mean", allow_colocated=allow_colocated, start=pooled, deadline=deadline)
    held_pooled = robust_objective(pooled, second, "mean")
    held_robust = robust_objective(robust, second, "mean")
    return held_robust < held_pooled - margin * (held_pooled - 1.0 if held_pooled > 1.0 else held_pooled)
