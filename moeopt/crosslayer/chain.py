"""Chain moves: the best joint re-split of two GPUs' experts over consecutive layers."""

from __future__ import annotations

import functools
import itertools
import time

import numpy as np

from moeopt.crosslayer.objective import next_layer_benefit
from moeopt.heuristics.local_search import TOL

#: Largest number of splits of two GPUs' experts `chain_pass` enumerates per layer
#: (``C(2S, S)``: 70 at 4 slots per GPU); with more slots the chain moves are skipped.
CHAIN_MAX_SPLITS = 70


@functools.lru_cache(maxsize=64)
def _splits(m: int, on_a: int) -> tuple[np.ndarray, np.ndarray]:
    """Every way to put ``on_a`` of m experts on GPU a (the rest on b): bitmasks ``[P]`` and
    membership ``bool [P, m]``."""
    masks = np.array([sum(1 << i for i in c) for c in itertools.combinations(range(m), on_a)], dtype=np.int64)
    return masks, ((masks[:, None] >> np.arange(m)[None, :]) & 1).astype(bool)


def _token_bits(ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """int ``[T]``: bit i set when the token's experts include the i-th expert of the pair."""
    p = pos[ids]
    return np.where(p >= 0, np.left_shift(1, np.maximum(p, 0)), 0).sum(axis=1)


def chain_pass(
    homes: np.ndarray,
    topk: np.ndarray,
    first: np.ndarray | None,
    gpus: int,
    loads: list[np.ndarray],
    limits: list[float | None],
    *,
    layers: tuple[int, int] | None = None,
    pairs: list[tuple[int, int]] | None = None,
    deadline: float | None = None,
) -> tuple[float, bool]:
    """Chain moves: for each pair of GPUs (a, b), the best joint re-split of the experts they
    hold at layers ``lo..hi`` (``layers``, default all), applied in place when it saves
    remote GPUs; returns the remote GPUs saved (summed over tokens) and whether ``deadline``
    cut the pass short.

    A swap in one layer cannot move a *chain* (an expert at l and the experts its tokens go
    to at l + 1) together: moving e from a to b moves its tokens' home at l + 1, so e's
    successors on a lose the stays they had. Here the splits of the pair's experts (each
    layer keeps the slot counts of a and b and its load limit) are chosen jointly over the
    layers, exactly, with the other GPUs and the layers outside ``lo..hi`` fixed: the remote
    GPUs that change are a chain of terms, layer l's depending only on the splits at l - 1
    and l, so one dynamic program over the layers (``[P, Q]`` tables, ``C(m, S_a)`` splits
    per layer) finds the best:

    * layer ``lo``'s own: tokens whose top-k meets the pair's experts, grouped by which of
      them they use (a bitmask) and where they live (a, b, elsewhere; fixed);
    * layer l > lo: tokens whose layer l - 1 top-1 is one of the pair's experts live on a or
      b depending on the split at l - 1; grouped by that expert and their layer-l bitmask;
    * layer ``hi + 1``'s: linear in the split at ``hi`` (`next_layer_benefit`).

    GPU pairs run in sequence (a Python loop over pairs, numpy inside); ``deadline`` stops
    it early. Layers with more than `CHAIN_MAX_SPLITS` splits end the chain.
    """
    L, E = homes.shape
    lo, hi = (0, L - 1) if layers is None else layers
    th = first if lo == 0 else homes[lo - 1][topk[:, lo - 1, 0]]
    scale = (1.0 - 1.0 / gpus) if th is None else 1.0
    bm = None if hi + 1 >= L else next_layer_benefit(homes[hi + 1], topk[:, hi, 0], topk[:, hi + 1, :], E, gpus)
    lims = [np.inf if (lim := limits[l]) is None else lim + TOL for l in range(L)]
    saved = 0.0
    todo = pairs if pairs is not None else [(a, b) for a in range(gpus) for b in range(a + 1, gpus)]
    for a, b in todo:
        if deadline is not None and time.perf_counter() > deadline:
            return saved, True
        xs: list[np.ndarray] = []
        ins: list[np.ndarray] = []
        values, backs, cur = None, [], 0.0
        top, prev_pos, cur_prev, options = lo - 1, np.full(E, -1), 0, 1
        for l in range(lo, hi + 1):
            h = homes[l]
            x = np.flatnonzero((h == a) | (h == b))
            m = len(x)
            if m > 16:
                break
            masks, inside = _splits(m, int((h[x] == a).sum()))
            if len(masks) > CHAIN_MAX_SPLITS:
                break
            pos = np.full(E, -1)
            pos[x] = np.arange(m)
            bits = _token_bits(topk[:, l, :], pos)
            hit = bits > 0
            rest = ((1 << m) - 1) & ~masks
            if l == lo:  # homes fixed: a, b or elsewhere
                where = (
                    np.full(int(hit.sum()), 2)
                    if th is None
                    else np.where(th[hit] == a, 0, np.where(th[hit] == b, 1, 2))
                )
                cnt = np.bincount(bits[hit] * 3 + where, minlength=(1 << m) * 3).reshape(1 << m, 3)
                used = np.flatnonzero(cnt.sum(axis=1))
                cnt = cnt[used].astype(np.float64)
                on_a = ((used[None, :] & masks[:, None]) != 0).astype(np.float64)
                on_b = ((used[None, :] & rest[:, None]) != 0).astype(np.float64)
                step = (scale * (on_b @ cnt[:, 0] + on_a @ cnt[:, 1] + (on_a + on_b) @ cnt[:, 2]))[None, :]
            else:  # homes: the pair's previous-layer expert that is the token's top-1 (m_prev: none)
                mp = len(xs[-1])
                src = prev_pos[topk[hit, l - 1, 0]]
                src = np.where(src < 0, mp, src)
                C = np.bincount(src * (1 << m) + bits[hit], minlength=(mp + 1) << m).reshape(mp + 1, 1 << m)
                used = np.flatnonzero(C.sum(axis=0))
                C = C[:, used].astype(np.float64)
                q_a = ((used[None, :] & masks[:, None]) != 0).astype(np.float64)
                q_b = ((used[None, :] & rest[:, None]) != 0).astype(np.float64)
                prev_in = ins[-1]
                step = (
                    ((q_a + q_b) @ C.sum(axis=0))[None, :] - prev_in @ (C[:mp] @ q_a.T) - (~prev_in) @ (C[:mp] @ q_b.T)
                )
            la = inside @ loads[l][x]
            ok = (la <= lims[l]) & (loads[l][x].sum() - la <= lims[l])
            c = int(np.flatnonzero((inside == (h[x] == a)).all(axis=1))[0])  # the current split
            step = np.where(ok[None, :], step, np.inf)
            if values is None:
                values = step[0]
                cur = float(step[0, c])
            else:
                total = values[:, None] + step
                backs.append(np.argmin(total, axis=0))
                values = total[backs[-1], np.arange(total.shape[1])]
                cur += float(step[cur_prev, c])
            xs.append(x)
            ins.append(inside)
            prev_pos, cur_prev, top = pos, c, l
            options *= len(masks)
        if values is None or options == 1 or not np.isfinite(cur):
            continue  # nothing to choose, or the current split breaks a load limit (no descent to price)
        if bm is not None and top == hi:  # the layer after the chain: linear in its last split
            lin = ins[-1] @ bm[xs[-1], a] + (~ins[-1]) @ bm[xs[-1], b]
            values = values - lin
            cur -= float(lin[cur_prev])
        elif top < L - 1:  # the chain stopped early: price the next layer against its last split
            nb = next_layer_benefit(homes[top + 1], topk[:, top, 0], topk[:, top + 1, :], E, gpus)
            lin = ins[-1] @ nb[xs[-1], a] + (~ins[-1]) @ nb[xs[-1], b]
            values = values - lin
            cur -= float(lin[cur_prev])
        j = int(np.argmin(values))
        gain = cur - float(values[j])
        if gain > 1e-7 * max(1.0, abs(cur)):
            saved += gain
            for t in range(len(xs) - 1, -1, -1):
                homes[lo + t][xs[t]] = np.where(ins[t][j], a, b)
                if t > 0:
                    j = int(backs[t - 1][j])
    return saved, False
