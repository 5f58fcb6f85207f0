"""--time-limit bounds every method's whole run; Ctrl-C stops every method at once (exit 130, no files)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from moeopt.budget import Budget, run_interruptible
from moeopt.io import load_instance
from moeopt.registry import get_method, method_names
from moeopt.solve import load_workloads, solve

ROOT = Path(__file__).resolve().parents[1]

#: Seconds per layer in the limit test, and what a run may add to L x T x 1.1 that no phase can
#: cut: scoring on the evaluation workload, one Mt-KaHyPar call, building an exact model, slot
#: repair (which must finish for the plan to be feasible) -- on a busy two-core machine.
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

#: Larger, for Ctrl-C: every search and exact model is still running a second after start.
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

#: Methods that may finish (in well under a second) before a signal sent a second after start
#: reaches them: for these the Ctrl-C test also accepts a complete run (exit 0, or killed by the
#: signal in the interpreter's teardown after both files were written).
FAST = {"balance", "eplb", "greedy", "linear", "metis", "random", "round_robin", "speed-greedy"}


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


def test_run_interruptible_raises_keyboard_interrupt_and_stops_the_solver():
    """SIGINT during a native-style blocking call calls stop() and raises KeyboardInterrupt."""
    stopped = threading.Event()

    def blocking() -> str:
        stopped.wait(10.0)
        return "finished"

    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            run_interruptible(blocking, stopped.set)
        assert time.perf_counter() - t0 < 2.0
        assert stopped.is_set()
        assert run_interruptible(lambda: 3) == 3  # no signal: the value comes back
    finally:
        signal.signal(signal.SIGINT, previous)


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
    """solve() with --time-limit T per layer ends within L x T x 1.1 plus a fixed allowance."""
    if not _available(name):
        pytest.skip(f"{name} is not available here")
    inst, wl = limit_case
    layers = inst.model.layers
    t0 = time.perf_counter()
    result = solve(inst, method=name, params=PARAMS.get(name), time_limit=LIMIT, workloads=wl)
    wall = time.perf_counter() - t0
    bound = layers * LIMIT * 1.1 + ALLOWANCE
    print(f"{name}: {wall:.2f} s for a bound of {bound:.2f} s ({result.termination.value})")
    assert result.plan is not None
    assert wall <= bound, f"{name} ran {wall:.2f} s, more than {layers} x {LIMIT} s x 1.1 + {ALLOWANCE} s"


# ----------------------------------------------------------------------------- Ctrl-C
#: The CLI's main() after its imports, the method's backend included (``available()``;
#: torch for eplb): 'ready' on stderr marks where a run starts (what ``python -m moeopt``
#: runs, with a marker so that the signal never lands in an import of native code).
_LAUNCH = (
    "import os, sys, moeopt.cli, moeopt.methods, moeopt.solve\n"
    "from moeopt.registry import get_method\n"
    "get_method(os.environ['MOEOPT_TEST_METHOD']).available()\n"
    "sys.stderr.write('ready\\n'); sys.stderr.flush()\n"
    "raise SystemExit(moeopt.cli.main(sys.argv[1:]))\n"
)
#: Seconds from 'ready' to the signal (the instance loads, the method starts), and how long the
#: run may take to stop after it.
SIGNAL_AFTER = 1.0
STOP_WITHIN = 1.5
#: The interpreter's teardown after main() returned (torch, OR-Tools, Pyomo modules) on a busy
#: two-core machine; a run that goes on after the signal (the old behaviour) takes a minute.
EXIT_WITHIN = 10.0
#: A process pool holds Ctrl-C back until its workers have started (so that it can stop them
#: all): the pool case is signalled once the fork server has loaded moeopt.
POOL_SIGNAL_AFTER = 4.0


def _interrupt(name: str, instance: Path, out: Path, extra: tuple[str, ...] = (), after: float = SIGNAL_AFTER) -> dict:
    """Run ``solve`` in a subprocess, SIGINT it after start-up, report how it ended."""
    out.mkdir(parents=True, exist_ok=True)
    own = out.parent / f"{out.name}.yaml"  # the instance with this method and its params
    params = "".join(f", {k}: {v}" for k, v in {**PARAMS.get(name, {}), **SIGINT_PARAMS.get(name, {})}.items())
    own.write_text(instance.read_text().replace("method: {name: greedy}", f"method: {{name: {name}{params}}}"))
    cmd = [
        sys.executable,
        "-c",
        _LAUNCH,
        "solve",
        str(own),
        "--time-limit",
        "60",
        "--output",
        str(out / "plan.json"),
        "--report",
        str(out / "report.json"),
        "--quiet",
        *extra,
    ]
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "MOEOPT_TEST_METHOD": name, "PYTHONPATH": path}
    # a shell or runner that started us in the background may ignore SIGINT: the child must not
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stderr.readline()
    if first.strip() != "ready":
        proc.kill()
        rest = proc.communicate()[1]
        return {"returncode": None, "stderr": first + rest}
    time.sleep(after)
    sent = time.perf_counter()
    finished_before = proc.poll() is not None
    if not finished_before:
        proc.send_signal(signal.SIGINT)
    lines, said = [], None
    for line in proc.stderr:  # until the child closes stderr: it has ended
        lines.append(line)
        if line.strip() == "interrupted" and said is None:
            said = time.perf_counter() - sent
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return {
        "returncode": proc.returncode,
        "said": said,  # seconds from the signal to the 'interrupted' line
        "exit": time.perf_counter() - sent,  # ... to the end of the process (teardown included)
        "stderr": "".join(lines),
        "finished_before": finished_before,
        "files": sorted(p.name for p in out.iterdir()),
    }


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """Every available method run and interrupted, four at a time."""
    root = tmp_path_factory.mktemp("sigint")
    instance = root / "sigint.yaml"
    instance.write_text(SIGINT_INSTANCE)
    names = [n for n in method_names() if _available(n)]
    jobs = {n: (n, instance, root / n) for n in names}
    jobs["tacg --workers 2"] = ("tacg", instance, root / "tacg-workers", ("--workers", "2"), POOL_SIGNAL_AFTER)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(_interrupt, *v) for k, v in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("name", [*method_names(), "tacg --workers 2"])
def test_sigint_stops_the_run(name, interrupted):
    """Ctrl-C: 'interrupted' (one line on stderr) within STOP_WITHIN s, exit 130, no output file."""
    if name not in interrupted:
        pytest.skip(f"{name} is not available here")
    r = interrupted[name]
    assert r["returncode"] is not None, r["stderr"]
    if r["returncode"] in (0, -signal.SIGINT) and name in FAST:  # done before the signal: a complete run
        assert r["files"] == ["plan.json", "report.json"]
        return
    print(f"{name}: 'interrupted' {r['said']} s, exit {r['exit']:.2f} s after SIGINT")
    assert r["returncode"] == 130, r["stderr"][-2000:]
    assert r["stderr"].strip().splitlines().count("interrupted") == 1, r["stderr"][-2000:]
    assert r["stderr"].strip().splitlines()[-1] == "interrupted", r["stderr"][-2000:]
    assert "Traceback" not in r["stderr"]
    assert r["said"] <= STOP_WITHIN
    assert r["exit"] <= EXIT_WITHIN
    assert r["files"] == []
