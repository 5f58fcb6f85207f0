"""Command line: round trips, tables, and one clear line (exit 2) for every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

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
    ("invalid_yaml_aliases.yaml", "invalid_yaml_aliases.yaml: expected aliases (*name) that add at most"),
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
    # --json: the same summary as data, each figure recomputed here from the trace itself
    assert main(["trace", "stats", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["kind"], report["tokens"], report["experts"], report["top_k"]) == ("trace", 500, 8, 2)
    assert report["families"]["math"] == 1.0
    for l, row in enumerate(report["per_layer"]):
        load = np.bincount(tr.topk[:, l, :].reshape(-1), minlength=8).astype(float)
        assert row["busiest_over_mean"] == pytest.approx(load.max() / load.mean())
        assert row["idlest_over_mean"] == pytest.approx(load.min() / load.mean())
        together = np.zeros((8, 8), dtype=bool)
        a, b = tr.topk[:, l, 0], tr.topk[:, l, 1]
        together[a, b] = together[b, a] = True
        assert row["coactivation_density"] == pytest.approx(together.mean())


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


# ----------------------------------------------------------------------------- issue 42: bad input, one line
def _one_line(capsys, argv: list[str]) -> str:
    """Run ``argv`` in-process; assert exit 2 and exactly one ``error:`` line; return it."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A folder (the working directory) with an instance naming its calibration trace, a plan
    solved for it and a count-only instance."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calib.npz").write_bytes((DATA / "tiny-trace.npz").read_bytes())
    (tmp_path / "inst.yaml").write_text((DATA / "tiny.yaml").read_text().replace("tiny-trace.npz", "calib.npz"))
    (tmp_path / "good-counts.csv").write_bytes((DATA / "good-counts.csv").read_bytes())
    (tmp_path / "counts.yaml").write_text((DATA / "counts.yaml").read_text())
    assert main(["solve", "inst.yaml", "--quiet", "--output", "plan.json"]) == 0
    return tmp_path


#: (argv, the file that must keep its bytes, what the line says): outputs onto the run's inputs
OVERWRITES = [
    (["solve", "inst.yaml", "--output", "inst.yaml"], "inst.yaml", "--output: inst.yaml: expected a new file"),
    (["solve", "inst.yaml", "--output", "calib.npz"], "calib.npz", "(workload.calibration of inst.yaml)"),
    (["solve", "inst.yaml", "--report", "inst.yaml"], "inst.yaml", "input of this run (the instance)"),
    (["solve", "inst.yaml", "--report", "./inst.yaml"], "inst.yaml", "input of this run (the instance)"),
    (["solve", "inst.yaml", "--report", "link.yaml"], "inst.yaml", "input of this run (the instance)"),
    (["solve", "inst.yaml", "--hint", "plan.json", "--output", "plan.json"], "plan.json", "(--hint)"),
    (["evaluate", "inst.yaml", "plan.json", "--report", "plan.json"], "plan.json", "input of this run (the plan)"),
    (["evaluate", "inst.yaml", "plan.json", "--report", "calib.npz"], "calib.npz", "(workload.calibration of"),
    (
        ["export", "plan.json", "--format", "sglang", "--dense-layers", "0", "--output", "plan.json"],
        "plan.json",
        "input of this run (the plan)",
    ),
    (
        ["export", "plan.json", "--format", "eplb", "--load", "calib.npz", "--output", "calib.npz"],
        "calib.npz",
        "(--load)",
    ),
    (["trace", "synth", "--output", "inst.yaml"], "inst.yaml", "--output: inst.yaml: expected an .npz output"),
    (["trace", "stats", "calib.npz", "--graphml", "calib.npz"], "calib.npz", "input of this run (the trace)"),
    (["compare", "inst.yaml", "--methods", "linear", "--report", "inst.yaml"], "inst.yaml", "(the instance)"),
    (["plot", "plan.json", "--instance", "inst.yaml", "-o", "plan.json"], "plan.json", "--output: plan.json"),
    (
        ["frontier", "inst.yaml", "--methods", "greedy", "-o", "fr", "--name", "../escaped"],
        "inst.yaml",
        "--name: expected a file stem inside -o/--output (no folder), got '../escaped'",
    ),
    (["frontier", "inst.yaml", "--methods", "greedy", "--name", "x"], "inst.yaml", "--name: names the files"),
]


@pytest.mark.parametrize("argv,kept,message", OVERWRITES, ids=[" ".join(o[0][:2] + o[0][-2:]) for o in OVERWRITES])
def test_outputs_never_overwrite_inputs(work, capsys, argv, kept, message):
    """An output naming one of the run's inputs (as given, ./x, a symlink) or a path outside
    frontier -o/--output: exit 2, one line naming the option, the input's bytes unchanged, nothing written."""
    (work / "link.yaml").symlink_to("inst.yaml")
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    err = _one_line(capsys, argv)
    assert message in err
    assert (work / kept).read_bytes() == before[kept]
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before
    assert not (work / "fr").exists() and not (work.parent / "escaped.json").exists()


def test_hard_link_to_an_input_is_refused_at_write_time(work):
    """Inside a command, a file a reader opened is never written: another name of it (a hard
    link: the same device and inode) is refused when the writer opens it, nothing is written."""
    from moeopt.errors import InputError
    from moeopt.io import read_plan, write_json
    from moeopt.outputs import all_or_none

    os.link(work / "plan.json", work / "same.json")
    before = (work / "plan.json").read_bytes()
    with pytest.raises(InputError, match="expected a new file, found an input of this run"):
        with all_or_none():
            read_plan(work / "plan.json")
            write_json(work / "same.json", {"x": 1})
    assert (work / "plan.json").read_bytes() == before
    write_json(work / "same.json", {"x": 1})  # outside a command nothing is recorded: written
    assert json.loads((work / "same.json").read_text()) == {"x": 1}


def test_yaml_aliases_are_bounded_before_expansion(capsys):
    """A 661-byte YAML whose nested anchors expand to 4.8 million nodes fails in one line at
    once (it took 39 s and 2.6 GB when the schema expanded every alias); a document of 10**40
    expanded nodes is refused as fast (the check counts shared nodes once)."""
    import yaml

    from moeopt.io.files import YamlAliasError, check_aliases

    path = DATA / "invalid_yaml_aliases.yaml"
    assert path.stat().st_size < 700
    t0 = time.perf_counter()
    err = _one_line(capsys, ["solve", str(path)])
    assert time.perf_counter() - t0 < 5.0 and "anchors repeated inside anchors" in err
    doc = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 40)
    )
    t0 = time.perf_counter()
    with pytest.raises(YamlAliasError):
        check_aliases(yaml.compose(doc, Loader=yaml.SafeLoader))
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(YamlAliasError, match="recursive alias"):
        check_aliases(yaml.compose("a: &a [1, *a]\n", Loader=yaml.SafeLoader))
    check_aliases(yaml.compose("a: &a [1, 2]\nb: *a\nc: *a\n", Loader=yaml.SafeLoader))  # a few aliases are fine


@pytest.mark.parametrize(
    "argv",
    [
        ["plot", "plan.json", "--instance", "inst.yaml", "-o", "o.txt"],
        ["solve", "inst.yaml", "--quiet", "--plot", "p.docx"],
        ["compare", "inst.yaml", "--methods", "linear", "--quiet", "--plot", "p.docx"],
        ["frontier", "inst.yaml", "--methods", "greedy", "--eps", "0.1", "--quiet", "--plot", "p.docx"],
    ],
    ids=["plot", "solve", "compare", "frontier"],
)
def test_unknown_figure_extension_is_one_line(work, capsys, argv):
    """A figure whose extension matplotlib writes no format for is refused before any work."""
    err = _one_line(capsys, argv)
    assert "expected a figure file ending in .avif, .eps" in err and "found ." in err
    assert not any(p.suffix in (".txt", ".docx") for p in work.iterdir())


def test_figures_are_written_in_their_extensions_format(work):
    """frontier --plot and -o/--output, and solve --plot, write the format the extension names."""
    assert main(["frontier", "inst.yaml", "--methods", "greedy", "--eps", "0.1", "--quiet", "--plot", "f.svg"]) == 0
    assert b"<svg" in (work / "f.svg").read_bytes()[:400]
    assert main(["solve", "inst.yaml", "--quiet", "--plot", "loads.pdf"]) == 0
    assert (work / "loads.pdf").read_bytes().startswith(b"%PDF")


def _plan_variant(work: Path, name: str, **change) -> str:
    data = json.loads((work / "plan.json").read_text())
    data.update(change)
    (work / name).write_text(json.dumps(data))
    return name


@pytest.mark.parametrize(
    "change,message",
    [
        ({"slots_per_gpu": 5}, "slots_per_gpu: expected 2 (the slots of each GPU in 'slots'), got 5"),
        ({"colour": 3}, "colour: unknown field; accepted: dispatch"),
        ({"placement": [[0, 0, 1, 1, 2, 2, 3, 3]] * 2}, "placement: not a field of moeopt.plan/2"),
        ({"dispatch": {"kind": "even", "lam": 3}}, "dispatch: field(s) lam do not apply to kind 'even'"),
    ],
    ids=["slots_per_gpu", "unknown-key", "v1-key", "dispatch-lam"],
)
def test_plan_files_are_strict(work, capsys, change, message):
    """Plan files are validated as strictly as instances: evaluate and export refuse them."""
    bad = _plan_variant(work, "bad.json", **change)
    assert message in _one_line(capsys, ["evaluate", "inst.yaml", bad])
    assert message in _one_line(capsys, ["export", bad, "--format", "eplb", "--output", "e.npz", "--quiet"])
    assert not (work / "e.npz").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["solve", "inst.yaml", "--method", ""], "--method: expected comma-separated method names, none empty"),
        (["solve", "inst.yaml", "--method", "nonexistent"], "--method: unknown method 'nonexistent'"),
        (["compare", "inst.yaml", "--methods", "linear,,greedy"], "--methods: expected comma-separated method"),
        (["compare", "inst.yaml", "--methods", "linear,nonexistent"], "error: --methods: unknown method 'nonexistent'"),
        (["compare", "inst.yaml", "--methods", "linear,linear"], "--methods: expected each method once"),
        (["frontier", "inst.yaml", "--methods", "greedy,"], "--methods: expected comma-separated method names"),
        (["frontier", "inst.yaml", "--methods", "greedy", "--eps", "0.1,"], "--eps: expected comma-separated"),
        (["solve", "inst.yaml", "--quiet", "--verbose"], "--quiet and --verbose: expected at most one"),
        (["replay", "inst.yaml", "--quiet", "--verbose"], "--quiet and --verbose: expected at most one"),
        (["trace", "stats", "calib.npz", "--select", "olmoe"], "calib.npz: select: names a model inside"),
        (["trace", "stats", "good-counts.csv", "--top-k", "2", "--select", "olmoe"], "select: names a model"),
    ],
)
def test_meaningless_options_are_refused(work, capsys, argv, message):
    """Options that mean nothing or contradict each other: exit 2, one line naming the option."""
    err = _one_line(capsys, argv)
    assert message in err and "method.name" not in err


def test_greedy_replicas_are_bounded(work, capsys):
    """greedy's replicas beyond the layer's redundant slots (G x replica_slots_per_gpu) is one line."""
    (work / "rep.yaml").write_text(
        (work / "counts.yaml")
        .read_text()
        .replace("{name: greedy}", "{name: greedy, replicate: true, replicas: 1000000000}")
    )
    err = _one_line(capsys, ["solve", "rep.yaml"])
    assert "rep.yaml: method.replicas: expected at most 0 copies per layer" in err


@pytest.mark.parametrize("method", ["balance", "greedy"])
def test_counts_whose_totals_overflow_are_refused(work, capsys, method):
    """Counts of 1e308 (their total overflows to inf; balance wrote objective, bound and gap
    NaN, greedy printed 7 warnings) give one line naming the file and field."""
    (work / "huge.csv").write_text("\n".join(",".join(["1e308"] * 8) for _ in range(2)))
    text = (work / "counts.yaml").read_text().replace("good-counts.csv", "huge.csv")
    (work / "huge.yaml").write_text(text.replace("{name: greedy}", f"{{name: {method}}}"))
    err = _one_line(capsys, ["solve", "huge.yaml", "--output", "p.json"])
    assert "huge.csv: counts: expected counts totalling at most 2**53" in err
    assert not (work / "p.json").exists()


def test_crosslayer_on_uniform_homes_says_so(work, capsys):
    """crosslayer on a token_home: uniform instance runs, and a note says its plans are made for
    previous-layer homes (the documented behaviour); --quiet keeps stderr empty."""
    from moeopt.registry import get_method

    if not get_method("crosslayer").available():
        pytest.skip("crosslayer needs Mt-KaHyPar")
    (work / "cl.yaml").write_text((work / "inst.yaml").read_text().replace("name: linear", "name: crosslayer"))
    assert main(["solve", "cl.yaml", "--layer-time-limit", "1"]) == 0
    err = capsys.readouterr().err
    assert "note: crosslayer plans for cluster.token_home: previous-layer" in err and "token_home: uniform" in err


def test_inputs_that_are_not_regular_files_say_what_they_are(work, capsys):
    """A directory, a FIFO or /dev/null as an input names what it is, not 'file not found'."""
    os.mkfifo(work / "fifo")
    (work / "adir").mkdir()
    cases = {
        "adir": "adir: is a directory, expected a file",
        "fifo": "fifo: is a FIFO (named pipe), not a regular file",
    }
    cases[os.devnull] = f"{os.devnull}: is a device, not a regular file"
    for path, message in cases.items():
        for argv in (
            ["solve", path],
            ["evaluate", "inst.yaml", path],
            ["trace", "stats", path],
            ["plot", path, "-o", "x.png"],
        ):
            err = _one_line(capsys, argv)
            assert message in err and "not found" not in err, (argv, err)
    (work / "dangling.npz").symlink_to("nowhere.npz")
    assert "dangling.npz: file not found (a symbolic link to a missing file)" in _one_line(
        capsys, ["trace", "stats", "dangling.npz"]
    )


def test_npz_that_are_not_npz_or_hold_pickles(work, capsys):
    """A garbage .npz is 'not an npz archive' and a pickled array is refused: numpy's
    allow_pickle hint (an invitation to unsafe loading) never reaches the user."""
    (work / "garbage.npz").write_bytes(bytes(range(256)) * 2)
    np.save(work / "one.npy", np.ones(3))
    (work / "one.npz").write_bytes((work / "one.npy").read_bytes())
    np.savez(work / "pickled.npz", topk=np.array([{"a": 1}], dtype=object))
    np.savez(work / "pickled-counts.npz", counts=np.array([[1, 2]], dtype=object))
    expected = {
        "garbage.npz": "garbage.npz: not an npz archive (a zip of .npy arrays): found bytes of another format",
        "one.npz": "one.npz: not an npz archive (a zip of .npy arrays): found a single .npy array",
        "pickled.npz": "pickled.npz: topk: expected a plain numeric array, found an array of Python objects",
        "pickled-counts.npz": "pickled-counts.npz: counts: expected a plain numeric array, found an array of Python",
    }
    for name, message in expected.items():
        for argv in (
            ["trace", "stats", name, "--top-k", "2"],
            ["import", name, "--format", "eplb", "--output", "p.json"],
        ):
            err = _one_line(capsys, argv)
            assert "allow_pickle" not in err, (argv, err)
            assert message in err or argv[0] == "import", (argv, err)
    assert "never loads pickles" in _one_line(capsys, ["trace", "stats", "pickled.npz"])


def test_missing_pt_is_file_not_found_even_without_torch(work, capsys, monkeypatch):
    """A missing .pt file is 'file not found' (it said 'needs torch' where torch is absent)."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    for argv in (
        ["trace", "stats", "missing.pt", "--top-k", "2"],
        ["trace", "import", "missing.pt", "--output", "t.npz"],
        ["import", "missing.pt", "--format", "eplb", "--output", "p.json"],
        ["solve", "inst.yaml", "--from", "missing.pt"],
    ):
        err = _one_line(capsys, argv)
        assert "missing.pt: file not found" in err and "torch" not in err, (argv, err)


def test_trace_stats_with_an_unwritable_graphml_prints_nothing(tmp_path, capsys):
    """A --graphml file that cannot be written: exit 2, one line naming it, nothing on stdout
    (the summary and the --json report come after the file)."""
    trace = ROOT / "instances" / "traces" / "quickstart-calib.npz"
    target = tmp_path / "file"
    target.write_text("")
    bad = str(target / "x.graphml")  # under a file: no directory can hold it
    for extra in ([], ["--json"]):
        try:
            code = main(["trace", "stats", str(trace), "--graphml", bad, *extra])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1 and "x.graphml" in err
