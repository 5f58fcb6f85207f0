"""The ``balance`` method end to end: real DeepSeek-V3 loads, bounds, robust, hierarchical, --from."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moeopt import balance as core
from moeopt.cli import main
from moeopt.errors import InfeasibleError
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.solve import load_workloads, solve
from tests.conftest import INSTANCES

PREFILL = INSTANCES / "real" / "deepseek_v3_prefill_in1024.json"


def instance(path, gpus=64, slots=4, extra=1, gpn=8, method="balance", groups=None, **params) -> Instance:
    return Instance(
        name="ds",
        model=Model(layers=4, experts=256, top_k=8, expert_groups=groups),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpn, slots_per_gpu=slots, replica_slots_per_gpu=extra),
        workload=Workload(calibration=WorkloadSource(path=path)),
        method=MethodSpec(name=method, params=params),
    )


def test_balance_beats_lpt_and_reports_a_valid_bound(deepseek_few_layers):
    """On real loads: every layer at or below LPT's MaxVio, bound <= objective, gap per layer."""
    inst = instance(deepseek_few_layers)
    r = solve(inst)
    load = load_workloads(inst).calibration_stats.expert_load
    per_layer = np.array(r.stats["calibration_maxvio_per_layer"])
    for l in range(4):
        c = core.copy_counts(load[l], 320, 64)
        items = np.repeat(np.arange(256), c)
        lpt_slots = items[core.lpt_pack(np.repeat(load[l] / c, c), items, 64, 5)]  # item index -> expert
        assert per_layer[l] <= float(core.maxvio(lpt_slots, load[l])) + 1e-12
    assert r.bound <= r.objective + 1e-12
    assert np.all(np.array(r.stats["gap_per_layer"]) >= -1e-12)
    assert r.metrics["maxvio"] == pytest.approx(per_layer.mean())  # the scorer agrees with the method
    assert r.metrics["balance_bound_maxvio"] <= r.metrics["maxvio"] + 1e-12
    assert r.plan.colocated == 0 and (r.plan.copy_counts >= 1).all()


def test_balance_vs_eplb_in_sample(deepseek_few_layers):
    """In-sample MaxVio at most a tenth of EPLB global's on the same 64 x (4 + 1) slots."""
    pytest.importorskip("torch")
    from moeopt.registry import get_method

    if not get_method("eplb").available():
        pytest.skip("sglang not installed")
    ours = solve(instance(deepseek_few_layers)).metrics["maxvio"]
    eplb = solve(instance(deepseek_few_layers, method="eplb")).metrics["maxvio"]
    assert ours <= 0.1 * eplb


@pytest.mark.parametrize(
    ("params", "joined"), [({}, False), ({"dispatch": "lp", "connect": True}, True), ({"connect": True}, True)]
)
def test_lp_plans_connect_the_copy_graph(deepseek_few_layers, params, joined):
    """Under lp dispatch (or when asked) every layer's GPUs are joined by shared experts."""
    from moeopt.balance.batch import copy_graph_batch

    r = solve(instance(deepseek_few_layers, **params))
    counts = r.plan.copy_counts
    comps = copy_graph_batch(r.plan.slots, counts)[1]
    assert (comps == 1).all() if joined else (comps > 1).any()
    assert r.stats["copy_graph_components_per_layer"] == comps.tolist()  # reported as planned
    assert r.plan.dispatch.kind == params.get("dispatch", "even")
    assert r.bound <= r.objective + 1e-12


def test_lp_choice_keeps_the_better_layer(deepseek_few_layers):
    """Under lp with connect unset, each layer is whichever of the connected and the unconnected
    plan has the smaller largest load under SGLang's own split of the calibration loads."""
    from moeopt.dispatch import count_loads

    inst = instance(deepseek_few_layers, dispatch="lp")
    load = load_workloads(inst).calibration_stats.expert_load
    runs = {c: solve(instance(deepseek_few_layers, dispatch="lp", connect=c)) for c in (None, True, False)}

    def peaks(plan):
        return count_loads(plan, load, inst.cluster).max(axis=-1)

    chosen, joined, plain = (peaks(runs[c].plan) for c in (None, True, False))
    np.testing.assert_allclose(chosen, np.minimum(joined, plain), rtol=1e-12)
    kept = runs[None].stats["lp_connected_layers"]
    assert kept == int((joined <= plain).sum())
    assert 0 <= kept <= len(load)


def test_connect_follows_the_dispatch_and_refuses_what_it_cannot_keep():
    from moeopt.methods.balance import BalanceParams

    assert not BalanceParams().connects and BalanceParams(dispatch="lp").connects
    assert BalanceParams(connect=True).connects and not BalanceParams(dispatch="lp", connect=False).connects
    assert BalanceParams(dispatch="lp", hierarchical=True).connects  # inside every node
    with pytest.raises(ValueError, match="connect"):
        BalanceParams(connect=True, search="thorough")


def test_group_spread_follows_the_model_groups(deepseek_few_layers):
    """With the router's groups (DeepSeek-V3: 8), the default plan spreads every group's load over
    the GPUs at an in-sample MaxVio far below LPT's; asked without groups, a one-line input error."""
    from moeopt.balance import batch as BB
    from moeopt.balance.groups import expert_groups, group_imbalance
    from moeopt.errors import InputError
    from moeopt.methods.balance import BalanceParams

    inst = instance(deepseek_few_layers, gpus=32, slots=8, groups=8)
    wl = load_workloads(inst)
    load = wl.calibration.expert_load
    spread = solve(inst, workloads=wl)
    flat = solve(instance(deepseek_few_layers, gpus=32, slots=8, groups=8, group_spread=False), workloads=wl)
    assert spread.stats["group_spread"] and not flat.stats["group_spread"]
    assert not solve(instance(deepseek_few_layers, gpus=32, slots=8), workloads=wl).stats["group_spread"]
    g = expert_groups(256, 8)
    assert group_imbalance(spread.plan.slots, load, g).mean() < 0.9 * group_imbalance(flat.plan.slots, load, g).mean()
    c = BB.copy_counts_batch(load, 32 * 9)
    lpt = BB.maxvio_batch(BB.lpt_pack_batch(load, c, 32, 9, False), load).mean()
    assert spread.metrics["maxvio"] < lpt / 10
    with pytest.raises(InputError, match="model.expert_groups"):
        solve(instance(deepseek_few_layers, gpus=32, slots=8, group_spread=True), workloads=wl)
    with pytest.raises(ValueError, match="group_spread"):
        BalanceParams(group_spread=True, dispatch="lp")
    assert not BalanceParams(dispatch="lp").groups_spread(8) and BalanceParams().groups_spread(8)


@pytest.mark.parametrize("search", ["fast", "thorough"])
def test_hierarchical_keeps_copies_in_a_node(deepseek_few_layers, search):
    """hierarchical: every expert's copies sit inside one node of 8 GPUs (both searches)."""
    r = solve(instance(deepseek_few_layers, hierarchical=True, search=search))
    assert r.metrics["maxvio"] < 0.05  # EPLB's hierarchical policy: about 0.7 on these loads
    node_of_slot = np.arange(64)[:, None].repeat(5, axis=1) // 8
    for l in range(4):
        for e in range(256):
            assert len(set(node_of_slot[r.plan.slots[l] == e].tolist())) == 1


def test_migration_budget_zero_and_unlimited(deepseek_few_layers, tmp_path):
    """--from with max_moves 0 returns the current plan; unlimited reaches the plain plan's MaxVio."""  # noqa: E501
    inst = instance(deepseek_few_layers, gpus=32, slots=8)
    current = solve(inst, method="greedy", params={"replicate": True}).plan
    same = solve(inst, params={"max_moves": 0}, current=current)
    assert same.plan.same_layout(current) and same.stats["moves"] == 0
    free = solve(inst, current=current)
    plain = solve(inst)
    # at least the unconstrained plan's MaxVio (the greedy moves may even end below it)
    assert free.metrics["maxvio"] <= plain.metrics["maxvio"] + 1e-12
    frontier = free.stats["migration_frontier"]
    assert frontier[0]["moves"] == 0 and frontier[-1]["maxvio"] <= frontier[0]["maxvio"]
    # the frontier is a report only: without it, the same re-plan
    quick = solve(inst, current=current, params={"migration_frontier": False})
    assert "migration_frontier" not in quick.stats and np.array_equal(quick.plan.slots, free.plan.slots)


def test_robust_needs_snapshots(deepseek_few_layers):
    """robust on a single pooled snapshot is one clear error."""
    from moeopt.errors import InputError

    with pytest.raises(InputError, match="method.robust"):
        solve(instance(deepseek_few_layers, robust="mean"))


def test_robust_never_worse_on_the_snapshots():
    """OLMoE per-domain counts as snapshots: robust's mean per-domain MaxVio <= the pooled plan's."""
    inst = Instance(
        name="olmoe",
        model=Model(layers=3, experts=64, top_k=8),
        cluster=Cluster(gpus=16, gpus_per_node=16, slots_per_gpu=4, replica_slots_per_gpu=1),
        workload=Workload(
            calibration=WorkloadSource(
                path=INSTANCES / "real" / "olmoe_mixtral_domain_expert_counts.npz",
                format="olmoe-domains",
                select="olmoe",
            )
        ),
        method=MethodSpec(name="balance"),
    )
    wl = load_workloads(inst)
    snaps = np.swapaxes(wl.calibration_stats.counts, 0, 1)  # [L, F, E]
    pooled = solve(inst, workloads=wl).plan
    robust = solve(inst, params={"robust": "mean"}, workloads=wl).plan
    for l in range(3):
        a = core.robust_objective(robust.slots[l], snaps[l], "mean")
        b = core.robust_objective(pooled.slots[l], snaps[l], "mean")
        assert a <= b + 1e-12


def test_solve_from_keeps_the_engines_colocated_copies(deepseek_few_layers):
    """An engine plan with two copies of one expert on one GPU (EPLB emits them) re-plans
    without error; the re-plan keeps at most the colocated copies it found, adds none."""
    from moeopt.plan import Plan

    inst = instance(deepseek_few_layers)
    slots = solve(inst, method="greedy", params={"replicate": True}).plan.slots.copy()
    for l in range(slots.shape[0]):  # on GPU 0, a replicated expert's copy becomes a second copy of another
        counts = np.bincount(slots[l].ravel(), minlength=256)
        i = next(i for i in range(5) if counts[slots[l, 0, i]] > 1)
        slots[l, 0, i] = slots[l, 0, (i + 1) % 5]
    current = Plan(slots=slots, experts=256)
    assert current.colocated == 4
    same = solve(inst, params={"max_moves": 0}, current=current)
    assert same.plan.same_layout(current)
    out = solve(inst, current=current)
    assert (out.plan.copies_on_gpu <= np.maximum(current.copies_on_gpu, 1)).all()
    assert out.metrics["maxvio"] < same.metrics["maxvio"]


def test_solve_from_with_per_step_counts_scores_the_steps(tmp_path):
    """With per-step counts and robust mode, --from scores every candidate on the steps: the
    frontier starts at the current plan's mean per-step MaxVio and no budget reaches (or beats)
    the robust plan made without a current plan."""
    import yaml

    from moeopt.methods.balance import robust_snapshots
    from moeopt.registry import Problem
    from tests.conftest import INSTANCES as ROOT

    src = ROOT / "quickstart.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["workload"] = {k: str(src.parent / v) for k, v in doc["workload"].items()}
    doc["cluster"] = {"gpus": 4, "replica_slots_per_gpu": 1}
    doc["method"] = {"name": "balance", "robust": "mean"}
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump(doc))
    from moeopt.io import load_instance

    inst = load_instance(path)
    wl = load_workloads(inst)
    snaps = robust_snapshots(Problem(inst, wl.calibration_stats, None, None))  # [L, T, E]
    current = solve(inst, method="greedy", params={"replicate": True}, workloads=wl).plan

    def per_step(plan):
        return float(np.mean([core.robust_objective(plan.slots[l], snaps[l]) - 1 for l in range(len(snaps))]))

    free = solve(inst, workloads=wl).plan
    moved = solve(inst, workloads=wl, current=current)
    assert moved.stats["migration_objective"] == "mean per-step"
    frontier = moved.stats["migration_frontier"]
    assert frontier[0]["moves"] == 0 and frontier[0]["maxvio"] == pytest.approx(per_step(current))
    assert per_step(moved.plan) <= per_step(free) + 1e-12
    pooled = solve(inst, workloads=wl, current=current, params={"robust": "none"})
    assert pooled.stats["migration_objective"] == "pooled"
    assert pooled.stats["migration_frontier"][0]["maxvio"] == pytest.approx(float(current_maxvio(current, wl)))


def current_maxvio(plan, wl) -> float:
    """The pooled MaxVio of a plan on the calibration loads (even split), layer mean."""
    load = wl.calibration_stats.expert_load
    return float(np.mean([core.maxvio(plan.slots[l], load[l]) for l in range(len(load))]))


def test_solve_from_an_engine_file(deepseek_few_layers, tmp_path, capsys):
    """solve --from reads an engine placement and prints the moves-vs-MaxVio frontier."""
    path = tmp_path / "inst.yaml"
    path.write_text(
        "model: {layers: 4, experts: 256, top_k: 8}\n"
        "cluster: {gpus: 32, gpus_per_node: 8, slots_per_gpu: 8, replica_slots_per_gpu: 1}\n"
        f"workload: {{calibration: {deepseek_few_layers}}}\nmethod: {{name: balance}}\n"
    )
    plan = tmp_path / "greedy.json"
    assert main(["solve", str(path), "--method", "greedy", "--quiet", "--output", str(plan)]) == 0
    sglang = tmp_path / "sglang.json"
    assert (
        main(["export", str(plan), "--format", "sglang", "--output", str(sglang), "--dense-layers", "0", "--quiet"])
        == 0
    )
    capsys.readouterr()
    assert main(["solve", str(path), "--from", str(sglang), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "migration frontier" in out and "moved expert weights" in out
    assert main(["solve", str(path), "--method", "tacg", "--from", str(sglang), "--quiet"]) == 2


def test_hierarchical_infeasible_nodes_say_why(deepseek_few_layers):
    """Nodes that cannot hold their experts: an InfeasibleError that says what would fix it."""
    # one GPU per node: 4 experts per node cannot fill 5 slots without colocated copies
    with pytest.raises(InfeasibleError, match="gpus_per_node.*allow_colocated_copies"):
        solve(instance(deepseek_few_layers, gpn=1, hierarchical=True))
    # the thorough search (layer by layer) checks the same: 8 experts per node, 9 slots per GPU
    with pytest.raises(InfeasibleError, match="get 8 experts each, fewer than the 9 slots"):
        solve(instance(deepseek_few_layers, gpus=32, slots=8, gpn=1, hierarchical=True, search="thorough"))


def test_absurd_gpu_count_is_a_clear_error(tmp_path, capsys):
    """Water-filling prices every copy level: 10^6 GPUs is a one-line error naming cluster.gpus
    (exit 2, nothing on stdout), not numpy's out-of-memory traceback."""
    counts = tmp_path / "c.json"
    counts.write_text(json.dumps({"counts": [list(range(1, 257))] * 2, "top_k": 2}))
    inst = tmp_path / "wide.yaml"
    inst.write_text(
        "model: {layers: 2, experts: 256, top_k: 2}\ncluster: {gpus: 1000000, replica_slots_per_gpu: 1}\n"
        "workload: {calibration: c.json}\nmethod: {name: balance}\n"
    )
    assert main(["solve", str(inst)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "cluster.gpus" in out.err and "memory budget" in out.err
    assert len(out.err.strip().splitlines()) == 1


def test_fast_search_polishes_layers_far_above_their_bound(tmp_path):
    """Skewed synthetic loads at 64 GPUs x (1 + 1): the fast search's water-filled counts leave every
    layer more than POLISH_GAP above its bound; the method re-plans them with the per-layer search
    (whose replace moves change the counts) and reports what the scorer recomputes."""
    from moeopt.balance.batch import maxvio_batch, plan_layers_fast
    from moeopt.evaluate import evaluate
    from moeopt.io import load_instance
    from moeopt.methods.balance import POLISH_GAP, layer_bounds

    path = tmp_path / "skewed.yaml"
    path.write_text(
        "model: {layers: 3, experts: 64, top_k: 4}\n"
        "cluster: {gpus: 64, gpus_per_node: 8, replica_slots_per_gpu: 1}\n"
        "workload:\n  synthetic: {tokens: 4096, steps: 4, seed: 0}\n"
    )
    inst = load_instance(path)
    load = load_workloads(inst).calibration_stats.expert_load
    fast = maxvio_batch(plan_layers_fast(load, 64, 2, spread=True), load)
    bound = layer_bounds(load, 64, 2, False)
    assert np.all(fast > bound + POLISH_GAP)  # the case
    r = solve(inst, method="balance", params={"robust": "none"})
    per_layer = np.array(r.stats["calibration_maxvio_per_layer"])
    assert np.all(per_layer < fast - 0.03)
    wl = load_workloads(inst)
    assert evaluate(r.plan, wl.calibration, inst.cluster)["maxvio"] == pytest.approx(per_layer.mean())
