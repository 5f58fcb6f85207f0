"""The ``solver`` parameter of the Pyomo models: every available solver against brute force and HiGHS on
tiny exact instances, one status model for all, time limits and Ctrl-C leave no solver process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from moeopt.errors import InputError
from moeopt.profile import Profile
from moeopt.registry import get_method, parse_params
from moeopt.result import PYOMO_LEGACY_TERMINATION, PYOMO_TERMINATION, Status, Termination, pyomo_termination
from moeopt.solvers import ExactSettings, grouping_milp, pyomo_solvers
from moeopt.solvers.gem_models import layer_model, solve_milp
from moeopt.solvers.pyomo_solvers import SOLVERS, available
from moeopt.solvers.replication import solve_replication_bound_pyomo
from tests.grouping_cases import brute_force, make_problem, random_grouping, run
from tests.test_gem import brute_force as gem_brute_force
from tests.test_gesr import brute_force as replication_brute_force
from tests.test_limits import ROOT, SIGINT_INSTANCE, Case, _descendants, _interrupt, _running

#: Every solver, skipped with its install line where it is missing.
EVERY = [
    pytest.param(
        name, marks=pytest.mark.skipif(not available(name), reason=f"{name} missing: {pyomo_solvers.INSTALL[name]}")
    )
    for name in SOLVERS
]


def _solver_processes() -> list[int]:
    """This process's children that are solver executables (cbc, glpsol, cplex), still running."""
    return [pid for pid in _descendants(os.getpid()) if _comm(pid) in ("cbc", "glpsol", "cplex") and _running(pid)]


# ----------------------------------------------------------------------------- status model
def test_legacy_and_v2_conditions_map_alike():
    """Pyomo's legacy and v2 condition names land on the same terminations."""
    assert pyomo_termination("optimal") is pyomo_termination("convergenceCriteriaSatisfied") is Termination.OPTIMAL
    assert pyomo_termination("maxTimeLimit") is Termination.TIME_LIMIT
    assert pyomo_termination("infeasible") is pyomo_termination("provenInfeasible") is Termination.INFEASIBLE
    assert pyomo_termination("userInterrupt") is pyomo_termination("interrupted") is Termination.INTERRUPTED
    assert pyomo_termination("feasible") is Termination.TIME_LIMIT  # GLPK's early stop
    assert pyomo_termination("no such name") is Termination.ERROR


def test_every_legacy_condition_is_mapped():
    """Every condition of Pyomo's legacy interfaces (CBC, GLPK, CPLEX) has an entry; none unknown."""
    from pyomo.opt import TerminationCondition

    for condition in TerminationCondition:
        assert condition.name in PYOMO_TERMINATION or condition.name in PYOMO_LEGACY_TERMINATION, condition.name


def test_availability_names_every_solver():
    """One row per solver; HiGHS (a core dependency) is there; a missing one says how to install it."""
    rows = pyomo_solvers.availability()
    assert [r[0] for r in rows] == list(SOLVERS)
    assert rows[0][1] and "highs" in rows[0][2]
    for name, ok, how in rows:
        assert ok == available(name)
        assert ok or how.startswith("missing: ")


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: .ci/run installs the scip extra")
def test_ci_has_a_second_free_solver():
    """CI installs SCIP from the package index (the scip extra), so its tests below run there, not skip."""
    assert available("scip"), pyomo_solvers.INSTALL["scip"]


def test_unknown_and_missing_solver_are_input_errors(monkeypatch):
    """A misspelt solver names the parameter; a solver not installed says how to install it."""
    method = get_method("tacg-milp")
    with pytest.raises(InputError, match=r"method\.solver.*must be one of highs, cbc"):
        parse_params(method, {"solver": "cpsat"})
    with pytest.raises(InputError, match=r"method\.solver.*must be one of"):
        parse_params(get_method("gem-milp"), {"solver": "xpress"})
    monkeypatch.setattr(pyomo_solvers, "_present", lambda needs: needs == "module:highspy")
    with pytest.raises(InputError, match=r"solver 'cbc' is not available here; a cbc executable on PATH"):
        run("tacg-milp", make_problem(E=8, G=4, L=1, tokens=500), solver="cbc")
    with pytest.raises(InputError, match=r"solver 'scip' is not available here; pip install 'moeopt\[scip\]'"):
        grouping_milp.solve(random_grouping(np.random.default_rng(0), E=5, G=2), ExactSettings(1.0, solver="scip"))


# ----------------------------------------------------------------------------- answers
@pytest.mark.parametrize("solver", EVERY)
def test_grouping_milp_matches_brute_force(solver):
    """tacg-milp's model: optimal, certified (bound = objective) and equal to brute force and to HiGHS."""
    for seed, limited in [(1, True), (2, False), (3, True)]:
        g = random_grouping(np.random.default_rng(seed), E=7, G=3, limited=limited)
        _, opt = brute_force(g)
        hint = brute_force(random_grouping(np.random.default_rng(seed), E=7, G=3, limited=False))[0]
        out = grouping_milp.solve(g, ExactSettings(time_limit=20.0, hint=hint, solver=solver))
        ref = grouping_milp.solve(g, ExactSettings(time_limit=20.0, solver="highs"))
        assert out.status is Status.OPTIMAL and out.termination is Termination.OPTIMAL, out.solver_status
        assert out.warm_start or solver not in ("highs", "cbc", "scip")  # GLPK takes no start
        assert g.feasible(out.home)
        assert g.objective(out.home) == pytest.approx(opt, rel=1e-6, abs=1e-9)
        assert out.bound == pytest.approx(opt, rel=1e-5, abs=1e-9)
        assert g.objective(out.home) == pytest.approx(g.objective(ref.home), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("solver", EVERY)
def test_gem_milp_matches_brute_force(solver):
    """gem-milp's model (affine and stepped profiles): the brute-force optimum, proved, as HiGHS."""
    rng = np.random.default_rng(11)
    n = rng.integers(0, 60, size=(3, 4)).astype(float)
    affine = Profile(
        tile=16, latency=np.array([[0.2, 0.5, 0.8, 1.1, 1.4, 1.7, 2.0], [0.3, 0.9, 1.5, 2.1, 2.7, 3.3, 3.9]])
    )
    stepped = Profile(
        tile=16, latency=np.array([[0.2, 0.2, 1.0, 1.0, 2.5, 2.5, 4.0], [0.3, 0.8, 0.8, 2.0, 2.0, 2.0, 5.0]])
    )
    for profile in (affine, stepped):
        exact = gem_brute_force(n, profile, 3)
        model = layer_model(n, profile, 3)
        out = solve_milp(model, time_limit=20.0, hint=np.array([0, 1, 0, 1]), solver=solver)
        ref = solve_milp(model, time_limit=20.0, solver="highs")
        assert out.status is Status.OPTIMAL, out.solver_status
        assert out.incumbent == pytest.approx(exact, rel=1e-6)
        assert out.bound == pytest.approx(exact, rel=1e-5)
        assert out.incumbent == pytest.approx(ref.incumbent, rel=1e-6)


@pytest.mark.parametrize("solver", EVERY)
def test_replication_bound_matches_brute_force(solver):
    """The replication MILP in Pyomo: the brute-force optimum (MaxVio), as HiGHS."""
    cases = [
        (np.zeros(3, dtype=np.int64), np.full(3, 3.0), 2, 1),
        (np.array([0, 0, 1, 0]), np.array([9.0, 4, 1, 7]), 2, 1),
    ]
    for home, load, G, S in cases:
        exact = replication_brute_force(home, load, G, S)
        cert = solve_replication_bound_pyomo(home, load, G, S, time_limit=20, solver=solver)
        ref = solve_replication_bound_pyomo(home, load, G, S, time_limit=20)
        assert cert.status is Status.OPTIMAL
        assert cert.bound == pytest.approx(exact, abs=1e-6) and cert.best == pytest.approx(exact, abs=1e-6)
        assert cert.best == pytest.approx(ref.best, abs=1e-6)


@pytest.mark.parametrize("solver", EVERY)
def test_tacg_milp_method_takes_the_solver(solver):
    """The registered method with ``solver:`` gives HiGHS's certified objective."""
    problem = make_problem(E=8, G=4, L=1, tokens=500)
    res = run("tacg-milp", problem, solver=solver, certificate="cheap")
    ref = run("tacg-milp", problem, certificate="cheap")
    assert res.params["solver"] == solver
    assert res.status is Status.OPTIMAL and ref.status is Status.OPTIMAL
    assert res.objective == pytest.approx(ref.objective, rel=1e-6)


@pytest.mark.parametrize("solver", EVERY)
def test_time_limit_is_reported_alike(solver):
    """Stopped by its time limit: a time_limit termination, a bound (if any) on the right side, no process left."""
    rng = np.random.default_rng(0)
    E = 24
    A = rng.random((E, E))
    A = (A + A.T) / 2
    np.fill_diagonal(A, 0.0)
    load = rng.dirichlet(np.full(E, 1.5))
    g = random_grouping(rng, E=E, G=4, limited=False).replace(graph=A, load=load)
    g = g.replace(load_limit=1.1 * g.min_max_load())
    t0 = time.perf_counter()
    out = grouping_milp.solve(g, ExactSettings(time_limit=0.5, solver=solver, refuse=False))
    assert time.perf_counter() - t0 < 8.0
    assert out.termination in (Termination.TIME_LIMIT, Termination.OPTIMAL), out.solver_status
    if out.termination is Termination.TIME_LIMIT:
        assert out.status in (Status.TIME_LIMIT, Status.NO_SOLUTION)
    if out.home is not None and out.bound is not None:
        assert out.bound >= g.objective(out.home) - 1e-6
    assert _solver_processes() == []


# ----------------------------------------------------------------------------- Ctrl-C
#: One layer of 32 experts on 4 GPUs: the solvers search for seconds on it, and Pyomo builds it fast.
SIGNAL_INSTANCE = SIGINT_INSTANCE.replace("layers: 2, experts: 64", "layers: 1, experts: 32").replace(
    "gpus: 8", "gpus: 4"
)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


@pytest.mark.parametrize(
    ("extra", "signum"),
    [((), signal.SIGINT), (("--workers", "2"), signal.SIGTERM)],
    ids=["serial SIGINT", "pool SIGTERM"],
)
def test_signal_kills_a_solver_executable(extra, signum, tmp_path):
    """Ctrl-C (serial run) or SIGTERM (pool workers) while CBC runs: exit 130 / 143, 'interrupted', cbc gone."""
    if not available("cbc"):
        pytest.skip("cbc missing")
    inst = tmp_path / "cbc.yaml"
    text = SIGNAL_INSTANCE.replace("method: {name: greedy}", "method: {name: tacg-milp, solver: cbc}")
    inst.write_text(text.replace("layers: 1", "layers: 2") if extra else text)
    cmd = [sys.executable, "-m", "moeopt", "solve", str(inst), "--time-limit", "60", "--quiet", *extra]
    cmd += ["--output", str(tmp_path / "plan.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, solver = time.monotonic() + 90, []
    while not solver and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        solver = [pid for pid in _descendants(proc.pid) if _comm(pid) == "cbc"]
    assert solver, "cbc never started"
    time.sleep(0.3)
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert err == "interrupted\n", err[-2000:]
    deadline = time.monotonic() + 5.0  # a pool worker takes the solver down as it ends
    while any(_running(pid) for pid in solver) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in solver)
    assert not (tmp_path / "plan.json").exists()


def test_signal_stops_a_solver_library(tmp_path):
    """Ctrl-C while SCIP (a library: in a child process under the command line) solves: exit 130, no process left."""
    if not available("scip"):
        pytest.skip("scip missing")
    case = Case("tacg-milp", params=(("solver", "scip"), ("certificate", "cheap")), instance=SIGNAL_INSTANCE)
    r = _interrupt("scip", case, tmp_path)
    assert r["sent"], r["stderr"][-2000:]
    assert r["returncode"] == 130 and r["stderr"] == "interrupted\n", r["stderr"][-2000:]
    assert r["in_native"] and r["stray"] == [] and r["files"] == []
