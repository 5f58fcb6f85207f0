"""``crosslayer``: plan the layers together when tokens stay on the GPU of their last expert.

The method: registration, parameters, the starts, the certificate and the result. The algorithm
(the objective under ``cluster.token_home: previous-layer``, its gains, the sweeps, chain moves,
kicks, load bounds and the exact optimum of tiny instances) lives in `moeopt.crosslayer`, whose
docstring describes it.

**Certificate** (``bound_rounds`` of column generation per layer, capped at ``bound_time``
seconds and by the time limit; ``bound_time: 0``: none): a token's remote GPUs at a layer are
its distinct GPUs less at most one (its home), so every plan's objective is at least, per layer,
the lower bound on distinct GPUs per token of `moeopt.colgen.cover.distinct_lower_bound`
(column generation over GPU contents, seeded with the plan; a pair LP where that is cut short;
a semidefinite bound on the pairs that share a GPU, up to 64 experts)
less the share of tokens that can stay at all (`moeopt.colgen.cover.stay_upper_bound`, an
LP over which previous-layer experts can share a GPU with which experts of this layer), or
times ``1 - 1/G`` at layer 0 under uniform homes (`moeopt.colgen.cover.remote_lower_bound`).
It ignores the load limit, so it is valid for every plan and loose; `maxvio_budget_bound` is the
bound within load limits.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from moeopt.crosslayer import (
    StayGain,
    cheapest_levels,
    largest_loads,
    least_largest_load,
    plan_remote,
    stay_edges,
    sweep,
)
from moeopt.errors import InfeasibleError
from moeopt.heuristics.hyperedges import ConnectivityGain, token_hyperedges
from moeopt.heuristics.local_search import TOL, limited_search, load_limit, resolve_eps_load
from moeopt.methods.hypergraph import _available
from moeopt.registry import Context, Problem, register
from moeopt.relabel import relabel_gpus, speed_classes
from moeopt.result import Result, Status, Termination, bound_closes
from moeopt.solvers.partitioners import fixed_home_partition, mtkahypar_partition


@dataclass
class CrossLayerParams:
    """Parameters of ``crosslayer``.

    Attributes
    ----------
    eps_load
        Load limit per layer, as ``agnostic``'s: each GPU's share of the layer's load at most
        ``(1 + eps_load) / G``; None (default): the automatic limit of ``tacg`` / ``agnostic``;
        ``.inf``: none. Hard, as in every method. The search from each start also keeps every
        layer's largest load at or below that start's: the plan is never less balanced than
        where it started (``agnostic``'s plan, the best start on the benchmarks).
    relax_eps_load
        Relax a limit that repair cannot meet (by ``x1.1`` steps) instead of failing; the
        starts get it too, and a note reports any relaxation.
    starts
        Comma-separated starting plans: ``agnostic`` (the ``agnostic`` method's plan),
        ``hypergraph`` (the ``hypergraph`` method's plan), ``forward`` (layer by layer,
        Mt-KaHyPar with each token's home GPU as a fixed pin). Each is improved by the sweeps;
        the best on the calibration trace is returned.
    sweeps
        Most passes over the layers (alternating forward and backward); a pass re-plans each
        layer knowing the previous layer's plan (where its tokens live) and the next layer's
        plan (where the tokens its top-1 experts send on find their experts): a free GPU
        renumbering, then swap/move search under the load limit. Stops early when a pass
        saves less than ``tolerance`` of the remote GPUs.
    tolerance
        Relative improvement below which the sweeps stop.
    kicks, patience, kick_swaps
        Iterated local search after the sweeps: at most ``kicks`` rounds (0: none), each 1 to
        ``kick_swaps`` random feasible swaps in one random layer followed by re-planning that
        layer and its neighbours, kept when not worse; stops after ``patience`` rounds without
        a new best, or at the time limit (per layer times the layers).
    chains
        After each pass (and around each kick), chain moves between consecutive layers
        (`chain_pass`): for a pair of GPUs, the best joint re-split of the experts they
        hold at layers l and l + 1, priced exactly; at most ``C(2S, S) = 70`` splits per layer
        (4 slots per GPU), skipped beyond.
    seed, preset
        Mt-KaHyPar seed offset and preset (starts ``hypergraph`` and ``forward``).
    bound_rounds
        Work budget of the certificate (a lower bound on every plan's objective, see the module
        docstring), after the search: master LP solves of its column generation per layer (None: by
        the layer's size, `moeopt.colgen.cover.cover_rounds`; its LPs, the stay LP's
        included, are bounded by iterations too), so that the bound, like the plan, is a function
        of the input, the seed and the parameters.
    bound_time
        Outer wall-clock cap on the certificate, seconds per layer, and as many again for its
        stay LP (None: none but the time limit's share; 0: no certificate). Under a time limit
        the search leaves the certificate a fifth of the budget, and it takes at most that; a cap
        that stops it is reported (termination ``time_limit`` and a note).
    """

    eps_load: float | None = field(default=None, metadata={"inf": True})
    relax_eps_load: bool = False
    starts: str = "agnostic,hypergraph"
    sweeps: int = 6
    tolerance: float = 1e-4
    kicks: int = 0
    patience: int = 20
    kick_swaps: int = 3
    chains: bool = True
    seed: int = 0
    preset: str = "default"
    bound_rounds: int | None = field(default=None, metadata={"ge": 1})
    bound_time: float | None = None

    def __post_init__(self) -> None:
        if self.bound_time is not None and not (math.isfinite(self.bound_time) and self.bound_time >= 0):
            raise ValueError(f"bound_time must be a finite number >= 0, got {self.bound_time}")
        if self.bound_rounds is not None and self.bound_rounds < 1:
            raise ValueError(f"bound_rounds must be >= 1, got {self.bound_rounds}")
        if self.eps_load is not None and not self.eps_load >= 0:
            raise ValueError(f"eps_load must be >= 0, got {self.eps_load}")
        names = [s.strip() for s in self.starts.split(",") if s.strip()]
        bad = [s for s in names if s not in START_KINDS]
        if not names or bad:
            raise ValueError(
                f"starts: expected a comma-separated subset of {', '.join(START_KINDS)}, got {self.starts!r}"
            )
        if self.sweeps < 0:
            raise ValueError(f"sweeps must be >= 0, got {self.sweeps}")
        if not self.tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")
        if self.kicks < 0 or self.patience < 1 or self.kick_swaps < 1:
            raise ValueError("kicks must be >= 0, patience and kick_swaps >= 1")

    @property
    def start_names(self) -> list[str]:
        return [s.strip() for s in self.starts.split(",") if s.strip()]


START_KINDS = ("agnostic", "hypergraph", "forward")
#: under a time limit: the starts' share of the budget, and the search's (the starts' and the sweeps')
#: when a certificate follows (it gets the rest)
START_SHARE = 0.4
SEARCH_SHARE = 0.7


@register
class CrossLayer:
    """Plans all layers together for ``token_home: previous-layer`` (sweeps over the layers)."""

    name: ClassVar[str] = "crosslayer"
    summary: ClassVar[str] = "plans layers together for token_home: previous-layer (relabel + swap sweeps)"
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    Params: ClassVar[type] = CrossLayerParams
    metric_hooks: ClassVar[tuple] = ()
    #: each layer's plan depends on its neighbours': never split into independent layers
    layerwise: ClassVar[bool] = False

    def available(self) -> bool:
        return _available("mtkahypar")

    def solve(self, problem: Problem, params: CrossLayerParams, ctx: Context) -> Result:
        t0 = time.perf_counter()
        trace = problem.trace
        assert trace is not None
        c = problem.instance.cluster
        G, S, L = c.gpus, c.slots_per_gpu, problem.layers
        topk = trace.topk.astype(np.int64)
        first = trace.home
        classes = speed_classes(G, problem.profile)
        loads, limits = layer_limits(problem, params)
        relax = [params.relax_eps_load] * L
        starts: dict[str, np.ndarray] = {}
        if ctx.hint is not None:
            starts["hint"] = ctx.hint.home
        for kind in params.start_names:
            starts[kind] = self._start(kind, problem, params, ctx, loads, limits, relax)
        for kind, homes in starts.items():
            # the free relabeling every method gets in solve(): the sweeps only improve on it
            relabeled, _ = relabel_gpus(problem.plan(homes), trace, c, problem.profile)
            starts[kind] = relabeled.home
        best_kind, best, best_cost = None, None, np.inf
        report: dict[str, dict[str, Any]] = {}
        # under a time limit the certificate keeps 30 % of what is left (at most bound_time per layer)
        search = ctx.budget.child(SEARCH_SHARE) if ctx.budget.limited and params.bound_time != 0 else ctx.budget
        for i, (kind, homes) in enumerate(starts.items()):
            before = float(plan_remote(homes, topk, first, G).sum())
            rng = np.random.default_rng([ctx.seed + params.seed, len(report)])
            deadline = search.child(1.0 / (len(starts) - i)).deadline  # this start's share of what is left
            # never less balanced than the start: each layer's limit is at most the start's largest
            # load (a start is within the limit; on held-out tokens the plan then stays about as
            # balanced as the start, e.g. agnostic's plan passed as the hint)
            lims = [
                None if lim is None else min(lim, top)
                for lim, top in zip(limits, largest_loads(homes, loads, G), strict=True)
            ]
            homes, info = sweep(homes, topk, first, G, S, loads, lims, relax, classes, params, rng, deadline)
            cost = float(plan_remote(homes, topk, first, G).sum())
            report[kind] = {"start": before / trace.tokens / L, "final": cost / trace.tokens / L, **info}
            ctx.say(f"crosslayer start {kind}: {before / trace.tokens / L:.4f} -> {cost / trace.tokens / L:.4f}")
            if cost < best_cost - TOL:
                best_kind, best, best_cost = kind, homes, cost
        assert best is not None
        plan = problem.plan(best)
        used = [None if lim is None else lim * G - 1.0 for lim in limits]
        maxload = [top * G - 1.0 for top in largest_loads(best, loads, G)]
        objective = best_cost / max(trace.tokens, 1) / L
        bound, certificate = self.certificate(problem, plan, params, ctx)
        status = Status.FEASIBLE
        if bound is not None and bound_closes(objective, bound):
            status = Status.OPTIMAL
        cut = [f"the search from {k}" for k, r in report.items() if r.get("capped")]
        if certificate.get("bound_capped_layers"):  # the clock, not the work budget, ended the bound
            cut.append(f"the certificate in {certificate['bound_capped_layers']} layer(s)")
        if cut:  # the plan (or the bound) depends on the machine's speed
            certificate = {**certificate, "note": f"time limit cut {' and '.join(cut)} short"}
        return Result(
            method=self.name,
            status=status,
            termination=Termination.TIME_LIMIT if cut else None,
            plan=plan,
            objective=objective,
            bound=bound,
            objective_name="remote GPUs per token (previous-layer homes, calibration)",
            sense="min",
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats={
                "best_start": best_kind,
                "starts": report,
                "eps_load_used": used,
                "calibration_maxvio_pooled": maxload,
                **certificate,
            },
        )

    @staticmethod
    def certificate(problem: Problem, plan: Any, params: CrossLayerParams, ctx: Context) -> tuple[float | None, dict]:
        """A lower bound on every plan's calibration objective (mean over layers of the remote
        GPUs per token) and its per-layer figures; ``(None, {})`` when ``bound_time`` is 0. Bounded by
        ``bound_rounds`` (work), capped by ``bound_time`` and the layer's share of the budget left."""
        from moeopt.joint.certify import certificate_cap, layer_certificates

        if params.bound_time == 0:
            return None, {}
        trace = problem.trace
        assert trace is not None
        # most of what is left of the run's budget (the scoring of the plan follows)
        limit = certificate_cap(ctx.budget.child(0.8), problem.layers, params.bound_time, previous_layer=True)
        # layer 0: the trace's homes or uniform ones; later layers: the previous expert's GPU
        uniform = [l == 0 and trace.home is None for l in range(problem.layers)]
        # the plans searched: single copy, each layer within its load limit (a relaxed limit:
        # the plan's own largest load, so that the bound holds for it too)
        loads, limits = layer_limits(problem, params)
        G = problem.instance.cluster.gpus
        limits = [
            None if lim is None else max(lim, top)
            for lim, top in zip(limits, largest_loads(plan.home, loads, G), strict=True)
        ]
        lower, stats = layer_certificates(
            problem,
            plan.slots,
            limit,
            uniform,
            ctx,
            "crosslayer",
            previous_layer=True,
            loads=loads,
            load_limits=limits,
            rounds=params.bound_rounds,
        )
        return float(np.mean(lower)), stats

    # ---------------------------------------------------------------- starts
    def _start(self, kind, problem, params, ctx, loads, limits, relax) -> np.ndarray:
        from moeopt import execute
        from moeopt.registry import get_method, parse_params

        c = problem.instance.cluster
        if kind in ("agnostic", "hypergraph"):
            impl = get_method(kind)
            given = {} if params.eps_load is None else {"eps_load": params.eps_load}
            if params.relax_eps_load:
                given["relax_eps_load"] = True
            if kind == "hypergraph":
                given["preset"] = params.preset
            # the starts share 40 % of the budget (L x the layer limit); the sweeps and the certificate the rest
            share = None if ctx.time_limit is None else START_SHARE * ctx.time_limit / max(len(params.start_names), 1)
            sub = Context(time_limit=share, seed=ctx.seed + params.seed, quiet=True)
            own = parse_params(impl, given)
            if kind == "agnostic":  # only the plan is used: no subgradient bound for it (-1: skipped)
                own = dataclasses.replace(own, bound_iterations=-1, eigen_iterations=-1)
            res = execute.run(impl, problem, own, sub)
            if res.plan is None:
                raise InfeasibleError(
                    f"crosslayer: start {kind!r} found no plan ({res.stats.get('reason', res.status)})"
                )
            return res.plan.home
        # forward: Mt-KaHyPar with home pins, layer by layer, repaired to the load limit
        trace = problem.trace
        G, S, E = c.gpus, c.slots_per_gpu, problem.experts
        token_home = trace.home
        homes = []
        for l in range(problem.layers):
            ids = trace.topk[:, l, :].astype(np.int64)
            if token_home is None:
                edges = token_hyperedges(ids, E)
                h, _ = mtkahypar_partition(edges, G, S, seed=ctx.seed + params.seed + l, preset=params.preset)
                gain: ConnectivityGain | StayGain = ConnectivityGain(edges)
            else:
                edges = stay_edges(ids, token_home, E, G)
                h = fixed_home_partition(edges, E, G, S, seed=ctx.seed + params.seed + l, preset=params.preset)
                gain = StayGain(edges, E, G)
            eps = None if limits[l] is None else limits[l] * G - 1.0
            h, _, _ = limited_search(
                [h],
                gain,
                G,
                S,
                load=loads[l],
                eps_load=eps,
                relax=relax[l],
                refine=False,
                score=lambda x: 0.0,
                balanced=True,
            )
            homes.append(h)
            token_home = h[ids[:, 0]]
        return np.stack(homes)


def layer_limits(problem: Problem, params: CrossLayerParams) -> tuple[list[np.ndarray], list[float | None]]:
    """Per layer, the expert loads (shares of the layer's calibration load) and the largest GPU
    load allowed (``eps_load``, or the automatic limit of ``agnostic``; None: no limit)."""
    c = problem.instance.cluster
    loads: list[np.ndarray] = []
    limits: list[float | None] = []
    for l in range(problem.layers):
        u = problem.stats.global_usage[l]
        load = u / u.sum() if u.sum() > 0 else np.full(problem.experts, 1.0 / problem.experts)
        loads.append(load)
        limits.append(load_limit(resolve_eps_load(params.eps_load, load, c.gpus, c.slots_per_gpu), c.gpus, load))
    return loads, limits


def maxvio_budget_bound(
    problem: Problem,
    plan: Any,
    slack: float,
    *,
    levels: int = 5,
    bound_time: float | None = None,
    ctx: Context | None = None,
    bound_rounds: int | None = None,
) -> dict[str, Any]:
    """A lower bound on the remote GPUs per token (``previous-layer`` homes, mean over layers, on
    ``problem``'s trace) of every single-copy plan whose MaxVio, mean over layers, is at most
    ``plan``'s + ``slack``: how far any plan can go below ``plan`` at that balance.

    `CrossLayer.certificate`'s bound, within load limits. A plan may spend its MaxVio
    unevenly over the layers: layer l gets ``a_l``, ``sum_l a_l <= sum_l mv_l + L slack`` (``mv``:
    ``plan``'s), each ``a_l`` at least ``floor_l`` (`least_largest_load`), so at most
    ``top_l = mv_l + L slack + sum_{m != l} (mv_m - floor_m)``. The certificate runs at ``levels``
    MaxVio levels per layer, ``mv_l`` to ``top_l`` (all layers at level j together); an allocation
    is charged, per layer, the bound at the level at or above its own and its previous layer's
    (the stay share depends on both; a larger limit only lowers a bound), and the result is the
    least total over the level tuples whose levels below fit the budget (a layer at level 0 may
    be anywhere down to its floor). Returns ``bound``, ``base`` (``plan``'s figure), the levels
    and the bound at each. Each level's certificate is bounded by ``bound_rounds`` (work),
    ``bound_time`` seconds per layer an outer cap (None: none).
    """
    from moeopt.evaluate import evaluate
    from moeopt.joint.certify import layer_certificates

    if levels < 2:
        raise ValueError(f"levels must be >= 2, got {levels}")
    trace = problem.trace
    assert trace is not None
    c = problem.instance.cluster
    G, L, S = c.gpus, problem.layers, c.slots_per_gpu
    ev = evaluate(plan, trace, c)
    mv = list(ev["maxvio_per_layer"])
    loads, _ = layer_limits(problem, CrossLayerParams())
    floor = [G * least_largest_load(u, G, S) - 1.0 for u in loads]
    top = [mv[l] + L * slack + sum(mv[m] - floor[m] for m in range(L) if m != l) for l in range(L)]
    grid = [[mv[l] + (top[l] - mv[l]) * j / (levels - 1) for j in range(levels)] for l in range(L)]
    uniform = [l == 0 and trace.home is None for l in range(L)]
    ctx = ctx or Context(seed=0, quiet=True)
    per_level, limited = [], True
    for j in range(levels):
        lower, cert = layer_certificates(
            problem,
            plan.slots,
            bound_time,
            uniform,
            ctx,
            "crosslayer",
            previous_layer=True,
            loads=loads,
            load_limits=[(1.0 + grid[l][j]) / G for l in range(L)],
            rounds=bound_rounds,
        )
        per_level.append(lower)
        limited = limited and all(cert["bound_load_limited_per_layer"])
    spend = [[floor[l]] + grid[l][:-1] for l in range(L)]  # the least MaxVio a layer at level k may have
    best = cheapest_levels(np.array(per_level, dtype=np.float64).T, np.array(spend), sum(mv) + L * slack)
    return {
        "bound": best / L,
        "base": float(ev["comm_per_token"]),
        "maxvio_levels_per_layer": grid,
        "bound_per_level": [float(np.mean(x)) for x in per_level],
        "load_limited": limited,
    }
