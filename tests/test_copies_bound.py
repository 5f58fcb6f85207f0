"""The flagged covering LP (moeopt/colgen/copies.py): a bound for plans with copies within a load
limit, against brute force over every plan with copies and every dispatch within the limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from moeopt.colgen.copies import applies, copies_lower_bound, flagged_columns
from moeopt.colgen.cover import distinct_lower_bound, token_patterns
from moeopt.evaluate import evaluate
from moeopt.solve import solve
from tests.test_joint_bound import _bare_instance, random_tokens


def best_within(topk: np.ndarray, E: int, G: int, W: int, limit: float) -> float:
    """Least mean distinct GPUs per token over every plan of ``G x W`` slots (copies included,
    every expert held) and every fractional dispatch whose GPU loads (shares of the token-expert
    pairs) are at most ``limit``: an LP over each token pattern's routings per plan."""
    pats, w = token_patterns(topk)
    need = float(sum(len(set(p)) * x for p, x in zip(pats, w, strict=True)))
    subsets = [frozenset(c) for z in range(1, W + 1) for c in itertools.combinations(range(E), z)]
    best = np.inf
    for plan in itertools.combinations_with_replacement(subsets, G):
        if frozenset().union(*plan) != frozenset(range(E)):
            continue
        holders = [[g for g in range(G) if e in plan[g]] for e in range(E)]
        cost, rows, cols, vals, eq_r = [], [], [], [], []
        for i, (p, x) in enumerate(zip(pats, w, strict=True)):
            for route in itertools.product(*(holders[int(e)] for e in p)):
                j = len(cost)
                cost.append(x * len(set(route)))
                eq_r.append(i)
                for g in set(route):
                    rows.append(g)
                    cols.append(j)
                    vals.append(x * route.count(g) / need)
        n = len(cost)
        A_ub = np.zeros((G, n))
        np.add.at(A_ub, (rows, cols), vals)
        A_eq = np.zeros((len(pats), n))
        A_eq[eq_r, np.arange(n)] = 1.0
        res = linprog(cost, A_ub=A_ub, b_ub=np.full(G, limit), A_eq=A_eq, b_eq=np.ones(len(pats)), method="highs")
        if res.status == 0:
            best = min(best, res.fun / w.sum())
    return float(best)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([(4, 3, 2, 2), (4, 2, 3, 2), (4, 2, 3, 3), (5, 3, 2, 2), (3, 2, 2, 2)]),
    st.sampled_from([0.0, 0.25, 1.0]),
    st.integers(6, 14),
)
def test_flagged_bound_is_below_every_plan_with_copies_within_the_limit(seed, shape, m, tokens):
    """The bound is at most the fewest distinct GPUs per token of any plan with copies under any
    dispatch within the limit (brute force), at every limit, and the LP is solved."""
    E, G, W, k = shape
    topk = random_tokens(seed, E, k, tokens)
    share = np.bincount(topk.reshape(-1), minlength=E) / topk.size
    limit = (1.0 + m) / G
    best = best_within(topk, E, G, W, limit)
    if not np.isfinite(best):  # no plan within the limit: nothing to bound
        return
    b = copies_lower_bound(topk, E, G, W, share, limit)
    assert b.proven
    assert b.distinct <= best + 1e-7


def test_flagged_bound_sees_what_the_limit_forces():
    """At a tight limit (every GPU at the mean load) the bound rises above the one over every plan
    (1 GPU per token: a plan may put a token's experts together at any load) and stays below the
    best plan within the limit; a looser limit can only lower it."""
    E, G, W = 4, 3, 2
    topk = random_tokens(0, E, 2, 14)
    share = np.bincount(topk.reshape(-1), minlength=E) / topk.size
    free = distinct_lower_bound(topk, E, G, W, sdp=False)
    b = copies_lower_bound(topk, E, G, W, share, 1.0 / G)
    best = best_within(topk, E, G, W, 1.0 / G)
    assert free.distinct == pytest.approx(1.0) and b.distinct > 1.2 and b.distinct <= best + 1e-7
    assert copies_lower_bound(topk, E, G, W, share, 2.0 / G).distinct <= b.distinct + 1e-9


def test_no_plan_within_the_limit_gives_at_most_every_expert_on_its_own_gpu():
    """Where no plan fits the limit the bound is vacuous; it stays at most k GPUs per token."""
    topk = random_tokens(3, 5, 2, 14)
    share = np.bincount(topk.reshape(-1), minlength=5) / topk.size
    assert not np.isfinite(best_within(topk, 5, 3, 2, 1.0 / 3))
    assert copies_lower_bound(topk, 5, 3, 2, share, 1.0 / 3).distinct <= 2.0 + 1e-9


def test_start_plan_and_caps_keep_the_bound_valid():
    """Seeded with a plan within the limit, capped at one round or at the clock, the bound stays
    at most the brute-force optimum (the Lagrangian bound holds at every exact pricing)."""
    E, G, W = 5, 3, 2
    topk = random_tokens(7, E, 2, 14)
    share = np.bincount(topk.reshape(-1), minlength=E) / topk.size
    limit = 1.3 / G
    best = best_within(topk, E, G, W, limit)
    plan = np.array([[0, 1], [2, 3], [4, 0]])
    full = copies_lower_bound(topk, E, G, W, share, limit, plan)
    one = copies_lower_bound(topk, E, G, W, share, limit, plan, rounds=1)
    clock = copies_lower_bound(topk, E, G, W, share, limit, time_limit=0.0)
    assert one.distinct <= full.distinct + 1e-9 <= best + 2e-7
    assert clock.info["capped"] and clock.distinct <= best + 1e-7


def test_applies_to_few_spare_slots_and_enumerable_layers():
    assert applies(60, 16, 4)  # qwen1.5-moe: 4 spare slots
    assert not applies(64, 16, 4)  # no spare slot: the single-copy bound
    assert not applies(64, 16, 5)  # W = 5: not enumerated
    assert not applies(256, 64, 4)  # too many sets
    assert flagged_columns(4, 2) == 4 * 2 + 6 * 4
    with pytest.raises(ValueError, match="spare slots"):
        copies_lower_bound(np.array([[0, 1]]), 4, 2, 2, np.full(4, 0.25), 0.5)


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(4, 2, 3), (5, 3, 2)]), st.sampled_from([0.05, 0.3]))
def test_joint_with_spare_slots_is_certified_within_the_plans_load_limit(seed, shape, eps):
    """With a few spare slots `joint`'s bound holds for every plan with copies within the MaxVio it
    reports per layer (the planner's limit, or the plan's own under its dispatch where higher): at
    most the brute-force optimum within it, and the plan is one of those plans."""
    E, G, W = shape
    inst, wl = _bare_instance(seed, E, G, 2, tokens=60, slots=W)
    r = solve(inst, method="joint", params={"eps": eps, "evaluations": 200, "restarts": 1}, workloads=wl)
    st_ = r.stats
    # the flagged LP's bound where it is the larger, which holds only within the limit
    kinds = st_["bound_kind_per_layer"]
    assert st_["bound_load_limited_per_layer"] == [kind == "flagged" for kind in kinds]
    covered = st_["bound_maxvio_limit_per_layer"]
    cal = evaluate(r.plan, wl.calibration, inst.cluster)
    for l in range(2):
        assert covered[l] >= max(eps, cal["maxvio_per_layer"][l]) - 1e-9
        best = best_within(wl.calibration.topk[:, l], E, G, W, (1.0 + covered[l]) / G) * (1.0 - 1.0 / G)
        assert st_["communication_lower_bound_per_layer"][l] <= best + 1e-7
        assert st_["communication_lower_bound_per_layer"][l] <= cal["comm_per_layer"][l] + 1e-7
