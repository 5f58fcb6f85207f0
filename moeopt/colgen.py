"""Grouping bounds that close: the set-partitioning relaxation solved by column generation.

The Dantzig-Wolfe reformulation of the grouping problem (formulations/tacg.md, section 7)
has one column per feasible group ``S`` (at most ``cap`` experts, load at most
``load_limit``) with value ``v(S) = sum_{e < e' in S} W[e, e']``:

    max sum_S v(S) x_S   s.t.   sum_{S ni e} x_S = 1 (each expert e),   sum_S x_S <= G,   x >= 0.

Its LP value bounds the optimum from above and is much tighter than the cheap bounds of
:mod:`moeopt.bounds`. Column generation solves it over a growing set of columns (the
restricted master, HiGHS); pricing looks for a group of positive reduced cost
``v(S) - pi(S) - mu`` (a small quadratic knapsack): a vectorized greedy + swap heuristic
first, then exactly (branch and bound over the groups in lexicographic order; CP-SAT
beside it for groups of more than 4 experts).

Every exact pricing at duals ``pi`` gives a valid bound, the Lagrangian (Farley) bound

    z <= L(pi) = sum_e pi_e + G max(0, max_S [v(S) - pi(S)]),

whatever ``pi`` (``pi >= 0`` when expert rows are ``<= 1``), so the bound is valid at every
iteration, not only at convergence; an exact pricing that stops early contributes its proved
upper bound on the reduced cost. Duals are smoothed (Wentges): pricing happens at a convex
combination of the best-bound duals and the master's. A restricted master MILP (HiGHS, the
incumbent as a start) over the generated columns can improve the plan.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from moeopt.bounds import grouping_bound, top_sum
from moeopt.errors import InfeasibleError
from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.heuristics.spectral import grouping_heuristic
from moeopt.result import Termination
from moeopt.solvers.highs_common import highs_threads, new_highs, set_start

#: reduced costs below this (relative to the largest affinity) count as zero
RC_TOL = 1e-7
#: integer scale of the largest coefficient in the CP-SAT pricing model
PRICING_SCALE = 1_000_000
#: loads are scaled to integers by this factor in the CP-SAT pricing model
LOAD_SCALE = 1_000_000_000
#: share of the time limit kept for the restricted master MILP at the end
MILP_SHARE = 0.15
#: master LP solves without progress before an exact pricing (for a bound and a new center)
STALL_ITERATIONS = 8
#: exact pricing may stop this far (relative to the LP value, over G) from the best reduced cost
PRICING_TOLERANCE = 2e-4


@dataclass(frozen=True, eq=False)
class ColgenResult:
    """What :func:`column_generation` found for one grouping problem.

    Attributes
    ----------
    bound
        A valid upper bound on the optimal intra-group affinity (the least of the
        Lagrangian bounds of the exactly priced iterations and the cheap bounds).
    objective
        ``problem.objective(home)`` of the best plan found, or None.
    home
        That plan (expert -> group), feasible; None when there is none.
    history
        ``(seconds, bound, incumbent)`` after each event (start, each exact pricing, MILP).
    columns
        Columns in the restricted master at the end.
    iterations
        Master LP solves.
    proven
        Whether pricing proved the master LP optimal (its value is then the LP bound).
    termination
        Why the search stopped (OPTIMAL: LP proved and, where possible, the plan too).
    lp_value
        The last restricted master LP value (a lower bound on the LP optimum).
    bound_kind
        ``'colgen'`` when the column generation bound is the tightest, else the cheap bound's name.
    info
        Counters: pricing calls by kind, time in each part.
    """

    bound: float
    objective: float | None
    home: np.ndarray | None
    history: list[tuple[float, float, float | None]]
    columns: int
    iterations: int
    proven: bool
    termination: Termination
    lp_value: float | None = None
    bound_kind: str = "colgen"
    info: dict = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """``(bound - objective) / bound`` (None without a plan; 0 for a zero bound)."""
        if self.objective is None:
            return None
        if self.bound <= 0:
            return 0.0
        return max(self.bound - self.objective, 0.0) / self.bound


# ----------------------------------------------------------------------------- pricing
def group_value(graph: np.ndarray, members: np.ndarray) -> float:
    """``v(S)``: the affinity inside one group."""
    idx = np.asarray(members, dtype=np.int64)
    return 0.5 * float(graph[np.ix_(idx, idx)].sum())


def pricing_candidates(problem: Grouping, pi: np.ndarray) -> np.ndarray:
    """Experts that some best least-size pricing group may hold.

    In a best group ``S`` of least size, every member ``e`` gains more from its partners than
    it costs: ``sum_{f in S - e} W[e, f] > pi_e`` (else dropping it keeps the value and the
    group feasible). That sum is at most ``e``'s ``cap - 1`` best partners among the
    remaining candidates, so experts failing it are dropped, repeatedly.
    """
    W = problem.graph
    cand = np.arange(problem.experts)
    partners = min(problem.cap, problem.experts) - 1
    while len(cand):
        top = top_sum(W[np.ix_(cand, cand)], partners) if partners > 0 else np.zeros(len(cand))
        keep = top > pi[cand]
        if keep.all():
            break
        cand = cand[keep]
    return cand


def _local_search(problem: Grouping, pi: np.ndarray, member: np.ndarray, rounds: int) -> np.ndarray:
    """Best-improvement moves on many groups at once: add, drop, or swap one expert."""
    W, w = problem.graph, problem.load
    E, cap = problem.experts, min(problem.cap, problem.experts)
    limit = problem.load_limit if problem.limited else math.inf
    n = len(member)
    member = member.copy()
    gain = member.astype(np.float64) @ W - pi[None, :]  # gain_x = sum_{s in S} W[s, x] - pi_x
    load = member.astype(np.float64) @ w
    active = np.arange(n)
    for _ in range(rounds):
        if not len(active):
            break
        a = active
        rows = np.arange(len(a))
        mem, gn, ld = member[a], gain[a], load[a]
        size = mem.sum(axis=1)
        # members, padded with non-members (masked) for groups below cap
        order = np.argsort(~mem, axis=1, kind="stable")[:, :cap]
        valid = np.take_along_axis(mem, order, axis=1)  # [n, cap]
        g_out = np.where(valid, np.take_along_axis(gn, order, axis=1), np.inf)  # value lost by dropping t
        # swap t out, f in: - gain_t + gain_f - W[t, f]
        fits = ld[:, None, None] - w[order][:, :, None] + w[None, None, :] <= limit + LOAD_TOL
        swap = gn[:, None, :] - W[order] - g_out[:, :, None]
        swap = np.where(mem[:, None, :] | ~fits | ~valid[:, :, None], -np.inf, swap)
        flat = swap.reshape(len(a), -1).argmax(axis=1)
        t_pos, f_swap = np.divmod(flat, E)
        best_swap = swap.reshape(len(a), -1)[rows, flat]
        # add f where a slot is free and it fits
        add = np.where(mem | (ld[:, None] + w[None, :] > limit + LOAD_TOL) | (size >= cap)[:, None], -np.inf, gn)
        f_add = add.argmax(axis=1)
        best_add = add[rows, f_add]
        # drop t (never the last member)
        drop = np.where(valid & (size > 1)[:, None], -g_out, -np.inf)
        t_drop = drop.argmax(axis=1)
        best_drop = drop[rows, t_drop]
        moves = np.stack([best_swap, best_add, best_drop], axis=1)
        kind = moves.argmax(axis=1)
        improving = moves[rows, kind] > 1e-12
        t_out = np.where(kind == 0, order[rows, t_pos], np.where(kind == 2, order[rows, t_drop], -1))
        f_in = np.where(kind == 0, f_swap, np.where(kind == 1, f_add, -1))
        sel = improving & (t_out >= 0)
        r, t = a[sel], t_out[sel]
        member[r, t] = False
        load[r] -= w[t]
        gain[r] -= W[t]
        sel = improving & (f_in >= 0)
        r, f = a[sel], f_in[sel]
        member[r, f] = True
        load[r] += w[f]
        gain[r] += W[f]
        active = a[improving]
    return member


def price_heuristic(
    problem: Grouping,
    pi: np.ndarray,
    *,
    rounds: int = 60,
    seeds: np.ndarray | None = None,
    extra: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Groups of high ``v(S) - pi(S)``: greedy growth from every seed expert, then local search.

    All starts grow at once (numpy over ``[starts, E]``): each step adds the expert of
    largest gain ``sum_{t in S} W[t, f] - pi_f`` that fits (slots, load), once while the gain
    is positive and once filling every slot; then best-improvement add / drop / swap moves
    (:func:`_local_search`) until none improves or ``rounds`` pass. ``extra`` groups (e.g.
    the master's best columns) are improved too.

    Returns
    -------
    list of np.ndarray
        Distinct groups (sorted expert ids), best reduced value ``v(S) - pi(S)`` first.
    """
    W, w = problem.graph, problem.load
    E, cap = problem.experts, min(problem.cap, problem.experts)
    limit = problem.load_limit if problem.limited else math.inf
    seeds = np.arange(E) if seeds is None else np.asarray(seeds, dtype=np.int64)
    if not len(seeds):
        return []
    starts = []
    for fill in (False, True):
        n = len(seeds)
        rows = np.arange(n)
        member = np.zeros((n, E), dtype=bool)
        member[rows, seeds] = True
        load = w[seeds].copy()
        gain = W[seeds] - pi[None, :]
        for _ in range(cap - 1):
            g = np.where(member | (load[:, None] + w[None, :] > limit + LOAD_TOL), -np.inf, gain)
            best = g.argmax(axis=1)
            ok = np.isfinite(g[rows, best]) & ((g[rows, best] > 0) | fill)
            if not ok.any():
                break
            r = rows[ok]
            member[r, best[ok]] = True
            load[r] += w[best[ok]]
            gain[r] += W[best[ok]]
        starts.append(member)
    for s in extra or []:
        m = np.zeros((1, E), dtype=bool)
        m[0, s] = True
        starts.append(m)
    member = _local_search(problem, pi, np.concatenate(starts), rounds)
    value = 0.5 * np.einsum("ne,ef,nf->n", member, W, member) - member @ pi
    order = np.argsort(-value)
    seen: set[bytes] = set()
    out = []
    for i in order:
        key = np.packbits(member[i]).tobytes()
        if key in seen:
            continue
        seen.add(key)
        out.append(np.flatnonzero(member[i]))
    return out


@dataclass(frozen=True)
class Pricing:
    """An exact pricing's answer: groups found and a proved bound on ``max_S v(S) - pi(S)``."""

    groups: list[np.ndarray]
    upper: float  # >= max over feasible S (the empty group included) of v(S) - pi(S)
    proven: bool  # upper is the maximum itself
    kind: str


def price_enumerate(problem: Grouping, pi: np.ndarray, cand: np.ndarray, keep: int = 20) -> Pricing:
    """Exact pricing by enumerating every subset of the candidates of at most ``cap`` experts
    (a reference for tests and tiny problems; :func:`price_branch_and_bound` prunes)."""
    W, w = problem.graph, problem.load
    limit = problem.load_limit if problem.limited else math.inf
    best_groups: list[tuple[float, np.ndarray]] = []
    upper = 0.0
    n = len(cand)
    for k in range(1, min(problem.cap, n) + 1):
        combos = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(n), k)), dtype=np.int32
        ).reshape(-1, k)
        sets = cand[combos]
        value = -pi[sets].sum(axis=1)
        for a in range(k):
            for b in range(a + 1, k):
                value = value + W[sets[:, a], sets[:, b]]
        if np.isfinite(limit):
            value = np.where(w[sets].sum(axis=1) <= limit + LOAD_TOL, value, -np.inf)
        if not len(value):
            continue
        upper = max(upper, float(value.max()))
        top = np.argsort(-value)[:keep]
        best_groups.extend((float(value[i]), np.sort(sets[i])) for i in top if value[i] > 0)
    best_groups.sort(key=lambda t: -t[0])
    return Pricing([s for _, s in best_groups[:keep]], upper, True, "enumerate")


def price_branch_and_bound(
    problem: Grouping,
    pi: np.ndarray,
    cand: np.ndarray,
    *,
    threshold: float = 0.0,
    tolerance: float = 0.0,
    deadline: float | None = None,
    keep: int = 20,
    chunk_elements: int = 4_000_000,
) -> Pricing:
    """Exact pricing by enumerating groups in lexicographic order, depth first by chunks, with bounds.

    A node is a feasible group ``T`` (last expert ``l``); its completions add up to
    ``r = cap - |T|`` experts ``f > l``, and with ``g_f = sum_{t in T} W[t, f] - pi_f``

        v(T + U) - pi(T + U) <= v(T) - pi(T) + top_r^+ (g_f + h_f / 2),

    ``h_f`` the sum of f's ``r - 1`` largest affinities to experts after ``l`` (pairs inside
    U counted from both ends). Nodes whose bound is at most ``max(threshold, best found) + tolerance`` are
    pruned; the last expert of a group is chosen exactly (``max_f g_f``). ``threshold`` must be
    the reduced value of some feasible group (or 0, the empty group). Children are expanded
    in chunks, best bound first; chunks left at ``deadline`` contribute their parents'
    bounds, so the answer's upper bound stays valid (not proven).
    """
    if not len(cand):
        return Pricing([], max(threshold, 0.0) + tolerance, True, "branch-and-bound")
    W, w = problem.graph, problem.load
    limit = problem.load_limit if problem.limited else math.inf
    cap = min(problem.cap, len(cand))
    Wc = W[np.ix_(cand, cand)]
    pc = pi[cand]
    wc = w[cand]
    n = len(cand)
    # tops[l, f, m]: the m largest affinities of f to experts after l (completions of a node
    # whose last expert is l come from there); m < cap - 1 is all a bound needs
    m = max(cap - 2, 0)
    tops = np.zeros((n, n, m + 1))
    for l in range(n - 1):
        part = Wc[:, l + 1 :]
        k = min(m, part.shape[1])
        if k:
            top = -np.sort(-np.partition(part, part.shape[1] - k, axis=1)[:, part.shape[1] - k :], axis=1)
            tops[l, :, 1 : k + 1] = np.cumsum(top, axis=1)
            tops[l, :, k + 1 :] = tops[l, :, k : k + 1]
    state = {"best": max(threshold, 0.0), "left": -math.inf}
    found: list[tuple[float, np.ndarray]] = []
    index = np.arange(n)

    def note(sets: np.ndarray, value: np.ndarray) -> None:
        if not len(value):
            return
        state["best"] = max(state["best"], float(value.max()))
        good = np.flatnonzero(value > threshold + 1e-15)
        found.extend((float(value[j]), cand[sets[j]]) for j in good[np.argsort(-value[good])[:keep]])

    def visit(sets: np.ndarray, value: np.ndarray, gain: np.ndarray, load: np.ndarray) -> None:
        k = sets.shape[1]
        note(sets, value)
        r = cap - k
        if r == 0:
            return
        after = index[None, :] > sets[:, -1][:, None]
        fits = load[:, None] + wc[None, :] <= limit + LOAD_TOL
        if r == 1:  # the last expert, exactly
            g = np.where(after & fits, gain, -np.inf)
            f = g.argmax(axis=1)
            ok = np.isfinite(g[np.arange(len(f)), f])
            note(np.concatenate([sets[ok], f[ok, None]], axis=1), value[ok] + g[ok, f[ok]])
            return
        score = np.where(after & fits, gain + 0.5 * tops[sets[:, -1], :, r - 1], -np.inf)
        pos = np.maximum(score, 0.0)
        bound = value + top_sum(pos, r)
        rest = top_sum(pos, r - 1)
        order = np.argsort(-bound)
        step = max(1, chunk_elements // (n * n))
        for c in range(0, len(order), step):
            part = order[c : c + step]
            part = part[bound[part] > state["best"] + tolerance]
            if not len(part):
                continue
            if deadline is not None and time.perf_counter() > deadline:
                state["left"] = max(state["left"], float(bound[part].max()))
                continue
            # children: each node with each f > last that may still pay
            cut = state["best"] + tolerance - value[part] - rest[part]
            node, f = np.nonzero(score[part] > cut[:, None])
            node = part[node]
            visit(
                np.concatenate([sets[node], f[:, None]], axis=1),
                value[node] + gain[node, f],
                gain[node] + Wc[f],
                load[node] + wc[f],
            )

    for c in range(0, n, max(1, chunk_elements // (n * n))):
        seeds = index[c : c + max(1, chunk_elements // (n * n))]
        visit(seeds[:, None], -pc[seeds], Wc[seeds] - pc[None, :], wc[seeds])
    found.sort(key=lambda t: -t[0])
    proven = state["left"] == -math.inf
    upper = max(state["best"] + tolerance, state["left"], 0.0)
    return Pricing([np.sort(s) for _, s in found[:keep]], upper, proven, "branch-and-bound")


def price_cpsat(
    problem: Grouping,
    pi: np.ndarray,
    cand: np.ndarray,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    threads: int = 1,
    seed: int = 0,
) -> Pricing:
    """Exact pricing with CP-SAT on the candidates: ``x_e`` in S, ``z_ij <= x_i, x_j`` per pair.

    Coefficients are scaled to integers; the proved real bound adds the largest rounding
    error of a feasible group (``cap (cap - 1) / 2`` pairs and ``cap`` experts, half a unit
    each). Loads get ``cap / 2`` units of slack so that every really feasible group stays
    feasible (the model is a relaxation); a group found is kept only within the real limit.
    """
    from ortools.sat.python import cp_model

    W, w = problem.graph, problem.load
    n, cap = len(cand), min(problem.cap, len(cand))
    Wc = W[np.ix_(cand, cand)]
    pc = pi[cand]
    pi_, pj_ = np.nonzero(np.triu(Wc, k=1) > 0)
    pw = Wc[pi_, pj_]
    top = max(float(pw.max(initial=0.0)), float(np.abs(pc).max(initial=0.0)), 1e-300)
    scale = PRICING_SCALE / top
    wint = np.rint(pw * scale).astype(np.int64)
    pint = np.rint(pc * scale).astype(np.int64)
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{e}") for e in range(n)]
    z = [m.new_bool_var(f"z{p}") for p in range(len(pw))]
    incident: list[list[int]] = [[] for _ in range(n)]
    for p, (i, j) in enumerate(zip(pi_.tolist(), pj_.tolist(), strict=True)):
        m.add_implication(z[p], x[i])
        m.add_implication(z[p], x[j])
        incident[i].append(p)
        incident[j].append(p)
    m.add(sum(x) <= cap)
    for e in range(n):  # star cuts: at most cap - 1 partners, only when e is in
        if len(incident[e]) > cap - 1:
            m.add(sum(z[p] for p in incident[e]) <= (cap - 1) * x[e])
    if problem.limited:
        wl = np.rint(w[cand] * LOAD_SCALE).astype(np.int64)
        lim = int(math.floor(problem.load_limit * LOAD_SCALE)) + (cap + 1) // 2
        m.add(sum(int(a) * xe for a, xe in zip(wl.tolist(), x, strict=True)) <= lim)
    m.maximize(
        sum(int(a) * zp for a, zp in zip(wint.tolist(), z, strict=True))
        - sum(int(a) * xe for a, xe in zip(pint.tolist(), x, strict=True))
    )
    if hint is not None:
        pos = {int(e): k for k, e in enumerate(cand)}
        inside = np.zeros(n, dtype=bool)
        inside[[pos[int(e)] for e in hint if int(e) in pos]] = True
        for k in range(n):
            m.add_hint(x[k], bool(inside[k]))
        for p, (i, j) in enumerate(zip(pi_.tolist(), pj_.tolist(), strict=True)):
            m.add_hint(z[p], bool(inside[i] and inside[j]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    code = solver.solve(m)
    name = solver.status_name(code)
    rounding = 0.5 / scale * (cap * (cap - 1) / 2 + cap)
    if name not in ("OPTIMAL", "FEASIBLE"):
        # no answer: the trivial bound (every candidate's best partners, cap of them)
        gain = top_sum(Wc, cap - 1) - pc
        return Pricing([], max(0.0, float(top_sum(np.maximum(gain, 0.0)[None, :], cap)[0])), False, "cpsat")
    upper = max(0.0, solver.best_objective_bound / scale + rounding)
    chosen = cand[[k for k in range(n) if solver.value(x[k])]]
    groups = [np.sort(chosen)] if len(chosen) else []
    return Pricing(groups, upper, name == "OPTIMAL", "cpsat")


def price_exact(
    problem: Grouping,
    pi: np.ndarray,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    seed: int = 0,
    threshold: float = 0.0,
    tolerance: float = 0.0,
) -> Pricing:
    """Exact pricing: :func:`price_branch_and_bound`, then CP-SAT on what is left of ``time_limit``
    when the search stops early and groups are larger than 4 (the least upper bound is kept)."""
    t0 = time.perf_counter()
    cand = pricing_candidates(problem, pi)
    if not len(cand):
        return Pricing([], 0.0, True, "pruned")
    partners = min(problem.cap, problem.experts) - 1
    potential = top_sum(problem.graph[np.ix_(cand, cand)], partners) - pi[cand]
    cand = cand[np.argsort(-potential, kind="stable")]  # promising experts first: good groups early
    out = price_branch_and_bound(
        problem,
        pi,
        cand,
        threshold=threshold,
        tolerance=tolerance,
        deadline=t0 + (time_limit if problem.cap <= 4 else 0.75 * time_limit),
    )
    left = time_limit - (time.perf_counter() - t0)
    if out.proven or problem.cap <= 4 or left < 0.5:
        return out
    sat = price_cpsat(
        problem,
        pi,
        cand,
        time_limit=left,
        hint=hint if hint is not None else (out.groups[0] if out.groups else None),
        seed=seed,
    )
    return Pricing(sat.groups + out.groups, min(out.upper, sat.upper), sat.proven, "branch-and-bound+cpsat")


def reduced_values(problem: Grouping, groups: list[np.ndarray], pi: np.ndarray) -> np.ndarray:
    """``v(S) - pi(S)`` of each group."""
    return np.array([group_value(problem.graph, s) - float(pi[s].sum()) for s in groups])


# ----------------------------------------------------------------------------- master
class Master:
    """The restricted master LP in highspy: rows per expert (``= 1`` or ``<= 1``) and ``sum x <= G``."""

    def __init__(self, problem: Grouping, partition: bool) -> None:
        import highspy

        self.problem = problem
        self.partition = partition
        self.inf = highspy.kHighsInf
        E = problem.experts
        self.h = new_highs()
        highs_threads(1)
        self.h.setOptionValue("threads", 1)
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        lower = np.concatenate([np.full(E, 1.0 if partition else -self.inf), [-self.inf]])
        upper = np.concatenate([np.ones(E), [float(problem.groups)]])
        self.h.addRows(
            E + 1,
            lower,
            upper,
            0,
            np.zeros(E + 1, dtype=np.int32),
            np.array([], dtype=np.int32),
            np.array([], dtype=np.float64),
        )
        self.groups: list[np.ndarray] = []
        self.values: list[float] = []
        self.keys: set[bytes] = set()

    def key(self, group: np.ndarray) -> bytes:
        member = np.zeros(self.problem.experts, dtype=bool)
        member[group] = True
        return np.packbits(member).tobytes()

    def add(self, groups: list[np.ndarray]) -> int:
        """Add the new ones among ``groups``; return how many were new."""
        new = []
        for s in groups:
            s = np.sort(np.asarray(s, dtype=np.int64))
            k = self.key(s)
            if len(s) == 0 or k in self.keys:
                continue
            self.keys.add(k)
            new.append(s)
        if not new:
            return 0
        vals = [group_value(self.problem.graph, s) for s in new]
        starts = np.cumsum([0] + [len(s) + 1 for s in new[:-1]]).astype(np.int32)
        index = np.concatenate([np.append(s, self.problem.experts) for s in new]).astype(np.int32)
        self.h.addCols(
            len(new),
            np.array(vals),
            np.zeros(len(new)),
            np.full(len(new), self.inf),
            len(index),
            starts,
            index,
            np.ones(len(index)),
        )
        self.groups.extend(new)
        self.values.extend(vals)
        return len(new)

    def solve(self) -> tuple[float, np.ndarray, float, np.ndarray]:
        """Solve the LP: value, expert duals pi, the count row's dual mu, and x."""
        self.h.run()
        status = self.h.modelStatusToString(self.h.getModelStatus())
        if status != "Optimal":
            raise RuntimeError(f"restricted master LP: HiGHS status {status}")
        sol = self.h.getSolution()
        dual = np.asarray(sol.row_dual)
        E = self.problem.experts
        return (
            float(self.h.getInfo().objective_function_value),
            dual[:E].copy(),
            float(dual[E]),
            np.asarray(sol.col_value),
        )


def restricted_milp(
    problem: Grouping,
    groups: list[np.ndarray],
    partition: bool,
    *,
    time_limit: float,
    start: np.ndarray | None = None,
) -> np.ndarray | None:
    """Best plan made of the given columns (HiGHS MILP, ``start`` as a warm start); None if none found."""
    import highspy

    E, C = problem.experts, len(groups)
    if C == 0:
        return None
    h = new_highs()
    highs_threads(1)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", max(0.1, float(time_limit)))
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    inf = highspy.kHighsInf
    h.addRows(
        E + 1,
        np.concatenate([np.full(E, 1.0 if partition else -inf), [-inf]]),
        np.concatenate([np.ones(E), [float(problem.groups)]]),
        0,
        np.zeros(E + 1, dtype=np.int32),
        np.array([], dtype=np.int32),
        np.array([], dtype=np.float64),
    )
    vals = np.array([group_value(problem.graph, s) for s in groups])
    starts = np.cumsum([0] + [len(s) + 1 for s in groups[:-1]]).astype(np.int32)
    index = np.concatenate([np.append(s, E) for s in groups]).astype(np.int32)
    h.addCols(C, vals, np.zeros(C), np.ones(C), len(index), starts, index, np.ones(len(index)))
    h.changeColsIntegrality(C, np.arange(C, dtype=np.int32), np.full(C, highspy.HighsVarType.kInteger))
    if start is not None:
        keys = {np.packbits(np.isin(np.arange(E), s)).tobytes(): c for c, s in enumerate(groups)}
        col = np.zeros(C)
        for g in np.unique(start):
            c = keys.get(np.packbits(start == g).tobytes())
            if c is not None:
                col[c] = 1.0
        set_start(h, col)
    h.run()
    if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
        return None
    x = np.asarray(h.getSolution().col_value)
    chosen = [groups[c] for c in np.flatnonzero(x > 0.5)]
    return _plan_of(problem, chosen)


def _plan_of(problem: Grouping, chosen: list[np.ndarray]) -> np.ndarray | None:
    """A plan from disjoint groups: uncovered experts go where slots and load allow (None if stuck)."""
    E, G = problem.experts, problem.groups
    home = np.full(E, -1, dtype=np.int64)
    for g, s in enumerate(chosen[:G]):
        if (home[s] >= 0).any():
            return None
        home[s] = g
    loads = np.bincount(home[home >= 0], weights=problem.load[home >= 0], minlength=G)
    sizes = np.bincount(home[home >= 0], minlength=G)
    for e in np.flatnonzero(home < 0)[np.argsort(-problem.load[home < 0])]:
        gain = np.bincount(home[home >= 0], weights=problem.graph[e, home >= 0], minlength=G)
        fits = (sizes < problem.cap) & (loads + problem.load[e] <= problem.load_limit + LOAD_TOL)
        if not fits.any():
            return None
        g = int(np.flatnonzero(fits)[np.argmax(gain[fits])])
        home[e] = g
        loads[g] += problem.load[e]
        sizes[g] += 1
    return home if problem.feasible(home) else None


# ----------------------------------------------------------------------------- driver
def _start_plan(problem: Grouping, start_home: np.ndarray | None, seed: int, deadline: float) -> np.ndarray | None:
    if start_home is not None:
        home = np.asarray(start_home, dtype=np.int64)
        return home if problem.feasible(home) else None
    try:  # agnostic's defaults (moeopt.methods.tacg.heuristic_home with AgnosticParams())
        home, _ = grouping_heuristic(problem, np.random.default_rng(seed), deadline=deadline)
    except InfeasibleError:
        return None
    return home if problem.feasible(home) else None


def column_generation(
    problem: Grouping,
    time_limit: float,
    *,
    start_home: np.ndarray | None = None,
    log: Callable[[str], None] | None = None,
    seed: int = 0,
    smoothing: float = 0.8,
    pricing_time: float | None = None,
) -> ColgenResult:
    """Upper bound (and maybe a better plan) for ``problem`` by column generation.

    Parameters
    ----------
    problem
        The grouping problem (W, w, G, cap, load limit).
    time_limit
        Seconds for everything (start plan, cheap bound, pricing, master LPs, final MILP).
    start_home
        A feasible plan: its groups seed the master and it is the first incumbent. None:
        ``agnostic``'s heuristic (:func:`moeopt.heuristics.spectral.grouping_heuristic`), within a
        tenth of the time limit.
    log
        Called with one line per exact pricing.
    seed
        Random seed of the start heuristic and CP-SAT.
    smoothing
        Wentges dual smoothing alpha in [0, 1) (0: price at the master's duals); after k
        consecutive exact pricings without a column, ``max(0, 1 - (k + 1)(1 - alpha))``.
    pricing_time
        Seconds per exact pricing, and the longest stretch of heuristic pricing between two
        exact ones (default: a tenth of the time limit, at least 1 s).

    Returns
    -------
    ColgenResult
        Bound valid at every recorded point, best plan and history.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    say = log or (lambda _msg: None)
    W = problem.graph
    E, G = problem.experts, problem.groups
    info: dict = {
        "heuristic_pricings": 0,
        "exact_pricings": 0,
        "mispricings": 0,
        "lp_time": 0.0,
        "pricing_time": 0.0,
        "milp_time": 0.0,
    }
    home = _start_plan(problem, start_home, seed, t0 + 0.1 * time_limit)
    incumbent = None if home is None else problem.objective(home)
    cheap, cheap_kind = grouping_bound(problem)
    bound, kind = cheap, cheap_kind
    history: list[tuple[float, float, float | None]] = [(time.perf_counter() - t0, bound, incumbent)]
    tol = RC_TOL * max(float(W.max(initial=0.0)), 1e-12)
    if E == 0 or min(problem.cap, E) <= 1 or bound <= tol:
        # no pair can share a group, or no pair has affinity: every plan is worth 0
        done = Termination.OPTIMAL if home is not None else Termination.COMPLETED
        return ColgenResult(bound, incumbent, home, history, 0, 0, True, done, 0.0, kind, info)

    partition = home is not None
    master = Master(problem, partition)
    master.add([np.array([e]) for e in range(E)])
    if home is not None:
        master.add([np.flatnonzero(home == g) for g in range(G)])
    if pricing_time is None:
        pricing_time = max(1.0, 0.1 * time_limit)
    milp_at = deadline - MILP_SHARE * time_limit
    # stability center of the dual smoothing: first each expert's share of its group's value
    # in the start plan (sum = its objective), then the duals of the best Lagrangian bound
    center = None if home is None else 0.5 * (W * (home[:, None] == home[None, :])).sum(axis=1)
    center_value = math.inf
    last_exact = time.perf_counter()
    best_lp, stalled = -math.inf, 0  # master LP iterations without progress
    mispriced = 0  # consecutive exact pricings that found nothing for the master
    iterations = 0
    proven = False
    lp_value = None
    hint = None
    while time.perf_counter() < milp_at:
        ts = time.perf_counter()
        lp_value, pi, mu, _x = master.solve()
        info["lp_time"] += time.perf_counter() - ts
        iterations += 1
        if lp_value >= bound - 1e-9 * max(abs(bound), 1.0):
            break  # the master meets a valid bound: LP (and bound) optimal
        # Wentges smoothing; after each misprice the pricing duals move towards the master's
        alpha = 1.0 - (mispriced + 1) * (1.0 - smoothing)
        alpha = alpha if alpha > 1e-9 else 0.0
        pi_price = pi if center is None or alpha == 0.0 else alpha * center + (1.0 - alpha) * pi
        if not partition:  # the Lagrangian bound of rows "<= 1" needs pi >= 0
            pi_price = np.maximum(pi_price, 0.0)
        ts = time.perf_counter()
        found = price_heuristic(problem, pi_price, seeds=pricing_candidates(problem, pi_price))
        info["heuristic_pricings"] += 1
        threshold = max(0.0, float(reduced_values(problem, found[:1], pi_price).max(initial=0.0)))
        rc = reduced_values(problem, found, pi) - mu
        good = [s for s, r in zip(found, rc, strict=True) if r > tol]
        if not good and pi_price is not pi:  # nothing at the smoothed duals: try the master's
            extra = price_heuristic(problem, pi, seeds=pricing_candidates(problem, pi))
            rc = reduced_values(problem, extra, pi) - mu
            good = [s for s, r in zip(extra, rc, strict=True) if r > tol]
        info["pricing_time"] += time.perf_counter() - ts
        if lp_value > best_lp + 1e-4 * max(abs(lp_value), 1e-12):
            best_lp, stalled = lp_value, 0
        else:
            stalled += 1
        due = time.perf_counter() - last_exact > pricing_time  # a bound (and a center) now and then
        if good and stalled < STALL_ITERATIONS and iterations > 1 and not due:
            hint = good[0]
            master.add(_disjoint_first(good, E, limit=max(10, 2 * G)))
            continue
        stall_added = bool(good)
        if good:  # the master stalls (degenerate pivots): price exactly for a bound and a new center
            master.add(_disjoint_first(good, E, limit=max(10, 2 * G)))
            stalled = 0
        # exact pricing at the smoothed duals: a Lagrangian bound, and columns if any
        ts = time.perf_counter()
        left = milp_at - time.perf_counter()
        # far from the LP optimum a rough pricing is worth more than an exact one: prune within a
        # tenth of the current gap (the bound loses at most that), then tighter as the gap closes
        slack = max(PRICING_TOLERANCE * max(abs(lp_value), abs(incumbent or 0.0)), 0.1 * (bound - lp_value)) / G
        pr = price_exact(
            problem,
            pi_price,
            time_limit=max(0.1, min(pricing_time, left)),
            hint=hint,
            seed=seed,
            threshold=threshold,
            tolerance=slack,
        )
        info["exact_pricings"] += 1
        last_exact = time.perf_counter()
        info["pricing_time"] += last_exact - ts
        lag = float(pi_price.sum()) + G * max(0.0, pr.upper)
        if lag < center_value:
            center, center_value = pi_price.copy(), lag
        if lag < bound:
            bound, kind = lag, "colgen"
        history.append((time.perf_counter() - t0, bound, incumbent))
        say(
            f"colgen it {iterations} ({time.perf_counter() - ts:.2f} s): lp {lp_value:.6g}, bound {bound:.6g}, "
            f"pricing {pr.kind} "
            f"upper {pr.upper:.4g}{'' if pr.proven else ' (unproven)'}, alpha {alpha:.2g}, "
            f"columns {len(master.groups)}"
        )
        rc = reduced_values(problem, pr.groups, pi) - mu
        good = [
            s
            for s, r in zip(pr.groups, rc, strict=True)
            if r > tol and problem.load[s].sum() <= problem.load_limit + LOAD_TOL
        ]
        if good:
            master.add(good)
        if good or stall_added:
            mispriced = 0
            continue
        mispriced += 1
        info["mispricings"] += 1
        if alpha == 0.0 and pr.proven and lag <= lp_value + PRICING_TOLERANCE * abs(lp_value) + 1e-12:
            proven = True  # priced at the master's duals, nothing to add: the LP is solved (to the tolerance)
            break
    if lp_value is not None and lp_value >= bound - 1e-9 * max(abs(bound), 1.0):
        proven = True
    # restricted master MILP over the generated columns
    ts = time.perf_counter()
    left = deadline - ts
    if left > 0.05 and (incumbent is None or incumbent < bound - 1e-9 * max(abs(bound), 1.0)):
        plan = restricted_milp(problem, master.groups, partition, time_limit=left, start=home)
        if plan is not None and problem.feasible(plan):
            value = problem.objective(plan)
            if incumbent is None or value > incumbent:
                home, incumbent = plan, value
        history.append((time.perf_counter() - t0, bound, incumbent))
    info["milp_time"] = time.perf_counter() - ts
    closed = incumbent is not None and bound - incumbent <= 1e-6 * max(abs(bound), 1e-12)
    if closed or proven:
        termination = Termination.OPTIMAL if closed else Termination.COMPLETED
    else:
        termination = Termination.TIME_LIMIT
    return ColgenResult(
        bound, incumbent, home, history, len(master.groups), iterations, proven, termination, lp_value, kind, info
    )


def _disjoint_first(groups: list[np.ndarray], experts: int, limit: int) -> list[np.ndarray]:
    """Up to ``limit`` groups, best first, preferring ones disjoint from those already taken."""
    used = np.zeros(experts, dtype=bool)
    first, rest = [], []
    for s in groups:
        if not used[s].any():
            first.append(s)
            used[s] = True
        else:
            rest.append(s)
    return (first + rest)[:limit]
