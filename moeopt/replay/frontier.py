"""Bytes moved against time-averaged MaxVio, over intervals and budgets, per policy.

[`replay_frontier`][moeopt.replay.frontier.replay_frontier] replays one stream under each policy at each interval of a
grid (and, for the policies with a move budget, at each budget), every point with the same calibration
prefix (the largest interval unless given) and the same worst-window length, so that every
point scores the same steps. A point is on the Pareto set when no other point moves no more
bytes at no higher time-averaged MaxVio, one of the two strictly lower. ``replay --frontier``
prints [`frontier_table`][moeopt.replay.frontier.frontier_table] and writes
[`frontier_report`][moeopt.replay.frontier.frontier_report]; ``moeopt plot`` draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tabulate import tabulate

from moeopt.instance import Instance
from moeopt.replay.policies import make_policy, policy_fields
from moeopt.replay.run import replay
from moeopt.replay.stream import Stream

__all__ = ["FRONTIER_REPORT", "FrontierPoint", "frontier_report", "frontier_table", "replay_frontier"]

#: The ``report`` key of a replay frontier file (``moeopt plot`` recognises it).
FRONTIER_REPORT = "replay-frontier"


@dataclass
class FrontierPoint:
    """One replay of the grid: its setting and its totals."""

    policy: str
    interval: int
    budget: int | None
    maxvio_mean: float
    maxvio_worst: float
    maxvio_max: float
    replans: int
    moved_slots: int
    moved_bytes: int
    moved_slots_per_layer_per_replan: float
    comm_per_token_mean: float | None = None
    pareto: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mark_pareto(points: Sequence[FrontierPoint]) -> None:
    """Flag the points no other point dominates in (moved bytes, time-averaged MaxVio)."""
    for p in points:
        p.pareto = not any(
            q is not p
            and q.moved_bytes <= p.moved_bytes
            and q.maxvio_mean <= p.maxvio_mean
            and (q.moved_bytes < p.moved_bytes or q.maxvio_mean < p.maxvio_mean)
            for q in points
        )


def replay_frontier(
    instance: Instance,
    stream: Stream,
    policies: Sequence[str] = ("periodic", "incremental", "auto"),
    *,
    intervals: Sequence[int] = (1, 2, 4),
    budgets: Sequence[int] = (4, 8, 16),
    params: dict[str, dict[str, Any]] | None = None,
    calibration: int | None = None,
    seed: int | None = None,
    workers: int | None = None,
    ray: str | bool | None = None,
    quiet: bool = True,
) -> list[FrontierPoint]:
    """Replay ``stream`` under each policy at each interval (and each budget, for policies with one).

    Parameters
    ----------
    instance, stream
        As in [`moeopt.replay.replay`][moeopt.replay.run.replay].
    policies
        Policy names.
    intervals
        Steps between decisions; each policy's ``window`` follows its interval unless ``params``
        sets it.
    budgets
        Moved slots per layer per re-plan, for the policies with a ``budget``.
    params
        Further parameters per policy name (e.g. ``{"periodic": {"planner": "eplb"}}``).
    calibration
        The calibration prefix of every point (default: the largest interval).
    seed, workers, ray, quiet
        As in [`moeopt.replay.replay`][moeopt.replay.run.replay].

    Returns
    -------
    list of FrontierPoint
        In the order policy, interval, budget; Pareto points flagged.
    """
    params = params or {}
    calib = calibration or max(intervals)
    points: list[FrontierPoint] = []
    block = stream.window_steps or max(intervals)
    for name in policies:
        make_policy(name)  # an unknown name: the one-line error listing the policies
        accepted = policy_fields(name)
        base = dict(params.get(name, {}))
        if "calibration" in accepted:
            base.setdefault("calibration", calib)
        sweep: list[int | None] = list(budgets) if "budget" in accepted and "budget_bytes" not in base else [None]
        for interval in intervals:
            for budget in sweep:
                given = {**base, "interval": interval}
                if budget is not None:
                    given["budget"] = budget
                policy = make_policy(name, **given)
                result = replay(
                    instance,
                    stream,
                    policy,
                    seed=seed,
                    workers=workers,
                    ray=ray,
                    quiet=quiet,
                    worst_window=block,
                )
                m = result.metrics
                points.append(
                    FrontierPoint(
                        policy=name,
                        interval=int(interval),
                        budget=getattr(result.policy, "budget", None),
                        maxvio_mean=m["maxvio_mean"],
                        maxvio_worst=m["maxvio_worst"],
                        maxvio_max=m["maxvio_max"],
                        replans=m["replans"],
                        moved_slots=m["moved_slots"],
                        moved_bytes=m["moved_bytes"],
                        moved_slots_per_layer_per_replan=m["moved_slots_per_layer_per_replan"],
                        comm_per_token_mean=m.get("comm_per_token_mean"),
                    )
                )
    mark_pareto(points)
    return points


def frontier_table(points: Sequence[FrontierPoint]) -> str:
    """One row per point: policy, interval, budget, MaxVio (mean, worst window), re-plans, moves, GB."""
    rows = [
        [
            p.policy,
            p.interval,
            "-" if p.budget is None else p.budget,
            f"{p.maxvio_mean:.4f}",
            f"{p.maxvio_worst:.4f}",
            p.replans,
            f"{p.moved_slots_per_layer_per_replan:.1f}",
            f"{p.moved_bytes / 1e9:.3f}",
            "*" if p.pareto else "",
        ]
        for p in points
    ]
    headers = [
        "policy",
        "interval",
        "budget / layer",
        "MaxVio (time avg)",
        "worst window",
        "re-plans",
        "moved slots / layer / re-plan",
        "moved GB",
        "Pareto",
    ]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def frontier_report(points: Sequence[FrontierPoint], instance: Instance, stream: Stream) -> dict[str, Any]:
    """The frontier as a JSON object (``report: replay-frontier``)."""
    return {
        "report": FRONTIER_REPORT,
        "instance": instance.name,
        "stream": stream.summary(),
        "expert_bytes": instance.model.expert_size,
        "points": [p.to_json() for p in points],
    }
