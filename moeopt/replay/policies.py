"""Re-planning policies: when a replay re-plans, on which steps, and how (SPEC section 12).

Every policy is a small frozen dataclass of its parameters, registered by name in
`POLICIES` (``make_policy("periodic", interval=8)``). A policy resolves, for one stream
and one instance, to a [`Schedule`][moeopt.replay.policies.Schedule]: the one composition the replay loop
([`moeopt.replay.replay`][moeopt.replay.run.replay]) runs. A schedule says

* **when**: after every ``interval`` scored steps (steps ``calibration + k * interval``,
  ``k >= 1``; every ``cadence`` steps when it is given), optionally only when the plan in
  service's mean per-step MaxVio over the last ``trigger_window`` steps exceeds ``level``
  ([`Schedule.decide`][moeopt.replay.policies.Schedule.decide] gets an
  [`Observation`][moeopt.replay.policies.Observation]: the steps seen, their MaxVio, whether a plan is pending); with a
  ``surge`` watch also after any step whose MaxVio jumps
  ([`Schedule.surge_onset`][moeopt.replay.policies.Schedule.surge_onset]);
* **on what**: the last ``span`` steps before the decision (``None``: every step so far), or
  a ``forecast`` of the coming steps made from them, or, for the oracle, the coming
  ``interval`` steps themselves;
* **how**: a registered planner (``planner`` + ``planner_params``), from scratch or from the
  plan in service with at most ``budget`` moved slots per layer (``balance``'s migration mode:
  `moeopt.balance.replan_from`; with ``carry`` the budget is a rate per interval,
  [`Schedule.bucket`][moeopt.replay.policies.Schedule.bucket]), robust over snapshots of ``snapshot`` steps each, and
  with the new plan's GPUs relabeled onto the plan in service (``relabel``); with ``min_gain`` the plan in
  service is kept unless the re-plan gains that share on the planned-on steps, with ``accept``
  unless its per-step gain passes a paired test.

A plan decided after step ``d - 1`` (planned on steps ending there) serves from step
``d + lag``; the plan in service serves until then. While a plan is pending no other re-plan is
decided. Every policy plans its first plan on the first ``calibration`` steps; the replay
scores the steps after them.

The named policies:

``static``
    Plan once on the calibration prefix; never re-plan (moves nothing).
``periodic``
    Every ``interval`` steps, plan on the last ``window`` steps with any registered planner:
    what SGLang (``--enable-eplb``, ``--eplb-rebalance-num-iterations``) and vLLM
    (``eplb_config.window_size``, ``step_interval``) run with EPLB. ``relabel: true`` renumbers
    the new plan's GPUs (and slot positions) to overlap the plan in service as much as
    possible (a linear assignment on overlap per layer, `moeopt.balance.migration.relabel`):
    the fairest version of what an engine could do with EPLB.
``threshold``
    ``periodic``, but re-plans only when the mean per-step MaxVio over the last ``window``
    steps exceeds ``level`` (SGLang's utilization threshold, vLLM-Ascend's degradation ratio).
``incremental``
    Every ``interval`` steps, re-plan from the plan in service moving at most ``budget`` slots
    per layer (or ``budget_bytes`` per layer, in expert weights of ``model.expert_size``
    bytes): vLLM-Ascend's SwiftBalancer with its swap cap.
``auto``
    moeopt's default: after every step (``cadence``), re-plan from the plan in service for a
    forecast of the coming steps made from the last ``history`` windows of ``window`` steps (an
    exponentially weighted mean whose half-life follows how fast the stream moves,
    [`moeopt.replay.forecast`][]), within a transfer budget per interval (a bucket that fills
    at a share of the slots per interval, with a reserve for surges); and a surge watch that
    re-plans at once, on the new steps alone, when a step's MaxVio jumps. Every knob is a
    parameter (acceptance tests, pooled layer budgets, the windows as robust snapshots instead
    of the forecast, ...); the defaults are the ones chosen on the bundled streams (see the
    re-planning guide).
``oracle``
    Hindsight, not a policy an engine can run: every block of ``interval`` scored steps is
    served by a plan made on that block itself (no lag). It bounds what any re-planning with
    that planner can reach.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from moeopt.errors import InputError
from moeopt.instance import Instance
from moeopt.registry import get_method, method_names
from moeopt.replay.mix import MIX_P

__all__ = [
    "POLICIES",
    "Auto",
    "Incremental",
    "Observation",
    "Oracle",
    "Periodic",
    "Policy",
    "Request",
    "Schedule",
    "Static",
    "Threshold",
    "default_interval",
    "make_policy",
    "policy_names",
]

#: The steps per interval when neither the policy nor the stream says: a sixteenth of the stream.
DEFAULT_INTERVAL_SHARE = 16


@dataclass(frozen=True)
class Request:
    """One planning job of a replay.

    Attributes
    ----------
    decided
        Steps observed when it was decided (the decision follows step ``decided - 1``).
    start, end
        The steps planned on: ``start .. end - 1``.
    effective
        The first step the new plan serves.
    planner, params
        The registered method and its parameters (``max_moves`` set from the budget).
    from_current
        Re-plan from the plan in service (migration-aware planners only).
    relabel
        Renumber the new plan's GPUs onto the plan in service.
    budget
        Moved slots per layer allowed (None: any).
    surge
        Made by the surge watch (between decision points): the steps from ``start`` on are a new
        regime, and later windows start there.
    min_gain
        Keep the plan in service unless the new plan lowers the mean per-step MaxVio of the
        planned-on steps by at least this share of it (None: always take the new plan).
    forecast
        Plan for a forecast of the coming steps made from the planned-on steps (None: plan on
        the steps themselves).
    accept, confidence
        When the new plan is taken (``always``, ``paired``, ``held-out``: [`Auto`][moeopt.replay.policies.Auto]), and
        the standard errors of the per-step gain the last two need.
    holdout
        With ``accept: held-out``: the last steps the trial re-plan does not see.
    allocate
        Pool the layers' budgets ([`moeopt.replay.run.allocate_moves`][]).
    families
        With a token trace labelled by task family: plan robustly over each family's load too
        when the mix of families moves at this test level ([`moeopt.replay.mix`][]; over the
        steps since the last surge across which the families' own routing moved:
        the replay's ``family_start``); None: never.
    """

    decided: int
    start: int
    end: int
    effective: int
    planner: str
    params: dict[str, Any] = field(default_factory=dict)
    from_current: bool = False
    relabel: bool = False
    budget: int | None = None
    surge: bool = False
    min_gain: float | None = None
    forecast: Forecasting | None = None
    accept: str = "always"
    confidence: float = 1.0
    holdout: int = 0
    allocate: bool = False
    families: float | None = None


#: The forecasts ``auto`` plans for (``none``: the recent windows as they are).
FORECASTS = ("level", "trend", "none")
#: When ``auto`` takes a decision point's re-plan.
ACCEPTS = ("always", "paired", "held-out")
#: When ``auto`` plans for each task family's load too: ``auto`` when the mix moves
#: ([`moeopt.replay.mix.mix_moves`][]), ``always`` with a labelled trace, ``none`` never.
FAMILIES = ("auto", "always", "none")


@dataclass(frozen=True)
class Forecasting:
    """How a re-plan turns its recent steps into the loads it plans for
    ([`moeopt.replay.forecast.forecast_loads`][]).

    Attributes
    ----------
    horizon
        Steps from the last recent step to the middle of the steps the new plan will serve.
    halflife
        The level's half-life in steps (None: chosen per layer from the recent steps).
    trend
        Add each expert's shrunk linear trend.
    recent
        Also plan for the recent steps, each window of ``snapshot`` steps one snapshot, beside
        the forecast (robust over them all); False: for the forecast alone.
    snapshot
        Steps per recent snapshot.
    """

    horizon: float
    halflife: float | None = None
    trend: bool = False
    recent: bool = False
    snapshot: int = 1


@dataclass(frozen=True, eq=False)
class Observation:
    """What a policy knows when it decides: everything up to the step just served.

    Attributes
    ----------
    step
        Steps observed so far (the next step's index).
    steps
        T, the stream's length (the oracle plans on the steps to come).
    calibration
        The first scored step.
    maxvio
        float ``[step - calibration]``: the per-step MaxVio of the scored steps so far, each
        under the plan that served it.
    planned_until
        End of the window the newest plan (in service or pending) was planned on.
    pending
        Whether a plan is decided but not yet in service (``lag``).
    service_start
        The first step the plan in service served.
    regime_start
        The first step of the current regime: where the newest surge re-plan's steps began (0
        before any surge); windows do not reach before it.
    calibration_maxvio
        float ``[calibration]``: the first plan's MaxVio on each calibration step (in sample), the
        reference of a surge at the first scored steps; None: not known.
    spent
        ``(decided, moved)`` of each re-plan made so far: its step and the most slots it moved
        in one layer (the move bucket's withdrawals).
    """

    step: int
    steps: int
    calibration: int
    maxvio: np.ndarray
    planned_until: int
    pending: bool
    service_start: int = 0
    regime_start: int = 0
    calibration_maxvio: np.ndarray | None = None
    spent: tuple[tuple[int, int], ...] = ()

    @property
    def since_plan(self) -> int:
        """Steps since the end of the newest plan's window."""
        return self.step - self.planned_until


@dataclass(frozen=True)
class Schedule:
    """The composition every policy resolves to; the replay loop runs only this.

    Attributes
    ----------
    interval
        Steps between decisions (decisions at ``calibration + k * interval``, ``k >= 1``).
    calibration
        Steps the first plan is planned on; scoring starts after them.
    lag
        Steps between a decision and the new plan's first step.
    span
        Steps planned on, ending at the decision; None: every step so far.
    level
        Re-plan only when the mean per-step MaxVio of the last ``trigger_window`` scored steps
        exceeds it; None: at every decision point.
    trigger_window
        Steps the trigger averages.
    replans
        False: never re-plan (``static``).
    lookahead
        Plan each block of ``interval`` steps on itself (``oracle``).
    planner, planner_params
        The registered method and its parameters.
    from_current
        Re-plan from the plan in service.
    budget
        Moved slots per layer (``max_moves``); None: any.
    relabel
        Renumber a fresh plan's GPUs onto the plan in service.
    snapshot
        Steps per robust snapshot: the planner's ``robust_steps`` is set to the snapshots in the
        window (at most ``max_snapshots``); None: the planner's own default.
    max_snapshots
        The most snapshots one plan is made on.
    surge
        The surge watch (None: off): after every step, re-plan at once when the last steps'
        MaxVio each exceed ``surge`` times the median of the ``trigger_window`` steps before them
        (and that median by ``surge_margin``), on those steps alone, from the plan in service
        within the whole [`bucket`][moeopt.replay.policies.Schedule.bucket]; later windows start at the surge
        ([`surge_onset`][moeopt.replay.policies.Schedule.surge_onset]).
    surge_margin
        The least rise (in MaxVio) a surge needs, so that noise on a well-balanced plan does not
        trigger one.
    surge_budget
        Moved slots per layer of a surge re-plan without ``carry`` (None: ``budget``).
    carry
        With a ``budget``: the budget is a rate, ``budget`` moved slots per layer per
        ``interval`` steps, kept in a bucket that holds at most ``carry`` intervals' worth (and
        starts with one, [`bucket`][moeopt.replay.policies.Schedule.bucket]): a surge re-plan may spend all of it, a
        decision point's re-plan only what lies above a reserve of ``carry - 1`` intervals' worth (at most
        ``budget``), so that a surge finds the reserve. None: ``budget`` per re-plan.
    min_gain
        Keep the plan in service unless the re-plan lowers the planned-on steps' mean per-step
        MaxVio by at least this share (None: always take it).
    cadence
        Steps between decision points (None: ``interval``); the bucket still fills per interval.
    rate
        Moved slots per layer the bucket gains per interval (None: ``budget``); may be
        fractional, a re-plan moves whole slots.
    settle
        Intervals after a surge during which decision points may spend the reserve too (None:
        never).
    forecast
        Plan for a forecast of the coming steps (None: on the windows as they are).
    accept, confidence
        When a decision point's re-plan is taken (`ACCEPTS`) and the standard errors of
        the per-step gain it needs.
    allocate
        Pool the layers' budgets ([`moeopt.replay.run.allocate_moves`][]).
    families
        The test level at which a moving task mix adds each family's load to the snapshots
        planned for ([`Request`][moeopt.replay.policies.Request]); None: never.
    """

    interval: int
    calibration: int
    lag: int = 0
    span: int | None = None
    level: float | None = None
    trigger_window: int = 1
    replans: bool = True
    lookahead: bool = False
    planner: str = "balance"
    planner_params: dict[str, Any] = field(default_factory=dict)
    from_current: bool = False
    budget: int | None = None
    relabel: bool = False
    snapshot: int | None = None
    max_snapshots: int = 16
    surge: float | None = None
    surge_margin: float = 0.0
    surge_budget: int | None = None
    carry: float | None = None
    min_gain: float | None = None
    cadence: int | None = None
    rate: float | None = None
    settle: float | None = None
    forecast: Forecasting | None = None
    accept: str = "always"
    confidence: float = 1.0
    allocate: bool = False
    families: float | None = None

    @property
    def per_interval(self) -> float:
        """Moved slots per layer the bucket gains per interval: ``rate``, else ``budget``."""
        return float(self.rate if self.rate is not None else (self.budget or 0))

    @property
    def every(self) -> int:
        """Steps between decision points: ``cadence``, else ``interval``."""
        return self.cadence or self.interval

    def initial(self, steps: int) -> Request:
        """The first plan: on the calibration prefix (the oracle: on the first scored block)."""
        if self.lookahead:
            start, end = self.calibration, min(self.calibration + self.interval, steps)
            return self._request(self.calibration, start, end, self.calibration, first=True)
        return self._request(self.calibration, 0, self.calibration, self.calibration, first=True)

    def next_decision(self, step: int) -> int | None:
        """The first decision point after ``step`` steps observed (None: the policy never re-plans)."""
        if not self.replans:
            return None
        if self.surge is not None and step >= self.calibration:
            return step + 1  # the surge watch looks after every step
        k = max(1, (step - self.calibration) // self.every + 1)
        return self.calibration + k * self.every

    def bucket(self, obs: Observation) -> int | None:
        """Moved slots per layer the next re-plan may spend: the bucket filled at ``budget`` per
        ``interval`` steps from one interval's worth at the calibration step, capped at ``carry``
        intervals' worth, less what each re-plan spent (None: no budget)."""
        if self.budget is None:
            return None
        if self.carry is None:
            return self.budget
        per = self.per_interval
        rate, cap = per / self.interval, self.carry * per
        level, t = per, self.calibration
        for step, moved in obs.spent:
            level = min(cap, level + rate * (step - t)) - moved
            t = step
        level = min(cap, level + rate * (obs.step - t))
        return max(0, math.floor(level + 1e-9))

    def surge_onset(self, obs: Observation) -> int | None:
        """The first step of a surge that ends at the last step observed, or None.

        A surge starting at step ``j`` (a step the plan in service served, at most
        ``trigger_window`` steps back) means every step from ``j`` to the last has MaxVio above
        ``surge`` times the median ``m`` of the ``trigger_window`` steps before ``j`` and above
        ``m + surge_margin``; the earliest such ``j`` is returned.
        """
        if self.surge is None:
            return None
        C, w = obs.calibration, self.trigger_window
        prior = obs.calibration_maxvio if obs.calibration_maxvio is not None else np.zeros(0)
        mv = np.concatenate([np.asarray(prior, dtype=np.float64)[-C:], obs.maxvio])  # mv[i]: step i + C - len(prior)
        first = C - (len(mv) - len(obs.maxvio))  # the step of mv[0]
        last = len(mv) - 1
        lowest = max(obs.service_start, obs.step - w, C, first + 1) - first
        onset = None
        for j in range(last, lowest - 1, -1):
            ref = float(np.median(mv[max(0, j - w) : j]))
            if float(mv[j:].min()) > max(self.surge * ref, ref + self.surge_margin):
                onset = j
            else:
                break
        return None if onset is None else first + onset

    def decide(self, obs: Observation) -> Request | None:
        """The re-plan to make after ``obs.step`` steps, or None to keep the plan in service."""
        d = obs.step
        if not self.replans or obs.pending or d <= self.calibration:
            return None
        if not self.lookahead:
            onset = self.surge_onset(obs)
            if onset is not None:
                budget = self.bucket(obs) if self.carry is not None or self.surge_budget is None else self.surge_budget
                return self._request(d, onset, d, d + self.lag, budget=budget, surge=True)
        if (d - self.calibration) % (self.interval if self.lookahead else self.every):
            return None
        if self.level is not None:
            recent = obs.maxvio[-self.trigger_window :]
            if not len(recent) or float(recent.mean()) <= self.level:
                return None
        if self.lookahead:
            return self._request(d, d, min(d + self.interval, obs.steps), d)
        start = 0 if self.span is None else max(0, d - self.span)
        budget = self.bucket(obs)
        if budget is not None and self.budget is not None:
            reserve = 0 if self.carry is None else math.floor((self.carry - 1.0) * self.per_interval + 1e-9)
            if self.settle is not None and obs.regime_start > 0 and d - obs.regime_start <= self.settle * self.interval:
                reserve = 0  # a surge was just met: converge on the new regime before saving again
            budget = min(self.budget, budget - reserve)
            if budget <= 0 and self.carry is not None:
                return None  # nothing above the surge reserve to spend: keep the plan in service
        begin = max(start, min(obs.regime_start, d - 1))
        return self._request(d, begin, d, d + self.lag, budget=budget)

    def _request(
        self,
        decided: int,
        start: int,
        end: int,
        effective: int,
        first: bool = False,
        budget: int | None = None,
        surge: bool = False,
    ) -> Request:
        params = dict(self.planner_params)
        forecast = None if first else self.forecast
        if forecast is not None:
            if forecast.recent:
                params["robust_steps"] = 0  # the replay makes the snapshots: the forecast, then the windows
            else:
                params["robust"] = "none"
        elif self.snapshot is not None:
            snapshots = min(self.max_snapshots, max(1, math.ceil((end - start) / self.snapshot)))
            params["robust_steps"] = snapshots
            if snapshots < 2 and params.get("robust") in ("mean", "worst"):
                params["robust"] = "none"  # one snapshot: robust over it is planning on it
        if first:
            budget = None
        if budget is not None:
            params["max_moves"] = budget
        from_current = self.from_current and not first
        if from_current and self.planner == "balance":
            params.setdefault("migration_frontier", False)  # the replay never reads balance's moves-vs-MaxVio report
        return Request(
            decided,
            start,
            end,
            effective,
            self.planner,
            params,
            from_current,
            self.relabel and not first,
            budget,
            surge,
            None if first else self.min_gain,
            forecast,
            "always" if first or surge else self.accept,
            self.confidence,
            self.snapshot or 1 if self.accept == "held-out" else 0,
            self.allocate and not first,
            self.families,
        )


class Policy(Protocol):
    """A named re-planning policy: its parameters, resolved to a [`Schedule`][moeopt.replay.policies.Schedule]."""

    name: ClassVar[str]
    summary: ClassVar[str]
    seed: int

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Policy:
        """A copy with every default filled in for this stream and instance (checked)."""
        ...

    def schedule(self, instance: Instance) -> Schedule:
        """The schedule of a resolved policy."""
        ...

    def to_json(self) -> dict[str, Any]:
        """``name`` and every parameter."""
        ...


# ----------------------------------------------------------------------------- checks
def _bad(field_name: str, message: str) -> InputError:
    return InputError(None, f"policy.{field_name}", message)


def _check_int(name: str, value: Any, low: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise _bad(name, f"expected an integer >= {low}, got {value!r}")


def _check_number(name: str, value: Any, *, low: float = 0.0, high: float = math.inf, open_low: bool = False) -> None:
    if value is None:
        return
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value <= high
    if not ok:
        side = f"> {low:g}" if open_low else f">= {low:g}"
        upper = f" and <= {high:g}" if math.isfinite(high) else ""
        raise _bad(name, f"expected a finite number {side}{upper}, got {value!r}")


def _check_planner(name: str, planner: str, params: Any, *, migration: bool = False) -> None:
    if not isinstance(planner, str) or planner not in method_names():
        raise _bad(name, f"unknown planner {planner!r}; registered methods: {', '.join(method_names())}")
    impl = get_method(planner)
    if not impl.available():
        hint = getattr(impl, "install_hint", "a package is missing")
        raise _bad(name, f"planner {planner!r} is not available here ({hint})")
    if migration and not getattr(impl, "migration_aware", False):
        raise _bad(name, f"planner {planner!r} does not re-plan from the plan in service; use 'balance'")
    if not isinstance(params, dict):
        raise _bad("planner_params", f"expected a mapping of the planner's parameters, got {params!r}")
    if "max_moves" in params:
        raise _bad("planner_params", "the move budget is the policy's budget (or budget_bytes), not max_moves")


def policy_json(policy: Any) -> dict[str, Any]:
    """A policy's ``name`` and every parameter (a planner's parameters copied), for reports."""
    out: dict[str, Any] = {"name": policy.name}
    for f in dataclasses.fields(policy):
        v = getattr(policy, f.name)
        out[f.name] = dict(v) if isinstance(v, dict) else v
    return out


def default_interval(steps: int, window_steps: int | None) -> int:
    """Steps per interval when a policy does not say: the stream's natural window, else a
    sixteenth of the stream (at least 1)."""
    return int(window_steps) if window_steps else max(1, steps // DEFAULT_INTERVAL_SHARE)


def _slots(instance: Instance) -> int:
    return int(instance.cluster.gpus * instance.cluster.width)


# ----------------------------------------------------------------------------- the policies
@dataclass(frozen=True)
class _Timing:
    """Fields every engine-runnable policy has: when, on how many steps, with what delay."""

    interval: int | None = None  # steps between decisions (default: the stream's window, else T / 16)
    window: int | None = None  # steps planned on, ending at the decision (default: interval)
    calibration: int | None = None  # steps the first plan is made on (default: window)
    lag: int = 0  # steps between the decision and the new plan's first step
    seed: int = 0

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for key in ("interval", "window", "calibration"):
            _check_int(key, getattr(self, key), 1)
        _check_int("lag", self.lag, 0, optional=False)
        _check_int("seed", self.seed, 0, optional=False)

    def _timing(self, steps: int, window_steps: int | None) -> dict[str, Any]:
        interval = self.interval or default_interval(steps, window_steps)
        window = self.window or interval
        return {"interval": interval, "window": window, "calibration": self.calibration or window}

    def to_json(self) -> dict[str, Any]:
        """``name`` and every parameter."""
        return policy_json(self)


@dataclass(frozen=True)
class Static(_Timing):
    """Plan once on the first ``calibration`` steps and serve that plan to the end.

    ``interval`` moves nothing: it sets the default ``window`` and the blocks the worst-window
    MaxVio is read over, so that ``static`` is scored like the policies beside it.
    """

    planner: str = "balance"
    planner_params: dict[str, Any] = field(default_factory=dict)

    name: ClassVar[str] = "static"
    summary: ClassVar[str] = "plan once on a calibration prefix, never re-plan"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.planner_params, dict):
            raise _bad("planner_params", f"expected a mapping, got {self.planner_params!r}")

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Static:
        _check_planner("planner", self.planner, self.planner_params)
        return dataclasses.replace(self, **self._timing(steps, window_steps))

    def schedule(self, instance: Instance) -> Schedule:
        assert self.interval is not None and self.calibration is not None
        return Schedule(
            self.interval,
            self.calibration,
            lag=self.lag,
            replans=False,
            planner=self.planner,
            planner_params=dict(self.planner_params),
        )


@dataclass(frozen=True)
class Periodic(_Timing):
    """Every ``interval`` steps, plan afresh on the last ``window`` steps with ``planner``
    (``eplb``, ``balance``, ``joint``, ... with ``planner_params``); ``relabel: true`` renumbers
    the new plan's GPUs onto the plan in service (fewest moved slots for that plan)."""

    planner: str = "balance"
    planner_params: dict[str, Any] = field(default_factory=dict)
    relabel: bool = False

    name: ClassVar[str] = "periodic"
    summary: ClassVar[str] = "every interval steps, plan on the last window steps (SGLang / vLLM EPLB)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.relabel, bool):
            raise _bad("relabel", f"expected true or false, got {self.relabel!r}")

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Periodic:
        _check_planner("planner", self.planner, self.planner_params)
        return dataclasses.replace(self, **self._timing(steps, window_steps))

    def schedule(self, instance: Instance) -> Schedule:
        assert self.interval is not None and self.calibration is not None
        return Schedule(
            self.interval,
            self.calibration,
            lag=self.lag,
            span=self.window,
            planner=self.planner,
            planner_params=dict(self.planner_params),
            relabel=self.relabel,
        )


@dataclass(frozen=True)
class Threshold(Periodic):
    """``periodic``, re-planning only when the plan in service's mean per-step MaxVio over the
    last ``window`` steps exceeds ``level``."""

    level: float = 0.15

    name: ClassVar[str] = "threshold"
    summary: ClassVar[str] = "every interval steps, re-plan only when the last window's MaxVio exceeds level"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_number("level", self.level)

    def schedule(self, instance: Instance) -> Schedule:
        assert self.window is not None
        return dataclasses.replace(super().schedule(instance), level=float(self.level), trigger_window=self.window)


@dataclass(frozen=True)
class _Budgeted(_Timing):
    """A move budget per layer: ``budget`` slots, or ``budget_bytes`` of expert weights, else a
    ``budget_share`` of the layer's slots."""

    budget: int | None = None  # moved slots per layer per re-plan
    budget_bytes: int | None = None  # moved bytes per layer per re-plan (in whole experts)
    budget_share: float = 0.2  # without budget and budget_bytes: this share of a layer's G x W slots

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("budget", self.budget, 0)
        _check_int("budget_bytes", self.budget_bytes, 1)
        _check_number("budget_share", self.budget_share, high=1.0, open_low=True)
        if self.budget is not None and self.budget_bytes is not None:
            raise _bad("budget", "give one of budget (slots) and budget_bytes, not both")

    def _budget(self, instance: Instance) -> int:
        if self.budget is not None:
            return int(self.budget)
        if self.budget_bytes is not None:
            return int(self.budget_bytes) // instance.model.expert_size
        return max(1, math.floor(self.budget_share * _slots(instance)))


@dataclass(frozen=True)
class Incremental(_Budgeted):
    """Every ``interval`` steps, re-plan from the plan in service on the last ``window`` steps,
    moving at most the budget per layer (``balance`` from a current plan; with per-step counts it
    plans robustly over the window's steps where that pays, its ``robust: auto``)."""

    planner: str = "balance"
    planner_params: dict[str, Any] = field(default_factory=dict)

    name: ClassVar[str] = "incremental"
    summary: ClassVar[str] = "every interval steps, re-plan from the plan in service within a move budget"

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Incremental:
        _check_planner("planner", self.planner, self.planner_params, migration=True)
        return dataclasses.replace(self, **self._timing(steps, window_steps), budget=self._budget(instance))

    def schedule(self, instance: Instance) -> Schedule:
        assert self.interval is not None and self.calibration is not None
        return Schedule(
            self.interval,
            self.calibration,
            lag=self.lag,
            span=self.window,
            planner=self.planner,
            planner_params=dict(self.planner_params),
            from_current=True,
            budget=self.budget,
        )


@dataclass(frozen=True)
class Auto(_Budgeted):
    """moeopt's default: after every step, re-plan from the plan in service for a forecast of
    the coming steps, within a transfer budget per interval, and at once when the load surges.

    * **Decision points** (every ``cadence`` steps, default 1: after every step; null: every
      ``interval`` steps; with ``level``, only when the last window's mean per-step MaxVio
      exceeds it): ``balance`` from the plan in service, planned for a **forecast** of the
      coming steps made from the last ``history`` windows of ``window`` steps
      ([`moeopt.replay.forecast.forecast_loads`][]): ``forecast: level`` an exponentially
      weighted mean of the recent steps whose half-life (``halflife``; null: chosen per layer
      from the recent steps by its one-step-ahead error) follows how fast the stream moves,
      ``trend`` that plus each expert's linear trend shrunk by its standard error, ``none``
      robust over the windows as they are (each window one snapshot; ``robust``: ``mean`` plans
      for the mean per-snapshot MaxVio, ``worst`` for the worst; ``history: null``: every window
      so far, at most ``max_snapshots``). ``forecast_recent`` plans robustly for the forecast and
      the recent windows together; ``horizon`` is the steps ahead the forecast is for (null:
      the middle of the next ``cadence`` steps).
    * **Task families** (``families``): on a token trace whose tokens carry their task family,
      when the families' shares move over the regime's steps beyond sampling (``auto``: a
      chi-square test, [`moeopt.replay.mix`][]; ``always``; ``none``: never), each family's load
      over the regime's steps is planned for too, robustly beside the forecast: a plan that
      balances every family balances any mix of them, so it does not chase the mix. The regime
      starts at the last surge across which the families' own routing moved (a surge the mix
      explains keeps the steps before it); the first plan on a single step plans for them too.
      On a token trace without labels the families are the clusters of the tokens' routing
      ([`latent_families`][moeopt.replay.mix.latent_families]) where they tell tasks apart
      ([`latent_signal`][moeopt.replay.mix.latent_signal]); each re-plan is then made with and
      without them, and the one served is the kind whose plans served the steps since better.
    * **Surge watch** (``surge``; null: off): after every step, when the last steps' MaxVio
      each exceed ``surge`` times the median of the window before them (and that median by
      ``surge_margin``), re-plan at once on those steps alone; later windows start there
      ([`Schedule.surge_onset`][moeopt.replay.policies.Schedule.surge_onset]). A plan chasing a shift that has already
      happened serves the whole interval otherwise.
    * **Transfer budget**: ``budget`` (or ``budget_bytes``, else ``budget_share`` of a layer's
      slots, unrounded: ``round_down`` floors it to whole slots) moved slots per layer per
      interval, saved in a bucket of ``carry`` intervals' worth: a decision point spends at most
      one interval's worth, and only what lies above a reserve of ``carry - 1`` intervals' worth
      (for ``settle`` intervals after a surge, the reserve too); a surge spends the whole bucket
      ([`Schedule.bucket`][moeopt.replay.policies.Schedule.bucket]). ``carry: null`` makes the budget per re-plan (a
      surge then spends ``surge_budget_share`` of the slots, or the budget). ``allocate`` pools the layers'
      budgets: each layer's re-plan is made at several budgets and the moves go to the layers
      where they lower the planned-for MaxVio most per moved slot (`allocate_moves`).
    * **Acceptance**: ``accept: paired`` keeps the plan in service unless the re-plan lowers the
      planned-on steps' per-step MaxVio by ``confidence`` standard errors of the paired
      per-step differences; ``held-out`` re-plans first without the last window and keeps the
      plan in service unless that re-plan beats it so on the window it did not see (surge
      re-plans are always taken). ``min_gain``: keep the plan in service unless the re-plan
      lowers the planned-on steps' mean per-step MaxVio by that share. ``from_current: false``
      plans afresh (no budget) and, with ``relabel``, renumbers the new plan's GPUs onto the
      plan in service. ``planner_params`` go to ``balance``.

    The defaults were chosen on the bundled streams as a whole (the re-planning guide,
    "Choosing a policy: measured", and ``benchmarks/replay.py``).
    """

    budget_share: float = 0.15  # without budget and budget_bytes: this share of a layer's slots per interval
    round_down: bool = False  # floor budget_share's slots to whole slots (else the bucket fills at the share)
    history: int | None = 2  # windows planned on (None: every window so far)
    level: float | None = None  # re-plan at a decision point only above this MaxVio (None: always)
    robust: str = "mean"  # balance's robust objective over the windows
    max_snapshots: int = 16  # most snapshots one plan is made on (older windows merged)
    from_current: bool = True  # re-plan from the plan in service within the budget (False: afresh)
    relabel: bool = True  # with from_current false: renumber the fresh plan's GPUs onto the plan in service
    surge: float | None = 2.0  # watch every step: re-plan at once when MaxVio jumps this many times (None: off)
    surge_margin: float = 0.02  # ... and by at least this much MaxVio
    carry: float | None = 3.0  # the budget is per interval, saved up to this many intervals (None: per re-plan)
    surge_budget_share: float | None = None  # with carry null: a surge re-plan's budget, a share of the slots
    settle: float | None = None  # intervals after a surge in which decision points spend the reserve too
    cadence: int | None = 1  # steps between decision points (None: interval); the bucket fills per interval
    forecast: str = "level"  # plan for a forecast of the coming steps: level | trend | none (the windows)
    halflife: float | None = None  # the forecast's half-life in steps (None: chosen per layer from the steps)
    horizon: float | None = None  # steps ahead the forecast is for (None: the middle of the next cadence)
    forecast_recent: bool = False  # plan robustly for the forecast and the recent windows (False: the forecast)
    accept: str = "always"  # always | paired | held-out: when a decision point's re-plan is taken
    confidence: float = 1.0  # accept paired / held-out: standard errors the per-step gain must exceed
    allocate: bool = False  # pool the layers' budgets: moves go to the layers where they pay most
    families: str = "auto"  # plan for each task family's load too: auto (when the mix moves) | always | none
    min_gain: float | None = None  # keep the plan in service unless a re-plan gains this share (None: always)
    rate: float | None = None  # resolved: moved slots per layer the bucket gains per interval
    planner_params: dict[str, Any] = field(default_factory=dict)

    name: ClassVar[str] = "auto"
    summary: ClassVar[str] = (
        "moeopt's default: after every step, from the plan in service for a forecast of the load, "
        "a transfer budget, a surge watch"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("history", self.history, 1)
        _check_number("level", self.level)
        _check_int("max_snapshots", self.max_snapshots, 1, optional=False)
        _check_number("surge", self.surge, low=1.0)
        _check_number("surge_margin", self.surge_margin)
        _check_number("carry", self.carry, low=1.0)
        _check_number("surge_budget_share", self.surge_budget_share, high=1.0, open_low=True)
        _check_number("settle", self.settle)
        _check_int("cadence", self.cadence, 1)
        _check_number("halflife", self.halflife, open_low=True)
        _check_number("horizon", self.horizon)
        _check_number("confidence", self.confidence, low=-math.inf)
        _check_number("min_gain", self.min_gain, high=1.0)
        _check_number("rate", self.rate)
        if self.robust not in ("mean", "worst", "auto", "none"):
            raise _bad("robust", f"expected mean, worst, auto or none, got {self.robust!r}")
        if self.forecast not in FORECASTS:
            raise _bad("forecast", f"expected {', '.join(FORECASTS)}, got {self.forecast!r}")
        if self.accept not in ACCEPTS:
            raise _bad("accept", f"expected {', '.join(ACCEPTS)}, got {self.accept!r}")
        if self.families not in FAMILIES:
            raise _bad("families", f"expected {', '.join(FAMILIES)}, got {self.families!r}")
        for key in ("from_current", "relabel", "round_down", "forecast_recent", "allocate"):
            if not isinstance(getattr(self, key), bool):
                raise _bad(key, f"expected true or false, got {getattr(self, key)!r}")
        if not self.from_current and (self.budget is not None or self.budget_bytes is not None):
            raise _bad("budget", "a budget needs from_current: true (a fresh plan moves what it moves)")

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Auto:
        _check_planner("planner_params", "balance", self.planner_params, migration=True)
        if "robust" in self.planner_params or "robust_steps" in self.planner_params:
            raise _bad("planner_params", "robust mode and its snapshots are the policy's robust and history")
        timing = self._timing(steps, window_steps)
        if not self.from_current:
            return dataclasses.replace(self, **timing, budget=None, rate=None)
        rate = self.rate
        if rate is None:
            shared = self.budget is None and self.budget_bytes is None and not self.round_down
            rate = self.budget_share * _slots(instance) if shared else float(self._budget(instance))
        # a decision point moves whole slots: at most the rate's ceiling
        return dataclasses.replace(self, **timing, budget=max(1, math.ceil(rate - 1e-9)), rate=float(rate))

    def schedule(self, instance: Instance) -> Schedule:
        assert self.interval is not None and self.calibration is not None and self.window is not None
        cadence = self.cadence or self.interval
        return Schedule(
            self.interval,
            self.calibration,
            lag=self.lag,
            span=None if self.history is None else self.history * self.window,
            level=None if self.level is None else float(self.level),
            trigger_window=self.window,
            planner="balance",
            planner_params={**self.planner_params, "robust": self.robust},
            from_current=self.from_current,
            budget=self.budget,
            relabel=self.relabel and not self.from_current,
            snapshot=self.window,
            max_snapshots=self.max_snapshots,
            surge=None if self.surge is None else float(self.surge),
            surge_margin=float(self.surge_margin),
            surge_budget=None
            if self.surge_budget_share is None or not self.from_current
            else max(1, math.floor(self.surge_budget_share * _slots(instance))),
            carry=None if self.carry is None else float(self.carry),
            min_gain=None if self.min_gain is None else float(self.min_gain),
            cadence=cadence,
            rate=self.rate,
            settle=None if self.settle is None else float(self.settle),
            forecast=None
            if self.forecast == "none"
            else Forecasting(
                float(self.horizon) if self.horizon is not None else (cadence + 1) / 2.0,
                None if self.halflife is None else float(self.halflife),
                self.forecast == "trend",
                self.forecast_recent,
                self.window,
            ),
            accept=self.accept,
            confidence=float(self.confidence),
            allocate=self.allocate,
            families={"auto": MIX_P, "always": 1.0, "none": None}[self.families],
        )


@dataclass(frozen=True)
class Oracle:
    """Hindsight: each block of ``interval`` scored steps is served by a plan made on that block
    itself, from scratch, with no lag. Not runnable by an engine; the bound beside the policies."""

    interval: int | None = None
    calibration: int | None = None  # scoring starts here (default: interval), as for the others
    planner: str = "balance"
    planner_params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    name: ClassVar[str] = "oracle"
    summary: ClassVar[str] = "hindsight: every block of interval steps planned on itself (a bound, not a policy)"

    def __post_init__(self) -> None:
        _check_int("interval", self.interval, 1)
        _check_int("calibration", self.calibration, 1)
        _check_int("seed", self.seed, 0, optional=False)

    def resolve(self, steps: int, window_steps: int | None, instance: Instance) -> Oracle:
        _check_planner("planner", self.planner, self.planner_params)
        interval = self.interval or default_interval(steps, window_steps)
        return dataclasses.replace(self, interval=interval, calibration=self.calibration or interval)

    def schedule(self, instance: Instance) -> Schedule:
        assert self.interval is not None and self.calibration is not None
        return Schedule(
            self.interval,
            self.calibration,
            lookahead=True,
            planner=self.planner,
            planner_params=dict(self.planner_params),
        )

    def to_json(self) -> dict[str, Any]:
        """``name`` and every parameter."""
        return policy_json(self)


#: The policies by name.
POLICIES: dict[str, type[Any]] = {cls.name: cls for cls in (Static, Periodic, Threshold, Incremental, Auto, Oracle)}


def policy_names() -> list[str]:
    """Names of the registered policies."""
    return list(POLICIES)


def policy_fields(name: str) -> list[str]:
    """The parameters of policy ``name``."""
    return [f.name for f in dataclasses.fields(POLICIES[name])]


def make_policy(name: str, **params: Any) -> Policy:
    """The policy ``name`` with ``params`` (unknown names and parameters: one-line `InputError`).

    Parameters
    ----------
    name
        A key of `POLICIES`.
    **params
        Its parameters; see each policy's class.
    """
    if name not in POLICIES:
        raise InputError(None, "policy", f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    accepted = policy_fields(name)
    for key in params:
        if key not in accepted:
            raise InputError(
                None, f"policy.{key}", f"policy {name!r} takes no {key}; its parameters: {', '.join(accepted)}"
            )
    policy: Policy = POLICIES[name](**params)
    return policy
