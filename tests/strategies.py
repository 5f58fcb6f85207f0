"""Hypothesis strategies: small random clusters, traces, feasible plan/2 plans, groupings and
profiles, every number drawn by hypothesis itself (no seed + numpy), so failures shrink."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from moeopt.grouping import Grouping
from moeopt.instance import Cluster
from moeopt.plan import DISPATCH_KINDS, Dispatch, Plan
from moeopt.profile import Profile
from moeopt.trace import Trace
from tests.conftest import BASE_EXAMPLES


def random_slots(
    E: int, G: int, W: int, L: int, rng: np.random.Generator, *, fill: float = 0.0, colocated: bool = False
) -> np.ndarray:
    """int ``[L, G, W]``: every expert once in a random slot, then a share ``fill`` of the
    free slots holding extra copies (on GPUs without that expert unless ``colocated``)."""
    slots = np.full((L, G, W), -1, dtype=np.int64)
    for l in range(L):
        flat = slots[l].reshape(-1)
        flat[rng.permutation(G * W)[:E]] = rng.permutation(E)
        for p in np.nonzero(flat < 0)[0]:
            if rng.random() >= fill:
                continue
            g = p // W
            present = set(flat[g * W : (g + 1) * W].tolist())
            options = [e for e in range(E) if colocated or e not in present]
            if options:
                flat[p] = int(rng.choice(options))
    return slots


def examples(n: int) -> int:
    """A test's own ``max_examples`` ``n`` scaled like the loaded profile (n in the default
    profile, 3n under ``HYPOTHESIS_PROFILE=explore``)."""
    return max(1, round(n * settings().max_examples / BASE_EXAMPLES))


def int_arrays(shape: int | tuple[int, ...], lo: int, hi: int, dtype: type = np.int64) -> st.SearchStrategy[np.ndarray]:
    """Integer arrays with every element drawn in ``[lo, hi]`` (no constant fill, so no hidden ties)."""
    return arrays(dtype, shape, elements=st.integers(lo, hi), fill=st.nothing())


def float_arrays(shape: int | tuple[int, ...], lo: float, hi: float) -> st.SearchStrategy[np.ndarray]:
    """Float arrays with every element drawn in ``[lo, hi]`` (finite, no subnormals)."""
    return arrays(
        np.float64, shape, elements=st.floats(lo, hi, allow_subnormal=False, allow_nan=False), fill=st.nothing()
    )


def distinct_rows(codes: np.ndarray, E: int) -> np.ndarray:
    """Decode ``codes[..., k]`` into k distinct experts per row: code j picks the
    (code mod (E - j))-th expert not chosen yet, so all-zero codes give 0, 1, ..., k - 1."""
    out = np.empty(codes.shape, dtype=np.int64)
    free = np.ones((*codes.shape[:-1], E), dtype=bool)
    for j in range(codes.shape[-1]):
        rank = codes[..., j] % (E - j)
        pick = np.argmax(free & (np.cumsum(free, axis=-1) == rank[..., None] + 1), axis=-1)
        out[..., j] = pick
        np.put_along_axis(free, pick[..., None], False, axis=-1)
    return out


def topk_arrays(shape: tuple[int, ...], E: int, k: int) -> st.SearchStrategy[np.ndarray]:
    """int16 ``[*shape, k]``: k distinct experts out of E per row (a token's routed experts)."""
    return int_arrays((*shape, k), 0, E - 1).map(lambda c: distinct_rows(c, E).astype(np.int16))


@st.composite
def slot_layouts(
    draw: st.DrawFn, E: int, G: int, W: int, L: int, *, fill: bool | None = False, colocated: bool = False
) -> np.ndarray:
    """int ``[L, G, W]``: every expert once in a drawn slot, then extra copies in the free slots
    (on GPUs without that expert unless ``colocated``): none (``fill=False``), wherever one fits
    (``True``), or ``None``: per layer none, all or a drawn subset."""
    slots = np.full((L, G, W), -1, dtype=np.int64)
    for l in range(L):
        flat = slots[l].reshape(-1)
        flat[draw(st.permutations(range(G * W)))[:E]] = draw(st.permutations(range(E)))
        mode = (
            ("none", "all", "some")[int(fill)] if fill is not None else draw(st.sampled_from(("none", "all", "some")))
        )
        if mode == "none":
            continue
        for p in np.nonzero(flat < 0)[0]:
            if mode == "some" and not draw(st.booleans()):
                continue
            g = p // W
            present = set(flat[g * W : (g + 1) * W].tolist())
            options = [e for e in range(E) if colocated or e not in present]
            if options:
                flat[p] = options[draw(st.integers(0, len(options) - 1))]
    return slots


@st.composite
def small_case(
    draw,
    max_experts: int = 12,
    max_gpus: int = 6,
    max_layers: int = 2,
    replicas: bool = False,
    colocated: bool = False,
    dispatch: str | None = "even",
):
    """(cluster, trace, plan) with E <= max_experts, G <= max_gpus, a feasible drawn plan.

    ``dispatch=None`` draws the plan's dispatch kind too.
    """
    E = draw(st.integers(2, max_experts))
    G = draw(st.integers(1, min(max_gpus, E)))
    k = draw(st.integers(1, min(E, 4)))
    L = draw(st.integers(1, max_layers))
    N = draw(st.integers(1, 60))
    T = draw(st.integers(1, 4))
    gpn = draw(st.sampled_from([d for d in range(1, G + 1) if G % d == 0]))
    slots = math.ceil(E / G) + draw(st.integers(0, 1))
    rslots = draw(st.integers(0, 2)) if replicas else 0
    kind = draw(st.sampled_from(DISPATCH_KINDS)) if dispatch is None else dispatch
    trace = Trace(
        topk=draw(topk_arrays((N, L), E, k)),
        family=draw(int_arrays(N, 0, 1, np.int32)),
        step=np.sort(draw(int_arrays(N, 0, T - 1, np.int32))),
        family_names=("a", "b"),
        num_experts=E,
    )
    cluster = Cluster(
        gpus=G, gpus_per_node=gpn, slots_per_gpu=slots, replica_slots_per_gpu=rslots, allow_colocated_copies=colocated
    )
    layout = draw(slot_layouts(E, G, slots + rslots, L, fill=None if replicas else False, colocated=colocated))
    return cluster, trace, Plan(slots=layout, experts=E, dispatch=Dispatch(kind=kind))


def symmetric_graphs(E: int) -> st.SearchStrategy[np.ndarray]:
    """``[E, E]`` symmetric, non-negative, zero diagonal; about half the pairs absent."""
    sparse = st.one_of(st.just(0.0), st.floats(0.0, 1.0, allow_subnormal=False))
    return arrays(np.float64, (E, E), elements=sparse, fill=st.nothing()).map(lambda W: np.triu(W, 1) + np.triu(W, 1).T)


@st.composite
def groupings(
    draw: st.DrawFn,
    min_experts: int = 2,
    max_experts: int = 8,
    min_groups: int = 1,
    max_groups: int = 4,
    limited: bool | None = None,
    spare: int = 2,
) -> Grouping:
    """A tiny grouping: W and w drawn as arrays, G and cap with E <= G cap (``cap`` at most
    ``spare`` above ceil(E / G)), a load limit when ``limited`` (drawn when None)."""
    E = draw(st.integers(min_experts, max_experts))
    W = np.triu(draw(symmetric_graphs(E)), 1)
    load = draw(float_arrays(E, 0.01, 1.0))
    load = load / load.sum()
    G = draw(st.integers(min_groups, min(max_groups, E)))
    cap = draw(st.integers(math.ceil(E / G), math.ceil(E / G) + spare))
    g = Grouping(W + W.T, load=load, groups=G, cap=cap)
    if draw(st.booleans()) if limited is None else limited:
        g = g.replace(load_limit=g.min_max_load() * draw(st.floats(1.0, 1.5)))
    return g


@st.composite
def full_groupings(draw: st.DrawFn, max_experts: int = 9, limited: bool | None = None) -> Grouping:
    """A tiny grouping whose plans fill every group: E = G cap (G >= 2 and cap >= 2), with a load
    limit when ``limited`` (drawn when None)."""
    E = draw(st.sampled_from([e for e in (4, 6, 8, 9) if e <= max_experts]))
    G = draw(st.sampled_from([d for d in range(2, E) if E % d == 0]))
    W = np.triu(draw(symmetric_graphs(E)), 1)
    load = draw(float_arrays(E, 0.01, 1.0))
    g = Grouping(W + W.T, load=load / load.sum(), groups=G, cap=E // G)
    if draw(st.booleans()) if limited is None else limited:
        g = g.replace(load_limit=g.min_max_load() * draw(st.floats(1.0, 1.5)))
    return g


@st.composite
def labelled_groupings(draw: st.DrawFn, max_experts: int = 8) -> Grouping:
    """A tiny grouping with heavy experts: 2 to G of them weigh more than half the load limit
    (no two on one GPU), the others little; E = G cap (every group full) or not, drawn."""
    G = draw(st.integers(2, 3))
    E = draw(st.integers(G + 1, max_experts))
    k = draw(st.integers(2, G))
    cap = draw(st.sampled_from(sorted({math.ceil(E / G), math.ceil(E / G) + 1})))
    W = np.triu(draw(symmetric_graphs(E)), 1)
    heavy = draw(float_arrays(k, 0.8, 1.0))
    light = draw(float_arrays(E - k, 0.01, 0.2))
    limit = draw(st.floats(1.0, 1.5))  # two heavy ones exceed it, each fits
    load = np.concatenate([heavy, light])
    order = draw(st.permutations(list(range(E))))
    load = load[np.asarray(order)]
    return Grouping(W + W.T, load=load / load.sum(), groups=G, cap=cap, load_limit=limit / load.sum())


@st.composite
def stepped_profiles(draw: st.DrawFn, gpus: int, tiles: int, tile: int = 16) -> Profile:
    """A general monotone (non-affine) step profile: drawn non-negative increments per GPU."""
    steps = draw(arrays(np.float64, (gpus, tiles), elements=st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0])))
    scale = draw(float_arrays((gpus, 1), 0.5, 1.5))
    base = draw(float_arrays((gpus, 1), 0.1, 0.5))
    return Profile(tile=tile, latency=np.concatenate([base, base + np.cumsum(steps * scale, axis=1)], axis=1))


@st.composite
def engine_plans(
    draw: st.DrawFn, max_experts: int = 12, max_gpus: int = 8, max_layers: int = 3
) -> tuple[Plan, int, int]:
    """``(plan, gpus_per_node, dense_layers)``: a plan with every slot filled (as SGLang's map
    needs), extra copies colocated or not (drawn), GPUs in nodes of a drawn divisor of G, and
    0 to 2 dense rows before its MoE layers."""
    E = draw(st.integers(2, max_experts))
    G = draw(st.integers(1, min(max_gpus, E)))
    L = draw(st.integers(1, max_layers))
    colocated = draw(st.booleans())
    lo = math.ceil(E / G)
    W = draw(st.integers(lo, lo + 2) if colocated else st.integers(lo, max(lo, min(E, lo + 2))))
    gpn = draw(st.sampled_from([d for d in range(1, G + 1) if G % d == 0]))
    slots = draw(slot_layouts(E, G, W, L, fill=True, colocated=colocated))
    return Plan(slots=slots, experts=E), gpn, draw(st.integers(0, 2))
