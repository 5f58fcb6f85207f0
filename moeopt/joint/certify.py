"""`joint`'s certificate: a lower bound on the calibration remote GPUs per token of every plan
with the instance's slots, per layer on the layer's executor (`bound_layer`), through the
covering bounds of `moeopt.colgen.cover`; ``crosslayer`` shares it under ``previous-layer``
homes. Budgets in work (``bound_rounds``), wall time only an outer cap that is reported.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from moeopt import execute
from moeopt.budget import Budget
from moeopt.errors import InputError

if TYPE_CHECKING:
    from moeopt.methods.joint import JointParams
    from moeopt.registry import Context, Problem
    from moeopt.trace import Trace


def certificate(
    problem: Problem,
    slots: np.ndarray,
    params: JointParams,
    ctx: Context,
    eps: np.ndarray | None = None,
    maxvio: list[float] | None = None,
) -> tuple[float, dict] | None:
    """A lower bound on the calibration remote GPUs per token (mean over layers) of every plan,
    and its per-layer figures (`moeopt.colgen.cover.distinct_lower_bound` on each layer's
    whole calibration trace, seeded with the plan's GPUs); None when ``bound_time`` is 0 or the
    rule has no certificate (`certifies`).

    Without spare slots (``G W = E``: every plan holds each expert once) and with the planner's
    per-layer load limits ``eps`` (MaxVio), the bound is for every plan within them
    (`load_limits`: each layer's limit, or the plan's own MaxVio where that is over it),
    far tighter than over every plan: two hot experts cannot share a GPU. With a few spare slots
    (layers that `moeopt.colgen.copies.applies` to) and the plan's own calibration MaxVio
    ``maxvio`` under its dispatch, per layer, it is for every plan with copies within the limit
    (the flagged covering LP, `moeopt.colgen.copies`).

    Under uniform token homes the evaluator counts ``distinct (1 - 1/G)`` remote GPUs per token
    (the expectation over the home); with known homes (``trace`` homes, ``previous-layer``) a
    home saves at most one GPU: ``distinct - 1``, and under ``previous-layer`` homes only for the
    share of tokens `moeopt.colgen.cover.stay_upper_bound` allows.

    Bounded by work (``bound_rounds``, LP iterations); the cap is ``bound_time`` and the layer's
    share of what is left of the run's budget (`certificate_cap`)."""
    if not certifies(problem, params):
        return None
    trace = _need_trace(problem, "joint")
    c = problem.instance.cluster
    uniform = getattr(c, "token_home", "uniform") == "uniform" and trace.home is None
    previous = getattr(c, "token_home", "uniform") == "previous-layer"
    # most of what is left of the run's budget (the scoring of the plan follows)
    limit = certificate_cap(ctx.budget.child(0.8), problem.layers, params.bound_time, previous)
    within = None if eps is None else load_limits(problem, slots, eps, maxvio)
    lower, stats = layer_certificates(
        problem,
        slots,
        limit,
        [uniform] * problem.layers,
        ctx,
        "joint",
        previous,
        loads=None if within is None else within[0],
        load_limits=None if within is None else within[1],
        rounds=params.bound_rounds,
        copies=within is not None and not single_copy_only(problem),
    )
    stats["bound_token_homes"] = "uniform" if uniform else "known"
    if within is not None:
        stats["bound_maxvio_limit_per_layer"] = within[2]
    return float(np.mean(lower)), stats


def load_limits(
    problem: Problem, slots: np.ndarray, eps: np.ndarray, plan_maxvio: list[float] | None = None
) -> tuple[list[np.ndarray], list[float | None], list[float]] | None:
    """The knowledge that makes the certificate a bound for every plan within a load limit: per
    layer, the experts' calibration loads (shares), the largest GPU load ``(1 + m_l) / G`` and
    ``m_l``, the MaxVio covered: the planner's ``eps[l]``, or the plan's own MaxVio where that is
    over it (the plan must be one of the plans the bound covers).

    Where no plan can hold a second copy of an expert (``G W = E``) a GPU's load is the sum of
    its experts', whatever the dispatch, and the plan's own MaxVio is that of its slots. With a
    few spare slots (`moeopt.colgen.copies.applies`) it is ``plan_maxvio[l]``, the plan's
    calibration MaxVio under its dispatch (the flagged LP covers every dispatch within the
    limit). None elsewhere (more spare slots, or no ``plan_maxvio``) or without calibration load."""
    from moeopt.balance.loads import maxvio
    from moeopt.colgen.copies import applies

    c = problem.instance.cluster
    single = single_copy_only(problem)
    if not single and (plan_maxvio is None or not applies(problem.experts, c.gpus, c.width)):
        return None
    loads: list[np.ndarray] = []
    limits: list[float | None] = []
    covered: list[float] = []
    for l in range(problem.layers):
        u = np.asarray(problem.stats.expert_load[l], dtype=np.float64)
        if not u.sum() > 0:
            return None
        share = u / u.sum()
        own = float(maxvio(slots[l], share)) if single else float(plan_maxvio[l])  # type: ignore[index]
        m = max(float(eps[l]), own)
        loads.append(share)
        limits.append((1.0 + m) / c.gpus)
        covered.append(m)
    return loads, limits, covered


def certifies(problem: Problem, params: JointParams) -> bool:
    """Whether `joint` reports a certificate: unless ``bound_time`` is 0, and under SGLang's
    ``static`` and vLLM-Ascend's rules only without spare slots: with copies a token's own GPU
    may serve an expert that another copy also holds, which the distinct-GPU bound does not see;
    with one copy of each expert every rule sends it there and a token from a uniform home
    uses ``distinct (1 - 1/G)`` remote GPUs, as under any other rule."""
    if params.bound_time == 0:
        return False
    return params.engine_rule not in ("static", "ascend") or single_copy_only(problem)


def single_copy_only(problem: Problem) -> bool:
    """Whether the slots hold each expert exactly once in every plan (``G W = E``: no spare slot)."""
    return problem.instance.cluster.physical_slots == problem.experts


def certificate_cap(budget: Budget, layers: int, bound_time: float | None, previous_layer: bool) -> float | None:
    """The certificate's outer wall-clock cap per layer: ``bound_time`` (None: none) and, under a
    time limit, each layer's share of what is left of ``budget`` (halved with ``previous_layer``
    homes: the stay LP gets as much again); None: no cap (the work budgets alone bound it)."""
    if not budget.limited:
        return bound_time
    share = budget.remaining() / (layers * (2 if previous_layer else 1))
    return max(share if bound_time is None else min(bound_time, share), 0.05)


def layer_certificates(
    problem: Problem,
    slots: np.ndarray,
    limit: float | None,
    uniform: list[bool],
    ctx: Context,
    name: str,
    previous_layer: bool = False,
    loads: list[np.ndarray] | None = None,
    load_limits: list[float | None] | None = None,
    rounds: int | None = None,
    copies: bool = False,
) -> tuple[list[float], dict]:
    """Per layer, a lower bound on the calibration remote GPUs per token of every plan: the
    bound on distinct GPUs per token of `bound_layer` (``rounds`` of column generation,
    capped at ``limit`` seconds, seeded with ``slots[l]``; the stay LP gets as many again) times
    ``1 - 1/G`` where the layer's token
    homes are ``uniform``, else less the share of tokens that can stay (1; with
    ``previous_layer`` homes, at layers >= 1, the bound of
    `moeopt.colgen.cover.stay_upper_bound`; `moeopt.colgen.cover.remote_lower_bound`).
    With ``loads`` and ``load_limits`` (per layer), the bound holds for every single-copy plan
    within those limits (tighter; see `moeopt.colgen.cover.distinct_lower_bound`), and with
    ``copies`` for every plan with copies within them (`moeopt.colgen.copies.copies_lower_bound`,
    a few spare slots: `load_limits`). Independent per layer: on the run's
    executor (--workers, Ray) when there is one. Returns the bounds and the per-layer stats."""
    from moeopt.colgen.cover import remote_lower_bound, stay_upper_bound

    trace = _need_trace(problem, name)
    c = problem.instance.cluster
    items = [
        (
            trace.topk[:, l],
            problem.experts,
            c.gpus,
            c.width,
            limit,
            slots[l],
            ctx.seed,
            None if loads is None else loads[l],
            None if load_limits is None else load_limits[l],
            rounds,
            copies,
        )
        for l in range(problem.layers)
    ]
    stays_too = previous_layer and not all(uniform[1:])
    # under a time limit, serially: the certificate's whole time, and the longest layer so far (a
    # layer's LPs take some time to set up whatever their cap): a layer that would not fit gets the
    # trivial bound (every token uses at least one GPU), so that the limit is kept (and it says so)
    end = None if limit is None else time.perf_counter() + limit * problem.layers * (2 if stays_too else 1)
    serial = ctx.executor is None or getattr(ctx.executor, "kind", "serial") == "serial"
    if end is None or not serial:
        found = execute.map_items(bound_layer, items, ctx.executor)
    else:
        found, took = [], 0.0
        for item in items:
            began = time.perf_counter()
            if found and end - began < took * (2 if stays_too else 1):
                found.append((1.0, 0.0, False, False, True, "trivial"))  # no time for it: the trivial bound
                continue
            found.append(bound_layer(*item))
            took = max(took, time.perf_counter() - began)

    def within(l: int) -> tuple[tuple[np.ndarray, np.ndarray] | None, tuple[float, float] | None]:
        """Layers l - 1 and l's loads and limits when both bounds held within them (single copy:
        the stay LP's rows within a limit are for single-copy plans, not for ``copies``)."""
        if copies or loads is None or load_limits is None or not (found[l][3] and found[l - 1][3]):
            return None, None
        a, b = load_limits[l - 1], load_limits[l]
        return (None, None) if a is None or b is None else ((loads[l - 1], loads[l]), (a, b))

    stay_reports: list[dict] = [{} for _ in range(problem.layers)]
    stays: list[float] = []
    took = 0.0
    for l in range(problem.layers):
        if not (previous_layer and l > 0 and not uniform[l]):
            stays.append(1.0)
            continue
        began = time.perf_counter()
        if end is not None and took > 0 and end - began < took:  # no time for it: every token may stay
            stays.append(1.0)
            stay_reports[l]["capped"] = True
            continue
        stays.append(
            stay_upper_bound(
                trace.topk[:, l - 1, 0],
                trace.topk[:, l],
                problem.experts,
                c.gpus,
                c.width,
                *within(l),
                limit,
                report=stay_reports[l],
            )
        )
        took = max(took, time.perf_counter() - began)
    lower = [remote_lower_bound(d, c.gpus, uniform[l], stays[l]) for l, (d, *_) in enumerate(found)]
    capped = [bool(f[4]) or bool(r.get("capped")) for f, r in zip(found, stay_reports, strict=True)]
    for l, (d, sec, ok, limited, *_) in enumerate(found):
        ctx.say(
            f"{name} layer {l}: communication lower bound {lower[l]:.4f} remote GPUs per token "
            f"(distinct GPUs >= {d:.4f}{' within the load limit' if limited else ''}, "
            f"LP {'solved' if ok else 'not solved'}), {sec:.2f} s"
        )
    return lower, {
        "communication_lower_bound_per_layer": lower,
        "distinct_lower_bound_per_layer": [d for d, *_ in found],
        "bound_seconds_per_layer": [f[1] for f in found],
        "bound_lp_solved_per_layer": [f[2] for f in found],
        "bound_load_limited_per_layer": [f[3] for f in found],
        "bound_kind_per_layer": [f[5] for f in found],
        "stay_upper_bound_per_layer": stays,
        "bound_rounds": rounds,
        "bound_capped_layers": sum(capped),
    }


def bound_layer(
    topk: np.ndarray,
    experts: int,
    gpus: int,
    width: int,
    limit: float | None,
    start: np.ndarray,
    seed: int,
    load: np.ndarray | None = None,
    load_limit: float | None = None,
    rounds: int | None = None,
    copies: bool = False,
) -> tuple[float, float, bool, bool, bool, str]:
    """One layer's certificate (`moeopt.colgen.cover.distinct_lower_bound`, ``rounds`` of
    column generation, ``limit`` seconds an outer cap): the bound on its distinct GPUs per token,
    the seconds taken, whether the LP was solved, whether the bound holds only within the load
    limit, whether the cap stopped it and which relaxation gave it (``colgen``, ``pair``, ``sdp``,
    ``trivial``: `moeopt.colgen.cover.JointBound`'s ``gen_kind``; ``flagged``).

    With ``load``, ``load_limit`` and ``copies`` (spare slots), the flagged LP
    (`moeopt.colgen.copies.copies_lower_bound`, for every plan with copies within the limit)
    first, then the bound over every plan in the time left; the larger is the layer's."""
    from moeopt.colgen.copies import copies_lower_bound
    from moeopt.colgen.cover import distinct_lower_bound

    began = time.perf_counter()
    flagged = None
    if copies and load is not None and load_limit is not None:
        # spare slots: every plan with copies within the limit (the flagged LP), first
        flagged = copies_lower_bound(topk, experts, gpus, width, load, load_limit, start, time_limit=limit)
        load = load_limit = None  # ... and the bound over every plan beside it
        if limit is not None:
            limit = max(limit - (time.perf_counter() - began), 0.05)
    b = distinct_lower_bound(
        topk,
        experts,
        gpus,
        width,
        time_limit=limit,
        rounds=rounds,
        start_slots=start,
        seed=seed,
        load=load,
        load_limit=load_limit,
    )
    info = b.info
    kind = str(info.get("gen_kind", "trivial"))
    distinct, proven, limited, capped = float(b.distinct), bool(b.proven), bool(info.get("load_limited")), False
    if flagged is not None:
        capped = bool(flagged.info.get("capped"))
        if flagged.distinct > distinct:
            distinct, proven, limited, kind = float(flagged.distinct), flagged.proven, True, "flagged"
    return (
        distinct,
        time.perf_counter() - began,
        proven,
        limited,
        bool(info.get("capped")) or capped,
        kind,
    )


def _need_trace(problem: Problem, name: str) -> Trace:
    """The problem's token trace, or a one-line error naming the method that needs it."""
    if problem.trace is None:
        src = str(problem.instance.source) if problem.instance.source else None
        raise InputError(
            src, "workload.calibration", f"method {name!r} needs a token trace; this workload is count-only"
        )
    return problem.trace
