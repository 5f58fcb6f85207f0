"""The local search over slot contents: neighbourhoods, screening, kicks (iterated local search).

The joint objective's neighbourhood and kicks (`_Screened`) run on the package's one
search driver (`moeopt.moves.driver`) over the one slot state (`SlotState`, a
`moeopt.moves.slots.SlotTable`)."""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from moeopt.joint.costs import (
    Cost,
)
from moeopt.joint.data import TOL
from moeopt.joint.state import Move, SlotState
from moeopt.moves.driver import descend, iterate


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
    E = state.E
    out = []
    slots = [(g, w) for g in range(G) for w in range(W)]
    for (a, i), (b, j) in itertools.combinations(slots, 2):
        m = Move("swap", a, i, b, j)
        if state.valid(m):
            out.append(m)
    for a, i in slots:
        e = int(state.slots[a, i])
        if e >= 0 and state.c[e] < 2:
            continue
        for f in range(E):
            m = Move("replace", a, i, expert=f)
            if state.valid(m):
                out.append(m)
    return out


@functools.lru_cache(maxsize=8)
def _upper_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(n, 1)``, kept per size (read only): the screening asks for it every round."""
    rows, cols = np.triu_indices(n, 1)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def top_order(values: np.ndarray, n: int) -> np.ndarray:
    """``np.argsort(-values)[:n]``: the indices of the ``n`` largest values, largest first. By a
    partial selection where those ``n`` are distinct and above all the others (the order is then
    the only one: the same indices in the same order), else by the full sort (ties keep its
    order)."""
    neg = -np.asarray(values, dtype=np.float64)
    if n >= len(neg):
        return np.argsort(neg)[:n]
    part = np.argpartition(neg, n)
    top, edge = part[:n], neg[part[n]]
    order = np.argsort(neg[top])
    vals = neg[top[order]]  # ascending: distinct when each step up is strict
    if np.isnan(vals).any() or not vals[-1] < edge or not (vals[1:] > vals[:-1]).all():
        return np.argsort(neg)[:n]
    return top[order]


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
    E = state.E
    flat = state.slots.reshape(-1)
    gpu_of = np.repeat(np.arange(G), W)
    e = np.maximum(flat, 0)
    filled = flat >= 0
    S = affinity @ state.holds  # [E, G] affinity of each expert with each GPU's contents
    wgt = np.where(filled, 1.0 / np.maximum(state.c[e], 1), 0.0)
    own = np.where(filled, S[e, gpu_of], 0.0)
    # swap gain proxy [P, P]: slot p's expert to q's GPU and back
    to_other = S[e][:, gpu_of] - affinity[e][:, e]  # [p, q]: e_p's affinity to GPU of q, minus e_q
    to_other = np.where(filled[:, None], to_other, 0.0)
    gain = wgt[:, None] * (to_other - own[:, None]) + (wgt[:, None] * (to_other - own[:, None])).T
    bad = (gpu_of[:, None] == gpu_of[None, :]) | (flat[:, None] == flat[None, :])
    hold_other = np.where(filled[:, None], state.holds[e][:, gpu_of], False)  # e_p already on GPU of q
    bad |= hold_other | hold_other.T
    gain = np.where(bad, -np.inf, gain)
    iu = _upper_pairs(len(flat))
    g_up = gain[iu]
    moves: list[Move] = []
    n_top = max(count // 3, 1)
    best = top_order(g_up, n_top)
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
                spare = [w for w in range(W) if state.slots[b, w] < 0 or state.c[state.slots[b, w]] >= 2]
                if spare:
                    moves.append(Move("replace", int(b), int(rng.choice(spare)), expert=ea))
        f = int(rng.integers(0, E))
        moves.append(Move("replace", a, i, expert=f))
    # a copy of an expert next to its partners, in a spare slot
    spare_slots = [p for p in range(len(flat)) if flat[p] < 0 or state.c[flat[p]] >= 2]
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
    cost's ``screen`` and ``prescreen``, else `screened_moves`) into a ranked queue,
    priced ``chunk`` at a time, and the improving ones applied (`_try_moves`); the
    queue is rebuilt when used up, wider (``candidates * 2**misses``) after a queue built on
    the current plan held no improving move. After ``patience`` such misses (one on small
    layers) the plan is a local optimum: a kick of ``kick_swaps`` random swaps from the best
    plan starts a new descent, at most ``kicks`` times, and the search stops after
    ``evaluations`` priced moves (None: no such bound). The work bounds fix the result for a
    seed; ``deadline`` (a ``time.perf_counter()`` value) is only a cap, and ``stats.capped``
    says when it ended the search. Returns the best plan, its value and the search's counters.

    The descent is `moeopt.moves.driver.descend` over `_Screened`, the kicks and
    acceptance `moeopt.moves.driver.iterate` (kicks from the best plan).
    """
    t0 = time.perf_counter()
    stats = SearchStats()
    P = state.slots.size
    small = P * (P - 1) // 2 + state.E * P <= exhaustive_below
    space = _Screened(
        cost,
        stats,
        np.zeros((state.E, state.E)) if affinity is None else affinity,
        rng,
        small=small,
        rounds=rounds,
        patience=patience,
        kick_swaps=kick_swaps,
        candidates=candidates,
        confirm=confirm,
        chunk=chunk,
        deadline=deadline,
        evaluations=evaluations,
    )
    best, best_value, log = iterate(space, state.copy(), rng, rounds=kicks, tol=TOL)
    stats.kicks = log.rounds
    stats.start_value = space.start_value
    cost.reset(best)
    stats.value = best_value
    stats.wall_time = time.perf_counter() - t0
    return best, best_value, stats


class _Screened:
    """The joint search as a `moeopt.moves.driver.Neighbourhood` (screened, priced
    moves; a step is the re-priced plan after one or several of them) and a
    `moeopt.moves.driver.Landscape` (`descend` over it, `kick` of random
    swaps, the cost's value). Keeps the counters of `SearchStats`; ``stopped()`` once
    rounds, evaluations or the deadline are spent."""

    def __init__(
        self,
        cost: Cost,
        stats: SearchStats,
        affinity: np.ndarray,
        rng: np.random.Generator,
        *,
        small: bool,
        rounds: int,
        patience: int,
        kick_swaps: int,
        candidates: int,
        confirm: int,
        chunk: int,
        deadline: float | None,
        evaluations: int | None,
    ) -> None:
        self.cost, self.stats, self.affinity, self.rng, self.small = cost, stats, affinity, rng, small
        self.rounds, self.patience, self.kick_swaps = rounds, patience, kick_swaps
        self.candidates, self.confirm, self.chunk = candidates, confirm, chunk
        self.deadline, self.evaluations = deadline, evaluations
        self.start_value = math.nan
        self.best_value = math.inf
        self.current = math.nan  # the value of the plan being descended
        self.queue: list[Move] = []
        self.fresh = False  # the queue was built on the current plan
        self.misses = 0
        self.spent = False

    # -- landscape ----------------------------------------------------------------------------------
    def descend(self, state: SlotState, round: int) -> SlotState:
        self.current = self.cost.reset(state)
        if round < 0:
            self.start_value = self.current
        self.queue, self.fresh, self.misses = [], False, 0
        descend(state, self, self.rounds)
        self._record(self.current)
        return state

    def kick(self, state: SlotState, rng: np.random.Generator, round: int) -> SlotState:
        return kick(state, rng, self.kick_swaps)

    def value(self, state: SlotState) -> float:
        return self.current

    def stopped(self) -> bool:
        return self.spent

    # -- neighbourhood ------------------------------------------------------------------------------
    def best(self, current: SlotState) -> tuple[SlotState, float, int, str, int] | None:
        """Price moves until some improve (the re-priced plan, its value, the moves applied, the
        first one's kind and screening rank); None at a local optimum or when spent."""
        stats, cost = self.stats, self.cost
        while stats.rounds < self.rounds:
            if self.evaluations is not None and stats.evaluated >= self.evaluations:
                break
            if self.deadline is not None and time.perf_counter() > self.deadline:
                stats.capped = True
                break
            stats.rounds += 1
            if self.small:
                part = neighbourhood(current)
                self.queue, self.fresh = [], True
            else:
                if not self.queue:
                    self.queue = self._screen(current)
                    self.fresh = True
                part = []
                while self.queue and len(part) < self.chunk:
                    m = self.queue.pop(0)
                    if current.valid(m):
                        part.append(m)
            if part:
                gains = _price(cost, current, part, self.deadline)
                if gains is None:  # the deadline fell while pricing a whole neighbourhood
                    stats.capped = True
                    break
                stats.evaluated += len(part)
                trial, value, n, first = _try_moves(
                    current, self.current, part, gains, cost, self.confirm, not self.small
                )
                if n:
                    return trial, value, n, part[first].kind, stats.evaluated - len(part) + first
            if self.queue or not self.fresh:
                continue  # more of this queue to price, or a stale queue used up: rebuild
            self.misses += 1
            if not self.small and self.misses < self.patience:
                continue
            return None  # a local optimum
        self.spent = True
        return None

    def apply(self, current: SlotState, step: tuple[SlotState, float, int, str, int]) -> None:
        trial, value, n, kind, rank = step
        current.assign(trial)
        self.current = value
        self.stats.moves += n
        self.stats.accepted.append((kind, rank))
        self.misses, self.fresh = 0, False
        self._record(value)
        self.stats.trajectory.append(self.best_value)

    def _record(self, value: float) -> None:
        """The best value so far, by the driver's rule (better by more than ``TOL``)."""
        if value < self.best_value - TOL:
            self.best_value = value

    def _screen(self, current: SlotState) -> list[Move]:
        count = self.candidates * 2**self.misses
        cost = self.cost
        if hasattr(cost, "screen"):
            queue = cost.screen(current, self.rng, count)
            if hasattr(cost, "prescreen"):
                queue = cost.prescreen(current, queue)
            return queue
        loads = cost.loads() if hasattr(cost, "loads") else np.ones((1, current.G))
        return screened_moves(current, self.affinity, loads, self.rng, count)
