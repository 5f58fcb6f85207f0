"""The cluster as a switch tree (a networkx graph) and the hop costs it implies; a layer's
coactivation graph for inspection.

A topology is a list of levels, from the GPUs up: level ``i`` puts ``size`` members of level
``i - 1`` (GPUs at level 0) under one switch, and two GPUs whose paths first meet at a level-i
switch are ``weight`` apart; the top level has no size (one switch joins everything). Without
``cluster.topology`` the tree is today's two-level model: ``gpus_per_node`` GPUs per node
(weight 1), the nodes on one switch (weight ``inter_node_weight``).

The graph's links carry half the weight step between the levels they join (GPU to level-0
switch ``w_0 / 2``, level i to level i + 1 ``(w_{i+1} - w_i) / 2``), so the shortest path
between two GPUs, the unique tree path, is the weight of the level where they meet. The schema
requires nondecreasing weights for ``cluster.topology``; the legacy field
``inter_node_weight < 1`` (accepted: an inter-node hop cheaper than an intra-node one) is no
tree's path length, and its costs are read off the meeting level (unweighted hops) instead.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx
import numpy as np

from moeopt.instance import Cluster, TopologyLevel


def levels(cluster: Cluster) -> tuple[TopologyLevel, ...]:
    """The cluster's switch-tree levels, GPUs up: ``cluster.topology`` or the two-level default.

    Raises
    ------
    ValueError
        When the sizes below the top do not divide ``cluster.gpus`` or a size is missing.
    """
    if cluster.topology is None:
        return (TopologyLevel(cluster.gpus_per_node, 1.0), TopologyLevel(None, cluster.inter_node_weight))
    tree = tuple(cluster.topology)
    span = 1
    for i, level in enumerate(tree[:-1]):
        if level.size is None or level.size < 1:
            raise ValueError(f"topology level {i}: expected a positive size, found {level.size}")
        span *= level.size
    if len(tree) < 2 or tree[-1].size is not None or cluster.gpus % span:
        raise ValueError(f"topology: expected levels whose sizes divide gpus={cluster.gpus}, top level without size")
    return tree


def cluster_graph(cluster: Cluster) -> nx.Graph:
    """The cluster as an undirected tree: GPUs and switches, links weighted by hop cost.

    Vertices are ``("gpu", g)`` and ``("switch", i, j)`` (switch j of level i), each with a
    ``kind`` attribute (and ``level`` for switches); every link has a ``weight``.

    Parameters
    ----------
    cluster
        The cluster; its `levels` give the tree.

    Returns
    -------
    networkx.Graph
        ``G + sum_i (switches at level i)`` vertices, a tree.
    """
    tree = levels(cluster)
    graph = nx.Graph()
    below: list[tuple[str | int, ...]] = [("gpu", g) for g in range(cluster.gpus)]
    graph.add_nodes_from(below, kind="gpu")
    previous_weight = 0.0
    for i, level in enumerate(tree):
        size = len(below) if level.size is None else level.size
        step = (level.weight - previous_weight) / 2
        switches: list[tuple[str | int, ...]] = [("switch", i, j) for j in range(len(below) // size)]
        graph.add_nodes_from(switches, kind="switch", level=i)
        graph.add_weighted_edges_from((v, switches[m // size], step) for m, v in enumerate(below))
        below, previous_weight = switches, level.weight
    return graph


@lru_cache(maxsize=32)
def hop_costs(cluster: Cluster) -> np.ndarray:
    """The topology-weighted hop cost between every pair of GPUs (read-only, cached per cluster).

    ``cost[g, h]`` is the weight of the level where GPUs g and h meet (0 on the diagonal): in
    the default two-level model 1 within a node and ``inter_node_weight`` across nodes.

    Parameters
    ----------
    cluster
        The cluster.

    Returns
    -------
    numpy.ndarray
        float ``[G, G]``, symmetric, zero diagonal.
    """
    tree = levels(cluster)
    graph = cluster_graph(cluster)
    G, per_switch = cluster.gpus, tree[0].size or cluster.gpus
    cost = np.zeros((G, G))
    weights = [level.weight for level in tree]
    monotone = all(b >= a for a, b in zip(weights, weights[1:], strict=False))
    gpus = [("gpu", h) for h in range(G)]
    # a GPU's paths all leave through its level-0 switch: one search per switch, not per GPU
    for j in range(G // per_switch):
        switch = ("switch", 0, j)
        if monotone:  # the tree's weighted shortest paths, plus the GPU's own link
            lengths = nx.single_source_dijkstra_path_length(graph, switch, weight="weight")
            row = weights[0] / 2 + np.array([lengths[v] for v in gpus])
        else:  # the meeting level from the number of links: 2 i + 1 from the switch for level i
            hops = nx.single_source_shortest_path_length(graph, switch)
            row = np.array([weights[hops[v] // 2] for v in gpus])
        cost[j * per_switch : (j + 1) * per_switch] = row
    np.fill_diagonal(cost, 0.0)
    # the halved link weights sum back in floating point; snap each entry to its level's weight
    snap = np.asarray([0.0, *weights])
    cost = snap[np.abs(cost[..., None] - snap).argmin(axis=-1)]
    cost.setflags(write=False)
    return np.asarray(cost)


def hop_cost_sum(cluster: Cluster) -> float:
    """``sum_h cost[h, g]``: the total hop cost to one GPU from every GPU (the same for every g:
    the tree is regular), summed as count x weight per level so the two-level default gives
    exactly ``(gpn - 1) + (G - gpn) w``."""
    weights, counts = np.unique(hop_costs(cluster)[0], return_counts=True)
    total = 0.0
    for w, n in zip(weights.tolist(), counts.tolist(), strict=True):
        total += n * w
    return total


def coactivation_graph(affinity: np.ndarray, load: np.ndarray, gpu: np.ndarray | None = None) -> nx.Graph:
    """One layer's coactivation graph, for inspection (GraphML export).

    Parameters
    ----------
    affinity
        float ``[E, E]``: A[l], the share of tokens with both experts in their top-k.
    load
        float ``[E]``: token-slots routed to each expert.
    gpu
        optional int ``[E]``: each expert's GPU (its first copy's) under a plan.

    Returns
    -------
    networkx.Graph
        Experts ``0..E-1`` with a ``load`` (and ``gpu``) attribute; an edge of ``weight``
        A[e, e'] for every pair with A[e, e'] > 0.
    """
    graph = nx.Graph()
    for e, x in enumerate(load.tolist()):
        graph.add_node(e, load=float(x), **({} if gpu is None else {"gpu": int(gpu[e])}))
    upper = np.triu(np.asarray(affinity, dtype=np.float64), k=1)
    i, j = np.nonzero(upper > 0)
    graph.add_weighted_edges_from(zip(i.tolist(), j.tolist(), upper[i, j].tolist(), strict=True))
    return graph
