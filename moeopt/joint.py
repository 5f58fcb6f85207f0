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
  *locality first*, as the online guard of SPEC 4.3 routes at small λ (an expert with one
  copy runs there; one with several on the holder with most of the token's other experts,
  ties spread evenly over the tied holders); then each GPU over its limit sheds pairs to
  their next-best holders, free ones first (a holder the token already uses), then at one
  GPU each, and load left over a limit (on the source, or pushed over on a receiver) costs
  ``penalty`` per pair. The sample's pairs are weighted so that each family's expert loads
  are the whole trace's. A move changes the holders of at most two experts, so only the
  tokens that chose them are routed again: gains are exact and incremental.
* :class:`ExactCost`: the ideal dispatch as a linear program over each token pattern's
  routings (every assignment of its experts to holders), for small layers; the exact MILP
  over slot contents (:func:`solve_exact`) uses the same model with binary holders, and
  :func:`brute_force` enumerates every plan of tiny layers to check both.

:func:`local_search` is one engine over slot contents with three operators: swap two slots
(a swap with an empty slot moves a copy), replace a copy (an expert with spare copies gives a
slot to another expert), and add a copy into an empty slot. On small layers each round
prices the whole neighbourhood and applies the best improving move; on larger ones moves are
screened by first-order gains (:meth:`SampleCost.screen`), ranked on a sub-sample
(:meth:`SampleCost.prescreen`) and priced a chunk at a time. At a local optimum a kick of
random swaps restarts the descent from the best plan (iterated local search). Bounded by
rounds, kicks and an optional deadline; a seed fixes the result when no deadline cuts it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from moeopt.budget import run_interruptible

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
    pair_weight
        Optional float ``[N, k]``: the load each sampled pair stands for (default 1). A
        sample of a larger trace weighs each pair by its expert's count in the trace over
        its count in the sample (per family), so loads follow the whole trace and only the
        split over copies and the communication come from the sample.
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
    pair_weight: np.ndarray | None = None

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
        w = np.ones(topk.shape) if self.pair_weight is None else np.asarray(self.pair_weight, dtype=np.float64)
        if w.shape != topk.shape or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("pair_weight: expected finite weights >= 0, one per (token, expert)")
        object.__setattr__(self, "pair_weight", w)

    @property
    def weights(self) -> np.ndarray:
        """float ``[n, k]``: ``pair_weight``, ones when none was given (set by ``__post_init__``)."""
        if self.pair_weight is None:
            raise RuntimeError("pair_weight is set by __post_init__")
        return self.pair_weight

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
        """float ``[E]``: load of each expert (weighted sampled pairs)."""
        return np.bincount(self.topk.ravel(), weights=self.weights.ravel(), minlength=self.experts)

    def coactivation(self) -> np.ndarray:
        """float ``[E, E]``: tokens choosing both e and e' (zero diagonal)."""
        n, k = self.topk.shape
        x = sp.csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), self.topk.ravel())), shape=(n, self.experts))
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
    """A :class:`JointLayer` on (a uniform sample of) one layer's tokens ``topk [N, k]``; a
    sample's pairs are weighted so that each family's expert loads are the whole trace's."""
    topk = np.asarray(topk, dtype=np.int64)
    family = np.asarray(family, dtype=np.int64)
    n, k = topk.shape
    if sample_tokens is None or n <= sample_tokens:
        return JointLayer(
            topk=topk, family=family, families=families, experts=experts, gpus=gpus, width=width, **kwargs
        )
    rng = rng or np.random.default_rng(0)
    idx = np.sort(rng.choice(n, size=sample_tokens, replace=False))
    full = np.bincount((family[:, None] * experts + topk).ravel(), minlength=families * experts)
    part = np.bincount((family[idx, None] * experts + topk[idx]).ravel(), minlength=families * experts)
    tok_full = np.bincount(family, minlength=families).astype(np.float64)
    tok_part = np.bincount(family[idx], minlength=families).astype(np.float64)
    scale = np.where(tok_full > 0, tok_part / np.maximum(tok_full, 1), 0.0)  # sample scale per family
    ratio = np.where(part > 0, full * np.repeat(scale, experts) / np.maximum(part, 1), 0.0)
    weight = ratio[family[idx, None] * experts + topk[idx]]
    return JointLayer(
        topk=topk[idx],
        family=family[idx],
        families=families,
        experts=experts,
        gpus=gpus,
        width=width,
        pair_weight=weight,
        **kwargs,
    )


def subsample(layer: JointLayer, tokens: int, rng: np.random.Generator) -> JointLayer:
    """A uniform sub-sample of a layer's tokens, its pairs weighted so that each family's
    expert loads keep the layer's proportions (at the sub-sample's scale)."""
    n = layer.tokens
    if tokens >= n:
        return layer
    E, F = layer.experts, layer.families
    idx = np.sort(rng.choice(n, size=tokens, replace=False))
    key = layer.family[:, None] * E + layer.topk
    full = np.bincount(key.ravel(), weights=layer.weights.ravel(), minlength=F * E)
    part = np.bincount(key[idx].ravel(), minlength=F * E).astype(np.float64)
    tok_full = np.bincount(layer.family, minlength=F).astype(np.float64)
    tok_part = np.bincount(layer.family[idx], minlength=F).astype(np.float64)
    scale = np.where(tok_full > 0, tok_part / np.maximum(tok_full, 1), 0.0)
    ratio = np.where(part > 0, full * np.repeat(scale, E) / np.maximum(part, 1), 0.0)
    return JointLayer(
        topk=layer.topk[idx],
        family=layer.family[idx],
        families=F,
        experts=E,
        gpus=layer.gpus,
        width=layer.width,
        eps=layer.eps,
        family_eps=layer.family_eps,
        robust=layer.robust,
        penalty=layer.penalty,
        pair_weight=ratio[key[idx]],
    )


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


def holder_masks(holds: np.ndarray) -> np.ndarray:
    """uint64 ``[E]``: bit g set when GPU g holds a copy of the expert (``holds [E, G]``)."""
    G = holds.shape[1]
    if G > 64:
        raise ValueError("the joint planner's routing handles at most 64 GPUs per layer")
    bits = np.left_shift(_ONE, np.arange(G, dtype=np.uint64))
    return np.bitwise_or.reduce(np.where(holds, bits[None, :], np.uint64(0)), axis=1)


def _pick(mask: np.ndarray, rot: np.ndarray, G: int) -> np.ndarray:
    """One GPU of each (non-zero) mask: the first set bit at or after ``rot`` (cyclically in
    ``G`` bits), so that ties spread evenly over the tied GPUs across tokens."""
    r = rot.astype(np.uint64)
    full = np.uint64((1 << G) - 1) if G < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    rotated = (np.right_shift(mask, r) | np.left_shift(mask, (np.uint64(G) - r) % np.uint64(64))) & full
    rotated = np.where(r == 0, mask, rotated)
    return (_lowest_bit(rotated) + rot) % G


def route_masks(
    tok_masks: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Locality-first routing on holder masks ``[n, k]``, as the online guard of SPEC 4.3
    routes at small λ.

    An expert with one copy runs there. The others are decided one top-k position after
    another, each on the holder with the most of the token's other experts (decided ones
    where they run, undecided ones on every holder); ties go to the first tied GPU at or
    after the token's ``rot`` (spreading tied load evenly, as the guard's load pressure does).

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
    gpu, used, fixed = _route(tok_masks, rot, G)
    alt, alt_gpu = _alternatives(tok_masks, gpu, used, fixed, rot, G)
    return gpu, alt, alt_gpu, _popcount(used)


def _planes(k: int) -> int:
    return max(1, int(math.ceil(math.log2(k + 1))))


def _count_planes(contrib: np.ndarray, skip: int, nplanes: int) -> list[np.ndarray]:
    """Bit-sliced sum over positions ``!= skip`` of masks ``contrib [m, k]``: plane ``i`` holds
    bit ``i`` of each GPU's count (saturating at ``2**nplanes - 1``)."""
    m, k = contrib.shape
    planes = [np.zeros(m, dtype=np.uint64) for _ in range(nplanes)]
    for j in range(k):
        if j == skip:
            continue
        carry = contrib[:, j]
        for i in range(nplanes):
            nxt = planes[i] & carry
            planes[i] = planes[i] ^ carry
            carry = nxt
        for i in range(nplanes):  # saturate: a carry out of the top plane sets every plane
            planes[i] |= carry
    return planes


def _most(cand: np.ndarray, planes: list[np.ndarray]) -> np.ndarray:
    """The bits of ``cand`` with the largest count (bit-sliced ``planes``)."""
    zero = np.uint64(0)
    best = cand.copy()
    for plane in reversed(planes):
        x = best & plane
        best = np.where(x != zero, x, best)
    return best


def _count_at(planes: list[np.ndarray], b: np.ndarray) -> np.ndarray:
    """The count of GPU ``b`` in bit-sliced ``planes``."""
    bb = b.astype(np.uint64)
    return sum(((np.right_shift(pl, bb) & _ONE).astype(np.int64) << i) for i, pl in enumerate(planes))


def _route(tok_masks: np.ndarray, rot: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The routing of :func:`route_masks`: GPUs ``[n, k]``, used-GPU masks ``[n]``, and which
    pairs have a single holder ``[n, k]``."""
    n, k = tok_masks.shape
    zero = np.uint64(0)
    fixed = _popcount(tok_masks) == 1
    gpu = np.where(fixed, _lowest_bit(tok_masks), -1)
    used = np.bitwise_or.reduce(np.where(fixed, tok_masks, zero), axis=1)
    rows = np.nonzero((~fixed).any(axis=1))[0]
    if not len(rows):
        return gpu, used, fixed
    nplanes = _planes(k)
    contrib = tok_masks[rows].copy()  # decided: the GPU's bit; undecided: every holder
    for j in range(k):
        r = np.nonzero(~fixed[rows, j])[0]
        if not len(r):
            continue
        planes = _count_planes(contrib[r], j, nplanes)
        g = _pick(_most(contrib[r, j], planes), rot[rows[r]], G)
        gpu[rows[r], j] = g
        contrib[r, j] = np.left_shift(_ONE, g.astype(np.uint64))
        used[rows[r]] |= contrib[r, j]
    return gpu, used, fixed


def _alternatives(
    tok_masks: np.ndarray, gpu: np.ndarray, used: np.ndarray, fixed: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each routed pair's next-best holder (most co-located experts, ties spread by ``rot``):
    the cost of diverting it there ``[n, k]`` (see :func:`route_masks`) and the GPU."""
    n, k = tok_masks.shape
    zero = np.uint64(0)
    alt = np.full((n, k), np.inf)
    alt_gpu = np.full((n, k), -1, dtype=np.int64)
    rows = np.nonzero((~fixed).any(axis=1))[0]
    if not len(rows):
        return alt, alt_gpu
    nplanes = _planes(k)
    contrib = np.left_shift(_ONE, gpu[rows].astype(np.uint64))  # where each pair runs
    for j in range(k):
        r = np.nonzero(~fixed[rows, j])[0]
        if not len(r):
            continue
        t = rows[r]
        planes = _count_planes(contrib[r], j, nplanes)
        b = gpu[t, j]
        opts = tok_masks[t, j] & ~np.left_shift(_ONE, b.astype(np.uint64))
        has = opts != zero
        ab = _pick(np.where(has, _most(opts, planes), _ONE), rot[t], G)
        drop = _count_at(planes, b) - _count_at(planes, ab)  # co-located experts lost
        alone = (gpu[t] == b[:, None]).sum(axis=1) == 1
        on_used = (np.right_shift(used[t], ab.astype(np.uint64)) & _ONE) == _ONE
        cost = np.where((drop <= 0) & (on_used | alone), 0.0, np.where(drop <= 1, 1.0, np.inf))
        alt[t, j] = np.where(has, cost, np.inf)
        alt_gpu[t, j] = np.where(has, ab, -1)
    return alt, alt_gpu


def route_locality_first(
    topk: np.ndarray, holds: np.ndarray, rot: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`route_masks` on tokens ``topk [n, k]`` and holders ``holds [E, G]`` (ties from
    ``rot``, default: the lowest GPU id); returns GPUs, alternative costs, distinct GPUs."""
    G = holds.shape[1]
    rot = np.zeros(len(topk), dtype=np.int64) if rot is None else rot
    gpu, alt, _, distinct = route_masks(holder_masks(holds)[topk], rot, G)
    return gpu, alt, distinct


def _shed_cost(load: np.ndarray, free: np.ndarray, paid: np.ndarray, eps: np.ndarray, penalty: float) -> np.ndarray:
    """Per workload (rows): pairs moved at cost 1 plus ``penalty`` per pair left over a limit.

    ``load`` ``[Wk, G]``; ``free, paid`` ``[Wk, G, G]``: pairs on GPU g whose cheapest other
    holder is g' at no cost / at one GPU; ``eps`` ``[Wk]``. Each GPU over its limit sheds
    free pairs, then paid ones; the shed pairs land on their other holders, and whatever
    then exceeds a limit (left on the source, or pushed over on a receiver) costs
    ``penalty`` per pair.
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
    return m1.sum(axis=1) + penalty * np.maximum(after - lim, 0.0).sum(axis=1)


class SampleCost:
    """The joint objective on a token sample, with incremental move gains.

    Tokens are routed locality first (:func:`route_masks`, ties spread by a fixed per-token
    rotation); per workload (calibration and each family) a GPU over its limit sheds pairs
    to their next-best holders, free ones first (:func:`_shed_cost`). :meth:`delta` routes
    again only the tokens that chose an expert whose holders the move changes, and updates
    the per-family aggregates by their difference, so it equals the change of :meth:`reset`'s
    value exactly.
    """

    def __init__(self, layer: JointLayer, coarse_tokens: int | None = 2048, seed: int = 0) -> None:
        self.layer = layer
        n, k = layer.topk.shape
        E = layer.experts
        #: a cheaper cost on a sub-sample that ranks many moves before they are priced here
        self.coarse = (
            SampleCost(subsample(layer, coarse_tokens, np.random.default_rng(seed)), None)
            if coarse_tokens is not None and n >= 3 * coarse_tokens
            else None
        )
        #: each token's tie rotation (fixed: a plan's value does not depend on history)
        self.rot = np.asarray(np.random.default_rng([seed, 1]).integers(0, layer.gpus, size=n))
        self._bits = np.left_shift(_ONE, np.arange(layer.gpus, dtype=np.uint64))
        order = np.argsort(layer.topk.ravel(), kind="stable")
        self._tok = (order // k).astype(np.int64)
        self._start = np.searchsorted(layer.topk.ravel()[order], np.arange(E + 1))
        self._eps = layer.limits
        self._wts = layer.workload_weights
        ntok = layer.family_tokens
        self._ntok = np.concatenate([[max(float(ntok.sum()), 1.0)], np.maximum(ntok, 1.0)])
        self.value = math.inf

    def tokens_of(self, experts: tuple[int, ...]) -> np.ndarray:
        """Sample tokens that chose any of ``experts`` (ascending)."""
        parts = [self._tok[self._start[e] : self._start[e + 1]] for e in experts]
        if len(parts) == 1:
            return parts[0]
        mark = np.zeros(self.layer.tokens, dtype=bool)
        for part in parts:
            mark[part] = True
        return np.flatnonzero(mark)

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
        movable = np.isfinite(a)
        key2 = key[movable] * G + alt_gpu.ravel()[movable]
        a, w = a[movable], w[movable]
        free = np.bincount(key2, weights=w * (a <= 0.0), minlength=F * G * G).reshape(F, G, G)
        paid = np.bincount(key2, weights=w * (a == 1.0), minlength=F * G * G).reshape(F, G, G)
        dsum = np.bincount(fam, weights=distinct, minlength=F).astype(np.float64)
        if cand is None:
            return load, free, paid, dsum
        Fo = self.layer.families
        return load.reshape(C, Fo, G), free.reshape(C, Fo, G, G), paid.reshape(C, Fo, G, G), dsum.reshape(C, Fo)

    def _value(self, load, free, paid, dsum) -> tuple[float, np.ndarray]:
        """J from per-family aggregates; also the per-workload values ``[1 + F]``."""
        wl = np.concatenate([load.sum(axis=0, keepdims=True), load])
        wf = np.concatenate([free.sum(axis=0, keepdims=True), free])
        wp = np.concatenate([paid.sum(axis=0, keepdims=True), paid])
        ds = np.concatenate([[dsum.sum()], dsum])
        comm = (ds + _shed_cost(wl, wf, wp, self._eps, self.layer.penalty)) / self._ntok
        return float(self._wts @ comm), comm

    def _values(self, load, free, paid, dsum) -> np.ndarray:
        """J of a batch of aggregates (leading axis C): ``[C]``."""
        C, F, G = load.shape
        wl = np.concatenate([load.sum(axis=1, keepdims=True), load], axis=1).reshape(-1, G)
        wf = np.concatenate([free.sum(axis=1, keepdims=True), free], axis=1).reshape(-1, G, G)
        wp = np.concatenate([paid.sum(axis=1, keepdims=True), paid], axis=1).reshape(-1, G, G)
        ds = np.concatenate([dsum.sum(axis=1, keepdims=True), dsum], axis=1)
        shed = _shed_cost(wl, wf, wp, np.tile(self._eps, C), self.layer.penalty).reshape(C, F + 1)
        return ((ds + shed) / self._ntok[None, :]) @ self._wts

    def _route_rows(self, masks: np.ndarray, rows: np.ndarray):
        return route_masks(masks[self.layer.topk[rows]], self.rot[rows], self.layer.gpus)

    def reset(self, state: SlotState) -> float:
        """Route every sampled token on ``state``; return J."""
        layer = self.layer
        self.masks = holder_masks(state.holds)
        rows = np.arange(layer.tokens)
        self.gpu, self.alt, self.alt_gpu, self.distinct = self._route_rows(self.masks, rows)
        self.agg = self._aggregate(rows, self.gpu, self.alt, self.alt_gpu, self.distinct)
        self.value, self.per_workload = self._value(*self.agg)
        if self.coarse is not None:
            self.coarse.reset(state)
        return self.value

    def price(self, state: SlotState) -> float:
        """J of ``state`` without changing this cost (what :meth:`delta` adds to J)."""
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
        """J after ``move`` minus J now (``state`` is the plan of the last :meth:`reset`); only
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
        """:meth:`delta` of several moves at once: their tokens are routed in one call."""
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
        multi = filled & (state.copies[e_of] >= 2)
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
        res = linprog(
            cost, A_ub=A_ub.tocsr(), b_ub=np.full(G, limit), A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs"
        )
        if res.status != 0:  # pragma: no cover - feasible by construction (excess is free)
            raise RuntimeError(f"ideal dispatch LP: {res.message}")
        per[c] = res.fun / ntok
    return float(layer.workload_weights @ per), per


class ExactCost:
    """The joint objective under the ideal dispatch (an LP per workload): small layers only.

    Prices the layer's tokens as they are (``pair_weight`` is not used: give it the whole
    workload, not a weighted sample)."""

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
    capped: bool = False  # the deadline, not the work bounds, ended the search
    trajectory: list[float] = field(default_factory=list)
    accepted: list[tuple[str, int]] = field(default_factory=list)  # (kind, screening rank)


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


def _try_moves(
    current: SlotState, value: float, part: list[Move], gains: np.ndarray, cost: Cost, confirm: int, combine: bool
) -> tuple[SlotState, float, int, int]:
    """Apply the improving moves of a priced chunk: first all of them that touch disjoint
    GPUs and experts (their gains about add up), else the ``confirm`` best one by one; a
    change is kept only when the re-priced plan is better (a cost's gains may rest on
    quantities fixed at its last reset, e.g. SampleCost's tie order). Returns the plan, its
    value, the moves applied (0: none) and the index in ``part`` of the first one."""
    order = [int(t) for t in np.argsort(gains, kind="stable") if gains[t] < -TOL]
    dirty = False
    if combine and len(order) > 1:
        trial, n = current.copy(), 0
        touched_g: set[int] = set()
        touched_e: set[int] = set()
        for t in order:
            m = part[t]
            gs = {m.a} if m.kind == "replace" else {m.a, m.b}
            es = set(trial.changed_experts(m))
            if gs & touched_g or es & touched_e or not trial.valid(m):
                continue
            trial.apply(m)
            touched_g |= gs
            touched_e |= es
            n += 1
        if n > 1:
            new_value = cost.reset(trial)
            dirty = True
            if new_value < value - TOL:
                return trial, new_value, n, order[0]
    for t in order[:confirm]:
        trial = current.copy()
        trial.apply(part[t])
        new_value = cost.reset(trial)
        dirty = True
        if new_value < value - TOL:
            return trial, new_value, 1, t
    if dirty:
        cost.reset(current)
    return current, value, 0, -1


def _price(cost: Cost, state: SlotState, moves: list[Move], deadline: float | None, chunk: int = 64):
    """The gains of ``moves``, priced ``chunk`` at a time so that a deadline is noticed within a
    chunk (None once it has passed); the same gains as one call."""
    one = cost.delta_many if hasattr(cost, "delta_many") else (lambda s, ms: [cost.delta(s, m) for m in ms])
    parts = []
    for i in range(0, len(moves), chunk):
        if i and deadline is not None and time.perf_counter() > deadline:
            return None
        parts.append(np.asarray(one(state, moves[i : i + chunk]), dtype=float))
    return np.concatenate(parts) if parts else np.zeros(0)


def local_search(
    state: SlotState,
    cost: Cost,
    rng: np.random.Generator,
    *,
    affinity: np.ndarray | None = None,
    rounds: int = 100_000,
    patience: int = 2,
    kicks: int = 8,
    kick_swaps: int = 2,
    candidates: int = 96,
    exhaustive_below: int = 2500,
    confirm: int = 3,
    chunk: int = 16,
    deadline: float | None = None,
    evaluations: int | None = None,
) -> tuple[SlotState, float, SearchStats]:
    """Iterated improvement search over slot contents.

    Small layers (a neighbourhood of at most ``exhaustive_below`` moves): each round prices
    every move and applies the best improving one. Larger layers: moves are screened (the
    cost's ``screen`` and ``prescreen``, else :func:`screened_moves`) into a ranked queue,
    priced ``chunk`` at a time, and the improving ones applied (:func:`_try_moves`); the
    queue is rebuilt when used up, wider (``candidates * 2**misses``) after a queue built on
    the current plan held no improving move. After ``patience`` such misses (one on small
    layers) the plan is a local optimum: a kick of ``kick_swaps`` random swaps from the best
    plan starts a new descent, at most ``kicks`` times, and the search stops after
    ``evaluations`` priced moves (None: no such bound). The work bounds fix the result for a
    seed; ``deadline`` (a ``time.perf_counter()`` value) is only a cap, and ``stats.capped``
    says when it ended the search. Returns the best plan, its value and the search's counters.
    """
    t0 = time.perf_counter()
    stats = SearchStats()
    current = state.copy()
    value = cost.reset(current)
    stats.start_value = value
    best, best_value = current.copy(), value
    if affinity is None:
        affinity = np.zeros((state.experts, state.experts))
    P = current.slots.size
    small = P * (P - 1) // 2 + current.experts * P <= exhaustive_below
    kicks_left, misses = kicks, 0
    queue: list[Move] = []
    fresh = False  # the queue was built on the current plan
    while stats.rounds < rounds:
        if evaluations is not None and stats.evaluated >= evaluations:
            break
        if deadline is not None and time.perf_counter() > deadline:
            stats.capped = True
            break
        stats.rounds += 1
        if small:
            part = neighbourhood(current)
            queue, fresh = [], True
        else:
            if not queue:
                if hasattr(cost, "screen"):
                    queue = cost.screen(current, rng, candidates * 2**misses)
                    if hasattr(cost, "prescreen"):
                        queue = cost.prescreen(current, queue)
                else:
                    loads = cost.loads() if hasattr(cost, "loads") else np.ones((1, current.gpus))
                    queue = screened_moves(current, affinity, loads, rng, candidates * 2**misses)
                fresh = True
            part = []
            while queue and len(part) < chunk:
                m = queue.pop(0)
                if current.valid(m):
                    part.append(m)
        if part:
            gains = _price(cost, current, part, deadline)
            if gains is None:  # the deadline fell while pricing a whole neighbourhood
                stats.capped = True
                break
            stats.evaluated += len(part)
            current, value, n, first = _try_moves(current, value, part, gains, cost, confirm, not small)
            if n:
                stats.moves += n
                stats.accepted.append((part[first].kind, stats.evaluated - len(part) + first))
                misses, fresh = 0, False
                if value < best_value - TOL:
                    best, best_value = current.copy(), value
                stats.trajectory.append(best_value)
                continue
        if queue or not fresh:
            continue  # more of this queue to price, or a stale queue used up: rebuild
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
        queue, fresh = [], False
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


def solve_exact(layer: JointLayer, *, time_limit: float | None = None, max_columns: int = 60_000) -> ExactResult:
    """The joint MILP of one layer (scipy's HiGHS).

    Binary ``y[e, g]`` (e held by g), ``sum_e y[e, g] <= W``, ``sum_g y[e, g] >= 1``; per
    workload and token pattern a continuous number of tokens on each routing (an assignment
    of the pattern's experts to GPUs), allowed only onto holders (``v <= tokens * y``);
    GPU loads minus an excess variable within ``(1 + eps)`` times the mean; objective the
    weighted distinct GPUs per token plus ``penalty`` per excess pair, as :class:`ExactCost`.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    check_exact_size(layer, max_columns)
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
                    cols += (base + rs).tolist() + [e * G + g]
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
                idx += (base + nz).tolist()
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
    options: dict[str, bool | float] = {"disp": False}
    if time_limit is not None:  # the model's build counts
        options["time_limit"] = max(float(time_limit) - (time.perf_counter() - t0), 0.05)
    # SciPy's HiGHS cannot be cancelled: on Ctrl-C the solve is left behind and the run stops
    res = run_interruptible(
        lambda: milp(
            c_vec,
            constraints=LinearConstraint(A, lo, hi),
            integrality=integrality,
            bounds=Bounds(np.zeros(n), ub),
            options=options,
        )
    )
    wall = time.perf_counter() - t0
    bound = getattr(res, "mip_dual_bound", None)
    if res.x is None:
        return ExactResult(None, None, None if bound is None else float(bound), "no_solution", wall)
    y = np.round(res.x[:ny]).reshape(E, G).astype(bool)
    slots = holds_to_slots(y, W)
    status = "optimal" if res.status == 0 else "time_limit"
    value = float(res.fun)
    return ExactResult(
        slots, value, float(bound) if bound is not None else (value if status == "optimal" else None), status, wall
    )


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
