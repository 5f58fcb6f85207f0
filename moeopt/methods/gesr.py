"""GESR: generic expert shared replication on top of any base plan (SPEC section 4).

Per layer: a *generic score* ``a·centrality + b·consistency − c·deviation`` finds the experts
every family uses (the hot spots a task-aware grouping cannot spread), the top ``R`` of them
above a centrality floor each get ``r`` replicas, placed by *structural fit* (coactivation
with the experts homed on the candidate GPU), ties broken by the lower estimated load, in the
cluster's ``replica_slots_per_gpu`` and never two copies of one expert on one GPU. At serving
time the online guard of [`moeopt.dispatch.guard_layer`][] picks a copy per token (λ, δ);
the evaluator simulates it, so the result's metrics are measured.

Methods: ``gesr`` (base plan + GESR replicas; default base ``tacg``), and on the same base and
budget ``hottest-replication`` (EPLB's idea: give the hottest expert per copy another copy on
the least loaded GPU) and ``random-replication``. Every result carries the exact replication
certificate of `moeopt.solvers.replication` (the lowest MaxVio any replica choice within
the budget could reach with a perfect split) on the calibration loads; the evaluation metrics
get it through a metric hook (``replication_bound_maxvio``, ``replication_gap``).

Count-only workloads (no coactivation) have no structural fit: placement then degrades to
load only (every candidate GPU fits equally, so the least loaded one wins).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from moeopt.errors import InputError
from moeopt.instance import Instance
from moeopt.methods.baselines import calibration_maxvio
from moeopt.plan import Dispatch, Plan
from moeopt.registry import Context, Problem, get_method, method_names, parse_params, register
from moeopt.result import Result, Status, Termination, combine_status, combine_termination
from moeopt.scoring import Workloads
from moeopt.solvers.replication import ReplicationBound, solve_replication_bound
from moeopt.trace import LIFT_EPS, log_lift

#: seconds per layer of the certificate MILP when the caller gives no time limit ...
CERTIFICATE_TIME_LIMIT = 2.0
#: ... and at most this many seconds over all layers (58-layer models get 0.5 s a layer)
CERTIFICATE_BUDGET = 30.0


def certificate_time(layers: int) -> float:
    """Default per-layer time limit of the certificate for a model with ``layers`` layers."""
    return min(CERTIFICATE_TIME_LIMIT, CERTIFICATE_BUDGET / max(layers, 1))


# ----------------------------------------------------------------------------- score
@dataclass(frozen=True)
class GenericScore:
    """Per-expert terms of the generic score of one layer, each ``[E]``."""

    score: np.ndarray
    centrality: np.ndarray
    consistency: np.ndarray
    deviation: np.ndarray


def generic_score(
    usage: np.ndarray,
    family_share: np.ndarray,
    *,
    a: float = 1.0,
    b: float = 1.0,
    c: float = 1.0,
    eps: float = LIFT_EPS,
) -> GenericScore:
    """``score = a·centrality + b·consistency − c·deviation`` of one layer (SPEC 4.1).

    Parameters
    ----------
    usage
        u ``[F, E]``: fraction of each family's token-slots routed to each expert.
    family_share
        π ``[F]``; families with no tokens are ignored.
    a, b, c
        Weights of centrality, consistency and the deviation penalty.
    eps
        ε of the log-lift ``s[f, e] = log((u[f, e] + ε) / (ubar[e] + ε))``.

    Returns
    -------
    GenericScore
        centrality ``ubar / max ubar``; consistency, the entropy of ``u[·, e] / Σ_f u[f, e]``
        divided by ``log F`` (1 = used equally by every family; 1 with a single family);
        deviation ``max_f |s[f, e]|``.
    """
    present = np.asarray(family_share) > 0
    u = np.asarray(usage, dtype=np.float64)[present]
    pi = np.asarray(family_share, dtype=np.float64)[present]
    pi = pi / pi.sum()
    ubar = pi @ u
    top = ubar.max()
    centrality = ubar / top if top > 0 else np.zeros_like(ubar)
    F = u.shape[0]
    if F > 1:
        col = u.sum(axis=0)
        q = np.where(col > 0, u / np.where(col > 0, col, 1.0), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ent = -np.where(q > 0, q * np.log(q), 0.0).sum(axis=0)
        consistency = np.where(col > 0, ent / np.log(F), 0.0)
    else:
        consistency = np.ones_like(ubar)
    deviation = np.abs(log_lift(u, ubar, eps)).max(axis=0)
    score = a * centrality + b * consistency - c * deviation
    return GenericScore(score, centrality, consistency, deviation)


def select_generic(score: GenericScore, count: int, floor: float) -> np.ndarray:
    """The ``count`` best-scoring experts with centrality at least ``floor``, best first."""
    eligible = np.nonzero(score.centrality >= floor)[0]
    order = eligible[np.argsort(-score.score[eligible], kind="stable")]
    return order[: max(count, 0)]


# ----------------------------------------------------------------------------- placement
def place_replicas(
    selected: np.ndarray,
    home: np.ndarray,
    load: np.ndarray,
    gpus: int,
    slots: int,
    *,
    copies_each: int = 1,
    affinity: np.ndarray | None = None,
    fit_tolerance: float = 0.0,
    load_cap: float | None = None,
) -> np.ndarray:
    """Replica GPUs for the selected experts by structural fit (SPEC 4.2).

    Each selected expert (in the given order) gets up to ``copies_each`` replicas. A copy of
    e goes to the GPU g with a free replica slot and no copy of e that maximizes the fit
    ``Σ_{e' homed on g} A[e, e']``; GPUs whose fit is within ``fit_tolerance`` (relative) of
    the best count as tied and the one with the lowest estimated load wins (load = home
    experts' loads plus replicated experts' loads split evenly over their copies). Without
    ``affinity`` (count-only workloads) every fit is 0: placement is by load only.

    Parameters
    ----------
    selected
        int ``[R]`` experts to replicate, most generic first.
    home
        int ``[E]`` home GPUs of the base plan.
    load
        float ``[E]`` calibration loads (token-slots).
    gpus, slots
        G and the replica slots per GPU.
    copies_each
        r, replicas per selected expert.
    affinity
        optional A ``[E, E]`` (task-agnostic coactivation).
    fit_tolerance
        relative tolerance under which two fits tie.

    Returns
    -------
    numpy.ndarray
        int ``[n, 2]`` rows ``(expert, gpu)``.
    """
    home = np.asarray(home, dtype=np.int64)
    load = np.asarray(load, dtype=np.float64)
    E = len(home)
    onehot = np.zeros((E, gpus))
    onehot[np.arange(E), home] = 1.0
    fit_all = affinity @ onehot if affinity is not None else np.zeros((E, gpus))
    holders = onehot.astype(bool)
    ncopy = np.ones(E)
    gpu_load = np.bincount(home, weights=load, minlength=gpus)
    free = np.full(gpus, slots)
    reps: list[tuple[int, int]] = []
    for e in np.asarray(selected, dtype=np.int64):
        for _ in range(copies_each):
            options = np.nonzero((free > 0) & ~holders[e])[0]
            if not len(options):
                break
            if load_cap is not None:  # secondary GPUs: those not already above the cap
                light = options[gpu_load[options] <= load_cap * gpu_load.mean()]
                options = light if len(light) else options
            fit = fit_all[e, options]
            best = fit.max()
            tied = options[fit >= best - fit_tolerance * abs(best)]
            g = int(tied[np.argmin(gpu_load[tied])])
            share = load[e] / ncopy[e]
            gpu_load[holders[e]] -= share - load[e] / (ncopy[e] + 1)
            ncopy[e] += 1
            gpu_load[g] += load[e] / ncopy[e]
            holders[e, g] = True
            free[g] -= 1
            reps.append((int(e), g))
    return np.array(reps, dtype=np.int64).reshape(-1, 2)


def random_replicas(home: np.ndarray, gpus: int, slots: int, budget: int, rng: np.random.Generator) -> np.ndarray:
    """``budget`` random copies (expert, gpu): a random free slot, a random expert it lacks."""
    home = np.asarray(home, dtype=np.int64)
    E = len(home)
    slot_gpu = rng.permutation(np.repeat(np.arange(gpus), slots))[: max(budget, 0)]
    reps: list[tuple[int, int]] = []
    taken = np.zeros((E, gpus), dtype=bool)
    taken[np.arange(E), home] = True
    for g in slot_gpu:
        options = np.nonzero(~taken[:, g])[0]
        if not len(options):
            continue
        e = int(rng.choice(options))
        taken[e, g] = True
        reps.append((e, int(g)))
    return np.array(reps, dtype=np.int64).reshape(-1, 2)


# ----------------------------------------------------------------------------- base plan
def base_result(problem: Problem, base: str, base_params: dict[str, Any] | None, ctx: Context) -> Result:
    """Run the base method (e.g. ``tacg``) on the same problem; its replicas are dropped.

    Raises
    ------
    InputError
        When ``base`` is not a registered method (``tacg`` before it is installed), or names
        a replication method itself.
    """
    src = str(problem.instance.source) if problem.instance.source else None
    if base in REPLICATION_METHODS:
        raise InputError(src, "method.base", f"base {base!r} is itself a replication method")
    if base not in method_names():
        raise InputError(
            src,
            "method.base",
            f"base method {base!r} is not registered (registered: {', '.join(method_names())}); "
            "set method.base to one of them, e.g. base: greedy",
        )
    impl = get_method(base, source=src)
    if not impl.available():
        raise InputError(src, "method.base", f"base method {base!r} is not available here")
    if "coactivation" in impl.requires and not problem.stats.has_coactivation:
        raise InputError(src, "method.base", f"base method {base!r} needs a token trace; this workload is count-only")
    params = parse_params(impl, base_params, source=src)
    result = impl.solve(problem, params, ctx)
    if result.plan is None:
        raise InputError(src, "method.base", f"base method {base!r} returned no plan ({result.status.value})")
    return result


# ----------------------------------------------------------------------------- certificate
def replication_certificate(
    home: np.ndarray,
    loads: np.ndarray,
    gpus: int,
    slots: int,
    *,
    time_limit: float = CERTIFICATE_TIME_LIMIT,
    hints: tuple[np.ndarray, ...] | None = None,
) -> list[ReplicationBound]:
    """The replication certificate of every layer (``home`` ``[L, E]``, ``loads`` ``[L, E]``)."""
    return [
        solve_replication_bound(
            home[l],
            loads[l],
            gpus,
            slots,
            time_limit=time_limit,
            hint=None if hints is None else hints[l],
        )
        for l in range(len(home))
    ]


def certificate_stats(bounds: list[ReplicationBound], measured: float | None, prefix: str = "replication") -> dict:
    """Summary of per-layer certificates: mean bound, best found, status, gap to ``measured``."""
    bound = float(np.mean([b.bound for b in bounds])) if bounds else 0.0
    best = [b.best for b in bounds if b.best is not None]
    out = {
        f"{prefix}_bound_maxvio": bound,
        f"{prefix}_best_maxvio": None if len(best) < len(bounds) else float(np.mean(best)),
        f"{prefix}_bound_status": combine_status([b.status for b in bounds]).value,
        f"{prefix}_bound_time": float(sum(b.wall_time for b in bounds)),
        f"{prefix}_bound_per_layer": [b.bound for b in bounds],
    }
    if measured is not None:
        out[f"{prefix}_gap"] = max(measured - bound, 0.0)
    return out


_HOOK_CACHE: dict[tuple, list[ReplicationBound]] = {}


def certificate_hook(plan: Plan, instance: Instance, wl: Workloads, metrics: dict, params: dict) -> None:
    """Metric hook of the replication methods: the replication certificate on the evaluation
    loads, for replicated plans whose method asked for it (``certificate`` parameter)."""
    slots = instance.cluster.replica_slots_per_gpu
    if not plan.has_replicas or slots <= 0 or not params.get("certificate", False):
        return
    loads = wl.evaluation.expert_load
    G = instance.cluster.gpus
    key = (plan.home.tobytes(), loads.tobytes(), G, slots)
    if key not in _HOOK_CACHE:
        _HOOK_CACHE.clear()  # one entry: a benchmark evaluates several plans on one base
        _HOOK_CACHE[key] = replication_certificate(
            plan.home,
            loads,
            G,
            slots,
            hints=plan.replicas,
            time_limit=params.get("certificate_time_limit") or certificate_time(plan.layers),
        )
    metrics.update(certificate_stats(_HOOK_CACHE[key], metrics.get("maxvio")))


# ----------------------------------------------------------------------------- methods
@dataclass
class ReplicationParams:
    """Parameters every replication method shares."""

    base: str = "tacg"  # the method giving the home placement
    base_params: dict | None = None  # its parameters
    replicas: int | None = None  # replica copies per layer; default: every replica slot
    lam: float = 1.0  # guard λ: weight of the decayed load against locality
    decay: float = 0.9  # guard δ: Lhat <- δ Lhat + (1 - δ) load(batch)
    # guard batch size within a trace step (None: the step)
    guard_batch_tokens: int | None = field(default=32, metadata={"ge": 1})
    dispatch: str = "locality"  # how tokens split over copies: locality (the guard), even, static, lp
    certificate: bool = True  # solve the replication MILP on the calibration loads
    certificate_time_limit: float | None = None  # seconds per layer (default min(2, 30 / L))

    def __post_init__(self) -> None:
        if self.base_params is not None and not isinstance(self.base_params, dict):
            raise ValueError(f"base_params must be a mapping, got {self.base_params!r}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {self.decay}")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if self.guard_batch_tokens is not None and self.guard_batch_tokens < 1:
            raise ValueError(f"guard_batch_tokens must be >= 1, got {self.guard_batch_tokens}")
        if self.replicas is not None and self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")
        Dispatch(kind=self.dispatch)  # one-line error for an unknown kind

    def dispatch_rule(self) -> Dispatch:
        """The plan's dispatch: the guard with these λ, δ and batch size, or another kind."""
        if self.dispatch == "locality":
            return Dispatch(kind="locality", lam=self.lam, decay=self.decay, batch_tokens=self.guard_batch_tokens)
        return Dispatch(kind=self.dispatch)


@dataclass
class GesrParams(ReplicationParams):
    """GESR's parameters (SPEC 4): score weights, floor, copies per expert, fit tolerance."""

    a: float = 1.0  # weight of centrality ubar / max ubar
    b: float = 1.0  # weight of cross-family consistency (normalized entropy)
    c: float = 1.0  # weight of the deviation penalty max_f |s[f, e]|
    centrality_floor: float = 0.2  # only experts at least this central are candidates
    copies_each: int = field(default=1, metadata={"ge": 1})  # r: replicas per selected expert
    fit_tolerance: float = 0.3  # relative fit difference treated as a tie (then lower load)
    load_cap: float | None = 1.0  # only GPUs with estimated load <= load_cap * mean host copies

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.copies_each < 1:
            raise ValueError(f"copies_each must be >= 1, got {self.copies_each}")
        if self.fit_tolerance < 0:
            raise ValueError(f"fit_tolerance must be >= 0, got {self.fit_tolerance}")


class _Replication:
    """Shared driver: base plan, per-layer replicas, measured objective and certificate."""

    name: ClassVar[str]
    summary: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()
    Params: ClassVar[type] = ReplicationParams
    metric_hooks: ClassVar[tuple] = (certificate_hook,)
    #: solved layer by layer (moeopt.execute): base plan, replicas and certificate of each
    #: layer; calibration MaxVio and its bound average over layers
    combine: ClassVar[str] = "mean"
    uses_trace: ClassVar[bool] = True  # the calibration MaxVio runs the guard on the trace
    stats_rules: ClassVar[dict] = {
        "base_status": "status",
        "calibration_replication_bound_status": "status",
        "base_wall_time": "sum",
        "calibration_replication_bound_time": "sum",
    }

    def available(self) -> bool:
        return True

    def combine_stats(self, per_layer: list[dict], params: Any) -> dict:
        """The layers' statistics; the base objective combines as the base method's does."""
        from moeopt.execute import combine_stats

        base_rule = getattr(get_method(params.base), "combine", "list")
        return combine_stats(per_layer, self.combine, {**self.stats_rules, "base_objective": base_rule})

    def layer_replicas(
        self, problem: Problem, params: Any, l: int, home: np.ndarray, budget: int, ctx: Context
    ) -> np.ndarray:
        raise NotImplementedError

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result:
        t0 = time.perf_counter()
        # the base plan takes 40 % of the budget; a fifth goes to each replication certificate
        # (on calibration loads here, on evaluation loads when the plan is scored), the rest to the
        # replicas and what no clock cuts (scoring, building the certificates' models)
        base = base_result(problem, params.base, params.base_params, replace(ctx, budget=ctx.budget.child(0.4)))
        return self.replicate(problem, params, base, ctx, t0=t0)

    def replicate(
        self, problem: Problem, params: Any, base: Result, ctx: Context, *, t0: float | None = None
    ) -> Result:
        """Add this method's replicas to the plan of a base result (its replicas dropped)."""
        t0 = time.perf_counter() if t0 is None else t0
        if base.plan is None:
            raise ValueError(f"{self.name}: the base result {base.method!r} has no plan to replicate")
        home = base.plan.home
        c = problem.instance.cluster
        G, S = c.gpus, c.replica_slots_per_gpu
        budget = G * S if params.replicas is None else min(params.replicas, G * S)
        rule = params.dispatch_rule()
        unreplicated = problem.plan(home, dispatch=rule)
        if S == 0 or budget == 0:
            plan = unreplicated
        else:
            reps = tuple(
                self.layer_replicas(problem, params, l, home[l], budget, ctx)
                for l in ctx.layers(problem.layers, self.name)
            )
            plan = problem.plan(home, reps, dispatch=rule)
        objective = calibration_maxvio(plan, problem)
        stats: dict[str, Any] = {
            "base_method": params.base,
            "base_status": base.status.value,
            "base_objective": base.objective,
            "base_objective_name": base.objective_name,
            "base_wall_time": base.wall_time,
            "base_calibration_maxvio": calibration_maxvio(unreplicated, problem),
            "replicas_per_layer": [len(r) for r in plan.replicas],
        }
        bound = None
        reported = dict(vars(params))
        if params.certificate and S > 0:
            limit = params.certificate_time_limit
            if limit is None:
                limit = certificate_time(ctx.model_layers or problem.layers)  # the whole model's layers
            if ctx.time_limit is not None:  # the layer's limit: a fifth of it per certificate
                limit = min(limit, 0.2 * ctx.time_limit)
                reported["certificate_time_limit"] = limit  # what the scoring's certificate_hook uses
            limit = min(limit, ctx.budget.remaining() / problem.layers)
            bounds = replication_certificate(
                home, problem.stats.expert_load, G, S, time_limit=limit, hints=plan.replicas
            )
            stats.update(certificate_stats(bounds, objective, prefix="calibration_replication"))
            bound = stats["calibration_replication_bound_maxvio"]
            if ctx.time_limit is not None:
                # the scoring's certificate (certificate_hook) runs after the solve: it gets what is
                # left of the run's budget, shared over the layers, so that the run keeps its limit
                left = max(ctx.budget.remaining(), 0.0) / problem.layers
                reported["certificate_time_limit"] = max(min(limit, left), 1e-3)
        return Result(
            method=self.name,
            status=combine_status([base.status, Status.FEASIBLE]),
            termination=combine_termination([base.termination, Termination.COMPLETED]),
            plan=plan,
            objective=objective,
            bound=bound,
            sense="min",
            objective_name="calibration_maxvio",
            wall_time=time.perf_counter() - t0,
            params=reported,
            stats=stats,
        )


@register
class Gesr(_Replication):
    """GESR: replicate generic experts by structural fit on top of a base plan."""

    name: ClassVar[str] = "gesr"
    summary: ClassVar[str] = "generic expert shared replication on a base plan (default tacg) + online guard"
    Params: ClassVar[type] = GesrParams

    def layer_replicas(
        self, problem: Problem, params: GesrParams, l: int, home: np.ndarray, budget: int, ctx: Context
    ) -> np.ndarray:
        stats = problem.stats
        score = generic_score(stats.usage[:, l], stats.family_share, a=params.a, b=params.b, c=params.c)
        selected = select_generic(score, budget // params.copies_each, params.centrality_floor)
        affinity = stats.affinity[l] if stats.affinity is not None else None
        c = problem.instance.cluster
        return place_replicas(
            selected,
            home,
            stats.expert_load[l],
            c.gpus,
            c.replica_slots_per_gpu,
            copies_each=params.copies_each,
            affinity=affinity,
            fit_tolerance=params.fit_tolerance,
            load_cap=params.load_cap,
        )


@register
class HottestReplication(_Replication):
    """EPLB's idea on a base plan: replicate the hottest expert per copy, least loaded GPU."""

    name: ClassVar[str] = "hottest-replication"
    summary: ClassVar[str] = "base plan + EPLB-style hottest-first replicas (same budget as gesr)"

    def layer_replicas(
        self, problem: Problem, params: ReplicationParams, l: int, home: np.ndarray, budget: int, ctx: Context
    ) -> np.ndarray:
        from moeopt.methods.baselines import hottest_replicas

        c = problem.instance.cluster
        return hottest_replicas(problem.stats.expert_load[l], home, c.gpus, c.replica_slots_per_gpu, budget)


@register
class RandomReplication(_Replication):
    """Random replicas on a base plan (seeded): the budget without any selection rule."""

    name: ClassVar[str] = "random-replication"
    summary: ClassVar[str] = "base plan + random replicas (same budget as gesr, seeded)"

    def layer_replicas(
        self, problem: Problem, params: ReplicationParams, l: int, home: np.ndarray, budget: int, ctx: Context
    ) -> np.ndarray:
        rng = np.random.default_rng([ctx.seed, l])
        c = problem.instance.cluster
        return random_replicas(home, c.gpus, c.replica_slots_per_gpu, budget, rng)


REPLICATION_METHODS = frozenset({Gesr.name, HottestReplication.name, RandomReplication.name})
