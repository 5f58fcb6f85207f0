"""The replay loop: serve a stream step by step under a policy, re-plan, count what it costs.

[`replay`][moeopt.replay.run.replay] plans the first plan on the first ``calibration`` steps, then serves the steps
after them in order. Every step is scored under the plan in service and its dispatch rule by
the one scorer's functions ([`moeopt.dispatch.count_loads`][] on counts,
[`moeopt.dispatch.route_trace`][] and `moeopt.evaluate.communication` on tokens,
[`moeopt.evaluate.maxvio`][]), a whole segment (the steps one plan serves) at a time. At
each of the policy's decision points the policy ([`Schedule`][moeopt.replay.policies.Schedule])
sees the MaxVio served so far and may ask for a re-plan, which [`moeopt.solve.solve`][]
makes with a registered planner on a window of the stream (count-only statistics of its
steps, or its tokens for trace planners), from the plan in service or not; the new plan
serves from its effective step (``lag``).

Per step: MaxVio (mean over layers of max/mean - 1 of that step's GPU loads; the MaxVio
``evaluate`` gives the plan on that step alone) and, with tokens, remote GPUs per token per
layer. Per re-plan: moved slots per layer (slots whose expert changes, slot order inside a GPU
ignored: `moeopt.balance.migration.count_moves`), moved bytes (moved slots x
``model.expert_size``) and, with ``timings``, the planning time. Totals in
[`ReplayResult.metrics`][moeopt.replay.run.ReplayResult.metrics].
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from moeopt import console
from moeopt.balance.migration import count_moves, relabel
from moeopt.balance.robust import robust_objective
from moeopt.dispatch import count_loads, route_trace
from moeopt.errors import MoeoptError
from moeopt.evaluate import communication, maxvio
from moeopt.instance import Instance
from moeopt.io import resolve_profile
from moeopt.plan import Plan
from moeopt.registry import get_method
from moeopt.replay.forecast import forecast_loads
from moeopt.replay.mix import (
    LATENT_MIN_BITS,
    ROUTING_SHIFT,
    family_snapshots,
    latent_families,
    latent_signal,
    routing_shift,
    step_window,
)
from moeopt.replay.policies import Forecasting, Observation, Policy, Request, Schedule, make_policy
from moeopt.replay.stream import Stream
from moeopt.scoring import Workloads
from moeopt.solve import solve
from moeopt.trace import Trace, stats_from_counts
from moeopt.utilization import utilization_trace

__all__ = [
    "ALLOCATE_LEVELS",
    "REPORT",
    "Replan",
    "ReplayResult",
    "allocate_moves",
    "planning_counts",
    "replay",
    "runs_report",
    "score_steps",
    "worst_window_of",
]

#: The ``report`` key of a replay report (``moeopt plot`` recognises it).
REPORT = "replay"

#: With pooled layer budgets: the per-layer budgets (times the budget) each layer's re-plan is made at
ALLOCATE_LEVELS = (0.5, 1.0, 2.0, 3.0)


@dataclass(frozen=True)
class Replan:
    """One re-plan of a replay and what it cost.

    Attributes
    ----------
    index
        1, 2, ...: the plan's number in `ReplayResult.plans` (0 is the first plan).
    decided
        Steps observed when it was decided.
    start, end
        The steps planned on (``start .. end - 1``).
    effective
        The first step the plan serves.
    planner
        The registered method that made it.
    moved_slots_per_layer
        Slots per layer whose expert changed from the plan in service.
    moved_bytes
        ``sum(moved_slots_per_layer) * model.expert_size``.
    plan_time
        Seconds planning took (wall; reported only with ``timings``).
    families
        Task families whose loads it was also planned for (0: none; [`moeopt.replay.mix`][]).
    """

    index: int
    decided: int
    start: int
    end: int
    effective: int
    planner: str
    moved_slots_per_layer: tuple[int, ...]
    moved_bytes: int
    plan_time: float = 0.0
    families: int = 0

    @property
    def moved_slots(self) -> int:
        """Moved slots over all layers."""
        return int(sum(self.moved_slots_per_layer))

    def to_json(self, timings: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "decided": self.decided,
            "window": [self.start, self.end],
            "effective": self.effective,
            "planner": self.planner,
            "moved_slots": self.moved_slots,
            "moved_slots_per_layer": list(self.moved_slots_per_layer),
            "moved_bytes": self.moved_bytes,
        }
        if self.families:
            out["families"] = self.families
        if timings:
            out["plan_time"] = self.plan_time
        return out


def worst_window_of(stream: Stream, policy: Any, given: int | None = None) -> tuple[int, str]:
    """Steps per window of the worst-window MaxVio and what set it: ``given``, else the
    stream's natural window, else the policy's interval (its window, for a policy without one)."""
    if given is not None:
        return int(given), "given"
    if stream.window_steps:
        return int(stream.window_steps), "window_steps"
    interval = getattr(policy, "interval", None)
    if interval:
        return int(interval), "interval"
    return int(policy.window), "window"


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """A replay: the per-step series, the re-plans, the plans, and the totals.

    Attributes
    ----------
    policy
        The policy, every default resolved.
    stream
        The stream served.
    steps
        int ``[S]``: the scored steps (``calibration .. T - 1``).
    maxvio
        float ``[S]``: MaxVio of each scored step under the plan in service.
    plan_of_step
        int ``[S]``: the plan in service at each scored step (index into `plans`).
    plans
        The first plan, then each re-plan's.
    replans
        One [`Replan`][moeopt.replay.run.Replan] per re-plan made.
    comm
        float ``[S]``: remote GPUs per token per layer at each step (NaN for a step without
        tokens); None without tokens.
    step_tokens
        int ``[S]``: tokens of each step; None without tokens.
    expert_size
        Bytes per expert (``model.expert_size``).
    worst_window, worst_basis
        Steps per window of [`metrics`][moeopt.replay.run.ReplayResult.metrics]' ``maxvio_worst`` and what set them
        ([`worst_window_of`][moeopt.replay.run.worst_window_of]).
    slots_per_layer
        ``G x W``.
    instance_name
        The instance's name.
    """

    policy: Any
    stream: Stream
    steps: np.ndarray
    maxvio: np.ndarray
    plan_of_step: np.ndarray
    plans: list[Plan]
    replans: list[Replan]
    comm: np.ndarray | None
    step_tokens: np.ndarray | None
    expert_size: int
    worst_window: int
    worst_basis: str
    slots_per_layer: int
    instance_name: str = ""
    initial_time: float = 0.0

    def window_means(self) -> np.ndarray:
        """float: the mean per-step MaxVio of each window of `worst_window` steps (natural
        windows from step 0 under ``window_steps``; else from the first scored step; a partial
        last window counts as one)."""
        first = 0 if self.worst_basis == "window_steps" else int(self.steps[0])
        block = (self.steps - first) // self.worst_window
        block = block - block[0]
        sums = np.bincount(block, weights=self.maxvio)
        return np.asarray(sums / np.bincount(block))

    @cached_property
    def metrics(self) -> dict[str, Any]:
        """The totals: ``maxvio_mean`` (time average of the per-step MaxVio over the scored steps),
        ``maxvio_worst`` (largest window mean, [`window_means`][moeopt.replay.run.ReplayResult.window_means]),
        ``maxvio_max`` (largest step), ``replans``, ``transfers`` (the re-plans that moved at least one
        slot: a re-plan that keeps every GPU's experts transfers nothing), ``moved_slots`` (all layers,
        all re-plans), ``moved_bytes``,
        ``moved_slots_per_layer_per_replan``, and ``comm_per_token_mean`` with tokens."""
        moved = sum(r.moved_slots for r in self.replans)
        n = len(self.replans)
        L = self.stream.layers
        out: dict[str, Any] = {
            "maxvio_mean": float(self.maxvio.mean()),
            "maxvio_worst": float(self.window_means().max()),
            "maxvio_max": float(self.maxvio.max()),
            "replans": n,
            "transfers": sum(1 for r in self.replans if r.moved_slots),
            "moved_slots": int(moved),
            "moved_bytes": int(moved) * self.expert_size,
            "moved_slots_per_layer_per_replan": float(moved / (n * L)) if n else 0.0,
            "slots_per_layer": self.slots_per_layer,
            "expert_bytes": self.expert_size,
            "scored_steps": int(len(self.steps)),
            "worst_window_steps": self.worst_window,
            "worst_window_basis": self.worst_basis,
        }
        if self.comm is not None and self.step_tokens is not None:
            tokens = self.step_tokens.sum()
            total = np.nansum(self.comm * self.step_tokens)
            out["comm_per_token_mean"] = float(total / tokens) if tokens else None
        return out

    def to_json(self, *, timings: bool = False) -> dict[str, Any]:
        """The report: ``policy``, ``stream``, ``metrics``, ``series`` (per scored step: ``step``,
        ``maxvio``, ``plan``, and ``comm`` with tokens) and ``replans``; no wall times unless
        ``timings`` (so that the same seed writes the same bytes)."""
        series: dict[str, Any] = {
            "step": self.steps.tolist(),
            "maxvio": self.maxvio.tolist(),
            "plan": self.plan_of_step.tolist(),
        }
        if self.comm is not None:
            series["comm"] = [None if np.isnan(c) else float(c) for c in self.comm]
        out: dict[str, Any] = {
            "report": REPORT,
            "instance": self.instance_name,
            "policy": self.policy.to_json(),
            "stream": self.stream.summary(),
            "metrics": self.metrics,
            "series": series,
            "replans": [r.to_json(timings) for r in self.replans],
        }
        if timings:
            out["timings"] = {
                "initial_plan_time": self.initial_time,
                "plan_time_total": self.initial_time + sum(r.plan_time for r in self.replans),
            }
        return out


def runs_report(results: list[ReplayResult], *, timings: bool = False) -> dict[str, Any]:
    """The report of one replay (its flat object) or of several on one stream (``runs``)."""
    if len(results) == 1:
        return results[0].to_json(timings=timings)
    first = results[0]
    return {
        "report": REPORT,
        "instance": first.instance_name,
        "stream": first.stream.summary(),
        "runs": [r.to_json(timings=timings) for r in results],
    }


# ----------------------------------------------------------------------------- the loop
@dataclass
class _Planner:
    """Makes the plan a [`Request`][moeopt.replay.policies.Request] asks for, with [`moeopt.solve.solve`][]."""

    instance: Instance
    stream: Stream
    seed: int
    workers: int | None
    ray: str | bool | None
    profile: Any = None
    cache: dict[str, Any] = field(default_factory=dict)
    onsets: list[int] = field(default_factory=list)  # surge onsets so far (the families' regimes)
    clusters: tuple[int, Trace] | None = None  # unlabelled trace: (end, steps 0 .. end - 1 clustered), the latest
    record: float = 0.0  # latent families: served-step MaxVio of the plans made with them less without
    trial: tuple[int, Plan, Plan] | None = None  # (end, plan with latent families, plan without) of the last re-plan

    def workloads(self, planner: str, start: int, end: int, forecast: Forecasting | None = None) -> Workloads:
        """The window as the planner's calibration (and evaluation) workload: its tokens when the
        stream has them (full statistics only for planners that read coactivation), else its counts;
        with ``forecast``, count statistics of the forecast ([`planning_counts`][moeopt.replay.run.planning_counts])."""
        if forecast is not None:
            window = self.stream.counts(start, end)
            snaps = planning_counts(window, forecast)
            stats = stats_from_counts(snaps[:, 0], top_k=int(self.stream.top_k), step_counts=snaps)
            return Workloads(stats, stats, stats, self.profile)
        counts_only = self.stream.stats(start, end)
        if self.stream.trace is None:
            return Workloads(counts_only, counts_only, counts_only, self.profile)
        sub = self.stream.trace_window(start, end)
        impl = get_method(planner)
        stats = sub.stats() if "coactivation" in impl.requires or planner == "auto" else counts_only
        return Workloads(sub, sub, stats, self.profile)

    def family_start(self, end: int) -> int:
        """The first step whose families' loads still hold at ``end``: 0, or the latest surge
        onset across which the families' own routing moved
        ([`routing_shift`][moeopt.replay.mix.routing_shift] above `ROUTING_SHIFT`). A surge that a
        moving task mix explains (each family routes as before) keeps the steps before it."""
        begin = 0
        for onset in sorted(o for o in set(self.onsets) if begin < o < end):
            before, after = self.family_window(begin, onset, end), self.family_window(onset, end, end)
            if routing_shift(before, after, self.stream.layers) > ROUTING_SHIFT:
                begin = onset
        return begin

    def unlabelled(self) -> bool:
        """Whether the stream's tokens carry no task family (fewer than two family names)."""
        t = self.stream.trace
        return t is not None and len(t.family_names) < 2

    def latent(self, end: int) -> Trace:
        """On an unlabelled trace, the tokens of steps ``0 .. end - 1`` labelled by the clusters
        of their routing ([`latent_families`][moeopt.replay.mix.latent_families], fitted on these
        steps) when they tell tasks apart ([`latent_signal`][moeopt.replay.mix.latent_signal] at
        least `LATENT_MIN_BITS`; else those tokens as they are, one family: no families planned
        for). The latest end's is kept."""
        if self.clusters is None or self.clusters[0] != end:
            window = self.stream.trace_window(0, end)
            signal = latent_signal(window, seed=self.seed) >= LATENT_MIN_BITS
            self.clusters = (end, latent_families(window, seed=self.seed) if signal else window)
        return self.clusters[1]

    def family_count(self, end: int) -> int:
        """The task families of the tokens before step ``end``: the trace's own, or the clusters."""
        t = self.stream.trace
        if t is None:
            return 0
        return len(self.latent(end).family_names if self.unlabelled() else t.family_names)

    def family_window(self, start: int, stop: int, end: int) -> Trace:
        """The tokens of steps ``start .. stop - 1`` with their families (on an unlabelled trace
        the clusters fitted on the steps before ``end``)."""
        if self.unlabelled():
            return step_window(self.latent(end), start, stop)
        return self.stream.trace_window(start, stop)

    def plan(self, req: Request, current: Plan | None) -> tuple[Plan, int]:
        """The plan ``req`` asks for and the task families it was also planned for (0: none)."""
        wl = self.workloads(req.planner, req.start, req.end, req.forecast)
        if req.surge:
            self.onsets.append(req.start)
        with_req, with_wl, families = self._with_families(req, wl, first=current is None)
        if not families or not self.unlabelled() or current is None:
            return self._make(with_req, current, with_wl), families
        # latent families: plan with and without them; serve the one whose plans served better
        self._score_trial(req.end)
        new = self._make(with_req, current, with_wl)
        without = self._make(req, current, wl)
        self.trial = (req.end, new, without)
        return (new, families) if self.record <= 0.0 else (without, 0)

    def _score_trial(self, end: int) -> None:
        """Adds to `record` how the last re-plan's two plans (with latent families, without)
        served the steps observed since it: the first's mean per-step MaxVio less the second's."""
        if self.trial is None or end <= self.trial[0]:
            return
        start, new, without = self.trial
        a = score_steps(self.instance, self.stream, new, start, end)[0]
        b = score_steps(self.instance, self.stream, without, start, end)[0]
        self.record += float(a.mean() - b.mean())
        self.trial = None

    def _make(self, req: Request, current: Plan | None, wl: Workloads) -> Plan:
        if req.allocate and current is not None and req.budget is not None and req.from_current:
            return self._allocated(req, current, wl)
        return self._solve(req, current, wl)

    def _with_families(self, req: Request, wl: Workloads, first: bool = False) -> tuple[Request, Workloads, int]:
        """With ``req.families`` and a trace whose task mix moves over the families' steps
        (`family_start` to ``req.end``;
        [`moeopt.replay.mix.mix_moves`][]): the snapshots planned for, then each family's load
        over those steps ([`family_loads`][moeopt.replay.mix.family_loads], scaled to the
        snapshots' load), planned for robustly together; else ``req`` and ``wl`` as they are.
        The ``first`` plan, made on a single step, plans for the families without the test (it
        has nothing to compare)."""
        t = self.stream.trace
        if req.families is None or t is None or self.family_count(req.end) < 2:
            return req, wl, 0
        window = self.stream.counts(req.start, req.end)
        if req.forecast is not None:
            base = planning_counts(window, req.forecast)
        else:
            steps = int(req.params.get("robust_steps") or window.shape[1])
            robust = req.params.get("robust", "auto") != "none"
            base = utilization_trace(window, steps).counts if robust else window.mean(axis=1, keepdims=True)
        begin = min(self.family_start(req.end), req.start)
        regime = self.family_window(begin, req.end, req.end)
        alpha = req.families
        if first and req.end - begin < 2:
            alpha = 1.0  # one calibration step: nothing to test the mix on, so plan for the families
        snaps = family_snapshots(regime, base, alpha)
        if snaps is None:
            return req, wl, 0
        stats = stats_from_counts(snaps.mean(axis=1), top_k=int(self.stream.top_k), step_counts=snaps)
        robust = "worst" if req.params.get("robust") == "worst" else "mean"
        req = dataclasses.replace(req, params={**req.params, "robust": robust, "robust_steps": 0})
        return req, Workloads(stats, stats, stats, self.profile), int(snaps.shape[1] - base.shape[1])

    def _allocated(self, req: Request, current: Plan, wl: Workloads) -> Plan:
        """Re-plans at several per-layer budgets (`ALLOCATE_LEVELS` times ``req.budget``), then per
        layer the one [`allocate_moves`][moeopt.replay.run.allocate_moves] picks so that all layers together move at
        most ``layers x budget`` slots: moves go where they lower the planned-for MaxVio most per slot."""
        budget = int(req.budget or 0)
        levels = sorted({max(1, round(f * budget)) for f in ALLOCATE_LEVELS})
        plans = [current] + [
            self._solve(dataclasses.replace(req, params={**req.params, "max_moves": b}), current, wl) for b in levels
        ]
        st = wl.calibration_stats
        snaps = st.step_counts if st.step_counts is not None else st.counts.sum(axis=0)[:, None, :]
        L = current.layers
        values = np.array([[robust_objective(p.slots[l], snaps[l]) for l in range(L)] for p in plans])
        moves = np.array([list(_moves(current, p)) for p in plans])
        pick = allocate_moves(values, moves, budget * L)
        slots = np.stack([plans[pick[l]].slots[l] for l in range(L)])
        return Plan(slots=slots, experts=current.experts, dispatch=plans[-1].dispatch)

    def _solve(self, req: Request, current: Plan | None, wl: Workloads) -> Plan:
        with _notes_once(current is None):
            result = solve(
                self.instance,
                method=req.planner,
                params=req.params,
                seed=self.seed,
                quiet=True,
                workloads=wl,
                current=current if req.from_current else None,
                workers=self.workers,
                ray=self.ray,
            )
        if result.plan is None:
            reason = result.stats.get("reason") or (result.termination.value if result.termination else "no plan")
            raise MoeoptError(f"replay: {req.planner} found no plan on steps {req.start}..{req.end - 1} ({reason})")
        plan = result.plan
        if req.relabel and current is not None:
            slots = np.stack([relabel(plan.slots[l], current.slots[l]) for l in range(plan.layers)])
            plan = Plan(slots=slots, experts=plan.experts, dispatch=plan.dispatch)
        return plan


def allocate_moves(values: np.ndarray, moves: np.ndarray, pool: int) -> np.ndarray:
    """int ``[L]``: per layer, the candidate to serve, so that the layers' moves sum to at most
    ``pool`` and the summed value drops the most (greedy on the best drop per moved slot).

    Parameters
    ----------
    values
        float ``[C, L]``: each candidate's value per layer (lower is better); candidate 0 is the
        plan in service (``moves[0] == 0``).
    moves
        int ``[C, L]``: each candidate's moved slots per layer.
    pool
        Moved slots all layers may spend together.
    """
    C, L = values.shape
    pick = np.zeros(L, dtype=np.int64)
    left = int(pool)
    while True:
        best, best_rate = None, 0.0
        for l in range(L):
            c0 = pick[l]
            for c in range(C):
                extra = int(moves[c, l] - moves[c0, l])
                drop = float(values[c0, l] - values[c, l])
                if drop <= 0 or extra > left:
                    continue
                rate = drop / max(extra, 1e-9) if extra > 0 else math.inf
                if rate > best_rate:
                    best, best_rate = (l, c, extra), rate
        if best is None:
            return pick
        l, c, extra = best
        pick[l] = c
        left -= max(0, extra)


def planning_counts(window: np.ndarray, forecast: Forecasting) -> np.ndarray:
    """float ``[L, n, E]``: the load snapshots a forecasting re-plan plans for: the forecast of
    the coming steps from ``window [L, m, E]`` ([`moeopt.replay.forecast.forecast_loads`][]),
    then (with ``forecast.recent``) the mean of each window of ``forecast.snapshot`` recent
    steps, the newest last (a partial oldest window kept)."""
    f = forecast_loads(window, forecast.horizon, halflife=forecast.halflife, trend=forecast.trend).loads
    snaps = [f[:, None, :]]
    if forecast.recent:
        m, w = window.shape[1], max(1, forecast.snapshot)
        for end in range(m - (m - 1) // w * w, m + 1, w):  # windows ending at the newest step
            snaps.append(window[:, max(0, end - w) : end].mean(axis=1, keepdims=True))
    return np.concatenate(snaps, axis=1)


def score_steps(instance: Instance, stream: Stream, plan: Plan, start: int, end: int) -> tuple[np.ndarray, Any]:
    """Per-step MaxVio of steps ``start .. end - 1`` under ``plan`` (one call for the segment)
    and, with tokens, ``(remote GPUs summed over each step's tokens, tokens per step)``."""
    cluster = instance.cluster
    S = end - start
    if stream.trace is None:
        loads = count_loads(plan, stream.counts(start, end), cluster)  # [L, S, G]
        return np.asarray(maxvio(loads).mean(axis=0)), None
    sub = stream.trace_window(start, end)
    tokens = np.bincount(sub.step, minlength=S)
    if sub.tokens == 0:
        return np.zeros(S), (np.zeros(S), tokens)
    routing = route_trace(plan, sub, cluster)
    loads = routing.step_loads
    if loads.shape[1] < S:  # trailing steps without tokens
        loads = np.concatenate([loads, np.zeros((loads.shape[0], S - loads.shape[1], loads.shape[2]))], axis=1)
    if routing.comm is not None:
        remote = routing.comm[1]
    else:
        assert routing.gpu is not None
        remote = communication(routing.gpu, cluster, sub.home)[1]
    per_token = remote.mean(axis=1)  # remote GPUs per layer, as evaluate's comm_per_token
    return np.asarray(maxvio(loads).mean(axis=0)), (np.bincount(sub.step, weights=per_token, minlength=S), tokens)


@contextmanager
def _notes_once(first: bool) -> Iterator[None]:
    """Console notes of the first plan only: a re-plan repeats its planner's notes (an executor
    it cannot use, EPLB's policy), which would print once per re-plan."""
    if first:
        yield
        return
    prior = console.mode()
    console.configure(quiet=True)
    try:
        yield
    finally:
        console.configure(verbose=prior == "verbose", quiet=prior == "quiet")


def _gains(instance: Instance, stream: Stream, current: Plan, new: Plan, req: Request) -> bool:
    """Whether ``new`` lowers the mean per-step MaxVio of the planned-on steps by at least
    ``req.min_gain`` of the plan in service's."""
    assert req.min_gain is not None
    before = float(score_steps(instance, stream, current, req.start, req.end)[0].mean())
    after = float(score_steps(instance, stream, new, req.start, req.end)[0].mean())
    return after < before * (1.0 - req.min_gain)


def _paired_gain(instance: Instance, stream: Stream, current: Plan, new: Plan, start: int, end: int) -> float:
    """How many standard errors ``new`` lowers the per-step MaxVio of steps ``start .. end - 1``
    below ``current``'s (a paired comparison; one step, or no spread: +-inf by the sign)."""
    diff = score_steps(instance, stream, current, start, end)[0] - score_steps(instance, stream, new, start, end)[0]
    mean = float(diff.mean())
    if len(diff) < 2:
        return math.inf if mean > 0 else -math.inf
    se = float(diff.std(ddof=1)) / math.sqrt(len(diff))
    if se <= 0:
        return math.inf if mean > 0 else -math.inf
    return mean / se


def _withdrawn(r: Replan, pooled: bool) -> int:
    """What a re-plan took from the move bucket: the most slots one layer moved, or, with the
    layers' budgets pooled, the slots moved per layer on average (rounded up)."""
    per = r.moved_slots_per_layer
    if not per:
        return 0
    return math.ceil(sum(per) / len(per)) if pooled else max(per)


def _moves(current: Plan, new: Plan) -> tuple[int, ...]:
    return tuple(count_moves(current.slots[l], new.slots[l]) for l in range(current.layers))


def replay(
    instance: Instance,
    stream: Stream,
    policy: Policy | str,
    *,
    seed: int | None = None,
    workers: int | None = None,
    ray: str | bool | None = None,
    quiet: bool = True,
    timings: bool = False,
    worst_window: int | None = None,
) -> ReplayResult:
    """Serve ``stream`` under ``policy``: score every step after the calibration prefix under
    the plan in service, re-plan when the policy asks, and count what each re-plan moves.

    Parameters
    ----------
    instance
        The instance (model, cluster: its slots and the expert size).
    stream
        The steps to serve ([`moeopt.replay.load_stream`][moeopt.replay.stream.load_stream]).
    policy
        A policy object (`moeopt.replay.POLICIES`) or a policy name (its defaults).
    seed
        Replaces the policy's ``seed`` (None: keep it); every plan is made with it.
    workers, ray
        Where the planning inside runs ([`moeopt.solve.solve`][]); the plans are the same.
    quiet
        No progress line per re-plan on stderr.
    timings
        Record planning times (they then appear in the report; off by default so that the same
        seed gives the same report, byte for byte).
    worst_window
        Steps per window of the worst-window MaxVio (default: [`worst_window_of`][moeopt.replay.run.worst_window_of]).

    Returns
    -------
    ReplayResult

    Raises
    ------
    InputError
        The stream does not fit the instance, is shorter than the policy's window or
        calibration prefix (plus one step), or a policy parameter is bad.
    """
    if isinstance(policy, str):
        policy = make_policy(policy)
    if seed is not None:
        policy = dataclasses.replace(policy, seed=seed)  # type: ignore[type-var]
    stream.check(instance)
    T = stream.steps
    resolved = policy.resolve(T, stream.window_steps, instance)
    sched: Schedule = resolved.schedule(instance)
    window = getattr(resolved, "window", None)
    if window is not None:
        stream.require_steps(int(window), "the policy's window")
    C = sched.calibration
    stream.require_steps(C + 1, f"the calibration prefix ({C} steps) and one step to serve")
    block, basis = worst_window_of(stream, resolved, worst_window)
    planner = _Planner(instance, stream, resolved.seed, workers, ray, resolve_profile(instance))
    say = (lambda line: None) if quiet else console.progress_line
    name = resolved.name

    first = sched.initial(T)
    t0 = time.perf_counter()
    plans = [planner.plan(first, None)[0]]
    initial_time = time.perf_counter() - t0
    say(f"replay {name}: first plan on steps {first.start}..{first.end - 1} ({first.planner})")

    S = T - C
    mv = np.zeros(S)
    served = np.zeros(S, dtype=np.int64)
    comm_sum = np.zeros(S) if stream.trace is not None else None
    tokens = np.zeros(S, dtype=np.int64) if stream.trace is not None else None
    replans: list[Replan] = []
    in_service = 0
    service_start = C  # the first step the plan in service served
    regime_start = 0  # where the newest surge re-plan's steps began
    pending: tuple[int, int] | None = None  # (effective step, plan index)
    planned_until = first.end
    pos = C
    decision = sched.next_decision(C)
    # the first plan's in-sample MaxVio per calibration step: the surge watch's first reference
    calib_mv = score_steps(instance, stream, plans[0], 0, C)[0] if sched.surge is not None else None

    def serve(until: int) -> None:
        """Score steps ``pos .. until - 1``, switching to the pending plan at its step."""
        nonlocal pos, in_service, pending, service_start
        while pos < until:
            if pending is not None and pending[0] <= pos:
                in_service, pending, service_start = pending[1], None, pos
            end = until if pending is None else min(until, pending[0])
            vals, comm = score_steps(instance, stream, plans[in_service], pos, end)
            mv[pos - C : end - C] = vals
            served[pos - C : end - C] = in_service
            if comm is not None:
                assert comm_sum is not None and tokens is not None
                comm_sum[pos - C : end - C], tokens[pos - C : end - C] = comm
            pos = end

    while pos < T:
        serve(T if decision is None else min(decision, T))
        if decision is None or decision >= T:
            break
        if pending is not None and pending[0] <= decision:
            in_service, pending, service_start = pending[1], None, decision
        obs = Observation(
            decision,
            T,
            C,
            mv[: decision - C],
            planned_until,
            pending is not None,
            service_start,
            regime_start,
            calib_mv,
            tuple((r.decided, _withdrawn(r, sched.allocate)) for r in replans),
        )
        req = sched.decide(obs)
        if req is not None and req.effective < T:
            current = plans[pending[1] if pending is not None else in_service]
            t1 = time.perf_counter()
            if req.surge:
                regime_start = req.start
            if req.accept == "held-out" and req.end - req.start > req.holdout:
                trial = dataclasses.replace(req, end=req.end - req.holdout)
                gain = _paired_gain(instance, stream, current, planner.plan(trial, current)[0], trial.end, req.end)
                if gain <= req.confidence:
                    say(f"replay {name}: step {req.decided}: a re-plan does not pay on held-out steps; plan kept")
                    decision = sched.next_decision(decision)
                    continue
            new, families = planner.plan(req, current)
            elapsed = time.perf_counter() - t1
            if req.accept == "paired" and _paired_gain(instance, stream, current, new, req.start, req.end) <= (
                req.confidence
            ):
                say(f"replay {name}: step {req.decided}: the re-plan's gain is within the steps' noise; plan kept")
                decision = sched.next_decision(decision)
                continue
            if req.min_gain is not None and not _gains(instance, stream, current, new, req):
                say(f"replay {name}: step {req.decided}: the re-plan gains less than {req.min_gain:g}; plan kept")
                decision = sched.next_decision(decision)
                continue
            moved = _moves(current, new)
            plans.append(new)
            index = len(plans) - 1
            replans.append(
                Replan(
                    index,
                    req.decided,
                    req.start,
                    req.end,
                    req.effective,
                    req.planner,
                    moved,
                    int(sum(moved)) * instance.model.expert_size,
                    elapsed,
                    families,
                )
            )
            planned_until = req.end
            say(
                f"replay {name}: step {req.decided}: re-planned on steps {req.start}..{req.end - 1} "
                f"({req.planner}), {sum(moved)} slots moved ({sum(moved) * instance.model.expert_size / 1e9:.3f} GB), "
                f"in service from step {req.effective}"
            )
            if req.effective <= decision:
                in_service, service_start = index, decision
            else:
                pending = (req.effective, index)
        decision = sched.next_decision(decision)

    comm = None
    if comm_sum is not None and tokens is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            comm = np.where(tokens > 0, comm_sum / np.maximum(tokens, 1), np.nan)
    return ReplayResult(
        policy=resolved,
        stream=stream,
        steps=np.arange(C, T),
        maxvio=mv,
        plan_of_step=served,
        plans=plans,
        replans=replans,
        comm=comm,
        step_tokens=tokens,
        expert_size=instance.model.expert_size,
        worst_window=block,
        worst_basis=basis,
        slots_per_layer=instance.cluster.gpus * instance.cluster.width,
        instance_name=instance.name,
        initial_time=initial_time,
    )
