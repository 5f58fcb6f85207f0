"""One entry point: load an instance's workloads, run a method, check and evaluate its plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moeopt.errors import InputError, PlanError
from moeopt.evaluate import GuardParams, evaluate, linear_plan
from moeopt.instance import Instance
from moeopt.io import load_workload, resolve_profile
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.registry import Context, Problem, get_method, parse_params
from moeopt.result import Result
from moeopt.trace import Stats, Trace


@dataclass(frozen=True, eq=False)
class Workloads:
    """An instance's calibration and evaluation workloads, loaded once."""

    calibration: Trace | Stats
    evaluation: Trace | Stats
    calibration_stats: Stats
    profile: Profile | None


def load_workloads(instance: Instance) -> Workloads:
    instance.check_feasible()
    model, w = instance.model, instance.workload
    calib = load_workload(w.calibration, model)
    if w.evaluation is not None:
        evaluation = load_workload(w.evaluation, model)
    elif w.calibration.synthetic is not None:
        # a fresh sample of the same synthetic structure: evaluate out of sample
        evaluation = load_workload(w.calibration, model, seed_offset=1)
    else:
        evaluation = calib
    stats = calib.stats() if isinstance(calib, Trace) else calib
    return Workloads(calib, evaluation, stats, resolve_profile(instance))


#: Post-processing hooks that add metrics to every result, e.g. GEM's lower bound.
#: Each is called as ``hook(plan, problem, workloads, metrics, result)`` and adds to ``metrics``.
METRIC_HOOKS: list[Callable[[Plan, Problem, Workloads, dict, Result], None]] = []


def check_requirements(method: Any, problem: Problem, src: str | None) -> None:
    needs = method.requires
    if "coactivation" in needs and not problem.stats.has_coactivation:
        raise InputError(
            src,
            "workload.calibration",
            f"method {method.name!r} needs a token trace (coactivation); this workload is count-only",
        )
    if "steps" in needs and problem.stats.step_counts is None:
        raise InputError(
            src, "workload.calibration", f"method {method.name!r} needs per-timestep counts (a trace with 'step')"
        )
    if "profile" in needs and problem.profile is None:
        raise InputError(src, "profile", f"method {method.name!r} needs a latency profile (instance field 'profile')")


def solve(
    instance: Instance,
    *,
    method: str | None = None,
    params: dict[str, Any] | None = None,
    time_limit: float | None = None,
    seed: int = 0,
    hint: Plan | None = None,
    quiet: bool = True,
    workloads: Workloads | None = None,
    guard: GuardParams | None = None,
) -> Result:
    """Solve ``instance`` with its method (or ``method``), check the plan, add every metric.

    ``params`` default to the instance's ``method:`` mapping; when ``method`` names another
    method, only the parameters that method accepts are kept. ``guard`` (the replica guard's
    λ, δ) defaults to the method's own settings (``result.stats["guard"]``), else the defaults.
    """
    src = str(instance.source) if instance.source else None
    name = method or instance.method.name
    impl = get_method(name, source=src)
    if params is None:
        strict = name == instance.method.name
        params_obj = parse_params(impl, instance.method.params, source=src, strict=strict)
    else:
        params_obj = parse_params(impl, params, source=src)
    if not impl.available():
        raise InputError(src, "method.name", f"method {name!r} is not available here (missing package?)")
    wl = workloads or load_workloads(instance)
    problem = Problem(
        instance, wl.calibration_stats, wl.calibration if isinstance(wl.calibration, Trace) else None, wl.profile
    )
    check_requirements(impl, problem, src)
    ctx = Context(time_limit=time_limit, seed=seed, hint=hint, quiet=quiet)
    t0 = time.perf_counter()
    result = impl.solve(problem, params_obj, ctx)
    wall = time.perf_counter() - t0
    if result.plan is None:
        return result.replace(wall_time=wall)
    try:
        result.plan.check(instance.cluster, layers=instance.model.layers, experts=instance.model.experts)
    except PlanError as exc:  # a method returning an infeasible plan is a bug, not bad input
        raise RuntimeError(f"method {name!r} returned an infeasible plan: {exc}") from exc
    if guard is None:  # a replication method's own guard settings (λ, δ), else the defaults
        guard = GuardParams(**result.stats["guard"]) if "guard" in result.stats else GuardParams()
    metrics = evaluate(result.plan, wl.evaluation, instance.cluster, profile=wl.profile, guard=guard)
    base = evaluate(
        linear_plan(instance.model.layers, instance.model.experts, instance.cluster.gpus),
        wl.evaluation,
        instance.cluster,
        profile=wl.profile,
    )
    add_relative_metrics(metrics, base)
    for hook in METRIC_HOOKS:
        hook(result.plan, problem, wl, metrics, result)
    return result.replace(metrics=metrics, wall_time=wall)


def add_relative_metrics(metrics: dict, base: dict) -> None:
    """Reductions vs the linear baseline, in percent (positive = better than linear)."""

    def pct(key: str) -> float | None:
        a, b = metrics.get(key), base.get(key)
        if a is None or b is None or b == 0:
            return None
        return 100.0 * (b - a) / b

    metrics["comm_reduction_vs_linear"] = pct("comm_per_token")
    metrics["comm_weighted_reduction_vs_linear"] = pct("comm_weighted_per_token")
    if "straggler_latency" in metrics:
        metrics["straggler_improvement_vs_linear"] = pct("straggler_latency")
        metrics["p90_improvement_vs_linear"] = pct("straggler_p90")
    metrics["linear"] = {k: v for k, v in base.items() if not isinstance(v, list)}
