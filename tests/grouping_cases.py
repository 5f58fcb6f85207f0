"""Tiny grouping problems, their brute-force optima, and small synthetic TACG problems."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from moeopt.grouping import LOAD_TOL, Grouping
from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
from moeopt.registry import Context, Problem, get_method, parse_params
from moeopt.result import Result
from moeopt.synth import SynthSpec, synthesize


def set_partitions(n: int, blocks: int) -> Iterator[list[int]]:
    """Restricted growth strings of length n with at most ``blocks`` blocks (one per partition)."""
    label = [0] * n

    def rec(i: int, used: int) -> Iterator[list[int]]:
        if i == n:
            yield label
            return
        for b in range(min(used + 1, blocks)):
            label[i] = b
            yield from rec(i + 1, max(used, b + 1))

    yield from rec(1, 1) if n else iter([label])


def brute_force(g: Grouping) -> tuple[np.ndarray | None, float]:
    """The optimal feasible plan and value by enumerating every set partition (E <= 10)."""
    assert g.experts <= 10, "brute force is for tiny instances"
    homes = np.array(list(map(list, set_partitions(g.experts, g.groups))), dtype=np.int64)
    same = homes[:, :, None] == homes[:, None, :]
    values = np.triu(same * g.graph[None], k=1).sum(axis=(1, 2))
    sizes = np.stack([(homes == b).sum(axis=1) for b in range(g.groups)], axis=1)
    loads = np.stack([((homes == b) * g.load[None]).sum(axis=1) for b in range(g.groups)], axis=1)
    ok = (sizes <= g.cap).all(axis=1) & (loads <= g.load_limit + LOAD_TOL).all(axis=1)
    if not ok.any():
        return None, -math.inf
    values = np.where(ok, values, -np.inf)
    i = int(np.argmax(values))
    return homes[i], float(values[i])


def random_grouping(
    rng: np.random.Generator,
    E: int = 8,
    G: int = 3,
    cap: int | None = None,
    limited: bool = True,
    density: float = 0.7,
) -> Grouping:
    """A random sparse non-negative graph, Dirichlet loads, and (optionally) a binding load limit."""
    W = rng.random((E, E)) * (rng.random((E, E)) < density)
    W = np.triu(W, 1)
    W = W + W.T
    load = rng.dirichlet(np.full(E, 1.5))
    cap = cap or math.ceil(E / G) + int(rng.integers(0, 2))
    g = Grouping(W, load=load, groups=G, cap=cap)
    if limited:
        g = g.replace(load_limit=g.min_max_load() * float(rng.uniform(1.0, 1.4)))
    return g


def make_problem(
    E: int = 16,
    G: int = 4,
    k: int = 2,
    L: int = 2,
    gpn: int | None = None,
    slots: int | None = None,
    tokens: int = 2000,
    seed: int = 0,
) -> Problem:
    """A synthetic task-structured problem (calibration statistics only)."""
    model = Model(layers=L, experts=E, top_k=k)
    cluster = Cluster(gpus=G, gpus_per_node=gpn or G, slots_per_gpu=slots or math.ceil(E / G))
    inst = Instance(name="t", model=model, cluster=cluster, workload=Workload(calibration=WorkloadSource(synthetic={})))
    trace = synthesize(SynthSpec(layers=L, experts=E, top_k=k, tokens=tokens, structure_seed=seed, seed=seed))
    return Problem(inst, trace.stats())


def run(name: str, problem: Problem, seed: int = 0, time_limit: float | None = 5.0, **params) -> Result:
    """Solve ``problem`` with the registered method ``name`` and YAML-style ``params``."""
    method = get_method(name)
    return method.solve(problem, parse_params(method, params), Context(time_limit=time_limit, seed=seed))
