"""Migration-aware re-planning: few moved slots from a current plan, and the moves-vs-MaxVio frontier.

With per-step loads (``steps``, robust mode) every candidate plan is scored by the mean (or
worst) per-step MaxVio of `moeopt.balance.robust.robust_objective` instead of the pooled
MaxVio, and the unconstrained plan is the robust one. The pooled walks find their moves on the
pooled loads; one more walk (`_RobustWalk`) finds them on the per-step objective itself: a plan
that balances the pooled load can leave every step's own hot GPU hot, and a budget spent on the
pooled maximum is then spent on the wrong GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import linear_sum_assignment

from moeopt.balance.layout import _Layout
from moeopt.balance.loads import (
    DEFAULT_ITERATIONS,
    FloatArray,
    IntArray,
    _as_load,
    _cap,
    _check_shape,
    gpu_loads,
    maxvio,
)
from moeopt.balance.planner import plan_layer
from moeopt.balance.robust import Objective, _RobustLayout, robust_objective
from moeopt.moves.driver import descend
from moeopt.moves.slots import presence


def count_moves(current: ArrayLike, new: ArrayLike) -> int:
    """Slots whose expert changes from ``current`` to ``new``, ignoring slot order inside a GPU.

    Parameters
    ----------
    current, new : array_like of int, shape (G, W)

    Returns
    -------
    int
        ``sum_g (W - |multiset(current[g]) & multiset(new[g])|)``.
    """
    c = np.asarray(current, dtype=np.int64)
    n = np.asarray(new, dtype=np.int64)
    if c.shape != n.shape:
        raise ValueError(f"plans differ in shape: {c.shape} vs {n.shape}")
    E = int(max(c.max(), n.max())) + 1
    return int(c.size - np.minimum(presence(c, E), presence(n, E)).sum())


def relabel(new: ArrayLike, current: ArrayLike) -> IntArray:
    """Permute ``new``'s GPUs and slot positions to match ``current`` as closely as possible.

    GPUs are matched by maximum total overlap (``linear_sum_assignment``), then experts that stay on
    a GPU keep their current slot position. The plan's loads are unchanged (GPUs are identical).

    Parameters
    ----------
    new, current : array_like of int, shape (G, W)

    Returns
    -------
    ndarray of int, shape (G, W)
        Same per-GPU multisets as ``new`` (GPU order permuted) with minimal `count_moves`
        over GPU permutations.
    """
    nw = np.asarray(new, dtype=np.int64)
    cu = np.asarray(current, dtype=np.int64)
    G, W = cu.shape
    E = int(max(nw.max(), cu.max())) + 1
    Mn, Mc = presence(nw, E), presence(cu, E)
    overlap = np.minimum(Mn[:, None, :], Mc[None, :, :]).sum(axis=2)
    rows, cols = linear_sum_assignment(-overlap)
    out = np.empty_like(cu)
    for r, h in zip(rows, cols, strict=True):
        left = Counter(nw[r].tolist())
        row = [-1] * W
        for pos, x in enumerate(cu[h].tolist()):
            if left[x] > 0:
                row[pos] = x
                left[x] -= 1
        rest = list(left.elements())
        for pos in range(W):
            if row[pos] < 0:
                row[pos] = rest.pop(0)
        out[h] = row
    return out


class _MigrationWalk:
    """Best-gain-per-moved-slot replace/swap moves from ``current`` (`run` returns the
    trajectory), as a neighbourhood of the one driver: its state is itself (the layout and
    the trajectory so far). A step is the layout after the move with the best
    reduction of the largest GPU load per moved slot (then of the heaviest GPU's load) that
    keeps the moves within ``budget``; at a local optimum, one smoothing swap (never raises
    the maximum) reshapes the plateau, at most ``max_stall`` times in a row. The walk stops
    at the budget, at ``target`` or when no step fits."""

    def __init__(
        self,
        current: IntArray,
        L: FloatArray,
        cap: int,
        allow: bool,
        budget: int,
        target: float | None,
        max_stall: int = 32,
    ) -> None:
        self.current, self.budget, self.target, self.max_stall = current, budget, target, max_stall
        self.lay = _Layout(current, None, L.size, allow=allow, load=L, cap=cap)
        self.mean = float(L.sum()) / self.lay.G
        self.M0 = presence(current, L.size)
        self.stall = 0
        self.traj = [(0, self.vio(), self.lay.e.copy())]

    def run(self) -> list[tuple[int, float, IntArray]]:
        """The walk to its end (`moeopt.moves.driver.descend`): ``(moves, MaxVio, plan)``."""
        descend(self, self, max_steps=2**62)
        return self.traj

    def vio(self) -> float:
        return float(self.lay.s.max()) / self.mean - 1.0 if self.mean > 0 else 0.0

    def moves(self, lay: _Layout) -> int:
        return int(self.current.size - np.minimum(self.M0, lay.M).sum())

    def best(self, state: _MigrationWalk) -> tuple[_Layout, bool] | None:
        """The next layout and whether it is a smoothing step; None when the walk ends."""
        done, vio = self.traj[-1][0], self.traj[-1][1]
        if self.mean <= 0 or done >= self.budget or (self.target is not None and vio <= self.target):
            return None
        lay = self.lay
        b = int(np.argmax(lay.s))
        second = float(np.partition(lay.s, -2)[-2]) if lay.G > 1 else -np.inf
        smax = float(lay.s[b])
        options: list[tuple[float, float, str, tuple[float, int, int] | tuple[float, int, int, int]]] = []
        # score: reduction of the global maximum per moved slot, then of the heaviest GPU's load
        sw = lay.best_swap(b)
        if sw is not None:
            options.append(((smax - max(sw[0], second)) / 2.0, (smax - sw[0]) / 2.0, "swap", sw))
        rp = lay.best_replace(b)
        if rp is not None:
            options.append((smax - max(rp[0], second), smax - rp[0], "replace", rp))
        if not options:
            if self.stall >= self.max_stall:
                return None
            trial = lay.copy()
            if not trial.smooth(1) or self.moves(trial) > self.budget:
                return None
            return trial, True
        options.sort(key=lambda o: (-o[0], -o[1]))
        for _, _, _, mv in options:
            trial = lay.copy()
            if len(mv) == 3:  # a swap (gain, slot i, slot j); else a replace (gain, g, i, x)
                _, i, j = mv
                trial.swap(b, i, j // lay.W, j % lay.W)
            else:
                _, g, i, x = mv
                trial.replace(g, i, x)
            if self.moves(trial) <= self.budget:
                return trial, False
        return None

    def apply(self, state: _MigrationWalk, step: tuple[_Layout, bool]) -> None:
        self.lay, smoothing = step
        self.stall = self.stall + 1 if smoothing else 0
        self.traj.append((self.moves(self.lay), self.vio(), self.lay.e.copy()))


#: the per-step walk (`_RobustWalk`) runs on layers of at most this many slots: a step scores
#: every swap and replacement that touches a hot GPU, so its cost grows with the square of the
#: slots (measured per layer: 0.16 s at 16 GPUs x 5 slots and a budget of 16, 0.45 s at 32 x 5,
#: 4.3 s at 64 x 5 with a budget of 64)
WALK_MAX_SLOTS = 128


class _RobustWalk:
    """Best-gain-per-moved-slot replace/swap moves from ``current`` on the per-step objective
    (`moeopt.balance.robust.robust_objective`: the mean or worst over the steps of each step's
    largest GPU load over its mean), as a neighbourhood of the one driver (its state is itself).

    The per-step loads and the values of swaps and replacements are robust planning's
    (`moeopt.balance.robust._RobustLayout`); what differs is the choice: a step is the replace
    (one slot takes another expert: copy counts change) or swap (two slots on different GPUs
    exchange experts) with the largest objective gain per slot it adds to the moves counted from
    ``current`` (a move that reverts earlier ones costs nothing and goes first), within
    ``budget``. Only moves that touch a GPU which is some step's hottest are tried: no other
    move can lower a step's maximum. Every expert keeps a copy; no new colocated copies unless
    ``allow``. The walk stops at the budget or when no move gains; `traj` holds
    ``(moves, per-step MaxVio, plan)`` after each step.
    """

    #: most candidate x step x GPU entries held at once when scoring replacements
    CHUNK = 4_000_000
    #: above this many candidate x step x GPU entries, only the replacements robust planning
    #: scores around each hot GPU (`_RobustLayout.replace_candidates`) are tried
    SCREEN = 4_000_000

    def __init__(self, current: IntArray, steps: FloatArray, budget: int, allow: bool, objective: Objective) -> None:
        G, W = current.shape
        tot = steps.sum(axis=1)
        S = steps[tot > 0] * (G / tot[tot > 0])[:, None]  # each step's mean GPU load is 1
        E = max(steps.shape[1], int(current.max()) + 1)
        self.budget, self.allow = budget, allow
        self.used = 0
        self.traj = [(0, 0.0, current.copy())]
        self.lay = _RobustLayout(current, S, _cap(E, G, W, allow), allow, objective == "worst") if len(S) else None
        if self.lay is not None:
            self.M0 = self.lay.M.copy()
            self.traj = [(0, self.lay.value() - 1.0, self.lay.e.copy())]

    def run(self) -> list[tuple[int, float, IntArray]]:
        """The walk to its end (every step without load: the current plan alone)."""
        if self.lay is not None:
            descend(self, self, max_steps=4 * self.lay.e.size)
        return self.traj

    def _cost(self, g: IntArray, x: IntArray, delta: int) -> IntArray:
        """Moves added when GPU ``g`` gains (``delta`` 1) or loses (-1) a copy of ``x``."""
        assert self.lay is not None
        m0, m = self.M0[g, x], self.lay.M[g, x]
        return -(np.minimum(m0, m + delta) - np.minimum(m0, m))

    def best(self, state: _RobustWalk) -> tuple[str, int, int, int] | None:
        """The best step ``(kind, slot, slot or expert, added moves)``; None when the walk ends."""
        lay = self.lay
        if lay is None or self.used >= self.budget:
            return None
        M, c, e, W, G, T = lay.M, lay.c, lay.e.ravel(), lay.W, lay.G, lay.T
        now = lay.value()
        hot_gpus = np.unique(np.argmax(lay.Lg, axis=1))
        options: list[tuple[float, str, int, int, int]] = []

        def consider(gain: FloatArray, cost: IntArray, kind: str, a: IntArray, b: IntArray) -> None:
            ok = (gain > 1e-12) & (self.used + cost <= self.budget)
            if ok.any():
                # a move that adds no moves (it reverts earlier ones) goes first
                rate = np.where(ok, np.where(cost <= 0, gain * 1e9, gain / np.maximum(cost, 1)), -np.inf)
                k = int(np.argmax(rate))
                options.append((float(rate[k]), kind, int(a[k]), int(b[k]), int(cost[k])))

        # swaps of a hot GPU's slots with every slot elsewhere
        for b in hot_gpus:
            val = lay.swap_values(int(b))  # [W, P]
            i, j = np.nonzero(np.isfinite(val))
            p, q = b * W + i, j
            g1, g2 = lay.gf[p], lay.gf[q]
            cost = (
                self._cost(g1, e[p], -1) + self._cost(g1, e[q], 1) + self._cost(g2, e[q], -1) + self._cost(g2, e[p], 1)
            )
            consider(now - val[i, j], cost, "swap", p, q)
        # replacements: a slot of an expert with >= 2 copies takes expert x; the slot's GPU or
        # one of x's GPUs is hot
        hot = np.zeros(G, dtype=bool)
        hot[hot_gpus] = True
        on_hot = np.asarray((M[hot] > 0).any(axis=0))
        sl = np.flatnonzero(c[e] >= 2)
        if not sl.size:
            return self._pick(options)
        ss, xx = np.repeat(sl, lay.E), np.tile(np.arange(lay.E), sl.size)
        a, g = e[ss], lay.gf[ss]
        keep = (xx != a) & (hot[g] | on_hot[xx])
        if not self.allow:
            keep &= M[g, xx] == 0
        ss, xx, a, g = ss[keep], xx[keep], a[keep], g[keep]
        if ss.size * T * G > self.SCREEN:  # large layers: the replacements robust planning scores
            found = [lay.replace_candidates(int(b)) for b in hot_gpus]
            parts = [f for f in found if f is not None]
            if not parts:
                return self._pick(options)
            g, i, a, xx = (np.concatenate(v) for v in zip(*parts, strict=True))
            ss = g * W + i
        step = max(1, self.CHUNK // max(1, T * G))
        for lo in range(0, ss.size, step):
            sk, xk, ak, gk = (v[lo : lo + step] for v in (ss, xx, a, g))
            gain = now - lay._replace_values(gk, ak, xk)
            consider(gain, self._cost(gk, ak, -1) + self._cost(gk, xk, 1), "replace", sk, xk)
        return self._pick(options)

    @staticmethod
    def _pick(options: list[tuple[float, str, int, int, int]]) -> tuple[str, int, int, int] | None:
        if not options:
            return None
        _, kind, i, j, added = max(options, key=lambda o: o[0])
        return kind, i, j, added

    def apply(self, state: _RobustWalk, step: tuple[str, int, int, int]) -> None:
        kind, i, j, cost = step
        lay = self.lay
        assert lay is not None
        if kind == "swap":
            lay.swap(i // lay.W, i % lay.W, j // lay.W, j % lay.W)
        else:
            lay.replace(i // lay.W, i % lay.W, j)
        self.used += cost
        self.traj.append((self.used, lay.value() - 1.0, lay.e.copy()))


def _check_current(current: ArrayLike, L: FloatArray) -> IntArray:
    cur = np.asarray(current, dtype=np.int64)
    if cur.ndim != 2:
        raise ValueError(f"current plan must be [G, W], got shape {cur.shape}")
    gpu_loads(cur, L)  # validates ids and copies
    return cur


def replan_from(
    current: ArrayLike,
    load: ArrayLike,
    *,
    max_moves: int | None = None,
    target_maxvio: float | None = None,
    allow_colocated: bool = False,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    unconstrained: ArrayLike | None = None,
    steps: ArrayLike | None = None,
    objective: Objective = "mean",
) -> IntArray:
    """Re-plan a layer from ``current`` moving few expert weights.

    Parameters
    ----------
    current : array_like of int, shape (G, W)
        Plan in service (may contain colocated copies, e.g. from EPLB).
    load : array_like of float, shape (E,)
        New loads.
    max_moves : int, optional
        Budget of changed slots (`count_moves`); ``None`` = unlimited; ``0`` returns ``current``.
    target_maxvio : float, optional
        Stop as soon as MaxVio <= target (fewest moves found that reach it).
    allow_colocated : bool
        Whether the moves may create colocated copies.
    seed, iterations : int
        For the unconstrained plan (`plan_layer`).
    unconstrained : array_like of int, shape (G, W), optional
        A precomputed unconstrained plan for ``load`` (skips the `plan_layer` call); with
        ``steps``, pass the robust plan (`moeopt.balance.plan_layer_robust`).
    steps : array_like of float, shape (T, E), optional
        Per-step loads: candidates are scored, and ``target_maxvio`` is read, as the ``objective``
        (mean or worst) per-step MaxVio (`moeopt.balance.robust_objective` minus 1).
    objective : {"mean", "worst"}
        With ``steps``.

    Returns
    -------
    ndarray of int, shape (G, W)

    Notes
    -----
    Candidates, all within the budget:

    * greedy path: from the heaviest GPU, the best swap (2 moved slots) or replacement (1 moved
      slot) by reduction of the largest load per moved slot; at a local optimum a few
      sum-of-squares smoothing swaps (never raising the maximum) reshape the plateau;
    * the unconstrained plan (`plan_layer`) relabeled onto ``current`` (`relabel`), and
      the plans met while reverting its slots to ``current`` one swap/replacement at a time;
    * with ``steps``, on layers of at most `WALK_MAX_SLOTS` slots, the per-step walk
      (`_RobustWalk`): the best replace or swap per moved slot on the per-step objective
      itself, among the moves that touch some step's hottest GPU.

    The best candidate is returned (with a target: the one with the fewest moves among those that
    reach it, else the best). With no budget and no target this is at least as good as
    `plan_layer`. Colocated copies already in ``current`` may stay; moves never create new
    ones unless ``allow_colocated``.
    """
    L = _as_load(load)
    cur = _check_current(current, L)
    G, W = cur.shape
    _check_shape(L.size, G, W, allow_colocated)
    budget = cur.size if max_moves is None else int(max_moves)
    if budget <= 0:
        return cur.copy()
    full = _unconstrained(L, G, W, cur, allow_colocated, seed, iterations, unconstrained)
    walk_target = target_maxvio if steps is None else None  # a per-step target is checked in _pick
    cands = _rescore(_migration_candidates(cur, L, budget, walk_target, allow_colocated, full), steps, objective)
    if steps is not None and cur.size <= WALK_MAX_SLOTS:
        walk = _RobustWalk(cur, _as_load(steps, ndim=2), budget, allow_colocated, objective)
        cands += _rescore(walk.run(), steps, objective)
    return _pick(cands, target_maxvio)[2]


def _rescore(
    cands: list[tuple[int, float, IntArray]], steps: ArrayLike | None, objective: Objective
) -> list[tuple[int, float, IntArray]]:
    """The candidates scored by the per-step objective (MaxVio form), or as they are without steps."""
    if steps is None:
        return cands
    return [(m, robust_objective(p, steps, objective) - 1.0, p) for m, _, p in cands]


def _revert_path(cur: IntArray, full: IntArray, L: FloatArray, allow: bool) -> list[tuple[int, float, IntArray]]:
    """From ``full`` (relabeled onto ``cur``), revert single slots to ``cur`` one at a time.

    Each step reverts the slot whose reversal raises the largest GPU load the least (the expert it
    drops must keep a copy; no new colocation unless allowed). Returns ``(moves, MaxVio, plan)``
    with strictly decreasing moves: plans in between the current and the unconstrained one (a
    descent of the one driver, `moeopt.moves.driver.descend`, over `_RevertWalk`).
    """
    G = cur.shape[0]
    if float(L.sum()) / G <= 0:
        return []
    walk = _RevertWalk(cur, full, L, allow)
    descend(walk, walk, max_steps=2**62)
    return walk.out


class _RevertWalk:
    """The reversal path of `_revert_path` as a neighbourhood of the one driver (its
    state is itself): a step reverts one differing slot (a swap between two differing slots,
    or a single slot taking back its expert); the walk ends when no slot differs, no reversal
    is valid, or a reversal does not lower the moves."""

    def __init__(self, cur: IntArray, full: IntArray, L: FloatArray, allow: bool) -> None:
        E = int(max(L.size, cur.max() + 1))
        G, W = cur.shape
        self.cur, self.L, self.allow = cur, L, allow
        self.lay = _Layout(full, None, E, allow=allow, load=L, cap=G * W)
        self.M0 = presence(cur, E)
        self.mean = float(L.sum()) / G
        self.ended = False
        self.out = [(self.moves(), float(self.lay.s.max()) / self.mean - 1.0, self.lay.e.copy())]

    def moves(self) -> int:
        return int(self.cur.size - np.minimum(self.M0, self.lay.M).sum())

    def rest_max(self, g1: IntArray, g2: IntArray) -> FloatArray:
        """Largest GPU load outside ``{g1, g2}`` (vectorized over pairs)."""
        s = self.lay.s
        order = np.argsort(-s, kind="stable")[:3]
        out = np.full(g1.shape, -np.inf)
        done = np.zeros(g1.shape, dtype=bool)
        for g in order:
            take = ~done & (g1 != g) & (g2 != g)
            out = np.where(take, s[g], out)
            done |= take
        return out

    def best(self, state: _RevertWalk) -> tuple[str, int, int, int, int] | None:
        """The cheapest reversal: ``(kind, g, i, g2 or expert, i2)``; None when the path ends."""
        if self.ended or self.out[-1][0] <= 0:
            return None
        lay, L, cur, allow = self.lay, self.L, self.cur, self.allow
        gi, ii = np.nonzero(lay.e != cur)
        x = lay.e[gi, ii]
        a = cur[gi, ii]
        c, M, s = lay.c, lay.M, lay.s
        best_v, best_mv = np.inf, None
        # swap-revert: slot p takes back its current expert a from a differing slot q that holds a
        P_, Q_ = np.nonzero((x[None, :] == a[:, None]) & (gi[:, None] != gi[None, :]))
        if P_.size:
            gp, gq = gi[P_], gi[Q_]
            ok = np.ones(P_.size, dtype=bool)
            if not allow:
                ok = (M[gq, x[P_]] == 0) & (M[gp, a[P_]] == 0)
            if ok.any():
                P_, Q_, gp, gq = P_[ok], Q_[ok], gp[ok], gq[ok]
                dw = L[a[P_]] / c[a[P_]] - L[x[P_]] / c[x[P_]]
                val = np.maximum(np.maximum(s[gp] + dw, s[gq] - dw), self.rest_max(gp, gq))
                k = int(np.argmin(val))
                p, q = int(P_[k]), int(Q_[k])
                best_v, best_mv = float(val[k]), ("swap", int(gi[p]), int(ii[p]), int(gi[q]), int(ii[q]))
        # single revert: slot p takes back its current expert (counts change)
        ok = c[x] >= 2
        if not allow:
            ok &= M[gi, a] == 0
        if ok.any():
            idx = np.flatnonzero(ok)
            xo, ao, go = x[idx], a[idx], gi[idx]
            new_x = L[xo] / np.maximum(c[xo] - 1, 1)
            new_a = L[ao] / (c[ao] + 1)
            tot = (
                s[None, :]
                + (new_x - L[xo] / c[xo])[:, None] * M[:, xo].T
                + (new_a - L[ao] / c[ao])[:, None] * M[:, ao].T
            )
            tot[np.arange(idx.size), go] += new_a - new_x
            vals = tot.max(axis=1)
            k = int(np.argmin(vals))
            if vals[k] < best_v:
                p = int(idx[k])
                best_v, best_mv = float(vals[k]), ("replace", int(gi[p]), int(ii[p]), int(a[p]), -1)
        return best_mv

    def apply(self, state: _RevertWalk, step: tuple[str, int, int, int, int]) -> None:
        kind, g, i, h, j = step
        if kind == "swap":
            self.lay.swap(g, i, h, j)
        else:
            self.lay.replace(g, i, h)
        m = self.moves()
        if m >= self.out[-1][0]:
            self.ended = True
            return
        self.out.append((m, float(self.lay.s.max()) / self.mean - 1.0, self.lay.e.copy()))


def _unconstrained(
    L: FloatArray, G: int, W: int, cur: IntArray, allow: bool, seed: int, iterations: int, given: ArrayLike | None
) -> IntArray:
    """The unconstrained plan (given or `plan_layer`), relabeled onto ``cur``."""
    if given is None:
        plan = plan_layer(L, G, W, allow_colocated=allow, seed=seed, iterations=iterations)
    else:
        plan = np.asarray(given, dtype=np.int64)
        if plan.shape != cur.shape:
            raise ValueError(f"unconstrained plan has shape {plan.shape}, expected {cur.shape}")
        gpu_loads(plan, L)  # validates ids and copies
    return relabel(plan, cur)


def _migration_candidates(
    cur: IntArray,
    L: FloatArray,
    budget: int,
    target: float | None,
    allow: bool,
    full: IntArray,
    path: list[tuple[int, float, IntArray]] | None = None,
) -> list[tuple[int, float, IntArray]]:
    G, W = cur.shape
    cap = _cap(L.size, G, W, allow)
    cands = _MigrationWalk(cur, L, cap, allow, budget, target).run()
    if path is None:
        path = _revert_path(cur, full, L, allow)
    cands += [p for p in path if p[0] <= budget]
    nm = count_moves(cur, full)
    if nm <= budget:
        cands.append((nm, float(maxvio(full, L)), full))
    return cands


def _pick(cands: list[tuple[int, float, IntArray]], target: float | None) -> tuple[int, float, IntArray]:
    if target is not None:
        hit = [c for c in cands if c[1] <= target]
        if hit:
            return min(hit, key=lambda c: (c[0], c[1]))
    return min(cands, key=lambda c: (c[1], c[0]))


def migration_frontier(
    current: ArrayLike,
    load: ArrayLike,
    budgets: Sequence[int],
    *,
    allow_colocated: bool = False,
    seed: int = 0,
    iterations: int = DEFAULT_ITERATIONS,
    unconstrained: ArrayLike | None = None,
    steps: ArrayLike | None = None,
    objective: Objective = "mean",
) -> list[tuple[int, float]]:
    """Moves used vs MaxVio reached, for each budget.

    Parameters
    ----------
    current : array_like of int, shape (G, W)
    load : array_like of float, shape (E,)
    budgets : sequence of int
        Budgets of moved slots (``0`` gives the current plan's MaxVio).
    allow_colocated, seed, iterations, unconstrained, steps, objective
        As in `replan_from` (with ``steps`` the MaxVio is the per-step objective's).

    Returns
    -------
    list of (int, float)
        ``(moves used, MaxVio)`` per budget, in the order given: the best plan with at most that
        many moves among one greedy trajectory run to the largest budget (with ``steps``, the
        per-step walk's too), the revert path of the unconstrained plan and that plan itself (so
        MaxVio never increases with the budget). One
        greedy run serves all budgets; `replan_from` with ``max_moves=b`` runs its own greedy,
        which may differ near the budget (it can still fit a 1-slot move where a swap does not).
    """
    L = _as_load(load)
    cur = _check_current(current, L)
    G, W = cur.shape
    _check_shape(L.size, G, W, allow_colocated)
    if not budgets:
        return []
    full = _unconstrained(L, G, W, cur, allow_colocated, seed, iterations, unconstrained)
    top = max(int(b) for b in budgets)
    cands = [(0, float(maxvio(cur, L)), cur)]
    if top > 0:
        path = _revert_path(cur, full, L, allow_colocated)
        cands += _migration_candidates(cur, L, top, None, allow_colocated, full, path)
    cands = _rescore(cands, steps, objective)
    if steps is not None and top > 0 and cur.size <= WALK_MAX_SLOTS:
        walk = _RobustWalk(cur, _as_load(steps, ndim=2), top, allow_colocated, objective)
        cands += _rescore(walk.run(), steps, objective)
    best: dict[int, tuple[int, float]] = {}
    for b in sorted({int(x) for x in budgets}):
        m, v, _ = _pick([c for c in cands if c[0] <= b], None)
        best[b] = (m, v)
    return [best[int(b)] for b in budgets]
