"""SGLang static's seeded draw replayed one layer at a time (`moeopt.balance.seeded`), and the polish
of GPU positions that ``balance`` and ``joint`` run for it: the replay equals the engine's tables
(moeopt's `static_map`, itself checked against SGLang's code in test_engine_routing, and the
SGLang fixture directly), the polish keeps every GPU's contents and nodes, never raises the
realized MaxVio, and its figures are the scorer's (`count_loads` under ``static``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.balance.seeded import StaticStreams, polish_static_positions, static_layer_share, static_trials
from moeopt.dispatch import count_loads, static_map
from moeopt.evaluate import maxvio
from moeopt.instance import Cluster, Instance
from moeopt.plan import Dispatch, Plan
from moeopt.solve import solve
from tests.strategies import engine_plans, float_arrays

ENGINES = Path(__file__).resolve().parent / "data" / "engines"


def replayed(plan: Plan, gpn: int | None, dense: int) -> np.ndarray:
    """int ``[G, L, E]``: `StaticStreams` layer after layer (each layer's table asked twice
    without committing first: asking must not run the streams)."""
    L, G, W = plan.slots.shape
    streams = StaticStreams(G, W, plan.experts, gpn, dense)
    out = []
    for l in range(L):
        row = plan.slots[l].reshape(-1)
        first = streams.table(row)
        assert (streams.table(row) == first).all()
        out.append(first)
        streams.advance(row)
    return np.stack(out, axis=1)


@given(engine_plans())
def test_replay_equals_static_map(case):
    """Layer by layer, the replayed tables equal static_map's on every rank, layer and expert, with
    and without nodes and dense rows."""
    plan, gpn, dense = case
    for nodes in (gpn, None):
        assert (replayed(plan, nodes, dense) == static_map(plan, nodes, 42, dense)).all()


def test_replay_equals_sglang_fixture():
    """On every committed plan SGLang 0.5.23 ran (tests/data/engines/random.npz), the replay equals the
    engine's own tables, for each configuration it was run with (dense rows, nodes)."""
    f = np.load(ENGINES / "random.npz")
    prefixes = sorted({k.rsplit("/", 1)[0] + "/" for k in f.files if k.endswith("/sglang")})
    assert prefixes
    for p in prefixes:
        plan = Plan(slots=f[p + "slots"].astype(np.int64), experts=int(f[p + "experts"]))
        configs = zip(f[p + "sglang_dense"], f[p + "sglang_nnodes"], f[p + "sglang"], strict=True)
        for dense, nnodes, engine in configs:
            gpn = plan.gpus // int(nnodes)
            assert (replayed(plan, gpn if gpn < plan.gpus else None, int(dense)) == engine).all(), p


def _layouts(draw, G: int, W: int, E: int, L: int) -> np.ndarray:
    slots = np.empty((L, G, W), dtype=np.int64)
    for l in range(L):
        items = np.concatenate(
            [np.arange(E), draw(st.lists(st.integers(0, E - 1), min_size=G * W - E, max_size=G * W - E))]
        )
        perm = draw(st.permutations(list(range(G * W))))
        slots[l] = np.asarray(items)[perm].reshape(G, W)
    return slots


@st.composite
def polish_cases(draw):
    G = draw(st.sampled_from([4, 6, 8]))
    gpn = draw(st.sampled_from([d for d in range(1, G + 1) if G % d == 0]))
    W = draw(st.integers(2, 3))
    E = draw(st.integers(G, G * W - 1))
    L = draw(st.integers(1, 3))
    slots = _layouts(draw, G, W, E, L)
    load = draw(float_arrays((L, E), 0.0, 100.0))
    return slots, load, gpn, draw(st.integers(0, 2)), draw(st.integers(2, 12)), draw(st.integers(0, 3))


@settings(max_examples=40)
@given(polish_cases())
def test_polish_keeps_contents_and_lowers_the_realized_maxvio(case):
    """Every layer's GPUs are a permutation within nodes (the same contents, each in its node), the
    realized MaxVio (mean over layers) never rises, and the reported figures are the scorer's loads under static
    (count_loads of the plan with its dense rows, nodes as given)."""
    slots, load, gpn, dense, trials, seed = case
    L, G, W = slots.shape
    E = load.shape[1]
    out, stats = polish_static_positions(slots, load, gpus_per_node=gpn, dense_layers=dense, trials=trials, seed=seed)
    node = gpn if gpn < G else G
    for l in range(L):
        for b in range(0, G, node):  # the same contents in every node
            before = sorted(tuple(sorted(r)) for r in slots[l, b : b + node].tolist())
            after = sorted(tuple(sorted(r)) for r in out[l, b : b + node].tolist())
            assert before == after
    assert np.mean(stats["static_maxvio_after"]) <= np.mean(stats["static_maxvio_before"]) + 1e-12
    cluster = Cluster(gpus=G, gpus_per_node=gpn, slots_per_gpu=W)
    for plan, key in ((Plan(slots=slots, experts=E), "before"), (Plan(slots=out, experts=E), "after")):
        plan = plan.with_dispatch(Dispatch(kind="static", dense_layers=dense))
        loads = count_loads(plan, load, cluster)  # the scorer's static loads, homes uniform
        np.testing.assert_allclose(maxvio(loads), stats[f"static_maxvio_{key}"], atol=1e-9)
    # no choice: the plan as it was, nothing replayed
    same, none = polish_static_positions(slots, load, gpus_per_node=gpn, dense_layers=dense, trials=1)
    assert (same == slots).all() and none == {}


@settings(max_examples=40)
@given(polish_cases(), st.booleans())
def test_repack_moves_only_single_copy_experts(case, grouped):
    """With repack and no permutation, every replicated expert's copies stay in their slots (so the
    draw is the same), the single-copy experts and empty slots only trade places (within their
    router group when groups are given), the realized MaxVio of every layer does not rise, and the
    reported figures are the scorer's (count_loads under static)."""
    slots, load, gpn, dense, _, _ = case
    L, G, W = slots.shape
    E = load.shape[1]
    groups = np.arange(E) % 2 if grouped else None
    out, stats = polish_static_positions(
        slots, load, gpus_per_node=gpn, dense_layers=dense, repack=True, groups=groups, trials=1
    )
    for l in range(L):
        multi = np.bincount(slots[l].ravel(), minlength=E) > 1
        fixed = multi[slots[l]]
        assert (out[l][fixed] == slots[l][fixed]).all()
        assert sorted(out[l][~fixed].tolist()) == sorted(slots[l][~fixed].tolist())
        if groups is not None:  # each GPU keeps its count of each group's single-copy experts
            for g in range(G):
                was = np.bincount(groups[slots[l][g][~fixed[g]]], minlength=2)
                now = np.bincount(groups[out[l][g][~fixed[g]]], minlength=2)
                assert (was == now).all()
    assert all(a <= b + 1e-9 for a, b in zip(stats["static_maxvio_after"], stats["static_maxvio_before"], strict=True))
    cluster = Cluster(gpus=G, gpus_per_node=gpn, slots_per_gpu=W)
    for plan, key in ((Plan(slots=slots, experts=E), "before"), (Plan(slots=out, experts=E), "after")):
        plan = plan.with_dispatch(Dispatch(kind="static", dense_layers=dense))
        np.testing.assert_allclose(maxvio(count_loads(plan, load, cluster)), stats[f"static_maxvio_{key}"], atol=1e-9)


@settings(max_examples=30)
@given(polish_cases())
def test_repack_after_permutations(case):
    """With repack and permutations, each node keeps its replicated copies (a permutation within
    nodes moves them between its GPUs), every layer keeps its experts, the mean realized MaxVio
    does not rise and the reported figures are the scorer's."""
    slots, load, gpn, dense, trials, seed = case
    L, G, W = slots.shape
    E = load.shape[1]
    out, stats = polish_static_positions(
        slots, load, gpus_per_node=gpn, dense_layers=dense, repack=True, trials=trials, seed=seed
    )
    node = gpn if gpn < G else G
    for l in range(L):
        assert sorted(out[l].ravel().tolist()) == sorted(slots[l].ravel().tolist())
        multi = np.bincount(slots[l].ravel(), minlength=E) > 1
        for b in range(0, G, node):
            was, now = slots[l, b : b + node].ravel(), out[l, b : b + node].ravel()
            assert sorted(was[multi[was]].tolist()) == sorted(now[multi[now]].tolist())
    assert np.mean(stats["static_maxvio_after"]) <= np.mean(stats["static_maxvio_before"]) + 1e-12
    cluster = Cluster(gpus=G, gpus_per_node=gpn, slots_per_gpu=W)
    for plan, key in ((Plan(slots=slots, experts=E), "before"), (Plan(slots=out, experts=E), "after")):
        plan = plan.with_dispatch(Dispatch(kind="static", dense_layers=dense))
        np.testing.assert_allclose(maxvio(count_loads(plan, load, cluster)), stats[f"static_maxvio_{key}"], atol=1e-9)


def test_a_deadline_leaves_the_plan_as_given():
    """When the deadline passes before the last layer, the plan comes back as given (a plan
    polished part way has no known figures for the rest), saying where it stopped."""
    rng = np.random.default_rng(5)
    G, W, E, L = 8, 3, 20, 3
    slots = np.stack([rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, G * W - E)])) for _ in range(L)])
    slots = slots.reshape(L, G, W)
    load = rng.random((L, E))
    out, stats = polish_static_positions(slots, load, repack=True, deadline=time.perf_counter() - 1.0)
    assert (out == slots).all() and stats == {"static_polish_cut": 0}


def test_layer_share_sums_to_one():
    """Each expert's shares over the GPUs sum to 1 (every rank sends its tokens somewhere)."""
    rng = np.random.default_rng(3)
    G, W, E = 8, 3, 20
    slots = np.concatenate([np.arange(E), rng.integers(0, E, G * W - E)])
    rng.shuffle(slots)
    share = static_layer_share(StaticStreams(G, W, E).table(slots), W, E)
    np.testing.assert_allclose(share.sum(axis=1), 1.0)


def test_trials_are_work_bounded():
    """64 permutations at 16 GPUs x 64 experts, 1 (no polish) at DeepSeek-V3's 256 x 256."""
    assert static_trials(16, 64) == 64 and static_trials(256, 256) == 1 and static_trials(64, 256) == 4


@pytest.fixture(scope="module")
def skewed() -> tuple[Instance, np.ndarray]:
    """One node of 16 GPUs x (4 + 1) slots, 64 experts with skewed loads (a Zipf-like profile),
    SGLang static named as the engine."""
    rng = np.random.default_rng(0)
    L, E = 2, 64
    counts = np.stack([rng.permutation(1.0 / np.arange(1, E + 1) ** 0.8) * 1e5 for _ in range(L)]).round()
    inst = Instance.from_counts(
        counts, gpus=16, top_k=4, slots_per_gpu=4, replica_slots_per_gpu=1, engine="sglang-static"
    )
    return inst, counts


def test_balance_for_static_is_polished(skewed):
    """balance for SGLang static (cluster.engine) re-deals its single-copy experts for the draw:
    the MaxVio under the draw, reported before and after, is lower after (here below 0.01 from
    above 0.05), and the scorer agrees with the reported figure."""
    inst, counts = skewed
    r = solve(inst, method="balance")
    before, after = r.stats["static_maxvio_before"], r.stats["static_maxvio_after"]
    assert sum(after) < sum(before) and max(after) < 0.01 < max(before)
    assert r.plan.dispatch.kind == "static"
    loads = count_loads(r.plan, counts, inst.cluster)
    np.testing.assert_allclose(maxvio(loads), after, atol=1e-9)
    # the result's objective is the plan's peak / mean load under the rule, as the scorer has it
    assert r.objective == pytest.approx(1.0 + float(np.mean(after))) and r.bound == 1.0
    # a re-plan from a plan in service keeps its positions (a relabelling would move every weight)
    again = solve(inst, method="balance", current=r.plan)
    assert "static_maxvio_after" not in again.stats


def test_balance_under_a_spent_time_limit_keeps_its_positions(skewed, monkeypatch):
    """A time limit that has passed when the polish starts leaves the balance plan as it was, and
    the run says the time limit cut it."""
    from moeopt.balance import seeded

    inst, _ = skewed
    real = seeded.polish_static_positions

    def late(*args, **kwargs):
        return real(*args, **{**kwargs, "deadline": time.perf_counter() - 1.0})

    monkeypatch.setattr("moeopt.methods.balance.polish_static_positions", late)
    r = solve(inst, method="balance")
    assert r.stats["static_polish"].startswith("cut by the time limit") and r.termination.value == "time_limit"
    assert "static_maxvio_after" not in r.stats


def test_no_replay_past_the_size_limit(skewed, monkeypatch):
    """Past STATIC_REPLAY_LIMIT (seconds a layer: 256 GPUs x 256 experts) the plan keeps its
    positions and says why; 64 x 256 is replayed."""
    from moeopt.balance import seeded

    assert seeded.static_replay_fits(64, 256) and not seeded.static_replay_fits(256, 256)
    monkeypatch.setattr(seeded, "STATIC_REPLAY_LIMIT", 100)
    inst, _ = skewed
    r = solve(inst, method="balance")
    assert r.stats["static_polish"].startswith("skipped") and "static_maxvio_after" not in r.stats


def test_no_polish_under_another_rule(skewed):
    """Under even the positions are the planner's own: nothing is replayed."""
    inst, counts = skewed
    even = inst.replace(cluster=replace(inst.cluster, engine="sglang"))
    r = solve(even, method="balance")
    assert "static_maxvio_after" not in r.stats
