"""A certificate for ``joint``: a lower bound on the distinct GPUs per token of any slot plan.

For a token with expert set ``T`` (``|T| = k``) and any plan (``S_g`` the distinct experts on
GPU ``g``), the GPUs ``U`` its dispatch uses hold its experts, so
``k <= sum_{g in U} |S_g ∩ T|``; every used GPU has ``|S_g ∩ T| >= 1`` and an unused one adds a
term ``>= 0``, hence

    distinct(T) = |U| >= k - sum_g (|S_g ∩ T| - 1)^+,

whatever the dispatch and the load. Summed over the tokens (weights ``w_t``), the saving
``sum_g v(S_g)`` with ``v(S) = sum_t w_t (|S ∩ T_t| - 1)^+`` is bounded by the LP (load limits and
the penalty dropped: a relaxation)

    max sum_S v(S) y_S   s.t.   sum_{S ni e} y_S >= 1 (each expert e),   sum_S y_S <= G,   y >= 0,

over columns ``S`` of at most ``W`` distinct experts (copies of one expert on one GPU add
nothing). It is solved by the package's column generation loop
(`moeopt.colgen.generate`) with `HypergraphPricer`; the Lagrangian (Farley) bound
``sum_e pi_e + G max(0, max_S v(S) - pi(S))`` with ``pi <= 0`` holds at every exact pricing, so
a cap on its work (or on the clock) leaves a valid bound. Exact pricing enumerates every
``W``-set by inclusion-exclusion
(``(c - 1)^+ = C(c,2) - C(c,3) + C(c,4)`` for ``c <= 4``) when ``W <= 4``; for larger ``W``
it bounds ``v`` by the pair value (``(c - 1)^+ <= C(c, 2)``) and prices that quadratic knapsack
exactly with the grouping's pricing.

A bound without column generation (`pair_saving_bound`) caps the saving when the
column generation is cut short before its first exact pricing (large layers): with
``A_ef = sum_{t ni e, f} w_t``, ``n_e = sum_{t ni e} w_t`` and ``top_e`` the sum of the ``W - 1``
largest ``A_ef`` over ``f``, every column satisfies both

    v(S) <= sum_{e<f in S} A_ef <= sum_{e in S} top_e / 2          ((c - 1)^+ <= C(c, 2))
    v(S) = sum_{e in S} sum_{t ni e} w_t (1 - 1/|S ∩ T_t|) <= sum_{e in S} (1 - 1/m) min(n_e, top_e)

(``m = min(W, k)``: a token counts for ``e`` only when another of its experts is in ``S``), so
the saving of a plan is at most the second per-expert terms summed over its ``G W`` slots
(each expert once, the spare slots on the largest terms: an expert is on at most ``G`` GPUs).
The first is summed exactly by the *pair LP* (`_pair_lp_bound`, a fractional b-matching):
with ``y_ef`` the GPUs holding both ``e`` and ``f`` and ``c_e`` those holding ``e``, every plan has
``y_ef <= min(c_e, c_f)``, ``sum_f y_ef <= (W - 1) c_e``, ``1 <= c_e <= G``, ``sum_e c_e <= G W``,
so ``max sum_{e<f} A_ef y_ef`` over that polytope bounds its saving. The smaller of the two is
the bound (on real DeepSeek-V3 layers of 256 experts on 64 GPUs, where the column generation
does not reach an exact pricing in seconds, it is within a few percent; milliseconds to a
second).

The bound on the mean distinct GPUs per token is ``(sum_t w_t k_t - LP) / sum_t w_t``, and never
less than ``sum_t w_t ceil(k_t / W) / sum_t w_t`` (a GPU holds at most ``W`` distinct experts: a
token of ``k`` experts with ``W < k`` uses at least two, whatever the plan); the
evaluator's remote GPUs per token under uniform token homes are ``distinct (1 - 1/G)`` (its
expectation over the home), and ``>= distinct - 1`` when homes are known.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from moeopt.colgen import RC_TOL, ColumnSpace, Master, Pricing, generate
from moeopt.colgen.pair_sdp import pair_sdp_saving_bound, pair_weights, pattern_sizes
from moeopt.colgen.pricing import PRICING_WORK, price_exact
from moeopt.grouping import LOAD_TOL, Grouping

#: exact pricing enumerates W-sets when there are at most this many
MAX_ENUMERATION = 3_000_000
#: W-sets scored per numpy chunk in the enumeration
CHUNK = 200_000
#: best sets of each chunk kept for the greedy packing of a whole plan
POOL = 4096
#: HiGHS iterations of each LP of the bound (the pair LP, the stay LP): their work budget
LP_ITERATIONS = 500_000
#: the column generation of `distinct_lower_bound` by default: ``COVER_WORK / (E M W)``
#: master LP solves (E experts, M token patterns, W slots per GPU: a round's heuristic pricing
#: costs about ``E M W``), at least ``COVER_MIN_ROUNDS`` and at most ``COVER_MAX_ROUNDS``. Small
#: layers (W <= 4, exact pricing by enumeration) get the rounds that prove their LP (E = 32, 8 GPUs
#: of 4 slots, top-6: 25 rounds, 2 s); large ones a few rounds, about what 3 s of the clock gave
#: them before (their bound comes from the pair LP)
COVER_WORK = 10_000_000
COVER_MIN_ROUNDS = 4
COVER_MAX_ROUNDS = 30
#: ... and within a load limit (single-copy plans) on layers whose columns exact pricing
#: enumerates (``C(E, W) <= MAX_ENUMERATION``), where the LP is the bound worth having and can be
#: proved: this many (the loop stops once the LP is solved). Measured on the joint benchmark's
#: layers without spare slots (64 experts, 16 GPUs x 4, 4 or 3 layers), the gap of `joint`'s plan
#: to the bound: deepseek-moe-16b 8.8 % at the rounds of `COVER_WORK` (5; the bound from the pair
#: LP), 3.4 % at 20, 2.6 % at 40 (every LP solved); moonlight-16b 2.4 %, count-sampled OLMoE
#: 3.3 % at 40 (solved), about 6 s per layer. Larger layers keep `COVER_WORK`'s rounds (256
#: experts on 64 GPUs: 24 rounds took 28 s a layer against 4 s, for the same bound)
COVER_LIMITED_ROUNDS = 60
#: heuristic pricing rounds between two exact pricings there
COVER_EXACT_EVERY = 5
#: work of each exact pricing there (`moeopt.colgen.pricing.price_exact`'s units)
COVER_PRICING_WORK = 5_000_000


def cover_rounds(experts: int, patterns: int, width: int, limited: bool = False) -> int:
    """The default master LP solves of `distinct_lower_bound` for a layer of ``experts``,
    ``patterns`` distinct top-k sets and ``width`` slots per GPU, ``limited`` to the columns within a
    load limit or not (see `COVER_WORK`, `COVER_LIMITED_ROUNDS`)."""
    if limited and math.comb(experts, min(width, experts)) <= MAX_ENUMERATION:
        return COVER_LIMITED_ROUNDS
    rounds = COVER_WORK / max(experts * patterns * width, 1)
    return int(min(max(round(rounds), COVER_MIN_ROUNDS), COVER_MAX_ROUNDS))


def token_patterns(topk: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted top-k sets ``[M, k]`` and their total weight ``[M]`` (tokens by default)."""
    sets = np.sort(np.asarray(topk, dtype=np.int64), axis=1)
    uniq, inv = np.unique(sets, axis=0, return_inverse=True)
    w = np.ones(len(sets)) if weights is None else np.asarray(weights, dtype=np.float64)
    return uniq, np.bincount(inv.reshape(-1), weights=w, minlength=len(uniq))


class HypergraphPricer:
    """Columns of at most ``width`` experts valued ``v(S) = sum_t w_t (|S ∩ T_t| - 1)^+``
    (a `moeopt.colgen.Pricer` for expert rows ``>= 1``: duals ``pi <= 0``).

    With ``load [E]`` and ``limit``, only columns whose load is at most ``limit`` are admissible
    (single-copy plans within a load limit: a GPU's load is the sum of its experts')."""

    full = False  # a column may be empty or smaller than width

    def __init__(
        self,
        patterns: np.ndarray,
        weights: np.ndarray,
        experts: int,
        width: int,
        load: np.ndarray | None = None,
        limit: float | None = None,
    ) -> None:
        self.patterns = np.asarray(patterns, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.experts = experts
        self.width = min(width, experts)
        self.limited = load is not None and limit is not None and math.isfinite(limit)
        self.load = np.zeros(experts) if load is None else np.asarray(load, dtype=np.float64)
        self.limit = float(limit) if limit is not None and self.limited else math.inf
        M, k = self.patterns.shape
        self.incidence = sp.csr_matrix(
            (np.ones(M * k), (np.repeat(np.arange(M), k), self.patterns.ravel())), shape=(M, experts)
        )
        self.incidence.sum_duplicates()
        self.incidence.data[:] = 1.0  # a repeated expert counts once
        self._tables: tuple | None = None
        self._combos: dict[int, np.ndarray] = {}  # every set of each size, once enumerated
        #: a ``time.perf_counter()`` value after which the heuristic's swap rounds stop (an outer
        #: cap of `distinct_lower_bound`; None: its rounds alone bound it)
        self.deadline: float | None = None

    # ----------------------------------------------------------------- values
    def value(self, groups: list[np.ndarray]) -> np.ndarray:
        """``v(S)`` of each group."""
        if not groups:
            return np.zeros(0)
        rows = np.repeat(np.arange(len(groups)), [len(s) for s in groups])
        cols = np.concatenate([np.asarray(s, dtype=np.int64) for s in groups])
        member = sp.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(len(groups), self.experts))
        counts = (member @ self.incidence.T).tocsr()  # [C, M]
        counts.data = np.maximum(counts.data - 1.0, 0.0)
        return np.asarray(counts @ self.weights).reshape(-1)

    @property
    def scale(self) -> float:
        """The largest single column value worth of a pair (tolerances are relative to it)."""
        return float(self.weights.max(initial=0.0))

    # ----------------------------------------------------------------- Pricer
    def project(self, pi: np.ndarray) -> np.ndarray:
        return np.minimum(pi, 0.0)

    def reduced(self, groups: list[np.ndarray], pi: np.ndarray) -> np.ndarray:
        if not groups:
            return np.zeros(0)
        return self.value(groups) - np.array([float(pi[s].sum()) for s in groups])

    def admissible(self, group: np.ndarray) -> bool:
        return 0 < len(group) <= self.width and float(self.load[group].sum()) <= self.limit + LOAD_TOL

    def _gains(self, member: np.ndarray, pi: np.ndarray) -> np.ndarray:
        """``[n, E]``: reduced value gained by adding each expert to each group (members: 0)."""
        counts = np.asarray(self.incidence @ member.T.astype(np.float64)).T  # [n, M]
        touched = (counts >= 1) * self.weights[None, :]
        gain = np.asarray(self.incidence.T @ touched.T).T - pi[None, :]
        return np.where(member, -np.inf, gain)

    @property
    def enumerates(self) -> bool:
        """Whether exact pricing enumerates every ``width``-set (then it is the heuristic too)."""
        return self.width <= 4 and math.comb(self.experts, self.width) <= MAX_ENUMERATION

    def heuristic(self, pi: np.ndarray, rounds: int = 4) -> list[np.ndarray]:
        """Greedy growth from every expert to ``width`` members (``pi <= 0``: every member pays),
        then swap rounds (drop one member, add the best other). Nothing when exact pricing
        enumerates: it costs about as much and proves a bound (the loop prices exactly then)."""
        if self.enumerates:
            return []
        return [s for s in self.greedy(pi, rounds) if self.admissible(s)]

    def greedy(self, pi: np.ndarray, rounds: int = 4) -> list[np.ndarray]:
        """The greedy + swap columns of `heuristic`."""
        E, Wd = self.experts, self.width
        n = E
        rows = np.arange(n)
        member = np.zeros((n, E), dtype=bool)
        member[rows, rows] = True
        for _ in range(Wd - 1):
            best = self._gains(member, pi).argmax(axis=1)
            member[rows, best] = True
        value = self._member_values(member, pi)
        for _ in range(rounds):
            if self.deadline is not None and time.perf_counter() > self.deadline:
                break
            improved = False
            for j in range(Wd):
                drop = np.sort(np.flatnonzero(member.ravel()).reshape(n, -1) % E, axis=1)[:, j]
                trial = member.copy()
                trial[rows, drop] = False
                gain = self._gains(trial, pi)
                gain[rows, drop] = -np.inf
                best = gain.argmax(axis=1)
                trial[rows, best] = True
                tv = self._member_values(trial, pi)
                better = tv > value + 1e-12 * max(self.scale, 1e-300)
                if better.any():
                    member[better], value[better] = trial[better], tv[better]
                    improved = True
            if not improved:
                break
        order = np.argsort(-value)
        seen: set[bytes] = set()
        out = []
        for i in order:
            key = np.packbits(member[i]).tobytes()
            if key not in seen:
                seen.add(key)
                out.append(np.flatnonzero(member[i]))
        return out

    def _member_values(self, member: np.ndarray, pi: np.ndarray) -> np.ndarray:
        counts = np.asarray(self.incidence @ member.T.astype(np.float64)).T
        return np.maximum(counts - 1.0, 0.0) @ self.weights - member @ pi

    def _lookup_tables(self) -> tuple:
        """Pair, triple and quadruple weights (``W2 [E, E]``, ``W3 [E, E, E]``, sorted quad keys)."""
        if self._tables is None:
            E = self.experts
            pats, w = self.patterns, self.weights
            k = pats.shape[1]
            W2 = np.zeros((E, E))
            enumerate_ = self.width <= 4 and math.comb(E, self.width) <= MAX_ENUMERATION
            W3 = np.zeros((E, E, E)) if self.width >= 3 and enumerate_ else None
            keys: np.ndarray = np.zeros(0, dtype=np.int64)
            kw: np.ndarray = np.zeros(0)
            for a, b in itertools.combinations(range(k), 2):
                np.add.at(W2, (pats[:, a], pats[:, b]), w)
            W2 = W2 + W2.T
            if W3 is not None:
                for a, b, c in itertools.combinations(range(k), 3):
                    np.add.at(W3, (pats[:, a], pats[:, b], pats[:, c]), w)
            if self.width >= 4 and k >= 4 and enumerate_:
                combos = list(itertools.combinations(range(k), 4))
                q = np.concatenate([_quad_key(pats[:, list(c)], E) for c in combos])
                keys, inv = np.unique(q, return_inverse=True)
                kw = np.bincount(inv.reshape(-1), weights=np.tile(w, len(combos)), minlength=len(keys))
            self._tables = (W2, W3, keys, kw)
        return self._tables

    def _sets_value(self, sets: np.ndarray) -> np.ndarray:
        """``v(S)`` of sorted sets ``[n, m]`` with ``m <= 4``, by inclusion-exclusion."""
        W2, W3, keys, kw = self._lookup_tables()
        m = sets.shape[1]
        value = np.zeros(len(sets))
        for a, b in itertools.combinations(range(m), 2):
            value += W2[sets[:, a], sets[:, b]]
        if m >= 3:
            for a, b, c in itertools.combinations(range(m), 3):
                value -= W3[sets[:, a], sets[:, b], sets[:, c]]
        if m == 4 and len(keys):
            q = _quad_key(sets, self.experts)
            pos = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
            value += np.where(keys[pos] == q, kw[pos], 0.0)
        return value

    def _sets_of(self, size: int) -> np.ndarray:
        """int ``[C(E, size), size]``: every set of ``size`` experts, sorted (cached)."""
        if size not in self._combos:
            it = itertools.combinations(range(self.experts), size)
            flat = np.fromiter(itertools.chain.from_iterable(it), dtype=np.int64)
            self._combos[size] = flat.reshape(-1, size)
        return self._combos[size]

    def exact(
        self,
        pi: np.ndarray,
        *,
        work: float = PRICING_WORK,
        deadline: float | None = None,
        hint: np.ndarray | None = None,
        seed: int = 0,
        threshold: float = 0.0,
        tolerance: float = 0.0,
        keep: int = 100,
        time_limit: float | None = None,
    ) -> Pricing:
        """A proved upper bound on ``max_S v(S) - pi(S)`` (``pi <= 0``) and the best sets found.

        ``pi <= 0`` makes the reduced value grow with ``S``, so a best set has ``width`` members
        (within a load limit, a best set may have fewer: every size is enumerated then).
        Enumeration of all of them when ``width <= 4`` and there are at most
        `MAX_ENUMERATION` (not cut by ``work``: at most a few tenths of a second);
        otherwise the pair relaxation priced exactly by
        `moeopt.colgen.price_exact` within the load limit in ``work`` units (its proved upper
        bound, unproven for ``v``; ``deadline``, or ``time_limit`` seconds from now, an outer
        wall-clock cap)."""
        del threshold, tolerance
        if (pi > 0).any():
            raise ValueError("hypergraph pricing needs duals pi <= 0 (expert rows >= 1)")
        E, Wd = self.experts, self.width
        if Wd <= 4 and math.comb(E, Wd) <= MAX_ENUMERATION:
            best: list[tuple[float, np.ndarray]] = []
            upper = 0.0  # the empty column
            pool: list[tuple[np.ndarray, np.ndarray]] = []
            per_value = np.full(E, -np.inf)
            per_size = np.zeros(E, dtype=np.int64)  # each expert's best set: its size and row
            per_row = np.zeros(E, dtype=np.int64)
            # within a load limit a best column may be smaller (no member fits any more)
            for size in range(Wd, 0, -1) if self.limited else (Wd,):
                combos = self._sets_of(size)
                for c in range(0, len(combos), CHUNK):
                    sets = combos[c : c + CHUNK]
                    rv = self._sets_value(sets) - pi[sets].sum(axis=1)
                    if self.limited:
                        rv = np.where(self.load[sets].sum(axis=1) <= self.limit + LOAD_TOL, rv, -np.inf)
                    upper = max(upper, float(rv.max()))
                    top = np.argsort(-rv)[:keep]
                    best.extend((float(rv[i]), sets[i].copy()) for i in top if np.isfinite(rv[i]))
                    best = sorted(best, key=lambda t: -t[0])[:keep]
                    top_pool = np.argpartition(-rv, min(POOL, len(rv)) - 1)[:POOL]
                    top_pool = top_pool[np.isfinite(rv[top_pool])]
                    pool.append((sets[top_pool], rv[top_pool]))
                    # the best set of each expert too: a fractional partition needs partners for the best
                    for j in range(size):
                        better = rv > per_value[sets[:, j]]
                        if better.any():
                            idx = np.flatnonzero(better)
                            order = idx[np.argsort(rv[idx], kind="stable")]  # last write wins: the largest
                            per_value[sets[order, j]] = rv[order]
                            per_size[sets[order, j]] = size
                            per_row[sets[order, j]] = c + order
            keys = {(int(z), int(r)) for z, r, v in zip(per_size, per_row, per_value, strict=True) if np.isfinite(v)}
            own = [self._sets_of(z)[r].copy() for z, r in sorted(keys)]
            packed = _pack(pool, E)
            return Pricing([s for _, s in best] + own, upper, True, "enumerate", packed)
        # the pair relaxation: v(S) <= sum of pair weights inside S, priced exactly (an upper bound)
        W2 = self._lookup_tables()[0]
        problem = Grouping(graph=W2, load=self.load, groups=1, cap=Wd, load_limit=self.limit)
        pr = price_exact(problem, pi, work=work, deadline=deadline, time_limit=time_limit, hint=hint, seed=seed)
        found = [s for s in self.greedy(pi) if self.admissible(s)][:keep]
        return Pricing(found, max(pr.upper, 0.0), False, f"pair-{pr.kind}", capped=pr.capped)


def _pack(pool: list[tuple[np.ndarray, np.ndarray]], E: int) -> list[np.ndarray]:
    """Disjoint sets from ``pool`` (``(sets [n, m], values [n])`` chunks), best value first
    (greedy), the experts left over in groups of the largest size: a whole plan around the best
    column, so that the master (a fractional partition when ``G W = E``) can use it (the caller
    keeps the admissible ones)."""
    sets = [s for chunk, _ in pool for s in chunk]
    value = np.concatenate([v for _, v in pool]) if pool else np.zeros(0)
    used = np.zeros(E, dtype=bool)
    out = []
    for i in np.argsort(-value, kind="stable"):
        if not used[sets[i]].any():
            out.append(sets[i].copy())
            used[sets[i]] = True
            if used.all():
                break
    rest = np.flatnonzero(~used)  # experts no good set took: groups of the same size
    size = max((len(s) for s in sets), default=1)
    return out + [rest[i : i + size] for i in range(0, len(rest), size)]


def _quad_key(sets: np.ndarray, E: int) -> np.ndarray:
    s = np.sort(sets, axis=1)
    return ((s[:, 0] * E + s[:, 1]) * E + s[:, 2]) * E + s[:, 3]


@dataclass(frozen=True, eq=False)
class JointBound:
    """What `distinct_lower_bound` proved for one layer.

    Attributes
    ----------
    distinct
        Lower bound on the mean distinct GPUs per token of every slot plan (any dispatch).
    saving
        The LP bound: at most this much weighted ``sum_g (|S_g ∩ T| - 1)^+`` in any plan.
    lp_value
        Last restricted master LP value (the LP optimum lies in ``[lp_value, saving]``).
    proven
        Whether the LP was solved (the bound is then the LP optimum).
    seconds, iterations, columns
        Wall time, master LP solves, columns generated.
    info
        The loop's counters.
    """

    distinct: float
    saving: float
    lp_value: float | None
    proven: bool
    seconds: float
    iterations: int
    columns: int
    info: dict = field(default_factory=dict)


def pair_saving_bound(
    pats: np.ndarray,
    w: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    load: np.ndarray | None = None,
    load_limit: float | None = None,
    *,
    iterations: int | None = LP_ITERATIONS,
    time_limit: float | None = None,
    report: dict | None = None,
) -> float:
    """An upper bound on the saving ``sum_g v(S_g)`` of every plan of ``gpus x width`` slots, from
    the token patterns ``pats [M, k]`` (sorted, `token_patterns`) and their weights ``w``:
    the smaller of the pair (b-matching) LP and the star bound of the module notes.

    With ``load`` and ``load_limit``: of every single-copy plan within the limit; the pair LP
    then has every copy count 1 and, per expert e, ``sum_f load_f y_ef <= limit - load_e`` (the
    experts sharing e's GPU fit beside it).

    The pair LP gets ``iterations`` HiGHS iterations (its work budget) and ``time_limit`` seconds
    (an outer cap); when it is not solved within them the star bound alone is returned, and
    ``report`` (a dict, if given) gets ``pair_lp`` (``solved``, ``iteration_limit`` or
    ``time_limit``)."""
    E = experts
    report = {} if report is None else report
    report["pair_lp"] = "solved"
    if len(pats) == 0 or E == 0 or width <= 1:
        return 0.0
    pair = pair_weights(pats, w, E)
    n = pair.diagonal()
    upper = sp.triu(pair, k=1).tocoo()
    A = pair.toarray()
    np.fill_diagonal(A, 0.0)
    keep = min(width - 1, E)  # the W - 1 largest pair weights of every expert
    top = np.partition(A, E - keep, axis=1)[:, E - keep :].sum(axis=1)
    m = min(width, int(pattern_sizes(pats).max()))
    per = (1.0 - 1.0 / max(m, 1)) * np.minimum(n, top)
    spare = gpus * width - E
    extra = np.sort(np.repeat(per, max(gpus - 1, 0)))[::-1][: max(spare, 0)]  # an expert on at most G GPUs
    star = float(per.sum() + extra.sum())
    lp, capped = _pair_lp_bound(
        upper.row, upper.col, upper.data, E, gpus, width, load, load_limit, iterations, time_limit
    )
    if lp is None:
        report["pair_lp"] = "time_limit" if capped else "iteration_limit"
    return star if lp is None else min(star, lp)


def _pair_lp_bound(
    e: np.ndarray,
    f: np.ndarray,
    a: np.ndarray,
    E: int,
    G: int,
    W: int,
    load: np.ndarray | None = None,
    limit: float | None = None,
    iterations: int | None = None,
    time_limit: float | None = None,
) -> tuple[float | None, bool]:
    """The pair LP of the module notes, ``max sum_{e<f} A_ef y_ef``, as a valid bound (None when
    HiGHS does not solve it within ``iterations`` and ``time_limit``; and whether the time limit
    stopped it): `_lp_upper_bound` over the polytope of
    `_copy_graph_rows` on the experts of one layer, with ``sum_f y_ef <= (W - 1) c_e``
    (``c_e = 1`` without spare slots: a fractional b-matching; within a load limit, single copy:
    ``c_e = 1`` and the partners' load fits beside e)."""
    if a.size == 0:
        return 0.0, False
    group = np.zeros(E, dtype=np.int64)
    if load is not None and limit is not None and math.isfinite(limit):
        load = np.asarray(load, dtype=np.float64)
        rows = _copy_graph_rows(e, f, group, W - 1.0, G, W, False, load, limit - load)
    else:
        rows = _copy_graph_rows(e, f, group, W - 1.0, G, W, G * W > E)
    A_ub, b_ub, lo, hi = rows
    report: dict = {}
    value = _lp_upper_bound(np.r_[a, np.zeros(len(lo) - a.size)], A_ub, b_ub, lo, hi, iterations, time_limit, report)
    return value, bool(report["capped"])


def _copy_graph_rows(
    u: np.ndarray,
    v: np.ndarray,
    group: np.ndarray,
    degree: float,
    G: int,
    W: int,
    spare: bool,
    load: np.ndarray | None = None,
    budget: np.ndarray | None = None,
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """The rows ``A_ub x <= b_ub`` and boxes ``lo <= x <= hi`` of every plan's edge counts:
    ``x`` is ``y`` (one per edge ``(u_i, v_i)``: the GPUs holding both ends), then with ``spare``
    slots the copy count ``c`` of every node.

    With ``spare`` slots every node has a copy count ``c`` in ``[1, G]``, at most ``G W`` per
    group, and ``y_i <= c_u, c_v``, ``sum_{i at x} y_i <= degree c_x``, ``y_i <= G``; without,
    every ``c = 1``: ``y_i <= 1`` and ``sum_{i at x} y_i <= degree``. With ``load [N]`` and
    ``budget [N]`` (single-copy plans within load limits): also, per node x, the load of the
    nodes sharing its GPU, ``sum_{i at x} load_{other end} y_i <= budget_x``.
    """
    n, N = u.size, group.size
    ar = np.arange(n)
    if not spare:
        A_ub = sp.csr_matrix((np.ones(2 * n), (np.r_[u, v], np.r_[ar, ar])), shape=(N, n))
        b_ub = np.full(N, float(degree))
        if load is not None and budget is not None:
            rows = sp.csr_matrix((np.r_[load[v], load[u]], (np.r_[u, v], np.r_[ar, ar])), shape=(N, n))
            A_ub = sp.vstack([A_ub, rows]).tocsr()
            b_ub = np.r_[b_ub, np.maximum(np.asarray(budget, dtype=np.float64), 0.0) + LOAD_TOL]
        return A_ub.tocsr(), b_ub, np.zeros(n), np.ones(n)
    node = n + np.arange(N)  # the copy count's column of every node
    nv = n + N
    deg = sp.csr_matrix(
        (np.r_[np.ones(2 * n), np.full(N, -float(degree))], (np.r_[u, v, np.arange(N)], np.r_[ar, ar, node])),
        shape=(N, nv),
    )
    link = [
        sp.csr_matrix((np.r_[np.ones(n), -np.ones(n)], (np.r_[ar, ar], np.r_[ar, node[x]])), shape=(n, nv))
        for x in (u, v)
    ]
    groups = int(group.max()) + 1
    total = sp.csr_matrix((np.ones(N), (group, node)), shape=(groups, nv))
    A_ub = sp.vstack([deg, *link, total]).tocsr()
    b_ub = np.r_[np.zeros(N + 2 * n), np.full(groups, float(G * W))]
    return A_ub, b_ub, np.r_[np.zeros(n), np.ones(N)], np.full(nv, float(G))


def _lp_upper_bound(
    obj: np.ndarray,
    A_ub: sp.csr_matrix,
    b_ub: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    iterations: int | None = None,
    time_limit: float | None = None,
    report: dict | None = None,
    method: str = "highs",
) -> float | None:
    """``max obj x`` s.t. ``A_ub x <= b_ub``, ``lo <= x <= hi``, as a valid upper bound: the
    Lagrangian value ``lam b + sum_j max(r_j lo_j, r_j hi_j)`` (``r = obj - A^T lam``) at HiGHS's
    duals ``lam >= 0`` (any such ``lam`` gives a bound, so solver tolerances cannot make it too
    small). None when HiGHS does not solve the LP within ``iterations`` (its work budget: the same
    answer on any machine) or ``time_limit`` seconds (an outer cap); ``report`` (a dict, if
    given) gets ``capped``: whether the time limit stopped HiGHS. ``method``: SciPy's HiGHS
    method (``highs``: HiGHS's choice, a simplex; ``highs-ipm``: its interior point method)."""
    report = {} if report is None else report
    from scipy.optimize import linprog

    options: dict[str, float | int] = {}
    if iterations is not None:
        options["maxiter"] = max(int(iterations), 1)
    if time_limit is not None:
        options["time_limit"] = max(float(time_limit), 0.01)
    res = linprog(-obj, A_ub=A_ub, b_ub=b_ub, bounds=np.c_[lo, hi], method=method, options=options)
    report["capped"] = res.status != 0 and "time limit" in str(res.message).lower()
    if res.status != 0:
        return None
    lam = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    red = obj - A_ub.T @ lam
    return float(lam @ b_ub + np.maximum(red * lo, red * hi).sum())


def stay_upper_bound(
    prev_top1: np.ndarray,
    topk: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    loads: tuple[np.ndarray, np.ndarray] | None = None,
    load_limits: tuple[float, float] | None = None,
    time_limit: float | None = None,
    *,
    iterations: int | None = LP_ITERATIONS,
    report: dict | None = None,
) -> float:
    """Under ``token_home: previous-layer``: an upper bound on the share of the tokens whose home
    (the GPU that served their top-1 expert ``prev_top1 [N]`` at the previous layer) holds one of
    their experts ``topk [N, k]`` at this layer, for every pair of plans of ``gpus x width`` slots.

    With ``z_ef`` the GPUs holding ``e`` at the previous layer and ``f`` at this one, a token of
    previous top-1 ``e`` stays only if some ``z_ef >= 1`` among its experts ``f``, and at most once:
    its share ``s <= min(1, sum_f z_ef)`` (tokens with the same ``e`` and experts share one ``s``);
    every pair of plans has ``sum_f z_ef <= W c_e``, ``sum_e z_ef <= W d_f``,
    ``z_ef <= min(c_e, d_f)`` (``c``, ``d``: each layer's copies, in ``[1, G]``, at most ``G W``
    in all; all 1 without spare slots). The LP over that polytope (`_stay_lp`), at most 1.
    (Weighting each pair by its tokens instead, ``sum B_ef z_ef``, counts a token once per expert
    beside its home: on the crosslayer benchmark's 64 GPUs x 128 experts, dependency 0.9, it read 1
    at every layer where this reads 0.79-0.86.)

    With ``loads`` (the previous layer's expert loads, this layer's) and ``load_limits`` (their
    largest GPU loads): for every pair of single-copy plans within the limits; then every copy
    count is 1 and the experts beside e at this layer fit in this layer's limit,
    ``sum_f load_f z_ef <= limit``, and likewise the previous-layer experts beside f.

    ``iterations``: HiGHS iterations for that LP (over token patterns, the larger; its work
    budget, so that the bound is the same on any machine), ``time_limit`` seconds an outer cap;
    when HiGHS does not solve it within them, the per-pair LP (``sum B_ef z_ef``, looser and
    quicker, within the same limits, solved first) is the bound. ``report`` (a dict, if given) gets
    ``stay_lp``: ``patterns`` (the LP above), ``pairs`` (the per-pair LP), ``none`` (neither: the
    bound is 1), and ``capped`` (whether the time limit stopped one).
    """
    report = {} if report is None else report
    report.update(stay_lp="patterns", capped=False)
    t0 = time.perf_counter()
    prev = np.asarray(prev_top1, dtype=np.int64)
    ids = np.asarray(topk, dtype=np.int64)
    N = len(prev)
    if N == 0:
        return 0.0
    E, G, W = experts, gpus, width
    key = np.unique((np.arange(N)[:, None] * E + prev[:, None]) * E + ids)  # (token, e, f), each once
    nz = np.unique(key % (E * E))  # the (e, f) pairs some token has
    e, f = nz // E, nz % E
    # nodes: the previous layer's experts (0..E-1), then this layer's (E..2E-1)
    group = np.repeat(np.arange(2), E)
    if loads is not None and load_limits is not None and all(math.isfinite(x) for x in load_limits):
        node_load = np.r_[np.asarray(loads[0], dtype=np.float64), np.asarray(loads[1], dtype=np.float64)]
        # a previous-layer expert's partners are this layer's experts, and the other way round
        budget = np.r_[np.full(E, float(load_limits[1])), np.full(E, float(load_limits[0]))]
        A_z, b_z, lo_z, hi_z = _copy_graph_rows(e, E + f, group, float(W), G, W, False, node_load, budget)
    else:
        A_z, b_z, lo_z, hi_z = _copy_graph_rows(e, E + f, group, float(W), G, W, G * W > E)
    polytope = (A_z, b_z, lo_z, hi_z)
    # first the per-pair LP (each pair weighted by its tokens: counts a token per expert; a
    # fraction of a second), so that a cap that stops the larger LP still leaves its bound
    B = np.bincount(key % (E * E), minlength=E * E)[nz].astype(np.float64)
    first: dict = {}
    ub = _lp_upper_bound(np.r_[B, np.zeros(len(lo_z) - B.size)], *polytope, iterations, time_limit, first)
    pairs = 1.0 if ub is None else min(1.0, max(ub, 0.0) / N)
    left = None if time_limit is None else max(time_limit - (time.perf_counter() - t0), 0.01)
    share, capped = _stay_lp(prev, ids, E, nz, polytope, iterations, left)
    report["capped"] = capped or first["capped"]
    if share is None or pairs < share:  # not solved in its budget (or, rarely, looser)
        report["stay_lp"] = "none" if ub is None else "pairs"
        return pairs
    return share


def _stay_lp(
    prev: np.ndarray,
    ids: np.ndarray,
    E: int,
    pairs: np.ndarray,
    polytope: tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray],
    iterations: int | None = None,
    time_limit: float | None = None,
) -> tuple[float | None, bool]:
    """The staying share's LP: a token stays at most once, and only if one of its pairs
    ``(e, f)`` (previous top-1, expert here) shares a GPU, so per pattern p (``e`` and its set of
    ``f``; tokens with the same pattern share it) ``s_p <= 1`` and ``s_p <= sum_{f in p} z_ef``,
    with ``z`` (the sorted keys ``pairs = e E + f``) in ``polytope`` (`_copy_graph_rows`);
    ``max sum_p w_p s_p / N``, as a valid bound (at most 1); None when HiGHS does not solve it
    within ``iterations`` and ``time_limit`` (and whether the time limit stopped it)."""
    N = len(prev)
    A_z, b_z, lo_z, hi_z = polytope
    pats, w = np.unique(np.c_[prev, np.sort(ids, axis=1)], axis=0, return_counts=True)
    P, nz = len(pats), A_z.shape[1]
    col = np.searchsorted(pairs, pats[:, :1] * E + pats[:, 1:])  # every (e, f) of a token is a pair
    once = np.ones(col.shape, dtype=bool)
    once[:, 1:] = pats[:, 2:] != pats[:, 1:-1]  # an expert repeated in a row counts once
    row = np.repeat(np.arange(P), once.sum(axis=1))
    link = sp.csr_matrix(
        (np.r_[np.ones(P), -np.ones(row.size)], (np.r_[np.arange(P), row], np.r_[nz + np.arange(P), col[once]])),
        shape=(P, nz + P),
    )
    A = sp.vstack([sp.hstack([A_z, sp.csr_matrix((A_z.shape[0], P))]), link]).tocsr()
    report: dict = {}
    ub = _lp_upper_bound(
        np.r_[np.zeros(nz), w.astype(np.float64)],
        A,
        np.r_[b_z, np.zeros(P)],
        np.r_[lo_z, np.zeros(P)],
        np.r_[hi_z, np.ones(P)],
        iterations,
        time_limit,
        report,
        method="highs-ipm",  # interior point: 0.9 s where the simplex takes 16 s (8192 tokens, 64 experts)
    )
    return (None if ub is None else min(1.0, max(ub, 0.0) / N)), bool(report["capped"])


@threadpool_limits.wrap(limits=1, user_api="blas")
def distinct_lower_bound(
    topk: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    *,
    time_limit: float | None = None,
    rounds: int | None = None,
    exact_every: int = COVER_EXACT_EVERY,
    pricing_work: float = COVER_PRICING_WORK,
    lp_iterations: int | None = LP_ITERATIONS,
    weights: np.ndarray | None = None,
    start_slots: np.ndarray | None = None,
    seed: int = 0,
    smoothing: float = 0.8,
    log: Callable[[str], None] | None = None,
    load: np.ndarray | None = None,
    load_limit: float | None = None,
    sdp: bool = True,
) -> JointBound:
    """Lower bound on the mean distinct GPUs per token of one layer's tokens ``topk [N, k]`` for
    every plan of ``gpus x width`` slots holding each of ``experts`` experts at least once (with
    ``load`` and ``load_limit``: every single-copy plan whose GPU loads are within the limit).

    Parameters
    ----------
    topk
        int ``[N, k]``: each token's experts.
    experts, gpus, width
        E, G and W (slots per GPU).
    time_limit
        Outer wall-clock cap in seconds (None: none); the bound is valid whenever it stops, and
        ``info["capped"]`` says whether the cap, not the work budgets, stopped some part of it
        (then the bound depends on the machine's speed).
    rounds, exact_every, pricing_work
        The column generation's work budgets (`moeopt.colgen.generate`): master LP solves
        (None: `cover_rounds` of the layer's size, more within a load limit), heuristic rounds between exact pricings,
        work of an exact pricing.
    lp_iterations
        HiGHS iterations of the pair LP (`pair_saving_bound`).
    weights
        Optional token weights ``[N]`` (default 1: the plain mean over tokens).
    start_slots
        Optional ``[G, W]`` plan (-1 empty) whose GPUs seed the master.
    seed, smoothing, log
        Exact pricing's seed; Wentges dual smoothing (as `moeopt.colgen.generate`); a sink
        for one line per exact pricing.
    load, load_limit
        Optional expert loads ``[E]`` and the largest GPU load: columns (GPU contents) are then
        only the sets within the limit, so the bound holds for single-copy plans within it (a
        GPU's load is the sum of its experts'), not for plans with copies, whose loads depend
        on the dispatch. Used only when ``start_slots`` is such a plan (it makes the master
        feasible); otherwise the limit is dropped (a valid, looser bound).
    sdp
        Also bound the saving by the semidefinite relaxation of
        `moeopt.colgen.pair_sdp.pair_sdp_saving_bound` (up to `SDP_MAX_EXPERTS` experts, with the
        ``sdp`` extra's CVXPY; seconds at 64 experts; at most half of ``time_limit``): the one cap
        above the trivial bound with spare slots on the joint benchmark's layers (count-sampled
        OLMoE, 1 spare slot per GPU: 5.04 distinct GPUs per token on the first layer, against 4.36
        from the pair LP). Not within a load limit: the limited columns are far stronger there
        (the crosslayer benchmark's 16-GPU cell: the LP solved at 4.7 % from the plan, the
        semidefinite cap taking half of the time left it at 6.5 %).
    """
    t0 = time.perf_counter()
    topk = np.asarray(topk, dtype=np.int64)
    if topk.ndim != 2:
        raise ValueError(f"topk: expected [tokens, k], got shape {topk.shape}")
    if gpus * width < experts:
        raise ValueError(f"{gpus} GPUs x {width} slots cannot hold {experts} experts")
    pats, w = token_patterns(topk, weights)
    total = float(w.sum())
    if total <= 0 or experts == 0:
        return JointBound(0.0, 0.0, 0.0, True, time.perf_counter() - t0, 0, 0)
    ksize = pattern_sizes(pats)
    need = float(ksize @ w)  # sum_t w_t k_t
    limited = (
        load is not None
        and load_limit is not None
        and start_slots is not None
        and _within(np.asarray(start_slots), np.asarray(load, dtype=np.float64), load_limit, experts)
    )
    if not limited:  # no limit, or a start plan over it: the bound for every plan
        load = load_limit = None
    pricer = HypergraphPricer(pats, w, experts, width, load, load_limit)
    pricer.deadline = None if time_limit is None else t0 + time_limit
    # every token uses at least ceil(k / W) GPUs (a GPU holds at most W distinct experts)
    least = float(np.ceil(ksize / max(width, 1)) @ w)
    trivial = need - least
    if min(width, experts) <= 1 or trivial <= 0:
        return JointBound(max(need, least) / total, 0.0, 0.0, True, time.perf_counter() - t0, 0, 0)
    deadline = None if time_limit is None else t0 + time_limit
    lp_report: dict = {}
    pair = pair_saving_bound(
        pats,
        w,
        experts,
        gpus,
        width,
        load,
        load_limit,
        iterations=lp_iterations,
        time_limit=time_limit,
        report=lp_report,
    )
    sdp_report: dict = {}
    # at most half of what is left under a cap: the column generation gets the rest
    left = None if deadline is None else max(0.5 * (deadline - time.perf_counter()), 0.05)
    semidefinite = (
        pair_sdp_saving_bound(pats, w, experts, gpus, width, time_limit=left, report=sdp_report)
        if sdp and not limited
        else math.inf
    )
    master = Master(ColumnSpace(experts, gpus, "cover", pricer.value))
    chunks = [np.arange(e, min(e + width, experts)) for e in range(0, experts, width)]
    # ceil(E / W) <= G columns covering every expert: the master is feasible (within a load
    # limit, the start plan's GPUs are)
    master.add([c for c in chunks if pricer.admissible(c)])
    if start_slots is not None:
        master.add([u for r in np.asarray(start_slots) if len(u := np.unique(r[r >= 0]))])
    gen = generate(
        master,
        pricer,
        bound=trivial,
        kind="trivial",
        rounds=cover_rounds(experts, len(pats), width, limited) if rounds is None else rounds,
        exact_every=exact_every,
        pricing_work=pricing_work,
        deadline=deadline,
        tol=RC_TOL * max(pricer.scale, 1e-12),
        smoothing=smoothing,
        seed=seed,
        t0=t0,
        log=log,
    )
    saving = min(gen.bound, trivial, pair, semidefinite)
    # which cap is the bound: the trivial one on a tie (nothing proved beyond it)
    kind = min(
        (("trivial", trivial), ("sdp", semidefinite), ("pair", pair), (gen.kind, gen.bound)),
        key=lambda kv: kv[1],
    )[0]
    return JointBound(
        distinct=max(need - saving, least) / total,
        saving=saving,
        lp_value=gen.lp_value,
        proven=gen.proven,
        seconds=time.perf_counter() - t0,
        iterations=gen.iterations,
        columns=len(master.groups),
        info=dict(
            gen_kind=kind,
            pair_saving=pair,
            sdp_saving=semidefinite,
            load_limited=limited,
            pair_lp=lp_report["pair_lp"],
            pair_sdp=sdp_report.get("pair_sdp", "off"),
            capped=gen.capped or lp_report["pair_lp"] == "time_limit" or sdp_report.get("pair_sdp") == "capped",
        ),
    )


def _within(slots: np.ndarray, load: np.ndarray, limit: float, experts: int) -> bool:
    """Whether ``slots [G, W]`` (-1 empty) is a single-copy plan of every expert with each GPU's
    load at most ``limit``."""
    held = slots[slots >= 0]
    if len(held) != experts or len(np.unique(held)) != experts:
        return False
    gpu_load = np.where(slots >= 0, load[np.maximum(slots, 0)], 0.0).sum(axis=1)
    return bool((gpu_load <= limit + LOAD_TOL).all())


def remote_lower_bound(distinct: float, gpus: int, uniform_homes: bool, stay: float = 1.0) -> float:
    """Remote GPUs per token from a bound on distinct ones: ``distinct (1 - 1/G)`` under uniform
    token homes (the evaluator's expectation), else ``distinct - stay`` (the home saves one GPU,
    for at most the share ``stay`` of the tokens whose home can hold one of their experts:
    `stay_upper_bound`)."""
    return distinct * (1.0 - 1.0 / gpus) if uniform_homes else max(distinct - stay, 0.0)
