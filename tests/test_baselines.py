"""vLLM's placement strategies as baselines: ``linear`` (its default) and ``round_robin``.

The expected maps are written out by hand from vLLM 0.34's ``determine_expert_map``
(``fused_moe/expert_map_manager.py``): ``round_robin`` gives rank ``r`` the experts
``r, r + G, r + 2G, ...`` in that local order, and ranks below ``E mod G`` one expert more.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.methods.baselines import round_robin_homes
from moeopt.plan import Plan
from moeopt.registry import method_names
from moeopt.scoring import Workloads
from moeopt.solve import solve
from moeopt.trace import stats_from_counts


def instance(experts: int, gpus: int, slots: int, replicas: int = 0, groups: int | None = None, layers: int = 1):
    """A count-only instance of ``layers x experts`` on ``gpus x (slots + replicas)`` slots."""
    return Instance(
        name="rr",
        model=Model(layers=layers, experts=experts, top_k=2, expert_groups=groups),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus, slots_per_gpu=slots, replica_slots_per_gpu=replicas),
        workload=Workload(calibration=WorkloadSource(synthetic={})),
        method=MethodSpec(name="round_robin"),
    )


def workloads(counts: np.ndarray) -> Workloads:
    """Calibration = evaluation = these per-expert counts ``[L, E]``."""
    stats = stats_from_counts(np.asarray(counts, dtype=np.float64), top_k=2)
    return Workloads(stats, stats, stats, None)


def run(inst: Instance, counts: np.ndarray | None = None):
    L, E = inst.model.layers, inst.model.experts
    counts = np.full((L, E), 10.0) if counts is None else counts
    return solve(inst, method="round_robin", workloads=workloads(counts))


# ----------------------------------------------------------------------------- round_robin
@pytest.mark.parametrize(
    ("experts", "gpus", "slots", "expected"),
    [
        # G divides E: every rank E / G experts, r, r + G, ...
        (8, 4, 2, [[0, 4], [1, 5], [2, 6], [3, 7]]),
        (6, 2, 3, [[0, 2, 4], [1, 3, 5]]),
        # 10 experts on 4 ranks: base 2, remainder 2 -> ranks 0 and 1 hold 3, ranks 2 and 3 hold 2
        (10, 4, 3, [[0, 4, 8], [1, 5, 9], [2, 6, -1], [3, 7, -1]]),
        # 7 experts on 3 ranks: rank 0 holds 3 (0, 3, 6), ranks 1 and 2 hold 2
        (7, 3, 3, [[0, 3, 6], [1, 4, -1], [2, 5, -1]]),
        # one more slot than needed: the spare slot stays empty on every rank
        (4, 4, 2, [[0, -1], [1, -1], [2, -1], [3, -1]]),
    ],
)
def test_round_robin_is_vllms_map(experts, gpus, slots, expected):
    """The plan's slots are vLLM's round_robin map (local order included), E divisible by G or not."""
    r = run(instance(experts, gpus, slots, groups=None, layers=2))
    assert r.plan.slots.tolist() == [expected, expected]
    assert (r.plan.copy_counts == 1).all() and r.plan.dispatch.kind == "even"


def test_round_robin_leaves_replica_slots_empty_and_says_so():
    """With replica slots, round_robin (no redundant experts in vLLM) leaves them empty, with a note."""
    r = run(instance(8, 4, 2, replicas=1, groups=2))
    assert r.plan.slots[0].tolist() == [[0, 4, -1], [1, 5, -1], [2, 6, -1], [3, 7, -1]]
    assert r.stats["empty_slots_per_layer"] == 4
    assert "no redundant experts" in r.stats["note"] and "linear" not in r.stats["note"]


def test_round_robin_notes_vllms_fallback_without_expert_groups(capsys):
    """vLLM runs round_robin only with expert groups: without them the note says it falls back to linear."""
    r = run(instance(8, 4, 2, groups=None))
    assert "falls back to linear" in r.stats["note"]
    assert "falls back to linear" in capsys.readouterr().err
    plain = run(instance(8, 4, 2, groups=2))  # what vLLM runs: groups, no replica slots
    assert "note" not in plain.stats
    assert np.array_equal(plain.plan.slots, run(instance(8, 4, 2)).plan.slots)  # the same map either way


def test_round_robin_and_linear_are_scored_by_the_one_scorer():
    """Hand-computed MaxVio: two hot experts 0 and 4 share GPU 0 under round_robin, not under linear."""
    counts = np.array([[8.0, 1, 1, 1, 8, 1, 1, 1]])  # total 22, mean GPU load 5.5
    inst = instance(8, 4, 2, groups=2)
    rr = run(inst, counts)
    lin = solve(inst, method="linear", workloads=workloads(counts))
    assert rr.objective == pytest.approx(16 / 5.5 - 1)  # GPU 0 holds 0 and 4
    assert lin.objective == pytest.approx(9 / 5.5 - 1)  # GPUs 0 and 2 hold 8 + 1
    evaluation = workloads(counts).evaluation
    for r in (rr, lin):
        assert r.metrics["maxvio"] == pytest.approx(r.objective)
        assert r.metrics["maxvio"] == pytest.approx(evaluate(r.plan, evaluation, inst.cluster)["maxvio"])


def test_round_robin_is_registered():
    """round_robin is listed beside linear."""
    assert {"linear", "round_robin"} <= set(method_names())


@given(experts=st.integers(1, 40), gpus=st.integers(1, 9))
def test_round_robin_counts_follow_vllm(experts, gpus):
    """Every rank holds vLLM's local count (base + 1 below the remainder) of experts r, r + G, ..."""
    home = round_robin_homes(experts, gpus)
    plan = Plan.from_homes(home[None, :], gpus=gpus)
    base, rem = divmod(experts, gpus)
    for r in range(gpus):
        local = plan.slots[0, r][plan.slots[0, r] >= 0]
        assert len(local) == base + (r < rem)
        assert local.tolist() == list(range(r, experts, gpus))


# ----------------------------------------------------------------------------- linear
def test_linear_is_vllms_default_when_gpus_divide_experts():
    """With G dividing E, linear is vLLM's contiguous map: rank r holds r*E/G ... (r+1)*E/G - 1."""
    r = solve(instance(8, 4, 2), method="linear", workloads=workloads(np.full((1, 8), 10.0)))
    assert r.plan.slots[0].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
