"""Dispatch policies (SPEC section 11): how tokens choose among the copies of an expert.

A plan's [`Dispatch`][moeopt.plan.Dispatch] is part of the plan; this module turns a plan and a
workload into what that rule executes:

* on count data (per-expert counts, per step or pooled), the GPU loads ``[L, ..., G]``
  ([`count_loads`][moeopt.dispatch.count_loads]);
* on a token trace, the per-step GPU loads and the GPU serving every token-expert
  assignment ([`route_trace`][moeopt.dispatch.route_trace]), from which communication is counted.

Policies
--------
``even``
    Every copy gets ``1/c`` of its expert's tokens (EPLB's model). On a trace a token uses
    copy ``row mod c``, ``row`` its position in its step (SGLang's ``dynamic`` dispatch,
    rank-invariant form); loads are the exact ``n/c`` shares.
``static``
    SGLang's static dispatch (``--ep-dispatch-algorithm static``, the engine's default with
    an all-to-all backend such as DeepEP): each source GPU (the token's home rank) maps each
    expert to one physical copy, fixed for the run: the first copy on its own GPU, else the
    first copy in its own node when that narrows the choice, else one dealt by the engine's
    "fair choice" over the expert's physical slots (each rank its own ``random.Random(42)``
    stream, as each engine rank builds its own table), so a GPU with two copies of an
    expert receives twice the share. Without token homes, homes are uniform and loads and
    communication are the exact expectation over the G possible homes.
``vllm``
    vLLM's EPLB routing (``eplb_map_and_record`` in vLLM 0.34): the token in row ``i`` of its
    rank's batch uses copy ``((i * 2654435769) mod 2**32) mod c`` (Knuth's multiplicative hash;
    copies in physical-slot order, [`physical_copies`][moeopt.dispatch.physical_copies]). On a trace ``i`` is the
    token's row in its step (and home, when the trace records homes); on counts the split is even in
    expectation and is scored as ``even``.
``ascend``
    vLLM-Ascend (``generate_log2phy_map``): source rank ``r`` sends every token for expert
    ``e`` to copy ``r mod c`` of ``e``, its ``c`` distinct devices in rank order (with tensor
    parallelism ``tp``: copy ``(r mod tp + r div tp + e) mod c``). A per-rank table like
    ``static`` ([`ascend_map`][moeopt.dispatch.ascend_map]); without token homes, loads and communication are the exact
    expectation over the G homes. When ``c`` does not divide G the copies get unequal shares
    (``ceil`` or ``floor`` of ``G / c`` ranks each).
``lp``
    SGLang's LP dispatch (LPLB, ``--ep-dispatch-algorithm lp``), as the engine computes it
    ([`lplb_layer_loads`][moeopt.dispatch.lplb_layer_loads]): per batch (trace step, or the pooled
    counts), the LP "split each replicated expert's tokens over its copies to minimize the largest
    GPU load", started at every variable 1 and run for 5 affine-scaling steps in float32 (the
    engine's fused kernel); where its convergence test fails, every copy gets weight 0.5 (an even
    split). The split is interior, not the LP's optimum: loads are at or above
    [`lp_layer_loads`][moeopt.dispatch.lp_layer_loads] (the exact optimum, a lower bound kept for
    planning and bounds). SGLang then draws each token's copy by the split's probabilities,
    independently per (token, expert): communication is that draw's expectation
    (`_expected_comm_draws`: GPU g used with probability ``1 - prod_e (1 - p[e, g])``); the
    per-token GPUs a caller needs (the harness) are a largest-remainder rounding of the split,
    tokens in order.
``locality``
    The online guard of SPEC 4.3 ([`guard_layer`][moeopt.dispatch.guard_layer]), simulated batch by batch; every
    layer's guard in one pass over the batches ([`guard_layers`][moeopt.dispatch.guard_layers]: with the guard's small
    batches, 32 tokens for ``joint``, the Python loop over batches is what costs). It needs
    tokens; on count data it reduces to ``even`` (no token has a preference, and the load
    term spreads each expert evenly in expectation). A research rule: no serving engine runs
    it today.

``static`` and ``ascend`` are *per-rank tables* ([`rank_map`][moeopt.dispatch.rank_map]): each source GPU maps each
expert to one physical slot, so what a token costs depends on where it lives (its home).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from moeopt.errors import InputError
from moeopt.instance import Cluster
from moeopt.plan import Dispatch, Plan
from moeopt.topology import hop_cost_sum, hop_costs
from moeopt.trace import Trace

#: The engine's seed for its fair choice of a copy (SGLang's ``compute_logical_to_rank_dispatch_physical_map``).
STATIC_SEED = 42


# ----------------------------------------------------------------------------- static (SGLang)
#: the last few [`static_map`][moeopt.dispatch.static_map] tables by the plan's contents: a plan is
#: scored several times (choosing its dispatch, then on each workload), each time as another
#: object, and replaying SGLang's seeded streams takes seconds per layer at 256 GPUs
_STATIC_CACHE: OrderedDict[tuple, np.ndarray] = OrderedDict()
_STATIC_CACHE_SIZE = 4  # a table is G x L x E int64: 30 MB at 256 GPUs, 58 layers, 256 experts


def static_map(
    plan: Plan, gpus_per_node: int | None = None, seed: int = STATIC_SEED, dense_layers: int = 0
) -> np.ndarray:
    """int ``[G, L, E]``: the physical slot each source GPU sends each expert's tokens to.

    Re-implements SGLang's static rule (``--ep-dispatch-algorithm static`` with an all-to-all
    backend such as DeepEP, where it is the default) from the engine's code
    (``compute_logical_to_rank_dispatch_physical_map``, SGLang 0.5.23): rank r uses an
    expert's only copy; else the first copy on its own GPU; else the first copy in its node
    when only some copies are there; else a "fair" draw: the ranks left without a near copy
    are dealt the expert's physical slots (each ``k // c`` times plus a sample of the rest,
    shuffled) and r takes its place in that deal. Each rank builds its own table with its own
    ``random.Random(seed)`` stream, consumed only by the experts it has no near copy of, in
    layer-then-expert order, exactly as each engine rank does.

    The engine's map has a row for every hidden layer: ``dense_layers`` rows of the trivial
    layout ``p mod E`` (what [`moeopt.interop.to_sglang`][] writes for a model's dense
    layers) come first and consume draws of each rank's stream before the MoE layers do
    (DeepSeek-V3: 3 rows; at 64 GPUs x 5 slots, 64 experts of each have two copies). Their
    picks are dropped from the result.
    """
    L, G, W = plan.slots.shape
    E = plan.experts
    slots = np.ascontiguousarray(plan.slots, dtype=np.int64)
    key = (hashlib.blake2b(slots.tobytes(), digest_size=16).digest(), slots.shape, E, gpus_per_node, seed, dense_layers)
    hit = _STATIC_CACHE.get(key)
    if hit is not None:
        _STATIC_CACHE.move_to_end(key)
        return hit
    if dense_layers:
        trivial = np.arange(G * W) % E
        rows = np.concatenate([np.tile(trivial, (dense_layers, 1)), slots.reshape(L, G * W)])
    else:
        rows = slots.reshape(L, G * W)
    out = _static_rows(rows, G, W, E, gpus_per_node, seed)[:, dense_layers:]
    out.setflags(write=False)
    _STATIC_CACHE[key] = out
    while len(_STATIC_CACHE) > _STATIC_CACHE_SIZE:
        _STATIC_CACHE.popitem(last=False)
    return out


def _static_rows(rows: np.ndarray, G: int, W: int, E: int, gpus_per_node: int | None, seed: int) -> np.ndarray:
    """[`static_map`][moeopt.dispatch.static_map] of a physical-to-logical map ``rows [layers, G * W]``."""
    L = rows.shape[0]
    out = np.full((G, L, E), -1, dtype=np.int64)
    drawn: list[tuple[int, int, list[int], np.ndarray]] = []  # (l, e, copies, ranks left to draw)
    for l in range(L):
        phys = rows[l]
        order = np.argsort(phys, kind="stable")
        valid = phys[order] >= 0
        order, ids = order[valid], phys[order][valid]
        start = np.searchsorted(ids, np.arange(E + 1))
        for e in range(E):
            cand = order[start[e] : start[e + 1]]  # ascending physical ids
            if len(cand) == 1:
                out[:, l, e] = cand[0]
                continue
            chosen = near_copies(cand, G, W, gpus_per_node)
            out[:, l, e] = chosen
            left = np.nonzero(chosen < 0)[0]
            if len(left):
                drawn.append((l, e, cand.tolist(), left))
    if not drawn:
        return out
    # A rank's stream is consumed only by the items it draws for (it skips those it has a near
    # copy of), and the deal of an item is the same for every rank that draws it: ranks that
    # skip the same items (mostly the ranks of one node) draw the same picks. So each class of
    # such ranks replays its stream once (as every rank of it would), and each rank takes its
    # place in the deal: the same table as one stream per rank, a node's ranks at once.
    item_l = np.array([d[0] for d in drawn])
    item_e = np.array([d[1] for d in drawn])
    skips = out[:, item_l, item_e] >= 0  # [G, items]: this rank's table holds only its near copy
    classes, which = np.unique(skips, axis=0, return_inverse=True)
    for c, skip in enumerate(classes):
        members = np.nonzero(which.reshape(-1) == c)[0]
        rng = random.Random(seed)
        for i, (l, e, slots_of_e, left) in enumerate(drawn):
            if skip[i]:
                continue
            picks = np.asarray(_fair_choices(slots_of_e, len(left), rng))
            out[members, l, e] = picks[np.searchsorted(left, members)]
    return out


def near_copies(cand: np.ndarray, G: int, W: int, gpus_per_node: int | None) -> np.ndarray:
    """int ``[G]``: the physical slot each rank takes of an expert's copies ``cand`` (ascending
    physical ids) before any draw: the first copy on its own GPU, else (``gpus_per_node`` below
    G) the first in its node when only some copies are there; -1 where the rank draws."""
    chosen = np.full(G, -1, dtype=np.int64)
    gs, at = np.unique(cand // W, return_index=True)
    chosen[gs] = cand[at]  # first copy on the rank's own GPU
    if gpus_per_node is not None and gpus_per_node < G:
        node_of = cand // (gpus_per_node * W)
        first_in_node = np.full(G // gpus_per_node, -1, dtype=np.int64)
        ns, at = np.unique(node_of, return_index=True)
        first_in_node[ns] = cand[at]
        per_node = np.bincount(node_of, minlength=G // gpus_per_node)
        rank_node = np.arange(G) // gpus_per_node
        narrower = (per_node[rank_node] > 0) & (per_node[rank_node] < len(cand))
        use_node = (chosen < 0) & narrower
        chosen[use_node] = first_in_node[rank_node[use_node]]
    return chosen


def _fair_choices(items: list[int], k: int, rng: random.Random) -> list[int]:
    """``k`` picks from ``items``: each ``k // n`` times, the remainder sampled, then shuffled."""
    whole, rest = divmod(k, len(items))
    picks = items * whole + rng.sample(items, k=rest)
    if _INLINE_SHUFFLE:
        _shuffle(picks, rng.getrandbits)
    else:
        rng.shuffle(picks)
    return picks


def _shuffle(x: list[int], getrandbits) -> None:  # type: ignore[no-untyped-def]
    """``random.Random.shuffle(x)`` with its bounded draws written out: the same words of the
    stream, the same permutation, no Python call per draw (the static map makes millions of
    them at 256 GPUs). `_INLINE_SHUFFLE` says whether this interpreter's shuffle agrees."""
    for i in range(len(x) - 1, 0, -1):
        n = i + 1
        bits = n.bit_length()
        r = getrandbits(bits)
        while r >= n:  # rejection, as random's _randbelow_with_getrandbits
            r = getrandbits(bits)
        x[i], x[r] = x[r], x[i]


def _shuffle_agrees() -> bool:
    """Whether `_shuffle` draws as this interpreter's ``random.shuffle`` (the stream after, too)."""
    a, b = random.Random(STATIC_SEED), random.Random(STATIC_SEED)
    for n in (1, 2, 3, 5, 17, 64, 257, 1000):
        x, y = list(range(n)), list(range(n))
        a.shuffle(x)
        _shuffle(y, b.getrandbits)
        if x != y:
            return False
    return a.getrandbits(32) == b.getrandbits(32)


#: `_shuffle` is used only where it draws exactly as ``random.shuffle`` (checked once at import)
_INLINE_SHUFFLE = _shuffle_agrees()


@lru_cache(maxsize=8)
def ascend_map(plan: Plan, tp_size: int | None = None) -> np.ndarray:
    """int ``[G, L, E]``: the physical slot vLLM-Ascend's rank r sends expert e's tokens to.

    Re-implements ``generate_log2phy_map`` (vLLM-Ascend 0.23): the copies of ``e`` are its
    devices in rank order, each once (the engine's expert map holds one entry per expert per
    device: a colocated second copy is never used), ``c`` of them; rank ``r`` uses copy
    ``r mod c``, or with ``tp_size > 1`` copy ``(r mod tp + r div tp + e) mod c``. The slot is
    that device's first slot holding ``e`` (the engine numbers a device's distinct experts in
    the order the map lists them; [`moeopt.interop.to_vllm_ascend`][] writes them in slot
    order, so on a plan without colocated copies or empty slots the engine's physical id and
    moeopt's slot ``g * W + w`` are the same number).
    """
    L, G, W = plan.slots.shape
    E = plan.experts
    out = np.empty((G, L, E), dtype=np.int64)
    r = np.arange(G)
    for l in range(L):
        first = np.full((E, G), -1, dtype=np.int64)  # first slot of e on g
        flat = plan.slots[l].reshape(-1)
        pos = np.nonzero(flat >= 0)[0][::-1]  # reversed: the first slot is written last
        first[flat[pos], pos // W] = pos
        held = first >= 0
        c = held.sum(axis=1)  # distinct devices of each expert
        devices = np.argsort(~held, axis=1, kind="stable")  # [E, G]: holding devices first, rank order
        if tp_size is None or tp_size <= 1:
            j = r[:, None] % c[None, :]  # [G, E]
        else:
            j = (r[:, None] % tp_size + r[:, None] // tp_size + np.arange(E)[None, :]) % c[None, :]
        dev = devices[np.arange(E)[None, :], j]
        out[:, l, :] = first[np.arange(E)[None, :], dev]
    out.setflags(write=False)
    return out


#: Rules that map each (source GPU, expert) to one fixed copy: what a token costs depends on its home.
RANK_TABLE_KINDS = ("static", "ascend")


def rank_map(plan: Plan, cluster: Cluster) -> np.ndarray:
    """int ``[G, L, E]``: the physical slot each source GPU sends each expert to, under the
    plan's ``static`` ([`static_map`][moeopt.dispatch.static_map]) or ``ascend``
    ([`ascend_map`][moeopt.dispatch.ascend_map]) rule."""
    d = plan.dispatch
    if d.kind == "static":
        return static_map(plan, cluster.gpus_per_node, STATIC_SEED, d.dense_layers)
    if d.kind == "ascend":
        return ascend_map(plan, d.tp_size)
    raise ValueError(f"dispatch {d.kind!r} has no per-rank table")


def rank_share(plan: Plan, cluster: Cluster) -> np.ndarray:
    """float ``[L, E, G]``: share of an expert's tokens each GPU serves under a per-rank rule
    (``static``, ``ascend``), with token homes uniform over the G source GPUs."""
    return _uniform_home_share(rank_map(plan, cluster) // plan.width, plan.experts)


def static_share(plan: Plan, gpus_per_node: int | None = None) -> np.ndarray:
    """float ``[L, E, G]``: [`rank_share`][moeopt.dispatch.rank_share] of SGLang's static rule, whatever the plan's own
    rule (its ``dense_layers`` when it is ``static``)."""
    dense = plan.dispatch.dense_layers if plan.dispatch.kind == "static" else 0
    return _uniform_home_share(static_map(plan, gpus_per_node, STATIC_SEED, dense) // plan.width, plan.experts)


def _uniform_home_share(dest: np.ndarray, E: int) -> np.ndarray:
    """float ``[L, E, G]`` from destination GPUs ``dest [G_src, L, E]``: the share of each
    expert's tokens each GPU serves when the G source GPUs send equal shares."""
    G, L, _ = dest.shape
    share = np.zeros((L, E, G))
    l_idx = np.broadcast_to(np.arange(L)[None, :, None], dest.shape)
    e_idx = np.broadcast_to(np.arange(E)[None, None, :], dest.shape)
    np.add.at(share, (l_idx.ravel(), e_idx.ravel(), dest.ravel()), 1.0 / G)
    return share


# ----------------------------------------------------------------------------- vllm
#: vLLM's replica hash (``eplb_map_and_record``): Knuth's multiplicative constant, floor(2**32 / phi).
VLLM_HASH = 2654435769


def vllm_copy_index(row: np.ndarray, copies: np.ndarray) -> np.ndarray:
    """The copy vLLM's EPLB routing picks: ``((row * 2654435769) mod 2**32) mod copies``.

    ``row`` is the token's row in its rank's batch, ``copies`` the expert's copy count (both
    broadcast); the copy is an index into the expert's copies in physical-slot order.
    """
    hashed = (np.asarray(row, dtype=np.int64) * VLLM_HASH) & 0xFFFFFFFF
    return np.asarray(hashed % np.asarray(copies, dtype=np.int64))


def physical_copies(plan: Plan, layer: int) -> np.ndarray:
    """int ``[E, C]``: the physical slots of each expert's copies in slot order, -1 padded
    (vLLM's ``logical_to_physical_map``, SGLang's ``logical_to_all_physical_map``)."""
    flat = plan.physical(layer)
    pos = np.nonzero(flat >= 0)[0]
    e = flat[pos]
    order = np.argsort(e, kind="stable")
    e_sorted, slot = e[order], pos[order]
    counts = np.bincount(e_sorted, minlength=plan.experts)
    table = np.full((plan.experts, max(int(counts.max(initial=1)), 1)), -1, dtype=np.int64)
    start = np.searchsorted(e_sorted, np.arange(plan.experts))
    table[e_sorted, np.arange(len(e_sorted)) - start[e_sorted]] = slot
    return table


# ----------------------------------------------------------------------------- even
def even_share(plan: Plan) -> np.ndarray:
    """float ``[L, E, G]``: copies of e on g divided by e's copies (colocated copies count twice)."""
    on = plan.copies_on_gpu.astype(np.float64)
    return np.asarray(on / plan.copy_counts[:, :, None])


# ----------------------------------------------------------------------------- lp
def lp_layer_loads(counts: np.ndarray, holds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best split of one layer's expert counts over the GPUs holding each expert: the optimum
    SGLang's LP dispatch aims at (its engine stops short of it, `lplb_layer_loads`), a lower bound
    on the largest load of any split, and what planners for ``lp`` plan with.

    Parameters
    ----------
    counts
        float ``[T, E]`` tokens per expert in each batch.
    holds
        bool ``[E, G]``: GPUs holding a copy of each expert.

    Returns
    -------
    loads
        float ``[T, G]``: GPU loads of the optimal split (largest load minimized per batch).
    flow
        float ``[T, E, G]``: tokens of e served by g in each batch.
    """
    counts = np.asarray(counts, dtype=np.float64)
    T, E = counts.shape
    G = holds.shape[1]
    single = holds.sum(axis=1) == 1
    home = holds.argmax(axis=1)
    flow = np.zeros((T, E, G))
    flow[:, single, home[single]] = counts[:, single]
    fixed = flow.sum(axis=1)  # [T, G]
    multi = np.nonzero(~single)[0]
    active = counts[:, multi].sum(axis=1) > 0 if len(multi) else np.zeros(T, dtype=bool)
    if not len(multi) or not active.any():
        return fixed, flow
    me, mg = np.nonzero(holds[multi])  # pairs (index into multi, gpu)
    V = len(me)
    ts = np.nonzero(active)[0]
    nT = len(ts)
    # variables: x[t, v] for t in ts, v in pairs (t-major), then z[t]
    nx = nT * V
    t_of = np.repeat(np.arange(nT), V)
    v_of = np.tile(np.arange(V), nT)
    # equality: sum over copies of e = n[t, e]
    eq_rows = t_of * len(multi) + me[v_of]
    A_eq = sp.csr_matrix((np.ones(nx), (eq_rows, np.arange(nx))), shape=(nT * len(multi), nx + nT))
    b_eq = counts[ts][:, multi].reshape(-1)
    # load rows: sum_{v on g} x[t, v] - z[t] <= -fixed[t, g]
    ub_rows = t_of * G + mg[v_of]
    rows = np.concatenate([ub_rows, np.arange(nT * G)])
    cols = np.concatenate([np.arange(nx), nx + np.repeat(np.arange(nT), G)])
    vals = np.concatenate([np.ones(nx), -np.ones(nT * G)])
    A_ub = sp.csr_matrix((vals, (rows, cols)), shape=(nT * G, nx + nT))
    b_ub = -fixed[ts].reshape(-1)
    c = np.concatenate([np.zeros(nx), np.ones(nT)])
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:  # pragma: no cover - a feasible bounded LP by construction
        raise RuntimeError(f"lp dispatch: HiGHS failed ({res.message})")
    x = np.maximum(res.x[:nx].reshape(nT, V), 0.0)
    part = np.zeros((nT, len(multi), G))
    np.add.at(part, (np.repeat(np.arange(nT), V), np.tile(me, nT), np.tile(mg, nT)), x.reshape(-1))
    flow[np.ix_(ts, multi, np.arange(G))] = part
    return flow.sum(axis=1), flow


#: SGLang's LPLB (``sglang/srt/eplb/lplb_solver.py``, kernels ``csrc/lplb/{lp_prep,ipm,lp_post}.cuh``):
#: barrier steps, the objective's weight on the start's infeasibility column, and the kernel's test
LPLB_STEPS = 5
LPLB_BIG_M = 1000.0
LPLB_STEP = 0.999
LPLB_FALLBACK = 0.5
LPLB_CHUNK_BYTES = 32 << 20  # one float32 stack of programs per pass (a DeepSeek-V3 layer: ~1.6 MB a batch)


def lplb_split(counts: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The copy weights SGLang's LP dispatch computes for one layer, batch by batch.

    A re-implementation of SGLang's LPLB (``LPLBSolver`` and its kernels) in float32: the counts
    are normalized by the batch total; the LP's variables are each replicated expert's physical
    copies ``x``, a slack per GPU, the largest load ``M`` and a column that makes the start
    (every variable 1) feasible, weighted 1000 in the objective ``min M``; its rows give each
    replicated expert its tokens and each GPU its load plus slack equal to ``M``. Five
    affine-scaling steps (``x <- x (1 - 0.999 d / max d)``, ``d = x (c - A^T w)``,
    ``(A X^2 A^T) w = A X^2 c``) then run, and the result is kept when ``max d < 0.1``, the
    start's column is in ``[0, 1e-4)`` and ``max |Ax - b| < 0.05``; otherwise every copy gets
    0.5 (the engine's non-convergence value). A copy's probability is its weight over the
    weights of its expert's copies (the dispatch kernel's multinomial).

    Parameters
    ----------
    counts
        float ``[T, E]``: tokens per expert in each batch (the batch's all-reduced counts).
    slots
        int ``[G, W]``: the layer's physical slots (rank-contiguous, as the engine lays them out;
        -1: empty).

    Returns
    -------
    share
        float ``[T, G * W]``: each physical slot's share of its expert's tokens (1 for a single
        copy; 0 for an empty slot).
    converged
        bool ``[T]``: whether the batch passed the kernel's test (else the 0.5 weights).
    """
    counts = np.asarray(counts, dtype=np.float64)
    T = counts.shape[0]
    prog = _LPLBProgram(np.asarray(slots), counts.shape[1])
    share = np.zeros((T, prog.slots))
    share[:, prog.valid] = 1.0
    if not T or not prog.R:
        return share, np.ones(T, dtype=bool)
    converged = np.empty(T, dtype=bool)
    # batches per pass: the stacked programs' float32 copies stay near LPLB_CHUNK_BYTES
    per = max(1, LPLB_CHUNK_BYTES // (4 * (prog.R + prog.G) * (prog.PR + prog.G + 2)))
    for s0 in range(0, T, per):
        part = slice(s0, s0 + per)
        A, b = prog.system(counts[part])
        x, converged[part] = _affine_scaling(A, b)
        prog.shares(x[:, : prog.PR], converged[part], share[part])
    return share, converged


class _LPLBProgram:
    """One layer's LP as SGLang's ``LPLBSolver`` lays it out: rows are the replicated experts (in
    id order) then the GPUs; columns the replicated experts' physical copies (in slot order), a
    slack per GPU, the largest load and the start's feasibility column."""

    def __init__(self, slots: np.ndarray, experts: int) -> None:
        G, W = slots.shape
        self.G, self.W, self.slots = G, W, G * W
        self.phys = slots.reshape(-1)
        self.valid = self.phys >= 0
        self.ncopies = np.bincount(self.phys[self.valid], minlength=experts)
        self.rep_log = np.flatnonzero(self.ncopies > 1)
        self.rep_phy = np.flatnonzero(self.valid & (self.ncopies[np.maximum(self.phys, 0)] > 1))
        self.single_log = np.flatnonzero(self.ncopies == 1)
        self.single_gpu = np.zeros(experts, dtype=np.int64)
        self.single_gpu[self.phys[self.valid]] = np.flatnonzero(self.valid) // W
        self.R, self.PR = R, PR = len(self.rep_log), len(self.rep_phy)
        # SGLang's A_base (its last column, the start's, is set per batch)
        self.A = np.zeros((R + G, PR + G + 2), dtype=np.float32)
        cols = np.arange(PR)
        self.A[np.searchsorted(self.rep_log, self.phys[self.rep_phy]), cols] = 1.0
        self.A[R + self.rep_phy // W, cols] = 1.0
        self.A[R + np.arange(G), PR + np.arange(G)] = 1.0
        self.A[R:, PR + G] = -1.0
        self.row_sums = self.A.sum(axis=1)

    def system(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``A [T, R + G, PR + G + 2]`` and ``b [T, R + G]`` of batches ``counts [T, E]``
        (SGLang's ``A_base`` with the start's column ``b - A_base 1`` appended, and its ``b``: the
        replicated experts' normalized counts, then minus each GPU's single-copy load)."""
        f32, G = np.float32, self.G
        T = counts.shape[0]
        total = np.maximum(counts[:, self.single_log].sum(axis=1) + counts[:, self.rep_log].sum(axis=1), 1.0)
        norm = counts.astype(f32) / total.astype(f32)[:, None]
        fixed = np.zeros((T, G), dtype=f32)
        np.add.at(fixed.T, self.single_gpu[self.single_log], norm[:, self.single_log].T)
        b = np.concatenate([norm[:, self.rep_log], -fixed], axis=1)
        At = np.broadcast_to(self.A, (T, *self.A.shape)).copy()
        At[:, :, -1] = b - self.row_sums[None, :]
        return At, b

    def shares(self, x: np.ndarray, converged: np.ndarray, out: np.ndarray) -> None:
        """Write the copies' shares of their experts' tokens into ``out [T, G * W]`` from the copy
        variables ``x [T, PR]`` (0.5 each where the batch did not converge; clamped at 0; an
        expert whose weights are all 0 is drawn uniformly, as the dispatch kernel does)."""
        T = x.shape[0]
        weight = np.where(converged[:, None], np.maximum(x, 0.0), LPLB_FALLBACK).astype(np.float64)
        e_rep = self.phys[self.rep_phy]
        wsum = np.zeros((T, len(self.ncopies)))
        np.add.at(wsum.T, e_rep, weight.T)
        zero = wsum[:, e_rep] <= 0.0
        out[:, self.rep_phy] = np.where(zero, 1.0 / self.ncopies[e_rep], weight / np.where(zero, 1.0, wsum[:, e_rep]))


def _affine_scaling(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SGLang's ``ipm_solve_kernel`` on a stack of programs ``A [B, nc, nv]``, ``b [B, nc]``
    (columns: the copies, the slacks, the largest load, the start's column): ``LPLB_STEPS``
    affine-scaling steps from every variable 1 in float32, then the kernel's convergence test.
    Returns ``x [B, nv]`` and converged ``[B]``."""
    f32 = np.float32
    B, nc, nv = A.shape
    c = np.zeros(nv, dtype=f32)
    c[nv - 2] = 1.0
    c[nv - 1] = LPLB_BIG_M
    x = np.ones((B, nv), dtype=f32)
    d_max = np.zeros(B, dtype=f32)
    for _ in range(LPLB_STEPS):
        ax2 = A * (x * x)[:, None, :]
        gram = ax2 @ np.swapaxes(A, 1, 2)
        rhs = ax2 @ c
        try:
            w = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0].astype(f32)
        except np.linalg.LinAlgError:  # a singular step: the kernel's result is unusable there
            w = np.stack([_solve_or_nan(gram[t], rhs[t]) for t in range(B)])
        r = (w[:, None, :] @ A)[:, 0, :]
        d = x * (c[None, :] - r)
        d_max = np.maximum(d.max(axis=1), 0.0).astype(f32)
        alpha = np.where(d_max > 1e-9, f32(LPLB_STEP) / np.where(d_max > 1e-9, d_max, 1.0), 1.0).astype(f32)
        x = (x * (1.0 - alpha[:, None] * d)).astype(f32)
    resid = np.abs((A @ x[:, :, None])[:, :, 0] - b).max(axis=1)
    aux = x[:, -1]
    converged = (d_max < 0.1) & (aux >= 0.0) & (aux < 1e-4) & (resid < 0.05) & np.isfinite(x).all(axis=1)
    return x, converged


def _solve_or_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(a, b).astype(np.float32)
    except np.linalg.LinAlgError:
        return np.full(len(b), np.nan, dtype=np.float32)


def _lplb_slot_tokens(counts: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """float ``[T, G * W]``: each physical slot's tokens in each batch under SGLang's LP dispatch
    (its expert's count times the engine's share, [`lplb_split`][moeopt.dispatch.lplb_split]; 0 for
    an empty slot)."""
    phys = np.asarray(slots).reshape(-1)
    share, _ = lplb_split(counts, slots)
    return np.asarray(counts[:, np.maximum(phys, 0)] * share)


def lplb_loads(counts: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """float ``[T, G]``: one layer's GPU loads per batch under SGLang's LP dispatch as the engine
    computes its split (the draw's expectation), without the per-expert flows."""
    counts = np.asarray(counts, dtype=np.float64)
    G, W = slots.shape
    return np.asarray(_lplb_slot_tokens(counts, slots).reshape(counts.shape[0], G, W).sum(axis=2))


def lplb_layer_loads(counts: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One layer's GPU loads ``[T, G]`` ([`lplb_loads`][moeopt.dispatch.lplb_loads]) and flows
    ``[T, E, G]`` under SGLang's LP dispatch as the engine computes its split: each expert's
    tokens in each batch go to its copies in the split's shares (the draw's expectation)."""
    counts = np.asarray(counts, dtype=np.float64)
    T, E = counts.shape
    G, W = slots.shape
    phys = np.asarray(slots).reshape(-1)
    tokens = _lplb_slot_tokens(counts, slots)
    valid = np.flatnonzero(phys >= 0)
    flow = np.zeros((T, E, G))
    np.add.at(flow.transpose(1, 2, 0), (phys[valid], valid // W), tokens[:, valid].T)
    return tokens.reshape(T, G, W).sum(axis=2), flow


# ----------------------------------------------------------------------------- counts
def count_loads(plan: Plan, counts: np.ndarray, cluster: Cluster) -> np.ndarray:
    """float ``[L, ..., G]``: GPU loads of per-expert counts ``[L, ..., E]`` under the plan's dispatch.

    Each leading index after the layer (e.g. a step) is one batch for ``lp``. Without token
    rows or homes, ``vllm`` splits evenly (its hash spreads rows evenly over the copies) and
    ``static`` / ``ascend`` take the expectation over uniform token homes.
    """
    counts = np.asarray(counts, dtype=np.float64)
    kind = plan.dispatch.kind
    if kind in ("even", "locality", "vllm"):
        return np.asarray(np.einsum("l...e,leg->l...g", counts, even_share(plan)))
    if kind in RANK_TABLE_KINDS:
        return np.asarray(np.einsum("l...e,leg->l...g", counts, rank_share(plan, cluster)))
    L, E, G = counts.shape[0], counts.shape[-1], plan.gpus
    flat = counts.reshape(L, -1, E)
    out = np.stack([lplb_loads(flat[l], plan.slots[l]) for l in range(L)])
    return out.reshape(counts.shape[:-1] + (G,))


def count_flows(plan: Plan, counts: np.ndarray, cluster: Cluster) -> np.ndarray:
    """float ``[L, T, E, G]``: tokens of expert e served by GPU g at step t, from ``[L, T, E]``."""
    counts = np.asarray(counts, dtype=np.float64)
    kind = plan.dispatch.kind
    if kind in ("even", "locality", "vllm"):
        return np.asarray(counts[..., None] * even_share(plan)[:, None])
    if kind in RANK_TABLE_KINDS:
        return np.asarray(counts[..., None] * rank_share(plan, cluster)[:, None])
    return np.stack([lplb_layer_loads(counts[l], plan.slots[l])[1] for l in range(plan.layers)])


# ----------------------------------------------------------------------------- traces
@dataclass(frozen=True, eq=False)
class Routing:
    """What a dispatch executes on a token trace.

    Attributes
    ----------
    step_loads
        float ``[L, T, G]``: token-expert assignments served by each GPU at each step.
    gpu
        int ``[tokens, L, k]``: the GPU serving each assignment; None for ``static`` without
        token homes (then it depends on the home, and ``comm`` holds the expectation).
    comm
        optional ``(distinct, remote, weighted)`` float ``[tokens, L]`` already averaged over
        homes (``static`` without token homes); None when computed from ``gpu``.
    nodes
        optional float ``[tokens, L]``: remote nodes per token ([`remote_nodes_of`][moeopt.dispatch.remote_nodes_of]),
        given where ``comm`` is (an expectation, or homes that change with the layer); None when
        computed from ``gpu``.
    """

    step_loads: np.ndarray
    gpu: np.ndarray | None
    comm: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    nodes: np.ndarray | None = None


def _step_counts(ids: np.ndarray, step: np.ndarray, T: int, E: int) -> np.ndarray:
    """float ``[T, E]``: how often each id (an expert, or the GPU that served a slot) occurs per step."""
    key = step[:, None] * E + ids
    return np.bincount(key.ravel(), minlength=T * E).reshape(T, E).astype(np.float64)


def _rank_in_group(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable order of ``key`` and, per element, its rank among equal keys (in token order)."""
    order = np.argsort(key, kind="stable")
    sk = key[order]
    rank_sorted = np.arange(len(sk)) - np.searchsorted(sk, sk)
    rank = np.empty(len(key), dtype=np.int64)
    rank[order] = rank_sorted
    return order, rank


def _assign_by_quota(ids: np.ndarray, step: np.ndarray, E: int, quota: np.ndarray) -> np.ndarray:
    """GPU of each assignment ``[n, k]`` given integer quotas ``[T, E, G]`` that sum to the counts:
    the tokens of (t, e), in token order, fill GPU 0's quota, then GPU 1's, and so on."""
    T, _, G = quota.shape
    key = (step[:, None] * E + ids).ravel()
    _, rank = _rank_in_group(key)
    cum = np.cumsum(quota.reshape(T * E, G), axis=1)  # [T*E, G]
    # GPU = number of cumulative quotas <= rank
    g = (cum[key] <= rank[:, None]).sum(axis=1)
    return np.asarray(g.reshape(ids.shape))


def _integer_quota(flow: np.ndarray) -> np.ndarray:
    """Largest-remainder rounding of ``flow [T, E, G]`` keeping each (t, e) total."""
    base = np.floor(flow + 1e-9)
    total = np.rint(flow.sum(axis=2))
    short = (total - base.sum(axis=2)).astype(np.int64)  # [T, E] >= 0
    frac = flow - base
    order = np.argsort(-frac, axis=2, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(flow.shape[2])[None, None, :], axis=2)
    base += rank < short[:, :, None]
    return base.astype(np.int64)


#: Seed of the uniform layer-0 homes drawn when ``token_home: previous-layer`` meets a trace
#: without homes under a dispatch that needs them (``static``, ``ascend``).
HOME_SEED = 0


def route_trace(plan: Plan, trace: Trace, cluster: Cluster) -> Routing:
    """Run the plan's dispatch on a token trace (see the module docstring for each policy).

    Token homes follow ``cluster.token_home``: ``uniform`` (the trace's ``home`` when it
    records one, else uniform: expectations), ``trace`` (the trace's ``home``, required) or
    ``previous-layer`` (the GPU that served the token's top-1 expert at the previous layer;
    layer 0 as ``uniform``).
    """
    mode = getattr(cluster, "token_home", "uniform")
    if mode == "trace" and trace.home is None:
        raise InputError(None, "cluster.token_home", "'trace' needs a trace with token homes (key 'home')")
    if mode == "previous-layer":
        return _route_previous_layer(plan, trace, cluster)
    L, G, W = plan.slots.shape
    E = plan.experts
    N = trace.tokens
    step = trace.step.astype(np.int64)
    T = int(step.max()) + 1 if N else 1
    step_loads = np.zeros((L, T, G))
    if plan.dispatch.kind in RANK_TABLE_KINDS and trace.home is None:
        share = rank_share(plan, cluster)
        dest = rank_map(plan, cluster) // W  # [G_src, L, E]
        distinct = np.zeros((N, L))
        remote = np.zeros((N, L))
        weighted = np.zeros((N, L))
        nodes = np.zeros((N, L))
        for l in range(L):
            ids = trace.topk[:, l, :].astype(np.int64)
            step_loads[l] = _step_counts(ids, step, T, E) @ share[l]
            d, r, w, n = _expected_comm_static(ids, dest[:, l, :], cluster)
            distinct[:, l], remote[:, l], weighted[:, l], nodes[:, l] = d, r, w, n
        return Routing(step_loads, None, (distinct, remote, weighted), nodes)
    if plan.dispatch.kind == "locality":  # every layer's guard in one pass over the batches
        G = plan.gpus
        gpu = guard_layers(trace.topk.astype(np.int64), step, all_copies(plan), G, plan.dispatch, trace.home)
        for l in range(L):
            step_loads[l] = _step_counts(gpu[:, l, :], step, T, G)
        return Routing(step_loads, gpu)
    gpu = np.empty((N, L, trace.top_k), dtype=np.int64)
    if plan.dispatch.kind == "lp":  # the GPUs of a rounding; communication: the draws' expectation
        comm = [np.zeros((N, L)) for _ in range(4)]
        for l in range(L):
            ids = trace.topk[:, l, :].astype(np.int64)
            gpu[:, l, :], step_loads[l], prob = _lp_layer(plan, l, ids, step, T)
            parts = _expected_comm_draws(ids, step, prob, trace.home, cluster)
            for out, one in zip(comm, parts, strict=True):
                out[:, l] = one
        return Routing(step_loads, gpu, (comm[0], comm[1], comm[2]), comm[3])
    row = batch_rows(trace, plan.dispatch.kind)
    for l in range(L):
        gpu[:, l, :], step_loads[l] = _route_layer(plan, l, trace, cluster, step, row, T, trace.home)
    return Routing(step_loads, gpu)


def batch_rows(trace: Trace, kind: str) -> np.ndarray:
    """int ``[tokens]``: each token's row in its batch: its step, and under ``vllm`` its rank too
    when the trace records homes (each vLLM rank hashes the rows of its own batch)."""
    step = trace.step.astype(np.int64)
    if kind == "vllm" and trace.home is not None:
        G = int(trace.home.max()) + 1 if trace.tokens else 1
        return _rank_in_group(step * G + trace.home.astype(np.int64))[1]
    return _rank_in_group(step)[1]


def all_copies(plan: Plan) -> np.ndarray:
    """int ``[L, E, C]``: [`Plan.copies`][moeopt.plan.Plan.copies] of every layer, -1 padded to the most copies."""
    per = [plan.copies(l) for l in range(plan.layers)]
    C = max(c.shape[1] for c in per)
    out = np.full((plan.layers, plan.experts, C), -1, dtype=np.int64)
    for l, c in enumerate(per):
        out[l, :, : c.shape[1]] = c
    return out


def _route_layer(
    plan: Plan,
    l: int,
    trace: Trace,
    cluster: Cluster,
    step: np.ndarray,
    row: np.ndarray,
    T: int,
    home: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One layer's dispatch: the GPU of every assignment ``[N, k]`` and the loads ``[T, G]``."""
    G, W, E = plan.gpus, plan.width, plan.experts
    kind = plan.dispatch.kind
    ids = trace.topk[:, l, :].astype(np.int64)
    if kind == "even":
        # SGLang's dynamic dispatch (rank-invariant form): a token's row in its batch picks
        # copy row mod c, copies in physical-slot order
        copies = plan.copies(l)
        c = plan.copy_counts[l]
        g = copies[ids, row[:, None] % c[ids]]
        return g, _step_counts(ids, step, T, E) @ even_share(plan)[l]
    if kind == "vllm":
        c = plan.copy_counts[l]
        g = plan.copies(l)[ids, vllm_copy_index(row[:, None], c[ids])]
    elif kind in RANK_TABLE_KINDS:
        assert home is not None
        g = rank_map(plan, cluster)[home[:, None], l, ids] // W
    elif kind == "lp":
        g, loads, _ = _lp_layer(plan, l, ids, step, T)
        return g, loads
    else:  # locality
        g = guard_layer(ids, step, plan.copies(l), G, plan.dispatch, home)
    return g, _step_counts(g, step, T, G)


def _lp_layer(
    plan: Plan, l: int, ids: np.ndarray, step: np.ndarray, T: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``lp`` on one layer: the GPU of every assignment ``[N, k]`` (a largest-remainder rounding
    of the split, tokens in order), the loads ``[T, G]`` and each pair's probabilities ``[T, E, G]``
    (the split's share of the expert's tokens in the batch)."""
    E = plan.experts
    counts = _step_counts(ids, step, T, E)
    loads, flow = lplb_layer_loads(counts, plan.slots[l])
    prob = flow / np.where(counts > 0, counts, 1.0)[:, :, None]
    return _assign_by_quota(ids, step, E, _integer_quota(flow)), loads, prob


def _expected_comm_draws(
    ids: np.ndarray,
    step: np.ndarray,
    prob: np.ndarray,
    home: np.ndarray | None,
    cluster: Cluster,
    chunk: int = 4096,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per token, the expected (distinct GPUs, remote GPUs, weighted remote cost, remote nodes)
    when each of its pairs draws its GPU independently by ``prob [T, E, G]`` (SGLang's ``lp``
    dispatch draws every token's copy by the batch's probabilities): GPU g is used with
    probability ``1 - prod_e (1 - p[e, g])``, node n with ``1 - prod_e (1 - sum_{g in n} p[e, g])``;
    remote, weighted and nodes as [`communication_of`][moeopt.dispatch.communication_of] and
    [`remote_nodes_of`][moeopt.dispatch.remote_nodes_of] count them."""
    G = cluster.gpus
    gpn = node_size(cluster)
    cost = hop_costs(cluster)
    N = len(ids)
    out = [np.zeros(N) for _ in range(4)]
    for s in range(0, N, chunk):
        p = prob[step[s : s + chunk, None], ids[s : s + chunk]]  # [n, k, G]
        used = 1.0 - np.prod(1.0 - p, axis=1)  # [n, G]
        q = p.reshape(p.shape[0], p.shape[1], G // gpn, gpn).sum(axis=3)  # [n, k, nodes]
        used_node = 1.0 - np.prod(1.0 - np.minimum(q, 1.0), axis=1)  # [n, nodes]
        distinct = used.sum(axis=1)
        if home is None:
            remote = distinct * (1.0 - 1.0 / G)
            weighted = distinct * hop_cost_sum(cluster) / G
            nodes = used_node.sum(axis=1) * (1.0 - gpn / G)
        else:
            h = home[s : s + chunk]
            remote = distinct - used[np.arange(len(h)), h]
            weighted = (cost[h] * used).sum(axis=1)
            nodes = used_node.sum(axis=1) - used_node[np.arange(len(h)), h // gpn]
        for o, v in zip(out, (distinct, remote, weighted, nodes), strict=True):
            o[s : s + chunk] = v
    return out[0], out[1], out[2], out[3]


def _route_previous_layer(plan: Plan, trace: Trace, cluster: Cluster) -> Routing:
    """Routing with each token's home at layer l the GPU that served its top-1 expert at l - 1."""
    L, G, _ = plan.slots.shape
    N, k = trace.tokens, trace.top_k
    step = trace.step.astype(np.int64)
    T = int(step.max()) + 1 if N else 1
    row = batch_rows(trace, plan.dispatch.kind)
    home = trace.home
    if home is None and plan.dispatch.kind in RANK_TABLE_KINDS:  # the copy a token uses depends on its home
        home = np.random.default_rng(HOME_SEED).integers(0, G, size=N)
    gpu = np.empty((N, L, k), dtype=np.int64)
    step_loads = np.zeros((L, T, G))
    comm = [np.zeros((N, L)) for _ in range(4)]
    for l in range(L):
        if plan.dispatch.kind == "lp":  # each pair drawn by the split: the expectation
            ids = trace.topk[:, l, :].astype(np.int64)
            gpu[:, l, :], step_loads[l], prob = _lp_layer(plan, l, ids, step, T)
            parts = _expected_comm_draws(ids, step, prob, home, cluster)
            for out, one in zip(comm, parts, strict=True):
                out[:, l] = one
        else:
            gpu[:, l, :], step_loads[l] = _route_layer(plan, l, trace, cluster, step, row, T, home)
            one = gpu[:, l : l + 1, :]
            many = (*communication_of(one, cluster, home), remote_nodes_of(one, cluster, home))
            for out, part in zip(comm, many, strict=True):
                out[:, l] = part[:, 0]
        home = gpu[:, l, 0]  # the token now lives where its top-1 expert ran
    return Routing(step_loads, gpu, (comm[0], comm[1], comm[2]), comm[3])


def communication_of(
    gpu: np.ndarray, cluster: Cluster, token_home: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per token and layer: distinct GPUs, remote GPUs, topology-weighted remote cost.

    With unknown token homes (drawn uniformly) the remote values are expectations:
    ``|GPUs(topk)| (1 - 1/G)`` and, per distinct GPU, the mean hop cost to it (two-level
    default: ``((gpn - 1) + (G - gpn) w) / G``); hop costs come from `moeopt.topology`.
    """
    G = cluster.gpus
    s = np.sort(gpu, axis=-1)
    first = np.ones(s.shape, dtype=bool)
    first[..., 1:] = s[..., 1:] != s[..., :-1]
    distinct = first.sum(axis=-1)
    if token_home is None:
        remote = distinct * (1.0 - 1.0 / G)
        weighted = distinct * hop_cost_sum(cluster) / G
    else:
        h = token_home[:, None, None]
        on_home = s == h
        remote = distinct - (first & on_home).sum(axis=-1)
        weighted = (hop_costs(cluster)[h, s] * first).sum(axis=-1)
    return distinct, remote.astype(np.float64), weighted.astype(np.float64)


def node_size(cluster: Cluster) -> int:
    """GPUs per node (``cluster.gpus_per_node``, at most G): the node of GPU g is ``g // node_size``."""
    return max(1, min(int(cluster.gpus_per_node), int(cluster.gpus)))


def remote_nodes_of(gpu: np.ndarray, cluster: Cluster, token_home: np.ndarray | None = None) -> np.ndarray:
    """Remote nodes per token and layer: the distinct nodes of the GPUs its experts run on
    (``gpu [tokens, L, k]``), minus its home node when one of them is.

    A node is ``cluster.gpus_per_node`` consecutive GPUs ([`node_size`][moeopt.dispatch.node_size]). With unknown token
    homes (drawn uniformly over the GPUs, so the home node uniformly over the ``G / gpn``
    nodes) the value is the expectation ``|nodes(topk)| (1 - gpn / G)``, as
    [`communication_of`][moeopt.dispatch.communication_of] takes it for GPUs.

    Parameters
    ----------
    gpu
        int ``[tokens, L, k]``: the GPU serving each (token, layer, expert).
    cluster
        The cluster (its ``gpus`` and ``gpus_per_node``).
    token_home
        optional int ``[tokens]``: the GPU each token lives on.

    Returns
    -------
    numpy.ndarray
        float ``[tokens, L]``.
    """
    G = cluster.gpus
    gpn = node_size(cluster)
    node = np.sort(np.asarray(gpu) // gpn, axis=-1)
    first = np.ones(node.shape, dtype=bool)
    first[..., 1:] = node[..., 1:] != node[..., :-1]
    distinct = first.sum(axis=-1)
    if token_home is None:
        return np.asarray(distinct * (1.0 - gpn / G), dtype=np.float64)
    at_home = first & (node == (np.asarray(token_home) // gpn)[:, None, None])
    return np.asarray(distinct - at_home.sum(axis=-1), dtype=np.float64)


def _expected_comm_static(
    ids: np.ndarray, dest: np.ndarray, cluster: Cluster, chunk: int = 1 << 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per token, the expectation over a uniform home h of (distinct GPUs, remote GPUs,
    weighted remote cost, remote nodes) when source GPU h sends expert e to ``dest[h, e]``.

    By linearity over GPUs: GPU g is used from the homes ``H(t, g) = U_e {h : dest[h, e] = g}``
    (e over the token's experts), so the expected distinct GPUs are ``sum_g |H(t, g)| / G``, the
    home GPU's share ``sum_g [g in H(t, g)] / G``, the weighted cost ``sum_g sum_{h in H(t, g)}
    cost[h, g] / G``, and the same with nodes for the remote nodes. The sets are bit masks over
    the homes, one per (expert, destination) pair, OR-ed per (token, GPU): the work grows with
    the tokens' copies, not with G times the tokens (at 256 GPUs, about 100x less than
    routing every token from every home)."""
    G = cluster.gpus
    gpn = node_size(cluster)
    E = dest.shape[1]
    nw = (G + 63) // 64
    # the homes sending each expert to each of its destinations: one mask per (e, g) pair
    key = (np.arange(E)[None, :] * G + dest).ravel()
    h_of = np.repeat(np.arange(G), E)
    pair, inv = np.unique(key, return_inverse=True)
    masks = np.zeros((len(pair), nw), dtype=np.uint64)
    np.bitwise_or.at(masks, (inv, h_of // 64), np.left_shift(np.uint64(1), (h_of % 64).astype(np.uint64)))
    pair_g = pair % G
    start = np.searchsorted(pair // G, np.arange(E + 1))
    # per GPU g: the homes at each hop-cost level from it, and the homes in its node
    cost_of = hop_costs(cluster)
    weights = [float(w) for w in np.unique(cost_of) if w > 0]
    level_masks = np.stack([_home_masks(cost_of == w) for w in weights]) if weights else np.zeros((0, G, nw), np.uint64)
    node_masks = _home_masks(np.equal.outer(np.arange(G) // gpn, np.arange(G) // gpn))  # [G, nw]
    N, k = ids.shape
    out = [np.zeros(N) for _ in range(4)]
    for s in range(0, N, chunk):
        part = ids[s : s + chunk]
        n = len(part)
        count = (start[part + 1] - start[part]).ravel()  # pairs of each (token, expert)
        tok = np.repeat(np.repeat(np.arange(n), k), count)
        first = np.repeat(start[part].ravel(), count)
        p = first + np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count)
        g = pair_g[p]
        used, t_used, g_used = _or_groups(tok * G + g, masks[p])  # [U, nw] per (token, GPU)
        t_used, g_used = t_used // G, g_used % G
        pop = popcount64(used).sum(axis=1)
        at_home = (used[np.arange(len(used)), g_used // 64] >> (g_used % 64).astype(np.uint64)) & np.uint64(1)
        cost = np.zeros(len(used))
        for w, lm in zip(weights, level_masks, strict=True):
            cost += w * popcount64(used & lm[g_used]).sum(axis=1)
        nodes, t_node, n_node = _or_groups(t_used * G + (g_used // gpn) * gpn, used)
        t_node, n_node = t_node // G, n_node % G
        node_pop = popcount64(nodes).sum(axis=1) - popcount64(nodes & node_masks[n_node]).sum(axis=1)
        values = (pop, pop - at_home.astype(np.float64), cost, node_pop)
        for o, t_of, v in zip(out, (t_used, t_used, t_used, t_node), values, strict=True):
            o[s : s + n] = np.bincount(t_of, weights=v, minlength=n) / G
    return out[0], out[1], out[2], out[3]


def _home_masks(member: np.ndarray) -> np.ndarray:
    """uint64 ``[G, ceil(G / 64)]``: row g's bit h set where ``member[h, g]``."""
    G = member.shape[0]
    nw = (G + 63) // 64
    bits = np.zeros((G, nw * 64), dtype=np.uint8)
    bits[:, :G] = np.asarray(member, dtype=bool).T
    packed = np.packbits(bits.reshape(G, nw, 8, 8)[:, :, :, ::-1], axis=-1)  # little-endian bytes
    return np.ascontiguousarray(packed.reshape(G, nw, 8)).view(np.uint64).reshape(G, nw)


def _or_groups(key: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The OR of ``masks`` rows per distinct ``key``: ``(or [U, nw], key, key)`` (keys ascending)."""
    order = np.argsort(key, kind="stable")
    k = key[order]
    head = np.ones(len(k), dtype=bool)
    head[1:] = k[1:] != k[:-1]
    at = np.nonzero(head)[0]
    if not len(at):
        return np.zeros((0, masks.shape[1]), dtype=np.uint64), k[at], k[at]
    return np.bitwise_or.reduceat(masks[order], at, axis=0), k[at], k[at]


_BYTE_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount64(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (int64)."""
    if hasattr(np, "bitwise_count"):
        return np.asarray(np.bitwise_count(x), dtype=np.int64)
    b = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (8,))  # pragma: no cover - numpy < 2
    return np.asarray(_BYTE_POP[b].sum(axis=-1, dtype=np.int64))  # pragma: no cover


# ----------------------------------------------------------------------------- locality (guard)
def guard_layer(
    topk: np.ndarray,
    step: np.ndarray,
    copies: np.ndarray,
    gpus: int,
    guard: Dispatch,
    token_home: np.ndarray | None = None,
) -> np.ndarray:
    """GPU executing each token-slot ``[tokens, k]`` of one layer under the online guard.

    For a token needing a replicated expert e the guard picks, among the GPUs holding e, the
    one maximizing ``locality(g) - lam * Lhat_g / mean(Lhat)`` (SPEC 4.3). ``locality(g)``
    counts the token's other top-k experts already on g, plus 1 when g is the token's home.
    An expert with a single copy is served by that copy; the replicated experts of a token
    are decided one top-k position after another, so each decision sees where the earlier
    ones went, and an expert still to be decided counts on every GPU holding a copy of it.
    (Counting other experts by their *first* copy instead would send two replicated experts
    that share a token to two different GPUs, each chasing the other's first copy.) Within a
    batch the decisions are vectorized over tokens and share the same ``Lhat``; ``Lhat`` is
    updated after it.

    Parameters
    ----------
    topk
        int ``[tokens, k]`` experts chosen by the (unchanged) router.
    step
        int ``[tokens]`` batch ids; the decayed load Lhat is updated after each batch.
    copies
        int ``[E, C]`` GPUs holding each expert, first copy first, -1 padded (``Plan.copies``).
    gpus
        G.
    guard
        λ (``lam``), δ (``decay``) and the batch size (``batch_tokens``): a
        [`Dispatch`][moeopt.plan.Dispatch].
    token_home
        optional int ``[tokens]`` GPU each token lives on.

    Returns
    -------
    numpy.ndarray
        int ``[tokens, k]``: a GPU holding each chosen expert.
    """
    return guard_layers(topk[:, None, :], step, copies[None], gpus, guard, token_home)[:, 0, :]


def guard_layers(
    topk: np.ndarray,
    step: np.ndarray,
    copies: np.ndarray,
    gpus: int,
    guard: Dispatch,
    token_home: np.ndarray | None = None,
) -> np.ndarray:
    """[`guard_layer`][moeopt.dispatch.guard_layer] for several layers at once: the same decisions, layer by layer.

    The layers' guards are independent (each has its own ``Lhat``) but share the batches (the
    tokens' steps), so one pass over the batches decides every layer's token-slots of a batch
    together: the Python loop runs over batches and top-k positions, not over layers (a
    26-layer trace of 200,000 tokens in batches of 32 tokens: 26x fewer rounds).

    Parameters
    ----------
    topk
        int ``[tokens, L, k]``.
    step
        int ``[tokens]`` batch ids.
    copies
        int ``[L, E, C]`` GPUs holding each expert per layer, first copy first, -1 padded.
    gpus, guard, token_home
        As in [`guard_layer`][moeopt.dispatch.guard_layer] (``token_home`` is the same for every layer).

    Returns
    -------
    numpy.ndarray
        int ``[tokens, L, k]``.
    """
    N, L, k = topk.shape
    E, C = copies.shape[1], copies.shape[2]
    # one id per (layer, expert): every lookup below is a 2-D gather, as for one layer
    flat = topk + (np.arange(L) * E)[None, :, None]  # [N, L, k]
    cps = copies.reshape(L * E, C)
    base: np.ndarray = cps[flat, 0]
    if C == 1 or not N:
        return base
    chosen: np.ndarray = base.copy()
    replicated: np.ndarray = np.asarray((cps[:, 1:] >= 0).any(axis=1))
    needs_choice = replicated[flat]  # [N, L, k]
    holds = np.zeros((L * E, gpus), dtype=bool)
    f_idx, w_idx = np.nonzero(cps >= 0)
    holds[f_idx, cps[f_idx, w_idx]] = True
    lhat = np.zeros((L, gpus))
    order = np.argsort(step, kind="stable")
    batch = step[order].astype(np.int64)
    if guard.batch_tokens is not None:  # split each step into batches of batch_tokens tokens
        rank = np.arange(len(batch)) - np.searchsorted(batch, batch)
        per_step = -(-np.bincount(batch).max() // guard.batch_tokens)
        batch = batch * per_step + rank // guard.batch_tokens
    bounds = np.searchsorted(batch, np.arange(batch.max() + 2))
    layer_key = (np.arange(L) * gpus)[None, :, None]
    for b in range(len(bounds) - 1):
        idx = order[bounds[b] : bounds[b + 1]]
        if not len(idx):
            continue
        mean = lhat.mean(axis=1, keepdims=True)
        pressure = np.divide(lhat, mean, out=np.zeros_like(lhat), where=mean > 0).ravel()  # [L * G]
        # the batch's token-slots as rows (token, layer) of [n L, k] arrays: one-index gathers
        ids = flat[idx].reshape(-1, k)
        gpu = chosen[idx].reshape(-1, k)
        pending = needs_choice[idx].reshape(-1, k)  # a copy: cleared as decisions are made
        for j in range(k):
            rows = np.nonzero(pending[:, j])[0]
            if not len(rows):
                continue
            pending[rows, j] = False
            own = ids[rows]  # [m, k] the token's experts at that layer
            cand = cps[own[:, j]]  # [m, C]
            valid = cand >= 0
            cand0 = np.maximum(cand, 0)
            executes_on = gpu[rows][:, None, :] == cand[:, :, None]  # [m, C, k]
            has_copy = holds[own[:, None, :], cand0[:, :, None]]
            on_g = np.where(pending[rows][:, None, :], has_copy, executes_on)
            on_g[:, :, j] = False
            locality = on_g.sum(axis=2)
            if token_home is not None:
                locality = locality + (cand == token_home[idx[rows // L]][:, None])
            score = np.where(valid, locality - guard.lam * pressure[((rows % L) * gpus)[:, None] + cand0], -np.inf)
            gpu[rows, j] = cand[np.arange(len(rows)), score.argmax(axis=1)]
        chosen[idx] = gpu.reshape(-1, L, k)
        load = np.bincount((layer_key + chosen[idx]).ravel(), minlength=L * gpus).reshape(L, gpus)
        lhat = guard.decay * lhat + (1.0 - guard.decay) * load
    return chosen
