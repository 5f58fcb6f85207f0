"""Pricing for the column generation: a group of positive reduced cost ``v(S) - pi(S) - mu``.

A small quadratic knapsack: a vectorized greedy + swap heuristic first
(`price_heuristic`), then exactly (`price_exact`: enumeration of small groups,
branch and bound over the groups in lexicographic order, CP-SAT beside it for groups of more
than 4 experts). An exact pricing that stops early still returns a proved upper bound on the
best reduced cost (``Pricing.upper``), which keeps the Lagrangian bound valid.

Exact pricing is bounded by work, not by the clock, so that a bound is a function of the
input, the seed and the parameters: the branch and bound by the node-candidate pairs it scores
(``work``), CP-SAT by its deterministic time with one worker (`WORK_PER_DTIME` work units
per deterministic second). A ``deadline`` is only an outer cap; a pricing it stops says so
(``Pricing.capped``) and its bound then depends on the machine's speed.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from moeopt.bounds import top_sum
from moeopt.budget import run_interruptible
from moeopt.grouping import LOAD_TOL, Grouping

#: integer scale of the largest coefficient in the CP-SAT pricing model
PRICING_SCALE = 1_000_000
#: loads are scaled to integers by this factor in the CP-SAT pricing model
LOAD_SCALE = 1_000_000_000
#: iterated local search of the full-group pricing heuristic: rounds (kicks), copies per round,
#: random swaps per kick, best groups kept
ILS_KICKS = 10
ILS_COPIES = 256
ILS_SWAPS = 3
ILS_ELITE = 32
#: ... and it stops after this many rounds in a row that did not raise the best value
ILS_PATIENCE = 2
#: work of one exact pricing (node-candidate pairs the branch and bound scores) by default:
#: about a second of pricing on a 2-core machine at E = 128 to 256
PRICING_WORK = 40_000_000
#: branch-and-bound work units per deterministic second of CP-SAT (both about a second of a
#: 2-core machine's time): CP-SAT gets the branch and bound's unspent share in its own units
WORK_PER_DTIME = 40_000_000
#: share of an exact pricing's work the branch and bound may spend before CP-SAT takes the
#: rest, for groups of more than 4 experts (smaller groups: the branch and bound alone)
BRANCH_SHARE = 0.75
#: least CP-SAT deterministic time worth starting
MIN_DTIME = 0.05


def group_value(graph: np.ndarray, members: np.ndarray) -> float:
    """``v(S)``: the affinity inside one group."""
    idx = np.asarray(members, dtype=np.int64)
    return 0.5 * float(graph[np.ix_(idx, idx)].sum())


def _reduced_rows(graph: np.ndarray, pi: np.ndarray, member: np.ndarray) -> np.ndarray:
    """``v(S) - pi(S)`` of each row of the membership matrix ``member [n, E]``."""
    return 0.5 * np.einsum("ne,ef,nf->n", member, graph, member) - member @ pi


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


def _local_search(
    problem: Grouping, pi: np.ndarray, member: np.ndarray, rounds: int, *, resize: bool = True
) -> np.ndarray:
    """Best-improvement moves on many groups at once: add, drop, or swap one expert (only swaps
    when ``resize`` is False: the groups keep their sizes)."""
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
        if not resize:
            best_add = best_drop = np.full(len(a), -np.inf)
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


def _iterated_swaps(
    problem: Grouping,
    pi: np.ndarray,
    member: np.ndarray,
    rounds: int,
    kicks: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Iterated local search over full groups: up to ``kicks`` times, ``ILS_COPIES`` copies of
    the best groups so far each take ``ILS_SWAPS`` random swaps within the load limit and go
    back to a local optimum (`_local_search`, swaps only); the ``ILS_ELITE`` best distinct
    groups are kept; ``ILS_PATIENCE`` rounds in a row without a better group end it. Returns
    every group kept, the start's included."""
    W, w = problem.graph, problem.load
    limit = problem.load_limit if problem.limited else math.inf
    elite = np.unique(member, axis=0)
    elite = elite[np.argsort(-_reduced_rows(W, pi, elite))[:ILS_ELITE]]
    best, idle = float(_reduced_rows(W, pi, elite[:1])[0]), 0
    for _ in range(kicks):
        copies = elite[rng.integers(len(elite), size=ILS_COPIES)]
        rows = np.arange(len(copies))
        for _ in range(ILS_SWAPS):  # a random member out, a random non-member in, if it fits
            keys = rng.random(copies.shape)
            out = np.where(copies, keys, -1.0).argmax(axis=1)
            into = np.where(copies, -1.0, keys).argmax(axis=1)
            ok = copies @ w - w[out] + w[into] <= limit + LOAD_TOL
            copies[rows[ok], out[ok]] = False
            copies[rows[ok], into[ok]] = True
        copies = _local_search(problem, pi, copies, rounds, resize=False)
        pool = np.unique(np.concatenate([elite, copies]), axis=0)
        values = _reduced_rows(W, pi, pool)
        elite = pool[np.argsort(-values)[:ILS_ELITE]]
        top = float(values.max())
        idle = 0 if top > best + 1e-12 * max(1.0, abs(best)) else idle + 1
        best = max(best, top)
        if idle >= ILS_PATIENCE:
            break
    return elite


def price_heuristic(
    problem: Grouping,
    pi: np.ndarray,
    *,
    rounds: int = 60,
    seeds: np.ndarray | None = None,
    extra: list[np.ndarray] | None = None,
    full: bool = False,
    kicks: int | None = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """Groups of high ``v(S) - pi(S)``: greedy growth from every seed expert, then local search.

    All starts grow at once (numpy over ``[starts, E]``): each step adds the expert of
    largest gain ``sum_{t in S} W[t, f] - pi_f`` that fits (slots, load), once while the gain
    is positive and once filling every slot; then best-improvement add / drop / swap moves
    (`_local_search`) until none improves or ``rounds`` pass. ``extra`` groups (e.g.
    the master's best columns) are improved too. With ``full``, only groups of exactly ``cap``
    experts: the filled starts (each keeping room under the load limit for the rest), swap
    moves only, then ``kicks`` rounds of iterated local search (`_iterated_swaps`).

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
    for fill in (True,) if full else (False, True):
        n = len(seeds)
        rows = np.arange(n)
        member = np.zeros((n, E), dtype=bool)
        member[rows, seeds] = True
        load = w[seeds].copy()
        gain = W[seeds] - pi[None, :]
        for step in range(cap - 1):
            room = np.full((n, 1), limit + LOAD_TOL) - load[:, None]
            if full and np.isfinite(limit):
                # keep room for the rest: f plus the r - 1 lightest other non-members must fit
                r_left = cap - 2 - step
                light = np.sort(np.where(member, np.inf, w[None, :]), axis=1)[:, : r_left + 1]
                sums = np.cumsum(light, axis=1)
                below = sums[:, r_left - 1 : r_left] if r_left else np.zeros((n, 1))
                among = w[None, :] <= light[:, r_left - 1 : r_left] if r_left else np.zeros((n, E), dtype=bool)
                room = room - np.where(among, sums[:, r_left : r_left + 1] - w[None, :], below)
            g = np.where(member | (w[None, :] > room), -np.inf, gain)
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
        if full and len(s) != cap:
            continue
        m = np.zeros((1, E), dtype=bool)
        m[0, s] = True
        starts.append(m)
    member = _local_search(problem, pi, np.concatenate(starts), rounds, resize=not full)
    if full:
        member = member[member.sum(axis=1) == cap]
        kicks = ILS_KICKS if kicks is None else kicks
        if len(member) and kicks:
            member = _iterated_swaps(problem, pi, member, rounds, kicks, np.random.default_rng(seed))
    order = np.argsort(-_reduced_rows(W, pi, member))
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
    #: columns the master takes whatever their reduced value (e.g. a whole plan around the best
    #: group: when columns must partition the experts, a new one is of no use without partners)
    partners: list[np.ndarray] = field(default_factory=list)
    #: the deadline (an outer wall-clock cap), not the work budget, stopped it: ``upper`` is still
    #: valid but depends on the machine's speed
    capped: bool = False


def price_enumerate(problem: Grouping, pi: np.ndarray, cand: np.ndarray, keep: int = 20) -> Pricing:
    """Exact pricing by enumerating every subset of the candidates of at most ``cap`` experts
    (a reference for tests and tiny problems; `price_branch_and_bound` prunes)."""
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
    work: float | None = None,
    deadline: float | None = None,
    keep: int = 20,
    chunk_elements: int = 4_000_000,
    full: bool = False,
) -> Pricing:
    """Exact pricing by enumerating groups in lexicographic order, depth first by chunks, with bounds.

    A node is a feasible group ``T`` (last expert ``l``); its completions add up to
    ``r = cap - |T|`` experts ``f > l``, and with ``g_f = sum_{t in T} W[t, f] - pi_f``

        v(T + U) - pi(T + U) <= v(T) - pi(T) + top_r^+ (g_f + h_f / 2),

    ``h_f`` the sum of f's ``r - 1`` largest affinities to experts after ``l`` (pairs inside
    U counted from both ends). Nodes whose bound is at most ``max(threshold, best found) + tolerance`` are
    pruned; the last expert of a group is chosen exactly (``max_f g_f``). ``threshold`` must be
    the reduced value of some feasible group (or 0, the empty group). Children are expanded
    in chunks, best bound first; each chunk costs its nodes times the candidates in ``work``
    units, and chunks left once ``work`` is spent (or at ``deadline``, an outer wall-clock cap:
    ``capped``) contribute their parents' bounds, so the answer's upper bound stays valid (not
    proven). Expansion is depth first in a fixed order, so ``work`` alone decides where it stops.

    With ``full``, only groups of exactly ``cap`` experts count (``cand`` must then be every
    expert): a node must add all ``r`` experts, so its bound is ``top_r`` without the positive
    part, the empty group is not a group (``threshold`` may be ``-inf`` or negative: the reduced
    value of some full group) and the upper bound may be negative.
    """
    floor = -math.inf if full else 0.0  # the empty group's value, when it counts
    if not len(cand) or (full and len(cand) < problem.cap):
        return Pricing([], max(threshold, floor) + tolerance, True, "branch-and-bound")
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
    state = {"best": max(threshold, floor), "left": -math.inf, "work": 0.0, "capped": False}
    budget = math.inf if work is None else float(work)
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
        r = cap - k
        if not full or r == 0:
            note(sets, value)
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
        pos = score if full else np.maximum(score, 0.0)  # a full group takes all r, good or not
        bound = value + top_sum(pos, r)
        rest = top_sum(pos, r - 1)
        order = np.argsort(-bound)
        step = max(1, chunk_elements // (n * n))
        for c in range(0, len(order), step):
            part = order[c : c + step]
            part = part[bound[part] > state["best"] + tolerance]
            if not len(part):
                continue
            stop = state["work"] >= budget
            if not stop and deadline is not None and time.perf_counter() > deadline:
                stop = state["capped"] = True
            if stop:
                state["left"] = max(state["left"], float(bound[part].max()))
                continue
            state["work"] += len(part) * n
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
    upper = max(state["best"] + tolerance, state["left"], floor)
    groups = [np.sort(s) for _, s in found[:keep]]
    return Pricing(groups, upper, proven, "branch-and-bound", capped=bool(state["capped"]) and not proven)


def price_cpsat(
    problem: Grouping,
    pi: np.ndarray,
    cand: np.ndarray,
    *,
    time_limit: float | None = None,
    deterministic_time: float | None = None,
    hint: np.ndarray | None = None,
    threads: int = 1,
    seed: int = 0,
    full: bool = False,
) -> Pricing:
    """Exact pricing with CP-SAT on the candidates: ``x_e`` in S, ``z_ij <= x_i, x_j`` per pair
    (``sum x = cap`` with ``full``: only full groups count, and the bound may be negative).

    ``deterministic_time`` (CP-SAT's own work measure) bounds the search so that, with one
    worker (``threads = 1``) and a fixed ``seed``, the answer is the same on any machine;
    ``time_limit`` (seconds) is an outer cap (``Pricing.capped`` when it, not the work, stopped
    the search).

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
    if full:
        m.add(sum(x) == cap)
    else:
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
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    if deterministic_time is not None:
        solver.parameters.max_deterministic_time = max(MIN_DTIME, deterministic_time)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the run, not just this pricing
    code = run_interruptible(lambda: solver.solve(m), solver.stop_search)
    name = solver.status_name(code)
    # stopped by the clock rather than by its deterministic time (or an optimum): machine-dependent
    capped = (
        name != "OPTIMAL"
        and time_limit is not None
        and (deterministic_time is None or solver.response_proto.deterministic_time < 0.999 * deterministic_time)
    )
    rounding = 0.5 / scale * (cap * (cap - 1) / 2 + cap)
    floor = -math.inf if full else 0.0  # the empty group's value, when it counts
    if name not in ("OPTIMAL", "FEASIBLE"):
        # no answer: the trivial bound (every candidate's best partners, cap of them)
        gain = top_sum(Wc, cap - 1) - pc
        pos = gain if full else np.maximum(gain, 0.0)
        return Pricing([], max(floor, float(top_sum(pos[None, :], cap)[0])), False, "cpsat", capped=capped)
    upper = max(floor, solver.best_objective_bound / scale + rounding)
    chosen = cand[[k for k in range(n) if solver.value(x[k])]]
    groups = [np.sort(chosen)] if len(chosen) else []
    return Pricing(groups, upper, name == "OPTIMAL", "cpsat", capped=capped)


def price_exact(
    problem: Grouping,
    pi: np.ndarray,
    *,
    work: float = PRICING_WORK,
    deadline: float | None = None,
    time_limit: float | None = None,
    hint: np.ndarray | None = None,
    seed: int = 0,
    threshold: float = 0.0,
    tolerance: float = 0.0,
    full: bool = False,
) -> Pricing:
    """Exact pricing within ``work`` units: `price_branch_and_bound` (all of it for groups of
    at most 4 experts, else `BRANCH_SHARE`), then, when that stops early, CP-SAT with one
    worker in the deterministic time the rest buys (`WORK_PER_DTIME`); the least upper bound
    is kept. ``deadline`` (``time.perf_counter()``), or ``time_limit`` seconds from now, caps both
    on the clock (``Pricing.capped`` when it stopped one). With ``full``, over groups of exactly
    ``cap`` experts (every expert a candidate)."""
    if time_limit is not None:
        end = time.perf_counter() + time_limit
        deadline = end if deadline is None else min(deadline, end)
    cand = np.arange(problem.experts) if full else pricing_candidates(problem, pi)
    if not len(cand):
        return Pricing([], 0.0, True, "pruned")
    partners = min(problem.cap, problem.experts) - 1
    potential = top_sum(problem.graph[np.ix_(cand, cand)], partners) - pi[cand]
    cand = cand[np.argsort(-potential, kind="stable")]  # promising experts first: good groups early
    share = 1.0 if problem.cap <= 4 else BRANCH_SHARE
    out = price_branch_and_bound(
        problem,
        pi,
        cand,
        threshold=threshold,
        tolerance=tolerance,
        work=share * work,
        deadline=deadline,
        full=full,
    )
    dtime = (1.0 - share) * work / WORK_PER_DTIME
    if out.proven or problem.cap <= 4 or out.capped or dtime < MIN_DTIME:
        return out
    left = None if deadline is None else deadline - time.perf_counter()
    if left is not None and left < MIN_DTIME:
        return replace(out, capped=True)
    sat = price_cpsat(
        problem,
        pi,
        cand,
        time_limit=left,
        deterministic_time=dtime,
        hint=hint if hint is not None else (out.groups[0] if out.groups else None),
        seed=seed,
        full=full,
    )
    return Pricing(
        sat.groups + out.groups,
        min(out.upper, sat.upper),
        sat.proven,
        "branch-and-bound+cpsat",
        capped=sat.capped,
    )


def reduced_values(problem: Grouping, groups: list[np.ndarray], pi: np.ndarray) -> np.ndarray:
    """``v(S) - pi(S)`` of each group."""
    return np.array([group_value(problem.graph, s) - float(pi[s].sum()) for s in groups])


class Pricer(Protocol):
    """Column pricing for `moeopt.colgen.driver.generate`: one per kind of column value."""

    #: every plan is exactly G columns of the size the pricing prices (so the Lagrangian bound
    #: takes its upper bound as it is, negative too; else ``max(0, upper)``, an empty column)
    full: bool

    def project(self, pi: np.ndarray) -> np.ndarray:
        """Duals at which the Lagrangian bound holds (the rows' sign; ``pi`` itself when free)."""
        ...

    def heuristic(self, pi: np.ndarray) -> list[np.ndarray]:
        """Columns of high reduced value ``v(S) - pi(S)``, best first."""
        ...

    def reduced(self, groups: list[np.ndarray], pi: np.ndarray) -> np.ndarray:
        """``v(S) - pi(S)`` of each column."""
        ...

    def exact(
        self,
        pi: np.ndarray,
        *,
        work: float,
        deadline: float | None,
        hint: np.ndarray | None,
        seed: int,
        threshold: float,
        tolerance: float,
    ) -> Pricing:
        """Columns and a proved upper bound on ``max_S v(S) - pi(S)`` (the empty column included),
        within ``work`` units (`PRICING_WORK`), ``deadline`` an outer wall-clock cap."""
        ...

    def admissible(self, group: np.ndarray) -> bool:
        """Whether a column found by exact pricing may enter the master (e.g. within a load limit)."""
        ...


class GroupingPricer:
    """The grouping's pricing (`Pricer`): quadratic knapsack columns of ``problem``."""

    def __init__(self, problem: Grouping, partition: bool) -> None:
        self.problem = problem
        self.partition = partition
        # E = G cap and the rows "= 1": a plan (and any master solution, as its columns cover
        # E = G cap experts with at most G of them) is G groups of exactly cap experts
        self.full = partition and problem.experts == problem.groups * problem.cap

    def project(self, pi: np.ndarray) -> np.ndarray:
        # rows "= 1": any pi; rows "<= 1": the Lagrangian bound needs pi >= 0
        return pi if self.partition else np.maximum(pi, 0.0)

    def heuristic(self, pi: np.ndarray) -> list[np.ndarray]:
        if self.full:
            return price_heuristic(self.problem, pi, full=True)
        return price_heuristic(self.problem, pi, seeds=pricing_candidates(self.problem, pi))

    def reduced(self, groups: list[np.ndarray], pi: np.ndarray) -> np.ndarray:
        return reduced_values(self.problem, groups, pi)

    def exact(
        self,
        pi: np.ndarray,
        *,
        work: float,
        deadline: float | None,
        hint: np.ndarray | None,
        seed: int,
        threshold: float,
        tolerance: float,
    ) -> Pricing:
        return price_exact(
            self.problem,
            pi,
            work=work,
            deadline=deadline,
            hint=hint,
            seed=seed,
            threshold=threshold,
            tolerance=tolerance,
            full=self.full,
        )

    def admissible(self, group: np.ndarray) -> bool:
        return bool(self.problem.load[group].sum() <= self.problem.load_limit + LOAD_TOL)
