"""Hypothesis strategies: small random clusters, traces and feasible plan/2 plans."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from moeopt.instance import Cluster
from moeopt.plan import DISPATCH_KINDS, Dispatch, Plan
from moeopt.trace import Trace


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
    """(cluster, trace, plan) with E <= max_experts, G <= max_gpus, a feasible random plan.

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
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    topk = np.argsort(rng.random((N, L, E)), axis=2)[:, :, :k].astype(np.int16)
    trace = Trace(
        topk=topk,
        family=rng.integers(0, 2, N).astype(np.int32),
        step=np.sort(rng.integers(0, T, N)).astype(np.int32),
        family_names=("a", "b"),
        num_experts=E,
    )
    cluster = Cluster(
        gpus=G, gpus_per_node=gpn, slots_per_gpu=slots, replica_slots_per_gpu=rslots, allow_colocated_copies=colocated
    )
    fill = rng.random() if replicas else 0.0
    layout = random_slots(E, G, slots + rslots, L, rng, fill=fill, colocated=colocated)
    return cluster, trace, Plan(slots=layout, experts=E, dispatch=Dispatch(kind=kind))
