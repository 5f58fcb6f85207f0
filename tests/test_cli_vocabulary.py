"""One command-line vocabulary: help on every flag and command, -o/--output, --report and --json,
--quiet/--verbose everywhere, the two time limits, --version and the version in every report."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from moeopt import version as moeopt_version
from moeopt.cli import build_parser, main
from tests.conftest import DATA, INSTANCES, ROOT

QUICKSTART = INSTANCES / "quickstart.yaml"
FOUR = DATA / "four_layers.yaml"

#: hidden options kept for old command lines (help suppressed on purpose), by command
DEPRECATED = {"frontier": {"--output-dir"}}
#: commands that write no file of their own (their result is stdout, or a report) and need no -o
NO_ARTIFACT = {"evaluate", "compare", "methods", "trace stats", "validate", "replay"}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.ArgumentParser, str]]:
    """Every leaf command of ``parser`` as (name, its parser, its help in the listing)."""
    out = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            full = f"{prefix}{name}"
            nested = _commands(sub, full + " ")
            out += nested or [(full, sub, helps.get(name))]
            if nested:  # a group of commands (trace) needs its own line in the listing too
                out.append((full, None, helps.get(name)))
    return out


COMMANDS = _commands(build_parser())
LEAVES = [(name, sub) for name, sub, _ in COMMANDS if sub is not None]


def _options(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in sub._actions for s in a.option_strings}


def test_the_parser_walk_finds_every_command():
    """The walk reaches every command (nested trace commands included): the checks below see them all."""
    names = {name for name, _ in LEAVES}
    assert {"solve", "evaluate", "compare", "frontier", "methods", "replay", "plot", "export", "import"} <= names
    assert {"trace synth", "trace stats", "trace stream", "trace import", "profile", "validate"} <= names


@pytest.mark.parametrize("name,sub,listed", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_and_flag_has_help(name, sub, listed):
    """A command without a line in the listing, or a flag or argument without help text, fails."""
    assert listed and listed.strip(), f"moeopt {name}: no help line in the command listing"
    if sub is None:
        return
    hidden = DEPRECATED.get(name, set())
    for action in sub._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        label = "/".join(action.option_strings) or action.dest
        if action.help == argparse.SUPPRESS:
            assert set(action.option_strings) <= hidden, f"moeopt {name} {label}: hidden without being deprecated"
            continue
        assert action.help and action.help.strip(), f"moeopt {name} {label}: no help text"


@pytest.mark.parametrize("name,sub", LEAVES, ids=[c[0] for c in LEAVES])
def test_one_vocabulary_on_every_command(name, sub):
    """--quiet and --verbose everywhere; the main artifact is -o/--output; --json beside every --report."""
    opts = _options(sub)
    assert "--quiet" in opts and "--verbose" in opts, f"moeopt {name}: --quiet / --verbose missing"
    if "--output" in opts or name not in NO_ARTIFACT:
        assert opts["-o"] is opts["--output"], f"moeopt {name}: the main output is not -o/--output"
    if "--report" in opts:
        assert "--json" in opts, f"moeopt {name}: --report without --json"
    if "--time-limit" in opts:  # the total beside the per-layer limit, never alone
        assert "--layer-time-limit" in opts
    assert not any(o.startswith("--output-") for o in opts if o not in DEPRECATED.get(name, set()))


def test_version_is_the_package_metadata(capsys):
    """``moeopt --version`` and ``python -m moeopt --version`` print the installed version."""
    expected = f"moeopt {version('moeopt')}"
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == expected
    out = subprocess.run(
        [sys.executable, "-m", "moeopt", "--version"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == expected


def _git_head() -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", str(QUICKSTART), "--method", "greedy"],
        ["evaluate", str(QUICKSTART), "PLAN"],
        ["compare", str(QUICKSTART), "--methods", "linear,greedy"],
        ["methods"],
        ["trace", "stats", str(INSTANCES / "traces" / "quickstart-calib.npz")],
    ],
    ids=["solve", "evaluate", "compare", "methods", "trace-stats"],
)
def test_json_prints_the_report_alone(tmp_path, capsys, argv):
    """--json: stdout is the JSON report alone, equal to what --report writes; it carries the
    package version and, in a git checkout, the commit."""
    plan = tmp_path / "plan.json"
    assert main(["solve", str(QUICKSTART), "--method", "greedy", "--quiet", "-o", str(plan)]) == 0
    capsys.readouterr()
    argv = [str(plan) if a == "PLAN" else a for a in argv]
    report = tmp_path / "report.json"
    assert main([*argv, "--json", "--report", str(report)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # the whole of stdout is one JSON document
    assert printed == json.loads(report.read_text())
    assert printed["moeopt_version"] == version("moeopt")
    head = _git_head()
    if head is not None:
        assert printed["git_commit"].removesuffix("+dirty") == head
    assert main([*argv, "--quiet"]) == 0  # without --json: the tables, not JSON
    with pytest.raises(json.JSONDecodeError):
        json.loads(capsys.readouterr().out)


def test_commit_is_absent_outside_a_checkout(tmp_path, monkeypatch):
    """Run from elsewhere than a git checkout, a report has the version and no commit (no error)."""
    monkeypatch.setattr(moeopt_version, "ROOT", tmp_path)
    moeopt_version.git_commit.cache_clear()
    try:
        assert moeopt_version.git_commit() is None
        meta = moeopt_version.provenance()
        assert meta == {"moeopt_version": version("moeopt")}
    finally:
        moeopt_version.git_commit.cache_clear()


def test_frontier_writes_into_output_and_keeps_the_old_spelling(tmp_path, capsys):
    """frontier -o DIR writes STEM.json (the --json report), .md and .png; --output-dir still works, with a note."""
    base = ["frontier", str(QUICKSTART), "--methods", "greedy", "--eps", "0.1", "--name", "f"]
    assert main([*base, "-o", str(tmp_path / "new"), "--json"]) == 0
    captured = capsys.readouterr()
    written = json.loads((tmp_path / "new" / "f.json").read_text())
    assert json.loads(captured.out) == written and written["points"]
    assert {p.name for p in (tmp_path / "new").iterdir()} == {"f.json", "f.md", "f.png"}
    assert "wrote" in captured.err  # the wrote line leaves stdout to the report
    assert main([*base, "--output-dir", str(tmp_path / "old")]) == 0
    assert "--output-dir is deprecated: use -o/--output" in capsys.readouterr().err
    assert (tmp_path / "old" / "f.json").exists()
    assert main([*base, "-o", str(tmp_path / "a"), "--output-dir", str(tmp_path / "b")]) == 2
    assert "expected one of them, got both" in capsys.readouterr().err


def test_the_two_time_limits_reach_every_layer(tmp_path, capsys):
    """--layer-time-limit caps each layer; --time-limit is the run's total, shared over its layers."""
    assert (
        main(["solve", str(FOUR), "--method", "greedy", "--json", "--time-limit", "60", "--layer-time-limit", "0.5"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["layer_time_limits"] == [0.5] * 4
    assert main(["solve", str(FOUR), "--method", "greedy", "--json", "--time-limit", "2"]) == 0
    limits = json.loads(capsys.readouterr().out)["stats"]["layer_time_limits"]
    # layer l gets at most what is left over the 4 - l layers still to plan; what a fast layer leaves
    # goes to the layers after it
    assert len(limits) == 4 and all(0 < x * (4 - l) <= 2.0 for l, x in enumerate(limits))
    assert limits == sorted(limits) and limits[-1] > limits[0]


def test_compare_shares_the_total_over_its_methods(capsys):
    """compare --time-limit S: the first of two methods has at most S / 2, shared over its 4 layers."""
    argv = ["compare", str(FOUR), "--methods", "greedy,gem", "--json", "--time-limit", "4"]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    first, second = (r["stats"]["layer_time_limits"] for r in results)
    assert 0 < first[0] <= 4 / 2 / 4  # greedy: half of what was left, a quarter of that per layer
    assert second[0] > first[0]  # gem gets what greedy left unused


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_a_bad_limit_in_the_instance_names_its_field(tmp_path, capsys, value):
    """method.time_limit / method.layer_time_limit in the YAML: one line naming the field, exit 2."""
    text = Path(FOUR).read_text().replace("method: {name: greedy}", f"method: {{name: greedy, time_limit: {value}}}")
    path = tmp_path / "inst.yaml"
    path.write_text(text)
    assert main(["solve", str(path), "--quiet"]) == 2
    assert "method.time_limit" in capsys.readouterr().err
