"""The lower bound on the largest GPU load of every plan of a layer."""

from __future__ import annotations

from typing import Literal, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from moeopt.balance.copies import copy_counts
from moeopt.balance.loads import (
    FloatArray,
    _as_load,
    _cap,
    _check_shape,
)


def _ceil_down(x: FloatArray) -> FloatArray:
    """``ceil`` that rounds values within a relative 1e-12 of an integer down (keeps bounds valid)."""
    return np.ceil(x - 1e-12 * np.maximum(1.0, np.abs(x)))


def _pigeonhole_feasible(L: FloatArray, T: float, G: int, W: int, cap: int) -> bool:
    """Necessary conditions for a plan with largest GPU load ``<= T`` (see `lower_bound`)."""
    P = G * W
    r = L / T
    m = np.maximum(1.0, _ceil_down(r))  # copies needed for per-copy load <= T
    if np.any(m > cap) or m.sum() > P + 0.5:
        return False
    for k in range(1, W):
        a = np.maximum(1.0, _ceil_down((k + 1) * r))  # copies needed for per-copy load <= T/(k+1)
        forced = a > cap
        room = k * G - m[forced].sum()  # items > T/(k+1) allowed beyond the forced ones
        if room < -0.5:
            return False
        base = a[~forced].sum() + m[forced].sum()
        need = base - P  # copies that must be saved by letting experts stay "big"
        if need <= 0.5:
            continue
        # fractional knapsack: experts moved to "big" save a_e - m_e copies and use m_e of the room
        sav = (a - m)[~forced]
        size = m[~forced]
        keep = sav > 0
        sav, size = sav[keep], size[keep]
        order = np.argsort(-sav / size, kind="stable")
        sav, size = sav[order], size[order]
        csize = np.cumsum(size)
        full = csize <= room + 1e-9
        best = sav[full].sum()
        nf = int(full.sum())
        if nf < sav.size:
            left = room - (csize[nf - 1] if nf else 0.0)
            best += sav[nf] * max(left, 0.0) / size[nf]
        if best < need - 1e-9:
            return False
    return True


@overload
def lower_bound(
    load: ArrayLike, G: int, W: int, allow_colocated: bool = False, *, details: Literal[False] = False
) -> float: ...
@overload
def lower_bound(
    load: ArrayLike, G: int, W: int, allow_colocated: bool = False, *, details: Literal[True]
) -> dict[str, float]: ...
def lower_bound(
    load: ArrayLike, G: int, W: int, allow_colocated: bool = False, *, details: bool = False
) -> float | dict[str, float]:
    """A valid lower bound on the largest GPU load of every plan (all copy counts, all placements).

    Parameters
    ----------
    load : array_like of float, shape (E,)
    G, W : int
        GPUs and slots per GPU.
    allow_colocated : bool
        Whether plans may put two copies of one expert on one GPU (only raises the copy cap).
    details : bool
        Return the parts as a dict (``average``, ``per_copy``, ``pigeonhole``, ``bound``).

    Returns
    -------
    float or dict
        ``max(average, per_copy, pigeonhole)``.

    Notes
    -----
    Let ``OPT`` be the optimal largest GPU load and ``T >= OPT`` the largest load of an optimal plan.

    * ``average = total / G``: some GPU carries at least the mean.
    * ``per_copy = min_c max_e load_e / c_e`` over ``sum c = P``, ``c_e <= cap`` (``cap = G`` without
      colocation): every slot's load is at most its GPU's load.
    * ``pigeonhole``: call a slot *k-big* when its per-copy load exceeds ``T / (k+1)``. If more than
      ``k G`` slots were k-big, some GPU would hold ``k+1`` of them and carry more than ``T``; so at most
      ``k G`` slots are k-big, for ``k = 1 .. W-1`` (this holds with colocated copies too: it is a
      statement about slots). Whatever the counts, expert ``e`` is either k-big with ``c_e >= m_e =
      ceil(load_e / T)`` copies (all k-big, since copies split evenly) or not, and then needs
      ``c_e >= a_e = ceil((k+1) load_e / T)`` copies. Hence there is a set ``B`` with
      ``sum_B m_e <= k G`` and ``sum_{not B} a_e + sum_B m_e <= P`` (experts with ``a_e > cap`` are in
      ``B``). We test the fractional (LP) relaxation of this knapsack. The test is monotone in ``T``
      (the same fractional ``B`` stays feasible when ``T`` grows), so bisection finds a ``T_0`` whose
      test fails; then ``OPT > T_0``. The test is piecewise constant between the breakpoints
      ``(k+1) load_e / q`` (``q`` integer), so it fails up to the first breakpoint above ``T_0``,
      which is returned (less a relative 1e-12 against float error). Near-integer ceilings round
      down inside the test, which only weakens it.
    """
    L = _as_load(load)
    E = L.size
    _check_shape(E, G, W, allow_colocated)
    total = float(L.sum())
    if total <= 0:
        out = {"average": 0.0, "per_copy": 0.0, "pigeonhole": 0.0, "bound": 0.0}
        return out if details else 0.0
    cap = _cap(E, G, W, allow_colocated)
    average = total / G
    c = copy_counts(L, G * W, cap)
    per_copy = float((L / c).max())
    lo = max(average, per_copy)
    pig = lo
    if not _pigeonhole_feasible(L, lo, G, W, cap):
        hi = total  # any plan has max <= total, so the necessary test passes there
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            if _pigeonhole_feasible(L, mid, G, W, cap):
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-13 * hi:
                break
        # The test only changes at breakpoints (k+1) load_e / q, so it fails on [lo, b) for the
        # smallest breakpoint b > lo: OPT >= b. Shaved by 1e-12 against float error near lo.
        x = np.arange(1, W + 1)[:, None] * L[None, :]
        x = x[x > 0]
        q = np.ceil(x / lo) - 1.0
        b = x[q >= 1] / q[q >= 1]
        b = b[b > lo]
        pig = max(lo, min(float(b.min()), hi) * (1 - 1e-12)) if b.size else lo
    bound = max(average, per_copy, pig)
    if details:
        return {"average": average, "per_copy": per_copy, "pigeonhole": pig, "bound": bound}
    return bound


def _pigeonhole_feasible_batch(L: FloatArray, T: FloatArray, G: int, W: int, cap: int) -> NDArray[np.bool_]:
    """`_pigeonhole_feasible` for every row of ``L[n, E]`` at its own ``T[n] > 0``, at once."""
    P = G * W
    r = L / T[:, None]
    m = np.maximum(1.0, _ceil_down(r))
    ok = ~((m > cap).any(axis=1) | (m.sum(axis=1) > P + 0.5))
    for k in range(1, W):
        a = np.maximum(1.0, _ceil_down((k + 1) * r))
        forced = a > cap
        mf = np.where(forced, m, 0.0).sum(axis=1)
        room = k * G - mf
        ok &= room >= -0.5
        need = np.where(forced, 0.0, a).sum(axis=1) + mf - P
        check = ok & (need > 0.5)
        if not check.any():
            continue
        rows = np.flatnonzero(check)
        sav = np.where(forced[rows], 0.0, (a - m)[rows])
        valid = sav > 0
        size = np.where(valid, m[rows], 0.0)
        sav = np.where(valid, sav, 0.0)
        ratio = np.where(valid, sav / np.where(valid, size, 1.0), -np.inf)
        order = np.argsort(-ratio, axis=1, kind="stable")  # invalid items last
        sav, size = np.take_along_axis(sav, order, axis=1), np.take_along_axis(size, order, axis=1)
        csize = np.cumsum(size, axis=1)
        rm = room[rows]
        full = csize <= rm[:, None] + 1e-9  # a prefix (sizes >= 1 on valid items)
        best = np.where(full, sav, 0.0).sum(axis=1)
        nvalid = valid.sum(axis=1)
        nf = np.minimum(full.sum(axis=1), nvalid)
        part = np.flatnonzero(nf < nvalid)
        if part.size:
            i = nf[part]
            left = rm[part] - np.where(i > 0, csize[part, np.maximum(i - 1, 0)], 0.0)
            best[part] += sav[part, i] * np.maximum(left, 0.0) / size[part, i]
        ok[rows[best < need[rows] - 1e-9]] = False
    return ok


def lower_bound_batch(
    loads: ArrayLike, G: int, W: int, allow_colocated: bool = False, counts: ArrayLike | None = None
) -> FloatArray:
    """`lower_bound` of every row of ``loads[L, E]``; float ``[L]``.

    ``counts`` (optional): the water-filled copy counts of ``loads``
    (`moeopt.balance.batch.copy_counts_batch` with ``G * W`` copies), when the caller has them.

    The average and per-copy terms and the pigeonhole test at their maximum run for all layers
    at once (on real loads the test passes there on most layers, and that maximum is the bound);
    a layer where it fails gets the per-layer function's bisection. Equal to `lower_bound`
    row by row (tested).
    """
    from moeopt.balance.batch import copy_counts_batch  # batch imports the planner, which is heavier

    Ld = np.asarray(loads, dtype=np.float64)
    if Ld.ndim != 2:
        raise ValueError(f"loads must be [L, E], got shape {Ld.shape}")
    nL, E = Ld.shape
    out = np.zeros(nL)
    if nL == 0:
        return out
    if not np.all(np.isfinite(Ld)) or np.any(Ld < 0):
        raise ValueError("load must be finite and >= 0")
    _check_shape(E, G, W, allow_colocated)
    cap = _cap(E, G, W, allow_colocated)
    total = Ld.sum(axis=1)
    pos = np.flatnonzero(total > 0)
    if pos.size == 0:
        return out
    Lp = Ld[pos]
    c = copy_counts_batch(Lp, G * W, cap) if counts is None else np.asarray(counts, dtype=np.int64)[pos]
    lo = np.maximum(total[pos] / G, (Lp / c).max(axis=1))
    ok = _pigeonhole_feasible_batch(Lp, lo, G, W, cap)
    out[pos] = lo
    for i in np.flatnonzero(~ok):
        out[pos[i]] = lower_bound(Lp[i], G, W, allow_colocated)
    return out
