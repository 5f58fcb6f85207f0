"""The cross-layer objective under ``previous-layer`` homes and its move and swap gains.

A token's remote GPUs at layer l are the distinct GPUs of its top-k experts other than the GPU
it lives on (the GPU of its top-1 expert at layer l - 1; at layer 0 its trace home, or uniform).
"""

from __future__ import annotations

import numpy as np

from moeopt.heuristics.hyperedges import ConnectivityGain, Hyperedges, token_hyperedges


class StayGain:
    """(λ − 1) gains of the real experts on hyperedges that also hold fixed home pins.

    Experts ``0..E-1`` move; pins ``E..E+G-1`` are the G home GPUs, fixed. The gains of
    `ConnectivityGain` on the extended hypergraph are
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


def token_homes(homes: np.ndarray, topk: np.ndarray, first: np.ndarray | None) -> list[np.ndarray | None]:
    """Per layer, the GPU every token lives on: ``first`` (trace homes, or None: uniform) at
    layer 0, then the GPU of its previous-layer top-1 expert (position 0 of its top-k)."""
    out: list[np.ndarray | None] = [first]
    for l in range(1, homes.shape[0]):
        out.append(homes[l - 1][topk[:, l - 1, 0]])
    return out


def layer_remote(home_l: np.ndarray, topk_l: np.ndarray, token_home: np.ndarray | None, gpus: int) -> float:
    """Remote GPUs summed over tokens at one layer (uniform homes: ``λ (1 - 1/G)``)."""
    g = np.sort(home_l[topk_l], axis=1)
    first = np.ones(g.shape, dtype=bool)
    first[:, 1:] = g[:, 1:] != g[:, :-1]
    distinct = float(first.sum())
    if token_home is None:
        return distinct * (1.0 - 1.0 / gpus)
    return distinct - float((first & (g == token_home[:, None])).sum())


def plan_remote(homes: np.ndarray, topk: np.ndarray, first: np.ndarray | None, gpus: int) -> np.ndarray:
    """float ``[L]``: remote GPUs summed over tokens per layer under ``previous-layer`` homes
    (the evaluator's figure times the tokens, for single-copy plans)."""
    th = token_homes(homes, topk, first)
    return np.array([layer_remote(homes[l], topk[:, l, :], th[l], gpus) for l in range(homes.shape[0])])


def next_layer_benefit(
    home_next: np.ndarray, top1: np.ndarray, topk_next: np.ndarray, experts: int, gpus: int
) -> np.ndarray:
    """float ``[E, G]``: ``B[e, g]`` = tokens whose top-1 expert is e at layer l and that find
    one of their layer l + 1 experts on g. Placing e on g saves them ``B[e, g]`` remote GPUs
    at layer l + 1: the next layer's dependence on layer l's plan is linear in it."""
    s = np.sort(home_next[np.asarray(topk_next, dtype=np.int64)], axis=1)
    first = np.ones(s.shape, dtype=bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    rows = np.repeat(np.asarray(top1, dtype=np.int64), s.shape[1])[first.ravel()]
    cols = s.ravel()[first.ravel()]
    return np.bincount(rows * gpus + cols, minlength=experts * gpus).reshape(experts, gpus).astype(np.float64)


class CrossGain:
    """Move and swap gains of one layer's share of the cross-layer objective.

    With the previous layer's plan and the next layer's plan fixed, the remote GPUs that
    depend on layer l's plan are (a) layer l's own: the (λ − 1) connectivity of each net
    ``topk ∪ {home}`` with the home as a fixed pin (`StayGain`; at layer 0 with
    uniform homes, ``λ (1 - 1/G)`` of the plain top-k sets), and (b) layer l + 1's, where a
    token lives on the GPU of its layer-l top-1 expert: a linear term, ``-B[e, P(e)]`` of
    `next_layer_benefit`. Gains of (b) add to the move gains and leave the swap
    correction alone, so `local_search` runs unchanged.
    """

    def __init__(self, edges: Hyperedges, experts: int, gpus: int, *, fixed: bool, benefit: np.ndarray | None) -> None:
        self.E, self.G, self.fixed = experts, gpus, fixed
        self.inner = StayGain(edges, experts, gpus) if fixed else ConnectivityGain(edges)
        self.scale = 1.0 if fixed else 1.0 - 1.0 / gpus
        self.benefit = benefit

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        move, pair = self.inner.gains(home, gpus)
        if self.scale != 1.0:
            move, pair = move * self.scale, pair * self.scale
        if self.benefit is not None:
            move = move + self.benefit - self.benefit[np.arange(self.E), home][:, None]
        return move, pair
