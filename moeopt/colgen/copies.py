"""A certificate for plans with a few copies within a load limit: the *flagged* covering LP.

`moeopt.colgen.cover` bounds the distinct GPUs per token of a plan by the saving
``sum_g v(S_g)``, ``v(S) = sum_t w_t (|S ∩ T_t| - 1)^+``; within a load limit it restricts the
columns to the GPU contents whose load fits, which is right only when every expert has one copy
(a GPU's load is then the sum of its experts'). With spare slots (``s = G W - E > 0``: 60 experts
on 16 GPUs x 4, say) a plan may hold copies, whose load the dispatch splits, and the bound had to
drop the limit: every plan, at any load, far below what a plan within the limit can reach.

Here a column is a GPU's content ``S`` with the members ``M ⊆ S`` that have other copies
("flagged") and the load ``sigma_e`` each flagged member serves there. Every plan within the limit
``Lam`` (largest GPU load, in the units of the expert loads ``u``) under any dispatch gives, per GPU,
such a column with

* the single-copy members' load plus the flagged ones' ``sigma`` at most ``Lam``
  (a single-copy expert serves all its load on its one GPU),

and its columns satisfy the rows (``y_j``: how many GPUs take column ``j``)

    (a) sum_j [e single in j] + 1/2 sum_j [e flagged in j] >= 1      every expert is held
    (b) sum_j [e single in j] <= 1                                   a single copy is on one GPU
    (c) sum_j y_j <= G
    (d) sum_j ([e single in j] u_e + [e flagged in j] sigma_e) >= u_e  its load is served
    (e) sum_j |M_j| <= 2 s                                           copies: each flagged expert
                                                                     has >= 2 of them, >= 1 spare

(a flagged expert has at least two copies, each flagged; ``E - #single`` flagged experts hold
at least ``2 (E - #single)`` slots of ``E + s``). The saving of any dispatch is at most
``sum_g v(S_g)`` (its GPUs serve subsets of what they hold), so the LP

    max sum_j v(S_j) y_j   over (a) - (e),  y >= 0

bounds the saving of every plan with copies within the limit, and ``(sum_t w_t k_t - LP) /
sum_t w_t`` bounds its distinct GPUs per token. It is solved by column generation; pricing
enumerates every set of at most ``W`` experts and every flag mask of it (exact when
`flagged_columns` is at most `MAX_FLAGGED`: ``W <= 4`` and some 60 experts), the best ``sigma``
of a (set, mask) being a fractional knapsack (the flagged members by their load dual, into the
room the single members leave). The Lagrangian (Farley) bound
``sum_r lambda_r b_r + G max(0, max_j rc_j)`` holds at every exact pricing, for any duals
``lambda >= 0``, so a cap on rounds (or on the clock) leaves a valid bound.

Where it helps: layers with a few spare slots. On qwen1.5-moe's first layer (60 experts on
16 x 4, 4 spare slots, three experts each above the limit alone, so copied in every plan within
it) it proves 2.93 remote GPUs per token against `joint`'s 3.35 (12.5 %) where the bound over
every plan is 2.16 (35 %). A copy is credited on every GPU that holds it (``v`` counts the
flagged members for every token), so with many spare slots (one per GPU) it is weak: the
flags let a hot expert sit beside every partner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from moeopt.colgen.cover import HypergraphPricer, JointBound, pattern_sizes, token_patterns
from moeopt.grouping import LOAD_TOL

#: exact pricing enumerates (set, flag mask) pairs: layers with at most this many get the bound
MAX_FLAGGED = 12_000_000
#: master LP solves by default (the loop stops once the LP is solved)
COPIES_ROUNDS = 60
#: pool-priced rounds between two exact pricings
COPIES_EXACT_EVERY = 4
#: (set, mask) pairs kept from each exact pricing and priced in the rounds between
POOL_SIZE = 60_000
#: columns added per round at most
ADD_PER_ROUND = 600
#: HiGHS iterations of each master LP (its work budget)
MASTER_ITERATIONS = 200_000


def flagged_columns(experts: int, width: int) -> int:
    """The (set, flag mask) pairs an exact pricing enumerates: ``sum_{z <= W} C(E, z) 2^z``."""
    return sum(math.comb(experts, z) * 2**z for z in range(1, min(width, experts) + 1))


def applies(experts: int, gpus: int, width: int) -> bool:
    """Whether `copies_lower_bound` serves a layer: spare slots, and exact pricing by enumeration
    (`flagged_columns` <= `MAX_FLAGGED`)."""
    return gpus * width > experts and width <= 4 and flagged_columns(experts, width) <= MAX_FLAGGED


class _Columns:
    """The master's columns (members, flags, each flagged member's served load, value), each with
    its entries in the master's ``<=`` rows (`copies_lower_bound`'s rows (a) - (e)), built once."""

    def __init__(self, load: np.ndarray) -> None:
        self.load = load
        self.members: list[np.ndarray] = []
        self.value: list[float] = []
        self.keys: set[tuple[bytes, bytes, bytes]] = set()
        self._rows: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []

    def add(self, members: np.ndarray, flags: np.ndarray, sigma: np.ndarray, value: float) -> bool:
        """Add the column unless it is empty or already there; whether it was added."""
        order = np.argsort(members)
        m, f, s = members[order], flags[order], sigma[order]
        key = (m.tobytes(), f.tobytes(), np.round(s, 12).tobytes())
        if len(m) == 0 or key in self.keys:
            return False
        E = len(self.load)
        single, flagged = m[~f], m[f]
        self.keys.add(key)
        self.members.append(m)
        self.value.append(float(value))
        self._rows.append(np.r_[single, E + single, 2 * E + 1 + single, flagged, 2 * E + 1 + flagged, 2 * E, 3 * E + 1])
        ones = np.ones(len(single))
        self._vals.append(np.r_[-ones, ones, -self.load[single], np.full(len(flagged), -0.5), -s[f], 1.0, len(flagged)])
        return True

    def matrix(self, rows: int) -> sp.csr_matrix:
        """The columns' entries in the master's rows."""
        cols = np.repeat(np.arange(len(self._rows)), [len(r) for r in self._rows])
        data = (np.concatenate(self._vals), (np.concatenate(self._rows), cols))
        return sp.csr_matrix(data, shape=(rows, len(self._rows)))


class _Enumeration:
    """Every set of at most ``W`` experts, its value and, per flag mask, the sets whose single
    members fit the limit (precomputed once: pricing then only adds the duals)."""

    def __init__(self, pricer: HypergraphPricer, load: np.ndarray, limit: float, deadline: float | None) -> None:
        self.parts = []
        self.capped = False  # the deadline passed before every set was valued: no exact pricing
        for z in range(1, pricer.width + 1):
            if deadline is not None and time.perf_counter() > deadline:
                self.capped = True
                return
            sets = pricer._sets_of(z)
            value = pricer._sets_value(sets) if z >= 2 else np.zeros(len(sets))
            U = load[sets]
            for mask in range(1 << z):
                if deadline is not None and time.perf_counter() > deadline:
                    self.capped = True
                    return
                flag = np.array([(mask >> i) & 1 for i in range(z)], dtype=bool)
                single = U[:, ~flag].sum(axis=1)
                ok = np.flatnonzero(single <= limit + LOAD_TOL)
                if len(ok):
                    self.parts.append((sets[ok], value[ok], flag, limit - single[ok]))


def _knapsack(room: np.ndarray, r: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the flagged members' served loads ``sigma`` (``[n, m]``, at most ``u``, in all at
    most ``room``, the largest duals ``r`` first, none at a dual <= 0) and their worth ``r sigma``."""
    n, m = r.shape
    sigma = np.zeros((n, m))
    if m == 0:
        return sigma, np.zeros(n)
    order = np.argsort(-r, axis=1, kind="stable")
    rs = np.take_along_axis(r, order, axis=1)
    us = np.take_along_axis(u, order, axis=1)
    left = np.maximum(room, 0.0).copy()
    taken = np.zeros((n, m))
    for i in range(m):
        take = np.where(rs[:, i] > 0, np.minimum(us[:, i], left), 0.0)
        taken[:, i] = take
        left -= take
    np.put_along_axis(sigma, order, taken, axis=1)
    return sigma, (taken * rs).sum(axis=1)


def _split(slots: np.ndarray, load: np.ndarray, limit: float) -> np.ndarray | None:
    """``[E, G]``: the start plan's split of each expert's load over its copies that lowers the
    largest GPU load most (`moeopt.dispatch.lp_layer_loads`), its flagged columns' served loads;
    None where even that split passes ``limit``."""
    from moeopt.dispatch import lp_layer_loads

    G = len(slots)
    holds = np.zeros((len(load), G), dtype=bool)
    g_of, w_of = np.nonzero(slots >= 0)
    holds[slots[g_of, w_of], g_of] = True
    loads, flow = lp_layer_loads(load[None, :], holds)
    return None if loads.max() > limit + LOAD_TOL else flow[0]


@threadpool_limits.wrap(limits=1, user_api="blas")
def copies_lower_bound(
    topk: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    load: np.ndarray,
    load_limit: float,
    start_slots: np.ndarray | None = None,
    *,
    rounds: int | None = None,
    exact_every: int = COPIES_EXACT_EVERY,
    time_limit: float | None = None,
    weights: np.ndarray | None = None,
    log: Callable[[str], None] | None = None,
) -> JointBound:
    """Lower bound on the mean distinct GPUs per token of one layer's tokens ``topk [N, k]`` for
    every plan of ``gpus x width`` slots holding each of ``experts`` experts at least once, copies
    included, whose GPU loads under its dispatch are at most ``load_limit`` (``load [E]``: the
    experts' loads, same units): the flagged covering LP of the module notes.

    Parameters
    ----------
    topk
        int ``[N, k]``: each token's experts.
    experts, gpus, width
        E, G and W; the layer must be one `applies` serves.
    load, load_limit
        The experts' loads and the largest GPU load.
    start_slots
        Optional ``[G, W]`` plan (-1 empty) within the limit: its GPUs (copies split as
        `moeopt.dispatch.lp_layer_loads` splits them, least largest load) seed the master.
    rounds, exact_every
        Master LP solves (None: `COPIES_ROUNDS`) and pool-priced rounds between exact pricings:
        the work budget; the loop stops once the LP is solved.
    time_limit
        Outer wall-clock cap in seconds; ``info["capped"]`` says whether it stopped the loop.
    weights
        Optional token weights ``[N]``.
    log
        A sink for one line per exact pricing.
    """
    from scipy.optimize import linprog

    t0 = time.perf_counter()
    E, G, W = experts, gpus, width
    if not applies(E, G, W):
        raise ValueError(f"the flagged LP needs spare slots and W <= 4 with few sets (E {E}, G {G}, W {W})")
    topk = np.asarray(topk, dtype=np.int64)
    u = np.asarray(load, dtype=np.float64)
    lam = float(load_limit)
    pats, w = token_patterns(topk, weights)
    total = float(w.sum())
    need = float(pattern_sizes(pats) @ w)
    least = float(np.ceil(pattern_sizes(pats) / max(min(W, E), 1)) @ w)
    if total <= 0:
        return JointBound(0.0, 0.0, 0.0, True, time.perf_counter() - t0, 0, 0)
    pricer = HypergraphPricer(pats, w, E, W)
    deadline = None if time_limit is None else t0 + time_limit
    enum = _Enumeration(pricer, u, lam, deadline)
    if enum.capped:  # the clock ran out before the sets were valued: the trivial bound
        return JointBound(
            least / total,
            need - least,
            None,
            False,
            time.perf_counter() - t0,
            0,
            0,
            {"gen_kind": "trivial", "capped": True},
        )
    spare = G * W - E
    cols = _Columns(u)
    for e in range(E):
        if u[e] <= lam + LOAD_TOL:
            cols.add(np.array([e]), np.zeros(1, dtype=bool), np.zeros(1), 0.0)
    if start_slots is not None:
        slots = np.asarray(start_slots, dtype=np.int64)
        split = _split(slots, u, lam)
        count = np.bincount(slots[slots >= 0], minlength=E)
        gpus_held = [np.unique(row[row >= 0]) for row in slots]
        values = pricer.value(gpus_held)
        for g, members in enumerate(gpus_held):
            flags = count[members] > 1
            if split is None:  # no split within the limit: an even one (the column may not fit)
                sigma = np.where(flags, u[members] / np.maximum(count[members], 1), 0.0)
            else:
                sigma = np.where(flags, split[members, g], 0.0)
            if u[members[~flags]].sum() + sigma.sum() <= lam + LOAD_TOL:
                cols.add(members, flags, sigma, float(values[g]))
    big = 10.0 * max(need, 1.0)  # more than any saving: an artificial column never pays
    rows = 3 * E + 2  # (a) E, (b) E, (c) 1, (d) E, (e) 1, all as <= rows
    b = np.r_[-np.ones(E), np.ones(E), [float(G)], -u, [2.0 * spare]]
    # artificial columns on (a) and (d): the master is feasible from the first round
    art_rows = np.r_[np.arange(E), 2 * E + 1 + np.arange(E)]
    art = sp.csr_matrix((-np.ones(2 * E), (art_rows, np.arange(2 * E))), shape=(rows, 2 * E))
    art_cost = np.r_[np.full(E, big), big / np.maximum(u, 1e-12)]  # a whole row's worth costs big

    best = math.inf  # the least Lagrangian bound on the saving so far
    pool: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    lp_value = 0.0
    proven = capped = False
    it = since_exact = 0
    limit_rounds = COPIES_ROUNDS if rounds is None else int(rounds)
    while it < limit_rounds:
        if deadline is not None and time.perf_counter() > deadline:
            capped = True
            break
        it += 1
        n = len(cols.members)
        A = cols.matrix(rows)
        res = linprog(
            -np.r_[np.asarray(cols.value), -art_cost],
            A_ub=sp.hstack([A, art]).tocsr(),
            b_ub=b,
            bounds=(0, None),
            method="highs",
            options={"maxiter": MASTER_ITERATIONS},
        )
        if res.status != 0:
            break
        lp_value = -float(res.fun)
        lamd = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
        p, q, mu, r, th = lamd[:E], lamd[E : 2 * E], lamd[2 * E], lamd[2 * E + 1 : 3 * E + 1], lamd[3 * E + 1]
        base = float(lamd @ b) - G * mu  # the count row's dual goes into G max(rc)
        single_gain = p - q + u * r  # a single member's reduced value (besides v)
        flag_gain = 0.5 * p - th  # a flagged member's, besides what its load earns
        exact = since_exact >= exact_every or not pool or it == 1
        parts = enum.parts if exact else pool
        top_rc = -math.inf
        found: list[tuple[float, np.ndarray, np.ndarray, np.ndarray, float]] = []
        new_pool = []
        for sets, value, flag, room in parts:
            rc = value + single_gain[sets[:, ~flag]].sum(axis=1) + flag_gain[sets[:, flag]].sum(axis=1)
            sigma, worth = _knapsack(room, r[sets[:, flag]], u[sets[:, flag]])
            rc = rc + worth
            top_rc = max(top_rc, float(rc.max()))
            keep = min(len(rc), max(1, POOL_SIZE // max(len(parts), 1)))
            pick = np.argpartition(-rc, keep - 1)[:keep]
            if exact:
                new_pool.append((sets[pick], value[pick], flag, room[pick]))
            good = pick[rc[pick] > mu + 1e-9 * max(need, 1.0)]
            good = good[np.argsort(-rc[good])][:ADD_PER_ROUND]
            for i in good:
                full = np.zeros(len(flag))
                full[flag] = sigma[i]
                found.append((float(rc[i]), sets[i], flag, full, float(value[i])))
        if exact:
            since_exact = 0
            pool = new_pool
            bound = base + G * max(0.0, top_rc)
            best = min(best, bound)
            if log is not None:
                log(
                    f"  flagged LP round {it}: LP {lp_value / total:.4f}, bound {best / total:.4f} saved GPUs per "
                    f"token, {n} columns, {time.perf_counter() - t0:.1f} s"
                )
            if top_rc - mu <= 1e-7 * max(need, 1.0):
                proven = True
                break
        else:
            since_exact += 1
            if top_rc - mu <= 1e-7 * max(need, 1.0):
                since_exact = exact_every  # the pool is spent: price exactly next round
        found.sort(key=lambda t: -t[0])
        added = 0
        for _, members, flag, sigma, v in found:
            added += cols.add(members.copy(), flag.copy(), sigma, v)
            if added >= ADD_PER_ROUND:
                break
        if not added and not exact:
            since_exact = exact_every
    # at most what ceil(k / W) leaves; at least 0 (a negative cap: no plan fits the limit)
    saving = max(min(best, need - least), 0.0) if math.isfinite(best) else need - least
    return JointBound(
        distinct=max(need - saving, least) / total,
        saving=saving,
        lp_value=lp_value,
        proven=proven,
        seconds=time.perf_counter() - t0,
        iterations=it,
        columns=len(cols.members),
        info={"gen_kind": "flagged" if math.isfinite(best) and best < need - least else "trivial", "capped": capped},
    )
