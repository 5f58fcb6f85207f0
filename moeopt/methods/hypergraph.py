"""Direct communication objective and the METIS baseline (issue 3, item 5; SPEC sections 2, 6).

``hypergraph``
    The expected number of distinct GPUs a token is dispatched to at a layer is the
    connectivity ``λ(m)`` of its top-k set ``m`` under the partition of experts into GPUs,
    so minimizing communication is a hypergraph partitioning problem with the (λ − 1)
    objective: experts are vertices, each distinct top-k set of the calibration trace is a
    hyperedge weighted by the number of tokens that chose it, and the G blocks have
    exactly ``slots_per_gpu`` unit-weight places each. Mt-KaHyPar (``mtkahypar``) partitions;
    a repair step enforces the slot capacities (and an optional load limit
    ``(1 + eps_load) / G`` on ``ubar``) with least-loss moves and swaps, and a swap/move
    local search on the exact (λ − 1) gains polishes the result.
``metis``
    SPEC section 6's baseline: METIS (``pymetis``) balanced k-way partition of the pairwise
    coactivation graph A (integer edge weights), then the same capacity repair on the
    pairwise objective; no swap refinement unless asked, so it is METIS as people use it.

Both repair and refinement run on the one engine of `moeopt.heuristics.local_search`
with the objectives' gains (`ConnectivityGain`,
`AffinityGain`); the partitioners are wrapped in
`moeopt.solvers.partitioners`. `hypergraph_homes` returns homes ``[L, E]`` for use
as a warm start by other methods (e.g. TACG).

eps_load (both methods, as every grouping method, see `moeopt.heuristics.local_search`):
unset, the automatic limit (`moeopt.grouping.auto_eps_load`); explicit,
``(1 + eps_load) / G``; both hard: when repair finds no plan within it the result has no plan
(``NO_SOLUTION``, or ``INFEASIBLE`` when the hottest expert alone breaks it) and its reason
names the eps_load that would do. ``relax_eps_load: true`` relaxes a limit repair cannot meet
step by step (the eps_load met is in ``stats['eps_load']``, the steps in
``stats['eps_load_relaxed']`` and a note); ``.inf``: no limit.

Time limit: Mt-KaHyPar's call cannot be stopped, and takes seconds on a layer of 128 experts
and 8192 tokens. Under a time limit it runs in a forked child process killed when
`PARTITION_SHARE` of the layer's time is spent (`partition_within`); a layer whose
partition did not finish starts the repair and refinement from a balanced packing instead, and
the result says so (termination ``time_limit``, ``stats['partition_stopped_layers']`` and a
note).
Without a time limit it runs here, to its end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from moeopt.errors import InfeasibleError, InputError
from moeopt.evaluate import evaluate, grouping_affinity
from moeopt.heuristics.hyperedges import ConnectivityGain, Hyperedges, token_hyperedges
from moeopt.heuristics.local_search import (
    AffinityGain,
    LimitNotMet,
    SearchLog,
    eps_load_report,
    limited_search,
    resolve_eps_load,
)
from moeopt.instance import Cluster
from moeopt.packing import balanced_homes
from moeopt.plan import Plan
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status, Termination
from moeopt.solvers.forked import call_before, can_fork
from moeopt.solvers.partitioners import initialized, metis_partition, mtkahypar_partition
from moeopt.trace import Trace

#: share of a layer's time (under a time limit) Mt-KaHyPar may take; the repair and the
#: refinement get the rest (from a balanced packing when it did not finish, the repair is short)
PARTITION_SHARE = 0.75


@dataclass
class LayerOutcome:
    """One layer's hypergraph plan: homes, Mt-KaHyPar's km1 (None: no partition finished in
    time), the search log, eps_load used, and whether the time limit stopped a partition."""

    home: np.ndarray
    km1: int | None
    log: SearchLog
    eps_load: float | None = None
    stopped: bool = False


def partition_within(
    edges: Hyperedges,
    gpus: int,
    slots: int,
    deadline: float | None,
    *,
    seed: int = 0,
    preset: str = "default",
    threads: int = 1,
) -> tuple[np.ndarray, int] | None:
    """`moeopt.solvers.partitioners.mtkahypar_partition`, stopped at ``deadline``
    (``time.perf_counter()``): in a forked child killed then (`moeopt.solvers.forked.call_before`),
    None when it did not finish. Without a deadline, or where a child cannot run it (no
    ``fork``; Mt-KaHyPar already started in this process), it runs here to its end."""
    if deadline is None or not can_fork() or initialized():
        return mtkahypar_partition(edges, gpus, slots, seed=seed, preset=preset, threads=threads)
    value, done = call_before(
        deadline, mtkahypar_partition, edges, gpus, slots, seed=seed, preset=preset, threads=threads
    )
    return value if done else None


def balanced_start(load: np.ndarray, gpus: int, slots: int) -> np.ndarray:
    """The start when no partition finished in time: the LPT packing of the loads
    (`moeopt.packing.balanced_homes`), within the load limit almost always, so that the
    repair has little to do and the refinement gets the time left."""
    return balanced_homes(load, gpus, slots)


def hypergraph_layer(
    topk_layer: np.ndarray,
    num_experts: int,
    gpus: int,
    slots: int,
    *,
    load: np.ndarray | None = None,
    eps_load: float | None = None,
    seed: int = 0,
    runs: int = 1,
    preset: str = "default",
    refine: bool = True,
    threads: int = 1,
    relax: bool = False,
    deadline: float | None = None,
) -> LayerOutcome:
    """Hypergraph plan of one layer: Mt-KaHyPar, capacity/load repair, (λ − 1) refinement.

    ``runs`` Mt-KaHyPar seeds (``seed``, ``seed + 1``, ...) are tried and the plan with the
    fewest distinct GPUs per token kept; see `hypergraph_homes` for the parameters.
    With a ``deadline`` (``time.perf_counter()``) the partitions get `PARTITION_SHARE` of
    the time left and are stopped then (`partition_within`), no further run starts after
    it, and refinement stops at the deadline.
    """
    edges = token_hyperedges(topk_layer, num_experts)
    if load is None:
        load = np.bincount(np.asarray(topk_layer).ravel(), minlength=num_experts).astype(np.float64)
    load = load / load.sum() if load.sum() > 0 else np.full(num_experts, 1.0 / num_experts)
    eps = resolve_eps_load(eps_load, load, gpus, slots)
    starts, km1s = [], []
    skipped = stopped = False
    now = time.perf_counter()
    cut = None if deadline is None else now + PARTITION_SHARE * max(deadline - now, 0.0)
    for r in range(max(1, runs)):
        if r and cut is not None and time.perf_counter() > cut:
            skipped = True
            break
        out = partition_within(edges, gpus, slots, cut, seed=seed + r, preset=preset, threads=threads)
        if out is None:  # the time limit stopped it: no run can finish in time
            stopped = True
            break
        starts.append(out[0])
        km1s.append(out[1])
    if not starts:  # no partition in time: the repair and refinement start from a balanced packing
        starts.append(balanced_start(load, gpus, slots))
    home, log, used = limited_search(
        starts,
        ConnectivityGain(edges),
        gpus,
        slots,
        load=load,
        eps_load=eps,
        relax=relax,
        refine=refine,
        score=lambda h: -edges.cost(h),
        balanced=refine or eps is not None,
        deadline=deadline,
    )
    log.capped = log.capped or skipped or stopped
    return LayerOutcome(home=home, km1=min(km1s) if km1s else None, log=log, eps_load=used, stopped=stopped)


def hypergraph_homes(
    trace: Trace,
    gpus: int,
    slots: int,
    *,
    eps_load: float | None = None,
    seed: int = 0,
    runs: int = 1,
    preset: str = "default",
    refine: bool = True,
    threads: int = 1,
    relax: bool = False,
) -> np.ndarray:
    """Homes ``[L, E]`` minimizing distinct GPUs per token: the warm start other methods use.

    Parameters
    ----------
    trace
        Calibration trace; every distinct top-k set of a layer becomes a hyperedge weighted
        by its token count.
    gpus, slots
        G and slots per GPU (``cap``).
    eps_load
        Load limit: each GPU's share of the layer's token-slots (``Σ_e ubar[e]``) at most
        ``(1 + eps_load) / G``; None: the automatic limit (as ``tacg``, hard too); ``inf``: none.
    seed, runs, preset, threads
        Mt-KaHyPar settings (``runs`` seeds from ``seed``; deterministic with one thread).
    refine
        Polish with (λ − 1) swaps and moves after repair.
    relax
        Relax a limit that repair cannot meet (``relax_eps_load``) instead of failing.

    Returns
    -------
    numpy.ndarray
        int ``[L, E]`` homes; every GPU holds at most ``slots`` experts.

    Raises
    ------
    InfeasibleError
        When the load limit cannot be met (one expert above it, or the repair stalled:
        `LimitNotMet`).
    """
    out = []
    for l in range(trace.layers):
        res = hypergraph_layer(
            trace.topk[:, l, :],
            trace.num_experts,
            gpus,
            slots,
            eps_load=eps_load,
            seed=seed,
            runs=runs,
            preset=preset,
            refine=refine,
            threads=threads,
            relax=relax,
        )
        out.append(res.home)
    return np.stack(out)


def calibration_gpus_per_token(plan: Plan, trace: Trace, cluster: Cluster) -> float:
    """Mean over tokens and layers of distinct GPUs (λ) on the calibration trace (evaluator)."""
    return float(evaluate(plan, trace, cluster)["gpus_per_token"])


def _available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _no_plan(name: str, exc: InfeasibleError, layer: int, t0: float, params: object) -> Result:
    """A result without a plan: NO_SOLUTION when repair missed the load limit, INFEASIBLE
    when no plan can meet it."""
    unmet = isinstance(exc, LimitNotMet)
    return Result(
        method=name,
        status=Status.NO_SOLUTION if unmet else Status.INFEASIBLE,
        # the search ended (no time limit was hit): repair stalled, or the limit is provably out of reach
        termination=Termination.COMPLETED if unmet else Termination.INFEASIBLE,
        plan=None,
        wall_time=time.perf_counter() - t0,
        params=vars(params),
        stats={"reason": f"layer {layer}: {exc}"},
    )


@register
class Hypergraph:
    """Mt-KaHyPar (λ − 1) partition of token hyperedges with exact slot balance."""

    name: ClassVar[str] = "hypergraph"
    summary: ClassVar[str] = "Mt-KaHyPar (lambda-1) partition of token top-k sets, slot/load repair, swap refinement"
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    #: solved layer by layer (moeopt.execute) on each layer's trace slice; GPUs per token average
    combine: ClassVar[str] = "mean"
    uses_trace: ClassVar[bool] = True

    @dataclass
    class Params:
        eps_load: float | None = field(default=None, metadata={"inf": True})  # (1 + eps_load) / G of ubar; .inf: off
        relax_eps_load: bool = False  # relax a limit repair cannot meet (reported) instead of failing
        runs: int = field(default=1, metadata={"ge": 1})  # Mt-KaHyPar seeds tried per layer
        preset: str = "default"
        refine: bool = True  # (lambda-1) swap/move refinement after repair
        threads: int = 1

    def available(self) -> bool:
        return _available("mtkahypar")

    def solve(self, problem: Problem, params: Params, ctx: Context) -> Result:
        t0 = time.perf_counter()
        trace = problem.trace
        if trace is None:
            raise InputError(None, "workload.calibration", "method 'hypergraph' needs a token trace")
        c = problem.instance.cluster
        ubar = problem.stats.global_usage
        homes, km1, log, eps_used, relaxed = [], 0, SearchLog(), [], []
        stopped: list[int] = []  # layers whose partition the time limit stopped
        for l in ctx.layers(problem.layers, "hypergraph"):
            try:
                out = hypergraph_layer(
                    trace.topk[:, l, :],
                    trace.num_experts,
                    c.gpus,
                    c.slots_per_gpu,
                    load=ubar[l],
                    eps_load=params.eps_load,
                    seed=ctx.seed,
                    runs=params.runs,
                    preset=params.preset,
                    refine=params.refine,
                    threads=params.threads,
                    relax=params.relax_eps_load,
                    deadline=ctx.budget.child(1.0 / (problem.layers - l)).deadline,
                )
            except InfeasibleError as exc:
                return _no_plan(self.name, exc, l, t0, params)
            relaxed.append(out.log.relaxed)
            homes.append(out.home)
            eps_used.append(out.eps_load)
            km1 += 0 if out.km1 is None else out.km1
            if out.stopped:
                stopped.append(l)
            log.add(out.log)
            ctx.say(
                f"hypergraph layer {l}: feasible plan, km1 {'-' if out.km1 is None else out.km1}"
                f"{' (partition stopped by the time limit)' if out.stopped else ''}, "
                f"repair {out.log.repair_moves}+{out.log.repair_swaps}, "
                f"refine {out.log.refine_moves}+{out.log.refine_swaps}"
            )
        plan = problem.plan(np.stack(homes))
        stats = {
            # Mt-KaHyPar's own (lambda - 1) before repair, as distinct GPUs per token
            "solver_objective": 1.0 + km1 / (trace.tokens * trace.layers),
            "solver_km1": km1,
            **{k: v for k, v in vars(log).items()},
            **eps_load_report(eps_used, relaxed),
        }
        if stopped:  # those layers' plans start from a packing, not from Mt-KaHyPar's partition
            stats["partition_stopped_layers"] = len(stopped)
            note = "time limit stopped Mt-KaHyPar before it finished: those layers started from a balanced packing"
            stats["note"] = f"{stats['note']}; {note}" if "note" in stats else note
        return Result(
            method=self.name,
            status=Status.FEASIBLE,
            termination=Termination.TIME_LIMIT if log.capped else None,  # the clock ended the refinement
            plan=plan,
            objective=calibration_gpus_per_token(plan, trace, c),
            objective_name="gpus_per_token",
            sense="min",
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats=stats,
        )


# ============================================================================ METIS
@register
class Metis:
    """METIS balanced partition of the coactivation graph A, repaired to slot capacity."""

    name: ClassVar[str] = "metis"
    summary: ClassVar[str] = "METIS (pymetis) balanced partition of coactivation graph A, slot repair"
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    combine: ClassVar[str] = "sum"  # solved layer by layer; intra-GPU affinity adds up
    uses_trace: ClassVar[bool] = False

    @dataclass
    class Params:
        eps_load: float | None = field(default=None, metadata={"inf": True})  # (1 + eps_load) / G of ubar; .inf: off
        relax_eps_load: bool = False  # relax a limit repair cannot meet (reported) instead of failing
        ufactor: int = 1  # METIS imbalance in 1/1000
        refine: bool = False  # pairwise swap refinement after repair (off: METIS as is)

    def available(self) -> bool:
        return _available("pymetis")

    def solve(self, problem: Problem, params: Params, ctx: Context) -> Result:
        t0 = time.perf_counter()
        c = problem.instance.cluster
        A = problem.stats.affinity
        if A is None:  # requires = coactivation: the registry checks it before solve
            raise ValueError("metis needs coactivation statistics (a token trace)")
        ubar = problem.stats.global_usage
        homes, cut, log, eps_used, relaxed = [], 0, SearchLog(), [], []
        for l in ctx.layers(problem.layers, "metis"):
            h, layer_cut = metis_partition(A[l], c.gpus, seed=ctx.seed, ufactor=params.ufactor)
            eps = resolve_eps_load(params.eps_load, ubar[l], c.gpus, c.slots_per_gpu)
            try:
                h, lg, used = limited_search(
                    [h],
                    AffinityGain(A[l]),
                    c.gpus,
                    c.slots_per_gpu,
                    load=ubar[l],
                    eps_load=eps,
                    relax=params.relax_eps_load,
                    refine=params.refine,
                    score=lambda x, g=A[l]: grouping_affinity(g, x),
                    balanced=False,
                )
            except InfeasibleError as exc:
                return _no_plan(self.name, exc, l, t0, params)
            relaxed.append(lg.relaxed)
            homes.append(h)
            eps_used.append(used)
            cut += layer_cut
            log.add(lg)
        plan = problem.plan(np.stack(homes))
        return Result(
            method=self.name,
            status=Status.FEASIBLE,
            plan=plan,
            objective=sum((grouping_affinity(A[l], plan.home[l]) for l in range(problem.layers)), 0.0),
            objective_name="intra_affinity",
            sense="max",
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats={
                "solver_objective": cut,
                "solver_objective_name": "metis_edgecut_scaled",
                **vars(log),
                **eps_load_report(eps_used, relaxed),
            },
        )
