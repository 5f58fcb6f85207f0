"""Online re-planning: replay a load stream under a policy and count what re-planning costs.

A :class:`Stream` is a sequence of steps (per-step counts ``[L, T, E]``, or a token trace with
``step``); a policy (:data:`POLICIES`: ``static``, ``periodic``, ``threshold``,
``incremental``, ``auto``, and the hindsight ``oracle``) decides when to re-plan, on which
steps and how; :func:`replay` serves the stream step by step under the plan in service,
scored by the one scorer, and reports per-step MaxVio (and remote GPUs per token with
tokens), the slots and bytes each re-plan moves, and the totals. :func:`replay_frontier`
sweeps intervals and budgets (bytes moved against time-averaged MaxVio). The command line is
``moeopt replay``; the guide is "Re-planning online".
"""

from __future__ import annotations

from moeopt.replay.frontier import FrontierPoint, frontier_report, frontier_table, replay_frontier
from moeopt.replay.policies import (
    POLICIES,
    Auto,
    Incremental,
    Observation,
    Oracle,
    Periodic,
    Policy,
    Request,
    Schedule,
    Static,
    Threshold,
    make_policy,
    policy_names,
)
from moeopt.replay.run import Replan, ReplayResult, replay, runs_report
from moeopt.replay.stream import Stream, load_stream

__all__ = [
    "POLICIES",
    "Auto",
    "FrontierPoint",
    "Incremental",
    "Observation",
    "Oracle",
    "Periodic",
    "Policy",
    "Replan",
    "ReplayResult",
    "Request",
    "Schedule",
    "Static",
    "Stream",
    "Threshold",
    "frontier_report",
    "frontier_table",
    "load_stream",
    "make_policy",
    "policy_names",
    "replay",
    "replay_frontier",
    "runs_report",
]
