"""The optional extras: the core install imports none of them, and a command that needs a missing one says
which in one line and exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moeopt.cli import main
from moeopt.extras import EXTRAS, MissingExtra, installed, load
from moeopt.solvers import pyomo_solvers

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "instances" / "quickstart.yaml"


def _hide(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make ``module`` and its submodules unimportable, as in an install without its extra."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_import_loads_no_extra():
    """`import moeopt` and its command line import none of the extras' modules."""
    code = "import sys, moeopt, moeopt.cli, moeopt.methods; print(sorted(m.split('.')[0] for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    loaded = set(eval(out))  # noqa: S307  (our own printout of a list of names)
    assert not loaded & {"cvxpy", "matplotlib", "pyscipopt", "ray"}


def test_load_names_the_extra(monkeypatch):
    """load() returns the module when present, and raises MissingExtra naming the extra when not."""
    assert load("json", "plot", "x").__name__ == "json"
    _hide(monkeypatch, "cvxpy")
    assert not installed("sdp")
    with pytest.raises(MissingExtra) as err:
        load("cvxpy", "sdp", "the SDP certificate")
    assert str(err.value) == "the SDP certificate needs the 'sdp' extra: pip install 'moeopt[sdp]'"


def test_plot_without_matplotlib_exits_2(monkeypatch, tmp_path, capsys):
    """plot and solve --plot without matplotlib: one line naming the 'plot' extra, exit 2; solve alone runs."""
    plan = tmp_path / "plan.json"
    assert main(["solve", str(QUICKSTART), "--method", "greedy", "--output", str(plan), "--quiet"]) == 0
    capsys.readouterr()
    _hide(monkeypatch, "matplotlib")
    out = tmp_path / "loads.png"
    assert main(["plot", str(plan), "--instance", str(QUICKSTART), "--output", str(out)]) == 2
    assert _one_error_line(capsys) == "error: writing a figure needs the 'plot' extra: pip install 'moeopt[plot]'"
    assert main(["solve", str(QUICKSTART), "--method", "greedy", "--plot", str(out), "--quiet"]) == 2
    assert "needs the 'plot' extra: pip install 'moeopt[plot]'" in _one_error_line(capsys)
    assert not out.exists()
    assert main(["solve", str(QUICKSTART), "--method", "greedy", "--quiet"]) == 0  # no figure asked: no need


def test_sdp_certificate_without_cvxpy_exits_2(monkeypatch, tmp_path, capsys):
    """certificate: sdp without cvxpy: one line naming the 'sdp' extra, exit 2."""
    inst = tmp_path / "sdp.yaml"
    text = QUICKSTART.read_text().replace("traces/", str(ROOT / "instances" / "traces") + "/")
    inst.write_text(text.replace("method: {name: tacg-cpsat}", "method: {name: tacg, certificate: sdp}"))
    _hide(monkeypatch, "cvxpy")
    assert main(["solve", str(inst), "--quiet"]) == 2
    line = _one_error_line(capsys)
    needs = "the SDP certificate (certificate: sdp or auto) needs the 'sdp' extra"
    assert line == f"error: {needs}: pip install 'moeopt[sdp]'"


def test_missing_solver_exits_2(monkeypatch, tmp_path, capsys):
    """solver: scip without pyscipopt: one line saying how to install it, exit 2."""
    inst = tmp_path / "scip.yaml"
    text = QUICKSTART.read_text().replace("traces/", str(ROOT / "instances" / "traces") + "/")
    inst.write_text(text.replace("method: {name: tacg-cpsat}", "method: {name: tacg-milp, solver: scip}"))
    monkeypatch.setattr(pyomo_solvers, "_present", lambda needs: needs == "module:highspy")
    assert main(["solve", str(inst), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: ") and "solver 'scip' is not available here; pip install 'moeopt[scip]'" in line


def test_methods_lists_every_solver(capsys):
    """moeopt methods: one line per MILP solver, 'yes' exactly where it can be used."""
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in pyomo_solvers.SOLVERS:
        row = [ln.split() for ln in lines if ln.split()[:1] == [name]]
        assert len(row) == 1, name
        assert row[0][1] == ("yes" if pyomo_solvers.available(name) else "no")


def test_extras_are_declared():
    """Each extra of the table is a pyproject extra; the core dependencies hold neither matplotlib nor cvxpy."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    core = " ".join(project["dependencies"])
    for extra in EXTRAS:
        assert extra in extras, extra
    assert "matplotlib" in " ".join(extras["plot"]) and "cvxpy" in " ".join(extras["sdp"])
    assert "matplotlib" not in core and "cvxpy" not in core
    assert "moeopt[plot,sdp]" in extras["dev"]  # the README's `pip install -e ".[dev]"` runs every test
