"""The triangle relaxation bound (moeopt/solvers/grouping_triangle.py) against brute-force optima."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.bounds import grouping_bound
from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.solvers.grouping_triangle import (
    star_rhs,
    triangle_bound,
    violated_stars,
    violated_triangles,
)
from tests.grouping_cases import brute_force, set_partitions
from tests.strategies import groupings

pytest.importorskip("highspy")


def feasible_plans(g: Grouping) -> list[np.ndarray]:
    """Every feasible plan of a tiny grouping, as colocation matrices ``[E, E]`` (0/1)."""
    out = []
    for label in set_partitions(g.experts, g.groups):
        home = np.array(label)
        if (np.bincount(home, minlength=g.groups) > g.cap).any():
            continue
        if (np.bincount(home, weights=g.load, minlength=g.groups) > g.load_limit + LOAD_TOL).any():
            continue
        same = (home[:, None] == home[None, :]).astype(float)
        np.fill_diagonal(same, 0.0)
        out.append(same)
    return out


@given(groupings())
def test_bound_is_at_least_the_brute_force_optimum(g: Grouping) -> None:
    home, opt = brute_force(g)
    res = triangle_bound(g, 10.0)
    total = float(np.triu(g.graph, 1).sum())
    assert res.bound <= total + 1e-9
    if home is not None:
        assert res.bound >= opt - 1e-7 * max(1.0, abs(opt))
        for _, b in res.history:  # valid at every round, not only at the end
            assert b >= opt - 1e-7 * max(1.0, abs(opt))
    bounds = [b for _, b in res.history]
    assert all(b2 <= b1 + 1e-12 for b1, b2 in zip(bounds, bounds[1:], strict=False))


@given(groupings(min_experts=4), st.integers(0, 2**32 - 1))
def test_every_cut_holds_at_every_plan(g: Grouping, seed: int) -> None:
    """Cuts separated from a random fractional point are met by every feasible plan."""
    rng = np.random.default_rng(seed)
    Y = rng.random((g.experts, g.experts))
    Y = np.triu(Y, 1) + np.triu(Y, 1).T
    plans = feasible_plans(g)
    for i, j, k in violated_triangles(Y, 1000):
        for same in plans:
            assert same[i, j] + same[i, k] - same[j, k] <= 1 + 1e-12
    for i, T, weight, rhs in violated_stars(Y, g, (1.0, 0.5, 0.25), 1000):
        for same in plans:
            lhs = same[i, T].sum() - weight * np.triu(same[np.ix_(T, T)], 1).sum()
            assert lhs <= rhs + 1e-9


def test_star_rhs() -> None:
    assert star_rhs(1.0, 5) == 1.0  # r = 1 or 2
    assert star_rhs(0.5, 5) == 1.5  # r = 2: 2 - 0.5; r = 3: 3 - 1.5
    assert star_rhs(0.0, 4) == 4.0
    assert star_rhs(1.0, 0) == 0.0


def test_dual_bound_matches_the_lp_when_converged() -> None:
    rng = np.random.default_rng(5)
    W = rng.random((16, 16))
    W = np.triu(W, 1) + np.triu(W, 1).T
    g = Grouping(W, load=rng.dirichlet(np.ones(16)), groups=4, cap=4)
    g = g.replace(load_limit=1.2 * g.min_max_load())
    res = triangle_bound(g, 30.0)
    assert res.converged and res.lp_value is not None
    assert res.bound >= res.lp_value - 1e-6 * abs(res.lp_value)
    assert res.bound <= res.lp_value + 1e-6 * abs(res.lp_value)


def test_tighter_than_the_cheap_bounds_on_large_groups() -> None:
    """Two groups of 8 with planted structure: the relaxation closes most of the cheap gap."""
    rng = np.random.default_rng(0)
    block = np.repeat(np.arange(2), 8)
    W = rng.random((16, 16)) * (1.0 + 4.0 * (block[:, None] == block[None, :]))
    W = np.triu(W, 1) + np.triu(W, 1).T
    g = Grouping(W, load=np.full(16, 1 / 16), groups=2, cap=8)
    cheap, _ = grouping_bound(g)
    res = triangle_bound(g, 30.0)
    plan = g.objective(block)
    assert plan <= res.bound + 1e-9
    assert res.bound < cheap - 0.5 * (cheap - plan)


def test_no_pairs_no_affinity() -> None:
    W = np.ones((4, 4)) - np.eye(4)
    g = Grouping(W, load=np.full(4, 0.25), groups=4, cap=1)
    assert triangle_bound(g, 1.0).bound == 0.0
