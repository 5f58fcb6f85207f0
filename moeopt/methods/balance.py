"""``balance``: copy counts and placement decided together over all ``G x W`` slots.

The load-only planner of SPEC section 11 (the algorithm is in `moeopt.balance`): per
layer, optimal copy counts for the largest per-copy load, exact-``W`` packing (LPT and
balanced differencing, then swap / replace-a-copy local search), with a lower bound on the
largest GPU load of *every* plan, so each layer reports its gap. Works on counts alone
(SGLang dumps, CSV, npz) and on traces. Options:

* ``robust: auto | mean | worst | none`` plans on the per-step counts (trace steps, or SGLang
  ``stat`` dumps ``[steps, layers, E]``, aggregated into at most ``robust_steps`` contiguous
  windows) for the mean (or worst) per-step largest load: what out-of-sample balance needs.
  ``auto`` (the default), with per-step counts of four windows or more, plans each layer
  robustly only where that pays on held-out steps (a robust and a pooled plan made on the
  first half of the windows, scored on the second half: `moeopt.balance.robust_pays`),
  else on the pooled loads; per-family counts are used as snapshots only when ``mean`` or
  ``worst`` is asked for.
* ``spread: true`` (the default; the ``fast`` search) gives every GPU its share of the
  replicated experts' copies (``floor`` or ``ceil`` of their number over the GPUs): a plan
  packed for the calibration loads alone leaves some GPUs with single copies only, which
  can hand nothing over when the loads shift. The in-sample mean MaxVio stays within a tenth
  of plain LPT's (about EPLB's). Measured on the DeepSeek-V3 files (plan on one, score on
  the other): held-out MaxVio under ``lp`` dispatch 0.51 -> 0.41 and 0.58 -> 0.46 at
  64 x (4 + 1), in-sample MaxVio 0.0008 -> 0.0013 (EPLB: 0.019).
* ``connect`` (default: on under ``dispatch: lp``; the ``fast`` search) exchanges copies of
  replicated experts until the copy graph (GPUs joined by shared experts) is connected, then
  repairs the loads by moving single copies only: under ``lp`` a GPU hands load only along
  that graph, and packing for balance alone leaves about seven separate groups of GPUs per
  DeepSeek-V3 layer (`moeopt.balance.batch.connect_copies_batch`); with ``hierarchical``,
  inside every node (copies stay inside their node: one group per node). That is what the LP's
  optimum needs; SGLang's LP dispatch stops short of it (5 affine-scaling steps,
  `moeopt.dispatch.lplb_split`), so by default (``connect`` unset, ``dispatch: lp``) each layer
  keeps whichever of the connected and the unconnected plan the engine's own split balances
  better on the calibration loads (``stats["lp_connected_layers"]``). On the DeepSeek-V3 prefill
  loads at 64 x (4 + 1), under the engine's split: in sample 0.00176 (connected 0.00225,
  unconnected 0.00188; EPLB 0.0178), on the decode loads 0.399 (0.417, 0.420; EPLB 0.535).
* The ``fast`` search re-plans the layers it leaves more than `POLISH_GAP` (MaxVio) above
  their lower bound with the per-layer iterated local search (``thorough``'s, whose replace
  moves change the copy counts), within the time limit, keeping whichever plan is better. The
  water-filled counts it starts from make every copy of a hot expert about as heavy as the
  largest; with few slots per GPU and skewed loads more of those copies than there are GPUs
  are then heavier than half a GPU's share, and they must share GPUs. Measured on
  DeepSeek-V3-shaped synthetic loads (16 layers, 256 GPUs x (1 + 1)): mean MaxVio 0.37 -> 0.05
  in sample and 0.42 -> 0.13 on another trace of the same shape (EPLB: 0.42 held out); on the
  bundled DeepSeek-V3 files no layer of 64 x 5 or 32 x 9 is that far from its bound.
* ``hierarchical: true`` keeps every expert's copies inside one node (EPLB's hierarchical
  constraint, ``cluster.gpus_per_node``): the ``fast`` search splits the experts over the nodes
  and plans every (layer, node) at once (`moeopt.balance.batch.plan_layers_hierarchical_fast`),
  ``thorough`` node by node with the iterated local search.
* With a current plan (``solve --from PLAN``): ``max_moves`` / ``target_maxvio`` re-plan
  moving few expert weights, and the moves-vs-MaxVio frontier is reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from moeopt import balance as core
from moeopt.balance.batch import (
    copy_counts_batch,
    copy_graph_batch,
    gpu_loads_batch,
    plan_layers_fast,
    plan_layers_hierarchical_fast,
)
from moeopt.balance.bound import lower_bound_batch
from moeopt.balance.groups import expert_groups
from moeopt.balance.loads import _cap, _node_shape
from moeopt.balance.ranks import polish_rank_modulo, rank_modulo_bound, rank_modulo_loads, share_table
from moeopt.balance.seeded import polish_static_positions, static_replay_fits, static_trials
from moeopt.balance.shift import shrink_loads
from moeopt.errors import InfeasibleError, InputError
from moeopt.evaluate import maxvio
from moeopt.instance import Instance
from moeopt.plan import Dispatch, Plan, rule_dispatch
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status, Termination, bound_closes
from moeopt.schema import check_size
from moeopt.utilization import utilization_trace

#: The dispatch rules ``balance`` plans for (``locality`` needs tokens: ``joint`` plans for it).
PLANNED_RULES = ("even", "static", "lp", "vllm", "ascend")

#: Budgets (moved slots per layer) of the migration frontier reported with ``--from``.
FRONTIER_BUDGETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


def layer_bounds(
    load: np.ndarray, G: int, W: int, allow_colocated: bool, counts: np.ndarray | None = None
) -> np.ndarray:
    """float ``[L]``: lower bound on the MaxVio of every plan, layer by layer (even split);
    ``counts``: the loads' water-filled copy counts, when already computed."""
    load = np.asarray(load, dtype=np.float64)
    mean = load.sum(axis=1) / G
    bound = lower_bound_batch(load, G, W, allow_colocated, counts)
    out = np.divide(bound, mean, out=np.ones_like(bound), where=mean > 0) - 1.0
    return np.maximum(out, 0.0)


def balance_bound_hook(plan: Plan, instance: Instance, workloads: Any, metrics: dict, params: dict) -> None:
    """Metric hook: the balance lower bound on the evaluation loads and the absolute gap.

    The bound (``balance_bound_maxvio``, mean over layers) holds for every plan in the
    instance's ``G x W`` slots under the plan's rule: ``even`` (`layer_bounds`) and
    ``ascend`` (vLLM-Ascend's shares, `moeopt.balance.ranks.rank_modulo_bound`);
    ``balance_gap`` is MaxVio minus it (absolute: MaxVio's optimum can be 0). Under other
    dispatch rules only ``total / G`` is a valid bound, so nothing is added.
    """
    c = instance.cluster
    load = workloads.evaluation.expert_load
    if plan.dispatch.kind == "even":
        bounds = layer_bounds(load, c.gpus, c.width, c.allow_colocated_copies)
    elif plan.dispatch.kind == "ascend":
        table = share_table(c.gpus, load.shape[1], plan.dispatch.tp_size)
        mean = load.sum(axis=1) / c.gpus
        raw = np.array([rank_modulo_bound(row, c.gpus, c.width, table) for row in load])
        bounds = np.maximum(np.divide(raw, mean, out=np.ones(len(raw)), where=mean > 0) - 1.0, 0.0)
    else:
        return
    metrics["balance_bound_maxvio"] = float(bounds.mean())
    metrics["balance_bound_per_layer"] = bounds.tolist()
    metrics["balance_gap"] = float(metrics["maxvio"] - bounds.mean())
    metrics["balance_gap_per_layer"] = (np.asarray(metrics["maxvio_per_layer"]) - bounds).tolist()


#: under a time limit, a robust layer's share of its time for the test of whether robust planning
#: pays (`moeopt.balance.robust_pays`), then of what is left for the robust plan's descent (both
#: stop at their deadline with the plan they have; the rest: the moves from a current plan, the
#: polish)
ROBUST_TEST_SHARE = 0.4
ROBUST_PLAN_SHARE = 0.9

#: the fast search's layers whose MaxVio lies more than this above their lower bound are
#: re-planned by the per-layer iterated local search (`moeopt.balance.plan_layer`), the better
#: plan kept (`moeopt.balance.batch.plan_layers_fast`'s ``polish_above``)
POLISH_GAP = 0.05

#: per-step counts are aggregated into at most this many contiguous windows for robust mode
#: (the planner's time grows with the snapshots; 16 windows kept its held-out gains, measured)
DEFAULT_ROBUST_STEPS = 16


def has_steps(problem: Problem) -> bool:
    """Whether the calibration statistics hold per-step counts of two steps or more."""
    sc = problem.stats.step_counts
    return sc is not None and sc.shape[1] > 1


def robust_mode(problem: Problem, robust: str, hierarchical: bool = False) -> str:
    """``robust``, with ``auto`` kept only when there are per-step counts and no hierarchical
    constraint (robust plans do not keep it), else ``none``."""
    if robust != "auto":
        return robust
    return "auto" if has_steps(problem) and not hierarchical else "none"


def robust_snapshots(problem: Problem, windows: int = DEFAULT_ROBUST_STEPS) -> np.ndarray:
    """float ``[L, T, E]``: the load snapshots robust mode plans for: per-step counts (trace
    steps, SGLang ``stat`` dumps; their mean over at most ``windows`` contiguous windows, 0: every
    step), else one snapshot per family (e.g. per-domain counts)."""
    stats = problem.stats
    if has_steps(problem):
        assert stats.step_counts is not None
        return utilization_trace(stats.step_counts, windows if windows > 0 else None).counts
    if stats.families > 1:
        return np.swapaxes(stats.counts, 0, 1)
    raise InputError(
        str(problem.instance.source) if problem.instance.source else None,
        "method.robust",
        "robust mode needs several load snapshots: per-step counts (a trace with 'step', an SGLang "
        "stat dump) or per-family counts",
    )


def check_hierarchical(problem: Problem) -> None:
    """Raise `InfeasibleError` when the nodes cannot hold their experts under the
    hierarchical constraint (`moeopt.balance.loads._node_shape`), saying what would fix it."""
    c = problem.instance.cluster
    try:
        _node_shape(problem.experts, c.gpus, c.width, c.gpus_per_node, c.allow_colocated_copies)
    except ValueError as exc:
        src = f"{problem.instance.source}: " if problem.instance.source else ""
        raise InfeasibleError(f"{src}method.hierarchical: {exc}") from None


@dataclass
class BalanceParams:
    """Parameters of ``balance``."""

    search: str = "fast"  # fast: all layers at once (batched LPT + swaps); thorough: per layer, ILS
    shrink: float | None = None  # alpha < 1 plans on mean * (load / mean) ** alpha: hedges a shift
    robust: str = "auto"  # auto | none | mean | worst: plan on per-step counts (auto: mean when there are steps)
    robust_steps: int = DEFAULT_ROBUST_STEPS  # per-step counts aggregated into at most this many windows (0: all)
    hierarchical: bool = False  # every expert's copies in one node (cluster.gpus_per_node)
    iterations: int = core.DEFAULT_ITERATIONS  # perturbation rounds of the local search
    # the rule the plan runs under and is planned for: even (EPLB's model, SGLang dynamic), static, lp,
    # vllm, ascend (vLLM-Ascend: the placement is polished for its rank-modulo shares); None: the
    # instance's cluster.engine rule, else even
    dispatch: str | None = None
    # ascend: the engine's tensor-parallel size (copy (r mod tp + r div tp + e) mod c)
    tp_size: int | None = field(default=None, metadata={"ge": 1})
    max_moves: int | None = None  # with a current plan: moved slots per layer at most
    target_maxvio: float | None = None  # with a current plan: stop moving once reached
    # with a current plan: also report the moves-vs-MaxVio frontier (one re-plan per budget; off for
    # a loop that re-plans often, e.g. the replay)
    migration_frontier: bool = True
    spread: bool = True  # fast search: every GPU gets its share of the replicated experts' copies
    connect: bool | None = None  # fast search: connect the copy graph (None: when dispatch is lp)
    # fast search: every GPU its share of each expert group's load (None: when model.expert_groups is
    # set and the plan is neither connected nor hierarchical)
    group_spread: bool | None = None
    polish: str = "none"  # cpsat: CP-SAT re-plans every small layer (counts and placement), with a proved bound
    polish_time: float = 1.0  # seconds of CP-SAT per layer (the time limits cap the total)
    # only layers of at most this many slots (G x W) are polished
    polish_slots: int = field(default=128, metadata={"ge": 1})

    def __post_init__(self) -> None:
        if self.search not in ("fast", "thorough"):
            raise ValueError(f"search must be fast or thorough, got {self.search!r}")
        if self.shrink is not None and not (np.isfinite(self.shrink) and 0 < self.shrink <= 1):
            raise ValueError(f"shrink must lie in (0, 1], got {self.shrink}")
        if self.robust not in ("auto", "none", "mean", "worst"):
            raise ValueError(f"robust must be auto, none, mean or worst, got {self.robust!r}")
        if self.robust_steps < 0:
            raise ValueError(f"robust_steps must be >= 0, got {self.robust_steps}")
        if self.hierarchical and self.robust in ("mean", "worst"):
            raise ValueError("robust mode does not keep the hierarchical constraint: set one of robust, hierarchical")
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        if self.max_moves is not None and self.max_moves < 0:
            raise ValueError(f"max_moves must be >= 0, got {self.max_moves}")
        if self.target_maxvio is not None and not (np.isfinite(self.target_maxvio) and self.target_maxvio >= 0):
            raise ValueError(f"target_maxvio must be a finite number >= 0, got {self.target_maxvio}")
        if self.connect and self.search != "fast":
            raise ValueError(
                "connect is a step of the fast search: it does not go with search: thorough "
                "(set connect: false, or leave it out)"
            )
        if self.group_spread and (self.search != "fast" or self.connects or self.hierarchical):
            raise ValueError(
                "group_spread is a step of the fast flat search: it does not go with search: thorough, "
                "hierarchical or connect (the default under dispatch: lp)"
            )
        if self.polish not in ("none", "cpsat"):
            raise ValueError(f"polish must be none or cpsat, got {self.polish!r}")
        if not (np.isfinite(self.polish_time) and self.polish_time > 0):
            raise ValueError(f"polish_time must be a finite number > 0, got {self.polish_time}")
        if self.polish_slots < 1:
            raise ValueError(f"polish_slots must be >= 1, got {self.polish_slots}")
        if self.dispatch is not None and self.dispatch not in PLANNED_RULES:
            raise ValueError(f"dispatch must be one of {', '.join(PLANNED_RULES)}, got {self.dispatch!r}")
        if self.tp_size is not None and self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")

    def groups_spread(self, expert_groups: int | None) -> bool:
        """Whether the fast search spreads the expert groups: as asked, else when the model has
        expert groups and the search is fast, flat and does not connect the copy graph."""
        if self.group_spread is not None:
            return self.group_spread
        return expert_groups is not None and self.search == "fast" and not self.connects and not self.hierarchical

    @property
    def connects(self) -> bool:
        """Whether the fast search connects the copy graph (with ``hierarchical``, inside every
        node): as asked, else under ``lp`` dispatch."""
        return self.dispatch == "lp" if self.connect is None else self.connect

    def resolved(self, instance: Instance) -> BalanceParams:
        """These parameters with ``dispatch`` decided: as given, else the rule of the instance's
        engine (``cluster.engine``), else ``even``."""
        if self.dispatch is not None:
            return self
        rule = instance.cluster.engine_rule or "even"
        if rule not in PLANNED_RULES:  # pragma: no cover - every engine runs a planned rule
            rule = "even"
        return replace(self, dispatch=rule)

    def rule(self, instance: Instance) -> Dispatch:
        """The plan's [`Dispatch`][moeopt.plan.Dispatch] (SGLang static with the model's dense rows; Ascend with
        ``tp_size``)."""
        kind = self.dispatch or "even"
        if kind == "ascend":
            return Dispatch(kind="ascend", tp_size=self.tp_size)
        return rule_dispatch(kind, instance.model)


@register
class Balance:
    """The load-balance planner: beats EPLB with a per-layer lower bound."""

    name: ClassVar[str] = "balance"
    summary: ClassVar[str] = (
        "copy counts + exact-W packing + swap/replace search over all slots, with a lower bound (beats EPLB)"
    )
    requires: ClassVar[frozenset[str]] = frozenset()
    Params: ClassVar[type] = BalanceParams
    metric_hooks: ClassVar[tuple] = (balance_bound_hook,)
    migration_aware: ClassVar[bool] = True
    #: solved layer by layer (moeopt.execute); peak/mean load and its bound average over layers
    combine: ClassVar[str] = "mean"
    #: the batched planner does all layers in one pass (much faster than one call per layer) ...
    layerwise: ClassVar[bool] = False
    uses_trace: ClassVar[bool] = False

    def split_layers(self, problem: Problem, params: BalanceParams, ctx: Context | None) -> bool:
        """... but robust planning on per-step counts, migration from a current plan and the
        thorough search work layer by layer: then the layers
        are split (moeopt.execute), so ``--workers`` and Ray spread them, and the serial run
        gives the same plan (every layer with its own seed)."""
        robust = robust_mode(problem, params.robust, params.hierarchical)
        current = ctx is not None and ctx.current is not None
        return current or robust != "none" or params.search != "fast"

    def _polish(
        self,
        problem: Problem,
        params: BalanceParams,
        ctx: Context,
        slots: np.ndarray,
        load: np.ndarray,
        stats: dict[str, Any],
    ) -> np.ndarray:
        """CP-SAT on every layer of at most ``polish_slots`` slots (no colocated copies, no current
        plan: a polished layer may move any copy): ``slots`` improved in place where CP-SAT finds
        better; returns the MaxVio lower bounds it proves per layer (0 where it proves nothing)."""
        from moeopt.balance.exact import polish_layer

        c = problem.instance.cluster
        G, W = c.gpus, c.width
        L = load.shape[0]
        out = np.zeros(L)
        # what CP-SAT's model (pooled loads, even split, free placement) would not keep
        why = [
            (c.allow_colocated_copies, "allow_colocated_copies"),
            (ctx.current is not None, "a current plan (solve --from)"),
            (params.hierarchical, "hierarchical (copies in one node)"),
            (params.connects, "a connected copy graph (dispatch: lp)"),
            (
                stats.get("robust") in ("mean", "worst") or stats.get("robust_layers", 0) > 0,
                "layers planned robustly on the steps",
            ),
            (G * W > params.polish_slots, f"{G} x {W} slots > polish_slots = {params.polish_slots}"),
        ]
        skip = next((reason for cond, reason in why if cond), None)
        if skip is not None:
            stats["polish"] = f"skipped: {skip}"
            return out
        improved, optimal = 0, 0
        for l in ctx.layers(L, "cpsat polish"):
            seconds = ctx.budget.cap(params.polish_time)
            if seconds <= 0:
                break
            r = polish_layer(load[l], slots[l], time_limit=seconds, seed=ctx.seed + l)
            slots[l] = r.slots
            mean = load[l].sum() / G
            out[l] = max(r.bound / mean - 1.0, 0.0) if mean > 0 else 0.0
            improved += int(r.improved)
            optimal += int(r.status == "OPTIMAL")
            ctx.say(f"cpsat polish layer {l}: {r.status.lower()}, bound {out[l]:.4g}")
        stats.update(polish="cpsat", polished_layers_improved=improved, polished_layers_optimal=optimal)
        return out

    @staticmethod
    def _polish_ascend(slots: np.ndarray, load: np.ndarray, l: int, table: np.ndarray) -> int:
        """Layer ``l`` of ``slots`` polished in place for vLLM-Ascend's shares; the swaps made."""
        slots[l], swaps = polish_rank_modulo(slots[l], load[l], table)
        return swaps

    def combine_stats(self, per_layer: list[dict], params: BalanceParams) -> dict:
        """The layers' statistics; the migration frontier adds moves and averages MaxVio."""
        from moeopt.execute import combine_stats

        rest = [{k: v for k, v in s.items() if k != "migration_frontier"} for s in per_layer]
        out = combine_stats(rest, self.combine, {"robust_snapshots": "max", "plan_time": "sum"})
        fronts = [s["migration_frontier"] for s in per_layer if "migration_frontier" in s]
        if fronts:
            out["migration_frontier"] = [
                {
                    "budget": point["budget"],
                    "moves": int(sum(f[i]["moves"] for f in fronts)),
                    "maxvio": float(np.mean([f[i]["maxvio"] for f in fronts])),
                }
                for i, point in enumerate(fronts[0])
            ]
        return out

    def available(self) -> bool:
        return True

    def solve(self, problem: Problem, params: BalanceParams, ctx: Context) -> Result:
        t0 = time.perf_counter()
        params = params.resolved(problem.instance)
        if params.hierarchical:
            check_hierarchical(problem)
        c = problem.instance.cluster
        G, W, L = c.gpus, c.width, problem.layers
        load = problem.stats.expert_load  # [L, E]
        allow = c.allow_colocated_copies
        # water-filling prices (and sorts) every copy level of every expert: a clear error before numpy's
        levels = _cap(problem.experts, G, W, allow)
        check_size(
            f"layers x copy levels x experts ({L} x {levels} x {problem.experts})",
            L * levels * problem.experts,
            str(problem.instance.source) if problem.instance.source else None,
            "cluster.gpus",
            itemsize=32,  # the prices, their sort order and the counts' temporaries
        )
        robust = robust_mode(problem, params.robust, params.hierarchical)
        steps = robust_snapshots(problem, params.robust_steps) if robust != "none" else None
        current = ctx.current
        true_load = load
        if params.shrink is not None:  # plan on loads pulled toward the mean (held-out shift)
            load = np.stack([shrink_loads(row, params.shrink) for row in load])
        slots = np.empty((L, G, W), dtype=np.int64)
        # the unconstrained plan of every layer at once (batched), unless a mode needs per-layer work
        fast = params.search == "fast" and robust in ("none", "auto")
        t_plan = time.perf_counter()
        base = None
        stats: dict[str, Any] = {"robust": robust}
        n_groups = problem.instance.model.expert_groups
        if params.group_spread and n_groups is None:
            raise InputError(
                str(problem.instance.source) if problem.instance.source else None,
                "model.expert_groups",
                "method.group_spread needs the router's expert groups (DeepSeek-V3: 8)",
            )
        spread_groups = fast and params.groups_spread(n_groups)
        # the water-filled copy counts, shared by the batched planner and the bound
        counts = copy_counts_batch(true_load, G * W, _cap(problem.experts, G, W, allow)) if fast else None

        # the layers the fast search leaves far above their bound are polished (not when connecting);
        # without shrink the planned loads are the true ones, and their bound is the one reported
        true_bounds = None
        polish_above = None
        if fast and not params.hierarchical:
            true_bounds = layer_bounds(true_load, G, W, allow, counts)
            planned = true_bounds if params.shrink is None else layer_bounds(load, G, W, allow)
            polish_above = planned + POLISH_GAP

        def fast_plans(connect: bool) -> np.ndarray:
            spread = replace(params, connect=connect).groups_spread(n_groups)
            if params.hierarchical:
                return plan_layers_hierarchical_fast(
                    load, G, W, c.gpus_per_node, allow_colocated=allow, spread=params.spread, connect=connect
                )
            return plan_layers_fast(
                load,
                G,
                W,
                allow_colocated=allow,
                spread=params.spread,
                connect=connect,
                counts=counts if params.shrink is None else None,
                groups=expert_groups(problem.experts, n_groups) if spread and n_groups else None,
                polish_above=None if connect else polish_above,
                polish_deadline=ctx.budget.child(0.5).deadline,
            )

        if fast:
            base = fast_plans(params.connects)
            if not params.hierarchical:
                stats["group_spread"] = bool(spread_groups and n_groups)
            if params.dispatch == "lp" and params.connect is None:
                # SGLang's LP dispatch stops short of the LP's optimum that connecting aims at: per
                # layer, keep the plan its own split balances better on the calibration loads
                base, stats["lp_connected_layers"] = _lp_choice(base, fast_plans(False), true_load)
        if base is not None and current is None:
            slots[:] = base
        step_objective: core.Objective = "worst" if robust == "worst" else "mean"
        if steps is not None:
            stats["robust_snapshots"] = int(steps.shape[1])
        moves: list[int] = []
        frontier: list[list[tuple[int, float]]] = []

        def pooled_plan(l: int) -> np.ndarray:
            """Layer ``l`` planned on its pooled loads, one layer at a time."""
            return core.plan_layer(
                load[l],
                G,
                W,
                allow_colocated=allow,
                seed=ctx.seed + l,
                iterations=params.iterations,
                gpus_per_node=c.gpus_per_node,
                hierarchical=params.hierarchical,
            )

        pooled_layers = robust_layers = 0
        looped = L if current is not None or base is None or robust == "auto" else 0
        for l in ctx.layers(looped, self.name):
            lb = ctx.budget.child(1.0 / (L - l))  # this layer's share of what is left (a clock only under a limit)
            if current is not None:
                cur = current.slots[l]
                # with snapshots, every candidate is scored on them; the unconstrained plan is the
                # robust one where planning on them pays (always with an explicit mode), as planned
                # without a current plan, so that no budget reaches its objective
                by_steps = None if steps is None else steps[l]
                if by_steps is not None and (
                    robust != "auto"
                    or core.robust_pays(
                        by_steps,
                        G,
                        W,
                        allow_colocated=allow,
                        seed=ctx.seed,
                        iterations=params.iterations,
                        deadline=lb.child(ROBUST_TEST_SHARE).deadline,
                    )
                ):
                    robust_layers += 1
                    free = core.plan_layer_robust(
                        by_steps,
                        G,
                        W,
                        step_objective,
                        allow_colocated=allow,
                        seed=ctx.seed,
                        iterations=params.iterations,
                        deadline=lb.child(ROBUST_PLAN_SHARE).deadline,
                    )
                elif base is not None:
                    free = base[l]
                else:
                    free = core.plan_layer(
                        load[l], G, W, allow_colocated=allow, seed=ctx.seed + l, iterations=params.iterations
                    )
                migrate: dict[str, Any] = {
                    "allow_colocated": allow,
                    "seed": ctx.seed,
                    "iterations": params.iterations,
                    "unconstrained": free,
                    "steps": by_steps,
                    "objective": step_objective,
                }
                slots[l] = core.replan_from(
                    cur, load[l], max_moves=params.max_moves, target_maxvio=params.target_maxvio, **migrate
                )
                moves.append(core.count_moves(cur, slots[l]))
                if params.migration_frontier:
                    frontier.append(core.migration_frontier(cur, load[l], FRONTIER_BUDGETS, **migrate))
            elif (
                robust == "auto"
                and steps is not None
                and not core.robust_pays(
                    steps[l],
                    G,
                    W,
                    allow_colocated=allow,
                    seed=ctx.seed,
                    iterations=params.iterations,
                    deadline=lb.child(ROBUST_TEST_SHARE).deadline,
                )
            ):
                pooled_layers += 1  # the pooled plan (the batched one when there is one)
                if base is None:
                    slots[l] = pooled_plan(l)
            elif robust != "none":
                assert steps is not None
                slots[l] = core.plan_layer_robust(
                    steps[l],
                    G,
                    W,
                    step_objective,
                    allow_colocated=allow,
                    seed=ctx.seed,
                    iterations=params.iterations,
                    deadline=lb.child(ROBUST_PLAN_SHARE).deadline,
                )
            else:
                slots[l] = pooled_plan(l)
        if robust == "auto":  # layers where planning on the steps paid
            stats["robust_layers"] = robust_layers if current is not None else L - pooled_layers
        exact_bounds = None
        if params.polish == "cpsat":
            exact_bounds = self._polish(problem, params, ctx, slots, true_load, stats)
        rule = params.rule(problem.instance)
        table = None
        if rule.kind == "ascend":  # vLLM-Ascend's unequal shares: re-deal the copies for them
            table = share_table(G, problem.experts, rule.tp_size)
            if current is None:
                swaps = [self._polish_ascend(slots, true_load, l, table) for l in ctx.layers(L, "ascend shares")]
                stats["ascend_swaps"] = int(sum(swaps))
            else:  # a swap moves two expert weights: a re-plan keeps its budget instead
                stats["ascend_swaps"] = 0
        if rule.kind == "static" and current is None and not static_replay_fits(G, problem.experts):
            stats["static_polish"] = (
                f"skipped: replaying SGLang's draw at {G} GPUs x {problem.experts} experts takes seconds a layer"
            )
        elif rule.kind == "static" and current is None:
            # SGLang's seeded draw deals the copies unevenly: the single-copy experts, which no draw
            # concerns, are re-dealt for the draw's loads (within router groups when they were spread)
            spread = n_groups if stats.get("group_spread") and n_groups else None
            slots, drawn = polish_static_positions(
                slots,
                true_load,
                gpus_per_node=problem.instance.cluster.gpus_per_node,
                dense_layers=rule.dense_layers,
                trials=max(1, static_trials(G, problem.experts) // 4),
                seed=ctx.seed,
                deadline=ctx.budget.child(0.5).deadline,
                repack=True,
                groups=None if spread is None else expert_groups(problem.experts, spread),
            )
            stats.update(drawn)
            if "static_polish_cut" in drawn:
                stats["static_polish"] = (
                    f"cut by the time limit at layer {drawn['static_polish_cut']}: the plan keeps its positions"
                )
        plan = Plan(slots=slots, experts=problem.experts, dispatch=rule)
        stats["plan_time"] = time.perf_counter() - t_plan  # the planner alone, bounds and scoring excluded
        if table is not None:  # the rule's own loads and bound
            loads_by_rule = np.stack([rank_modulo_loads(slots[l], true_load[l], table) for l in range(L)])
            per_layer = maxvio(loads_by_rule)
            mean = true_load.sum(axis=1) / G
            raw = np.array([rank_modulo_bound(true_load[l], G, W, table) for l in range(L)])
            bounds = np.maximum(np.divide(raw, mean, out=np.ones(L), where=mean > 0) - 1.0, 0.0)
        else:
            per_layer = maxvio(gpu_loads_batch(slots, true_load))  # every layer at once
            bounds = true_bounds if true_bounds is not None else layer_bounds(true_load, G, W, allow, counts)
        if exact_bounds is not None and table is None:  # CP-SAT's proved bounds (even split), where higher
            bounds = np.maximum(bounds, exact_bounds)
        if rule.kind == "static":  # the rule's own loads (the draw replayed); only total / G bounds every plan
            if "static_maxvio_after" in stats:
                per_layer = np.asarray(stats["static_maxvio_after"], dtype=np.float64)
            bounds = np.zeros(L)
        stats["calibration_maxvio_per_layer"] = per_layer.tolist()
        stats["bound_maxvio_per_layer"] = bounds.tolist()
        stats["gap_per_layer"] = (per_layer - bounds).tolist()
        # groups of GPUs joined by shared experts: under lp dispatch load moves only within one
        stats["copy_graph_components_per_layer"] = copy_graph_batch(slots, plan.copy_counts)[1].tolist()
        if current is not None:
            stats["moves_per_layer"] = moves
            stats["moves"] = int(sum(moves))
            # what the migration frontier's MaxVio (and target_maxvio) is read as
            stats["migration_objective"] = "pooled" if steps is None else f"{step_objective} per-step"
            if frontier:
                stats["migration_frontier"] = [
                    {
                        "budget": b,
                        "moves": int(sum(f[i][0] for f in frontier)),
                        "maxvio": float(np.mean([f[i][1] for f in frontier])),
                    }
                    for i, b in enumerate(FRONTIER_BUDGETS)
                ]
        # largest GPU load over the mean (1 + MaxVio): its optimum is >= 1, so the relative gap
        # to the bound means something even when MaxVio itself is near 0
        objective = 1.0 + float(per_layer.mean())
        bound = 1.0 + float(bounds.mean())
        status = Status.OPTIMAL if bound_closes(objective, bound) else Status.FEASIBLE
        return Result(
            method=self.name,
            status=status,
            plan=plan,
            objective=objective,
            bound=bound,
            sense="min",
            objective_name="peak/mean load",
            wall_time=time.perf_counter() - t0,
            params=dict(vars(params)),
            stats=stats,
            # the time limit cut the static polish short: the plan depends on the machine's speed
            termination=Termination.TIME_LIMIT if "static_polish_cut" in stats else None,
        )


def _lp_choice(connected: np.ndarray, plain: np.ndarray, load: np.ndarray) -> tuple[np.ndarray, int]:
    """Per layer, the one of two plans ``[L, G, W]`` whose GPU loads under SGLang's LP dispatch
    (`moeopt.dispatch.lplb_loads`, the engine's split, as the scorer computes it) have the
    smaller largest load on ``load [L, E]`` (ties: ``connected``); and how many layers kept the
    connected plan."""
    from moeopt.dispatch import lplb_loads

    def peak(slots: np.ndarray) -> np.ndarray:
        return np.array([lplb_loads(load[l : l + 1], slots[l]).max() for l in range(len(slots))])

    keep = peak(connected) <= peak(plain)
    return np.where(keep[:, None, None], connected, plain), int(keep.sum())
