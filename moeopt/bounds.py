"""Cheap valid upper bounds on the grouping objective (formulations/tacg.md, section 5).

The LP relaxation of the exact models is weak past E = 64, so every TACG result (exact or
heuristic) reports the tightest of these bounds, computed in milliseconds per layer:

* `star_bound`: an expert has at most ``cap - 1`` partners in its group, whose loads
  fit in ``load_limit - w[e]``; each pair is counted from both ends, so halve the sum.
  The load-knapsack is relaxed with a Lagrange multiplier per expert.
* `lagrangian_bound`: split each pair's weight between its ends,
  ``a[e, e'] + a[e', e] = W[e, e']``; for every split, the sum over experts of their best
  ``cap - 1`` partners under ``a[e, :]`` (with the load multiplier) bounds the optimum. The
  star bound is the split ``a = W / 2``; subgradient steps on the symmetry of the partner
  choice tighten it (to the fractional b-matching value when they converge).
* `eigenvalue_bound`: the Donath-Hoffman bound ``1/2 min_d [sum_i m_i lambda_i(W +
  diag d) - sum d]`` with group sizes ``m`` filled greedily (``cap`` each), improved over
  the diagonal ``d`` by a few subgradient steps.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from moeopt.grouping import Grouping


def top_sum(values: np.ndarray, count: int) -> np.ndarray:
    """Sum of the ``count`` largest entries along the last axis (also used by `moeopt.colgen`)."""
    n = values.shape[-1]
    if count <= 0:
        return np.zeros(values.shape[:-1])
    top = values if count >= n else np.partition(values, n - count, axis=-1)[..., n - count :]
    total: np.ndarray = top.sum(axis=-1)
    return total


def star_bound(problem: Grouping, multipliers: int = 24) -> float:
    """``1/2 sum_e`` (best affinity of e to ``cap - 1`` partners whose loads fit beside it).

    For each expert e and each ``mu >= 0`` in a grid,
    ``mu (L - w_e) + top_{cap-1} (W[e] - mu w)^+`` bounds e's intra-group affinity
    (Lagrangian relaxation of the partners' load limit); the least over the grid is kept.

    Parameters
    ----------
    problem
        The grouping problem (W, w, G, cap, load limit L).
    multipliers
        Number of positive multipliers tried (0: ignore the load limit).

    Returns
    -------
    float
        A valid upper bound on the optimal intra-group affinity.
    """
    W, w = problem.graph, problem.load
    partners = min(problem.cap, problem.experts) - 1
    plain = top_sum(W, partners)  # mu = 0
    best = plain
    if problem.limited and multipliers > 0 and partners > 0:
        room = np.maximum(problem.load_limit - w, 0.0)
        pos = w > 0
        ratios = W[:, pos] / w[pos][None, :]
        ratios = ratios[ratios > 0]
        if len(ratios):
            mu = np.unique(np.quantile(ratios, np.linspace(0.0, 1.0, multipliers)))
            reduced = np.maximum(W[None, :, :] - mu[:, None, None] * w[None, None, :], 0.0)
            np.einsum("mii->mi", reduced)[...] = 0.0  # an expert is not its own partner
            lag = mu[:, None] * room[None, :] + top_sum(reduced, partners)
            best = np.minimum(plain, lag.min(axis=0))
    return 0.5 * float(best.sum())


def _multipliers(problem: Grouping, count: int) -> np.ndarray:
    """Load multipliers mu >= 0 tried per expert: 0 and quantiles of the ratios W / w."""
    if not problem.limited or count <= 0:
        return np.zeros(1)
    w = problem.load
    pos = w > 0
    ratios = problem.graph[:, pos] / w[pos][None, :]
    ratios = ratios[ratios > 0]
    if not len(ratios):
        return np.zeros(1)
    return np.unique(np.concatenate([[0.0], np.quantile(ratios, np.linspace(0.0, 1.0, count))]))


def _partner_values(split: np.ndarray, problem: Grouping, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per expert, the least over ``mu`` of ``mu (L - w_e) + top_{cap-1} (split[e] - mu w)^+``,
    and the 0/1 partner choice ``[E, E]`` that attains it."""
    E = problem.experts
    c = min(problem.cap, E) - 1
    w = problem.load
    reduced = split[None, :, :] - mu[:, None, None] * w[None, None, :]
    np.einsum("mii->mi", reduced)[...] = -np.inf  # an expert is not its own partner
    # the c largest values per (multiplier, expert); their positions only at each expert's best
    # multiplier (a partition of values is several times faster than one of indices)
    vals = np.partition(reduced, E - c, axis=2)[:, :, E - c :]
    room = np.maximum(problem.load_limit - w, 0.0) if problem.limited else np.zeros(E)
    total = np.maximum(vals, 0.0).sum(axis=2) + mu[:, None] * room[None, :]
    best = total.argmin(axis=0)
    rows = np.arange(E)
    at_best = reduced[best, rows]  # [E, E]
    idx = np.argpartition(at_best, E - c, axis=1)[:, E - c :]
    choice = np.zeros((E, E))
    np.put_along_axis(choice, idx, (np.take_along_axis(at_best, idx, axis=1) > 0).astype(np.float64), axis=1)
    return total[best, rows], choice


def lagrangian_bound(problem: Grouping, iterations: int = 100, multipliers: int = 12) -> float:
    """Lagrangian bound on the symmetry of partner choices (tightens `star_bound`).

    For any split ``a`` with ``a + a^T = W``, a plan's objective equals
    ``sum_e sum_{e' in g(e), e' != e} a[e, e']``, and e's term is at most its best choice of
    ``cap - 1`` partners whose loads fit in ``L - w_e`` (bounded with a load multiplier).
    Starting from ``a = W / 2`` (the star bound), each step moves weight, for every pair
    chosen by one end only, from the choosing end to the other (diminishing step sizes);
    the least value seen is returned.

    Parameters
    ----------
    problem
        The grouping problem.
    iterations
        Subgradient steps (0: the star bound with the same multipliers).
    multipliers
        Positive load multipliers tried per expert.
    """
    E = problem.experts
    if min(problem.cap, E) <= 1:
        return 0.0
    W = problem.graph
    mu = _multipliers(problem, multipliers)
    split = 0.5 * W
    best = np.inf
    top = float(W.max(initial=0.0))
    for it in range(iterations + 1):
        values, choice = _partner_values(split, problem, mu)
        best = min(best, float(values.sum()))
        asym = choice - choice.T  # +1 where e chose e' alone
        norm = float((asym * asym).sum())
        if norm == 0.0 or it == iterations:
            break
        split = split - (top / ((it + 1) * np.sqrt(norm))) * asym
    return max(best, 0.0)


def _sizes(experts: int, groups: int, cap: int) -> np.ndarray:
    """Group sizes paired with descending eigenvalues: ``cap`` each, greedily."""
    m = np.zeros(min(groups, experts))
    left = experts
    for i in range(len(m)):
        m[i] = min(cap, left)
        left -= m[i]
    return m


def eigenvalue_bound(problem: Grouping, iterations: int = 15) -> float:
    """Donath-Hoffman bound with a subgradient search over the diagonal shift.

    For any ``d``, ``sum_g x_g^T W x_g = sum_g x_g^T (W + diag d) x_g - sum d`` and, for
    group-indicator vectors with sizes ``m_1 >= m_2 >= ...``,
    ``sum_g x_g^T M x_g <= sum_i m_i lambda_i(M)`` (eigenvalues descending; Fan's inequality
    applied to the orthonormal columns ``x_g / sqrt(m_g)``). The objective counts each pair
    once, hence the factor 1/2. Ignores the load limit (still valid).

    Parameters
    ----------
    problem
        The grouping problem.
    iterations
        Subgradient steps on ``d`` (0: ``d = 0`` only).
    """
    W = problem.graph
    E = problem.experts
    m = _sizes(E, problem.groups, problem.cap)
    k = int((m > 0).sum())
    if k == 0:
        return 0.0
    d = np.zeros(E)
    best = np.inf
    scale = max(float(np.abs(W).sum(axis=1).max()), 1e-12)
    for it in range(iterations + 1):
        vals, vecs = scipy.linalg.eigh(W + np.diag(d), subset_by_index=[E - k, E - 1], driver="evr")
        vals, vecs = vals[::-1], vecs[:, ::-1]
        value = float(m[:k] @ vals - d.sum())
        best = min(best, value)
        grad = (vecs**2) @ m[:k] - 1.0  # d/dd_j of sum_i m_i lambda_i - sum d
        norm = float(grad @ grad)
        if norm < 1e-18:
            break
        d = d - (scale / (it + 1)) * grad / np.sqrt(norm)
    return 0.5 * max(best, 0.0)


def grouping_bound(
    problem: Grouping, *, lagrangian_iterations: int = 100, eigen_iterations: int = 0
) -> tuple[float, str]:
    """The tightest of the cheap bounds and its name.

    Parameters
    ----------
    problem
        The grouping problem.
    lagrangian_iterations
        Subgradient steps of `lagrangian_bound` (-1: skip it).
    eigen_iterations
        Subgradient steps of `eigenvalue_bound` (-1: skip it).

    Returns
    -------
    tuple
        ``(bound, name)`` with name one of ``'total'``, ``'star'``, ``'lagrangian'``,
        ``'eigenvalue'``.
    """
    cands = {"total": 0.5 * float(problem.graph.sum()), "star": star_bound(problem)}
    if lagrangian_iterations >= 0:
        cands["lagrangian"] = lagrangian_bound(problem, lagrangian_iterations)
    if eigen_iterations >= 0:
        cands["eigenvalue"] = eigenvalue_bound(problem, eigen_iterations)
    name = min(cands, key=cands.__getitem__)
    return cands[name], name
