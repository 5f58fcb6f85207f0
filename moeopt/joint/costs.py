"""Pricing a plan: locality-first routing on a token sample with load shedding
(`SampleCost`), with incremental move gains.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from moeopt.joint.data import JointLayer, subsample
from moeopt.joint.state import Move, SlotState


class Cost(Protocol):
    """Prices a plan (`reset`) and the change a move would make (`delta`)."""

    def reset(self, state: SlotState) -> float: ...

    def delta(self, state: SlotState, move: Move) -> float: ...


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (uint8)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    b = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (8,))  # pragma: no cover - numpy < 2
    return _BYTE_POP[b].sum(axis=-1, dtype=np.uint8)  # pragma: no cover


_BYTE_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


#: GPUs per layer the routing's bit masks hold (one uint64 per expert)
MAX_GPUS = 64


def tokens_of_experts(tok: np.ndarray, start: np.ndarray, experts, mark: np.ndarray) -> np.ndarray:
    """int ``[m]``: the sampled tokens that chose any of ``experts``, ascending. ``tok`` lists the
    tokens expert by expert (``tok[start[e]:start[e + 1]]``: expert ``e``'s, ascending); ``mark``
    is an all-False scratch of one flag per token, left all False."""
    if len(experts) == 1:
        e = int(experts[0])
        return tok[start[e] : start[e + 1]]
    for e in experts:
        mark[tok[start[e] : start[e + 1]]] = True
    tokens = np.flatnonzero(mark)
    mark[tokens] = False
    return tokens


def holder_masks(holds: np.ndarray) -> np.ndarray:
    """uint64 ``[E]``: bit g set when GPU g holds a copy of the expert (``holds [E, G]``)."""
    G = holds.shape[1]
    if G > MAX_GPUS:
        raise ValueError(f"the joint planner's routing handles at most {MAX_GPUS} GPUs per layer")
    bits = np.left_shift(_ONE, np.arange(G, dtype=np.uint64))
    return np.bitwise_or.reduce(np.where(holds, bits[None, :], np.uint64(0)), axis=1)


def route_masks(
    tok_masks: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Locality-first routing on holder masks ``[n, k]``, as the online guard of SPEC 4.3
    routes at small λ.

    An expert with one copy runs there. The others are decided one top-k position after
    another, each on the holder with the most of the token's other experts (decided ones
    where they run, undecided ones on every holder); ties go to the first tied GPU at or
    after the token's ``rot`` (in ``[0, G)``; spreading tied load evenly, as the guard's load
    pressure does). A pair with no holder (empty mask) runs on GPU ``(64 + rot) % G``.

    Counts are kept per token and GPU, updated as positions are decided: as small-int
    arrays ``[G, rows]`` in chunks of rows when ``(k + 1) * G < 256`` (`_route_dense`),
    else bit-sliced over the uint64 masks (`_route_sliced`).

    Returns
    -------
    gpu
        int ``[n, k]``: the GPU of each pair.
    alt
        float ``[n, k]``: the cost of diverting the pair to its next-best holder: 0 when the
        holder is as local and the token already uses it (or the pair was alone on its GPU),
        1 when it is at most one co-located expert less local, inf when it has no other
        holder or is less local than that (a guard diverts it only at a very large λ).
    alt_gpu
        int ``[n, k]``: that holder (-1: none).
    distinct
        int ``[n]``: distinct GPUs each token uses.
    """
    n, k = tok_masks.shape
    if (k + 1) * G >= 256:
        return _route_sliced(tok_masks, rot, G)
    out = (
        np.empty((n, k), dtype=np.int64),
        np.empty((n, k)),
        np.empty((n, k), dtype=np.int64),
        np.empty(n, dtype=np.int64),
    )
    for s in range(0, n, _CHUNK):
        part = slice(s, s + _CHUNK)
        _route_dense(tok_masks[part], rot[part], G, *(a[part] for a in out))
    return out


_CHUNK = 4096  # rows per dense pass: its [k, G, rows] temporaries stay in cache


def _divert_cost(cb: np.ndarray, cab: np.ndarray) -> np.ndarray:
    """``alt`` of a pair from the pairs on its GPU ``cb`` (itself included) and on its
    next-best holder ``cab`` (see `route_masks`)."""
    drop = cb - 1 - cab  # co-located experts lost
    return np.where((drop <= 0) & ((cab > 0) | (cb == 1)), 0.0, np.where(drop <= 1, 1.0, np.inf))


@lru_cache(maxsize=64)
def _dense_tables(k: int, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decoding of `_route_dense`'s best keys ``key`` (0: no holder) by rotation ``r``:
    the GPU ``[r * W + key]`` (``W = k * G + 1``; no holder: where an empty mask runs), the
    alternative GPU (no holder: -1) and the cost ``[S_b * W + key]`` of diverting to it."""
    W = k * G + 1
    key = np.arange(W)
    r = np.arange(G)[:, None]
    gpu = (r + (-key) % G) % G
    cost = np.where(key == 0, np.inf, _divert_cost(np.arange(W)[:, None] // G, (key - 1) // G))
    return np.where(key == 0, (64 + r) % G, gpu).ravel(), np.where(key == 0, -1, gpu).ravel(), cost.ravel()


def _route_dense(
    tok: np.ndarray,
    rot: np.ndarray,
    G: int,
    gpu: np.ndarray,
    alt: np.ndarray,
    alt_gpu: np.ndarray,
    distinct: np.ndarray,
) -> None:
    """`route_masks` of rows ``tok [m, k]`` into the outputs, on uint8 counts.

    ``S [G, m]`` holds ``G *`` each GPU's count; a holder's key is ``S + pri`` with ``pri``
    in ``1..G``, largest for the first GPU at or after ``rot`` (so the keys of a token's
    holders differ, the largest is the routing's choice, and 0 marks non-holders)."""
    m, k = tok.shape
    u8 = np.uint8
    t_gpu, t_alt, t_cost = _dense_tables(k, G)
    W = k * G + 1
    nb = 1 << max(0, (G - 1).bit_length() - 3)  # bytes of a G-bit word
    b = np.ascontiguousarray(tok.astype(f"<u{nb}").T).view(u8).reshape(k, m, nb)
    H = np.empty((k, nb, 8, m), u8)  # holders [k, G, m], 0/1
    np.right_shift(np.ascontiguousarray(b.transpose(0, 2, 1))[:, :, None, :], _BIT_SHIFTS, out=H)
    H &= u8(1)
    H = H.reshape(k, nb * 8, m)[:, :G]
    y = (rot + (G - 1)).astype(u8)[None, :] - np.arange(G, dtype=u8)[:, None]
    pri = np.minimum(y, y - u8(G))  # (rot - g - 1) mod G
    pri += u8(1)
    HG = H * u8(G)
    S = HG.sum(axis=0, dtype=u8)  # undecided pairs count on every holder
    buf = np.empty_like(S)
    run = np.empty((k, G, m), dtype=bool)  # where each pair runs
    runu = run.view(u8)
    best = np.empty((2, k, m), u8)  # best keys: routing, alternative
    empty = (tok == 0).any(axis=0)
    for j in range(k):
        S -= HG[j]
        np.add(S, pri, out=buf)
        buf *= H[j]
        top = np.max(buf, axis=0, out=best[0, j])
        np.equal(buf, top, out=run[j])
        if empty[j]:
            z = np.flatnonzero(top == 0)
            run[j][:, z] = False
            run[j][(64 + rot[z]) % G, z] = True
        np.multiply(runu[j], u8(G), out=buf)
        S += buf
    # alternatives: the best other holder, by the final counts
    key = np.greater(H, runu).view(u8) * (S + pri)
    np.max(key, axis=1, out=best[1])
    np.multiply(runu, S, out=key)
    Sb = key.max(axis=1).astype(np.int64)  # G * pairs on the pair's GPU
    Sb *= W
    Sb += best[1]
    idx = best.astype(np.int64)
    idx += rot * W
    gpu[:] = t_gpu.take(idx[0]).T
    alt_gpu[:] = t_alt.take(idx[1]).T
    alt[:] = t_cost.take(Sb).T
    np.sum(S > 0, axis=0, out=distinct)


_BIT_SHIFTS = np.arange(8, dtype=np.uint8)[None, None, :, None]


@lru_cache(maxsize=64)
def _sliced_tables(k: int, G: int) -> tuple[np.ndarray, np.ndarray]:
    """The GPU ``[p * G + r]`` of rotated bit ``p`` at rotation ``r`` (``p = 64``: -1), and the
    cost ``[has * (k + 1)**2 + cb * (k + 1) + cab]`` of `_divert_cost` (no ``has``: inf)."""
    p = np.arange(65)[:, None]
    gpu = np.where(p < 64, (p + np.arange(G)[None, :]) % G, -1)
    cost = _divert_cost(np.arange(k + 1)[:, None], np.arange(k + 1)[None, :])
    return gpu.ravel(), np.concatenate([np.full(cost.size, np.inf), cost.ravel()])


def _route_sliced(
    tok_masks: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`route_masks` on bit-sliced counts: plane ``i`` holds bit ``i`` of each GPU's
    count (at most ``k``). Masks are rotated to each token's frame (bit ``p``: GPU
    ``(p + rot) % G``), so the first tied GPU at or after ``rot`` is the lowest tied bit."""
    m, k = tok_masks.shape
    t_gpu, t_cost = _sliced_tables(k, G)
    r = rot.astype(np.uint64)[:, None]
    full = np.uint64((1 << G) - 1) if G < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    tok = (np.right_shift(tok_masks, r) | np.left_shift(np.left_shift(tok_masks, np.uint64(G - 1) - r), _ONE)) & full
    tokT = np.ascontiguousarray(tok.T)
    planes = [np.zeros(m, np.uint64) for _ in range(max(1, math.ceil(math.log2(k + 1))))]
    for j in range(k):
        _add_bits(planes, tokT[j])  # undecided pairs count on every holder
    empty = (tokT == _ZERO).any(axis=1)
    run = np.empty((k, m), np.uint64)  # the bit each pair runs on
    x, z = np.empty(m, np.uint64), np.empty(m, np.uint64)
    for j in range(k):
        _sub_bits(planes, tokT[j])
        best = tokT[j].copy()
        _most(best, planes, x, z)
        np.negative(best, out=x)
        np.bitwise_and(best, x, out=run[j])  # lowest bit: the first tied GPU from rot
        if empty[j]:
            run[j][tokT[j] == _ZERO] = np.uint64(1 << (64 % G))
        _add_bits(planes, run[j])
    # alternatives: the best other holder, by the final counts
    runT = np.ascontiguousarray(run.T)
    best = tok & ~runT
    has = best != _ZERO
    P = [p[:, None] for p in planes]
    _most(best, P, np.empty_like(best), np.empty_like(best))
    ab = best & np.negative(best)
    K = k + 1
    idx = has.astype(np.uint16) * np.uint16(K * K)
    idx += _count_bits(P, runT).astype(np.uint16) * np.uint16(K)
    idx += _count_bits(P, ab)
    rg = rot.astype(np.uint16)[:, None]
    gpu = t_gpu.take(_popcount(runT - _ONE).astype(np.uint16) * np.uint16(G) + rg)
    alt_gpu = t_gpu.take(_popcount(ab - _ONE).astype(np.uint16) * np.uint16(G) + rg)
    return gpu, t_cost.take(idx), alt_gpu, _popcount(np.bitwise_or.reduce(run, axis=0)).astype(np.int64)


def _add_bits(planes: list[np.ndarray], bits: np.ndarray) -> None:
    """Add 1 to the bit-sliced counts of the GPUs in ``bits`` (in place; no overflow)."""
    for p in planes[:-1]:
        carry = p & bits
        p ^= bits
        bits = carry
    planes[-1] ^= bits


def _sub_bits(planes: list[np.ndarray], bits: np.ndarray) -> None:
    """Subtract 1 from the bit-sliced counts of the GPUs in ``bits`` (in place; all >= 1)."""
    for p in planes[:-1]:
        p ^= bits
        bits = p & bits
    planes[-1] ^= bits


def _most(best: np.ndarray, planes: list[np.ndarray], x: np.ndarray, z: np.ndarray) -> None:
    """Keep the bits of ``best`` with the largest count (in place; ``x``, ``z``: scratch)."""
    for p in reversed(planes):
        np.bitwise_and(best, p, out=x)
        np.equal(x, _ZERO, out=z, casting="unsafe")
        np.negative(z, out=z)  # all ones where no bit of best is in this plane
        z |= p
        best &= z


def _count_bits(planes: list[np.ndarray], bit: np.ndarray) -> np.ndarray:
    """uint8 count of the GPU of each single ``bit``."""
    c = np.zeros(bit.shape, np.uint8)
    for i, p in enumerate(planes):
        c += ((p & bit) != _ZERO).view(np.uint8) << np.uint8(i)
    return c


def route_locality_first(
    topk: np.ndarray, holds: np.ndarray, rot: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`route_masks` on tokens ``topk [n, k]`` and holders ``holds [E, G]`` (ties from
    ``rot``, default: the lowest GPU id); returns GPUs, alternative costs, distinct GPUs."""
    G = holds.shape[1]
    rot = np.zeros(len(topk), dtype=np.int64) if rot is None else rot
    gpu, alt, _, distinct = route_masks(holder_masks(holds)[topk], rot, G)
    return gpu, alt, distinct


def _shed_cost(
    load: np.ndarray, free: np.ndarray, paid: np.ndarray, eps: np.ndarray, penalty: float, caps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per workload (rows): pairs moved at cost 1 plus ``penalty`` per pair left over a limit.

    ``load`` ``[Wk, G]``; ``free, paid`` ``[Wk, G, G]``: pairs on GPU g whose cheapest other
    holder is g' at no cost / at one GPU; ``eps`` ``[Wk]``. Each GPU over its limit sheds
    free pairs, then paid ones; the shed pairs land on their other holders, and whatever
    then exceeds a limit (left on the source, or pushed over on a receiver) costs
    ``penalty`` per pair. Also returns ``penalty`` times the pairs then over the looser
    ``caps`` ``[Wk]`` (the family cap; ``inf``: none).
    """
    G = load.shape[1]
    lim = (1.0 + eps[:, None]) * load.sum(axis=1, keepdims=True) / G
    over = np.maximum(load - lim, 0.0)
    f_out, p_out = free.sum(axis=2), paid.sum(axis=2)
    m0 = np.minimum(over, f_out)
    m1 = np.minimum(over - m0, p_out)
    with np.errstate(invalid="ignore", divide="ignore"):
        r0 = np.where(f_out > 0, m0 / f_out, 0.0)
        r1 = np.where(p_out > 0, m1 / p_out, 0.0)
    received = np.einsum("wg,wgh->wh", r0, free) + np.einsum("wg,wgh->wh", r1, paid)
    after = load - m0 - m1 + received
    cost = m1.sum(axis=1) + penalty * np.maximum(after - lim, 0.0).sum(axis=1)
    capped = np.isfinite(caps)
    cap_lim = (1.0 + np.where(capped, caps, 0.0)[:, None]) * load.sum(axis=1, keepdims=True) / G
    over_cap = np.where(capped[:, None], np.maximum(after - cap_lim, 0.0), 0.0)
    return cost, penalty * over_cap.sum(axis=1)


class SampleCost:
    """The joint objective on a token sample, with incremental move gains.

    Tokens are routed locality first (`route_masks`, ties spread by a fixed per-token
    rotation); per workload (calibration and each family) a GPU over its limit sheds pairs
    to their next-best holders, free ones first (`_shed_cost`). `delta` routes
    again only the tokens that chose an expert whose holders the move changes, and updates
    the per-family aggregates by their difference, so it equals the change of `reset`'s
    value exactly.
    """

    def __init__(
        self, layer: JointLayer, coarse_tokens: int | None = 2048, seed: int = 0, *, family_cap: bool = True
    ) -> None:
        self.layer = layer
        n, k = layer.topk.shape
        E = layer.experts
        #: a cheaper cost on a sub-sample that ranks many moves before they are priced here
        self.coarse = (
            SampleCost(subsample(layer, coarse_tokens, np.random.default_rng(seed)), None, family_cap=family_cap)
            if coarse_tokens is not None and n >= 3 * coarse_tokens
            else None
        )
        #: each token's tie rotation (fixed: a plan's value does not depend on history)
        self.rot = np.asarray(np.random.default_rng([seed, 1]).integers(0, layer.gpus, size=n))
        self._bits = np.left_shift(_ONE, np.arange(layer.gpus, dtype=np.uint64))
        order = np.argsort(layer.topk.ravel(), kind="stable")
        self._tok = (order // k).astype(np.int64)
        self._start = np.searchsorted(layer.topk.ravel()[order], np.arange(E + 1))
        self._mark = np.zeros(layer.tokens, dtype=bool)  # scratch of `tokens_of_experts`
        self._eps = layer.limits
        self._wts = layer.workload_weights
        #: the family cap's weights (zero without one, or with ``family_cap=False``: the
        #: search's first phase prices the objective without it)
        self._capw = layer.cap_weights if family_cap else np.zeros(1 + layer.families)
        self._caps = layer.cap_limits
        ntok = layer.family_tokens
        self._ntok = np.concatenate([[max(float(ntok.sum()), 1.0)], np.maximum(ntok, 1.0)])
        self.value = math.inf
        #: the family cap's part of ``value`` (0 without a cap), set by `reset`
        self.cap_term = 0.0

    def tokens_of(self, experts: tuple[int, ...]) -> np.ndarray:
        """Sample tokens that chose any of ``experts`` (ascending)."""
        return tokens_of_experts(self._tok, self._start, experts, self._mark)

    def _aggregate(self, rows, gpu, alt, alt_gpu, distinct, cand=None, C=None):
        """Per family: load ``[F, G]``, free and paid movable load by source and target GPU
        ``[F, G, G]``, distinct GPUs summed over tokens ``[F]``; with candidate ids ``cand``
        of the rows, the same per candidate (a leading axis of ``C``)."""
        F, G = self.layer.families, self.layer.gpus
        fam = self.layer.family[rows]
        if cand is not None:
            fam = cand * F + fam
            F = F * C
        w = self.layer.weights[rows].ravel()
        key = (fam[:, None] * G + gpu).ravel()
        load = np.bincount(key, weights=w, minlength=F * G).reshape(F, G)
        a = alt.ravel()
        movable = np.isfinite(a)  # a diversion costs 0 (free), 1 (paid) or inf (none)
        key2 = (key[movable] * G + alt_gpu.ravel()[movable]) * 2 + (a[movable] == 1.0)
        both = np.bincount(key2, weights=w[movable], minlength=F * G * G * 2).reshape(F, G, G, 2)
        free, paid = both[..., 0], both[..., 1]
        dsum = np.bincount(fam, weights=distinct, minlength=F).astype(np.float64)
        if cand is None:
            return load, free, paid, dsum
        Fo = self.layer.families
        return load.reshape(C, Fo, G), free.reshape(C, Fo, G, G), paid.reshape(C, Fo, G, G), dsum.reshape(C, Fo)

    def _value(self, load, free, paid, dsum) -> tuple[float, np.ndarray, float]:
        """J from per-family aggregates; also the per-workload values ``[1 + F]`` and the
        family cap's part of J."""
        wl = np.concatenate([load.sum(axis=0, keepdims=True), load])
        wf = np.concatenate([free.sum(axis=0, keepdims=True), free])
        wp = np.concatenate([paid.sum(axis=0, keepdims=True), paid])
        ds = np.concatenate([[dsum.sum()], dsum])
        shed, cap = _shed_cost(wl, wf, wp, self._eps, self.layer.penalty, self._caps)
        comm = (ds + shed) / self._ntok
        cap_term = float(self._capw @ (cap / self._ntok))
        return float(self._wts @ comm) + cap_term, comm, cap_term

    def _values(self, load, free, paid, dsum) -> np.ndarray:
        """J of a batch of aggregates (leading axis C): ``[C]``."""
        C, F, G = load.shape
        wl = np.concatenate([load.sum(axis=1, keepdims=True), load], axis=1).reshape(-1, G)
        wf = np.concatenate([free.sum(axis=1, keepdims=True), free], axis=1).reshape(-1, G, G)
        wp = np.concatenate([paid.sum(axis=1, keepdims=True), paid], axis=1).reshape(-1, G, G)
        ds = np.concatenate([dsum.sum(axis=1, keepdims=True), dsum], axis=1)
        shed, cap = _shed_cost(wl, wf, wp, np.tile(self._eps, C), self.layer.penalty, np.tile(self._caps, C))
        shed, cap = shed.reshape(C, F + 1), cap.reshape(C, F + 1)
        return ((ds + shed) / self._ntok[None, :]) @ self._wts + (cap / self._ntok[None, :]) @ self._capw

    def _route_rows(self, masks: np.ndarray, rows: np.ndarray):
        return route_masks(masks[self.layer.topk[rows]], self.rot[rows], self.layer.gpus)

    def reset(self, state: SlotState) -> float:
        """Route every sampled token on ``state``; return J."""
        layer = self.layer
        self.masks = holder_masks(state.holds)
        rows = np.arange(layer.tokens)
        self.gpu, self.alt, self.alt_gpu, self.distinct = self._route_rows(self.masks, rows)
        self.agg = self._aggregate(rows, self.gpu, self.alt, self.alt_gpu, self.distinct)
        self.value, self.per_workload, self.cap_term = self._value(*self.agg)
        if self.coarse is not None:
            self.coarse.reset(state)
        return self.value

    def price(self, state: SlotState) -> float:
        """J of ``state`` without changing this cost (what `delta` adds to J)."""
        rows = np.arange(self.layer.tokens)
        return self._value(*self._aggregate(rows, *self._route_rows(holder_masks(state.holds), rows)))[0]

    def prescreen(self, state: SlotState, moves: list[Move], chunk: int = 64) -> list[Move]:
        """``moves`` ordered by their gain on the coarse sub-sample (as given without one)."""
        if self.coarse is None or len(moves) <= 1:
            return moves
        gains = np.concatenate(
            [self.coarse.delta_many(state, moves[i : i + chunk]) for i in range(0, len(moves), chunk)]
        )
        return [moves[int(t)] for t in np.argsort(gains, kind="stable")]

    def delta(self, state: SlotState, move: Move) -> float:
        """J after ``move`` minus J now (``state`` is the plan of the last `reset`); only
        the tokens that chose an expert whose holders change are routed again."""
        return float(self.delta_many(state, [move])[0])

    def _masks_after(self, state: SlotState, move: Move) -> dict[int, np.uint64]:
        """The holder masks a move changes, ``{expert: new mask}``."""
        masks, bits = self.masks, self._bits
        out: dict[int, np.uint64] = {}
        if move.kind == "swap":
            e, f = int(state.slots[move.a, move.i]), int(state.slots[move.b, move.j])
            if e >= 0:
                out[e] = (masks[e] & ~bits[move.a]) | bits[move.b]
            if f >= 0:
                out[f] = (masks[f] & ~bits[move.b]) | bits[move.a]
        else:
            e, f = int(state.slots[move.a, move.i]), move.expert
            if e >= 0:
                out[e] = masks[e] & ~bits[move.a]
            out[f] = masks[f] | bits[move.a]
        return out

    def delta_many(self, state: SlotState, moves: list[Move]) -> np.ndarray:
        """`delta` of several moves at once: their tokens are routed in one call."""
        C = len(moves)
        if not C:
            return np.zeros(0)
        topk = self.layer.topk
        rows_l, cand_l, tok_l = [], [], []
        for ci, move in enumerate(moves):
            changed = self._masks_after(state, move)
            rows = self.tokens_of(tuple(changed))
            if not len(rows):
                continue
            ids = topk[rows]
            tok = self.masks[ids]
            for x, mx in changed.items():
                tok[ids == x] = mx
            rows_l.append(rows)
            cand_l.append(np.full(len(rows), ci))
            tok_l.append(tok)
        if not rows_l:
            return np.zeros(C)
        rows, cand, tok = np.concatenate(rows_l), np.concatenate(cand_l), np.concatenate(tok_l)
        new = self._aggregate(rows, *route_masks(tok, self.rot[rows], self.layer.gpus), cand, C)
        old = self._aggregate(rows, self.gpu[rows], self.alt[rows], self.alt_gpu[rows], self.distinct[rows], cand, C)
        agg = tuple(a[None] - o + w for a, o, w in zip(self.agg, old, new, strict=True))
        return self._values(*agg) - self.value

    # ------------------------------------------------------------------ move screening
    def screen(self, state: SlotState, rng: np.random.Generator, count: int) -> list[Move]:
        """About ``count`` promising moves, by first-order gains of the current routing.

        Communication: for every (token, expert) pair served by the copy in slot ``p`` and
        every GPU ``b``, the token's change in distinct GPUs if the pair ran on ``b`` (or on
        its expert's cheapest other holder, when that is cheaper); summed per slot this
        prices moving a copy (``[P, G]``), and pairs that could join a GPU their token
        already uses price adding a copy (``[E, G]``). Load, per workload: a moved or removed
        copy's pairs go to ``b`` or to their cheapest other holder, an added copy draws the
        pairs that join it; the new loads are priced with the current shed costs. A swap is
        two moves, a replacement a removal and an addition. The best swaps and replacements
        by the weighted sum, plus a few random swaps, are returned (best first).
        """
        layer = self.layer
        N, k = layer.topk.shape
        G, W = state.slots.shape
        P, E, F = G * W, layer.experts, layer.families
        gpu, topk = self.gpu, layer.topk
        NK = N * k
        used = np.zeros((N, G), dtype=bool)
        used[np.repeat(np.arange(N), k), gpu.ravel()] = True
        alone = (gpu[:, :, None] == gpu[:, None, :]).sum(axis=2) == 1  # [N, k]
        slot_of = np.full((E, G), -1, dtype=np.int64)
        g_idx, w_idx = np.nonzero(state.slots >= 0)
        slot_of[state.slots[g_idx, w_idx], g_idx] = g_idx * W + w_idx
        p = slot_of[topk, gpu].ravel()  # slot serving each pair
        fam = np.repeat(layer.family, k)
        # cost of each pair on each GPU; its cheapest other holder (ties to the preferred GPU)
        c = (~used)[:, None, :].astype(np.float64) - alone[:, :, None]  # [N, k, G]
        other = np.where(state.holds[topk], c, np.inf)
        other[np.arange(N)[:, None], np.arange(k)[None, :], gpu] = np.inf
        other = other.reshape(NK, G)
        alt_gpu = np.argmin(other, axis=1)
        alt_cost = other[np.arange(NK), alt_gpu]
        has_alt = np.isfinite(alt_cost)
        c = np.minimum(c.reshape(NK, G), alt_cost[:, None])
        to_b = (c <= alt_cost[:, None]).astype(np.float64)  # the pair would run on b

        def by(rows: np.ndarray, nrows: int, vals: np.ndarray | None = None) -> sp.csr_matrix:
            v = np.ones(NK) if vals is None else vals
            return sp.csr_matrix((v, (rows, np.arange(NK))), shape=(nrows, NK))

        sel = by(p, P)
        move = sel @ c  # [P, G] communication of moving slot p's copy to GPU b
        join = -(alone[:, :, None] & used[:, None, :]).reshape(NK, G).astype(np.float64)
        add = by(topk.ravel(), E) @ join  # [E, G]: adding a copy of e on g
        add_slot = sel @ join  # [P, G]: the part of it from pairs on slot p
        remove = np.where(has_alt, alt_cost, layer.penalty * G)
        remove = np.bincount(p, weights=remove, minlength=P)  # [P]
        # per workload (calibration, then families): pairs served, moving to b, redirected
        pw = layer.weights.ravel()
        selw = by(fam * P + p, F * P, pw)
        served = np.asarray(selw.sum(axis=1)).reshape(F, P)
        moved_to = (selw @ to_b).reshape(F, P, G)
        redirect = (
            (selw @ sp.csr_matrix((has_alt.astype(np.float64), (np.arange(NK), alt_gpu)), shape=(NK, G)))
            .toarray()
            .reshape(F, P, G)
        )
        joins = (by(fam * E + topk.ravel(), F * E, pw) @ -join).reshape(F, E, G)  # load of e joining g
        agg = (self.agg[0], self.agg[1].sum(axis=2), self.agg[2].sum(axis=2))
        load, free, paid = (np.concatenate([a.sum(axis=0, keepdims=True), a]) for a in agg)
        served, moved_to, redirect, joins = (
            np.concatenate([a.sum(axis=0, keepdims=True), a]) for a in (served, moved_to, redirect, joins)
        )
        scale = self._wts / self._ntok  # weight of one GPU (or pair) per workload
        live = [int(w) for w in np.nonzero(scale > 0)[0]]
        lim = (1.0 + self._eps) * load.sum(axis=1) / G  # [Wk]
        pen = layer.penalty

        def shed(x: np.ndarray, w: int) -> np.ndarray:  # x [..., G] loads of workload w
            over = np.maximum(x - lim[w], 0.0)
            m0 = np.minimum(over, free[w])
            m1 = np.minimum(over - m0, paid[w])
            return (m1 + pen * (over - m0 - m1)).sum(axis=-1)

        flat = state.slots.reshape(-1)
        gpu_of = np.repeat(np.arange(G), W)
        e_of = np.maximum(flat, 0)
        filled = flat >= 0
        multi = filled & (state.c[e_of] >= 2)
        onehot = np.eye(G)[gpu_of]  # [P, G]
        # swaps p <-> q: p's copy to GPU b = gpu(q), q's copy to GPU a = gpu(p)
        comm = move[:, gpu_of] + move[:, gpu_of].T
        extra = np.where(multi[:, None], add[e_of][:, gpu_of] - add_slot[:, gpu_of], 0.0)
        swap = scale[0] * 0 + (comm + extra + extra.T) * self._wts[0] / self._ntok[0]
        for w in live:
            # leaving pairs of p: to b (moved_to) or to their other holder (redirect, scaled)
            srv = np.maximum(served[w], 1e-12)
            mv = moved_to[w][:, gpu_of]  # [P, Q]: pairs of p that run on q's GPU
            keep = (served[w][:, None] - mv) / srv[:, None]  # share redirected elsewhere
            delta = (-served[w][:, None] * onehot)[:, None, :] + (mv[:, :, None] * onehot[None, :, :])
            delta = delta + keep[:, :, None] * redirect[w][:, None, :]
            # ... and the same for q's copy moving to p's GPU (transpose)
            delta = delta + np.transpose(delta, (1, 0, 2))
            base = shed(load[w], w)
            swap = swap + scale[w] * (shed(load[w][None, None, :] + delta, w) - base)
            if w > 0:
                continue
        holds_pq = state.holds[e_of][:, gpu_of] & filled[:, None]  # p's expert already on q's GPU
        bad = (gpu_of[:, None] == gpu_of[None, :]) | (flat[:, None] == flat[None, :]) | holds_pq | holds_pq.T
        bad |= ~filled[:, None] & ~filled[None, :]
        swap = np.where(bad, np.inf, swap)
        iu = np.triu_indices(P, 1)
        sv = swap[iu]
        n_swap = max(2 * count // 3, 1)
        top = np.argpartition(sv, min(n_swap, len(sv) - 1))[:n_swap] if len(sv) else np.zeros(0, int)
        moves: list[tuple[float, Move]] = []
        for t in top:
            if np.isfinite(sv[t]):
                pp, qq = int(iu[0][t]), int(iu[1][t])
                moves.append((float(sv[t]), Move("swap", pp // W, pp % W, qq // W, qq % W)))
        # replacements: slot p (a spare copy or an empty slot) := f
        spare = np.nonzero(multi | ~filled)[0]
        if len(spare):
            ga = gpu_of[spare]
            rep = (remove[spare][:, None] + add[:, ga].T) * self._wts[0] / self._ntok[0]  # [s, E]
            for w in live:
                delta = np.zeros((len(spare), E, G))
                delta[np.arange(len(spare)), :, ga] += joins[w][:, ga].T - served[w][spare][:, None]
                delta += redirect[w][spare][:, None, :]
                rep = rep + scale[w] * (shed(load[w][None, None, :] + delta, w) - shed(load[w], w))
            rep = np.where(state.holds[:, ga].T, np.inf, rep)
            n_rep = max(count // 3, 1)
            rv = rep.ravel()
            top = np.argpartition(rv, min(n_rep, len(rv) - 1))[:n_rep]
            for t in top:
                if np.isfinite(rv[t]):
                    i, f = divmod(int(t), E)
                    pp = int(spare[i])
                    moves.append((float(rv[t]), Move("replace", pp // W, pp % W, expert=f)))
        for _ in range(max(count // 12, 1)):
            x, y = rng.choice(G, size=2, replace=False) if G > 1 else (0, 0)
            moves.append((np.inf, Move("swap", int(x), int(rng.integers(W)), int(y), int(rng.integers(W)))))
        moves.sort(key=lambda t: t[0])
        moves = [(v, m) for v, m in moves if state.valid(m)]
        self.last_proxy = np.array([v for v, _ in moves])
        return [m for _, m in moves]

    def loads(self) -> np.ndarray:
        """float ``[1 + F, G]``: locality-first loads of the calibration and family workloads."""
        load = self.agg[0]
        return np.concatenate([load.sum(axis=0, keepdims=True), load])
