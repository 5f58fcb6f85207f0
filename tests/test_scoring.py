"""The one scorer: solve and evaluate agree exactly, for every registered method."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moeopt.cli import main
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.plan import Dispatch
from moeopt.registry import get_method, method_names
from moeopt.scoring import probe_plan, scoring_seconds
from moeopt.trace import Trace
from tests.conftest import INSTANCES


def instance_for(name: str) -> str:
    """A bundled instance the method can run on: GEM's needs a profile, the rest a trace
    with replica slots (so replication methods and dispatch rules matter)."""
    needs = get_method(name).requires
    return str(INSTANCES / ("gem-small.yaml" if "profile" in needs else "gesr-small.yaml"))


@pytest.mark.parametrize("name", method_names())
def test_solve_then_evaluate_agree(name, tmp_path, capsys):
    """``evaluate`` of the plan file ``solve`` wrote prints exactly the table ``solve`` printed,
    and its report holds exactly the same metrics (method hooks included)."""
    if not get_method(name).available():
        pytest.skip(f"{name} is not available here")
    inst = instance_for(name)
    plan, report, again = tmp_path / "plan.json", tmp_path / "solve.json", tmp_path / "eval.json"
    args = ["solve", inst, "--method", name, "--quiet", "--layer-time-limit", "1", "--output", str(plan)]
    assert main([*args, "--report", str(report)]) == 0
    solved = capsys.readouterr().out.splitlines()[1:]  # drop the solver's status line
    assert main(["evaluate", inst, str(plan), "--report", str(again)]) == 0
    evaluated = capsys.readouterr().out.splitlines()
    assert evaluated == solved
    assert json.loads(again.read_text())["metrics"] == json.loads(report.read_text())["metrics"]


def _probe_instance(gpus: int = 8, experts: int = 16, replicas: int = 1) -> Instance:
    model = Model(2, experts, 2)
    cluster = Cluster(gpus=gpus, gpus_per_node=4, slots_per_gpu=experts // gpus, replica_slots_per_gpu=replicas)
    return Instance("probe", model, cluster, Workload(WorkloadSource()), MethodSpec("balance"))


def test_probe_plan_spreads_copies_by_load():
    """The timing probe has the instance's shape, every expert once in the primary slots, and
    its replica slots' copies in proportion to the load (largest remainders), one expert's copies
    on consecutive GPUs."""
    inst = _probe_instance()
    load = np.zeros(16)
    load[[3, 7]] = [3.0, 1.0]
    plan = probe_plan(inst, Dispatch(kind="static"), load)
    assert plan.slots.shape == (1, 8, 3) and plan.dispatch.kind == "static"
    assert sorted(plan.slots[0, :, :2].ravel().tolist()) == list(range(16))
    assert np.bincount(plan.slots[0, :, 2], minlength=16)[[3, 7]].tolist() == [6, 2]
    assert plan.slots[0, :6, 2].tolist() == [3] * 6
    even = probe_plan(inst, Dispatch(), None)
    assert sorted(even.slots[0, :, 2].tolist()) == list(range(8))  # 8 copies over 16 experts: the first 8
    assert probe_plan(_probe_instance(replicas=0), Dispatch(), load).slots.shape == (1, 8, 2)


def test_scoring_seconds_is_measured_on_one_layer():
    """``scoring_seconds`` times one layer of the workload (a trace or counts) under each rule."""
    rng = np.random.default_rng(0)
    inst = _probe_instance()
    topk = np.stack([rng.permutation(16)[:2] for _ in range(200 * 2)]).reshape(200, 2, 2)
    zeros = np.zeros(200, np.int32)
    trace = Trace(topk=topk, family=zeros, step=zeros, family_names=("a",), num_experts=16)
    for rule in ("even", "static", "lp"):
        seconds = scoring_seconds(inst, trace, Dispatch(kind=rule), baseline=True)
        assert 0.0 < seconds < 60.0
    assert scoring_seconds(inst, trace.stats(), Dispatch()) > 0.0
