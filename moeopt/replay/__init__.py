"""Online re-planning: replay a load stream under a policy and count what re-planning costs.

A [`Stream`][moeopt.replay.stream.Stream] is a sequence of steps (per-step counts ``[L, T, E]``, or a token trace with
``step``); a policy (`POLICIES`: ``static``, ``periodic``, ``threshold``,
``incremental``, ``auto``, and the hindsight ``oracle``) decides when to re-plan, on which
steps and how (``auto`` plans for a forecast of the coming steps,
[`forecast_loads`][moeopt.replay.forecast.forecast_loads]); [`replay`][moeopt.replay.run.replay] serves the stream step
by step under the plan in service, scored by the one scorer, and reports per-step MaxVio (and remote GPUs per token with
tokens), the slots and bytes each re-plan moves, and the totals.
[`replay_frontier`][moeopt.replay.frontier.replay_frontier] sweeps intervals and budgets (bytes moved against
time-averaged MaxVio); [`noise_floor`][moeopt.replay.floor.noise_floor] serves every step with a plan made on the other
steps of its block, the reference for what no plan that does not know a step's own noise can beat. The command line is
``moeopt replay``; the guide is "Re-planning online".
"""

from __future__ import annotations

from moeopt.replay.floor import NoiseFloor, noise_floor
from moeopt.replay.forecast import Forecast, forecast_loads
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
    "Forecast",
    "FrontierPoint",
    "NoiseFloor",
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
    "forecast_loads",
    "frontier_table",
    "load_stream",
    "make_policy",
    "noise_floor",
    "policy_names",
    "replay",
    "replay_frontier",
    "runs_report",
]
