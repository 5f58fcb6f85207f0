"""CP-SAT polish of a balance layer (moeopt.balance.exact): checked against brute-force optima."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt import balance as B
from moeopt.balance.exact import polish_layer
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.solve import load_workloads, solve
from tests.test_balance_core import brute_opt, check_plan


@st.composite
def tiny(draw):
    E = draw(st.integers(1, 5))
    G = draw(st.integers(1, 3))
    lo = max(1, -(-E // G))
    W = draw(st.integers(lo, max(lo, min(E, 3))))
    load = np.array(draw(st.lists(st.integers(0, 30), min_size=E, max_size=E)), dtype=float)
    return load, G, W


@settings(deadline=None, max_examples=40)
@given(tiny())
def test_polish_is_valid_never_worse_and_its_bound_below_the_brute_force_optimum(case):
    load, G, W = case
    start = B.plan_layer(load, G, W, iterations=0)
    r = polish_layer(load, start, time_limit=5)
    check_plan(r.slots, load.size, G, W, False)
    opt = brute_opt(load, G, W, False)
    got = float(B.gpu_loads(r.slots, load).max())
    assert got <= float(B.gpu_loads(start, load).max()) + 1e-9
    assert r.bound <= opt * (1 + 1e-12) + 1e-12
    assert r.bound <= got + 1e-12
    if r.status == "OPTIMAL":  # optimal up to the weights' rounding (1e-6 of the largest load)
        assert got <= opt + 1e-5 * max(load.max(), 1.0)


def test_polish_finds_what_the_greedy_plan_misses():
    # 2 GPUs x 3 slots, one copy each (6 experts): the optimum is 9 / 9; start from 10 / 8
    load = np.array([5.0, 4.0, 3.0, 3.0, 2.0, 1.0])
    start = np.array([[0, 1, 5], [2, 3, 4]])
    r = polish_layer(load, start, time_limit=10)
    assert r.status == "OPTIMAL" and r.improved
    assert B.gpu_loads(r.slots, load).max() == pytest.approx(brute_opt(load, 2, 3, False))
    assert r.bound == pytest.approx(9.0, rel=1e-5)


def instance(polish: str, allow: bool = False) -> Instance:
    return Instance(
        name="tiny",
        model=Model(layers=2, experts=6, top_k=2),
        cluster=Cluster(
            gpus=3, gpus_per_node=3, slots_per_gpu=2, replica_slots_per_gpu=1, allow_colocated_copies=allow
        ),
        workload=Workload(calibration=WorkloadSource(synthetic={"tokens": 512, "skew": 1.2})),
        method=MethodSpec(name="balance", params={"polish": polish, "polish_time": 5.0, "robust": "none"}),
    )


def test_method_polish_improves_or_keeps_the_plan_and_raises_the_bound():
    plain, polished = solve(instance("none")), solve(instance("cpsat"))
    assert polished.objective <= plain.objective + 1e-12
    assert polished.bound >= plain.bound - 1e-12
    assert polished.bound <= polished.objective + 1e-12
    assert polished.stats["polish"] == "cpsat"
    assert polished.stats["polished_layers_optimal"] + polished.stats["polished_layers_improved"] >= 1
    # the reported objective, recomputed from the plan and the calibration loads
    load = load_workloads(instance("cpsat")).calibration.expert_load
    mv = [B.maxvio(polished.plan.slots[l], load[l]) for l in range(2)]
    assert polished.objective == pytest.approx(1.0 + float(np.mean(mv)), rel=1e-9)
    skipped = solve(instance("cpsat", allow=True))
    assert skipped.stats["polish"] == "skipped: allow_colocated_copies"
    lp = instance("cpsat")
    lp = lp.replace(method=MethodSpec(name="balance", params={"polish": "cpsat", "dispatch": "lp", "robust": "none"}))
    assert solve(lp).stats["polish"].startswith("skipped: a connected copy graph")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"polish": "milp"}, "polish must be"),
        ({"polish_time": 0}, "polish_time"),
        ({"polish_slots": 0}, "polish_slots"),
    ],
)
def test_bad_polish_params(params, message):
    from moeopt.methods.balance import BalanceParams

    with pytest.raises(ValueError, match=message):
        BalanceParams(**params)
