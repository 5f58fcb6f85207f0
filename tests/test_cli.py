"""Command line: round trips, tables, and one clear line (exit 2) for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from moeopt.cli import main
from moeopt.io import read_plan, read_trace
from tests.conftest import DATA, ROOT

BAD = [
    ("invalid_missing_trace.yaml", "no-such-trace.npz: file not found"),
    ("invalid_capacity.yaml", "2 GPUs x 3 slots = 6 slots < 8 experts; set cluster.slots_per_gpu >= 4"),
    ("invalid_unknown_method.yaml", "method.name: unknown method 'magic'"),
    ("invalid_unknown_param.yaml", "method.colour: unknown parameter for method 'greedy'"),
    ("invalid_param_type.yaml", "method.replicas: expected an integer"),
    ("invalid_gpus.yaml", "cluster.gpus: expected an integer, found 'four'"),
    ("invalid_gpus_per_node.yaml", "cluster.gpus_per_node: expected a divisor of gpus=4, found 3"),
    ("invalid_unknown_field.yaml", "cluster.gpu: unknown field"),
    ("invalid_top_k.yaml", "model.top_k: expected at most experts=8, found 9"),
    ("invalid_trace_shape.yaml", "bad-shape.npz: topk: expected shape [tokens, layers, k]"),
    ("invalid_expert_id.yaml", "bad-expert-id.npz: topk: expected expert ids in [0, 7], found 9"),
    ("invalid_family.yaml", "bad-family.npz: family: family id 3 has no entry in family_names"),
    ("invalid_nan_counts.yaml", "nan-counts.json: counts: contains NaN"),
    ("invalid_negative_counts.yaml", "negative-counts.csv: counts: contains negative counts"),
    ("invalid_layers.yaml", "tiny-trace.npz: layers: workload has 2 layers, model.layers is 3"),
    ("invalid_not_npz.yaml", "not-an-npz.npz: not an npz archive (a zip of .npy arrays)"),
    ("invalid_yaml_syntax.yaml", "invalid_yaml_syntax.yaml: not valid YAML"),
    ("invalid_missing_model.yaml", "model: required field is missing"),
    ("invalid_needs_trace.yaml", "needs a token trace (coactivation); this workload is count-only"),
]


@pytest.mark.parametrize("name,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_clear_line(name, message, tmp_path, capsys):
    """Each bad input: exit 2, one line on stderr naming file and field, no output file left."""
    out = tmp_path / "plan.json"
    code = main(["solve", str(DATA / name), "--quiet", "--output", str(out), "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message in err
    assert not list(tmp_path.iterdir())


def test_no_traceback_from_the_real_entry_point(tmp_path):
    """``python -m moeopt`` on a bad file prints one line, not a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "moeopt", "solve", str(DATA / "invalid_expert_id.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_missing_instance_file(capsys):
    """A missing instance file names the file."""
    assert main(["solve", "nope.yaml"]) == 2
    assert "nope.yaml: file not found" in capsys.readouterr().err


def test_solve_then_evaluate_round_trip(quickstart_path, tmp_path, capsys):
    """Plan and report written by solve re-evaluate to the same metrics."""
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "report.json"
    assert (
        main(["solve", str(quickstart_path), "--quiet", "--output", str(plan_path), "--report", str(report_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "Jain fairness" in out and "linear" in out
    report = json.loads(report_path.read_text())
    for key in ("comm_per_token", "comm_reduction_vs_linear", "jain", "maxvio"):
        assert key in report["metrics"]
    for key in ("status", "objective", "bound", "gap", "wall_time"):
        assert key in report
    plan_json = json.loads(plan_path.read_text())
    assert plan_json["format"] == "moeopt.plan/2" and plan_json["gpus"] == 4
    assert np.array(plan_json["slots"]).shape == (2, 4, 4) and plan_json["dispatch"] == {"kind": "even"}
    r2 = tmp_path / "eval.json"
    assert main(["evaluate", str(quickstart_path), str(plan_path), "--report", str(r2)]) == 0
    again = json.loads(r2.read_text())["metrics"]
    assert again == report["metrics"]


def test_method_override_keeps_accepted_params(tmp_path):
    """--method replaces the name; parameters the new method does not accept are dropped."""
    report = tmp_path / "r.json"
    inst = tmp_path / "i.yaml"
    inst.write_text(
        (DATA / "tiny.yaml")
        .read_text()
        .replace("{name: linear}", "{name: greedy, replicate: true}")
        .replace("tiny-trace.npz", str(DATA / "tiny-trace.npz"))
    )
    assert main(["solve", str(inst), "--method", "random", "--quiet", "--report", str(report)]) == 0
    assert json.loads(report.read_text())["method"] == "random"


def test_compare_table(capsys):
    """compare prints one table with a column per method."""
    assert main(["compare", str(DATA / "tiny.yaml"), "--methods", "linear,random,greedy", "--quiet"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert all(name in header for name in ("linear", "random", "greedy"))
    assert "wall time" in out


def test_counts_only_instance(capsys):
    """A count-only workload solves with count-based methods; communication shows as '-'."""
    assert main(["solve", str(DATA / "counts.yaml"), "--quiet"]) == 0
    assert "MaxVio" in capsys.readouterr().out


def test_methods_lists_baselines(capsys):
    """methods lists every registered method with its availability."""
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("linear", "random", "greedy"):
        assert any(line.startswith(name) and " yes " in line for line in out.splitlines())


def test_trace_synth_and_stats(tmp_path, capsys):
    """trace synth writes a readable trace; trace stats summarizes it; OOD has one family."""
    path = tmp_path / "t.npz"
    assert (
        main(
            [
                "trace",
                "synth",
                "--experts",
                "8",
                "--top-k",
                "2",
                "--tokens",
                "500",
                "--family",
                "math",
                "--output",
                str(path),
                "--quiet",
            ]
        )
        == 0
    )
    tr = read_trace(path)
    assert tr.tokens == 500 and tr.num_experts == 8
    assert set(np.unique(tr.family)) == {tr.family_names.index("math")}
    assert main(["trace", "stats", str(path)]) == 0
    assert "math 100.0 %" in capsys.readouterr().out


def test_evaluate_rejects_wrong_plan(tmp_path, capsys, quickstart_path):
    """A plan for another cluster size is refused with one line."""
    plan = tmp_path / "p.json"
    plan.write_text(
        json.dumps(
            {"format": "moeopt.plan/1", "gpus": 2, "layers": 2, "experts": 16, "placement": [[0] * 8 + [1] * 8] * 2}
        )
    )
    assert main(["evaluate", str(quickstart_path), str(plan)]) == 2
    assert "plan is for 2 GPUs" in capsys.readouterr().err
    assert read_plan(plan).gpus == 2


def test_solve_accepts_hint(quickstart_path, tmp_path):
    """--hint reads a plan file and passes it on; a hint for another cluster is refused."""
    plan = tmp_path / "p.json"
    assert main(["solve", str(quickstart_path), "--quiet", "--output", str(plan)]) == 0
    assert main(["solve", str(quickstart_path), "--quiet", "--hint", str(plan)]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(plan.read_text().replace('"gpus": 4', '"gpus": 2'))
    assert main(["solve", str(quickstart_path), "--quiet", "--hint", str(bad)]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", "x.yaml", "--dispatch", "fastest"],
        ["solve", "x.yaml", "--workers", "-1"],
        ["evaluate", "x.yaml"],
        ["trace", "synth", "--layers", "two", "--output", "t.npz"],
    ],
)
def test_usage_errors_are_one_line(argv, capsys):
    """Bad command-line options exit 2 with one line naming the command and the option."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: moeopt ")
