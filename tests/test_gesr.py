"""GESR: generic score, replica placement, the online guard and the replication certificate."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.dispatch import guard_layer, route_trace
from moeopt.errors import InputError
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.io import load_instance
from moeopt.methods.gesr import (
    generic_score,
    place_replicas,
    random_replicas,
    select_generic,
)
from moeopt.plan import Dispatch, Plan
from moeopt.registry import Context, Problem, get_method, parse_params
from moeopt.solve import load_workloads, solve
from moeopt.solvers.replication import (
    optimal_split_maxvio,
    replica_count_bound,
    solve_replication_bound,
    solve_replication_bound_pyomo,
)
from moeopt.synth import SynthSpec, synthesize
from moeopt.trace import stats_from_counts
from tests.conftest import INSTANCES
from tests.strategies import float_arrays, int_arrays, small_case

REPLICATION = ("gesr", "hottest-replication", "random-replication")


def synthetic_problem(E=16, G=4, k=2, S=1, layers=2, tokens=1024, seed=0, counts_only=False) -> Problem:
    trace = synthesize(SynthSpec(layers=layers, experts=E, top_k=k, tokens=tokens, seed=seed))
    model = Model(layers=layers, experts=E, top_k=k)
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=-(-E // G), replica_slots_per_gpu=S)
    inst = Instance("t", model, cluster, Workload(WorkloadSource(synthetic={})), MethodSpec("gesr"))
    if counts_only:
        stats = stats_from_counts(trace.stats().counts, top_k=k, family_names=trace.family_names)
        return Problem(inst, stats, None)
    return Problem(inst, trace.stats(), trace)


def run(name: str, problem: Problem, **params) -> object:
    impl = get_method(name)
    return impl.solve(problem, parse_params(impl, {"base": "greedy", "certificate": False, **params}), Context())


def holds_matrix(plan: Plan, layer: int, gpus: int) -> np.ndarray:
    copies = plan.copies(layer)
    holds = np.zeros((plan.experts, gpus), dtype=bool)
    e, w = np.nonzero(copies >= 0)
    holds[e, copies[e, w]] = True
    return holds


# ----------------------------------------------------------------------------- score
def test_generic_score_terms():
    """An expert used alike by every family scores consistency 1, deviation 0; a specialist not."""
    usage = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])
    s = generic_score(usage, np.array([0.5, 0.5]))
    assert s.centrality[0] == pytest.approx(1.0)
    assert s.consistency[0] == pytest.approx(1.0) and s.deviation[0] == pytest.approx(0.0)
    assert s.consistency[1] == pytest.approx(0.0) and s.deviation[1] > 10
    assert s.score[0] > s.score[1]
    assert list(select_generic(s, 1, floor=0.0)) == [0]
    assert list(select_generic(s, 5, floor=0.9)) == [0]  # the floor removes the specialists


# ----------------------------------------------------------------------------- placement
@st.composite
def replica_cases(draw: st.DrawFn) -> tuple:
    """(G, S, r, order, home, load, affinity): a drawn layer for structural replica placement."""
    G = draw(st.integers(2, 6))
    E = draw(st.integers(G, 3 * G))
    a = draw(float_arrays((E, E), 0.0, 1.0))
    a = a + a.T
    np.fill_diagonal(a, 0)
    order = np.array(draw(st.permutations(range(E))), dtype=np.int64)
    return (
        G,
        draw(st.integers(0, 3)),
        draw(st.integers(1, 3)),
        order,
        draw(int_arrays(E, 0, G - 1)),
        draw(float_arrays(E, 0.0, 1.0)),
        a,
    )


@given(replica_cases())
@settings(max_examples=30)
def test_place_replicas_respects_slots(case):
    """Structural placement: at most S per GPU, never on the home GPU, never twice on a GPU."""
    G, S, r, order, home, load, a = case
    E = len(home)
    reps = place_replicas(order, home, load, G, S, copies_each=r, affinity=a)
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=E, replica_slots_per_gpu=S)
    Plan.from_homes(home[None], (reps,), gpus=G).check(cluster, own=True)
    assert len(reps) == min(G * S, len(reps))
    assert np.bincount(reps[:, 0], minlength=E).max(initial=0) <= r


def test_placement_follows_structural_fit_then_load():
    """The replica goes where its coactivated experts live; equal fits pick the lighter GPU."""
    home = np.array([0, 1, 2, 2])
    a = np.zeros((4, 4))
    a[0, 1] = a[1, 0] = 1.0
    load = np.array([4.0, 1.0, 1.0, 1.0])
    assert place_replicas(np.array([0]), home, load, 3, 1, affinity=a).tolist() == [[0, 1]]
    # no coactivation (count-only): GPU 1 (load 1) beats GPU 2 (load 2)
    assert place_replicas(np.array([0]), home, load, 3, 1, affinity=None).tolist() == [[0, 1]]
    assert place_replicas(np.array([0]), np.array([0, 2, 1, 1]), load, 3, 1).tolist() == [[0, 2]]


@given(
    st.integers(2, 5).flatmap(lambda G: st.tuples(st.just(G), st.integers(G, 4 * G))),
    st.integers(0, 999),
    st.sampled_from(REPLICATION),
    st.integers(0, 3),
    st.booleans(),
)
@settings(max_examples=12)
def test_replica_constraints_hold(shape, seed, name, S, counts_only):
    """Every replication method's plan passes Plan.check for any budget, trace or counts."""
    G, E = shape
    p = synthetic_problem(E=E, G=G, k=min(2, E), S=S, tokens=256, seed=seed, counts_only=counts_only)
    res = run(name, p)
    res.plan.check(p.instance.cluster, layers=p.layers, experts=p.experts)
    assert all(len(r) <= G * S for r in res.plan.replicas)


@pytest.mark.parametrize("name", REPLICATION)
def test_zero_slots_return_the_base_plan(name):
    """With replica_slots_per_gpu = 0 the plan is the base plan, unchanged, without replicas."""
    p = synthetic_problem(S=0)
    base = get_method("greedy").solve(p, parse_params(get_method("greedy"), {}), Context())
    res = run(name, p)
    assert np.array_equal(res.plan.home, base.plan.home)
    assert not res.plan.has_replicas


def test_gesr_replicates_generic_experts_and_helps_balance():
    """On a task-structured trace GESR adds replicas and lowers an unbalanced base's MaxVio."""
    p = synthetic_problem(E=16, G=4, k=2, S=2, tokens=4096)
    res = run("gesr", p, base="linear")
    assert sum(len(r) for r in res.plan.replicas) > 0
    assert res.objective < res.stats["base_calibration_maxvio"]


def test_unknown_base_is_a_clear_error():
    """A base method that is not registered fails loudly, naming the registered ones."""
    p = synthetic_problem()
    with pytest.raises(InputError, match="not registered.*greedy"):
        run("gesr", p, base="no-such-method")
    with pytest.raises(InputError, match="itself a replication method"):
        run("gesr", p, base="gesr")


def test_random_replicas_fill_budget():
    """Random replication uses exactly the budget when experts are plentiful."""
    reps = random_replicas(np.repeat(np.arange(4), 4), 4, 2, 8, np.random.default_rng(0))
    assert len(reps) == 8 and np.bincount(reps[:, 1], minlength=4).tolist() == [2, 2, 2, 2]


# ----------------------------------------------------------------------------- guard
@given(small_case(replicas=True), st.floats(0, 8), st.floats(0, 0.99), st.sampled_from([None, 1, 3]))
def test_guard_sends_tokens_only_to_holders(case, lam, decay, batch):
    """The guard never sends a token to a GPU lacking the expert; loads sum to tokens*k*L."""
    cluster, trace, plan = case
    plan = plan.with_dispatch(Dispatch("locality", lam, decay, batch))
    gpu = route_trace(plan, trace, cluster).gpu
    for l in range(trace.layers):
        holds = holds_matrix(plan, l, cluster.gpus)
        assert holds[trace.topk[:, l, :].astype(np.int64), gpu[:, l, :]].all()
    m = evaluate(plan, trace, cluster)
    assert m["total_load"] == trace.tokens * trace.top_k * trace.layers
    assert np.asarray(m["loads"]).sum(axis=1).tolist() == [trace.tokens * trace.top_k] * trace.layers


@given(small_case(replicas=False))
def test_no_replicas_is_home_dispatch(case):
    """Without replicas every assignment runs on the expert's home GPU."""
    cluster, trace, plan = case
    gpu = route_trace(plan.with_dispatch(Dispatch("locality", 3.0, 0.5, 2)), trace, cluster).gpu
    for l in range(trace.layers):
        assert np.array_equal(gpu[:, l, :], plan.home[l][trace.topk[:, l, :]])


def test_guard_keeps_a_token_on_one_gpu():
    """Two replicated experts of one token end up together (not chasing each other's home)."""
    copies = np.array([[0, 1], [1, 0], [2, -1], [3, -1]])
    topk = np.array([[0, 1]] * 8)
    gpu = guard_layer(topk, np.zeros(8, dtype=np.int64), copies, 4, Dispatch("locality", lam=0.0))
    assert (gpu[:, 0] == gpu[:, 1]).all()


def test_guard_locality_and_load():
    """λ = 0 follows locality (the token's other expert); a large λ spreads a hot expert."""
    # expert 0 on GPUs 0 and 1; expert 2 lives on GPU 1, so tokens (0, 2) prefer GPU 1
    copies = np.array([[0, 1], [0, -1], [1, -1], [2, -1]])
    n = 400
    topk = np.stack([np.zeros(n, dtype=np.int64), np.full(n, 2)], axis=1)
    step = np.repeat(np.arange(20), 20)
    local = guard_layer(topk, step, copies, 3, Dispatch("locality", lam=0.0))
    assert (local[:, 0] == 1).all()
    spread = guard_layer(topk, step, copies, 3, Dispatch("locality", lam=50.0, decay=0.5, batch_tokens=5))
    # GPU 1 already runs expert 2 for every token: balance wants expert 0 on GPU 0
    assert (spread[:, 0] == 0).mean() > 0.6


def test_guard_lambda_lowers_maxvio_on_hot_replicas():
    """On hottest-first replicas the load-aware guard beats pure locality on MaxVio."""
    p = synthetic_problem(E=16, G=4, k=2, S=2, tokens=4096)
    res = run("hottest-replication", p)
    trace, c = p.trace, p.instance.cluster
    pure = evaluate(res.plan, trace, c, dispatch=Dispatch("locality", lam=0.0))["maxvio"]
    aware = evaluate(res.plan, trace, c, dispatch=Dispatch("locality", lam=4.0, decay=0.9, batch_tokens=32))["maxvio"]
    assert aware < pure


def test_solve_uses_the_methods_guard():
    """A GESR plan carries the guard settings of its parameters as its dispatch rule."""
    inst = load_instance(INSTANCES / "gesr-small.yaml")
    inst = inst.replace(method=replace(inst.method, params={**inst.method.params, "base": "greedy"}))
    wl = load_workloads(inst)
    res = solve(inst, params={"base": "greedy", "lam": 3.0, "decay": 0.5}, workloads=wl)
    assert res.plan.dispatch == Dispatch("locality", lam=3.0, decay=0.5, batch_tokens=32)
    m = evaluate(res.plan, wl.evaluation, inst.cluster)
    assert res.metrics["maxvio"] == pytest.approx(m["maxvio"])
    assert res.metrics["replication_bound_maxvio"] <= res.metrics["maxvio"] + 1e-9
    assert res.bound is not None and res.bound <= res.objective + 1e-9


def test_bundled_instance_solves():
    """instances/gesr-small.yaml solves with its own method and base."""
    res = solve(load_instance(INSTANCES / "gesr-small.yaml"))
    assert res.method == "gesr" and res.plan.has_replicas
    assert 0.0 <= res.metrics["replication_gap"]


# ----------------------------------------------------------------------------- certificate
def brute_force(home: np.ndarray, load: np.ndarray, G: int, S: int) -> float:
    """Lowest optimally-split MaxVio over every replica choice with S slots per GPU."""
    E = len(home)
    per_gpu = []
    for g in range(G):
        options = [e for e in range(E) if home[e] != g]
        per_gpu.append([c for n in range(S + 1) for c in itertools.combinations(options, n)])
    best = np.inf
    for choice in itertools.product(*per_gpu):
        reps = np.array([(e, g) for g, es in enumerate(choice) for e in es], dtype=np.int64).reshape(-1, 2)
        best = min(best, optimal_split_maxvio(home, reps, load, G))
    return best


BACKENDS = {"highspy": solve_replication_bound, "pyomo": solve_replication_bound_pyomo}


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.data(), st.integers(2, 3), st.integers(1, 2), st.booleans())
@settings(max_examples=12)
def test_certificate_matches_brute_force(backend, data, G, S, crowded):
    """The MILP's optimum equals the brute-force optimum over all replica choices."""
    E = data.draw(st.integers(G, 4 if S == 1 else 3), label="E")
    # crowded: every expert on GPU 0, so the budget binds and the optimum is often above 0
    home = np.zeros(E, dtype=np.int64) if crowded else data.draw(int_arrays(E, 0, G - 1), label="home")
    load = data.draw(int_arrays(E, 1, 60), label="load").astype(float)  # integer loads, skewed by the draw
    exact = brute_force(home, load, G, S)
    cert = BACKENDS[backend](home, load, G, S, time_limit=20)
    assert cert.status.value == "optimal"
    assert cert.bound == pytest.approx(exact, abs=1e-6)
    assert cert.best == pytest.approx(exact, abs=1e-6)
    z_floor = replica_count_bound(home, load / (load.sum() / G), G, S)
    assert z_floor - 1 <= exact + 1e-9


@pytest.mark.parametrize("backend", BACKENDS)
def test_certificate_known_optimum(backend):
    """Three experts of load 3 on GPU 0, one replica slot per GPU, 2 GPUs: MaxVio 1/3."""
    cert = BACKENDS[backend](np.zeros(3, dtype=np.int64), np.full(3, 3.0), 2, 1, time_limit=20)
    assert cert.status.value == "optimal"
    assert cert.bound == pytest.approx(1 / 3) and cert.best == pytest.approx(1 / 3)
    assert len(cert.replicas) == 1 and cert.replicas[0, 1] == 1


def test_certificate_bounds_every_measured_plan():
    """No replicated plan (GESR, hottest, random) dispatched by the guard beats the bound."""
    p = synthetic_problem(E=16, G=4, k=2, S=1, tokens=2048)
    res = {n: run(n, p) for n in REPLICATION}
    home = res["gesr"].plan.home
    loads = p.stats.expert_load
    bounds = [solve_replication_bound(home[l], loads[l], 4, 1, time_limit=10) for l in range(p.layers)]
    for name, r in res.items():
        m = evaluate(r.plan, p.trace, p.instance.cluster)
        for l, b in enumerate(bounds):
            assert b.bound <= m["maxvio_per_layer"][l] + 1e-9, name


def test_certificate_without_slots_is_the_base_maxvio():
    """With no replica slot the bound is the base plan's own MaxVio."""
    home = np.array([0, 0, 1])
    cert = solve_replication_bound(home, np.array([3.0, 1.0, 2.0]), 2, 0)
    assert cert.bound == pytest.approx(4 / 3 - 1)


def test_certificate_hook_only_for_replicated_plans(quickstart_path):
    """Plans without replicas get no replication certificate in their metrics."""
    res = solve(load_instance(quickstart_path), method="greedy", params={})
    assert "replication_bound_maxvio" not in res.metrics


def test_highs_thread_count_changes_between_solves():
    """A HiGHS solve with 2 threads does not break a later 1-thread certificate (global scheduler)."""
    import highspy

    h = highspy.Highs()
    h.silent()
    h.setOptionValue("threads", 2)  # sizes the process-wide scheduler, as outside code might
    h.addVar(0.0, 1.0)
    h.run()
    cert = solve_replication_bound_pyomo(np.zeros(3, dtype=np.int64), np.full(3, 3.0), 2, 1, time_limit=20)
    assert cert.status.value == "optimal"
