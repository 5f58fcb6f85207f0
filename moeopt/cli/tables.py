"""Text tables of the command line: metrics, solve summaries, migration frontiers, trace summaries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from moeopt.plan import RESEARCH_KINDS
from moeopt.result import Result
from moeopt.trace import Trace

#: Rows of the metric tables: (report key, label, lower is better)
METRIC_ROWS = [
    ("comm_per_token", "remote GPUs / token / layer", True),
    ("comm_nodes_per_token", "remote nodes / token / layer", True),
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
    """The ``--report`` JSON of a solve: `to_dict`, the one serializer."""
    return result.replace(instance=instance_name).to_dict()


def metrics_table(columns: dict[str, dict], extra: Sequence[tuple[str, list[str]]] = ()) -> str:
    """The metric rows of several plans side by side, plus ``extra`` rows (label, cells)."""
    names = list(columns)
    rows = []
    for key, label, _ in METRIC_ROWS:
        vals = [columns[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        if key == "comm_nodes_per_token" and not any(vals):  # one node: nothing crosses nodes
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
    extra = []
    if metrics.get("dispatch"):
        kind = metrics["dispatch"]
        label = " (a research rule: no serving engine runs it)" if kind in RESEARCH_KINDS else ""
        extra.append(f"dispatch: {kind}{label}")
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
    lines = [result.summary()]
    if result.plan is None and isinstance(result.stats.get("reason"), str):
        lines.append(f"no plan: {result.stats['reason']}")  # why, and what would fix it
    return "\n".join([*lines, metrics_report(result.method, result.metrics)])


def migration_table(stats: dict) -> str:
    """Moves vs MaxVio of a migration-aware re-plan (``solve --from``)."""
    rows = [[f["budget"], f["moves"], f"{f['maxvio']:.4f}"] for f in stats["migration_frontier"]]
    head = f"moved expert weights: {stats['moves']} (per layer: max {max(stats['moves_per_layer'], default=0)})"
    objective = stats.get("migration_objective", "pooled")
    column = "MaxVio" if objective == "pooled" else f"{objective} MaxVio"  # e.g. "mean per-step MaxVio"
    table = tabulate(rows, headers=["budget / layer", "moves (all layers)", column], tablefmt="github")
    return "\n".join([head, "migration frontier (calibration, even split):", table])


def trace_report(workload: Any) -> dict[str, Any]:
    """``trace stats`` as data (the ``--json`` / ``--report`` content): the shape, the family
    shares, per layer the busiest and idlest expert's load over the mean (and the coactivation
    density where there are tokens), and GEM's classification (None without per-step counts)."""
    from moeopt.utilization import classification_report

    stats = workload.stats() if isinstance(workload, Trace) else workload
    trace = isinstance(workload, Trace)
    layers = []
    for l in range(stats.layers):
        load = stats.expert_load[l]
        mean = max(float(load.mean()), 1e-12)
        row = {"layer": l, "busiest_over_mean": float(load.max()) / mean, "idlest_over_mean": float(load.min()) / mean}
        if stats.affinity is not None:
            row["coactivation_density"] = float((stats.affinity[l] > 0).mean())
        layers.append(row)
    return {
        "kind": "trace" if trace else "counts",
        "tokens": workload.tokens if trace else None,
        "layers": stats.layers,
        "experts": stats.experts,
        "top_k": stats.top_k,
        "steps": workload.steps if trace else None,
        "families": {n: float(s) for n, s in zip(stats.family_names, stats.family_share, strict=True)},
        "per_layer": layers,
        "classification": classification_report(stats),
    }


def trace_summary(workload: Any, report: dict[str, Any] | None = None) -> str:
    """The human-readable ``trace stats`` (from ``report``, `trace_report` of ``workload`` when None)."""
    from moeopt.utilization import classification_text

    r = trace_report(workload) if report is None else report
    lines = []
    if r["kind"] == "trace":
        lines.append(
            f"tokens {r['tokens']}, layers {r['layers']}, experts {r['experts']}, top-{r['top_k']}, steps {r['steps']}"
        )
    else:
        lines.append(f"count-only statistics: layers {r['layers']}, experts {r['experts']}, top-{r['top_k']}")
    lines.append("families: " + ", ".join(f"{n} {100 * s:.1f} %" for n, s in r["families"].items()))
    density = any("coactivation_density" in x for x in r["per_layer"])
    rows = [
        [x["layer"], f"{x['busiest_over_mean']:.2f}", f"{x['idlest_over_mean']:.2f}"]
        + ([f"{x['coactivation_density']:.2f}"] if density else [])
        for x in r["per_layer"]
    ]
    headers = ["layer", "busiest/mean", "idlest/mean"] + (["coactivation density"] if density else [])
    lines.append(tabulate(rows, headers=headers, tablefmt="github"))
    lines.extend(classification_text(r["classification"]))
    return "\n".join(lines)
