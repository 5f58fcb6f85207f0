"""The balance planner's layout (a `WeightedSlots`: slot table with
per-slot weights and per-GPU sums) and the vectorized swap / replace / smoothing kernels of its local search."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from moeopt.balance.loads import _RTOL, FloatArray, IntArray
from moeopt.moves.driver import Moves, descend
from moeopt.moves.slots import WeightedSlots


class _Layout(WeightedSlots):
    """Slots of one layer with per-slot weights and per-GPU sums (a `WeightedSlots`).

    In *item* mode (``load is None``) every slot holds an item with a fixed weight (``item`` tracks
    item ids). In *count* mode the weight of a slot is ``load[e] / c[e]`` and replace moves change
    the counts.
    """

    __slots__ = ("load", "cap", "allow", "tol")
    _shared = ("gf", "load")

    def __init__(
        self,
        eslot: IntArray,
        wslot: FloatArray | None,
        E: int,
        *,
        allow: bool,
        item: IntArray | None = None,
        load: FloatArray | None = None,
        cap: int = 0,
    ) -> None:
        e = np.asarray(eslot, dtype=np.int64)
        if load is not None:
            w = load[e] / np.bincount(e.ravel(), minlength=E)[e]
        elif wslot is not None:
            w = wslot
        else:
            raise ValueError("_Layout needs slot weights or per-expert loads")
        super().__init__(e, w, E, item)
        self.allow = allow
        self.load = load
        self.cap = cap
        mean = float(self.s.mean()) if self.G else 0.0
        self.tol = _RTOL * max(mean, 1e-300) * 8

    def replace(self, g: int, i: int, x: int) -> int:
        if self.load is None:
            raise RuntimeError("_Layout.replace needs per-expert loads (a layout built with load=)")
        a = super().replace(g, i, x)
        self.w = self.load[self.e] / self.c[self.e]
        self.s = self.w.sum(axis=1)
        return a

    # -- kernels ----------------------------------------------------------------------------------
    def best_swap(self, b: int) -> tuple[float, int, int] | None:
        """Best exchange of an item of GPU ``b`` (the maximum) with an item elsewhere.

        Returns ``(new pair max, slot on b, flat slot elsewhere)`` when both bins end strictly below
        ``s[b]``, else ``None``.
        """
        W = self.W
        sb = self.s[b]
        d = self.w.reshape(-1)[None, :] - self.w[b][:, None]  # [W, P]: b gains d, the partner loses d
        val = np.maximum(d + sb, self.s[self.gf] - d)
        val[:, b * W : (b + 1) * W] = np.inf
        if not self.allow:
            val[:, self.M[b, self.e.reshape(-1)] > 0] = np.inf  # partner's expert already on b
            val[(self.M[:, self.e[b]] > 0)[self.gf].T] = np.inf  # b's expert already on the partner
        k = int(np.argmin(val))
        v = float(val.flat[k])
        if v < sb - self.tol:
            return v, k // val.shape[1], k % val.shape[1]
        return None

    def best_max_swap(self) -> tuple[int, int, int, int] | None:
        """The `best_swap` of the heaviest GPU as a step ``(g1, i1, g2, i2)``, or None."""
        b = int(np.argmax(self.s))
        mv = self.best_swap(b)
        if mv is None:
            return None
        _, i, j = mv
        return b, i, j // self.W, j % self.W

    def descent(self, max_moves: int) -> int:
        """Max-bin swap descent; returns the number of swaps applied."""
        return descend(self, SWAPS, max_moves)

    def best_smooth(self, top: int = 8) -> tuple[int, int, int, int] | None:
        """The best sum-of-squares improving swap that keeps every bin below the maximum, as a
        step ``(g1, i1, g2, i2)``, or None.

        Sources are the items of the ``top`` heaviest bins, partners any item of another bin: this
        lowers the bins that block the max-bin descent.
        """
        W = self.W
        k = min(top, self.G)
        ef = self.e.ravel()
        smax = float(self.s.max())
        src = np.argpartition(-self.s, k - 1)[:k] if k < self.G else np.arange(self.G)
        wi = self.w[src].ravel()  # [k*W]
        gi = np.repeat(src, W)
        ei = self.e[src].ravel()
        wf = self.w.ravel()
        sa = self.s[gi][:, None]
        sb = self.s[self.gf][None, :]
        d = wi[:, None] - wf[None, :]  # source bin changes by -d, partner bin by +d
        na = sa - d
        nb = sb + d
        gain = d * (sa - sb - d)  # half the sum-of-squares decrease
        ok = (gi[:, None] != self.gf[None, :]) & (na < smax - self.tol) & (nb < smax - self.tol)
        if not self.allow:
            ok &= self.M[self.gf[None, :], ei[:, None]] == 0
            ok &= self.M[gi[:, None], ef[None, :]] == 0
        gain = np.where(ok, gain, 0.0)
        j = int(np.argmax(gain))
        if gain.flat[j] <= 1e-12 * smax * smax:
            return None
        r, q = divmod(j, gain.shape[1])
        return int(gi[r]), int(r % W), q // W, q % W

    def smooth(self, max_moves: int) -> int:
        """Sum-of-squares smoothing swaps (`best_smooth`); returns the number applied."""
        return descend(self, SMOOTHING, max_moves)

    def replace_candidates(self, b: int) -> tuple[FloatArray, FloatArray, IntArray, IntArray, IntArray]:
        """Score every count change touching GPU ``b`` (the maximum), vectorized over all GPUs.

        Two families: (i) a donor slot on ``b`` (its expert has ``c >= 2``) becomes any expert ``x``;
        (ii) an expert ``x`` on ``b`` gains a copy at a donor slot elsewhere. Returns ``(strict,
        relaxed, gpu, slot, x)``: ``strict`` ranks moves that lower ``b`` below the maximum without
        raising any other GPU to it (``inf`` otherwise), ``relaxed`` is the new largest load.
        """
        assert self.load is not None and self.c is not None
        L, c, M, s = self.load, self.c, self.M, self.s
        thr = float(s[b]) - self.tol
        tied_other = s >= thr
        tied_other[b] = False
        old = L / c
        give = c >= 2
        take = c < self.cap
        new_minus = np.where(give, L / np.maximum(c - 1, 1), 0.0)
        new_plus = L / (c + 1)
        da = np.where(give, new_minus - old, 0.0)
        dx = new_plus - old
        out: list[tuple[FloatArray, FloatArray, IntArray, IntArray, IntArray]] = []

        def judge(tot: FloatArray, valid: NDArray[np.bool_]) -> tuple[FloatArray, FloatArray]:
            ok = valid & (tot[..., b] < thr)
            ok &= np.all((tot < thr) | (tied_other & (tot <= s + self.tol)), axis=-1)
            strict = np.where(ok, np.where(tied_other, -np.inf, tot).max(axis=-1), np.inf)
            relaxed = np.where(valid, tot.max(axis=-1), np.inf)
            return strict, relaxed

        # (i) a donor slot on b becomes expert x
        ea = self.e[b]
        ii = np.flatnonzero(give[ea])
        if ii.size and take.any():
            a = ea[ii]
            A = (M[:, a].T * da[a][:, None]).astype(np.float64)
            A[:, b] -= new_minus[a]
            X = M.T * dx[:, None]
            X[:, b] += new_plus
            tot = s[None, None, :] + A[:, None, :] + X[None, :, :]
            valid = take[None, :] & (np.arange(self.E)[None, :] != a[:, None])
            if not self.allow:
                valid &= (M[b] == 0)[None, :]
            st, rl = judge(tot, valid)
            K, X_ = np.meshgrid(ii, np.arange(self.E), indexing="ij")
            out.append((st.ravel(), rl.ravel(), np.full(st.size, b), K.ravel(), X_.ravel()))
        # (ii) an expert x on b gains a copy at a donor slot elsewhere
        xs = np.unique(ea[take[ea]])
        ef = self.e.ravel()
        jj = np.flatnonzero(give[ef] & (self.gf != b))
        if xs.size and jj.size:
            aj = ef[jj]
            gj = self.gf[jj]
            Aj = (M[:, aj].T * da[aj][:, None]).astype(np.float64)
            Aj[np.arange(jj.size), gj] -= new_minus[aj]
            Xp = M[:, xs].T * dx[xs][:, None]
            tot = s[None, None, :] + Xp[:, None, :] + Aj[None, :, :]
            tot[:, np.arange(jj.size), gj] += new_plus[xs][:, None]
            valid = aj[None, :] != xs[:, None]
            if not self.allow:
                valid &= M[gj[None, :], xs[:, None]] == 0
            st, rl = judge(tot, valid)
            X_, J = np.meshgrid(xs, jj, indexing="ij")
            out.append((st.ravel(), rl.ravel(), self.gf[J.ravel()], J.ravel() % self.W, X_.ravel()))
        if not out:
            empty = np.empty(0)
            return empty, empty, empty.astype(np.int64), empty.astype(np.int64), empty.astype(np.int64)
        return tuple(np.concatenate([o[t] for o in out]) for t in range(5))  # type: ignore[return-value]

    def best_replace(self, b: int) -> tuple[float, int, int, int] | None:
        """Best count change that lowers GPU ``b`` (the maximum) without creating a new maximum.

        Returns ``(score, gpu, slot, new expert)`` or ``None``.
        """
        st, _, g, i, x = self.replace_candidates(b)
        if st.size == 0:
            return None
        k = int(np.argmin(st))
        if not np.isfinite(st[k]):
            return None
        return float(st[k]), int(g[k]), int(i[k]), int(x[k])

    def replace_lookahead(self, n_cand: int, max_moves: int) -> _Layout | None:
        """Try the ``n_cand`` count changes with the lowest new maximum, each followed by a swap
        descent; return the best resulting layout if it lowers the maximum, else ``None``."""
        _, rl, g, i, x = self.replace_candidates(int(np.argmax(self.s)))
        if rl.size == 0:
            return None
        best, best_max = None, float(self.s.max()) - self.tol
        for k in np.argsort(rl, kind="stable")[:n_cand]:
            if not np.isfinite(rl[k]):
                break
            trial = self.copy()
            trial.replace(int(g[k]), int(i[k]), int(x[k]))
            trial.descent(max_moves)
            m = float(trial.s.max())
            if m < best_max:
                best, best_max = trial, m
        return best

    def best_max_replace(self) -> tuple[int, int, int] | None:
        """The `best_replace` of the heaviest GPU as a step ``(g, i, x)``, or None."""
        mv = self.best_replace(int(np.argmax(self.s)))
        return None if mv is None else mv[1:]

    def joint_descent(self, max_moves: int, smooth_moves: int, replace: bool = True) -> None:
        """Alternate swap descent, smoothing and replace moves until none lowers the maximum."""
        n = 0
        while n < max_moves:
            n += descend(self, SWAPS, max_moves - n)
            if smooth_moves:
                k = descend(self, SMOOTHING, smooth_moves)
                if k:
                    n += k
                    m = descend(self, SWAPS, max_moves - n)
                    if m:
                        n += m
                        continue
            if self.load is None or not replace or not descend(self, REPLACES, 1):
                break
            n += 1

    def perturb(self, rng: np.random.Generator, n_bins: int, n_swaps: int) -> None:
        """Random feasible swaps among the heaviest GPU and ``n_bins`` random others."""
        G, W = self.G, self.W
        if G < 2:
            return
        b = int(np.argmax(self.s))
        k = min(n_bins, G - 1)
        r = rng.integers(0, 1 << 30, size=k + 4 * n_swaps)
        # k distinct other bins (partial Fisher-Yates on 0..G-2, then skip b)
        pool = list(range(G - 1))
        for t in range(k):
            j = t + int(r[t]) % (G - 1 - t)
            pool[t], pool[j] = pool[j], pool[t]
        bins = [b] + [o + (o >= b) for o in pool[:k]]
        nb = k + 1
        for t in range(n_swaps):
            x1, x2, i1, i2 = (int(v) for v in r[k + 4 * t : k + 4 * t + 4])
            g1 = bins[x1 % nb]
            g2 = bins[(x1 % nb + 1 + x2 % k) % nb]
            i1 %= W
            i2 %= W
            if self.can_swap(g1, i1, g2, i2, self.allow):
                self.swap(g1, i1, g2, i2)


def _swap(lay: _Layout, step: tuple[int, int, int, int]) -> None:
    lay.swap(*step)


def _replace(lay: _Layout, step: tuple[int, int, int]) -> None:
    lay.replace(*step)


#: the neighbourhoods of the layout (`moeopt.moves.driver.descend` runs them)
SWAPS: Moves[_Layout, tuple[int, int, int, int]] = Moves(_Layout.best_max_swap, _swap)
SMOOTHING: Moves[_Layout, tuple[int, int, int, int]] = Moves(_Layout.best_smooth, _swap)
REPLACES: Moves[_Layout, tuple[int, int, int]] = Moves(_Layout.best_max_replace, _replace)
