"""Exact grouping backends (CP-SAT, Pyomo MILP, highspy MILP) against brute force and heuristics."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.errors import InfeasibleError, InputError
from moeopt.grouping import Grouping
from moeopt.heuristics.local_search import iterated_local_search
from moeopt.heuristics.spectral import capacity_repair, spectral_labels
from moeopt.methods.tacg import TacgExact, layer_problems
from moeopt.registry import get_method, method_names, parse_params
from moeopt.result import Status
from moeopt.solvers import ExactSettings
from tests.conftest import DATA
from tests.grouping_cases import brute_force, make_problem, random_grouping, run

EXACT = [n for n in method_names() if isinstance(get_method(n), TacgExact)]
KNOWN = json.loads((DATA / "tacg_known_optima.json").read_text())["cases"]


def known_case(case: dict) -> Grouping:
    """A :class:`Grouping` from a row of ``tests/data/tacg_known_optima.json``."""
    E = len(case["load"])
    W = np.zeros((E, E))
    W[np.triu_indices(E, 1)] = case["graph"]
    limit = math.inf if case["load_limit"] is None else case["load_limit"]
    return Grouping(W + W.T, load=case["load"], groups=case["groups"], cap=case["cap"], load_limit=limit)


def backend(name: str):
    """The solver module of a registered exact method, skipping unavailable ones."""
    method = get_method(name)
    if not method.available():
        pytest.skip(f"{name} not available here")
    return method.backend_module()


def test_every_exact_backend_is_registered() -> None:
    """CP-SAT, Pyomo and highspy backends are all registered."""
    assert set(EXACT) == {"tacg-cpsat", "tacg-milp", "tacg-highs"}


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("seed", range(6))
def test_backend_matches_brute_force(name: str, seed: int) -> None:
    """Optimal status, value = brute force, bound >= optimum, plan feasible (E <= 8)."""
    mod = backend(name)
    rng = np.random.default_rng(100 + seed)
    E = 5 + seed % 4
    g = random_grouping(rng, E=E, G=2 + seed % 3, limited=seed % 2 == 0)
    best, opt = brute_force(g)
    if best is None:
        pytest.skip("random instance infeasible")
    out = mod.solve(g, ExactSettings(time_limit=20.0, hint=None if seed % 3 == 0 else best, seed=seed))
    assert out.status == Status.OPTIMAL
    assert g.feasible(out.home), g.violations(out.home)
    assert g.objective(out.home) == pytest.approx(opt, rel=1e-6, abs=1e-9)
    assert out.incumbent == pytest.approx(opt, rel=1e-5, abs=1e-8)
    assert out.bound >= opt - 1e-7 * max(opt, 1.0)
    assert out.gap is not None and out.gap < 1e-5


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("case", KNOWN, ids=[c["name"] for c in KNOWN])
def test_backend_reproduces_known_optima(name: str, case: dict) -> None:
    """Every backend proves the tabulated optimum; the table's plan is feasible and attains it."""
    mod = backend(name)
    g = known_case(case)
    assert g.feasible(np.array(case["plan"])) and g.objective(np.array(case["plan"])) == pytest.approx(case["optimum"])
    out = mod.solve(g, ExactSettings(time_limit=20.0))
    assert out.status == Status.OPTIMAL
    assert g.objective(out.home) == pytest.approx(case["optimum"], abs=1e-9)


@pytest.mark.parametrize("case", KNOWN, ids=[c["name"] for c in KNOWN])
def test_heuristic_reaches_known_optima(case: dict) -> None:
    """The iterated local search (default engine) finds every tabulated optimum."""
    g = known_case(case)
    rng = np.random.default_rng(0)
    home, _ = iterated_local_search(g, capacity_repair(g, spectral_labels(g.graph, g.groups, rng)), rng)
    assert g.objective(home) == pytest.approx(case["optimum"], abs=1e-9)


@pytest.mark.parametrize("name", EXACT)
def test_backend_proves_packing_infeasible(name: str) -> None:
    """Any pair of these loads exceeds the limit, which no single-expert check reveals."""
    mod = backend(name)
    g = Grouping(np.ones((3, 3)) - np.eye(3), load=[0.35, 0.35, 0.3], groups=2, cap=2, load_limit=0.6)
    g.check_load_limit()  # passes: the hottest expert alone fits
    assert brute_force(g)[0] is None
    assert mod.solve(g, ExactSettings(time_limit=10.0)).status == Status.INFEASIBLE


@pytest.mark.parametrize("name", EXACT)
def test_backend_accepts_plans_exactly_at_the_load_limit(name: str) -> None:
    """Loads from token counts often sum to the limit exactly; such plans stay feasible."""
    mod = backend(name)
    W = np.full((6, 6), 0.1)
    W[0, 1] = W[1, 0] = W[2, 3] = W[3, 2] = W[4, 5] = W[5, 4] = 1.0
    load = np.array([5, 3, 6, 2, 4, 4]) / 24  # each best pair carries exactly 1/3
    g = Grouping(W, load=load, groups=3, cap=2, load_limit=1 / 3)
    out = mod.solve(g, ExactSettings(time_limit=10.0))
    assert out.status == Status.OPTIMAL
    assert g.objective(out.home) == pytest.approx(3.0) == brute_force(g)[1]


@pytest.mark.parametrize("name", EXACT)
def test_backend_refuses_sizes_beyond_the_time_limit(name: str) -> None:
    """A dense E = 256, G = 64 model with a 1 s limit is refused with a clear InputError."""
    mod = backend(name)
    W = np.ones((256, 256))
    g = Grouping(W, load=np.full(256, 1 / 256), groups=64, cap=4)
    with pytest.raises(InputError, match="too many"):
        mod.solve(g, ExactSettings(time_limit=1.0))


@pytest.mark.parametrize("name", EXACT)
def test_backend_respects_the_time_limit(name: str) -> None:
    """On a size no backend closes quickly, the solver stops near the limit holding the hint."""
    mod = backend(name)
    g = random_grouping(np.random.default_rng(7), E=40, G=8, cap=5, limited=True, density=0.5)
    start = capacity_repair(g, spectral_labels(g.graph, 8, np.random.default_rng(0)))
    t0 = time.perf_counter()
    out = mod.solve(g, ExactSettings(time_limit=2.0, hint=start))
    assert time.perf_counter() - t0 < 2.0 + 4.0  # slack for model hand-over on a loaded machine
    assert out.status in (Status.OPTIMAL, Status.TIME_LIMIT)
    assert g.feasible(out.home)
    # a loaded machine may stop HiGHS before its root bound; a bound given must be valid
    assert out.bound is None or out.bound >= g.objective(out.home) - 1e-9


def test_canonical_hint_satisfies_symmetry_breaking() -> None:
    """Renumbered plans keep their groups and meet x[e,g] <= sum_{e'<e} x[e',g-1]."""
    rng = np.random.default_rng(3)
    g = random_grouping(rng, E=12, G=5, cap=3, limited=False)
    home = rng.permutation(np.repeat(np.arange(5), 3))[:12]
    c = g.canonical(home)
    same = home[:, None] == home[None, :]
    assert np.array_equal(same, c[:, None] == c[None, :])
    for e in range(12):
        assert c[e] <= e
        if c[e] >= 1:
            assert (c[:e] == c[e] - 1).any()


# ----------------------------------------------------------------------------- methods
@pytest.mark.parametrize("name", EXACT)
def test_exact_method_plan_feasible_objective_recomputed(name: str) -> None:
    """A registered exact method returns an optimal, feasible plan whose evaluator objective
    equals the backend's, on a 2-layer instance with nodes and E not divisible by G."""
    backend(name)
    p = make_problem(E=10, G=4, gpn=2, k=2, tokens=1500, seed=4)
    r = run(name, p, time_limit=20.0, eps_load=0.6)
    r.plan.check(p.instance.cluster, layers=p.layers, experts=p.experts)
    assert r.status == Status.OPTIMAL
    assert r.objective == pytest.approx(r.stats["solver_objective"], rel=1e-5)
    assert r.bound >= r.objective - 1e-9 and r.gap < 1e-5
    _, groupings, _ = layer_problems(p, parse_params(get_method(name), {"eps_load": 0.6}))
    for l, g in enumerate(groupings):
        assert g.feasible(r.plan.home[l])
        assert g.objective(r.plan.home[l]) == pytest.approx(brute_force(g)[1], rel=1e-6)


def test_exact_method_reports_infeasible_load_limit() -> None:
    """An explicit eps_load below what the hottest expert needs is refused before solving."""
    p = make_problem(E=8, G=4, k=2, seed=0)
    with pytest.raises(InfeasibleError, match="eps_load"):
        run("tacg-cpsat", p, eps_load=0.0)


@settings(max_examples=8)
@given(
    st.integers(0, 1000),
    st.sampled_from([(8, 2), (8, 4), (9, 3), (12, 4)]),
    st.sampled_from([None, 0.5]),
    st.floats(0.3, 3.0),
)
def test_exact_optimum_never_below_any_heuristic(
    seed: int, shape: tuple[int, int], eps: float | None, tau: float
) -> None:
    """CP-SAT's proved optimum >= tacg with and without repair/refinement on the same objective."""
    E, G = shape
    p = make_problem(E=E, G=G, k=2, L=1, tokens=600, seed=seed)
    common = {"eps_load": eps, "tau": tau}
    try:
        exact = run("tacg-cpsat", p, seed=seed, time_limit=20.0, **common)
    except InfeasibleError:
        return
    assert exact.status == Status.OPTIMAL
    for extra in ({}, {"refine": False}, {"repair": False, "refine": False}):
        try:
            h = run("tacg", p, seed=seed, **common, **extra)
        except InfeasibleError:
            continue
        assert h.objective <= exact.objective + 1e-6 * max(exact.objective, 1e-9)
        assert h.bound >= exact.objective - 1e-6 * max(exact.objective, 1e-9)
