"""Hypothesis strategies: small random clusters, traces and feasible plans."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from moeopt.instance import Cluster
from moeopt.methods.baselines import random_homes
from moeopt.plan import Plan
from moeopt.trace import Trace


@st.composite
def small_case(draw, max_experts: int = 12, max_gpus: int = 6, max_layers: int = 2, replicas: bool = False):
    """(cluster, trace, plan) with E <= max_experts, G <= max_gpus, a feasible random plan."""
    E = draw(st.integers(2, max_experts))
    G = draw(st.integers(1, min(max_gpus, E)))
    k = draw(st.integers(1, min(E, 4)))
    L = draw(st.integers(1, max_layers))
    N = draw(st.integers(1, 60))
    T = draw(st.integers(1, 4))
    gpn = draw(st.sampled_from([d for d in range(1, G + 1) if G % d == 0]))
    slots = math.ceil(E / G) + draw(st.integers(0, 1))
    rslots = draw(st.integers(0, 2)) if replicas else 0
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
    cluster = Cluster(gpus=G, gpus_per_node=gpn, slots_per_gpu=slots, replica_slots_per_gpu=rslots)
    home = np.stack([random_homes(E, G, slots, rng) for _ in range(L)])
    reps = []
    for l in range(L):
        rows = []
        free = np.full(G, rslots)
        for e in rng.permutation(E)[: rng.integers(0, E + 1)]:
            options = [g for g in range(G) if free[g] > 0 and g != home[l, e]]
            if options:
                g = int(rng.choice(options))
                rows.append((int(e), g))
                free[g] -= 1
        reps.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
    return cluster, trace, Plan(home=home, replicas=tuple(reps))
