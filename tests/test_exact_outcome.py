"""The one exact-outcome type, the shared HiGHS helpers and the one ``available()`` check.

Every exact backend (grouping CP-SAT / highspy / Pyomo, GEM MILP / CP-SAT) returns
:class:`moeopt.outcome.ExactOutcome`; HiGHS models built from arrays go through
:func:`moeopt.solvers.highs_common.highs_milp`, starting plans through ``set_start`` and
``pyomo_highs_start``; optional backends are checked by :func:`moeopt.solvers.available`.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from moeopt.outcome import ExactOutcome, exact_status
from moeopt.profile import Profile
from moeopt.registry import get_method
from moeopt.result import Status, Termination
from moeopt.solvers import CPSAT, HIGHSPY, PYOMO_HIGHS, ExactSettings, available
from tests.grouping_cases import brute_force, random_grouping

#: (termination, holds a plan) -> status, written out by hand
EXPECTED_STATUS = {
    (Termination.OPTIMAL, True): Status.OPTIMAL,
    (Termination.OPTIMAL, False): Status.NO_SOLUTION,
    (Termination.TIME_LIMIT, True): Status.TIME_LIMIT,
    (Termination.TIME_LIMIT, False): Status.NO_SOLUTION,
    (Termination.ITERATION_LIMIT, True): Status.TIME_LIMIT,
    (Termination.INTERRUPTED, True): Status.TIME_LIMIT,
    (Termination.INTERRUPTED, False): Status.NO_SOLUTION,
    (Termination.INFEASIBLE, False): Status.INFEASIBLE,
    (Termination.INFEASIBLE, True): Status.INFEASIBLE,
    (Termination.ERROR, False): Status.ERROR,
    (Termination.ERROR, True): Status.TIME_LIMIT,
}


@pytest.mark.parametrize(("termination", "has_plan"), list(EXPECTED_STATUS))
def test_exact_status_table(termination: Termination, has_plan: bool) -> None:
    assert exact_status(termination, has_plan) is EXPECTED_STATUS[termination, has_plan]


def test_from_termination_drops_plan_and_bound_of_an_infeasibility_proof() -> None:
    out = ExactOutcome.from_termination(
        Termination.INFEASIBLE, home=np.zeros(3, dtype=np.int64), incumbent=1.0, bound=2.0
    )
    assert out.status is Status.INFEASIBLE
    assert out.home is None and out.incumbent is None and out.bound is None
    kept = ExactOutcome.from_termination(Termination.TIME_LIMIT, home=None, incumbent=5.0, bound=7.0)
    assert kept.status is Status.NO_SOLUTION and kept.incumbent is None and kept.bound == 7.0


def test_outcome_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="does not match"):
        ExactOutcome(status=Status.OPTIMAL, home=None, incumbent=None, bound=None)
    with pytest.raises(ValueError, match="does not match"):
        ExactOutcome(status=Status.NO_SOLUTION, home=np.zeros(2, dtype=np.int64), incumbent=None, bound=None)
    with pytest.raises(ValueError, match="sense"):
        ExactOutcome(status=Status.NO_SOLUTION, home=None, incumbent=None, bound=None, sense="up")


def test_gap_follows_sense() -> None:
    home = np.zeros(2, dtype=np.int64)
    top = ExactOutcome(status=Status.TIME_LIMIT, home=home, incumbent=8.0, bound=10.0, sense="max")
    low = ExactOutcome(status=Status.TIME_LIMIT, home=home, incumbent=10.0, bound=8.0, sense="min")
    assert top.gap == pytest.approx(0.25)
    assert low.gap == pytest.approx(0.2)
    assert not top.optimal
    # a bound on the wrong side of the incumbent gives no gap
    assert ExactOutcome(status=Status.TIME_LIMIT, home=home, incumbent=8.0, bound=10.0, sense="min").gap == 0.0


# ----------------------------------------------------------------------------- backends
@pytest.mark.parametrize("name", ["tacg-cpsat", "tacg-highs", "tacg-milp"])
def test_grouping_backends_return_the_one_outcome(name: str) -> None:
    """Same type and fields from every grouping backend; the hint is taken as a start."""
    method = get_method(name)
    if not method.available():
        pytest.skip(f"{name} not available here")
    g = random_grouping(np.random.default_rng(3), E=7, G=3, limited=False)
    best, opt = brute_force(g)
    out = method.backend_module().solve(g, ExactSettings(time_limit=20.0, hint=best))
    assert isinstance(out, ExactOutcome)
    assert out.sense == "max" and out.status is Status.OPTIMAL and out.optimal
    assert out.termination is Termination.OPTIMAL
    assert out.warm_start and out.solver_status
    assert out.incumbent == pytest.approx(opt, rel=1e-5)
    assert 0.0 <= out.build_time <= out.wall_time


def _gem_case() -> tuple[np.ndarray, Profile, int]:
    rng = np.random.default_rng(11)
    n = rng.integers(0, 60, size=(3, 4)).astype(float)
    latency = np.array([[0.2, 0.5, 0.8, 1.1, 1.4, 1.7, 2.0], [0.3, 0.9, 1.5, 2.1, 2.7, 3.3, 3.9]])
    return n, Profile(tile=16, latency=latency), 3


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_gem_backends_return_the_one_outcome(backend: str) -> None:
    """The GEM models return the same type, minimizing, and accept the hint."""
    method = get_method(f"gem-{backend}")
    if not method.available():
        pytest.skip(f"gem-{backend} not available here")
    from moeopt.solvers.gem_models import layer_model, solve_cpsat, solve_milp

    n, prof, slots = _gem_case()
    model = layer_model(n, prof, slots)
    solve = solve_milp if backend == "milp" else solve_cpsat
    out = solve(model, time_limit=20.0, hint=np.array([0, 1, 0, 1]))
    assert isinstance(out, ExactOutcome)
    assert out.sense == "min" and out.status is Status.OPTIMAL
    assert out.warm_start and out.solver_status
    assert out.bound <= out.incumbent + 1e-6 * abs(out.incumbent)
    assert 0.0 <= out.build_time <= out.wall_time


# ----------------------------------------------------------------------------- HiGHS helpers
def _knapsack(integer: bool, maximize: bool):
    """max 5a + 4b + 3c s.t. 2a + 3b + c <= 5, 0 <= a, b, c <= 1 (as min of the negation when
    not maximizing): 9 with integers (a = b = 1), 5 + 3 + 8/3 as an LP."""
    from moeopt.solvers.highs_common import highs_milp

    sign = 1.0 if maximize else -1.0
    return highs_milp(
        sign * np.array([5.0, 4.0, 3.0]),
        np.zeros(3),
        np.ones(3),
        sp.csr_matrix(np.array([[2.0, 3.0, 1.0]])),
        np.array([-np.inf]),
        np.array([5.0]),
        np.full(3, integer),
        maximize=maximize,
    )


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("integer", [True, False])
def test_highs_milp_assembles_the_model(integer: bool, maximize: bool) -> None:
    pytest.importorskip("highspy")
    h = _knapsack(integer, maximize)
    h.run()
    value = h.getInfo().objective_function_value * (1.0 if maximize else -1.0)
    assert value == pytest.approx(9.0 if integer else 5.0 + 3.0 + 8.0 / 3.0, rel=1e-7)


def test_set_start_hands_over_a_plan() -> None:
    """Without search or heuristics HiGHS holds no plan; with the start (a = c = 1) it holds that one."""
    pytest.importorskip("highspy")
    from moeopt.solvers.highs_common import set_start

    objectives = []
    for start in (None, np.array([1.0, 0.0, 1.0])):
        h = _knapsack(True, True)
        if start is not None:
            assert set_start(h, start)
            assert list(h.getSolution().col_value) == [1.0, 0.0, 1.0]
        for option, value in (("mip_max_nodes", 0), ("presolve", "off"), ("mip_heuristic_effort", 0.0)):
            h.setOptionValue(option, value)
        h.run()
        info = h.getInfo()
        objectives.append(info.objective_function_value if info.primal_solution_status == 2 else None)
    assert objectives == [None, pytest.approx(8.0)]
    assert not set_start(_knapsack(True, True), np.array([1.0, 0.0]))  # wrong length: refused


def test_pyomo_start_without_the_interface_is_refused() -> None:
    from moeopt.solvers.highs_common import pyomo_highs_start

    class Bare:
        def set_instance(self, model: object) -> None:
            pass

    assert not pyomo_highs_start(Bare(), object(), [])


# ----------------------------------------------------------------------------- available()
def test_available_follows_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    for backend, module in ((CPSAT, "ortools"), (HIGHSPY, "highspy")):
        assert available(backend) == (importlib.util.find_spec(module) is not None)
    assert not available("moeopt_no_such_module")
    monkeypatch.setitem(sys.modules, CPSAT, None)
    monkeypatch.setitem(sys.modules, "highspy", None)
    monkeypatch.setitem(sys.modules, "pyomo.environ", None)
    assert not available(CPSAT) and not available(HIGHSPY) and not available(PYOMO_HIGHS)
    for name in ("tacg-cpsat", "tacg-highs", "tacg-milp", "gem-cpsat", "gem-milp"):
        assert not get_method(name).available(), name
