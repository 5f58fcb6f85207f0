"""The one scorer: solve and evaluate agree exactly, for every registered method."""

from __future__ import annotations

import json

import pytest

from moeopt.cli import main
from moeopt.registry import get_method, method_names
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
