"""Spectral grouping and capacity repair (the TACG paper's heuristic, SPEC section 3.3).

1. `spectral_labels`: top-G eigenvectors of ``D^{-1/2} W D^{-1/2}``, rows normalized,
   k-means into G clusters (scipy). Cluster sizes ignore the slots.
2. `capacity_repair`: min-cost assignment of experts to the ``G * cap`` slots (cost =
   minus the affinity of the expert to each cluster, ``scipy.optimize.linear_sum_assignment``),
   then `load_repair`.
3. `load_repair`: while a group exceeds the load limit, the move or swap with the
   least affinity loss that lowers the total squared overload (the one engine's load repair,
   `moeopt.heuristics.local_search`).

`first_fit` is the affinity-blind fix used by the ``repair=false`` ablation;
`grouping_heuristic` chains the steps with the iterated swap search of
`moeopt.heuristics.local_search`.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.cluster.vq import kmeans2
from scipy.optimize import linear_sum_assignment

from moeopt import packing
from moeopt.errors import InfeasibleError
from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.heuristics.local_search import iterated_local_search, repair_load


def spectral_embedding(graph: np.ndarray, dims: int) -> np.ndarray:
    """Rows of the top ``dims`` eigenvectors of ``D^{-1/2} W D^{-1/2}``, unit-normalized."""
    E = graph.shape[0]
    dims = max(1, min(dims, E))
    degree = graph.sum(axis=1)
    inv = 1.0 / np.sqrt(np.maximum(degree, 1e-12 * max(float(degree.max(initial=0.0)), 1e-300)))
    norm = graph * inv[:, None] * inv[None, :]
    _, vecs = scipy.linalg.eigh(norm, subset_by_index=[E - dims, E - 1], driver="evr")
    length = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(length > 0, length, 1.0)


def spectral_labels(graph: np.ndarray, groups: int, rng: np.random.Generator) -> np.ndarray:
    """Cluster ids ``[E]`` in ``[0, groups)`` from k-means on the spectral embedding."""
    E = graph.shape[0]
    if groups <= 1:
        return np.zeros(E, dtype=np.int64)
    if groups >= E:
        return np.arange(E, dtype=np.int64)
    emb = spectral_embedding(graph, groups)
    _, labels = kmeans2(emb, groups, minit="++", seed=rng)
    return labels.astype(np.int64)


def capacity_repair(problem: Grouping, labels: np.ndarray) -> np.ndarray:
    """A slot- and load-feasible plan close to the clusters ``labels``.

    Experts go to slots by a min-cost assignment whose cost is minus the affinity of the expert
    to the cluster that owns the slot (plus a small bonus for the expert's own cluster), so an
    overfull cluster keeps the members most attached to it. Then `load_repair`.

    Raises
    ------
    InfeasibleError
        When the load limit cannot be met from this start (see `load_repair`).
    """
    E, G, cap = problem.experts, problem.groups, problem.cap
    onehot = np.zeros((E, G))
    onehot[np.arange(E), labels] = 1.0
    affinity = problem.graph @ onehot
    scale = max(float(affinity.max(initial=0.0)), 1e-300)
    cost = -(affinity / scale + 1e-3 * onehot)
    slots = np.repeat(cost, cap, axis=1)  # column j is a slot of group j // cap
    rows, cols = linear_sum_assignment(slots)
    home = np.empty(E, dtype=np.int64)
    home[rows] = cols // cap
    return load_repair(problem, home)


def first_fit(problem: Grouping, labels: np.ndarray) -> np.ndarray:
    """Affinity-blind fix (ablation ``repair=false``): heaviest expert first, into its cluster
    when it has a slot and room, else into the least-loaded group with a slot
    (`moeopt.packing.first_fit`); then `load_repair` if the limit
    still fails."""
    home = packing.first_fit(problem.load, labels, problem.groups, problem.cap, problem.load_limit + LOAD_TOL)
    return load_repair(problem, home)


def load_repair(problem: Grouping, home: np.ndarray) -> np.ndarray:
    """Moves and swaps with the least affinity loss until every group meets the load limit.

    The load repair of the one engine (`moeopt.heuristics.local_search.repair_load`):
    each step is the move or swap with the largest affinity gain among those that lower the
    total squared overload. If it stalls, it restarts from a load-balanced packing (heaviest
    first onto the least-loaded group) before giving up.

    Raises
    ------
    InfeasibleError
        When neither start reaches the limit (the message gives the eps_load that would do).
    """
    if not problem.limited:
        return np.asarray(home, dtype=np.int64)
    out = repair_load(problem, np.asarray(home, dtype=np.int64))
    if out is not None:
        return out
    packed = packing.balanced_homes(problem.load, problem.groups, problem.cap)
    out = repair_load(problem, packed)
    if out is not None:
        return out
    reached = float(problem.group_loads(packed).max())
    G = problem.groups
    raise InfeasibleError(
        f"no plan found with largest group load <= (1+eps_load)/G = {problem.load_limit:.6g}; "
        f"use eps_load >= {reached * G - 1:.4g} (met by a load-balanced packing); "
        f"no plan can meet eps_load < {problem.min_max_load() * G - 1:.4g}"
    )


def grouping_heuristic(
    g: Grouping,
    rng: np.random.Generator,
    *,
    repair: bool = True,
    refine: bool = True,
    iterations: int = 1000,
    patience: int = 200,
    kick_swaps: int | None = None,
    hint: np.ndarray | None = None,
    deadline: float | None = None,
) -> tuple[np.ndarray, dict]:
    """One layer's plan: spectral clusters, capacity repair, iterated local search.

    Parameters
    ----------
    g
        The layer's grouping problem.
    rng
        Seeded generator (k-means initialization and kicks).
    repair, refine
        False: `first_fit` instead of `capacity_repair`; no swap search.
    iterations, patience, kick_swaps
        Of `moeopt.heuristics.local_search.iterated_local_search`.
    hint
        Optional plan; used as the start when feasible and better.
    deadline
        ``time.perf_counter()`` value at which the swap search stops.

    Returns
    -------
    tuple
        The plan ``home[e]`` and counters (``spectral``: the objective before the search).
    """
    labels = spectral_labels(g.graph, g.groups, rng)
    home = capacity_repair(g, labels) if repair else first_fit(g, labels)
    info: dict = {"spectral": g.objective(home)}
    if hint is not None and g.feasible(hint) and g.objective(hint) > g.objective(home):
        home = np.asarray(hint, dtype=np.int64)
    if refine:
        home, counters = iterated_local_search(
            g,
            home,
            rng,
            iterations=iterations,
            patience=patience,
            kick_swaps=kick_swaps,
            deadline=deadline,
        )
        info.update(counters)
    return home, info
