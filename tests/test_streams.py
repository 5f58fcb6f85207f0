"""Count streams (``moeopt.streams``, ``trace stream``) and the bundled stream instances (``instances/replay``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.io import load_instance, read_workload_file
from moeopt.io.instances import load_workload
from moeopt.streams import (
    cap_shares,
    count_sampled,
    domain_mix,
    domain_sequence,
    mix_waypoints,
    phase_shift,
    sample_counts,
)
from moeopt.trace import Stats, Trace
from tests.strategies import examples, float_arrays

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "instances" / "real"
REPLAY = ROOT / "instances" / "replay"
DOMAINS = REAL / "olmoe_mixtral_domain_expert_counts.npz"
PREFILL = REAL / "deepseek_v3_prefill_in1024.json"
DECODE = REAL / "deepseek_v3_decode_in1000out1000.json"


def disjoint(L: int = 2, E: int = 8, k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Two count tables ``[L, E]`` on disjoint experts (the first half, the second half)."""
    a = np.zeros((L, E))
    a[:, : E // 2] = np.arange(1, E // 2 + 1)
    return a, a[:, ::-1].copy()


def shares(counts: np.ndarray) -> np.ndarray:
    return counts / counts.sum(axis=-1, keepdims=True)


@given(float_arrays((3, 8), 0.0, 10.0), st.integers(1, 4))
@settings(max_examples=examples(50))
def test_cap_shares_caps_and_keeps_the_total(raw, k):
    """cap_shares: rows sum to 1, none above 1/k, zeros stay zero, uncapped shares never fall."""
    raw[:, :k] += 1.0  # at least k positive experts per row
    p = shares(raw)
    capped = cap_shares(p, 1.0 / k)
    assert np.allclose(capped.sum(axis=1), 1.0)
    assert (capped <= 1.0 / k + 1e-9).all()
    assert (capped[p == 0] == 0).all()
    assert (capped[p <= 1.0 / k] >= p[p <= 1.0 / k] - 1e-12).all()


def test_sample_counts_never_exceed_the_tokens():
    """A share above 1/k is capped, so no expert gets more than tokens_per_step (k distinct per token)."""
    p = shares(np.array([[[50.0, 1, 1, 1, 1, 1]]]))
    counts = sample_counts(p, 100, 2, seed=0)
    assert counts.sum() == 200 and counts.max() <= 100


def test_domain_sequence_shapes_sums_and_shift():
    """domain_sequence: [L, D*S, E], tokens x k per step and layer, each segment on its own domain."""
    a, b = disjoint()
    counts = domain_sequence({"a": a, "b": b}, ["a", "b", "a"], 4, 500, 2, seed=1)
    assert counts.shape == (2, 12, 8) and counts.dtype == np.float64
    assert (counts.sum(axis=2) == 1000).all()
    on_b = counts[:, :, 4:].sum(axis=(0, 2))
    assert list(on_b > 0) == [False] * 4 + [True] * 4 + [False] * 4  # the shift is where it says
    assert np.array_equal(counts, domain_sequence({"a": a, "b": b}, ["a", "b", "a"], 4, 500, 2, seed=1))
    assert not np.array_equal(counts, domain_sequence({"a": a, "b": b}, ["a", "b", "a"], 4, 500, 2, seed=2))


def test_domain_sequence_blend_is_gradual():
    """blend: the last steps of a domain move linearly into the next; the first steps stay pure."""
    a, b = disjoint(L=1, E=8)
    counts = domain_sequence({"a": a, "b": b}, ["a", "b"], 6, 20000, 2, blend=3, seed=0)
    weight_b = counts[0, :, 4:].sum(axis=1) / counts[0].sum(axis=1)
    assert np.allclose(weight_b[:3], 0.0) and np.allclose(weight_b[6:], 1.0)
    assert np.allclose(weight_b[3:6], [0.25, 0.5, 0.75], atol=0.02)


def test_domain_sequence_on_real_olmoe_counts():
    """On the real OLMoE counts each segment's pooled shares match its domain's distribution."""
    stats = read_workload_file(DOMAINS, select="olmoe")
    assert isinstance(stats, Stats)
    by_domain = {name: stats.counts[f] for f, name in enumerate(stats.family_names)}
    order = ["github", "arxiv", "wikipedia"]
    counts = domain_sequence(by_domain, order, 8, 4096, stats.top_k, seed=0)
    assert counts.shape == (3, 24, 64) and (counts.sum(axis=2) == 4096 * 8).all()
    for i, name in enumerate(order):
        pooled = shares(counts[:, 8 * i : 8 * (i + 1)].sum(axis=1))
        assert 0.5 * np.abs(pooled - shares(by_domain[name])).sum(axis=1).max() < 0.03  # total variation


def test_phase_shift_switches_at_switch_and_ramps():
    """phase_shift: steps before switch from a, from switch on from b; a ramp blends linearly."""
    a, b = disjoint()
    counts = phase_shift(a, b, 10, 4, 300, 2, seed=0)
    assert counts.shape == (2, 10, 8) and (counts.sum(axis=2) == 600).all()
    on_b = counts[:, :, 4:].sum(axis=(0, 2))
    assert list(on_b > 0) == [False] * 4 + [True] * 6
    assert (counts[:, 4:, :4] == 0).all()
    ramped = phase_shift(a, b, 10, 4, 20000, 2, ramp=3, seed=0)
    weight_b = ramped[0, :, 4:].sum(axis=1) / ramped[0].sum(axis=1)
    assert np.allclose(weight_b[:4], 0) and np.allclose(weight_b[7:], 1)
    assert np.allclose(weight_b[4:7], [0.25, 0.5, 0.75], atol=0.02)


def test_phase_shift_on_real_deepseek_v3_loads():
    """Prefill then decode (real DeepSeek-V3 loads): each phase's pooled shares match its source."""
    pre, dec = read_workload_file(PREFILL, top_k=8), read_workload_file(DECODE, top_k=8)
    assert isinstance(pre, Stats) and isinstance(dec, Stats)
    counts = phase_shift(pre.expert_load[:6], dec.expert_load[:6], 16, 8, 4096, 8, seed=0)
    assert counts.shape == (6, 16, 256) and (counts.sum(axis=2) == 4096 * 8).all()

    def tv(x: np.ndarray, y: np.ndarray) -> float:
        return float(0.5 * np.abs(shares(x) - shares(y)).sum(axis=1).max())

    first, second = counts[:, :8].sum(axis=1), counts[:, 8:].sum(axis=1)
    assert tv(first, pre.expert_load[:6]) < 0.05 and tv(second, dec.expert_load[:6]) < 0.05
    assert tv(first, dec.expert_load[:6]) > 0.1  # the phases differ more than the sampling noise


def test_count_sampled_stationary_and_drifting():
    """count_sampled: drift 0 keeps far steps as alike as near ones; drift > 0 decorrelates them."""
    rng = np.random.default_rng(0)
    load = rng.pareto(1.5, size=(2, 64)) + 0.1
    still = count_sampled(load, 24, 4096, 4, seed=3)
    moving = count_sampled(load, 24, 4096, 4, drift=0.2, seed=3)
    assert still.shape == moving.shape == (2, 24, 64) and (moving.sum(axis=2) == 4096 * 4).all()
    assert np.array_equal(moving, count_sampled(load, 24, 4096, 4, drift=0.2, seed=3))

    def corr(c: np.ndarray, d: int) -> float:
        return float(np.mean([np.corrcoef(np.log1p(c[0, t]), np.log1p(c[0, t + d]))[0, 1] for t in range(24 - d)]))

    flat = [corr(still, d) for d in (1, 5, 10, 20)]
    assert max(flat) - min(flat) < 0.01, flat
    decay = [corr(moving, d) for d in (1, 5, 10, 20)]
    assert (np.diff(decay) < 0).all() and decay[0] - decay[-1] > 0.1, decay  # about 0.98 -> 0.84
    assert moving.max() <= 4096  # the hottest expert's share is capped at 1/k
    # step 0 of a drifting stream is sampled from the load itself (its shares capped at 1/k)
    assert 0.5 * np.abs(shares(moving[:, 0]) - cap_shares(shares(load), 1 / 4)).sum(axis=1).max() < 0.05


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda a, b: domain_sequence({"a": a}, ["b"], 4, 10, 2), "order"),
        (lambda a, b: domain_sequence({"a": a}, [], 4, 10, 2), "order"),
        (lambda a, b: domain_sequence({"a": a}, ["a"], 4, 10, 2, blend=4), "blend"),
        (lambda a, b: domain_sequence({"a": a, "b": b[:1]}, ["a", "b"], 4, 10, 2), "counts_by_domain"),
        (lambda a, b: phase_shift(a, b, 10, 10, 10, 2), "switch"),
        (lambda a, b: phase_shift(a, b, 10, 8, 10, 2, ramp=3), "ramp"),
        (lambda a, b: phase_shift(a, -b, 10, 5, 10, 2), "b"),
        (lambda a, b: phase_shift(a, b, 10, 5, 0, 2), "tokens_per_step"),
        (lambda a, b: count_sampled(a, 10, 10, 2, drift=float("nan")), "drift"),
        (lambda a, b: count_sampled(a, 10, 10, 5), "load"),  # 4 experts routed, top-5
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a"], 4, 10, 2), "order"),
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a", "a"], 4, 10, 2), "order"),
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a", "c"], 4, 10, 2), "order"),
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a", "b"], 4, 10, 2, focus=0.5), "focus"),
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a", "b"], 4, 10, 2, focus=1.5), "focus"),
        (lambda a, b: domain_mix({"a": a, "b": b[:1]}, ["a", "b"], 4, 10, 2), "counts_by_domain"),
        (lambda a, b: domain_mix({"a": a, "b": b}, ["a", "b"], 4, 0, 2), "tokens_per_step"),
    ],
)
def test_bad_stream_input_names_its_field(call, field):
    """Bad builder input is one InputError naming the parameter."""
    a, b = disjoint()
    with pytest.raises(InputError) as info:
        call(a, b)
    assert info.value.field == field, info.value


def test_mix_waypoints_move_from_even_through_each_focus() -> None:
    """The mix starts even, passes through each domain's focused mix in turn, and every row is a mix."""
    way = mix_waypoints(3, 4, focus=0.8)  # 4 steps: exactly the 4 waypoints
    np.testing.assert_allclose(way, [[1 / 3] * 3, [0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    between = mix_waypoints(3, 7, focus=0.8)  # a step halfway between each pair
    np.testing.assert_allclose(between[1], (way[0] + way[1]) / 2)
    np.testing.assert_allclose(between.sum(axis=1), 1.0)


def test_domain_mix_labels_tokens_by_domain() -> None:
    """Each step holds its tokens, their domains drawn from the step's mix; each token picks k
    distinct experts its domain routes to; the same seed draws the same trace."""
    a, b = disjoint(L=2, E=8, k=2)  # domain a routes to experts 0-3, b to 4-7
    t = domain_mix({"a": a, "b": b}, ["a", "b"], 3, 4000, 2, focus=0.9, seed=1)
    assert (t.layers, t.steps, t.num_experts, t.top_k, t.family_names) == (2, 3, 8, 2, ("a", "b"))
    assert (np.bincount(t.step) == 4000).all()
    share_b = np.array([np.mean(t.family[t.step == s] == 1) for s in range(3)])
    np.testing.assert_allclose(share_b, [0.5, 0.1, 0.9], atol=0.03)  # even, focus a, focus b
    assert (t.topk[:, :, 0] != t.topk[:, :, 1]).all()
    assert ((t.topk < 4) == (t.family == 0)[:, None, None]).all()  # each token stays in its domain's experts
    again = domain_mix({"a": a, "b": b}, ["a", "b"], 3, 4000, 2, focus=0.9, seed=1)
    assert np.array_equal(again.topk, t.topk) and np.array_equal(again.family, t.family)


def test_trace_stream_mix_writes_a_labelled_trace(tmp_path) -> None:
    """trace stream mix writes a token trace whose tokens carry their domain, read back as a trace."""
    out = tmp_path / "m.npz"
    argv = ["--select", "mistral", "--order", "github,c4", "--steps", "4", "--tokens-per-step", "50"]
    assert main(["trace", "stream", "mix", "--source", str(DOMAINS), *argv, "--output", str(out), "--quiet"]) == 0
    t = read_workload_file(out)
    assert isinstance(t, Trace) and t.family_names == ("github", "c4") and t.steps == 4 and t.tokens == 200


def run_stream(argv: list[str], tmp_path: Path) -> Stats:
    out = tmp_path / "s.npz"
    assert main(["trace", "stream", *argv, "--output", str(out), "--quiet"]) == 0
    stats = read_workload_file(out)
    assert isinstance(stats, Stats) and stats.step_counts is not None
    assert np.load(out)["step_counts"].dtype == np.float32
    return stats


def test_trace_stream_writes_each_kind(tmp_path, capsys):
    """trace stream domains / phase / sampled write counts files with step_counts the readers accept."""
    s = run_stream(["domains", "--source", str(DOMAINS), "--select", "mistral", "--order", "github,c4"], tmp_path)
    assert s.step_counts.shape == (3, 16, 8) and (s.step_counts.sum(axis=2) == 4096 * 2).all()
    assert np.allclose(s.expert_load, s.step_counts.sum(axis=1)) and s.top_k == 2
    argv = ["phase", "--source", str(PREFILL), "--after", str(DECODE), "--top-k", "8", "--steps", "6"]
    s = run_stream([*argv, "--tokens-per-step", "64"], tmp_path)
    assert s.step_counts.shape == (58, 6, 256) and (s.step_counts.sum(axis=2) == 64 * 8).all()
    argv = ["sampled", "--source", str(PREFILL), "--top-k", "8", "--steps", "5", "--drift", "0.1"]
    s = run_stream([*argv, "--tokens-per-step", "64"], tmp_path)
    assert s.step_counts.shape == (58, 5, 256)
    assert capsys.readouterr().out == ""  # --quiet


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sampled", "--source", str(PREFILL), "--top-k", "8", "--blend", "2"], "--blend: only used by"),
        (["phase", "--source", str(PREFILL), "--top-k", "8"], "--after"),
        (["domains", "--source", str(DOMAINS), "--select", "olmoe", "--order", "github,nope"], "--order"),
        (
            ["domains", "--source", str(DOMAINS), "--select", "olmoe", "--steps-per-domain", "2", "--blend", "2"],
            "--blend",
        ),
        (["domains", "--source", str(PREFILL), "--top-k", "8"], "per-domain"),
        (["phase", "--source", str(PREFILL), "--after", str(DECODE), "--top-k", "8", "--switch", "48"], "--switch"),
        (["sampled", "--source", str(PREFILL)], "top_k"),
        (["sampled", "--source", str(PREFILL), "--top-k", "8", "--drift", "-1"], "--drift"),
        (["sampled", "--source", "missing.npz", "--top-k", "8"], "file not found"),
        (["phase", "--source", str(DOMAINS), "--after", str(PREFILL), "--select", "olmoe"], "--select"),
        (["mix", "--source", str(DOMAINS), "--select", "olmoe", "--order", "github"], "--order"),
        (["mix", "--source", str(DOMAINS), "--select", "olmoe", "--focus", "0.1"], "--focus"),
        (["mix", "--source", str(DOMAINS), "--select", "olmoe", "--focus", "2"], "--focus"),
        (["mix", "--source", str(DOMAINS), "--select", "olmoe", "--blend", "1"], "--blend: only used by"),
        (["mix", "--source", str(PREFILL), "--top-k", "8"], "per-domain"),
    ],
)
def test_trace_stream_bad_input_is_one_line(argv, needle, tmp_path, capsys):
    """Bad trace stream input exits 2 with one line saying what was wrong, and writes nothing."""
    out = tmp_path / "s.npz"
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["trace", "stream", *argv, "--output", str(out)]))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and needle in err, err
    assert not out.exists()


BUNDLED = sorted(REPLAY.glob("*.yaml"))


def test_bundled_streams_exist():
    """instances/replay holds the nine named stream instances, each file under 2 MB."""
    names = {p.stem for p in BUNDLED}
    assert names >= {
        "olmoe-domains-stream",
        "mixtral-domains-stream",
        "deepseek-v3-prefill-decode-stream",
        "deepseek-v3-count-sampled-stream",
        "synthetic-mix-drift",
        "synthetic-popularity-drift",
        "synthetic-switch",
        "olmoe-domain-mix-stream",
        "mixtral-domain-mix-stream",
    }
    for path in REPLAY.iterdir():
        assert path.stat().st_size < 2 * 2**20, path


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_bundled_stream_loads_with_enough_steps(path):
    """Each bundled stream instance loads, fits its model and has 32+ steps (windows of 4-8, 6+ re-plans)."""
    inst = load_instance(path)
    w = load_workload(inst.workload.calibration, inst.model)
    steps = w.steps if isinstance(w, Trace) else w.step_counts.shape[1]
    assert steps >= 32
    counts = w.step_counts
    assert counts.shape == (inst.model.layers, steps, inst.model.experts)
    assert (counts.sum(axis=1) > 0).any(axis=1).all()  # every layer routes tokens


def readme_commands() -> list[list[str]]:
    """The ``python -m moeopt ...`` commands of instances/replay/README.md (continuations joined)."""
    text = (REPLAY / "README.md").read_text().replace("\\\n", " ")
    return [shlex.split(line)[3:] for line in text.splitlines() if line.startswith("python -m moeopt ")]


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda argv: Path(argv[argv.index("--output") + 1]).stem)
def test_readme_commands_redraw_the_bundled_streams(argv, tmp_path, monkeypatch):
    """Each command of the README redraws its bundled stream exactly (from the repository root)."""
    monkeypatch.chdir(ROOT)
    at = argv.index("--output") + 1
    bundled = np.load(ROOT / argv[at])
    argv = [*argv[:at], str(tmp_path / "s.npz"), *argv[at + 1 :], "--quiet"]
    assert main(argv) == 0
    redrawn = np.load(tmp_path / "s.npz")
    assert sorted(redrawn.files) == sorted(bundled.files)
    for key in bundled.files:
        assert np.array_equal(redrawn[key], bundled[key]) and redrawn[key].dtype == bundled[key].dtype, key


def test_small_stream_instance_solves(capsys):
    """solve --method balance plans a bundled stream instance (Mixtral domains)."""
    assert main(["solve", str(REPLAY / "mixtral-domains-stream.yaml"), "--method", "balance", "--quiet"]) == 0
    assert "MaxVio per step" in capsys.readouterr().out
