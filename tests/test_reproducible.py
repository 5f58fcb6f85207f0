"""Searches and certificates are bounded by work, not by the clock: one seed gives the same plan,
bound and gap on a busy machine."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from moeopt.cli.tables import report_dict
from moeopt.io import load_instance, plan_to_json
from moeopt.registry import get_method
from moeopt.result import Termination
from moeopt.solve import load_workloads, solve

#: Small enough for a quick suite, large enough that every search does real work (kicks,
#: perturbation rounds, screened move queues) and would differ if the clock decided its length.
INSTANCE = """\
name: reproducible
model: {layers: 2, experts: 24, top_k: 2}
cluster: {gpus: 4, replica_slots_per_gpu: 1}
workload:
  synthetic: {tokens: 2048, steps: 16, structure_seed: 7, seed: 0}
profile: {variability: medium, seed: 0, tile: 64}
method: {name: greedy}
"""

#: Every method with a randomized or iterated search (parameters keep the suite short).
SEARCHES: dict[str, dict | None] = {
    "gem": None,
    "tacg": None,
    "agnostic": None,
    "joint": {"evaluations": 200},
    "balance": None,
    "gesr": None,
    "hottest-replication": None,
    "random-replication": None,
    "crosslayer": None,
    "hypergraph": {"runs": 2},
    "metis": {"refine": True},
    "random": None,
}


def _spin() -> None:  # pragma: no cover  (runs in the hog processes)
    while True:
        pass


@contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[None]:
    """Processes spinning on every core while the block runs."""
    ctx = multiprocessing.get_context("spawn")
    hogs = [ctx.Process(target=_spin, daemon=True) for _ in range(processes or os.cpu_count() or 2)]
    for p in hogs:
        p.start()
    time.sleep(0.5)
    assert all(p.is_alive() for p in hogs), "the CPU hog did not start"
    try:
        yield
    finally:
        for p in hogs:
            p.terminate()
        for p in hogs:
            p.join(5)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The instance and its loaded workloads."""
    path = tmp_path_factory.mktemp("reproducible") / "reproducible.yaml"
    path.write_text(INSTANCE)
    inst = load_instance(path)
    return inst, load_workloads(inst)


def _plan_bytes(result) -> bytes:
    return json.dumps(plan_to_json(result.plan, result.method, result.params), sort_keys=True).encode()


@pytest.mark.parametrize("name", list(SEARCHES))
def test_same_seed_same_plan_under_load(name, case):
    """Two runs with one seed, the second beside a CPU hog on every core: byte-identical plans."""
    if not get_method(name).available():
        pytest.skip(f"{name} is not available here")
    inst, wl = case
    params = SEARCHES[name]
    quiet = solve(inst, method=name, params=params, seed=11, workloads=wl)
    with cpu_hog():
        busy = solve(inst, method=name, params=params, seed=11, workloads=wl)
    # the clock never decided: no cap bound in either run
    assert quiet.termination is not Termination.TIME_LIMIT and busy.termination is not Termination.TIME_LIMIT
    assert _plan_bytes(quiet) == _plan_bytes(busy)


def test_another_seed_gives_another_plan(case):
    """The comparison above can fail: plans depend on the seed."""
    inst, wl = case
    a = solve(inst, method="random", seed=11, workloads=wl)
    b = solve(inst, method="random", seed=12, workloads=wl)
    assert _plan_bytes(a) != _plan_bytes(b)


@pytest.mark.parametrize("name", ["gem", "tacg", "joint"])
def test_a_binding_cap_is_reported(name, case):
    """When the clock, not the work bound, ends a search, the result says so."""
    inst, wl = case
    endless = {
        "gem": {"rounds": 10**6, "patience": 10**6},
        "tacg": {"iterations": 10**6, "patience": 10**6},
        "joint": {"evaluations": 10**7},
    }[name]
    r = solve(inst, method=name, params=endless, layer_time_limit=0.3, workloads=wl)
    assert r.termination is Termination.TIME_LIMIT
    assert "time limit" in str(r.stats.get("note"))


# ----------------------------------------------------------------------------- certificates
#: Small, with certificates that do real work: the cover LPs of joint and crosslayer are solved by
#: column generation (4 slots per GPU: exact pricing by enumeration) and stay above their trivial
#: values, tacg's column generation prices and proves its LP, and its SDP runs SCS and the polish.
CERT_INSTANCE = """\
name: reproducible-certificates
model: {layers: 2, experts: 24, top_k: 6}
cluster: {gpus: 8, token_home: previous-layer}
workload:
  synthetic: {tokens: 1024, steps: 8, structure_seed: 7, seed: 0, layer_dependency: 0.5}
method: {name: greedy}
"""

#: The certified methods, with parameters that keep their searches short (the certificates keep
#: their default work budgets): name -> (method, params)
CERTIFIED: dict[str, tuple[str, dict]] = {
    "joint": ("joint", {"evaluations": 200, "restarts": 1}),
    "crosslayer": ("crosslayer", {"sweeps": 2}),
    "tacg auto": ("tacg", {"certificate": "auto", "iterations": 100}),
    "tacg sdp": ("tacg", {"certificate": "sdp", "iterations": 100}),
}

#: report keys that hold wall times (seconds, timings, the history's clock), the only fields two
#: runs may differ in
WALL = re.compile(r"seconds|time|wall")


def without_wall_times(value: object) -> object:
    """``value`` (a report) without the keys that hold wall times, recursively."""
    if isinstance(value, dict):
        return {k: without_wall_times(v) for k, v in value.items() if not WALL.search(str(k))}
    if isinstance(value, list):
        return [without_wall_times(v) for v in value]
    return value


@pytest.fixture(scope="module")
def cert_case(tmp_path_factory):
    """The certificates' instance and its loaded workloads."""
    path = tmp_path_factory.mktemp("certificates") / "certificates.yaml"
    path.write_text(CERT_INSTANCE)
    inst = load_instance(path)
    return inst, load_workloads(inst)


@pytest.mark.parametrize("case_name", list(CERTIFIED))
def test_same_certificate_under_load(case_name, cert_case):
    """Two runs of a certified method, the second beside a CPU hog on every core: the same report
    (plan, bound, gap, certificate records) apart from wall times."""
    name, params = CERTIFIED[case_name]
    inst, wl = cert_case
    quiet = solve(inst, method=name, params=params, seed=5, workloads=wl)
    with cpu_hog():
        busy = solve(inst, method=name, params=params, seed=5, workloads=wl)
    assert quiet.bound is not None and quiet.gap is not None
    # the work budgets, not the clock, ended every part: nothing was capped
    assert quiet.termination is not Termination.TIME_LIMIT and busy.termination is not Termination.TIME_LIMIT
    a, b = (without_wall_times(report_dict(r, inst.name)) for r in (quiet, busy))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_a_binding_certificate_cap_is_reported(cert_case):
    """A time limit too short for the certificate's work stops it and says so (termination and note)."""
    inst, wl = cert_case
    r = solve(
        inst,
        method="tacg",
        params={"certificate": "sdp", "iterations": 100, "sdp_iterations": 10**6},
        layer_time_limit=0.5,
        workloads=wl,
    )
    assert r.termination is Termination.TIME_LIMIT
    assert "certificate" in str(r.stats.get("note"))
    assert any(rec["sdp"]["capped"] for rec in r.stats["certificate"])
