"""Command line: ``python -m moeopt {solve, evaluate, compare, trace, methods}``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tabulate import tabulate

from moeopt.errors import MoeoptError
from moeopt.evaluate import evaluate, linear_plan
from moeopt.io import load_instance, read_plan, read_workload_file, write_json, write_plan, write_trace
from moeopt.result import Result
from moeopt.solve import Workloads, add_relative_metrics, load_workloads, solve
from moeopt.trace import Trace

#: Rows of the metric tables: (report key, label, lower is better)
METRIC_ROWS = [
    ("comm_per_token", "remote GPUs / token / layer", True),
    ("comm_weighted_per_token", "topology-weighted comm", True),
    ("gpus_per_token", "GPUs / token / layer", True),
    ("jain", "Jain fairness", False),
    ("maxvio", "MaxVio", True),
    ("maxvio_per_step", "MaxVio per step (mean)", True),
    ("straggler_latency", "straggler latency S (ms)", True),
    ("straggler_p90", "p90 step latency (ms)", True),
    ("gap_to_bound", "gap to lower bound", True),
    ("replication_bound_maxvio", "MaxVio lower bound (replication certificate)", True),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def report_dict(result: Result, instance_name: str) -> dict:
    return {
        "instance": instance_name,
        "method": result.method,
        "params": result.params,
        "status": result.status.value,
        "objective_name": result.objective_name,
        "sense": result.sense,
        "objective": result.objective,
        "bound": result.bound,
        "gap": result.gap,
        "wall_time": result.wall_time,
        "metrics": result.metrics,
        "stats": result.stats,
    }


def metrics_table(columns: dict[str, dict]) -> str:
    names = list(columns)
    rows = []
    for key, label, _ in METRIC_ROWS:
        vals = [columns[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        rows.append([label] + [_fmt(v) for v in vals])
    return tabulate(rows, headers=["metric"] + names, tablefmt="github")


def _solve_table(result: Result) -> str:
    lin = result.metrics.get("linear", {})
    cols = {"linear": lin, result.method: result.metrics}
    table = metrics_table(cols)
    extra = []
    for key, label in (
        ("comm_reduction_vs_linear", "communication reduction vs linear"),
        ("straggler_improvement_vs_linear", "straggler latency improvement vs linear"),
        ("p90_improvement_vs_linear", "p90 step latency improvement vs linear"),
    ):
        v = result.metrics.get(key)
        if v is not None:
            extra.append(f"{label}: {v:+.2f} %")
    head = (
        f"{result.method}: {result.status.value}; objective {result.objective_name} = {_fmt(result.objective)}"
        f"; bound {_fmt(result.bound)}; gap {_fmt(None if result.gap is None else 100 * result.gap)} %"
        f"; {result.wall_time:.2f} s"
    )
    return "\n".join([head, table, *extra])


# ----------------------------------------------------------------------------- commands
def cmd_solve(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    hint = None
    if args.hint:
        hint, gpus = read_plan(args.hint)
        if gpus != inst.cluster.gpus:
            raise MoeoptError(f"{args.hint}: gpus: plan is for {gpus} GPUs, instance has {inst.cluster.gpus}")
    result = solve(inst, method=args.method, time_limit=args.time_limit, seed=args.seed, quiet=args.quiet, hint=hint)
    if args.output and result.plan is not None:
        write_plan(args.output, result.plan, inst.cluster.gpus, result.method, result.params)
    if args.report:
        write_json(args.report, report_dict(result, inst.name))
    print(_solve_table(result))
    return 0 if result.plan is not None else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    plan, gpus = read_plan(args.plan)
    if gpus != inst.cluster.gpus:
        raise MoeoptError(f"{args.plan}: gpus: plan is for {gpus} GPUs, instance has {inst.cluster.gpus}")
    try:
        plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{args.plan}: {exc}") from None
    wl = load_workloads(inst)
    workload = read_workload_file(args.trace, top_k=inst.model.top_k) if args.trace else wl.evaluation
    metrics = evaluate(plan, workload, inst.cluster, profile=wl.profile)
    base = evaluate(
        linear_plan(inst.model.layers, inst.model.experts, gpus), workload, inst.cluster, profile=wl.profile
    )
    add_relative_metrics(metrics, base)
    if args.report:
        write_json(args.report, {"instance": inst.name, "plan": str(args.plan), "metrics": metrics})
    print(metrics_table({"linear": base, Path(args.plan).name: metrics}))
    if metrics.get("comm_reduction_vs_linear") is not None:
        print(f"communication reduction vs linear: {metrics['comm_reduction_vs_linear']:+.2f} %")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    wl: Workloads = load_workloads(inst)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    cols: dict[str, dict] = {}
    reports = []
    for name in names:
        r = solve(inst, method=name, time_limit=args.time_limit, seed=args.seed, quiet=args.quiet, workloads=wl)
        m = dict(r.metrics)
        m["wall_time"] = r.wall_time
        cols[name] = m
        reports.append(report_dict(r, inst.name))
    if args.report:
        write_json(args.report, {"instance": inst.name, "results": reports})
    table = metrics_table(cols)
    walls = "| wall time (s) | " + " | ".join(f"{cols[n]['wall_time']:.3f}" for n in names) + " |"
    red = (
        "| comm reduction vs linear (%) | "
        + " | ".join(_fmt(cols[n].get("comm_reduction_vs_linear")) for n in names)
        + " |"
    )
    print("\n".join([table, red, walls]))
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from moeopt.registry import get_method, method_names, param_fields

    rows = []
    for name in method_names():
        m = get_method(name)
        params = ", ".join(f"{f}={v.default!r}" for f, v in param_fields(m).items())
        rows.append([name, "yes" if m.available() else "no", m.summary, params or "-"])
    print(tabulate(rows, headers=["method", "available", "what it does", "parameters"], tablefmt="plain"))
    return 0


def cmd_trace_synth(args: argparse.Namespace) -> int:
    from moeopt.synth import SynthSpec, synthesize

    spec = SynthSpec(
        layers=args.layers,
        experts=args.experts,
        top_k=args.top_k,
        tokens=args.tokens,
        steps=args.steps,
        families=tuple(f.strip() for f in args.families.split(",")),
        only_family=args.family,
        family_communities=args.family_communities,
        structure_seed=args.structure_seed,
        seed=args.seed,
    )
    spec.validate(source="trace synth", prefix="--")
    trace = synthesize(spec)
    write_trace(args.output, trace)
    if not args.quiet:
        print(
            f"wrote {args.output}: {trace.tokens} tokens, {trace.layers} layers, E={trace.num_experts}, "
            f"k={trace.top_k}, {trace.steps} steps, families {', '.join(trace.family_names)}"
        )
    return 0


def trace_summary(workload: Any) -> str:
    stats = workload.stats() if isinstance(workload, Trace) else workload
    lines = []
    if isinstance(workload, Trace):
        lines.append(
            f"tokens {workload.tokens}, layers {workload.layers}, experts {workload.num_experts}, "
            f"top-{workload.top_k}, steps {workload.steps}"
        )
    else:
        lines.append(f"count-only statistics: layers {stats.layers}, experts {stats.experts}, top-{stats.top_k}")
    share = ", ".join(f"{n} {100 * s:.1f} %" for n, s in zip(stats.family_names, stats.family_share, strict=True))
    lines.append(f"families: {share}")
    rows = []
    for l in range(stats.layers):
        load = stats.expert_load[l]
        row = [l, f"{load.max() / max(load.mean(), 1e-12):.2f}", f"{load.min() / max(load.mean(), 1e-12):.2f}"]
        if stats.affinity is not None:
            a = stats.affinity[l]
            row.append(f"{(a > 0).mean():.2f}")
        rows.append(row)
    headers = ["layer", "busiest/mean", "idlest/mean"] + (
        ["coactivation density"] if stats.affinity is not None else []
    )
    lines.append(tabulate(rows, headers=headers, tablefmt="github"))
    import moeopt.methods  # noqa: F401  (methods register their trace-stats hooks)

    for hook in TRACE_STATS_HOOKS:
        lines.extend(hook(stats))
    return "\n".join(lines)


#: Extra sections for ``trace stats`` (GEM adds its expert classification here).
TRACE_STATS_HOOKS: list[Callable[[Any], list[str]]] = []


def cmd_trace_stats(args: argparse.Namespace) -> int:
    workload = read_workload_file(args.trace, top_k=args.top_k, select=args.select)
    print(trace_summary(workload))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from moeopt.harness.profile import profile_command  # torch stays optional

    return profile_command(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from moeopt.harness.run import validate_command  # torch stays optional

    return validate_command(args)


def _harness_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    sp.add_argument("--d-model", type=int, default=None, help="expert FFN width (CPU default 64)")
    sp.add_argument("--d-ff", type=int, default=None, help="expert FFN hidden size (CPU default 128)")
    sp.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="CPU default fp32")
    sp.add_argument("--tile", type=int, default=None, help="tokens per tile of the profile (default 64)")
    sp.add_argument("--speeds", default=None, help="emulated GPU speeds, comma-separated")
    sp.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU default 1)")
    sp.add_argument(
        "--statistic",
        default="median",
        choices=["median", "min"],
        help="of the timed runs (min is steadier on a shared CPU)",
    )
    sp.add_argument("--quiet", action="store_true", help="no progress bar")


# ----------------------------------------------------------------------------- serving engines
def _engine_instance(args: argparse.Namespace) -> Any:
    """The --instance of export/import (or None); --gpus must agree with it."""
    if not getattr(args, "instance", None):
        return None
    inst = load_instance(args.instance)
    if getattr(args, "gpus", None) not in (None, inst.cluster.gpus):
        raise MoeoptError(f"--gpus {args.gpus} disagrees with {args.instance}: cluster.gpus is {inst.cluster.gpus}")
    return inst


def _check_against(plan: Any, gpus: int, inst: Any, src: str) -> None:
    if gpus != inst.cluster.gpus:
        raise MoeoptError(f"{src}: gpus: plan is for {gpus} GPUs, instance has {inst.cluster.gpus}")
    try:
        plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{src}: {exc}") from None


def cmd_export(args: argparse.Namespace) -> int:
    from moeopt.interop import default_slots
    from moeopt.io import write_engine_plan

    plan, gpus = read_plan(args.plan)
    inst = _engine_instance(args)
    slots, replica_slots = default_slots(plan, gpus)
    if inst is not None:
        _check_against(plan, gpus, inst, args.plan)
        slots, replica_slots = inst.cluster.slots_per_gpu, inst.cluster.replica_slots_per_gpu
    if args.dense_layers and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    load = None
    if args.load:
        w = read_workload_file(args.load, top_k=inst.model.top_k if inst is not None else 1)
        load = (w.stats() if isinstance(w, Trace) else w).expert_load
    write_engine_plan(
        args.output,
        plan,
        gpus,
        args.format,
        slots_per_gpu=slots,
        replica_slots_per_gpu=replica_slots,
        load=load,
        dense_layers=args.dense_layers,
    )
    if not args.quiet:
        physical = (slots + replica_slots) * gpus
        print(
            f"wrote {args.output}: {args.format}, {plan.layers + args.dense_layers} layers x {physical} physical "
            f"slots ({gpus} GPUs x {slots + replica_slots}); redundant experts: {physical - plan.experts}"
        )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from moeopt.io import read_engine_plan

    inst = _engine_instance(args)
    gpus = args.gpus if inst is None else inst.cluster.gpus
    slots = args.slots_per_gpu if args.slots_per_gpu or inst is None else inst.cluster.slots_per_gpu
    if args.dense_layers and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    plan, gpus = read_engine_plan(
        args.file,
        args.format,
        gpus=gpus,
        experts=None if inst is None else inst.model.experts,
        slots_per_gpu=slots,
        dense_layers=args.dense_layers,
    )
    if inst is not None:
        _check_against(plan, gpus, inst, args.file)
    write_plan(args.output, plan, gpus, f"import:{args.format}", {"source": str(args.file)})
    if not args.quiet:
        reps = sum(len(r) for r in plan.replicas)
        print(f"wrote {args.output}: {plan.layers} layers x {plan.experts} experts on {gpus} GPUs, {reps} replicas")
    return 0


def cmd_trace_import(args: argparse.Namespace) -> int:
    from moeopt.io import read_sglang_dump, write_counts

    if Path(args.output).suffix.lower() != ".npz":
        raise MoeoptError(f"{args.output}: expected an .npz output (a trace or a counts file)")
    w = read_sglang_dump(args.dump, top_k=args.top_k, trusted=args.trust_pickle)
    if isinstance(w, Trace):
        write_trace(args.output, w)
        what = f"trace, {w.tokens} tokens, {w.layers} MoE layers, E={w.num_experts}, top-{w.top_k}, {w.steps} steps"
    else:
        write_counts(args.output, w)
        steps = 0 if w.step_counts is None else w.step_counts.shape[1]
        what = f"counts, {w.layers} MoE layers, E={w.experts}, top-{w.top_k}, {steps} steps"
    if not args.quiet:
        print(f"wrote {args.output}: {what}")
    return 0


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeopt", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--time-limit",
            type=float,
            default=None,
            help="seconds per layer (exact solvers stop there; heuristics use it as a cap)",
        )
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--quiet", action="store_true", help="no progress output")

    s = sub.add_parser("solve", help="solve an instance, print metrics vs linear, write plan and report")
    s.add_argument("instance")
    s.add_argument("--method", default=None, help="override the instance's method name")
    s.add_argument("--output", help="plan JSON to write")
    s.add_argument("--report", help="report JSON to write")
    s.add_argument("--hint", help="warm-start plan JSON (exact solvers start from it)")
    common(s)
    s.set_defaults(func=cmd_solve)

    e = sub.add_parser("evaluate", help="score a plan on an instance's evaluation workload (or --trace)")
    e.add_argument("instance")
    e.add_argument("plan")
    e.add_argument("--trace", help="evaluate on this trace or count file instead")
    e.add_argument("--report")
    e.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("compare", help="several methods side by side")
    c.add_argument("instance")
    c.add_argument("--methods", required=True, help="comma-separated method names")
    c.add_argument("--report")
    common(c)
    c.set_defaults(func=cmd_compare)

    m = sub.add_parser("methods", help="list registered methods and whether they are available")
    m.set_defaults(func=cmd_methods)

    t = sub.add_parser("trace", help="synthesize or inspect traces")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    ts = tsub.add_parser("synth", help="write a synthetic task-structured trace (.npz)")
    ts.add_argument("--layers", type=int, default=2)
    ts.add_argument("--experts", type=int, default=16)
    ts.add_argument("--top-k", type=int, default=2)
    ts.add_argument("--tokens", type=int, default=4096)
    ts.add_argument("--steps", type=int, default=16)
    ts.add_argument("--families", default="code,query,math,reasoning")
    ts.add_argument("--family", default=None, help="single-family (out-of-distribution) workload")
    ts.add_argument(
        "--family-communities",
        choices=["shared", "per_family"],
        default="shared",
        help="one partition of experts into co-activated communities, or one per family",
    )
    ts.add_argument("--structure-seed", type=int, default=0, help="seed of the hidden expert structure")
    ts.add_argument("--seed", type=int, default=0, help="seed of the token sample")
    ts.add_argument("--output", required=True)
    ts.add_argument("--quiet", action="store_true")
    ts.set_defaults(func=cmd_trace_synth)
    tt = tsub.add_parser("stats", help="summarize a trace or count file")
    tt.add_argument("trace")
    tt.add_argument("--top-k", type=int, default=None, help="top-k of count files that do not record it")
    tt.add_argument("--select", default=None, help="model inside a multi-model count file")
    tt.set_defaults(func=cmd_trace_stats)
    ti = tsub.add_parser("import", help="SGLang expert-distribution dump (.pt) -> trace or counts .npz")
    ti.add_argument("dump")
    ti.add_argument("--output", required=True, help="TRACE.npz (per_token dump) or COUNTS.npz (stat dump)")
    ti.add_argument("--top-k", type=int, default=None, help="model top-k (stat dumps do not record it)")
    ti.add_argument("--trust-pickle", action="store_true", help="also unpickle non-tensor objects (runs code)")
    ti.add_argument("--quiet", action="store_true")
    ti.set_defaults(func=cmd_trace_import)

    engines = ("sglang", "eplb", "vllm-ascend")
    x = sub.add_parser("export", help="write a plan for a serving engine (SGLang, DeepSeek EPLB, vLLM-Ascend)")
    x.add_argument("plan")
    x.add_argument("--format", required=True, choices=engines)
    x.add_argument("--output", required=True, help="sglang: .json/.pt; eplb: .npz/.pt; vllm-ascend: .json")
    x.add_argument("--instance", help="take slots_per_gpu and replica_slots_per_gpu from it and check the plan")
    x.add_argument("--load", help="trace or count file: its hottest expert fills GPUs that hold nothing")
    x.add_argument("--dense-layers", type=int, default=0, help="sglang: dense hidden layers before the MoE ones")
    x.add_argument("--quiet", action="store_true")
    x.set_defaults(func=cmd_export)
    im = sub.add_parser("import", help="read a serving engine's expert placement back into a plan JSON")
    im.add_argument("file")
    im.add_argument("--format", required=True, choices=engines)
    im.add_argument("--output", required=True, help="plan JSON to write")
    im.add_argument("--instance", help="take gpus, experts and slots_per_gpu from it and check the plan")
    im.add_argument("--gpus", type=int, default=None, help="GPU count (SGLang maps do not record it)")
    im.add_argument("--slots-per-gpu", type=int, default=None, help="home slots per GPU (default ceil(E/G))")
    im.add_argument("--dense-layers", type=int, default=0, help="sglang: leading dense-layer rows to drop")
    im.add_argument("--quiet", action="store_true")
    im.set_defaults(func=cmd_import)

    pr = sub.add_parser("profile", help="measure a latency profile C(n) of one MoE layer (needs torch)")
    _harness_args(pr)
    pr.add_argument("--experts-per-gpu", type=int, default=1, help="experts the n tokens are spread over")
    pr.add_argument("--max-tokens", type=int, default=None, help="largest n (default 4096 on GPU, 512 on CPU)")
    pr.add_argument("--dense", action="store_true", help="also time every n; report the step function's error")
    pr.add_argument("--repeats", type=int, default=5, help="timed runs per n (median)")
    pr.add_argument("--warmup", type=int, default=2, help="untimed runs per n")
    pr.add_argument("--output", required=True, help="profile YAML to write")
    pr.set_defaults(func=cmd_profile)

    v = sub.add_parser("validate", help="run plans on this device as G emulated GPUs; measured vs modelled S")
    v.add_argument("instance")
    v.add_argument("plans", nargs="*", help="plan JSON files (none: linear, greedy and gem solved here)")
    _harness_args(v)
    v.add_argument("--max-steps", type=int, default=None, help="measure only the first N steps")
    v.add_argument("--profile", default=None, help="modelled profile file (default: the instance's)")
    v.add_argument("--repeats", type=int, default=3, help="timed runs per GPU group (median)")
    v.add_argument("--warmup", type=int, default=1, help="untimed runs per GPU group")
    v.add_argument(
        "--all-to-all",
        default="auto",
        choices=["auto", "off", "nccl", "gloo"],
        help="time the token all-to-all (auto: NCCL when several CUDA devices are visible)",
    )
    v.add_argument("--world", type=int, default=None, help="ranks of the all-to-all")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--report", help="report JSON to write")
    v.add_argument("--markdown", help="report Markdown to write")
    v.set_defaults(func=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except MoeoptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `moeopt ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (keep the interpreter's flush at exit quiet)
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
