"""TACG: task-aware coactivation grouping (SPEC section 3; formulations/tacg.md).

Per layer: family preferences ``p[f, e]`` (log-lift, softmax over families with temperature
tau), the task-modulated graph ``Ã`` blended with the task-agnostic graph ``A`` by beta, and a
capacity- and load-constrained grouping of the experts on the GPUs maximizing intra-GPU
affinity. Methods:

* ``tacg``: spectral clustering + capacity repair + iterated local search (default engine);
* ``agnostic``: the same with beta = 0 (ExFlow-style global graph);
* ``tacg-cpsat``, ``tacg-milp`` (Pyomo + HiGHS), ``tacg-highs`` (highspy arrays): exact
  models warm-started from the heuristic plan, returning the proved bound.

With nodes (``gpus_per_node < gpus``) grouping is flat on GPUs (the certified objective is
same-GPU affinity); the groups are then placed on nodes by the same search on the quotient
graph, which only relabels GPUs (objective, loads and bound unchanged).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from moeopt.bounds import grouping_bound
from moeopt.colgen.driver import ROUNDS
from moeopt.errors import InfeasibleError
from moeopt.evaluate import grouping_affinity
from moeopt.grouping import AUTO_LOAD_SLACK, Grouping
from moeopt.heuristics.local_search import eps_load_report, relax_until_met
from moeopt.heuristics.nodes import arrange_nodes, node_affinity
from moeopt.heuristics.spectral import grouping_heuristic
from moeopt.registry import Context, Problem, register
from moeopt.result import Result, Status, Termination, bound_closes, combine_status, combine_termination
from moeopt.solvers import ExactSettings
from moeopt.solvers.grouping_sdp import SCS_ITERATIONS
from moeopt.solvers.pyomo_solvers import check_solver, require
from moeopt.trace import LIFT_EPS, Stats, log_lift

#: epsilon of the log-lift preference score (SPEC 3.1)
#: automatic load limit: this factor above the least largest-group load any plan can reach
#: seconds per layer when the caller gives no time limit
DEFAULT_TIME_LIMIT = 10.0
#: the exact solvers' share of what is left of a layer's time after the warm start (the rest:
#: building the model and reading the answer, which the solver's clock does not count; Pyomo
#: builds far slower than the others)
SOLVER_SHARE = {"cpsat": 0.8, "highs": 0.8, "milp": 0.6}
#: the bounds a heuristic plan can be certified with (TacgParams.certificate)
CERTIFICATES = ("cheap", "colgen", "triangle", "sdp", "both", "auto")
#: the note of a run whose certificate the time limit cut short (``certificate_capped_layers``: how many)
CERTIFICATE_CAPPED = "time limit cut the certificate short: the bound depends on the machine's speed"


# ----------------------------------------------------------------------------- graph
def family_preference(usage: np.ndarray, global_usage: np.ndarray, tau: float, eps: float = LIFT_EPS) -> np.ndarray:
    """``F * p[f, l, e]``: family preferences scaled so that uniform preferences are exactly 1.

    ``s[f, e] = log((u[f, e] + eps) / (ubar[e] + eps))`` and ``p = softmax_f(s / tau)``;
    returns ``F p``, computed as ``exp(z) / mean_f exp(z)`` so that tau = inf gives 1.0
    exactly (the task-agnostic graph, bit for bit).

    Parameters
    ----------
    usage
        u ``[F, L, E]``.
    global_usage
        ubar ``[L, E]``.
    tau
        temperature τ > 0; ``math.inf`` gives uniform preferences.
    """
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    s = log_lift(usage, global_usage, eps)
    z = s / tau
    z = z - z.max(axis=0, keepdims=True)
    ez = np.exp(z)
    return ez / ez.mean(axis=0, keepdims=True)


def task_modulated_graph(stats: Stats, tau: float = 1.0, beta: float = 1.0) -> np.ndarray:
    """``(1 - beta) A + beta Ã`` with ``Ã = sum_f pi_f C[f] ⊙ (F^2 p[f] p[f]^T)``, ``[L, E, E]``.

    Parameters
    ----------
    stats
        Calibration statistics with coactivation C ``[F, L, E, E]``.
    tau
        Preference temperature τ (``inf``: Ã = A).
    beta
        Blend β in [0, 1] (0: the task-agnostic graph A).
    """
    A = stats.affinity
    if A is None or stats.coactivation is None:
        raise ValueError("the task-modulated graph needs coactivation statistics (a token trace)")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if beta == 0.0:
        return A.copy()
    q = family_preference(stats.usage, stats.global_usage, tau)  # [F, L, E]
    modulated = stats.coactivation * (q[:, :, :, None] * q[:, :, None, :])
    tilde = np.einsum("f,flij->lij", stats.family_share, modulated)
    if beta == 1.0:
        return tilde
    return (1.0 - beta) * A + beta * tilde


# ----------------------------------------------------------------------------- parameters
@dataclass
class TacgParams:
    """Parameters of every TACG method (YAML ``method:`` mapping).

    Attributes
    ----------
    tau, beta
        Preference temperature τ (``.inf``: uniform preferences) and blend β in [0, 1]
        (0: task-agnostic graph A) of SPEC 3.1-3.2.
    eps_load
        Load limit: each GPU's share of the layer's load (ubar) is at most
        ``(1 + eps_load) / G``. None (default): per layer, 10 % above the least largest-GPU
        share any plan can reach (``1.1 * Grouping.min_max_load()``), so the limit binds but
        stays reachable; ``.inf``: no limit.
        Hard either way: when repair finds no plan within it, solving fails and says which
        eps_load would do (the rule of every grouping method, see
        `moeopt.heuristics.local_search`).
    relax_eps_load
        Heuristics only: relax a limit that repair cannot meet by ``x1.1`` steps (at most 10)
        instead of failing; ``stats.eps_load`` then holds the limits met,
        ``stats.eps_load_relaxed`` the steps per layer, and a note says so.
    repair, refine
        Affinity-aware capacity repair (false: affinity-blind first fit) and the swap
        search (false: none); the ablations of SPEC 3.4.
    iterations, patience, kick
        Iterated local search rounds per layer, rounds without a new best before stopping,
        random swaps per kick (None: drawn in ``2 .. 2 max(2, E // 10)`` each round).
    bound_iterations, eigen_iterations
        Subgradient steps of the Lagrangian and eigenvalue bounds (-1: skip that bound).
    nodes
        With ``gpus_per_node < gpus``: ``"flat"`` (default) groups on GPUs, then places the
        groups on nodes (only relabels GPUs; the certified objective is untouched);
        ``"top-down"`` (heuristic ``tacg`` only) first groups experts into nodes
        (``gpus_per_node * cap`` slots, load limit ``gpus_per_node * (1+eps_load)/G``), then
        each node's experts onto its GPUs, falling back to flat for a layer where that split
        misses the per-GPU load limit.
    certificate
        The bound reported (heuristic methods): ``"cheap"`` (default) the tightest of the
        bounds of `moeopt.bounds.grouping_bound`, milliseconds; ``"colgen"`` also the
        set-partitioning bound by column generation (`moeopt.colgen.column_generation`,
        formulations/tacg.md section 7) in the rest of the layer's time, whose restricted
        master MILP replaces the plan when it finds a better one; ``"triangle"`` also the pair
        LP with triangle and star cuts
        (`moeopt.solvers.grouping_triangle.triangle_bound`, section 8), the one that
        closes for large groups (cap 8 and more); ``"sdp"`` also the semidefinite relaxation
        (`moeopt.solvers.grouping_sdp.sdp_bound`, section 9), tighter still on groups
        of 8 and 16 at E = 128 and 256; ``"both"`` colgen and triangle, each in half the
        time, the smaller bound reported; ``"auto"`` colgen in at most half the time (it stops
        at its first unproved exact pricing), then, unless it proved its LP, the SDP in the
        rest, the smaller bound reported. Exact methods: the
        solver gets half of each layer's time, and the certificate the rest when the solver
        leaves a gap. Every certificate is bounded by work (below), so the bound, like the
        plan, is a function of the input, the seed and the parameters; a time limit only caps
        it (the layer's time limit), and a cap that stops one is reported
        (termination ``time_limit`` and a note).
    certificate_rounds
        Column generation's work budget per layer: master LP solves, each followed by a pricing
        (`moeopt.colgen.column_generation`).
    sdp_iterations
        The SDP's work budget per layer: SCS iterations (`moeopt.solvers.grouping_sdp.sdp_bound`;
        at E = 256 about 35 ms each on a 2-core machine).
    """

    tau: float = 1.0
    beta: float = 1.0
    eps_load: float | None = field(default=None, metadata={"inf": True})
    relax_eps_load: bool = False
    repair: bool = True
    refine: bool = True
    iterations: int = 1000
    patience: int = 200
    kick: int | None = None
    bound_iterations: int = 100
    eigen_iterations: int = 0
    nodes: str = "flat"
    certificate: str = "cheap"
    certificate_rounds: int = field(default=ROUNDS, metadata={"ge": 1})
    sdp_iterations: int = field(default=SCS_ITERATIONS, metadata={"ge": 1})

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"tau must be positive, got {self.tau}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {self.beta}")
        if self.eps_load is not None and not self.eps_load >= 0:
            raise ValueError(f"eps_load must be >= 0, got {self.eps_load}")
        if self.iterations < 0 or self.patience < 1:
            raise ValueError("iterations must be >= 0 and patience >= 1")
        if self.nodes not in ("flat", "top-down"):
            raise ValueError(f"nodes must be 'flat' or 'top-down', got {self.nodes!r}")
        if self.certificate not in CERTIFICATES:
            raise ValueError(f"certificate must be one of {', '.join(CERTIFICATES)}, got {self.certificate!r}")


@dataclass
class AgnosticParams(TacgParams):
    """TACG parameters with beta = 0 by default (the task-agnostic graph A)."""

    beta: float = 0.0


@dataclass
class ExactParams(TacgParams):
    """TACG parameters plus: warm_start (pass the heuristic plan to the solver), threads."""

    warm_start: bool = True
    threads: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.relax_eps_load:
            raise ValueError("relax_eps_load: exact methods keep the limit (they prove whether it can be met)")


@dataclass
class MilpParams(ExactParams):
    """Exact TACG parameters plus the MILP solver behind the Pyomo model (``tacg-milp``).

    Attributes
    ----------
    solver
        ``highs`` (default), ``cbc``, ``glpk``, ``gurobi``, ``cplex`` or ``scip``, through
        Pyomo's interface to it (`moeopt.solvers.pyomo_solvers`; docs/guides/solvers.md).
    """

    solver: str = "highs"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_solver(self.solver)


def layer_problems(problem: Problem, params: TacgParams) -> tuple[np.ndarray, list[Grouping], list[float]]:
    """The graph ``[L, E, E]``, one `Grouping` per layer and each layer's eps_load.

    Raises
    ------
    InfeasibleError
        When an explicit ``eps_load`` cannot be met by any plan.
    """
    stats, c = problem.stats, problem.instance.cluster
    graph = task_modulated_graph(stats, params.tau, params.beta)
    G = c.gpus
    out, eps = [], []
    for l in range(problem.layers):
        g = Grouping(graph=graph[l], load=stats.global_usage[l], groups=G, cap=c.slots_per_gpu)
        if params.eps_load is None:
            limit = AUTO_LOAD_SLACK * g.min_max_load()
        else:
            limit = (1.0 + params.eps_load) / G
        g = g.replace(load_limit=limit)
        try:
            g.check_load_limit(params.eps_load)
        except InfeasibleError as exc:
            raise InfeasibleError(f"layer {l}: {exc}") from None
        out.append(g)
        eps.append(limit * G - 1.0)
    return graph, out, eps


# ----------------------------------------------------------------------------- heuristic
def heuristic_home(
    g: Grouping,
    params: TacgParams,
    rng: np.random.Generator,
    *,
    hint: np.ndarray | None = None,
    deadline: float | None = None,
) -> tuple[np.ndarray, dict]:
    """One layer's plan: spectral clusters, capacity repair, iterated local search.

    Parameters
    ----------
    g
        The layer's grouping problem.
    params
        ``repair`` false replaces the affinity-aware repair by `first_fit`; ``refine``
        false skips the swap search.
    rng
        Seeded generator (k-means initialization and kicks).
    hint
        Optional plan for the layer; used as the start when feasible and better.
    """
    return grouping_heuristic(
        g,
        rng,
        repair=params.repair,
        refine=params.refine,
        iterations=params.iterations,
        patience=params.patience,
        kick_swaps=params.kick,
        hint=hint,
        deadline=deadline,
    )


def relaxed_heuristic(
    g: Grouping,
    eps_load: float,
    params: TacgParams,
    rng: np.random.Generator,
    hint: np.ndarray | None,
    deadline: float | None,
) -> tuple[Grouping, float, int, tuple[np.ndarray, dict]]:
    """`heuristic_home` under ``relax_eps_load``: when repair cannot meet the limit,
    retry with it relaxed (`moeopt.heuristics.local_search.relax_until_met`).

    Returns
    -------
    tuple
        The layer's problem with the limit met, that eps_load, the relaxation steps and
        `heuristic_home`'s plan and counters.
    """

    def attempt(eps: float) -> tuple[Grouping, tuple[np.ndarray, dict]] | None:
        trial = g if eps == eps_load else g.replace(load_limit=(1.0 + eps) / g.groups)
        try:
            return trial, heuristic_home(trial, params, rng, hint=hint, deadline=deadline)
        except InfeasibleError:
            return None

    (g, out), used, steps = relax_until_met(attempt, eps_load, relax=True)
    return g, used, steps, out


def top_down_home(
    g: Grouping, params: TacgParams, gpus_per_node: int, rng: np.random.Generator, deadline: float | None = None
) -> np.ndarray:
    """Hierarchical grouping: experts into nodes first, then each node's experts onto its GPUs.

    Raises
    ------
    InfeasibleError
        When a node's experts cannot be split onto its GPUs within the per-GPU load limit.
    """
    nodes = g.groups // gpus_per_node
    scale = gpus_per_node if np.isfinite(g.load_limit) else 1.0
    node_problem = g.replace(groups=nodes, cap=gpus_per_node * g.cap, load_limit=scale * g.load_limit)
    node, _ = heuristic_home(node_problem, params, rng, deadline=deadline)
    home = np.empty(g.experts, dtype=np.int64)
    for n in range(nodes):
        idx = np.flatnonzero(node == n)
        if not len(idx):
            continue
        sub = Grouping(
            graph=g.graph[np.ix_(idx, idx)], load=g.load[idx], groups=gpus_per_node, cap=g.cap, load_limit=g.load_limit
        )
        sub.check_load_limit()
        local, _ = heuristic_home(sub, params, rng, deadline=deadline)
        home[idx] = n * gpus_per_node + local
    return home


def certificate_seconds(ctx: Context, layers_left: int) -> float | None:
    """This layer's share of what is left of the budget: the certificate's outer wall-clock cap
    (None without a time limit: its work budgets alone bound it)."""
    if not ctx.budget.limited:
        return None
    return max(ctx.budget.child(1.0 / layers_left).remaining(), 0.1)


def strong_certificate(
    g: Grouping, home: np.ndarray, ctx: Context, layers_left: int, params: TacgParams
) -> tuple[np.ndarray, float, str, dict]:
    """The ``certificate`` bound (``colgen``, ``triangle``, ``sdp``, ``both`` or ``auto``) for one
    layer, within its work budgets and capped by its share of the time left: see `certify`."""
    return certify(
        g,
        home,
        certificate_seconds(ctx, layers_left),
        params.certificate,
        seed=ctx.seed,
        rounds=params.certificate_rounds,
        sdp_iterations=params.sdp_iterations,
    )


def certify(
    g: Grouping,
    home: np.ndarray,
    seconds: float | None,
    kind: str,
    *,
    seed: int = 0,
    rounds: int | None = None,
    sdp_iterations: int | None = None,
) -> tuple[np.ndarray, float, str, dict]:
    """The ``kind`` certificate of plan ``home`` (``colgen``, ``triangle``, ``sdp``, ``both`` or
    ``auto``; see `TacgParams`): returns the plan (column generation's MILP may improve it),
    the bound, the name of the method that gave it and a record per method.

    Each bound is bounded by work (column generation's ``rounds`` of pricing, the SDP's SCS
    ``sdp_iterations``, the triangle LP's cutting rounds; None: each one's default), so the bound
    is a function of the layer, the plan, ``seed`` and these parameters. ``seconds`` (None:
    none) is only an outer cap, shared as the work is (``both``: half each; ``auto``: column
    generation at most half, the SDP the rest); ``record[...]["capped"]`` says where it stopped
    a bound (which then depends on the machine's speed)."""
    from moeopt.colgen import column_generation
    from moeopt.solvers.grouping_triangle import triangle_bound

    t0 = time.perf_counter()
    share = None if seconds is None else (seconds / 2 if kind in ("both", "auto") else seconds)
    record: dict = {}
    bound, name = math.inf, kind
    if kind in ("colgen", "both", "auto"):
        # auto: column generation stops at its first unproved exact pricing (no MILP), so that
        # the SDP gets the rest of the layer's effort
        cert = column_generation(
            g, share, start_home=home, seed=seed, rounds=ROUNDS if rounds is None else rounds, give_up=kind == "auto"
        )
        if cert.home is not None and cert.objective is not None and cert.objective > g.objective(home):
            home = cert.home
        record["colgen"] = {
            "bound": cert.bound,
            "objective": cert.objective,
            "proven": cert.proven,
            "columns": cert.columns,
            "iterations": cert.iterations,
            "termination": cert.termination.value,
            "seconds": cert.history[-1][0],
            "gave_up": cert.info["gave_up"],
            "capped": bool(cert.info["capped"]),
        }
        bound, name = cert.bound, "colgen"
    if kind in ("triangle", "both"):
        tri = triangle_bound(g, share)
        record["triangle"] = tri.record()
        if tri.bound < bound:
            bound, name = tri.bound, "triangle"
    if kind == "sdp" or (kind == "auto" and not record["colgen"]["proven"]):
        from moeopt.solvers.grouping_sdp import sdp_bound

        # auto: what colgen left of the layer's cap (it may give up, or end its MILP, early)
        cap = seconds if kind == "sdp" or seconds is None else max(seconds - (time.perf_counter() - t0), 0.1)
        sdp = sdp_bound(g, cap, iterations=SCS_ITERATIONS if sdp_iterations is None else sdp_iterations)
        record["sdp"] = sdp.record()
        if sdp.bound < bound:
            bound, name = sdp.bound, "sdp"
    return home, bound, name, record


def certificate_capped(records: list[dict]) -> int:
    """Layers whose certificate (any of its bounds in ``records``, one per layer) the time limit
    cut short."""
    return sum(any(bool(r.get("capped")) for r in rec.values()) for rec in records)


def _finish(home: np.ndarray, g: Grouping, gpn: int, rng: np.random.Generator) -> np.ndarray:
    return arrange_nodes(g, home, gpn, rng) if gpn < g.groups else home


class TacgBase:
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    name: ClassVar[str]
    #: solved layer by layer (moeopt.execute); affinity and its bound add up over layers
    combine: ClassVar[str] = "sum"
    uses_trace: ClassVar[bool] = False

    def available(self) -> bool:
        return True

    def _result(
        self,
        problem: Problem,
        params: TacgParams,
        graph: np.ndarray,
        groupings: list[Grouping],
        homes: list[np.ndarray],
        statuses: list[Status],
        bounds: list[float],
        stats: dict,
        eps: list[float],
        termination: Termination | None = None,
    ) -> Result:
        home = np.stack(homes)
        c = problem.instance.cluster
        objective = sum((grouping_affinity(graph[l], home[l]) for l in range(len(homes))), 0.0)
        agnostic = problem.stats.affinity
        if agnostic is None:
            raise ValueError("tacg needs coactivation statistics (a token trace)")
        stats = {
            **stats,
            "agnostic_affinity": sum((grouping_affinity(agnostic[l], home[l]) for l in range(len(homes))), 0.0),
            "eps_load": eps,
            "max_load_share": [float(g.group_loads(h).max() * g.groups) for g, h in zip(groupings, homes, strict=True)],
        }
        if c.gpus_per_node < c.gpus:
            stats["node_affinity"] = sum(node_affinity(graph[l], home[l], c.gpus_per_node) for l in range(len(homes)))
        return Result(
            method=self.name,
            status=combine_status(statuses),
            plan=problem.plan(home),
            objective=objective,
            bound=float(sum(bounds)),
            sense="max",
            objective_name="affinity",
            params=vars(params).copy(),
            stats=stats,
            termination=termination,
        )


@register
class Tacg(TacgBase):
    """Task-aware coactivation grouping, heuristic (iterated local search)."""

    name: ClassVar[str] = "tacg"
    summary: ClassVar[str] = "task-aware grouping: spectral + capacity repair + iterated swap search"
    Params: ClassVar[type] = TacgParams

    def solve(self, problem: Problem, params: TacgParams, ctx: Context) -> Result:
        graph, groupings, eps = layer_problems(problem, params)
        gpn = problem.instance.cluster.gpus_per_node
        homes, bounds, kinds, spectral, rounds, statuses, modes = [], [], [], [], [], [], []
        relaxed: list[int] = []
        certs: list[dict] = []
        capped = 0
        for l in ctx.layers(problem.layers, self.name):
            g = groupings[l]
            rng = np.random.default_rng([ctx.seed, l])
            hint = None if ctx.hint is None else ctx.hint.home[l]
            # the cheap bound does not depend on the plan: first, so that the search's cap leaves time for it
            cheap = grouping_bound(
                g, lagrangian_iterations=params.bound_iterations, eigen_iterations=params.eigen_iterations
            )
            # the search is bounded by its iterations; the clock (the layer's share, half of it when a
            # strong certificate follows under a time limit) only caps it
            most = None if ctx.budget.limited else DEFAULT_TIME_LIMIT
            layer = ctx.budget.child(1.0 / (problem.layers - l), most=most)
            deadline = (layer.child(0.5) if params.certificate != "cheap" and ctx.budget.limited else layer).deadline
            if params.relax_eps_load:
                g, eps[l], steps, (home, info) = relaxed_heuristic(g, eps[l], params, rng, hint, deadline)
                groupings[l] = g
                relaxed.append(steps)
                if steps:  # the limit was relaxed: the bound of the problem solved
                    cheap = grouping_bound(
                        g, lagrangian_iterations=params.bound_iterations, eigen_iterations=params.eigen_iterations
                    )
            else:
                home, info = heuristic_home(g, params, rng, hint=hint, deadline=deadline)
            mode = "flat"
            if params.nodes == "top-down" and gpn < g.groups:
                try:
                    home = top_down_home(g, params, gpn, rng, deadline)
                    mode = "top-down"
                except InfeasibleError:
                    pass  # this layer's node split misses the per-GPU load limit: keep the flat plan
            strong = None
            if params.certificate != "cheap":  # a bound that closes (and maybe a better plan)
                home, sb, sname, record = strong_certificate(g, home, ctx, problem.layers - l, params)
                strong = (sb, sname)
                certs.append(record)
            modes.append(mode)
            homes.append(_finish(home, g, gpn, rng) if mode == "flat" else home)
            b, kind = cheap
            if strong is not None and strong[0] < b:
                b, kind = strong
            bounds.append(b)
            kinds.append(kind)
            # a cheap bound that meets the plan's value certifies it
            closed = bound_closes(g.objective(home), b)
            statuses.append(Status.OPTIMAL if closed else Status.FEASIBLE)
            spectral.append(info["spectral"])
            rounds.append(info.get("rounds", 0))
            capped += int(info.get("capped", 0))
            ctx.say(
                f"{self.name} layer {l}: {statuses[-1].solution} plan, affinity {g.objective(home):.6g}, "
                f"bound {b:.6g} ({kind})"
            )
        stats = {
            "bound_kind": kinds,
            "spectral_affinity": float(sum(spectral)),
            "ils_rounds": rounds,
            "node_mode": modes,
        }
        if certs:
            stats["certificate"] = certs
        termination = None
        notes = []
        if params.relax_eps_load:
            report = eps_load_report(eps, relaxed)
            stats["eps_load_relaxed"] = relaxed
            notes += [report["note"]] if "note" in report else []
        if capped:  # the clock, not the iterations, ended a search: the plan depends on the machine's speed
            notes.append(f"time limit cut the search short in {capped} layer(s)")
            termination = Termination.TIME_LIMIT
        cut = certificate_capped(certs)
        if cut:  # the clock, not the work budget, ended a certificate: the bound depends on the machine's speed
            stats["certificate_capped_layers"] = cut
            notes.append(CERTIFICATE_CAPPED)
            termination = Termination.TIME_LIMIT
        if notes:
            stats["note"] = "; ".join(notes)
        return self._result(problem, params, graph, groupings, homes, statuses, bounds, stats, eps, termination)


@register
class Agnostic(Tacg):
    """TACG on the task-agnostic graph A (beta = 0): the ExFlow-style baseline and ablation."""

    name: ClassVar[str] = "agnostic"
    summary: ClassVar[str] = "coactivation grouping on the task-agnostic graph (TACG with beta=0)"
    Params: ClassVar[type] = AgnosticParams


# ----------------------------------------------------------------------------- exact
class TacgExact(TacgBase):
    """Exact TACG grouping by a backend module with ``available``, ``check_size`` and ``solve``."""

    Params: ClassVar[type] = ExactParams
    backend: ClassVar[str]

    def backend_module(self):
        """The solver module (``available``, ``check_size``, ``build_model``, ``solve``)."""
        from moeopt.solvers import grouping_cpsat, grouping_highs, grouping_milp

        return {"cpsat": grouping_cpsat, "highs": grouping_highs, "milp": grouping_milp}[self.backend]

    def available(self) -> bool:
        return bool(self.backend_module().available())

    def solve(self, problem: Problem, params: ExactParams, ctx: Context) -> Result:
        graph, groupings, eps = layer_problems(problem, params)
        limit = ctx.time_limit if ctx.time_limit is not None else DEFAULT_TIME_LIMIT
        mod = self.backend_module()
        for g in groupings:  # refuse before spending any time
            mod.check_size(g, limit)
        if isinstance(params, MilpParams):  # a solver that is not installed: say so before any search
            require(params.solver, self.name)
        gpn = problem.instance.cluster.gpus_per_node
        homes: list[np.ndarray] = []
        statuses, bounds, kinds, incumbents, starts, gaps, walls = [], [], [], [], [], [], []
        terminations: list[Termination] = []
        certs: list[dict] = []
        discarded = 0
        for l in ctx.layers(problem.layers, self.name):
            g = groupings[l]
            rng = np.random.default_rng([ctx.seed, l])
            start = None
            layer = ctx.budget.child(1.0 / (problem.layers - l), most=None if ctx.budget.limited else limit)
            # the cheap bound does not depend on the plan: first, so that the solver's limit leaves time for it
            cheap, kind = grouping_bound(
                g, lagrangian_iterations=params.bound_iterations, eigen_iterations=params.eigen_iterations
            )
            if params.warm_start:  # the warm start's search may use a quarter of the layer's limit
                try:
                    hint = None if ctx.hint is None else ctx.hint.home[l]
                    start, _ = heuristic_home(g, params, rng, hint=hint, deadline=layer.child(0.25).deadline)
                except InfeasibleError:
                    start = None  # the repair missed a packing: let the exact model look for one
            # the rest of the layer's share (sizes were checked against the full limit above), less what
            # building the model and reading the answer take (the solver's clock does not count them);
            # with a strong certificate the solver gets half of it and the certificate the rest
            strong = params.certificate != "cheap"
            left = layer.child(0.5 if strong else SOLVER_SHARE[self.backend]).cap(limit, floor=0.05)
            out = mod.solve(
                g,
                ExactSettings(
                    time_limit=left,
                    hint=start,
                    threads=params.threads,
                    seed=ctx.seed,
                    refuse=False,
                    solver=params.solver if isinstance(params, MilpParams) else "highs",
                ),
            )
            feasible = [h for h in (start, out.home) if h is not None and g.feasible(h)]
            known = max((g.objective(h) for h in feasible), default=0.0)
            solver_bound = out.bound
            if solver_bound is not None and solver_bound < known - 1e-6 * max(abs(known), 1.0):
                solver_bound = None  # below a known plan: not a proof (never seen from a finished solve)
                discarded += 1
            bound = cheap if solver_bound is None else min(solver_bound, cheap)
            kind = kind if bound == cheap else "solver"
            better = None
            best = max(feasible, key=g.objective, default=None)
            if strong and best is not None and not bound_closes(g.objective(best), bound):
                # the solver left a gap: the certificate asked for (colgen's master may also improve the plan)
                improved, sb, sname, record = strong_certificate(g, best, ctx, problem.layers - l, params)
                certs.append(record)
                if g.objective(improved) > g.objective(best) + 1e-12:
                    better = improved  # kept below when better than the solver's plan
                if sb < bound:
                    bound, kind = sb, sname
            kinds.append(kind)
            if out.status == Status.INFEASIBLE:
                raise InfeasibleError(
                    f"layer {l}: {self.name} proved that no plan meets the load limit "
                    f"(eps_load = {eps[l]:.4g}) with {g.cap} slots per GPU"
                )
            home = out.home
            if home is not None and not g.feasible(home):
                home = None  # outside the load tolerance after the backend's rounding
            if start is not None and (home is None or g.objective(start) > g.objective(home)):
                home = start
            if better is not None and (home is None or g.objective(better) > g.objective(home)):
                home = better
            status = Status.NO_SOLUTION
            if home is not None:  # optimal whenever the bound closes, whoever found the plan
                closed = bound_closes(g.objective(home), bound)
                status = Status.OPTIMAL if closed else Status.TIME_LIMIT
            terminations.append(out.termination)
            if home is None:
                statuses.append(Status.NO_SOLUTION)
                homes.append(np.zeros(g.experts, dtype=np.int64))
            else:
                statuses.append(status)
                homes.append(_finish(home, g, gpn, rng))
            bounds.append(bound)
            incumbents.append(out.incumbent)
            starts.append(None if start is None else g.objective(start))
            gaps.append(out.gap)
            walls.append(out.wall_time)
            ctx.say(
                f"{self.name} layer {l}: {out.termination.value}, {statuses[-1].solution} plan, "
                f"incumbent {'-' if out.incumbent is None else format(out.incumbent, '.6g')}, bound {bound:.6g}, "
                f"{out.wall_time:.2f} s"
            )
        stats = {
            "solver_objective": float(sum(v for v in incumbents if v is not None)),
            "layer_status": [s.value for s in statuses],
            "layer_termination": [t.value for t in terminations],
            "layer_solver_gap": gaps,
            "layer_wall_time": walls,
            "warm_start_objective": starts,
            "bound_kind": kinds,
            "solver_bounds_discarded": discarded,
        }
        if certs:
            stats["certificate"] = certs
        termination = combine_termination(terminations)
        cut = certificate_capped(certs)
        if cut:  # the clock, not the work budget, ended a certificate: the bound depends on the machine's speed
            stats["certificate_capped_layers"] = cut
            stats["note"] = CERTIFICATE_CAPPED
            termination = Termination.TIME_LIMIT
        if Status.NO_SOLUTION in statuses:
            return Result(
                method=self.name,
                status=Status.NO_SOLUTION,
                plan=None,
                bound=float(sum(bounds)),
                sense="max",
                objective_name="affinity",
                params=vars(params).copy(),
                stats=stats,
                termination=termination,
            )
        return self._result(problem, params, graph, groupings, homes, statuses, bounds, stats, eps, termination)


@register
class TacgCpsat(TacgExact):
    """Exact TACG grouping with OR-Tools CP-SAT, hinted with the heuristic plan."""

    name: ClassVar[str] = "tacg-cpsat"
    summary: ClassVar[str] = "exact task-aware grouping, CP-SAT (heuristic plan as hint)"
    backend: ClassVar[str] = "cpsat"


@register
class TacgMilp(TacgExact):
    """Exact TACG grouping as a Pyomo MILP solved by HiGHS (or the ``solver`` parameter's choice)."""

    name: ClassVar[str] = "tacg-milp"
    summary: ClassVar[str] = "exact task-aware grouping, MILP in Pyomo (solver: highs, cbc, glpk, gurobi, cplex, scip)"
    backend: ClassVar[str] = "milp"
    Params: ClassVar[type] = MilpParams


@register
class TacgHighs(TacgExact):
    """Exact TACG grouping, the same MILP built directly with highspy's array API."""

    name: ClassVar[str] = "tacg-highs"
    summary: ClassVar[str] = "exact task-aware grouping, MILP built with highspy arrays"
    backend: ClassVar[str] = "highs"
