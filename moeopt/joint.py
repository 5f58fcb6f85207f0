"""Joint planner core: slot contents chosen for communication and balance together (SPEC 11).

One MoE layer at a time. A plan fills the ``G x W`` physical slots with expert ids (every
expert at least one copy, no two copies of one expert on one GPU, ``-1`` for an empty slot).
The *ideal dispatch* of a plan on a token workload sends every (token, expert) pair to one
GPU holding the expert, as a fractional flow over the tokens, so that

    minimize   mean over tokens of the distinct GPUs a token uses (hypergraph connectivity)
    subject to every GPU's load <= (1 + eps) * mean load   (soft: ``penalty`` per unit over)

The joint objective of a plan is that value on the calibration workload and, robustly, on
each family's own workload (single-family workloads are the shift a deployment sees):

    J = (1 - robust) * D_cal(eps) + robust * sum_f pi_f * D_f(family_eps)

Two cost objects price a plan and the moves of the local search:

* :class:`SampleCost` (the search's engine): on a token sample, each token's experts go
  *locality first* (a GPU the token already uses, else the holder shared with most of its
  pending experts, ties to the lighter GPU: what SGLang-style online guards do), then each
  GPU over the limit sheds load, cheapest pairs first (pairs whose other holder the token
  already uses cost nothing, the others one GPU each); load that no holder can take costs
  ``penalty`` per pair. A move changes the holders of at most two experts, so only the
  tokens that chose them are routed again (incremental gains).
* :class:`ExactCost`: the ideal dispatch as a linear program over each token pattern's
  routings (every assignment of its experts to holders), for small layers; the exact MILP
  over slot contents (:func:`solve_exact`) uses the same model with binary holders, and
  :func:`brute_force` enumerates every plan of tiny layers to check both.

:func:`local_search` is one engine over slot contents with three operators: swap two slots
(a swap with an empty slot moves a copy), replace a copy (an expert with spare copies gives a
slot to another expert), and add a copy into an empty slot. Each round scores a screened
neighbourhood (the whole neighbourhood on small layers) and applies the best improving move;
when none improves, a kick of random swaps restarts the descent from the best plan (iterated
local search). Bounded by rounds and an optional deadline; a seed fixes the result.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp

#: Improvements smaller than this (in GPUs per token) are noise.
TOL = 1e-9


# ============================================================================ problem data
@dataclass(frozen=True, eq=False)
class JointLayer:
    """One layer's joint problem on a token sample.

    Attributes
    ----------
    topk
        int ``[N, k]``: the sampled tokens' experts.
    family
        int ``[N]``: family id of each token, in ``[0, families)``.
    families
        F.
    experts, gpus, width
        E, G and W (physical slots per GPU).
    eps
        Load limit on the calibration workload: every GPU <= ``(1 + eps)`` times the mean.
    family_eps
        The same limit on each family's own workload (None: ``eps``).
    robust
        Weight of the family workloads in the objective, in [0, 1] (0: calibration only).
    penalty
        Cost, in GPUs per token, of one (token, expert) pair over a load limit that no
        holder can take (the soft constraint's price).
    """

    topk: np.ndarray
    family: np.ndarray
    families: int
    experts: int
    gpus: int
    width: int
    eps: float = 0.05
    family_eps: float | None = None
    robust: float = 0.5
    penalty: float = 4.0

    def __post_init__(self) -> None:
        topk = np.asarray(self.topk, dtype=np.int64)
        if topk.ndim != 2:
            raise ValueError(f"topk: expected [tokens, k], got shape {topk.shape}")
        object.__setattr__(self, "topk", topk)
        object.__setattr__(self, "family", np.asarray(self.family, dtype=np.int64).reshape(-1))
        if len(self.family) != len(topk):
            raise ValueError("family: one id per token expected")
        if topk.size and (topk.min() < 0 or topk.max() >= self.experts):
            raise ValueError(f"topk: expert ids must lie in [0, {self.experts - 1}]")
        if self.gpus * self.width < self.experts:
            raise ValueError(f"{self.gpus} GPUs x {self.width} slots cannot hold {self.experts} experts")
        if not self.eps >= 0 or (self.family_eps is not None and not self.family_eps >= 0):
            raise ValueError("eps and family_eps must be >= 0")
        if not 0.0 <= self.robust <= 1.0:
            raise ValueError(f"robust must lie in [0, 1], got {self.robust}")
        if not self.penalty >= 0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}")

    @property
    def tokens(self) -> int:
        return int(self.topk.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[1])

    @property
    def family_tokens(self) -> np.ndarray:
        """float ``[F]``: sampled tokens of each family."""
        return np.bincount(self.family, minlength=self.families).astype(np.float64)

    @property
    def family_weights(self) -> np.ndarray:
        """float ``[F]``: ``robust * pi_f`` (zero for a family without tokens, and when F = 1)."""
        n = self.family_tokens
        if self.families <= 1 or self.robust == 0 or n.sum() == 0:
            return np.zeros(self.families)
        return self.robust * n / n.sum()

    @property
    def limits(self) -> np.ndarray:
        """float ``[1 + F]``: ``eps`` of the calibration workload, then of each family."""
        fe = self.eps if self.family_eps is None else self.family_eps
        return np.concatenate([[self.eps], np.full(self.families, fe)])

    @property
    def workload_weights(self) -> np.ndarray:
        """float ``[1 + F]``: weight of the calibration workload and of each family's."""
        w = self.family_weights
        return np.concatenate([[1.0 - w.sum()], w])

    @property
    def expert_load(self) -> np.ndarray:
        """float ``[E]``: sampled (token, expert) pairs of each expert."""
        return np.bincount(self.topk.ravel(), minlength=self.experts).astype(np.float64)

    def coactivation(self) -> np.ndarray:
        """float ``[E, E]``: tokens choosing both e and e' (zero diagonal)."""
        n, k = self.topk.shape
        x = sp.csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), self.topk.ravel())),
                          shape=(n, self.experts))
        a = (x.T @ x).toarray()
        np.fill_diagonal(a, 0.0)
        return a


def layer_from_trace(
    topk: np.ndarray,
    family: np.ndarray,
    families: int,
    *,
    experts: int,
    gpus: int,
    width: int,
    sample_tokens: int | None = None,
    rng: np.random.Generator | None = None,
    **kwargs,
) -> JointLayer:
    """A :class:`JointLayer` on (a uniform sample of) one layer's tokens ``topk [N, k]``."""
    n = len(topk)
    idx = np.arange(n)
    if sample_tokens is not None and n > sample_tokens:
        rng = rng or np.random.default_rng(0)
        idx = np.sort(rng.choice(n, size=sample_tokens, replace=False))
    return JointLayer(topk=np.asarray(topk)[idx], family=np.asarray(family)[idx], families=families,
                      experts=experts, gpus=gpus, width=width, **kwargs)


# ============================================================================ plan state
class SlotState:
    """Slot contents ``[G, W]`` with the holder matrix and copy counts kept in step."""

    def __init__(self, slots: np.ndarray, experts: int) -> None:
        self.slots = np.asarray(slots, dtype=np.int64).copy()
        self.experts = experts
        G = self.slots.shape[0]
        self.holds = np.zeros((experts, G), dtype=bool)
        self.copies = np.zeros(experts, dtype=np.int64)
        for g in range(G):
            ids = self.slots[g][self.slots[g] >= 0]
            if len(np.unique(ids)) != len(ids):
                raise ValueError(f"GPU {g} holds two copies of one expert")
            self.holds[ids, g] = True
            self.copies[ids] += 1
        if (self.copies == 0).any():
            raise ValueError(f"expert {int(np.argmin(self.copies))} has no copy")

    @property
    def gpus(self) -> int:
        return int(self.slots.shape[0])

    @property
    def width(self) -> int:
        return int(self.slots.shape[1])

    def copy(self) -> SlotState:
        out = SlotState.__new__(SlotState)
        out.slots, out.experts = self.slots.copy(), self.experts
        out.holds, out.copies = self.holds.copy(), self.copies.copy()
        return out

    def _set(self, g: int, w: int, e: int) -> None:
        old = int(self.slots[g, w])
        if old >= 0:
            self.holds[old, g] = False
            self.copies[old] -= 1
        if e >= 0:
            self.holds[e, g] = True
            self.copies[e] += 1
        self.slots[g, w] = e

    def apply(self, move: Move) -> None:
        """Apply a valid move in place."""
        if move.kind == "swap":
            e, f = int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j])
            self._set(move.a, move.i, -1)
            self._set(move.b, move.j, -1)
            self._set(move.a, move.i, f)
            self._set(move.b, move.j, e)
        else:
            self._set(move.a, move.i, move.expert)

    def valid(self, move: Move) -> bool:
        """Whether a move keeps every expert covered and no expert twice on a GPU."""
        if move.kind == "swap":
            if move.a == move.b:
                return False
            e, f = int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j])
            if e == f:
                return False
            return (e < 0 or not self.holds[e, move.b]) and (f < 0 or not self.holds[f, move.a])
        e, f = int(self.slots[move.a, move.i]), move.expert
        if f == e or (f >= 0 and self.holds[f, move.a]):
            return False
        return e < 0 or self.copies[e] >= 2

    def changed_experts(self, move: Move) -> tuple[int, ...]:
        """The experts whose holder sets a move changes."""
        if move.kind == "swap":
            ids = (int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j]))
        else:
            ids = (int(self.slots[move.a, move.i]), move.expert)
        return tuple(e for e in ids if e >= 0)


@dataclass(frozen=True)
class Move:
    """``swap``: slot (a, i) <-> slot (b, j); ``replace``: slot (a, i) := ``expert``."""

    kind: str
    a: int
    i: int
    b: int = -1
    j: int = -1
    expert: int = -1


# ============================================================================ costs
class Cost(Protocol):
    """Prices a plan (:meth:`reset`) and the change a move would make (:meth:`delta`)."""

    def reset(self, state: SlotState) -> float: ...

    def delta(self, state: SlotState, move: Move) -> float: ...


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.int64)
    b = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (8,))  # pragma: no cover - numpy < 2
    return _BYTE_POP[b].sum(axis=-1).astype(np.int64)  # pragma: no cover


_BYTE_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
_ONE = np.uint64(1)


def _lowest_bit(x: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) uint64."""
    return _popcount((x & (~x + _ONE)) - _ONE)


class Ranking:
    """GPUs in tie-break order: bit ``r`` of a holder mask is the GPU of rank ``r`` (rank 0
    preferred), so the lowest set bit of a mask is its preferred GPU."""

    def __init__(self, preference: np.ndarray) -> None:
        G = len(preference)
        if G > 64:
            raise ValueError("the joint planner's routing handles at most 64 GPUs per layer")
        self.gpu_of = np.argsort(-np.asarray(preference, dtype=np.float64), kind="stable")  # rank -> GPU
        self.rank = np.empty(G, dtype=np.int64)
        self.rank[self.gpu_of] = np.arange(G)
        self.bits = np.left_shift(_ONE, self.rank.astype(np.uint64))  # GPU -> bit

    def masks(self, holds: np.ndarray) -> np.ndarray:
        """uint64 ``[E]``: holder mask of each expert."""
        return np.bitwise_or.reduce(np.where(holds, self.bits[None, :], np.uint64(0)), axis=1)

    def mask_of(self, gpus: np.ndarray) -> np.uint64:
        return np.bitwise_or.reduce(self.bits[np.asarray(gpus, dtype=np.int64)], initial=np.uint64(0))


def route_masks(tok_masks: np.ndarray, open_mask: np.uint64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Locality-first routing on holder masks ``[n, k]`` (bits = GPU ranks).

    An expert with one copy runs there. The others are decided one top-k position after
    another: a GPU the token already uses, else a holder of one of its still undecided
    experts, else any holder; the lowest rank (preferred GPU) among those.

    Returns
    -------
    bit
        int ``[n, k]``: the rank of the GPU of each pair.
    alt
        float ``[n, k]``: the cost (0 or 1 distinct GPU for the token) of sending the pair
        to its cheapest other holder within ``open_mask``; ``inf`` when it has none.
    distinct
        int ``[n]``: distinct GPUs each token uses.
    """
    n, k = tok_masks.shape
    zero = np.uint64(0)
    fixed = _popcount(tok_masks) == 1
    bit = np.where(fixed, _lowest_bit(tok_masks), -1)
    used = np.bitwise_or.reduce(np.where(fixed, tok_masks, zero), axis=1)
    pending = ~fixed
    if pending.any():
        for j in range(k):
            r = np.nonzero(pending[:, j])[0]
            if not len(r):
                continue
            pending[r, j] = False
            cand = tok_masks[r, j]
            inter = cand & used[r]
            others = np.bitwise_or.reduce(np.where(pending[r], tok_masks[r], zero), axis=1) & cand
            choice = np.where(inter != zero, inter, np.where(others != zero, others, cand))
            b = _lowest_bit(choice)
            bit[r, j] = b
            used[r] |= np.left_shift(_ONE, b.astype(np.uint64))
    distinct = _popcount(used)
    alt = np.full((n, k), np.inf)
    r, j = np.nonzero(~fixed)
    if len(r):
        b = bit[r, j]
        bm = np.left_shift(_ONE, b.astype(np.uint64))
        alone = (bit[r] == b[:, None]).sum(axis=1) == 1  # the pair is the token's only one there
        opts = tok_masks[r, j] & ~bm & open_mask
        free = ((opts & used[r]) != zero) | alone
        alt[r, j] = np.where(opts == zero, np.inf, np.where(free, 0.0, 1.0))
    return bit, alt, distinct


def route_locality_first(
    topk: np.ndarray, holds: np.ndarray, preference: np.ndarray, open_: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`route_masks` on tokens ``topk [n, k]`` and holders ``holds [E, G]``, ties to the
    GPU of larger ``preference``; returns GPUs (not ranks), alternative costs, distinct GPUs."""
    rk = Ranking(preference)
    masks = rk.masks(holds)
    bit, alt, distinct = route_masks(masks[topk], rk.mask_of(np.nonzero(open_)[0]))
    return rk.gpu_of[bit], alt, distinct


def _shed_cost(load: np.ndarray, free: np.ndarray, paid: np.ndarray, eps: np.ndarray, penalty: float) -> np.ndarray:
    """Per workload (rows): pairs moved at cost 1 plus ``penalty`` per pair nobody can take.

    ``load, free, paid`` are ``[Wk, G]``: load, pairs movable at no cost, pairs movable at one
    GPU each; ``eps`` ``[Wk]``.
    """
    mean = load.sum(axis=1, keepdims=True) / load.shape[1]
    over = np.maximum(load - (1.0 + eps[:, None]) * mean, 0.0)
    m0 = np.minimum(over, free)
    m1 = np.minimum(over - m0, paid)
    return m1.sum(axis=1) + penalty * (over - m0 - m1).sum(axis=1)


class SampleCost:
    """The joint objective on a token sample, with incremental move gains.

    Tokens are routed locality first (:func:`route_locality_first`); per workload
    (calibration and each family) a GPU over its limit sheds pairs, cheapest first. The tie
    order and the GPUs allowed to receive shed load are fixed at :meth:`reset` (from the
    calibration loads then); :meth:`delta` routes again only the tokens that chose an expert
    whose holders the move changes.
    """

    def __init__(self, layer: JointLayer) -> None:
        self.layer = layer
        n, k = layer.topk.shape
        E = layer.experts
        order = np.argsort(layer.topk.ravel(), kind="stable")
        self._tok = (order // k).astype(np.int64)
        self._start = np.searchsorted(layer.topk.ravel()[order], np.arange(E + 1))
        self._eps = layer.limits
        self._wts = layer.workload_weights
        ntok = layer.family_tokens
        self._ntok = np.concatenate([[max(float(ntok.sum()), 1.0)], np.maximum(ntok, 1.0)])
        self.value = math.inf

    def tokens_of(self, experts: tuple[int, ...]) -> np.ndarray:
        """Sample tokens that chose any of ``experts``."""
        parts = [self._tok[self._start[e]: self._start[e + 1]] for e in experts]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0]

    def _aggregate(self, rows: np.ndarray, gpu: np.ndarray, alt: np.ndarray, distinct: np.ndarray):
        """Per family ``[F, G]`` load, free and paid movable pairs, ``[F]`` distinct sums."""
        F, G = self.layer.families, self.layer.gpus
        fam = self.layer.family[rows]
        key = (fam[:, None] * G + gpu).ravel()
        a = alt.ravel()
        load = np.bincount(key, minlength=F * G).reshape(F, G).astype(np.float64)
        free = np.bincount(key, weights=(a <= 0.0), minlength=F * G).reshape(F, G)
        paid = np.bincount(key, weights=(a == 1.0), minlength=F * G).reshape(F, G)
        dsum = np.bincount(fam, weights=distinct, minlength=F).astype(np.float64)
        return load, free, paid, dsum

    def _value(self, load, free, paid, dsum) -> tuple[float, np.ndarray]:
        """J from per-family aggregates; also the per-workload values ``[1 + F]``."""
        wl = np.concatenate([load.sum(axis=0, keepdims=True), load])
        wf = np.concatenate([free.sum(axis=0, keepdims=True), free])
        wp = np.concatenate([paid.sum(axis=0, keepdims=True), paid])
        ds = np.concatenate([[dsum.sum()], dsum])
        comm = (ds + _shed_cost(wl, wf, wp, self._eps, self.layer.penalty)) / self._ntok
        return float(self._wts @ comm), comm

    def reset(self, state: SlotState) -> float:
        """Route every sampled token on ``state``; fix tie order and receivers; return J."""
        layer = self.layer
        G = layer.gpus
        holds = state.holds
        # tie order and receivers from the calibration loads of a first routing (ties to
        # the GPU with the least load estimated by an even split over copies)
        n_copy = holds.sum(axis=1)
        share = np.where(n_copy > 0, layer.expert_load / np.maximum(n_copy, 1), 0.0)
        est = (holds * share[:, None]).sum(axis=0)
        rk = Ranking(-est)
        bit, _, _ = route_masks(rk.masks(holds)[layer.topk], rk.mask_of(np.arange(G)))
        load = np.bincount(rk.gpu_of[bit].ravel(), minlength=G).astype(np.float64)
        self.ranking = Ranking(-load)
        self.open_mask = self.ranking.mask_of(np.nonzero(load <= (1.0 + layer.eps) * load.mean())[0])
        self.masks = self.ranking.masks(holds)
        bit, self.alt, self.distinct = route_masks(self.masks[layer.topk], self.open_mask)
        self.gpu = self.ranking.gpu_of[bit]
        rows = np.arange(layer.tokens)
        self.agg = self._aggregate(rows, self.gpu, self.alt, self.distinct)
        self.value, self.per_workload = self._value(*self.agg)
        return self.value

    def delta(self, state: SlotState, move: Move) -> float:
        """J after ``move`` minus J now (``state`` is the plan of the last :meth:`reset`)."""
        changed = state.changed_experts(move)
        rows = self.tokens_of(changed)
        if not len(rows):
            return 0.0
        masks = self.masks.copy()
        bits = self.ranking.bits
        if move.kind == "swap":
            e, f = int(state.slots[move.a, move.i]), int(state.slots[move.b, move.j])
            if e >= 0:
                masks[e] = (masks[e] & ~bits[move.a]) | bits[move.b]
            if f >= 0:
                masks[f] = (masks[f] & ~bits[move.b]) | bits[move.a]
        else:
            e, f = int(state.slots[move.a, move.i]), move.expert
            if e >= 0:
                masks[e] &= ~bits[move.a]
            masks[f] |= bits[move.a]
        bit, alt, distinct = route_masks(masks[self.layer.topk[rows]], self.open_mask)
        gpu = self.ranking.gpu_of[bit]
        old = self._aggregate(rows, self.gpu[rows], self.alt[rows], self.distinct[rows])
        new = self._aggregate(rows, gpu, alt, distinct)
        agg = tuple(a - o + w for a, o, w in zip(self.agg, old, new, strict=True))
        return self._value(*agg)[0] - self.value

    # ------------------------------------------------------------------ move screening
    def screen(self, state: SlotState, rng: np.random.Generator, count: int) -> list[Move]:
        """About ``count`` promising moves, by first-order gains of the current routing.

        For every (token, expert) pair routed to the copy in slot ``p`` and every GPU ``b``:
        the token's change in distinct GPUs if the pair ran on ``b`` (or, for an expert with
        other copies, on its cheapest other holder when that is cheaper). Summed per slot
        this prices moving a copy ([P, G]); pairs of an expert that could join a GPU the
        token already uses price adding a copy ([E, G]). A swap adds two moves, a
        replacement a removal and an addition; the calibration load each move shifts is
        priced with the current shed costs. The best swaps and replacements by that sum,
        plus a few random ones, are returned.
        """
        layer = self.layer
        N, k = layer.topk.shape
        G, W = state.slots.shape
        P = G * W
        E = layer.experts
        gpu, topk = self.gpu, layer.topk
        used = np.zeros((N, G), dtype=bool)
        used[np.repeat(np.arange(N), k), gpu.ravel()] = True
        alone = (gpu[:, :, None] == gpu[:, None, :]).sum(axis=2) == 1  # [N, k]
        slot_of = np.full((E, G), -1, dtype=np.int64)
        g_idx, w_idx = np.nonzero(state.slots >= 0)
        slot_of[state.slots[g_idx, w_idx], g_idx] = g_idx * W + w_idx
        p = slot_of[topk, gpu].ravel()  # slot serving each pair
        # cost of each pair on each GPU b; the other holders' best, for replicated experts
        c = (~used)[:, None, :].astype(np.float64) - alone[:, :, None]  # [N, k, G]
        holds = state.holds[topk]  # [N, k, G]
        other = np.where(holds, c, np.inf)
        other[np.arange(N)[:, None], np.arange(k)[None, :], gpu] = np.inf
        alt_other = other.min(axis=2)  # [N, k]
        c = np.minimum(c, alt_other[:, :, None]).reshape(-1, G)
        to_b = (c <= alt_other.reshape(-1, 1)).astype(np.float64)  # the pair would run on b
        sel = sp.csr_matrix((np.ones(N * k), (p, np.arange(N * k))), shape=(P, N * k))
        move = sel @ c  # [P, G]
        moved_to = sel @ to_b  # [P, G]
        served = np.asarray(sel.sum(axis=1)).ravel()  # [P] pairs on each slot
        join = -(alone[:, :, None] & used[:, None, :]).reshape(-1, G).astype(np.float64)
        by_e = sp.csr_matrix((np.ones(N * k), (topk.ravel(), np.arange(N * k))), shape=(E, N * k))
        add = by_e @ join  # [E, G]: adding a copy of e on g
        add_slot = sel @ join  # [P, G]: the part of it from pairs on slot p
        remove = np.where(np.isfinite(alt_other), alt_other, self.layer.penalty * G).reshape(-1)
        remove = np.bincount(p, weights=remove, minlength=P)  # [P]
        flat = state.slots.reshape(-1)
        gpu_of = np.repeat(np.arange(G), W)
        e_of = np.maximum(flat, 0)
        filled = flat >= 0
        multi = filled & (state.copies[e_of] >= 2)
        # load pricing on the calibration workload (free and paid movable pairs held fixed)
        load = self.agg[0].sum(axis=0)
        free, paid = self.agg[1].sum(axis=0), self.agg[2].sum(axis=0)
        lim = (1.0 + layer.eps) * load.sum() / G

        def shed(g: np.ndarray, x: np.ndarray) -> np.ndarray:
            over = np.maximum(x - lim, 0.0)
            m0 = np.minimum(over, free[g])
            m1 = np.minimum(over - m0, paid[g])
            return m1 + layer.penalty * (over - m0 - m1)

        base = shed(np.arange(G), load)
        # swaps p <-> q (p < q on different GPUs)
        a, b = gpu_of[:, None], gpu_of[None, :]
        comm = move[:, gpu_of] + move[:, gpu_of].T  # [P, Q]: p's copy to q's GPU and back
        extra = np.where(multi[:, None], add[e_of][:, gpu_of] - add_slot[:, gpu_of], 0.0)
        comm = comm + extra + extra.T
        la = load[gpu_of][:, None] - served[:, None] + moved_to[:, gpu_of].T  # new load of p's GPU
        lb = load[gpu_of][None, :] - served[None, :] + moved_to[:, gpu_of]  # new load of q's GPU
        dload = shed(np.broadcast_to(a, (P, P)), la) + shed(np.broadcast_to(b, (P, P)), lb)
        dload -= base[gpu_of][:, None] + base[gpu_of][None, :]
        swap = comm + dload
        holds_pq = state.holds[e_of][:, gpu_of] & filled[:, None]  # p's expert already on q's GPU
        bad = (a == b) | (flat[:, None] == flat[None, :]) | holds_pq | holds_pq.T
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
        # replacements: slot p (a spare copy or empty) := f
        spare = np.nonzero(multi | ~filled)[0]
        if len(spare):
            ga = gpu_of[spare]
            rep = remove[spare][:, None] + add[:, ga].T  # [s, E]
            # load: slot p's pairs leave (to other holders), f's pairs that join come in
            gain_in = -add[:, ga].T  # pairs of f that would run on a (approximately)
            la = load[ga][:, None] - served[spare][:, None] + gain_in
            rep = rep + shed(np.broadcast_to(ga[:, None], la.shape), la) - base[ga][:, None]
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
            x, y = (rng.choice(G, size=2, replace=False) if G > 1 else (0, 0))
            moves.append((np.inf, Move("swap", int(x), int(rng.integers(W)), int(y), int(rng.integers(W)))))
        moves.sort(key=lambda t: t[0])
        return [m for _, m in moves if state.valid(m)]

    def loads(self) -> np.ndarray:
        """float ``[1 + F, G]``: locality-first loads of the calibration and family workloads."""
        load = self.agg[0]
        return np.concatenate([load.sum(axis=0, keepdims=True), load])


# ----------------------------------------------------------------------------- exact pricing
def _patterns(topk: np.ndarray, family: np.ndarray, families: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted top-k sets ``[M, k]`` and their token counts per family ``[M, F]``."""
    sets = np.sort(topk, axis=1)
    uniq, inv = np.unique(sets, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    w = np.zeros((len(uniq), families))
    np.add.at(w, (inv, family), 1.0)
    return uniq, w


def routings(pattern: np.ndarray, holds: np.ndarray | None, gpus: int) -> np.ndarray:
    """int ``[R, k]``: every assignment of the pattern's experts to GPUs (holders only when
    ``holds [E, G]`` is given)."""
    opts = [np.arange(gpus) if holds is None else np.nonzero(holds[e])[0] for e in pattern]
    return np.array(list(itertools.product(*opts)), dtype=np.int64).reshape(-1, len(pattern))


def _distinct(rows: np.ndarray) -> np.ndarray:
    s = np.sort(rows, axis=1)
    return 1 + (s[:, 1:] != s[:, :-1]).sum(axis=1)


def ideal_dispatch(layer: JointLayer, holds: np.ndarray) -> tuple[float, np.ndarray]:
    """The joint objective of a plan under the ideal dispatch, by one LP per workload.

    Variables: tokens of each pattern on each of its routings (continuous), the excess of
    each GPU over its limit. Minimizes distinct GPUs plus ``penalty`` per excess pair.

    Returns
    -------
    (J, per_workload)
        J and the per-workload values ``[1 + F]`` (GPUs per token, penalty included).
    """
    from scipy.optimize import linprog

    pats, w = _patterns(layer.topk, layer.family, layer.families)
    G, F = layer.gpus, layer.families
    eps = layer.limits
    wk = np.concatenate([w.sum(axis=1, keepdims=True), w], axis=1)  # [M, 1+F]
    per = np.zeros(1 + F)
    rts = [routings(p, holds, G) for p in pats]
    for c in range(1 + F):
        ntok = wk[:, c].sum()
        if ntok == 0:
            continue
        live = np.nonzero(wk[:, c] > 0)[0]
        cols, dist = [], []
        for m in live:
            cols.append(rts[m])
            dist.append(_distinct(rts[m]))
        nv = sum(len(r) for r in cols)
        pid = np.concatenate([np.full(len(r), i) for i, r in enumerate(cols)])
        allr = np.concatenate(cols)
        d = np.concatenate(dist).astype(np.float64)
        # equality: tokens of each pattern
        A_eq = sp.csr_matrix((np.ones(nv), (pid, np.arange(nv))), shape=(len(live), nv + G))
        b_eq = wk[live, c]
        # load rows: sum of pairs on g - excess_g <= limit
        k = allr.shape[1]
        rr = np.repeat(np.arange(nv), k)
        gg = allr.ravel()
        A_ub = sp.csr_matrix((np.ones(nv * k), (gg, rr)), shape=(G, nv + G)).tolil()
        for g in range(G):
            A_ub[g, nv + g] = -1.0
        limit = (1.0 + eps[c]) * ntok * k / G
        cost = np.concatenate([d, np.full(G, layer.penalty)])
        res = linprog(cost, A_ub=A_ub.tocsr(), b_ub=np.full(G, limit), A_eq=A_eq, b_eq=b_eq,
                      bounds=(0, None), method="highs")
        if res.status != 0:  # pragma: no cover - feasible by construction (excess is free)
            raise RuntimeError(f"ideal dispatch LP: {res.message}")
        per[c] = res.fun / ntok
    return float(layer.workload_weights @ per), per


class ExactCost:
    """The joint objective under the ideal dispatch (an LP per workload): small layers only."""

    def __init__(self, layer: JointLayer) -> None:
        self.layer = layer
        self.value = math.inf

    def reset(self, state: SlotState) -> float:
        self.value = ideal_dispatch(self.layer, state.holds)[0]
        return self.value

    def delta(self, state: SlotState, move: Move) -> float:
        trial = state.copy()
        trial.apply(move)
        return ideal_dispatch(self.layer, trial.holds)[0] - self.value


# ============================================================================ search
@dataclass
class SearchStats:
    """Counters of one search."""

    rounds: int = 0
    moves: int = 0
    kicks: int = 0
    evaluated: int = 0
    start_value: float = math.nan
    value: float = math.nan
    wall_time: float = 0.0
    trajectory: list[float] = field(default_factory=list)


def neighbourhood(state: SlotState) -> list[Move]:
    """Every valid move: swaps of two slots on different GPUs, replacements of a spare copy
    (or an empty slot) by an expert the GPU lacks."""
    G, W = state.slots.shape
    E = state.experts
    out = []
    slots = [(g, w) for g in range(G) for w in range(W)]
    for (a, i), (b, j) in itertools.combinations(slots, 2):
        m = Move("swap", a, i, b, j)
        if state.valid(m):
            out.append(m)
    for a, i in slots:
        e = int(state.slots[a, i])
        if e >= 0 and state.copies[e] < 2:
            continue
        for f in range(E):
            m = Move("replace", a, i, expert=f)
            if state.valid(m):
                out.append(m)
    return out


def screened_moves(
    state: SlotState, affinity: np.ndarray, loads: np.ndarray, rng: np.random.Generator, count: int
) -> list[Move]:
    """About ``count`` promising moves of a large neighbourhood.

    * swaps with the best affinity gain (each copy weighted by 1 / its expert's copies);
    * moves off the most loaded GPU of the worst workload (swaps with lighter slots,
      replacements of its spare copies, a copy of its heaviest experts elsewhere);
    * replacements adding a copy of an expert next to its partners;
    * a few uniformly random swaps and replacements.
    """
    G, W = state.slots.shape
    E = state.experts
    flat = state.slots.reshape(-1)
    gpu_of = np.repeat(np.arange(G), W)
    e = np.maximum(flat, 0)
    filled = flat >= 0
    S = affinity @ state.holds  # [E, G] affinity of each expert with each GPU's contents
    wgt = np.where(filled, 1.0 / np.maximum(state.copies[e], 1), 0.0)
    own = np.where(filled, S[e, gpu_of], 0.0)
    # swap gain proxy [P, P]: slot p's expert to q's GPU and back
    to_other = S[e][:, gpu_of] - affinity[e][:, e]  # [p, q]: e_p's affinity to GPU of q, minus e_q
    to_other = np.where(filled[:, None], to_other, 0.0)
    gain = wgt[:, None] * (to_other - own[:, None]) + (wgt[:, None] * (to_other - own[:, None])).T
    bad = (gpu_of[:, None] == gpu_of[None, :]) | (flat[:, None] == flat[None, :])
    hold_other = np.where(filled[:, None], state.holds[e][:, gpu_of], False)  # e_p already on GPU of q
    bad |= hold_other | hold_other.T
    gain = np.where(bad, -np.inf, gain)
    iu = np.triu_indices(len(flat), 1)
    g_up = gain[iu]
    moves: list[Move] = []
    n_top = max(count // 3, 1)
    best = np.argsort(-g_up)[:n_top]
    for t in best:
        if np.isfinite(g_up[t]):
            p, q = iu[0][t], iu[1][t]
            moves.append(Move("swap", int(gpu_of[p]), int(p % W), int(gpu_of[q]), int(q % W)))
    # the hottest GPU of the worst workload
    rel = loads / np.maximum(loads.mean(axis=1, keepdims=True), 1e-12)
    hot = int(np.unravel_index(np.argmax(rel), rel.shape)[1])
    cold = np.argsort(loads[0])
    hot_slots = [(hot, w) for w in range(W)]
    for a, i in hot_slots:
        for _ in range(2):
            b = int(cold[rng.integers(0, max(G // 2, 1))])
            j = int(rng.integers(0, W))
            moves.append(Move("swap", a, i, b, j))
        ea = int(state.slots[a, i])
        if ea >= 0:  # give the hot expert a copy on a light GPU (replace a spare copy there)
            for b in cold[: max(G // 4, 1)]:
                spare = [w for w in range(W) if state.slots[b, w] < 0 or state.copies[state.slots[b, w]] >= 2]
                if spare:
                    moves.append(Move("replace", int(b), int(rng.choice(spare)), expert=ea))
        f = int(rng.integers(0, E))
        moves.append(Move("replace", a, i, expert=f))
    # a copy of an expert next to its partners, in a spare slot
    spare_slots = [p for p in range(len(flat)) if flat[p] < 0 or state.copies[flat[p]] >= 2]
    if spare_slots:
        sp_g = gpu_of[spare_slots]
        fit = S[:, sp_g] - np.where(filled[spare_slots], affinity[:, e[spare_slots]], 0.0)  # [E, s]
        fit = np.where(state.holds[:, sp_g], -np.inf, fit)
        flat_best = np.argsort(-fit.ravel())[: max(count // 6, 1)]
        for t in flat_best:
            x, s = divmod(int(t), len(spare_slots))
            if np.isfinite(fit[x, s]):
                p = spare_slots[s]
                moves.append(Move("replace", int(gpu_of[p]), int(p % W), expert=x))
    for _ in range(max(count // 6, 1)):
        a, b = rng.choice(G, size=2, replace=False) if G > 1 else (0, 0)
        moves.append(Move("swap", int(a), int(rng.integers(W)), int(b), int(rng.integers(W))))
        moves.append(Move("replace", int(rng.integers(G)), int(rng.integers(W)), expert=int(rng.integers(E))))
    seen, out = set(), []
    for m in moves:
        key = (m.kind, m.a, m.i, m.b, m.j, m.expert)
        if m.kind == "swap" and (m.b, m.j) < (m.a, m.i):
            key = (m.kind, m.b, m.j, m.a, m.i, m.expert)
        if key not in seen and state.valid(m):
            seen.add(key)
            out.append(m)
    return out


def kick(state: SlotState, rng: np.random.Generator, swaps: int) -> SlotState:
    """A copy of ``state`` after ``swaps`` random valid slot swaps."""
    out = state.copy()
    G, W = out.slots.shape
    done, tries = 0, 0
    while done < swaps and tries < 50 * swaps and G > 1:
        tries += 1
        a, b = rng.choice(G, size=2, replace=False)
        m = Move("swap", int(a), int(rng.integers(W)), int(b), int(rng.integers(W)))
        if out.valid(m):
            out.apply(m)
            done += 1
    return out


def local_search(
    state: SlotState,
    cost: Cost,
    rng: np.random.Generator,
    *,
    affinity: np.ndarray | None = None,
    rounds: int = 5000,
    patience: int = 3,
    kicks: int = 8,
    kick_swaps: int = 2,
    candidates: int = 96,
    exhaustive_below: int = 2500,
    confirm: int = 3,
    chunk: int = 16,
    deadline: float | None = None,
) -> tuple[SlotState, float, SearchStats]:
    """Iterated best-improvement search over slot contents.

    Each round prices a neighbourhood (all moves when there are at most
    ``exhaustive_below``, else :func:`screened_moves`, redrawn up to ``patience`` times) and
    applies the best improving move (of the ``confirm`` best predicted, the first whose
    re-priced value is lower). When none improves, a kick of ``kick_swaps`` random
    swaps from the best plan starts a new descent (at most ``kicks`` times); the best plan
    is returned with its value.
    """
    t0 = time.perf_counter()
    stats = SearchStats()
    current = state.copy()
    value = cost.reset(current)
    stats.start_value = value
    best, best_value = current.copy(), value
    if affinity is None:
        affinity = np.zeros((state.experts, state.experts))
    full = neighbourhood(current) if len(current.slots.ravel()) ** 2 // 2 <= exhaustive_below else None
    small = full is not None and len(full) + current.experts * current.slots.size <= exhaustive_below
    kicks_left = kicks
    misses = 0
    while stats.rounds < rounds:
        if deadline is not None and time.perf_counter() > deadline:
            break
        stats.rounds += 1
        if small:
            moves = neighbourhood(current)
        elif hasattr(cost, "screen"):
            moves = cost.screen(current, rng, candidates * 2**misses)  # widen after a miss
        else:
            loads = cost.loads() if hasattr(cost, "loads") else np.ones((1, current.gpus))
            moves = screened_moves(current, affinity, loads, rng, candidates)
        improved = False
        # price the moves chunk by chunk (in screening order) and stop at the first chunk with
        # an improving one; a move is kept when the re-priced plan is better (a cost's gains
        # may rest on quantities fixed at its last reset, e.g. SampleCost's tie order)
        step = len(moves) if small else max(chunk, 1)
        for lo in range(0, len(moves), step):
            part = moves[lo : lo + step]
            gains = np.array([cost.delta(current, m) for m in part])
            stats.evaluated += len(part)
            dirty = False
            for t in np.argsort(gains, kind="stable")[:confirm]:
                if gains[t] >= -TOL:
                    break
                trial = current.copy()
                trial.apply(part[int(t)])
                new_value = cost.reset(trial)
                dirty = True
                if new_value < value - TOL:
                    current, value, improved = trial, new_value, True
                    break
            if improved:
                break
            if dirty:
                cost.reset(current)
        if improved:
            stats.moves += 1
            misses = 0
            if value < best_value - TOL:
                best, best_value = current.copy(), value
            stats.trajectory.append(best_value)
            continue
        misses += 1
        if not small and misses < patience:
            continue
        if kicks_left <= 0:
            break
        kicks_left -= 1
        stats.kicks += 1
        misses = 0
        current = kick(best, rng, kick_swaps)
        value = cost.reset(current)
    cost.reset(best)
    stats.value = best_value
    stats.wall_time = time.perf_counter() - t0
    return best, best_value, stats


# ============================================================================ exact model
def check_exact_size(layer: JointLayer, max_columns: int = 60_000) -> int:
    """Columns of the exact MILP; raises ValueError when above ``max_columns``."""
    pats, w = _patterns(layer.topk, layer.family, layer.families)
    live = (w > 0).sum(axis=1) + 1  # calibration + the families it appears in
    k = pats.shape[1]
    cols = int((live * layer.gpus**k).sum()) + layer.experts * layer.gpus
    if cols > max_columns:
        raise ValueError(
            f"the exact joint model needs {cols} columns (patterns x G^k routings), more than {max_columns}; "
            "use 'joint' (local search) for this size"
        )
    return cols


@dataclass
class ExactResult:
    """The exact joint model's answer for one layer."""

    slots: np.ndarray | None
    value: float | None
    bound: float | None
    status: str  # optimal / time_limit / no_solution
    wall_time: float


def solve_exact(layer: JointLayer, *, time_limit: float | None = None) -> ExactResult:
    """The joint MILP of one layer (scipy's HiGHS).

    Binary ``y[e, g]`` (e held by g), ``sum_e y[e, g] <= W``, ``sum_g y[e, g] >= 1``; per
    workload and token pattern a continuous number of tokens on each routing (an assignment
    of the pattern's experts to GPUs), allowed only onto holders (``v <= tokens * y``);
    GPU loads minus an excess variable within ``(1 + eps)`` times the mean; objective the
    weighted distinct GPUs per token plus ``penalty`` per excess pair, as :class:`ExactCost`.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    check_exact_size(layer)
    pats, w = _patterns(layer.topk, layer.family, layer.families)
    E, G, W, F = layer.experts, layer.gpus, layer.width, layer.families
    k = pats.shape[1]
    allr = routings(np.arange(k), None, G)  # [G^k, k] GPU of each pattern position
    dist = _distinct(allr).astype(np.float64)
    wk = np.concatenate([w.sum(axis=1, keepdims=True), w], axis=1)
    weights = layer.workload_weights
    eps = layer.limits
    ny = E * G
    c_parts = [np.zeros(ny)]
    rows, cols, vals, lo, hi = [], [], [], [], []
    row = 0
    col = ny
    # holder constraints
    for g in range(G):  # capacity
        rows += [row] * E
        cols += [e * G + g for e in range(E)]
        vals += [1.0] * E
        lo.append(-np.inf)
        hi.append(float(W))
        row += 1
    for e in range(E):  # every expert at least one copy
        rows += [row] * G
        cols += [e * G + g for g in range(G)]
        vals += [1.0] * G
        lo.append(1.0)
        hi.append(np.inf)
        row += 1
    nR = len(allr)
    for c in range(1 + F):
        ntok = wk[:, c].sum()
        if ntok == 0 or weights[c] == 0:
            continue
        scale = weights[c] / ntok
        live = np.nonzero(wk[:, c] > 0)[0]
        start = col
        for m in live:
            base = col
            c_parts.append(scale * dist)
            # sum over routings = tokens of the pattern
            rows += [row] * nR
            cols += list(range(base, base + nR))
            vals += [1.0] * nR
            lo.append(wk[m, c])
            hi.append(wk[m, c])
            row += 1
            # v[r] <= tokens * y[e_pos, g_pos] for each position (aggregated over routings
            # that put position pos on g: sum_r v[r] <= tokens * y)
            for pos in range(k):
                e = int(pats[m, pos])
                for g in range(G):
                    rs = np.nonzero(allr[:, pos] == g)[0]
                    rows += [row] * (len(rs) + 1)
                    cols += list(base + rs) + [e * G + g]
                    vals += [1.0] * len(rs) + [-wk[m, c]]
                    lo.append(-np.inf)
                    hi.append(0.0)
                    row += 1
            col += nR
        # load rows with excess
        limit = (1.0 + eps[c]) * ntok * k / G
        exc = col
        c_parts.append(np.full(G, scale * layer.penalty))
        col += G
        for g in range(G):
            idx, coef = [], []
            for mi in range(len(live)):
                base = start + mi * nR
                n_on = (allr == g).sum(axis=1)
                nz = np.nonzero(n_on)[0]
                idx += list(base + nz)
                coef += list(n_on[nz].astype(np.float64))
            rows += [row] * (len(idx) + 1)
            cols += idx + [exc + g]
            vals += coef + [-1.0]
            lo.append(-np.inf)
            hi.append(limit)
            row += 1
    c_vec = np.concatenate(c_parts)
    n = len(c_vec)
    A = sp.csr_matrix((vals, (rows, cols)), shape=(row, n))
    integrality = np.zeros(n)
    integrality[:ny] = 1
    ub = np.full(n, np.inf)
    ub[:ny] = 1.0
    options = {"disp": False}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    res = milp(c_vec, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(n), ub), options=options)
    wall = time.perf_counter() - t0
    bound = getattr(res, "mip_dual_bound", None)
    if res.x is None:
        return ExactResult(None, None, None if bound is None else float(bound), "no_solution", wall)
    y = np.round(res.x[:ny]).reshape(E, G).astype(bool)
    slots = holds_to_slots(y, W)
    status = "optimal" if res.status == 0 else "time_limit"
    value = float(res.fun)
    return ExactResult(slots, value, float(bound) if bound is not None else (value if status == "optimal" else None),
                       status, wall)


def holds_to_slots(holds: np.ndarray, width: int) -> np.ndarray:
    """int ``[G, W]`` slots from a holder matrix ``[E, G]`` (ascending ids, then empty)."""
    E, G = holds.shape
    slots = np.full((G, width), -1, dtype=np.int64)
    for g in range(G):
        ids = np.nonzero(holds[:, g])[0]
        if len(ids) > width:
            raise ValueError(f"GPU {g} holds {len(ids)} experts, more than {width} slots")
        slots[g, : len(ids)] = ids
    return slots


def fill_slots(holds: np.ndarray, width: int, load: np.ndarray) -> np.ndarray:
    """Fill each GPU's free slots with copies of the heaviest experts it lacks (a copy never
    hurts the ideal dispatch), then return the slots ``[G, W]``."""
    holds = holds.copy()
    G = holds.shape[1]
    order = np.argsort(-load, kind="stable")
    for g in range(G):
        free = width - int(holds[:, g].sum())
        for e in order:
            if free <= 0:
                break
            if not holds[e, g]:
                holds[e, g] = True
                free -= 1
    return holds_to_slots(holds, width)


def brute_force(layer: JointLayer) -> tuple[float, np.ndarray]:
    """The optimum of the joint objective by enumerating every full plan (tiny layers only):
    each GPU holds ``min(W, E)`` distinct experts (more copies never hurt the ideal dispatch),
    every expert at least one copy; each plan priced by :func:`ideal_dispatch`."""
    E, G, W = layer.experts, layer.gpus, layer.width
    size = min(W, E)
    subsets = list(itertools.combinations(range(E), size))
    if len(subsets) ** G > 20_000:
        raise ValueError("brute force is for tiny layers only")
    best, best_slots = math.inf, None
    seen = set()
    for combo in itertools.product(range(len(subsets)), repeat=G):
        key = tuple(sorted(combo))  # GPUs are interchangeable
        if key in seen:
            continue
        seen.add(key)
        holds = np.zeros((E, G), dtype=bool)
        for g, s in enumerate(combo):
            holds[list(subsets[s]), g] = True
        if not holds.any(axis=1).all():
            continue
        v = ideal_dispatch(layer, holds)[0]
        if v < best - 1e-12:
            best, best_slots = v, holds_to_slots(holds, W)
    assert best_slots is not None
    return best, best_slots
