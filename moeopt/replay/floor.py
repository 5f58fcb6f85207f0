"""The noise floor of a stream: what a plan that knew the traffic, but not each step's own
noise, reaches on every step (SPEC section 12).

A step's MaxVio has two parts: the plan's mismatch with the traffic (what re-planning can
remove) and the step's own sampling noise (a batch of tokens, bursts of some experts), which
no plan made before the step can remove. [`noise_floor`][moeopt.replay.floor.noise_floor] measures the second part with
a held-out reference: every scored step is served by a plan made on the pooled counts of the
*other* steps of its block of ``interval`` steps (leave one step out). That plan knows the
block's traffic (its mix, its drift), never the step itself. A causal policy that reaches the
floor's time average would plan as well as one that knew the window in advance. The floor is a
measured reference, not a bound: a target below it lies below what planning on the rest of the
window reaches (on the bundled synthetic streams, planning robustly over those steps one by
one instead of on their pooled counts does slightly worse). On a token trace whose tokens carry
their task family and whose mix moves over the block ([`moeopt.replay.mix`][]), the plan is
made robustly over the other steps' pooled counts and each family's load on them, as ``auto``
plans: a floor that a family-aware plan goes below would not be one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from moeopt.errors import InputError, MoeoptError
from moeopt.instance import Instance
from moeopt.io import resolve_profile
from moeopt.plan import Plan
from moeopt.registry import get_method
from moeopt.replay.mix import family_snapshots
from moeopt.replay.run import ReplayResult, score_steps, worst_window_of
from moeopt.replay.stream import Stream
from moeopt.scoring import Workloads
from moeopt.solve import solve
from moeopt.trace import stats_from_counts

__all__ = ["NoiseFloor", "noise_floor"]


def _others_stats(stream: Stream, others: np.ndarray, b0: int, b1: int, t: int) -> tuple[Any, dict[str, Any]]:
    """The statistics step ``t`` is planned on: the pooled counts of the other steps of its
    block ``b0 .. b1 - 1`` and, on a labelled trace whose mix moves over them, each family's
    load on them as robust snapshots ([`family_snapshots`][moeopt.replay.mix.family_snapshots]),
    with the planner parameters that plan for them."""
    pooled = others.sum(axis=1)
    top_k = int(stream.top_k)
    tr = stream.trace
    if tr is not None and len(tr.family_names) > 1 and b1 - b0 > 1:
        block = stream.trace_window(b0, b1)
        base = others.mean(axis=1, keepdims=True)
        snaps = family_snapshots(block.subset(block.step != t - b0), base)
        if snaps is not None:
            stats = stats_from_counts(snaps.mean(axis=1), top_k=top_k, step_counts=snaps)
            return stats, {"robust": "mean", "robust_steps": 0}
    return stats_from_counts(pooled, top_k=top_k), {}


@dataclass(frozen=True)
class NoiseFloor:
    """The noise-floor reference as a report's ``policy``: every scored step served by a plan
    made on the pooled counts of the other steps of its block (not a policy an engine can run)."""

    interval: int
    calibration: int
    planner: str = "balance"
    planner_params: dict[str, Any] | None = None
    seed: int = 0

    name: ClassVar[str] = "noise floor"

    def to_json(self) -> dict[str, Any]:
        """``name`` and every parameter."""
        return {
            "name": self.name,
            "interval": self.interval,
            "calibration": self.calibration,
            "planner": self.planner,
            "planner_params": dict(self.planner_params or {}),
            "seed": self.seed,
        }


def noise_floor(
    instance: Instance,
    stream: Stream,
    interval: int,
    *,
    calibration: int | None = None,
    planner: str = "balance",
    planner_params: dict[str, Any] | None = None,
    seed: int = 0,
    worst_window: int | None = None,
) -> ReplayResult:
    """Serve every scored step with a plan made on the other steps of its block (leave one out).

    Parameters
    ----------
    instance
        The instance.
    stream
        The stream (only its counts are read: the plans are made on pooled counts).
    interval
        Steps per block (``>= 2``): blocks start at ``calibration`` as the replay's intervals
        and the oracle's blocks do.
    calibration
        The first scored step (default: ``interval``), as for the policies beside it.
    planner, planner_params
        A registered planner that plans on counts (default ``balance``).
    seed
        Every plan's seed.
    worst_window
        Steps per window of the worst-window MaxVio (default: ``interval``).

    Returns
    -------
    ReplayResult
        Per scored step the MaxVio of its leave-one-out plan (``plans``: one per step; no
        re-plans are counted: the reference moves what it moves).

    Raises
    ------
    InputError
        ``interval`` below 2, a stream too short, or a planner that needs tokens.
    """
    if isinstance(interval, bool) or not isinstance(interval, (int, np.integer)) or interval < 2:
        raise InputError(
            stream.source, "interval", f"the noise floor needs blocks of 2 steps or more, got {interval!r}"
        )
    C = int(calibration or interval)
    T = stream.steps
    stream.check(instance)
    stream.require_steps(C + 1, f"the calibration prefix ({C} steps) and one step to serve")
    if "coactivation" in get_method(planner).requires:
        raise InputError(None, "planner", f"the noise floor plans on counts; {planner!r} needs tokens")
    params = dict(planner_params or {})
    profile = resolve_profile(instance)
    mv = np.zeros(T - C)
    plans: list[Plan] = []
    for b0 in range(C, T, int(interval)):
        b1 = min(b0 + int(interval), T)
        block = stream.counts(b0, b1)
        for t in range(b0, b1):
            others = np.delete(block, t - b0, axis=1)
            if others.shape[1] == 0:  # a last block of one step: its neighbours before it
                others = stream.counts(max(0, t - int(interval) + 1), t)
            stats, robust = _others_stats(stream, others, b0, b1, t)
            result = solve(
                instance,
                method=planner,
                params={**params, **robust},
                seed=seed,
                quiet=True,
                workloads=Workloads(stats, stats, stats, profile),
            )
            if result.plan is None:
                raise MoeoptError(f"noise floor: {planner} found no plan for step {t}")
            plans.append(result.plan)
            mv[t - C] = score_steps(instance, stream, result.plan, t, t + 1)[0][0]
    policy = NoiseFloor(int(interval), C, planner, params, seed)
    block_steps, basis = worst_window_of(stream, policy, worst_window)
    return ReplayResult(
        policy=policy,
        stream=stream,
        steps=np.arange(C, T),
        maxvio=mv,
        plan_of_step=np.arange(T - C),
        plans=plans,
        replans=[],
        comm=None,
        step_tokens=None,
        expert_size=instance.model.expert_size,
        worst_window=block_steps,
        worst_basis=basis,
        slots_per_layer=instance.cluster.gpus * instance.cluster.width,
        instance_name=instance.name,
    )
