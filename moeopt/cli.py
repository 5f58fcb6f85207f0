"""moeopt: place the experts of a Mixture-of-Experts model on GPUs; solve, score, compare and plot plans.

Results go to stdout; progress (per-layer lines, bars) to stderr on a terminal or with --verbose;
notes to stderr unless --quiet (see moeopt.console)."""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tabulate import tabulate

from moeopt import console
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
from moeopt.outputs import all_or_none, check_directory, check_target
from moeopt.plan import DISPATCH_KINDS, Dispatch
from moeopt.registry import metric_hooks
from moeopt.result import Result
from moeopt.schema import check_homes
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
    assert result.termination is not None  # Result.__post_init__ sets it
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


def metrics_table(columns: dict[str, dict], extra: Sequence[tuple[str, list[str]]] = ()) -> str:
    """The metric rows of several plans side by side, plus ``extra`` rows (label, cells)."""
    names = list(columns)
    rows = []
    for key, label, _ in METRIC_ROWS:
        vals = [columns[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        rows.append([label] + [_fmt(v) for v in vals])
    rows += [[label, *cells] for label, cells in extra]
    if not extra:
        return tabulate(rows, headers=["metric"] + names, tablefmt="github")
    # text rows (dispatch) among numbers: keep every cell as printed, numbers right-aligned
    align = ("left",) + ("right",) * len(names)
    return tabulate(rows, headers=["metric"] + names, tablefmt="github", disable_numparse=True, colalign=align)


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
    assert result.termination is not None  # Result.__post_init__ sets it
    head = (
        f"{result.method}: {result.termination.value}, {result.status.solution} plan"
        f"; objective {result.objective_name} = {_fmt(result.objective)}"
        f"; bound {_fmt(result.bound)}; gap {_fmt(None if result.gap is None else 100 * result.gap)} %"
        f"; {result.wall_time:.2f} s"
    )
    lines = [head]
    if result.plan is None and isinstance(result.stats.get("reason"), str):
        lines.append(f"no plan: {result.stats['reason']}")  # why, and what would fix it
    return "\n".join([*lines, metrics_report(result.method, result.metrics)])


def _number_type(parse: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type=``: ``parse`` the text, keep it when ``ok``, else one line saying what was expected."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return convert


_positive_int = _number_type(int, lambda v: v >= 1, "an integer >= 1")
#: ``--seed``, ``--layer``, ``--dense-layers``: an integer in ``[0, 2**31 - 1]``
_nonneg_int = _number_type(int, lambda v: 0 <= v < 2**31, f"an integer in [0, {2**31 - 1}]")
#: ``--time-limit``: a finite number of seconds > 0
_positive_seconds = _number_type(float, lambda v: math.isfinite(v) and v > 0, "a finite number of seconds > 0")
#: a probability: a number in ``[0, 1]``
_fraction = _number_type(float, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


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
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
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


def _plot_loads(
    path: str,
    inst: Any,
    metrics: dict[str, dict],
    workloads: Workloads | None = None,
    *,
    current: Any = None,
    layer: int | None = None,
) -> None:
    """Per-GPU loads of each plan (its ``metrics``) against linear, or against ``current``
    (``--from``), on the instance's evaluation workload: one panel per plan."""
    from moeopt import plot
    from moeopt.evaluate import evaluate, linear_plan

    wl = workloads or load_workloads(inst)
    m = inst.model
    base = current if current is not None else linear_plan(m.layers, m.experts, inst.cluster.gpus)
    before = evaluate(base, wl.evaluation, inst.cluster)
    label = "current" if current is not None else "linear"
    metrics = {k: v for k, v in metrics.items() if k != label} or metrics  # no panel of linear against itself
    panels = [plot.load_bars(v, before, layer=layer, after_label=k, before_label=label) for k, v in metrics.items()]
    plot.draw_loads(panels, path, title=f"{inst.name}: tokens per GPU, {label} vs plan (held-out workload)")
    console.note(f"wrote {path}")


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
        quiet=not console.progress(),
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
    if args.plot and result.plan is not None:
        _plot_loads(args.plot, inst, {result.method: result.metrics}, current=current, layer=args.layer)
    return 0 if result.plan is not None else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    pf = _read_plan_for(args.plan, inst)
    plan = pf.plan if args.dispatch is None else pf.plan.with_dispatch(Dispatch(kind=args.dispatch))
    wl = load_workloads(inst)
    workload = None
    if args.trace:
        workload = fit_workload(read_workload_file(args.trace, top_k=inst.model.top_k), inst.model, args.trace)
        if isinstance(workload, Trace):
            check_homes(workload.home, inst.cluster.gpus, args.trace)
    metrics = score(plan, inst, wl, workload=workload, hooks=metric_hooks(pf.method), params=pf.params)
    if args.report:
        write_json(args.report, {"instance": inst.name, "plan": str(args.plan), "metrics": metrics})
    print(metrics_report(pf.method or Path(args.plan).name, metrics))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    wl: Workloads = load_workloads(inst)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise MoeoptError(f"--methods: expected comma-separated method names, got {args.methods!r}")
    cols: dict[str, dict] = {}
    reports = []
    for name in names:
        r = solve(
            inst,
            method=name,
            time_limit=args.time_limit,
            seed=args.seed,
            quiet=not console.progress(),
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
    extra = [
        ("comm reduction vs linear (%)", [_fmt(cols[n].get("comm_reduction_vs_linear")) for n in names]),
        ("wall time (s)", [f"{cols[n]['wall_time']:.3f}" for n in names]),
        ("dispatch", [str(cols[n].get("dispatch", "-")) for n in names]),
    ]
    print(metrics_table(cols, extra))
    if args.plot:
        _plot_loads(args.plot, inst, {n: cols[n] for n in names if "loads" in cols[n]}, wl, layer=args.layer)
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
    log = console.progress_line if console.progress() else None
    points = fr.frontier(
        inst,
        methods=methods,
        eps=eps,
        time_limit=args.time_limit,
        seed=args.seed,
        log=log,
        workers=args.workers,
        ray=args.ray,
    )
    out = Path(args.output_dir) if args.output_dir else None
    stem = args.name or inst.name
    md = f"# Frontier: {inst.name}\n\n" + fr.table(points) + "\n"
    if out is not None:
        write_json(
            out / f"{stem}.json",
            {"instance": inst.name, "eps": eps, "methods": methods, "points": [p.to_json() for p in points]},
        )
        write_text(out / f"{stem}.md", md)
        fr.plot(points, out / f"{stem}.png", title=inst.name)
    print(fr.table(points))
    if args.plot:
        fr.plot(points, args.plot, title=inst.name)
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
        successors=args.successors,
        structure_seed=args.structure_seed,
        seed=args.seed,
    )
    spec.validate(source=None, prefix="--")
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
    graph = _coactivation_graph(args, workload) if args.graphml else None  # refuse before printing
    print(trace_summary(workload))
    if graph is not None:
        from moeopt.io import write_graphml

        write_graphml(args.graphml, graph)
        print(
            f"wrote {args.graphml}: layer {args.layer}, {graph.number_of_nodes()} experts, "
            f"{graph.number_of_edges()} coactivation edges"
        )
    return 0


def _coactivation_graph(args: argparse.Namespace, workload: Any) -> Any:
    """``trace stats --graphml``: one layer's coactivation graph (experts with their load and,
    with ``--plan``, their GPU; edges weighted by coactivation, zero edges dropped)."""
    from moeopt.topology import coactivation_graph

    stats = workload.stats() if isinstance(workload, Trace) else workload
    if stats.affinity is None:
        raise MoeoptError(f"{args.trace}: a count-only source has no coactivation; --graphml needs a trace")
    if not 0 <= args.layer < stats.layers:
        raise MoeoptError(f"--layer: expected 0..{stats.layers - 1}, got {args.layer}")
    gpu = None
    if args.plan:
        plan = read_plan(args.plan)
        if (plan.layers, plan.experts) != (stats.layers, stats.experts):
            raise MoeoptError(
                f"{args.plan}: plan has {plan.layers} layers x {plan.experts} experts, "
                f"the trace {stats.layers} x {stats.experts}"
            )
        gpu = plan.home[args.layer]
    graph = coactivation_graph(stats.affinity[args.layer], stats.expert_load[args.layer], gpu)
    graph.graph.update(layer=args.layer, source=str(args.trace))
    return graph


def cmd_profile(args: argparse.Namespace) -> int:
    from moeopt.harness.profile import profile_command  # torch stays optional

    return profile_command(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from moeopt.harness.run import validate_command  # torch stays optional

    return validate_command(args)


def _harness_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    sp.add_argument("--d-model", type=_positive_int, default=None, help="expert FFN width (CPU default 64)")
    sp.add_argument("--d-ff", type=_positive_int, default=None, help="expert FFN hidden size (CPU default 128)")
    sp.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="CPU default fp32")
    sp.add_argument("--tile", type=_positive_int, default=None, help="tokens per tile of the profile (default 64)")
    sp.add_argument("--speeds", default=None, help="emulated GPU speeds, comma-separated")
    sp.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads (CPU default 1)")
    sp.add_argument(
        "--statistic",
        default="median",
        choices=["median", "min"],
        help="of the timed runs (min is steadier on a shared CPU)",
    )
    sp.add_argument("--quiet", action="store_true", help="nothing on stderr but errors (no progress bar)")
    sp.add_argument("--verbose", action="store_true", help="progress on stderr even when it is not a terminal")


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
        for line in engine_settings(args.format, plan, str(args.output), dense_layers=args.dense_layers):
            print(line)
    for line in notes:
        console.note(line)
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
        console.note(line)
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


def _plot_input(path: str) -> dict:
    """A JSON file for ``moeopt plot``: a plan, a solve or compare report, or a frontier file."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise MoeoptError(f"{path}: file not found") from None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MoeoptError(f"{path}: not a JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise MoeoptError(f"{path}: expected a JSON object (plan, report or frontier file)")
    return data


def _plot_kind(data: dict) -> str:
    """What a file is drawn as by default: frontier file -> frontier, plan -> loads, report -> gap."""
    if "points" in data:
        return "frontier"
    if "format" in data:
        return "loads"
    return "gap"


def _reports(data: dict) -> list[dict]:
    """The solve reports in a ``solve --report`` (one) or ``compare --report`` (several) file."""
    return list(data["results"]) if isinstance(data.get("results"), list) else [data]


def cmd_plot(args: argparse.Namespace) -> int:
    from moeopt import plot

    data = _plot_input(args.file)
    kind = args.kind or _plot_kind(data)
    if kind == "frontier":
        plot.draw_frontier(data, args.output)
    elif kind == "gap":
        if "points" in data or "format" in data:
            raise MoeoptError(f"{args.file}: --kind gap needs a solve or compare report (--report)")
        histories = [h for h in map(plot.gap_history, _reports(data)) if h is not None]
        if not histories:
            methods = ", ".join(str(r.get("method")) for r in _reports(data))
            raise MoeoptError(
                f"{args.file}: the report has no history ({methods} solved all layers together and recorded none)"
            )
        plot.draw_gap(histories, args.output, title=f"{data.get('instance', '')}: incumbent and bound per layer")
    else:
        if not args.instance:
            raise MoeoptError("--kind loads needs --instance (the workload the loads are counted on)")
        inst = load_instance(args.instance)
        current = _current_plan(args.from_plan, args.from_format, inst) if args.from_plan else None
        wl = load_workloads(inst)
        if "format" in data:
            from moeopt.evaluate import evaluate

            pf = _read_plan_for(args.file, inst)
            metrics = {pf.method or Path(args.file).stem: evaluate(pf.plan, wl.evaluation, inst.cluster)}
        elif "points" in data:
            raise MoeoptError(f"{args.file}: a frontier file has no plans; --kind loads needs a plan or a report")
        else:
            metrics = {str(r.get("method")): r.get("metrics") or {} for r in _reports(data)}
            if not all("loads" in m for m in metrics.values()):
                raise MoeoptError(f"{args.file}: the report carries no per-GPU loads")
        _plot_loads(args.output, inst, metrics, wl, current=current, layer=args.layer)
        return 0
    console.note(f"wrote {args.output}")
    return 0


# ----------------------------------------------------------------------------- parser
class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), like every other moeopt error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="moeopt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--time-limit",
            type=_positive_seconds,
            default=None,
            help="seconds per layer (exact solvers stop there; heuristics use it as a cap)",
        )
        sp.add_argument("--seed", type=_nonneg_int, default=0)
        verbosity(sp)
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

    def verbosity(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--verbose", action="store_true", help="progress lines on stderr even when it is not a terminal"
        )
        sp.add_argument("--quiet", action="store_true", help="nothing on stderr but errors (no progress, no notes)")

    def plot_args(sp: argparse.ArgumentParser, layer: bool = True) -> None:
        sp.add_argument("--plot", metavar="FILE.png", help="also draw a figure (matplotlib) to this file")
        if layer:
            sp.add_argument(
                "--layer",
                type=_nonneg_int,
                default=None,
                help="layer of the load plot (default: the plan's worst layer)",
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
    plot_args(s)
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
    plot_args(c)
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
    plot_args(fr_, layer=False)
    fr_.set_defaults(func=cmd_frontier)

    m = sub.add_parser("methods", help="list registered methods and whether they are available")
    m.set_defaults(func=cmd_methods)

    t = sub.add_parser("trace", help="synthesize, inspect or import traces")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    ts = tsub.add_parser("synth", help="write a synthetic task-structured trace (.npz)")
    ts.add_argument("--layers", type=_positive_int, default=2)
    ts.add_argument("--experts", type=_positive_int, default=16)
    ts.add_argument("--top-k", type=_positive_int, default=2)
    ts.add_argument("--tokens", type=_positive_int, default=4096)
    ts.add_argument("--steps", type=_positive_int, default=16)
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
        type=_fraction,
        default=0.0,
        help="chance in [0, 1] that a token's community follows its previous top-1 expert's",
    )
    ts.add_argument(
        "--successors",
        type=_nonneg_int,
        default=0,
        help="a following token also favours this many successor experts of its previous top-1 (0: none)",
    )
    ts.add_argument("--structure-seed", type=_nonneg_int, default=0, help="seed of the hidden expert structure")
    ts.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the token sample")
    ts.add_argument("--output", required=True)
    ts.add_argument("--quiet", action="store_true")
    ts.set_defaults(func=cmd_trace_synth)
    tt = tsub.add_parser("stats", help="summarize a trace or count file")
    tt.add_argument("trace")
    tt.add_argument("--top-k", type=_positive_int, default=None, help="top-k of count files that do not record it")
    tt.add_argument("--select", default=None, help="model inside a multi-model count file")
    tt.add_argument("--graphml", default=None, help="write a layer's coactivation graph as GraphML")
    tt.add_argument("--layer", type=_nonneg_int, default=0, help="the layer --graphml writes (default 0)")
    tt.add_argument("--plan", default=None, help="plan file: each expert's GPU as a --graphml node attribute")
    tt.set_defaults(func=cmd_trace_stats)
    ti = tsub.add_parser("import", help="SGLang expert-distribution dump (.pt) -> trace or counts .npz")
    ti.add_argument("dump")
    ti.add_argument("--output", required=True, help="TRACE.npz (per_token dump) or COUNTS.npz (stat dump)")
    ti.add_argument("--top-k", type=_positive_int, default=None, help="model top-k (stat dumps do not record it)")
    ti.add_argument("--trust-pickle", action="store_true", help="also unpickle non-tensor objects (runs code)")
    ti.add_argument("--quiet", action="store_true")
    ti.set_defaults(func=cmd_trace_import)
    # the nested trace commands, listed under the top-level help too (from their parsers)
    p.epilog = (
        "trace commands:\n"
        + "\n".join(f"  trace {a.dest:<8}{a.help}" for a in tsub._choices_actions)
        + "\n\nEach command: moeopt COMMAND --help."
    )

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
    x.add_argument(
        "--dense-layers", type=_nonneg_int, default=0, help="sglang: dense hidden layers before the MoE ones"
    )
    x.add_argument("--quiet", action="store_true")
    x.set_defaults(func=cmd_export)
    im = sub.add_parser("import", help="read a serving engine's expert placement back into a plan JSON")
    im.add_argument("file")
    im.add_argument("--format", required=True, choices=engines)
    im.add_argument("--output", required=True, help="plan JSON to write")
    im.add_argument("--instance", help="take gpus and experts from it and check the plan")
    im.add_argument("--gpus", type=_positive_int, default=None, help="GPU count (SGLang maps do not record it)")
    im.add_argument(
        "--dispatch",
        choices=DISPATCH_KINDS,
        default=None,
        help="the engine's dispatch (default: sglang static, eplb even, vllm-ascend even)",
    )
    im.add_argument("--dense-layers", type=_nonneg_int, default=0, help="sglang: leading dense-layer rows to drop")
    im.add_argument("--quiet", action="store_true")
    im.set_defaults(func=cmd_import)

    pr = sub.add_parser("profile", help="measure a latency profile C(n) of one MoE layer (needs torch)")
    _harness_args(pr)
    pr.add_argument("--experts-per-gpu", type=_positive_int, default=1, help="experts the n tokens are spread over")
    pr.add_argument(
        "--max-tokens", type=_positive_int, default=None, help="largest n (default 4096 on GPU, 512 on CPU)"
    )
    pr.add_argument("--dense", action="store_true", help="also time every n; report the step function's error")
    pr.add_argument("--repeats", type=_positive_int, default=5, help="timed runs per n (median)")
    pr.add_argument("--warmup", type=_nonneg_int, default=2, help="untimed runs per n")
    pr.add_argument("--output", required=True, help="profile YAML to write")
    pr.set_defaults(func=cmd_profile)

    v = sub.add_parser("validate", help="run plans on this device as G emulated GPUs; measured vs modelled S")
    v.add_argument("instance")
    v.add_argument("plans", nargs="*", help="plan JSON files (none: linear, greedy and gem solved here)")
    _harness_args(v)
    v.add_argument("--max-steps", type=_positive_int, default=None, help="measure only the first N steps")
    v.add_argument("--profile", default=None, help="modelled profile file (default: the instance's)")
    v.add_argument("--repeats", type=_positive_int, default=3, help="timed runs per GPU group (median)")
    v.add_argument("--warmup", type=_nonneg_int, default=1, help="untimed runs per GPU group")
    v.add_argument(
        "--all-to-all",
        default="auto",
        choices=["auto", "off", "nccl", "gloo"],
        help="time the token all-to-all (auto: NCCL when several CUDA devices are visible)",
    )
    v.add_argument("--world", type=_positive_int, default=None, help="ranks of the all-to-all")
    v.add_argument("--seed", type=_nonneg_int, default=0)
    v.add_argument("--report", help="report JSON to write")
    v.add_argument("--markdown", help="report Markdown to write")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser(
        "plot", help="draw per-GPU loads, a frontier, or incumbent and bound over time (PNG, matplotlib)"
    )
    pl.add_argument("file", help="plan JSON, solve/compare --report JSON, or frontier JSON (--output-dir)")
    pl.add_argument(
        "--kind",
        choices=["loads", "frontier", "gap"],
        default=None,
        help="what to draw (default: plan -> loads, frontier file -> frontier, report -> gap)",
    )
    pl.add_argument("--output", "-o", required=True, metavar="OUT.png", help="image to write")
    pl.add_argument("--instance", help="loads: the instance whose evaluation workload is counted")
    pl.add_argument(
        "--from",
        dest="from_plan",
        metavar="CURRENT_PLAN",
        help="loads: compare with this plan (moeopt or engine file) instead of linear",
    )
    pl.add_argument("--from-format", choices=["plan", "sglang", "eplb", "vllm-ascend"], default=None)
    pl.add_argument("--layer", type=_nonneg_int, default=None, help="loads: layer to draw (default: the worst)")
    pl.add_argument("--quiet", action="store_true", help="no note on stderr")
    pl.set_defaults(func=cmd_plot)
    return p


#: terminal escape sequences (CSI, OSC) and other control characters kept out of error lines
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x1f\x7f-\x9f]")


def one_line(message: str) -> str:
    """An error message as one printable line: escape sequences dropped, line breaks joined."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\n\r\t" else "", message).strip()


#: options naming files a command writes, and options naming a directory it writes into
OUTPUT_FILE_OPTIONS = ("output", "report", "markdown", "plot", "graphml")
OUTPUT_DIR_OPTIONS = ("output_dir",)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that cannot be written (directories, FIFOs, devices,
    unwritable folders), naming the option; two options naming one file are refused too."""
    seen: dict[str, str] = {}
    for name in OUTPUT_FILE_OPTIONS:
        value = getattr(args, name, None)
        if value is None:
            continue
        option = "--" + name.replace("_", "-")
        target = str(check_target(value, option))
        if target in seen:
            raise MoeoptError(f"{option}: {value} is also given as {seen[target]}; expected distinct files")
        seen[target] = option
    for name in OUTPUT_DIR_OPTIONS:
        if getattr(args, name, None):
            check_directory(getattr(args, name), "--" + name.replace("_", "-"))


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (building costs tens of ms, mostly gettext look-ups)."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console.configure(verbose=getattr(args, "verbose", False), quiet=getattr(args, "quiet", False))
    try:
        check_outputs(args)
        with all_or_none():  # every output file is written, or none
            return int(args.func(args))
    except MoeoptError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `moeopt ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (keep the interpreter's flush at exit quiet)
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
