"""Dispatch policies: lp optimality (brute force), lp <= even, SGLang's static rule by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.dispatch import (
    all_copies,
    count_loads,
    guard_layer,
    guard_layers,
    lp_layer_loads,
    route_trace,
    static_map,
    static_share,
)
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Trace, stats_from_counts
from tests.strategies import examples, int_arrays, random_slots, slot_layouts, small_case


def brute_force_min_max(counts: np.ndarray, holds: np.ndarray) -> float:
    """The fractional min-max load by Hall's condition: max over GPU sets S of the tokens whose
    experts live only inside S, divided by |S| (the max-flow min-cut value of the LP)."""
    E, G = holds.shape
    best = 0.0
    for r in range(1, G + 1):
        for S in itertools.combinations(range(G), r):
            inside = ~holds[:, [g for g in range(G) if g not in S]].any(axis=1)
            best = max(best, counts[inside].sum() / r)
    return best


@st.composite
def layer_and_counts(draw, colocated: bool = False):
    E = draw(st.integers(1, 6))
    G = draw(st.integers(1, 4))
    W = -(-E // G) + draw(st.integers(0, 2))
    slots = draw(slot_layouts(E, G, W, 1, fill=None, colocated=colocated))
    T = draw(st.integers(1, 3))
    counts = draw(int_arrays((1, T, E), 0, 19)).astype(float)
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=W)
    return Plan(slots=slots, experts=E), counts, cluster


@settings(max_examples=examples(150))
@given(layer_and_counts(colocated=True))
def test_lp_matches_brute_force(case):
    """lp's largest GPU load per batch equals the brute-force fractional optimum."""
    plan, counts, cluster = case
    loads, flow = lp_layer_loads(counts[0], plan.copies_on_gpu[0] > 0)
    for t in range(counts.shape[1]):
        assert loads[t].max() == pytest.approx(brute_force_min_max(counts[0, t], plan.copies_on_gpu[0] > 0), abs=1e-6)
    # the split serves every token, only from GPUs holding the expert
    assert np.allclose(flow.sum(axis=2), counts[0])
    assert (flow[:, ~(plan.copies_on_gpu[0] > 0)] <= 1e-9).all()


@settings(max_examples=examples(150))
@given(layer_and_counts(colocated=True), st.sampled_from(["even", "static"]))
def test_lp_never_worse(case, other):
    """On the same plan, the LP's optimum (what SGLang's LP dispatch aims at) is never above even's or
    static's largest load per batch; the engine's own split (5 affine-scaling steps) is at or above
    that optimum and serves the same tokens."""
    plan, counts, cluster = case
    best = lp_layer_loads(counts[0], plan.copies_on_gpu[0] > 0)[0]
    lp = count_loads(plan.with_dispatch(Dispatch(kind="lp")), counts, cluster)
    rule = count_loads(plan.with_dispatch(Dispatch(kind=other)), counts, cluster)
    assert (best.max(axis=-1) <= rule[0].max(axis=-1) + 1e-6).all()
    assert (lp[0].max(axis=-1) >= best.max(axis=-1) - 1e-6 * (1.0 + counts[0].sum(axis=-1))).all()
    assert np.allclose(lp.sum(axis=-1), counts.sum(axis=-1))


@settings(max_examples=examples(60))
@given(small_case(replicas=True, colocated=True))
def test_lp_loads_on_traces(case):
    """On token traces: lp's per-step loads are the engine's split of the step's counts (the same
    as on those counts), at or above the LP optimum, with the same total load as even."""
    cluster, trace, plan = case
    plan_lp = plan.with_dispatch(Dispatch(kind="lp"))
    even = evaluate(plan, trace, cluster)
    lp = evaluate(plan_lp, trace, cluster)
    assert lp["total_load"] == pytest.approx(even["total_load"])
    r = route_trace(plan_lp, trace, cluster)
    steps = trace.step_counts
    np.testing.assert_allclose(r.step_loads, count_loads(plan_lp, steps, cluster), atol=1e-9)
    for l in range(plan.layers):
        best = lp_layer_loads(steps[l], plan.copies_on_gpu[l] > 0)[0]
        assert (r.step_loads[l].max(axis=-1) >= best.max(axis=-1) - 1e-6 * (1.0 + steps[l].sum(axis=-1))).all()


def test_lp_trace_assignment_follows_the_split():
    """lp's per-token choices are an integer rounding of its loads (within one token per copy)."""
    rng = np.random.default_rng(3)
    N, E, G = 400, 6, 3
    topk = np.argsort(rng.random((N, 1, E)) * np.array([4, 1, 1, 1, 1, 1]), axis=2)[:, :, -2:].astype(np.int16)
    trace = Trace(
        topk=topk,
        family=np.zeros(N, np.int32),
        step=(np.arange(N) // 100).astype(np.int32),
        family_names=("all",),
        num_experts=E,
    )
    plan = Plan(slots=np.array([[[0, 1, 2], [3, 0, -1], [4, 5, 0]]]), experts=E, dispatch=Dispatch(kind="lp"))
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=3)
    r = route_trace(plan, trace, cluster)
    counted = np.zeros((4, G))
    np.add.at(counted, (np.repeat(trace.step, 2), r.gpu[:, 0, :].ravel()), 1)
    assert np.abs(counted - r.step_loads[0]).max() <= 3 + 1e-9  # expert 0 has 3 copies


def test_static_rule_by_hand():
    """SGLang static: own GPU's copy first, then own node's when that narrows, else a fair draw
    over physical slots (so two copies on one GPU draw twice)."""
    # 5 GPUs x 2 slots, one node: expert 0 twice on GPU 0 and once on GPU 1
    slots = np.array([[[0, 0], [0, 1], [2, 3], [4, 5], [6, 7]]])
    plan = Plan(slots=slots, experts=8)
    m = static_map(plan)  # [G_src, L, E] physical slot ids (slot p on GPU p // 2)
    assert m[0, 0, 0] == 0 and m[1, 0, 0] == 2  # local copies, the first one on GPU 0
    assert sorted(m[2:, 0, 0].tolist()) == [0, 1, 2]  # 3 ranks, 3 physical copies: each once
    share = static_share(plan)
    assert share[0, 0].tolist() == pytest.approx([3 / 5, 2 / 5, 0, 0, 0])
    assert (m[:, 0, 5] == 7).all()  # a single copy serves everyone
    # two nodes of 2 GPUs: copies on GPU 0, 1 (node 0) and 2 (node 1); rank 3 stays in its node
    plan2 = Plan(slots=np.array([[[0, 1], [0, 2], [0, 3], [4, 5]]]), experts=6)
    m2 = static_map(plan2, gpus_per_node=2)
    assert m2[3, 0, 0] == 4  # GPU 2's copy (physical slot 4)
    # one node: no narrowing, rank 3 draws over all three copies
    assert m2[3, 0, 0] in (0, 2, 4)


def test_static_expectation_over_homes():
    """Without token homes, static loads are the exact average over the G possible homes."""
    rng = np.random.default_rng(0)
    E, G, W, N = 6, 3, 3, 50
    plan = Plan(slots=random_slots(E, G, W, 1, rng, fill=1.0), experts=E, dispatch=Dispatch(kind="static"))
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=2, replica_slots_per_gpu=1)
    topk = np.argsort(rng.random((N, 1, E)), axis=2)[:, :, :2].astype(np.int16)
    base = dict(topk=topk, family=np.zeros(N, np.int32), step=np.zeros(N, np.int32), family_names=("a",), num_experts=E)
    avg = evaluate(plan, Trace(**base), cluster)
    per_home = [evaluate(plan, Trace(**base, home=np.full(N, h)), cluster) for h in range(G)]
    assert np.allclose(avg["loads"], np.mean([m["loads"] for m in per_home], axis=0))
    assert avg["comm_per_token"] == pytest.approx(np.mean([m["comm_per_token"] for m in per_home]))
    assert avg["gpus_per_token"] == pytest.approx(np.mean([m["gpus_per_token"] for m in per_home]))


@settings(max_examples=examples(40))
@given(small_case(replicas=True, colocated=True, dispatch=None))
def test_counts_and_trace_agree(case):
    """For even, static and ascend (no homes) and lp, a trace's loads equal those from its per-step
    counts (vllm's hash picks copies per row, which counts only have in expectation; locality needs
    tokens)."""
    cluster, trace, plan = case
    if plan.dispatch.kind in ("locality", "vllm"):
        return
    m = evaluate(plan, trace, cluster)
    s = trace.stats()
    m2 = evaluate(plan, s, cluster)
    assert np.allclose(m["loads"], m2["loads"])
    assert m["maxvio_per_step"] == pytest.approx(m2["maxvio_per_step"])
    pooled = evaluate(plan, stats_from_counts(s.expert_load, top_k=trace.top_k), cluster)
    if plan.dispatch.kind != "lp":
        assert np.allclose(pooled["loads"], m["loads"])


def reference_guard(topk, step, copies, G, guard, home):
    """The online guard of SPEC 4.3 written plainly, token by token (the oracle of the tests
    below): batches of ``batch_tokens`` tokens within each step, in step order; a token's
    replicated experts decided one top-k position after another, each on the copy maximizing
    its locality (other experts on the GPU: decided ones where they run, undecided ones
    wherever they have a copy; +1 for the token's home) minus lam * Lhat_g / mean(Lhat)."""
    N, k = topk.shape
    holds = [set(int(g) for g in row if g >= 0) for row in copies]
    out = copies[topk, 0].copy()
    lhat = np.zeros(G)
    order = sorted(range(N), key=lambda t: step[t])
    batches, last, size = [], None, 0
    for t in order:
        if step[t] != last or (guard.batch_tokens is not None and size == guard.batch_tokens):
            batches.append([])
            last, size = step[t], 0
        batches[-1].append(t)
        size += 1
    for tokens in batches:
        mean = lhat.mean()
        pressure = lhat / mean if mean > 0 else np.zeros(G)
        for t in tokens:
            pending = [len(holds[e]) > 1 or (copies[e] >= 0).sum() > 1 for e in topk[t]]
            for j in range(k):
                if not pending[j]:
                    continue
                pending[j] = False
                best, pick = -np.inf, None
                for c in copies[topk[t, j]]:
                    if c < 0:
                        continue
                    loc = sum(
                        (int(c) in holds[topk[t, i]]) if pending[i] else (out[t, i] == c) for i in range(k) if i != j
                    )
                    loc += home is not None and home[t] == c
                    score = loc - guard.lam * pressure[c]
                    if score > best:
                        best, pick = score, c
                out[t, j] = pick
        load = np.bincount(out[tokens].ravel(), minlength=G)
        lhat = guard.decay * lhat + (1.0 - guard.decay) * load
    return out


@settings(max_examples=examples(60))
@given(
    small_case(max_layers=3, replicas=True, colocated=True),
    st.floats(0.0, 8.0),
    st.floats(0.0, 1.0),
    st.one_of(st.none(), st.integers(1, 7)),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_guard_over_all_layers_equals_layer_by_layer(case, lam, decay, batch, homes, rnd):
    """guard_layers (one pass over the batches for every layer) decides each token-slot as
    guard_layer does layer by layer and as the plain token-by-token guard does, with or
    without token homes, for any batch size."""
    cluster, trace, plan = case
    guard = Dispatch("locality", lam=lam, decay=decay, batch_tokens=batch)
    topk = trace.topk.astype(np.int64)
    step = trace.step.astype(np.int64)
    home = np.array([rnd.randrange(cluster.gpus) for _ in range(trace.tokens)]) if homes else None
    together = guard_layers(topk, step, all_copies(plan), cluster.gpus, guard, home)
    for l in range(plan.layers):
        alone = guard_layer(topk[:, l, :], step, plan.copies(l), cluster.gpus, guard, home)
        assert np.array_equal(together[:, l, :], alone)
        expected = reference_guard(topk[:, l, :], step, plan.copies(l), cluster.gpus, guard, home)
        assert np.array_equal(alone, expected)
        holds = plan.copies_on_gpu[l] > 0
        assert holds[topk[:, l, :], together[:, l, :]].all()  # every slot served by a copy of its expert


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 300))
def test_inline_shuffle_draws_as_random_shuffle(seed, n):
    """The static map's written-out shuffle gives random.shuffle's permutation and leaves the
    stream where random.shuffle leaves it (SGLang's ranks each draw from their own stream)."""
    import random

    from moeopt.dispatch import _INLINE_SHUFFLE, _shuffle

    assert _INLINE_SHUFFLE  # this interpreter's shuffle is the one written out
    a, b = random.Random(seed), random.Random(seed)
    x, y = list(range(n)), list(range(n))
    a.shuffle(x)
    _shuffle(y, b.getrandbits)
    assert x == y
    assert a.random() == b.random()


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_static_expectations_over_homes_on_two_nodes(seed):
    """Without token homes, every static communication metric (remote GPUs, topology-weighted
    cost, remote nodes, GPUs per token) is the exact mean of the same metric with every token
    homed on each of the G GPUs in turn (the bit-mask expectation against brute force)."""
    rng = np.random.default_rng(seed)
    E, G, W, N = 8, 4, 3, 40
    plan = Plan(slots=random_slots(E, G, W, 1, rng, fill=1.0), experts=E, dispatch=Dispatch(kind="static"))
    cluster = Cluster(gpus=G, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1, inter_node_weight=4.0)
    topk = np.argsort(rng.random((N, 1, E)), axis=2)[:, :, :3].astype(np.int16)
    base = dict(topk=topk, family=np.zeros(N, np.int32), step=np.zeros(N, np.int32), family_names=("a",), num_experts=E)
    avg = evaluate(plan, Trace(**base), cluster)
    per_home = [evaluate(plan, Trace(**base, home=np.full(N, h)), cluster) for h in range(G)]
    for key in ("comm_per_token", "comm_weighted_per_token", "comm_nodes_per_token", "gpus_per_token"):
        assert avg[key] == pytest.approx(np.mean([m[key] for m in per_home])), key
    assert np.allclose(avg["loads"], np.mean([m["loads"] for m in per_home], axis=0))
