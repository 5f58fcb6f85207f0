"""Column generation bounds (moeopt/colgen/) against brute-force optima on tiny groupings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from moeopt.bounds import lagrangian_bound, star_bound
from moeopt.colgen import (
    PRICING_TOLERANCE,
    ColgenResult,
    column_generation,
    price_branch_and_bound,
    price_cpsat,
    price_enumerate,
    price_exact,
    price_heuristic,
    pricing_candidates,
    restricted_milp,
)
from moeopt.colgen.pricing import GroupingPricer, reduced_values
from moeopt.errors import InputError
from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.result import Status, Termination
from tests.grouping_cases import brute_force, make_problem, random_grouping, run
from tests.strategies import full_groupings, groupings

TOL = 1e-9


def brute_pricing(g: Grouping, pi: np.ndarray) -> float:
    """max over feasible groups S (the empty one included) of v(S) - pi(S), by enumeration."""
    best = 0.0
    for k in range(1, min(g.cap, g.experts) + 1):
        for s in itertools.combinations(range(g.experts), k):
            idx = list(s)
            if g.load[idx].sum() > g.load_limit + LOAD_TOL:
                continue
            best = max(best, 0.5 * g.graph[np.ix_(idx, idx)].sum() - pi[idx].sum())
    return best


def check(g: Grouping, res: ColgenResult, opt: float) -> None:
    """The bound at every point is >= the optimum; a returned plan is feasible and recomputed."""
    scale = max(1.0, abs(opt))
    assert res.bound >= opt - 1e-7 * scale
    for _, bound, incumbent in res.history:
        assert bound >= opt - 1e-7 * scale
        if incumbent is not None:
            assert incumbent <= opt + 1e-7 * scale
    if res.home is not None:
        assert g.violations(res.home) == []
        assert res.objective == g.objective(res.home)
        assert res.objective <= opt + 1e-7 * scale


@given(groupings())
def test_bound_is_valid_against_brute_force(g: Grouping) -> None:
    """The column generation bound (and each history point) is >= the brute-force optimum."""
    home, opt = brute_force(g)
    if home is None:
        return
    res = column_generation(g, 5.0, start_home=home, seed=0)
    check(g, res, opt)
    assert res.objective == pytest.approx(opt)  # started from the optimum, never worse


@given(groupings(max_experts=7))
def test_bound_without_start_and_proven_lp(g: Grouping) -> None:
    """From agnostic's own plan: valid bound, and a proved LP lies below the star and Lagrangian bounds."""
    home, opt = brute_force(g)
    if home is None:
        return
    res = column_generation(g, 10.0, seed=1)
    check(g, res, opt)
    if res.proven and res.lp_value is not None:
        # every column's value splits over its members' best partners: LP <= star, Lagrangian
        assert res.lp_value <= star_bound(g) + 1e-7 * max(1.0, opt)
        assert res.lp_value <= lagrangian_bound(g) + 1e-7 * max(1.0, opt)
        slack = PRICING_TOLERANCE * max(abs(res.lp_value), opt) + 1e-9
        assert res.lp_value >= opt - slack - 1e-7 * max(1.0, opt)  # a relaxation, solved to the tolerance
        assert res.bound <= res.lp_value + slack + 1e-7 * max(1.0, opt)


@given(groupings(), st.data())
def test_exact_pricing_matches_enumeration(g: Grouping, data: st.DataObject) -> None:
    """Branch and bound (and its candidate pruning) finds the enumerated best reduced value."""
    pi = data.draw(arrays(np.float64, g.experts, elements=st.floats(-0.5, 1.5)))
    want = brute_pricing(g, pi)
    cand = pricing_candidates(g, pi)
    bb = price_branch_and_bound(g, pi, cand)
    assert bb.proven
    assert bb.upper == pytest.approx(want, abs=1e-9)
    full = price_enumerate(g, pi, np.arange(g.experts))
    assert max(full.upper, 0.0) == pytest.approx(want, abs=1e-9)
    ex = price_exact(g, pi, time_limit=5.0)
    assert ex.upper >= want - 1e-9
    for s in bb.groups + ex.groups:  # groups returned are feasible and as good as said
        assert len(s) <= g.cap and g.load[s].sum() <= g.load_limit + LOAD_TOL


@given(groupings(), st.data())
def test_cpsat_pricing_bound_is_valid(g: Grouping, data: st.DataObject) -> None:
    """CP-SAT pricing's bound (integer-scaled, rounding added back) is >= the best reduced value."""
    pi = data.draw(arrays(np.float64, g.experts, elements=st.floats(-0.5, 1.5)))
    want = brute_pricing(g, pi)
    cand = pricing_candidates(g, pi)
    if not len(cand):
        assert want == 0.0
        return
    out = price_cpsat(g, pi, cand, time_limit=5.0)
    assert out.upper >= want - 1e-9
    if out.proven:
        assert out.upper <= want + 1e-4 * max(1.0, float(np.abs(g.graph).max()), float(np.abs(pi).max()))


@given(groupings(), st.data())
def test_heuristic_pricing_returns_feasible_groups(g: Grouping, data: st.DataObject) -> None:
    """Heuristic pricing: distinct feasible groups, best reduced value first, never above the max."""
    pi = data.draw(arrays(np.float64, g.experts, elements=st.floats(-0.5, 1.5)))
    found = price_heuristic(g, pi)
    values = [0.5 * g.graph[np.ix_(s, s)].sum() - pi[s].sum() for s in found]
    # best first, up to rounding (the function sums by einsum, this test by blocks)
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:], strict=False))
    assert len({tuple(s) for s in found}) == len(found)
    for s in found:
        assert 1 <= len(s) <= g.cap and g.load[s].sum() <= g.load_limit + LOAD_TOL
    assert values[0] <= brute_pricing(g, pi) + 1e-9


def brute_full_pricing(g: Grouping, pi: np.ndarray) -> float:
    """max over groups of exactly cap experts within the load limit of v(S) - pi(S) (-inf if none)."""
    best = -np.inf
    for s in itertools.combinations(range(g.experts), g.cap):
        idx = list(s)
        if g.load[idx].sum() <= g.load_limit + LOAD_TOL:
            best = max(best, 0.5 * g.graph[np.ix_(idx, idx)].sum() - pi[idx].sum())
    return best


@given(full_groupings(), st.data())
def test_full_pricing_matches_enumeration(g: Grouping, data: st.DataObject) -> None:
    """Pricing over full groups (E = G cap): branch and bound finds the enumerated best value,
    negative ones too (duals above every group's value); CP-SAT's bound and the exact pricing's
    are never below it; the heuristic returns full feasible groups no better than it."""
    pi = data.draw(arrays(np.float64, g.experts, elements=st.floats(-0.5, 3.0)))
    want = brute_full_pricing(g, pi)
    every = np.arange(g.experts)
    bb = price_branch_and_bound(g, pi, every, threshold=-np.inf, full=True)
    assert bb.proven
    assert bb.upper == pytest.approx(want, abs=1e-9)
    ex = price_exact(g, pi, time_limit=5.0, threshold=-np.inf, full=True)
    assert ex.upper >= want - 1e-9
    sat = price_cpsat(g, pi, every, time_limit=5.0, full=True)
    assert sat.upper >= want - 1e-9
    if sat.proven:
        assert sat.upper <= want + 1e-4 * max(1.0, float(np.abs(g.graph).max()), float(np.abs(pi).max()))
    for s in bb.groups + ex.groups + sat.groups:
        assert len(s) == g.cap and g.load[s].sum() <= g.load_limit + LOAD_TOL
    found = price_heuristic(g, pi, full=True)
    for s in found:
        assert len(s) == g.cap and g.load[s].sum() <= g.load_limit + LOAD_TOL
    if found:
        assert 0.5 * g.graph[np.ix_(found[0], found[0])].sum() - pi[found[0]].sum() <= want + 1e-9


def test_iterated_local_search_finds_the_best_full_group() -> None:
    """On 20 experts, groups of 10 within a load limit, the iterated local search finds the best
    of all 184 756 groups (brute force) for 16 duals; the plain local search it starts from
    misses some of them, so this checks the kicks."""
    combos = np.array(list(itertools.combinations(range(20), 10)))
    member = np.zeros((len(combos), 20))
    member[np.arange(len(combos))[:, None], combos] = 1.0
    misses = 0
    for seed in range(1, 5):
        rng = np.random.default_rng(seed)
        W = np.triu(rng.random((20, 20)) * (rng.random((20, 20)) < 0.3), 1)
        g = Grouping(W + W.T, load=rng.dirichlet(np.ones(20)), groups=2, cap=10)
        g = g.replace(load_limit=1.1 * g.min_max_load())
        fits = member @ g.load <= g.load_limit + LOAD_TOL
        pair_value = 0.5 * np.einsum("ne,ef,nf->n", member, g.graph, member)
        for _ in range(4):
            pi = rng.random(20) * 0.8
            want = float((pair_value - member @ pi)[fits].max())

            ils, plain = (price_heuristic(g, pi, full=True, kicks=k) for k in (None, 0))
            assert reduced_values(g, ils[:1], pi)[0] == pytest.approx(want, abs=1e-9)
            misses += reduced_values(g, plain[:1], pi)[0] < want - 1e-9
    assert misses > 0


@given(full_groupings(), st.data())
def test_full_lagrangian_bound_is_valid(g: Grouping, data: st.DataObject) -> None:
    """With E = G cap every plan is G full groups, so for any duals sum(pi) + G max_{|S| = cap}
    [v(S) - pi(S)] (no max with 0, negative allowed) bounds the optimum: the bound the driver
    takes from full pricing."""
    home, opt = brute_force(g)
    if home is None:
        return
    pi = data.draw(arrays(np.float64, g.experts, elements=st.floats(-0.5, 3.0)))
    bb = price_branch_and_bound(g, pi, np.arange(g.experts), threshold=-np.inf, full=True)
    assert pi.sum() + g.groups * bb.upper >= opt - 1e-9 * max(1.0, abs(opt))
    assert GroupingPricer(g, partition=True).full
    assert not GroupingPricer(g, partition=False).full  # groups may stay empty: the 0 column counts
    assert not GroupingPricer(g.replace(cap=g.cap + 1), partition=True).full


@given(full_groupings())
def test_full_bound_is_valid_against_brute_force(g: Grouping) -> None:
    """Column generation on full groups (the iterated-local-search heuristic steering, the exact
    pricing certifying): every bound point >= the brute-force optimum."""
    home, opt = brute_force(g)
    if home is None:
        return
    res = column_generation(g, 5.0, start_home=home, seed=0)
    check(g, res, opt)


def test_full_columns_close_a_planted_grouping() -> None:
    """24 experts in 4 planted blocks of 6 plus noise, G = 4, cap 6: the LP is proved and the bound
    within 1 % of the plan."""
    rng = np.random.default_rng(0)
    block = np.repeat(np.arange(4), 6)
    W = rng.random((24, 24)) * 0.2 + (block[:, None] == block[None, :]) * rng.random((24, 24))
    W = np.triu(W, 1)
    g = Grouping(W + W.T, load=np.full(24, 1 / 24), groups=4, cap=6)
    res = column_generation(g, 20.0, seed=0)
    assert res.proven
    assert res.gap is not None and res.gap <= 0.01


def test_random_load_limited_instances() -> None:
    """Load-limited random groupings at E = 8..10 (numpy draws): valid bounds, feasible plans."""
    rng = np.random.default_rng(3)
    for _ in range(6):
        g = random_grouping(rng, E=int(rng.integers(8, 11)), G=3, limited=True)
        home, opt = brute_force(g)
        if home is None:
            continue
        res = column_generation(g, 10.0, seed=0)
        check(g, res, opt)
        assert res.termination in (Termination.OPTIMAL, Termination.COMPLETED, Termination.TIME_LIMIT)


def test_closes_gap_on_sixteen_experts() -> None:
    """On a 16-expert, 4-GPU synthetic layer the bound is proved and within 2 % of the plan."""
    p = make_problem(E=16, G=4, L=1, seed=2)
    g = Grouping(p.stats.affinity[0], p.stats.global_usage[0], groups=4, cap=4)
    res = column_generation(g, 20.0, seed=0)
    assert res.proven
    assert res.gap is not None and res.gap <= 0.02
    assert res.bound <= star_bound(g) + 1e-9


def test_give_up_stops_at_the_first_unproved_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``give_up``: column generation returns after the first exact pricing that ends unproved,
    without the restricted master MILP, and its bound at every point stays valid."""
    import dataclasses

    g = random_grouping(np.random.default_rng(7), E=10, G=2, cap=5, limited=True)
    home, opt = brute_force(g)
    assert home is not None
    real = GroupingPricer.exact

    def unproved(self, *args, **kwargs):  # the same pricing bound, reported as not proved
        return dataclasses.replace(real(self, *args, **kwargs), proven=False)

    def no_milp(*args, **kwargs):
        raise AssertionError("the restricted master MILP ran after giving up")

    monkeypatch.setattr(GroupingPricer, "exact", unproved)
    monkeypatch.setattr("moeopt.colgen.driver.restricted_milp", no_milp)
    res = column_generation(g, 20.0, seed=0, give_up=True)
    check(g, res, opt)
    assert res.info["gave_up"] and res.info["exact_pricings"] == 1
    assert res.termination == Termination.ITERATION_LIMIT and not res.proven  # its work, not the clock
    assert res.history[-1][0] < 10.0  # returned long before its time limit


def test_give_up_changes_nothing_when_every_pricing_is_proved() -> None:
    """On a layer whose exact pricings all prove, ``give_up`` runs to the same proved bound."""
    p = make_problem(E=16, G=4, L=1, seed=2)
    g = Grouping(p.stats.affinity[0], p.stats.global_usage[0], groups=4, cap=4)
    plain = column_generation(g, 20.0, seed=0)
    res = column_generation(g, 20.0, seed=0, give_up=True)
    assert res.proven and not res.info["gave_up"]
    assert res.bound == pytest.approx(plain.bound, rel=1e-6)


def test_restricted_milp_builds_a_feasible_plan() -> None:
    """The restricted master MILP over a plan's own groups returns a feasible plan of that value."""
    g = random_grouping(np.random.default_rng(5), E=9, G=3, cap=3, limited=False)
    home, opt = brute_force(g)
    cols = [np.flatnonzero(home == k) for k in range(3)] + [np.array([e]) for e in range(9)]
    plan = restricted_milp(g, cols, True, time_limit=5.0, start=home)
    assert plan is not None and g.violations(plan) == []
    assert g.objective(plan) == pytest.approx(opt)


def test_infeasible_start_falls_back_to_packing() -> None:
    """An infeasible start plan is ignored: the bound comes from the packing relaxation, still valid."""
    g = random_grouping(np.random.default_rng(11), E=8, G=3, limited=True)
    home, opt = brute_force(g)
    bad = np.zeros(g.experts, dtype=np.int64)  # all on one GPU: over cap
    res = column_generation(g, 5.0, start_home=bad)
    assert res.bound >= opt - 1e-9
    assert res.home is None or g.violations(res.home) == []


def test_tacg_colgen_certificate() -> None:
    """``certificate: colgen`` on tacg: bound no looser than the cheap one, plan as good, stats recorded."""
    p = make_problem(E=16, G=4, L=2, seed=1)
    cheap = run("tacg", p, time_limit=5.0)
    cg = run("tacg", p, time_limit=5.0, certificate="colgen")
    assert cg.bound <= cheap.bound + 1e-9
    assert cg.objective >= cheap.objective - 1e-9
    assert cg.bound >= cg.objective - 1e-9
    assert [sorted(r) for r in cg.stats["certificate"]] == [["colgen"], ["colgen"]]
    assert cg.status in (Status.OPTIMAL, Status.FEASIBLE)
    with pytest.raises(InputError, match=r"^method\.certificate: must be one of .*auto, got 'nope'$") as info:
        run("agnostic", p, certificate="nope")
    assert info.value.field == "method.certificate"


@pytest.mark.parametrize("kind", ["triangle", "both"])
def test_tacg_triangle_certificate(kind: str) -> None:
    """``certificate: triangle`` / ``both``: bound no looser than the cheap one and above the plan."""
    p = make_problem(E=16, G=2, L=2, seed=3)
    cheap = run("tacg", p, time_limit=5.0)
    res = run("tacg", p, time_limit=5.0, certificate=kind)
    assert res.bound <= cheap.bound + 1e-9
    assert res.bound >= res.objective - 1e-9
    assert res.objective >= cheap.objective - 1e-9
    records = res.stats["certificate"]
    assert len(records) == 2 and all("triangle" in r for r in records)
    assert ("colgen" in records[0]) == (kind == "both")


def test_tacg_sdp_certificate() -> None:
    """``certificate: sdp``: a bound no looser than the cheap one, above the plan, recorded per layer."""
    pytest.importorskip("cvxpy")
    p = make_problem(E=16, G=2, L=2, seed=3)
    cheap = run("tacg", p, time_limit=5.0)
    res = run("tacg", p, time_limit=5.0, certificate="sdp")
    assert res.bound <= cheap.bound + 1e-9
    assert res.bound >= res.objective - 1e-9
    records = res.stats["certificate"]
    assert len(records) == 2 and all(r["sdp"]["bound"] >= 0 for r in records)
    assert res.bound < cheap.bound  # on this instance the SDP is strictly tighter than the cheap bounds


def test_tacg_auto_certificate_stops_at_a_proved_colgen() -> None:
    """``certificate: auto`` where column generation proves its LP: colgen's bound, no SDP."""
    p = make_problem(E=16, G=4, L=2, seed=1)
    cheap = run("tacg", p, time_limit=5.0)
    res = run("tacg", p, time_limit=5.0, certificate="auto")
    records = res.stats["certificate"]
    assert all(r["colgen"]["proven"] and "sdp" not in r for r in records)
    assert res.bound <= cheap.bound + 1e-9
    assert res.bound >= res.objective - 1e-9


def test_tacg_auto_certificate_falls_back_to_the_sdp(monkeypatch: pytest.MonkeyPatch) -> None:
    """``certificate: auto`` where column generation does not prove its LP: the SDP runs in the
    rest of the layer's time and the smaller of the two bounds is reported."""
    pytest.importorskip("cvxpy")
    import dataclasses

    import moeopt.colgen as colgen

    real = colgen.column_generation

    def unproven(*args, **kwargs):  # the same run, reported as stopped before its LP was solved
        return dataclasses.replace(real(*args, **kwargs), proven=False)

    monkeypatch.setattr(colgen, "column_generation", unproven)
    p = make_problem(E=16, G=2, L=2, seed=3)
    res = run("tacg", p, time_limit=6.0, certificate="auto")
    records = res.stats["certificate"]
    assert len(records) == 2 and all("colgen" in r and "sdp" in r for r in records)
    per_layer = [min(r["colgen"]["bound"], r["sdp"]["bound"]) for r in records]
    assert res.bound <= sum(per_layer) + 1e-9
    assert res.bound >= res.objective - 1e-9
    # each layer reports (and names) the smaller of the two
    assert res.stats["bound_kind"] == [min(("colgen", "sdp"), key=lambda k: r[k]["bound"]) for r in records]


def test_exact_methods_honour_a_strong_certificate() -> None:
    """``tacg-cpsat`` with ``certificate: sdp``: when the solver leaves a gap, half the layer's
    time goes to the SDP bound, which is reported when tighter (it was ignored before)."""
    pytest.importorskip("cvxpy")
    p = make_problem(E=32, G=4, L=1, seed=3, k=4)
    plain = run("tacg-cpsat", p, time_limit=2.0)
    res = run("tacg-cpsat", p, time_limit=2.0, certificate="sdp")
    assert res.bound >= res.objective - 1e-9
    assert res.stats["bound_kind"] == ["sdp"] and len(res.stats["certificate"]) == 1
    assert res.bound < plain.bound  # the solver's own bound after 2 s is looser on this layer
    assert "certificate" not in plain.stats
