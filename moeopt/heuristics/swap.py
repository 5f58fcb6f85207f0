"""Local search for the capacity-constrained grouping: moves, pairwise swaps, iterated search.

Gains are evaluated for every move and every swap at once with numpy. With ``S = W X`` (X the
one-hot group matrix, ``S[e, g]`` = affinity of e to group g) and ``own[e] = S[e, h(e)]``:

* move e -> g: ``S[e, g] - own[e]`` (needs a free slot and room for ``w[e]`` in g);
* swap e <-> e' (different groups): ``Q[e, e'] + Q[e', e] - 2 W[e, e']`` with
  ``Q[e, e'] = S[e, h(e')] - own[e]`` (needs both new group loads within the limit).

:func:`iterated_local_search` (the default TACG engine, SPEC section 10) alternates random
feasible swaps (a kick) with best-improvement local search and keeps the best plan; it is
deterministic for a given generator and iteration budget.
"""

from __future__ import annotations

import time

import numpy as np

from moeopt.grouping import LOAD_TOL, Grouping


class _State:
    """A plan with its affinity-to-group matrix, group loads and sizes, and the gain of every
    swap, kept up to date.

    A move or swap changes only groups a and b: column a and b of ``S``, their loads, and so
    only the swap gains of pairs with an end in a or b. Those rows and columns of the gain
    matrix are recomputed (``O(E cap)`` work per step instead of ``O(E^2)``).
    """

    def __init__(self, problem: Grouping, home: np.ndarray) -> None:
        self.p = problem
        self.home = np.asarray(home, dtype=np.int64).copy()
        onehot = np.zeros((problem.experts, problem.groups))
        onehot[np.arange(problem.experts), self.home] = 1.0
        self.S = problem.graph @ onehot
        self.loads = problem.group_loads(self.home)
        self.sizes = problem.group_sizes(self.home)
        self.limit = problem.load_limit + LOAD_TOL
        self.swap_gain = np.empty((problem.experts, problem.experts))
        self._refresh(np.arange(problem.experts))

    def _swap_rows(self, rows: np.ndarray) -> np.ndarray:
        """Swap gains ``[len(rows), E]`` (-inf where the swap is not allowed)."""
        p, home, S = self.p, self.home, self.S
        E = p.experts
        own = S[np.arange(E), home]
        hr = home[rows]
        gain = (S[rows][:, home] - own[rows, None]) + (S[:, hr].T - own[None, :]) - 2.0 * p.graph[rows]
        ok = hr[:, None] != home[None, :]
        if p.limited:
            w = p.load
            dw = w[None, :] - w[rows, None]  # change on the group of the row's expert
            ok &= (self.loads[hr][:, None] + dw <= self.limit) & (self.loads[home][None, :] - dw <= self.limit)
        return np.where(ok, gain, -np.inf)

    def _refresh(self, rows: np.ndarray) -> None:
        block = self._swap_rows(rows)
        self.swap_gain[rows] = block
        self.swap_gain[:, rows] = block.T

    def _apply(self, e: int, g: int) -> None:
        a = int(self.home[e])
        col = self.p.graph[:, e]
        self.S[:, a] -= col
        self.S[:, g] += col
        self.loads[a] -= self.p.load[e]
        self.loads[g] += self.p.load[e]
        self.sizes[a] -= 1
        self.sizes[g] += 1
        self.home[e] = g

    def move(self, e: int, g: int) -> None:
        a = int(self.home[e])
        self._apply(e, g)
        self._refresh(np.flatnonzero((self.home == a) | (self.home == g)))

    def swap(self, e: int, f: int) -> None:
        a, b = int(self.home[e]), int(self.home[f])
        self._apply(e, b)
        self._apply(f, a)
        self._refresh(np.flatnonzero((self.home == a) | (self.home == b)))

    def best_step(self, tol: float) -> tuple[float, str, int, int]:
        """The best improving move or swap ``(gain, kind, i, j)``; gain <= tol means none."""
        p, home, S = self.p, self.home, self.S
        E = p.experts
        best = (tol, "", -1, -1)
        # moves into groups with a free slot (E x G: recomputed, cheap)
        open_ = self.sizes < p.cap
        if open_.any():
            own = S[np.arange(E), home]
            gain = S - own[:, None]
            ok = open_[None, :] & (home[:, None] != np.arange(p.groups)[None, :])
            if p.limited:
                ok &= self.loads[None, :] + p.load[:, None] <= self.limit
            gain = np.where(ok, gain, -np.inf)
            i = int(np.argmax(gain))
            if gain.flat[i] > best[0]:
                best = (float(gain.flat[i]), "move", i // p.groups, i % p.groups)
        i = int(np.argmax(self.swap_gain))
        if self.swap_gain.flat[i] > best[0]:
            best = (float(self.swap_gain.flat[i]), "swap", i // E, i % E)
        return best


def _tolerance(problem: Grouping) -> float:
    return 1e-12 * max(float(problem.graph.max(initial=0.0)), 1e-300) * max(problem.experts, 1)


def local_search(problem: Grouping, home: np.ndarray, *, max_steps: int | None = None) -> np.ndarray:
    """Best-improvement moves and pairwise swaps until none improves (feasibility kept).

    Parameters
    ----------
    problem
        The grouping problem.
    home
        int ``[E]`` a feasible starting plan (slots and load limit).
    max_steps
        Stop after this many improving steps (default: no limit).

    Returns
    -------
    numpy.ndarray
        A locally optimal plan, int ``[E]``.
    """
    state = _State(problem, home)
    tol = _tolerance(problem)
    steps = 0
    while max_steps is None or steps < max_steps:
        gain, kind, i, j = state.best_step(tol)
        if not kind:
            break
        if kind == "move":
            state.move(i, j)
        else:
            state.swap(i, j)
        steps += 1
    return state.home


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
    """Iterated local search: kick the current plan, descend, accept if not worse.

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
    swaps = kick_swaps if kick_swaps is not None else max(2, problem.experts // 10)
    cur = local_search(problem, home)
    cur_val = problem.objective(cur)
    best, best_val = cur.copy(), cur_val
    tol = _tolerance(problem)
    since = rounds = improvements = capped = 0
    for _ in range(iterations):
        if deadline is not None and time.perf_counter() > deadline:
            capped = 1
            break
        if patience is not None and since >= patience:
            break
        rounds += 1
        size = swaps if kick_swaps is not None else int(rng.integers(2, 2 * swaps + 1))
        cand = local_search(problem, kick(problem, cur, size, rng))
        val = problem.objective(cand)
        if val >= cur_val - tol:
            cur, cur_val = cand, val
        if val > best_val + tol:
            best, best_val = cand.copy(), val
            improvements += 1
            since = 0
        else:
            since += 1
    return best, {"rounds": rounds, "improvements": improvements, "capped": capped}


def arrange_nodes(
    problem: Grouping, home: np.ndarray, gpus_per_node: int, rng: np.random.Generator, iterations: int = 50
) -> np.ndarray:
    """Relabel the groups so that groups with strong mutual affinity share a node.

    The G groups are themselves grouped into ``G / gpus_per_node`` nodes (same search on the
    quotient graph ``X^T W X``, cap ``gpus_per_node``); each group keeps its experts, so the
    intra-group objective and every load are unchanged.
    """
    G = problem.groups
    if gpus_per_node >= G or G % gpus_per_node:
        return home
    onehot = np.zeros((problem.experts, G))
    onehot[np.arange(problem.experts), home] = 1.0
    quotient = onehot.T @ problem.graph @ onehot
    np.fill_diagonal(quotient, 0.0)
    nodes = G // gpus_per_node
    q = Grouping(graph=quotient, load=np.zeros(G), groups=nodes, cap=gpus_per_node)
    start = np.arange(G) // gpus_per_node
    node, _ = iterated_local_search(q, start, rng, iterations=iterations, patience=max(10, iterations // 2))
    # GPU ids: node n holds GPUs n*gpn .. n*gpn + gpn - 1, assigned in group order
    order = np.argsort(node, kind="stable")
    gpu_of_group = np.empty(G, dtype=np.int64)
    gpu_of_group[order] = np.arange(G)
    return gpu_of_group[home]


def node_affinity(graph: np.ndarray, home: np.ndarray, gpus_per_node: int) -> float:
    """Affinity between experts on different GPUs of one node."""
    node = home // gpus_per_node
    mask = (node[:, None] == node[None, :]) & (home[:, None] != home[None, :])
    return float(np.triu(graph * mask, k=1).sum())
