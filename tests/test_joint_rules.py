"""The joint objective under the engines' dispatch rules (RuleCost): exact against the scorer,
incremental gains equal to re-pricing, and joint plans made for a rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.dispatch import batch_rows, count_loads
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.joint import RULE_KINDS, JointLayer, Move, RuleCost, SlotState
from moeopt.joint.rules import rows_any
from moeopt.joint.search import top_order
from moeopt.plan import Dispatch, Plan
from moeopt.solve import load_workloads, solve
from moeopt.trace import Trace
from tests.strategies import examples, slot_layouts, topk_arrays


@st.composite
def cases(draw: st.DrawFn, rules: tuple[str, ...] = RULE_KINDS):
    """A one-layer plan without colocated copies, a token sample with steps and homes, a rule."""
    G = draw(st.integers(2, 5))
    W = draw(st.integers(1, 3))
    E = draw(st.integers(2, G * W))
    k = draw(st.integers(1, min(3, E)))
    n = draw(st.integers(1, 40))
    slots = draw(slot_layouts(E, G, W, 1, fill=None))[0]
    topk = draw(topk_arrays((n,), E, k)).astype(np.int64)
    step = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    home = np.array(draw(st.lists(st.integers(0, G - 1), min_size=n, max_size=n)))
    rule = draw(st.sampled_from(rules))
    gpn = draw(st.sampled_from([None, 1, 2]))
    return slots, topk, step, home, rule, gpn


def _cost(slots, topk, step, home, rule, gpn, draw=None, homes_known=False):
    G, W = slots.shape
    E = int(max(slots.max(), topk.max())) + 1
    n, k = topk.shape
    trace = Trace(
        topk=topk[:, None, :].astype(np.int16),
        family=np.zeros(n, np.int32),
        step=step.astype(np.int32),
        family_names=("a",),
        num_experts=E,
        home=home.astype(np.int64) if homes_known or rule in ("static", "ascend") else None,
    )
    layer = JointLayer(topk=topk, family=np.zeros(n), families=1, experts=E, gpus=G, width=W, robust=0.0)
    cost = RuleCost(
        layer,
        rule,
        row=batch_rows(trace, rule),
        home=home,
        draw=np.zeros((n, k)) if draw is None else draw,
        gpus_per_node=gpn,
        homes_known=homes_known,
    )
    return cost, trace, E


@settings(max_examples=examples(80))
@given(case=cases(rules=("even", "vllm", "ascend")), homes_known=st.booleans())
def test_deterministic_rules_price_what_the_scorer_scores(case, homes_known):
    """Under even, vllm and ascend the cost's mean remote GPUs per token and its loads are the
    scorer's on the same tokens (rows from their steps; homes from the trace, or uniform)."""
    slots, topk, step, home, rule, _ = case
    cost, trace, E = _cost(slots, topk, step, home, rule, None, homes_known=homes_known)
    value = cost.reset(SlotState(slots, E))
    G, W = slots.shape
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=W)
    plan = Plan(slots=slots[None], experts=E, dispatch=Dispatch(kind=rule))
    m = evaluate(plan, trace, cluster)
    # one workload, no load term within the limit: the value is the remote mean plus the penalty part
    remote = cost._remote_sum[0] / len(topk)
    assert remote == pytest.approx(m["comm_per_token"], abs=1e-9)
    loads = count_loads(plan, np.bincount(topk.ravel(), minlength=E)[None].astype(float), cluster)[0]
    np.testing.assert_allclose(cost.loads()[0], loads, atol=1e-9)
    assert value >= remote - 1e-9


@settings(max_examples=examples(80))
@given(case=cases(), data=st.data())
def test_delta_equals_repricing(case, data):
    """Every move's incremental gain equals the change of the re-priced value, under every rule."""
    slots, topk, step, home, rule, gpn = case
    n, k = topk.shape
    draws = np.array(data.draw(st.lists(st.floats(0, 0.999), min_size=n * k, max_size=n * k))).reshape(n, k)
    cost, _, E = _cost(slots, topk, step, home, rule, gpn, draws)
    state = SlotState(slots, E)
    base = cost.reset(state)
    G, W = slots.shape
    a, b = data.draw(st.integers(0, G - 1)), data.draw(st.integers(0, G - 1))
    i, j = data.draw(st.integers(0, W - 1)), data.draw(st.integers(0, W - 1))
    moves = [Move("swap", a, i, b, j), Move("replace", a, i, expert=data.draw(st.integers(0, E - 1)))]
    for m in moves:
        if not state.valid(m):
            continue
        d = cost.delta(state, m)
        trial = state.copy()
        trial.apply(m)
        assert cost.reset(trial) - base == pytest.approx(d, abs=1e-9)
        cost.reset(state)


def test_static_near_copy_is_free():
    """Under static a token whose home holds its expert stays home: an expert on every GPU costs
    no remote GPU, whatever the draw."""
    slots = np.array([[0, 1], [0, 2], [0, 3]])  # expert 0 on every GPU
    topk = np.array([[0], [0], [0]])
    cost, _, E = _cost(slots, topk, np.zeros(3, int), np.array([0, 1, 2]), "static", None, np.full((3, 1), 0.9))
    cost.reset(SlotState(slots, E))
    assert cost._remote_sum[0] == 0.0


@pytest.fixture(scope="module")
def small_instance():
    return Instance(
        name="t",
        model=Model(layers=1, experts=16, top_k=2),
        cluster=Cluster(gpus=4, gpus_per_node=4, slots_per_gpu=4, replica_slots_per_gpu=1),
        workload=Workload(calibration=WorkloadSource(synthetic={"tokens": 2048, "steps": 8, "seed": 0})),
        method=MethodSpec(name="joint"),
    )


@pytest.mark.parametrize("rule", ["even", "static", "lp", "ascend"])
def test_joint_plans_for_an_engine_rule(small_instance, rule):
    """joint with an engine rule returns a plan under that rule, scored by the scorer on
    calibration as the result says, and an instance's engine makes it the default."""
    r = solve(small_instance, params={"dispatch": rule, "eps": 0.3, "time_per_layer": 1.0, "restarts": 1})
    assert r.plan is not None and r.plan.dispatch.kind == rule
    engine = {"even": "sglang", "static": "sglang-static", "lp": "sglang-lp", "ascend": "vllm-ascend"}[rule]
    inst = small_instance.replace(
        cluster=Cluster(gpus=4, gpus_per_node=4, slots_per_gpu=4, replica_slots_per_gpu=1, engine=engine)
    )
    r2 = solve(inst, params={"eps": 0.3, "time_per_layer": 1.0, "restarts": 1})
    assert r2.plan is not None and r2.plan.dispatch.kind == rule
    assert "engine_rule" not in r2.stats  # planned for the engine's rule: nothing re-scored


@settings(max_examples=examples(60))
@given(case=cases(rules=("static",)))
def test_static_loads_bound_the_fair_draw(case):
    """Under static (no node preference) the cost's GPU loads are at least the scorer's, whatever
    SGLang's seeded draw gives each copy, and equal to them when every copy count divides G."""
    slots, topk, step, home, _, _ = case
    cost, _, E = _cost(slots, topk, step, home, "static", None)
    cost.reset(SlotState(slots, E))
    G, W = slots.shape
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=W)
    plan = Plan(slots=slots[None], experts=E, dispatch=Dispatch(kind="static"))
    load = np.bincount(topk.ravel(), minlength=E)[None].astype(float)
    real = count_loads(plan, load, cluster)[0]
    assert (cost.loads()[0] >= real - 1e-9).all()
    c = plan.copy_counts[0]
    if (G % c == 0).all():
        np.testing.assert_allclose(cost.loads()[0], real, atol=1e-9)


@settings(max_examples=examples(60))
@given(case=cases(rules=("even", "vllm", "ascend")))
def test_over_share_is_the_largest_excess_over_the_limit(case):
    """RuleCost.over_share on GPUs (no bins): the hottest GPU's load over (1 + eps) times the
    mean, in units of the mean; 0 within the limit."""
    slots, topk, step, home, rule, _ = case
    cost, _, E = _cost(slots, topk, step, home, rule, None)
    cost.reset(SlotState(slots, E))
    loads = cost.loads()[0]
    mean = loads.mean()
    eps = float(cost._eps[0])
    expected = max(loads.max() / mean - (1.0 + eps), 0.0) if mean > 0 else 0.0
    assert cost.over_share() == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_distinct_per_row_counts_each_rows_values(data):
    """The popcount path (G <= 64) and the sorting path (G > 64) both count each row's distinct
    GPUs as a set would."""
    from moeopt.joint.rules import distinct_per_row

    G = data.draw(st.sampled_from([1, 2, 7, 16, 63, 64, 65, 256]))
    m = data.draw(st.integers(0, 30))
    k = data.draw(st.integers(1, 9))
    gpu = np.array(data.draw(st.lists(st.integers(0, G - 1), min_size=m * k, max_size=m * k)), dtype=np.int64)
    gpu = gpu.reshape(m, k)
    want = np.array([len(set(row.tolist())) for row in gpu], dtype=np.int64)
    got = distinct_per_row(gpu, G)
    assert got.dtype == np.int64 and got.shape == (m,)
    np.testing.assert_array_equal(got, want)


@given(
    st.lists(st.floats(-3, 3) | st.just(-np.inf) | st.sampled_from([0.0, 1.0]), min_size=1, max_size=80),
    st.integers(1, 90),
)
def test_top_order_is_the_full_sorts_head(values: list[float], n: int) -> None:
    """The screening's partial selection gives the indices and order of ``argsort(-v)[:n]``, ties
    and -inf included (where the selection is not unique it is the full sort)."""
    v = np.array(values)
    assert (top_order(v, n) == np.argsort(-v)[:n]).all()


@given(st.integers(0, 40), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_rows_any_agrees_with_any(m: int, k: int, seed: int) -> None:
    mask = np.random.default_rng(seed).random((m, k)) < 0.15
    assert (rows_any(mask) == mask.any(axis=1)).all()
    assert (rows_any(mask[:, ::-1]) == mask[:, ::-1].any(axis=1)).all()  # not contiguous: the plain reduction


@settings(max_examples=examples(100), deadline=None)
@given(st.data())
def test_mix_layers_is_within_eps_and_beats_every_whole_restart(data):
    """The per-layer mix of restarts keeps the mean MaxVio within eps whenever some mix is, costs
    no more than any whole restart within it (nor, with one layer, than any restart within), and
    falls back to the most balanced plan of each layer when none is."""
    from itertools import product

    from moeopt.joint.choice import mix_layers

    R = data.draw(st.integers(1, 4))
    L = data.draw(st.integers(1, 4))
    vals = st.floats(0.0, 1.0, allow_nan=False)
    comm = np.array(data.draw(st.lists(st.lists(vals, min_size=L, max_size=L), min_size=R, max_size=R)))
    vio = np.array(data.draw(st.lists(st.lists(vals, min_size=L, max_size=L), min_size=R, max_size=R)))
    eps = data.draw(st.floats(0.0, 1.0))
    pick = mix_layers(comm, vio, eps)
    cols = np.arange(L)
    assert pick.shape == (L,) and ((0 <= pick) & (pick < R)).all()
    mixes = [np.array(p) for p in product(range(R), repeat=L)]
    feasible = [p for p in mixes if vio[p, cols].mean() <= eps + 1e-9]
    if not feasible:
        assert np.allclose(vio[pick, cols], vio.min(axis=0))
        return
    assert vio[pick, cols].mean() <= eps + 1e-9
    got = comm[pick, cols].sum()
    for r in range(R):
        if vio[r].mean() <= eps + 1e-9:
            assert got <= comm[r].sum() + 1e-9
    if L == 1:
        assert got == pytest.approx(min(comm[p, cols].sum() for p in feasible))


def test_ladder_limits_scale_then_bracket():
    """A layer that came in under its limit is searched next at a limit scaled by how far (at most
    the span's top); one that went over, lower (not under the span's bottom); once a limit gave a
    plan within and another one over, the geometric mean of the two."""
    from moeopt.joint.choice import ladder_limits

    limits = np.array([0.2, 0.2, 0.2])
    within, over = np.full(3, np.nan), np.full(3, np.nan)
    nxt = ladder_limits(limits.copy(), limits, np.array([0.1, 0.05, 0.25]), within, over, (0.5, 2.0))
    assert nxt == pytest.approx([0.4, 0.4, 0.16])
    assert within[:2] == pytest.approx([0.2, 0.2]) and np.isnan(within[2])
    assert over[2] == pytest.approx(0.2) and np.isnan(over[:2]).all()
    # layer 0's 0.4 goes over: between 0.2 (within) and 0.4; layer 2's 0.16 comes in: between 0.16 and 0.2
    nxt2 = ladder_limits(nxt, limits, np.array([0.3, 0.19, 0.15]), within, over, (0.5, 2.0))
    assert nxt2[0] == pytest.approx(np.sqrt(0.2 * 0.4))
    assert nxt2[1] == pytest.approx(min(0.4 * 0.2 / 0.19, 0.4))
    assert nxt2[2] == pytest.approx(np.sqrt(0.16 * 0.2))


def test_lp_restarts_climb_a_ladder_and_mix_layers():
    """Under lp, joint's default restarts (8) search at limits scaled by how far each layer's plan
    came under eps on lp's own split; the kept plan, a mix of the restarts' layers or one of them,
    is within eps on calibration as the one scorer measures it, at no more remote GPUs per token than
    any restart within it."""
    from moeopt.methods.joint import LP_RESTARTS

    inst = Instance(
        name="t",
        model=Model(layers=2, experts=16, top_k=2),
        cluster=Cluster(gpus=4, gpus_per_node=4, slots_per_gpu=4, replica_slots_per_gpu=1),
        workload=Workload(calibration=WorkloadSource(synthetic={"tokens": 2048, "steps": 8, "seed": 0})),
        method=MethodSpec(name="joint"),
    )
    eps = 0.15
    wl = load_workloads(inst)
    r = solve(inst, params={"dispatch": "lp", "eps": eps, "evaluations": 300, "time_per_layer": 60.0}, workloads=wl)
    ladder = r.stats["search_eps_per_restart"]
    assert len(ladder) == len(r.stats["restarts"]) == LP_RESTARTS
    assert ladder[0] == pytest.approx([eps, eps])
    assert all(0.5 * eps - 1e-12 <= x <= 2 * eps + 1e-12 for rung in ladder for x in rung)
    assert any(x != pytest.approx(eps) for rung in ladder[1:] for x in rung)
    runs = r.stats["restarts"]
    assert r.stats["constraint_met"]
    cal = evaluate(r.plan, wl.calibration, inst.cluster)
    assert cal["comm_per_token"] == pytest.approx(r.objective) and cal["maxvio"] <= eps + 1e-9
    assert r.objective <= min(x["comm_per_token"] for x in runs if x["met"]) + 1e-9
    if "restart_per_layer" in r.stats:  # a mix: each layer as that restart's plan has it
        assert len(r.stats["restart_per_layer"]) == 2
