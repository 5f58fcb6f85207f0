"""Production scale: remote nodes per token, group-limited synthetic routing, ``joint`` past 64 GPUs
(engine rules, hierarchical mode) and ``auto`` on large clusters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.dispatch import remote_nodes_of
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Trace
from tests.strategies import examples, small_case


# ----------------------------------------------------------------------------- remote nodes
def test_remote_nodes_by_hand():
    """4 GPUs in 2 nodes: a token on GPUs {0, 1} from GPU 0 crosses no node, {0, 2} one, {1, 3} from 0 one."""
    c = Cluster(gpus=4, gpus_per_node=2, slots_per_gpu=1)
    gpu = np.array([[[0, 1]], [[0, 2]], [[1, 3]], [[2, 3]]])
    assert remote_nodes_of(gpu, c, np.array([0, 0, 0, 0]))[:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert remote_nodes_of(gpu, c, np.array([2, 2, 2, 2]))[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0]
    # uniform homes: every distinct node is the home node with probability gpn / G = 1/2
    assert remote_nodes_of(gpu, c)[:, 0].tolist() == [0.5, 1.0, 1.0, 0.5]


def test_remote_nodes_in_evaluate_by_hand():
    """E = 4 on 4 GPUs in 2 nodes, one expert each: tokens {0, 1} and {0, 3} from GPU 0 cross 0 and 1 nodes."""
    c = Cluster(gpus=4, gpus_per_node=2, slots_per_gpu=1)
    plan = Plan.from_homes(np.array([[0, 1, 2, 3]]), gpus=4)
    topk = np.array([[[0, 1]], [[0, 3]]], dtype=np.int16)
    trace = Trace(topk, np.zeros(2, np.int32), np.zeros(2, np.int32), ("a",), 4, home=np.array([0, 0]))
    m = evaluate(plan, trace, c)
    assert m["comm_nodes_per_token"] == pytest.approx(0.5)
    assert m["comm_per_token"] == pytest.approx(1.0)
    # one node per GPU: remote nodes are remote GPUs
    one = evaluate(plan, trace, replace(c, gpus_per_node=1))
    assert one["comm_nodes_per_token"] == pytest.approx(one["comm_per_token"])


@settings(max_examples=examples(40))
@given(small_case(max_experts=8, max_gpus=6, replicas=True, dispatch=None), st.data())
def test_remote_nodes_expectation_is_the_mean_over_homes(case, data):
    """Every rule: remote nodes, GPUs and weighted cost with homes unknown are the mean over the G explicit homes."""
    cluster, trace, plan = case
    if plan.dispatch.kind == "locality":  # the guard's choice depends on the home itself: no expectation form
        plan = plan.with_dispatch(Dispatch(kind="even"))
    m = evaluate(plan, trace, cluster)
    per_home = []
    for h in range(cluster.gpus):
        t = replace(trace, home=np.full(trace.tokens, h))
        e = evaluate(plan, t, cluster)
        per_home.append([e["comm_nodes_per_token"], e["comm_per_token"], e["comm_weighted_per_token"]])
    mean = np.mean(per_home, axis=0)
    assert np.allclose(mean, [m["comm_nodes_per_token"], m["comm_per_token"], m["comm_weighted_per_token"]])
    # never more than the remote GPUs, and zero on a one-node cluster
    assert m["comm_nodes_per_token"] <= m["comm_per_token"] + 1e-9
    if cluster.gpus_per_node == cluster.gpus:
        assert m["comm_nodes_per_token"] == 0.0


def test_static_expectation_past_64_gpus():
    """SGLang static on 72 GPUs in 9 nodes (homes as bit masks of two words): the expectation over homes
    equals the mean over the 72 explicit homes."""
    rng = np.random.default_rng(3)
    G, E, W = 72, 40, 2
    slots = np.full((1, G, W), -1)
    flat = slots[0].reshape(-1)
    flat[rng.permutation(G * W)[: 2 * E]] = np.concatenate([np.arange(E), rng.permutation(E)])
    for g in range(G):  # no expert twice on one GPU
        if slots[0, g, 0] == slots[0, g, 1]:
            slots[0, g, 1] = -1
    plan = Plan(slots=slots, experts=E, dispatch=Dispatch(kind="static"))
    c = Cluster(gpus=G, gpus_per_node=8, slots_per_gpu=1, replica_slots_per_gpu=1)
    topk = np.stack([rng.permutation(E)[:4] for _ in range(30)])[:, None, :].astype(np.int16)
    trace = Trace(topk, np.zeros(30, np.int32), np.zeros(30, np.int32), ("a",), E)
    m = evaluate(plan, trace, c)
    keys = ("comm_nodes_per_token", "comm_per_token", "comm_weighted_per_token")
    per = [[evaluate(plan, replace(trace, home=np.full(30, h)), c)[k] for k in keys] for h in range(G)]
    assert np.allclose(np.mean(per, axis=0), [m[k] for k in keys])


# ----------------------------------------------------------------------------- group-limited routing
@settings(max_examples=examples(30))
@given(
    groups=st.sampled_from([2, 4, 8]),
    per=st.integers(1, 6),
    data=st.data(),
)
def test_group_limited_synth_never_leaves_its_groups(groups, per, data):
    """Synthetic group-limited routing: every token's k distinct experts lie in at most topk_group groups."""
    from moeopt.synth import SynthSpec, synthesize

    E = groups * per
    topk_group = data.draw(st.integers(1, groups))
    k = data.draw(st.integers(1, min(E, topk_group * per, 8)))
    spec = SynthSpec(layers=2, experts=E, top_k=k, tokens=300, steps=3, expert_groups=groups, topk_group=topk_group)
    topk = synthesize(spec).topk.astype(np.int64)
    g = np.sort(topk // per, axis=-1)
    used = 1 + (g[..., 1:] != g[..., :-1]).sum(axis=-1)
    assert used.max() <= topk_group
    s = np.sort(topk, axis=-1)
    assert (s[..., 1:] != s[..., :-1]).all()  # distinct experts


def test_group_limited_count_sampling_and_bad_specs():
    """trace_from_counts routes group-limited too; a group count that does not divide E or holds too few
    experts is refused in one line."""
    from moeopt.errors import InputError
    from moeopt.synth import SynthSpec, trace_from_counts
    from moeopt.trace import stats_from_counts

    rng = np.random.default_rng(0)
    stats = stats_from_counts(rng.random((1, 2, 32)) + 0.1, top_k=6)
    t = trace_from_counts(stats, tokens=500, seed=1, expert_groups=8, topk_group=2)
    g = np.sort(t.topk.astype(np.int64) // 4, axis=-1)
    assert (1 + (g[..., 1:] != g[..., :-1]).sum(axis=-1)).max() <= 2
    with pytest.raises(ValueError, match="expert_groups: expected a divisor"):
        trace_from_counts(stats, expert_groups=5, topk_group=2)
    with pytest.raises(InputError, match="topk_group"):
        SynthSpec.from_mapping({"experts": 16, "top_k": 6, "expert_groups": 8, "topk_group": 2})
