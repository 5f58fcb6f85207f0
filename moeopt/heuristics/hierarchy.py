"""The joint planner on many nodes: nodes first, then GPUs inside each node.

Past one node the traffic that matters crosses nodes, and a layer of 256 experts on 256 GPUs is
too large a neighbourhood for the slot search to cover in seconds. The hierarchical planner
splits it:

1. **Node level.** Nodes are bins of ``gpus_per_node x W`` slots, at most one copy of an expert
   per node (a second copy in a node moves no token across nodes). The joint objective is priced
   on nodes: remote *nodes* per token under the plan's rule (`moeopt.joint.RuleCost` with
   ``bin_size = gpus_per_node``; the locality rule's `moeopt.joint.SampleCost` on nodes),
   each node's load within ``(1 + eps)`` times the mean node load, and no copy hotter than a
   GPU may be: each node's copies are packed onto its GPUs as the GPU level starts, and the
   load over the GPU limit is priced too (``slot_width``). The search
   (`moeopt.joint.local_search`) runs from the joint planner's starts on nodes:
   ``balance`` (the balance planner's plan of the GPUs, its GPUs dealt to the nodes:
   `gpus_onto_nodes`; the default), ``grouping``
   (`node_grouping_start`: the balanced copies grouped onto nodes by co-activation) and, for
   routers with expert groups, ``groups`` (`group_node_start`: each group on as few nodes as
   its load allows) and, for the rules that give every expert of a token the same copy index,
   ``twins`` (`twin_node_start`: nodes in pairs holding the same experts).
2. **Each copy's load** under the rule: ``1 / c`` of its expert's (`node_shares`;
   ``ascend``: the rank-modulo shares), and under SGLang ``static`` exactly what the engine's
   seeded tables deal each node (`static_node_shares`).
3. **GPU level.** Single-copy experts are swapped between nodes whose copies no packing of
   their GPUs balances (`rebalance_singles`: the only node-level decisions the GPU level
   may change, and only where the node level left a GPU over its limit), then each node's
   copies go to its GPUs (`place_in_nodes`): the grouping problem of one node
   (`moeopt.grouping.Grouping`: the node's copies, their loads under the rule,
   ``gpus_per_node`` groups of ``W`` slots, a GPU load limit), solved by the grouping heuristic
   (spectral clusters, capacity and load repair, iterated swaps) for the co-activation inside
   GPUs. Copies never leave their node there.

For the rules that pick the same copy index for every expert of a token (``even``: copy
``row mod c``; ``vllm``: by the row's hash; ``ascend``: ``rank mod c``), the ``twins`` start
(`twin_node_start`) pairs the nodes: both nodes of a pair hold the same experts, so the tokens of
even rows (ranks) find their experts on the even nodes and the others on the odd nodes, and each
token sees half the nodes.
"""

from __future__ import annotations

import time

import numpy as np
from threadpoolctl import threadpool_limits

from moeopt import packing
from moeopt.errors import InfeasibleError
from moeopt.grouping import Grouping
from moeopt.heuristics.spectral import grouping_heuristic


@threadpool_limits.wrap(limits=1, user_api="blas")  # small eigenproblems: threads only contend
def node_grouping_start(
    load: np.ndarray,
    affinity: np.ndarray,
    nodes: int,
    width: int,
    rng: np.random.Generator,
    *,
    eps: float = 0.05,
    iterations: int = 0,
    deadline: float | None = None,
) -> np.ndarray:
    """int ``[nodes, width]``: the copies of a balanced plan grouped onto nodes by co-activation.

    The copy counts are the balance planner's (`moeopt.balance.copy_counts`: water-filling
    the ``nodes * width`` slots, at most one copy per node), so no copy is hotter than the
    hottest per-copy load any plan must carry. The copies are the items of a grouping problem
    (`moeopt.grouping.Grouping`): ``nodes`` groups of ``width`` slots, each node's load at
    most ``(1 + eps)`` times the mean (relaxed to what a balanced packing reaches when needed),
    copies of ``e`` and ``e'`` attracted by ``A[e, e'] / (c_e c_e')`` (the tokens they share, split
    over the copies), solved by the grouping heuristic (spectral clusters, capacity and load
    repair, then ``iterations`` rounds of swaps, none by default: the joint search that follows
    refines the start under the rule's own cost, and the grouping's swap rounds cost seconds on
    512 copies). Two copies of one expert that land on one node are then swapped apart
    (`_separate_copies`).
    """
    from moeopt.balance import copy_counts

    load = np.asarray(load, dtype=np.float64)
    E = len(load)
    if nodes * width < E:
        raise ValueError(f"{nodes} nodes x {width} slots cannot hold {E} experts")
    total = float(load.sum())
    w = load / total if total > 0 else np.full(E, 1.0 / E)
    c = np.asarray(copy_counts(w, nodes * width, max_copies=nodes), dtype=np.int64)
    expert = np.repeat(np.arange(E), c)
    item_w = w[expert] / c[expert]
    graph = np.asarray(affinity, dtype=np.float64)[np.ix_(expert, expert)] / np.outer(c[expert], c[expert])
    graph[expert[:, None] == expert[None, :]] = 0.0
    scale = float(graph.max(initial=0.0)) or 1.0
    home = _grouped(graph / scale, item_w, nodes, width, eps, rng, iterations, deadline)
    home = _separate_copies(home, expert, item_w, nodes)
    slots = np.full((nodes, width), -1, dtype=np.int64)
    fill = np.zeros(nodes, dtype=np.int64)
    for i in np.argsort(-item_w, kind="stable"):
        n = home[i]
        slots[n, fill[n]] = expert[i]
        fill[n] += 1
    return slots


def group_node_start(load: np.ndarray, groups: int, nodes: int, width: int) -> np.ndarray | None:
    """int ``[nodes, width]``: the router's expert groups laid out on nodes, each group on as few
    nodes as its load allows; None where the layout does not apply.

    Under group-limited routing (DeepSeek-V3 / R1: a token's experts lie in ``topk_group`` of
    ``groups`` groups of consecutive ids) a token that touches a group touches only the nodes
    holding that group. EPLB's hierarchical policy exploits this with a fixed number of nodes
    per group, which leaves the nodes as unequal as the groups' loads. Here the copy counts are
    the balance planner's (`moeopt.balance.copy_counts` over the ``nodes * width`` slots, at
    most one copy per node), so that each group's slots follow its load; the groups lie one
    after the other on the nodes (a node may hold the end of one group and the start of the
    next), each with as many copies of an expert as the nodes it spans, and the copies a hot
    expert has beyond those fill the last slots. Each group's copies go, the experts with most
    copies first and the hottest first among them, to the node share of its slots furthest
    below its share of the group's load, never two copies of an expert on one node.

    None: the groups do not divide the experts, the slots cannot hold each expert once, or a
    node's share of a group has more slots than the group has experts."""
    from moeopt.balance import copy_counts

    load = np.asarray(load, dtype=np.float64)
    E = len(load)
    total = nodes * width
    if groups < 2 or E % groups or total < E:
        return None
    per = E // groups
    w = load / load.sum() if load.sum() > 0 else np.full(E, 1.0 / E)
    c = np.asarray(copy_counts(w, total, max_copies=nodes), dtype=np.int64)
    per_copy = w / c

    def touched(offset: int, size: int) -> int:
        return (offset + size - 1) // width - offset // width + 1

    slots = np.full((nodes, width), -1, dtype=np.int64)
    spill: list[int] = []
    offset = 0
    for g in range(groups):
        ids = np.arange(g * per, (g + 1) * per)
        size = int(c[ids].sum())
        while True:  # as many copies of an expert as the nodes its group's slots span
            fit = int(np.minimum(c[ids], touched(offset, size)).sum())
            if fit == size:
                break
            size = fit
        first = offset // width
        span = touched(offset, size)
        share = np.array(
            [min((n + 1) * width, offset + size) - max(n * width, offset) for n in range(first, first + span)]
        )
        if share.max() > per:
            return None
        kept = np.minimum(c[ids], span)
        for j, e in enumerate(ids.tolist()):
            spill += [e] * int(c[e] - kept[j])
        target = share / share.sum() * float((kept * per_copy[ids]).sum())
        have = np.zeros(span)
        free = share.copy()
        held: list[list[int]] = [[] for _ in range(span)]
        # most copies first, each to the shares with the most free slots (so that every expert
        # finds as many shares as it has copies where any assignment can), then the furthest
        # below their target; a copy no share can take joins the spilled ones
        for i in sorted(range(per), key=lambda i: (-kept[i], -per_copy[ids[i]], i)):
            open_ = sorted((p for p in range(span) if free[p] > 0), key=lambda p: (-free[p], have[p] - target[p], p))
            for p in open_[: int(kept[i])]:
                held[p].append(int(ids[i]))
                have[p] += per_copy[ids[i]]
                free[p] -= 1
            spill += [int(ids[i])] * max(int(kept[i]) - len(open_), 0)
        for p, row in enumerate(held):
            n = first + p
            start = max(n * width, offset) - n * width
            slots[n, start : start + len(row)] = sorted(row, key=lambda e: (-per_copy[e], e))
            # a share left with free slots (its copies spilled) keeps them for the spilled copies
        offset += size
    # the hot experts' copies beyond their groups' nodes: the last slots, hottest first, each on
    # the least loaded node with a free slot that does not hold the expert yet
    node_load = np.array([per_copy[r[r >= 0]].sum() for r in slots])
    many = np.bincount(np.asarray(spill, dtype=np.int64), minlength=E)
    for e in sorted(spill, key=lambda e: (-many[e], -per_copy[e], e)):
        ok = [n for n in range(nodes) if (slots[n] < 0).any() and e not in slots[n]]
        if not ok:  # every free slot lies on a node holding e: move a copy from a node without e
            room = _make_room(slots, e)
            if room is None:
                return None
            node_load = np.array([per_copy[r[r >= 0]].sum() for r in slots])
            ok = [room]
        n = min(ok, key=lambda n: (node_load[n], n))
        slots[n, int(np.argmax(slots[n] < 0))] = e
        node_load[n] += per_copy[e]
    return slots


#: the twin start's extra single-copy experts tried, in order (each pair gives a hot expert two copies)
TWIN_SINGLES = (0, 2, 4, 8, 16, 32, 64, 128, 256)
#: beside other starts, the twin layout starts a search only where its GPUs pack within this much
#: MaxVio over the layer's limit (the search balances a little; from far over, no plan it reaches
#: keeps the limit, and the other starts lose the evaluations it takes)
TWIN_SLACK = 0.1


def twin_copy_counts(w: np.ndarray, total: int, extra: int, most: int) -> np.ndarray | None:
    """int ``[E]``: copy counts of the twin start: 1 or even; 2 for every expert, the coldest at 1
    where ``total`` slots hold fewer than two copies each, then the hottest expert per copy 2
    more (at most ``most``) while spare slots last, and then, while a pair of cold experts at 2
    can go to 1 (at most ``extra`` of them) and that lowers the largest load per copy, the
    hottest 2 more again. Slots no expert can take stay spare. None: the slots cannot hold
    each expert once."""
    E = len(w)
    if total < E:
        return None
    c = np.full(E, 2, dtype=np.int64)
    order = np.argsort(w, kind="stable")  # coldest first
    short = max(0, 2 * E - total)
    c[order[:short]] = 1
    spare = total - int(c.sum())
    colder = [int(e) for e in order[short:]]  # experts still at 2, coldest first
    given = 0
    while True:
        h = int(np.argmax(w / c))
        if c[h] + 2 > most:
            break
        if spare >= 2:
            spare -= 2
        elif given + 2 <= extra:
            pair = [e for e in colder if c[e] == 2 and e != h][:2]
            if len(pair) < 2 or max(w[h] / (c[h] + 2), float(w[pair].max())) >= w[h] / c[h]:
                break
            c[pair] = 1
            given += 2
        else:
            break
        c[h] += 2
    return c


def _level_twins(q: np.ndarray, ids: np.ndarray, cap: float, experts: int, rounds: int = 400) -> None:
    """In place: while the most loaded twin node is over ``cap``, the exchange of its pair's twin
    slot with another pair's (or a move to an empty one, or a single-copy slot turned over) that
    lowers the larger load of the two pairs most; never two copies of an expert on one node.
    ``q [P, S, 2]``: twin slot loads, ``ids [P, S, 2]``: their experts (-1 empty)."""
    P, S, _ = q.shape
    for _ in range(rounds):
        load = q.sum(axis=1)  # [P, 2]
        top = load.max(axis=1)
        h = int(top.argmax())
        if top[h] <= cap:
            return
        on = np.zeros((P, 2, experts + 1), dtype=bool)  # which experts each twin holds (index E: empty)
        np.put_along_axis(on, np.where(ids >= 0, ids, experts).transpose(0, 2, 1), True, axis=2)
        on[:, :, experts] = False
        a, b = q[h], q  # [S, 2], [P, S, 2]
        new_h = load[h][None, None, None, :] - a[:, None, None, :] + b[None]  # [S, P, S, 2]
        new_v = load[None, :, None, :] + a[:, None, None, :] - b[None]
        worst = np.maximum(new_h.max(axis=3), new_v.max(axis=3))  # [S, P, S]
        e_h, e_v = ids[h], ids  # [S, 2], [P, S, 2]
        # h's slot i into pair v: its experts not already on v's twins (unless they leave with slot j)
        into_v = np.zeros((S, P, S), dtype=bool)
        into_h = np.zeros((S, P, S), dtype=bool)
        for t in (0, 1):
            held_v = on[:, t, np.where(e_h[:, t] >= 0, e_h[:, t], experts)].T  # [S, P]
            into_v |= held_v[:, :, None] & (e_v[None, :, :, t] != e_h[:, None, None, t])
            held_h = on[h, t, np.where(e_v[:, :, t] >= 0, e_v[:, :, t], experts)]  # [P, S]
            into_h |= held_h[None, :, :] & (e_v[None, :, :, t] != e_h[:, None, None, t])
        worst[into_v | into_h] = np.inf
        worst[:, h, :] = np.inf
        flip = np.maximum(load[h][0] - a[:, 0] + a[:, 1], load[h][1] - a[:, 1] + a[:, 0])  # [S]
        flip[(e_h[:, 0] == e_h[:, 1]) | (e_h < 0).any(axis=1)] = np.inf
        i, v, j = np.unravel_index(int(np.argmin(worst)), worst.shape)
        f = int(np.argmin(flip))
        if min(worst[i, v, j], flip[f]) >= top[h] - 1e-12:
            return
        if flip[f] < worst[i, v, j]:
            q[h, f] = q[h, f, ::-1].copy()
            ids[h, f] = ids[h, f, ::-1].copy()
        else:
            q[h, i], q[v, j] = q[v, j].copy(), q[h, i].copy()
            ids[h, i], ids[v, j] = ids[v, j].copy(), ids[h, i].copy()


def twin_node_start(
    load: np.ndarray,
    groups: int | None,
    nodes: int,
    width: int,
    gpus_per_node: int,
    eps: float,
    within: float | None = None,
) -> np.ndarray | None:
    """int ``[nodes, width]``: twin nodes, for the rules that give every expert of a token the same
    copy index (``even``: ``row mod c`` by the token's row; ``vllm``: by its row's hash; ``ascend``:
    ``rank mod c`` by its rank): nodes ``2v`` and ``2v + 1`` hold the same experts, an expert with
    ``c`` (even) copies has ``c / 2`` twin pairs, so every token of an even row (rank) finds its
    experts on the even nodes and every other token on the odd nodes: each token sees half the
    nodes, each with twice the experts. Single-copy experts (the coldest) are
    paired, one on each twin. The twin pairs are filled group by group of the router's groups
    (``groups``; None: one group), the heaviest group first, its copies hottest first, each to a
    pair already holding its group within ``(1 + eps)`` times the mean node load, else to the least
    loaded pair. Balance needs hot experts with many copies, and each two copies more cost two cold
    experts their second copy (and the twin layout for them): of `TWIN_SINGLES`, the fewest single
    copies whose nodes pack onto their GPUs within ``(1 + eps)`` times the mean GPU load
    (`packed_max`), else the layout that packs lowest, if that packs within ``1 + within`` times
    the mean GPU load (None: any).

    None: an odd number of nodes, groups that do not divide the experts, slots that cannot
    hold each expert once, or no layout within ``within``."""
    load = np.asarray(load, dtype=np.float64)
    E = len(load)
    groups = groups or 1
    if nodes < 2 or nodes % 2 or E % groups or width < 1:
        return None
    pairs, per = nodes // 2, E // groups
    w = load / load.sum() if load.sum() > 0 else np.full(E, 1.0 / E)
    gpu_mean = 1.0 / (nodes * gpus_per_node)
    slot_width = max(1, width // gpus_per_node)
    cap = (1.0 + eps) / nodes
    # the router groups, heaviest first (the fill's order)
    heaviest = np.argsort(np.argsort(-np.bincount(np.arange(E) // per, weights=w, minlength=groups), kind="stable"))
    best: tuple[float, np.ndarray] | None = None
    for extra in TWIN_SINGLES:
        c = twin_copy_counts(w, nodes * width, extra, nodes)
        if c is None:
            return None
        # twin slots: (load on the even twin, load on the odd twin, expert there, expert there)
        units = [(w[e] / c[e], w[e] / c[e], e, e) for e in range(E) if c[e] >= 2 for _ in range(c[e] // 2)]
        singles = sorted((e for e in range(E) if c[e] == 1), key=lambda e: (e // per, -w[e]))
        if len(singles) % 2:
            singles.append(-1)  # the last single copy's twin slot stays empty
        units += [(w[a], w[b] if b >= 0 else 0.0, a, b) for a, b in zip(singles[0::2], singles[1::2], strict=True)]
        if len(units) > pairs * width:
            return None
        q = np.zeros((pairs, width, 2))  # twin slot loads
        ids = np.full((pairs, width, 2), -1, dtype=np.int64)  # their experts
        count = np.zeros(pairs, dtype=np.int64)
        twin_load = np.zeros((pairs, 2))
        holds = np.zeros((pairs, E), dtype=bool)
        has = np.zeros((pairs, groups), dtype=bool)
        for u in sorted(units, key=lambda u: (heaviest[u[2] // per], -(u[0] + u[1]))):
            g = u[2] // per
            room = (count < width) & ~holds[:, u[2]]
            if not room.any():
                break  # the pairs with room hold it already: no twin layout at these counts
            fits = room & has[:, g] & (np.maximum(twin_load[:, 0] + u[0], twin_load[:, 1] + u[1]) <= cap)
            v = int(np.argmin(np.where(fits if fits.any() else room, twin_load.max(axis=1), np.inf)))
            q[v, count[v]], ids[v, count[v]] = u[:2], u[2:]
            count[v] += 1
            twin_load[v] += u[:2]
            holds[v, u[2]] = has[v, g] = True
        if count.sum() != len(units):
            continue
        _level_twins(q, ids, cap, E)
        slots = np.full((nodes, width), -1, dtype=np.int64)
        for v in range(pairs):
            for t in (0, 1):
                kept = ids[v, :, t][ids[v, :, t] >= 0]
                slots[2 * v + t, : len(kept)] = kept
        packed = max(
            packed_max(q[v, :, t][ids[v, :, t] >= 0], gpus_per_node, slot_width) for v in range(pairs) for t in (0, 1)
        )
        score = packed / gpu_mean - 1.0
        if best is None or score < best[0] - 1e-12:
            best = (score, slots)
        if score <= eps:
            return slots
    return None if best is None or (within is not None and best[0] > within) else best[1]


def _make_room(slots: np.ndarray, e: int) -> int | None:
    """Move one copy from a node without ``e`` to a free slot of a node with ``e``, so that the
    first node has a free slot for ``e``; that node, or None where no such move exists."""
    for a in np.flatnonzero((slots < 0).any(axis=1)):
        for b in np.flatnonzero(~(slots == e).any(axis=1)):
            for j, x in enumerate(slots[b]):
                if x >= 0 and x not in slots[a]:
                    slots[a, int(np.argmax(slots[a] < 0))] = x
                    slots[b, j] = -1
                    return int(b)
    return None


def _grouped(
    graph: np.ndarray,
    w: np.ndarray,
    groups: int,
    cap: int,
    eps: float,
    rng: np.random.Generator,
    iterations: int,
    deadline: float | None,
) -> np.ndarray:
    """int ``[items]``: each item's group (the grouping heuristic; its limit relaxed if needed)."""
    packed = np.asarray(packing.balanced_homes(w, groups, cap), dtype=np.int64)
    if groups == 1:
        return packed
    reach = float(np.bincount(packed, weights=w, minlength=groups).max())
    limit = max((1.0 + eps) * float(w.sum()) / groups, reach * (1.0 + 1e-9))
    g = Grouping(graph, w, groups, cap, load_limit=limit)
    if deadline is not None and time.perf_counter() > deadline:
        return packed
    try:
        home, _ = grouping_heuristic(
            g,
            rng,
            refine=iterations > 0,
            iterations=iterations,
            patience=max(5, iterations // 4),
            hint=packed,
            deadline=deadline,
        )
    except InfeasibleError:
        return packed
    return np.asarray(home, dtype=np.int64)


def _separate_copies(home: np.ndarray, expert: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """``home`` with no two copies of one expert in one group: each extra copy swaps with the
    item of another group (whose expert its group lacks, and which lacks the copy's expert)
    closest to it in load. Bounded: every swap removes one duplicate and adds none."""
    home = np.asarray(home, dtype=np.int64).copy()
    E = int(expert.max()) + 1 if len(expert) else 0
    for _ in range(len(home)):
        held = np.zeros((E, groups), dtype=np.int64)
        np.add.at(held, (expert, home), 1)
        dup = np.flatnonzero(held[expert, home] > 1)
        if not len(dup):
            return home
        i = int(dup[0])
        e, g = int(expert[i]), int(home[i])
        ok = (held[e, home] == 0) & (held[expert, g] == 0) & (home != g)
        cand = np.flatnonzero(ok)
        if not len(cand):
            break
        j = int(cand[np.argmin(np.abs(w[cand] - w[i]))])
        home[i], home[j] = home[j], g
    return home


@threadpool_limits.wrap(limits=1, user_api="blas")
def place_in_nodes(
    node_slots: np.ndarray,
    copy_load: np.ndarray,
    affinity: np.ndarray,
    gpus_per_node: int,
    width: int,
    limit: float,
    rng: np.random.Generator,
    *,
    iterations: int = 100,
    deadline: float | None = None,
) -> tuple[np.ndarray, float]:
    """int ``[nodes * gpus_per_node, width]``: each node's copies placed on its GPUs, and the
    largest GPU load reached.

    Per node, the grouping problem of its copies (their loads ``copy_load[e, n]`` under the
    rule, ``gpus_per_node`` groups of ``width`` slots, largest GPU load at most ``limit``: the
    run's GPU limit, or what a balanced packing of the node reaches when that is more) solved
    by `moeopt.heuristics.spectral.grouping_heuristic` for the co-activation inside GPUs.
    Every copy stays on its node.

    Parameters
    ----------
    node_slots
        int ``[nodes, gpus_per_node * width]``: the node level's plan (``-1``: empty).
    copy_load
        float ``[E, nodes]``: the load each node's copy of each expert serves.
    affinity
        float ``[E, E]``: co-activation.
    gpus_per_node, width
        GPUs per node and slots per GPU.
    limit
        The largest GPU load wanted (same units as ``copy_load``).
    rng
        Seeds the grouping heuristic.
    iterations, deadline
        The grouping search's rounds per node and optional ``time.perf_counter()`` cap.
    """
    nodes, S = node_slots.shape
    out = np.full((nodes * gpus_per_node, width), -1, dtype=np.int64)
    worst = 0.0
    for n in range(nodes):
        items = node_slots[n][node_slots[n] >= 0]
        q = copy_load[items, n].astype(np.float64)
        home = _place_node(items, q, affinity, gpus_per_node, width, limit, rng, iterations, deadline)
        for g in range(gpus_per_node):
            mine = items[home == g]
            out[n * gpus_per_node + g, : len(mine)] = mine
        if len(items):
            worst = max(worst, float(np.bincount(home, weights=q, minlength=gpus_per_node).max()))
    return out, worst


def _place_node(
    items: np.ndarray,
    q: np.ndarray,
    affinity: np.ndarray,
    gpn: int,
    width: int,
    limit: float,
    rng: np.random.Generator,
    iterations: int,
    deadline: float | None,
) -> np.ndarray:
    """int ``[len(items)]``: the GPU (0..gpn-1) of each of a node's copies."""
    m = len(items)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if gpn == 1:
        return np.zeros(m, dtype=np.int64)
    total = float(q.sum())
    if total <= 0:
        return np.arange(m, dtype=np.int64) // width
    w = q / total
    packed = packing.round_robin_lpt(w, gpn, width)  # what the node level priced
    reach = float(np.bincount(packed, weights=w, minlength=gpn).max())
    rel = max(limit / total, reach * (1.0 + 1e-9))
    graph = np.asarray(affinity, dtype=np.float64)[np.ix_(items, items)]
    scale = float(graph.max(initial=0.0)) or 1.0
    g = Grouping(graph / scale, w, gpn, width, load_limit=rel)
    if deadline is not None and time.perf_counter() > deadline:
        return np.asarray(packed, dtype=np.int64)
    try:
        home, _ = grouping_heuristic(
            g, rng, iterations=iterations, patience=max(5, iterations // 4), hint=packed, deadline=deadline
        )
    except InfeasibleError:
        return np.asarray(packed, dtype=np.int64)
    return np.asarray(home, dtype=np.int64)


def gpus_onto_nodes(slots: np.ndarray, gpus_per_node: int, load: np.ndarray | None = None) -> np.ndarray:
    """int ``[nodes, gpus_per_node * W]``: a GPU plan ``[G, W]`` regrouped by node, its GPUs
    dealt to the nodes so that as few nodes as possible hold two copies of one expert.

    A GPU plan balanced for its GPUs (the balance planner's, whose copy counts suit ``W`` slots
    a GPU) stays as balanced whichever node each GPU joins; the node level wants at most one
    copy of an expert per node. GPUs holding the most-copied experts go first, each to the
    node with room where it collides with fewest copies, then the lightest (``load [E]``: the
    experts' loads, split evenly over their copies), then the emptiest. A copy that still meets
    another of its expert in its node becomes an empty slot (as `node_slots`)."""
    G, W = slots.shape
    nodes = G // gpus_per_node
    E = int(slots.max(initial=-1)) + 1
    counts = np.bincount(slots[slots >= 0], minlength=E)
    per_copy = np.zeros(E) if load is None else np.asarray(load, dtype=np.float64)[:E] / np.maximum(counts, 1)
    held = np.zeros((nodes, E), dtype=np.int64)
    fill = np.zeros(nodes, dtype=np.int64)
    node_load = np.zeros(nodes)
    members: list[list[int]] = [[] for _ in range(nodes)]
    most = np.where(slots >= 0, counts[np.maximum(slots, 0)], 0).max(axis=1)
    for g in np.argsort(-most, kind="stable"):
        row = slots[g][slots[g] >= 0]
        clash = held[:, row].sum(axis=1).astype(np.float64)
        clash[fill >= gpus_per_node] = np.inf
        n = int(np.lexsort((fill, node_load, clash))[0])
        held[n, row] += 1
        fill[n] += 1
        node_load[n] += float(per_copy[row].sum())
        members[n].append(int(g))
    regrouped = np.concatenate([slots[sorted(m)] for m in members])[None]
    return node_slots(regrouped, gpus_per_node)[0]


def node_slots(slots: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """int ``[L, nodes, gpus_per_node * W]``: a GPU plan ``[L, G, W]`` seen by node (a node's slots
    are its GPUs' in order; a second copy of an expert in a node becomes an empty slot)."""
    L, G, W = slots.shape
    out = slots.reshape(L, G // gpus_per_node, gpus_per_node * W).copy()
    for l in range(L):
        for n in range(out.shape[1]):
            row = out[l, n]
            seen: set[int] = set()
            for i, e in enumerate(row.tolist()):
                if e in seen:
                    row[i] = -1
                elif e >= 0:
                    seen.add(e)
    return out


def node_shares(
    slots: np.ndarray, experts: int, rule: str, gpus_per_node: int, tp_size: int | None = None
) -> np.ndarray:
    """float ``[E, nodes]``: the share of each expert's load each node's copy serves under
    ``rule``, for a node-level plan ``[nodes, S]`` (at most one copy of an expert per node).

    ``1 / c`` per copy under every rule but ``ascend`` (``static`` too: with a copy per node,
    the node's own ranks and an even part of the fair draw; ``lp`` at most that); ``ascend``:
    the rank-modulo shares over the ``nodes * gpus_per_node`` ranks, copies in node order."""
    nodes = slots.shape[0]
    holds = np.zeros((experts, nodes), dtype=bool)
    n, s = np.nonzero(slots >= 0)
    holds[slots[n, s], n] = True
    c = np.maximum(holds.sum(axis=1), 1)
    if rule != "ascend":
        return np.asarray(holds / c[:, None], dtype=np.float64)
    from moeopt.balance.ranks import share_table

    table = share_table(nodes * gpus_per_node, experts, tp_size)
    rank = np.clip(np.cumsum(holds, axis=1) - 1, 0, nodes - 1)
    return np.asarray(np.where(holds, table[np.arange(experts)[:, None], c[:, None], rank], 0.0))


def packed_max(q: np.ndarray, gpus: int, width: int) -> float:
    """The largest GPU load when loads ``q`` are packed onto ``gpus`` GPUs of ``width`` slots by
    `moeopt.packing.round_robin_lpt` (what the node level prices and the GPU level starts
    from)."""
    if not len(q):
        return 0.0
    home = packing.round_robin_lpt(q, gpus, width)
    return float(np.bincount(home, weights=q, minlength=gpus).max())


def rebalance_singles(
    node_slots: np.ndarray,
    copy_load: np.ndarray,
    affinity: np.ndarray,
    gpus_per_node: int,
    width: int,
    limit: float,
    steps: int = 64,
    tries: int = 24,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The node plan with experts of one copy swapped between nodes until every node's copies
    pack within ``limit`` per GPU (or no swap helps), the copies' loads on it (a single copy
    serves its expert's whole load wherever it is) and the swaps made.

    Only single-copy experts move: their shares do not depend on the plan, and no expert's set
    of holding nodes with several copies changes, so SGLang static's seeded deals, decided by
    those sets alone (`moeopt.dispatch.static_map`), stay what ``copy_load`` was computed
    from. Each step takes the node whose packing is worst and swaps one of its single-copy
    experts with a lighter one of another node: of the ``tries`` swaps leaving the two nodes'
    loads most even, the one that lowers the larger of their packed maxima the most, ties to
    the least co-activation lost. At most ``steps`` swaps."""
    slots = np.array(node_slots, dtype=np.int64, copy=True)
    nodes = slots.shape[0]
    E = copy_load.shape[0]
    holds = np.zeros((E, nodes), dtype=bool)
    n_idx, s_idx = np.nonzero(slots >= 0)
    holds[slots[n_idx, s_idx], n_idx] = True
    single = holds.sum(axis=1) == 1
    A = np.asarray(affinity, dtype=np.float64)
    copy_load = np.array(copy_load, dtype=np.float64, copy=True)
    whole = copy_load.sum(axis=1)  # a single copy's load, on whichever node it is
    q_of = np.where(slots >= 0, copy_load[np.maximum(slots, 0), np.arange(nodes)[:, None]], 0.0)  # [N, S]
    movable = (slots >= 0) & single[np.maximum(slots, 0)]

    def node_max(n: int) -> float:
        return packed_max(q_of[n][slots[n] >= 0], gpus_per_node, width)

    worst = np.array([node_max(n) for n in range(nodes)])
    node_load = q_of.sum(axis=1)
    done = 0
    for _ in range(steps):
        w = int(np.argmax(worst))
        if worst[w] <= limit:
            break
        # every swap (slot i of w, slot j of node n): w's load falls by delta, n's rises by it
        d = q_of[w][:, None, None] - q_of[None, :, :]  # [S_w, N, S]
        ok = movable[w][:, None, None] & movable[None, :, :] & (d > 0)
        ok[:, w, :] = False
        if not ok.any():
            break
        top_load = np.maximum(node_load[w] - d, node_load[None, :, None] + d)
        order = np.argsort(np.where(ok, top_load, np.inf), axis=None)[:tries]
        best: tuple[float, float, int, int, int] | None = None
        for t in order:
            i, n, j = (int(x) for x in np.unravel_index(t, d.shape))
            if not ok[i, n, j]:
                continue
            a, b = int(slots[w, i]), int(slots[n, j])
            slots[w, i], slots[n, j] = b, a
            q_of[w, i], q_of[n, j] = whole[b], whole[a]
            top = max(node_max(w), node_max(n))
            slots[w, i], slots[n, j] = a, b
            q_of[w, i], q_of[n, j] = whole[a], whole[b]
            if top >= worst[w] - 1e-12:
                continue
            lost = (A[a, holds[:, w]].sum() - A[a, a]) + (A[b, holds[:, n]].sum() - A[b, b])
            lost -= (A[b, holds[:, w]].sum() - A[b, a]) + (A[a, holds[:, n]].sum() - A[a, b])
            if best is None or (top, lost) < best[:2]:
                best = (top, lost, n, i, j)
        if best is None:
            break
        _, _, n, i, j = best
        a, b = int(slots[w, i]), int(slots[n, j])
        slots[w, i], slots[n, j] = b, a
        q_of[w, i], q_of[n, j] = whole[b], whole[a]
        copy_load[a, w], copy_load[a, n], copy_load[b, n], copy_load[b, w] = 0.0, whole[a], 0.0, whole[b]
        holds[a, w], holds[a, n], holds[b, n], holds[b, w] = False, True, False, True
        node_load[w], node_load[n] = q_of[w].sum(), q_of[n].sum()
        worst[w], worst[n] = node_max(w), node_max(n)
        done += 1
    return slots, copy_load, done


def static_node_shares(
    node_plans: np.ndarray, experts: int, gpus_per_node: int, width: int, dense_layers: int = 0
) -> np.ndarray:
    """float ``[L, E, nodes]``: the share of each expert's load each node serves under SGLang's
    static rule, exactly as the engine's seeded tables deal it (`moeopt.dispatch.static_map`,
    homes uniform over the ranks), for node plans ``[L, nodes, gpus_per_node * width]`` with at
    most one copy of an expert per node.

    Which node serves which rank does not depend on where a node's copies sit among its GPUs (a
    rank uses its node's copy; the fair deal runs over the copies in slot order, which is node
    order, and its stream is consumed by the items a rank's node lacks), so the shares computed
    on any placement inside the nodes hold for the final one."""
    from moeopt.dispatch import STATIC_SEED, static_map
    from moeopt.plan import Dispatch, Plan

    L, nodes, S = node_plans.shape
    G, E = nodes * gpus_per_node, experts
    plan = Plan(slots=node_plans.reshape(L, G, width), experts=E, dispatch=Dispatch(kind="static"))
    table = static_map(plan, gpus_per_node, STATIC_SEED, dense_layers)  # [G, L, E] physical slots
    node = table // S
    out = np.zeros((L, E, nodes))
    l_idx = np.broadcast_to(np.arange(L)[None, :, None], node.shape)
    e_idx = np.broadcast_to(np.arange(E)[None, None, :], node.shape)
    np.add.at(out, (l_idx.ravel(), e_idx.ravel(), node.ravel()), 1.0 / G)
    return out
