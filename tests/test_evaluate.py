"""The evaluator: invariants on random instances and hand-computed toy cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.dispatch import RANK_TABLE_KINDS, route_trace
from moeopt.errors import PlanError
from moeopt.evaluate import (
    communication,
    evaluate,
    grouping_affinity,
    jain,
    linear_plan,
    loads_from_counts,
    maxvio,
)
from moeopt.instance import Cluster
from moeopt.plan import Dispatch, Plan
from moeopt.profile import synthetic_profile
from moeopt.trace import Trace, stats_from_counts
from tests.strategies import small_case


def homes(home, replicas=(), gpus=2, width=None, dispatch=None) -> Plan:
    return Plan.from_homes(np.asarray(home), replicas, gpus=gpus, width=width, dispatch=dispatch)


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
    m = evaluate(homes([[0, 0, 1, 1]]), toy_trace(), c)
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
    m = evaluate(homes([[0, 0, 1, 1]]), toy_trace([0, 0, 0]), c)
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


@given(small_case(replicas=True, colocated=True, dispatch=None))
def test_invariants(case):
    """1/G <= Jain <= 1, MaxVio >= 0, 1 <= GPUs/token <= min(k, G), loads sum to N*L*k."""
    cluster, trace, plan = case
    plan.check(cluster)
    m = evaluate(plan, trace, cluster)
    G, k = cluster.gpus, trace.top_k
    assert 1 / G - 1e-9 <= m["jain"] <= 1 + 1e-9
    assert m["maxvio"] >= -1e-12
    assert 1 - 1e-9 <= m["gpus_per_token"] <= min(k, G) + 1e-9
    assert m["total_load"] == pytest.approx(trace.tokens * trace.layers * k)
    assert 0 <= m["comm_per_token"] <= m["gpus_per_token"]


@given(small_case(replicas=True, colocated=True, dispatch=None))
def test_dispatch_only_to_holders(case):
    """Every dispatch sends every token-expert assignment to a GPU that holds that expert."""
    cluster, trace, plan = case
    if plan.dispatch.kind in RANK_TABLE_KINDS:  # per-token choices need homes
        trace = Trace(**{**trace.__dict__, "home": np.arange(trace.tokens) % cluster.gpus})
    if plan.dispatch.kind == "locality":
        plan = plan.with_dispatch(Dispatch(kind="locality", lam=2.0, decay=0.5))
    gpu = route_trace(plan, trace, cluster).gpu
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
    assert np.allclose(loads_from_counts(plan, counts, cluster), np.array(m["loads"]))
    m2 = evaluate(plan, stats_from_counts(counts, top_k=trace.top_k), cluster)
    assert m2["comm_per_token"] is None
    assert m2["jain"] == pytest.approx(m["jain"]) and m2["maxvio"] == pytest.approx(m["maxvio"])


def test_plan_over_capacity_rejected():
    """A plan with more copies on a GPU than it has slots is rejected with a clear message."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2)
    with pytest.raises(PlanError, match="GPU 0, which has 2 slots"):
        homes([[0, 0, 0, 1]]).check(c)


def test_plan_checks_itself():
    """Missing experts, ids out of range and bad shapes are one-line PlanErrors."""
    with pytest.raises(PlanError, match="no copy of expert 2"):
        Plan(slots=np.array([[[0, 1], [3, -1]]]), experts=4)
    with pytest.raises(PlanError, match="holds expert 7"):
        Plan(slots=np.array([[[0, 1], [7, -1]]]), experts=4)
    with pytest.raises(PlanError, match="expected \\[layers, gpus, slots\\]"):
        Plan(slots=np.array([0, 1]))
    with pytest.raises(PlanError, match="dispatch.kind"):
        Dispatch(kind="random")


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_colocated_counts_every_copy_beyond_the_first_on_a_gpu(L, G, W, E, seed):
    """``Plan.colocated`` (sorted slots) equals the sum over (layer, expert, GPU) of copies - 1."""
    rng = np.random.default_rng(seed)
    E = min(E, G * W)  # every expert needs a slot; the rest: repeats and empty slots
    rows = [rng.permutation(np.concatenate([np.arange(E), rng.integers(-1, E, G * W - E)])) for _ in range(L)]
    slots = np.stack(rows).reshape(L, G, W)
    plan = Plan(slots=slots, experts=E)
    assert plan.colocated == int(np.maximum(plan.copies_on_gpu - 1, 0).sum())


def test_colocated_copies_are_legal_but_not_for_planners():
    """Two copies of one expert on one GPU: fine for engine plans, an error for own plans
    unless the cluster allows them."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1)
    plan = Plan(slots=np.array([[[0, 0, 1], [2, 3, -1]]]), experts=4)
    assert plan.colocated == 1 and plan.copy_counts.tolist() == [[2, 1, 1, 1]]
    plan.check(c)
    assert "colocated" in plan.notes()[0]
    with pytest.raises(PlanError, match="allow_colocated_copies"):
        plan.check(c, own=True)
    plan.check(
        Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1, allow_colocated_copies=True),
        own=True,
    )


def test_colocated_copies_double_the_share():
    """Under even dispatch a GPU with two of an expert's three copies gets 2/3 of its tokens."""
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1)
    plan = Plan(slots=np.array([[[0, 0, 1], [0, 2, 3]]]), experts=4)
    counts = np.array([[9.0, 0, 0, 0]])
    assert loads_from_counts(plan, counts, c).tolist() == [[6.0, 3.0]]


def test_from_homes_layout():
    """from_homes lists homes, then extra copies, then empty slots, per GPU."""
    plan = homes([[1, 0, 1, 0]], [np.array([[2, 0]])], width=3)
    assert plan.slots.tolist() == [[[1, 3, 2], [0, 2, -1]]]
    # home = the GPU of an expert's first copy in slot order: expert 2's copy on GPU 0 comes first
    assert plan.home.tolist() == [[1, 0, 0, 0]]
    assert [r.tolist() for r in plan.replicas] == [[[2, 1]]]


def test_straggler_toy():
    """S = sum over steps of the slowest GPU's latency, by hand on a 2-GPU profile."""
    prof = synthetic_profile(2, variability=0.0, tile=1, alpha=1.0, beta=0.0, max_tiles=8)
    c = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2)
    m = evaluate(homes([[0, 0, 1, 1]]), toy_trace(), c, profile=prof)
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
