"""GEM (SPEC section 5): GPU-variability-aware expert mapping minimizing straggler latency.

Methods registered here:

- ``gem``: multi-start pairwise-swap search with perturbation (the default engine);
- ``gem-milp``: the exact MILP (Pyomo + HiGHS), warm-started by ``gem``;
- ``gem-cpsat``: the exact CP-SAT model, hinted by ``gem``;
- ``speed-greedy``: LPT on mean loads weighted by GPU speed (a GEM baseline).

Every method's objective is ``S(M) = sum_l sum_t max_g C_g(n_g(M, t))`` on the calibration
utilization trace (T step groups), recomputed by [`moeopt.evaluate.layer_straggler`][].
Importing this module also registers two hooks: every result with a latency profile gets
``metrics.straggler_lower_bound`` and ``metrics.gap_to_bound``, and ``trace stats`` shows
GEM's expert classification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from moeopt.budget import Budget
from moeopt.errors import InputError
from moeopt.evaluate import layer_straggler
from moeopt.heuristics.gem_search import SearchSettings, search_layer, speed_greedy_homes
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status, Termination, bound_closes, combine_status, combine_termination
from moeopt.solvers import CPSAT, PYOMO_HIGHS
from moeopt.solvers import available as solver_available
from moeopt.solvers.pyomo_solvers import check_solver, require
from moeopt.utilization import (
    DEFAULT_STEPS,
    Utilization,
    step_lower_bound,
    straggler_bound_hook,
    utilization_trace,
)

OBJECTIVE = "straggler_latency"
#: the exact GEM solvers' share of each layer's time (the rest: building the model and reading
#: the answer, which the solver's clock does not count; Pyomo builds far slower than CP-SAT)
SOLVER_SHARE = {"cpsat": 0.8, "milp": 0.6}


def problem_utilization(problem: Problem, steps: int | None) -> Utilization:
    """The calibration utilization trace ``n[l, t, e]`` aggregated into ``steps`` groups.

    Parameters
    ----------
    problem
        The method's problem (its statistics must hold per-step counts).
    steps
        Number of step groups T; None keeps every step.

    Returns
    -------
    Utilization
        Counts ``[L, T, E]`` and the grouping.

    Raises
    ------
    InputError
        When the calibration workload has no per-step counts.
    """
    if problem.stats.step_counts is None:
        raise InputError(None, "workload.calibration", "GEM needs per-step counts (a trace with 'step')")
    return utilization_trace(problem.stats.step_counts, steps)


def plan_straggler(home: np.ndarray, util: Utilization, problem: Problem) -> float:
    """Straggler latency S(M) of homes ``[L, E]`` on the utilization trace, summed over layers.

    Parameters
    ----------
    home
        int ``[L, E]`` home GPU of each expert.
    util
        The utilization trace.
    problem
        The problem (for its profile).

    Returns
    -------
    float
        ``sum_l sum_t max_g C_g(n_g(M, t))``, from the evaluator's
        [`layer_straggler`][moeopt.evaluate.layer_straggler] per layer.
    """
    assert problem.profile is not None
    return float(sum(layer_straggler(util.counts[l], home[l], problem.profile) for l in range(len(home))))


def utilization_bound(util: Utilization, problem: Problem) -> float:
    """Lower bound on S over every replica-free plan on the utilization trace.

    Parameters
    ----------
    util
        The utilization trace.
    problem
        The problem (profile and slots per GPU).

    Returns
    -------
    float
        The sum over layers and steps of `step_lower_bound`.
    """
    assert problem.profile is not None
    slots = problem.instance.cluster.slots_per_gpu
    return float(step_lower_bound(util.counts, problem.profile, slots=slots).sum())


def _steps_param(steps: int) -> int | None:
    return None if steps <= 0 else steps


# ----------------------------------------------------------------------------- gem
@register
class Gem:
    """GEM's mapping search: noisy multi-start initial mappings, pairwise swaps, perturbation."""

    name: ClassVar[str] = "gem"
    summary: ClassVar[str] = "GEM straggler-latency search: multi-start greedy + vectorized pairwise swaps + ILS"
    requires: ClassVar[frozenset[str]] = frozenset({"steps", "profile"})
    metric_hooks: ClassVar[tuple] = (straggler_bound_hook,)
    #: solved layer by layer (moeopt.execute); S and its bound add up over layers
    combine: ClassVar[str] = "sum"
    uses_trace: ClassVar[bool] = False
    uses_coactivation: ClassVar[bool] = False
    stats_rules: ClassVar[dict] = {"steps": "same", "source_steps": "same"}

    @dataclass
    class Params:
        steps: int = DEFAULT_STEPS  # utilization-trace steps T (0: every trace step)
        starts: int = field(default=8, metadata={"ge": 1})  # initial mappings (speed-aware LPT, step-aware greedy)
        noise: float = 0.15  # lognormal sigma of the load noise of starts 3..
        rounds: int = 400  # perturbation rounds of the iterated local search
        patience: int = 60  # stop after this many rounds without improvement
        ils_time: float = 0.0  # wall cap (s per layer) on the perturbation rounds (0: none, reproducible)
        perturb: int = 0  # random swaps per perturbation (0: random in [2, max(4, E // 8)])
        accept: float = 0.0  # walk on to local optima up to this fraction worse than the best
        rho: float = 0.5  # Pearson threshold of correlated temporal pairs

    def available(self) -> bool:
        return True

    def settings(self, params: Params, ctx: Context, layers: int) -> SearchSettings:
        per_layer = ctx.time_limit  # the layer's limit: --layer-time-limit, or its share of --time-limit
        return SearchSettings(
            starts=params.starts,
            noise=params.noise,
            rounds=params.rounds,
            patience=params.patience,
            perturb=params.perturb,
            rho=params.rho,
            time_limit=per_layer,
            accept=params.accept,
            ils_time=params.ils_time if params.ils_time > 0 else None,
        )

    def search(self, problem: Problem, params: Params, ctx: Context) -> tuple[np.ndarray, Utilization, dict]:
        """Run the search on every layer; returns homes ``[L, E]``, the trace and statistics."""
        assert problem.profile is not None
        util = problem_utilization(problem, _steps_param(params.steps))
        settings = self.settings(params, ctx, problem.layers)
        slots = problem.instance.cluster.slots_per_gpu
        homes, initial, found = [], [], []
        moves = rounds = capped = 0
        for l in ctx.layers(problem.layers, self.name):
            hint = None if ctx.hint is None else ctx.hint.home[l]
            # rounds and patience bound the search; the layer's share of the budget only caps it
            cap = ctx.budget.child(1.0 / (problem.layers - l)).cap()
            home, s, st = search_layer(
                util.counts[l],
                problem.profile,
                slots,
                replace(settings, time_limit=cap),
                seed=ctx.seed + 7919 * l,
                hint=hint,
            )
            capped += int(st.capped)
            homes.append(home)
            initial.append(min(st.initial))
            found.append(s)
            moves += st.moves
            rounds += st.rounds
            ctx.say(
                f"{self.name} layer {l}: feasible plan, S {s:.4f} (best start {min(st.initial):.4f}), {st.moves} swaps"
            )
        stats = {
            "steps": util.steps,
            "source_steps": int(len(util.group)),
            "initial_best": float(sum(initial)),
            "initial_per_layer": initial,
            "search_per_layer": found,
            "moves": moves,
            "rounds": rounds,
        }
        if capped:
            stats["note"] = f"time limit cut the search short in {capped} layer(s)"
        return np.stack(homes), util, stats

    def solve(self, problem: Problem, params: Params, ctx: Context) -> Result:
        t0 = time.perf_counter()
        home, util, stats = self.search(problem, params, ctx)
        objective = plan_straggler(home, util, problem)
        stats["solver_objective"] = float(sum(stats["search_per_layer"]))
        return Result(
            method=self.name,
            status=Status.FEASIBLE,
            termination=Termination.TIME_LIMIT if "note" in stats else None,
            plan=problem.plan(home),
            objective=objective,
            bound=utilization_bound(util, problem),
            sense="min",
            objective_name=OBJECTIVE,
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats=stats,
        )


# ----------------------------------------------------------------------------- exact
class _GemExact:
    """Shared driver of the exact GEM methods: search for a warm start, then one exact model
    per layer; the better of the two plans is kept, the bound is the larger of the solver's
    and the per-step lower bound."""

    name: ClassVar[str]
    summary: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset({"steps", "profile"})
    metric_hooks: ClassVar[tuple] = (straggler_bound_hook,)
    backend: ClassVar[str]
    combine: ClassVar[str] = "sum"
    uses_trace: ClassVar[bool] = False
    uses_coactivation: ClassVar[bool] = False
    stats_rules: ClassVar[dict] = {"steps": "same"}

    @dataclass
    class Params:
        steps: int = DEFAULT_STEPS  # utilization-trace steps T (0: every trace step)
        time_limit: float = 30.0  # seconds per layer when the run gives no time limit
        warm_start: bool = True  # hint the exact model with gem's plan
        threads: int = 2  # solver threads

    def available(self) -> bool:
        raise NotImplementedError

    def run_layer(  # one layer's exact solve; implemented by each backend
        self, model: Any, limit: float, hint: np.ndarray | None, params: Any, ctx: Context, util: Utilization
    ):
        raise NotImplementedError

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result:
        from moeopt.solvers.gem_models import layer_model

        t0 = time.perf_counter()
        assert problem.profile is not None
        util = problem_utilization(problem, _steps_param(params.steps))
        slots = problem.instance.cluster.slots_per_gpu
        models = [layer_model(util.counts[l], problem.profile, slots, method=self.name) for l in range(problem.layers)]
        # one budget for warm start and exact solves: the run's time limits, else the method's own per layer
        budget = ctx.budget if ctx.budget.limited else Budget(params.time_limit * problem.layers)
        hints = None
        if params.warm_start:  # a fifth of the budget at most
            gem = Gem()
            gparams = Gem.Params(steps=params.steps)
            hctx = Context(seed=ctx.seed, hint=ctx.hint, quiet=True, budget=budget.child(0.2))
            hints, _, _ = gem.search(problem, gparams, hctx)
        elif ctx.hint is not None:
            hints = ctx.hint.home
        hint_objective = None if hints is None else plan_straggler(hints, util, problem)
        homes: list[np.ndarray | None] = []  # None: a layer without a plan
        statuses, bounds, layer_stats = [], [], []
        terminations: list[Termination] = []
        for l in ctx.layers(problem.layers, self.name):
            # the solver's own limit leaves a share of the layer's time for building its model
            # and reading the answer back, which its clock does not count
            share = SOLVER_SHARE.get(self.backend, 0.8)
            limit = budget.cap(share * budget.remaining() / (problem.layers - l), floor=0.05)
            hint = None if hints is None else hints[l]
            out = self.run_layer(models[l], limit, hint, params, ctx, util)
            terminations.append(out.termination)
            candidates = [h for h in (out.home, hint) if h is not None]
            if not candidates:
                statuses.append(Status.NO_SOLUTION)
                homes.append(None)
                continue
            scores = [layer_straggler(util.counts[l], h, problem.profile) for h in candidates]
            best = int(np.argmin(scores))
            homes.append(candidates[best])
            bound = max(float(models[l].step_bound.sum()), out.bound if out.bound is not None else -np.inf)
            bounds.append(bound)
            # optimal whenever the bound closes on the plan kept, whoever found it
            closed = bound_closes(min(scores), bound)
            statuses.append(Status.OPTIMAL if closed else Status.TIME_LIMIT)
            layer_stats.append(
                {
                    "status": out.solver_status,
                    "solver_objective": out.incumbent,
                    "solver_bound": out.bound,
                    "time": round(out.wall_time, 3),
                    "warm_start": out.warm_start,
                    "kept": "solver" if best == 0 and out.home is not None else "hint",
                    "encoding": "tile counts"
                    if models[l].affine
                    else ("level binaries" if self.backend == "milp" else "element"),
                }
            )
            ctx.say(
                f"{self.name} layer {l}: {out.termination.value}, {statuses[-1].solution} plan, "
                f"S {min(scores):.4f}, bound {bound:.4f}"
            )
        status = combine_status(statuses)
        stats = {
            "layers": layer_stats,
            "layer_termination": [t.value for t in terminations],
            "solver_objective": float(sum(s["solver_objective"] or 0.0 for s in layer_stats)),
            "steps": util.steps,
            "hint_objective": hint_objective,
        }
        if any(h is None for h in homes):
            return Result(
                method=self.name,
                status=status,
                termination=combine_termination(terminations),
                plan=None,
                sense="min",
                objective_name=OBJECTIVE,
                wall_time=time.perf_counter() - t0,
                params=vars(params),
                stats=stats,
            )
        home = np.stack([h for h in homes if h is not None])  # every layer has one (checked above)
        objective = plan_straggler(home, util, problem)
        bound = float(sum(bounds))  # valid by construction (CP-SAT's rounding is corrected)
        return Result(
            method=self.name,
            status=status,
            termination=combine_termination(terminations),
            plan=problem.plan(home),
            objective=objective,
            bound=bound,
            sense="min",
            objective_name=OBJECTIVE,
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats=stats,
        )


@register
class GemMilp(_GemExact):
    """Exact GEM MILP (Pyomo + HiGHS): tile counts (affine) or ordered level binaries."""

    name: ClassVar[str] = "gem-milp"
    summary: ClassVar[str] = (
        "exact GEM MILP via Pyomo (HiGHS or solver:), tile counts / level binaries, warm-started by gem"
    )
    backend: ClassVar[str] = "milp"

    @dataclass
    class Params(_GemExact.Params):
        # the MILP solver behind the Pyomo model: highs, cbc, glpk, gurobi, cplex or scip (docs/guides/solvers.md)
        solver: str = "highs"

        def __post_init__(self) -> None:
            check_solver(self.solver)

    def available(self) -> bool:
        return solver_available(PYOMO_HIGHS)

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result:
        require(params.solver, self.name)  # a solver that is not installed: say so before any search
        return super().solve(problem, params, ctx)

    def run_layer(self, model, limit, hint, params, ctx, util):
        from moeopt.solvers.gem_models import solve_milp

        return solve_milp(model, time_limit=limit, hint=hint, threads=params.threads, solver=params.solver)


@register
class GemCpsat(_GemExact):
    """Exact GEM CP-SAT model: tile counts (affine) or element constraints, hinted by gem."""

    name: ClassVar[str] = "gem-cpsat"
    summary: ClassVar[str] = "exact GEM CP-SAT model (tile counts / element on tile count), hinted by gem"
    backend: ClassVar[str] = "cpsat"

    def available(self) -> bool:
        return solver_available(CPSAT)

    def run_layer(self, model, limit, hint, params, ctx, util):
        from moeopt.solvers.gem_models import solve_cpsat

        return solve_cpsat(
            model, time_limit=limit, hint=hint, seed=ctx.seed, workers=params.threads, denominator=util.denominator
        )


# ----------------------------------------------------------------------------- speed-greedy
@register
class SpeedGreedy:
    """LPT on mean expert loads, each expert onto the GPU that finishes earliest given speeds."""

    name: ClassVar[str] = "speed-greedy"
    summary: ClassVar[str] = "LPT packing on mean loads weighted by GPU speed (GEM baseline)"
    requires: ClassVar[frozenset[str]] = frozenset({"profile"})
    metric_hooks: ClassVar[tuple] = (straggler_bound_hook,)
    combine: ClassVar[str] = "sum"
    uses_trace: ClassVar[bool] = False
    uses_coactivation: ClassVar[bool] = False

    @dataclass
    class Params:
        steps: int = DEFAULT_STEPS  # utilization-trace steps T for the reported objective

    def available(self) -> bool:
        return True

    def solve(self, problem: Problem, params: Params, ctx: Context) -> Result:
        t0 = time.perf_counter()
        assert problem.profile is not None
        slots = problem.instance.cluster.slots_per_gpu
        load = problem.stats.expert_load
        home = np.stack([speed_greedy_homes(load[l], problem.profile.speed, slots) for l in range(problem.layers)])
        objective = bound = None
        if problem.stats.step_counts is not None:
            util = problem_utilization(problem, _steps_param(params.steps))
            objective = plan_straggler(home, util, problem)
            bound = utilization_bound(util, problem)
        return Result(
            method=self.name,
            status=Status.FEASIBLE,
            plan=problem.plan(home),
            objective=objective,
            bound=bound,
            sense="min",
            objective_name=OBJECTIVE,
            wall_time=time.perf_counter() - t0,
            params=vars(params),
        )


__all__ = ["Gem", "SpeedGreedy", "plan_straggler", "straggler_bound_hook", "utilization_bound"]
