"""`joint`'s planning pipeline over the layers: each layer's sampled problem
(`layer_problems`), the load limits any plan can reach (`reachable_limits`), the starts
(`grouping_starts`, `balance_starts`), the engine rule's inputs (`rule_inputs`) and one whole
search of every layer on the run's executor (`search_flat`; `search_hierarchical`: nodes first,
then GPUs). The per-layer work is in `moeopt.joint.layers`; the method
(`moeopt.methods.joint`) runs the restarts, chooses the dispatch and builds the result.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt import balance as core
from moeopt import execute
from moeopt import joint as jm
from moeopt.budget import Budget
from moeopt.dispatch import HOME_SEED, batch_rows
from moeopt.errors import InputError
from moeopt.evaluate import maxvio
from moeopt.heuristics import hierarchy as hier
from moeopt.joint.layers import NODE_SEARCH_SHARE, place_layer, search_layer, search_nodes
from moeopt.joint.rules import rule_gpu_loads
from moeopt.methods.baselines import hottest_replicas
from moeopt.registry import Context, Problem, get_method, parse_params

if TYPE_CHECKING:
    from moeopt.methods.joint import JointParams


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


def reachable_limits(
    problem: Problem, balanced: np.ndarray, eps: float, rule: str | None = None, tp_size: int | None = None
) -> tuple[np.ndarray, list[int]]:
    """Each layer's load limit: ``eps``, or, on a layer where no plan in these slots comes near
    it (the balance planner's plan ``balanced [L, G, W]`` misses it on the calibration loads:
    an expert hotter than a GPU's share with no slot to copy it into; under an engine ``rule``,
    its loads as the search prices them, `moeopt.joint.rules.rule_gpu_loads`: SGLang ``static``'s
    fair draw deals copies unequal shares), ``eps`` above what that plan reaches. Returns the
    limits and the relaxed layers.

    A target below the least reachable MaxVio leaves the search nothing but the penalty to
    minimize: it ends near the most balanced plan and gives up the communication saving
    (measured: moonlight-16b without replica slots, eps 0.05 against a least MaxVio of 0.34:
    0.4 % fewer remote GPUs per token at MaxVio 0.375; planned at 0.39: both axes better).
    """
    load = problem.stats.expert_load
    if rule is None:
        loads = [core.gpu_loads(balanced[l], load[l]) for l in range(problem.layers)]
    else:
        node = problem.instance.cluster.gpus_per_node
        loads = [
            rule_gpu_loads(balanced[l], load[l], rule, gpus_per_node=node, tp_size=tp_size)
            for l in range(problem.layers)
        ]
    reached = np.array([float(maxvio(x)) for x in loads])
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
        why = start.termination.value if start.termination is not None else start.status.value
        raise InputError(_source(problem), "method.eps_load", f"the agnostic start found no plan ({why})")
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


def search_flat(
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
    if not starts:  # starts: groups alone
        from moeopt.methods.joint import HIERARCHICAL_GPUS  # (that module imports this one)

        raise InputError(
            _source(problem),
            "method.starts",
            f"the groups and twins starts need hierarchical mode (hierarchical: true, the default from "
            f"{HIERARCHICAL_GPUS} GPUs on several nodes); add balance or grouping",
        )
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


def search_hierarchical(
    problem: Problem,
    params: JointParams,
    ctx: Context,
    seed: int,
    balanced: np.ndarray,
    limits: np.ndarray,
    search: Budget,
    bar: Any,
) -> tuple[np.ndarray, int, list[dict]]:
    """`search_flat` in hierarchical mode (`moeopt.heuristics.hierarchy`), in three steps,
    the first and last per layer on the run's executor:

    1. the node level's search from its starts (``grouping``: the balanced copies grouped
       onto nodes by co-activation; ``balance``: the balance planner's plan of the GPUs
       ``balanced``, its GPUs dealt to the nodes, `moeopt.heuristics.hierarchy.gpus_onto_nodes`),
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
    if "balance" in params.start_list:
        starts["balance"] = np.stack(
            [node_balance_start(balanced[l], load[l], gpn, nodes, per_node, seed + l) for l in range(L)]
        )
    if "groups" in params.start_list:
        grouped = group_starts(problem, nodes, per_node)
        if grouped is not None:
            starts["groups"] = grouped
        elif params.start_list == ["groups"] and ctx.hint is None:
            raise InputError(
                _source(problem),
                "method.starts",
                "the groups start needs model.expert_groups dividing the experts, and nodes with no more "
                "slots than a group has experts; add balance",
            )
    per_start: list[dict[str, np.ndarray]] = [{k: v[l] for k, v in starts.items()} for l in range(L)]
    if "twins" in params.start_list:
        # beside other starts, only where the twin layout packs near the limit (`TWIN_SLACK`)
        alone = params.start_list == ["twins"] and ctx.hint is None
        groups = problem.instance.model.expert_groups
        for l in range(L):
            eps = float(limits[l])
            within = None if alone else eps + hier.TWIN_SLACK
            twin = hier.twin_node_start(load[l], groups, nodes, per_node, gpn, eps, within)
            if twin is not None:
                per_start[l]["twins"] = twin
            elif alone:
                raise InputError(
                    _source(problem),
                    "method.starts",
                    "the twins start needs an even number of nodes and slots for each expert once; add balance",
                )
            elif not per_start[l]:  # twins with groups alone: the groups start did not apply either
                per_start[l]["balance"] = node_balance_start(balanced[l], load[l], gpn, nodes, per_node, seed + l)
    rules = rule_inputs(problem, params, layers, seed, nodes=True)
    per_layer = min(params.time_per_layer, search.remaining() / L)
    items = [
        (layers[l], per_start[l], load[l], problem.experts, params, seed, l, per_layer) + (rules[l], ctx.budget.limited)
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


def _source(problem: Problem) -> str | None:
    """The instance's file, for an error's first words."""
    src = problem.instance.source
    return str(src) if src else None


def node_balance_start(
    balanced: np.ndarray, load: np.ndarray, gpus_per_node: int, nodes: int, per_node: int, seed: int
) -> np.ndarray:
    """int ``[nodes, per_node]``: the node level's ``balance`` start of one layer: the balance
    planner's GPU plan ``balanced [G, W]`` with its GPUs dealt to the nodes
    (`moeopt.heuristics.hierarchy.gpus_onto_nodes`), whose copy counts suit ``W`` slots a GPU;
    where that would put two copies of an expert on one node (more copies than nodes), the
    balance planner's plan of the nodes instead.

    Planned on the nodes' slots, every copy of a hot expert is about as heavy as the largest,
    and with 2 slots a GPU those copies must share GPUs (DeepSeek-V3-shaped synthetic layers at
    256 GPUs x (1 + 1) under ``even``, eps 0.05: held-out MaxVio 0.434 -> 0.156)."""
    dealt = hier.gpus_onto_nodes(balanced, gpus_per_node, load)
    if (dealt < 0).sum() == (balanced < 0).sum():
        return dealt
    return core.plan_layer(load, nodes, per_node, seed=seed)


def group_starts(problem: Problem, nodes: int, per_node: int) -> np.ndarray | None:
    """int ``[L, nodes, per_node]``: every layer's router groups laid out on the nodes
    (`moeopt.heuristics.hierarchy.group_node_start`); None where the model has no expert
    groups or the layout does not apply to some layer."""
    groups = problem.instance.model.expert_groups
    if groups is None or groups < 2:
        return None
    out = []
    for l in range(problem.layers):
        s = hier.group_node_start(problem.stats.expert_load[l], groups, nodes, per_node)
        if s is None:
            return None
        out.append(s)
    return np.stack(out)


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
