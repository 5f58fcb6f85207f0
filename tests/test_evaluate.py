"""The evaluator: invariants on random instances and hand-computed toy cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from moeopt.errors import PlanError
from moeopt.evaluate import (
    GuardParams,
    communication,
    dispatch,
    evaluate,
    grouping_affinity,
    jain,
    linear_plan,
    loads_from_counts,
    maxvio,
)
from moeopt.instance import Cluster
from moeopt.plan import Plan
from moeopt.profile import synthetic_profile
from moeopt.trace import Trace, stats_from_counts
from tests.strategies import small_case


def toy_trace(homes=None) -> Trace:
    topk = np.array([[[0, 1]], [[0, 2]], [[2, 3]]], dtype=np.int16)
    return Trace(
        topk=topk,
        family=np.zeros(3, dtype=np.int32),
        step=np.array([0, 0, 1], dtype=np.int32),
        family_names=("all",),
        num_experts=4,
        home=None if homes is None else np.asarray(homes),
    )


def test_toy_uniform_homes():
    """E=4 on 2 GPUs, home [0,0,1,1]: hand-computed GPUs per token, remote expectation, loads."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2)
    m = evaluate(Plan(home=np.array([[0, 0, 1, 1]])), toy_trace(), c)
    assert m["gpus_per_token"] == pytest.approx(4 / 3)
    assert m["comm_per_token"] == pytest.approx(4 / 3 * 0.5)
    assert m["loads"] == [[3.0, 3.0]]
    assert m["jain"] == pytest.approx(1.0) and m["maxvio"] == pytest.approx(0.0)
    # per step: step 0 has GPU loads (3, 1), step 1 has (0, 2)
    assert m["maxvio_per_step_max"] == pytest.approx(1.0)
    assert m["maxvio_per_step"] == pytest.approx(((3 / 2 - 1) + (2 / 1 - 1)) / 2)


def test_toy_known_homes_and_topology():
    """With token homes on GPU 0 and one GPU per node: remote counts 0,1,1 and weight 4."""
    c = Cluster(gpus=2, gpus_per_node=1, slots_per_gpu=2, inter_node_weight=4.0)
    m = evaluate(Plan(home=np.array([[0, 0, 1, 1]])), toy_trace([0, 0, 0]), c)
    assert m["comm_per_token"] == pytest.approx(2 / 3)
    assert m["comm_weighted_per_token"] == pytest.approx(8 / 3)


def test_uniform_home_topology_expectation():
    """Unknown homes: each distinct GPU costs ((gpn-1) + (G-gpn) w) / G in expectation."""
    c = Cluster(gpus=4, gpus_per_node=2, slots_per_gpu=1, inter_node_weight=4.0)
    gpu = np.array([[[0, 1]], [[0, 2]]])
    distinct, remote, weighted = communication(gpu, c)
    assert distinct.tolist() == [[2], [2]]
    assert remote.tolist() == [[1.5], [1.5]]
    assert weighted[0, 0] == pytest.approx(2 * (1 + 2 * 4) / 4)


def test_jain_maxvio_extremes():
    """Jain is 1 and MaxVio 0 for equal loads; Jain 1/G and MaxVio G-1 for one hot GPU."""
    assert jain(np.array([5, 5, 5, 5])) == pytest.approx(1.0)
    assert maxvio(np.array([5, 5, 5, 5])) == pytest.approx(0.0)
    assert jain(np.array([8, 0, 0, 0])) == pytest.approx(0.25)
    assert maxvio(np.array([8, 0, 0, 0])) == pytest.approx(3.0)


@given(small_case(replicas=True))
def test_invariants(case):
    """1/G <= Jain <= 1, MaxVio >= 0, 1 <= GPUs/token <= min(k, G), loads sum to N*L*k."""
    cluster, trace, plan = case
    plan.check(cluster)
    m = evaluate(plan, trace, cluster)
    G, k = cluster.gpus, trace.top_k
    assert 1 / G - 1e-9 <= m["jain"] <= 1 + 1e-9
    assert m["maxvio"] >= -1e-12
    assert 1 - 1e-9 <= m["gpus_per_token"] <= min(k, G) + 1e-9
    assert m["total_load"] == trace.tokens * trace.layers * k
    assert 0 <= m["comm_per_token"] <= m["gpus_per_token"]


@given(small_case(replicas=True))
def test_dispatch_only_to_holders(case):
    """The guard sends every token-expert assignment to a GPU that holds that expert."""
    cluster, trace, plan = case
    gpu = dispatch(plan, trace, cluster.gpus, GuardParams(lam=2.0, decay=0.5))
    for l in range(trace.layers):
        copies = plan.copies(l)
        holds = (copies[trace.topk[:, l, :].astype(int)] == gpu[:, l, :, None]).any(axis=-1)
        assert holds.all()


@given(small_case())
def test_counts_agree_with_trace(case):
    """Loads from a trace equal loads computed from its per-expert counts (no replicas)."""
    cluster, trace, plan = case
    m = evaluate(plan, trace, cluster)
    counts = trace.stats().expert_load
    assert np.allclose(loads_from_counts(plan, counts, cluster.gpus), np.array(m["loads"]))
    m2 = evaluate(plan, stats_from_counts(counts, top_k=trace.top_k), cluster)
    assert m2["comm_per_token"] is None
    assert m2["jain"] == pytest.approx(m["jain"]) and m2["maxvio"] == pytest.approx(m["maxvio"])


def test_plan_over_capacity_rejected():
    """A plan with more experts on a GPU than it has slots is rejected with a clear message."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2)
    with pytest.raises(PlanError, match="GPU 0, which has 2 slots"):
        Plan(home=np.array([[0, 0, 0, 1]])).check(c)


def test_replica_on_home_rejected():
    """A replica on its expert's home GPU, or beyond the replica slots, is rejected."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1)
    with pytest.raises(PlanError, match="on its home GPU"):
        Plan(home=np.array([[0, 0, 1, 1]]), replicas=(np.array([[0, 0]]),)).check(c)
    with pytest.raises(PlanError, match="replica_slots_per_gpu"):
        Plan(home=np.array([[0, 0, 1, 1]]), replicas=(np.array([[0, 1], [1, 1]]),)).check(c)


def test_straggler_toy():
    """S = sum over steps of the slowest GPU's latency, by hand on a 2-GPU profile."""
    prof = synthetic_profile(2, variability=0.0, tile=1, alpha=1.0, beta=0.0, max_tiles=8)
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2)
    m = evaluate(Plan(home=np.array([[0, 0, 1, 1]])), toy_trace(), c, profile=prof)
    # step 0: loads (3, 1) -> 3; step 1: loads (0, 2) -> 2
    assert m["straggler_latency"] == pytest.approx(5.0)


def test_grouping_affinity_toy():
    """Intra-group affinity counts each same-GPU pair once."""
    a = np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0]], dtype=float)
    assert grouping_affinity(a, np.array([0, 0, 1])) == 1.0
    assert grouping_affinity(a, np.array([0, 0, 0])) == 6.0


def test_linear_plan_contiguous():
    """Linear puts expert e on GPU floor(e*G/E), also when G does not divide E."""
    assert linear_plan(1, 6, 4).home.tolist() == [[0, 0, 1, 2, 2, 3]]
