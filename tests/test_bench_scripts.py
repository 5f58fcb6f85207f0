"""How the benchmark scripts end and read their arguments (benchmarks/machine_info.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from machine_info import run_script, workers_arg  # noqa: E402

#: the scripts that take ``--workers``
WITH_WORKERS = ("balance", "crosslayer", "gem", "joint", "tacg", "task_signal")


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_workers_must_be_a_positive_integer(text):
    with pytest.raises(Exception, match="expected an integer >= 1"):
        workers_arg(text)
    assert workers_arg("3") == 3


@pytest.mark.parametrize("script", WITH_WORKERS)
def test_scripts_refuse_a_bad_worker_count_in_one_line(script):
    """argparse's usage and one error line, exit 2, no traceback, nothing on stdout."""
    out = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--workers", "0"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert "argument --workers: expected an integer >= 1, got '0'" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_script_ends_an_interrupted_run_with_130(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        run_script(interrupted)
    assert stop.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
    with pytest.raises(SystemExit) as stop:
        run_script(lambda: 0)
    assert stop.value.code == 0


def test_every_script_ends_through_run_script():
    """Every benchmark script's entry point is `run_script` (Ctrl-C: one line, exit 130)."""
    for path in sorted(BENCH.glob("*.py")):
        if path.name == "machine_info.py" or "__main__" not in path.read_text():
            continue
        assert "    run_script(main)" in path.read_text(), path.name


def test_the_rule_grid_extends_while_the_plans_balance_below_agnostic():
    """Past the rule grid's top the joint benchmark plans at looser limits only while the last plan's
    calibration MaxVio is below agnostic's, and at most RULE_EXTEND_MAX times."""
    import joint

    assert joint.extended_limit(0.5, 0.3, 0.4, 0) == round(0.5 * joint.RULE_EXTEND, 4)
    assert joint.extended_limit(0.5, 0.3, 0.4, joint.RULE_EXTEND_MAX - 1) is not None
    assert joint.extended_limit(0.5, 0.3, 0.4, joint.RULE_EXTEND_MAX) is None
    assert joint.extended_limit(0.5, 0.4, 0.4, 0) is None  # reached agnostic's load
    assert joint.extended_limit(0.5, 0.45, 0.4, 0) is None
