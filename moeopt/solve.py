"""One entry point: load an instance's workloads, run a method, check and evaluate its plan."""

from __future__ import annotations

import math
import time
from typing import Any

from moeopt import console, execute
from moeopt.errors import InputError, PlanError
from moeopt.instance import Instance
from moeopt.io import load_workload, resolve_profile
from moeopt.plan import DISPATCH_KINDS, Dispatch, Plan, engine_dispatch, rule_dispatch
from moeopt.registry import Context, Problem, get_method, method_names, param_fields, parse_params
from moeopt.relabel import relabel_gpus
from moeopt.result import Result
from moeopt.schema import check_homes
from moeopt.scoring import Workloads, add_relative_metrics, score, scoring_seconds
from moeopt.trace import Trace

__all__ = [
    "RUN_LIMITS",
    "Workloads",
    "add_relative_metrics",
    "check_requirements",
    "load_workloads",
    "run_limits",
    "scoring_reserve",
    "solve",
]

#: Keys of a ``method:`` mapping (or of ``params``) that set the run's time limits rather than a
#: method parameter: ``time_limit`` (seconds for the whole run) and ``layer_time_limit`` (per layer).
#: A method with a parameter of that name keeps it (``gem-milp``'s ``time_limit``).
RUN_LIMITS = ("time_limit", "layer_time_limit")


def run_limits(
    mapping: dict[str, Any] | None, source: str | None, prefix: str = "method.", method: str | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Split a ``method:`` mapping into the run's time limits and the method's own parameters.

    Parameters
    ----------
    mapping
        A ``method:`` mapping (its ``name`` already taken out) or the ``params`` of `solve`.
    source
        The file it was read from, for messages.
    prefix
        Put before a key in messages (``method.time_limit``).
    method
        The registered method the mapping is for: a parameter of its own named like a run limit
        stays its parameter.

    Returns
    -------
    tuple of dict
        The limits given (`RUN_LIMITS` keys, seconds) and every other key.

    Raises
    ------
    InputError
        Naming ``method.time_limit`` (or ``method.layer_time_limit``) for a value that is not
        a finite number of seconds > 0.
    """
    own = param_fields(get_method(method)) if method is not None and method in method_names() else {}
    limits: dict[str, float] = {}
    rest: dict[str, Any] = {}
    for key, value in (mapping or {}).items():
        if key not in RUN_LIMITS or key in own:
            rest[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise InputError(source, f"{prefix}{key}", f"expected a finite number of seconds > 0, found {value!r}")
        limits[key] = float(value)
    return limits, rest


def load_workloads(instance: Instance) -> Workloads:
    """The instance's workloads, loaded once: read from their files, drawn from their synthetic
    specs, or the arrays the in-memory constructors (`Instance.from_counts`, ...) hold.
    Without an evaluation workload plans are scored in sample, except on a synthetic workload
    (a fresh sample of it)."""
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
    for workload, source in ((calib, w.calibration), (evaluation, w.evaluation or w.calibration)):
        if isinstance(workload, Trace):  # token homes index the cluster's GPUs
            where = str(source.path) if source.path else None
            check_homes(workload.home, instance.cluster.gpus, where)
            if instance.cluster.token_home == "trace" and workload.home is None:
                if where is None and source.data is None:  # a synthetic workload
                    raise InputError(
                        str(instance.source) if instance.source else None,
                        "cluster.token_home",
                        "expected a trace with token homes for 'trace', found a synthetic workload (it has none)",
                    )
                raise InputError(where, "home", "expected token homes (cluster.token_home is 'trace'), found none")
    stats = calib.stats() if isinstance(calib, Trace) else calib
    return Workloads(calib, evaluation, stats, resolve_profile(instance))


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
    layer_time_limit: float | None = None,
    seed: int = 0,
    hint: Plan | None = None,
    quiet: bool = True,
    workloads: Workloads | None = None,
    dispatch: Dispatch | None = None,
    current: Plan | None = None,
    workers: int | None = None,
    ray: str | bool | None = None,
    relabel: bool = True,
) -> Result:
    """Solve ``instance`` with its method (or ``method``), check the plan, score it.

    Layers are solved one at a time (``moeopt.execute``), each seeded from ``seed`` and
    its index: in this process (``workers=1``), in ``workers`` local processes, or as Ray
    tasks (``ray``: a cluster address, or ``"local"`` / True for a local Ray started for the
    run), with the same plans in every case. None: the instance's ``executor:`` mapping,
    else serial.

    ``time_limit`` is seconds for the whole run (loading the workloads included) and
    ``layer_time_limit`` seconds per layer: each layer gets the smaller of its limit and its
    share of what is left of the total (``moeopt.budget.share``). None: the value of the
    same key in ``params``, else in the instance's ``method:`` mapping (unless the method has a
    parameter of that name), else no limit.

    ``params`` default to the instance's ``method:`` mapping; when ``method`` names another
    method, only the parameters that method accepts are kept. ``dispatch`` replaces the
    dispatch rule of the returned plan (default: the one the method chose). ``current`` is
    the plan running now, for migration-aware methods (``balance``). Under ``token_home:
    previous-layer`` every plan gets the free GPU relabeling of ``moeopt.relabel``
    (``relabel=False`` skips it). The metrics come
    from ``moeopt.scoring.score``, the same function ``evaluate`` uses on the plan file.
    """
    started = time.time()  # a total limit counts from here
    src = str(instance.source) if instance.source else None
    own_limits, own_params = run_limits(instance.method.params, src, method=instance.method.name)
    given = method or instance.method.name
    given_limits, params = run_limits(params, src, method=given) if params is not None else ({}, None)
    limits = {**own_limits, **given_limits}
    explicit = {k: v for k, v in (("time_limit", time_limit), ("layer_time_limit", layer_time_limit)) if v is not None}
    limits.update(run_limits(explicit, None, prefix="")[0])  # checked as the instance's are
    time_limit, layer_time_limit = limits.get("time_limit"), limits.get("layer_time_limit")
    name = method or instance.method.name
    impl = get_method(name, source=src)
    executor = execute.resolve(instance, workers, ray)
    if executor.kind == "ray":
        execute.import_ray()  # fail before loading anything
    if params is None:
        strict = name == instance.method.name
        params_obj = parse_params(impl, own_params, source=src, strict=strict)
    else:
        params_obj = parse_params(impl, params, source=src)
    if not impl.available():
        hint_line = getattr(impl, "install_hint", "missing package?")
        raise InputError(src, "method.name", f"method {name!r} is not available here ({hint_line})")
    wl = workloads or load_workloads(instance)
    problem = Problem(
        instance, wl.calibration_stats, wl.calibration if isinstance(wl.calibration, Trace) else None, wl.profile
    )
    check_requirements(impl, problem, src)
    if current is not None:
        if not getattr(impl, "migration_aware", False):
            raise InputError(src, "--from", f"method {name!r} does not re-plan from a current plan; use 'balance'")
        try:
            current.check(instance.cluster, layers=instance.model.layers, experts=instance.model.experts)
        except PlanError as exc:
            raise InputError(src, "--from", str(exc)) from None
        current = current.padded(instance.cluster.width)
    ctx = Context(time_limit=layer_time_limit, seed=seed, hint=hint, quiet=quiet, current=current)
    deadline = None if time_limit is None else started + time_limit  # loading the workloads counts too
    reserve = 0.0
    if deadline is not None:  # the scoring after the method is part of the run: keep its time free
        rule = dispatch or engine_dispatch(instance.model, instance.cluster) or _planned_rule(params_obj, instance)
        reserve = scoring_reserve(instance, wl, rule)
    t0 = time.perf_counter()
    note = console.note  # a note is shown even when progress is not (unless --quiet)
    profile_note = wl.profile.meta.get("note") if wl.profile is not None else None
    if profile_note:  # e.g. "profile: one GPU broadcast to 8 identical GPUs"
        note(f"note: {profile_note}")
    result = execute.run(
        impl, problem, params_obj, ctx, executor, note=note, deadline=None if deadline is None else deadline - reserve
    )
    for line in console.result_notes(result.stats, result.method):  # what to act on, not only in the report
        note(line)
    wall = time.perf_counter() - t0
    if profile_note:
        result = result.replace(stats={**result.stats, "profile": profile_note})
    if result.plan is None:
        return result.replace(wall_time=wall, instance=instance.name)
    plan = result.plan if dispatch is None else result.plan.with_dispatch(dispatch)
    engine_rule = engine_dispatch(instance.model, instance.cluster)
    rule_note = None
    if dispatch is None and engine_rule is not None and plan.dispatch != engine_rule:
        # the plan runs under the engine's rule, whatever its method assumed: score it so
        if plan.dispatch.kind != engine_rule.kind:  # not merely another dense-row count
            rule_note = (
                f"note: {name} planned for dispatch {plan.dispatch.kind!r}; scored under {engine_rule.kind!r}, "
                f"the rule {instance.cluster.engine} runs (cluster.engine)"
            )
            note(rule_note)
        plan = plan.with_dispatch(engine_rule)
    own = not getattr(impl, "emits_colocated", False)
    try:  # a re-plan may keep the colocated copies the engine's plan has (EPLB emits them), add none
        plan.check(
            instance.cluster, layers=instance.model.layers, experts=instance.model.experts, own=own, kept=current
        )
    except PlanError as exc:  # a method returning an infeasible plan is a bug, not bad input
        raise RuntimeError(f"method {name!r} returned an infeasible plan: {exc}") from exc
    stats = result.stats
    if relabel and instance.cluster.token_home == "previous-layer" and isinstance(wl.calibration, Trace):
        # tokens stay where their last expert ran: renumbering each layer's GPUs is free
        plan, info = relabel_gpus(plan, wl.calibration, instance.cluster, wl.profile)
        stats = {**stats, "relabel": info}
    metrics = score(plan, instance, wl, hooks=getattr(impl, "metric_hooks", ()), params=result.params)
    if rule_note:
        stats = {**stats, "engine_rule": rule_note.removeprefix("note: ")}
    if time_limit is not None:  # under a total limit the overrun is the whole run's, the scoring included
        over = time.time() - started - time_limit
        stats = {k: v for k, v in stats.items() if k != "time_limit_exceeded_s"}
        if over > 0:
            stats["time_limit_exceeded_s"] = round(over, 3)
    return result.replace(plan=plan, metrics=metrics, wall_time=wall, stats=stats, instance=instance.name)


#: the scoring reserve's margin over its measurement
RESERVE_MARGIN = 1.1


def _planned_rule(params: Any, instance: Instance) -> Dispatch:
    """The rule the method's plan will most likely be scored under: its ``dispatch`` parameter
    when that names a rule, else the default (``even``)."""
    kind = getattr(params, "dispatch", None)
    return rule_dispatch(kind, instance.model) if kind in DISPATCH_KINDS else Dispatch()


def scoring_reserve(instance: Instance, workloads: Workloads, rule: Dispatch) -> float:
    """Seconds to keep free at the end of a time-limited run for scoring its plan: the plan
    under ``rule`` and the linear baseline on the evaluation workload, as
    [`moeopt.scoring.scoring_seconds`][] measures them, times `RESERVE_MARGIN`.

    Scoring takes seconds at scale (under SGLang's ``static`` rule at 256 GPUs, each rank's
    seeded table and the expectation over the token homes: about half a second per layer) after
    the method has used its time.
    """
    try:
        seconds = scoring_seconds(instance, workloads.evaluation, rule, baseline=True)
    except (PlanError, InputError, ValueError):  # a shape the probe cannot take: the plan's own scoring will say
        return 0.0
    return seconds * RESERVE_MARGIN
