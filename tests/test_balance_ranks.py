"""Balance under vLLM-Ascend's rank-modulo routing: loads, the polish, the bound, the planner."""

from __future__ import annotations

import itertools
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.balance.ranks import polish_rank_modulo, rank_modulo_bound, rank_modulo_loads, share_table
from moeopt.dispatch import count_loads
from moeopt.evaluate import maxvio
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.plan import Dispatch, Plan
from moeopt.solve import solve
from tests.strategies import examples, float_arrays, slot_layouts


@st.composite
def layers(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int | None]:
    """A one-layer plan (extra copies on other GPUs), loads, and a TP size."""
    G = draw(st.integers(2, 6))
    W = draw(st.integers(1, 3))
    E = draw(st.integers(1, G * W))
    slots = draw(slot_layouts(E, G, W, 1, fill=None))[0]
    load = draw(float_arrays(E, 0.0, 100.0))
    tp = draw(st.sampled_from([None, 2, 3]))
    return slots, load, tp


@settings(max_examples=examples(60))
@given(case=layers())
def test_loads_are_the_dispatch_rules(case):
    """The planner's loads equal the scorer's under ``ascend`` (moeopt.dispatch, a separate code path)."""
    slots, load, tp = case
    G, E = slots.shape[0], load.size
    plan = Plan(slots=slots[None], experts=E, dispatch=Dispatch(kind="ascend", tp_size=tp))
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=slots.shape[1])
    expected = count_loads(plan, load[None], cluster)[0]
    np.testing.assert_allclose(rank_modulo_loads(slots, load, share_table(G, E, tp)), expected, atol=1e-9)


@settings(max_examples=examples(60))
@given(case=layers())
def test_polish_keeps_counts_and_never_worsens(case):
    """The polish keeps every copy count and GPU fill, never colocates, and never raises the peak."""
    slots, load, tp = case
    G, E = slots.shape[0], load.size
    table = share_table(G, E, tp)
    before = rank_modulo_loads(slots, load, table)
    out, swaps = polish_rank_modulo(slots, load, table)
    after = rank_modulo_loads(out, load, table)
    assert after.max() <= before.max() + 1e-9
    assert np.array_equal(np.bincount(out[out >= 0], minlength=E), np.bincount(slots[slots >= 0], minlength=E))
    assert np.array_equal((out >= 0).sum(axis=1), (slots >= 0).sum(axis=1))
    for row in out:
        ids = row[row >= 0]
        assert len(set(ids.tolist())) == len(ids)
    assert swaps >= 0


def _every_plan(E: int, G: int, W: int):
    """Every layout of E experts in G x W slots, each expert at least once, at most once per GPU."""
    per_gpu = [c for r in range(W + 1) for c in itertools.combinations(range(E), r)]
    for choice in itertools.product(per_gpu, repeat=G):
        held = np.zeros(E, dtype=int)
        for c in choice:
            held[list(c)] += 1
        if (held >= 1).all():
            slots = np.full((G, W), -1)
            for g, c in enumerate(choice):
                slots[g, : len(c)] = c
            yield slots


@settings(max_examples=examples(25), deadline=None)
@given(E=st.integers(2, 4), G=st.integers(2, 3), W=st.integers(1, 2), tp=st.sampled_from([None, 2]), data=st.data())
def test_bound_is_below_every_plan(E, G, W, tp, data):
    """The rule's lower bound is at most the best plan's peak, found by enumerating every plan."""
    if E > G * W:
        return
    load = data.draw(float_arrays(E, 0.0, 10.0))
    table = share_table(G, E, tp)
    best = min(rank_modulo_loads(s, load, table).max() for s in _every_plan(E, G, W))
    assert rank_modulo_bound(load, G, W, table) <= best + 1e-9


def test_share_table_by_hand():
    """64 ranks over 3 copies: 22, 21, 21 ranks; TP 2 shifts the deal by the expert id."""
    t = share_table(64, 2)
    assert (t[0, 3, :3] * 64).tolist() == [22, 21, 21] and t[0, 4, :4].tolist() == [0.25] * 4
    t2 = share_table(4, 2, tp_size=2)  # ranks 0..3: (r % 2 + r // 2 + e) % 2
    assert (t2[0, 2, :2] * 4).tolist() == [2, 2]
    assert (t2[0, 3, :3] * 4).tolist() == [1, 2, 1] and (t2[1, 3, :3] * 4).tolist() == [1, 1, 2]


def test_balance_plans_for_vllm_ascend(deepseek_few_layers):
    """On real DeepSeek-V3 loads (64 GPUs x 5 slots) the even plan loses its balance under the
    rank-modulo rule; the plan made for the rule (cluster.engine: vllm-ascend) keeps MaxVio <= 0.005."""
    inst = Instance(
        name="ds",
        model=Model(layers=4, experts=256, top_k=8),
        cluster=Cluster(gpus=64, gpus_per_node=8, slots_per_gpu=4, replica_slots_per_gpu=1, engine="vllm-ascend"),
        workload=Workload(calibration=WorkloadSource(path=deepseek_few_layers)),
        method=MethodSpec(name="balance"),
    )
    made = solve(inst)
    assert made.plan is not None and made.plan.dispatch.kind == "ascend"
    assert made.metrics["maxvio"] <= 0.005
    assert 0 <= made.metrics["balance_bound_maxvio"] <= made.metrics["maxvio"] + 1e-12
    even = solve(inst.replace(cluster=Cluster(gpus=64, gpus_per_node=8, slots_per_gpu=4, replica_slots_per_gpu=1)))
    assert even.plan is not None and even.plan.dispatch.kind == "even"
    c = inst.cluster
    load = np.array(json.loads(deepseek_few_layers.read_text())["logical_count"][3:], dtype=float)
    under_rule = maxvio(count_loads(even.plan.with_dispatch(Dispatch(kind="ascend")), load, c)).mean()
    assert under_rule > 2 * made.metrics["maxvio"]  # what exporting the even plan would give
