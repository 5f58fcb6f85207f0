"""GPU validation harness on the CPU at tiny sizes: profiler, plan runs, report shape, no-torch path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.cli import main
from moeopt.dispatch import route_trace
from moeopt.evaluate import communication, evaluate, linear_plan
from moeopt.harness.alltoall import rank_traffic
from moeopt.harness.profile import monotone_fit, split_tokens, step_function_error
from moeopt.harness.run import PLAN_KEYS, REPORT_KEYS, plan_loads, ranking
from moeopt.instance import Cluster
from moeopt.io import load_instance, read_profile, write_plan
from moeopt.plan import Dispatch, Plan
from moeopt.profile import synthetic_profile
from moeopt.solve import load_workloads
from moeopt.trace import stats_from_counts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def torch():
    """torch (CPU build is enough); the tests that run kernels skip without it."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_instance(tmp_path_factory) -> Path:
    """1 layer x 8 experts, top-2, 2 GPUs, 4 steps; synthetic workload and a synthetic profile."""
    d = tmp_path_factory.mktemp("harness")
    path = d / "tiny.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            name: tiny
            model: {layers: 1, experts: 8, top_k: 2}
            cluster: {gpus: 2}
            workload:
              synthetic: {tokens: 256, steps: 4, seed: 3}
            profile: {variability: high, seed: 1, tile: 32, max_tiles: 16}
            """
        )
    )
    return path


# ----------------------------------------------------------------------------- pure numpy
def test_step_function_error_known_values() -> None:
    """Step function P[ceil(n/tile)] vs a linear dense sweep: errors computed by hand."""
    err = step_function_error(np.array([0.0, 1.0, 2.0]), np.array([0.0, 0.5, 1.0, 1.5, 2.0]), tile=2)
    assert err["max_rel_error"] == pytest.approx(1.0)
    assert err["n_at_max"] == 1
    assert err["mean_rel_error"] == pytest.approx((1.0 + 0.0 + 1.0 / 3.0 + 0.0) / 4.0)


@given(st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=30))
def test_monotone_fit_is_nondecreasing_and_keeps_the_sum(values: list[float]) -> None:
    """The pool-adjacent-violators fit never decreases and preserves the total."""
    fit = monotone_fit(np.array(values))
    assert len(fit) == len(values)
    assert (np.diff(fit) >= -1e-9).all()
    assert fit.sum() == pytest.approx(sum(values), rel=1e-9, abs=1e-9)
    if (np.diff(values) >= 0).all():
        np.testing.assert_allclose(fit, values)


def test_monotone_fit_is_not_dragged_up_by_one_outlier() -> None:
    """One slow sample early does not raise every later step (unlike a running max)."""
    fit = monotone_fit(np.array([0.0, 9.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    assert fit[-1] == 7.0
    assert fit[1] < 9.0


def test_split_tokens_even() -> None:
    """Tokens are spread over experts with sizes differing by at most one."""
    assert split_tokens(10, 4) == [3, 3, 2, 2]
    assert sum(split_tokens(7, 3)) == 7


def test_ranking_agreement_and_tau() -> None:
    """Same order: tau 1, agrees; opposite order: tau -1, one discordant pair; ties agree."""
    same = ranking(["a", "b", "c"], [1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    assert same["agrees"] is True and same["kendall_tau"] == pytest.approx(1.0)
    assert same["measured"] == ["a", "b", "c"]
    flipped = ranking(["a", "b"], [2.0, 1.0], [1.0, 2.0])
    assert flipped["agrees"] is False and flipped["discordant_pairs"] == 1
    assert flipped["kendall_tau"] == pytest.approx(-1.0)
    tied = ranking(["a", "b"], [1.0, 2.0], [5.0, 5.0])
    assert tied["agrees"] is True and tied["kendall_tau"] is None
    single = ranking(["a"], [1.0], [1.0])
    assert single["agrees"] is None


def test_plan_loads_match_the_evaluator(quickstart_path: Path) -> None:
    """Per-expert counts sum to the evaluator's loads; modelled S equals evaluate()'s S; traffic = remote."""
    inst = load_instance(quickstart_path)
    wl = load_workloads(inst)
    trace = wl.evaluation
    G = inst.cluster.gpus
    home = np.random.default_rng(5).integers(0, G, size=trace.tokens)
    trace = dataclasses.replace(trace, home=home)
    plan = linear_plan(inst.model.layers, inst.model.experts, G)
    # a replica makes the dispatch non-trivial; the guard's per-token choices are what the
    # evaluator counts too (even and lp are fractional there, rounded to tokens here)
    reps = tuple(np.array([[0, 3]]) for _ in range(inst.model.layers))
    plan = Plan.from_homes(plan.home, reps, gpus=G, dispatch=Dispatch(kind="locality"))
    cluster = dataclasses.replace(inst.cluster, replica_slots_per_gpu=1)
    pl = plan_loads("p", plan, trace, cluster)
    np.testing.assert_array_equal(pl.per_expert.sum(axis=-1), pl.step_loads)
    # every token-expert assignment of the trace is executed exactly once
    counts = np.stack(
        [np.bincount(trace.topk[:, l].ravel(), minlength=inst.model.experts) for l in range(inst.model.layers)]
    )
    np.testing.assert_array_equal(pl.per_expert.sum(axis=(1, 2)), counts)
    profile = synthetic_profile(G, variability="medium", seed=2)
    from moeopt.evaluate import straggler

    assert straggler(pl.step_loads, profile)[0] == pytest.approx(
        evaluate(plan, trace, cluster, profile=profile)["straggler_latency"]
    )
    _, remote, _ = communication(route_trace(plan, trace, cluster).gpu, cluster, home)
    np.testing.assert_allclose(pl.traffic.sum(axis=(1, 2, 3)), remote.sum(axis=0))
    assert (pl.traffic[:, :, np.arange(G), np.arange(G)] == 0).all()


def test_plan_loads_from_step_counts_split_replicas() -> None:
    """Count statistics: replicas split an expert's tokens evenly, per expert and GPU."""
    step_counts = np.array([[[8.0, 2.0, 0.0, 4.0], [0.0, 6.0, 2.0, 2.0]]])  # [L=1, T=2, E=4]
    stats = stats_from_counts(step_counts.sum(axis=1), top_k=1, step_counts=step_counts)
    plan = Plan.from_homes(np.array([[0, 0, 1, 1]]), (np.array([[0, 1]]),), gpus=2)
    cluster = Cluster(gpus=2, gpus_per_node=2, slots_per_gpu=2, replica_slots_per_gpu=1)
    pl = plan_loads("p", plan, stats, cluster)
    assert pl.per_expert[0, 0, 0, 0] == 4 and pl.per_expert[0, 0, 1, 0] == 4
    assert pl.per_expert[0, 0, 1, 3] == 4 and pl.per_expert[0, 1, 0, 1] == 6
    np.testing.assert_allclose(pl.per_expert.sum(axis=-1), pl.step_loads)
    assert pl.traffic is None


def test_rank_traffic_folds_gpus_and_drops_local() -> None:
    """Emulated GPUs g map to rank g mod W; traffic between GPUs on one rank is local."""
    traffic = np.zeros((1, 1, 4, 4), dtype=np.int64)
    traffic[0, 0, 0, 2] = 5  # same rank 0 -> local
    traffic[0, 0, 0, 1] = 3  # rank 0 -> rank 1
    traffic[0, 0, 3, 2] = 7  # rank 1 -> rank 0
    folded = rank_traffic(traffic, 2)
    assert folded[0, 0].tolist() == [[0, 3], [7, 0]]


# ----------------------------------------------------------------------------- no torch
def test_cli_without_torch_one_line_exit_2(monkeypatch, capsys, quickstart_path: Path, tmp_path: Path) -> None:
    """profile and validate without torch: exit code 2 and one error line naming the install."""
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    for argv in (
        ["profile", "--output", str(tmp_path / "p.yaml")],
        ["validate", str(quickstart_path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("error:") and 'pip install -e ".[torch]"' in err[0]
    assert not (tmp_path / "p.yaml").exists()


def test_import_and_cli_work_without_torch() -> None:
    """import moeopt, the harness modules and a plain CLI command need no torch."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import moeopt, moeopt.cli, moeopt.harness.profile, moeopt.harness.run, moeopt.harness.alltoall\n"
        "assert moeopt.cli.main(['methods']) == 0\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "linear" in out.stdout


# ----------------------------------------------------------------------------- with torch (CPU)
def test_profile_cli_cpu_tiny(torch, tmp_path: Path, capsys) -> None:
    """profile --dense at tiny sizes writes a readable, non-decreasing profile with its error."""
    out = tmp_path / "cpu.yaml"
    rc = main(
        [
            "profile",
            "--device",
            "cpu",
            "--d-model",
            "32",
            "--d-ff",
            "64",
            "--max-tokens",
            "128",
            "--tile",
            "32",
            "--dense",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    assert "step function vs dense" in capsys.readouterr().out
    prof = read_profile(out)
    assert prof.tile == 32 and prof.latency.shape == (1, 5)
    assert (np.diff(prof.latency[0]) >= 0).all() and prof.latency[0, -1] > 0
    meta = prof.meta
    assert meta["device_type"] == "cpu" and meta["torch"] == torch.__version__
    assert (meta["d_model"], meta["d_ff"], meta["dtype"]) == (32, 64, "fp32")
    assert meta["points"] == {"tile": 5, "dense": 129}
    assert meta["sampling_seconds"]["tile"] > 0 and meta["sampling_seconds"]["dense"] > 0
    err = meta["dense_vs_tile"]
    assert err["max_rel_error"] >= err["mean_rel_error"] >= 0
    assert 1 <= err["n_at_max"] <= 128


def test_profile_speeds_scale_rows(torch) -> None:
    """Emulated speeds divide the measured row: a speed-2 GPU is twice as fast."""
    from moeopt.harness.profile import FFNShape, measure_profile

    run = measure_profile(
        FFNShape(16, 32), device="cpu", max_tokens=64, tile=32, repeats=2, warmup=1, speeds=[1.0, 2.0]
    )
    lat = run.profile.latency
    np.testing.assert_allclose(lat[1], lat[0] / 2.0)
    assert run.profile.speed[1] / run.profile.speed[0] == pytest.approx(2.0)
    assert run.dense_ms is None and "dense_vs_tile" not in run.profile.meta


def test_timer_rounds_median_and_min(torch, monkeypatch) -> None:
    """Interleaved rounds keep the median (or min) of each callable's runs, in order. The clock
    is the timer's perf_counter, advanced by the callables (a loaded machine stretches real
    sleeps: a 1 ms sleep once measured 3.06 ms and failed this test)."""
    from moeopt.harness import profile
    from moeopt.harness.profile import Timer

    clock = [0.0]
    monkeypatch.setattr(profile.time, "perf_counter", lambda: clock[0])
    for statistic, expect in (("median", 3.0), ("min", 1.0)):
        naps = iter([0.006, 0.0, 0.001, 0.0, 0.003, 0.0])  # rounds: (slow, idle) x 3

        def nap(naps=naps) -> None:
            clock[0] += next(naps)

        got = Timer("cpu", warmup=0, repeats=3, statistic=statistic).rounds([nap, nap])
        assert got[0] == pytest.approx(expect) and got[1] == 0.0


def test_bad_device_and_sizes_are_clear_errors(torch, tmp_path: Path, capsys) -> None:
    """Asking for CUDA on a CPU-only torch, or a zero size, is one error line with exit 2."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert main(["profile", "--device", "cuda", "--output", str(tmp_path / "x.yaml")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # a usage error now, like every out-of-range option
        main(["profile", "--device", "cpu", "--d-model", "0", "--output", str(tmp_path / "x.yaml")])
    assert info.value.code == 2 and "--d-model" in capsys.readouterr().err


def test_validate_cli_report_shape(torch, tiny_instance: Path, tmp_path: Path, capsys) -> None:
    """validate with two plan files: documented report keys, positive measurements, ranking."""
    inst = load_instance(tiny_instance)
    G, L, E = inst.cluster.gpus, inst.model.layers, inst.model.experts
    lin = tmp_path / "linear.json"
    write_plan(lin, linear_plan(L, E, G), "linear")
    skew = tmp_path / "interleaved.json"
    write_plan(skew, Plan.from_homes(np.tile(np.arange(E) % G, (L, 1)), gpus=G), "interleaved")
    report_path, md_path = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(
        [
            "validate",
            str(tiny_instance),
            str(lin),
            str(skew),
            "--device",
            "cpu",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--report",
            str(report_path),
            "--markdown",
            str(md_path),
            "--quiet",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert tuple(k for k in report if k not in ("moeopt_version", "git_commit")) == REPORT_KEYS
    assert report["moeopt_version"] == version("moeopt")  # every report names the version that made it
    assert report["format"] == "moeopt.validate/1" and report["device"]["type"] == "cpu"
    assert report["speed_source"] == "profile" and report["modelled_profile"]["source"] == "instance"
    assert report["steps"] == 4 and len(report["speeds"]) == G
    assert [p["name"] for p in report["plans"]] == ["linear", "interleaved"]
    wl = load_workloads(inst)
    for entry, plan_path in zip(report["plans"], (lin, skew), strict=True):
        assert tuple(entry) == PLAN_KEYS
        assert entry["measured_straggler_ms"] > 0 and entry["measured_p90_ms"] > 0
        assert len(entry["measured_per_step_ms"]) == 4 and min(entry["measured_per_step_ms"]) > 0
        assert entry["assignments"] == 256 * 2
        from moeopt.io import read_plan

        plan = read_plan(plan_path)
        # the modelled value is the evaluator's S on the full evaluation workload
        expected = evaluate(plan, wl.evaluation, inst.cluster, profile=wl.profile)["straggler_latency"]
        assert entry["modelled_straggler"] == pytest.approx(expected)
    assert report["plans"][0]["measured_improvement_vs_linear"] == 0.0
    inter = report["plans"][1]
    lin_s = report["plans"][0]["modelled_straggler"]
    assert inter["modelled_improvement_vs_linear"] == pytest.approx(100 * (lin_s - inter["modelled_straggler"]) / lin_s)
    r = report["ranking"]
    assert set(r) == {"measured", "modelled", "kendall_tau", "p_value", "discordant_pairs", "agrees"}
    assert sorted(r["measured"]) == ["interleaved", "linear"]
    (m0, m1), (s0, s1) = ([p[k] for p in report["plans"]] for k in ("measured_straggler_ms", "modelled_straggler"))
    discordant = (m0 - m1) * (s0 - s1) < 0  # the two plans ordered oppositely by measurement and model
    assert r["discordant_pairs"] == int(discordant) and r["agrees"] is (not discordant)
    assert report["all_to_all"]["ran"] is False
    assert "| linear |" in md_path.read_text() and "Ranking" in printed


def test_validate_solves_on_the_spot_and_measures_a_profile(torch, tmp_path: Path) -> None:
    """No plan and no instance profile: linear and greedy solved here, profile measured here."""
    from moeopt.harness.run import validate

    path = tmp_path / "noprof.yaml"
    path.write_text(
        "name: noprof\nmodel: {layers: 1, experts: 8, top_k: 2}\ncluster: {gpus: 2}\n"
        "workload:\n  synthetic: {tokens: 128, steps: 3, seed: 1}\n"
    )
    report = validate(load_instance(path), device="cpu", speeds=[1.0, 0.5], max_steps=2, repeats=1, warmup=0, tile=32)
    names = [p["name"] for p in report["plans"]]
    assert names[:2] == ["linear", "greedy"]
    from moeopt.registry import method_names

    assert ("gem" in names) == ("gem" in method_names())
    assert report["speed_source"] == "cli" and report["speeds"] == [1.0, 0.5]
    assert report["modelled_profile"]["source"] == "measured" and report["steps"] == 2
    for entry in report["plans"]:
        assert entry["measured_straggler_ms"] > 0 and entry["modelled_straggler"] > 0
        assert len(entry["modelled_per_step"]) == 2


def test_validate_with_measured_profile_file(torch, tiny_instance: Path, tmp_path: Path) -> None:
    """The prepared script's path: profile --speeds, then validate --profile uses its speeds."""
    prof = tmp_path / "measured.yaml"
    size = ["--device", "cpu", "--d-model", "32", "--d-ff", "64", "--statistic", "min", "--quiet"]
    assert (
        main(
            [
                "profile",
                *size,
                "--experts-per-gpu",
                "4",
                "--max-tokens",
                "256",
                "--tile",
                "32",
                "--speeds",
                "1.0,0.5",
                "--repeats",
                "2",
                "--output",
                str(prof),
            ]
        )
        == 0
    )
    rep = tmp_path / "r.json"
    assert (
        main(
            [
                "validate",
                str(tiny_instance),
                *size,
                "--profile",
                str(prof),
                "--max-steps",
                "2",
                "--repeats",
                "2",
                "--report",
                str(rep),
            ]
        )
        == 0
    )
    report = json.loads(rep.read_text())
    assert report["modelled_profile"]["source"] == "file" and report["modelled_profile"]["tile"] == 32
    assert report["speed_source"] == "profile" and report["speeds"] == [1.0, 0.5]
    assert report["timing"]["statistic"] == "min" and report["steps"] == 2
    assert all(p["modelled_straggler"] > 0 and p["measured_straggler_ms"] > 0 for p in report["plans"])


def test_validate_needs_steps_and_positive_max_steps(torch, tiny_instance: Path, tmp_path: Path, capsys) -> None:
    """Count-only workloads without per-step counts, and --max-steps 0, are one-line errors."""
    counts = tmp_path / "counts.npz"
    np.savez(counts, counts=np.arange(1, 9, dtype=np.float64).reshape(1, 8), top_k=np.array(2))
    inst = tmp_path / "counts.yaml"
    inst.write_text(
        "model: {layers: 1, experts: 8, top_k: 2}\ncluster: {gpus: 2}\nworkload: {calibration: counts.npz}\n"
    )
    assert main(["validate", str(inst), "--device", "cpu", "--quiet"]) == 2
    assert "per-timestep counts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # a usage error now, like every out-of-range option
        main(["validate", str(tiny_instance), "--device", "cpu", "--max-steps", "0", "--quiet"])
    assert info.value.code == 2 and "--max-steps" in capsys.readouterr().err


def test_validate_rejects_wrong_speed_count(torch, tiny_instance: Path, capsys) -> None:
    """--speeds must give one value per GPU of the instance."""
    assert main(["validate", str(tiny_instance), "--device", "cpu", "--speeds", "1,1,1", "--quiet"]) == 2
    assert "expected 2 values" in capsys.readouterr().err


def test_all_to_all_gloo_path(torch, quickstart_path: Path) -> None:
    """The all-to-all code path (NCCL on GPUs) runs with gloo on 2 CPU ranks and counts bytes."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed not built")
    from moeopt.harness.alltoall import time_all_to_all

    inst = load_instance(quickstart_path)
    wl = load_workloads(inst)
    G = inst.cluster.gpus
    pl = plan_loads("linear", linear_plan(inst.model.layers, inst.model.experts, G), wl.evaluation, inst.cluster)
    out = time_all_to_all([pl], world=2, backend="gloo", steps=2, d_model=8, dtype="fp32", repeats=1)
    assert out["ran"] is True and out["world"] == 2
    assert out["ms"]["linear"] > 0
    assert out["bytes"]["linear"] == int(rank_traffic(pl.traffic[:, :2], 2).sum()) * 8 * 4
