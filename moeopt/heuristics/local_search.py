"""The one local-search engine over homes: slot repair, load repair and move/swap refinement.

The package has one search engine in two parts: this module prices and applies move/swap
steps of homes ``[E]`` for the grouping objectives (TACG, agnostic, METIS and hypergraph
refinement, crosslayer), and `moeopt.moves` holds what every search shares: the slot
state of slot-level plans (`moeopt.moves.slots.SlotTable`, used by the balance and
joint planners) and the driver (`moeopt.moves.driver.descend`,
`moeopt.moves.driver.iterate`) that runs TACG's iterated local search here
(`iterated_local_search`), the balance planner's descents and iterated search, and the
joint planner's search.

A plan is ``home [E]`` (the GPU of each expert), G GPUs of ``slots`` places each, an optional
load limit on ``Σ_{e on g} load[e]``. The engine (`local_search`) only needs, for a
plan, the gain of every single move ``[E, G]`` and a pair correction ``[E, E]`` that turns two
moves into the gain of a swap; an objective supplies those through the `Gain` protocol:

* `AffinityGain`: the pairwise grouping objective ``Σ_g Σ_{e<e' in g} W[e, e']``
  (tacg, agnostic, metis), kept up to date incrementally between steps;
* `moeopt.heuristics.hyperedges.ConnectivityGain`: the (λ − 1) objective (hypergraph;
  ``crosslayer`` wraps it with fixed home pins and a next-layer term);
* `LoadBalanceGain`: minus ``Σ_g load_g²`` (the balanced start, `balanced_start`).

On top of it: `constrained_search` (several starts, keep the best), the ``eps_load``
rule shared by every grouping method (`resolve_eps_load`, `limited_search`), and
the grouping-problem drivers `descend`, `repair_load`, `kick` and
`iterated_local_search` (TACG's engine, SPEC section 10).

The ``eps_load`` rule (tacg, agnostic, hypergraph, metis, crosslayer)
    Unset: the automatic limit (`moeopt.grouping.auto_eps_load`), a hard limit like an
    explicit one. Explicit: ``(1 + eps_load) / G`` of the layer's load, hard. ``.inf``: none.
    When no plan is found within the limit the method fails and says which eps_load would
    do. Only when the user asks (``relax_eps_load: true``) is a limit that repair cannot
    meet relaxed, by ``RELAX_STEP`` at most ``RELAX_TRIES`` times (`relax_until_met`),
    and the relaxation reported in the result's note (`eps_load_report`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from moeopt.errors import InfeasibleError, InputError
from moeopt.grouping import LOAD_TOL, Grouping, auto_eps_load, min_max_load
from moeopt.moves import driver
from moeopt.moves.driver import Moves
from moeopt.packing import round_robin_lpt

#: Gains below this are treated as zero (floating point noise from sparse products).
TOL = 1e-9

#: With ``relax_eps_load``, a load limit that repair cannot reach is multiplied by this
#: factor, at most ``RELAX_TRIES`` times (without it every limit is hard).
RELAX_STEP = 1.1
RELAX_TRIES = 10


# ============================================================================ gains
class Gain(Protocol):
    """A gain model: an objective to improve by moves and swaps (larger gain = better).

    The engine asks for the gains at the current plan once per round, after applying the
    previous round's steps; the first call gives the initial gains, and a model may keep
    state between calls and update it from the experts whose GPU changed since the last
    call (`AffinityGain` does, in ``O(E)`` per moved expert). A model may set a
    class attribute ``local = True`` when the swap gain of e and f depends only on the
    plan's contents of their two GPUs: the engine then recomputes only the swap gains of
    experts on the GPUs a step touched.
    """

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        """``move[e, g]``: gain of moving e to g (0 at its home); ``pair[e, f]``: correction
        such that swapping e and f (on different GPUs) gains
        ``move[e, home f] + move[f, home e] - pair[e, f]``."""
        ...


class AffinityGain:
    """Gains of the pairwise objective Σ_g Σ_{e<e' in g} W[e, e'] (W symmetrized).

    With ``S = W X`` (X the one-hot GPU matrix) a move e -> g gains ``S[e, g] - S[e, h(e)]``
    and the pair correction is ``2 W``. ``S`` is kept between calls and updated column by
    column for the experts that moved (``O(E)`` per moved expert instead of ``O(E² G)``).

    Attributes
    ----------
    local
        True: a step between GPUs a and b changes only the swap gains of experts on a or b,
        so the engine refreshes only those rows and columns of its swap scores.
    """

    local = True

    def __init__(self, graph: np.ndarray) -> None:
        w = np.asarray(graph, dtype=np.float64)
        self.graph = (w + w.T) / 2.0
        np.fill_diagonal(self.graph, 0.0)
        self._pair = 2.0 * self.graph
        self._home: np.ndarray | None = None
        self._S = np.zeros((0, 0))

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        E = len(home)
        moved = None if self._home is None or self._S.shape != (E, gpus) else np.flatnonzero(home != self._home)
        if moved is None or len(moved) > max(4, E // 8):
            onehot = np.zeros((E, gpus))
            onehot[np.arange(E), home] = 1.0
            self._S = self.graph @ onehot  # [E, G] affinity of e with each group
        else:
            assert self._home is not None
            for e in moved:
                col = self.graph[:, e]
                self._S[:, self._home[e]] -= col
                self._S[:, home[e]] += col
        self._home = np.array(home, dtype=np.int64)
        S = self._S
        return S - S[np.arange(E), home][:, None], self._pair


# ============================================================================ engine
@dataclass
class SearchLog:
    """What `local_search` did: repair moves/swaps, refinement moves/swaps."""

    repair_moves: int = 0
    repair_swaps: int = 0
    refine_moves: int = 0
    refine_swaps: int = 0
    limit_met: bool = True
    capped: bool = False  # a deadline ended the refinement (or skipped starts)
    relaxed: int = 0  # times the load limit was relaxed (relax_eps_load, see relax_until_met)

    def add(self, other: SearchLog) -> None:
        for f in ("repair_moves", "repair_swaps", "refine_moves", "refine_swaps", "relaxed"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.limit_met = self.limit_met and other.limit_met
        self.capped = self.capped or other.capped


def _excess(x: np.ndarray, limit: float) -> np.ndarray:
    return np.maximum(x - limit, 0.0)


def _steps(
    move_score: np.ndarray | None,
    swap_score: np.ndarray | None,
    home: np.ndarray,
    gpus: int,
    *,
    threshold: float,
    batch: bool,
) -> list[tuple[int, int, int]]:
    """The steps of one round: ``(kind, e, x)``, kind 0 = move e to GPU x, kind 1 = swap e
    with expert x; candidates scoring ``<= threshold`` are skipped (None: no candidates).

    Without ``batch``: the best move (first in row-major order on ties), replaced by the best
    swap only when that gains strictly more. With ``batch``: the best steps on pairwise
    disjoint GPU pairs. A step changes only its two GPUs, and both objectives' gains (and
    the load potential) of a step depend only on those GPUs, so steps on disjoint pairs keep
    their exact gains when applied together.
    """
    scores = [(kind, score) for kind, score in ((0, move_score), (1, swap_score)) if score is not None]
    if not batch:
        best: tuple[float, int, int, int] | None = None
        for kind, score in scores:  # a swap replaces the best move only when it gains strictly more
            i = int(np.argmax(score))
            if score.flat[i] > (threshold if best is None else best[0]):
                best = (float(score.flat[i]), kind, *divmod(i, score.shape[1]))
        return [] if best is None else [best[1:]]
    want = 4 * gpus
    cands: list[tuple[float, int, int, int]] = []
    for kind, score in scores:
        flat = score.ravel()
        n = min(want, flat.size)
        top = np.argpartition(-flat, n - 1)[:n] if n < flat.size else np.arange(flat.size)
        top = top[flat[top] > threshold]
        cols = score.shape[1]
        cands.extend((float(flat[i]), kind, int(i // cols), int(i % cols)) for i in top)
    cands.sort(key=lambda c: -c[0])
    used = np.zeros(gpus, dtype=bool)
    steps = []
    for _, kind, e, x in cands:
        a, b = home[e], (x if kind == 0 else home[x])
        if used[a] or used[b]:
            continue
        steps.append((kind, e, x))
        used[a] = used[b] = True
    return steps


def local_search(
    home: np.ndarray,
    gain: Gain,
    gpus: int,
    slots: int,
    *,
    load: np.ndarray | None = None,
    limit: float | None = None,
    refine: bool = True,
    batch: bool = True,
    max_steps: int = 100_000,
    tol: float = TOL,
    deadline: float | None = None,
) -> tuple[np.ndarray, SearchLog]:
    """Capacity repair, load repair and swap/move refinement of one layer's homes.

    1. **Slot repair**: while a GPU holds more than ``slots`` experts, move an expert of an
       over-full GPU to a GPU with a free slot with the largest gain (least loss), preferring
       destinations that stay within the load limit.
    2. **Load repair** (when ``limit`` is given): while some GPU's ``Σ load[e] > limit``,
       apply the move or swap with the largest gain among those that take load off a GPU over
       the limit without pushing the receiving GPU over it (a swap brings back a lighter
       expert); where none is left, among those that strictly reduce the potential
       ``Σ_g max(0, load_g − limit)²`` (squared, so that splitting an excess between two GPUs
       counts as progress). Both lower the excess at every step but may do so by tiny amounts,
       so each stage stops after ``4 E G + 10`` rounds (a stalled repair: ``limit_met``
       False; `moeopt.heuristics.spectral.load_repair` then restarts from a balanced
       packing).
    3. **Refinement** (``refine``): best-improvement moves to free slots and swaps, each
       keeping every slot and load limit, until no step gains more than ``tol``.

    Each phase is a `moeopt.moves.driver.descend` over its own steps. Each round prices
    every move and swap at once (numpy); with ``batch`` it applies the
    best steps on pairwise disjoint GPU pairs together (see `_steps`). For a gain with
    ``local = True`` (`AffinityGain`) refinement keeps its swap scores and refreshes
    only the rows and columns of experts on the GPUs a step touched.

    Parameters
    ----------
    home
        int ``[E]`` initial GPUs (any, capacities may be violated).
    gain
        The objective's move and swap gains (`Gain`).
    gpus, slots
        G and the slots per GPU (``cap``); needs ``gpus * slots >= E``.
    load
        float ``[E]`` expert loads (``ubar``), needed with ``limit``.
    limit
        Largest total load a GPU may hold, ``(1 + eps_load) / G`` for loads summing to 1.
    refine
        Run step 3.
    batch
        Apply several disjoint steps per round (False: the single best step per round).
    max_steps
        Safety cap on the rounds of each phase.
    tol
        Smallest gain refinement accepts.
    deadline
        ``time.perf_counter()`` value after which refinement stops (``log.capped``); repair
        always runs to its end, so the plan stays feasible.

    Returns
    -------
    home, log
        The new homes and a `SearchLog` (``limit_met`` False when load repair
        stalled; slot capacities always hold on return).

    Raises
    ------
    InfeasibleError
        When ``gpus * slots < E``.
    """
    home = np.asarray(home, dtype=np.int64).copy()
    E = len(home)
    if gpus * slots < E:
        raise InfeasibleError(f"{gpus} GPUs x {slots} slots cannot hold {E} experts")
    log = SearchLog()
    load = np.zeros(E) if load is None else np.asarray(load, dtype=np.float64)
    lim = np.inf if limit is None else float(limit)
    idx = np.arange(E)
    gid = np.arange(gpus)

    def state() -> tuple[np.ndarray, np.ndarray]:
        return np.bincount(home, minlength=gpus), np.bincount(home, weights=load, minlength=gpus)

    def apply(steps: list[tuple[int, int, int]], phase: str) -> np.ndarray:
        """Apply the steps; the GPUs they touched."""
        touched = []
        for kind, e, x in steps:
            touched += [int(home[e]), int(x if kind == 0 else home[x])]
            if kind == 0:
                home[e] = x
            else:
                home[e], home[x] = home[x], home[e]
            name = f"{phase}_{'moves' if kind == 0 else 'swaps'}"
            setattr(log, name, getattr(log, name) + 1)
        return np.array(touched, dtype=np.int64)

    Steps = list[tuple[int, int, int]]

    # 1. slots: each move reduces the overflow by one
    def overflow(home: np.ndarray) -> Steps | None:
        count, gl = state()
        if (count <= slots).all():
            return None
        move, _ = gain.gains(home, gpus)
        ok = (count[home] > slots)[:, None] & (count < slots)[None, :]
        within = gl[None, :] + load[:, None] <= lim + TOL
        s_move = np.where(ok, move + np.where(within, 0.0, -1e18), -np.inf)
        # one move per over-full source and destination GPU per round keeps counts exact
        return _steps(s_move, None, home, gpus, threshold=-np.inf, batch=batch)

    driver.descend(home, Moves(overflow, lambda home, steps: apply(steps, "repair")), max_steps)

    # 2. load limit: first only steps that unload a GPU over the limit without pushing the
    # receiving GPU over it (each lowers the total excess and creates none), then any step that
    # lowers the squared excess
    def best_of(home: np.ndarray, move: np.ndarray, pair: np.ndarray, ok_m: np.ndarray, ok_s: np.ndarray) -> Steps:
        """The best admissible repair steps (``ok_m [E, G]`` moves, ``ok_s [E, E]`` swaps)."""
        swap = move[idx[:, None], home[None, :]] + move[idx[None, :], home[:, None]] - pair
        return _steps(
            np.where(ok_m, move, -np.inf), np.where(ok_s, swap, -np.inf), home, gpus, threshold=-np.inf, batch=batch
        )

    def unload(home: np.ndarray) -> Steps | None:
        count, gl = state()
        over = gl > lim + TOL
        if not over.any():
            return None
        move, pair = gain.gains(home, gpus)
        src = over[home]  # experts on a GPU over the limit
        ok_m = src[:, None] & (count < slots)[None, :] & (gl[None, :] + load[:, None] <= lim + TOL)
        ok_s = (
            src[:, None]
            & (home[:, None] != home[None, :])
            & (load[None, :] < load[:, None])
            & (gl[home][None, :] - load[None, :] + load[:, None] <= lim + TOL)
        )
        return best_of(home, move, pair, ok_m, ok_s) or None

    # each repair stage takes at most ``repair_steps`` rounds: both lower the excess at every
    # step but can crawl (tiny decreases), and a caller with a stalled repair has a fallback
    repair_steps = min(max_steps, 4 * E * gpus + 10)
    if limit is not None:
        driver.descend(home, Moves(unload, lambda home, steps: apply(steps, "repair")), repair_steps)

    def excess(home: np.ndarray) -> Steps | None:
        count, gl = state()
        exc = _excess(gl, lim) ** 2
        if np.sqrt(exc.sum()) <= TOL:
            return None
        move, pair = gain.gains(home, gpus)
        he = gl[home]  # [E] load of each expert's GPU
        d_move = (
            _excess(he - load, lim)[:, None] ** 2
            + _excess(gl[None, :] + load[:, None], lim) ** 2
            - exc[home][:, None]
            - exc[None, :]
        )
        ok_m = (count < slots)[None, :] & (home[:, None] != gid[None, :]) & (d_move < -(TOL**2))
        diff = load[:, None] - load[None, :]  # u_e - u_f
        d_swap = (
            _excess(he[:, None] - diff, lim) ** 2
            + _excess(he[None, :] + diff, lim) ** 2
            - exc[home][:, None]
            - exc[home][None, :]
        )
        ok_s = (home[:, None] != home[None, :]) & (d_swap < -(TOL**2))
        steps = best_of(home, move, pair, ok_m, ok_s)
        if not steps:
            log.limit_met = False  # stalled above the limit
            return None
        return steps

    if (
        limit is not None
        and driver.descend(home, Moves(excess, lambda home, steps: apply(steps, "repair")), repair_steps)
        == repair_steps
    ):
        log.limit_met = False  # out of steps

    # 3. refinement within every limit
    local = bool(getattr(gain, "local", False))
    swap_score = np.empty((E, E))
    rows = idx  # rows (and columns) of swap_score to recompute

    def improving(home: np.ndarray) -> Steps | None:
        if deadline is not None and time.perf_counter() > deadline:
            log.capped = True
            return None
        count, gl = state()
        move, pair = gain.gains(home, gpus)
        free = count < slots
        move_score = None  # no GPU has a free slot: no moves (the common case E = G slots)
        if free.any():
            move_score = np.where(free[None, :] & (gl[None, :] + load[:, None] <= lim + TOL), move, -np.inf)
        he = gl[home]
        hr = home[rows]
        dw = load[None, :] - load[rows, None]  # load change of the row expert's GPU
        ok_s = (hr[:, None] != home[None, :]) & (he[rows, None] + dw <= lim + TOL) & (he[None, :] - dw <= lim + TOL)
        block = move[rows][:, home] + move[:, hr].T - pair[rows]
        block = np.where(ok_s, block, -np.inf)
        swap_score[rows] = block
        swap_score[:, rows] = block.T
        return _steps(move_score, swap_score, home, gpus, threshold=tol, batch=batch) or None

    def refine_step(home: np.ndarray, steps: Steps) -> None:
        nonlocal rows
        touched = apply(steps, "refine")
        if local:
            hit = np.zeros(gpus, dtype=bool)
            hit[touched] = True
            rows = np.flatnonzero(hit[home])

    if refine and log.limit_met:
        driver.descend(home, Moves(improving, refine_step), max_steps)
    return home, log


# ============================================================================ balanced start
class LoadBalanceGain:
    """Gains of minus ``Σ_g load_g²`` (a flatter load profile is a positive gain).

    Moving e (load ``w_e``) from a to b changes ``Σ load²`` by ``2 w_e (L_b − L_a) + 2 w_e²``;
    a swap of e (on a) and f (on b) by the two moves' sum minus ``4 w_e w_f``, so the pair
    correction is ``-4 w wᵀ``. The swap gain of e and f depends only on the loads of their
    two GPUs (``local``).
    """

    local = True

    def __init__(self, load: np.ndarray) -> None:
        self.load = np.asarray(load, dtype=np.float64)
        self._pair = -4.0 * np.outer(self.load, self.load)

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        w = self.load
        gl = np.bincount(home, weights=w, minlength=gpus)
        move = -(2.0 * w[:, None] * (gl[None, :] - gl[home][:, None]) + 2.0 * w[:, None] ** 2)
        move[np.arange(len(home)), home] = 0.0
        return move, self._pair


def balanced_start(load: np.ndarray, gpus: int, slots: int, *, max_steps: int = 100_000) -> np.ndarray:
    """The most load-balanced homes found here: round-robin LPT, then a swap/move descent.

    `round_robin_lpt` (every GPU gets one expert per round
    of G, heavy experts paired with light ones), then the engine's best-improvement moves to
    free slots and swaps on `LoadBalanceGain` until none lowers ``Σ_g load_g²``.

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    gpus, slots
        G and slots per GPU.
    max_steps
        Safety cap on the descent steps.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes within the slot capacities.
    """
    start = round_robin_lpt(load, gpus, slots)
    home, _ = local_search(start, LoadBalanceGain(load), gpus, slots, batch=False, max_steps=max_steps, tol=1e-15)
    return home


# ============================================================================ several starts
def constrained_search(
    starts: list[np.ndarray],
    gain: Gain,
    gpus: int,
    slots: int,
    *,
    load: np.ndarray,
    limit: float | None,
    refine: bool,
    score: Callable[[np.ndarray], float],
    balanced: bool = True,
    deadline: float | None = None,
) -> tuple[np.ndarray, SearchLog]:
    """Repair and refine each start (and `balanced_start`); keep the best feasible
    (refinement stops at ``deadline``, see `local_search`).

    Parameters
    ----------
    starts
        Initial homes ``[E]`` (e.g. one per partitioner seed).
    gain, gpus, slots, load, limit, refine
        As in `local_search`.
    balanced
        Also start from `balanced_start`: the start that meets tight load limits
        without repair, and often the better one for local search. Without it the balanced
        start is still tried when no other start meets the load limit.
    score
        Objective of a plan, larger is better; picks the best start.

    Returns
    -------
    home, log
        The best plan meeting every limit and its log; when no plan met the load limit, the
        first attempt with ``log.limit_met`` False.
    """
    best: np.ndarray | None = None
    fallback: np.ndarray | None = None
    best_log, best_val = SearchLog(limit_met=False), -np.inf
    attempts = list(starts) + ([balanced_start(load, gpus, slots)] if balanced else [])
    for i, h in enumerate(attempts):
        if best is not None and deadline is not None and time.perf_counter() > deadline:
            best_log.capped = True  # out of time: the other starts are not repaired
            break
        cand, log = local_search(h, gain, gpus, slots, load=load, limit=limit, refine=refine, deadline=deadline)
        if not log.limit_met:
            if best is None and fallback is None:
                best_log, fallback = log, cand
            if best is None and not balanced and i == len(attempts) - 1:
                attempts.append(balanced_start(load, gpus, slots))  # the last resort for a tight limit
                balanced = True
            continue
        val = score(cand)
        if best is None or val > best_val + TOL:
            best, best_log, best_val = cand, log, val
    out = best if best is not None else fallback
    assert out is not None
    return out, best_log


# ============================================================================ the eps_load rule
def resolve_eps_load(eps_load: float | None, load: np.ndarray, gpus: int, slots: int) -> float | None:
    """The eps_load to apply: None gives the automatic limit of
    `moeopt.grouping.auto_eps_load` (hard, like an explicit one); ``.inf`` gives none."""
    if eps_load is None:
        return auto_eps_load(load, gpus, slots)
    return None if math.isinf(eps_load) else eps_load


def load_limit(eps_load: float | None, gpus: int, load: np.ndarray) -> float | None:
    """``(1 + eps_load) · Σ load / G``, or None without a limit; raises when unattainable.

    Raises
    ------
    InfeasibleError
        When one expert alone exceeds the limit, so no plan can meet it.
    """
    if eps_load is None:
        return None
    if eps_load < 0:
        raise InputError(None, "method.eps_load", f"must be >= 0, got {eps_load}")
    limit = (1.0 + eps_load) * float(load.sum()) / gpus
    if load.max() > limit + TOL:
        raise InfeasibleError(
            f"load limit eps_load={eps_load:g} is unattainable: the hottest expert alone carries "
            f"{load.max() * gpus / load.sum():.3f}x the mean GPU load; use eps_load >= "
            f"{load.max() * gpus / load.sum() - 1:.4f}"
        )
    return limit


class LimitNotMet(InfeasibleError):
    """Repair found no plan within the load limit (a heuristic's failure, not a proof that
    none exists; an unattainable limit raises plain `InfeasibleError`)."""


def unmet_limit_error(eps_load: float, load: np.ndarray, gpus: int, slots: int) -> LimitNotMet:
    """The error of an eps_load that no plan found meets: why, and what would do."""
    total = float(np.sum(load))
    reached = np.bincount(balanced_start(load, gpus, slots), weights=load, minlength=gpus).max()
    need = min_max_load(load, gpus, slots)
    return LimitNotMet(
        f"no plan found with every GPU's load share <= (1 + eps_load)/G at eps_load={eps_load:g} "
        f"(repair stalled); use eps_load >= {reached * gpus / total - 1:.4g} (met by a load-balanced "
        f"packing) or relax_eps_load: true; no plan can meet eps_load < {need * gpus / total - 1:.4g}"
    )


T = TypeVar("T")


def relax_until_met(attempt: Callable[[float], T | None], eps_load: float, *, relax: bool) -> tuple[T, float, int]:
    """Run ``attempt(eps_load)`` (None: the limit was not met), relaxing the limit if asked.

    Without ``relax`` the limit is tried once; with it, the limit ``1 + eps_load`` is
    multiplied by ``RELAX_STEP`` up to ``RELAX_TRIES`` times until an attempt meets it.

    Returns
    -------
    result, eps_load, relaxations
        The first result that met its limit, the eps_load it met and how many times the
        limit was relaxed.

    Raises
    ------
    InfeasibleError
        When no attempt met its limit (the caller adds why and what would fix it).
    """
    eps = eps_load
    for tries in range((RELAX_TRIES if relax else 0) + 1):
        out = attempt(eps)
        if out is not None:
            return out, eps, tries
        eps = (1.0 + eps) * RELAX_STEP - 1.0
    raise InfeasibleError(f"no plan met the load limit, last tried eps_load={eps_load:g}")


def limited_search(
    starts: list[np.ndarray],
    gain: Gain,
    gpus: int,
    slots: int,
    *,
    load: np.ndarray,
    eps_load: float | None,
    relax: bool = False,
    **kwargs: Any,
) -> tuple[np.ndarray, SearchLog, float | None]:
    """`constrained_search` under the eps_load rule (module docstring): the limit is
    hard unless ``relax``; ``eps_load`` None means no limit (resolve it first with
    `resolve_eps_load`).

    Returns
    -------
    home, log, eps_load
        The plan, its log (``log.relaxed``: relaxation steps) and the eps_load it meets.

    Raises
    ------
    InfeasibleError
        When eps_load is unattainable; `LimitNotMet` when no plan found meets it
        (nor, with ``relax``, its relaxations).
    """
    if eps_load is None:
        home, log = constrained_search(starts, gain, gpus, slots, load=load, limit=None, **kwargs)
        return home, log, None
    load_limit(eps_load, gpus, load)  # raises when the hottest expert alone is above it

    def attempt(eps: float) -> tuple[np.ndarray, SearchLog] | None:
        limit = (1.0 + eps) * float(load.sum()) / gpus
        home, log = constrained_search(starts, gain, gpus, slots, load=load, limit=limit, **kwargs)
        return (home, log) if log.limit_met else None

    try:
        (home, log), used, relaxed = relax_until_met(attempt, eps_load, relax=relax)
    except InfeasibleError:
        raise unmet_limit_error(eps_load, load, gpus, slots) from None
    log.relaxed = relaxed
    return home, log, used


def eps_load_report(eps_load: Sequence[float | None], relaxed: Sequence[int]) -> dict[str, Any]:
    """Result stats of the eps_load rule: the eps_load each layer meets, how often its limit
    was relaxed (only with ``relax_eps_load``), and a note when any was.

    The note names no layer (the executor may solve layers one at a time and merge their
    stats); ``eps_load_relaxed`` has one count per layer.
    """
    out: dict[str, Any] = {"eps_load": eps_load, "eps_load_relaxed": relaxed}
    if any(relaxed):
        out["note"] = (
            f"relax_eps_load: repair could not meet the load limit, relaxed by x{RELAX_STEP} steps "
            "(stats.eps_load_relaxed: steps per layer; stats.eps_load: the limits met)"
        )
    return out


# ============================================================================ grouping drivers
def _tolerance(problem: Grouping) -> float:
    return 1e-12 * max(float(problem.graph.max(initial=0.0)), 1e-300) * max(problem.experts, 1)


def _limit(problem: Grouping) -> float | None:
    return problem.load_limit + LOAD_TOL - TOL if problem.limited else None


def descend(
    problem: Grouping, home: np.ndarray, *, max_steps: int | None = None, gain: AffinityGain | None = None
) -> np.ndarray:
    """Best-improvement moves and pairwise swaps until none improves (feasibility kept).

    `local_search` with `AffinityGain`, one step per round.

    Parameters
    ----------
    problem
        The grouping problem.
    home
        int ``[E]`` a feasible starting plan (slots and load limit).
    max_steps
        Stop after this many improving steps (default: no limit).
    gain
        The problem's `AffinityGain`, reused across calls (default: a new one).

    Returns
    -------
    numpy.ndarray
        A locally optimal plan, int ``[E]``.
    """
    home, _ = local_search(
        home,
        AffinityGain(problem.graph) if gain is None else gain,
        problem.groups,
        problem.cap,
        load=problem.load,
        limit=_limit(problem),
        batch=False,
        max_steps=100_000 if max_steps is None else max_steps,
        tol=_tolerance(problem),
    )
    return home


def repair_load(problem: Grouping, home: np.ndarray) -> np.ndarray | None:
    """Slot and load repair of ``home`` (`local_search` without refinement, one step
    per round); None when the repair stalls above the limit."""
    home, log = local_search(
        home,
        AffinityGain(problem.graph),
        problem.groups,
        problem.cap,
        load=problem.load,
        limit=_limit(problem),
        refine=False,
        batch=False,
    )
    return home if log.limit_met else None


def kick(problem: Grouping, home: np.ndarray, swaps: int, rng: np.random.Generator) -> np.ndarray:
    """Apply ``swaps`` random feasible swaps between experts of different groups."""
    home = np.asarray(home, dtype=np.int64).copy()
    E = problem.experts
    if problem.groups < 2 or E < 2:
        return home
    loads = problem.group_loads(home)
    limit = problem.load_limit + LOAD_TOL
    w = problem.load
    tries = rng.integers(0, E, size=(4 * swaps, 2))
    done = 0
    for e, f in tries:
        a, b = home[e], home[f]
        if a == b:
            continue
        if problem.limited and (loads[a] - w[e] + w[f] > limit or loads[b] - w[f] + w[e] > limit):
            continue
        home[e], home[f] = b, a
        loads[a] += w[f] - w[e]
        loads[b] += w[e] - w[f]
        done += 1
        if done == swaps:
            break
    return home


def iterated_local_search(
    problem: Grouping,
    home: np.ndarray,
    rng: np.random.Generator,
    *,
    iterations: int = 1000,
    patience: int | None = 200,
    kick_swaps: int | None = None,
    deadline: float | None = None,
) -> tuple[np.ndarray, dict]:
    """Iterated local search: kick the current plan, descend, accept if not worse
    (`moeopt.moves.driver.iterate` over `_GroupingSpace`).

    Parameters
    ----------
    problem
        The grouping problem.
    home
        A feasible starting plan.
    rng
        Source of the random kicks (the result is deterministic given its state).
    iterations
        Kick-and-descend rounds.
    patience
        Stop after this many rounds without a new best (None: never).
    kick_swaps
        Random swaps per kick; by default each kick draws its size uniformly from
        ``2 .. 2 max(2, E // 10)`` (mixing small and large perturbations).
    deadline
        ``time.perf_counter()`` value after which the search stops (breaks determinism only
        when it is reached).

    Returns
    -------
    tuple
        The best plan found and counters ``{'rounds', 'improvements', 'capped'}`` (``capped``:
        1 when the deadline, not the iterations or the patience, ended the search).
    """
    space = _GroupingSpace(problem, kick_swaps)
    best, _, log = driver.iterate(
        space, home, rng, rounds=iterations, patience=patience, sideways=True, tol=space.tol, deadline=deadline
    )
    return best, {"rounds": log.rounds, "improvements": log.improvements, "capped": int(log.capped)}


class _GroupingSpace:
    """The grouping problem as a `Landscape`: `descend`,
    random-swap kicks (`kick`) and minus the objective."""

    def __init__(self, problem: Grouping, kick_swaps: int | None) -> None:
        self.problem = problem
        self.fixed = kick_swaps
        self.swaps = kick_swaps if kick_swaps is not None else max(2, problem.experts // 10)
        self.gain = AffinityGain(problem.graph)
        self.tol = _tolerance(problem)

    def descend(self, home: np.ndarray, round: int) -> np.ndarray:
        return descend(self.problem, home, gain=self.gain)

    def kick(self, home: np.ndarray, rng: np.random.Generator, round: int) -> np.ndarray:
        size = self.swaps if self.fixed is not None else int(rng.integers(2, 2 * self.swaps + 1))
        return kick(self.problem, home, size, rng)

    def value(self, home: np.ndarray) -> float:
        return -self.problem.objective(home)
