"""Synthetic drift (``SynthSpec.drift``): each kind moves what it says, ``none`` draws the old traces."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.io import load_instance, read_trace
from moeopt.io.instances import load_workload
from moeopt.synth import SynthSpec, family_shares, switch_point, synthesize
from moeopt.trace import Trace

ROOT = Path(__file__).resolve().parent.parent


def digest(trace: Trace) -> str:
    return hashlib.sha256(trace.topk.tobytes() + trace.family.tobytes() + trace.step.tobytes()).hexdigest()[:16]


def step_shares(trace: Trace) -> np.ndarray:
    """Empirical family shares per step, ``[T, F]``."""
    F = len(trace.family_names)
    counts = np.bincount(trace.step * F + trace.family, minlength=trace.steps * F).reshape(trace.steps, F)
    return counts / counts.sum(axis=1, keepdims=True)


def test_drift_none_draws_the_bundled_trace():
    """drift: none (explicit) redraws the bundled quickstart trace and an old digest exactly."""
    bundled = read_trace(ROOT / "instances" / "traces" / "quickstart-calib.npz")
    trace = synthesize(SynthSpec(drift="none"))
    assert np.array_equal(trace.topk, bundled.topk) and np.array_equal(trace.family, bundled.family)
    assert np.array_equal(trace.step, bundled.step)
    assert digest(synthesize(SynthSpec(layers=2, experts=16, top_k=2, tokens=1024, drift="none"))) == "50694965dae8956a"


@pytest.mark.parametrize(
    "drift", [{"drift": "mix"}, {"drift": "popularity", "drift_rate": 0.3}, {"drift": "switch", "switch_step": 3}]
)
def test_each_drift_is_seeded_and_changes_the_trace(drift):
    """Each drift kind draws the same trace twice from one spec, and a trace other than drift: none."""
    spec = SynthSpec(layers=2, experts=16, top_k=2, tokens=2000, steps=8, layer_dependency=0.5, successors=2)
    drifting = replace(spec, **drift)
    assert digest(synthesize(drifting)) == digest(synthesize(drifting))
    assert digest(synthesize(drifting)) != digest(synthesize(spec))


def test_mix_moves_the_family_shares_to_drift_share():
    """mix with drift_share: step 0 draws the start mix, the last step only the target family."""
    spec = SynthSpec(
        layers=1, experts=16, tokens=16000, steps=16, family_share=(1, 1, 1, 1), drift="mix", drift_share=(0, 0, 0, 1)
    )
    shares = family_shares(spec)
    assert np.allclose(shares[0], 0.25) and np.allclose(shares[-1], [0, 0, 0, 1])
    assert np.allclose(shares.sum(axis=1), 1.0) and (np.diff(shares[:, 3]) > 0).all()  # linear, monotone
    empirical = step_shares(synthesize(spec))
    assert np.abs(empirical[0] - 0.25).max() < 0.06
    assert np.array_equal(empirical[-1], [0, 0, 0, 1])  # a zero share is never drawn
    assert np.abs(empirical - shares).max() < 0.08  # every step follows its own mix


def test_mix_visits_each_family_in_turn():
    """mix without drift_share concentrates drift_focus on each family in turn, in order."""
    spec = SynthSpec(layers=1, experts=16, tokens=24000, steps=33, drift="mix", drift_focus=0.7)
    shares = family_shares(spec)
    peaks = shares.argmax(axis=0)
    assert list(peaks) == sorted(peaks) and peaks[-1] == 32  # family 3 ends the stream
    assert np.allclose(shares.max(axis=0), 0.7)
    empirical = step_shares(synthesize(spec))
    assert list(empirical.argmax(axis=1)[peaks]) == [0, 1, 2, 3]


def mean_rank_correlation(loads: np.ndarray, distance: int) -> float:
    """Mean Spearman correlation of per-step expert loads ``[T, E]`` ``distance`` steps apart."""
    T = loads.shape[0]
    return float(np.mean([spearmanr(loads[t], loads[t + distance])[0] for t in range(T - distance)]))


def test_popularity_drift_decorrelates_far_steps():
    """popularity: per-step loads' rank correlation falls with distance; without drift it does not."""
    base = SynthSpec(layers=1, experts=48, top_k=4, tokens=48000, steps=24, burst_fraction=0.0, structure_seed=5)
    still = synthesize(base).step_counts[0]
    moving = synthesize(replace(base, drift="popularity", drift_rate=0.25)).step_counts[0]
    decay = [mean_rank_correlation(moving, d) for d in (1, 5, 10, 20)]
    assert (np.diff(decay) < 0).all() and decay[0] - decay[-1] > 0.15, decay  # about 0.97 -> 0.74
    flat = [mean_rank_correlation(still, d) for d in (1, 5, 10, 20)]
    assert max(flat) - min(flat) < 0.02, flat
    # the walk is part of the hidden structure: another sample seed drifts the same way
    other = synthesize(replace(base, drift="popularity", drift_rate=0.25, seed=1)).step_counts[0]
    assert spearmanr(moving[-4:].sum(axis=0), other[-4:].sum(axis=0))[0] > 0.9


def test_switch_changes_structure_at_switch_step():
    """switch: hot experts differ before and after switch_step; each half matches its own structure."""
    spec = SynthSpec(layers=2, experts=32, top_k=4, tokens=24000, steps=12, structure_seed=7)
    trace = synthesize(replace(spec, drift="switch", switch_step=5))
    assert switch_point(replace(spec, drift="switch")) == (6, 8)  # defaults: steps // 2, structure_seed + 1
    before = trace.step_counts[:, :5].sum(axis=1)
    after = trace.step_counts[:, 5:].sum(axis=1)
    old = synthesize(replace(spec, seed=3)).expert_load
    new = synthesize(replace(spec, structure_seed=8, seed=3)).expert_load
    for l in range(spec.layers):
        hot_before, hot_after = set(np.argsort(-before[l])[:4]), set(np.argsort(-after[l])[:4])
        assert hot_before != hot_after
        assert np.corrcoef(before[l], old[l])[0, 1] > 0.9 and np.corrcoef(after[l], new[l])[0, 1] > 0.9
        assert np.corrcoef(before[l], new[l])[0, 1] < 0.6 and np.corrcoef(after[l], old[l])[0, 1] < 0.6


def test_switch_seed_names_the_new_structure():
    """switch_seed picks the structure after the switch (not only structure_seed + 1)."""
    spec = SynthSpec(layers=1, experts=32, top_k=4, tokens=20000, steps=4, drift="switch", switch_seed=20)
    after = synthesize(spec).step_counts[0, 2:].sum(axis=0)
    target = synthesize(SynthSpec(layers=1, experts=32, top_k=4, tokens=20000, structure_seed=20)).expert_load[0]
    assert np.corrcoef(after, target)[0, 1] > 0.9


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"drift": "sideways"}, "drift"),
        ({"drift_rate": 0.1}, "drift_rate"),
        ({"drift": "popularity", "drift_rate": -1.0}, "drift_rate"),
        ({"drift": "mix", "drift_share": [1, 1]}, "drift_share"),
        ({"drift": "mix", "drift_share": [0, 0, 0, 0]}, "drift_share"),
        ({"drift": "mix", "drift_share": [1, 0, 0, 0], "drift_focus": 0.5}, "drift_focus"),
        ({"drift": "mix", "only_family": "code"}, "drift"),
        ({"drift": "switch", "switch_step": 16}, "switch_step"),
        ({"drift": "switch", "switch_seed": 0}, "switch_seed"),
        ({"drift": "switch", "steps": 1}, "steps"),
        ({"switch_step": 3}, "switch_step"),
    ],
)
def test_bad_drift_names_its_field(fields, field):
    """A bad drift parameter is one InputError naming workload.synthetic.<field>."""
    with pytest.raises(InputError) as info:
        SynthSpec.from_mapping(fields, source="x.yaml")
    assert info.value.field == f"workload.synthetic.{field}", info.value


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--drift-rate", "0.2"], "--drift-rate"),
        (["--drift", "popularity", "--drift-rate", "0"], "--drift-rate"),
        (["--drift", "mix", "--drift-share", "1,x"], "--drift-share"),
        (["--drift", "mix", "--drift-share", "1,1"], "--drift-share"),
        (["--drift", "switch", "--switch-step", "99"], "--switch-step"),
    ],
)
def test_trace_synth_bad_drift_is_one_line(argv, option, tmp_path, capsys):
    """trace synth with a bad drift flag exits 2 with one line naming the flag."""
    with pytest.raises(SystemExit) as info:
        code = main(["trace", "synth", *argv, "--output", str(tmp_path / "t.npz")])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and option in err, err
    assert not (tmp_path / "t.npz").exists()


def test_trace_synth_writes_a_drifting_trace(tmp_path, capsys):
    """trace synth --drift mix --drift-share writes the trace synthesize draws from the same spec."""
    path = tmp_path / "t.npz"
    argv = [
        "--tokens",
        "3000",
        "--steps",
        "6",
        "--family-share",
        "1,1,1,1",
        "--drift",
        "mix",
        "--drift-share",
        "1,0,0,0",
    ]
    assert main(["trace", "synth", *argv, "--output", str(path)]) == 0
    assert "drift mix" in capsys.readouterr().out
    spec = SynthSpec(tokens=3000, steps=6, family_share=(1, 1, 1, 1), drift="mix", drift_share=(1, 0, 0, 0))
    assert digest(read_trace(path)) == digest(synthesize(spec))


def test_instance_synthetic_drift(tmp_path):
    """workload.synthetic takes drift fields; calibration and evaluation share the drifting structure."""
    path = tmp_path / "i.yaml"
    path.write_text(
        "model: {layers: 1, experts: 16, top_k: 2}\ncluster: {gpus: 4}\n"
        "workload: {synthetic: {tokens: 8000, steps: 8, drift: switch, switch_step: 4}}\n"
    )
    inst = load_instance(path)
    calib = load_workload(inst.workload.calibration, inst.model)
    evaluation = load_workload(inst.workload.calibration, inst.model, seed_offset=1)
    assert isinstance(calib, Trace) and isinstance(evaluation, Trace)
    late_c, late_e = calib.step_counts[0, 4:].sum(axis=0), evaluation.step_counts[0, 4:].sum(axis=0)
    assert np.corrcoef(late_c, late_e)[0, 1] > 0.9
    path.write_text(path.read_text().replace("switch_step: 4", "switch_step: 8"))
    with pytest.raises(InputError, match=r"workload\.synthetic\.switch_step"):
        load_instance(path)
