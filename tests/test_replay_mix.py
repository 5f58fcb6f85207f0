"""``auto`` plans for every task family when the task mix moves (moeopt.replay.mix)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.replay import Stream, make_policy, replay
from moeopt.replay.floor import _others_stats
from moeopt.replay.mix import MIX_P, family_loads, mix_moves
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
    req = Request(4, 2, 4, 4, "balance", {"robust": "none"}, families=MIX_P, regime=0)
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
