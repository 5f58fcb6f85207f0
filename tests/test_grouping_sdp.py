"""The semidefinite relaxation bound (moeopt/solvers/grouping_sdp.py) against brute-force optima."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.grouping import Grouping
from moeopt.solvers.grouping_sdp import (
    StructureDuals,
    dual_bound,
    load_structure,
    polish,
    sdp_bound,
    structure_terms,
)
from tests.grouping_cases import brute_force, set_partitions
from tests.strategies import float_arrays, groupings, labelled_groupings

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


@settings(max_examples=30, deadline=None)
@given(labelled_groupings())
def test_structured_bound_is_at_least_the_brute_force_optimum(g: Grouping) -> None:
    """With heavy experts: the conflict, label and lifted rows and the polish keep the bound valid."""
    home, opt = brute_force(g)
    if home is None:
        return
    s = load_structure(g)
    assert len(s.labels) >= 2
    assert s.exact == (len(s.labels) == g.groups)
    res = sdp_bound(g, 10.0)
    assert res.bound >= opt - 1e-7 * max(1.0, abs(opt))


@settings(max_examples=30, deadline=None)
@given(labelled_groupings())
def test_structure_rows_hold_at_every_plan(g: Grouping) -> None:
    """Every feasible plan (enumerated) meets the rows: conflicting pairs apart, at most one
    label per GPU (exactly one with ``exact``), and every edge colocated only beside a common
    label or, without ``exact``, beside none."""
    s = load_structure(g)
    K = s.labels
    a, b = s.edges
    for labels in set_partitions(g.experts, g.groups):
        home = np.asarray(labels, dtype=np.int64)
        if g.violations(home):
            continue
        X = home[:, None] == home[None, :]
        assert not (X & s.conflict).any()
        per_gpu = np.bincount(home[K], minlength=g.groups)
        assert (per_gpu <= 1).all()
        if s.exact:
            assert (per_gpu == 1).all()
        together = X[a, b]
        labelled = X[a][:, K].any(axis=1) & X[b][:, K].any(axis=1)
        assert (~together | labelled | (~X[a][:, K].any(axis=1) & ~s.exact)).all()


@settings(max_examples=40, deadline=None)
@given(labelled_groupings(), st.data())
def test_any_structure_multipliers_give_a_valid_bound(g: Grouping, data) -> None:
    """The structure rows' Lagrangian terms, for random multipliers (wrong signs and lifted
    coefficients of the wrong sign included), never cut below the optimum; nor does the
    polish started from them."""
    home, opt = brute_force(g)
    if home is None:
        return
    s = load_structure(g)
    E, m, k = g.experts, len(s.edges[0]), len(s.labels)
    zeros = int(np.triu(s.conflict, 1).sum())

    def draw(shape, name):
        return data.draw(float_arrays(shape, -2.0, 2.0), label=name)

    duals = StructureDuals(
        zero=draw(zeros, "zero"),
        gamma=draw(m, "gamma"),
        alpha=draw((m, k), "alpha"),
        beta=draw((m, k), "beta"),
        alpha0=draw(m, "alpha0"),
        beta0=draw(m, "beta0"),
        rho=draw(E - k, "rho"),
    )
    extra, constant = structure_terms(g, s, duals)
    y, z, mu = draw(E, "y"), draw(E, "z"), draw(E, "mu")
    N = draw((E, E), "N")
    full = E == g.groups * g.cap
    tol = 1e-9 * max(1.0, abs(opt))
    assert dual_bound(g, y, z, N, mu, full=full, extra=extra, constant=constant) >= opt - tol
    polished = polish(
        g,
        y,
        z,
        N,
        mu,
        full=full,
        conflict=s.conflict,
        extra=extra,
        constant=constant,
        deadline=time.perf_counter() + 0.5,
    )
    assert polished >= opt - 1e-7 * max(1.0, abs(opt))


def test_structure_tightens_and_polish_recovers_a_stopped_solve() -> None:
    """Three heavy experts with strong mutual affinity cannot share a GPU: the plain
    relaxation counts much of that affinity, the structured one none. Multipliers of a
    solve stopped early, polished, come back close to the converged bound."""
    rng = np.random.default_rng(3)
    E, G = 9, 3
    W = rng.random((E, E)) * 0.2
    W[:3, :3] = 5.0
    W = np.triu(W, 1) + np.triu(W, 1).T
    load = np.concatenate([np.full(3, 0.25), np.full(E - 3, 0.25 / (E - 3))])
    g = Grouping(W, load=load, groups=G, cap=3, load_limit=0.35)
    s = load_structure(g)
    assert list(s.labels) == [0, 1, 2] and s.exact
    plain = sdp_bound(g, 20.0, structured=False).bound
    structured = sdp_bound(g, 20.0).bound
    _, opt = brute_force(g)
    assert opt <= structured + 1e-9
    assert structured - opt < 0.5 * (plain - opt)  # most of the plain relaxation's excess is gone

    zero = np.zeros(E)
    unpolished = dual_bound(g, zero, zero, np.zeros((E, E)), zero, full=True)
    polished = polish(
        g,
        zero,
        zero,
        np.zeros((E, E)),
        zero,
        full=True,
        conflict=s.conflict,
        extra=np.zeros((E, E)),
        constant=0.0,
        deadline=time.perf_counter() + 5.0,
    )
    assert polished < unpolished
    assert polished >= opt - 1e-9
    assert polished <= structured + 1e-3 * abs(structured)  # back at the converged bound, from zero


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
