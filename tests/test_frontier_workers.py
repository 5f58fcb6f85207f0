"""The frontier sweep in a local process pool: the same points as the serial sweep."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from moeopt import frontier as fr
from moeopt.cli import main
from moeopt.frontier import FrontierPoint, frontier
from moeopt.io import load_instance
from moeopt.solve import load_workloads
from tests.conftest import INSTANCES, ROOT
from tests.test_execute import _descendants

#: Methods whose plans depend on the seed only: agnostic and greedy are deterministic, joint is
#: bounded by its ``evaluations`` (its 30 s cap per layer never binds on gesr-small).
METHODS = ["agnostic", "greedy", "joint"]
EPS = [0.1, 0.3]
#: A limit none of these searches reaches here (a search cut by the clock depends on the machine).
TIME_LIMIT = 20.0


def _key(p: FrontierPoint | dict) -> dict:
    """A point without its wall time (the one field that differs between runs)."""
    d = p.to_json() if isinstance(p, FrontierPoint) else dict(p)
    d.pop("wall_time")
    d.pop("stats")
    return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@pytest.fixture(scope="module")
def serial():
    """gesr-small, its workloads, and the serial sweep's points."""
    inst = load_instance(INSTANCES / "gesr-small.yaml")
    wl = load_workloads(inst)
    points = frontier(inst, methods=METHODS, eps=EPS, layer_time_limit=TIME_LIMIT, workloads=wl, workers=1)
    return inst, wl, points


def _not_here(*args, **kwargs):
    raise AssertionError("a point was solved in the parent process, not in a worker")


def test_pool_gives_the_serial_points(serial, monkeypatch):
    """workers=2 gives the serial sweep's points, in the same order, with the same metrics."""
    inst, wl, points = serial
    monkeypatch.setattr(fr, "_solve_point", _not_here)  # the workers have their own copy
    lines: list[str] = []
    pooled = frontier(
        inst, methods=METHODS, eps=EPS, layer_time_limit=TIME_LIMIT, workloads=wl, workers=2, log=lines.append
    )
    assert [(p.method, p.eps) for p in points] == [
        ("agnostic", None),
        ("agnostic", 0.1),
        ("agnostic", 0.3),
        ("greedy", None),
        ("joint", 0.1),
        ("joint", 0.3),
    ]
    assert all(p.error is None for p in points)
    assert [_key(p) for p in pooled] == [_key(p) for p in points]
    assert len(lines) == len(points)  # one progress line per point, whatever order they finish in


def test_cli_frontier_workers_writes_the_serial_points(serial, tmp_path, capsys, monkeypatch):
    """``moeopt frontier --workers 2`` writes the JSON of the serial sweep."""
    _, _, points = serial
    monkeypatch.setattr(fr, "_solve_point", _not_here)  # the workers have their own copy
    args = [
        "frontier",
        str(INSTANCES / "gesr-small.yaml"),
        "--methods",
        ",".join(METHODS),
        "--eps",
        ",".join(map(str, EPS)),
        "--layer-time-limit",
        str(TIME_LIMIT),
        "--workers",
        "2",
        "--output",
        str(tmp_path),
        "--quiet",
    ]
    assert main(args) == 0
    assert "MaxVio (held-out)" in capsys.readouterr().out
    data = json.loads((tmp_path / "gesr-small.json").read_text())
    assert [_key(p) for p in data["points"]] == [_key(p) for p in points]


def test_cli_frontier_rejects_zero_workers(capsys):
    """``--workers 0`` is one line on stderr and exit code 2."""
    with pytest.raises(SystemExit) as exc:
        main(["frontier", str(INSTANCES / "gesr-small.yaml"), "--workers", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_stops_every_point_worker():
    """Ctrl-C during ``frontier --workers 2`` ends every worker and exits 130 with one line."""
    cmd = [
        sys.executable,
        "-m",
        "moeopt",
        "frontier",
        str(INSTANCES / "gesr-small.yaml"),
        "--methods",
        "joint",
        "--eps",
        "0.05,0.1,0.2,0.3,0.4,0.5",
        "--workers",
        "2",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and len(_descendants(proc.pid)) < 4:
            time.sleep(0.1)  # resource tracker, fork server and the two workers
        time.sleep(0.5)  # the workers have their points
        assert proc.poll() is None, proc.stderr.read()
        kids = _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err.strip() == "interrupted"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if os.path.exists(f"/proc/{k}")]


def test_ray_gives_the_serial_points(serial, monkeypatch):
    """ray='local' solves the points as Ray tasks: the serial sweep's points, in its order."""
    ray = pytest.importorskip("ray")
    inst, wl, points = serial
    monkeypatch.setattr(fr, "_solve_point", _not_here)  # the Ray workers import their own copy
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        lines: list[str] = []
        on_ray = frontier(
            inst, methods=METHODS, eps=EPS, layer_time_limit=TIME_LIMIT, workloads=wl, ray="local", log=lines.append
        )
    finally:
        ray.shutdown()
    assert [_key(p) for p in on_ray] == [_key(p) for p in points]
    assert len(lines) == len(points)
