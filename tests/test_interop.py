"""Serving-engine interoperability: SGLang, DeepSeek EPLB and vLLM-Ascend plans, recorder dumps."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt import interop
from moeopt.cli import main
from moeopt.errors import InputError, PlanError
from moeopt.instance import Cluster
from moeopt.io import (
    read_engine_plan,
    read_plan,
    read_sglang_dump,
    read_trace,
    read_workload_file,
    write_engine_plan,
    write_plan,
)
from moeopt.plan import Plan
from moeopt.trace import Stats, Trace
from tests.conftest import ROOT
from tests.strategies import small_case


@st.composite
def placed_plan(draw, max_experts: int = 12, max_gpus: int = 5, max_layers: int = 3):
    """(plan, cluster): every GPU homes at least one expert per layer; random replicas."""
    E = draw(st.integers(1, max_experts))
    G = draw(st.integers(1, min(max_gpus, E)))
    L = draw(st.integers(1, max_layers))
    slots = math.ceil(E / G) + draw(st.integers(0, 1))
    rslots = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    home = np.empty((L, E), dtype=np.int64)
    reps = []
    for l in range(L):
        order = rng.permutation(E)
        home[l, order[:G]] = np.arange(G)  # no GPU left without a home expert
        free = np.full(G, slots - 1)
        for e in order[G:]:
            g = int(rng.choice(np.flatnonzero(free > 0)))
            home[l, e] = g
            free[g] -= 1
        rows, rfree = [], np.full(G, rslots)
        for e in rng.permutation(E)[: rng.integers(0, E + 1)]:
            options = [g for g in range(G) if rfree[g] > 0 and g != home[l, e]]
            for g in rng.permutation(options)[: rng.integers(0, len(options) + 1)]:
                rows.append((int(e), int(g)))
                rfree[g] -= 1
        reps.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
    plan = Plan(home=home, replicas=tuple(reps))
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=slots, replica_slots_per_gpu=rslots)
    plan.check(cluster)
    return plan, cluster


def copy_sets(plan: Plan) -> list[set[tuple[int, int]]]:
    """Per layer, the (expert, gpu) pairs held as replicas."""
    return [set(map(tuple, r.tolist())) for r in plan.replicas]


def assert_same_plan(a: Plan, b: Plan) -> None:
    assert np.array_equal(a.home, b.home)
    assert copy_sets(a) == copy_sets(b)


def export_import(plan: Plan, cluster: Cluster, fmt: str) -> Plan:
    """Convert through one engine format in memory (JSON text for the JSON formats)."""
    G, S, R = cluster.gpus, cluster.slots_per_gpu, cluster.replica_slots_per_gpu
    if fmt == "sglang":
        data = json.loads(json.dumps(interop.to_sglang(plan, G, slots_per_gpu=S, replica_slots_per_gpu=R)))
        return interop.from_sglang(data, G, slots_per_gpu=S)
    if fmt == "eplb":
        back, g = interop.from_eplb(interop.to_eplb(plan, G, slots_per_gpu=S, replica_slots_per_gpu=R))
    else:
        data = json.loads(json.dumps(interop.to_vllm_ascend(plan, G, slots_per_gpu=S, replica_slots_per_gpu=R)))
        back, g = interop.from_vllm_ascend(data, slots_per_gpu=S)
    assert g == G
    return back


@pytest.mark.parametrize("fmt", interop.ENGINE_FORMATS)
@given(case=placed_plan())
def test_round_trip_each_format(fmt, case):
    """plan -> engine format -> plan keeps every home and every replica."""
    plan, cluster = case
    back = export_import(plan, cluster, fmt)
    assert_same_plan(plan, back)
    back.check(cluster)


@given(case=small_case(replicas=True))
def test_layout_keeps_copies_of_any_plan(case):
    """Any feasible plan: the layout holds exactly its (expert, GPU) copies, plus the hottest
    expert on GPUs that hold nothing in a layer, and every slot maps to a valid expert."""
    cluster, _, plan = case
    G = cluster.gpus
    table = interop.physical_layout(
        plan, G, slots_per_gpu=cluster.slots_per_gpu, replica_slots_per_gpu=cluster.replica_slots_per_gpu
    )
    W = cluster.slots_per_gpu + cluster.replica_slots_per_gpu
    assert table.shape == (plan.layers, G * W)
    assert table.min() >= 0 and table.max() < plan.experts
    for l in range(plan.layers):
        held = {(int(e), p // W) for p, e in enumerate(table[l])}
        want = {(e, int(plan.home[l, e])) for e in range(plan.experts)} | copy_sets(plan)[l]
        empty = {g for g in range(G) if not any(g == h for _, h in want)}
        assert {c for c in held if c[1] not in empty} == want
        assert len({e for e, g in held if g in empty}) <= 1
        back = interop.plan_from_physical(
            table[l : l + 1], G, experts=plan.experts, slots_per_gpu=cluster.slots_per_gpu
        )
        got = {(e, int(back.home[0, e])) for e in range(plan.experts)} | copy_sets(back)[0]
        assert got == held


def test_sglang_slot_to_gpu_rule():
    """Physical slot p lies on GPU p // (P / G): homes first, then replicas, every GPU W slots."""
    plan = Plan(
        home=np.array([[0, 0, 1, 1, 2, 3]]),
        replicas=(np.array([[0, 3], [5, 1]]),),
    )
    G = 4
    table = np.array(interop.to_sglang(plan, G)["physical_to_logical_map"])
    # S = ceil(6 / 4) = 2 home slots and 1 replica slot per GPU: P = 12
    assert table.shape == (1, 12)
    by_gpu = table[0].reshape(G, 3)
    assert by_gpu.tolist() == [[0, 1, 0], [2, 3, 5], [4, 4, 4], [5, 5, 0]]
    for p, e in enumerate(table[0]):
        g = p // (table.shape[1] // G)
        assert g == plan.home[0, e] or [e, g] in plan.replicas[0].tolist()


def test_empty_gpu_gets_hottest_expert():
    """A GPU that holds nothing is filled with the hottest expert (by load when given)."""
    plan = Plan(home=np.array([[0, 0, 1, 1]]))
    G = 3
    table = interop.physical_layout(plan, G, slots_per_gpu=2)
    assert table[0, 4:].tolist() == [0, 0]  # no load: most replicated, lowest id
    load = np.array([[1.0, 2.0, 9.0, 3.0]])
    table = interop.physical_layout(plan, G, slots_per_gpu=2, load=load)
    assert table[0, 4:].tolist() == [2, 2]


def test_eplb_log2phy_padded_with_minus_one():
    """log2phy lists each expert's slots ascending, -1 padded; logcnt counts them."""
    plan = Plan(home=np.array([[0, 0, 1, 1]]), replicas=(np.array([[2, 0], [3, 0]]),))
    out = interop.to_eplb(plan, 2)
    # GPU 0: homes 0, 1 + replicas 2, 3; GPU 1: homes 2, 3 + two unused slots (copies of 2)
    assert out["phy2log"].tolist() == [[0, 1, 2, 3, 2, 3, 2, 2]]
    assert out["logcnt"].tolist() == [[1, 1, 4, 2]]
    assert out["log2phy"].shape == (1, 4, 4)
    assert out["log2phy"][0].tolist() == [[0, -1, -1, -1], [1, -1, -1, -1], [2, 4, 6, 7], [3, 5, -1, -1]]
    for e in range(4):
        slots = out["log2phy"][0, e]
        assert (out["phy2log"][0, slots[slots >= 0]] == e).all()


def test_eplb_inconsistent_tensors_rejected():
    """logcnt or log2phy that disagree with phy2log is an InputError, not a wrong plan."""
    plan = Plan(home=np.array([[0, 0, 1, 1]]), replicas=(np.array([[2, 0]]),))
    good = interop.to_eplb(plan, 2)
    bad = dict(good, logcnt=good["logcnt"] + 1)
    with pytest.raises(InputError, match="logcnt"):
        interop.from_eplb(bad)
    l2p = good["log2phy"].copy()
    l2p[0, 0, 0], l2p[0, 1, 0] = l2p[0, 1, 0], l2p[0, 0, 0]
    with pytest.raises(InputError, match="log2phy"):
        interop.from_eplb(dict(good, log2phy=l2p))
    with pytest.raises(InputError, match="num_gpus"):
        interop.from_eplb({"phy2log": good["phy2log"]})


@pytest.mark.parametrize(
    "table,gpus,message",
    [
        ([[0, 1, 2]], 2, "do not split evenly over 2 GPUs"),
        ([[0, 1, 1, 3]], 2, "logical expert 2 has no physical slot"),
        ([[0, -1]], 1, "is negative"),
        ([0, 1], 1, "expected [layers, physical slots]"),
        ([[0, 1], [0]], 1, "rectangular"),
        ([["a", "b"]], 1, "numbers"),
    ],
)
def test_bad_physical_maps(table, gpus, message):
    """Malformed SGLang maps raise InputError naming the problem."""
    with pytest.raises(InputError) as err:
        interop.from_sglang({"physical_to_logical_map": table}, gpus, source="map.json")
    assert message in str(err.value) and "map.json" in str(err.value)


def test_bad_vllm_ascend_maps():
    """Malformed vLLM-Ascend maps raise InputError naming the field."""
    plan = Plan(home=np.array([[0, 1], [1, 0]]))
    good = interop.to_vllm_ascend(plan, 2)
    cases = [
        ({"layers": []}, "layer_list"),
        (dict(good, moe_layer_count=3), "moe_layer_count"),
        ({**good, "layer_list": [good["layer_list"][0], good["layer_list"][0]]}, "duplicate layer_id"),
        (
            {**good, "layer_list": [{**good["layer_list"][0], "device_count": 3}, good["layer_list"][1]]},
            "device_count",
        ),
        (
            {
                **good,
                "layer_list": [{**good["layer_list"][0], "device_list": [{"device_id": 0}, {"device_id": 1}]}]
                + good["layer_list"][1:],
            },
            "device_expert",
        ),
    ]
    for data, message in cases:
        with pytest.raises(InputError, match=message):
            interop.from_vllm_ascend(data)
    devices = good["layer_list"][0]["device_list"]
    swapped = {**good, "layer_list": [{**good["layer_list"][0], "device_list": devices[::-1]}, good["layer_list"][1]]}
    back, _ = interop.from_vllm_ascend(swapped)
    assert back.home.tolist() == plan.home.tolist()  # ordered by device_id, not list order


def test_export_refuses_plan_over_slots():
    """A plan needing more slots than the instance gives cannot be exported."""
    plan = Plan(home=np.array([[0, 0, 0, 1]]), replicas=(np.array([[3, 0]]),))
    with pytest.raises(PlanError, match="slots_per_gpu=2"):
        interop.physical_layout(plan, 2, slots_per_gpu=2)
    with pytest.raises(PlanError, match="replica_slots_per_gpu is 0"):
        interop.physical_layout(plan, 2, slots_per_gpu=3, replica_slots_per_gpu=0)


# ----------------------------------------------------------------------------- files
@pytest.mark.parametrize(
    "fmt,suffix", [("sglang", ".json"), ("sglang", ".pt"), ("eplb", ".npz"), ("vllm-ascend", ".json")]
)
def test_file_round_trip(fmt, suffix, tmp_path):
    """write_engine_plan then read_engine_plan returns the plan."""
    if suffix == ".pt":
        pytest.importorskip("torch")
    plan = Plan(
        home=np.array([[0, 1, 2, 0, 1, 2], [2, 2, 1, 1, 0, 0]]), replicas=(np.array([[0, 1]]), np.zeros((0, 2)))
    )
    path = tmp_path / f"plan{suffix}"
    write_engine_plan(path, plan, 3, fmt, slots_per_gpu=2, replica_slots_per_gpu=1)
    back, gpus = read_engine_plan(path, fmt, gpus=3 if fmt == "sglang" else None, slots_per_gpu=2)
    assert gpus == 3
    assert_same_plan(plan, back)


def test_eplb_pt_round_trip(tmp_path):
    """EPLB tensors saved with torch (int64 tensors) read back to the plan."""
    torch = pytest.importorskip("torch")
    plan = Plan(home=np.array([[0, 1, 0, 1]]), replicas=(np.array([[2, 1]]),))
    path = tmp_path / "eplb.pt"
    write_engine_plan(path, plan, 2, "eplb")
    saved = torch.load(path, weights_only=True)
    assert saved["phy2log"].dtype == torch.int64 and saved["log2phy"].shape == (1, 4, 2)
    back, gpus = read_engine_plan(path, "eplb")
    assert gpus == 2
    assert_same_plan(plan, back)


def test_engine_file_errors(tmp_path):
    """Wrong suffix, missing file, bad JSON and a missing GPU count are InputErrors."""
    plan = Plan(home=np.array([[0, 1]]))
    with pytest.raises(InputError, match="written as .npz or .pt"):
        write_engine_plan(tmp_path / "x.json", plan, 2, "eplb")
    with pytest.raises(InputError, match="file not found"):
        read_engine_plan(tmp_path / "none.json", "sglang", gpus=2)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_engine_plan(tmp_path / "bad.json", "vllm-ascend")
    write_engine_plan(tmp_path / "ok.json", plan, 2, "sglang")
    with pytest.raises(InputError, match="GPU count"):
        read_engine_plan(tmp_path / "ok.json", "sglang")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "ok.json"]


# ----------------------------------------------------------------------------- recorder dumps
def _per_token_dump(rng, torch, *, dense: int = 1, L: int = 2, E: int = 6, G: int = 3, k: int = 2, steps: int = 3):
    """A synthetic SGLang per_token dump and the logical top-k it encodes ([tokens, L, k])."""
    home = np.stack([rng.permutation(np.arange(E) % G) for _ in range(L)])
    hot = rng.integers(E, size=L)
    plan = Plan(home=home, replicas=tuple(np.array([[hot[l], (home[l, hot[l]] + 1) % G]]) for l in range(L)))
    p2l = np.array(interop.to_sglang(plan, G, dense_layers=dense)["physical_to_logical_map"])
    records, truth = [], []
    for t in range(steps):
        n = int(rng.integers(1, 6))
        logical = np.stack([np.argsort(rng.random((n, E)), axis=1)[:, :k] for _ in range(L)], axis=1)
        physical = np.full((dense + L, n, k), -1, dtype=np.int64)
        for l in range(L):
            for i in range(n):
                for j in range(k):
                    slots = np.flatnonzero(p2l[dense + l] == logical[i, l, j])
                    physical[dense + l, i, j] = rng.choice(slots)
        records.append({"forward_pass_id": 10 + t, "rank": 0, "topk_ids_of_layer": torch.from_numpy(physical)})
        truth.append(logical)
    dump = {"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)}
    return dump, np.concatenate(truth)


def test_per_token_dump_to_trace(tmp_path):
    """per_token dump: physical ids mapped to logical experts, dense layers and padding dropped."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    dump, truth = _per_token_dump(rng, torch)
    pad = torch.full((3, 2, 2), -1, dtype=torch.int64)
    pad[1:, 1] = 0  # one padded token (-1 at a MoE layer) and one real token
    dump["records"].append({"forward_pass_id": 99, "topk_ids_of_layer": pad})
    path = tmp_path / "dump.pt"
    torch.save(dump, path)
    tr = read_sglang_dump(path)
    assert isinstance(tr, Trace)
    p2l = dump["last_physical_to_logical_map"].numpy()
    expected = np.concatenate([truth, p2l[1:, 0][None, :, None].repeat(2, axis=2)])
    assert tr.layers == 2 and tr.top_k == 2 and tr.num_experts == 6
    assert np.array_equal(tr.topk, expected)
    assert tr.steps == 4 and np.all(np.diff(tr.step) >= 0)
    assert isinstance(read_workload_file(path), Trace)  # workloads accept the dump too


def test_stat_dump_to_counts(tmp_path):
    """stat dump: logical_count [steps, layers, E]; all-zero dense layers dropped, steps kept."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 50, (4, 3, 8))
    counts[:, 0] = 0  # a dense layer
    path = tmp_path / "stat.pt"
    torch.save({"logical_count": torch.from_numpy(counts)}, path)
    st_ = read_sglang_dump(path, top_k=2)
    assert isinstance(st_, Stats)
    assert st_.layers == 2 and st_.experts == 8
    assert np.array_equal(st_.expert_load, counts[:, 1:].sum(axis=0))
    assert np.array_equal(st_.step_counts, counts[:, 1:].transpose(1, 0, 2))
    with pytest.raises(InputError, match="top_k"):
        read_sglang_dump(path)


def test_stat_dump_shapes():
    """A [layers, E] logical_count has no per-step counts; a list of dumps stacks as steps."""
    one = interop.read_sglang_dump({"logical_count": [[0, 0, 0], [1, 2, 3]]}, top_k=1)
    assert one.layers == 1 and one.step_counts is None
    assert one.expert_load.tolist() == [[1, 2, 3]]
    many = interop.read_sglang_dump([{"logical_count": [[0, 0], [1, 2]]}, {"logical_count": [[0, 0], [3, 0]]}], top_k=1)
    assert many.expert_load.tolist() == [[4, 2]]
    assert many.step_counts.tolist() == [[[1, 2], [3, 0]]]


@pytest.mark.parametrize(
    "obj,message",
    [
        ([1, 2], "expected an SGLang expert-distribution dump"),
        ({"records": []}, "records: expected a non-empty list"),
        ({"records": [{"x": 1}], "last_physical_to_logical_map": [[0]]}, "records[0]: expected a record"),
        ({"records": [{"topk_ids_of_layer": [[[0]]]}]}, "last_physical_to_logical_map: required"),
        (
            {"records": [{"topk_ids_of_layer": [[[0]], [[0]]]}], "last_physical_to_logical_map": [[0, 0]]},
            "expected [1 layers, tokens, k]",
        ),
        ({"records": [{"topk_ids_of_layer": [[[5]]]}], "last_physical_to_logical_map": [[0, 0]]}, "physical ids"),
        ({"records": [{"topk_ids_of_layer": [[[-1]]]}], "last_physical_to_logical_map": [[0, 0]]}, "no token"),
        ({"logical_count": [1, 2]}, "expected [steps, layers, experts]"),
        ({"logical_count": [[0, 0]]}, "every layer is all zero"),
        ({"logical_count": [[1, -2]]}, "negative"),
    ],
)
def test_bad_dumps(obj, message):
    """Unexpected dump structure: InputError naming the field, never a traceback."""
    with pytest.raises(InputError) as err:
        interop.read_sglang_dump(obj, top_k=1, source="dump.pt")
    assert message in str(err.value) and "dump.pt" in str(err.value)


def test_pt_without_torch(tmp_path, monkeypatch):
    """Without torch, a .pt path raises InputError saying torch is needed."""
    monkeypatch.setitem(sys.modules, "torch", None)
    (tmp_path / "d.pt").write_bytes(b"x")
    with pytest.raises(InputError, match="needs torch"):
        read_sglang_dump(tmp_path / "d.pt")
    with pytest.raises(InputError, match="needs torch"):
        write_engine_plan(tmp_path / "e.pt", Plan(home=np.array([[0]])), 1, "eplb")


def test_import_without_torch():
    """import moeopt and the CLI work when torch cannot be imported."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import moeopt, moeopt.interop, moeopt.io\n"
        "from moeopt.cli import build_parser\n"
        "build_parser().parse_args(['export', 'p.json', '--format', 'sglang', '--output', 'o.json'])\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ----------------------------------------------------------------------------- real data
def test_real_deepseek_v3_counts_and_export(real_data):
    """The real DeepSeek-V3 SGLang counts load as 58 MoE layers x 256 experts; a plan for
    them exports to SGLang's 61-row map (3 dense layers) and reads back."""
    stats = read_workload_file(real_data / "deepseek_v3_prefill_in1024.json", top_k=8)
    assert (stats.layers, stats.experts) == (58, 256)
    G = 32
    plan = Plan(home=np.tile(np.arange(256) // 8, (58, 1)))
    data = interop.to_sglang(plan, G, replica_slots_per_gpu=1, load=stats.expert_load, dense_layers=3)
    table = np.array(data["physical_to_logical_map"])
    assert table.shape == (61, 288)
    back = interop.from_sglang(data, G, dense_layers=3)
    assert np.array_equal(back.home, plan.home)
    assert not back.has_replicas  # unused replica slots only repeat experts already on the GPU


# ----------------------------------------------------------------------------- CLI
def _plan_file(tmp_path) -> tuple:
    plan = Plan(
        home=np.array([[0, 0, 1, 1, 2, 2, 3, 3], [3, 2, 1, 0, 0, 1, 2, 3]]),
        replicas=(np.array([[0, 1], [4, 3]]), np.array([[7, 0]])),
    )
    path = tmp_path / "plan.json"
    write_plan(path, plan, 4, "test")
    inst = tmp_path / "inst.yaml"
    inst.write_text(
        "name: t\nmodel: {layers: 2, experts: 8, top_k: 2}\n"
        "cluster: {gpus: 4, replica_slots_per_gpu: 1}\n"
        "workload: {synthetic: {tokens: 100}}\n"
    )
    return plan, path, inst


@pytest.mark.parametrize("fmt,suffix", [("sglang", ".json"), ("eplb", ".npz"), ("vllm-ascend", ".json")])
def test_cli_export_import_round_trip(fmt, suffix, tmp_path, capsys):
    """moeopt export then moeopt import gives back the plan file's homes and replicas."""
    plan, path, inst = _plan_file(tmp_path)
    out = tmp_path / f"engine{suffix}"
    assert main(["export", str(path), "--format", fmt, "--output", str(out), "--instance", str(inst)]) == 0
    assert "4 GPUs x 3" in capsys.readouterr().out
    back_path = tmp_path / "back.json"
    extra = ["--gpus", "4"] if fmt == "sglang" else []
    assert main(["import", str(out), "--format", fmt, "--output", str(back_path), "--quiet", *extra]) == 0
    back, gpus = read_plan(back_path)
    assert gpus == 4
    assert_same_plan(plan, back)


def test_cli_trace_import(tmp_path, capsys):
    """moeopt trace import writes a trace (per_token) or counts (stat) npz."""
    torch = pytest.importorskip("torch")
    dump, truth = _per_token_dump(np.random.default_rng(3), torch)
    torch.save(dump, tmp_path / "tok.pt")
    assert main(["trace", "import", str(tmp_path / "tok.pt"), "--output", str(tmp_path / "t.npz")]) == 0
    assert np.array_equal(read_trace(tmp_path / "t.npz").topk, truth)
    torch.save({"logical_count": torch.ones(2, 3, 4, dtype=torch.int64)}, tmp_path / "stat.pt")
    args = ["trace", "import", str(tmp_path / "stat.pt"), "--output", str(tmp_path / "c.npz"), "--top-k", "2"]
    assert main(args) == 0
    assert "counts, 3 MoE layers, E=4, top-2, 2 steps" in capsys.readouterr().out
    counts = read_workload_file(tmp_path / "c.npz")
    assert counts.step_counts.shape == (3, 2, 4) and counts.top_k == 2


class Marker:
    """A non-tensor object, as a recorder dump may carry in a record's extra fields."""


def test_cli_trace_import_trust_pickle(tmp_path, capsys):
    """Dumps holding other objects load only with --trust-pickle (unpickling runs code)."""
    torch = pytest.importorskip("torch")
    dump, truth = _per_token_dump(np.random.default_rng(4), torch)
    dump["records"][0]["misc"] = Marker()
    torch.save(dump, tmp_path / "tok.pt")
    args = ["trace", "import", str(tmp_path / "tok.pt"), "--output", str(tmp_path / "t.npz")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trust-pickle" in err
    assert main([*args, "--trust-pickle", "--quiet"]) == 0
    assert np.array_equal(read_trace(tmp_path / "t.npz").topk, truth)


def test_cli_bad_inputs_one_line(tmp_path, capsys):
    """Bad export/import/trace-import input: exit 2 and one clear line on stderr."""
    plan, path, inst = _plan_file(tmp_path)
    (tmp_path / "bad.json").write_text('{"physical_to_logical_map": [[0, 1, 2]]}')
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    small = tmp_path / "small.yaml"
    small.write_text(
        "name: s\nmodel: {layers: 2, experts: 8, top_k: 2}\ncluster: {gpus: 4}\nworkload: {synthetic: {}}\n"
    )
    cases = [
        (
            ["export", str(tmp_path / "none.json"), "--format", "sglang", "--output", str(tmp_path / "o.json")],
            "file not found",
        ),
        (["export", str(path), "--format", "eplb", "--output", str(tmp_path / "o.json")], "written as .npz or .pt"),
        (
            ["export", str(path), "--format", "sglang", "--output", str(tmp_path / "o.json"), "--instance", str(small)],
            "replica_slots_per_gpu is 0",
        ),
        (
            ["export", str(path), "--format", "eplb", "--output", str(tmp_path / "o.npz"), "--dense-layers", "3"],
            "--dense-layers applies to --format sglang only",
        ),
        (
            ["import", str(tmp_path / "bad.json"), "--format", "sglang", "--output", str(tmp_path / "p.json")],
            "GPU count",
        ),
        (
            [
                "import",
                str(tmp_path / "bad.json"),
                "--format",
                "sglang",
                "--gpus",
                "2",
                "--output",
                str(tmp_path / "p.json"),
            ],
            "do not split evenly over 2 GPUs",
        ),
        (
            ["import", str(tmp_path / "bad.json"), "--format", "vllm-ascend", "--output", str(tmp_path / "p.json")],
            "layer_list",
        ),
        (["trace", "import", str(tmp_path / "junk.pt"), "--output", str(tmp_path / "t.npz")], "junk.pt"),
        (
            ["trace", "import", str(tmp_path / "junk.pt"), "--output", str(tmp_path / "t.csv")],
            "expected an .npz output",
        ),
    ]
    before = set(tmp_path.iterdir())
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        assert message in err, (argv, err)
    assert set(tmp_path.iterdir()) == before
