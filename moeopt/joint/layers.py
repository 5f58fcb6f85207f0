"""`joint`'s search of one layer, what the executor runs per layer: from each start, the local
search over slot contents (`moeopt.joint.local_search`) under the locality-first cost or an
engine rule's, the family-cap repair, and in hierarchical mode the node level's search and the
placement of each node's copies on its GPUs (`moeopt.heuristics.hierarchy`).

Every function here is seeded by ``(seed, l)`` alone, so a layer gets the same plan in this
process, a worker or a Ray task. The method (`moeopt.methods.joint`) builds the layers'
problems, runs these on its executor and assembles the result.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt import joint as jm
from moeopt.heuristics import hierarchy as hier

if TYPE_CHECKING:
    from moeopt.methods.joint import JointParams


#: share of a search's evaluations (and time) the family-cap repair may use
REPAIR_SHARE = 0.5


def _fill(slots: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Empty slots of a start get copies of the heaviest experts their GPU lacks."""
    if (slots >= 0).all():
        return slots
    holds = np.zeros((len(load), slots.shape[0]), dtype=bool)
    g, w = np.nonzero(slots >= 0)
    holds[slots[g, w], g] = True
    return jm.fill_slots(holds, slots.shape[1], load)


def search_layer(
    layer: jm.JointLayer,
    starts: dict[str, np.ndarray],
    load: np.ndarray,
    experts: int,
    params: JointParams,
    seed: int,
    l: int,
    per_layer: float,
    rule: dict | None = None,
    strict: bool = False,
    within: bool = False,
) -> dict:
    """Layer ``l``'s search from each start (a share of ``per_layer`` seconds and of the
    evaluations each, by start weight; with ``strict``, under a run's time limit, the starts and
    the family-cap repair share ``per_layer`` counted from the layer's start, so that a start that
    ran over leaves the next less rather than the run more); the best plan and the run's statistics. Seeded by
    ``(seed, l)`` alone: the same plan in this process, a worker or a Ray task. ``rule``: the
    engine rule's inputs of `moeopt.joint.RuleCost` (its ``rule``, the sample's ``row``,
    ``home`` and ``draw``, ``gpus_per_node``, ``tp_size``); None: the locality-first cost.
    ``within`` (the hierarchical node level, engine rules): of the starts' plans, only those
    whose largest excess over a limit (`moeopt.joint.RuleCost.over_share`) is at most
    `WITHIN_SLACK` above the least compete on value (the penalty prices load over the limits
    softly, and a start far from balance can win on value while no GPU packing of its nodes
    keeps the limit)."""
    runs: dict[str, tuple[float, jm.SlotState, Any]] = {}
    over: dict[str, float] = {}
    weight = {"grouping": 2.0, "balance": 1.0, "groups": 1.0, "twins": 1.0, "hint": 1.0}
    total = sum(weight[k] for k in starts)
    capped = 0
    # strict: the family-cap repair may follow (locality cost only) and its time comes out of the
    # layer's too, and the starts' shares count from the layer's start
    searching = per_layer / (1.0 + REPAIR_SHARE) if strict and rule is None and layer.has_cap else per_layer
    begun, given = time.perf_counter(), 0.0
    for label, s in starts.items():
        share = searching * weight[label] / total
        given += share
        if not strict:  # no time limit: each start's cap (time_per_layer's share) from its own start
            begun, given = time.perf_counter(), share
        try:
            state = jm.SlotState(_fill(s, load), experts)
        except ValueError:  # e.g. a hint with colocated copies: not a joint start
            continue
        rng = np.random.default_rng([seed, l, len(runs)])
        cost: Any = (
            jm.SampleCost(layer, params.coarse_tokens, seed=seed + l, family_cap=False)
            if rule is None
            else jm.RuleCost(layer, **rule)
        )
        best, value, st = jm.local_search(
            state,
            cost,
            rng,
            candidates=params.candidates,
            kicks=params.kicks,
            deadline=begun + given,
            evaluations=max(1, round(params.evaluation_count * weight[label] / total)),
        )
        capped += int(st.capped)
        runs[label] = (value, best, st)
        if within and rule is not None:  # RuleCost: the engine rule's cost
            cost.reset(best)
            over[label] = cost.over_share()
    pool = runs
    if over:  # the starts whose plans lie within the limits as far as the best does, then the lowest value
        least = min(over.values())
        pool = {k: v for k, v in runs.items() if over.get(k, 0.0) <= least + WITHIN_SLACK}
    label, (value, best, st) = min(pool.items(), key=lambda kv: kv[1][0])
    repair = None
    if rule is None:  # the family cap is priced by the locality-first cost only
        best, repair = repair_family_cap(layer, best, params, seed, l, searching)
    stats = {
        "start": label,
        "value": value,
        "family_cap_repair": repair,
        "starts": {
            k: {
                "start_value": v[2].start_value,
                "value": v[0],
                "moves": v[2].moves,
                "rounds": v[2].rounds,
                "kicks": v[2].kicks,
                "evaluated": v[2].evaluated,
                **({"over_limit": over[k]} if k in over else {}),
            }
            for k, v in runs.items()
        },
    }
    return {"slots": best.slots, "capped": capped, "stats": stats}


#: node level (``within``): a start's plan competes on its value only if its largest load over a
#: limit (`moeopt.joint.RuleCost.over_share`, in units of the mean load under that limit) is at
#: most this much above the least of all the starts' plans
WITHIN_SLACK = 0.02


#: shares of a layer's time in hierarchical mode: the node level's grouping start, the node level
#: in all (start and search); the rest goes to placing the copies on GPUs
NODE_START_SHARE = 0.2


NODE_SEARCH_SHARE = 0.8


def search_nodes(
    layer: jm.JointLayer,
    starts: dict[str, np.ndarray],
    load: np.ndarray,
    experts: int,
    params: JointParams,
    seed: int,
    l: int,
    per_layer: float,
    rule: dict | None,
    strict: bool = False,
) -> dict:
    """Layer ``l``'s node level in hierarchical mode: `search_layer` on ``layer`` (nodes as
    bins) from the starts of ``params.starts`` (``grouping``:
    `moeopt.heuristics.hierarchy.node_grouping_start`) and ``starts`` (a hint; ``balance``,
    `moeopt.joint.planner.node_balance_start`; ``groups``), in `NODE_SEARCH_SHARE` of ``per_layer``
    (``strict``: under a run's time limit, as `search_layer`'s). Seeded by ``(seed, l)`` alone."""
    began = time.perf_counter()
    capped = 0
    mine: dict[str, np.ndarray] = {}
    if "grouping" in params.start_list:
        rng = np.random.default_rng([seed, l, 3])
        deadline = began + NODE_START_SHARE * per_layer
        grouped = hier.node_grouping_start(
            load, layer.coactivation(), layer.gpus, layer.width, rng, eps=layer.eps, deadline=deadline
        )
        capped += int(time.perf_counter() > deadline)
        mine["grouping"] = grouped
    starts = {**mine, **starts}
    left = max(NODE_SEARCH_SHARE * per_layer - (time.perf_counter() - began), 0.05)
    found = search_layer(layer, starts, load, experts, params, seed, l, left, rule, strict, within=True)
    return {"slots": np.asarray(found["slots"]), "capped": found["capped"] + capped, "stats": found["stats"]}


def place_layer(
    layer: jm.JointLayer,
    node_slots: np.ndarray,
    copy_load: np.ndarray,
    gpus_per_node: int,
    width: int,
    eps: float,
    seed: int,
    l: int,
    seconds: float,
) -> dict:
    """Layer ``l``'s GPU level in hierarchical mode: single-copy experts swapped between nodes
    whose copies pack over the GPU limit (`moeopt.heuristics.hierarchy.rebalance_singles`),
    then each node's copies on its GPUs (`moeopt.heuristics.hierarchy.place_in_nodes`); the
    GPU limit is ``(1 + eps)`` times the mean GPU load, the copies' loads ``copy_load [E, nodes]``."""
    began = time.perf_counter()
    nodes = node_slots.shape[0]
    total = float(copy_load.sum())
    limit = (1.0 + eps) * total / (nodes * gpus_per_node)
    affinity = layer.coactivation()
    node_slots, copy_load, swaps = hier.rebalance_singles(node_slots, copy_load, affinity, gpus_per_node, width, limit)
    deadline = began + seconds
    gpu_slots, worst = hier.place_in_nodes(
        node_slots,
        copy_load,
        affinity,
        gpus_per_node,
        width,
        limit,
        np.random.default_rng([seed, l, 5]),
        deadline=deadline,
    )
    gpu_slots = _fill(gpu_slots, copy_load.sum(axis=1))  # a node level with empty slots: the heaviest experts
    stats = {
        "level": "nodes",
        "single_swaps": swaps,
        "gpu_maxvio": worst * nodes * gpus_per_node / max(total, 1e-300) - 1.0,
    }
    return {"slots": gpu_slots, "capped": int(time.perf_counter() > deadline), "stats": stats}


def repair_family_cap(
    layer: jm.JointLayer, state: jm.SlotState, params: JointParams, seed: int, l: int, per_layer: float
) -> tuple[jm.SlotState, dict | None]:
    """The search's second phase: where the plan puts some family over ``family_cap``, a
    descent on the objective with the cap priced (`JointLayer.cap_weights`), from the
    plan, with ``REPAIR_SHARE`` of the search's evaluations and time.

    The cap is left out of the first phase on purpose: from the grouping start (one task's
    experts together, as the communication wants) every family is far over it, and pricing
    it there steers the whole search (benchmark, kappa = 1.5 priced from the start: 0.5-1.4
    points less held-out reduction on the synthetic instances, 1 replica slot, eps 0.06).
    Returns the plan and what the repair did (None: nothing to repair)."""
    if not layer.has_cap:
        return state, None
    cost = jm.SampleCost(layer, params.coarse_tokens, seed=seed + l)
    cost.reset(state)
    over = cost.cap_term
    if over <= jm.TOL:
        return state, None
    best, _, st = jm.local_search(
        state,
        cost,
        np.random.default_rng([seed, l, 1 << 16]),
        candidates=params.candidates,
        kicks=0,
        deadline=time.perf_counter() + per_layer * REPAIR_SHARE,
        evaluations=max(1, round(params.evaluation_count * REPAIR_SHARE)),
    )
    return best, {  # local_search leaves ``cost`` priced on ``best``
        "cap_term_before": over,
        "cap_term_after": cost.cap_term,
        "moves": st.moves,
        "evaluated": st.evaluated,
    }
