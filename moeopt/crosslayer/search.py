"""The cross-layer search: each layer re-planned knowing both neighbours (a free GPU
renumbering, then swaps and moves on the exact gains), sweeps over the layers with chain moves,
and kicks (iterated local search)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from moeopt.crosslayer.chain import chain_pass
from moeopt.crosslayer.objective import CrossGain, next_layer_benefit, plan_remote, stay_edges
from moeopt.heuristics.hyperedges import token_hyperedges
from moeopt.heuristics.local_search import RELAX_STEP, RELAX_TRIES, TOL, local_search
from moeopt.moves.driver import iterate
from moeopt.relabel import stay_counts


def permute_layer(
    home_l: np.ndarray,
    topk: np.ndarray,
    l: int,
    token_home: np.ndarray | None,
    home_next: np.ndarray | None,
    gpus: int,
    classes: np.ndarray,
) -> np.ndarray:
    """Layer l's homes with GPU ids permuted to the best of both neighbours (free: no load changes).

    Renaming GPU h to g keeps ``M[g, h]`` stays at layer l (tokens living on g with an
    expert on h) and gains ``N[h, g]`` at layer l + 1 (tokens whose top-1 runs on h and
    that find a layer l + 1 expert on g): one linear assignment. GPUs of different speed
    classes never trade ids.
    """
    ids = topk[:, l, :].astype(np.int64)
    value = np.zeros((gpus, gpus))
    if token_home is not None:
        value += stay_counts(token_home, home_l[ids], gpus)
    if home_next is not None:
        value += stay_counts(home_l[ids[:, 0]], home_next[topk[:, l + 1, :].astype(np.int64)], gpus).T
    value[classes[:, None] != classes[None, :]] = -1e18
    if (value[np.arange(gpus), np.arange(gpus)] >= value.max(axis=1) - TOL).all() and np.all(
        value[np.arange(gpus), np.arange(gpus)] >= value.max(axis=0) - TOL
    ):
        return home_l
    g_new, h_old = linear_sum_assignment(value, maximize=True)
    if value[g_new, h_old].sum() <= value[np.arange(gpus), np.arange(gpus)].sum() + TOL:
        return home_l
    new_of_old = np.empty(gpus, dtype=np.int64)
    new_of_old[h_old] = g_new
    return new_of_old[home_l]


class _KickSpace:
    """The kicks of `sweep` as a landscape of the one driver
    (`moeopt.moves.driver.iterate`): a kick re-plans a few swaps of one random layer,
    the descent re-plans that layer and its neighbours (and, with ``chains``, chain moves on
    the GPU pairs the kick touched); the value is the remote GPUs summed over tokens."""

    def __init__(self, topk, first, G, S, loads, limits, relax, classes, params, deadline) -> None:
        self.topk, self.first, self.G, self.S = topk, first, G, S
        self.loads, self.limits, self.relax, self.classes = loads, limits, relax, classes
        self.params, self.deadline = params, deadline
        self.capped = False  # a chain pass was cut by the deadline
        self._kicked: tuple[int, np.ndarray] | None = None  # (layer, its homes before the kick)

    def kick(self, homes: np.ndarray, rng: np.random.Generator, round: int) -> np.ndarray:
        L = homes.shape[0]
        cand = homes.copy()
        l = int(rng.integers(L))
        swaps = int(rng.integers(1, self.params.kick_swaps + 1))
        cand[l] = kick_layer(cand[l], self.loads[l], self.limits[l], self.classes, rng, swaps)
        self._kicked = (l, homes[l].copy())
        return cand

    def descend(self, homes: np.ndarray, round: int) -> np.ndarray:
        if round < 0 or self._kicked is None:  # the start: already a local optimum of the sweeps
            return homes
        l, before = self._kicked
        L, G = homes.shape[0], self.G
        for m in (l, l - 1, l + 1, l):
            if 0 <= m < L:
                improve_layer(
                    homes, m, self.topk, self.first, G, self.S, self.loads, self.limits, self.relax, self.classes
                )
        if self.params.chains:  # chain moves on the pairs of GPUs the kick and re-planning touched
            diff = homes[l] != before
            hit = set(np.concatenate([homes[l][diff], before[diff]]).tolist())
            pairs = [(a, b) for a in range(G) for b in range(a + 1, G) if a in hit or b in hit]
            cut = chain_pass(
                homes, self.topk, self.first, G, self.loads, self.limits, pairs=pairs, deadline=self.deadline
            )[1]
            self.capped = self.capped or cut
        return homes

    def value(self, homes: np.ndarray) -> float:
        return float(plan_remote(homes, self.topk, self.first, self.G).sum())


def improve_layer(homes, l, topk, first, G, S, loads, limits, relax, classes) -> None:
    """Re-plan layer l in place knowing its neighbours: the best free GPU renumbering
    (`permute_layer`), then swap/move search on the layer's share of the objective
    (`CrossGain`) within the slot and load limits."""
    L, E = homes.shape
    th = first if l == 0 else homes[l - 1][topk[:, l - 1, 0]]
    nxt = homes[l + 1] if l + 1 < L else None
    homes[l] = permute_layer(homes[l], topk, l, th, nxt, G, classes)
    ids = topk[:, l, :]
    if th is None:
        edges, fixed = token_hyperedges(ids, E), False
    else:
        edges, fixed = stay_edges(ids, th, E, G), True
    benefit = None if nxt is None else next_layer_benefit(nxt, ids[:, 0], topk[:, l + 1, :], E, G)
    gain = CrossGain(edges, E, G, fixed=fixed, benefit=benefit)
    h, log = local_search(homes[l], gain, G, S, load=loads[l], limit=limits[l], refine=True)
    tries = 0
    while not log.limit_met and relax[l] and limits[l] is not None and tries < RELAX_TRIES:
        limits[l] *= RELAX_STEP  # relax_eps_load: the start itself breaks the limit
        tries += 1
        h, log = local_search(homes[l], gain, G, S, load=loads[l], limit=limits[l], refine=True)
    if log.limit_met:
        homes[l] = h


def kick_layer(
    home: np.ndarray, load: np.ndarray, limit: float | None, classes: np.ndarray, rng: np.random.Generator, swaps: int
) -> np.ndarray:
    """``swaps`` random swaps of experts on different GPUs that keep the load limit."""
    home = home.copy()
    G = int(home.max()) + 1
    gl = np.bincount(home, weights=load, minlength=G)
    lim = np.inf if limit is None else limit + TOL
    E = len(home)
    for _ in range(swaps):
        for _try in range(20):
            e, f = rng.integers(E, size=2)
            a, b = home[e], home[f]
            if a == b:
                continue
            d = load[e] - load[f]
            if gl[a] - d <= lim and gl[b] + d <= lim:
                home[e], home[f] = b, a
                gl[a] -= d
                gl[b] += d
                break
    return home


def sweep(homes, topk, first, G, S, loads, limits, relax, classes, params: Any, rng=None, deadline=None):
    """Alternating forward/backward passes of `improve_layer` until a pass saves
    less than ``tolerance``, then ``kicks`` rounds of iterated local search."""
    homes = np.array(homes, dtype=np.int64, copy=True)
    L, E = homes.shape
    total = float(plan_remote(homes, topk, first, G).sum())
    start_total = total
    passes = 0
    limits = list(limits)
    chained = 0.0
    capped = False
    took = 0.0  # the longest re-planning of a layer so far: the next one starts only if it fits
    for p in range(params.sweeps):
        order = range(L) if p % 2 == 0 else range(L - 1, -1, -1)
        for l in order:
            if deadline is not None and deadline - time.perf_counter() < took:
                capped = True  # the time limit, not the sweeps' convergence, ends the search
                break
            began = time.perf_counter()
            improve_layer(homes, l, topk, first, G, S, loads, limits, relax, classes)
            took = max(took, time.perf_counter() - began)
        if capped:
            passes += 1
            total = float(plan_remote(homes, topk, first, G).sum())
            break
        if params.chains:
            gain, cut = chain_pass(homes, topk, first, G, loads, limits, deadline=deadline)
            chained += gain
            capped = capped or cut
        passes += 1
        new_total = float(plan_remote(homes, topk, first, G).sum())
        if total - new_total <= params.tolerance * max(total, 1.0):
            total = new_total
            break
        total = new_total
    kicks = improvements = 0
    if rng is not None and params.kicks > 0:
        space = _KickSpace(topk, first, G, S, loads, limits, relax, classes, params, deadline)
        homes, total, log = iterate(
            space,
            homes,
            rng,
            rounds=params.kicks,
            patience=params.patience,
            sideways=True,
            tol=TOL,
            deadline=deadline,
        )
        homes = homes.copy()
        kicks, improvements = log.rounds, log.improvements
        capped = capped or log.capped or space.capped
    return homes, {
        "passes": passes,
        "kicks": kicks,
        "kick_improvements": improvements,
        "saved": (start_total - total),
        "chain_saved": chained,
        "capped": capped,
    }
