"""Traces, statistics, count loaders (real data included), synthetic workloads, profiles, plans."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

from moeopt.errors import InputError
from moeopt.io import (
    load_instance,
    read_plan,
    read_plan_file,
    read_profile,
    read_trace,
    read_workload_file,
    write_plan,
    write_profile,
    write_trace,
)
from moeopt.profile import Profile, synthetic_profile
from moeopt.solve import load_workloads
from moeopt.synth import SynthSpec, synthesize, trace_from_counts
from moeopt.trace import stats_from_trace
from tests.conftest import DATA, INSTANCES
from tests.strategies import small_case


@given(small_case())
def test_stats_match_brute_force(case):
    """Usage and coactivation from sparse algebra equal a per-token count."""
    _, trace, _ = case
    st = stats_from_trace(trace)
    F, L, E = st.families, st.layers, st.experts
    usage = np.zeros((F, L, E))
    co = np.zeros((F, L, E, E))
    for n in range(trace.tokens):
        f = trace.family[n]
        for l in range(L):
            ids = set(int(x) for x in trace.topk[n, l])
            for e in trace.topk[n, l]:
                usage[f, l, e] += 1
            for a, b in itertools.permutations(ids, 2):
                co[f, l, a, b] += 1
    ntok = np.bincount(trace.family, minlength=F)
    for f in range(F):
        if ntok[f]:
            assert np.allclose(st.coactivation[f], co[f] / ntok[f])
            assert np.allclose(st.usage[f], usage[f] / usage[f].sum(axis=1, keepdims=True))
    assert np.allclose(st.global_usage.sum(axis=1), 1.0)
    assert np.allclose(st.step_counts.sum(axis=1), usage.sum(axis=0))


def test_trace_round_trip(tmp_path):
    """write_trace then read_trace gives the same arrays."""
    tr = synthesize(SynthSpec(layers=2, experts=8, top_k=2, tokens=300, seed=3))
    write_trace(tmp_path / "t.npz", tr)
    back = read_trace(tmp_path / "t.npz")
    assert np.array_equal(back.topk, tr.topk) and np.array_equal(back.family, tr.family)
    assert back.family_names == tr.family_names and back.num_experts == 8


def test_synthetic_structure():
    """Families differ in usage; generic experts are hot for every family; seeds reproduce."""
    spec = SynthSpec(layers=1, experts=32, top_k=4, tokens=8000, seed=0)
    a, b = synthesize(spec), synthesize(spec)
    assert np.array_equal(a.topk, b.topk)
    st = a.stats()
    u = st.usage[:, 0]
    # total variation distance between families' usage is large (task structure)
    assert 0.5 * np.abs(u[0] - u[1]).sum() > 0.2
    # the generic expert(s) are above the mean for every family
    assert ((u > 1 / 32).all(axis=0)).any()
    ood = synthesize(SynthSpec(layers=1, experts=32, top_k=4, tokens=500, only_family="math"))
    assert set(np.unique(ood.family)) == {ood.family_names.index("math")}
    other = synthesize(SynthSpec(layers=1, experts=32, top_k=4, tokens=8000, seed=1))
    assert not np.array_equal(other.topk, a.topk)


def test_olmoe_domain_counts_load(real_data):
    """The real OLMoE per-domain counts load as 6 families x 3 layers x 64 experts, top-8."""
    st = read_workload_file(real_data / "olmoe_mixtral_domain_expert_counts.npz", select="olmoe")
    assert st.counts.shape == (6, 3, 64) and st.top_k == 8
    assert "github" in st.family_names
    # each row sums to tokens x k
    assert np.allclose(st.counts.sum(axis=2) / 8, st.family_tokens[:, None], rtol=1e-6)
    mix = read_workload_file(real_data / "olmoe_mixtral_domain_expert_counts.npz", select="mistral")
    assert mix.counts.shape == (5, 3, 8) and mix.top_k == 2
    with pytest.raises(InputError, match="choose one of"):
        read_workload_file(real_data / "olmoe_mixtral_domain_expert_counts.npz")


def test_deepseek_counts_drop_dense_layers(real_data):
    """SGLang's DeepSeek-V3 loads drop the three all-zero dense layers: 58 x 256."""
    st = read_workload_file(real_data / "deepseek_v3_decode_in1000out1000.json", top_k=8)
    assert st.counts.shape == (1, 58, 256)
    load = st.expert_load
    assert (load.max(axis=1) / load.mean(axis=1)).max() > 4  # real imbalance


def test_bundled_real_instances_load():
    """Every bundled real-data instance loads and matches its model shape."""
    for path in sorted((INSTANCES / "real").glob("*.yaml")):
        inst = load_instance(path)
        wl = load_workloads(inst)
        assert wl.calibration_stats.layers == inst.model.layers
        assert wl.calibration_stats.experts == inst.model.experts


def test_count_sampled_trace_follows_marginals(real_data):
    """trace_from_counts keeps per-family usage close to the real counts."""
    st = read_workload_file(real_data / "olmoe_mixtral_domain_expert_counts.npz", select="mistral")
    tr = trace_from_counts(st, tokens=20000, seed=0)
    back = tr.stats()
    assert np.abs(back.usage - st.usage).max() < 0.05


def test_counts_csv_and_npy(tmp_path):
    """Plain count tables (CSV with header, NPY) load as count-only statistics."""
    st = read_workload_file(DATA / "good-counts.csv", top_k=2)
    assert st.counts.shape == (1, 2, 8) and st.coactivation is None
    np.save(tmp_path / "c.npy", np.ones((3, 2, 8)))
    st3 = read_workload_file(tmp_path / "c.npy", top_k=2)
    assert st3.families == 3
    with pytest.raises(InputError, match="need the model's top_k"):
        read_workload_file(DATA / "good-counts.csv")


@given(small_case(replicas=True, colocated=True, dispatch=None))
def test_plan_json_round_trip(case):
    """Any plan/2 (empty slots, colocated copies, every dispatch) survives write_plan/read_plan_file."""
    _, _, plan = case
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.json"
        write_plan(path, plan, "x", {"a": 1})
        back = read_plan_file(path)
    assert np.array_equal(back.plan.slots, plan.slots) and back.plan.experts == plan.experts
    assert back.plan.dispatch == plan.dispatch and back.method == "x" and back.params == {"a": 1}


def test_plan_v1_files_still_read(tmp_path):
    """A first-release plan/1 file (homes + replicas) reads into plan/2 with the guard dispatch."""
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "format": "moeopt.plan/1",
                "gpus": 2,
                "layers": 2,
                "experts": 4,
                "placement": [[0, 0, 1, 1], [1, 0, 1, 0]],
                "replicas": [[[0, 1]], []],
            }
        )
    )
    plan = read_plan(path)
    assert plan.slots.tolist() == [[[0, 1, -1], [2, 3, 0]], [[1, 3, -1], [0, 2, -1]]]
    assert plan.copies_on_gpu[0, 0].tolist() == [1, 1] and plan.copy_counts[1].tolist() == [1, 1, 1, 1]
    assert plan.home.tolist() == [[0, 0, 1, 1], [1, 0, 1, 0]]
    assert plan.dispatch.kind == "locality"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"slots": [[[0, 1], [2, 9]]]}, "holds expert 9"),
        ({"slots": [[[0, 1], [2, 2]]]}, "no copy of expert 3"),
        ({"slots": [[["a", 1], [2, 3]]]}, "slots[0][0][0]: expected an integer"),
        ({"slots": [[[0, 1], [2, 3]]], "gpus": "two"}, "gpus: expected an integer"),
        ({"slots": [[[0, 1], [2, 3]]], "dispatch": {"kind": "fastest"}}, "dispatch.kind"),
        ({"slots": [[[0, 1]], [[2, 3]]]}, "expected shape [1, 2, slots]"),
    ],
)
def test_bad_plan_files_one_line(tmp_path, bad, message):
    """Malformed plan/2 files are InputErrors naming the file and the field."""
    data = {"format": "moeopt.plan/2", "gpus": 2, "layers": 1, "experts": 4, **bad}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        read_plan(path)
    assert str(path) in str(info.value) and message in str(info.value) and "\n" not in str(info.value)


def test_profile_round_trip_and_step_function(tmp_path):
    """Profiles round-trip through YAML; C(n) steps at tile boundaries and extends affinely."""
    prof = synthetic_profile(3, variability="high", seed=1, tile=64, max_tiles=4)
    write_profile(tmp_path / "p.yaml", prof)
    back = read_profile(tmp_path / "p.yaml")
    assert np.allclose(back.latency, prof.latency, atol=1e-6) and back.tile == 64
    p = Profile(tile=64, latency=np.array([[1.0, 2.0, 3.0]]))
    assert p(np.array([[0], [1], [64], [65], [128], [129], [256]]))[:, 0].tolist() == [1, 2, 2, 3, 3, 4, 5]
    spreads = [synthetic_profile(64, variability=v, seed=0).speed for v in ("low", "medium", "high")]
    assert spreads[0].std() < spreads[1].std() < spreads[2].std()
    with pytest.raises(InputError, match="non-decreasing"):
        Profile(tile=64, latency=np.array([[2.0, 1.0]]))


def test_synthetic_instance_evaluates_out_of_sample():
    """A synthetic workload evaluates on a fresh sample of the same structure."""
    path = DATA / "synthetic.yaml"
    path.write_text(
        "model: {layers: 1, experts: 8, top_k: 2}\ncluster: {gpus: 2}\nworkload: {synthetic: {tokens: 200, steps: 4}}\n"
    )
    try:
        wl = load_workloads(load_instance(path))
    finally:
        path.unlink()
    assert wl.calibration.tokens == wl.evaluation.tokens == 200
    assert not np.array_equal(wl.calibration.topk, wl.evaluation.topk)


def test_written_files_have_the_usual_mode(tmp_path):
    """Atomic writes honour the umask instead of mkstemp's private 0600."""
    import os

    from moeopt.io import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644


def test_per_family_communities():
    """per_family communities: co-activation partners differ by family; shared: they agree."""

    def partner_overlap(spec: SynthSpec) -> float:
        co = synthesize(spec).stats().coactivation[:, 0]  # [F, E, E]
        top = [set(map(tuple, np.argwhere(c > np.quantile(c, 0.97)))) for c in co]
        return len(top[0] & top[1]) / max(1, len(top[0] | top[1]))

    base = dict(layers=1, experts=32, top_k=4, tokens=12000, structure_seed=3)
    shared = partner_overlap(SynthSpec(**base))
    per_family = partner_overlap(SynthSpec(**base, family_communities="per_family"))
    assert per_family < shared
    with pytest.raises(InputError, match="family_communities"):
        SynthSpec(**base, family_communities="nope").validate()
