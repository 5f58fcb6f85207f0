"""The validated schema and safe outputs: every case of issue 13's checklist as an explicit test
(exit 2, one line naming the file or option, nothing written), plus the schema's own pieces."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from moeopt.cli import main, one_line
from moeopt.errors import InputError
from moeopt.registry import get_method, parse_params
from moeopt.schema import MAX_NESTING, SynthSchema, check_topk, input_error, nesting

BASE = {
    "name": "tiny",
    "model": {"layers": 1, "experts": 4, "top_k": 2},
    "cluster": {"gpus": 2},
    "workload": {"synthetic": {"tokens": 24, "steps": 2}},
    "method": {"name": "linear"},
}
PLAN = {
    "format": "moeopt.plan/2",
    "gpus": 2,
    "layers": 1,
    "experts": 4,
    "slots_per_gpu": 2,
    "slots": [[[0, 1], [2, 3]]],
    "dispatch": "even",
    "method": "linear",
    "params": {},
}


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def one_error(argv: list[str], capsys, starts: str, contains: str) -> str:
    code, err = run(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {starts}"), err
    assert contains in err, err
    return err


def instance(tmp_path: Path, **changes) -> Path:
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def plan(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, **changes}))
    return path


def trace(tmp_path: Path, name: str = "trace.npz", **arrays) -> Path:
    base = {
        "topk": np.array([[[0, 1]], [[2, 3]], [[1, 3]]], dtype=np.int16),
        "family": np.zeros(3, np.int32),
        "step": np.array([0, 1, 1], np.int32),
        "num_experts": np.array(4),
        "home": np.array([0, 1, 0], np.int32),
    }
    base.update(arrays)
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return path


# ----------------------------------------------------------------------------- instances
@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"cluster__gpus": 10**12}, "cluster.gpus", "memory budget"),
        ({"model__experts": 10**9}, "model.experts", "memory budget"),
        ({"model__expert_groups": 3}, "model.expert_groups", "divisor of experts=4"),
        ({"model__expert_groups": 0}, "model.expert_groups", ">= 1"),
        ({"model__expert_groups": "x"}, "model.expert_groups", "expected an integer"),
        ({"method": {"name": "balance", "group_spread": True}}, "model.expert_groups", "expert groups"),
        ({"workload__synthetic__families": []}, "workload.synthetic.families", "at least 1 item"),
        ({"workload__synthetic__family_share": [1, -1, 0, 0]}, "workload.synthetic.family_share[1]", ">= 0"),
        ({"workload__synthetic__family_share": [0, 0, 0, 0]}, "workload.synthetic.family_share", "positive total"),
        ({"workload__synthetic__skew": math.nan}, "workload.synthetic.skew", "finite"),
        ({"workload__synthetic__burst_fraction": 2}, "workload.synthetic.burst_fraction", "<= 1"),
        ({"workload__synthetic__generic": -1}, "workload.synthetic.generic", ">= 0"),
        ({"workload__synthetic__tokens": 10**10}, "workload.synthetic.tokens", "memory budget"),
        ({"workload__synthetic__top_k": 3}, "workload.synthetic.top_k", "disagrees"),
        ({"workload__evaluation": {"synthetic": {"experts": 8}}}, "workload.evaluation.synthetic.experts", "disagrees"),
        ({"cluster__gpus": 3.9}, "cluster.gpus", "expected an integer, found 3.9"),
        ({"cluster__gpus": "3"}, "cluster.gpus", "expected an integer, found '3'"),
        ({"cluster__inter_node_weight": math.inf}, "cluster.inter_node_weight", "finite"),
        ({"cluster__token_home": "moon"}, "cluster.token_home", "expected one of"),
        ({"cluster__token_home": "trace"}, "cluster.token_home", "synthetic workload"),
        ({"profile": {"variability": 1.5}}, "profile.variability", "< 1"),
        ({"executor": {"workers": 0}}, "executor.workers", ">= 1"),
        ({"method": {"name": "greedy", "replicas": -3}}, "method.replicas", ">= 0"),
        ({"method": {"name": "gem", "steps": -1}}, "method.steps", ">= 0"),
        ({"method": {"name": "gem", "starts": 0}}, "method.starts", ">= 1"),
        ({"method": {"name": "gesr", "lam": math.nan}}, "method.lam", "finite"),
        ({"method": {"name": "hypergraph", "runs": 0}}, "method.runs", ">= 1"),
        ({"method": {"name": "metis", "ufactor": -1}}, "method.ufactor", ">= 0"),
        ({"method": {"name": "hypergraph", "preset": 5}}, "method.preset", "expected a string"),
        ({"method": {"name": "greedy", "replicas": 2.0}}, "method.replicas", "expected an integer"),
    ],
)
def test_invalid_instance_fields(changes, field, message, tmp_path, capsys):
    """Each invalid instance value: exit 2, one line 'file: field: ...', no plan written."""
    inst = instance(tmp_path, **changes)
    out = tmp_path / "plan.json"
    one_error(["solve", str(inst), "--quiet", "--output", str(out)], capsys, f"{inst}: {field}:", message)
    assert not out.exists()


def test_latin1_yaml(tmp_path, capsys):
    """A Latin-1 instance names the file and the offending byte."""
    path = tmp_path / "latin.yaml"
    path.write_bytes(yaml.safe_dump({**BASE, "name": "tiny\u00e9"}, allow_unicode=True).encode("latin-1"))
    one_error(["solve", str(path)], capsys, str(path), "expected UTF-8 text, found byte 0xe9")


def test_deeply_nested_yaml(tmp_path, capsys):
    """Nesting beyond MAX_NESTING is refused before validation recurses."""
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    one_error(["solve", str(path)], capsys, str(path), "nested")
    assert nesting([[[1]]]) == 3 and nesting({"a": 1}) == 1 and nesting(3) == 0
    assert nesting(json.loads("[" * 100 + "]" * 100)) > MAX_NESTING


def test_method_override_keeps_strictness(tmp_path, capsys):
    """A valid instance solves; --method drops the other method's parameters, as before."""
    inst = instance(tmp_path, method={"name": "gem", "starts": 2})
    code, err = run(["solve", str(inst), "--method", "linear", "--quiet"], capsys)
    assert code == 0, err


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "argv, option",
    [
        (["--seed", "-1"], "--seed"),
        (["--seed", "1.5"], "--seed"),
        (["--time-limit", "nan"], "--time-limit"),
        (["--time-limit", "-1"], "--time-limit"),
        (["--time-limit", "0"], "--time-limit"),
        (["--time-limit", "inf"], "--time-limit"),
        (["--layer-time-limit", "0"], "--layer-time-limit"),
        (["--layer-time-limit", "nan"], "--layer-time-limit"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_numeric_options(argv, option, tmp_path, capsys):
    """Out-of-range numeric options: one argparse line naming the option."""
    inst = instance(tmp_path)
    one_error(["solve", str(inst), *argv], capsys, "moeopt solve: argument", option)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--experts", "0"], "--experts"),
        (["--layer-dependency", "2"], "--layer-dependency"),
        (["--layer-dependency", "nan"], "--layer-dependency"),
        (["--structure-seed", "-1"], "--structure-seed"),
    ],
)
def test_trace_synth_options(argv, option, tmp_path, capsys):
    """trace synth names the option (never '--.field')."""
    out = tmp_path / "t.npz"
    err = one_error(["trace", "synth", *argv, "--output", str(out)], capsys, "moeopt trace synth: argument", option)
    assert "--." not in err and not out.exists()


def test_trace_synth_checked_fields_name_the_option(tmp_path, capsys):
    """Cross-field and size checks of trace synth name the CLI option."""
    out = tmp_path / "t.npz"
    one_error(["trace", "synth", "--tokens", "10000000000", "--output", str(out)], capsys, "--tokens:", "budget")
    one_error(["trace", "synth", "--families", "a,a", "--output", str(out)], capsys, "--families:", "distinct")
    one_error(["trace", "synth", "--top-k", "9", "--experts", "4", "--output", str(out)], capsys, "--top-k:", "at most")
    assert not out.exists()


# ----------------------------------------------------------------------------- outputs
def test_output_directory_is_refused(tmp_path, capsys):
    """--output naming a directory: one line naming the option, before any solve."""
    inst = instance(tmp_path)
    (tmp_path / "d").mkdir()
    one_error(["solve", str(inst), "--output", str(tmp_path / "d")], capsys, "--output:", "found a directory")


def test_output_path_ending_in_a_slash_is_refused(tmp_path, capsys):
    """--plot DIR/ (a folder that does not exist yet) is not written as a file named DIR."""
    inst = instance(tmp_path)
    one_error(["solve", str(inst), "--plot", str(tmp_path / "figs") + "/"], capsys, "--plot:", "directory path")
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("budget", ["abc", "0", "-5"])
def test_bad_memory_budget_is_one_line(tmp_path, capsys, monkeypatch, budget):
    """A malformed MOEOPT_MEMORY_BUDGET names the variable, in one line, with no output."""
    monkeypatch.setenv("MOEOPT_MEMORY_BUDGET", budget)
    inst = instance(tmp_path)
    one_error(
        ["solve", str(inst), "--output", str(tmp_path / "p.json")], capsys, "MOEOPT_MEMORY_BUDGET:", "positive integer"
    )
    assert not (tmp_path / "p.json").exists()


def test_output_fifo_and_device_are_refused(tmp_path, capsys):
    """A FIFO or /dev/null as --output is refused, never replaced."""
    inst = instance(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_error(["solve", str(inst), "--output", str(fifo)], capsys, "--output:", "found a FIFO")
    assert fifo.is_fifo()
    one_error(["solve", str(inst), "--report", os.devnull], capsys, "--report:", "found a device")


def test_unwritable_report_leaves_no_plan(tmp_path, capsys):
    """A report that cannot be written: neither the plan nor temporary files are left."""
    inst = instance(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "plan.json"
    one_error(
        ["solve", str(inst), "--output", str(out), "--report", str(tmp_path / "afile" / "r.json")],
        capsys,
        "--report:",
        "Not a directory",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "inst.yaml"]


def test_all_or_none_on_a_late_failure(tmp_path, capsys, monkeypatch):
    """When the second write fails after the first succeeded, the first is not renamed."""
    import moeopt.cli.reports as cli  # where --report is written

    inst = instance(tmp_path)
    out, report = tmp_path / "plan.json", tmp_path / "r.json"

    def broken(*args, **kwargs):
        raise InputError(str(report), None, "cannot be written (disk full)")

    monkeypatch.setattr(cli, "write_json", broken)
    argv = ["solve", str(inst), "--quiet", "--output", str(out), "--report", str(report)]
    one_error(argv, capsys, str(report), "disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inst.yaml"]


def test_symlink_output_writes_its_target(tmp_path, capsys):
    """A symlink given as --output stays a symlink; the file it points to is written."""
    inst = instance(tmp_path)
    link, target = tmp_path / "link.json", tmp_path / "target.json"
    link.symlink_to(target)
    code, err = run(["solve", str(inst), "--quiet", "--output", str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and json.loads(target.read_text())["format"] == "moeopt.plan/2"


# ----------------------------------------------------------------------------- traces and counts
def _trace_instance(tmp_path: Path, path: Path) -> Path:
    return instance(tmp_path, workload={"calibration": path.name})


@pytest.mark.parametrize(
    "arrays, field, message",
    [
        ({"topk": np.array([[[0, 1]], [[2, "x"]], [[1, 3]]], dtype=object)}, "topk", "plain numeric array"),
        ({"topk": np.array([[[0, 0]], [[2, 3]], [[1, 3]]], dtype=np.int16)}, "topk", "distinct experts"),
        ({"topk": np.zeros((0, 1, 2), np.int16)}, "topk", "at least one token"),
        ({"home": np.array([0, 5, 0], np.int32)}, "home", "expected GPU ids in [0, 1]"),
        ({"weights": np.full((3, 1, 2), np.nan)}, "weights", "finite"),
        ({"num_experts": np.array([4, 4])}, "num_experts", "expected an integer"),
        ({"num_experts": np.array(10**6)}, "num_experts", "memory budget"),
    ],
)
def test_invalid_traces(arrays, field, message, tmp_path, capsys):
    """A trace with an invalid array: one line naming the trace file and the array."""
    path = trace(tmp_path, **arrays)
    inst = _trace_instance(tmp_path, path)
    one_error(["solve", str(inst), "--quiet"], capsys, f"{path}: {field}:", message)


def test_all_zero_counts(tmp_path, capsys):
    """Counts with a layer of zeros are refused (they would score nothing)."""
    path = tmp_path / "c.npz"
    np.savez(path, counts=np.zeros((1, 4)), top_k=np.array(2))
    inst = _trace_instance(tmp_path, path)
    one_error(["solve", str(inst), "--quiet"], capsys, f"{path}: counts:", "layer of zeros")


def test_evaluate_trace_with_other_top_k(tmp_path, capsys):
    """evaluate --trace refuses top-3 routing on a top-2 instance, as solve does."""
    inst = instance(tmp_path)
    p = plan(tmp_path)
    t = trace(tmp_path, "t3.npz", topk=np.array([[[0, 1, 2]], [[2, 3, 1]], [[1, 3, 0]]], dtype=np.int16))
    one_error(["evaluate", str(inst), str(p), "--trace", str(t)], capsys, f"{t}: topk:", "top-3")


def test_evaluate_trace_homes_checked(tmp_path, capsys):
    """evaluate --trace checks token homes against the cluster."""
    inst = instance(tmp_path)
    p = plan(tmp_path)
    t = trace(tmp_path, "t.npz", home=np.array([0, 7, 0], np.int32))
    one_error(["evaluate", str(inst), str(p), "--trace", str(t)], capsys, f"{t}: home:", "[0, 1]")


# ----------------------------------------------------------------------------- plans
@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"gpus": "four"}, "gpus", "expected an integer, found 'four'"),
        ({"gpus": 2.0}, "gpus", "expected an integer"),
        ({"experts": 10**12}, "experts", "memory budget"),
        ({"slots": [[[0, 1], [2, 3.9]]]}, "slots[0][1][1]", "expected an integer, found 3.9"),
        ({"slots": [[[0, 1], [2, "3"]]]}, "slots[0][1][1]", "expected an integer, found '3'"),
        ({"params": []}, "params", "expected a mapping"),
    ],
)
def test_invalid_plan_fields(changes, field, message, tmp_path, capsys):
    """Plan JSON with wrong types: one line naming the plan and the field."""
    inst = instance(tmp_path)
    p = plan(tmp_path, **changes)
    one_error(["evaluate", str(inst), str(p)], capsys, f"{p}: {field}:", message)


@pytest.mark.parametrize("gpu_slot_value", [99, -2])
def test_export_refuses_bad_ids(gpu_slot_value, tmp_path, capsys):
    """export refuses a plan holding an expert id out of range (evaluate does too)."""
    p = plan(tmp_path, slots=[[[0, 1], [2, gpu_slot_value]]])
    out = tmp_path / "e.npz"
    one_error(["export", str(p), "--format", "eplb", "--output", str(out)], capsys, str(p), "")
    assert not out.exists()


def test_hint_over_capacity_is_refused(tmp_path, capsys):
    """A --hint wider than the cluster's slots, or with an id out of range, is refused."""
    inst = instance(tmp_path)
    wide = plan(tmp_path, slots_per_gpu=3, slots=[[[0, 1, -1], [2, 3, 0]]])
    one_error(["solve", str(inst), "--method", "greedy", "--hint", str(wide)], capsys, str(wide), "")
    bad = plan(tmp_path, slots=[[[0, 1], [2, 99]]])
    one_error(["solve", str(inst), "--method", "greedy", "--hint", str(bad)], capsys, str(bad), "99")


def test_deep_json_plan(tmp_path, capsys):
    """A deeply nested plan JSON is one line, not a RecursionError."""
    p = tmp_path / "deep.json"
    p.write_text("[" * 100000 + "]" * 100000)
    one_error(["evaluate", str(instance(tmp_path)), str(p)], capsys, str(p), "nested")


# ----------------------------------------------------------------------------- pieces
def test_ansi_codes_are_stripped():
    """Error lines never carry escape sequences or line breaks."""
    assert one_line("bad \x1b[31mred\x1b[0m\nvalue\x07") == "bad red value"


def test_input_error_first_error_only():
    """The mapping of a ValidationError: first error, dotted field, expected and found."""
    from pydantic import ValidationError

    try:
        SynthSchema.model_validate({"tokens": 0, "skew": "x"})
    except ValidationError as exc:
        err = input_error(exc, "f.yaml", "workload.synthetic", SynthSchema)
    assert str(err) == "f.yaml: workload.synthetic.tokens: expected a value >= 1, found 0"
    try:
        SynthSchema.model_validate({"colour": 1})
    except ValidationError as exc:
        err = input_error(exc, "f.yaml", "workload.synthetic", SynthSchema)
    assert err.field == "workload.synthetic.colour" and "accepted: burst" in err.message


def test_check_topk_rules():
    """check_topk: integer dtype, 3-D, in range, distinct per row."""
    check_topk(np.array([[[0, 1]]]), "t", 2)
    for bad in (np.array([[[0.0, 1.0]]]), np.array([[0, 1]]), np.array([[[0, 2]]]), np.array([[[1, 1]]])):
        with pytest.raises(InputError):
            check_topk(bad, "t", 2)


def test_param_metadata_allows_inf_where_declared():
    """eps_load: .inf (off) stays accepted; NaN and negatives do not."""
    tacg = get_method("tacg")
    assert parse_params(tacg, {"eps_load": math.inf}).eps_load == math.inf
    for bad in (math.nan, -0.5, "0.1"):
        with pytest.raises(InputError):
            parse_params(tacg, {"eps_load": bad})


@pytest.mark.parametrize("gpu", [99, -1])
def test_export_refuses_v1_gpu_out_of_range(gpu, tmp_path, capsys):
    """export of a first-release plan whose placement names GPU 99 or -1: one line, no file."""
    p = tmp_path / "v1.json"
    p.write_text(
        json.dumps({"format": "moeopt.plan/1", "gpus": 2, "layers": 1, "experts": 4, "placement": [[0, 0, 1, gpu]]})
    )
    out = tmp_path / "e.npz"
    one_error(["export", str(p), "--format", "eplb", "--output", str(out)], capsys, f"{p}: placement:", "[0, 1]")
    assert not out.exists()


@pytest.mark.parametrize(
    ("method", "field"),
    [
        ("joint", "evaluations"),
        ("joint", "candidates"),
        ("joint", "sample_tokens"),
        ("joint", "bound_rounds"),
        ("balance", "polish_slots"),
        ("balance", "tp_size"),
        ("gesr", "copies_each"),
        ("crosslayer", "bound_rounds"),
    ],
)
@pytest.mark.parametrize("value", [0, -3])
def test_count_params_state_their_range(method, field, value):
    """A count that must be at least 1: the error says ">= 1" (not the numbers' default ">= 0")
    for 0 and for a negative value alike, from the schema, before the method's own check."""
    with pytest.raises(InputError) as err:
        parse_params(get_method(method), {field: value})
    assert f"method.{field}: expected a value >= 1, found {value}" in str(err.value)
