"""``crosslayer``: plan the layers together when tokens stay on the GPU of their last expert.

Under ``cluster.token_home: previous-layer`` (ExFlow, MoETuner) a token's hidden state lives,
at layer l, on the GPU that ran its top-1 expert at layer l - 1, so its dispatch costs the
distinct GPUs of its top-k experts *other than that GPU*. Adding the home GPU to each token's
hyperedge as a pin fixed to that GPU makes this exact: with homes ``h``, the (λ − 1)
connectivity of the net ``topk ∪ {home}`` is the token's remote GPUs. The planner goes
forward layer by layer:

1. homes of layer l's tokens from the layer l - 1 plan (layer 0: uniform, so plain (λ − 1)
   on the top-k sets, as ``hypergraph``);
2. Mt-KaHyPar partitions the experts plus G *fixed* home vertices (one per GPU, each fixed to
   its GPU, block weight ``slots + 1``);
3. capacity and load repair and (λ − 1) refinement with the home pins held fixed
   (:class:`StayGain`), under the same automatic load limit as ``tacg`` / ``hypergraph``;
4. the plan that also starts from the stay-unaware ``hypergraph`` partition, relabeled to the
   homes (a free permutation of GPU ids), competes, and the better one is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.optimize import linear_sum_assignment

from moeopt.methods.hypergraph import (
    ConnectivityGain,
    Hyperedges,
    _available,
    _mtkahypar,
    limited_search,
    mtkahypar_partition,
    resolve_eps_load,
    token_hyperedges,
)
from moeopt.registry import Context, Problem, register
from moeopt.relabel import stay_counts
from moeopt.result import Result, Status


class StayGain:
    """(λ − 1) gains of the real experts on hyperedges that also hold fixed home pins.

    Experts ``0..E-1`` move; pins ``E..E+G-1`` are the G home GPUs, fixed. The gains of
    :class:`~moeopt.methods.hypergraph.ConnectivityGain` on the extended hypergraph are
    computed with the home pins in place and restricted to the real experts, so the search
    never moves a home.
    """

    def __init__(self, edges: Hyperedges, experts: int, gpus: int) -> None:
        self.inner = ConnectivityGain(edges)
        self.E, self.G = experts, gpus

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        full = np.concatenate([home, np.arange(self.G)])
        move, pair = self.inner.gains(full, gpus)
        move = move[: self.E].copy()
        return move, pair[: self.E, : self.E]


def stay_edges(topk_layer: np.ndarray, token_home: np.ndarray, experts: int, gpus: int) -> Hyperedges:
    """Hyperedges ``topk ∪ {home}``: vertex ``E + g`` stands for GPU g, where the token lives."""
    aug = np.concatenate([np.asarray(topk_layer, dtype=np.int64), experts + token_home[:, None]], axis=1)
    return token_hyperedges(aug, experts + gpus)


def fixed_home_partition(
    edges: Hyperedges, experts: int, gpus: int, slots: int, *, seed: int = 0, preset: str = "default"
) -> np.ndarray:
    """Mt-KaHyPar on experts plus G home vertices fixed to their GPUs (km1 = remote GPUs)."""
    mtk, init = _mtkahypar(1)
    ctx = init.context_from_preset(getattr(mtk.PresetType, preset.upper()))
    ctx.set_partitioning_parameters(gpus, 0.0, mtk.Objective.KM1)
    ctx.set_individual_target_block_weights([int(slots) + 1] * gpus)  # + the fixed home vertex
    ctx.logging = False
    mtk.set_seed(int(seed))
    n = experts + gpus
    hg = init.create_hypergraph(ctx, n, len(edges.pins), edges.pins, [1] * n, np.rint(edges.weight).astype(np.int64).tolist())
    hg.add_fixed_vertices([-1] * experts + list(range(gpus)), gpus)
    part = np.asarray(hg.partition(ctx).get_partition(), dtype=np.int64)
    return part[:experts]


def relabel_to_homes(home: np.ndarray, topk_layer: np.ndarray, token_home: np.ndarray, gpus: int) -> np.ndarray:
    """Expert homes with GPU ids permuted so that the most tokens find an expert at home."""
    M = stay_counts(token_home, home[np.asarray(topk_layer, dtype=np.int64)], gpus).astype(np.float64)
    g_new, h_old = linear_sum_assignment(M, maximize=True)
    new_of_old = np.empty(gpus, dtype=np.int64)
    new_of_old[h_old] = g_new
    return new_of_old[home]


@dataclass
class CrossLayerParams:
    """Parameters of ``crosslayer``."""

    eps_load: float | None = None  # load limit (None: the automatic limit of tacg; .inf: none)
    seed: int = 0
    preset: str = "default"  # Mt-KaHyPar preset
    refine: bool = True

    def __post_init__(self) -> None:
        if self.eps_load is not None and not self.eps_load >= 0:
            raise ValueError(f"eps_load must be >= 0, got {self.eps_load}")


@register
class CrossLayer:
    """Forward layer-by-layer (λ − 1) planning with the previous layer's GPU as a fixed pin."""

    name: ClassVar[str] = "crosslayer"
    summary: ClassVar[str] = "plans layers in sequence for token_home: previous-layer (home GPU as a fixed pin)"
    requires: ClassVar[frozenset[str]] = frozenset({"coactivation"})
    Params: ClassVar[type] = CrossLayerParams
    metric_hooks: ClassVar[tuple] = ()
    #: each layer's plan depends on the previous one: never split into independent layers
    layerwise: ClassVar[bool] = False

    def available(self) -> bool:
        return _available("mtkahypar")

    def solve(self, problem: Problem, params: CrossLayerParams, ctx: Context) -> Result:
        t0 = time.perf_counter()
        trace = problem.trace
        assert trace is not None
        c = problem.instance.cluster
        G, S, E, L = c.gpus, c.slots_per_gpu, problem.experts, problem.layers
        loads = problem.stats.global_usage  # [L, E] shares
        seed = ctx.seed + params.seed
        homes, used_eps, limits_met = [], [], []
        token_home = trace.home
        for l in ctx.layers(L, self.name):
            topk = trace.topk[:, l, :].astype(np.int64)
            load = loads[l] / loads[l].sum() if loads[l].sum() > 0 else np.full(E, 1.0 / E)
            eps, automatic = resolve_eps_load(params.eps_load, load, G, S)
            plain = token_hyperedges(topk, E)
            base, _ = mtkahypar_partition(plain, G, S, seed=seed + l, preset=params.preset)
            if token_home is None:
                gain, edges, starts = ConnectivityGain(plain), plain, [base]
                cost = plain.cost
            else:
                edges = stay_edges(topk, token_home, E, G)
                gain = StayGain(edges, E, G)
                starts = [
                    fixed_home_partition(edges, E, G, S, seed=seed + l, preset=params.preset),
                    relabel_to_homes(base, topk, token_home, G),
                ]

                def cost(h: np.ndarray, edges: Hyperedges = edges) -> float:
                    return edges.cost(np.concatenate([h, np.arange(G)]))

            home, log, used = limited_search(
                starts, gain, G, S, load=load, eps_load=eps, automatic=automatic, refine=params.refine,
                score=lambda h, cost=cost: -cost(h), balanced=True,
            )
            homes.append(home)
            used_eps.append(used)
            limits_met.append(log.limit_met)
            token_home = home[topk[:, 0]]  # tokens now live where their top-1 expert ran
        plan = problem.plan(np.stack(homes))
        prev = _previous_layer_cluster(c)
        from moeopt.evaluate import evaluate

        objective = float(evaluate(plan, trace, prev)["comm_per_token"])
        return Result(
            method=self.name,
            status=Status.FEASIBLE,
            plan=plan,
            objective=objective,
            objective_name="remote GPUs per token (previous-layer homes, calibration)",
            sense="min",
            wall_time=time.perf_counter() - t0,
            params=vars(params),
            stats={"eps_load_used": used_eps, "load_limit_met": limits_met},
        )


def _previous_layer_cluster(cluster):
    from dataclasses import replace

    return replace(cluster, token_home="previous-layer")
