"""``auto`` plans for every task family when the task mix moves (moeopt.replay.mix)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.replay import Stream, make_policy, replay
from moeopt.replay.floor import _others_stats
from moeopt.replay.mix import MIX_P, ROUTING_SHIFT, _divergence, family_loads, mix_moves, routing_shift
from moeopt.replay.policies import Request
from moeopt.replay.run import _Planner
from moeopt.trace import Trace
from tests.strategies import examples
from tests.test_replay import tiny_instance


def trace_of(rows: list[tuple[int, int, list[int]]], experts: int, families: int = 2) -> Trace:
    """A one-layer trace from ``(step, family, experts picked)`` rows."""
    return Trace(
        topk=np.array([[picks] for _, _, picks in rows], dtype=np.int16),
        family=np.array([f for _, f, _ in rows], dtype=np.int32),
        step=np.array([s for s, _, _ in rows], dtype=np.int32),
        family_names=tuple(f"f{i}" for i in range(families)),
        num_experts=experts,
    )


def stream_of(trace: Trace) -> Stream:
    """The trace as a stream (its per-step counts from its tokens)."""
    counts = np.zeros((trace.layers, trace.steps, trace.num_experts))
    for l in range(trace.layers):
        np.add.at(counts[l], (np.repeat(trace.step, trace.top_k), trace.topk[:, l].ravel().astype(np.int64)), 1)
    return Stream(counts, trace.top_k, trace=trace, name="mix")


#: steps 0-1 serve family 0 (experts 0 and 1), steps 2-3 family 1 (experts 2 and 3), ten tokens a step
MOVING = [(s, 0, [s % 2]) for s in (0, 1) for _ in range(10)] + [(s, 1, [2 + s % 2]) for s in (2, 3) for _ in range(10)]
#: every step: five tokens of each family
STILL = [(s, f, [2 * f + s % 2]) for s in range(4) for f in (0, 1) for _ in range(5)]


def test_mix_moves_tells_a_moving_mix_from_a_still_one() -> None:
    """A mix that moves from one family to the other is flagged; shares equal on every step are not."""
    moving, p = mix_moves(trace_of(MOVING, 4))
    assert moving and p < 1e-6
    assert mix_moves(trace_of(STILL, 4)) == (False, pytest.approx(1.0))
    one = trace_of([(s, 0, [0]) for s in range(3)], 4, families=1)
    assert mix_moves(one) == (False, 1.0)
    # a family that never appears carries no evidence; one step has nothing to compare
    assert mix_moves(trace_of([(0, 0, [0]), (0, 1, [1])], 4, families=3)) == (False, 1.0)


@settings(max_examples=examples(20))
@given(st.lists(st.integers(1, 30), min_size=2, max_size=6), st.integers(1, 4))
def test_mix_moves_not_on_shares_fixed_exactly(sizes: list[int], ratio: int) -> None:
    """Every step with the same shares of the families (any step sizes): p = 1, never a moving mix."""
    rows = [(s, f, [f]) for s, n in enumerate(sizes) for f, m in ((0, n), (1, ratio * n)) for _ in range(m)]
    moving, p = mix_moves(trace_of(rows, 2))
    assert not moving and p == pytest.approx(1.0)


def test_family_loads_by_hand() -> None:
    """Each family's share of every expert's picks; families below the least share left out."""
    rows = [(0, 0, [0, 1]), (0, 0, [0, 1]), (1, 0, [0, 2]), (1, 1, [2, 1])]
    t = Trace(
        topk=np.array([[r[2]] for r in rows], dtype=np.int16),
        family=np.array([r[1] for r in rows], dtype=np.int32),
        step=np.array([r[0] for r in rows], dtype=np.int32),
        family_names=("a", "b", "c"),  # c has no token
        num_experts=3,
    )
    loads = family_loads(t, 1)
    assert loads.shape == (1, 2, 3)
    np.testing.assert_allclose(loads[0], [[3 / 6, 2 / 6, 1 / 6], [0.0, 0.5, 0.5]])
    np.testing.assert_allclose(family_loads(t, 1, min_share=0.3)[0], [[3 / 6, 2 / 6, 1 / 6]])  # b: 1 of 4 tokens


def test_planner_adds_each_family_when_the_mix_moves() -> None:
    """The snapshots planned for are the window's (here pooled), then each family's load over the
    regime scaled to the window's load per step; robust mean over them all. With a still mix, or
    with ``families`` off, the request and its workload are left as they are."""
    inst = tiny_instance(layers=1, experts=4, gpus=2, slots=2, replicas=0)
    planner = _Planner(inst, stream_of(trace_of(MOVING, 4)), 0, None, None)
    req = Request(4, 2, 4, 4, "balance", {"robust": "none"}, families=MIX_P)
    base = planner.workloads("balance", 2, 4)
    new_req, wl, n = planner._with_families(req, base)
    assert n == 2 and new_req.params == {"robust": "mean", "robust_steps": 0}
    snaps = wl.calibration_stats.step_counts
    # steps 2-3 pooled: 5 tokens a step on each of experts 2 and 3; family 0 split 0/1, family 1 split 2/3
    np.testing.assert_allclose(snaps[0], [[0, 0, 5, 5], [5, 5, 0, 0], [0, 0, 5, 5]])
    assert planner._with_families(Request(4, 2, 4, 4, "balance", families=None), base)[2] == 0
    still = _Planner(inst, stream_of(trace_of(STILL, 4)), 0, None, None)
    same_req, same_wl, n = still._with_families(req, base)
    assert n == 0 and same_req is req and same_wl is base


#: steps 0-3: both families (10 tokens each a step), family 0 on experts 0-1, family 1 on 2-3
SPLIT = [(s, f, [2 * f + i % 2]) for s in range(4) for f in (0, 1) for i in range(10)]


def shifted(rows: list[tuple[int, int, list[int]]], steps: int, swap: bool, share0: int) -> list:
    """Steps after ``rows``: ``share0`` of 20 tokens a step from family 0, the rest from family 1;
    with ``swap`` each family routes to the other's experts."""
    out = []
    for s in range(steps, steps + 2):
        for f, n in ((0, share0), (1, 20 - share0)):
            home = (1 - f) if swap else f
            out += [(s, f, [2 * home + i % 2]) for i in range(n)]
    return rows + out


def test_divergence_by_hand() -> None:
    """The chi-square distance less its sampling part: rows [10, 0] and [0, 10] give
    (20 - 1) / (10 x 10 / 20) = 3.8 (the distance itself is 4); equal rows give 0."""
    assert _divergence(np.array([10.0, 0.0]), np.array([0.0, 10.0])) == pytest.approx(3.8)
    assert _divergence(np.array([5.0, 5.0, 0.0]), np.array([10.0, 10.0, 0.0])) == 0.0
    # a small difference within sampling noise is not counted
    assert _divergence(np.array([51.0, 49.0]), np.array([49.0, 51.0])) == 0.0


def test_routing_shift_tells_a_new_mix_from_new_routing() -> None:
    """After a change of the mix alone each family routes as before (shift 0); when the families
    swap their experts each moved as far as they lie apart, or further."""
    before = trace_of(SPLIT, 4).subset(np.arange(80))
    mix = trace_of(shifted(SPLIT, 4, False, 18), 4)
    swap = trace_of(shifted(SPLIT, 4, True, 10), 4)
    after_mix = mix.subset(mix.step >= 4)
    after_swap = swap.subset(swap.step >= 4)
    assert routing_shift(before, after_mix, 1) == 0.0
    assert routing_shift(before, after_swap, 1) > 1.0 > ROUTING_SHIFT
    one = trace_of([(0, 0, [0]), (1, 0, [1])], 4, families=1)
    assert routing_shift(one, one, 1) == 0.0  # one family: nothing to compare


@settings(max_examples=examples(30))
@given(
    st.lists(st.lists(st.integers(0, 6), min_size=4, max_size=4), min_size=2, max_size=3),
    st.lists(st.integers(1, 4), min_size=3, max_size=3),
)
def test_routing_shift_is_zero_for_a_pure_change_of_mix(counts: list[list[int]], scales: list[int]) -> None:
    """After steps in which each family picks its experts in the same proportions as before (its
    counts scaled by any factor: only the mix changed), no family's routing moved."""
    rows = [(0, f, [e]) for f, row in enumerate(counts) for e, n in enumerate(row) for _ in range(n)]
    rows += [(1, f, [e]) for f, row in enumerate(counts) for e, n in enumerate(row) for _ in range(n * scales[f])]
    if not rows:
        return
    t = trace_of(rows, 4, families=len(counts))
    assert routing_shift(t.subset(t.step == 0), t.subset(t.step == 1), 1) == 0.0


def test_family_start_keeps_the_steps_before_a_surge_of_the_mix() -> None:
    """The families' loads are measured from step 0 across a surge that the mix explains, and
    from the surge's onset when the families' routing moved there."""
    inst = tiny_instance(layers=1, experts=4, gpus=2, slots=2, replicas=0)
    for swap, start in ((False, 0), (True, 4)):
        planner = _Planner(inst, stream_of(trace_of(shifted(SPLIT, 4, swap, 18), 4)), 0, None, None)
        assert planner.family_start(6) == 0  # no surge yet
        planner.onsets.append(4)
        assert planner.family_start(6) == start
        assert planner.family_start(4) == 0  # the onset is not before the end


def test_first_plan_on_one_step_plans_for_the_families() -> None:
    """On a single calibration step the mix cannot be tested: the first plan plans for the
    families anyway; a later plan on one step does not (nothing shows the mix moves), and
    ``families: always`` plans for them on one step too."""
    inst = tiny_instance(layers=1, experts=4, gpus=2, slots=2, replicas=0)
    planner = _Planner(inst, stream_of(trace_of(SPLIT, 4)), 0, None, None)
    req = Request(1, 0, 1, 1, "balance", {"robust": "none"}, families=MIX_P)
    base = planner.workloads("balance", 0, 1)
    assert planner._with_families(req, base, first=True)[2] == 2
    assert planner._with_families(req, base)[2] == 0
    always = Request(1, 0, 1, 1, "balance", {"robust": "none"}, families=1.0)
    assert planner._with_families(always, base)[2] == 2
    two = Request(2, 0, 2, 2, "balance", {"robust": "none"}, families=MIX_P)  # a still mix on two steps
    assert planner._with_families(two, planner.workloads("balance", 0, 2), first=True)[2] == 0


def test_auto_reports_the_families_it_planned_for() -> None:
    """auto's re-plans on a moving mix say how many families they planned for; ``families: none``
    plans without them, and the report says nothing of families then."""
    trace = trace_of(MOVING + [(s, f, [2 * f + s % 2]) for s in (4, 5) for f in (0, 1) for _ in range(5)], 4)
    stream = stream_of(trace)
    inst = tiny_instance(layers=1, experts=4, gpus=2, slots=2, replicas=0)
    on = replay(
        inst, stream, make_policy("auto", interval=2, window=2, families="always", surge=None, carry=None, budget=4)
    )
    off = replay(
        inst, stream, make_policy("auto", interval=2, window=2, families="none", surge=None, carry=None, budget=4)
    )
    assert on.replans and all(r.families == 2 for r in on.replans)
    assert all(r.to_json()["families"] == 2 for r in on.replans)
    assert off.replans and all(r.families == 0 and "families" not in r.to_json() for r in off.replans)
    assert on.policy.to_json()["families"] == "always"


def test_auto_families_must_be_known() -> None:
    with pytest.raises(Exception, match="families"):
        make_policy("auto", families="sometimes")


def test_noise_floor_plans_for_each_family_when_the_mix_moves() -> None:
    """The noise floor's plan for a step of a labelled trace whose mix moves over the other steps
    of its block is robust over their pooled counts and each family's load on them; on a still
    mix it is the pooled counts alone."""
    moving = stream_of(trace_of(MOVING, 4))
    others = np.delete(moving.counts(0, 4), 0, axis=1)
    stats, params = _others_stats(moving, others, 0, 4, 0)
    assert params == {"robust": "mean", "robust_steps": 0}
    # steps 1-3: family 0 on expert 1 (10 tokens), family 1 on experts 2 and 3 (10 each); per step 10 tokens
    np.testing.assert_allclose(
        stats.step_counts[0], [[0, 10 / 3, 10 / 3, 10 / 3], [0, 10, 0, 0], [0, 0, 5, 5]], atol=1e-12
    )
    still = stream_of(trace_of(STILL, 4))
    stats, params = _others_stats(still, np.delete(still.counts(0, 4), 0, axis=1), 0, 4, 0)
    assert params == {} and stats.step_counts is None


def planted(families: int, steps: int, tokens: int, seed: int, *, shared: bool = False, mix: bool = True) -> Trace:
    """A 4-layer, 16-expert, top-2 trace whose tokens route by their family: family ``f`` picks
    its experts from its own four (``4 f .. 4 f + 3``) at every layer, a pick in ten from the rest
    (``shared``: every token from one distribution, whatever its family). With ``mix`` the
    share of family 0 grows step by step; the trace is unlabelled (one family name)."""
    rng = np.random.default_rng(seed)
    L, E, k = 4, 16, 2
    share = np.linspace(0.1, 0.7, steps) if mix else np.full(steps, 1.0 / families)
    fam, step = [], []
    for s in range(steps):
        rest = (1.0 - share[s]) / (families - 1)
        f = rng.choice(families, size=tokens, p=[share[s]] + [rest] * (families - 1))
        fam.append(f)
        step.append(np.full(tokens, s))
    fam_a, step_a = np.concatenate(fam), np.concatenate(step)
    topk = np.empty((fam_a.size, L, k), dtype=np.int16)
    for i, f in enumerate(fam_a):
        p = np.full(E, 0.1 / (E - 4))
        own = np.arange(4) if shared else 4 * f + np.arange(4)
        p[own] = 0.9 / 4
        p /= p.sum()
        for l in range(L):
            topk[i, l] = rng.choice(E, size=k, replace=False, p=p)
    trace = Trace(topk, np.zeros(fam_a.size, dtype=np.int32), step_a.astype(np.int32), ("all",), E)
    return trace, fam_a


def test_latent_families_recover_planted_families() -> None:
    """Clusters of the tokens' routing put nearly every token with its (hidden) family; the same
    seed gives the same labels."""
    from moeopt.replay.mix import LATENT_FAMILIES, latent_families

    trace, truth = planted(3, 4, 150, seed=1)
    lab = latent_families(trace, seed=0)
    assert lab.family_names == tuple(f"latent {i + 1}" for i in range(LATENT_FAMILIES))
    majority = sum(np.bincount(truth[lab.family == c]).max() for c in np.unique(lab.family))
    assert majority / trace.tokens >= 0.95
    np.testing.assert_array_equal(lab.family, latent_families(trace, seed=0).family)
    np.testing.assert_array_equal(lab.topk, trace.topk)


def test_latent_signal_tells_families_from_picks() -> None:
    """Tokens that route by family at every layer: a cluster from half the layers predicts the
    other half (bits per pick well above the level); tokens that all route alike: nothing to
    predict (below the level: at or under 0, the clusters' own estimates being noisier than the
    pooled one)."""
    from moeopt.replay.mix import LATENT_MIN_BITS, latent_signal

    routed, _ = planted(3, 4, 150, seed=2)
    alike, _ = planted(3, 4, 150, seed=2, shared=True)
    assert latent_signal(routed) > 10 * LATENT_MIN_BITS
    assert latent_signal(alike) < LATENT_MIN_BITS


def test_auto_plans_for_latent_families_on_an_unlabelled_trace() -> None:
    """On an unlabelled trace whose hidden task mix moves, auto's re-plans plan for the clusters
    of the tokens' routing; when the tokens all route alike (no task shows) they plan for none."""
    inst = tiny_instance(layers=4, experts=16, gpus=4, slots=5, replicas=1)
    policy = make_policy("auto", interval=1, window=1, calibration=1, surge=None)
    routed = replay(inst, stream_of(planted(3, 6, 120, seed=3)[0]), policy)
    alike = replay(inst, stream_of(planted(3, 6, 120, seed=3, shared=True)[0]), policy)
    assert routed.replans and any(r.families >= 2 for r in routed.replans)
    assert alike.replans and all(r.families == 0 for r in alike.replans)
    again = replay(inst, stream_of(planted(3, 6, 120, seed=3)[0]), policy)  # the clusters are seeded
    assert again.to_json() == routed.to_json()


def test_latent_trial_record_is_the_served_steps_difference() -> None:
    """The record that picks between planning with the latent families and without is the two
    plans' mean per-step MaxVio on the steps served since, recomputed here from the counts."""
    from moeopt.plan import Plan

    inst = tiny_instance(layers=1, experts=4, gpus=2, slots=2, replicas=0)
    stream = stream_of(trace_of(MOVING, 4))
    planner = _Planner(inst, stream, 0, None, None)
    a = Plan(slots=np.array([[[0, 1], [2, 3]]]), experts=4)
    b = Plan(slots=np.array([[[0, 2], [1, 3]]]), experts=4)
    planner.trial = (1, a, b)
    planner._score_trial(1)  # nothing served since: no change
    assert planner.record == 0.0 and planner.trial is not None
    planner._score_trial(4)
    counts = stream.counts(1, 4)  # [1, 3, 4]

    def mean_vio(plan: Plan) -> float:  # one copy per expert: a GPU's load is its experts' counts
        loads = counts[0][:, plan.slots[0]].sum(axis=2)  # [steps, GPUs]
        return float(np.mean(loads.max(axis=1) / loads.mean(axis=1) - 1.0))

    assert planner.record == pytest.approx(mean_vio(a) - mean_vio(b))
    assert planner.trial is None
