"""--layer-time-limit and --time-limit bound every method's whole run; Ctrl-C and SIGTERM stop every
method family at once (exit 130 / 143, no files, no process left)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from moeopt.budget import MIN_SHARE, Budget, share
from moeopt.io import load_instance
from moeopt.registry import get_method, method_names, parse_params
from moeopt.solve import load_workloads, solve

ROOT = Path(__file__).resolve().parents[1]

#: Seconds per layer in the limit test, and what a run may add to L x T x 1.1 that no phase can
#: cut: scoring on the evaluation workload, building an exact model (Pyomo's), slot repair (which
#: must finish for the plan to be feasible), a search's first round -- on a busy two-core machine.
#: (Mt-KaHyPar's call, which cannot be stopped, runs in a child killed at the layer's deadline.)
LIMIT = 1.0
ALLOWANCE = 2.0

#: Two layers x 32 experts on 4 GPUs with a replica slot each: small enough to keep the suite
#: short, large enough that the searches and exact models run past LIMIT without a cap.
LIMIT_INSTANCE = """\
name: limits
model: {layers: 2, experts: 32, top_k: 4}
cluster: {gpus: 4, replica_slots_per_gpu: 1}
workload:
  synthetic: {tokens: 4096, steps: 16, structure_seed: 5, seed: 0}
profile: {variability: medium, seed: 0, tile: 64}
method: {name: greedy}
"""

#: Larger, for Ctrl-C: every native solver (CP-SAT, HiGHS, Mt-KaHyPar) runs for seconds on it.
SIGINT_INSTANCE = """\
name: sigint
model: {layers: 2, experts: 64, top_k: 4}
cluster: {gpus: 8, replica_slots_per_gpu: 1}
workload:
  synthetic: {tokens: 8192, steps: 16, structure_seed: 5, seed: 0}
profile: {variability: medium, seed: 0, tile: 64}
method: {name: greedy}
"""

#: Parameters that take the work bounds off the searches, so that only the clock can stop
#: them and the limit test can fail (the exact models and joint run past the limit as they
#: are); the exact joint model only fits a small token sample.
_ENDLESS = {"iterations": 10**6, "patience": 10**6}
PARAMS: dict[str, dict] = {
    "tacg": _ENDLESS,
    "agnostic": _ENDLESS,
    "tacg-cpsat": _ENDLESS,
    "tacg-highs": _ENDLESS,
    "tacg-milp": _ENDLESS,
    "gem": {"rounds": 10**6, "patience": 10**6},
    "gesr": {"base_params": _ENDLESS},
    "hottest-replication": {"base_params": _ENDLESS},
    "random-replication": {"base_params": _ENDLESS},
    "crosslayer": {"kicks": 10**6, "patience": 10**6},
    "hypergraph": {"runs": 10**4},
    "joint": {"evaluations": 10**7},
    "joint-exact": {"sample_tokens": 64, "coarse_tokens": 64},
}

#: On the larger Ctrl-C instance (8 GPUs, top-4) the exact joint model needs a smaller token
#: sample to stay under its column limit (patterns x G^k routings).
SIGINT_PARAMS: dict[str, dict] = {"joint-exact": {"sample_tokens": 8, "coarse_tokens": 8, "max_columns": 100000}}


def _available(name: str) -> bool:
    return get_method(name).available()


# ----------------------------------------------------------------------------- budget
def test_budget_shares_one_clock():
    """A child budget takes a fraction of what is left and never outlives its parent."""
    b = Budget(1.0)
    assert 0.9 < b.remaining() <= 1.0 and not b.expired()
    c = b.child(0.25)
    assert c.remaining() <= 0.25 + 1e-6
    assert c.deadline <= b.deadline
    assert b.cap(5.0) <= 1.0 and b.cap(0.1) == pytest.approx(0.1)
    assert Budget(None).cap() is None and math.isinf(Budget().remaining())
    assert Budget(None).child(0.5, most=2.0).remaining() <= 2.0
    assert Budget(0.0).expired()


# ----------------------------------------------------------------------------- time limit
@pytest.fixture(scope="module")
def limit_case(tmp_path_factory):
    """The limit test's instance and its loaded workloads."""
    path = tmp_path_factory.mktemp("limits") / "limits.yaml"
    path.write_text(LIMIT_INSTANCE)
    inst = load_instance(path)
    return inst, load_workloads(inst)


@pytest.mark.parametrize("name", method_names())
def test_time_limit_bounds_the_whole_run(name, limit_case):
    """solve() with --layer-time-limit T ends within L x T x 1.1 plus a fixed allowance."""
    if not _available(name):
        pytest.skip(f"{name} is not available here")
    inst, wl = limit_case
    layers = inst.model.layers
    t0 = time.perf_counter()
    result = solve(inst, method=name, params=PARAMS.get(name), layer_time_limit=LIMIT, workloads=wl)
    wall = time.perf_counter() - t0
    bound = layers * LIMIT * 1.1 + ALLOWANCE
    print(f"{name}: {wall:.2f} s for a bound of {bound:.2f} s ({result.termination.value})")
    assert result.plan is not None
    assert wall <= bound, f"{name} ran {wall:.2f} s, more than {layers} x {LIMIT} s x 1.1 + {ALLOWANCE} s"
    over = result.stats.get("time_limit_exceeded_s")  # said in the report when the run took longer
    assert over is None or (over > 0 and result.wall_time >= layers * LIMIT)


#: One layer of 128 experts on 16 GPUs, top-8: Mt-KaHyPar takes about a second on it (several on
#: a busy machine), far more than the limit below.
PARTITION_INSTANCE = """\
name: partition-limit
model: {layers: 2, experts: 128, top_k: 8}
cluster: {gpus: 16}
workload:
  synthetic: {tokens: 8192, steps: 16, structure_seed: 5, seed: 0}
method: {name: hypergraph}
"""


def test_time_limit_stops_mt_kahypar(tmp_path):
    """hypergraph keeps a limit shorter than Mt-KaHyPar's call: the call runs in a child killed at
    the layer's deadline, the layer starts from a balanced packing, and the result says so."""
    path = tmp_path / "partition.yaml"
    path.write_text(PARTITION_INSTANCE)
    limit = 0.25
    report = tmp_path / "report.json"
    # a fresh process, as the command line runs: a process that has started Mt-KaHyPar's threads
    # itself (an earlier test's in-process call) cannot fork it and runs the call here, unstopped
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "moeopt", "solve", str(path), "--method", "hypergraph"]
    cmd += ["--layer-time-limit", str(limit), "--quiet", "--report", str(report), "-o", str(tmp_path / "plan.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    r = json.loads(report.read_text())
    # the solve itself (scoring apart) within 1.1 x T x L plus the allowance (the call alone takes
    # longer than that: a second or more per layer)
    assert r["wall_time"] <= 2 * limit * 1.1 + ALLOWANCE, r["wall_time"]
    assert (tmp_path / "plan.json").exists()
    assert wall < 30.0
    stopped = r["stats"].get("partition_stopped_layers", 0)
    if stopped:  # the usual case: no partition of this size takes under 0.2 s
        assert r["termination"] == "time_limit"
        assert "Mt-KaHyPar" in str(r["stats"].get("note"))


#: Four layers, so that a total of T seconds and T seconds per layer differ by 3 T
FOUR_LAYERS = ROOT / "tests" / "data" / "four_layers.yaml"


def test_share_divides_what_is_left_over_the_rounds_to_run():
    """share(): min(own limit, time left / rounds still to run), never below MIN_SHARE; no deadline: the own limit."""
    now = time.time()
    assert share(2.0, None, 4) == 2.0 and share(None, None, 4) is None
    assert share(None, now + 4.0, 4) == pytest.approx(1.0, abs=0.01)
    assert share(None, now + 4.0, 4, width=2) == pytest.approx(2.0, abs=0.01)  # two rounds of two
    assert share(0.5, now + 4.0, 4) == 0.5
    assert share(None, now - 1.0, 3) == MIN_SHARE and share(0.001, now - 1.0, 3) == 0.001


@pytest.mark.parametrize("name", ["gem", "tacg", "joint"])
def test_total_time_limit_bounds_the_whole_run(name):
    """solve(time_limit=T) ends within T x 1.1 plus the allowance on 4 layers (T per layer would take 4 T)."""
    inst = load_instance(FOUR_LAYERS)
    total = 1.0
    t0 = time.perf_counter()
    result = solve(inst, method=name, params=PARAMS.get(name), time_limit=total)  # the workloads' loading counts
    wall = time.perf_counter() - t0
    print(f"{name}: {wall:.2f} s for a total of {total} s ({result.termination.value})")
    assert result.plan is not None
    assert wall <= total * 1.1 + ALLOWANCE, f"{name} ran {wall:.2f} s under a total of {total} s"
    assert result.termination.value == "time_limit"  # the endless searches were cut by the clock
    limits = result.stats.get("layer_time_limits")
    if limits is not None:  # split per layer: each layer had at most what was left over the layers to plan
        assert all(x * (4 - l) <= total for l, x in enumerate(limits))


def test_total_time_limit_keeps_the_scoring_time_free(monkeypatch):
    """Under a total limit the method's deadline comes before the run's by the scoring still to do
    (measured on one layer: ``scoring_reserve``), so that the plan's scoring fits in the limit too."""
    import importlib

    execute = importlib.import_module("moeopt.execute")
    solve_mod = importlib.import_module("moeopt.solve")  # the package exports the function of that name
    seen = {}
    run = execute.run

    def spy(*args, deadline=None, **kwargs):
        seen["deadline"] = deadline
        return run(*args, deadline=deadline, **kwargs)

    monkeypatch.setattr(solve_mod, "scoring_seconds", lambda *a, **k: 2.0)
    monkeypatch.setattr(execute, "run", spy)
    inst = load_instance(FOUR_LAYERS)
    t0 = time.time()
    result = solve(inst, method="balance", time_limit=30.0)
    assert result.plan is not None
    reserve = 2.0 * solve_mod.RESERVE_MARGIN
    assert seen["deadline"] is not None and seen["deadline"] <= t0 + 30.0 - reserve + 0.5
    assert seen["deadline"] >= t0 + 30.0 - reserve - 5.0
    assert solve_mod.scoring_reserve(inst, load_workloads(inst), solve_mod.Dispatch()) == pytest.approx(reserve)


def test_the_instance_method_mapping_carries_the_limits(tmp_path):
    """method: {time_limit, layer_time_limit} set the run's limits (arguments override them); a
    method's own parameter of that name (gem-milp's time_limit) stays its parameter."""
    text = FOUR_LAYERS.read_text().replace(
        "method: {name: greedy}", "method: {name: gem, rounds: 1000000, patience: 1000000, time_limit: 1.0}"
    )
    path = tmp_path / "limited.yaml"
    path.write_text(text)
    inst = load_instance(path)
    t0 = time.perf_counter()
    r = solve(inst)
    assert time.perf_counter() - t0 <= 1.1 + ALLOWANCE and r.termination.value == "time_limit"
    assert len(r.stats["layer_time_limits"]) == 4 and "time_limit" not in r.params
    r = solve(inst, time_limit=30.0, layer_time_limit=0.1)
    assert r.stats["layer_time_limits"] == [0.1] * 4
    milp = inst.replace(method=replace(inst.method, name="gem-milp", params={"time_limit": 5.0}))
    if get_method("gem-milp").available():
        # no run limit taken from gem-milp's own parameter: gem runs without a deadline
        assert "layer_time_limits" not in solve(milp, method="gem").stats
        assert parse_params(get_method("gem-milp"), {"time_limit": 5.0}).time_limit == 5.0


# ----------------------------------------------------------------------------- Ctrl-C, SIGTERM
#: The CLI's main() in a child process, instrumented for the test only: marks on the file
#: descriptor MOEOPT_TEST_MARKS say when it is ready, when a native solver call starts and ends
#: (moeopt.interrupt.native: CP-SAT, HiGHS, the child process of Mt-KaHyPar or SciPy's MILP),
#: when it forks a child process for a native call, and when a layer is done, so that the signal
#: is sent while the native solver runs, never in Python warm-up code. SIGINT is set to Python's
#: default handler first, as in a terminal (a runner that started the tests in the background
#: may ignore it).
_LAUNCH = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
marks = os.fdopen(int(os.environ["MOEOPT_TEST_MARKS"]), "w", buffering=1)
import moeopt.cli, moeopt.execute, moeopt.interrupt, moeopt.methods, moeopt.solve
from moeopt.registry import get_method
get_method(os.environ["MOEOPT_TEST_METHOD"]).available()
native, enter, leave = moeopt.interrupt.native, moeopt.interrupt.native.__enter__, moeopt.interrupt.native.__exit__
def marked_enter(self):
    marks.write("native start\\n")
    return enter(self)
def marked_exit(self, *exc):
    marks.write("native end\\n")
    return leave(self, *exc)
native.__enter__, native.__exit__ = marked_enter, marked_exit
os.register_at_fork(before=lambda: marks.write("fork\\n"))  # a child process for a native call
point = moeopt.execute._history_point
def marked_point(*args):
    marks.write("layer done\\n")
    return point(*args)
moeopt.execute._history_point = marked_point
marks.write("ready\\n")
raise SystemExit(moeopt.cli.main(sys.argv[1:]))
"""

#: The executors' instance: four layers, so that layers are still running in the workers when
#: the first one is done (the signal's cue).
EXECUTOR_INSTANCE = SIGINT_INSTANCE.replace("layers: 2", "layers: 4")
#: Mt-KaHyPar's instance: a partition takes seconds on it (on the Ctrl-C instance, well under one).
PARTITION_INSTANCE = (
    SIGINT_INSTANCE.replace("experts: 64, top_k: 4", "experts: 128, top_k: 8")
    .replace("gpus: 8", "gpus: 16")
    .replace("tokens: 8192", "tokens: 16384")
)

#: Seconds from the cue to the signal (the solver is well into its search), the longest wait for
#: a cue (start-up of the interpreter, Ray), and for the run to end after the signal.
SIGNAL_AFTER = 0.3
CUE_WITHIN = 120.0
END_WITHIN = 60.0
#: Seconds from the signal to 'interrupted' on stderr: the solver stops through its own API, or
#: its child process is killed, at once; a pool or a local Ray is stopped in a few seconds.
SAID_WITHIN = 3.0
SAID_WITHIN_EXECUTOR = 20.0


@dataclass(frozen=True)
class Case:
    """One interrupted run: the method, its parameters, the signal, extra options, and the cue
    ('native': a native solver call, or a child process for one, has started; 'layer': a layer
    is done; a number: seconds after start-up, for a method that runs no native solver)."""

    method: str
    signum: int = signal.SIGINT
    extra: tuple[str, ...] = ()
    cue: str | float = "native"
    params: tuple[tuple[str, object], ...] = ()
    instance: str = SIGINT_INSTANCE

    @property
    def executor(self) -> bool:
        return self.cue == "layer"


_POOL = ("--workers", "2", "--layer-time-limit", "3")
_RAY = ("--ray", "--layer-time-limit", "3")
#: Every method of issue 42 and both executors, stopped by SIGINT or SIGTERM: the two go through
#: one handler; each solver family (CP-SAT, HiGHS through highspy and through Pyomo, the killed
#: child process of SciPy's MILP and of Mt-KaHyPar, plain Python) gets SIGINT, and SIGTERM runs
#: on two families (CP-SAT: gem-cpsat; Pyomo's HiGHS: gem-milp), a pool and a local Ray.
CASES: dict[str, Case] = {
    "tacg-cpsat": Case("tacg-cpsat"),
    "tacg-highs": Case("tacg-highs"),
    "tacg-milp": Case("tacg-milp"),
    "joint-exact": Case("joint-exact", params=tuple(SIGINT_PARAMS["joint-exact"].items())),
    "hypergraph": Case("hypergraph", instance=PARTITION_INSTANCE),
    "crosslayer": Case("crosslayer", instance=PARTITION_INSTANCE),
    "joint": Case("joint", cue=1.5, params=(("evaluations", 10**7),)),
    "tacg-cpsat --workers 2": Case("tacg-cpsat", extra=_POOL, cue="layer", instance=EXECUTOR_INSTANCE),
    "tacg-cpsat --ray": Case("tacg-cpsat", extra=_RAY, cue="layer", instance=EXECUTOR_INSTANCE),
    "gem-cpsat": Case("gem-cpsat"),
    "gem-milp": Case("gem-milp"),
    "gem-cpsat SIGTERM": Case("gem-cpsat", signal.SIGTERM),
    "gem-milp SIGTERM": Case("gem-milp", signal.SIGTERM),
    "gem-milp --workers 2 SIGTERM": Case(
        "gem-milp", signal.SIGTERM, extra=_POOL, cue="layer", instance=EXECUTOR_INSTANCE
    ),
    "tacg-cpsat --ray SIGTERM": Case("tacg-cpsat", signal.SIGTERM, extra=_RAY, cue="layer", instance=EXECUTOR_INSTANCE),
}


def _ray_installed() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    try:
        import psutil
    except ImportError:  # /proc: parent of every process
        parents: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                parents.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [pid]
        while todo:
            kids = parents.get(todo.pop(), [])
            out += kids
            todo += kids
        return out
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _interrupt(name: str, case: Case, root: Path) -> dict:
    """Run ``solve`` in a subprocess, send the signal at the case's cue, report how it ended."""
    out = root / name.replace(" ", "_")
    out.mkdir()
    own = root / f"{out.name}.yaml"  # the instance with this method and its params
    params = "".join(f", {k}: {v}" for k, v in case.params)
    own.write_text(case.instance.replace("method: {name: greedy}", f"method: {{name: {case.method}{params}}}"))
    cmd = [sys.executable, "-c", _LAUNCH, "solve", str(own), "--layer-time-limit", "60", "--quiet", *case.extra]
    cmd += ["--output", str(out / "plan.json"), "--report", str(out / "report.json")]
    read_marks, write_marks = os.pipe()
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "MOEOPT_TEST_METHOD": case.method, "MOEOPT_TEST_MARKS": str(write_marks), "PYTHONPATH": path}
    # a session of its own: Ctrl-C in a terminal signals the run's whole process group (its
    # workers, fork server and child processes too); SIGTERM, as `kill PID`, the run alone
    proc = subprocess.Popen(
        cmd,
        cwd=out,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(write_marks,),
        start_new_session=True,
    )
    os.close(write_marks)
    marks = os.fdopen(read_marks)
    errors: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: errors.extend((time.perf_counter(), ln) for ln in proc.stderr))
    reader.start()
    seen: list[tuple[float, str]] = []

    def wait_for(*cues: str) -> bool:
        for line in marks:
            seen.append((time.perf_counter(), line.strip()))
            if line.strip() in cues:
                return True
        return False  # the run ended first

    cued = wait_for("ready")
    if cued and isinstance(case.cue, float):
        time.sleep(case.cue)
    elif cued:
        cued = wait_for("native start", "fork") if case.cue == "native" else wait_for("layer done")
    sent = None
    children: list[int] = []
    forks = 0  # the run's own forked copies alive at the signal: a native call's child process
    if cued and proc.poll() is None:
        time.sleep(SIGNAL_AFTER)
        children = _descendants(proc.pid)
        forks = sum(_cmdline(pid) == _cmdline(proc.pid) for pid in children)
        sent = time.perf_counter()
        if case.signum == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(case.signum)
    for line in marks:  # until every holder of the pipe (the run and its children) has ended
        seen.append((time.perf_counter(), line.strip()))
    marks.close()
    try:
        proc.wait(timeout=END_WITHIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(30)
    proc.stdout.close()
    ended = time.perf_counter()
    deadline = time.perf_counter() + 15.0  # a local Ray's processes may take a moment to go
    while any(_running(pid) for pid in children) and time.perf_counter() < deadline:
        time.sleep(0.1)
    said = next((t for t, ln in errors if ln.strip() == "interrupted"), None)
    return {
        "returncode": proc.returncode,
        "sent": sent is not None,
        "said": None if sent is None or said is None else said - sent,
        "ended": None if sent is None else ended - sent,
        # the native call ended after the signal, or its child process was running: the signal landed in it
        "in_native": sent is not None and (forks > 0 or any(t > sent and ln == "native end" for t, ln in seen)),
        "stderr": "".join(ln for _, ln in errors),
        "files": sorted(p.name for p in out.iterdir()),  # outputs, temporary files, a core dump
        "children": len(children),
        "stray": [pid for pid in children if _running(pid)],
    }


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """Every case run and interrupted, three at a time (two cores: the solvers share them)."""
    root = tmp_path_factory.mktemp("interrupt")
    jobs = {
        name: case
        for name, case in CASES.items()
        if _available(case.method) and ("--ray" not in case.extra or _ray_installed())
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_interrupt, name, case, root) for name, case in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def _excerpt(text: str, ends: int = 2000) -> str:
    """The head and the tail of a long stderr (a native abort's message comes first, its stack after)."""
    return text if len(text) <= 2 * ends else f"{text[:ends]}\n[...]\n{text[-ends:]}"


@pytest.mark.parametrize("name", list(CASES))
def test_signal_stops_the_run(name, interrupted):
    """SIGINT (SIGTERM): exit 130 (143), 'interrupted' alone on stderr, no file, no core, no process left."""
    if name not in interrupted:
        pytest.skip(f"{name}: not available here")
    case, r = CASES[name], interrupted[name]
    assert r["sent"], f"{name} ended before its cue: {r['stderr'][-2000:]}"
    print(f"{name}: 'interrupted' {r['said']} s, exit {r['ended']:.2f} s after the signal; {r['children']} children")
    assert r["returncode"] == 128 + case.signum, _excerpt(r["stderr"])
    assert r["stderr"] == "interrupted\n", _excerpt(r["stderr"])  # no traceback, no C++ abort, no leaked semaphore
    assert r["files"] == []
    assert r["stray"] == []
    if case.cue == "native":
        assert r["in_native"], f"{name}: the signal did not land in a native solver call"
    assert r["said"] is not None and r["said"] <= (SAID_WITHIN_EXECUTOR if case.executor else SAID_WITHIN)
