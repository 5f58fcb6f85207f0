"""``auto``: the default method when an instance names none: ``joint`` on a token trace,
``balance`` on count-only workloads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moeopt import console
from moeopt.joint.costs import MAX_GPUS
from moeopt.methods.balance import balance_bound_hook
from moeopt.methods.joint import JointParams, unplannable
from moeopt.registry import Context, Problem, get_method, parse_params, register
from moeopt.result import Result


@dataclass
class AutoParams:
    """``auto`` takes no parameters of its own: it runs ``joint`` or ``balance`` with theirs."""


@register
class Auto:
    """The default when an instance names no method: ``joint`` on a token trace (communication
    and balance; hierarchical from 64 GPUs on several nodes, and made for SGLang's ``even``
    rule where neither the engine's rule nor the locality routing can plan the cluster),
    ``balance`` on count-only workloads (balance alone: communication needs tokens). The result
    is the chosen method's, under its name."""

    name: ClassVar[str] = "auto"
    summary: ClassVar[str] = "the default: joint on token traces, balance on count-only workloads"
    requires: ClassVar[frozenset[str]] = frozenset()
    Params: ClassVar[type] = AutoParams
    layerwise: ClassVar[bool] = False
    #: balance's bound hook: it adds metrics to even-dispatch plans only, so joint's plans
    #: (guard or lp dispatch) score the same as under joint's own (empty) hooks
    metric_hooks: ClassVar[tuple] = (balance_bound_hook,)

    def available(self) -> bool:
        return True

    def choose(self, problem: Problem) -> str:
        if problem.trace is not None and problem.stats.has_coactivation:
            return "joint"
        return "balance"

    def joint_params(self, problem: Problem) -> tuple[dict, str | None]:
        """``joint``'s parameters for this cluster and why they are not its defaults: ``{}``, or
        ``dispatch: even`` (SGLang's default rule, planned at any size) when the defaults
        (the locality routing, on GPUs or on nodes) cannot plan the cluster."""
        if unplannable(problem, JointParams().resolved(problem)) is None:
            return {}, None
        c = problem.instance.cluster
        return {"dispatch": "even"}, (
            f"auto: the locality routing plans at most {MAX_GPUS} GPUs (or {MAX_GPUS} nodes) per layer, this "
            f"cluster has {c.gpus} GPUs in {c.nodes} node(s): joint planned for SGLang's even rule "
            "(name the engine with cluster.engine to plan for its own rule)"
        )

    def solve(self, problem: Problem, params: AutoParams, ctx: Context) -> Result:
        name = self.choose(problem)
        impl = get_method(name)
        given, why = self.joint_params(problem) if name == "joint" else ({}, None)
        result = impl.solve(problem, parse_params(impl, given), ctx)
        stats = {**result.stats, "chosen_by": self.name}
        if why is not None:
            stats["note"] = f"{stats['note']}; {why}" if stats.get("note") else why
            console.note(f"note: {why}")
        return result.replace(stats=stats)
