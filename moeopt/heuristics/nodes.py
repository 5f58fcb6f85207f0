"""Placing groups on nodes: relabel GPUs so that groups with strong mutual affinity share a node.

The grouping search itself (moves, swaps, iterated local search) is the one engine of
`moeopt.heuristics.local_search`; here it runs on the quotient graph of the groups.
"""

from __future__ import annotations

import numpy as np

from moeopt.grouping import Grouping
from moeopt.heuristics.local_search import iterated_local_search


def arrange_nodes(
    problem: Grouping, home: np.ndarray, gpus_per_node: int, rng: np.random.Generator, iterations: int = 50
) -> np.ndarray:
    """Relabel the groups so that groups with strong mutual affinity share a node.

    The G groups are themselves grouped into ``G / gpus_per_node`` nodes (same search on the
    quotient graph ``X^T W X``, cap ``gpus_per_node``); each group keeps its experts, so the
    intra-group objective and every load are unchanged.
    """
    G = problem.groups
    if gpus_per_node >= G or G % gpus_per_node:
        return home
    onehot = np.zeros((problem.experts, G))
    onehot[np.arange(problem.experts), home] = 1.0
    quotient = onehot.T @ problem.graph @ onehot
    np.fill_diagonal(quotient, 0.0)
    nodes = G // gpus_per_node
    q = Grouping(graph=quotient, load=np.zeros(G), groups=nodes, cap=gpus_per_node)
    start = np.arange(G) // gpus_per_node
    node, _ = iterated_local_search(q, start, rng, iterations=iterations, patience=max(10, iterations // 2))
    # GPU ids: node n holds GPUs n*gpn .. n*gpn + gpn - 1, assigned in group order
    order = np.argsort(node, kind="stable")
    gpu_of_group = np.empty(G, dtype=np.int64)
    gpu_of_group[order] = np.arange(G)
    return gpu_of_group[home]


def node_affinity(graph: np.ndarray, home: np.ndarray, gpus_per_node: int) -> float:
    """Affinity between experts on different GPUs of one node."""
    node = home // gpus_per_node
    mask = (node[:, None] == node[None, :]) & (home[:, None] != home[None, :])
    return float(np.triu(graph * mask, k=1).sum())
