"""Baselines of SPEC section 6: linear, round_robin, random, token-balanced greedy (+ hottest replication).

``linear`` and ``round_robin`` are vLLM's two expert placement strategies
(``--expert-placement-strategy``; ``determine_expert_map`` in vLLM's
``fused_moe/expert_map_manager.py``): ``linear``, the default, gives every rank a contiguous
block of experts; ``round_robin`` gives rank ``r`` the experts ``r, r + G, r + 2G, ...``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from moeopt import console
from moeopt.errors import InputError
from moeopt.evaluate import evaluate, linear_plan
from moeopt.packing import balanced_homes
from moeopt.plan import Dispatch, Plan
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status
from moeopt.utilization import straggler_bound_hook


def calibration_maxvio(plan: Plan, problem: Problem) -> float:
    """Mean over layers of MaxVio on the calibration workload (the trace when there is one,
    else the counts) under the plan's own dispatch."""
    workload = problem.trace if problem.trace is not None else problem.stats
    return float(evaluate(plan, workload, problem.instance.cluster)["maxvio"])


def baseline_result(
    name: str, plan: Plan, problem: Problem, params: object, t0: float, stats: dict | None = None
) -> Result:
    """A load-only method's result: its plan with the calibration MaxVio as objective."""
    return Result(
        method=name,
        status=Status.FEASIBLE,
        plan=plan,
        objective=calibration_maxvio(plan, problem),
        objective_name="maxvio",
        sense="min",
        wall_time=time.perf_counter() - t0,
        params=vars(params),
        stats=stats or {},
    )


@dataclass
class NoParams:
    """Parameters of a method that takes none."""


class Baseline:
    """Shared parts of the baselines: no requirements, always available, maxvio objective."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()
    Params: ClassVar[type] = NoParams
    #: solved layer by layer (moeopt.execute); the objective is a mean over layers
    combine: ClassVar[str] = "mean"
    uses_trace: ClassVar[bool] = True  # calibration_maxvio reads the trace when there is one
    uses_coactivation: ClassVar[bool] = False  # loads only: each layer's task ships no E x E matrix
    #: the instance's straggler lower bound (when it has a profile), to compare with GEM's
    metric_hooks: ClassVar[tuple] = (straggler_bound_hook,)

    def available(self) -> bool:
        return True

    def homes(self, problem: Problem, params: Any, ctx: Context) -> Plan:
        raise NotImplementedError

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result:
        t0 = time.perf_counter()
        return baseline_result(self.name, self.homes(problem, params, ctx), problem, params, t0)


@register
class Linear(Baseline):
    """vLLM's default contiguous mapping (``--expert-placement-strategy linear``).

    Expert ``e`` on GPU ``floor(e * G / E)``: GPU ``g`` holds a contiguous block of experts, in
    ascending order. When ``G`` divides ``E`` this is vLLM's map exactly (``E / G`` experts a
    rank); when it does not, both give every GPU ``floor(E / G)`` or ``ceil(E / G)`` experts,
    but vLLM gives the extra experts to the first ``E mod G`` ranks and this rule spreads them
    (6 experts on 4 GPUs: vLLM ``0 0 1 1 2 3``, here ``0 0 1 2 2 3``).
    """

    name: ClassVar[str] = "linear"
    summary: ClassVar[str] = "expert e on GPU floor(e*G/E) (vLLM's default, linear)"

    def homes(self, problem: Problem, params: object, ctx: Context) -> Plan:
        return problem.plan(linear_plan(problem.layers, problem.experts, problem.gpus).home)


def round_robin_homes(experts: int, gpus: int) -> np.ndarray:
    """vLLM's ``round_robin`` placement: expert ``e`` on GPU ``e mod G``.

    Rank ``r`` holds ``r, r + G, r + 2G, ...`` (local slots in that ascending order, as
    [`moeopt.plan.Plan.from_homes`][] lays out homes), so the first ``E mod G`` ranks hold
    ``ceil(E / G)`` experts and the others ``floor(E / G)``, as vLLM's ``determine_expert_map``
    counts them.

    Parameters
    ----------
    experts
        E, logical experts.
    gpus
        G, GPUs (vLLM's ``ep_size``).

    Returns
    -------
    numpy.ndarray
        int ``[E]``: the GPU of every expert.
    """
    return np.arange(experts, dtype=np.int64) % gpus


def round_robin_notes(problem: Problem) -> list[str]:
    """What differs from vLLM's own use of ``round_robin`` on this instance, one phrase each.

    vLLM (``determine_expert_placement_strategy``) keeps ``round_robin`` only for models with
    more than one expert group, with no redundant experts and without EPLB (and, with
    all-to-all kernels, only on the DeepEP low-latency or NIXL EP backends); otherwise it
    falls back to ``linear``.
    """
    notes = []
    groups = problem.instance.model.expert_groups
    if groups is None or groups <= 1:
        notes.append(
            "vLLM runs round_robin only for models with expert groups (model.expert_groups > 1) "
            "and falls back to linear for this one"
        )
    replicas = problem.instance.cluster.replica_slots_per_gpu
    if replicas:
        notes.append(f"vLLM's round_robin has no redundant experts: the {replicas} replica slot(s) per GPU stay empty")
    return notes


@register
class RoundRobin(Baseline):
    """vLLM's ``round_robin`` placement (``--expert-placement-strategy round_robin``).

    Expert ``e`` on GPU ``e mod G``, one copy each, replica slots empty: vLLM uses it only
    without redundant experts and without EPLB, and only for models with expert groups
    (DeepSeek-V3's ``n_group``), where it spreads every group over the GPUs; otherwise vLLM
    falls back to ``linear``. The plan is the round-robin map whatever the instance; the
    result's ``note`` (and a note on stderr) says when vLLM would not run it as given.
    """

    name: ClassVar[str] = "round_robin"
    summary: ClassVar[str] = "expert e on GPU e mod G (vLLM's round_robin; no replicas)"
    #: one plan for every layer, made at once: the note is said once
    layerwise: ClassVar[bool] = False

    def homes(self, problem: Problem, params: object, ctx: Context) -> Plan:
        home = round_robin_homes(problem.experts, problem.gpus)
        return problem.plan(np.tile(home, (problem.layers, 1)))

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result:
        t0 = time.perf_counter()
        plan = self.homes(problem, params, ctx)
        c = problem.instance.cluster
        stats: dict[str, Any] = {"empty_slots_per_layer": c.gpus * c.width - problem.experts}
        notes = round_robin_notes(problem)
        if notes:
            stats["note"] = "round_robin: " + "; ".join(notes)
            console.note(f"note: {stats['note']}")
        return baseline_result(self.name, plan, problem, params, t0, stats)


def random_homes(experts: int, gpus: int, slots: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random assignment of experts to GPU slots (capacity respected)."""
    slot_gpu = np.repeat(np.arange(gpus), slots)
    return rng.permutation(slot_gpu)[:experts] if slots * gpus >= experts else slot_gpu


@register
class Random(Baseline):
    """Seeded uniformly random placement within slot capacities."""

    name: ClassVar[str] = "random"
    summary: ClassVar[str] = "uniformly random slots (seeded)"

    def homes(self, problem: Problem, params: object, ctx: Context) -> Plan:
        rng = np.random.default_rng(ctx.seed)
        c = problem.instance.cluster
        return problem.plan(
            np.stack([random_homes(problem.experts, c.gpus, c.slots_per_gpu, rng) for _ in range(problem.layers)])
        )


def hottest_replicas(load: np.ndarray, home: np.ndarray, gpus: int, replica_slots: int, budget: int) -> np.ndarray:
    """EPLB-style replication: give the expert with the highest per-copy load one more copy,
    on the least-loaded GPU with a free replica slot that lacks it; repeat ``budget`` times.

    Returns int ``[R, 2]`` rows ``(expert, gpu)``.
    """
    E = len(load)
    holds = np.zeros((E, gpus), dtype=bool)
    holds[np.arange(E), home] = True
    ncopy = np.ones(E)
    free = np.full(gpus, replica_slots)
    gpu_load = np.bincount(home, weights=load, minlength=gpus).astype(np.float64)
    reps: list[tuple[int, int]] = []
    for _ in range(min(budget, gpus * replica_slots)):
        placed = False
        for e in np.argsort(-load / ncopy, kind="stable"):
            options = (free > 0) & ~holds[e]
            if not options.any():
                continue
            g = int(np.argmin(np.where(options, gpu_load, np.inf)))  # least loaded, lowest id on ties
            # the expert's load is re-split evenly over its copies
            gpu_load[holds[e]] += load[e] / (ncopy[e] + 1) - load[e] / ncopy[e]
            gpu_load[g] += load[e] / (ncopy[e] + 1)
            holds[e, g] = True
            ncopy[e] += 1
            free[g] -= 1
            reps.append((int(e), g))
            placed = True
            break
        if not placed:
            break
    return np.array(reps, dtype=np.int64).reshape(-1, 2)


@register
class Greedy(Baseline):
    """Token-balanced greedy packing on mean loads, optionally replicating the hottest experts."""

    name: ClassVar[str] = "greedy"
    summary: ClassVar[str] = "token-balanced LPT packing; replicate=true adds EPLB-style hottest replicas"

    @dataclass
    class Params:
        replicate: bool = False
        replicas: int | None = None  # per layer; default: every replica slot
        dispatch: str = "even"  # how tokens split over copies: even, static, lp, locality

        def __post_init__(self) -> None:
            Dispatch(kind=self.dispatch)  # one-line error for an unknown kind
            if self.replicas is not None and self.replicas < 0:
                raise ValueError(f"replicas must be >= 0, got {self.replicas}")

    def homes(self, problem: Problem, params: Params, ctx: Context) -> Plan:
        c = problem.instance.cluster
        loads = problem.stats.expert_load
        home = np.stack([balanced_homes(loads[l], c.gpus, c.slots_per_gpu) for l in range(problem.layers)])
        reps: tuple[np.ndarray, ...] = ()
        most = c.gpus * c.replica_slots_per_gpu  # the redundant slots of a layer
        if params.replicas is not None and params.replicas > most:
            src = str(problem.instance.source) if problem.instance.source else None
            raise InputError(
                src,
                "method.replicas",
                f"expected at most {most} copies per layer (cluster.gpus x replica_slots_per_gpu = "
                f"{c.gpus} x {c.replica_slots_per_gpu}), got {params.replicas}",
            )
        if params.replicate and c.replica_slots_per_gpu > 0:
            budget = most if params.replicas is None else params.replicas
            reps = tuple(
                hottest_replicas(loads[l], home[l], c.gpus, c.replica_slots_per_gpu, budget)
                for l in ctx.layers(problem.layers, "greedy")
            )
        return problem.plan(home, reps, Dispatch(kind=params.dispatch))
