"""Hypergraph (λ − 1) and METIS methods: gains, feasibility, objectives, availability."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.errors import InputError
from moeopt.evaluate import communication, evaluate, grouping_affinity, linear_plan
from moeopt.grouping import auto_eps_load
from moeopt.heuristics.hyperedges import ConnectivityGain, token_hyperedges
from moeopt.heuristics.local_search import AffinityGain, LoadBalanceGain, balanced_start, local_search
from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
from moeopt.methods.hypergraph import Hypergraph, Metis, hypergraph_homes
from moeopt.result import Status, Termination
from moeopt.solve import load_workloads, solve
from moeopt.synth import SynthSpec, synthesize
from tests.strategies import float_arrays, int_arrays, symmetric_graphs, topk_arrays


def make_instance(experts: int = 16, gpus: int = 4, top_k: int = 2, layers: int = 2, tokens: int = 2048) -> Instance:
    """A synthetic task-structured instance (calibration seed 0, evaluation seed 1)."""
    syn = {"layers": layers, "experts": experts, "top_k": top_k, "tokens": tokens, "structure_seed": 5}
    return Instance(
        name="hg-test",
        model=Model(layers=layers, experts=experts, top_k=top_k),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus, slots_per_gpu=math.ceil(experts / gpus)),
        workload=Workload(calibration=WorkloadSource(synthetic=syn)),
    )


@pytest.fixture(scope="module")
def structured():
    """DeepSeek-like shape scaled down: 32 experts, top-4, 8 GPUs, with loaded workloads."""
    inst = make_instance(experts=32, gpus=8, top_k=4, layers=2, tokens=4096)
    return inst, load_workloads(inst)


def distinct_per_token(topk_layer: np.ndarray, home: np.ndarray) -> np.ndarray:
    """Distinct GPUs of each token, computed by the evaluator."""
    gpu = home[topk_layer.astype(np.int64)][:, None, :]
    distinct, _, _ = communication(gpu, Cluster(gpus=int(home.max()) + 1, gpus_per_node=1, slots_per_gpu=1))
    return distinct[:, 0]


def test_hyperedges_merge_identical_sets():
    """Tokens with the same top-k set in any order (or with a repeated id) share one weighted hyperedge."""
    topk = np.array([[0, 1, 2], [2, 1, 0], [3, 1, 1], [1, 3, 3], [4, 5, 6]])
    edges = token_hyperedges(topk, 8)
    sets = {tuple(p): w for p, w in zip(edges.pins, edges.weight, strict=True)}
    assert sets == {(0, 1, 2): 2.0, (1, 3): 2.0, (4, 5, 6): 1.0}
    assert edges.tokens == 5


@given(topk_arrays((200,), 12, 3), int_arrays(12, 0, 3))
def test_hyperedge_cost_matches_evaluator(topk, home):
    """Σ_m w_m λ(m) over deduplicated hyperedges equals the evaluator's distinct GPUs summed over tokens."""
    E, G = 12, 4
    topk = topk.astype(np.int64)
    topk[::7] = topk[0]  # force repeated sets
    home[:G] = np.arange(G)
    edges = token_hyperedges(topk, E)
    assert edges.cost(home) == pytest.approx(distinct_per_token(topk, home).sum())


@given(topk_arrays((60,), 9, 3), st.permutations(np.arange(9) % 3))
def test_connectivity_gains_are_exact(topk, home):
    """Every move and swap gain equals the brute-force change of Σ_m w_m λ(m)."""
    E, G = 9, 3
    edges = token_hyperedges(topk.astype(np.int64), E)
    home = np.asarray(home, dtype=np.int64)
    move, pair = ConnectivityGain(edges).gains(home, G)
    base = edges.cost(home)
    for e in range(E):
        for g in range(G):
            h = home.copy()
            h[e] = g
            assert move[e, g] == pytest.approx(base - edges.cost(h))
        for f in range(E):
            if home[e] != home[f]:
                h = home.copy()
                h[e], h[f] = home[f], home[e]
                swap = move[e, home[f]] + move[f, home[e]] - pair[e, f]
                assert swap == pytest.approx(base - edges.cost(h))


@given(symmetric_graphs(8), st.permutations(np.arange(8) % 3))
def test_affinity_gains_are_exact(W, home):
    """Every move and swap gain of the pairwise objective equals the change of grouping_affinity."""
    E, G = 8, 3
    home = np.asarray(home, dtype=np.int64)
    move, pair = AffinityGain(W).gains(home, G)
    base = grouping_affinity(W, home)
    for e in range(E):
        for f in range(E):
            if home[e] != home[f]:
                h = home.copy()
                h[e], h[f] = home[f], home[e]
                assert move[e, home[f]] + move[f, home[e]] - pair[e, f] == pytest.approx(grouping_affinity(W, h) - base)
        for g in range(G):
            h = home.copy()
            h[e] = g
            assert move[e, g] == pytest.approx(grouping_affinity(W, h) - base)


@given(float_arrays(8, 0.0, 1.0), st.permutations(np.arange(8) % 3))
def test_load_balance_gains_are_exact(load, home):
    """Every move and swap gain of LoadBalanceGain equals the drop of the sum of squared GPU loads."""
    E, G = 8, 3
    home = np.asarray(home, dtype=np.int64)

    def square(h):
        return float((np.bincount(h, weights=load, minlength=G) ** 2).sum())

    move, pair = LoadBalanceGain(load).gains(home, G)
    base = square(home)
    for e in range(E):
        for f in range(E):
            if home[e] != home[f]:
                h = home.copy()
                h[e], h[f] = home[f], home[e]
                assert move[e, home[f]] + move[f, home[e]] - pair[e, f] == pytest.approx(base - square(h))
        for g in range(G):
            h = home.copy()
            h[e] = g
            assert move[e, g] == pytest.approx(base - square(h))


@given(float_arrays(11, 0.0, 1.0))
def test_balanced_start_is_a_local_optimum(load):
    """balanced_start fills at most cap slots per GPU and no single move or swap flattens its loads further."""
    E, G, cap = 11, 4, 3
    load = load**3  # skewed, as expert loads are
    home = balanced_start(load, G, cap)
    assert np.bincount(home, minlength=G).max() <= cap
    move, pair = LoadBalanceGain(load).gains(home, G)
    free = np.bincount(home, minlength=G) < cap
    assert (move[:, free] <= 1e-12).all()
    swap = move[np.arange(E)[:, None], home[None, :]] + move[np.arange(E)[None, :], home[:, None]] - pair
    assert (swap[home[:, None] != home[None, :]] <= 1e-12).all()


@given(topk_arrays((80,), 10, 3), float_arrays(10, 0.0, 1.0), st.sampled_from([None, 0.3, 1.0]))
def test_local_search_repairs_and_never_worsens(topk, load, eps):
    """From an over-full start, repair meets slots and the load limit; refinement only improves."""
    E, G, cap = 10, 4, 3
    edges = token_hyperedges(topk.astype(np.int64), E)
    load = load + 0.2
    load /= load.sum()
    limit = None if eps is None else (1 + eps) / G
    if limit is not None and load.max() > limit:
        return
    start = np.zeros(E, dtype=np.int64)  # everything on GPU 0
    home, log = local_search(start, ConnectivityGain(edges), G, cap, load=load, limit=limit, refine=False)
    if not log.limit_met:  # a stalled repair must say so; a balanced start then meets the limit
        home, log = local_search(
            balanced_start(load, G, cap), ConnectivityGain(edges), G, cap, load=load, limit=limit, refine=False
        )
    assert np.bincount(home, minlength=G).max() <= cap
    if limit is not None and log.limit_met:
        assert np.bincount(home, weights=load, minlength=G).max() <= limit + 1e-9
    refined, _ = local_search(home, ConnectivityGain(edges), G, cap, load=load, limit=limit, refine=True)
    assert np.bincount(refined, minlength=G).max() <= cap
    assert edges.cost(refined) <= edges.cost(home) + 1e-9


def test_hypergraph_plan_feasible_and_objective_recomputed(structured):
    """The plan fits the slots and its objective is the evaluator's GPUs per token on the calibration trace."""
    inst, wl = structured
    r = solve(inst, method="hypergraph", workloads=wl)
    assert r.status == Status.FEASIBLE and r.objective_name == "gpus_per_token" and r.sense == "min"
    r.plan.check(inst.cluster, layers=2, experts=32)
    m = evaluate(r.plan, wl.calibration, inst.cluster)
    assert r.objective == pytest.approx(m["gpus_per_token"])
    assert r.stats["solver_objective"] >= 1.0


def test_hypergraph_beats_linear_on_structured_trace(structured):
    """On a task-structured trace, the (λ − 1) plan needs fewer remote GPUs per token than linear, out of sample."""
    inst, wl = structured
    r = solve(inst, method="hypergraph", workloads=wl)
    assert r.metrics["comm_per_token"] <= r.metrics["linear"]["comm_per_token"]
    assert r.metrics["comm_reduction_vs_linear"] > 5.0


def test_hypergraph_load_limit_holds(structured):
    """With eps_load every GPU's calibration load share stays within (1 + eps_load) / G."""
    inst, wl = structured
    eps = 0.6
    r = solve(inst, method="hypergraph", params={"eps_load": eps}, workloads=wl)
    assert r.status == Status.FEASIBLE
    ubar = wl.calibration_stats.global_usage
    for l in range(inst.model.layers):
        share = np.bincount(r.plan.home[l], weights=ubar[l], minlength=inst.cluster.gpus) * inst.cluster.gpus
        assert share.max() <= 1 + eps + 1e-9


def test_hypergraph_unattainable_limit_is_infeasible():
    """A load limit below the hottest expert's own share is reported infeasible, without a plan."""
    inst = make_instance(experts=8, gpus=8, top_k=2, layers=1, tokens=1024)
    r = solve(inst, method="hypergraph", params={"eps_load": 0.0})
    assert r.status == Status.INFEASIBLE and r.plan is None
    assert "eps_load" in r.stats["reason"]
    assert r.termination == Termination.INFEASIBLE  # proved out of reach, not a time limit


def test_hypergraph_unmet_limit_gives_no_plan(structured):
    """Perfect balance (eps_load = 0) that repair cannot reach yields no plan rather than a violating one."""
    inst, wl = structured
    r = solve(inst, method="hypergraph", params={"eps_load": 0.0}, workloads=wl)
    assert r.plan is None and r.status in (Status.NO_SOLUTION, Status.INFEASIBLE)


@pytest.mark.parametrize("method", ["hypergraph", "metis"])
def test_relax_eps_load_only_when_asked(method, structured):
    """A limit repair cannot meet gives no plan by default; relax_eps_load relaxes it and says so in a note."""
    inst, wl = structured
    hard = solve(inst, method=method, params={"eps_load": 0.0}, workloads=wl)
    assert hard.plan is None and hard.status == Status.NO_SOLUTION
    assert hard.termination == Termination.COMPLETED  # repair stalled: no time limit was hit
    reason = str(hard.stats["reason"])  # one line per layer when solved layer by layer
    assert "relax_eps_load" in reason and "use eps_load >=" in reason
    soft = solve(inst, method=method, params={"eps_load": 0.0, "relax_eps_load": True}, workloads=wl)
    assert soft.status == Status.FEASIBLE and "relax_eps_load" in soft.stats["note"]
    G = inst.cluster.gpus
    ubar = wl.calibration_stats.global_usage
    for l, (eps, steps) in enumerate(zip(soft.stats["eps_load"], soft.stats["eps_load_relaxed"], strict=True)):
        assert steps >= 1 and eps == pytest.approx(1.1**steps - 1)
        assert np.bincount(soft.plan.home[l], weights=ubar[l], minlength=G).max() <= (1 + eps) / G + 1e-6


def test_hypergraph_deterministic_and_warm_start(structured):
    """Same seed, same plan; hypergraph_homes gives the method's homes for warm starts."""
    inst, wl = structured
    a = solve(inst, method="hypergraph", workloads=wl, seed=3)
    b = solve(inst, method="hypergraph", workloads=wl, seed=3)
    assert np.array_equal(a.plan.home, b.plan.home)
    homes = hypergraph_homes(wl.calibration, inst.cluster.gpus, inst.cluster.slots_per_gpu, seed=3)
    assert homes.shape == (2, 32)
    assert np.array_equal(homes, a.plan.home)


@pytest.mark.parametrize("experts,gpus", [(10, 4), (30, 8), (16, 4)])
def test_metis_respects_capacity(experts, gpus):
    """METIS plans fit ceil(E/G) slots even when E is not divisible by G; objective is recomputed affinity."""
    inst = make_instance(experts=experts, gpus=gpus, top_k=2, layers=2, tokens=1024)
    wl = load_workloads(inst)
    # the automatic load limit is hard and can be out of reach on these tiny layers: relax it
    r = solve(inst, method="metis", workloads=wl, params={"relax_eps_load": True})
    assert r.status == Status.FEASIBLE
    r.plan.check(inst.cluster, layers=2, experts=experts)
    assert np.bincount(r.plan.home[0], minlength=gpus).max() <= inst.cluster.slots_per_gpu
    A = wl.calibration_stats.affinity
    assert r.objective == pytest.approx(sum(grouping_affinity(A[l], r.plan.home[l]) for l in range(2)))
    free = solve(inst, method="metis", params={"eps_load": math.inf}, workloads=wl)
    lin = linear_plan(2, experts, gpus)
    assert free.objective >= sum(grouping_affinity(A[l], lin.home[l]) for l in range(2))


@pytest.mark.parametrize("method", ["hypergraph", "metis"])
def test_default_load_limit_is_automatic(method, structured):
    """Without eps_load both apply the automatic limit (tacg's rule, never relaxed unless
    asked): every GPU's calibration share stays within it."""
    inst, wl = structured
    r = solve(inst, method=method, workloads=wl)
    assert r.status == Status.FEASIBLE
    G, cap = inst.cluster.gpus, inst.cluster.slots_per_gpu
    ubar = wl.calibration_stats.global_usage
    assert r.stats["eps_load_relaxed"] == [0] * inst.model.layers and "note" not in r.stats
    for l, eps in enumerate(r.stats["eps_load"]):
        assert eps == pytest.approx(auto_eps_load(ubar[l], G, cap))
        share = np.bincount(r.plan.home[l], weights=ubar[l], minlength=G)
        assert share.max() <= (1 + eps) / G + 1e-6
    free = solve(inst, method=method, params={"eps_load": math.inf}, workloads=wl)
    assert "eps_load" in free.stats and free.stats["eps_load"] == [None] * inst.model.layers


def test_metis_load_limit_holds(structured):
    """METIS with eps_load keeps every GPU within the limit on the calibration loads."""
    inst, wl = structured
    r = solve(inst, method="metis", params={"eps_load": 0.8}, workloads=wl)
    assert r.status == Status.FEASIBLE
    ubar = wl.calibration_stats.global_usage
    share = np.stack([np.bincount(r.plan.home[l], weights=ubar[l], minlength=8) for l in range(2)]) * 8
    assert share.max() <= 1.8 + 1e-9


def test_available_follows_imports(monkeypatch, structured):
    """available() is True with the package and False without it; solve then refuses clearly."""
    assert Hypergraph().available() and Metis().available()
    monkeypatch.setitem(sys.modules, "mtkahypar", None)
    monkeypatch.setitem(sys.modules, "pymetis", None)
    assert not Hypergraph().available() and not Metis().available()
    inst, wl = structured
    with pytest.raises(InputError, match="not available"):
        solve(inst, method="hypergraph", workloads=wl)


def test_hypergraph_needs_a_trace():
    """Count-only workloads are refused: hyperedges need token top-k sets."""
    trace = synthesize(SynthSpec(layers=1, experts=8, top_k=2, tokens=256))
    inst = make_instance(experts=8, gpus=2, top_k=2, layers=1)
    stats = trace.stats()
    from moeopt.solve import Workloads
    from moeopt.trace import stats_from_counts

    counts = stats_from_counts(stats.counts, top_k=2)
    wl = Workloads(counts, counts, counts, None)
    with pytest.raises(InputError, match="token trace"):
        solve(inst, method="hypergraph", workloads=wl)


def test_single_gpu_puts_everything_on_gpu_zero():
    """With one GPU both methods return the only plan."""
    inst = make_instance(experts=6, gpus=1, top_k=2, layers=1, tokens=256)
    wl = load_workloads(inst)
    for name in ("hypergraph", "metis"):
        r = solve(inst, method=name, workloads=wl)
        assert (r.plan.home == 0).all()


def test_cli_says_why_there_is_no_plan(tmp_path, capsys):
    """solve without a plan: exit 1, no plan file, and the reason with the eps_load that would do."""
    from moeopt.cli import main

    inst = tmp_path / "inst.yaml"
    inst.write_text(
        "name: tight\nmodel: {layers: 1, experts: 16, top_k: 2}\ncluster: {gpus: 4}\n"
        "workload:\n  synthetic: {tokens: 256}\nmethod: {name: hypergraph, eps_load: 0.0}\n"
    )
    out = tmp_path / "plan.json"
    assert main(["solve", str(inst), "--output", str(out), "--quiet"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("hypergraph: completed, none plan")
    assert "no plan: layer 0:" in text and "use eps_load >=" in text
    assert not out.exists()
