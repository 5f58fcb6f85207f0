"""moeopt.result: termination tables per backend, combining layers, gaps, bounds and Result's checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.plan import Plan
from moeopt.result import (
    CPSAT_TERMINATION,
    HIGHS_TERMINATION,
    OPTIMALITY_TOLERANCE,
    PYOMO_LEGACY_TERMINATION,
    PYOMO_TERMINATION,
    Result,
    Status,
    Termination,
    bound_closes,
    combine_status,
    combine_termination,
    cpsat_termination,
    highs_termination,
    pyomo_termination,
    relative_gap,
)

#: worst first, as documented by combine_termination / combine_status
TERMINATION_ORDER = [
    Termination.ERROR,
    Termination.INFEASIBLE,
    Termination.INTERRUPTED,
    Termination.ITERATION_LIMIT,
    Termination.TIME_LIMIT,
    Termination.COMPLETED,
    Termination.OPTIMAL,
]
STATUS_ORDER = [Status.ERROR, Status.INFEASIBLE, Status.NO_SOLUTION, Status.TIME_LIMIT, Status.FEASIBLE, Status.OPTIMAL]

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _plan() -> Plan:
    return Plan(slots=np.array([[[0], [1]]]), experts=2)


def _expected(name: str) -> set[Termination]:
    """What a backend code may sensibly mean, from the words in its name."""
    low = name.lower()
    if "interrupt" in low:
        return {Termination.INTERRUPTED}
    if "timelimit" in low or "time_limit" in low:
        return {Termination.TIME_LIMIT}
    if "error" in low or "invalid" in low or "notset" in low or "empty" in low or "licens" in low:
        return {Termination.ERROR}
    if "infeasible" in low:
        return {Termination.INFEASIBLE}
    if low in ("koptimal", "optimal", "convergencecriteriasatisfied"):
        return {Termination.OPTIMAL}
    if "limit" in low or "target" in low or "bound" in low or "steplength" in low:
        return {Termination.ITERATION_LIMIT, Termination.ERROR}  # memory limit: an error
    return {Termination.ERROR}  # unknown, unbounded (the models are bounded): cannot be trusted


# ----------------------------------------------------------------------------- backend tables
def test_highs_codes_all_map_sensibly():
    """Every highspy HighsModelStatus maps to the termination its name says; the table has no stale names."""
    highspy = pytest.importorskip("highspy")
    names = list(highspy.HighsModelStatus.__members__)
    assert names
    for name in names:
        assert highs_termination(name) in _expected(name), name
    assert set(HIGHS_TERMINATION) <= set(names)


def test_pyomo_codes_all_map_sensibly():
    """Every Pyomo v2 TerminationCondition maps to the termination its name says."""
    pytest.importorskip("pyomo")
    from pyomo.contrib.solver.common.results import TerminationCondition

    names = [c.name for c in TerminationCondition]
    for name in names:
        assert name in PYOMO_TERMINATION, name
        assert pyomo_termination(name) in _expected(name), name
    assert set(PYOMO_TERMINATION) <= set(names)


def test_cpsat_codes_all_map_sensibly():
    """Every CP-SAT CpSolverStatus is in the table; OPTIMAL/INFEASIBLE/MODEL_INVALID mean what they say."""
    pytest.importorskip("ortools")
    from ortools.sat import cp_model_pb2

    names = list(cp_model_pb2.CpSolverStatus.keys())
    assert set(names) == set(CPSAT_TERMINATION)
    assert cpsat_termination("OPTIMAL", 0.1, 10.0) is Termination.OPTIMAL
    assert cpsat_termination("INFEASIBLE", 0.1, 10.0) is Termination.INFEASIBLE
    assert cpsat_termination("MODEL_INVALID", 10.0, 10.0) is Termination.ERROR


@given(
    name=st.sampled_from(["FEASIBLE", "UNKNOWN", "OPTIMAL", "INFEASIBLE", "MODEL_INVALID", "NEW_CODE"]),
    limit=st.floats(min_value=0.01, max_value=1e4),
    share=st.floats(min_value=0.0, max_value=2.0),
)
def test_cpsat_early_stop_is_an_interrupt(name, limit, share):
    """A CP-SAT stop well before its time limit is an interrupt, never a time limit; unknown codes are errors."""
    wall = share * limit
    term = cpsat_termination(name, wall, limit)
    if wall < 0.95 * limit:
        assert term is not Termination.TIME_LIMIT
    if name in ("FEASIBLE", "UNKNOWN"):
        assert term is (Termination.TIME_LIMIT if wall >= 0.95 * limit else Termination.INTERRUPTED)
    if name == "NEW_CODE":
        assert term is Termination.ERROR


@given(st.text(max_size=20))
def test_unknown_codes_are_errors(name):
    """A code no table knows is an error (never a time limit or an optimum)."""
    if name not in HIGHS_TERMINATION:
        assert highs_termination(name) is Termination.ERROR
    if name not in PYOMO_TERMINATION and name not in PYOMO_LEGACY_TERMINATION:
        assert pyomo_termination(name) is Termination.ERROR


def test_no_interrupt_is_a_time_limit():
    """An interrupted code maps to INTERRUPTED in every table."""
    for table in (HIGHS_TERMINATION, PYOMO_TERMINATION, PYOMO_LEGACY_TERMINATION, CPSAT_TERMINATION):
        for name, term in table.items():
            if "nterrupt" in name:
                assert term is Termination.INTERRUPTED, name


# ----------------------------------------------------------------------------- combining layers
@given(st.lists(st.sampled_from(list(Termination)), max_size=8), st.randoms(use_true_random=False))
def test_combine_termination_is_the_worst(values, rnd):
    """Layers combine to their worst ending, in any order; no layers means a completed search."""
    got = combine_termination(values)
    if not values:
        assert got is Termination.COMPLETED
        return
    assert got is min(values, key=TERMINATION_ORDER.index)
    shuffled = list(values)
    rnd.shuffle(shuffled)
    assert combine_termination(shuffled) is got
    assert (got is Termination.OPTIMAL) == all(v is Termination.OPTIMAL for v in values)


def test_combine_termination_precedence():
    """error > infeasible > interrupted > iteration limit > time limit > completed > optimal."""
    for worse, better in zip(TERMINATION_ORDER[:-1], TERMINATION_ORDER[1:], strict=True):
        assert combine_termination([better, worse]) is worse
        assert combine_termination([worse, better]) is worse


@given(st.lists(st.sampled_from(list(Status)), max_size=8))
def test_combine_status_is_the_worst(values):
    """Layer statuses combine to the worst; a plan only when every layer has one."""
    got = combine_status(values)
    if not values:
        assert got is Status.FEASIBLE
        return
    assert got is min(values, key=STATUS_ORDER.index)
    assert got.has_plan == all(v.has_plan for v in values)


# ----------------------------------------------------------------------------- status and result
def test_status_words_and_default_termination():
    """Each status says what it holds and implies a termination when the method gives none."""
    implied = {
        Status.OPTIMAL: Termination.OPTIMAL,
        Status.FEASIBLE: Termination.COMPLETED,
        Status.TIME_LIMIT: Termination.TIME_LIMIT,
        Status.INFEASIBLE: Termination.INFEASIBLE,
        Status.NO_SOLUTION: Termination.TIME_LIMIT,
        Status.ERROR: Termination.ERROR,
    }
    for status, term in implied.items():
        plan = _plan() if status.has_plan else None
        r = Result("m", status, plan)
        assert r.termination is term
        assert status.solution == ("optimal" if status is Status.OPTIMAL else "feasible" if plan else "none")
    r = Result("m", Status.TIME_LIMIT, _plan(), termination=Termination.INTERRUPTED)
    assert r.termination is Termination.INTERRUPTED


def test_result_needs_a_plan_and_a_sense():
    """A status that holds a plan needs one; the sense is min or max."""
    for status in (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT):
        with pytest.raises(ValueError, match="needs a plan"):
            Result("m", status, None)
    with pytest.raises(ValueError, match="sense"):
        Result("m", Status.FEASIBLE, _plan(), sense="maximize")


@given(objective=finite, bound=finite, sense=st.sampled_from(["min", "max"]))
def test_result_accepts_exactly_the_valid_bounds(objective, bound, sense):
    """A bound on the wrong side of the objective (beyond 1e-6 relative) is refused, any other kept."""
    tol = 1e-6 * max(1.0, abs(objective))
    wrong = bound > objective + tol if sense == "min" else bound < objective - tol
    if wrong:
        with pytest.raises(ValueError, match="not a valid bound"):
            Result("m", Status.FEASIBLE, _plan(), objective=objective, bound=bound, sense=sense)
    else:
        r = Result("m", Status.FEASIBLE, _plan(), objective=objective, bound=bound, sense=sense)
        assert r.gap == relative_gap(objective, bound, sense) and math.isfinite(r.gap)
        if bound > objective if sense == "min" else bound < objective:  # wrong side, within tolerance
            assert r.gap == 0.0


# ----------------------------------------------------------------------------- gaps
@given(objective=finite, slack=st.floats(min_value=0.0, max_value=1e6), sense=st.sampled_from(["min", "max"]))
def test_relative_gap(objective, slack, sense):
    """gap = |bound - objective| / max(|objective|, 1e-9), zero when the bound meets the objective."""
    bound = objective - slack if sense == "min" else objective + slack
    gap = relative_gap(objective, bound, sense)
    assert gap == pytest.approx(abs(bound - objective) / max(abs(objective), 1e-9), rel=1e-9, abs=1e-12)
    assert relative_gap(objective, objective, sense) == 0.0
    assert relative_gap(None, bound, sense) is None and relative_gap(objective, None, sense) is None


def test_gap_at_a_zero_objective():
    """MaxVio can be 0 (a perfectly balanced plan): the gap stays finite, 0 when the bound is 0 too."""
    assert relative_gap(0.0, 0.0, "min") == 0.0
    assert math.isfinite(relative_gap(0.0, -0.5, "min"))
    r = Result("m", Status.OPTIMAL, _plan(), objective=0.0, bound=0.0)
    assert r.gap == 0.0 and bound_closes(r.objective, r.bound)
    # a bound on the wrong side of a zero objective falls back to the 1e-6 absolute tolerance
    Result("m", Status.FEASIBLE, _plan(), objective=0.0, bound=5e-7)
    with pytest.raises(ValueError, match="not a valid bound"):
        Result("m", Status.FEASIBLE, _plan(), objective=0.0, bound=2e-6)


@given(a=finite, b=finite)
def test_bound_closes_is_symmetric_and_relative(a, b):
    """bound_closes is symmetric, reflexive and scale invariant away from the 1e-12 floor."""
    assert bound_closes(a, a)
    assert bound_closes(a, b) == bound_closes(b, a)
    if max(abs(a), abs(b)) > 1e-6:
        assert bound_closes(a, b) == bound_closes(1e3 * a, 1e3 * b)
        assert bound_closes(a, b) == (abs(a - b) <= OPTIMALITY_TOLERANCE * max(abs(a), abs(b)))


def test_bound_closes_tolerance():
    """A relative difference of 1e-5 closes the gap, 1e-4 does not; the floor is absolute near zero."""
    assert bound_closes(100.0, 100.0 * (1 - 0.5e-5))
    assert not bound_closes(100.0, 100.0 * (1 - 1e-4))
    assert bound_closes(0.0, 0.0)
    assert not bound_closes(1e-9, 0.0)


def test_summary_lists_the_result():
    """summary(): method, termination, what it holds, objective, bound, gap in percent, time; '-' for none."""
    r = Result("greedy", Status.FEASIBLE, _plan(), objective=2.0, bound=1.0, objective_name="maxvio", wall_time=1.2345)
    text = r.summary()
    assert text.startswith("greedy: ") and "feasible plan" in text
    assert "objective maxvio = 2.0000" in text and "bound 1.0000" in text and "gap 50.0000 %" in text
    assert text.endswith("; 1.23 s") and "\n" not in text
    empty = Result("greedy", Status.NO_SOLUTION, None).summary()
    assert "objective" in empty and "= -;" in empty and "bound -;" in empty and "gap - %" in empty


# ----------------------------------------------------------------------------- replace, unknown terminations
def test_replace_checks_the_new_result_and_keeps_the_old():
    """Result.replace returns a new, re-validated result; the original is unchanged."""
    r = Result("m", Status.FEASIBLE, _plan(), objective=2.0, bound=1.0, wall_time=3.0)
    tighter = r.replace(bound=1.5)
    assert tighter.bound == 1.5 and tighter.objective == 2.0 and tighter.wall_time == 3.0
    assert tighter.gap == pytest.approx(0.25) and r.bound == 1.0 and r.gap == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not a valid bound"):
        r.replace(bound=2.5)  # above the objective of a minimization
    with pytest.raises(ValueError, match="needs a plan"):
        r.replace(plan=None)
    with pytest.raises(ValueError, match="sense"):
        r.replace(sense="largest")


def test_replace_keeps_an_explicit_termination():
    """A replaced result keeps the termination it had (it is a field, not re-derived from the status)."""
    r = Result("m", Status.TIME_LIMIT, _plan(), objective=2.0)
    assert r.termination is Termination.TIME_LIMIT
    assert r.replace(objective=1.0).termination is Termination.TIME_LIMIT


def test_combine_termination_skips_unknown_layers():
    """None (a termination not known) is skipped; nothing known is a completed run."""
    assert combine_termination([None, Termination.TIME_LIMIT, Termination.OPTIMAL]) is Termination.TIME_LIMIT
    assert combine_termination([None]) is Termination.COMPLETED
    assert combine_termination([]) is Termination.COMPLETED
