"""The one scorer: every command scores a plan here, with the plan's own dispatch.

``solve``, ``evaluate``, ``compare``, ``validate``, the benchmarks and the notebooks all call
[`score`][moeopt.scoring.score], so the same plan on the same workload gets the same numbers everywhere: the
metrics of [`moeopt.evaluate.evaluate`][], the reductions against the linear baseline, and
the metrics the plan's method declares (``metric_hooks``: lower bounds, gaps, certificates).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moeopt.evaluate import evaluate, linear_plan
from moeopt.instance import Instance
from moeopt.plan import Dispatch, Plan
from moeopt.profile import Profile
from moeopt.trace import Stats, Trace, layer_workload


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


def probe_plan(instance: Instance, rule: Dispatch, load: np.ndarray | None = None) -> Plan:
    """A one-layer plan of the instance's shape to time scoring on: vLLM's linear placement,
    its replica slots holding copies of the experts in proportion to ``load`` (float ``[E]``;
    None: evenly), each expert's copies on consecutive GPUs, as balancing planners spread the
    hottest experts' copies."""
    cluster = instance.cluster
    G, E, R = cluster.gpus, instance.model.experts, cluster.replica_slots_per_gpu
    base = linear_plan(1, E, G, cluster.width)
    if not R:
        return base.with_dispatch(rule)
    n = G * R
    w = np.ones(E) if load is None or float(np.sum(load)) <= 0 else np.asarray(load, dtype=np.float64)
    exact = w / w.sum() * n
    copies = np.floor(exact).astype(np.int64)
    copies[np.argsort(copies - exact, kind="stable")[: n - int(copies.sum())]] += 1  # largest remainders
    seq = np.repeat(np.arange(E), copies)  # the i-th copy on GPU i mod G, replica slot i div G
    slots = base.slots.copy()
    slots[0, np.arange(n) % G, cluster.width - R + np.arange(n) // G] = seq
    return Plan(slots=slots, experts=E, dispatch=rule)


def scoring_seconds(instance: Instance, workload: Trace | Stats, rule: Dispatch, *, baseline: bool = False) -> float:
    """Seconds [`evaluate`][moeopt.evaluate.evaluate] takes on ``workload`` for a plan of the
    instance's shape under ``rule`` (and with ``baseline``, the linear plan too, as `score`
    does), measured on one layer with `probe_plan` and times the layers.

    What a time-limited run keeps free for the scoring still to come: under SGLang's ``static``
    rule at 256 GPUs each rank's seeded table and the expectation over the token homes take about
    half a second per layer, after the method has used its time.
    """
    one = layer_workload(workload, 0)
    probe = probe_plan(instance, rule, np.asarray(one.expert_load[0], dtype=np.float64))
    t0 = time.perf_counter()
    evaluate(probe, one, instance.cluster)
    if baseline:
        evaluate(linear_plan(1, instance.model.experts, instance.cluster.gpus), one, instance.cluster)
    return (time.perf_counter() - t0) * instance.model.layers
