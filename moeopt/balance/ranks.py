"""Balance under vLLM-Ascend's rank-modulo routing: loads, a polish, a lower bound.

vLLM-Ascend sends rank ``r``'s tokens for expert ``e`` to copy ``j(r, e)`` of ``e``, the copies
being ``e``'s ``c`` devices in rank order: ``j = r mod c`` (with tensor parallelism ``tp``:
``(r mod tp + r div tp + e) mod c``; [`moeopt.dispatch.ascend_map`][]). With the tokens spread
evenly over the source ranks, copy ``j`` serves ``n_j / G`` of ``e``'s load, ``n_j`` the ranks
that pick it: ``floor(G / c)`` or ``ceil(G / c)`` without TP. When ``c`` does not divide ``G``
the copies on the lowest-numbered devices get the larger shares, so a plan packed for the even
split (every copy ``1 / c``) loses its balance: on the real DeepSeek-V3 prefill loads at
64 GPUs x (4 + 1) slots, ``balance``'s even plan is at MaxVio 0.0014 under ``even`` and 0.0144
under this rule.

`polish_rank_modulo` repairs a plan for the rule: a descent on the rule's true GPU loads
whose move swaps two slots of different GPUs (two experts trade places, which re-orders both
experts' devices and so re-deals their shares), always from the most loaded GPU, taking the
swap that lowers ``(largest load, sum of squared loads)`` the most. Every candidate swap of a
slot of the most loaded GPU is scored at once (numpy), so one step costs a few array
operations of ``G * W x G`` numbers.
"""

from __future__ import annotations

import numpy as np

from moeopt.balance.copies import copy_counts
from moeopt.balance.loads import FloatArray, IntArray


def share_table(G: int, experts: int, tp_size: int | None = None) -> FloatArray:
    """float ``[E, G + 1, G]``: ``n[e, c, j] / G``, the share of expert ``e``'s load served by its
    ``j``-th copy (devices in rank order) when it has ``c`` copies (``c = 0`` unused)."""
    r = np.arange(G)
    out = np.zeros((experts, G + 1, G))
    for c in range(1, G + 1):
        if tp_size is None or tp_size <= 1:  # the same deal for every expert
            out[:, c, :c] = np.bincount(r % c, minlength=c)[None, :] / G
            continue
        j = (r[None, :] % tp_size + r[None, :] // tp_size + np.arange(experts)[:, None]) % c  # [E, G]
        counts = np.zeros((experts, c))
        np.add.at(counts, (np.repeat(np.arange(experts), G), j.ravel()), 1.0)
        out[:, c, :c] = counts / G
    return out


def _contribution(held: np.ndarray, experts: IntArray, load: FloatArray, table: FloatArray) -> FloatArray:
    """float ``[n, G]``: the load each row's expert puts on every GPU, ``held[n, G]`` its devices."""
    c = held.sum(axis=-1)
    rank = np.cumsum(held, axis=-1) - 1  # a device's position among the expert's devices
    share = table[experts[:, None], c[:, None], np.clip(rank, 0, held.shape[-1] - 1)]
    return np.where(held, share * load[experts][:, None], 0.0)


def rank_modulo_loads(slots: IntArray, load: FloatArray, table: FloatArray) -> FloatArray:
    """float ``[G]``: one layer's GPU loads under the rank-modulo rule (``table`` of `share_table`)."""
    G = slots.shape[0]
    E = load.size
    held = np.zeros((E, G), dtype=bool)
    g, _ = np.nonzero(slots >= 0)
    held[slots[slots >= 0], g] = True
    return np.asarray(_contribution(held, np.arange(E), load, table).sum(axis=0))


def polish_rank_modulo(
    slots: IntArray, load: FloatArray, table: FloatArray, *, max_steps: int | None = None
) -> tuple[IntArray, int]:
    """One layer's plan ``slots [G, W]`` improved for the rank-modulo rule; returns it and the swaps made.

    Copy counts and every GPU's number of filled slots are kept; two copies of one expert never
    share a GPU (the engine would use only one). Stops when no swap from the most loaded GPU lowers
    ``(largest load, sum of squared loads)``, or after ``max_steps`` swaps (default ``4 * G * W``).
    """
    slots = np.array(slots, dtype=np.int64)
    G, W = slots.shape
    E = load.size
    held = np.zeros((E, G), dtype=bool)
    g_of, _ = np.nonzero(slots >= 0)
    held[slots[slots >= 0], g_of] = True
    cur = _contribution(held, np.arange(E), load, table)  # [E, G]
    loads = cur.sum(axis=0)
    flat_gpu = np.repeat(np.arange(G), W)
    limit = 4 * G * W if max_steps is None else max_steps
    steps = 0
    while steps < limit:
        a = int(np.argmax(loads))
        base = (loads.max(), float((loads**2).sum()))
        best = None
        flat = slots.reshape(-1)
        for i in range(W):
            e = int(slots[a, i])
            if e < 0:
                continue
            f = flat
            ok = (flat_gpu != a) & (f >= 0)
            ok &= ~held[e, flat_gpu] & ~held[np.maximum(f, 0), a]
            idx = np.flatnonzero(ok)
            if not idx.size:
                continue
            b, ff = flat_gpu[idx], f[idx]
            rows = np.arange(idx.size)
            he = np.repeat(held[e][None], idx.size, axis=0)
            he[:, a] = False
            he[rows, b] = True
            hf = held[ff].copy()
            hf[rows, b] = False
            hf[:, a] = True
            ne = _contribution(he, np.full(idx.size, e), load, table)
            nf = _contribution(hf, ff, load, table)
            new = loads[None, :] - cur[e][None, :] - cur[ff] + ne + nf
            top, sq = new.max(axis=1), (new**2).sum(axis=1)
            k = int(np.lexsort((sq, top))[0])
            cand = (float(top[k]), float(sq[k]))
            if cand < base and (best is None or cand < best[0]):
                best = (cand, i, int(idx[k]), he[k], hf[k], ne[k], nf[k])
        if best is None:
            break
        _, i, flat_idx, he_k, hf_k, ne_k, nf_k = best
        b, j = divmod(flat_idx, W)
        e, f_ = int(slots[a, i]), int(slots[b, j])
        slots[a, i], slots[b, j] = f_, e
        loads = loads - cur[e] - cur[f_] + ne_k + nf_k
        held[e], held[f_] = he_k, hf_k
        cur[e], cur[f_] = ne_k, nf_k
        steps += 1
    return slots, steps


def rank_modulo_bound(load: FloatArray, G: int, W: int, table: FloatArray) -> float:
    """A lower bound on the largest GPU load of every plan of ``G x W`` slots under the rule.

    ``max(total / G, T*)`` with ``T* = min over copy counts (sum <= G W, 1 <= c_e <= G) of max_e
    load_e * s_e(c_e)``, ``s_e(c)`` the largest share a copy of ``e`` gets with ``c`` copies
    (``table[e, c].max()``): some GPU holds that copy. A second copy of an expert on a GPU serves
    nothing under the rule, so counts above G never help. ``T*`` is the smallest of the candidate
    values ``load_e * s_e(c)`` whose cheapest counts fit in ``G W`` slots (each expert the fewest
    copies whose largest share times its load is at most the candidate).
    """
    load = np.asarray(load, dtype=np.float64)
    total = float(load.sum())
    if total <= 0:
        return 0.0
    largest = table[:, 1:, :].max(axis=2)  # [E, G]: largest share with c = 1..G copies
    # the fewest copies reaching a largest share <= s: largest is not monotone in c (TP), so use
    # the running minimum over c (more copies are allowed when fewer would do)
    best = np.minimum.accumulate(largest, axis=1) * load[:, None]  # [E, G]: least max-copy load with <= c copies
    cands = np.unique(best)
    P = G * W

    def need(T: float) -> float:
        ok = best <= T * (1 + 1e-12)
        if not ok.any(axis=1).all():
            return np.inf
        return float((ok.argmax(axis=1) + 1).sum())

    lo, hi = 0, cands.size - 1
    if need(float(cands[hi])) > P:  # cannot happen with E <= G W, kept for safety
        return max(total / G, float(cands[hi]))
    while lo < hi:
        mid = (lo + hi) // 2
        if need(float(cands[mid])) <= P:
            hi = mid
        else:
            lo = mid + 1
    # every plan has some expert at or above cands[lo - 1] < T*: the bound is the smallest feasible value
    return max(total / G, float(cands[lo]))


def even_counts(load: FloatArray, G: int, W: int) -> IntArray:
    """The water-filled copy counts of the even split (`moeopt.balance.copies.copy_counts`)."""
    return np.asarray(copy_counts(load, G * W, G))
