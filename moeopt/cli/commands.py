"""The planning commands: solve, evaluate, compare, frontier, methods, trace, profile, validate."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

from moeopt import console
from moeopt.cli.args import _current_plan, _dispatch, _read_plan_for, method_list
from moeopt.cli.plots import _plot_loads
from moeopt.cli.reports import emit, wrote
from moeopt.cli.tables import (
    _fmt,
    _solve_table,
    metrics_report,
    metrics_table,
    migration_table,
    report_dict,
    trace_report,
    trace_summary,
)
from moeopt.errors import InputError, MoeoptError
from moeopt.io import (
    fit_workload,
    load_instance,
    read_plan,
    read_workload_file,
    write_plan,
    write_trace,
)
from moeopt.plan import engine_dispatch, rule_dispatch
from moeopt.registry import metric_hooks
from moeopt.schema import check_homes
from moeopt.scoring import score
from moeopt.solve import Workloads, load_workloads, run_limits, solve
from moeopt.trace import Stats, Trace


def _note_token_home(inst: Any, names: list[str]) -> None:
    """Say when a method plans for other token homes than the instance's (``crosslayer`` plans
    for ``previous-layer`` homes; its plans are scored under the instance's own)."""
    home = inst.cluster.token_home
    if "crosslayer" in names and home != "previous-layer":
        console.note(
            f"note: crosslayer plans for cluster.token_home: previous-layer (a token stays on the GPU of its "
            f"previous layer's top-1 expert); {inst.source or inst.name} has token_home: {home}, under which its "
            f"plans are scored: set token_home: previous-layer, or plan with joint or agnostic"
        )


def _total_limit(args: argparse.Namespace, inst: Any) -> float | None:
    """The run's total ``--time-limit``, else the instance's ``method.time_limit``, else None."""
    if args.time_limit is not None:
        return float(args.time_limit)
    own, _ = run_limits(inst.method.params, str(inst.source) if inst.source else None, method=inst.method.name)
    return own.get("time_limit")


def cmd_solve(args: argparse.Namespace) -> int:
    if args.method is not None:
        method_list(args.method, "--method")
    inst = load_instance(args.instance)
    _note_token_home(inst, [args.method or inst.method.name])
    hint = _read_plan_for(args.hint, inst).plan if args.hint else None
    current = _current_plan(args.from_plan, args.from_format, inst) if args.from_plan else None
    result = solve(
        inst,
        method=args.method,
        time_limit=args.time_limit,
        layer_time_limit=args.layer_time_limit,
        seed=args.seed,
        quiet=not console.progress(),
        hint=hint,
        dispatch=_dispatch(args, inst.model),
        current=current,
        workers=args.workers,
        ray=args.ray,
    )
    if args.output and result.plan is not None:
        write_plan(args.output, result.plan, result.method, result.params)
    text = _solve_table(result)
    if "migration_frontier" in result.stats:
        text += "\n" + migration_table(result.stats)
    emit(args, report_dict(result, inst.name), text)
    if args.plot and result.plan is not None:
        _plot_loads(args.plot, inst, {result.method: result.metrics}, current=current, layer=args.layer)
    return 0 if result.plan is not None else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    inst = load_instance(args.instance)
    pf = _read_plan_for(args.plan, inst)
    plan = pf.plan if args.dispatch is None else pf.plan.with_dispatch(rule_dispatch(args.dispatch, inst.model))
    engine = engine_dispatch(inst.model, inst.cluster)
    if args.dispatch is None and engine is not None and plan.dispatch != engine:
        console.note(
            f"note: {args.plan} runs under dispatch {plan.dispatch.kind!r}, but {inst.cluster.engine} "
            f"(cluster.engine) runs {engine.kind!r}: --dispatch {engine.kind} scores it as the engine will run it"
        )
    wl = load_workloads(inst)
    workload = None
    if args.trace:
        workload = fit_workload(read_workload_file(args.trace, top_k=inst.model.top_k), inst.model, args.trace)
        if isinstance(workload, Trace):
            check_homes(workload.home, inst.cluster.gpus, args.trace)
    metrics = score(plan, inst, wl, workload=workload, hooks=metric_hooks(pf.method), params=pf.params)
    report = {"instance": inst.name, "plan": str(args.plan), "metrics": metrics}
    emit(args, report, metrics_report(pf.method or Path(args.plan).name, metrics))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Several methods in turn; a total ``--time-limit`` is shared over them (each method, as it
    starts, gets its share of what is left over the methods still to run)."""
    from moeopt.budget import share

    started = time.time()
    names = method_list(args.methods, "--methods")
    inst = load_instance(args.instance)
    _note_token_home(inst, names)
    total = _total_limit(args, inst)
    deadline = None if total is None else started + total
    wl: Workloads = load_workloads(inst)
    cols: dict[str, dict] = {}
    reports = []
    for i, name in enumerate(names):
        r = solve(
            inst,
            method=name,
            time_limit=share(None, deadline, len(names) - i),
            layer_time_limit=args.layer_time_limit,
            seed=args.seed,
            quiet=not console.progress(),
            workloads=wl,
            dispatch=_dispatch(args, inst.model),
            workers=args.workers,
            ray=args.ray,
        )
        m = dict(r.metrics)
        m["wall_time"] = r.wall_time
        cols[name] = m
        reports.append(report_dict(r, inst.name))
    extra = [
        ("comm reduction vs linear (%)", [_fmt(cols[n].get("comm_reduction_vs_linear")) for n in names]),
        ("wall time (s)", [f"{cols[n]['wall_time']:.3f}" for n in names]),
        ("dispatch", [str(cols[n].get("dispatch", "-")) for n in names]),
    ]
    emit(args, {"instance": inst.name, "results": reports}, metrics_table(cols, extra))
    if args.plot:
        _plot_loads(args.plot, inst, {n: cols[n] for n in names if "loads" in cols[n]}, wl, layer=args.layer)
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    """Sweep the load limit of several methods; write the Pareto set as table, JSON and plot."""
    from moeopt import frontier as fr
    from moeopt.io import write_json, write_text
    from moeopt.outputs import check_target, figure_format

    started = time.time()
    methods = method_list(args.methods, "--methods")
    try:
        eps = [float(x) for x in args.eps.split(",")]
    except ValueError:
        raise MoeoptError(f"--eps: expected comma-separated numbers, got {args.eps!r}") from None
    if any(not (e >= 0) for e in eps):
        raise MoeoptError(f"--eps: every value must be >= 0, got {args.eps!r}")
    inst = load_instance(args.instance)
    _note_token_home(inst, methods)
    out = Path(args.output) if args.output else None
    stem = args.name or inst.name
    if out is not None:  # the three files, checked before the sweep (inputs and --plot included)
        seen = {str(check_target(args.plot, "--plot"))} if args.plot else set()
        for suffix in (".json", ".md", ".png"):
            target = str(check_target(out / f"{stem}{suffix}", "--output"))
            if target in seen:
                raise MoeoptError(f"--output: {out / (stem + suffix)} is also given as --plot; expected distinct files")
            seen.add(target)
        figure_format(out / f"{stem}.png", "--output")
    log = console.progress_line if console.progress() else None
    total = _total_limit(args, inst)
    points = fr.frontier(
        inst,
        methods=methods,
        eps=eps,
        time_limit=None if total is None else max(total - (time.time() - started), 0.0),
        layer_time_limit=args.layer_time_limit,
        seed=args.seed,
        log=log,
        workers=args.workers,
        ray=args.ray,
    )
    md = f"# Frontier: {inst.name}\n\n" + fr.table(points) + "\n"
    data = {"instance": inst.name, "eps": eps, "methods": methods, "points": [p.to_json() for p in points]}
    report = emit(args, data, fr.table(points))
    if out is not None:
        write_json(out / f"{stem}.json", report)
        write_text(out / f"{stem}.md", md)
        fr.plot(points, out / f"{stem}.png", title=inst.name)
    if args.plot:
        fr.plot(points, args.plot, title=inst.name)
    if out is not None:
        wrote(args, f"wrote {out / (stem + '.json')}, {stem}.md and {stem}.png")
    return 0


def _default(field: Any) -> Any:
    """A parameter's default as JSON holds it (its ``repr`` when JSON has no such value)."""
    import dataclasses
    import json

    value = field.default_factory() if field.default is dataclasses.MISSING else field.default
    try:
        json.dumps(value, allow_nan=False)  # inf (an unbounded default) as its repr, not null
    except (TypeError, ValueError):
        return repr(value)
    return value


def cmd_methods(args: argparse.Namespace) -> int:
    from moeopt.registry import get_method, method_names, param_fields
    from moeopt.solvers.pyomo_solvers import availability

    rows, listed = [], []
    for name in method_names():
        m = get_method(name)
        fields = param_fields(m)
        params = ", ".join(f"{f}={v.default!r}" for f, v in fields.items())
        rows.append([name, "yes" if m.available() else "no", m.summary, params or "-"])
        listed.append(
            {
                "name": name,
                "available": bool(m.available()),
                "summary": m.summary,
                "parameters": {f: _default(v) for f, v in fields.items()},
            }
        )
    solvers = availability()
    lines = [tabulate(rows, headers=["method", "available", "what it does", "parameters"], tablefmt="plain")]
    lines.append("\nMILP solvers of the Pyomo models (tacg-milp, gem-milp: parameter solver; docs/guides/solvers.md):")
    lines += [f"  {solver:<7} {'yes' if ok else 'no':<4} {how}" for solver, ok, how in solvers]
    report = {
        "methods": listed,
        "solvers": [{"name": solver, "available": bool(ok), "how": how} for solver, ok, how in solvers],
    }
    emit(args, report, "\n".join(lines))
    return 0


def _share_list(text: str | None, option: str) -> tuple[float, ...] | None:
    """``--family-share 1,1,2``: comma-separated numbers (the schema checks their count and range)."""
    if text is None:
        return None
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise MoeoptError(f"{option}: expected comma-separated numbers, got {text!r}") from None


def cmd_trace_synth(args: argparse.Namespace) -> int:
    from moeopt.synth import SynthSpec, synthesize

    spec = SynthSpec(
        layers=args.layers,
        experts=args.experts,
        top_k=args.top_k,
        tokens=args.tokens,
        steps=args.steps,
        families=tuple(f.strip() for f in args.families.split(",")),
        family_share=_share_list(args.family_share, "--family-share"),
        only_family=args.family,
        family_communities=args.family_communities,
        layer_dependency=args.layer_dependency,
        successors=args.successors,
        structure_seed=args.structure_seed,
        seed=args.seed,
        drift=args.drift,
        drift_share=_share_list(args.drift_share, "--drift-share"),
        drift_focus=args.drift_focus,
        drift_rate=args.drift_rate,
        switch_step=args.switch_step,
        switch_seed=args.switch_seed,
    )
    spec.validate(source=None, prefix="--")
    if Path(args.output).suffix.lower() != ".npz":
        raise MoeoptError(f"--output: {args.output}: expected an .npz output (a trace)")
    trace = synthesize(spec)
    write_trace(args.output, trace)
    if not args.quiet:
        drift = "" if spec.drift == "none" else f", drift {spec.drift}"
        print(
            f"wrote {args.output}: {trace.tokens} tokens, {trace.layers} layers, E={trace.num_experts}, "
            f"k={trace.top_k}, {trace.steps} steps, families {', '.join(trace.family_names)}{drift}"
        )
    return 0


#: ``trace stream KIND``: the options each kind reads beyond the shared ones
STREAM_OPTIONS = {
    "domains": ("select", "order", "steps_per_domain", "blend"),
    "phase": ("after", "steps", "switch", "ramp"),
    "sampled": ("select", "steps", "drift"),
    "mix": ("select", "order", "steps", "focus"),
}


def _stream_counts(args: argparse.Namespace, path: str, select: str | None = None) -> Stats:
    w = read_workload_file(path, top_k=args.top_k, select=select)
    if isinstance(w, Trace):
        w = w.stats()
    return w


def _per_domain(args: argparse.Namespace) -> tuple[Stats, dict, tuple[str, ...]]:
    """``--source`` (with ``--select``) as per-domain counts, and ``--order`` (default: every domain)."""
    src = _stream_counts(args, args.source, args.select)
    if src.families < 2:
        raise MoeoptError(f"{args.source}: expected per-domain counts (several families), found one family")
    by_domain = {name: src.counts[f] for f, name in enumerate(src.family_names)}
    order = src.family_names if args.order is None else tuple(d.strip() for d in args.order.split(",") if d.strip())
    return src, by_domain, order


def _trace_stream_mix(args: argparse.Namespace) -> int:
    """``trace stream mix``: a token trace whose domain mix drifts ([`moeopt.streams.domain_mix`][])."""
    from moeopt import streams
    from moeopt.io import write_trace

    src, by_domain, order = _per_domain(args)
    steps = 32 if args.steps is None else args.steps
    focus = streams.DEFAULT_FOCUS if args.focus is None else args.focus
    trace = streams.domain_mix(by_domain, order, steps, args.tokens_per_step, src.top_k, focus=focus, seed=args.seed)
    write_trace(args.output, trace)
    if not args.quiet:
        print(
            f"wrote {args.output}: token trace, {trace.layers} layers, E={trace.num_experts}, top-{trace.top_k}, "
            f"{steps} steps of {args.tokens_per_step} tokens; the mix of {', '.join(order)} drifts (focus {focus:g})"
        )
    return 0


def cmd_trace_stream(args: argparse.Namespace) -> int:
    """``trace stream KIND``: a count stream (per-step counts that drift) built from real or
    any count data by ``moeopt.streams``, written as a counts ``.npz`` with ``step_counts``
    (``mix``: a token trace ``.npz`` whose tokens carry their domain)."""
    from dataclasses import replace

    import numpy as np

    from moeopt import streams
    from moeopt.io import write_counts
    from moeopt.trace import stats_from_counts

    used = STREAM_OPTIONS[args.kind]
    for name in sorted({n for names in STREAM_OPTIONS.values() for n in names} - set(used)):
        if getattr(args, name) is not None:
            option = "--" + name.replace("_", "-")
            kinds = [k for k, names in STREAM_OPTIONS.items() if name in names]
            raise MoeoptError(f"{option}: only used by trace stream {' or '.join(kinds)}, not {args.kind}")
    if Path(args.output).suffix.lower() != ".npz":
        raise MoeoptError(f"{args.output}: expected an .npz output (a counts file; mix: a trace file)")
    tokens = args.tokens_per_step
    try:
        if args.kind == "mix":
            return _trace_stream_mix(args)
        if args.kind == "domains":
            src, by_domain, order = _per_domain(args)
            per = 8 if args.steps_per_domain is None else args.steps_per_domain
            counts = streams.domain_sequence(
                by_domain, order, per, tokens, src.top_k, blend=args.blend or 0, seed=args.seed
            )
            what = f"domains {', '.join(order)}, {per} steps each" + (f", blend {args.blend}" if args.blend else "")
        elif args.kind == "phase":
            if args.after is None:
                raise MoeoptError("--after: trace stream phase needs the distribution after the switch (a file)")
            src, after = _stream_counts(args, args.source), _stream_counts(args, args.after)
            if after.top_k != src.top_k:
                raise MoeoptError(f"{args.after}: top-{after.top_k} routing, {args.source} has top-{src.top_k}")
            steps = 48 if args.steps is None else args.steps
            switch = steps // 2 if args.switch is None else args.switch
            a, b, ramp = src.expert_load, after.expert_load, args.ramp or 0
            counts = streams.phase_shift(a, b, steps, switch, tokens, src.top_k, ramp=ramp, seed=args.seed)
            what = f"{args.source} then {args.after} from step {switch}" + (f", ramp {args.ramp}" if args.ramp else "")
        else:
            src = _stream_counts(args, args.source, args.select)
            steps = 48 if args.steps is None else args.steps
            drift = 0.0 if args.drift is None else args.drift
            counts = streams.count_sampled(src.expert_load, steps, tokens, src.top_k, drift=drift, seed=args.seed)
            what = f"{args.source}, " + (f"drift {drift}" if drift > 0 else "stationary")
    except InputError as exc:
        if exc.source is None and exc.field:  # a builder's parameter: name the option that set it
            flags = {"a": "--source", "b": "--after", "load": "--source", "counts_by_domain": "--source"}
            name = exc.field.split("[")[0]
            raise InputError(None, flags.get(name, "--" + name.replace("_", "-")), exc.message) from None
        raise
    stats = stats_from_counts(counts.sum(axis=1), top_k=src.top_k)
    # float32 counts: exact (integers below 2**24) and half the size of float64 on disk
    write_counts(args.output, replace(stats, step_counts=counts.astype(np.float32)))
    if not args.quiet:
        L, T, E = counts.shape
        print(f"wrote {args.output}: counts, {L} layers, E={E}, top-{src.top_k}, {T} steps of {tokens} tokens; {what}")
    return 0


def cmd_trace_stats(args: argparse.Namespace) -> int:
    workload = read_workload_file(args.trace, top_k=args.top_k, select=args.select)
    graph = _coactivation_graph(args, workload) if args.graphml else None  # refuse before printing
    if graph is not None:  # written before anything is printed: a file that cannot be written prints nothing
        from moeopt.io import write_graphml

        write_graphml(args.graphml, graph)
    report = trace_report(workload)
    emit(args, {"trace": str(args.trace), **report}, trace_summary(workload, report))
    if graph is not None:
        wrote(
            args,
            f"wrote {args.graphml}: layer {args.layer}, {graph.number_of_nodes()} experts, "
            f"{graph.number_of_edges()} coactivation edges",
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
