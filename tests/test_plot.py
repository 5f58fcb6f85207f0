"""moeopt plot and --plot: the numbers behind each figure, and PNG files of a sane size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from moeopt import console, plot
from moeopt.cli import main
from moeopt.evaluate import evaluate, linear_plan
from moeopt.io import load_instance, read_plan
from moeopt.solve import load_workloads

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "instances" / "quickstart.yaml"


@pytest.fixture(autouse=True)
def _auto_mode():
    """Each test starts (and leaves) the console in its library default, ``auto``."""
    console.configure()
    yield
    console.configure()


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, read from its header; fails on anything else."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def assert_sane_png(path: Path) -> None:
    """A PNG of a readable size: between 300 and 3000 pixels a side, 5 kB to 2 MB."""
    w, h = png_size(path)
    assert 300 <= w <= 3000 and 300 <= h <= 3000, (w, h)
    assert 5_000 < path.stat().st_size < 2_000_000


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """quickstart solved by tacg (one copy per expert, even dispatch) with plan, report and --plot."""
    d = tmp_path_factory.mktemp("solved")
    argv = [
        "solve",
        str(QUICKSTART),
        "--method",
        "tacg",
        "--quiet",
        "--output",
        str(d / "plan.json"),
        "--report",
        str(d / "report.json"),
        "--plot",
        str(d / "loads.png"),
    ]
    console.configure()
    assert main(argv) == 0
    return d


def counted_loads(plan, trace) -> np.ndarray:
    """Tokens per GPU counted directly: each (token, k) pair lands on its expert's only GPU."""
    assert not plan.replicas or all((r < 0).all() for r in plan.replicas)
    return np.stack(
        [np.bincount(plan.home[l][trace.topk[:, l].ravel()], minlength=plan.gpus) for l in range(plan.layers)]
    ).astype(float)


def test_load_bars_match_the_plans_loads(solved):
    """The bars of every layer are the token counts of the plan and of linear on the held-out trace."""
    inst = load_instance(QUICKSTART)
    wl = load_workloads(inst)
    plan = read_plan(solved / "plan.json")
    after = evaluate(plan, wl.evaluation, inst.cluster)
    before = evaluate(linear_plan(2, 16, 4), wl.evaluation, inst.cluster)
    mine, lin = counted_loads(plan, wl.evaluation), counted_loads(linear_plan(2, 16, 4), wl.evaluation)
    for layer in range(2):
        bars = plot.load_bars(after, before, layer=layer)
        np.testing.assert_array_equal(bars.after, mine[layer])
        np.testing.assert_array_equal(bars.before, lin[layer])
        assert bars.mean == pytest.approx(mine[layer].mean()) == pytest.approx(lin[layer].mean())
        assert bars.maxvio_after == pytest.approx(mine[layer].max() / mine[layer].mean() - 1)
        assert bars.maxvio_after == pytest.approx(after["maxvio_per_layer"][layer])
    worst = plot.load_bars(after, before)
    assert worst.layer == int(np.argmax(after["maxvio_per_layer"]))


def test_solve_plot_and_plot_command(solved, tmp_path, capsys):
    """solve --plot and plot --kind loads (plan or report, vs linear or --from) write sane PNGs."""
    assert_sane_png(solved / "loads.png")
    plan, report = solved / "plan.json", solved / "report.json"
    out = tmp_path / "a.png"
    assert main(["plot", str(plan), "--instance", str(QUICKSTART), "-o", str(out), "--layer", "0"]) == 0
    assert_sane_png(out)
    assert capsys.readouterr().err.strip() == f"wrote {out}"
    out2 = tmp_path / "b.png"
    argv = ["plot", str(report), "--kind", "loads", "--instance", str(QUICKSTART), "-o", str(out2)]
    assert main([*argv, "--from", str(plan)]) == 0
    assert_sane_png(out2)


def test_gap_plot_from_history(solved, tmp_path):
    """The gap figure's data is the report's per-layer history; the PNG is written."""
    data = json.loads((solved / "report.json").read_text())
    h = plot.gap_history(data)
    assert h is not None and h.method == "tacg" and h.sense == "max"
    assert sorted(h.layer.tolist()) == [0, 1] and np.all(np.diff(h.seconds) >= 0)
    assert h.incumbent.sum() == pytest.approx(data["objective"])
    assert np.all(h.bound >= h.incumbent - 1e-9)  # a maximization: each bound above its incumbent
    assert h.gap == pytest.approx((h.bound - h.incumbent) / np.maximum(np.abs(h.incumbent), 1e-9))
    out = tmp_path / "gap.png"
    assert main(["plot", str(solved / "report.json"), "-o", str(out)]) == 0
    assert_sane_png(out)


def test_gap_plot_without_history_is_one_line(tmp_path, capsys, pooled_balance_quickstart):
    """A method that solves all layers together records no history: one line says so, no file."""
    report = tmp_path / "r.json"
    assert main(["solve", str(pooled_balance_quickstart), "--quiet", "--report", str(report)]) == 0
    out = tmp_path / "gap.png"
    assert main(["plot", str(report), "--kind", "gap", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the report has no history" in err and not out.exists()


def test_frontier_output_plots(tmp_path, capsys):
    """plot on a frontier JSON draws its points (the same points, Pareto flags kept); frontier --plot too."""
    argv = [
        "frontier",
        str(QUICKSTART),
        "--methods",
        "agnostic,greedy",
        "--eps",
        "0.2",
        "--quiet",
        "--output",
        str(tmp_path),
        "--name",
        "f",
        "--plot",
        str(tmp_path / "direct.png"),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / "f.json").read_text())
    points = plot.frontier_points(data)
    written = [(p["method"], p["eps"], p["pareto"]) for p in data["points"]]
    assert [(p.method, p.eps, p.pareto) for p in points] == written and any(written_p[2] for written_p in written)
    out = tmp_path / "fig.png"
    assert main(["plot", str(tmp_path / "f.json"), "-o", str(out)]) == 0
    assert_sane_png(out)
    assert_sane_png(tmp_path / "direct.png")


def test_compare_plot_has_a_panel_per_method(tmp_path, capsys):
    """compare --plot draws one panel per method (a wider figure than one panel); plot draws a
    compare report's histories."""
    one, three = tmp_path / "one.png", tmp_path / "three.png"
    assert main(["compare", str(QUICKSTART), "--methods", "greedy", "--quiet", "--plot", str(one)]) == 0
    report = tmp_path / "compare.json"
    argv = ["compare", str(QUICKSTART), "--methods", "greedy,agnostic,tacg", "--quiet", "--plot", str(three)]
    assert main([*argv, "--report", str(report)]) == 0
    assert_sane_png(one)
    assert_sane_png(three)
    assert png_size(three)[0] > png_size(one)[0]
    histories = [plot.gap_history(r) for r in json.loads(report.read_text())["results"]]
    assert [h.method for h in histories] == ["greedy", "agnostic", "tacg"]
    gap = tmp_path / "gap.png"
    assert main(["plot", str(report), "-o", str(gap)]) == 0  # a compare report: every method's history
    assert_sane_png(gap)


def test_plot_bad_inputs_one_line(solved, tmp_path, capsys):
    """Bad plot inputs: exit 2, one line on stderr, no image."""
    out = tmp_path / "x.png"
    cases = [
        (["plot", str(solved / "plan.json"), "-o", str(out)], "needs --instance"),
        (
            ["plot", str(solved / "plan.json"), "--instance", str(QUICKSTART), "--layer", "5", "-o", str(out)],
            "layers 0..1",
        ),
        (["plot", str(tmp_path / "none.json"), "-o", str(out)], "file not found"),
        (["plot", str(solved / "plan.json"), "--kind", "gap", "-o", str(out)], "needs a solve or compare report"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
    assert not out.exists()
