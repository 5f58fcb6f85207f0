"""The one scorer: every command scores a plan here, with the plan's own dispatch.

``solve``, ``evaluate``, ``compare``, ``validate``, the benchmarks and the notebooks all call
[`score`][moeopt.scoring.score], so the same plan on the same workload gets the same numbers everywhere: the
metrics of [`moeopt.evaluate.evaluate`][], the reductions against the linear baseline, and
the metrics the plan's method declares (``metric_hooks``: lower bounds, gaps, certificates).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from moeopt.evaluate import evaluate, linear_plan
from moeopt.instance import Instance
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.trace import Stats, Trace


@dataclass(frozen=True, eq=False)
class Workloads:
    """An instance's calibration and evaluation workloads, loaded once."""

    calibration: Trace | Stats
    evaluation: Trace | Stats
    calibration_stats: Stats
    profile: Profile | None


#: ``hook(plan, instance, workloads, metrics, params)`` adds metrics in place.
MetricHook = Callable[[Plan, Instance, Workloads, dict, dict], None]


def score(
    plan: Plan,
    instance: Instance,
    workloads: Workloads,
    *,
    workload: Trace | Stats | None = None,
    hooks: Iterable[MetricHook] = (),
    params: dict[str, Any] | None = None,
) -> dict:
    """Every metric of ``plan`` on the instance's evaluation workload (or ``workload``).

    Parameters
    ----------
    plan
        The plan, scored under its own ``plan.dispatch``.
    instance
        Its instance (cluster, model).
    workloads
        The instance's loaded workloads (profile included).
    workload
        Score on this workload instead of ``workloads.evaluation`` (e.g. ``evaluate --trace``).
    hooks
        The plan's method's metric hooks ([`moeopt.registry.metric_hooks`][]).
    params
        The method's parameters as it reported them (``Result.params``), passed to the hooks.

    Returns
    -------
    dict
        [`evaluate`][moeopt.evaluate.evaluate]'s metrics plus ``*_reduction_vs_linear`` (percent,
        positive = better than linear), ``linear`` (the baseline's scalar metrics), the hooks'
        metrics, and ``notes`` (remarks such as colocated copies).
    """
    cluster = instance.cluster
    target = workloads.evaluation if workload is None else workload
    metrics = evaluate(plan, target, cluster, profile=workloads.profile)
    base = evaluate(
        linear_plan(instance.model.layers, instance.model.experts, cluster.gpus),
        target,
        cluster,
        profile=workloads.profile,
    )
    add_relative_metrics(metrics, base)
    for hook in hooks:
        hook(plan, instance, workloads, metrics, params or {})
    metrics["notes"] = plan.notes()
    return metrics


def add_relative_metrics(metrics: dict, base: dict) -> None:
    """Reductions vs the linear baseline, in percent (positive = better than linear)."""

    def pct(key: str) -> float | None:
        a, b = metrics.get(key), base.get(key)
        if a is None or b is None or b == 0:
            return None
        return float(100.0 * (b - a) / b)

    metrics["comm_reduction_vs_linear"] = pct("comm_per_token")
    metrics["comm_nodes_reduction_vs_linear"] = pct("comm_nodes_per_token")
    metrics["comm_weighted_reduction_vs_linear"] = pct("comm_weighted_per_token")
    if "straggler_latency" in metrics:
        metrics["straggler_improvement_vs_linear"] = pct("straggler_latency")
        metrics["p90_improvement_vs_linear"] = pct("straggler_p90")
    metrics["linear"] = {k: v for k, v in base.items() if not isinstance(v, list)}
