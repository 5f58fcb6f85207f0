"""Long runs speak: progress lines on any stderr (a line a minute from a bar that cannot redraw),
notes a user must act on printed once, nothing with --quiet."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moeopt import console

ROOT = Path(__file__).resolve().parents[1]
FOUR_LAYERS = ROOT / "tests" / "data" / "four_layers.yaml"
LAYER_LINE = re.compile(r"\blayer (\d+): ")

#: joint on a cluster without replica slots, at eps 0: no layer can reach its load target, and
#: the note says what would (replica slots).
UNREACHABLE = """\
name: unreachable
model: {layers: 2, experts: 16, top_k: 2}
cluster: {gpus: 4}
workload:
  synthetic: {tokens: 2048, steps: 4, structure_seed: 3, seed: 0}
method: {name: joint, eps: 0.0, time_per_layer: 0.5, bound_time: 0}
"""


@pytest.fixture(autouse=True)
def _auto_mode(monkeypatch):
    """Each test starts (and leaves) the console in its library default, ``auto``, writing to a
    stderr that is not a terminal."""
    console.configure()
    yield
    console.configure()


def _cli_to_file(tmp_path: Path, *argv: str) -> tuple[int, str]:
    """The CLI in a child process with stderr redirected to a file: exit code and stderr."""
    err = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with err.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "moeopt", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=f, timeout=300
        )
    return proc.returncode, err.read_text()


def test_line_bar_speaks_per_step_or_per_interval(monkeypatch):
    """A line bar writes a line per step at every=0, none for quick steps at every=60 s, and one
    from its timer while a step runs longer than its interval; never a carriage return."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    for _ in console.LineBar(range(3), desc="tacg", unit="layer", every=0.0):
        pass
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["tacg: 1/3 layers", "tacg: 2/3 layers", "tacg: 3/3 layers"]
    assert "left" in lines[0] and "left" not in lines[-1]
    out.truncate(0)
    out.seek(0)
    quick = console.LineBar(total=5, desc="joint", unit="layer", every=60.0)
    quick.update(5)
    quick.close()
    assert out.getvalue() == ""
    slow = console.LineBar(total=2, desc="joint", unit="layer", every=0.2)
    time.sleep(0.5)  # one long first step: the timer speaks
    slow.close()
    assert out.getvalue().startswith("joint: 0/2 layers, 0s") and "\r" not in out.getvalue()


def test_bar_is_a_line_bar_off_a_terminal(monkeypatch):
    """Off a terminal a bar is a LineBar (a line per step with --verbose); --quiet disables it."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    made = console.bar(total=3, desc="x")
    assert isinstance(made, console.LineBar) and made.every == console.LINE_EVERY
    made.close()
    console.configure(verbose=True)
    made = console.bar(total=3, desc="x")
    assert made.every == 0.0
    made.close()
    console.configure(quiet=True)
    assert console.bar(total=3).disable is True and not isinstance(console.bar(total=3), console.LineBar)


def test_result_notes_leave_out_what_was_shown(capsys):
    """A result's notes come back as lines, without the parts a method already printed."""
    console.note("note: auto: planned with balance")
    stats = {"note": "eps 0 is below the least reachable MaxVio; auto: planned with balance"}
    assert console.result_notes(stats) == ["note: eps 0 is below the least reachable MaxVio"]
    assert console.result_notes(stats, "joint") == ["note: joint: eps 0 is below the least reachable MaxVio"]
    assert console.result_notes({"note": "auto: planned with balance"}) == []
    per_layer = {"note": ["time limit cut 1 search(es) short", "time limit cut 1 search(es) short"]}
    assert console.result_notes(per_layer) == ["note: time limit cut 1 search(es) short"]
    assert console.result_notes({}) == [] and capsys.readouterr().err == "note: auto: planned with balance\n"


def test_layer_lines_reach_a_file(tmp_path):
    """solve with stderr redirected to a file: a progress line per layer, as each one ends."""
    code, err = _cli_to_file(tmp_path, "solve", str(FOUR_LAYERS), "--method", "tacg")
    assert code == 0, err
    assert [int(m) for m in LAYER_LINE.findall(err)] == [0, 1, 2, 3], err
    assert "\r" not in err


def test_unreachable_target_note_is_printed_once(tmp_path):
    """joint's note that its target is out of reach (and that replica slots would reach it) is on
    stderr once, not only in the report; --quiet hides it."""
    inst = tmp_path / "unreachable.yaml"
    inst.write_text(UNREACHABLE)
    code, err = _cli_to_file(tmp_path, "solve", str(inst), "--report", str(tmp_path / "r.json"))
    assert code == 0, err
    notes = [ln for ln in err.splitlines() if ln.startswith("note: ") and "least reachable MaxVio" in ln]
    assert len(notes) == 1 and "replica slots" in notes[0], err
    code, err = _cli_to_file(tmp_path, "solve", str(inst), "--quiet")
    assert code == 0 and err == ""
