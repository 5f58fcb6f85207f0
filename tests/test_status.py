"""Status model: why a solve stopped (termination) apart from what it holds; one word per ending."""

from __future__ import annotations

import numpy as np
import pytest

from moeopt.plan import Plan
from moeopt.result import (
    CPSAT_TERMINATION,
    HIGHS_TERMINATION,
    PYOMO_TERMINATION,
    Result,
    Status,
    Termination,
    combine_termination,
    cpsat_termination,
    highs_termination,
    pyomo_termination,
)


def test_every_highs_status_is_mapped():
    """Every HiGHS model status has a termination; an interrupt is never a time limit."""
    highspy = pytest.importorskip("highspy")
    names = [n for n in dir(highspy.HighsModelStatus) if n.startswith("k")]
    assert names
    for name in names:
        assert name in HIGHS_TERMINATION, name
    assert highs_termination("kInterrupt") is Termination.INTERRUPTED
    assert highs_termination("kIterationLimit") is Termination.ITERATION_LIMIT
    assert highs_termination("kSolveError") is Termination.ERROR
    assert highs_termination("kSomethingNew") is Termination.ERROR


def test_every_pyomo_termination_is_mapped():
    """Every Pyomo v2 TerminationCondition has a termination; errors stay errors."""
    pytest.importorskip("pyomo")
    from pyomo.contrib.solver.common.results import TerminationCondition

    for cond in TerminationCondition:
        assert cond.name in PYOMO_TERMINATION, cond.name
    assert pyomo_termination("interrupted") is Termination.INTERRUPTED
    assert pyomo_termination("error") is Termination.ERROR
    assert pyomo_termination("maxTimeLimit") is Termination.TIME_LIMIT


def test_every_cpsat_status_is_mapped():
    """CP-SAT: MODEL_INVALID is an error (not 'no solution'); an early stop is an interrupt."""
    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    for code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE, cp_model.MODEL_INVALID, cp_model.UNKNOWN):
        assert cp_model.CpSolver().status_name(code) in CPSAT_TERMINATION
    assert cpsat_termination("MODEL_INVALID", 0.1, 10) is Termination.ERROR
    assert cpsat_termination("FEASIBLE", 10.0, 10) is Termination.TIME_LIMIT
    assert cpsat_termination("FEASIBLE", 1.0, 10) is Termination.INTERRUPTED
    assert cpsat_termination("UNKNOWN", 2.0, 10) is Termination.INTERRUPTED


def test_interrupt_is_never_a_time_limit():
    """No table maps an interrupt or an error to a time limit."""
    for table in (HIGHS_TERMINATION, PYOMO_TERMINATION):
        for name, term in table.items():
            if "nterrupt" in name or "rror" in name:
                assert term not in (Termination.TIME_LIMIT, Termination.OPTIMAL), name


def test_combine_termination_takes_the_worst():
    """Layers combine to their worst ending."""
    assert combine_termination([Termination.OPTIMAL, Termination.TIME_LIMIT]) is Termination.TIME_LIMIT
    assert combine_termination([Termination.TIME_LIMIT, Termination.INTERRUPTED]) is Termination.INTERRUPTED
    assert combine_termination([]) is Termination.COMPLETED


def _plan() -> Plan:
    return Plan(slots=np.array([[[0], [1]]]), experts=2)


def test_result_rejects_a_bound_on_the_wrong_side():
    """A lower bound above a minimized objective (or an upper bound below a maximized one) is refused."""
    with pytest.raises(ValueError, match="not a valid bound"):
        Result("m", Status.FEASIBLE, _plan(), objective=1.0, bound=1.5, sense="min")
    with pytest.raises(ValueError, match="not a valid bound"):
        Result("m", Status.FEASIBLE, _plan(), objective=2.0, bound=1.0, sense="max")
    r = Result("m", Status.FEASIBLE, _plan(), objective=1.0, bound=0.9, sense="min")
    assert r.termination is Termination.COMPLETED and r.status.solution == "feasible"


def test_exact_and_heuristic_agree_on_optimality(quickstart_path):
    """tacg and tacg-cpsat both call a plan optimal when the bound closes on it."""
    from moeopt.io import load_instance
    from moeopt.solve import load_workloads, solve

    inst = load_instance(quickstart_path)
    wl = load_workloads(inst)
    exact = solve(inst, method="tacg-cpsat", workloads=wl, layer_time_limit=20)
    assert exact.status is Status.OPTIMAL and exact.termination is Termination.OPTIMAL
    heur = solve(inst, method="tacg", workloads=wl)
    if heur.bound is not None and heur.bound <= heur.objective + 1e-9 * max(1.0, heur.bound):
        assert heur.status is Status.OPTIMAL
