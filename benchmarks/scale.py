"""Scale-out benchmark: a whole DeepSeek-V3-size model serially, in 2 worker processes and on a
local Ray, and how the cost of one layer grows with the experts and the tokens.

Part 1, the whole model: DeepSeek-V3 (58 MoE layers x 256 experts, top-8) on 64 GPUs (8 per
node, 4 slots each), calibration = a *count-sampled* trace of the real SGLang prefill loads
(``instances/real/deepseek_v3_prefill_in1024.json``, ``moeopt.synth.trace_from_counts``,
8192 tokens in 16 steps), a synthetic latency profile (medium variability) for GEM. Methods
with fixed work budgets, so that no clock cuts a search short and every executor returns the
same plan (checked): ``greedy`` and ``balance`` (counts), ``tacg`` (40 local-search rounds,
patience 20) and ``gem`` (30 perturbation rounds, patience 10, no ILS clock). Each method is
solved with ``workers=1`` (serial), ``workers=2`` (a local process pool) and ``ray="local"``
(a local Ray started for the run and stopped after it, as ``--ray`` does). Wall time is
what a caller of :func:`moeopt.solve.solve` waits, scoring included; ``layer sum`` is the
sum of the layers' own solve times. Start-up costs are measured apart: a pool on a method
that costs nothing per layer (``linear``), and ``ray.init`` + ``ray.shutdown``, before any
other run. Then paired runs: serial and 2 workers alternated 3 times on the first 8 layers,
the speed-up to read on a machine shared with other work (one pair of runs measures the
neighbours' load as much as the executor).

Part 2, one layer: serial solve time of one layer, and the time to turn its trace into
statistics, for E = 64, 128, 256, 512 experts (100k tokens) and for 10k, 100k, 1M tokens
(E = 256); synthetic task-structured traces (``moeopt.synth``, top-8, 16 steps), 64 GPUs.

Every run uses one BLAS thread (``OMP_NUM_THREADS`` etc. = 1 unless set): the pool's workers
and Ray's tasks run with one, and on a busy 2-core machine OpenBLAS's second thread alone made
a serial ``tacg`` about 1.6x slower, which would otherwise count as executor speed-up.

Part 3: what a Ray cluster of 16 nodes would give, *estimated* from part 1's per-layer times
(list scheduling of the 58 layers in order on 16 x c CPUs, plus the measured per-run Ray
overhead); not measured.

Run: ``python benchmarks/scale.py`` (about 15 min on 2 cores; ``--quick`` for a smoke run
on 6 layers). Writes ``benchmarks/results/scale.json``, ``scale.md`` and ``scale.png``.
"""

from __future__ import annotations

import os

# One BLAS thread everywhere (before numpy loads): the pool's workers and Ray's tasks run with
# one, so the serial run does too and the speed-ups measure the executors, not OpenBLAS.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import pickle  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from machine_info import machine, run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from tabulate import tabulate  # noqa: E402

from moeopt import execute  # noqa: E402
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource  # noqa: E402
from moeopt.io import read_workload_file, write_json, write_text  # noqa: E402
from moeopt.profile import synthetic_profile  # noqa: E402
from moeopt.registry import Context, Problem, get_method, parse_params  # noqa: E402
from moeopt.scoring import Workloads  # noqa: E402
from moeopt.solve import solve  # noqa: E402
from moeopt.synth import SynthSpec, synthesize, trace_from_counts  # noqa: E402
from moeopt.trace import stats_from_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
PREFILL = ROOT / "instances" / "real" / "deepseek_v3_prefill_in1024.json"

GPUS, GPUS_PER_NODE, TOP_K, STEPS = 64, 8, 8, 16
TOKENS = 8192
#: label: (method, parameters); fixed budgets: the same plan from every executor
METHODS = {
    "greedy": ("greedy", {}),
    # pooled loads (the trace has steps: the default robust: auto plans per layer, split like
    # tacg; the results in benchmarks/results/scale.* predate it and measured this pooled pass)
    "balance": ("balance", {"robust": "none"}),
    "tacg": ("tacg", {"iterations": 40, "patience": 20}),
    "gem": ("gem", {"rounds": 30, "patience": 10, "ils_time": 0.0}),
}
#: seconds per layer: far above any layer's work, so it never binds
TIME_LIMIT = 600.0
EXECUTORS = {
    "serial": {"workers": 1},
    "2 workers": {"workers": 2},
    "local Ray (2 CPUs)": {"ray": "local", "workers": 2},
}
#: the paired measurement: serial and 2 workers alternated on the first layers
PAIRED_LAYERS, PAIRED_REPS = 8, 3
SWEEP_E = (64, 128, 256, 512)
SWEEP_TOKENS = (10_000, 100_000, 1_000_000)
SWEEP_BASE_TOKENS = 100_000
CLUSTER_NODES = 16
CLUSTER_CPUS = (2, 8)


def instance(layers: int, experts: int) -> Instance:
    return Instance(
        name=f"scale-{layers}x{experts}",
        model=Model(layers=layers, experts=experts, top_k=TOP_K),
        cluster=Cluster(gpus=GPUS, gpus_per_node=GPUS_PER_NODE, slots_per_gpu=-(-experts // GPUS)),
        workload=Workload(WorkloadSource(synthetic={})),  # unused: workloads are passed in
        method=MethodSpec("greedy"),
        profile={"variability": "medium", "seed": 0, "tile": 64},
    )


def deepseek_workloads(layers: int) -> Workloads:
    counts = read_workload_file(PREFILL, top_k=TOP_K)
    stats = stats_from_counts(counts.counts[:, :layers], top_k=TOP_K, family_names=counts.family_names)
    trace = trace_from_counts(stats, tokens=TOKENS, steps=STEPS, seed=0)
    return Workloads(trace, trace, trace.stats(), synthetic_profile(GPUS, variability="medium", seed=0, tile=64))


def timed_solve(inst: Instance, wl: Workloads, method: str, params: dict, **executor) -> tuple[float, object]:
    t0 = time.perf_counter()
    r = solve(inst, method=method, params=params, workloads=wl, layer_time_limit=TIME_LIMIT, quiet=True, **executor)
    return time.perf_counter() - t0, r


def _layerwise(inst: Instance, wl: Workloads, method: str, params: dict) -> bool:
    """Whether this run of ``method`` is split per layer (:func:`moeopt.execute.is_layerwise`)."""
    impl = get_method(method)
    problem = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    return execute.is_layerwise(impl, problem, parse_params(impl, params), Context(seed=0))


def payload_kib(inst: Instance, wl: Workloads, method: str, params: dict) -> float:
    """Mean pickled size of one layer's task (what a worker or a Ray node receives)."""
    impl = get_method(method)
    problem = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    tasks = execute.layer_tasks(impl, problem, parse_params(impl, params), Context(seed=0))
    return float(np.mean([len(pickle.dumps(t)) for t in tasks[:4]]) / 1024)


def startup_costs(inst: Instance, wl: Workloads, log) -> dict:
    serial, _ = timed_solve(inst, wl, "linear", {})
    pooled, _ = timed_solve(inst, wl, "linear", {}, workers=2)
    out = {"pool_start_s": max(pooled - serial, 0.0)}
    try:
        import ray
    except ImportError:
        log("Ray is not installed: no Ray rows")
        return out
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    t1 = time.perf_counter()
    ray.shutdown()
    out.update(ray_init_s=t1 - t0, ray_shutdown_s=time.perf_counter() - t1)
    return out


def whole_model(layers: int, methods: list[str], start: dict, log) -> tuple[list[dict], dict]:
    inst = instance(layers, 256)
    wl = deepseek_workloads(layers)
    executors = {k: v for k, v in EXECUTORS.items() if "ray" not in v or "ray_init_s" in start}
    rows, per_layer = [], {}
    for label in methods:
        method, params = METHODS[label]
        layerwise = _layerwise(inst, wl, method, params)
        kib = payload_kib(inst, wl, method, params) if layerwise else None
        digests = set()
        # a method that solves all layers together runs serially whatever the executor: one row
        runs = executors if layerwise else {"serial (whole model)": {"workers": 1}}
        for ex_label, ex in runs.items():
            wall, r = timed_solve(inst, wl, method, params, **ex)
            digests.add(hashlib.sha256(r.plan.slots.tobytes()).hexdigest())
            layer_times = r.stats.get("layer_wall_times", [r.wall_time])
            cpu = float(sum(r.stats.get("layer_cpu_times", [np.nan])))
            if layerwise and ex_label == "serial":
                per_layer[label] = layer_times
            rows.append(
                {
                    "method": label,
                    "executor": ex_label,
                    "wall_s": wall,
                    "solve_s": r.wall_time,
                    "layer_sum_s": float(sum(layer_times)),
                    "layer_cpu_s": cpu,
                    "objective": r.objective,
                    "payload_kib": kib,
                    "status": r.status.value,
                    "layerwise": layerwise,
                }
            )
            log(f"{label:8s} {ex_label:20s} wall {wall:8.2f} s (layers {sum(layer_times):8.2f} s)")
        for row in rows[-len(runs) :]:
            row["same_plan_as_serial"] = len(digests) == 1
    return rows, per_layer


def _spin(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def cpu_parallelism(seconds: float = 2.0) -> float:
    """How many CPUs this process can use right now: the work two busy processes get done in
    ``seconds``, over what one gets done alone (2.0 on an idle 2-core machine)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_spin, [0.1, 0.1]))  # start both workers first
        one = pool.submit(_spin, seconds).result()
        two = sum(pool.map(_spin, [seconds, seconds]))
    return two / max(one, 1)


def paired_speedup(methods: list[str], layers: int, reps: int, log) -> list[dict]:
    """Serial and 2-worker solves of the first ``layers`` layers, alternated ``reps`` times.

    On a machine shared with other work a single pair of runs measures the neighbours as
    much as the executor; alternating the two and taking the median ratio does not.
    """
    inst = instance(layers, 256)
    wl = deepseek_workloads(layers)
    out = []
    for label in methods:
        method, params = METHODS[label]
        if not _layerwise(inst, wl, method, params):
            continue
        serial, pooled, serial_cpu, pooled_cpu = [], [], [], []
        capacity = [cpu_parallelism()]
        for rep in range(reps):
            order = [("serial", 1), ("pool", 2)] if rep % 2 == 0 else [("pool", 2), ("serial", 1)]
            for kind, workers in order:
                wall, r = timed_solve(inst, wl, method, params, workers=workers)
                cpu = float(sum(r.stats["layer_cpu_times"]))
                (serial if kind == "serial" else pooled).append(wall)
                (serial_cpu if kind == "serial" else pooled_cpu).append(cpu)
        capacity.append(cpu_parallelism())
        ratios = [s / p for s, p in zip(serial, pooled, strict=True)]
        row = {
            "method": label,
            "layers": layers,
            "serial_s": serial,
            "2_workers_s": pooled,
            "serial_cpu_s": serial_cpu,
            "2_workers_cpu_s": pooled_cpu,
            "speedups": ratios,
            "median_speedup": float(np.median(ratios)),
            "best_speedup": float(max(ratios)),
            "cpus_available": capacity,
        }
        out.append(row)
        log(
            f"paired {label}: serial {np.round(serial, 1).tolist()} s, 2 workers {np.round(pooled, 1).tolist()} s, "
            f"speed-up median {row['median_speedup']:.2f}x; CPUs available {np.round(capacity, 2).tolist()}"
        )
    return out


def one_layer_costs(methods: list[str], quick: bool, log) -> list[dict]:
    points = [(E, SWEEP_BASE_TOKENS) for E in SWEEP_E] + [(256, n) for n in SWEEP_TOKENS if n != SWEEP_BASE_TOKENS]
    if quick:
        points = [(64, 10_000), (128, 10_000), (256, 10_000), (256, 30_000)]
    out = []
    for E, tokens in points:
        spec = SynthSpec(layers=1, experts=E, top_k=TOP_K, tokens=tokens, steps=STEPS, structure_seed=0, seed=0)
        trace = synthesize(spec)
        t0 = time.perf_counter()
        stats = trace.stats()
        stats_s = time.perf_counter() - t0
        wl = Workloads(trace, trace, stats, synthetic_profile(GPUS, variability="medium", seed=0, tile=64))
        inst = instance(1, E)
        row = {"experts": E, "tokens": tokens, "stats_s": stats_s}
        for label in methods:
            method, params = METHODS[label]
            _, r = timed_solve(inst, wl, method, params)
            row[label] = float(sum(r.stats.get("layer_wall_times", [r.wall_time])))
        out.append(row)
        log(
            f"one layer E={E:4d} tokens={tokens:8d}: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in row.items() if k not in ("experts", "tokens"))
        )
    return out


def makespan(times: list[float], slots: int) -> float:
    """Layers handed out in order to the first free of ``slots`` CPUs (Ray's FIFO)."""
    free = np.zeros(slots)
    for t in times:
        i = int(np.argmin(free))
        free[i] += t
    return float(free.max())


def cluster_estimate(per_layer: dict, rows: list[dict], start: dict) -> list[dict]:
    out = []
    for label, times in per_layer.items():
        ray_row = next((r for r in rows if r["method"] == label and "Ray" in r["executor"]), None)
        pool_row = next(r for r in rows if r["method"] == label and r["executor"] == "2 workers")
        serial_row = next(r for r in rows if r["method"] == label and r["executor"] == "serial")
        # per-run overhead of Ray beyond its layers' own work (as they ran there, on 2 CPUs), its
        # start and stop excluded: worker start-up, shipping, scheduling, scoring
        boot = start.get("ray_init_s", 0.0) + start.get("ray_shutdown_s", 0.0)
        overhead = (ray_row["wall_s"] - boot - ray_row["layer_sum_s"] / 2) if ray_row else 0.0
        row = {
            "method": label,
            "serial_s": serial_row["wall_s"],
            "2_workers_s": pool_row["wall_s"],
            "ray_overhead_s": max(overhead, 0.0),
            "slowest_layer_s": max(times),
        }
        for c in CLUSTER_CPUS:
            row[f"16x{c}_cpus_s"] = makespan(times, CLUSTER_NODES * c) + max(overhead, 0.0)
        out.append(row)
    return out


def plot(sweep: list[dict], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by_e = [r for r in sweep if r["tokens"] == sweep[0]["tokens"]]
    by_n = sorted([r for r in sweep if r["experts"] == 256], key=lambda r: r["tokens"])
    for ax, rows, key, xlabel in ((axes[0], by_e, "experts", "experts E"), (axes[1], by_n, "tokens", "tokens")):
        x = [r[key] for r in rows]
        for label, style in zip([*methods, "stats_s"], ["o-", "s-", "^-", "D-", "k--"], strict=False):
            y = [max(r[label], 1e-4) for r in rows]
            ax.plot(x, y, style, ms=4, label="trace -> statistics" if label == "stats_s" else label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds for one layer (serial)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title(f"one layer vs E ({by_e[0]['tokens']:,} tokens, 64 GPUs)")
    axes[1].set_title("one layer vs tokens (E = 256, 64 GPUs)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _fmt_cpu(v) -> str:
    return "-" if v is None or np.isnan(v) else f"{v:.2f}"


def markdown(rows, start, sweep, estimate, methods, info, paired) -> str:
    layers = info["layers"]
    speed = []
    for label in methods:
        serial = next(r for r in rows if r["method"] == label and r["executor"].startswith("serial"))["wall_s"]
        for r in rows:
            if r["method"] == label:
                speed.append(
                    [
                        label,
                        r["executor"],
                        f"{r['wall_s']:.2f}",
                        f"{r['layer_sum_s']:.2f}",
                        _fmt_cpu(r["layer_cpu_s"]),
                        f"{serial / r['wall_s']:.2f}x",
                        "yes" if r["same_plan_as_serial"] else "NO",
                        "-" if r["payload_kib"] is None else f"{r['payload_kib']:.0f}",
                    ]
                )
    sweep_rows = [
        [r["experts"], f"{r['tokens']:,}", f"{r['stats_s']:.3f}", *(f"{r[m]:.3f}" for m in methods)] for r in sweep
    ]
    est_rows = [
        [
            e["method"],
            f"{e['serial_s']:.1f}",
            f"{e['2_workers_s']:.1f}",
            f"{e['slowest_layer_s']:.2f}",
            f"{e['ray_overhead_s']:.1f}",
            *(f"{e[f'16x{c}_cpus_s']:.1f}" for c in CLUSTER_CPUS),
        ]
        for e in estimate
    ]
    m = info["machine"]
    lines = [
        "# Scale-out benchmark",
        "",
        f"Machine: {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, load average at start "
        f"{m['load_average'][0]:.2f} (the CPUs are shared with other work: timings are noisy). "
        f"Commit {m['git_commit'][:10] if m['git_commit'] else '-'}. Run time {info['wall_s']:.0f} s. "
        "Produced by `python benchmarks/scale.py`. One BLAS thread in every process (serial too).",
        "",
        f"## Whole model: DeepSeek-V3 size ({layers} layers x 256 experts, top-8, 64 GPUs)",
        "",
        "Count-sampled trace of the real SGLang prefill loads (8192 tokens, 16 steps); fixed work "
        "budgets (tacg 40 rounds, gem 30 rounds, no clock), so every executor must return the same "
        "plan. Wall = what `solve()` takes, scoring included; layer sum = the layers' own solve "
        "times (wall), layer CPU = their CPU seconds (a layer sum well above its CPU means the "
        "workers waited for a CPU); payload = pickled size of one layer's task. `balance` on "
        "pooled loads (`robust: none`) plans all layers in one batched pass (it does not split per "
        "layer): it runs serially whatever the executor, with a one-line note.",
        "",
        tabulate(
            speed,
            headers=[
                "method",
                "executor",
                "wall (s)",
                "layer sum (s)",
                "layer CPU (s)",
                "speed-up",
                "same plan",
                "payload (KiB)",
            ],
            tablefmt="github",
        ),
        "",
        "Paired runs (the speed-up to read on a shared machine): serial and `workers=2` alternated "
        f"{PAIRED_REPS} times on the first {paired[0]['layers'] if paired else PAIRED_LAYERS} layers; "
        "CPU = the layers' CPU seconds (about equal when the work is the same); CPUs available = "
        "what two busy processes got done over one, just before and after (2.00 on an idle "
        "2-core machine): no executor beats it.",
        "",
        tabulate(
            [
                [
                    p["method"],
                    " / ".join(f"{x:.1f}" for x in p["serial_s"]),
                    " / ".join(f"{x:.1f}" for x in p["2_workers_s"]),
                    " / ".join(f"{x:.2f}x" for x in p["speedups"]),
                    f"{p['median_speedup']:.2f}x",
                    f"{np.mean(p['serial_cpu_s']):.1f} / {np.mean(p['2_workers_cpu_s']):.1f}",
                    " / ".join(f"{x:.2f}" for x in p.get("cpus_available", [])),
                ]
                for p in paired
            ],
            headers=[
                "method",
                "serial (s)",
                "2 workers (s)",
                "speed-up per pair",
                "median",
                "CPU s (serial / 2w)",
                "CPUs available (before / after)",
            ],
            tablefmt="github",
        ),
        "",
        f"Start-up: a process pool of 2 workers {start.get('pool_start_s', 0):.2f} s (fork server with moeopt "
        "preloaded, once per process); a local Ray "
        + (
            f"{start['ray_init_s']:.1f} s to start and {start['ray_shutdown_s']:.1f} s to stop"
            if "ray_init_s" in start
            else "(not installed)"
        )
        + "; serial: none.",
        "",
        "## One layer: cost vs experts and tokens",
        "",
        "Serial solve of one layer (seconds) and the time to turn its trace into statistics "
        "(coactivation, counts), synthetic task-structured traces, 64 GPUs. See `scale.png` (log-log).",
        "",
        tabulate(sweep_rows, headers=["E", "tokens", "trace -> stats", *methods], tablefmt="github"),
        "",
        f"## Estimate (not measured): a Ray cluster of {CLUSTER_NODES} nodes",
        "",
        "List scheduling of the measured per-layer times (serial run above) on 16 x c CPUs, plus "
        "the Ray overhead measured here (the local Ray run's wall minus Ray's start and stop and "
        "half its layers' summed times: worker start-up, shipping, scheduling, scoring). Assumes nodes as fast as this "
        "machine and a cluster already running (`ray.init(address=...)` then only connects).",
        "",
        tabulate(
            est_rows,
            headers=[
                "method",
                "serial (s)",
                "2 workers (s)",
                "slowest layer (s)",
                "Ray overhead (s)",
                *(f"16 x {c} CPUs (s)" for c in CLUSTER_CPUS),
            ],
            tablefmt="github",
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 6 layers, small sweeps")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--paired-only",
        action="store_true",
        help="redo only the paired runs (e.g. on a quieter machine), keep the rest of scale.json",
    )
    args = ap.parse_args()
    log = (lambda *_: None) if args.quiet else (lambda *a: print(*a, flush=True))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.paired_only:
        import json

        old = json.loads((OUT / "scale.json").read_text())
        fresh = paired_speedup(methods, PAIRED_LAYERS, PAIRED_REPS, log)
        redone = {row["method"] for row in fresh}
        paired = [row for row in old.get("paired", []) if row["method"] not in redone] + fresh  # keep other methods
        old["paired"] = paired
        old["cluster_estimate"] = cluster_estimate(old["per_layer_serial_s"], old["whole_model"], old["startup"])
        old["info"]["machine"]["load_average_paired"] = list(os.getloadavg())
        write_json(OUT / "scale.json", old)
        write_text(
            OUT / "scale.md",
            markdown(
                old["whole_model"],
                old["startup"],
                old["one_layer"],
                old["cluster_estimate"],
                list(old["info"]["methods"]),
                old["info"],
                paired,
            ),
        )
        log(f"rewrote {OUT / 'scale.json'} and scale.md with new paired runs")
        return 0
    layers = 6 if args.quick else 58
    info = {"machine": machine(), "layers": layers, "tokens": TOKENS, "methods": {m: METHODS[m] for m in methods}}
    t0 = time.perf_counter()
    t1 = time.perf_counter()
    wl = deepseek_workloads(layers)
    log(f"DeepSeek-V3 count-sampled trace, {layers} layers: {time.perf_counter() - t1:.1f} s")
    start = startup_costs(instance(layers, 256), wl, log)  # first: the fork server starts once per process
    log(f"start-up: {start}")
    paired = paired_speedup(methods, 2 if args.quick else PAIRED_LAYERS, 1 if args.quick else PAIRED_REPS, log)
    rows, per_layer = whole_model(layers, methods, start, log)
    sweep = one_layer_costs(methods, args.quick, log)
    estimate = cluster_estimate(per_layer, rows, start)
    info["wall_s"] = time.perf_counter() - t0
    info["machine"]["load_average_end"] = list(os.getloadavg())
    stem = "scale-quick" if args.quick else "scale"
    write_json(
        OUT / f"{stem}.json",
        {
            "info": info,
            "whole_model": rows,
            "startup": start,
            "per_layer_serial_s": per_layer,
            "one_layer": sweep,
            "paired": paired,
            "cluster_estimate": estimate,
        },
    )
    write_text(OUT / f"{stem}.md", markdown(rows, start, sweep, estimate, methods, info, paired))
    plot(sweep, methods, OUT / f"{stem}.png")
    log(f"wrote {OUT / stem}.json, .md, .png ({info['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    run_script(main)
