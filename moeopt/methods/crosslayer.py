"""``crosslayer``: plan the layers together when tokens stay on the GPU of their last expert.

Under ``cluster.token_home: previous-layer`` (ExFlow, MoETuner) a token's hidden state lives,
at layer l, on the GPU that ran its top-1 expert at layer l - 1, so its dispatch at layer l
costs the distinct GPUs of its top-k experts *other than that GPU*. The objective (remote
GPUs per token, summed over layers) couples each layer only to its neighbours, and for a
layer l with both neighbours' plans fixed it is exact and simple:

* layer l's own remote GPUs: the (λ − 1) connectivity of the net ``topk ∪ {home}`` with the
  token's home as a pin fixed to its GPU (`stay_edges`, `StayGain`); tokens
  with the same (top-k set, home) share one net;
* layer l + 1's: a token lives on the GPU of its layer-l top-1 expert e, so placing e on g
  saves ``B[e, g]`` remote GPUs there, the tokens with top-1 e that find one of their
  layer l + 1 experts on g (`next_layer_benefit`): a linear term.

The planner:

1. **starts**: ``agnostic``'s plan (and optionally ``hypergraph``'s, or a forward pass of
   Mt-KaHyPar with the home pins fixed, or the caller's hint), each with the free GPU
   relabeling every method gets (`moeopt.relabel.relabel_gpus`);
2. **sweeps**: forward, then backward, and so on, each layer is re-planned knowing both
   neighbours: the best renumbering of its GPU ids against both (one linear assignment,
   `permute_layer`; GPUs of different speed classes never trade ids), then
   best-improvement swaps and moves on the exact gains (`CrossGain`) within the slot
   counts and the same automatic load limit as ``agnostic`` / ``tacg`` / ``hypergraph``;
   after each pass, **chain moves** (`chain_pass`): per pair of GPUs, the best joint
   re-split of the experts they hold in every layer (a dynamic program over the layers), which
   moves an expert together with the experts its tokens go to next; until a pass saves less
   than ``tolerance``;
3. optional **kicks** (iterated local search: random feasible swaps in one layer, then the
   layer and its neighbours re-planned, kept when not worse);
4. the best plan over the starts on the calibration trace.

Every step is a descent on the calibration objective, so the result is never worse than its
relabeled starts.

**Certificate** (``bound_rounds`` of column generation per layer, capped at ``bound_time``
seconds and by the time limit; ``bound_time: 0``: none): a token's remote GPUs at a layer are
its distinct GPUs less at most one (its home), so every plan's objective is at least, per layer,
the lower bound on distinct GPUs per token of `moeopt.colgen.cover.distinct_lower_bound`
(column generation over GPU contents, seeded with the plan; a pair LP where that is cut short)
less the share of tokens that can stay at all (`moeopt.colgen.cover.stay_upper_bound`, an
LP over which previous-layer experts can share a GPU with which experts of this layer), or
times ``1 - 1/G`` at layer 0 under uniform homes (`moeopt.colgen.cover.remote_lower_bound`).
It ignores the load limit, so it is valid for every plan and loose.

`exact_crosslayer` computes the optimum of tiny instances (dynamic programming over all
placements of each layer) to check the planner and the certificate.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import linear_sum_assignment

from moeopt.errors import InfeasibleError, InputError
from moeopt.heuristics.hyperedges import ConnectivityGain, Hyperedges, token_hyperedges
from moeopt.heuristics.local_search import (
    RELAX_STEP,
    RELAX_TRIES,
    TOL,
    limited_search,
    load_limit,
    local_search,
    resolve_eps_load,
)
from moeopt.methods.hypergraph import _available
from moeopt.moves.driver import iterate
from moeopt.registry import Context, Problem, register
from moeopt.relabel import relabel_gpus, speed_classes, stay_counts
from moeopt.result import Result, Status, Termination, bound_closes
from moeopt.solvers.partitioners import fixed_home_partition, mtkahypar_partition


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


# ============================================================================ the cross-layer objective
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


#: Largest number of splits of two GPUs' experts `chain_pass` enumerates per layer
#: (``C(2S, S)``: 70 at 4 slots per GPU); with more slots the chain moves are skipped.
CHAIN_MAX_SPLITS = 70


@functools.lru_cache(maxsize=64)
def _splits(m: int, on_a: int) -> tuple[np.ndarray, np.ndarray]:
    """Every way to put ``on_a`` of m experts on GPU a (the rest on b): bitmasks ``[P]`` and
    membership ``bool [P, m]``."""
    masks = np.array([sum(1 << i for i in c) for c in itertools.combinations(range(m), on_a)], dtype=np.int64)
    return masks, ((masks[:, None] >> np.arange(m)[None, :]) & 1).astype(bool)


def _token_bits(ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """int ``[T]``: bit i set when the token's experts include the i-th expert of the pair."""
    p = pos[ids]
    return np.where(p >= 0, np.left_shift(1, np.maximum(p, 0)), 0).sum(axis=1)


def chain_pass(
    homes: np.ndarray,
    topk: np.ndarray,
    first: np.ndarray | None,
    gpus: int,
    loads: list[np.ndarray],
    limits: list[float | None],
    *,
    layers: tuple[int, int] | None = None,
    pairs: list[tuple[int, int]] | None = None,
    deadline: float | None = None,
) -> tuple[float, bool]:
    """Chain moves: for each pair of GPUs (a, b), the best joint re-split of the experts they
    hold at layers ``lo..hi`` (``layers``, default all), applied in place when it saves
    remote GPUs; returns the remote GPUs saved (summed over tokens) and whether ``deadline``
    cut the pass short.

    A swap in one layer cannot move a *chain* (an expert at l and the experts its tokens go
    to at l + 1) together: moving e from a to b moves its tokens' home at l + 1, so e's
    successors on a lose the stays they had. Here the splits of the pair's experts (each
    layer keeps the slot counts of a and b and its load limit) are chosen jointly over the
    layers, exactly, with the other GPUs and the layers outside ``lo..hi`` fixed: the remote
    GPUs that change are a chain of terms, layer l's depending only on the splits at l - 1
    and l, so one dynamic program over the layers (``[P, Q]`` tables, ``C(m, S_a)`` splits
    per layer) finds the best:

    * layer ``lo``'s own: tokens whose top-k meets the pair's experts, grouped by which of
      them they use (a bitmask) and where they live (a, b, elsewhere; fixed);
    * layer l > lo: tokens whose layer l - 1 top-1 is one of the pair's experts live on a or
      b depending on the split at l - 1; grouped by that expert and their layer-l bitmask;
    * layer ``hi + 1``'s: linear in the split at ``hi`` (`next_layer_benefit`).

    GPU pairs run in sequence (a Python loop over pairs, numpy inside); ``deadline`` stops
    it early. Layers with more than `CHAIN_MAX_SPLITS` splits end the chain.
    """
    L, E = homes.shape
    lo, hi = (0, L - 1) if layers is None else layers
    th = first if lo == 0 else homes[lo - 1][topk[:, lo - 1, 0]]
    scale = (1.0 - 1.0 / gpus) if th is None else 1.0
    bm = None if hi + 1 >= L else next_layer_benefit(homes[hi + 1], topk[:, hi, 0], topk[:, hi + 1, :], E, gpus)
    lims = [np.inf if (lim := limits[l]) is None else lim + TOL for l in range(L)]
    saved = 0.0
    todo = pairs if pairs is not None else [(a, b) for a in range(gpus) for b in range(a + 1, gpus)]
    for a, b in todo:
        if deadline is not None and time.perf_counter() > deadline:
            return saved, True
        xs: list[np.ndarray] = []
        ins: list[np.ndarray] = []
        values, backs, cur = None, [], 0.0
        top, prev_pos, cur_prev, options = lo - 1, np.full(E, -1), 0, 1
        for l in range(lo, hi + 1):
            h = homes[l]
            x = np.flatnonzero((h == a) | (h == b))
            m = len(x)
            if m > 16:
                break
            masks, inside = _splits(m, int((h[x] == a).sum()))
            if len(masks) > CHAIN_MAX_SPLITS:
                break
            pos = np.full(E, -1)
            pos[x] = np.arange(m)
            bits = _token_bits(topk[:, l, :], pos)
            hit = bits > 0
            rest = ((1 << m) - 1) & ~masks
            if l == lo:  # homes fixed: a, b or elsewhere
                where = (
                    np.full(int(hit.sum()), 2)
                    if th is None
                    else np.where(th[hit] == a, 0, np.where(th[hit] == b, 1, 2))
                )
                cnt = np.bincount(bits[hit] * 3 + where, minlength=(1 << m) * 3).reshape(1 << m, 3)
                used = np.flatnonzero(cnt.sum(axis=1))
                cnt = cnt[used].astype(np.float64)
                on_a = ((used[None, :] & masks[:, None]) != 0).astype(np.float64)
                on_b = ((used[None, :] & rest[:, None]) != 0).astype(np.float64)
                step = (scale * (on_b @ cnt[:, 0] + on_a @ cnt[:, 1] + (on_a + on_b) @ cnt[:, 2]))[None, :]
            else:  # homes: the pair's previous-layer expert that is the token's top-1 (m_prev: none)
                mp = len(xs[-1])
                src = prev_pos[topk[hit, l - 1, 0]]
                src = np.where(src < 0, mp, src)
                C = np.bincount(src * (1 << m) + bits[hit], minlength=(mp + 1) << m).reshape(mp + 1, 1 << m)
                used = np.flatnonzero(C.sum(axis=0))
                C = C[:, used].astype(np.float64)
                q_a = ((used[None, :] & masks[:, None]) != 0).astype(np.float64)
                q_b = ((used[None, :] & rest[:, None]) != 0).astype(np.float64)
                prev_in = ins[-1]
                step = (
                    ((q_a + q_b) @ C.sum(axis=0))[None, :] - prev_in @ (C[:mp] @ q_a.T) - (~prev_in) @ (C[:mp] @ q_b.T)
                )
            la = inside @ loads[l][x]
            ok = (la <= lims[l]) & (loads[l][x].sum() - la <= lims[l])
            c = int(np.flatnonzero((inside == (h[x] == a)).all(axis=1))[0])  # the current split
            step = np.where(ok[None, :], step, np.inf)
            if values is None:
                values = step[0]
                cur = float(step[0, c])
            else:
                total = values[:, None] + step
                backs.append(np.argmin(total, axis=0))
                values = total[backs[-1], np.arange(total.shape[1])]
                cur += float(step[cur_prev, c])
            xs.append(x)
            ins.append(inside)
            prev_pos, cur_prev, top = pos, c, l
            options *= len(masks)
        if values is None or options == 1 or not np.isfinite(cur):
            continue  # nothing to choose, or the current split breaks a load limit (no descent to price)
        if bm is not None and top == hi:  # the layer after the chain: linear in its last split
            lin = ins[-1] @ bm[xs[-1], a] + (~ins[-1]) @ bm[xs[-1], b]
            values = values - lin
            cur -= float(lin[cur_prev])
        elif top < L - 1:  # the chain stopped early: price the next layer against its last split
            nb = next_layer_benefit(homes[top + 1], topk[:, top, 0], topk[:, top + 1, :], E, gpus)
            lin = ins[-1] @ nb[xs[-1], a] + (~ins[-1]) @ nb[xs[-1], b]
            values = values - lin
            cur -= float(lin[cur_prev])
        j = int(np.argmin(values))
        gain = cur - float(values[j])
        if gain > 1e-7 * max(1.0, abs(cur)):
            saved += gain
            for t in range(len(xs) - 1, -1, -1):
                homes[lo + t][xs[t]] = np.where(ins[t][j], a, b)
                if t > 0:
                    j = int(backs[t - 1][j])
    return saved, False


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
    bound_rounds: int | None = None
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
            homes, info = self.sweep(homes, topk, first, G, S, loads, lims, relax, classes, params, rng, deadline)
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
        from moeopt.methods.joint import certificate_cap, layer_certificates

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
            # the starts share 40 % of the budget (L x --time-limit); the sweeps and the certificate the rest
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

    # ---------------------------------------------------------------- sweeps
    @staticmethod
    def sweep(homes, topk, first, G, S, loads, limits, relax, classes, params, rng=None, deadline=None):
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


class _KickSpace:
    """The kicks of `CrossLayer.sweep` as a landscape of the one driver
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


def least_largest_load(load: np.ndarray, G: int, S: int) -> float:
    """A lower bound on the largest GPU load of every single-copy plan of ``G x S`` slots (loads
    ``[E]``): exact with two slots per GPU and no spare slot (the heaviest expert with the
    lightest, the second with the second lightest, and so on, is a best pairing), else
    `moeopt.grouping.min_max_load`."""
    from moeopt.grouping import min_max_load

    if S == 2 and len(load) == 2 * G:
        w = np.sort(np.asarray(load, dtype=np.float64))
        return float((w + w[::-1]).max())
    return min_max_load(load, G, S)


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
    from moeopt.methods.joint import layer_certificates

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


def cheapest_levels(cost: np.ndarray, spend: np.ndarray, budget: float) -> float:
    """``min sum_l cost[l, max(k_l, k_{l-1})]`` (``k_{-1} = k_0``) over the level tuples with
    ``sum_l spend[l, k_l] <= budget`` (``cost``, ``spend``: ``[L, levels]``; ``inf`` if none fits).

    Exact, by dynamic programming over the layers: per level of the last layer, the pairs (spent,
    cost) that no other pair beats on both, so the work grows with those fronts, not with
    ``levels ** L``.
    """
    L, K = cost.shape
    tol = 1e-12
    front = [np.array([[spend[0, k], cost[0, k]]]) for k in range(K)]
    for l in range(1, L):
        nxt = []
        for k in range(K):
            parts = [f + np.array([spend[l, k], cost[l, max(k, j)]]) for j, f in enumerate(front) if len(f)]
            pairs = np.concatenate(parts) if parts else np.zeros((0, 2))
            pairs = pairs[pairs[:, 0] <= budget + tol]
            pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]  # by spent, then cost
            keep = pairs[:, 1] < np.minimum.accumulate(np.r_[np.inf, pairs[:-1, 1]])  # strictly cheaper
            nxt.append(pairs[keep])
        front = nxt
    fits = [f[f[:, 0] <= budget + tol, 1] for f in front]
    return float(min((x.min() for x in fits if len(x)), default=math.inf))


def largest_loads(homes: np.ndarray, loads: list[np.ndarray], G: int) -> list[float]:
    """Each layer's largest GPU load (``homes [L, E]``, ``loads`` per layer)."""
    return [float(np.bincount(h, weights=w, minlength=G).max()) for h, w in zip(homes, loads, strict=True)]


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


# ============================================================================ exact (tiny instances)
#: Largest number of joint placements `exact_crosslayer` enumerates.
EXACT_MAX_PLANS = 2_000_000


def layer_placements(
    experts: int, gpus: int, slots: int, load: np.ndarray | None = None, limit: float | None = None
) -> np.ndarray:
    """int ``[P, E]``: every assignment of E experts to G GPUs with at most ``slots`` each
    (and GPU loads within ``limit`` when given)."""
    grids = np.stack(np.meshgrid(*[np.arange(gpus)] * experts, indexing="ij"), axis=-1).reshape(-1, experts)
    counts = np.stack([(grids == g).sum(axis=1) for g in range(gpus)], axis=1)
    ok = (counts <= slots).all(axis=1)
    if limit is not None and load is not None:
        gl = np.stack([((grids == g) * load[None, :]).sum(axis=1) for g in range(gpus)], axis=1)
        ok &= (gl <= limit + TOL).all(axis=1)
    return grids[ok]


def exact_crosslayer(
    topk: np.ndarray,
    gpus: int,
    slots: int,
    *,
    first: np.ndarray | None = None,
    loads: list[np.ndarray] | None = None,
    limits: list[float | None] | None = None,
    experts: int | None = None,
) -> tuple[np.ndarray, float]:
    """The optimal single-copy plan under ``previous-layer`` homes, by exhaustive search.

    Dynamic programming over the layers: the remote GPUs of layer l depend only on the
    plans of layers l - 1 and l, so ``best[l][p]`` (least remote GPUs of layers 0..l with
    layer l placed as p) is a min over the previous layer's placements. Exact, and tractable
    for tiny instances only (placements per layer squared times layers).

    Parameters
    ----------
    topk
        int ``[tokens, L, k]`` (top-1 first).
    gpus, slots
        G and slots per GPU.
    first
        Layer-0 token homes (None: uniform, expected ``λ (1 - 1/G)``).
    loads, limits
        Per layer, expert loads and the largest GPU load allowed (None: no limit).
    experts
        E (default: the largest id in ``topk`` plus one).

    Returns
    -------
    homes, remote
        The optimal homes ``[L, E]`` and its remote GPUs summed over tokens and layers.
    """
    topk = np.asarray(topk, dtype=np.int64)
    L = topk.shape[1]
    E = experts if experts is not None else int(topk.max()) + 1
    per = [
        layer_placements(E, gpus, slots, None if loads is None else loads[l], None if limits is None else limits[l])
        for l in range(L)
    ]
    if sum(len(per[l - 1]) * len(per[l]) for l in range(1, L)) + len(per[0]) > EXACT_MAX_PLANS:
        raise InputError(None, "exact_crosslayer", "instance too large for exhaustive search")
    if any(len(p) == 0 for p in per):
        raise InfeasibleError("no placement meets the slot and load limits")
    cost0 = np.array([layer_remote(p, topk[:, 0, :], first, gpus) for p in per[0]])
    best = [cost0]
    back: list[np.ndarray] = []
    for l in range(1, L):
        prev, cur = per[l - 1], per[l]
        # pair cost [P_prev, P_cur]: layer l's remote GPUs with homes from the previous placement
        pair = np.empty((len(prev), len(cur)))
        for i, p in enumerate(prev):
            th = p[topk[:, l - 1, 0]]
            pair[i] = [layer_remote(q, topk[:, l, :], th, gpus) for q in cur]
        total = best[-1][:, None] + pair
        back.append(np.argmin(total, axis=0))
        best.append(total.min(axis=0))
    j = int(np.argmin(best[-1]))
    value = float(best[-1][j])
    idx = [j]
    for l in range(L - 1, 0, -1):
        j = int(back[l - 1][j])
        idx.append(j)
    idx.reverse()
    return np.stack([per[l][idx[l]] for l in range(L)]), value
