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

from moeopt import console
from moeopt import joint as jm
from moeopt.balance.seeded import polish_static_positions, static_replay_fits, static_trials
from moeopt.budget import Budget
from moeopt.errors import InputError
from moeopt.joint.certify import _need_trace, certificate, certifies, single_copy_only
from moeopt.joint.choice import (
    DispatchChoice,
    _restart_rank,
    choose_dispatch,
    ladder_limits,
    mix_layers,
    restart_seed,
)
from moeopt.joint.costs import MAX_GPUS
from moeopt.joint.planner import (
    balance_starts,
    layer_problems,
    reachable_limits,
    search_flat,
    search_hierarchical,
)
from moeopt.plan import Dispatch, Plan, rule_dispatch
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status, Termination, combine_status
from moeopt.scoring import scoring_seconds
from moeopt.trace import Trace

#: wall cap (seconds of search per layer) when the caller gives no time limit: a safety net only,
#: far above what the work bound (DEFAULT_EVALUATIONS moves priced per layer) takes on a busy
#: machine, so that it does not decide the plan (at 30 s it did, beside a CPU hog, on 64 experts)
DEFAULT_TIME_PER_LAYER = 300.0
DEFAULT_EVALUATIONS = 2400
#: flat mode under an engine's rule (`moeopt.joint.RuleCost`): its priced moves cost about a third of
#: the guard's simulated ones, so three times the moves take no longer than the guard's search
#: (qwen1.5-moe, 16 x (4 + 1), CPU per layer: locality 4.8 s at 2400; lp 0.9 -> 2.5 s, static
#: 1.3 -> 3.3 s at 7200; 256 experts on 32 x (8 + 1): locality 35 s, static 10 -> 29 s) and the
#: search ends lower (held-out cut of remote GPUs under lp, qwen1.5-moe 1 slot at eps 0.9567,
#: seeds 0-2: 16.2 / 16.4 / 16.6 % -> 17.6 / 17.2 / 17.4 %; deepseek-moe-16b 17.1 -> 17.5 %,
#: moonlight-16b 14.8 -> 15.4 %; static on qwen1.5-moe 26.4 -> 27.1 %)
RULE_EVALUATIONS = 7200
#: the layer's slots (G x W) that `DEFAULT_EVALUATIONS` was measured on (64 experts on
#: 16 x (4 + 1)); in hierarchical mode the default grows with the slots past it
EVALUATIONS_SLOTS = 80
#: hierarchical mode: priced moves per `EVALUATIONS_SLOTS` slots (256 GPUs x (1 + 1): 20480). The node
#: level's search is bound by them; 4/3 of `DEFAULT_EVALUATIONS`'s rate since its priced moves got
#: that much faster (commit 5d1e1b3), so a whole DeepSeek-V3 plan takes about the time it took
#: at 2400 per 80 slots (58 layers, --workers 2, static: 463 s then, 341 s at that rate after)
HIERARCHICAL_EVALUATIONS = 3200
#: ``hierarchical`` by default from this many GPUs on a cluster of several nodes
HIERARCHICAL_GPUS = 64
#: the joint search's starts when ``starts`` is not given (``balance`` alone in hierarchical mode)
DEFAULT_STARTS = "grouping,balance"
#: the starts in hierarchical mode when ``starts`` is not given
HIERARCHICAL_STARTS = "balance"
#: ... and under SGLang ``static`` (``groups`` only where the model has expert groups): on the
#: scale benchmark's count-sampled cell lower than ``balance`` alone at every eps, within 0.6 %
#: either way on the synthetic one, while under ``even`` it lost 1.8 % on the synthetic cell
#: (benchmarks/results/joint_scale.md)
HIERARCHICAL_STATIC_STARTS = "balance,groups"
#: ... and under the rules that give every expert of a token the same copy index (SGLang ``even``: its
#: row mod c; vLLM: its row's hash; vLLM-Ascend: its rank mod c): the twin nodes too, where they pack
#: near the limit (benchmarks/results/joint_scale.md, docs/methods/joint.md)
HIERARCHICAL_INDEX_STARTS = "balance,twins"
#: the rules whose copy choice is the same copy index for every expert of a token
INDEX_RULES = ("even", "vllm", "ascend")
#: whole searches when ``restarts`` is not given (one in hierarchical mode)
DEFAULT_RESTARTS = 2
#: ... and in flat mode under SGLang's ``lp``, where they climb a ladder of search limits
#: (`ladder_limits`) and each layer's plan is picked among them (`mix_layers`): under that rule one
#: search's end varies more from seed to seed than with its depth, so more, shorter searches find
#: more (held-out cut of remote GPUs, eps at agnostic's calibration MaxVio, 4 x 7200 -> 8 x 3600
#: evaluations, the same work: count-sampled OLMoE 1 replica slot, seeds 0-3, 3.22 -> 3.73 % on
#: average (4 x 3600: 3.34 %), 2 slots seeds 0-1 4.09 -> 4.39 %; qwen1.5-moe 1 slot seeds 0-1
#: 17.39 -> 18.01 %; deepseek-moe-16b 18.47 -> 18.57 %; moonlight-16b 14.43 -> 14.00 %, where a
#: deeper search does better; 2 slots, seed 0: qwen1.5-moe 18.15 -> 18.22, deepseek-moe-16b
#: 19.07 -> 18.92, moonlight-16b 15.90 -> 15.52 %)
LP_RESTARTS = 8
#: ... sharing this many priced moves per layer (`evaluations` left to default: this over
#: ``restarts``), the work of 4 searches of `RULE_EVALUATIONS`
LP_WORK = 4 * RULE_EVALUATIONS
#: the ladder's search limits lie within these multiples of each layer's limit
LADDER_RANGE = (0.5, 2.0)
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
        ``balance`` (the balance planner's plan; in hierarchical mode its GPUs dealt to the
        nodes, `moeopt.heuristics.hierarchy.gpus_onto_nodes`), ``groups``
        (hierarchical mode, models with ``expert_groups``: each router group on as few nodes as
        its load allows, `moeopt.heuristics.hierarchy.group_node_start`), ``twins``
        (hierarchical mode, for the rules that give every expert of a token the same copy index,
        ``even`` and ``vllm`` by its row, ``ascend`` by its rank: nodes in pairs holding the same
        experts, so that each token sees half the nodes,
        `moeopt.heuristics.hierarchy.twin_node_start`; beside other starts only in the layers
        where its layout packs near the load limit). None: ``grouping``
        and ``balance``; in hierarchical mode ``balance`` (measured on DeepSeek-V3-shaped layers
        at 256 GPUs: the search from it alone, with all the evaluations, ends as low or lower
        than with ``grouping`` too), and ``balance,groups`` under SGLang ``static`` (lower than
        ``balance`` alone on the count-sampled scale cell at every eps, within 0.6 % on the
        synthetic one; under ``even`` it lost on the synthetic cell), and ``balance,twins``
        under ``even``, ``vllm`` and ``ascend`` (the scale benchmark's cells,
        `docs/methods/joint.md`).
    grouping_eps
        ``eps_load`` of the grouping start (default ``.inf``: the unconstrained grouping, whose
        locality the search then trades for balance; None: the grouping's automatic limit).
    evaluations
        Moves priced per layer, shared by the starts: the search's work bound (same seed, same
        plan on any machine). None: in flat mode `DEFAULT_EVALUATIONS`, and `RULE_EVALUATIONS`
        under an engine's rule (its moves are priced about three times faster than the guard's),
        under ``lp`` `LP_WORK` shared by the restarts (3600 each with the default 8);
        in hierarchical mode, any rule, ``HIERARCHICAL_EVALUATIONS * G * W / EVALUATIONS_SLOTS``
        when that is more than `DEFAULT_EVALUATIONS` (the node
        level's search is bound by it: DeepSeek-V3-shaped synthetic layers at 256 GPUs x
        (1 + 1) under ``even``, eps 0.2, 2 layers: 2400 -> 8000 -> 20000 evaluations gave
        6.18 -> 5.86 -> 5.64 remote nodes per token, EPLB 7.28; eps 0.3, 4 layers: 15360 ->
        20480 gave 5.847 -> 5.771 at held-out MaxVio 0.402 / 0.404).
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
        seed: ``restarts: 1`` is one search; None: 2, 8 under ``lp`` in flat mode, and 1 in
        hierarchical mode, where one search
        of a DeepSeek-V3-sized model is what fits in minutes); each gets its dispatch chosen on the calibration
        trace, and the plan with the fewest calibration remote GPUs per token among those within
        ``eps`` is kept (none within: the most balanced). Under ``lp`` (flat mode) they climb a
        ladder of search limits (`moeopt.joint.choice.ladder_limits`: the search prices each copy's
        even share, the engine's split balances below it) and each layer's plan may come from any
        of them, the mean MaxVio within ``eps`` (`moeopt.joint.choice.mix_layers`). One search
        ends at a local optimum of its sample's proxy for the dispatch, and where it ends varies with the seed more than
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
    sample_tokens: int | None = field(default=4096, metadata={"ge": 1})
    coarse_tokens: int | None = field(default=1024, metadata={"ge": 1})
    starts: str | None = None
    grouping_eps: float | None = field(default=math.inf, metadata={"inf": True})
    time_per_layer: float = DEFAULT_TIME_PER_LAYER
    evaluations: int | None = field(default=None, metadata={"ge": 1})
    candidates: int = field(default=96, metadata={"ge": 1})
    kicks: int = 8
    dispatch: str = "auto"
    tp_size: int | None = field(default=None, metadata={"ge": 1})
    lam: float | None = None
    decay: float = 0.99
    guard_batch_tokens: int | None = field(default=32, metadata={"ge": 1})
    bound_rounds: int | None = field(default=None, metadata={"ge": 1})
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
        unknown = set(self.start_list) - {"grouping", "balance", "groups", "twins"}
        if unknown or not self.start_list:
            raise ValueError(
                f"starts: expected a comma-separated subset of grouping,balance,groups,twins, got {self.starts!r}"
            )
        if not self.time_per_layer > 0:
            raise ValueError(f"time_per_layer must be > 0, got {self.time_per_layer}")
        if self.evaluations is not None and self.evaluations < 1:
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
        """The starts (``starts``, else the default: ``grouping,balance``; in hierarchical mode
        ``balance``, and ``balance,groups`` under SGLang ``static``)."""
        if self.starts is not None:
            given = self.starts
        elif not self.hierarchical:
            given = DEFAULT_STARTS
        elif self.engine_rule == "static":
            given = HIERARCHICAL_STATIC_STARTS
        elif self.engine_rule in INDEX_RULES:
            given = HIERARCHICAL_INDEX_STARTS
        else:
            given = HIERARCHICAL_STARTS
        return [s.strip() for s in given.split(",") if s.strip()]

    @property
    def engine_rule(self) -> str | None:
        """The engine rule the search prices (`moeopt.joint.RULE_KINDS`), None for the guard."""
        return self.dispatch if self.dispatch in jm.RULE_KINDS else None

    def resolved(self, problem: Problem) -> JointParams:
        """``auto`` becomes the rule of the instance's engine (``cluster.engine``) when it names one;
        ``hierarchical``, ``restarts``, ``evaluations`` and ``starts`` left to default get their
        values for the cluster and the rule."""
        out = self
        rule = problem.instance.cluster.engine_rule
        if out.dispatch == "auto" and rule is not None and rule in jm.RULE_KINDS:
            out = replace(out, dispatch=rule)
        if out.hierarchical is None:
            c = problem.instance.cluster
            out = replace(out, hierarchical=c.nodes > 1 and c.gpus >= HIERARCHICAL_GPUS)
        if out.restarts is None:
            flat = LP_RESTARTS if out.engine_rule == "lp" else DEFAULT_RESTARTS
            out = replace(out, restarts=1 if out.hierarchical else flat)
        if out.evaluations is None:
            c = problem.instance.cluster
            if out.hierarchical:
                evaluations = max(
                    DEFAULT_EVALUATIONS, round(HIERARCHICAL_EVALUATIONS * c.gpus * c.width / EVALUATIONS_SLOTS)
                )
            elif out.engine_rule == "lp":  # the ladder's restarts share the work
                evaluations = max(1, round(LP_WORK / out.restart_count))
            else:
                evaluations = RULE_EVALUATIONS if out.engine_rule is not None else DEFAULT_EVALUATIONS
            out = replace(out, evaluations=evaluations)
        if out.starts is None:  # the report names the starts the search ran from
            out = replace(out, starts=",".join(out.start_list))
        return out

    @property
    def evaluation_count(self) -> int:
        """``evaluations`` (its default when not resolved yet)."""
        return DEFAULT_EVALUATIONS if self.evaluations is None else self.evaluations

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


def static_positions(
    problem: Problem, slots: np.ndarray, seed: int, budget: Budget, layer_stats: list[dict]
) -> np.ndarray:
    """The searched plan with each layer's GPUs permuted (within nodes) for SGLang's seeded draw
    (`moeopt.balance.seeded.polish_static_positions`): the search prices a copy's share by its
    expectation, the engine deals the ranks without a near copy by each rank's own stream. Every
    GPU keeps its contents; the realized MaxVio before and after goes into ``layer_stats``."""
    dispatch = rule_dispatch("static", problem.instance.model)
    out, drawn = polish_static_positions(
        slots,
        problem.stats.expert_load,
        gpus_per_node=problem.instance.cluster.gpus_per_node,
        dense_layers=dispatch.dense_layers,
        trials=static_trials(problem.instance.cluster.gpus, problem.experts),
        seed=seed,
        deadline=budget.child(0.25).deadline,
    )
    if "static_maxvio_after" in drawn:  # else the time limit cut it: the plan as searched
        for l, ls in enumerate(layer_stats):
            ls["static_maxvio_before"] = drawn["static_maxvio_before"][l]
            ls["static_maxvio_after"] = drawn["static_maxvio_after"][l]
    return out


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
        limits, relaxed = reachable_limits(problem, balanced, params.eps, params.engine_rule, params.tp_size)
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
        certifying = certifies(problem, params)
        planning = ctx.budget.child(0.75 if certifying else 0.9)
        # under an engine rule each restart's dispatch choice is one scoring of the calibration trace, which at
        # scale takes as long as a search (SGLang static at 256 GPUs: half a second per layer): measured on one
        # layer, it is kept free of the search's share
        scoring = (
            scoring_seconds(problem.instance, trace, params.rule_dispatch(problem))
            if planning.limited and params.engine_rule is not None
            else 0.0
        )
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
        # under lp (flat), the restarts climb a ladder of search limits (`ladder_limits`)
        ladder = params.engine_rule == "lp" and not params.hierarchical
        searched = limits.copy()
        within, over = np.full(len(limits), np.nan), np.full(len(limits), np.nan)
        ladder_log: list[list[float]] = []
        try:
            took = 0.0  # the longest restart so far: another starts only if as long a one fits
            for r in range(restarts):
                if r > 0 and planning.remaining() < took:
                    skipped = restarts - r  # the time limit, not the restarts asked for, ended it
                    break
                began = time.perf_counter()
                seed = restart_seed(ctx.seed, r)
                restart = planning.child(1.0 / (restarts - r))  # this restart's share of what is left
                search = restart.child(0.5, most=max(0.0, restart.remaining() - scoring))
                searcher = search_hierarchical if params.hierarchical else search_flat
                slots, capped, layer_stats = searcher(problem, params, ctx, seed, balanced, searched, search, bar)
                c = problem.instance.cluster
                if (
                    params.engine_rule == "static"
                    and ctx.current is None
                    and static_replay_fits(c.gpus, problem.experts)
                ):
                    slots = static_positions(problem, slots, seed, restart, layer_stats)
                plan = Plan(slots=slots, experts=problem.experts)
                choice = choose_dispatch(plan, trace, problem, target, restart)
                capped += int(choice.capped)
                took = max(took, time.perf_counter() - began)
                found.append((seed, slots, capped, layer_stats, choice))
                if ladder and choice.maxvio_per_layer is not None:
                    ladder_log.append(searched.tolist())
                    reached = np.asarray(choice.maxvio_per_layer)
                    searched = ladder_limits(searched, limits, reached, within, over, LADDER_RANGE)
                if restarts > 1:
                    ctx.say(
                        f"{self.name} restart {r + 1}/{restarts} (seed {seed}): calibration "
                        f"{choice.comm:.4f} remote GPUs per token at MaxVio {choice.maxvio:.4f}"
                        f"{'' if choice.met else f' (over eps {target.eps:g})'}"
                        + (f"; searched at eps {np.mean(ladder_log[-1]):.4g} (mean over layers)" if ladder_log else "")
                    )
        finally:
            bar.close()
        best = min(range(len(found)), key=lambda i: _restart_rank(found[i][4]))
        _, slots, _, layer_stats, choice = found[best]
        mixed = None
        if ladder and len(found) > 1 and problem.instance.cluster.token_home != "previous-layer":
            # layers are independent under lp: each layer's plan from whichever restart, the mean MaxVio within eps
            comm = np.array([f[4].comm_per_layer for f in found], dtype=np.float64)
            vio = np.array([f[4].maxvio_per_layer for f in found], dtype=np.float64)
            pick = mix_layers(comm, vio, float(target.eps))
            # one more scoring of the calibration trace: only within the time limit's share for it
            if len(set(pick.tolist())) > 1 and not (planning.limited and planning.remaining() < scoring):
                mix = np.stack([found[i][1][l] for l, i in enumerate(pick)])
                mix_plan = Plan(slots=mix, experts=problem.experts)
                mixed_choice = choose_dispatch(mix_plan, trace, problem, target, planning)
                if _restart_rank(mixed_choice) < _restart_rank(choice):
                    slots, choice, mixed = mix, mixed_choice, pick.tolist()
                    layer_stats = [found[i][3][l] for l, i in enumerate(pick)]
                    ctx.say(
                        f"{self.name}: layers taken from restarts {', '.join(str(i + 1) for i in mixed)}: calibration "
                        f"{choice.comm:.4f} remote GPUs per token at MaxVio {choice.maxvio:.4f}"
                    )
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
        if ladder_log:
            stats["search_eps_per_restart"] = ladder_log
        if mixed is not None:
            stats["restart_per_layer"] = mixed
        capped = sum(f[2] for f in found)  # searches (and dispatch choices) the clock cut short, in every restart
        if relaxed:
            stats["eps_per_layer"] = limits.tolist()
            stats["eps_relaxed_layers"] = relaxed
            stats["note"] = (
                f"eps {params.eps:g} is below the least reachable MaxVio on {len(relaxed)} layer(s) (hot experts, "
                f"no slot to copy them into): those were planned at eps above it; add replica slots "
                "(cluster.replica_slots_per_gpu) to balance them"
            )
        cert = certificate(problem, slots, params, ctx, limits, choice.maxvio_per_layer)
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
            covered = result.stats.get("bound_maxvio_limit_per_layer")
            scope = ""
            if covered is not None:  # the plans within each layer's load limit (no or a few spare slots)
                lo, hi = min(covered), max(covered)
                span = f"{hi:.3g}" if hi - lo < 5e-4 else f"{lo:.3g} to {hi:.3g} by layer"
                scope = f" for plans within MaxVio {span}"
            elif not single_copy_only(problem):
                # with copies the relaxations hold no load limit: the bound is what a plan at any
                # load could reach, so a large gap at a tight eps is mostly the price of balance
                scope = " for every plan at any load (the load limit is not in the bound with copies)"
            ctx.say(
                f"{self.name}: calibration {result.objective:.4f} remote GPUs per token, lower bound {bound:.4f}"
                f"{scope}, gap {gap:.4f} ({100 * gap / max(result.objective, 1e-12):.1f} %)"
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
