"""The ``eplb`` method: DeepSeek's real EPLB (SGLang's copy) wired into plan/2 and scored by moeopt.

The tests that run EPLB need torch and sglang (``pip install -e '.[eplb]'`` then ``pip install
--no-deps 'sglang>=0.5'``) and skip without them; the missing-package error is tested always.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from moeopt.errors import InputError
from moeopt.evaluate import loads_from_counts, maxvio
from moeopt.io import load_instance
from moeopt.methods import eplb as eplb_mod
from moeopt.registry import Context, Problem, get_method, parse_params
from moeopt.solve import load_workloads, solve

INSTANCES = Path(__file__).resolve().parents[1] / "instances"
PREFILL = "deepseek_v3_prefill_in1024.json"
DECODE = "deepseek_v3_decode_in1000out1000.json"


@pytest.fixture(scope="module")
def deepseek_eplb():
    """SGLang's ``deepseek`` EPLB module, or a skip saying what to install."""
    pytest.importorskip("torch", reason="the eplb method needs torch: pip install -e '.[eplb]'")
    try:
        return eplb_mod.load_deepseek_eplb()
    except ImportError as exc:
        pytest.skip(f"the eplb method needs sglang: pip install --no-deps 'sglang>=0.5' ({exc})")


_CACHE: dict = {}


def instance(counts: str = PREFILL, gpus: int = 64, slots: int = 4):
    """The bundled EPLB instance on ``counts`` with ``gpus x (slots + 1)`` slots, plus its workloads."""
    key = (counts, gpus, slots)
    if key not in _CACHE:
        base = load_instance(INSTANCES / "deepseek-v3-eplb.yaml")
        cal = base.workload.calibration
        workload = type(base.workload)(calibration=type(cal)(path=INSTANCES / "real" / counts))
        cluster = type(base.cluster)(gpus=gpus, gpus_per_node=8, slots_per_gpu=slots, replica_slots_per_gpu=1)
        inst = base.replace(cluster=cluster, workload=workload)
        _CACHE[key] = (inst, load_workloads(inst))
    return _CACHE[key]


def run(inst, wl, **params):
    method = get_method("eplb")
    return method.solve(Problem(inst, wl.calibration_stats), parse_params(method, params), Context())


@pytest.mark.parametrize("counts", [PREFILL, DECODE])
@pytest.mark.parametrize("gpus,slots", [(64, 4), (32, 8)])
def test_global_plan_is_eplbs_map_and_scores_as_eplb_says(deepseek_eplb, counts, gpus, slots):
    """Slots = EPLB's phy2log; moeopt's even-split loads = EPLB's per-slot model to 1e-9."""
    import torch

    inst, wl = instance(counts, gpus, slots)
    L, E, W = inst.model.layers, inst.model.experts, slots + 1
    P = gpus * W
    weight = wl.calibration_stats.expert_load
    assert weight.shape == (L, E) == (58, 256)
    phy2log, _, logcnt = deepseek_eplb.rebalance_experts(
        torch.tensor(weight), num_replicas=P, num_groups=1, num_nodes=1, num_gpus=gpus, enable_hierarchical=False
    )
    phy2log, logcnt = phy2log.numpy(), logcnt.numpy()

    r = run(inst, wl, policy="global")
    plan = r.plan
    assert plan.dispatch.kind == "even"
    assert plan.slots.shape == (L, gpus, W)
    assert np.array_equal(plan.slots, phy2log.reshape(L, gpus, W))
    assert ((plan.slots >= 0).sum(axis=(1, 2)) == P).all()
    assert (plan.copy_counts >= 1).all() and np.array_equal(plan.copy_counts, logcnt)
    plan.check(inst.cluster, layers=L, experts=E)  # fits; colocated copies are allowed for engine plans

    # EPLB's own model, computed here: GPU g serves sum over its slots p of weight[e_p] / logcnt[e_p]
    rows = np.arange(L)[:, None]
    per_slot = weight[rows, phy2log] / logcnt[rows, phy2log]  # [L, P]
    eplb_loads = per_slot.reshape(L, gpus, W).sum(axis=2)
    ours = loads_from_counts(plan, weight, inst.cluster)
    scale = eplb_loads.mean()
    assert np.abs(ours - eplb_loads).max() <= 1e-9 * scale
    assert r.objective == pytest.approx(float(maxvio(eplb_loads).mean()), rel=1e-9)
    assert r.objective_name == "maxvio" and r.sense == "min"
    assert r.stats["eplb_wall_time"] > 0 and r.stats["policy"] == "global"
    assert r.stats["colocated_copies"] == plan.colocated


def test_global_reaches_eplbs_balance_in_sample(deepseek_eplb):
    """DeepSeek-V3 prefill at 64 x (4 + 1): EPLB balances to MaxVio ~0.02 (wired wrongly it would not)."""
    inst, wl = instance(PREFILL, 64, 4)
    r = run(inst, wl, policy="global")
    assert r.objective < 0.05
    inst, wl = instance(PREFILL, 32, 8)
    assert run(inst, wl, policy="global").objective < 0.05


@pytest.mark.parametrize("counts", [PREFILL, DECODE])
@pytest.mark.parametrize("num_groups", [None, 4, 8])
def test_hierarchical_keeps_every_expert_in_one_node(deepseek_eplb, counts, num_groups):
    """Hierarchical EPLB: groups packed to nodes, copies only within the expert's node; by
    default the model's router groups (8 in the bundled DeepSeek-V3 instance), as SGLang passes."""
    import torch

    inst, wl = instance(counts, 32, 8)  # 4 nodes of 8 GPUs
    assert inst.model.expert_groups == 8
    L, G, W, gpn = 58, 32, 9, 8
    r = run(inst, wl, policy="hierarchical", num_groups=num_groups)
    groups = num_groups or 8
    phy2log, _, _ = deepseek_eplb.rebalance_experts(
        torch.tensor(wl.calibration_stats.expert_load),
        num_replicas=G * W,
        num_groups=groups,
        num_nodes=G // gpn,
        num_gpus=G,
        enable_hierarchical=True,
    )
    assert np.array_equal(r.plan.slots, phy2log.numpy().reshape(L, G, W))
    assert (r.plan.copy_counts >= 1).all()
    on_node = r.plan.copies_on_gpu.reshape(L, 256, G // gpn, gpn).sum(axis=3) > 0  # [L, E, nodes]
    assert (on_node.sum(axis=2) == 1).all()
    assert r.stats["num_groups"] == groups and r.stats["num_nodes"] == 4
    assert 0 <= r.objective < 2


@pytest.mark.parametrize(
    ("expert_groups", "gpus", "expected"),
    [(8, 32, 8), (8, 64, 8), (None, 32, 4), (8, 128, 16), (16, 128, 16)],
)
def test_hierarchical_groups_default_to_the_router_groups(deepseek_eplb, expert_groups, gpus, expected):
    """Without ``num_groups`` the hierarchical policy takes ``model.expert_groups`` when it is
    a multiple of the nodes (DeepSeek's EPLB needs that), else one group per node."""
    base, wl = instance(PREFILL, 32, 8)
    model = dataclasses.replace(base.model, expert_groups=expert_groups)
    cluster = type(base.cluster)(gpus=gpus, gpus_per_node=8, slots_per_gpu=256 // gpus, replica_slots_per_gpu=1)
    r = run(base.replace(model=model, cluster=cluster), wl, policy="hierarchical")
    assert r.stats["num_groups"] == expected and r.stats["num_nodes"] == gpus // 8
    assert eplb_mod.default_groups(model, gpus // 8) == expected


def test_solve_path_keeps_colocated_copies(deepseek_eplb):
    """moeopt solve on the bundled instance: EPLB's colocated copies are kept and scored."""
    inst, wl = instance(PREFILL, 64, 4)
    r = solve(inst, workloads=wl)
    assert r.plan.colocated > 0  # EPLB does emit them on this data
    assert r.metrics["maxvio"] == pytest.approx(r.objective, rel=1e-9)


def test_params_are_checked(deepseek_eplb):
    """Unknown policies, num_groups under the global policy and groups EPLB cannot use are refused."""
    method = get_method("eplb")
    assert method.Params().policy == "auto"  # SGLang's default, --eplb-algorithm auto
    with pytest.raises(InputError, match=r"method\.policy: must be one of 'auto', 'global', 'hierarchical'"):
        parse_params(method, {"policy": "flat"})
    with pytest.raises(InputError, match="only to policy: hierarchical or auto"):
        parse_params(method, {"policy": "global", "num_groups": 8})
    inst, wl = instance(PREFILL, 32, 8)
    with pytest.raises(InputError, match="must divide 256 experts"):
        run(inst, wl, policy="hierarchical", num_groups=12)
    with pytest.raises(InputError, match="multiple of the 4 nodes"):
        run(inst, wl, policy="hierarchical", num_groups=2)


@pytest.mark.parametrize(
    ("groups", "nodes", "expected"),
    [
        (8, 8, "hierarchical"),
        (8, 4, "hierarchical"),
        (8, 1, "hierarchical"),
        (16, 8, "hierarchical"),
        (None, 8, "global"),
        (None, 1, "global"),
        (4, 8, "global"),
        (8, 16, "global"),
        (12, 8, "global"),
    ],
)
def test_auto_resolves_as_sglangs_compute_algorithm(groups, nodes, expected):
    """SGLang's auto: hierarchical iff the model has groups and they are a multiple of the nodes."""
    policy, why = eplb_mod.resolve_policy(groups, nodes)
    assert policy == expected
    assert (f"{groups} expert groups" in why) if groups is not None else ("no expert groups" in why)


@pytest.mark.parametrize(
    ("expert_groups", "gpus", "resolved"),
    [(8, 64, "hierarchical"), (None, 64, "global"), (4, 64, "global")],
)
def test_auto_plan_is_the_resolved_policys_plan(deepseek_eplb, expert_groups, gpus, resolved, capsys):
    """auto on 64 GPUs in 8 nodes: hierarchical with DeepSeek-V3's 8 groups, global without groups
    or with 4 (not a multiple of 8); the plan is that policy's plan, named in stats and a note."""
    base, wl = instance(PREFILL, 64, 4)
    inst = base.replace(model=dataclasses.replace(base.model, expert_groups=expert_groups))
    auto = run(inst, wl)
    named = run(inst, wl, policy=resolved)
    assert np.array_equal(auto.plan.slots, named.plan.slots)
    assert auto.objective == named.objective
    assert auto.stats["policy"] == "auto" and auto.stats["policy_resolved"] == resolved
    assert named.stats["policy_resolved"] == resolved and "note" not in named.stats
    assert auto.stats["note"].startswith(f"eplb: auto -> {resolved}: ")
    assert "as SGLang's default" in auto.stats["note"] and auto.stats["note"] in capsys.readouterr().err
    if resolved == "hierarchical":
        assert "8 expert groups over 8 nodes" in auto.stats["note"]
        assert auto.stats["num_groups"] == 8 and auto.stats["num_nodes"] == 8
    if expert_groups is not None and resolved == "global":
        assert "not a multiple of the 8 nodes" in auto.stats["note"]


def test_auto_takes_num_groups_in_place_of_the_models(deepseek_eplb):
    """method.num_groups under auto stands for SGLang's num_groups: 16 groups over 8 nodes -> hierarchical."""
    base, wl = instance(PREFILL, 64, 4)
    inst = base.replace(model=dataclasses.replace(base.model, expert_groups=None))
    r = run(inst, wl, num_groups=16)
    assert r.stats["policy_resolved"] == "hierarchical" and r.stats["num_groups"] == 16
    assert np.array_equal(r.plan.slots, run(inst, wl, policy="hierarchical", num_groups=16).plan.slots)


def test_bundled_instance_runs_the_global_policy_it_describes(deepseek_eplb):
    """instances/deepseek-v3-eplb.yaml describes the global policy and runs it (auto would pick hierarchical)."""
    path = INSTANCES / "deepseek-v3-eplb.yaml"
    assert "EPLB (global policy" in yaml.safe_load(path.read_text())["description"]
    inst, wl = instance(PREFILL, 64, 4)  # the bundled file's shape and loads
    assert inst.method.params == {"policy": "global"}
    assert solve(inst, workloads=wl).stats["policy_resolved"] == "global"


@pytest.mark.parametrize("missing", ["sglang", "torch"])
def test_missing_package_gives_one_line_error(monkeypatch, missing):
    """Without sglang (or torch) eplb is unavailable and solve says what to install, in one line."""
    monkeypatch.delitem(sys.modules, eplb_mod._MODULE_NAME, raising=False)
    if missing == "sglang":
        monkeypatch.setattr(eplb_mod, "_PACKAGE", "sglang_not_installed_for_this_test")
    else:
        monkeypatch.setitem(sys.modules, "torch", None)
    method = get_method("eplb")
    assert not method.available()
    inst = load_instance(INSTANCES / "deepseek-v3-eplb.yaml")
    with pytest.raises(InputError) as info:
        solve(inst)
    msg = str(info.value)
    assert "\n" not in msg
    assert "'eplb'" in msg and "sglang and torch" in msg
    assert "pip install -e '.[eplb]'" in msg and "pip install --no-deps 'sglang>=0.5'" in msg
    # called directly, the method refuses the same way
    with pytest.raises(InputError, match=r"\.\[eplb\]"):
        method.solve(Problem(inst, None), method.Params(), Context())
