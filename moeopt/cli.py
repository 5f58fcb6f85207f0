"""Command line: ``python -m moeopt {solve, evaluate, compare, trace, methods}``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from tabulate import tabulate

from moeopt.errors import MoeoptError
from moeopt.io import (
    PlanFile,
    fit_workload,
    load_instance,
    read_plan,
    read_plan_file,
    read_workload_file,
    write_json,
    write_plan,
    write_trace,
)
from moeopt.plan import DISPATCH_KINDS, Dispatch
from moeopt.registry import metric_hooks
from moeopt.result import Result
from moeopt.scoring import score
from moeopt.solve import Workloads, load_workloads, solve
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
        "termination": result.termination.value,
        "solution": result.status.solution,
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


def metrics_report(name: str, metrics: dict) -> str:
    """The metrics table of one plan against linear, its reductions and its notes."""
    table = metrics_table({"linear": metrics.get("linear", {}), name: metrics})
    extra = [f"dispatch: {metrics['dispatch']}"] if metrics.get("dispatch") else []
    for key, label in (
        ("comm_reduction_vs_linear", "communication reduction vs linear"),
        ("straggler_improvement_vs_linear", "straggler latency improvement vs linear"),
        ("p90_improvement_vs_linear", "p90 step latency improvement vs linear"),
    ):
        v = metrics.get(key)
        if v is not None:
            extra.append(f"{label}: {v:+.2f} %")
    return "\n".join([table, *extra, *metrics.get("notes", [])])


def _solve_table(result: Result) -> str:
    head = (
        f"{result.method}: {result.termination.value}, {result.status.solution} plan"
        f"; objective {result.objective_name} = {_fmt(result.objective)}"
        f"; bound {_fmt(result.bound)}; gap {_fmt(None if result.gap is None else 100 * result.gap)} %"
        f"; {result.wall_time:.2f} s"
    )
    return "\n".join([head, metrics_report(result.method, result.metrics)])


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _dispatch(args: argparse.Namespace) -> Dispatch | None:
    return Dispatch(kind=args.dispatch) if getattr(args, "dispatch", None) else None


def _read_plan_for(path: str, inst: Any) -> PlanFile:
    """A plan file checked against an instance (errors name the plan file)."""
    pf = read_plan_file(path)
    try:
        pf.plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{path}: {exc}") from None
    return pf


def _engine_format(path: str) -> str:
    """Guess a plan file's format from its content: moeopt plan, SGLang, vLLM-Ascend, EPLB."""
    import json

    if path.endswith(".pt"):
        return "eplb"
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return "plan"  # read_plan_file says what is wrong with it
    if isinstance(data, dict) and "physical_to_logical_map" in data:
        return "sglang"
    if isinstance(data, dict) and "layer_list" in data:
        return "vllm-ascend"
    return "plan"


def _current_plan(path: str, fmt: str | None, inst: Any) -> Any:
    """The plan running now (``solve --from``): a moeopt plan or any engine's placement file."""
    from moeopt.io import read_engine_plan

    fmt = fmt or _engine_format(path)
    if fmt == "plan":
        return _read_plan_for(path, inst).plan
    rows = None
    if fmt == "sglang":
        import json

        with open(path, encoding="utf-8") as fh:
            rows = len(json.load(fh).get("physical_to_logical_map", []))
    dense = max(0, rows - inst.model.layers) if rows is not None else 0
    plan = read_engine_plan(path, fmt, gpus=inst.cluster.gpus, experts=inst.model.experts, dense_layers=dense)
    try:
        plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{path}: {exc}") from None
    return plan


def migration_table(stats: dict) -> str:
    """Moves vs MaxVio of a migration-aware re-plan (``solve --from``)."""
    rows = [[f["budget"], f["moves"], f"{f['maxvio']:.4f}"] for f in stats["migration_frontier"]]
    head = f"moved expert weights: {stats['moves']} (per layer: max {max(stats['moves_per_layer'], default=0)})"
    table = tabulate(rows, headers=["budget / layer", "moves (all layers)", "MaxVio"], tablefmt="github")
    return "\n".join([head, "migration frontier (calibration, even split):", table])


# ----------------------------------------------------------------------------- commands
def cmd_solve(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    hint = _read_plan_for(args.hint, inst).plan if args.hint else None
    current = _current_plan(args.from_plan, args.from_format, inst) if args.from_plan else None
    result = solve(
        inst,
        method=args.method,
        time_limit=args.time_limit,
        seed=args.seed,
        quiet=args.quiet,
        hint=hint,
        dispatch=_dispatch(args),
        current=current,
        workers=args.workers,
        ray=args.ray,
    )
    if args.output and result.plan is not None:
        write_plan(args.output, result.plan, result.method, result.params)
    if args.report:
        write_json(args.report, report_dict(result, inst.name))
    print(_solve_table(result))
    if "migration_frontier" in result.stats:
        print(migration_table(result.stats))
    return 0 if result.plan is not None else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    pf = _read_plan_for(args.plan, inst)
    plan = pf.plan if args.dispatch is None else pf.plan.with_dispatch(Dispatch(kind=args.dispatch))
    wl = load_workloads(inst)
    workload = None
    if args.trace:
        workload = fit_workload(read_workload_file(args.trace, top_k=inst.model.top_k), inst.model, args.trace)
    metrics = score(plan, inst, wl, workload=workload, hooks=metric_hooks(pf.method), params=pf.params)
    if args.report:
        write_json(args.report, {"instance": inst.name, "plan": str(args.plan), "metrics": metrics})
    print(metrics_report(pf.method or Path(args.plan).name, metrics))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    wl: Workloads = load_workloads(inst)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    cols: dict[str, dict] = {}
    reports = []
    for name in names:
        r = solve(
            inst,
            method=name,
            time_limit=args.time_limit,
            seed=args.seed,
            quiet=args.quiet,
            workloads=wl,
            dispatch=_dispatch(args),
            workers=args.workers,
            ray=args.ray,
        )
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
    disp = "| dispatch | " + " | ".join(str(cols[n].get("dispatch", "-")) for n in names) + " |"
    print("\n".join([table, red, walls, disp]))
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    """Sweep the load limit of several methods; write the Pareto set as table, JSON and plot."""
    from moeopt import frontier as fr
    from moeopt.io import write_text

    inst = load_instance(args.instance)
    try:
        eps = [float(x) for x in args.eps.split(",") if x.strip()]
    except ValueError:
        raise MoeoptError(f"--eps: expected comma-separated numbers, got {args.eps!r}") from None
    if any(not (e >= 0) for e in eps):
        raise MoeoptError(f"--eps: every value must be >= 0, got {args.eps!r}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    points = fr.frontier(inst, methods=methods, eps=eps, time_limit=args.time_limit, seed=args.seed, log=log)
    out = Path(args.output_dir) if args.output_dir else None
    stem = args.name or inst.name
    md = f"# Frontier: {inst.name}\n\n" + fr.table(points) + "\n"
    if out is not None:
        write_json(out / f"{stem}.json", {"instance": inst.name, "eps": eps, "methods": methods,
                                          "points": [p.to_json() for p in points]})
        write_text(out / f"{stem}.md", md)
        fr.plot(points, out / f"{stem}.png", title=inst.name)
    print(fr.table(points))
    if out is not None and not args.quiet:
        print(f"wrote {out / (stem + '.json')}, {stem}.md and {stem}.png")
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
        layer_dependency=args.layer_dependency,
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
    from moeopt.utilization import classification_lines

    lines.extend(classification_lines(stats))
    return "\n".join(lines)


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


def _check_against(plan: Any, inst: Any, src: str) -> None:
    try:
        plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{src}: {exc}") from None


def cmd_export(args: argparse.Namespace) -> int:
    import numpy as np

    from moeopt.interop import engine_settings
    from moeopt.io import write_engine_plan

    plan = read_plan(args.plan)
    inst = _engine_instance(args)
    if inst is not None:
        _check_against(plan, inst, args.plan)
        plan = plan.padded(inst.cluster.width)
    if args.dispatch:
        plan = plan.with_dispatch(Dispatch(kind=args.dispatch))
    if args.dense_layers and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    load = None
    if args.load:
        w = read_workload_file(args.load, top_k=inst.model.top_k if inst is not None else 1)
        load = (w.stats() if isinstance(w, Trace) else w).expert_load
        if load.shape[0] == plan.layers and load.shape[1] < plan.experts:  # highest ids never routed
            load = np.pad(load, ((0, 0), (0, plan.experts - load.shape[1])))
        if load.shape != (plan.layers, plan.experts):
            raise MoeoptError(
                f"{args.load}: counts: expected {plan.layers} layers x {plan.experts} experts, got {list(load.shape)}"
            )
    notes = write_engine_plan(args.output, plan, args.format, load=load, dense_layers=args.dense_layers)
    if not args.quiet:
        W = plan.width
        if args.format == "vllm-ascend":  # each device's distinct experts only
            W = int((plan.copies_on_gpu > 0).sum(axis=1).max())
        print(
            f"wrote {args.output}: {args.format}, {plan.layers + args.dense_layers} layers x {plan.gpus * W} "
            f"physical slots ({plan.gpus} GPUs x {W}), {plan.experts} experts, dispatch {plan.dispatch.kind}"
        )
        for line in [*notes, *engine_settings(args.format, plan, str(args.output), dense_layers=args.dense_layers)]:
            print(line)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from moeopt.io import read_engine_plan

    inst = _engine_instance(args)
    gpus = args.gpus if inst is None else inst.cluster.gpus
    if args.dense_layers and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    plan = read_engine_plan(
        args.file,
        args.format,
        gpus=gpus,
        experts=None if inst is None else inst.model.experts,
        dense_layers=args.dense_layers,
        dispatch=args.dispatch,
    )
    if inst is not None:
        _check_against(plan, inst, args.file)
        plan = plan.padded(inst.cluster.width)
    write_plan(args.output, plan, f"import:{args.format}", {"source": str(args.file)})
    if not args.quiet:
        P = plan.gpus * plan.width
        print(
            f"wrote {args.output}: {plan.layers} layers x {P} physical slots ({plan.gpus} GPUs x {plan.width}), "
            f"{plan.experts} experts, dispatch {plan.dispatch.kind}"
        )
        for line in plan.notes():
            print(line)
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
class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), like every other moeopt error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="moeopt", description=__doc__)
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
        sp.add_argument(
            "--workers",
            type=_positive_int,
            default=None,
            metavar="N",
            help="solve layers in N local processes (same plans as serial; default: the instance's executor, else 1)",
        )
        sp.add_argument(
            "--ray",
            nargs="?",
            const="local",
            default=None,
            metavar="ADDRESS",
            help="solve layers as Ray tasks on the cluster at ADDRESS, or on a local Ray when no address "
            '(needs pip install -e ".[ray]")',
        )

    def dispatch_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--dispatch",
            choices=DISPATCH_KINDS,
            default=None,
            help="how tokens split over an expert's copies (default: the plan's own rule)",
        )

    s = sub.add_parser("solve", help="solve an instance, print metrics vs linear, write plan and report")
    s.add_argument("instance")
    s.add_argument("--method", default=None, help="override the instance's method name")
    s.add_argument("--output", help="plan JSON to write")
    s.add_argument("--report", help="report JSON to write")
    s.add_argument("--hint", help="warm-start plan JSON (exact solvers start from it)")
    s.add_argument(
        "--from",
        dest="from_plan",
        metavar="CURRENT_PLAN",
        help="the plan running now (moeopt plan or engine file): re-plan moving few expert weights (balance)",
    )
    s.add_argument(
        "--no-relabel",
        action="store_true",
        help="with token_home: previous-layer, keep the method's GPU ids (no free relabeling)",
    )
    s.add_argument(
        "--from-format",
        choices=["plan", "sglang", "eplb", "vllm-ascend"],
        default=None,
        help="format of --from (default: from the file's content; .pt is eplb)",
    )
    dispatch_arg(s)
    common(s)
    s.set_defaults(func=cmd_solve)

    e = sub.add_parser("evaluate", help="score a plan on an instance's evaluation workload (or --trace)")
    e.add_argument("instance")
    e.add_argument("plan")
    e.add_argument("--trace", help="evaluate on this trace or count file instead")
    e.add_argument("--report")
    dispatch_arg(e)
    e.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("compare", help="several methods side by side")
    c.add_argument("instance")
    c.add_argument("--methods", required=True, help="comma-separated method names")
    c.add_argument("--report")
    dispatch_arg(c)
    common(c)
    c.set_defaults(func=cmd_compare)

    fr_ = sub.add_parser(
        "frontier", help="communication vs held-out MaxVio of several methods over a load-limit sweep (Pareto set)"
    )
    fr_.add_argument("instance")
    fr_.add_argument("--eps", default="0.02,0.05,0.1,0.2", help="load limits to sweep (comma-separated)")
    fr_.add_argument(
        "--methods",
        default="joint,agnostic,tacg,hypergraph,hottest-replication,gesr,greedy,balance",
        help="comma-separated methods (grouping: eps_load; replication: the base's eps_load; joint: eps)",
    )
    fr_.add_argument("--output-dir", help="write NAME.json, NAME.md and NAME.png here")
    fr_.add_argument("--name", help="file stem (default: the instance name)")
    common(fr_)
    fr_.set_defaults(func=cmd_frontier)

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
    ts.add_argument(
        "--layer-dependency",
        type=float,
        default=0.0,
        help="chance in [0, 1] that a token's community follows its previous top-1 expert's",
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
    x.add_argument("--instance", help="check the plan against it and write cluster's slots_per_gpu + replica ones")
    x.add_argument("--load", help="trace or count file: picks the fill of an empty slot no neutral copy can fill")
    x.add_argument(
        "--dispatch",
        choices=DISPATCH_KINDS,
        default=None,
        help="dispatch to run the engine with (default: the plan's; sets SGLang's --ep-dispatch-algorithm)",
    )
    x.add_argument("--dense-layers", type=int, default=0, help="sglang: dense hidden layers before the MoE ones")
    x.add_argument("--quiet", action="store_true")
    x.set_defaults(func=cmd_export)
    im = sub.add_parser("import", help="read a serving engine's expert placement back into a plan JSON")
    im.add_argument("file")
    im.add_argument("--format", required=True, choices=engines)
    im.add_argument("--output", required=True, help="plan JSON to write")
    im.add_argument("--instance", help="take gpus and experts from it and check the plan")
    im.add_argument("--gpus", type=int, default=None, help="GPU count (SGLang maps do not record it)")
    im.add_argument(
        "--dispatch",
        choices=DISPATCH_KINDS,
        default=None,
        help="the engine's dispatch (default: sglang static, eplb even, vllm-ascend even)",
    )
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
