"""Layers solved one at a time: serial, a local process pool and Ray give the same plans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest

from moeopt import execute
from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.io import load_instance, plan_to_json
from moeopt.registry import Context, Problem, get_method, parse_params
from moeopt.result import Result, Status
from moeopt.solve import load_workloads, solve
from tests.conftest import DATA, INSTANCES, ROOT

QUICKSTART = INSTANCES / "quickstart.yaml"
FOUR = DATA / "four_layers.yaml"

#: (instance, method, parameters): deterministic runs (no time limit binds on these sizes)
CASES = [
    (QUICKSTART, "tacg", None),
    (QUICKSTART, "tacg-cpsat", {"threads": 1}),
    (QUICKSTART, "greedy", None),
    (QUICKSTART, "balance", None),
    (FOUR, "tacg", None),
    (FOUR, "gem", {"ils_time": 0.0}),
    (FOUR, "balance", None),
    (FOUR, "gesr", {"base": "greedy"}),
    (FOUR, "random", None),
    (QUICKSTART, "joint", {"bound_time": 0}),  # solved whole, its layer searches on the executor
]
IDS = [f"{p.stem}-{m}" for p, m, _ in CASES]

_LOADED: dict = {}


def _loaded(path):
    if path not in _LOADED:
        inst = load_instance(path)
        _LOADED[path] = (inst, load_workloads(inst))
    return _LOADED[path]


def _splits(path, method, params) -> bool:
    """Whether the run of ``method`` on ``path`` is split per layer (moeopt.execute)."""
    inst, wl = _loaded(path)
    impl = get_method(method)
    problem = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    return execute.is_layerwise(impl, problem, parse_params(impl, params or {}), Context())


def test_balance_splits_layers_only_for_per_layer_work():
    """balance is solved whole on pooled loads (its batched pass is faster), and split per
    layer when robust planning, migration or the thorough search make each layer's work
    dominate (the hierarchical constraint too, with the thorough search; the fast search plans
    every layer's nodes at once); without a problem the class default (whole) holds."""
    impl = get_method("balance")
    assert not execute.is_layerwise(impl)
    inst, wl = _loaded(QUICKSTART)
    stepped = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    pooled = Problem(inst, replace(wl.calibration_stats, step_counts=None), None, wl.profile)
    assert wl.calibration_stats.step_counts is not None  # the quickstart trace has steps: robust auto
    p = parse_params(impl, {})
    assert execute.is_layerwise(impl, stepped, p, Context())
    assert not execute.is_layerwise(impl, pooled, p, Context())
    assert not execute.is_layerwise(impl, stepped, parse_params(impl, {"robust": "none"}), Context())
    for extra in ({"hierarchical": True, "search": "thorough"}, {"search": "thorough"}):
        assert execute.is_layerwise(impl, pooled, parse_params(impl, extra), Context())
    assert not execute.is_layerwise(impl, pooled, parse_params(impl, {"hierarchical": True}), Context())
    plan = solve(inst, method="balance", workloads=wl).plan
    assert execute.is_layerwise(impl, pooled, p, Context(current=plan))


def _plan_bytes(path, method, params, **executor) -> tuple[bytes, Result]:
    inst, wl = _loaded(path)
    r = solve(inst, method=method, params=params, seed=3, workloads=wl, **executor)
    assert r.plan is not None, r.status
    return plan_to_json_bytes(r), r


def plan_to_json_bytes(r: Result) -> bytes:
    import json

    return json.dumps(plan_to_json(r.plan, r.method, r.params), sort_keys=True).encode()


@pytest.mark.parametrize("path,method,params", CASES, ids=IDS)
def test_pool_gives_the_serial_plans(path, method, params):
    serial, rs = _plan_bytes(path, method, params, workers=1)
    pooled, rp = _plan_bytes(path, method, params, workers=2)
    assert pooled == serial
    if _splits(path, method, params):
        assert rs.stats["executor"] == "serial" and rp.stats["executor"] == "2 workers"
    else:  # solved whole in this process (a method may spread its per-layer phases)
        assert rs.stats["executor"] == "serial (whole model)"
        spread = getattr(get_method(method), "spreads_layers", False)
        whole = "whole model, its per-layer searches and bounds on 2 workers" if spread else "serial (whole model)"
        assert rp.stats["executor"] == whole
    assert rp.objective == pytest.approx(rs.objective) and rp.status == rs.status
    assert rp.metrics["maxvio"] == rs.metrics["maxvio"]


def test_joint_certificate_on_workers_is_the_serial_one():
    """joint's per-layer certificates run on the executor too: with every layer's LP solved the
    bound is the serial run's, layer by layer."""
    serial, rs = _plan_bytes(QUICKSTART, "joint", {"bound_time": 5})
    pooled, rp = _plan_bytes(QUICKSTART, "joint", {"bound_time": 5}, workers=2)
    assert pooled == serial
    assert all(rs.stats["bound_lp_solved_per_layer"]) and all(rp.stats["bound_lp_solved_per_layer"])
    assert rp.stats["distinct_lower_bound_per_layer"] == rs.stats["distinct_lower_bound_per_layer"]
    assert rp.bound == rs.bound <= rs.objective


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module's Ray tests; solve() uses it as it is."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("path,method,params", CASES, ids=IDS)
def test_ray_gives_the_serial_plans(local_ray, path, method, params):
    serial, _ = _plan_bytes(path, method, params)
    on_ray, r = _plan_bytes(path, method, params, ray="local")
    assert on_ray == serial
    if _splits(path, method, params):
        assert r.stats["executor"] == "ray (local)"
    assert local_ray.is_initialized()  # a Ray already running is used, not shut down


def test_plan_files_identical_from_the_command_line(tmp_path):
    outs = []
    for extra in ([], ["--workers", "2"]):
        out = tmp_path / f"plan{len(outs)}.json"
        assert main(["solve", str(FOUR), "--method", "tacg", "--quiet", "--output", str(out), *extra]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


# ----------------------------------------------------------------------------- combining
def test_layers_combine_as_the_whole_model():
    from moeopt.evaluate import grouping_affinity
    from moeopt.methods.gem import plan_straggler, problem_utilization
    from moeopt.methods.tacg import task_modulated_graph

    inst, wl = _loaded(FOUR)
    problem = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    tacg = solve(inst, method="tacg", workloads=wl)
    graph = task_modulated_graph(wl.calibration_stats)
    assert tacg.objective == pytest.approx(sum(grouping_affinity(graph[l], tacg.plan.home[l]) for l in range(4)))
    assert len(tacg.stats["bound_kind"]) == 4 and len(tacg.stats["layer_wall_times"]) == 4
    gem = solve(inst, method="gem", params={"ils_time": 0.0}, workloads=wl)
    util = problem_utilization(problem, 16)
    assert gem.objective == pytest.approx(plan_straggler(gem.plan.home, util, problem))
    assert gem.stats["steps"] == util.steps and gem.objective <= gem.stats["initial_best"] + 1e-9
    bal = solve(inst, method="balance", workloads=wl)
    assert bal.objective == pytest.approx(1.0 + np.mean(bal.stats["calibration_maxvio_per_layer"]))
    assert bal.bound <= bal.objective


def test_combine_stats_rules():
    per_layer = [
        {"a": [1.5], "moves": 2, "s": 1.0, "kind": "x", "st": "optimal", "opt": None},
        {"a": [2.5], "moves": 3, "s": 3.0, "kind": "y", "st": "feasible", "opt": 1.0},
    ]
    out = execute.combine_stats(per_layer, "mean", {"st": "status"})
    assert out == {"a": [1.5, 2.5], "moves": 5, "s": 2.0, "kind": ["x", "y"], "st": "feasible", "opt": None}
    assert execute.combine_stats(per_layer, "sum")["s"] == 4.0


def test_layer_seeds_differ_by_layer_and_seed():
    seeds = {execute.layer_seed(s, l) for s in range(3) for l in range(50)}
    assert len(seeds) == 150 and all(0 <= x < 2**31 for x in seeds)
    assert execute.layer_seed(-1, 0) == execute.layer_seed(2**64 - 1, 0)


# ----------------------------------------------------------------------------- a method of its own
@dataclass
class _NoParams:
    fail_layer: int = -1


class Whole:
    """A method without ``combine``: solved as one problem, in this process."""

    name: ClassVar[str] = "whole"
    Params: ClassVar[type] = _NoParams
    requires: ClassVar[frozenset] = frozenset()
    metric_hooks: ClassVar[tuple] = ()
    seen: ClassVar[list] = []

    def available(self) -> bool:
        return True

    def solve(self, problem, params, ctx) -> Result:
        type(self).seen.append(problem.layers)
        home = np.zeros((problem.layers, problem.experts), dtype=np.int64)
        home[:, :] = (np.arange(problem.experts) * problem.gpus) // problem.experts
        return Result(method=self.name, status=Status.FEASIBLE, plan=problem.plan(home), objective=1.0)


class Layered(Whole):
    """Layerwise; layer ``fail_layer`` raises an error naming its (local) layer 0."""

    name: ClassVar[str] = "layered"
    combine: ClassVar[str] = "sum"

    def solve(self, problem, params, ctx) -> Result:
        ctx.say("layered layer 0: working")
        if params.fail_layer >= 0 and ctx.seed == execute.layer_seed(0, params.fail_layer):
            raise InputError("x.yaml", "method", "layer 0: cannot be placed")
        return super().solve(problem, params, ctx)


def _problem(path=FOUR) -> Problem:
    inst, wl = _loaded(path)
    return Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)


def test_method_without_combine_runs_whole_with_a_note():
    notes: list[str] = []
    Whole.seen.clear()
    r = execute.run(Whole(), _problem(), _NoParams(), Context(), execute.Executor(workers=2), note=notes.append)
    assert Whole.seen == [4] and r.plan.layers == 4 and r.objective == 1.0
    assert len(notes) == 1 and "solves all layers together" in notes[0]
    assert r.stats["executor"] == "serial (whole model)"


@pytest.mark.parametrize("workers", [1, 2])
def test_layer_error_names_the_model_layer(workers):
    lines: list[str] = []
    ctx = Context(quiet=False, log=lines.append)
    with pytest.raises(InputError, match=r"^x\.yaml: method: layer 2: cannot be placed$") as info:
        execute.run(Layered(), _problem(), _NoParams(fail_layer=2), ctx, execute.Executor(workers=workers))
    assert info.value.message == "layer 2: cannot be placed"
    r = execute.run(Layered(), _problem(), _NoParams(), ctx, execute.Executor(workers=workers))
    assert r.objective == 4.0 and r.plan.layers == 4
    assert "layered layer 3: working" in lines


# ----------------------------------------------------------------------------- configuration
def test_executor_from_the_instance_yaml(tmp_path):
    text = FOUR.read_text().replace("method: {name: greedy}", "method: {name: greedy}\nexecutor: {workers: 2}")
    path = tmp_path / "four.yaml"
    path.write_text(text)
    inst = load_instance(path)
    assert inst.executor is not None and inst.executor.workers == 2 and inst.executor.ray is None
    r = solve(inst)
    assert r.stats["executor"] == "2 workers"
    assert solve(inst, workers=1).stats["executor"] == "serial"  # the command line wins
    ray_inst = tmp_path / "ray.yaml"
    ray_inst.write_text(text.replace("executor: {workers: 2}", "executor: {ray: true}"))
    assert load_instance(ray_inst).executor.ray == "local"


@pytest.mark.parametrize(
    "executor,message",
    [
        ("{workers: 0}", "executor.workers: expected a value >= 1, found 0"),
        ("{ray: 5}", "executor.ray: expected a cluster address, 'local' or true, found 5"),
        ("{threads: 2}", "executor.threads: unknown field; accepted: ray, workers"),
        ("[2]", "executor: expected a mapping, found [2]"),
    ],
)
def test_bad_executor_one_line(tmp_path, capsys, executor, message):
    path = tmp_path / "bad.yaml"
    path.write_text(FOUR.read_text() + f"executor: {executor}\n")
    assert main(["solve", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_workers_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["solve", str(FOUR), "--workers", "0"])
    assert info.value.code == 2 and "expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_missing_ray_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    out = tmp_path / "plan.json"
    assert main(["solve", str(FOUR), "--quiet", "--output", str(out), "--ray"]) == 2
    err = capsys.readouterr().err
    assert err == 'error: Ray is not installed: pip install -e ".[ray]" (or pip install "ray>=2.9")\n'
    assert not out.exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bind, read the free port, close: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_is_one_line(capsys, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # another test's local Ray would be reused
    out = tmp_path / "plan.json"
    address = f"127.0.0.1:{_closed_port()}"
    assert main(["solve", str(FOUR), "--quiet", "--output", str(out), "--ray", address]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--ray {address}: cannot connect to a Ray cluster: nothing answers" in err
    assert not out.exists()


def test_compare_with_workers(capsys):
    assert main(["compare", str(FOUR), "--methods", "greedy,balance", "--quiet", "--workers", "2"]) == 0
    assert "balance" in capsys.readouterr().out


# ----------------------------------------------------------------------------- SIGINT
def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_stops_every_worker(tmp_path):
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        "model: {layers: 4, experts: 32, top_k: 2}\ncluster: {gpus: 4}\n"
        "workload: {synthetic: {tokens: 2048, steps: 4}}\n"
        "method: {name: tacg, iterations: 100000000, patience: 100000000}\n"
    )
    cmd = [sys.executable, "-m", "moeopt", "solve", str(slow), "--quiet", "--layer-time-limit", "120", "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        kids: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            kids = _descendants(proc.pid)
            if len(kids) >= 4:  # resource tracker, fork server and the two workers
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(1.0)  # the workers have their layers
        kids = _descendants(proc.pid)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and time.monotonic() - t0 < 30
    assert err.strip() == "interrupted"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if os.path.exists(f"/proc/{k}")]


class _RecordingRay:
    """A stand-in for the ray module: tasks never finish, ``wait`` raises the interrupt, and
    every ``cancel`` and ``shutdown`` is recorded."""

    def __init__(self) -> None:
        self.up = False
        self.calls: list[tuple] = []

    def is_initialized(self) -> bool:
        return self.up

    def init(self, address=None, **_: object) -> None:
        self.up = True
        self.calls.append(("init", address))

    def shutdown(self) -> None:
        self.up = False
        self.calls.append(("shutdown",))

    def remote(self, **_: object):
        class _Remote:
            def remote(self, *args: object) -> tuple:
                return ("ref", args)

        return lambda fn: _Remote()

    def put(self, value: object) -> object:
        return value

    def wait(self, pending, num_returns=1):
        raise KeyboardInterrupt

    def cancel(self, ref, force=False) -> None:
        self.calls.append(("cancel", force))


@pytest.mark.parametrize(
    ("address", "cancelled"),
    [("local", False), ("auto", True)],  # a local Ray of the run's own; a cluster (no host:port to check)
)
def test_interrupted_ray_tasks(monkeypatch, address, cancelled):
    """Ctrl-C under a local Ray of the run's own shuts it down without cancelling its tasks
    (a force-cancel racing a task's reply aborts Ray's driver); on a cluster the pending tasks
    are cancelled, then the connection closed."""
    ray = _RecordingRay()
    monkeypatch.setattr(execute, "import_ray", lambda: ray)
    with pytest.raises(KeyboardInterrupt):
        execute.ray_map(lambda x: x, [(1,), (2,)], execute.Executor(workers=2, ray=address), lambda r: None)
    cancels = [c for c in ray.calls if c[0] == "cancel"]
    assert cancels == ([("cancel", True)] * 2 if cancelled else [])
    assert ray.calls[0] == ("init", address) and ray.calls[-1] == ("shutdown",)
