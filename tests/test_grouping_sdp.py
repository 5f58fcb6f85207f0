"""The semidefinite relaxation bound (moeopt/solvers/grouping_sdp.py) against brute-force optima."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.grouping import Grouping
from moeopt.solvers.grouping_sdp import dual_bound, sdp_bound
from tests.grouping_cases import brute_force
from tests.strategies import float_arrays, groupings

pytest.importorskip("cvxpy")


@settings(max_examples=40, deadline=None)
@given(groupings())
def test_bound_is_at_least_the_brute_force_optimum(g: Grouping) -> None:
    home, opt = brute_force(g)
    res = sdp_bound(g, 10.0)
    assert res.bound <= float(np.triu(g.graph, 1).sum()) + 1e-9
    if home is not None:
        assert res.bound >= opt - 1e-7 * max(1.0, abs(opt))


@settings(max_examples=40, deadline=None)
@given(groupings(min_experts=3), st.data())
def test_any_multipliers_give_a_valid_bound(g: Grouping, data) -> None:
    """The recomputed bound holds for arbitrary multipliers, not only the solver's: random
    ones (wrong signs included) never cut below the optimum."""
    home, opt = brute_force(g)
    if home is None:
        return
    E = g.experts
    y = data.draw(float_arrays(E, -2.0, 2.0), label="y")
    z = data.draw(float_arrays(E, -2.0, 2.0), label="z")
    mu = data.draw(float_arrays(E, -2.0, 2.0), label="mu")
    N = data.draw(float_arrays((E, E), -1.0, 1.0), label="N")
    N = 0.5 * (N + N.T)
    for full in (False, True) if E == g.groups * g.cap else (False,):
        assert dual_bound(g, y, z, N, mu, full=full) >= opt - 1e-9 * max(1.0, abs(opt))


def test_near_the_sdp_value_and_certifies_a_planted_grouping() -> None:
    """Four groups of 8 with planted structure: the recomputed bound is the solver's value up
    to its accuracy, and the planted plan is within it."""
    rng = np.random.default_rng(1)
    block = np.repeat(np.arange(4), 8)
    W = rng.random((32, 32)) * (1.0 + 3.0 * (block[:, None] == block[None, :]))
    W = np.triu(W, 1) + np.triu(W, 1).T
    g = Grouping(W, load=np.full(32, 1 / 32), groups=4, cap=8)
    res = sdp_bound(g, 30.0)
    assert res.status == "optimal" and res.sdp_value is not None
    assert res.sdp_value - 1e-6 <= res.bound <= res.sdp_value * (1 + 1e-3)
    plan = g.objective(block)
    assert plan <= res.bound + 1e-9
    assert (res.bound - plan) / res.bound < 0.02  # the planted grouping is certified within 2 %


def test_trivial_cases() -> None:
    W = np.ones((4, 4)) - np.eye(4)
    assert sdp_bound(Grouping(W, load=np.full(4, 0.25), groups=4, cap=1), 1.0).bound == 0.0
    assert sdp_bound(Grouping(np.zeros((4, 4)), load=np.full(4, 0.25), groups=2, cap=2), 1.0).bound == 0.0
