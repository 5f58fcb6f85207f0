"""``joint`` and ``joint-exact``: slot contents and dispatch chosen for communication and balance.

The joint planner of SPEC section 11 (the model and the search are in `moeopt.joint`).
Per layer, on a sample of the calibration tokens, it minimizes the distinct GPUs per token
of the ideal dispatch subject to every GPU's load within ``(1 + eps)`` times the mean, on the
calibration workload and (weight ``robust``) on every family's own workload, by local search
over slot contents (swap two slots, replace a copy, move a copy) from two starts:
task-agnostic grouping plus hottest-first copies, and the balance planner's plan.

The plan's dispatch is then chosen on the whole calibration trace by the one scorer
(`moeopt.evaluate.evaluate`, what ``solve`` and ``evaluate`` report): the online guard
(``locality``) with the smallest λ whose calibration MaxVio is within ``eps`` (fewest remote
GPUs), else the most balanced of the guard and ``lp``. ``joint-exact`` solves the same model
exactly (a MILP over slot contents with the dispatch as continuous flow) on small layers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from moeopt import balance as core
from moeopt import console, execute
from moeopt import joint as jm
from moeopt.budget import Budget
from moeopt.dispatch import HOME_SEED, batch_rows
from moeopt.errors import InputError
from moeopt.evaluate import maxvio
from moeopt.heuristics import hierarchy as hier
from moeopt.joint.certify import _need_trace, certificate
from moeopt.joint.choice import (
    DispatchChoice,
    _restart_rank,
    choose_dispatch,
    restart_seed,
)
from moeopt.joint.costs import MAX_GPUS
from moeopt.joint.layers import (
    NODE_SEARCH_SHARE,
    place_layer,
    search_layer,
    search_nodes,
)
from moeopt.methods.balance import balance_bound_hook
from moeopt.methods.baselines import hottest_replicas
from moeopt.plan import Dispatch, Plan, rule_dispatch
from moeopt.registry import Context, Problem, get_method, parse_params, register
from moeopt.result import Result, Status, Termination, combine_status
from moeopt.trace import Trace

#: wall cap (seconds of search per layer) when the caller gives no time limit: a safety net only,
#: far above what the work bound (DEFAULT_EVALUATIONS moves priced per layer) takes on a busy
#: machine, so that it does not decide the plan (at 30 s it did, beside a CPU hog, on 64 experts)
DEFAULT_TIME_PER_LAYER = 300.0
DEFAULT_EVALUATIONS = 2400
#: ``hierarchical`` by default from this many GPUs on a cluster of several nodes
HIERARCHICAL_GPUS = 64
#: the joint search's starts when ``starts`` is not given (``balance`` alone in hierarchical mode)
DEFAULT_STARTS = "grouping,balance"
#: whole searches when ``restarts`` is not given (one in hierarchical mode)
DEFAULT_RESTARTS = 2
#: most whole searches ``restarts`` runs (each is a full search of every layer; past a few, the
#: best of them hardly changes and a larger value is more likely a typo than a plan)
MAX_RESTARTS = 64
#: per-layer cap on a single family's load, ``(1 + cap)`` times its mean: a shift to one task
#: family may make a GPU 2.75x as busy, not more (OLMoE count-sampled, 1 replica slot, eps 0.06:
#: the plan without it groups one domain's experts on one GPU, 3.5x that domain's mean). Tighter
#: caps cost communication (cap 1.0: 0.5-1.8 points of reduction on the synthetic instances)
DEFAULT_FAMILY_CAP = 1.75


@dataclass
class JointParams:
    """Parameters of ``joint`` (YAML ``method:`` mapping).

    Attributes
    ----------
    eps
        Load limit: largest GPU load <= ``(1 + eps)`` times the mean, on the calibration
        workload (the search's target, and the dispatch choice's constraint).
    family_eps
        The limit on each family's own workload in the search (None: ``2 * eps``; single-family
        workloads are far more skewed than their mixture).
    robust
        Weight of the family workloads in the search objective, in [0, 1].
    family_cap
        A per-layer cap on each family's own load: no GPU above ``(1 + family_cap)`` times a
        family's mean (``inf``: none). Priced like the calibration limit (``penalty`` per pair
        over, weight ``(1 - robust) * pi_f``) in a repair phase after each search that went
        over it; plans within the cap are left as they are.
    penalty
        Price, in GPUs per token, of a (token, expert) pair over a limit that no copy can take.
    sample_tokens
        Calibration tokens per layer the search accepts moves on (None: all). A small sample
        overfits: its balance does not hold on other tokens.
    coarse_tokens
        Tokens of the sub-sample that ranks the screened moves before they are priced on
        ``sample_tokens`` (None: no ranking).
    starts
        Comma-separated starts: ``grouping`` (agnostic grouping + hottest-first copies; in
        hierarchical mode the balanced copies grouped onto nodes by co-activation),
        ``balance`` (the balance planner's plan; of the nodes in hierarchical mode). None: both,
        and ``balance`` alone in hierarchical mode (measured on DeepSeek-V3-shaped layers at 256
        GPUs: the search from it alone, with all the evaluations, ends as low or lower).
    grouping_eps
        ``eps_load`` of the grouping start (default ``.inf``: the unconstrained grouping, whose
        locality the search then trades for balance; None: the grouping's automatic limit).
    evaluations
        Moves priced per layer, shared by the starts: the search's work bound (same seed, same
        plan on any machine).
    time_per_layer
        Wall cap, seconds of search per layer (``--layer-time-limit`` and ``--time-limit`` cap it further); a cap that
        binds is reported (termination ``time_limit``) and makes the plan depend on the
        machine's speed.
    candidates, kicks
        Moves screened per round; random-swap kicks of the iterated search.
    dispatch
        The rule the plan is made for and runs under. A serving engine's (`moeopt.dispatch`):
        ``even`` (SGLang dynamic), ``static`` (SGLang static, the model's dense rows), ``lp``
        (SGLang lp), ``vllm``, ``ascend`` (vLLM-Ascend): the search then prices the rule itself
        (`moeopt.joint.RuleCost`: which copy each token really gets, the rule's loads).
        Or the research rule no engine runs: ``locality`` (the load-guarded nearest copy, λ
        chosen on the calibration trace); ``auto``: the instance's engine rule
        (``cluster.engine``), else as ``locality``, with ``lp`` when no λ meets ``eps``.
    tp_size
        ``ascend``: vLLM-Ascend's tensor-parallel size.
    lam
        Fix the guard's λ (None: chosen on the calibration trace from ``1, 2, 4, ..., 128``).
    decay, guard_batch_tokens
        The guard's δ (0.99: the decayed load remembers about 100 batches, so the guard
        balances the load of the whole workload, not only the last few batches) and batch.
    family_guard
        After λ is chosen on the mixture, double it while the worst single family's calibration
        MaxVio is more than 10 % above the most balanced guard's, the mixture stays within
        ``eps`` and the communication within 2 % of the mixture's choice (a shift to one
        family is what a deployment sees; a little more λ often fixes it for little
        communication).
    restarts
        Whole searches from differently seeded starts and samples (the first with the run's
        seed: ``restarts: 1`` is one search; None: 2, and 1 in hierarchical mode, where one search
        of a DeepSeek-V3-sized model is what fits in minutes); each gets its dispatch chosen on the calibration
        trace, and the plan with the fewest calibration remote GPUs per token among those within
        ``eps`` is kept (none within: the most balanced). One search ends at a local optimum of
        its sample's proxy for the dispatch, and where it ends varies with the seed more than
        with more evaluations; the calibration trace ranks the ends as the held-out one does
        (benchmark: deepseek-moe-16b, 1 replica slot, eps 0.06, seeds 0-3: 25.9, 22.5, 24.6,
        25.5 % fewer held-out remote GPUs, in the order of their calibration figures).
    bound_rounds
        Work budget of the certificate (`moeopt.colgen.cover`: a lower bound on the remote
        GPUs per token of any plan, the result's ``bound``): master LP solves of its column
        generation per layer (None: by the layer's size, `moeopt.colgen.cover.cover_rounds`;
        its LPs are bounded by iterations too), so that the bound, like the plan, is a function of
        the input, the seed and the parameters.
    bound_time
        Outer wall-clock cap on the certificate, seconds per layer (None: none but
        the layer's share of the run's time limits); a cap that stops it is reported (termination
        ``time_limit`` and a note) and makes the bound depend on the machine's speed; 0: no
        certificate.
    hierarchical
        Plan nodes first, then GPUs inside each node (`moeopt.heuristics.hierarchy`): the
        node level minimizes remote *nodes* per token at balanced node loads (and GPU loads each
        node's copies can be packed to), the GPU level places each node's copies on its GPUs.
        None (default): on when the cluster has more than one node and at least 64 GPUs (at 64
        GPUs in 8 nodes it planned DeepSeek-V3-shaped layers with fewer remote nodes and GPUs
        than the flat search, in a third to a ninth of the time); true needs more than one node;
        false plans GPUs directly (past 64 GPUs only under an engine rule: the ``locality``
        routing holds at most 64 GPUs, or 64 nodes in hierarchical mode).
    """

    eps: float = 0.05
    family_eps: float | None = None
    robust: float = 0.1
    family_cap: float = field(default=DEFAULT_FAMILY_CAP, metadata={"inf": True})
    penalty: float = 4.0
    sample_tokens: int | None = 4096
    coarse_tokens: int | None = 1024
    starts: str | None = None
    grouping_eps: float | None = field(default=math.inf, metadata={"inf": True})
    time_per_layer: float = DEFAULT_TIME_PER_LAYER
    evaluations: int = DEFAULT_EVALUATIONS
    candidates: int = 96
    kicks: int = 8
    dispatch: str = "auto"
    tp_size: int | None = None
    lam: float | None = None
    decay: float = 0.99
    guard_batch_tokens: int | None = 32
    bound_rounds: int | None = None
    bound_time: float | None = None
    family_guard: bool = True
    restarts: int | None = field(default=None, metadata={"ge": 1, "le": MAX_RESTARTS})
    hierarchical: bool | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps}")
        if self.grouping_eps is not None and not self.grouping_eps >= 0:
            raise ValueError(f"grouping_eps must be >= 0, got {self.grouping_eps}")
        if self.family_eps is not None and not self.family_eps >= 0:
            raise ValueError(f"family_eps must be >= 0, got {self.family_eps}")
        if not 0.0 <= self.robust <= 1.0:
            raise ValueError(f"robust must lie in [0, 1], got {self.robust}")
        if not self.family_cap >= 0:
            raise ValueError(f"family_cap must be >= 0, got {self.family_cap}")
        if self.penalty < 0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}")
        if self.sample_tokens is not None and self.sample_tokens < 1:
            raise ValueError(f"sample_tokens must be >= 1, got {self.sample_tokens}")
        if self.coarse_tokens is not None and self.coarse_tokens < 1:
            raise ValueError(f"coarse_tokens must be >= 1, got {self.coarse_tokens}")
        unknown = set(self.start_list) - {"grouping", "balance"}
        if unknown or not self.start_list:
            raise ValueError(f"starts: expected a comma-separated subset of grouping,balance, got {self.starts!r}")
        if not self.time_per_layer > 0:
            raise ValueError(f"time_per_layer must be > 0, got {self.time_per_layer}")
        if self.evaluations < 1:
            raise ValueError(f"evaluations must be >= 1, got {self.evaluations}")
        if self.candidates < 1 or self.kicks < 0:
            raise ValueError("candidates must be >= 1 and kicks >= 0")
        if self.dispatch not in ("auto", "locality", *jm.RULE_KINDS):
            raise ValueError(
                f"dispatch must be one of auto, locality, {', '.join(jm.RULE_KINDS)}, got {self.dispatch!r}"
            )
        if self.tp_size is not None and self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.lam is not None and not self.lam >= 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {self.decay}")
        if self.guard_batch_tokens is not None and self.guard_batch_tokens < 1:
            raise ValueError(f"guard_batch_tokens must be >= 1, got {self.guard_batch_tokens}")
        if self.restarts is not None and not 1 <= self.restarts <= MAX_RESTARTS:
            raise ValueError(f"restarts must lie in [1, {MAX_RESTARTS}], got {self.restarts}")
        if self.bound_time is not None and not (math.isfinite(self.bound_time) and self.bound_time >= 0):
            raise ValueError(f"bound_time must be a finite number >= 0, got {self.bound_time}")
        if self.bound_rounds is not None and self.bound_rounds < 1:
            raise ValueError(f"bound_rounds must be >= 1, got {self.bound_rounds}")

    @property
    def start_list(self) -> list[str]:
        """The starts (``starts``, else the default: ``grouping,balance``; ``balance`` in
        hierarchical mode)."""
        given = self.starts if self.starts is not None else ("balance" if self.hierarchical else DEFAULT_STARTS)
        return [s.strip() for s in given.split(",") if s.strip()]

    @property
    def engine_rule(self) -> str | None:
        """The engine rule the search prices (`moeopt.joint.RULE_KINDS`), None for the guard."""
        return self.dispatch if self.dispatch in jm.RULE_KINDS else None

    def resolved(self, problem: Problem) -> JointParams:
        """``auto`` becomes the rule of the instance's engine (``cluster.engine``) when it names one;
        ``hierarchical`` and ``restarts`` left to default get their values for the cluster."""
        out = self
        rule = problem.instance.cluster.engine_rule
        if out.dispatch == "auto" and rule is not None and rule in jm.RULE_KINDS:
            out = replace(out, dispatch=rule)
        if out.hierarchical is None:
            c = problem.instance.cluster
            out = replace(out, hierarchical=c.nodes > 1 and c.gpus >= HIERARCHICAL_GPUS)
        if out.restarts is None:
            out = replace(out, restarts=1 if out.hierarchical else DEFAULT_RESTARTS)
        return out

    @property
    def restart_count(self) -> int:
        """``restarts`` (its default when not resolved yet)."""
        return DEFAULT_RESTARTS if self.restarts is None else self.restarts

    def rule_dispatch(self, problem: Problem) -> Dispatch:
        """The plan's `Dispatch` under an engine rule (SGLang static with the model's dense rows)."""
        assert self.engine_rule is not None
        if self.engine_rule == "ascend":
            return Dispatch(kind="ascend", tp_size=self.tp_size)
        return rule_dispatch(self.engine_rule, problem.instance.model)

    def guard(self, lam: float) -> Dispatch:
        return Dispatch(kind="locality", lam=lam, decay=self.decay, batch_tokens=self.guard_batch_tokens)


# ----------------------------------------------------------------------------- pieces
def layer_problems(
    problem: Problem,
    params: JointParams,
    seed: int,
    eps: np.ndarray | None = None,
    bins: tuple[int, int] | None = None,
) -> list[jm.JointLayer]:
    """One `moeopt.joint.JointLayer` per layer on a sample of the calibration trace
    (``eps``: each layer's load limit, default ``params.eps`` everywhere; ``bins``: ``(nodes,
    slots per node)`` for the hierarchical planner's node level, else the cluster's GPUs)."""
    trace = problem.trace
    assert trace is not None
    c = problem.instance.cluster
    gpus, width = (c.gpus, c.width) if bins is None else bins
    eps = np.full(problem.layers, params.eps) if eps is None else eps
    return [
        jm.layer_from_trace(
            trace.topk[:, l],
            trace.family,
            len(trace.family_names),
            experts=problem.experts,
            gpus=gpus,
            width=width,
            sample_tokens=params.sample_tokens,
            rng=np.random.default_rng([seed, l]),
            eps=float(eps[l]),
            family_eps=2.0 * float(eps[l]) if params.family_eps is None else params.family_eps,
            robust=params.robust,
            penalty=params.penalty,
            family_cap=params.family_cap,
        )
        for l in range(problem.layers)
    ]


def reachable_limits(problem: Problem, balanced: np.ndarray, eps: float) -> tuple[np.ndarray, list[int]]:
    """Each layer's load limit: ``eps``, or, on a layer where no plan in these slots comes near
    it (the balance planner's plan ``balanced [L, G, W]`` misses it on the calibration loads:
    an expert hotter than a GPU's share with no slot to copy it into), ``eps`` above what that
    plan reaches. Returns the limits and the relaxed layers.

    A target below the least reachable MaxVio leaves the search nothing but the penalty to
    minimize: it ends near the most balanced plan and gives up the communication saving
    (measured: moonlight-16b without replica slots, eps 0.05 against a least MaxVio of 0.34:
    0.4 % fewer remote GPUs per token at MaxVio 0.375; planned at 0.39: both axes better).
    """
    load = problem.stats.expert_load
    reached = np.array([float(maxvio(core.gpu_loads(balanced[l], load[l]))) for l in range(problem.layers)])
    relaxed = [l for l in range(problem.layers) if reached[l] > eps]
    limits = np.where(reached > eps, reached + eps, eps)
    return limits, relaxed


#: the last grouping starts (one per restart seed), reused while the same calibration statistics
#: are planned again (a sweep over eps solves the same groupings every time)
_START_CACHE: dict[tuple, tuple[Any, np.ndarray]] = {}


def grouping_starts(problem: Problem, ctx: Context, eps_load: float | None = None) -> np.ndarray:
    """int ``[L, G, W]``: task-agnostic grouping (TACG, beta = 0) plus hottest-first copies in
    the replica slots (the two-phase plan the joint search starts from)."""
    key = (id(problem.stats), problem.instance.cluster, eps_load, ctx.seed, ctx.time_limit)
    hit = _START_CACHE.get(key)
    if hit is not None and hit[0] is problem.stats:
        return hit[1].copy()
    impl = get_method("agnostic")
    sub = Context(time_limit=ctx.time_limit, seed=ctx.seed, budget=ctx.budget.child(0.25))
    given = {} if eps_load is None else {"eps_load": eps_load}
    start = impl.solve(problem, parse_params(impl, given), sub)
    if start.plan is None:  # e.g. a load limit it could not reach
        src = str(problem.instance.source) if problem.instance.source else None
        why = start.termination.value if start.termination is not None else start.status.value
        raise InputError(src, "method.eps_load", f"the agnostic start found no plan ({why})")
    home = start.plan.home
    c = problem.instance.cluster
    load = problem.stats.expert_load
    reps = [
        hottest_replicas(load[l], home[l], c.gpus, c.replica_slots_per_gpu, c.gpus * c.replica_slots_per_gpu)
        if c.replica_slots_per_gpu > 0
        else np.zeros((0, 2), dtype=np.int64)
        for l in range(problem.layers)
    ]
    slots = problem.plan(home, reps).slots
    if len(_START_CACHE) >= 8:  # a sweep's starts: one per restart
        _START_CACHE.clear()
    _START_CACHE[key] = (problem.stats, slots)
    return slots.copy()


def balance_starts(problem: Problem, seed: int) -> np.ndarray:
    """int ``[L, G, W]``: the balance planner's plan on the calibration loads."""
    c = problem.instance.cluster
    load = problem.stats.expert_load
    return np.stack([core.plan_layer(load[l], c.gpus, c.width, seed=seed + l) for l in range(problem.layers)])


def unplannable(problem: Problem, params: JointParams | None = None) -> tuple[str, str] | None:
    """Why ``joint`` cannot plan this cluster with ``params`` (resolved; None: the exact model's
    flat locality routing), as ``(field, message)``; None when it can.

    The ``locality`` routing holds ``MAX_GPUS`` GPUs per layer (one bit mask word per expert):
    past that ``joint`` plans for an engine rule (`moeopt.joint.RuleCost`, any size) or
    hierarchically, where the locality routing runs on nodes (at most ``MAX_GPUS`` of them)."""
    c = problem.instance.cluster
    if params is not None and params.hierarchical:
        if c.nodes < 2:
            return "method.hierarchical", "needs a cluster of several nodes (cluster.gpus_per_node below cluster.gpus)"
        if params.engine_rule is None and c.nodes > MAX_GPUS:
            return "cluster.gpus", (
                f"the locality routing plans at most {MAX_GPUS} nodes, got {c.nodes}; plan for an engine rule "
                "(method.dispatch: even, static, lp, vllm or ascend, or cluster.engine)"
            )
        return None
    if (params is None or params.engine_rule is None) and c.gpus > MAX_GPUS:
        hint = (
            "; plan for an engine rule (method.dispatch, or cluster.engine) or hierarchically (method.hierarchical)"
            if params is not None
            else "; use joint"
        )
        return "cluster.gpus", f"the locality routing plans at most {MAX_GPUS} GPUs per layer, got {c.gpus}{hint}"
    return None


def _need_routing(problem: Problem, name: str, params: JointParams | None = None) -> Trace:
    """`_need_trace`, and a one-line error when ``joint`` (``params``, resolved) or the
    exact model (None) cannot plan the cluster (`unplannable`)."""
    why = unplannable(problem, params)
    if why is not None:
        src = str(problem.instance.source) if problem.instance.source else None
        raise InputError(src, why[0], f"method {name!r}: {why[1]}")
    return _need_trace(problem, name)


def finish(
    name: str,
    problem: Problem,
    params: Any,
    slots: np.ndarray,
    t0: float,
    stats: dict,
    statuses: list[Status],
    bound: float | None = None,
    budget: Budget | None = None,
    choice: DispatchChoice | None = None,
) -> Result:
    """Pick the dispatch (within ``budget``; ``choice``: already picked), score on calibration,
    build the result."""
    plan = Plan(slots=slots, experts=problem.experts)
    if choice is None:
        choice = choose_dispatch(plan, _need_trace(problem, name), problem, params, budget)
    plan = plan.with_dispatch(choice.dispatch)
    stats = {
        **stats,
        "dispatch_choice": choice.tried,
        "calibration_maxvio": choice.maxvio,
        "calibration_worst_family_maxvio": choice.worst_family_maxvio,
        "constraint_met": choice.met,
        "copies_per_layer": [int((plan.copy_counts[l] > 1).sum()) for l in range(plan.layers)],
    }
    return Result(
        method=name,
        status=combine_status(statuses),
        plan=plan,
        objective=choice.comm,
        bound=bound,
        sense="min",
        objective_name="calibration_comm_per_token",
        wall_time=time.perf_counter() - t0,
        params=dict(vars(params)),
        stats=stats,
    )


# ----------------------------------------------------------------------------- methods
@register
class Joint:
    """Joint planner: local search over slot contents for communication at a balanced load."""

    name: ClassVar[str] = "joint"
    summary: ClassVar[str] = (
        "communication at a load limit, robust to single-family workloads: local search over slots "
        "(swap / replace / move a copy) + the guard's λ chosen on calibration"
    )
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    Params: ClassVar[type] = JointParams
    metric_hooks: ClassVar[tuple] = ()
    #: solved whole (not split per layer by the executor): one dispatch rule, with one λ,
    #: is chosen for all layers on the whole calibration trace ...
    layerwise: ClassVar[bool] = False
    #: ... but the layers' searches run on the run's executor (--workers, Ray), the same plans
    spreads_layers: ClassVar[bool] = True

    def available(self) -> bool:
        return True

    def solve(self, problem: Problem, params: JointParams, ctx: Context) -> Result:
        t0 = time.perf_counter()
        params = params.resolved(problem)
        trace = _need_routing(problem, self.name, params)
        restarts = params.restart_count
        balanced = balance_starts(problem, ctx.seed)
        limits, relaxed = reachable_limits(problem, balanced, params.eps)
        if relaxed:
            ctx.say(
                f"{self.name}: eps {params.eps:g} is below the least MaxVio any plan in these slots reaches on "
                f"{len(relaxed)} layer(s); planning those at eps above it (replica slots would reach it)"
            )
        # the dispatch is chosen for all layers at once, on the mean MaxVio over layers
        target = replace(params, eps=float(limits.mean())) if relaxed else params
        # under a time limit each phase has its share of the run's budget (L x the layer limit), so that
        # together they keep it: the restarts (search, then dispatch choice) share 75 % of it (90 %
        # without a certificate), each search half of its restart's share; the certificate gets what
        # is left, and the rest is slack for the scoring and the steps no clock can cut (a search's
        # first round). Without a limit, work alone bounds every phase.
        certifying = params.bound_time != 0 and params.engine_rule not in ("static", "ascend")
        planning = ctx.budget.child(0.75 if certifying else 0.9)
        L = problem.layers
        bar = console.bar(
            total=L * restarts,
            desc=self.name,
            unit="layer",
            disable=L * restarts <= 1,
            quiet=ctx.quiet,
            leave=False,
        )
        found: list[tuple[int, np.ndarray, int, list[dict], DispatchChoice]] = []
        skipped = 0  # restarts the time limit left out
        try:
            took = 0.0  # the longest restart so far: another starts only if as long a one fits
            for r in range(restarts):
                if r > 0 and planning.remaining() < took:
                    skipped = restarts - r  # the time limit, not the restarts asked for, ended it
                    break
                began = time.perf_counter()
                seed = restart_seed(ctx.seed, r)
                restart = planning.child(1.0 / (restarts - r))  # this restart's share of what is left
                search = restart.child(0.5)
                searcher = self._search_hierarchical if params.hierarchical else self._search
                slots, capped, layer_stats = searcher(problem, params, ctx, seed, balanced, limits, search, bar)
                plan = Plan(slots=slots, experts=problem.experts)
                choice = choose_dispatch(plan, trace, problem, target, restart)
                capped += int(choice.capped)
                took = max(took, time.perf_counter() - began)
                found.append((seed, slots, capped, layer_stats, choice))
                if restarts > 1:
                    ctx.say(
                        f"{self.name} restart {r + 1}/{restarts} (seed {seed}): calibration "
                        f"{choice.comm:.4f} remote GPUs per token at MaxVio {choice.maxvio:.4f}"
                        f"{'' if choice.met else f' (over eps {target.eps:g})'}"
                    )
        finally:
            bar.close()
        best = min(range(len(found)), key=lambda i: _restart_rank(found[i][4]))
        _, slots, _, layer_stats, choice = found[best]
        for l, ls in enumerate(layer_stats):
            ctx.say(f"{self.name} layer {l}: feasible plan, objective {ls['value']:.4f} from {ls['start']}")
        stats: dict[str, Any] = {
            "search": layer_stats,
            "search_objective": float(np.mean([s["value"] for s in layer_stats])),
            "restart": best,
            "restarts_skipped": skipped,
            "restarts": [
                {"seed": seed, "comm_per_token": c.comm, "maxvio": c.maxvio, "met": c.met} for seed, _, _, _, c in found
            ],
        }
        capped = sum(f[2] for f in found)  # searches (and dispatch choices) the clock cut short, in every restart
        if relaxed:
            stats["eps_per_layer"] = limits.tolist()
            stats["eps_relaxed_layers"] = relaxed
            stats["note"] = (
                f"eps {params.eps:g} is below the least reachable MaxVio on {len(relaxed)} layer(s) (hot experts, "
                f"no slot to copy them into): those were planned at eps above it; add replica slots "
                "(cluster.replica_slots_per_gpu) to balance them"
            )
        cert = certificate(problem, slots, params, ctx)
        bound = None
        if cert is not None:
            bound, more = cert
            stats = {**stats, **more}
        result = finish(
            self.name, problem, target, slots, t0, stats, [Status.FEASIBLE], bound, budget=ctx.budget, choice=choice
        )
        if relaxed:
            result = result.replace(params={**result.params, "eps": params.eps})
        if bound is not None and result.objective is not None:
            gap = result.objective - bound
            ctx.say(
                f"{self.name}: calibration {result.objective:.4f} remote GPUs per token, lower bound {bound:.4f}, "
                f"gap {gap:.4f} ({100 * gap / max(result.objective, 1e-12):.1f} %)"
            )
            result = result.replace(
                stats={**result.stats, "communication_lower_bound": bound, "communication_gap": gap}
            )
        cut = [f"{capped} search(es)"] if capped else []  # the clock, not the evaluations, ended them
        if skipped:
            cut.append(f"{skipped} restart(s)")
        if result.stats.get("bound_capped_layers"):  # ... or ended the certificate: the bound depends on it
            cut.append(f"the certificate in {result.stats['bound_capped_layers']} layer(s)")
        if cut:  # the plan (or the bound) depends on the machine's speed
            note = f"time limit cut {' and '.join(cut)} short"
            if "note" in result.stats:
                note = f"{result.stats['note']}; {note}"
            result = result.replace(termination=Termination.TIME_LIMIT, stats={**result.stats, "note": note})
        return result

    def _search(
        self,
        problem: Problem,
        params: JointParams,
        ctx: Context,
        seed: int,
        balanced: np.ndarray,
        limits: np.ndarray,
        search: Budget,
        bar: Any,
    ) -> tuple[np.ndarray, int, list[dict]]:
        """One whole search, seeded by ``seed``, within ``search`` (a cap: the evaluations bound
        it): every layer's search from the starts, on the run's executor. Returns the slots
        ``[L, G, W]``, the searches the clock cut short and the per-layer statistics."""
        layers = layer_problems(problem, params, seed, limits)
        load = problem.stats.expert_load
        starts: dict[str, np.ndarray] = {}
        if "grouping" in params.start_list:
            starts["grouping"] = grouping_starts(problem, replace(ctx, seed=seed, budget=search), params.grouping_eps)
        if "balance" in params.start_list:
            starts["balance"] = balanced
        if ctx.hint is not None:
            starts["hint"] = ctx.hint.padded(problem.instance.cluster.width).slots
        rules = rule_inputs(problem, params, layers, seed)
        # each layer's share of what the starts left (serial: a pool only finishes sooner)
        per_layer = min(params.time_per_layer, search.remaining() / problem.layers)
        # the layers' searches are independent: on a pool or Ray they run side by side
        items = [
            (
                layers[l],
                {k: s[l] for k, s in starts.items()},
                load[l],
                problem.experts,
                params,
                seed,
                l,
                per_layer,
                rules[l],
                ctx.budget.limited,
            )
            for l in range(problem.layers)
        ]
        found = execute.map_items(search_layer, items, ctx.executor, lambda _: bar.update())
        slots = np.stack([out["slots"] for out in found])
        return slots, sum(out["capped"] for out in found), [out["stats"] for out in found]

    def _search_hierarchical(
        self,
        problem: Problem,
        params: JointParams,
        ctx: Context,
        seed: int,
        balanced: np.ndarray,
        limits: np.ndarray,
        search: Budget,
        bar: Any,
    ) -> tuple[np.ndarray, int, list[dict]]:
        """`_search` in hierarchical mode (`moeopt.heuristics.hierarchy`), in three steps,
        the first and last per layer on the run's executor:

        1. the node level's search from its starts (``grouping``: the balanced copies grouped
           onto nodes by co-activation; ``balance``: the balance planner's plan of the nodes),
           `search_nodes`;
        2. each copy's load under the rule: ``1 / c`` of its expert's (``ascend``: the rank-modulo
           shares), and under SGLang ``static`` exactly what the engine's seeded tables deal each
           node (`moeopt.heuristics.hierarchy.static_node_shares`: they depend on every
           layer's nodes, not on the GPUs inside them);
        3. single-copy experts swapped between nodes whose copies no packing balances, then each
           node's copies placed on its GPUs (`place_layer`)."""
        c = problem.instance.cluster
        nodes, gpn, per_node = c.nodes, c.gpus_per_node, c.gpus_per_node * c.width
        L = problem.layers
        layers = layer_problems(problem, params, seed, limits, bins=(nodes, per_node))
        load = problem.stats.expert_load
        starts: dict[str, np.ndarray] = {}
        if ctx.hint is not None:
            starts["hint"] = hier.node_slots(ctx.hint.padded(c.width).slots, gpn)
        rules = rule_inputs(problem, params, layers, seed, nodes=True)
        per_layer = min(params.time_per_layer, search.remaining() / L)
        items = [
            (layers[l], {k: v[l] for k, v in starts.items()}, load[l], problem.experts, params, seed, l, per_layer)
            + (rules[l], ctx.budget.limited)
            for l in range(L)
        ]
        found = execute.map_items(search_nodes, items, ctx.executor)
        node_plans = np.stack([out["slots"] for out in found])
        rule = params.engine_rule or "even"
        if rule == "static":
            dense = params.rule_dispatch(problem).dense_layers
            shares = hier.static_node_shares(node_plans, problem.experts, gpn, c.width, dense)
        else:
            shares = np.stack(
                [hier.node_shares(node_plans[l], problem.experts, rule, gpn, params.tp_size) for l in range(L)]
            )
        placing = [
            (layers[l], node_plans[l], load[l][:, None] * shares[l], gpn, c.width, float(limits[l]), seed, l)
            + (per_layer * (1.0 - NODE_SEARCH_SHARE),)
            for l in range(L)
        ]
        placed = execute.map_items(place_layer, placing, ctx.executor, lambda _: bar.update())
        slots = np.stack([out["slots"] for out in placed])
        stats = [{**f["stats"], **p["stats"]} for f, p in zip(found, placed, strict=True)]
        return slots, sum(out["capped"] for out in found) + sum(out["capped"] for out in placed), stats


def rule_inputs(
    problem: Problem, params: JointParams, layers: list[jm.JointLayer], seed: int, nodes: bool = False
) -> list[dict | None]:
    """Per layer, `moeopt.joint.RuleCost`'s inputs on the layer's sample (None under the
    guard): each sampled token's row in its batch (`moeopt.dispatch.batch_rows`), its home
    (the trace's, else drawn uniformly with `moeopt.dispatch.HOME_SEED`, as the scorer's
    ``previous-layer`` homes are) and a fair-draw number per pair (seeded by ``(seed, l)``); with
    ``nodes``, for the hierarchical node level (``bin_size``: the cluster's GPUs per node,
    ``slot_width``: its slots per GPU)."""
    rule = params.engine_rule
    if rule is None:
        return [None] * len(layers)
    trace = problem.trace
    assert trace is not None
    c = problem.instance.cluster
    per_bin = {"bin_size": c.gpus_per_node, "slot_width": c.width} if nodes else {}
    row = batch_rows(trace, rule)
    home = trace.home if trace.home is not None else np.random.default_rng(HOME_SEED).integers(0, c.gpus, trace.tokens)
    out: list[dict | None] = []
    for l, layer in enumerate(layers):
        ids = layer.token_ids if layer.token_ids is not None else np.arange(layer.tokens)
        out.append(
            {
                "rule": rule,
                "row": row[ids],
                "home": np.asarray(home)[ids],
                "draw": np.random.default_rng([seed, l, 7]).random(layer.topk.shape),
                "gpus_per_node": c.gpus_per_node,
                "tp_size": params.tp_size,
                "homes_known": trace.home is not None,
                **per_bin,
            }
        )
    return out


@dataclass
class JointExactParams(JointParams):
    """``joint`` parameters plus the exact model's time limit per layer (None: the layer's time
    limit or 60 s) and its size limit (columns of the MILP)."""

    exact_time_limit: float | None = None
    max_columns: int = 60_000


@register
class JointExact(Joint):
    """The joint model solved exactly per layer (MILP, scipy's HiGHS): small layers only."""

    name: ClassVar[str] = "joint-exact"
    summary: ClassVar[str] = (
        "the joint model exactly: MILP over slot contents with the dispatch as continuous flow (small layers)"
    )
    Params: ClassVar[type] = JointExactParams
    spreads_layers: ClassVar[bool] = False  # its layers' MILPs run in this process

    def solve(self, problem: Problem, params: JointParams, ctx: Context) -> Result:
        if not isinstance(params, JointExactParams):
            raise TypeError(f"{self.name} takes JointExactParams, got {type(params).__name__}")
        t0 = time.perf_counter()
        _need_routing(problem, self.name)
        src = str(problem.instance.source) if problem.instance.source else None
        exact_params = replace(params, sample_tokens=params.sample_tokens)
        layers = layer_problems(problem, exact_params, ctx.seed)
        for l, layer in enumerate(layers):
            try:
                jm.check_exact_size(layer, params.max_columns)
            except ValueError as exc:
                raise InputError(src, "method", f"layer {l}: {exc}") from None
        # the exact solves share 40 % of the budget (L x the layer limit), each at most its own limit;
        # the rest goes to the local search of layers without an incumbent and the dispatch choice
        own = params.exact_time_limit or (None if ctx.budget.limited else 60.0)
        exact = ctx.budget.child(0.4)
        load = problem.stats.expert_load
        slots, statuses, bounds, fallback = [], [], [], None
        values: list[float | None] = []
        for l in ctx.layers(problem.layers, self.name):
            limit = exact.cap(min(own or math.inf, exact.remaining() / (problem.layers - l)), floor=0.05)
            res = jm.solve_exact(layers[l], time_limit=limit, max_columns=params.max_columns)
            if res.slots is None:  # no incumbent in time: the local search's plan for this layer
                if fallback is None:
                    # only its slots are used: a fixed λ spares the dispatch choice
                    searched = Joint().solve(problem, replace(params, lam=1.0, bound_time=0.0, restarts=1), ctx).plan
                    if searched is None:
                        raise RuntimeError(f"{self.name}: the local search found no plan for layer {l}")
                    fallback = searched.slots
                slots.append(fallback[l])
                statuses.append(Status.TIME_LIMIT)
                values.append(None)
            else:
                holds = np.zeros((problem.experts, problem.gpus), dtype=bool)
                g, w = np.nonzero(res.slots >= 0)
                holds[res.slots[g, w], g] = True
                slots.append(jm.fill_slots(holds, res.slots.shape[1], load[l]))
                statuses.append(Status.OPTIMAL if res.status == "optimal" else Status.TIME_LIMIT)
                values.append(res.value)
            bounds.append(res.bound)
            term = "optimal" if statuses[-1] is Status.OPTIMAL else "time_limit"  # Termination words
            value = "-" if res.value is None else f"{res.value:.6g}"
            bound = "-" if res.bound is None else f"{res.bound:.6g}"
            ctx.say(
                f"{self.name} layer {l}: {term}, {statuses[-1].solution} plan, objective {value}, bound {bound}, "
                f"{res.wall_time:.2f} s"
            )
        stats = {"model_objective_per_layer": values, "model_bound_per_layer": bounds}
        return finish(self.name, problem, params, np.stack(slots), t0, stats, statuses, budget=ctx.budget)


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
