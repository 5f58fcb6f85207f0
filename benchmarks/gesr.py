"""GESR benchmark: base plan vs +GESR, +hottest-first and +random replication, per budget.

Workloads (calibrate on one split, evaluate on another):

* the TACG workloads ``instances/{deepseek-moe-16b,qwen1.5-moe,moonlight-16b}.yaml``
  (synthetic task-structured traces at those models' shapes, 16 GPUs), evaluated on the
  mixed evaluation trace and on every single-family (OOD) slice of it; base plan ``tacg``
  (``greedy`` if tacg is not registered), plus the task-agnostic grouping (``agnostic``) for
  the paper's OOD hot-spot claim;
* DeepSeek-V3 expert counts recorded by SGLang (58 MoE layers x 256 experts, top-8):
  calibrate on the prefill counts, evaluate on the decode counts and the other way round;
  count-only, so the base is ``greedy`` and replicas split by the plan's dispatch rule,
  and the guard is measured on a count-sampled trace (``moeopt.synth.trace_from_counts``);
* OLMoE per-domain counts (3 layers x 64 experts, top-8, 6 domains): calibrate on the
  domain mix, evaluate on the mix and on every single domain; count-only, base ``greedy``.

For every (workload, replica budget 1/2/4 slots per GPU): MaxVio, Jain and communication
of each plan, and the exact replication certificate on the evaluation loads (the lowest
MaxVio any replica choice within the budget could reach with a perfect split).

Run: ``python benchmarks/gesr.py`` (about 10 min on 2 shared cores). Writes
``benchmarks/results/gesr.json`` and ``benchmarks/results/gesr.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from machine_info import machine as machine_info  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from machine_info import run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from tabulate import tabulate

from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.io import load_instance, read_workload_file, write_json, write_text
from moeopt.methods.gesr import certificate_stats, replication_certificate
from moeopt.registry import Context, Problem, get_method, method_names, parse_params
from moeopt.result import Result
from moeopt.solve import load_workloads
from moeopt.synth import trace_from_counts
from moeopt.trace import Stats, Trace

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real"
OUT = ROOT / "benchmarks" / "results"
BUDGETS = (1, 2, 4)
#: plan label -> (method, parameters); "gesr-tuned" = λ 4, two copies per generic expert,
#: the best GESR setting on the calibration split of the TACG workloads
VARIANTS = {
    "gesr": ("gesr", {}),
    "gesr-tuned": ("gesr", {"lam": 4.0, "copies_each": 2}),
    "hottest-replication": ("hottest-replication", {}),
    "random-replication": ("random-replication", {}),
}
REPLICATION = tuple(VARIANTS)


def run_base(problem: Problem, name: str) -> Result:
    impl = get_method(name)
    return impl.solve(problem, parse_params(impl, {}), Context(seed=0))


def metrics_of(result_plan, workload, cluster) -> dict:
    """The scorer's metrics of a plan under its own dispatch rule."""
    m = evaluate(result_plan, workload, cluster)
    return {
        "maxvio": m["maxvio"],
        "jain": m["jain"],
        "comm_per_token": m["comm_per_token"],
        "maxvio_per_step": m.get("maxvio_per_step"),
    }


def replicated_plans(problem: Problem, base: Result) -> dict[str, Result]:
    out = {}
    for label, (name, extra) in VARIANTS.items():
        impl = get_method(name)
        params = parse_params(impl, {"base": base.method, "certificate": False, **extra})
        out[label] = impl.replicate(problem, params, base, Context(seed=0))
    return out


def score_workloads(
    label: str,
    instance: Instance,
    calibration: Trace | Stats,
    evaluations: dict[str, Trace | Stats],
    base_names: list[str],
    *,
    budgets: dict[str, tuple[int, ...]] | None = None,
    guard_traces: dict[str, Trace] | None = None,
    cert_time: float = 1.0,
    certify: tuple[str, ...] | None = None,
    log=print,
) -> list[dict]:
    """Rows for one calibration workload and several evaluation workloads."""
    stats = calibration.stats() if isinstance(calibration, Trace) else calibration
    trace = calibration if isinstance(calibration, Trace) else None
    rows = []
    for base_name in base_names:
        p0 = Problem(instance.replace(cluster=replace(instance.cluster, replica_slots_per_gpu=0)), stats, trace)
        t0 = time.perf_counter()
        base = run_base(p0, base_name)
        base_time = time.perf_counter() - t0
        for S in (budgets or {}).get(base_name, BUDGETS):
            cluster = replace(instance.cluster, replica_slots_per_gpu=S)
            prob = Problem(instance.replace(cluster=cluster), stats, trace)
            t0 = time.perf_counter()
            plans = replicated_plans(prob, base)
            rep_time = time.perf_counter() - t0
            for ev_name, ev in evaluations.items():
                t1 = time.perf_counter()
                bounds = None
                if certify is None or base_name in certify:
                    bounds = replication_certificate(
                        base.plan.home,
                        ev.expert_load,
                        cluster.gpus,
                        S,
                        time_limit=cert_time,
                        hints=plans["gesr"].plan.replicas,
                    )
                row = {
                    "workload": label,
                    "evaluation": ev_name,
                    "base": base_name,
                    "replica_slots": S,
                    "base_time_s": base_time,
                    "replication_time_s": rep_time,
                }
                row["base_plan"] = metrics_of(base.plan, ev, instance.cluster)
                for name, res in plans.items():
                    row[name] = metrics_of(res.plan, ev, cluster)
                    row[name]["replicas"] = int(sum(len(r) for r in res.plan.replicas))
                if guard_traces and ev_name in guard_traces:  # count-only: guard on sampled tokens
                    for name in ("base_plan", *plans):
                        plan = base.plan if name == "base_plan" else plans[name].plan
                        g = metrics_of(plan, guard_traces[ev_name], cluster)
                        row[name]["guard_sampled"] = g
                row["certificate"] = None
                if bounds is not None:
                    cert = certificate_stats(bounds, row["gesr"]["maxvio"])
                    row["certificate"] = {
                        "bound_maxvio": cert["replication_bound_maxvio"],
                        "best_maxvio": cert["replication_best_maxvio"],
                        "status": cert["replication_bound_status"],
                        "time_s": cert["replication_bound_time"],
                        "gesr_gap": cert.get("replication_gap"),
                        "gesr_tuned_gap": max(row["gesr-tuned"]["maxvio"] - cert["replication_bound_maxvio"], 0.0),
                    }
                rows.append(row)
                c = row["certificate"]
                log(
                    f"{label:>18} {ev_name:>10} {base_name:>8} S={S} "
                    + " ".join(f"{n[:9]}={row[n]['maxvio']:.3f}" for n in ("base_plan", *plans))
                    + ("" if c is None else f" bound={c['bound_maxvio']:.3f} ({c['status']})")
                    + f" {time.perf_counter() - t1:.1f}s"
                )
    return rows


def synthetic_suite(names: list[str], log) -> list[dict]:
    bases = ["tacg" if "tacg" in method_names() else "greedy"]
    if "agnostic" in method_names():
        bases.append("agnostic")
    rows = []
    for name in names:
        inst = load_instance(ROOT / "instances" / f"{name}.yaml")
        wl = load_workloads(inst)
        ev = wl.evaluation
        evaluations = {"mixed": ev}
        evaluations.update({f: ev.only_family(f) for f in ev.family_names})
        rows += score_workloads(
            name,
            inst,
            wl.calibration,
            evaluations,
            bases,
            cert_time=1.0,
            certify=bases[:1],
            budgets={"agnostic": (1,)},
            log=log,
        )
    return rows


def count_instance(name: str, stats: Stats, gpus: int = 16) -> Instance:
    model = Model(layers=stats.layers, experts=stats.experts, top_k=stats.top_k)
    cluster = Cluster(gpus=gpus, gpus_per_node=gpus, slots_per_gpu=-(-stats.experts // gpus))
    return Instance(name, model, cluster, Workload(WorkloadSource()), MethodSpec("greedy"))


def deepseek_suite(log, tokens: int) -> list[dict]:
    files = {
        "prefill": REAL / "deepseek_v3_prefill_in1024.json",
        "decode": REAL / "deepseek_v3_decode_in1000out1000.json",
    }
    if not all(p.is_file() for p in files.values()):
        log("DeepSeek-V3 counts not found; skipped")
        return []
    stats = {k: read_workload_file(p, top_k=8) for k, p in files.items()}
    rows = []
    for calib, evalu in (("prefill", "decode"), ("decode", "prefill")):
        inst = count_instance(f"deepseek-v3-{calib}", stats[calib])
        sampled = trace_from_counts(stats[evalu], tokens=tokens, steps=16, seed=1)
        rows += score_workloads(
            f"deepseek-v3 {calib}->{evalu}",
            inst,
            stats[calib],
            {evalu: stats[evalu]},
            ["greedy"],
            guard_traces={evalu: sampled},
            cert_time=0.3,
            log=log,
        )
    return rows


def olmoe_suite(log) -> list[dict]:
    path = REAL / "olmoe_mixtral_domain_expert_counts.npz"
    if not path.is_file():
        log("OLMoE counts not found; skipped")
        return []
    stats = read_workload_file(path, format="olmoe-domains", select="olmoe")
    inst = count_instance("olmoe", stats)
    evaluations = {"mixed": stats}
    evaluations.update({f: stats.only_family(f) for f in stats.family_names})
    return score_workloads("olmoe", inst, stats, evaluations, ["greedy"], cert_time=1.0, log=log)


# ----------------------------------------------------------------------------- report
def summary(rows: list[dict]) -> dict:
    """The paper's points: TACG+GESR mean Jain / MaxVio (mixed), OOD hot-spot ratios."""
    out: dict = {}
    syn = [r for r in rows if r["workload"] in ("deepseek-moe-16b", "qwen1.5-moe", "moonlight-16b")]
    for S in BUDGETS:
        mixed = [r for r in syn if r["evaluation"] == "mixed" and r["replica_slots"] == S and r["base"] != "agnostic"]
        ood = [r for r in syn if r["evaluation"] != "mixed" and r["replica_slots"] == S and r["base"] != "agnostic"]
        if ood:
            out[f"slots{S}_ood"] = {
                name: {
                    "jain": float(np.mean([r[name]["jain"] for r in ood])),
                    "maxvio": float(np.mean([r[name]["maxvio"] for r in ood])),
                    "comm_per_token": float(np.mean([r[name]["comm_per_token"] for r in ood])),
                }
                for name in ("base_plan", *REPLICATION)
            }
        if mixed:
            out[f"slots{S}_mixed"] = {
                name: {
                    "jain": float(np.mean([r[name]["jain"] for r in mixed])),
                    "maxvio": float(np.mean([r[name]["maxvio"] for r in mixed])),
                    "comm_per_token": float(np.mean([r[name]["comm_per_token"] for r in mixed])),
                }
                for name in ("base_plan", *REPLICATION)
            }
    ratios = {}
    for base in ("tacg", "greedy", "agnostic"):
        for name in ("base_plan", "gesr"):
            vals = []
            for r in syn:
                if r["base"] != base or r["evaluation"] == "mixed" or r["replica_slots"] != 1:
                    continue
                mixed = next(
                    m
                    for m in syn
                    if m["workload"] == r["workload"]
                    and m["base"] == base
                    and m["evaluation"] == "mixed"
                    and m["replica_slots"] == 1
                )
                vals.append((r["workload"], r["evaluation"], r[name]["maxvio"], mixed[name]["maxvio"]))
            if vals:
                ratios[f"{base}+{name}"] = {
                    "mean_ood_maxvio": float(np.mean([v[2] for v in vals])),
                    "max_ood_over_mixed": float(max(v[2] / max(v[3], 1e-9) for v in vals)),
                    "code_ood_over_mixed": float(
                        np.mean([v[2] / max(v[3], 1e-9) for v in vals if v[1] == "code"] or [np.nan])
                    ),
                }
    out["ood_maxvio_ratio_slots1"] = ratios
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        "# GESR benchmark",
        "",
        f"Machine: {info['machine']}. Total wall time {info['wall_time_s']:.0f} s.",
        "Guard: λ = 1, δ = 0.9, batches of 32 tokens within each trace step (GESR defaults).",
        "MaxVio / Jain over the whole evaluation workload (mean over layers); comm = remote GPUs",
        "per token per layer (count-only workloads: none). GESR tuned = λ 4, 2 copies per generic",
        "expert (best on the calibration split). `optimum` = exact replication certificate on",
        "the evaluation loads: `[proved lower bound, best found]` for the lowest MaxVio any",
        "replica choice within the budget reaches with a perfect token split (one number when",
        "`optimal`; 1 s per layer, 0.3 s for DeepSeek-V3). A plan's MaxVio minus the lower bound",
        "bounds its distance from the best possible.",
        "",
    ]
    header = [
        "workload",
        "eval",
        "base",
        "slots",
        "MaxVio base",
        "+GESR",
        "+GESR tuned",
        "+hottest",
        "+random",
        "optimum",
        "Jain base/GESR/tuned/hottest",
        "comm base/GESR/tuned/hottest",
    ]
    shown = ("base_plan", "gesr", "gesr-tuned", "hottest-replication")
    table = []
    for r in rows:
        comm = [r[n]["comm_per_token"] for n in shown]
        c = r["certificate"]
        table.append(
            [
                r["workload"],
                r["evaluation"],
                r["base"],
                r["replica_slots"],
                *(f"{r[n]['maxvio']:.4f}" for n in ("base_plan", *REPLICATION)),
                "-" if c is None else f"[{c['bound_maxvio']:.3f}, {_fmt(c['best_maxvio'])}] {c['status']}",
                "/".join(f"{r[n]['jain']:.4f}" for n in shown),
                "-" if comm[0] is None else "/".join(f"{v:.3f}" for v in comm),
            ]
        )
    lines.append(tabulate(table, headers=header, tablefmt="github"))
    guard_rows = [r for r in rows if "guard_sampled" in r["gesr"]]
    if guard_rows:
        lines += ["", "## Count-only workloads: guard measured on count-sampled traces", ""]
        t2 = []
        for r in guard_rows:
            t2.append(
                [r["workload"], r["replica_slots"]]
                + [
                    f"{r[n]['guard_sampled']['maxvio']:.4f} / {r[n]['guard_sampled']['comm_per_token']:.3f}"
                    for n in ("base_plan", *REPLICATION)
                ]
            )
        lines.append(
            tabulate(
                t2,
                headers=["workload", "slots", "base", "+GESR", "+GESR tuned", "+hottest", "+random"],
                tablefmt="github",
            )
        )
        lines.append("")
        lines.append("(MaxVio / remote GPUs per token on a count-sampled trace; coactivation there has no structure.)")
    s = info["summary"]
    lines += ["", "## The paper's points", ""]
    for key, val in s.items():
        if key.startswith("slots"):
            lines.append(
                f"- {key}: "
                + "; ".join(
                    f"{n}: Jain {v['jain']:.4f}, MaxVio {v['maxvio']:.4f}, comm {v['comm_per_token']:.3f}"
                    for n, v in val.items()
                )
            )
    for key, val in s.get("ood_maxvio_ratio_slots1", {}).items():
        lines.append(
            f"- OOD (single-family) MaxVio, {key}, 1 slot: mean {val['mean_ood_maxvio']:.4f}, "
            f"worst OOD/mixed {val['max_ood_over_mixed']:.2f}x, code OOD/mixed {val['code_ood_over_mixed']:.2f}x"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["deepseek-moe-16b", "qwen1.5-moe", "moonlight-16b"])
    ap.add_argument("--no-real", action="store_true", help="skip DeepSeek-V3 and OLMoE")
    ap.add_argument("--sampled-tokens", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true", help="rebuild gesr.md from gesr.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.report_only:
        import json

        data = json.loads((args.out / "gesr.json").read_text())
        data["info"]["summary"] = summary(data["rows"])
        write_json(args.out / "gesr.json", data)
        write_text(args.out / "gesr.md", markdown(data["rows"], data["info"]))
        return 0

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {line}", flush=True)

    rows = synthetic_suite(args.models, log)
    if not args.no_real:
        rows += olmoe_suite(log)
        rows += deepseek_suite(log, args.sampled_tokens)
    info = {
        "machine": f"{platform.processor() or platform.machine()}, 2-core CPU shared with other jobs, "
        f"Python {sys.version.split()[0]}",
        "wall_time_s": time.perf_counter() - t0,
        "budgets": BUDGETS,
        "machine_info": machine_info(),
    }
    info["summary"] = summary(rows)
    write_json(args.out / "gesr.json", {"info": info, "rows": rows})
    write_text(args.out / "gesr.md", markdown(rows, info))
    log(f"wrote {args.out / 'gesr.json'} and gesr.md")
    return 0


if __name__ == "__main__":
    run_script(main)
