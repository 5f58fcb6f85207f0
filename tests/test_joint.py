"""Joint planner: the exact model, the move gains, the local search and the method."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from moeopt import joint as jm
from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.evaluate import evaluate
from moeopt.io import load_instance
from moeopt.registry import get_method, parse_params
from moeopt.result import Termination
from moeopt.solve import load_workloads, solve
from tests.conftest import INSTANCES


def tiny_layer(
    seed: int,
    *,
    E: int = 5,
    G: int = 3,
    W: int = 2,
    k: int = 2,
    tokens: int = 60,
    families: int = 2,
    eps: float = 0.1,
    robust: float = 0.5,
    family_cap: float = float("inf"),
) -> jm.JointLayer:
    """Tokens of ``families`` families, each preferring its own experts (Dirichlet)."""
    rng = np.random.default_rng(seed)
    pref = rng.dirichlet(np.full(E, 0.7), size=families)
    fam = rng.integers(0, families, tokens)
    topk = np.array([rng.choice(E, size=k, replace=False, p=pref[f]) for f in fam])
    return jm.JointLayer(topk, fam, families, E, G, W, eps=eps, robust=robust, family_cap=family_cap)


def one_copy_each(E: int, G: int, W: int, load: np.ndarray) -> jm.SlotState:
    holds = np.zeros((E, G), dtype=bool)
    holds[np.arange(E), np.arange(E) % G] = True
    return jm.SlotState(jm.fill_slots(holds, W, load), E)


# ----------------------------------------------------------------------------- exact model
@pytest.mark.parametrize(("seed", "cap"), [(0, np.inf), (1, np.inf), (2, np.inf), (0, 0.1), (1, 0.1)])
def test_exact_model_matches_brute_force(seed, cap):
    """The MILP over slot contents reaches the optimum found by enumerating every plan (with
    and without a family cap)."""
    layer = tiny_layer(seed, family_cap=cap)
    assert layer.has_cap == np.isfinite(cap)
    best, slots = jm.brute_force(layer)
    res = jm.solve_exact(layer, time_limit=30)
    assert res.status == "optimal"
    assert res.value == pytest.approx(best, abs=1e-6)
    holds = jm.SlotState(
        jm.fill_slots(jm.SlotState(res.slots, layer.experts).holds, layer.width, layer.expert_load), layer.experts
    ).holds
    assert jm.ideal_dispatch(layer, holds)[0] == pytest.approx(best, abs=1e-6)


def test_ideal_dispatch_without_limit_is_set_cover():
    """Without a load limit the ideal dispatch runs each token on the fewest GPUs covering it."""
    layer = tiny_layer(3, eps=1e9, robust=0.0)
    holds = np.zeros((5, 3), dtype=bool)
    holds[[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]] = True
    holds[0, 2] = True
    expect = np.mean([1 if any(holds[a, g] and holds[b, g] for g in range(3)) else 2 for a, b in layer.topk])
    assert jm.ideal_dispatch(layer, holds)[0] == pytest.approx(expect)


def test_exact_model_refuses_large_layers():
    """Past its size limit the exact model says so in one line."""
    rng = np.random.default_rng(0)
    layer = jm.JointLayer(rng.integers(0, 64, (50, 6)) % 64, np.zeros(50, int), 1, 64, 16, 5)
    with pytest.raises(ValueError, match="exact joint model needs"):
        jm.check_exact_size(layer)


# ----------------------------------------------------------------------------- costs and moves
@pytest.mark.parametrize("seed", range(4))
def test_sample_cost_equals_exact_without_limit(seed):
    """With top-2 and no load limit, locality-first routing is the ideal dispatch."""
    layer = tiny_layer(seed, E=6, G=3, W=3, eps=1e9, robust=0.3)
    rng = np.random.default_rng(seed)
    holds = np.zeros((6, 3), dtype=bool)
    holds[np.arange(6), rng.permutation(np.repeat(np.arange(3), 2))] = True
    state = jm.SlotState(jm.fill_slots(holds, 3, layer.expert_load), 6)
    assert jm.SampleCost(layer, None).reset(state) == pytest.approx(jm.ExactCost(layer).reset(state))


@pytest.mark.parametrize("cap", [np.inf, 0.3])
def test_move_gains_are_incremental_and_exact(cap):
    """A move's gain, priced on the tokens it touches, equals the objective re-priced on all
    tokens with the same tie order; batched gains equal single ones (family cap priced too)."""
    layer = tiny_layer(5, E=12, G=4, W=4, k=3, tokens=400, families=3, eps=0.05, family_cap=cap)
    cost = jm.SampleCost(layer, None)
    state = one_copy_each(12, 4, 4, layer.expert_load)
    cost.reset(state)
    moves = jm.neighbourhood(state)[::7]
    batched = cost.delta_many(state, moves)
    for m, d in zip(moves, batched, strict=True):
        trial = state.copy()
        trial.apply(m)
        repriced = cost.price(trial) - cost.value
        assert cost.delta(state, m) == pytest.approx(repriced, abs=1e-12)
        assert d == pytest.approx(repriced, abs=1e-12)


def test_family_cap_term_by_hand():
    """Without a load limit nothing is shed, so the cap term is ``(1 - robust) * pi_f *
    penalty`` times each family's pairs over ``(1 + cap)`` times its mean, per sampled token
    of the family; the sample cost without the cap is the plain objective."""
    cap, robust = 0.2, 0.3
    layer = tiny_layer(4, E=6, G=3, W=2, tokens=200, families=2, eps=1e9, robust=robust, family_cap=cap)
    holds = np.zeros((6, 3), dtype=bool)
    holds[np.arange(6), np.arange(6) % 3] = True  # one copy each: the routing is fixed
    state = jm.SlotState(jm.holds_to_slots(holds, 2), 6)
    gpu_of = np.arange(6) % 3
    plain = jm.SampleCost(layer, None, family_cap=False).reset(state)
    want = 0.0
    n = layer.family_tokens
    for f in range(2):
        rows = layer.family == f
        load = np.bincount(gpu_of[layer.topk[rows]].ravel(), minlength=3).astype(float)
        over = np.maximum(load - (1 + cap) * load.mean(), 0.0).sum()
        want += (1 - robust) * n[f] / n.sum() * layer.penalty * over / n[f]
    assert want > 0  # the test exercises the cap
    assert jm.SampleCost(layer, None).reset(state) == pytest.approx(plain + want, abs=1e-12)
    assert jm.ExactCost(layer).reset(state) == pytest.approx(plain + want, abs=1e-9)  # top-2, no limit: exact


def test_family_cap_repair_only_touches_plans_over_the_cap():
    """The repair phase lowers the priced objective of a plan over the family cap and leaves a
    plan within it alone."""
    from moeopt.joint.layers import repair_family_cap
    from moeopt.methods.joint import JointParams

    layer = tiny_layer(2, E=12, G=4, W=4, k=3, tokens=400, families=3, eps=0.2, family_cap=0.2)
    params = JointParams(eps=0.2, coarse_tokens=None, evaluations=400)
    # each family's favourite experts together: some family far over the cap
    order = np.argsort(
        -np.bincount((layer.family[:, None] * 12 + layer.topk).ravel(), minlength=36).reshape(3, 12), axis=1
    )
    holds = np.zeros((12, 4), dtype=bool)
    placed = 0
    for e in order[0]:
        if holds[e].any():
            continue
        holds[e, min(placed // 3, 3)] = True
        placed += 1
    state = jm.SlotState(jm.fill_slots(holds, 4, layer.expert_load), 12)
    cost = jm.SampleCost(layer, None)
    before = cost.reset(state)
    repaired, info = repair_family_cap(layer, state, params, 0, 0, per_layer=30.0)
    assert info is not None and info["cap_term_before"] > 0
    assert cost.reset(repaired) < before
    assert info["cap_term_after"] < info["cap_term_before"]
    again, none = repair_family_cap(layer, repaired, replace(params, family_cap=1e9), 0, 0, per_layer=30.0)
    assert none is None and again is repaired


def test_moves_keep_a_valid_plan():
    """Swaps, replacements and moves into empty slots keep every expert covered, no expert
    twice on a GPU, and the holder matrix in step with the slots."""
    rng = np.random.default_rng(0)
    slots = np.array([[0, 1, -1], [2, 3, 0], [4, 5, 1]])
    state = jm.SlotState(slots, 6)
    for _ in range(200):
        moves = jm.neighbourhood(state)
        assert all(state.valid(m) for m in moves)
        state.apply(moves[int(rng.integers(len(moves)))])
        again = jm.SlotState(state.slots, 6)
        assert np.array_equal(again.holds, state.holds) and np.array_equal(again.c, state.c)


# ----------------------------------------------------------------------------- local search
@pytest.mark.parametrize("seed", [0, 1])
def test_local_search_reaches_the_exact_optimum(seed):
    """Pricing by the exact ideal dispatch, the search ends at the MILP's optimum."""
    layer = tiny_layer(seed)
    opt = jm.solve_exact(layer, time_limit=30).value
    start = one_copy_each(5, 3, 2, layer.expert_load)
    _, value, _ = jm.local_search(start, jm.ExactCost(layer), np.random.default_rng(seed), kicks=4)
    assert value == pytest.approx(opt, abs=1e-6)


def test_sample_search_reaches_the_exact_optimum_without_limit():
    """On a layer where the sample cost is exact (top-2, no limit), the screened search over
    a larger neighbourhood finds the MILP optimum."""
    layer = tiny_layer(7, E=8, G=4, W=3, tokens=300, families=2, eps=1e9, robust=0.0)
    opt = jm.solve_exact(layer, time_limit=30).value
    start = one_copy_each(8, 4, 3, layer.expert_load)
    _, value, _ = jm.local_search(
        start, jm.SampleCost(layer, None), np.random.default_rng(0), kicks=8, exhaustive_below=0, candidates=48
    )
    assert value == pytest.approx(opt, abs=1e-9)


# ----------------------------------------------------------------------------- the method
@pytest.fixture(scope="module")
def small_instance():
    """gesr-small (2 layers x 16 experts, top-2, 4 GPUs x (4 + 1) slots) and its workloads."""
    inst = load_instance(INSTANCES / "gesr-small.yaml")
    return inst, load_workloads(inst)


def test_joint_meets_the_limit_on_calibration(small_instance):
    """The joint plan's MaxVio on the calibration trace, as the one scorer measures it under
    the plan's own dispatch, is within eps; it needs fewer GPUs per token than linear."""
    inst, wl = small_instance
    r = solve(inst, method="joint", params={"eps": 0.1, "time_per_layer": 0.5}, workloads=wl)
    cal = evaluate(r.plan, wl.calibration, inst.cluster)
    assert r.stats["constraint_met"]
    assert cal["maxvio"] <= 0.1 + 1e-9
    assert r.objective == pytest.approx(cal["comm_per_token"])
    assert r.metrics["comm_reduction_vs_linear"] > 0
    r.plan.check(inst.cluster, layers=2, experts=16, own=True)


def test_restarts_keep_the_best_calibration_plan(small_instance):
    """Each restart's plan gets its own dispatch choice; the kept plan is the one with the
    fewest calibration remote GPUs per token within eps, as the one scorer measures it, and the
    first restart is the one-search plan of the run's seed."""
    from moeopt.joint.choice import restart_seed

    inst, wl = small_instance
    # bounded by evaluations, not the clock: the same plans on any machine
    params = {"eps": 0.2, "time_per_layer": 60.0, "evaluations": 300, "bound_time": 0}
    one = solve(inst, method="joint", params={**params, "restarts": 1}, workloads=wl)
    three = solve(inst, method="joint", params={**params, "restarts": 3}, workloads=wl)
    runs = three.stats["restarts"]
    assert [r["seed"] for r in runs] == [restart_seed(0, r) for r in range(3)]
    assert len({r["seed"] for r in runs}) == 3
    assert runs[0]["comm_per_token"] == pytest.approx(one.objective)
    met = [r for r in runs if r["met"]]
    assert met and three.stats["constraint_met"]
    assert three.objective == pytest.approx(min(r["comm_per_token"] for r in met))
    assert three.objective <= one.objective + 1e-12
    assert runs[three.stats["restart"]]["comm_per_token"] == pytest.approx(three.objective)
    assert one.termination is three.termination is Termination.COMPLETED
    cal = evaluate(three.plan, wl.calibration, inst.cluster)
    assert cal["comm_per_token"] == pytest.approx(three.objective) and cal["maxvio"] <= 0.2 + 1e-9


def test_restart_ranking_prefers_plans_within_eps():
    """A restart within eps beats any over it; among those within, fewer remote GPUs win;
    among those over, the more balanced wins."""
    from moeopt.joint.choice import DispatchChoice, _restart_rank
    from moeopt.plan import Dispatch

    def c(comm, maxvio, met):
        return DispatchChoice(Dispatch(kind="lp"), comm, maxvio, met, [])

    assert _restart_rank(c(5.0, 0.05, True)) < _restart_rank(c(1.0, 0.5, False))
    assert _restart_rank(c(4.0, 0.05, True)) < _restart_rank(c(4.1, 0.01, True))
    assert _restart_rank(c(9.0, 0.3, False)) < _restart_rank(c(1.0, 0.4, False))


def test_unreachable_limit_is_planned_above_the_least_reachable(small_instance):
    """Without replica slots and eps 0, no layer can meet the limit: each is planned eps above
    the balance plan's MaxVio, the note says so, and the plan saves more than the balanced one."""
    from dataclasses import replace
    from types import SimpleNamespace

    from moeopt.joint.planner import reachable_limits

    inst, wl = small_instance
    bare = inst.replace(cluster=replace(inst.cluster, replica_slots_per_gpu=0))
    r = solve(bare, method="joint", params={"eps": 0.0, "time_per_layer": 0.5, "bound_time": 0}, workloads=wl)
    reached = r.stats["eps_per_layer"]
    assert r.stats["eps_relaxed_layers"] == [0, 1] and all(e > 0 for e in reached)
    assert "below the least reachable MaxVio" in r.stats["note"] and r.params["eps"] == 0.0
    balanced = solve(bare, method="balance", workloads=wl)
    assert r.metrics["comm_per_token"] < balanced.metrics["comm_per_token"]
    # a reachable limit is kept as it is; an unreachable one becomes eps above what is reached
    load = wl.calibration_stats.expert_load
    problem = SimpleNamespace(layers=2, stats=SimpleNamespace(expert_load=load), instance=bare)
    slots = np.stack([np.arange(16).reshape(4, 4)] * 2)
    limits, relaxed = reachable_limits(problem, slots, 10.0)
    assert relaxed == [] and (limits == 10.0).all()
    limits, relaxed = reachable_limits(problem, slots, 0.0)
    assert relaxed == [0, 1] and (limits > 0).all()


def test_family_guard_raises_lambda_only_as_far_as_needed(small_instance):
    """The family guard starts from the λ chosen on the mixture and only doubles it: the
    mixture stays within eps and the communication within 2 % of the mixture's choice, λ never
    falls, and it stops at the first λ whose worst single-family calibration MaxVio is within
    10 % of the most balanced guard's (or at the largest λ, or where the next doubling would
    break eps or the communication cap)."""
    from moeopt.joint.choice import FAMILY_COMM_SLACK, FAMILY_SLACK, LAM_GRID, choose_dispatch
    from moeopt.registry import Problem

    inst, wl = small_instance
    params = {"eps": 0.3, "time_per_layer": 0.3, "bound_time": 0, "family_guard": False}
    r = solve(inst, method="joint", params=params, workloads=wl)
    problem = Problem(inst, wl.calibration_stats, wl.calibration)
    plain = parse_params(get_method("joint"), params)
    guarded = replace(plain, family_guard=True)
    a = choose_dispatch(r.plan, wl.calibration, problem, plain)
    b = choose_dispatch(r.plan, wl.calibration, problem, guarded)
    assert a.met and b.met and b.maxvio <= 0.3 + 1e-9
    assert a.dispatch.kind == b.dispatch.kind == "locality"
    assert b.dispatch.lam >= a.dispatch.lam

    fams = [wl.calibration.only_family(n) for n in wl.calibration.family_names]
    assert len(fams) > 1

    def worst(lam):
        p = r.plan.with_dispatch(plain.guard(lam))
        return max(evaluate(p, f, inst.cluster)["maxvio"] for f in fams)

    assert b.worst_family_maxvio == pytest.approx(worst(b.dispatch.lam))
    ref = worst(LAM_GRID[-1])
    lam = a.dispatch.lam
    while lam < b.dispatch.lam:  # every λ passed over missed the family target
        assert worst(lam) > (1 + FAMILY_SLACK) * ref
        lam = min(2 * lam, LAM_GRID[-1])
    assert lam == b.dispatch.lam
    if b.dispatch.lam < LAM_GRID[-1] and b.worst_family_maxvio > (1 + FAMILY_SLACK) * ref:
        nxt = r.plan.with_dispatch(plain.guard(min(2 * b.dispatch.lam, LAM_GRID[-1])))
        m = evaluate(nxt, wl.calibration, inst.cluster)
        assert m["maxvio"] > 0.3 or m["comm_per_token"] > (1 + FAMILY_COMM_SLACK) * a.comm
    assert b.comm <= (1 + FAMILY_COMM_SLACK) * a.comm + 1e-12


def test_joint_exact_runs_and_certifies(small_instance):
    """joint-exact solves each small layer's model (or falls back to the search) and reports
    the model's value and bound per layer."""
    inst, wl = small_instance
    r = solve(inst, method="joint-exact", params={"eps": 0.2, "time_per_layer": 0.3}, layer_time_limit=2, workloads=wl)
    assert len(r.stats["model_bound_per_layer"]) == 2
    r.plan.check(inst.cluster, layers=2, experts=16, own=True)


def test_joint_needs_a_trace(small_instance):
    """On count-only workloads the joint planner says it needs tokens."""
    inst = load_instance(INSTANCES / "real" / "olmoe-domains.yaml")
    with pytest.raises(InputError, match="token trace"):
        solve(inst, method="joint")


def test_joint_params_are_checked():
    """Bad parameters give one line naming the field."""
    impl = get_method("joint")
    with pytest.raises(InputError, match="robust"):
        parse_params(impl, {"robust": 2.0})
    with pytest.raises(InputError, match="starts"):
        parse_params(impl, {"starts": "grouping,nope"})
    with pytest.raises(InputError, match="restarts"):
        parse_params(impl, {"restarts": 0})
    with pytest.raises(InputError, match="restarts: expected a value <= 64"):
        parse_params(impl, {"restarts": 10**9})
    with pytest.raises(InputError, match="family_cap"):
        parse_params(impl, {"family_cap": -1})
    assert parse_params(impl, {"family_cap": float("inf")}).family_cap == float("inf")


def test_frontier_command(small_instance, tmp_path, capsys):
    """``moeopt frontier`` writes the sweep's table, JSON and plot; the Pareto set is the
    points no other point beats on both communication and held-out MaxVio."""
    inst_path = str(INSTANCES / "gesr-small.yaml")
    args = [
        "frontier",
        inst_path,
        "--eps",
        "0.1,0.3",
        "--methods",
        "joint,agnostic,greedy",
        "--layer-time-limit",
        "0.3",
        "--output",
        str(tmp_path),
        "--quiet",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "MaxVio (held-out)" in out
    data = json.loads((tmp_path / "gesr-small.json").read_text())
    pts = [p for p in data["points"] if p["error"] is None]
    assert {p["method"] for p in pts} == {"joint", "agnostic", "greedy"}
    assert sum(p["method"] == "greedy" for p in pts) == 1  # no load-limit knob: one point
    assert sum(p["method"] == "agnostic" for p in data["points"]) == 3  # automatic limit + 2 eps
    for p in pts:
        dominated = any(q["comm_per_token"] < p["comm_per_token"] and q["maxvio"] < p["maxvio"] for q in pts)
        assert not (p["pareto"] and dominated)
        assert set(p["family_maxvio"]) == {"code", "query", "math", "reasoning"}
    assert (tmp_path / "gesr-small.png").stat().st_size > 0
    assert (tmp_path / "gesr-small.md").read_text().startswith("# Frontier")


def test_frontier_rejects_bad_eps(tmp_path, capsys):
    """A non-numeric --eps is one line on stderr and exit code 2."""
    assert main(["frontier", str(INSTANCES / "gesr-small.yaml"), "--eps", "a,b"]) == 2
    assert "--eps" in capsys.readouterr().err


def test_grouping_start_uses_the_replica_slots(small_instance):
    """The grouping start fills the replica slots with hottest-first copies."""
    from moeopt.joint.planner import grouping_starts
    from moeopt.registry import Context, Problem

    inst, wl = small_instance
    problem = Problem(inst, wl.calibration_stats, wl.calibration)
    slots = grouping_starts(problem, Context(time_limit=0.5))
    assert slots.shape == (2, 4, 5)
    counts = np.array([np.bincount(s[s >= 0], minlength=16) for s in slots])
    assert (counts >= 1).all() and (counts.sum(axis=1) == 20).all()
    inst2 = inst.replace(cluster=replace(inst.cluster, replica_slots_per_gpu=0))
    assert grouping_starts(Problem(inst2, wl.calibration_stats, wl.calibration), Context(time_limit=0.5)).shape == (
        2,
        4,
        4,
    )


def test_auto_is_the_default(tmp_path):
    """An instance without ``method:`` runs ``auto``: joint on a token trace, balance on counts."""
    trace_inst = tmp_path / "trace.yaml"
    trace_inst.write_text(
        "model: {layers: 1, experts: 8, top_k: 2}\ncluster: {gpus: 4, replica_slots_per_gpu: 1}\n"
        "workload:\n  synthetic: {tokens: 1024, steps: 4, structure_seed: 1}\n"
    )
    inst = load_instance(trace_inst)
    assert inst.method.name == "auto"
    assert solve(inst, layer_time_limit=0.3).method == "joint"
    counts = load_instance(INSTANCES / "real" / "olmoe-domains.yaml").replace(method=load_instance(trace_inst).method)
    assert solve(counts).method == "balance"


def test_more_gpus_than_the_routing_holds(tmp_path, capsys):
    """Past 64 GPUs in one node joint's locality routing is a one-line input error naming cluster.gpus
    (not a traceback from its bit masks), and auto plans with joint made for SGLang's even rule, saying why."""
    path = tmp_path / "wide.yaml"
    path.write_text(
        "model: {layers: 1, experts: 66, top_k: 2}\ncluster: {gpus: 66, replica_slots_per_gpu: 1}\n"
        "workload:\n  synthetic: {tokens: 2048, structure_seed: 1}\n"
    )
    inst = load_instance(path)
    with pytest.raises(InputError) as err:
        solve(inst, method="joint", layer_time_limit=1.0)
    assert err.value.field == "cluster.gpus" and "at most 64 GPUs" in str(err.value) and "\n" not in str(err.value)
    res = solve(inst, layer_time_limit=1.0)
    assert res.method == "joint" and res.plan.dispatch.kind == "even" and "at most 64 GPUs" in res.stats["note"]
    assert main(["solve", str(path), "--layer-time-limit", "1"]) == 0
    assert "planned for SGLang's even rule" in capsys.readouterr().err
    assert main(["solve", str(path), "--method", "joint", "--layer-time-limit", "1"]) == 2
    assert "cluster.gpus" in capsys.readouterr().err
    # the certificate joint shares with crosslayer has no such limit
    cross = solve(inst.replace(cluster=replace(inst.cluster, token_home="previous-layer")), method="crosslayer")
    assert cross.bound is not None and cross.bound <= cross.objective


def test_frontier_point_without_a_plan(small_instance):
    """A method that returns no plan at an unreachable load limit (hypergraph reports
    infeasible) becomes a point with an error, not a crash; it is never on the Pareto set."""
    from moeopt.frontier import frontier

    inst, wl = small_instance
    points = frontier(inst, methods=["hypergraph", "greedy"], eps=[0.0], layer_time_limit=0.5, workloads=wl)
    hyper = [p for p in points if p.method == "hypergraph" and p.eps == 0.0]
    assert len(hyper) == 1
    assert hyper[0].error is not None and hyper[0].error.startswith("no plan")  # eps 0 is unreachable here
    assert not hyper[0].pareto
    assert any(p.method == "greedy" and p.error is None for p in points)
