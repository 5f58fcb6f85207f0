"""token_home: previous-layer, the free GPU relabeling and the cross-layer planner (issue 17)."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.cli import main
from moeopt.crosslayer import (
    CrossGain,
    chain_pass,
    cheapest_levels,
    exact_crosslayer,
    layer_placements,
    least_largest_load,
    next_layer_benefit,
    permute_layer,
    plan_remote,
    stay_edges,
)
from moeopt.errors import InputError
from moeopt.evaluate import evaluate
from moeopt.heuristics.hyperedges import token_hyperedges
from moeopt.heuristics.local_search import load_limit, resolve_eps_load
from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
from moeopt.io import load_instance
from moeopt.methods.crosslayer import maxvio_budget_bound
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.registry import Problem
from moeopt.relabel import relabel_gpus, speed_classes
from moeopt.solve import load_workloads, solve
from moeopt.synth import SynthSpec, _structure, synthesize
from moeopt.trace import Trace
from tests.strategies import int_arrays, small_case, topk_arrays

PREV = "previous-layer"


def synth_instance(L=3, E=16, k=2, G=4, dep=0.8, tokens=2048, home=PREV, **synthetic) -> Instance:
    syn = {"tokens": tokens, "steps": 8, "layer_dependency": dep, "structure_seed": 1, "seed": 0, **synthetic}
    return Instance(
        name="cl",
        model=Model(L, E, k),
        cluster=Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=-(-E // G), token_home=home),
        workload=Workload(WorkloadSource(synthetic=syn)),
    )


def layer_limits(wl, G: int, S: int) -> tuple[list[np.ndarray], list[float | None]]:
    loads, limits = [], []
    for u in wl.calibration_stats.global_usage:
        u = u / u.sum()
        eps = resolve_eps_load(None, u, G, S)
        loads.append(u)
        limits.append(load_limit(eps, G, u))
    return loads, limits


# ----------------------------------------------------------------------------- relabeling
SCALARS = ("comm_per_token", "comm_weighted_per_token", "gpus_per_token", "maxvio", "jain", "maxvio_per_step")


@given(small_case(max_layers=3, replicas=True, dispatch=None))
def test_relabel_changes_no_metric_under_uniform(case):
    """Under uniform homes a relabeled plan has the same metrics, layer by layer, for every
    dispatch rule (loads as a multiset per layer; layers with replicas are left alone)."""
    cluster, trace, plan = case
    new, _ = relabel_gpus(plan, trace, cluster)
    a, b = evaluate(plan, trace, cluster), evaluate(new, trace, cluster)
    for key in SCALARS:
        assert b[key] == pytest.approx(a[key], abs=1e-9), key
    for key in ("comm_per_layer", "maxvio_per_layer", "jain_per_layer"):
        assert np.allclose(a[key], b[key]), key
    assert np.allclose(np.sort(a["loads"], axis=1), np.sort(b["loads"], axis=1))
    # only whole GPUs move: every GPU's slots are some GPU's slots of the original layer
    for l in range(plan.layers):
        rows = {tuple(r) for r in plan.slots[l].tolist()}
        assert {tuple(r) for r in new.slots[l].tolist()} == rows


@given(small_case(max_layers=3, replicas=True, dispatch=None))
def test_relabel_never_raises_previous_layer_communication(case):
    cluster, trace, plan = case
    prev = replace(cluster, token_home=PREV)
    new, info = relabel_gpus(plan, trace, prev)
    before = evaluate(plan, trace, prev)["comm_per_token"]
    after = evaluate(new, trace, prev)["comm_per_token"]
    assert after <= before + 1e-12
    assert info["comm_after"] == pytest.approx(after)


def test_relabel_respects_speed_classes():
    """With a heterogeneous profile GPUs trade ids only within a class of identical rows,
    even when a cross-class renumbering would keep more tokens at home."""
    rng = np.random.default_rng(0)
    G, E, L, N = 4, 8, 3, 600
    lat = np.array([[0.1, 1.0], [0.1, 1.0], [0.1, 2.0], [0.1, 2.0]])  # GPUs 0, 1 fast; 2, 3 slow
    profile = Profile(tile=64, latency=lat)
    assert speed_classes(G, profile).tolist() == [0, 0, 1, 1]
    # layer l + 1 puts on GPU (g + 2) % 4 what follows GPU g: the best renumbering crosses classes
    home = np.array([[0, 0, 1, 1, 2, 2, 3, 3], [2, 2, 3, 3, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3]])
    plan = Plan.from_homes(home, gpus=G)
    group = rng.integers(0, 4, size=N)
    topk = np.stack([2 * group + rng.integers(0, 2, size=N)] * L, axis=1)[:, :, None]
    topk = np.concatenate([topk, topk ^ 1], axis=2).astype(np.int16)
    trace = Trace(
        topk=topk, family=np.zeros(N, np.int32), step=np.zeros(N, np.int32), family_names=("a",), num_experts=E
    )
    cluster = Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=2, token_home=PREV)
    free, _ = relabel_gpus(plan, trace, cluster)
    assert evaluate(free, trace, cluster)["comm_per_token"] < evaluate(plan, trace, cluster)["comm_per_token"]
    assert not np.array_equal(free.slots, plan.slots)
    kept, _ = relabel_gpus(plan, trace, cluster, profile)
    cls = speed_classes(G, profile)
    for l in range(L):
        for g in range(G):
            (src,) = [h for h in range(G) if np.array_equal(plan.slots[l, h], kept.slots[l, g])]
            assert cls[src] == cls[g]
    # the planner's renumbering obeys the same rule
    t = topk.astype(np.int64)
    th = home[0][t[:, 0, 0]]
    out = permute_layer(home[1], t, 1, th, home[2], G, cls)
    for e in range(E):
        assert cls[out[e]] == cls[home[1][e]]


# ----------------------------------------------------------------------------- scorer
def test_previous_layer_scorer_hand_toy():
    """2 layers, 4 GPUs in 2 nodes (inter-node weight 4), known homes: known remote counts."""
    G, E = 4, 4
    plan = Plan.from_homes(np.array([[0, 1, 2, 3], [3, 2, 1, 0]]), gpus=G)
    topk = np.array([[[0, 1], [3, 2]], [[1, 3], [2, 0]], [[2, 0], [0, 1]]], dtype=np.int16)
    trace = Trace(
        topk=topk,
        family=np.zeros(3, np.int32),
        step=np.zeros(3, np.int32),
        family_names=("a",),
        num_experts=E,
        home=np.array([0, 2, 1]),
    )
    cluster = Cluster(gpus=G, gpus_per_node=2, slots_per_gpu=1, inter_node_weight=4.0, token_home=PREV)
    m = evaluate(plan, trace, cluster)
    # layer 0, homes from the trace: token 0 on GPU 0 uses {0, 1}: 1 remote (same node);
    # token 1 on 2 uses {1, 3}: 2 remote (1 across nodes); token 2 on 1 uses {2, 0}: 2 (1 across)
    # layer 1, homes = GPU of the layer-0 top-1 (0, 1, 2): {0, 1} from 0, {1, 3} from 1 (3 across),
    # {3, 2} from 2: one remote each
    assert m["comm_per_layer"] == pytest.approx([5 / 3, 1.0])
    assert m["comm_per_token"] == pytest.approx(4 / 3)
    assert m["comm_weighted_per_token"] == pytest.approx(((1 + 5 + 5) / 3 + (1 + 4 + 1) / 3) / 2)
    # the same plan under uniform homes counts the trace's homes at every layer
    uni = evaluate(plan, trace, replace(cluster, token_home="uniform"))
    assert uni["comm_per_layer"][1] == pytest.approx((2 + 1 + 2) / 3)
    # the planner's own objective is the scorer's
    assert plan_remote(plan.home, topk.astype(np.int64), trace.home, G).sum() / 6 == pytest.approx(4 / 3)


def test_bad_token_home_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nmodel: {layers: 2, experts: 8, top_k: 2}\n"
        "cluster: {gpus: 2, token_home: nowhere}\nworkload: {synthetic: {tokens: 64}}\n"
    )
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert "\n" not in str(info.value) and "cluster.token_home" in str(info.value)
    assert main(["solve", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "token_home" in err and "previous-layer" in err


# ----------------------------------------------------------------------------- synthetic dependency
def follow_share(dep: float, layers: int = 3) -> float:
    """Share of tokens (top-1 not generic) whose layer-l top-1 lies in the community linked to
    their layer l - 1 top-1's community."""
    spec = SynthSpec(layers=layers, experts=32, top_k=4, tokens=4096, layer_dependency=dep, structure_seed=2)
    trace = synthesize(spec)
    structure = _structure(spec, np.random.default_rng(spec.structure_seed))
    hits = total = 0
    for l in range(1, layers):
        prev = structure[l - 1].community[trace.family, trace.topk[:, l - 1, 0]]
        now = structure[l].community[trace.family, trace.topk[:, l, 0]]
        ok = prev >= 0
        C = structure[l].preference.shape[1]
        hits += int((now[ok] == structure[l].link[prev[ok] % C]).sum())
        total += int(ok.sum())
    return hits / total


def test_layer_dependency_makes_tokens_follow_the_link():
    shares = [follow_share(d) for d in (0.0, 0.5, 0.9)]
    assert shares[0] < shares[1] < shares[2]
    assert shares[2] - shares[0] > 0.3


def test_layer_dependency_validated():
    with pytest.raises(InputError, match="layer_dependency"):
        SynthSpec.from_mapping({"layer_dependency": 1.5})


def successor_share(successors: int, dep: float = 0.9) -> float:
    """Share of layer l >= 1 top-k entries that are successors of the token's layer l - 1 top-1."""
    spec = SynthSpec(layers=3, experts=32, top_k=4, tokens=4096, layer_dependency=dep, successors=2, structure_seed=2)
    structure = _structure(spec, np.random.default_rng(spec.structure_seed))
    trace = synthesize(replace(spec, successors=successors))
    hits = []
    for l in range(1, spec.layers):
        succ = structure[l].successor[trace.family, trace.topk[:, l - 1, 0]]  # [N, 2]
        hits.append((trace.topk[:, l, :, None] == succ[:, None, :]).any(axis=2).mean())
    return float(np.mean(hits))


def test_successors_make_tokens_follow_their_previous_expert():
    """With successors, a token's experts are more often its previous top-1's successors."""
    assert successor_share(2) > successor_share(0) + 0.1


def test_successors_zero_keeps_the_community_trace():
    """successors only adds structure on its own stream: the structure is the same."""
    a = _structure(SynthSpec(layers=3, experts=32, top_k=4, layer_dependency=0.5), np.random.default_rng(0))
    b = _structure(
        SynthSpec(layers=3, experts=32, top_k=4, layer_dependency=0.5, successors=3), np.random.default_rng(0)
    )
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.community, y.community) and np.array_equal(x.link, y.link)
    assert b[1].successor.shape == (4, 32, 3) and a[1].successor.size == 0


#: sha256 (first 16 hex digits) of topk, family and step of traces drawn before successors
#: existed: successors=0 (the default) must keep every earlier trace bit-identical
OLD_TRACES = [
    (
        {
            "layers": 3,
            "experts": 32,
            "top_k": 4,
            "tokens": 2048,
            "layer_dependency": 0.7,
            "structure_seed": 3,
            "seed": 1,
        },
        "03d4840570e7264c",
    ),
    ({"layers": 2, "experts": 16, "top_k": 2, "tokens": 1024}, "50694965dae8956a"),
]


def trace_digest(trace: Trace) -> str:
    return hashlib.sha256(trace.topk.tobytes() + trace.family.tobytes() + trace.step.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(("spec", "digest"), OLD_TRACES)
def test_successors_zero_reproduces_the_old_traces(spec, digest):
    assert trace_digest(synthesize(SynthSpec(**spec))) == digest
    # without layer dependency no token follows: successors change nothing either
    if spec.get("layer_dependency", 0.0) == 0.0:
        assert trace_digest(synthesize(SynthSpec(**spec, successors=3))) == digest
    else:
        assert trace_digest(synthesize(SynthSpec(**spec, successors=3))) != digest


def test_successors_lie_in_the_linked_community():
    spec = SynthSpec(layers=3, experts=32, top_k=4, layer_dependency=0.5, successors=3, structure_seed=4)
    structure = _structure(spec, np.random.default_rng(spec.structure_seed))
    for l in (1, 2):
        prev, s = structure[l - 1], structure[l]
        C = len(s.link)
        for f in range(len(spec.families)):
            for e in range(spec.experts):
                succ = s.successor[f, e]
                c = prev.community[f, e]
                target = s.link[c % C] if c >= 0 else -1  # generic experts lead to the generic ones
                assert (s.community[f, succ] == target).all()
                # distinct unless the community has fewer members (then each one, repeated)
                assert len(set(succ.tolist())) == min(3, int((s.community[f] == target).sum()))


def test_successors_validated():
    with pytest.raises(InputError, match="successors"):
        SynthSpec.from_mapping({"successors": -1})
    # more successors than experts would allocate [families, E, successors] for nothing
    with pytest.raises(InputError, match="successors: expected at most experts=16"):
        SynthSpec.from_mapping({"experts": 16, "successors": 2**31 - 1})


# ----------------------------------------------------------------------------- gains
@settings(max_examples=30)
@given(st.integers(3, 8), st.integers(2, 3), st.booleans(), st.data())
def test_cross_gain_is_exact(E, G, with_homes, data):
    """Move and swap gains of a layer equal the change of the whole plan's remote GPUs."""
    L, k, N = 3, 2, 40
    topk = data.draw(topk_arrays((N, L), E, k), label="topk").astype(np.int64)
    first = data.draw(int_arrays(N, 0, G - 1), label="first") if with_homes else None
    homes = data.draw(int_arrays((L, E), 0, G - 1), label="homes")
    l = data.draw(st.integers(0, L - 1), label="l")
    th = first if l == 0 else homes[l - 1][topk[:, l - 1, 0]]
    edges = token_hyperedges(topk[:, l], E) if th is None else stay_edges(topk[:, l], th, E, G)
    nxt = None if l + 1 == L else next_layer_benefit(homes[l + 1], topk[:, l, 0], topk[:, l + 1], E, G)
    move, pair = CrossGain(edges, E, G, fixed=th is not None, benefit=nxt).gains(homes[l], G)
    base = plan_remote(homes, topk, first, G).sum()
    e, g = data.draw(st.integers(0, E - 1), label="e"), data.draw(st.integers(0, G - 1), label="g")
    moved = homes.copy()
    moved[l, e] = g
    assert move[e, g] == pytest.approx(base - plan_remote(moved, topk, first, G).sum())
    f = data.draw(st.integers(0, E - 1), label="f")
    if homes[l, e] != homes[l, f]:
        swapped = homes.copy()
        swapped[l, e], swapped[l, f] = homes[l, f], homes[l, e]
        gain = move[e, homes[l, f]] + move[f, homes[l, e]] - pair[e, f]
        assert gain == pytest.approx(base - plan_remote(swapped, topk, first, G).sum())


# ----------------------------------------------------------------------------- chain moves
def full_homes(rng: np.random.Generator, L: int, G: int, S: int) -> np.ndarray:
    """Homes ``[L, G * S]`` with exactly S experts per GPU in every layer."""
    return np.stack([rng.permutation(np.repeat(np.arange(G), S)) for _ in range(L)])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(2, 4), st.booleans(), st.sampled_from([0, 1, 2]), st.data())
def test_chain_pass_gain_is_exact(G, S, L, with_homes, limited, data):
    """The remote GPUs a chain pass reports saving equal the recomputed objective's change;
    it keeps every GPU's slot count in every layer and the load limits (``limited``: 0 none,
    1 a limit the start meets, 2 one it breaks: the pass then stays finite and exact)."""
    E, k, N = G * S, 2, 60
    topk = data.draw(topk_arrays((N, L), E, k), label="topk").astype(np.int64)
    first = data.draw(int_arrays(N, 0, G - 1), label="first") if with_homes else None
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    homes = full_homes(rng, L, G, S)
    loads = [rng.random(E) + 0.1 for _ in range(L)]
    loads = [u / u.sum() for u in loads]
    # a limit the start meets (the chain moves must keep it), or one it breaks
    factor = {0: None, 1: 1.0, 2: 0.9}[limited]
    limits = [
        None if factor is None else factor * np.bincount(homes[l], weights=loads[l], minlength=G).max()
        for l in range(L)
    ]
    lo = data.draw(st.integers(0, L - 1), label="lo")
    hi = data.draw(st.integers(lo, L - 1), label="hi")
    before = plan_remote(homes, topk, first, G).sum()
    out = homes.copy()
    saved, cut = chain_pass(out, topk, first, G, loads, limits, layers=(lo, hi))
    assert not cut
    assert saved >= 0
    assert saved == pytest.approx(before - plan_remote(out, topk, first, G).sum())
    for l in range(L):
        assert (np.bincount(out[l], minlength=G) == S).all()
        if limited == 1:
            assert np.bincount(out[l], weights=loads[l], minlength=G).max() <= limits[l] + 1e-9
        if not lo <= l <= hi:
            assert np.array_equal(out[l], homes[l])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_chain_pass_is_exact_on_two_gpus(seed):
    """On 2 GPUs one chain pass over all layers re-splits every expert of every layer jointly
    (a dynamic program over the layers), so it reaches the optimum of ``exact_crosslayer``
    from any start."""
    rng = np.random.default_rng(seed)
    L, G, S, k, N = 3, 2, 3, 2, 80
    E = G * S
    topk = np.stack([np.argsort(rng.random((N, E)), axis=1)[:, :k] for _ in range(L)], axis=1)
    loads = [np.bincount(topk[:, l].ravel(), minlength=E) / (N * k) for l in range(L)]
    limits = [0.62] * L if seed % 2 else [None] * L
    first = rng.integers(0, G, size=N) if seed >= 2 else None
    _, opt = exact_crosslayer(topk, G, S, first=first, loads=loads, limits=limits, experts=E)
    homes = full_homes(rng, L, G, S)
    while any(
        lim is not None and np.bincount(homes[l], weights=loads[l], minlength=G).max() > lim
        for l, lim in enumerate(limits)
    ):
        homes = full_homes(rng, L, G, S)  # a start within the limit
    chain_pass(homes, topk, first, G, loads, limits)
    assert plan_remote(homes, topk, first, G).sum() == pytest.approx(opt)


# ----------------------------------------------------------------------------- planner
@pytest.fixture(scope="module")
def planned():
    inst = synth_instance()
    wl = load_workloads(inst)
    res = {
        "crosslayer": solve(inst, method="crosslayer", workloads=wl, relabel=False),
        "agnostic": solve(inst, method="agnostic", workloads=wl, relabel=False),
        "agnostic+relabel": solve(inst, method="agnostic", workloads=wl),
        "hypergraph+relabel": solve(inst, method="hypergraph", workloads=wl),
    }
    return inst, wl, res


def test_crosslayer_never_worse_than_its_starts(planned):
    inst, wl, res = planned
    calib = {k: evaluate(r.plan, wl.calibration, inst.cluster)["comm_per_token"] for k, r in res.items()}
    assert calib["crosslayer"] <= calib["agnostic+relabel"] + 1e-12
    assert calib["crosslayer"] <= calib["hypergraph+relabel"] + 1e-12
    assert calib["crosslayer"] < calib["agnostic"]
    cl = res["crosslayer"]
    assert cl.objective == pytest.approx(calib["crosslayer"])
    for start in cl.stats["starts"].values():
        assert start["final"] <= start["start"] + 1e-12


def _agnostic_and_crosslayer(structure_seed: int, dep: float, successors: int):
    """A tiny expert-level dependent instance, its workloads, and its ``agnostic`` plan and the
    ``crosslayer`` plan from that start alone."""
    inst = synth_instance(L=3, E=16, k=2, G=4, dep=dep, tokens=1024, successors=successors)
    inst = replace(
        inst,
        workload=Workload(
            WorkloadSource(synthetic={**inst.workload.calibration.synthetic, "structure_seed": structure_seed})
        ),
    )
    wl = load_workloads(inst)
    ag = solve(inst, method="agnostic", workloads=wl)
    cl = solve(inst, method="crosslayer", workloads=wl, params={"starts": "agnostic", "kicks": 20})
    return inst, wl, ag, cl


@pytest.mark.parametrize(("structure_seed", "dep", "successors"), [(0, 0.9, 2), (3, 0.5, 3)])
def test_crosslayer_never_worse_than_relabeled_agnostic_with_successors(structure_seed, dep, successors):
    """On expert-level dependent traces the planner (a descent from the relabeled agnostic
    plan) is never worse than agnostic + relabel on the calibration trace, within the same
    load limit."""
    inst, wl, ag, cl = _agnostic_and_crosslayer(structure_seed, dep, successors)
    before = evaluate(ag.plan, wl.calibration, inst.cluster)["comm_per_token"]
    after = evaluate(cl.plan, wl.calibration, inst.cluster)["comm_per_token"]
    assert after <= before + 1e-12
    c = inst.cluster
    loads, limits = layer_limits(wl, c.gpus, c.slots_per_gpu)
    for l in range(inst.model.layers):
        assert np.bincount(cl.plan.home[l], weights=loads[l], minlength=c.gpus).max() <= limits[l] + 1e-9


@pytest.mark.parametrize(("structure_seed", "dep"), [(0, 0.9), (1, 0.5), (2, 0.0)])
def test_crosslayer_is_never_less_balanced_than_its_start(structure_seed, dep):
    """From one start (the relabeled agnostic plan), every layer's largest load stays at or
    below the start's, not merely below the automatic limit (which the start may not reach)."""
    inst, wl, ag, cl = _agnostic_and_crosslayer(structure_seed, dep, 2)
    c = inst.cluster
    loads, limits = layer_limits(wl, c.gpus, c.slots_per_gpu)
    below = 0
    for l in range(inst.model.layers):
        start = np.bincount(ag.plan.home[l], weights=loads[l], minlength=c.gpus).max()
        assert np.bincount(cl.plan.home[l], weights=loads[l], minlength=c.gpus).max() <= start + 1e-9
        below += start < limits[l] - 1e-6
    assert below  # the start leaves room under the limit somewhere: the check bites


def test_crosslayer_keeps_the_automatic_load_limit(planned):
    inst, wl, res = planned
    c = inst.cluster
    loads, limits = layer_limits(wl, c.gpus, c.slots_per_gpu)
    for name in ("crosslayer", "agnostic"):
        home = res[name].plan.home
        for l in range(inst.model.layers):
            assert np.bincount(home[l], weights=loads[l], minlength=c.gpus).max() <= limits[l] + 1e-9
            assert np.bincount(home[l], minlength=c.gpus).max() <= c.slots_per_gpu


@pytest.mark.parametrize(("method", "limited"), [("crosslayer", True), ("joint", False)])
def test_stay_lp_is_load_limited_only_for_single_copy_plans(monkeypatch, method, limited):
    """With spare slots (14 experts in 4 x 4), crosslayer's plans hold one copy each: its stay LP
    keeps the rows within the load limits. joint's certificate there covers plans with copies
    (the flagged LP), for which those rows do not hold: its stay LP is the one over every plan."""
    import moeopt.colgen.cover as cover

    seen = []
    real = cover.stay_upper_bound

    def spy(*args, **kwargs):
        seen.append(args[6])  # the two layers' load limits (None: every plan)
        return real(*args, **kwargs)

    monkeypatch.setattr(cover, "stay_upper_bound", spy)
    inst = synth_instance(E=14, G=4, tokens=1024)
    assert inst.cluster.gpus * inst.cluster.slots_per_gpu > inst.model.experts
    res = solve(inst, method=method, workloads=load_workloads(inst))
    assert len(seen) == inst.model.layers - 1  # layers >= 1: homes on the previous layer's GPUs
    if limited:
        assert all(res.stats["bound_load_limited_per_layer"])
        assert all(lim is not None for lim in seen)
    else:
        assert res.stats["bound_kind_per_layer"][0] == "flagged"
        assert all(lim is None for lim in seen)


def test_crosslayer_params_validated():
    inst = synth_instance(L=2, E=8, tokens=256)
    with pytest.raises(InputError, match="starts"):
        solve(inst, method="crosslayer", params={"starts": "agnostic,magic"})
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="bound_time"):
            solve(inst, method="crosslayer", params={"bound_time": bad})
    res = solve(inst, method="crosslayer", params={"bound_time": 0})
    assert res.bound is None and "communication_lower_bound_per_layer" not in res.stats


# ----------------------------------------------------------------------------- exact model
def naive_optimum(topk, G, S, E, loads, limits, first=None):
    per = [layer_placements(E, G, S, loads[l], limits[l]) for l in range(topk.shape[1])]
    best = np.inf
    for combo in itertools.product(*per):
        best = min(best, plan_remote(np.stack(combo), topk, first, G).sum())
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_dynamic_program_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    L, E, G, k, N = 3, 4, 2, 2, 30
    topk = np.stack([np.argsort(rng.random((N, E)), axis=1)[:, :k] for _ in range(L)], axis=1)
    loads = [np.bincount(topk[:, l].ravel(), minlength=E) / (N * k) for l in range(L)]
    limits = [0.7] * L
    first = rng.integers(0, G, size=N) if seed % 2 else None
    homes, value = exact_crosslayer(topk, G, 2, first=first, loads=loads, limits=limits, experts=E)
    assert value == pytest.approx(naive_optimum(topk, G, 2, E, loads, limits, first))
    assert value == pytest.approx(plan_remote(homes, topk, first, G).sum())


@pytest.mark.parametrize(("seed", "G", "dep"), [(0, 2, 0.9), (1, 3, 0.5), (2, 2, 0.0), (3, 3, 0.9), (4, 2, 0.5)])
def test_crosslayer_reaches_the_optimum_on_tiny_instances(seed, G, dep):
    """2-3 layers, 6 experts on 2-3 GPUs under a load limit 10 % above the least reachable
    largest load (found by enumeration): the planner's plan is optimal (dynamic programming
    over all placements), and no method beats the optimum."""
    inst = synth_instance(
        L=2 + seed % 2, E=6, k=2, G=G, dep=dep, tokens=256, communities=2, generic=0, structure_seed=seed
    )
    wl = load_workloads(inst)
    c, topk = inst.cluster, wl.calibration.topk.astype(np.int64)
    S = c.slots_per_gpu
    loads = [u / u.sum() for u in wl.calibration_stats.global_usage]
    least = max(min(np.bincount(p, weights=u, minlength=G).max() for p in layer_placements(6, G, S)) for u in loads)
    eps = 1.1 * least * G - 1.0
    limits = [(1.0 + eps) / G] * len(loads)
    _, opt = exact_crosslayer(topk, G, S, loads=loads, limits=limits, experts=6)
    cl = solve(inst, method="crosslayer", workloads=wl, relabel=False, params={"eps_load": eps})
    ag = solve(inst, method="agnostic", workloads=wl, params={"eps_load": eps})
    assert plan_remote(cl.plan.home, topk, None, G).sum() == pytest.approx(opt)
    assert plan_remote(ag.plan.home, topk, None, G).sum() >= opt - 1e-9
    # the certificate: valid against the brute-force optimum (per token and layer), not trivial
    N, L = topk.shape[0], topk.shape[1]
    assert 0.0 < cl.bound <= opt / (N * L) + 1e-9
    assert cl.bound <= cl.objective + 1e-12
    assert len(cl.stats["communication_lower_bound_per_layer"]) == L
    assert all(cl.stats["bound_load_limited_per_layer"])  # the plans searched: within the load limit


@pytest.mark.parametrize(
    ("seed", "L", "E", "G", "dep", "slack"),
    [(0, 3, 4, 2, 0.9, 0.02), (1, 3, 4, 2, 0.5, 0.1), (2, 2, 6, 3, 0.9, 0.02), (3, 2, 6, 3, 0.0, 0.3)],
)
def test_maxvio_budget_bound_is_below_every_plan_within_the_budget(seed, L, E, G, dep, slack):
    """The bound on every single-copy plan whose MaxVio (mean over layers) is within ``slack`` of
    agnostic's: below the best such plan's figure, by brute force over every plan (two slots per
    GPU, no spare: every plan is single-copy), and the pairing floor is exact there."""
    inst = synth_instance(L=L, E=E, k=2, G=G, dep=dep, tokens=300, communities=2, generic=0, structure_seed=seed)
    wl = load_workloads(inst)
    c, trace = inst.cluster, wl.calibration
    topk = trace.topk.astype(np.int64)
    problem = Problem(inst, wl.calibration_stats, trace, wl.profile)
    ag = solve(inst, method="agnostic", workloads=wl, relabel=False)
    out = maxvio_budget_bound(problem, ag.plan, slack, levels=4, bound_time=2.0)
    assert out["load_limited"]
    assert out["base"] == pytest.approx(evaluate(ag.plan, trace, c)["comm_per_token"])
    per = layer_placements(E, G, 2)
    loads = [u / u.sum() for u in wl.calibration_stats.global_usage]
    mvs = [np.array([G * np.bincount(p, weights=u, minlength=G).max() - 1.0 for p in per]) for u in loads]
    for u, mv in zip(loads, mvs, strict=True):
        assert G * least_largest_load(u, G, 2) - 1.0 == pytest.approx(mv.min())
    budget = sum(evaluate(ag.plan, trace, c)["maxvio_per_layer"]) + L * slack
    best = np.inf
    for idx in itertools.product(range(len(per)), repeat=L):
        if sum(mvs[l][idx[l]] for l in range(L)) <= budget + 1e-9:
            homes = np.stack([per[idx[l]] for l in range(L)])
            best = min(best, plan_remote(homes, topk, None, G).sum() / (len(topk) * L))
    assert out["bound"] <= best + 1e-9
    assert out["bound"] > 0.0


@given(st.integers(1, 5), st.integers(2, 4), st.data())
def test_cheapest_levels_matches_enumeration(L: int, K: int, data: st.DataObject) -> None:
    """The dynamic program of :func:`maxvio_budget_bound` equals the minimum over every level
    tuple within the budget (``inf`` when none fits), ties and equal spends included."""
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])
    cost = np.array(data.draw(st.lists(st.lists(values, min_size=K, max_size=K), min_size=L, max_size=L)))
    spend = np.array(data.draw(st.lists(st.lists(values, min_size=K, max_size=K), min_size=L, max_size=L)))
    budget = data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
    want = min(
        (
            sum(cost[l, max(ks[l], ks[l - 1] if l else ks[0])] for l in range(L))
            for ks in itertools.product(range(K), repeat=L)
            if sum(spend[l, ks[l]] for l in range(L)) <= budget + 1e-12
        ),
        default=np.inf,
    )
    assert cheapest_levels(cost, spend, budget) == pytest.approx(want)
