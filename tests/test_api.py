"""The public API: instances from arrays and mappings, solve, evaluate, reports, engine files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moeopt
from moeopt.cli import main
from moeopt.cli.tables import report_dict
from tests.strategies import examples, int_arrays, topk_arrays

RNG = np.random.default_rng(7)
COUNTS = RNG.integers(1, 200, size=(3, 16))
TOPK = np.stack([RNG.permutation(16)[:2] for _ in range(600 * 2)]).reshape(600, 2, 2)


def test_the_issue_line_runs():
    """``moeopt.solve(moeopt.Instance.from_counts(counts, gpus=8, top_k=4), method="balance").to_dict()``."""
    report = moeopt.solve(moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=4), method="balance").to_dict()
    assert report["method"] == "balance" and report["status"] == "feasible"
    assert report["instance"] == "counts"
    assert json.loads(json.dumps(report)) == report  # plain JSON values only
    assert 0 <= report["metrics"]["maxvio"] < 0.5


def test_counts_shape_the_model_and_are_scored_in_sample():
    """The counts give layers and experts; without evaluation counts plans are scored on them."""
    inst = moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=4, replica_slots_per_gpu=1, dense_layers=0)
    assert (inst.model.layers, inst.model.experts, inst.model.top_k) == (3, 16, 4)
    assert (inst.cluster.gpus, inst.cluster.gpus_per_node, inst.cluster.width) == (8, 8, 3)
    result = moeopt.solve(inst, method="balance")
    assert result.plan is not None
    loads = np.asarray(result.metrics["loads"])  # [L, G], scored on COUNTS
    np.testing.assert_allclose(loads.sum(axis=1), COUNTS.sum(axis=1))
    assert moeopt.evaluate(result.plan, inst)["maxvio"] == pytest.approx(result.metrics["maxvio"])


def test_evaluation_counts_are_held_out():
    """``evaluation`` counts are what plans are scored on; ``evaluate(workload=...)`` scores on others."""
    other = COUNTS[:, ::-1].copy()
    inst = moeopt.Instance.from_counts(COUNTS, gpus=4, top_k=2, evaluation=other)
    result = moeopt.solve(inst, method="balance")
    np.testing.assert_allclose(np.asarray(result.metrics["loads"]).sum(axis=1), other.sum(axis=1))
    in_sample = moeopt.evaluate(result.plan, inst, workload=COUNTS)
    assert in_sample["maxvio"] < result.metrics["maxvio"]  # planned on COUNTS, best there


def test_torch_tensors_give_the_numpy_plan():
    """A torch tensor (integer, float, bfloat16) plans exactly as the numpy array does."""
    torch = pytest.importorskip("torch")
    base = moeopt.solve(moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=4), method="balance").plan
    for tensor in (torch.tensor(COUNTS), torch.tensor(COUNTS, dtype=torch.float32), torch.tensor(COUNTS).bfloat16()):
        plan = moeopt.solve(moeopt.Instance.from_counts(tensor, gpus=8, top_k=4), method="balance").plan
        if tensor.dtype == torch.bfloat16 and not torch.equal(tensor.double(), torch.tensor(COUNTS).double()):
            continue  # bfloat16 rounds counts above 256: another workload
        np.testing.assert_array_equal(plan.slots, base.slots)
    inst = moeopt.Instance.from_trace(torch.tensor(TOPK), gpus=4)
    assert inst.model.top_k == 2 and inst.model.experts == 16


def test_nested_lists_are_arrays():
    """Nested lists are accepted where arrays are."""
    inst = moeopt.Instance.from_counts(COUNTS.tolist(), gpus=8, top_k=4)
    np.testing.assert_array_equal(inst.workload.calibration.data.expert_load, COUNTS)


def test_step_counts_keep_their_steps():
    """Per-step counts: the pooled counts are their sum; balance plans on the steps."""
    steps = RNG.integers(0, 50, size=(2, 5, 16))
    inst = moeopt.Instance.from_step_counts(steps, gpus=4, top_k=2)
    stats = inst.workload.calibration.data
    np.testing.assert_allclose(stats.expert_load, steps.sum(axis=1))
    assert stats.step_counts.shape == (2, 5, 16)
    assert moeopt.solve(inst, method="balance").plan is not None


def test_in_memory_trace_solves_like_its_file(tmp_path):
    """A trace held in memory gives the plan and metrics of the same trace read from a file."""
    home = RNG.integers(0, 4, size=len(TOPK))
    step = np.repeat(np.arange(6), 100)
    memory = moeopt.Instance.from_trace(TOPK, gpus=4, home=home, step=step, token_home="trace", name="t")
    trace = memory.workload.calibration.data
    moeopt.write_trace(tmp_path / "t.npz", trace)
    mapping = {
        "name": "t",
        "model": {"layers": 2, "experts": 16, "top_k": 2},
        "cluster": {"gpus": 4, "token_home": "trace"},
        "workload": {"calibration": "t.npz"},
    }
    from_file = moeopt.Instance.from_dict(mapping, base=tmp_path)
    a, b = (moeopt.solve(i, method="greedy") for i in (memory, from_file))
    np.testing.assert_array_equal(a.plan.slots, b.plan.slots)
    assert a.metrics["comm_per_token"] == b.metrics["comm_per_token"]


def test_trace_object_is_accepted():
    """A ``moeopt.Trace`` stands for its arrays; arrays beside it are refused."""
    trace = moeopt.Instance.from_trace(TOPK, gpus=4).workload.calibration.data
    assert moeopt.Instance.from_trace(trace, gpus=4).model.experts == 16
    with pytest.raises(moeopt.InputError, match="^step: expected nothing beside a Trace"):
        moeopt.Instance.from_trace(trace, gpus=4, step=np.zeros(len(TOPK), dtype=int))


BAD_COUNTS = [
    (-COUNTS, "counts: contains negative counts"),
    (np.where(COUNTS > 100, np.nan, COUNTS), "counts: contains NaN or infinite values"),
    (COUNTS[0], "counts: expected [layers, experts]"),
    ([[1, 2], [3]], "counts: expected a rectangular array of numbers"),
    (COUNTS > 5, "counts: expected numbers, found dtype bool"),
    (np.array([["a", "b"]]), "counts: expected numbers, found dtype <U1"),
    (np.zeros((2, 16)), "counts: expected every layer to count some routed tokens"),
]


@pytest.mark.parametrize(("counts", "message"), BAD_COUNTS)
def test_bad_counts_name_the_argument(counts, message):
    """A bad count array is one InputError naming ``counts``."""
    with pytest.raises(moeopt.InputError) as err:
        moeopt.Instance.from_counts(counts, gpus=8, top_k=2)
    assert str(err.value).startswith(message)


def test_bad_traces_and_options_name_the_argument():
    """Bad trace arrays and options are one InputError naming the argument or field."""
    cases = [
        (lambda: moeopt.Instance.from_trace(TOPK.astype(float) + 0.5, gpus=4), "topk: expected integer expert ids"),
        (lambda: moeopt.Instance.from_trace(TOPK, gpus=4, experts=8), "topk: expected expert ids in [0, 7]"),
        (lambda: moeopt.Instance.from_trace(np.zeros((5, 1, 2), int), gpus=4), "topk: expected distinct experts"),
        (lambda: moeopt.Instance.from_trace(TOPK, gpus=4, step=[1, 2]), "step: expected integers of shape [600]"),
        (lambda: moeopt.Instance.from_trace(TOPK, gpus=4, top_k=3), "topk: trace has top-2 routing, model.top_k is 3"),
        (lambda: moeopt.Instance.from_trace(TOPK, gpus=4, home=np.full(600, 9)), "home: expected GPU ids in [0, 3]"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=99), "top_k: expected an integer in [1, 16]"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=0, top_k=2), "cluster.gpus: expected a value >= 1"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=2, gpus_per_node=3), "cluster.gpus_per_node"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=2, engine="trt"), "cluster.engine: expected one"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=2, colour=1), "colour: unknown option"),
        (lambda: moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=2, evaluation=COUNTS[:1]), "evaluation: layers"),
    ]
    for make, message in cases:
        with pytest.raises(moeopt.InputError) as err:
            make()
        assert message in str(err.value), (str(err.value), message)
        assert str(err.value).split(":")[0] in message  # the argument or field comes first


def test_from_dict_gives_the_file_messages(tmp_path):
    """``from_dict`` validates with the instance-file schema: the file's message, without the file."""
    mapping = {"model": {"layers": 2, "experts": 8, "top_k": 9}, "cluster": {"gpus": 4}, "workload": {"synthetic": {}}}
    (tmp_path / "bad.yaml").write_text(json.dumps(mapping))  # JSON is YAML
    with pytest.raises(moeopt.InputError) as from_file:
        moeopt.load_instance(tmp_path / "bad.yaml")
    with pytest.raises(moeopt.InputError) as from_dict:
        moeopt.Instance.from_dict(mapping)
    assert str(from_file.value) == f"{tmp_path / 'bad.yaml'}: {from_dict.value}"
    mapping["model"]["top_k"] = 2
    inst = moeopt.Instance.from_dict(mapping)
    assert inst.source is None and moeopt.solve(inst, method="linear").plan is not None


def test_to_json_is_the_cli_report(tmp_path, quickstart_path):
    """``Result.to_json`` writes what ``solve --report`` writes (one serializer), up to the wall times."""
    assert main(["solve", str(quickstart_path), "--method", "greedy", "--report", str(tmp_path / "cli.json")]) == 0
    result = moeopt.solve(moeopt.load_instance(quickstart_path), method="greedy")
    text = result.to_json(tmp_path / "api.json")
    assert (tmp_path / "api.json").read_text() == text
    cli, api = json.loads((tmp_path / "cli.json").read_text()), json.loads(text)
    assert api == result.to_dict() == report_dict(result, result.instance)
    for report in (cli, api):
        report.pop("wall_time")
        report["stats"].pop("layer_wall_times", None)
    assert list(cli) == list(api)  # the same keys in the same order, version and commit included
    assert "moeopt_version" in api
    assert cli["metrics"] == api["metrics"] and cli["objective"] == api["objective"]


def test_engine_files_round_trip(tmp_path):
    """``to_engine`` and ``from_engine`` keep every slot, for every engine format."""
    inst = moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=4, replica_slots_per_gpu=1, dense_layers=3)
    plan = moeopt.solve(inst, method="balance").plan
    for engine, name in (("sglang", "m.json"), ("eplb", "m.npz"), ("vllm-ascend", "m.json")):
        rule = {"vllm-ascend": moeopt.Dispatch("ascend")}.get(engine, plan.dispatch)
        notes = plan.with_dispatch(rule).to_engine(engine, tmp_path / engine / name, instance=inst)
        assert isinstance(notes, list)
        back = moeopt.Plan.from_engine(tmp_path / engine / name, engine, instance=inst)
        assert back.same_layout(plan), engine
    sglang = json.loads((tmp_path / "sglang" / "m.json").read_text())["physical_to_logical_map"]
    assert len(sglang) == 3 + 3  # dense rows first


def test_engine_files_are_checked(tmp_path):
    """The export's checks: dense layers for SGLang, the suffix, the engine's rule, the engine's name."""
    inst = moeopt.Instance.from_counts(COUNTS, gpus=8, top_k=4)
    plan = moeopt.solve(inst, method="balance").plan
    with pytest.raises(moeopt.InputError, match="^dense_layers: SGLang's map needs a row for every hidden layer"):
        plan.to_engine("sglang", tmp_path / "m.json", instance=inst)
    with pytest.raises(moeopt.InputError, match="eplb plans are written as .npz or .pt"):
        plan.to_engine("eplb", tmp_path / "m.json")
    with pytest.raises(moeopt.InputError, match="dispatch: the plan runs under 'locality'"):
        plan.with_dispatch(moeopt.Dispatch("locality")).to_engine("sglang", tmp_path / "m.json", dense_layers=0)
    with pytest.raises(moeopt.InputError, match="^engine: expected one of sglang, eplb, vllm-ascend"):
        plan.to_engine("trt", tmp_path / "m.json")
    assert not list(tmp_path.iterdir())


def test_method_available_and_names():
    """Every registered method says whether it can run; an unknown one is an InputError."""
    assert "balance" in moeopt.method_names() and moeopt.method_available("balance")
    with pytest.raises(moeopt.InputError, match="unknown method 'nope'"):
        moeopt.method_available("nope")


@settings(max_examples=examples(25))
@given(counts=int_arrays((2, 8), 1, 1000), gpus=st.sampled_from([1, 2, 4, 8]), top_k=st.integers(1, 4))
def test_counts_in_report_out(counts, gpus, top_k):
    """Any valid counts table solves to a plan whose report is plain JSON with the table's totals."""
    result = moeopt.solve(moeopt.Instance.from_counts(counts, gpus=gpus, top_k=top_k), method="greedy")
    report = result.to_dict()
    assert json.loads(result.to_json()) == report
    np.testing.assert_allclose(np.sum(report["metrics"]["loads"], axis=1), counts.sum(axis=1))


@settings(max_examples=examples(15))
@given(topk=topk_arrays((40, 2), 8, 2))
def test_trace_arrays_keep_their_tokens(topk):
    """A top-k array becomes a trace with its tokens, layers and k; experts from its largest id."""
    inst = moeopt.Instance.from_trace(topk, gpus=2, experts=8)
    trace = inst.workload.calibration.data
    np.testing.assert_array_equal(trace.topk, topk)
    assert (inst.model.layers, inst.model.experts, inst.model.top_k) == (2, 8, 2)


def test_load_figure_reads_at_hundreds_of_gpus(tmp_path, monkeypatch):
    """Past 32 GPUs the per-GPU load figure draws sorted load curves, not a bar per GPU; its
    title says in sample when the instance has no held-out workload."""
    pytest.importorskip("matplotlib")
    from moeopt import plot

    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: drawn.append(fig))
    counts = RNG.gamma(0.5, 100, size=(1, 640)) + 1
    inst = moeopt.Instance.from_counts(counts, gpus=320, top_k=8)
    result = moeopt.solve(inst, method="balance")
    base = moeopt.evaluate(moeopt.solve(inst, method="linear").plan, inst)
    plot.draw_loads([plot.load_bars(result.metrics, base, after_label="balance")], tmp_path / "x.png")
    (ax,) = [a for a in drawn[0].axes if a.get_visible()]
    assert not ax.patches and len(ax.lines) >= 3  # two sorted curves and the mean
    assert "sorted by load" in ax.get_xlabel()
    assert plot.scored_on(inst) == "in sample"
    held = moeopt.Instance.from_counts(counts, gpus=320, top_k=8, evaluation=counts[:, ::-1].copy())
    assert plot.scored_on(held) == "held-out workload"


def test_in_memory_instance_runs_in_a_process_pool():
    """An instance holding its arrays in memory solves the same in worker processes as here."""
    inst = moeopt.Instance.from_trace(TOPK, gpus=4)
    here = moeopt.solve(inst, method="greedy")
    pool = moeopt.solve(inst, method="greedy", workers=2)
    np.testing.assert_array_equal(here.plan.slots, pool.plan.slots)
