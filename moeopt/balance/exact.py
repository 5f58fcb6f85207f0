"""CP-SAT polish of one layer: copy counts and placement decided together, exactly, with a proved bound.

The model (formulations/balance.md, "Exact polish"): for expert ``e`` and GPU ``g`` a Boolean
``n[e, g]`` (a copy of ``e`` on ``g``; no colocated copies), for every count ``k`` a Boolean
``y[e, k]`` (``e`` has ``k`` copies), and ``z[e, g, k] >= n[e, g] + y[e, k] - 1``; GPU ``g``'s load is
``sum_{e, k} w[e, k] z[e, g, k]`` with ``w[e, k] = floor(S * load_e / k)``, every GPU holds exactly
``W`` copies, every expert at least one, and the largest GPU load ``T`` is minimized. The weights
round down, so CP-SAT's bound (over ``S``) is a valid lower bound on the largest GPU load of every
plan; the plan it returns is scored on the exact loads, and kept only when better than the start.
GPUs are interchangeable: their loads are ordered (``T = load[0] >= load[1] >= ...``), and the start
(the heuristic plan, given as a hint) is sorted the same way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from moeopt.balance.loads import IntArray, _as_load, _check_shape, gpu_loads
from moeopt.budget import run_interruptible

#: weights are scaled so the largest per-copy load is about this many units
SCALE_UNITS = 10**6


@dataclass
class Polished:
    """What `polish_layer` returns."""

    slots: IntArray  # the better of the start and CP-SAT's plan
    bound: float  # lower bound on the largest GPU load of every plan (the exact loads)
    status: str  # CP-SAT's status name (OPTIMAL, FEASIBLE, UNKNOWN, ...)
    improved: bool  # CP-SAT's plan replaced the start
    wall_time: float


def polish_layer(
    load: ArrayLike,
    start: ArrayLike,
    *,
    time_limit: float = 1.0,
    seed: int = 0,
    threads: int = 1,
) -> Polished:
    """Polish one layer's plan with CP-SAT (no colocated copies).

    Parameters
    ----------
    load : array_like of float, shape (E,)
    start : array_like of int, shape (G, W)
        A valid plan (every expert at least once, no colocated copies): the hint, and the plan
        returned unless CP-SAT finds a better one.
    time_limit : float
        Seconds for CP-SAT.
    seed, threads : int
        CP-SAT's random seed and workers.

    Returns
    -------
    Polished
        ``bound`` is CP-SAT's proved bound on the largest GPU load of every plan (0 when it proves
        nothing; not clamped to anything); ``status == "OPTIMAL"`` means the plan is optimal up to
        the rounding of the weights (each under ``1 / S`` of a load unit, ``S`` scaling the largest
        load to ``SCALE_UNITS``).
    """
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    L = _as_load(load)
    s0 = np.asarray(start, dtype=np.int64)
    G, W = s0.shape
    E = L.size
    _check_shape(E, G, W, False)
    base = float(gpu_loads(s0, L).max())
    if L.max() <= 0:
        return Polished(s0.copy(), 0.0, "OPTIMAL", False, time.perf_counter() - t0)
    P = G * W
    K = min(G, P - E + 1)  # copies of one expert: at most one per GPU, every other expert needs one
    S = SCALE_UNITS / float(L.max())
    w = np.floor(S * L[:, None] / np.arange(1, K + 1)[None, :]).astype(np.int64)  # [E, K]
    m = cp_model.CpModel()
    n = [[m.new_bool_var(f"n{e}_{g}") for g in range(G)] for e in range(E)]
    y = [[m.new_bool_var(f"y{e}_{k + 1}") for k in range(K)] for e in range(E)]
    z = [[[m.new_bool_var(f"z{e}_{g}_{k + 1}") for k in range(K)] for g in range(G)] for e in range(E)]
    top = int(w[:, 0].sum())
    loads = [m.new_int_var(0, top, f"load{g}") for g in range(G)]
    for e in range(E):
        m.add_exactly_one(y[e])
        m.add(sum(n[e]) == sum((k + 1) * y[e][k] for k in range(K)))
        for g in range(G):
            for k in range(K):
                m.add_bool_or([z[e][g][k], n[e][g].Not(), y[e][k].Not()])
        for k in range(K):  # redundant, tightens the relaxation: k copies make k products true
            m.add(sum(z[e][g][k] for g in range(G)) >= (k + 1) * y[e][k])
    for g in range(G):
        m.add(sum(n[e][g] for e in range(E)) == W)
        m.add(loads[g] == sum(int(w[e, k]) * z[e][g][k] for e in range(E) for k in range(K) if w[e, k] > 0))
    for g in range(G - 1):
        m.add(loads[g] >= loads[g + 1])
    m.add(G * loads[0] >= sum(loads))  # redundant (the order implies it), for the relaxation
    m.minimize(loads[0])
    # the start as a hint, its GPUs in the order the symmetry breaking asks for
    c0 = np.bincount(s0.ravel(), minlength=E)
    hint_load = np.array([sum(int(w[e, c0[e] - 1]) for e in row) if c0.max() <= K else 0 for row in s0])
    order = np.argsort(-hint_load, kind="stable")
    if c0.max() <= K:
        on = np.zeros((E, G), dtype=bool)
        for g_new, g_old in enumerate(order):
            on[s0[g_old], g_new] = True
        for e in range(E):
            for g in range(G):
                m.add_hint(n[e][g], bool(on[e, g]))
                for k in range(K):
                    m.add_hint(z[e][g][k], bool(on[e, g] and c0[e] == k + 1))
            for k in range(K):
                m.add_hint(y[e][k], c0[e] == k + 1)
        for g in range(G):
            m.add_hint(loads[g], int(hint_load[order[g]]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, float(time_limit))
    solver.parameters.num_workers = max(1, int(threads))
    solver.parameters.random_seed = int(seed)
    solver.parameters.linearization_level = 2  # the clauses z >= n + y - 1 into the LP (its bound)
    solver.parameters.catch_sigint_signal = False
    code = run_interruptible(lambda: solver.solve(m), solver.stop_search)
    status = solver.status_name(code)
    slots, improved, bound = s0.copy(), False, 0.0
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # floor weights: the proved bound (in units) is at most the true optimum times S
        bound = max(0.0, math.floor(solver.best_objective_bound) / S)
        cand = np.array([[e for e in range(E) if solver.value(n[e][g])] for g in range(G)], dtype=np.int64)
        if cand.shape == (G, W) and float(gpu_loads(cand, L).max()) < base * (1 - 1e-12):
            slots, improved = cand, True
    return Polished(slots, bound, status, improved, time.perf_counter() - t0)
