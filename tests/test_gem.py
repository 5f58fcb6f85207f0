"""GEM: utilization trace, classification, lower bound, search, exact backends, profiles."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.errors import InputError
from moeopt.evaluate import evaluate, layer_straggler
from moeopt.heuristics.gem_search import LayerSearch, SearchSettings, search_layer
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.io import load_instance, read_profile, write_profile
from moeopt.profile import Profile, synthetic_profile
from moeopt.registry import Context, Problem, get_method, method_names
from moeopt.solve import load_workloads, solve
from moeopt.trace import stats_from_counts
from moeopt.utilization import classify_experts, step_lower_bound, utilization_trace
from tests.strategies import float_arrays, int_arrays, stepped_profiles

INSTANCES = Path(__file__).resolve().parents[1] / "instances"
EXACT = ["gem-milp", "gem-cpsat"]


# ----------------------------------------------------------------------------- helpers
def brute_force(n: np.ndarray, profile: Profile, slots: int) -> float:
    """Minimum S over every slot-feasible assignment (tiny instances only)."""
    T, E = n.shape
    G = profile.gpus
    homes = np.array(list(itertools.product(range(G), repeat=E)))
    counts = (homes[:, :, None] == np.arange(G)).sum(axis=1)
    homes = homes[(counts <= slots).all(axis=1)]
    onehot = (homes[:, None, :] == np.arange(G)[None, :, None]).astype(float)  # [H, G, E]
    X = np.einsum("te,hge->htg", n, onehot)
    return float(profile(X).max(axis=-1).sum(axis=-1).min())


def stepped_profile(gpus: int, tiles: int, rng: np.random.Generator, tile: int = 16) -> Profile:
    """A general monotone (non-affine) step profile: random non-negative increments."""
    inc = rng.choice([0.0, 0.0, 0.5, 1.0, 3.0], size=(gpus, tiles)) * rng.uniform(0.5, 1.5, size=(gpus, 1))
    base = rng.uniform(0.1, 0.5, size=(gpus, 1))
    return Profile(tile=tile, latency=np.concatenate([base, base + np.cumsum(inc, axis=1)], axis=1))


def count_problem(n: np.ndarray, profile: Profile, slots: int, top_k: int = 1) -> Problem:
    """A one-layer problem from per-step counts ``n[t, e]`` and a profile."""
    T, E = n.shape
    G = profile.gpus
    inst = Instance(
        name="tiny",
        model=Model(layers=1, experts=E, top_k=top_k),
        cluster=Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=slots),
        workload=Workload(WorkloadSource(synthetic={})),
        method=MethodSpec("gem"),
    )
    stats = stats_from_counts(n.sum(axis=0)[None], top_k=top_k, step_counts=n[None])
    return Problem(inst, stats, None, profile)


def synthetic_instance(experts: int = 8, gpus: int = 4, variability: str = "high", layers: int = 1) -> Instance:
    return Instance(
        name="synthetic",
        model=Model(layers=layers, experts=experts, top_k=2),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus, slots_per_gpu=-(-experts // gpus)),
        workload=Workload(
            WorkloadSource(synthetic={"tokens": 4096, "steps": 16, "burst": 3.0, "burst_fraction": 0.15})
        ),
        method=MethodSpec("gem"),
        profile={"variability": variability, "seed": 1, "tile": 32},
    )


# ----------------------------------------------------------------------------- utilization
def test_utilization_aggregates_into_equal_groups_of_means():
    """32 source steps become 16 groups of two steps holding their mean counts."""
    sc = np.arange(2 * 32 * 3, dtype=float).reshape(2, 32, 3)
    util = utilization_trace(sc, 16)
    assert util.counts.shape == (2, 16, 3)
    assert (util.sizes == 2).all() and util.aggregated and util.denominator == 2
    np.testing.assert_allclose(util.counts[:, 3], sc[:, 6:8].mean(axis=1))
    assert utilization_trace(sc, 64).counts.shape == (2, 32, 3)  # fewer steps than T: kept


def test_classification_finds_consistent_temporal_and_correlated_pairs():
    """A steady expert is consistent; two experts bursting together form a correlated pair."""
    T, E = 16, 20
    n = np.full((T, E), 10.0)
    n[:, 0] = 40.0  # consistent
    burst = np.zeros(T, dtype=bool)
    burst[[2, 7, 11]] = True
    n[burst, 3] = 200.0
    n[burst, 5] = 180.0
    n[[4, 9], 8] = 150.0  # temporal, bursting elsewhere
    c = classify_experts(n)
    assert c.consistent[0] and not c.temporal[0]
    assert c.temporal[[3, 5, 8]].all()
    assert {tuple(p) for p in c.pairs} == {(3, 5)}


# ----------------------------------------------------------------------------- lower bound
@given(st.integers(1, 6), st.integers(2, 4), st.integers(1, 3), st.data(), st.booleans())
def test_lower_bound_never_exceeds_any_plan(T, G, slots, data, affine):
    """The per-step bound is at most S of drawn slot-feasible plans, and of split loads."""
    E = data.draw(st.integers(1, G * slots), label="E")
    n = data.draw(int_arrays((T, E), 0, 119), label="n").astype(float)
    if affine:
        prof = synthetic_profile(G, variability=0.3, seed=data.draw(st.integers(0, 999), label="seed"), tile=16)
    else:
        prof = data.draw(stepped_profiles(G, 24), label="profile")
    lb = step_lower_bound(n, prof, slots=slots).sum()
    assert lb >= step_lower_bound(n, prof).sum() - 1e-12
    for _ in range(3):
        home = np.array(data.draw(st.permutations(np.repeat(np.arange(G), slots).tolist()), label="home")[:E])
        assert lb <= layer_straggler(n, home, prof) + 1e-9
    # replicas may split an expert's load anywhere: only the fractional part must hold
    split = data.draw(float_arrays((E, G), 0.0, 1.0), label="split") + 1e-3
    X = n @ (split / split.sum(axis=1, keepdims=True))  # [E, G] rows sum to one
    assert step_lower_bound(n, prof, single_expert=False).sum() <= prof(X).max(axis=-1).sum() + 1e-9


def test_lower_bound_is_tight_on_a_perfect_balance_and_a_hot_expert():
    """Equal tile-sized loads on identical GPUs meet the bound; a hot expert sets it."""
    prof = synthetic_profile(4, variability="none", tile=64)
    n = np.full((3, 4), 64.0)
    assert step_lower_bound(n, prof).sum() == pytest.approx(layer_straggler(n, np.arange(4), prof))
    hot = np.array([[1000.0, 1.0, 1.0, 1.0]])
    assert step_lower_bound(hot, prof)[0] == pytest.approx(prof.latency[0, 0] + 0.05 * 16)


# ----------------------------------------------------------------------------- search
@pytest.mark.parametrize("seed", range(6))
def test_search_never_worse_than_its_initial_mappings(seed):
    """The search returns S no larger than any start, and S matches the evaluator."""
    rng = np.random.default_rng(seed)
    T, E, G = 16, 24, 4
    n = rng.integers(0, 300, size=(T, E)).astype(float) * rng.uniform(0.2, 2.0, size=E)
    prof = synthetic_profile(G, variability="high", seed=seed, tile=32)
    home, s, stats = search_layer(n, prof, 6, SearchSettings(starts=4, rounds=5), seed=seed)
    assert len(stats.initial) == 4
    assert s <= min(stats.initial) + 1e-9
    assert np.bincount(home, minlength=G).max() <= 6
    assert s == pytest.approx(layer_straggler(n, home, prof))


@pytest.mark.parametrize("seed", range(8))
def test_search_finds_brute_force_optimum_on_tiny_instances(seed):
    """Iterated local search reaches the brute-force optimum (E = 6, G = 3, free slots)."""
    rng = np.random.default_rng(100 + seed)
    n = np.round(rng.integers(0, 200, size=(5, 6)) * rng.uniform(0.1, 2.0, size=6))
    prof = stepped_profile(3, 40, rng) if seed % 2 else synthetic_profile(3, variability="high", seed=seed, tile=32)
    _, s, _ = search_layer(n, prof, 3, seed=seed)
    assert s == pytest.approx(brute_force(n, prof, 3))


@pytest.mark.parametrize("fractional", [False, True])
def test_swap_gains_match_recomputed_scores(fractional):
    """Every vectorized swap gain equals the difference of recomputed S (moves to free slots
    too), on integral counts (per-token lookup) and on aggregated means (tile arithmetic)."""
    rng = np.random.default_rng(3)
    n = rng.integers(0, 200, size=(6, 7)).astype(float) + (0.5 if fractional else 0.0)
    prof = stepped_profile(3, 60, rng)
    ls = LayerSearch(n, prof, 3)  # 9 slots, 2 dummies
    assert ls.integral != fractional
    home = ls.pad(np.array([0, 0, 1, 1, 2, 2, 0]))
    X = ls.loads(home)
    Cx = ls.latency(X, np.arange(3)[None, :])
    slot = ls.slots_of(home)
    pa, pb = np.nonzero(np.triu(np.ones((3, 3), dtype=bool), 1))
    dS = ls.gains(slot, X, Cx, pa, pb)
    base = ls.score(home)
    for k, p, q in itertools.product(range(len(pa)), range(3), range(3)):
        i, j = slot[pa[k], p], slot[pb[k], q]
        h = home.copy()
        h[i], h[j] = h[j], h[i]
        assert dS[k, p, q] == pytest.approx(ls.score(h) - base, abs=1e-9)


def test_large_layer_runs():
    """E = 256 experts on G = 64 GPUs with T = 16 steps: a full search completes."""
    rng = np.random.default_rng(0)
    pop = rng.pareto(1.5, 256) + 0.2
    n = np.stack([rng.multinomial(8192 * 8, pop / pop.sum()) for _ in range(16)]).astype(float)
    prof = synthetic_profile(64, variability="high", seed=0)
    home, s, _ = search_layer(n, prof, 4, SearchSettings(starts=2, rounds=3), seed=0)
    assert np.bincount(home, minlength=64).max() <= 4
    assert step_lower_bound(n, prof).sum() <= s + 1e-9 < layer_straggler(n, (np.arange(256) * 64) // 256, prof)


def test_identical_gpus_flat_load_agree_with_token_balancing():
    """Identical GPUs and a load constant over steps: gem, speed-greedy and greedy all balance
    tokens perfectly here, so their S coincide with the lower bound."""
    w = np.array([70.0, 10.0, 60.0, 20.0, 50.0, 30.0, 40.0, 40.0]) * 8
    n = np.tile(w, (16, 1))
    prof = synthetic_profile(4, variability="none", tile=64)
    problem = count_problem(n, prof, 2, top_k=1)
    lb = step_lower_bound(n, prof).sum()
    results = {
        m: get_method(m).solve(problem, get_method(m).Params(), Context()) for m in ("gem", "speed-greedy", "greedy")
    }
    for name, r in results.items():
        assert layer_straggler(n, r.plan.home[0], prof) == pytest.approx(lb), name
        loads = np.bincount(r.plan.home[0], weights=w, minlength=4)
        assert np.ptp(loads) == 0, name


# ----------------------------------------------------------------------------- methods
def test_gem_objective_is_recomputed_by_the_evaluator():
    """gem's objective equals the evaluator's S of its plan on the calibration trace."""
    inst = synthetic_instance()
    wl = load_workloads(inst)
    r = solve(inst, method="gem", workloads=wl)
    calib = evaluate(r.plan, wl.calibration, inst.cluster, profile=wl.profile)
    assert r.objective == pytest.approx(calib["straggler_latency"])
    assert r.bound <= r.objective + 1e-9
    assert r.objective <= r.stats["initial_best"] + 1e-9
    lin = solve(inst, method="linear", workloads=wl)
    assert r.metrics["straggler_latency"] < lin.metrics["straggler_latency"]


@pytest.mark.parametrize("method", ["linear", "greedy", "speed-greedy", "gem"])
def test_every_method_reports_gap_to_bound(method):
    """The metric hook adds the straggler lower bound and the gap for any method's plan."""
    inst = load_instance(INSTANCES / "gem-small.yaml")
    r = solve(inst, method=method)
    m = r.metrics
    assert 0.0 <= m["straggler_lower_bound"] <= m["straggler_latency"]
    assert m["gap_to_bound"] == pytest.approx(1 - m["straggler_lower_bound"] / m["straggler_latency"])


def test_trace_stats_shows_classification(tmp_path, capsys):
    """``trace stats`` lists GEM's consistent / temporal experts and correlated pairs."""
    from moeopt.cli import main
    from moeopt.io import write_trace
    from moeopt.synth import SynthSpec, synthesize

    path = tmp_path / "t.npz"
    write_trace(path, synthesize(SynthSpec(layers=1, experts=8, tokens=2048, steps=16, burst=4.0)))
    assert main(["trace", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "GEM classification" in out and "correlated temporal pairs" in out


def test_trace_stats_without_steps_says_so():
    """Count-only statistics get one line explaining that the classification needs steps."""
    from moeopt.utilization import classification_lines

    stats = stats_from_counts(np.ones((2, 8)), top_k=2)
    assert classification_lines(stats) == ["GEM classification: needs per-step counts (a trace with 'step'); none here"]


def test_gem_needs_steps_and_profile():
    """A count-only workload or a missing profile is refused with a clear error."""
    inst = synthetic_instance().replace(profile=None)
    with pytest.raises(InputError, match="latency profile"):
        solve(inst, method="gem")


# ----------------------------------------------------------------------------- exact
def _exact(name: str):
    if name not in method_names():
        pytest.skip(f"{name} not registered")
    m = get_method(name)
    if not m.available():
        pytest.skip(f"{name} not available")
    return m


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("case", range(5))
def test_exact_equals_brute_force(name, case):
    """Every exact backend proves the brute-force optimum (affine, stepped and identical-GPU
    profiles; the last exercises symmetry breaking with a relabelled hint)."""
    m = _exact(name)
    rng = np.random.default_rng(500 + case)
    E, G, T = (5, 3, 4) if case < 2 else (6, 2, 5) if case < 4 else (7, 3, 4)
    n = np.round(rng.integers(0, 150, size=(T, E)) * rng.uniform(0.2, 2.0, size=E))
    if case == 4:
        prof = synthetic_profile(G, variability="none", tile=16)
    else:
        prof = (
            synthetic_profile(G, variability="high", seed=case, tile=16)
            if case % 2 == 0
            else stepped_profile(G, 60, rng)
        )
    slots = 3 if case < 2 or case == 4 else 4
    problem = count_problem(n, prof, slots)
    r = m.solve(problem, m.Params(), Context(time_limit=30))
    assert r.status.value == "optimal"
    opt = brute_force(n, prof, slots)
    assert r.objective == pytest.approx(opt, rel=1e-6)
    assert r.bound == pytest.approx(opt, rel=1e-5)


@pytest.mark.parametrize("name", EXACT)
def test_exact_refuses_sizes_that_cannot_fit(name):
    """A clear InputError instead of a hopeless model."""
    m = _exact(name)
    rng = np.random.default_rng(0)
    n = rng.integers(0, 2000, size=(16, 256)).astype(float)
    problem = count_problem(n, synthetic_profile(64, variability="low"), 4)
    with pytest.raises(InputError, match="gem"):
        m.solve(problem, m.Params(), Context(time_limit=5))


# ----------------------------------------------------------------------------- profiles
def test_profile_yaml_round_trip(tmp_path):
    """write_profile / read_profile keep tile, names and latencies (to 1e-6)."""
    prof = stepped_profile(3, 10, np.random.default_rng(1), tile=32)
    prof = Profile(tile=32, latency=prof.latency, names=("a100-0", "a100-1", "h100"), meta={"source": "test"})
    path = tmp_path / "p.yaml"
    write_profile(path, prof)
    back = read_profile(path)
    assert back.tile == 32 and back.names == prof.names and back.meta["source"] == "test"
    np.testing.assert_allclose(back.latency, prof.latency, atol=1e-6)
    np.testing.assert_allclose(back(np.array([[0, 33, 700]])), prof(np.array([[0, 33, 700]])), atol=1e-6)


@pytest.mark.parametrize(("level", "spread"), [("low", 0.05), ("medium", 0.15), ("high", 0.30)])
def test_synthetic_variability_levels(level, spread):
    """Speeds stay within 1 +/- spread, with a spread that grows with the level."""
    prof = synthetic_profile(64, variability=level, seed=3)
    speeds = np.array(prof.meta["speeds"])
    assert (np.abs(speeds - 1) <= spread + 1e-9).all()
    assert np.ptp(speeds) > spread  # 64 draws cover most of the interval
    flat = synthetic_profile(8, variability="none")
    assert np.ptp(flat.latency, axis=0).max() == 0
    with pytest.raises(InputError, match="variability"):
        synthetic_profile(4, variability="extreme")


def test_step_function_jumps_at_tile_boundaries():
    """C_g(n) = P[g, ceil(n / tile)], extended affinely past the last boundary."""
    prof = Profile(tile=64, latency=np.array([[1.0, 2.0, 2.0, 5.0]]))
    got = prof(np.array([[0], [1], [64], [65], [128], [129], [192], [193], [256 + 64]]))[:, 0]
    np.testing.assert_allclose(got, [1, 2, 2, 2, 2, 5, 5, 8, 11])


@pytest.mark.parametrize("name", EXACT)
def test_exact_is_warm_started_and_never_worse_than_gem(name):
    """Under a short time limit the exact method keeps at least gem's plan and a valid bound."""
    m = _exact(name)
    rng = np.random.default_rng(7)
    n = np.round(rng.integers(0, 400, size=(16, 24)) * rng.uniform(0.1, 2.0, size=24))
    problem = count_problem(n, synthetic_profile(4, variability="high", seed=2, tile=32), 6)
    r = m.solve(problem, m.Params(), Context(time_limit=3))
    assert r.status.value in ("optimal", "time_limit")
    assert all(layer["warm_start"] for layer in r.stats["layers"])
    assert r.objective <= r.stats["hint_objective"] + 1e-9
    assert step_lower_bound(n, problem.profile).sum() - 1e-9 <= r.bound <= r.objective + 1e-9


@pytest.mark.parametrize(
    ("name", "source", "message"),
    [
        ("invalid_profile_seed.yaml", "invalid_profile_seed.yaml", "profile.seed: expected an integer, found 'abc'"),
        (
            "invalid_profile_variability.yaml",
            "invalid_profile_variability.yaml",
            "profile.variability: expected one of",
        ),
        ("invalid_profile_gpus.yaml", "invalid_profile_gpus.yaml", "profile: profile has 3 GPUs, cluster.gpus is 4"),
        (
            "invalid_profile_decreasing.yaml",
            "profile-decreasing.yaml",
            "profile.gpus[].latency: latencies must be non-decreasing",
        ),
    ],
)
def test_bad_profiles_are_refused_with_the_field(name, source, message, capsys):
    """A bad ``profile:`` gives one line naming the file and the field, exit code 2."""
    from moeopt.cli import main

    path = Path(__file__).resolve().parent / "data" / name
    assert main(["solve", str(path), "--method", "gem", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"{source}: {message}" in err


def test_gap_to_bound_with_replicas_uses_the_fractional_bound():
    """Plans with replicas get the bound without the single-expert terms, still below S."""
    inst = synthetic_instance(experts=16, gpus=4)
    inst = inst.replace(cluster=Cluster(gpus=4, gpus_per_node=4, slots_per_gpu=4, replica_slots_per_gpu=1))
    r = solve(inst, method="greedy", params={"replicate": True})
    assert r.plan.has_replicas
    m = r.metrics
    assert 0.0 <= m["straggler_lower_bound"] <= m["straggler_latency"]


def test_gem_uses_a_hint_and_ignores_an_infeasible_one():
    """A feasible hint is one more start (never worse than it); an over-full one is skipped."""
    rng = np.random.default_rng(4)
    n = rng.integers(0, 300, size=(16, 12)).astype(float)
    prof = synthetic_profile(4, variability="high", seed=4, tile=32)
    hint = np.repeat(np.arange(4), 3)
    _, s, st = search_layer(n, prof, 3, SearchSettings(starts=2, rounds=0), hint=hint)
    assert len(st.initial) == 3 and st.initial[0] == pytest.approx(layer_straggler(n, hint, prof))
    _, _, st = search_layer(n, prof, 3, SearchSettings(starts=2, rounds=0), hint=np.zeros(12, dtype=int))
    assert len(st.initial) == 2


def test_quadratic_gains_match_recomputed_phi():
    """The plateau tie-breaker's vectorized change of Phi equals a direct recomputation."""
    rng = np.random.default_rng(5)
    n = rng.integers(0, 200, size=(5, 8)).astype(float)
    prof = synthetic_profile(3, variability="high", seed=5)
    ls = LayerSearch(n, prof, 3)
    home = ls.pad(np.array([0, 0, 1, 1, 2, 2, 0, 1]))
    phi = lambda h: float((ls.loads(h) ** 2 / ls.speed).sum())  # noqa: E731
    slot = ls.slots_of(home)
    pa, pb = np.nonzero(np.triu(np.ones((3, 3), dtype=bool), 1))
    dphi = ls.quad_gains(slot, ls.loads(home), pa, pb)
    for k, p, q in itertools.product(range(len(pa)), range(3), range(3)):
        i, j = slot[pa[k], p], slot[pb[k], q]
        h = home.copy()
        h[i], h[j] = h[j], h[i]
        assert dphi[k, p, q] == pytest.approx(phi(h) - phi(home), rel=1e-9, abs=1e-6)


@given(st.integers(2, 4), st.integers(0, 999), st.booleans(), st.data())
def test_canonical_hint_satisfies_symmetry_breaking(G, seed, identical, data):
    """Relabelling identical GPUs makes any plan satisfy the symmetry-breaking fixings, keeps
    S, and leaves GPUs with distinct profiles alone."""
    from moeopt.solvers.gem_models import canonical_home, layer_model, symmetry_pairs

    lat = synthetic_profile(G, variability="high", seed=seed).latency
    lat[1:] = lat[0] if identical else lat[1:]  # sometimes all identical
    lat[-1] = lat[-1] if G < 3 else lat[0]  # GPU G-1 shares GPU 0's profile
    prof = Profile(tile=64, latency=lat)
    E = data.draw(st.integers(1, 3 * G), label="E")
    n = data.draw(int_arrays((4, E), 0, 299), label="n").astype(float)
    model = layer_model(n, prof, 3)
    home = np.array(data.draw(st.permutations(np.repeat(np.arange(G), 3).tolist()), label="home")[:E])
    canon = canonical_home(model, home)
    assert all(canon[e] != g for e, g in symmetry_pairs(model))
    assert layer_straggler(n, canon, prof) == pytest.approx(layer_straggler(n, home, prof))
    assert (np.bincount(canon, minlength=G) <= 3).all()


@pytest.mark.parametrize("name", EXACT)
def test_exact_on_aggregated_steps_equals_brute_force(name):
    """A trace with more steps than T is aggregated into group means (halves here), and the
    exact backends (CP-SAT scaling counts by the group size) still prove the optimum."""
    m = _exact(name)
    rng = np.random.default_rng(11)
    n = rng.integers(0, 120, size=(8, 5)).astype(float)  # 8 source steps -> 4 groups of 2
    prof = synthetic_profile(3, variability="high", seed=11, tile=16)
    problem = count_problem(n, prof, 2)
    r = m.solve(problem, m.Params(steps=4), Context(time_limit=30))
    util = utilization_trace(n[None], 4)
    assert util.denominator == 2 and not np.array_equal(util.counts, np.round(util.counts))
    assert r.status.value == "optimal" and r.stats["steps"] == 4
    assert r.objective == pytest.approx(brute_force(util.counts[0], prof, 2), rel=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_cpsat_bound_survives_integer_rounding(seed):
    """CP-SAT solves rounded integer latencies; its reported bound is corrected for that
    rounding, so it never exceeds the brute-force optimum of the true latencies (no clamp)."""
    pytest.importorskip("ortools")
    from moeopt.solvers.gem_models import layer_model, solve_cpsat

    rng = np.random.default_rng(900 + seed)
    E, G, T, slots = 4, 2, 3, 3
    n = rng.integers(0, 80, size=(T, E)).astype(float)
    # latencies with many significant digits: rounding to integers moves every entry
    base = rng.uniform(0.1, 0.5, size=(G, 1)) * np.pi
    prof = Profile(tile=16, latency=np.concatenate([base, base + np.cumsum(rng.uniform(0, 1, (G, 8)) / 3, axis=1)], 1))
    out = solve_cpsat(layer_model(n, prof, slots), time_limit=10)
    opt = brute_force(n, prof, slots)
    assert out.optimal
    assert out.bound <= opt
    assert out.bound == pytest.approx(opt, rel=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_per_step_bound_is_each_steps_brute_force_optimum(seed):
    """The per-step CP-SAT bound never exceeds a step's brute-force optimum (rounded latencies,
    stepped profiles, aggregated means), meets it where proved, is never below the per-step
    bound, and its sum stays below the brute-force optimum of the whole layer (no clamp)."""
    pytest.importorskip("ortools")
    from moeopt.solvers.gem_models import layer_model, per_step_bound

    rng = np.random.default_rng(1200 + seed)
    E, G, T, slots = [(5, 2, 3, 3), (6, 3, 3, 2), (7, 3, 2, 3)][seed % 3]
    if seed % 2:  # many significant digits: rounding to integers moves every entry
        base = rng.uniform(0.1, 0.5, size=(G, 1)) * np.pi
        prof = Profile(tile=16, latency=np.concatenate([base, base + np.cumsum(rng.uniform(0, 1, (G, 12)) / 3, 1)], 1))
    else:
        prof = stepped_profile(G, 12, rng)
    source = rng.integers(0, 60, size=(2 * T, E)).astype(float)
    util = utilization_trace(source[None], T)  # means of 2 steps: counts in halves
    n = util.counts[0]
    bound, proved = per_step_bound(layer_model(n, prof, slots), time_limit=10, denominator=util.denominator)
    opt = np.array([brute_force(n[t : t + 1], prof, slots) for t in range(T)])
    assert proved.all()
    assert (bound <= opt).all()
    assert bound == pytest.approx(opt, rel=1e-5)
    assert (bound >= step_lower_bound(n, prof, slots=slots) - 1e-12).all()
    assert bound.sum() <= brute_force(n, prof, slots)


def test_per_step_bound_sees_integrality_the_step_bound_misses():
    """Three experts of 40 tokens on two identical GPUs (tile 64, 2 slots): the fractional
    balance needs one tile per GPU (bound 0.2), but two experts share a GPU (80 tokens, 2 tiles):
    the step's optimum is 0.3, which the per-step CP-SAT bound proves."""
    pytest.importorskip("ortools")
    from moeopt.solvers.gem_models import layer_model, per_step_bound

    prof = Profile(tile=64, latency=np.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]]))
    n = np.array([[40.0, 40.0, 40.0]])
    bound, proved = per_step_bound(layer_model(n, prof, 2), time_limit=10)
    lb = step_lower_bound(n, prof, slots=2)
    assert proved.all()
    assert lb[0] == pytest.approx(0.2)  # 120 tokens: 2 tiles, one per GPU fits fractionally
    assert bound[0] == pytest.approx(brute_force(n, prof, 2)) == pytest.approx(0.3)
