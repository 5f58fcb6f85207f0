"""CP-SAT model of the capacity-constrained grouping (formulations/tacg.md, section 3).

Variables: ``x[e, g]`` (expert e on group g), the group index ``h[e] = sum_g g x[e, g]`` and,
for every pair with positive affinity, ``z[p]`` (both ends in one group), enforced by
``z[p] => h[i] == h[j]``. Slots, the load limit, star cuts (at most ``cap - 1`` partners
whose loads fit beside e), and value-precedence symmetry breaking ``x[e, g] <= sum_{e' < e} x[e', g-1]``.
Value precedence goes through prefix booleans ``used[e, k]`` (some expert ``<= e`` on k).
Loads are scaled to integers with ``cap / 2`` units of slack on the limit, so that plans at
the limit (common with token counts) stay feasible and no plan exceeds it by more than
``LOAD_TOL``.
The objective uses weights scaled to integers; the reported bound adds back the largest
possible rounding error so that it stays valid for the real weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from moeopt.budget import run_interruptible
from moeopt.errors import InputError
from moeopt.grouping import Grouping, pairs
from moeopt.outcome import ExactOutcome
from moeopt.result import cpsat_termination
from moeopt.solvers import CPSAT, ExactSettings
from moeopt.solvers import available as solver_available

if TYPE_CHECKING:  # ortools stays a lazy import at run time
    from ortools.sat.python.cp_model import CpModel, IntVar

#: integer scale of the largest affinity in the objective
WEIGHT_SCALE = 1_000_000
#: integer scale of the loads (which sum to about 1)
LOAD_SCALE = 1_000_000_000
#: model terms per second of time limit before refusing. Building is fast (about 300k
#: terms/s) but presolve and the first search passes are not: at E = 256, G = 64 (300k terms)
#: CP-SAT held no solution, not even the hint, after 10 s on this 2-core machine
TERMS_PER_SECOND = 20_000


def available() -> bool:
    """Whether CP-SAT can be used."""
    return solver_available(CPSAT)


@dataclass
class CpsatModel:
    """A built CP-SAT model with its variables and scales."""

    model: CpModel
    x: list[list[IntVar]]
    used: list[list[IntVar]]
    h: list[IntVar]
    z: list[IntVar]
    pair_i: np.ndarray
    pair_j: np.ndarray
    weight_int: np.ndarray
    scale: float
    rounding: float  # largest total rounding error of the objective, in real units
    build_time: float


def model_terms(g: Grouping) -> int:
    """Linear terms and clause literals of `build_model`."""
    E, G = g.experts, g.groups
    P = len(pairs(g.graph)[0])
    return int(E * G * (12 + g.limited) + P * (3 + 2 * g.limited))


def check_size(g: Grouping, time_limit: float) -> None:
    """Refuse (InputError) models that cannot be built and searched within ``time_limit``."""
    n = model_terms(g)
    most = int(TERMS_PER_SECOND * max(time_limit, 1.0))
    if n > most:
        raise InputError(
            None,
            None,
            f"tacg-cpsat: E={g.experts}, G={g.groups} gives about {n} model terms, too many for a "
            f"{time_limit:g} s limit (at most {most}); raise --layer-time-limit or use the heuristic 'tacg'",
        )


def build_model(g: Grouping) -> CpsatModel:
    """The CP-SAT model of ``g`` (no solving)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    E, G, cap = g.experts, g.groups, g.cap
    m = cp_model.CpModel()
    # symmetry breaking: expert e can only use groups 0..e
    x = [[m.new_bool_var(f"x{e}_{k}") for k in range(min(e + 1, G))] for e in range(E)]
    for e in range(E):
        m.add_exactly_one(x[e])
    for k in range(G):
        col = [x[e][k] for e in range(k, E)]
        if col:
            m.add(sum(col) <= cap)
    # rounded loads: a group of at most cap experts errs by at most cap/2 units, so with cap/2
    # units of slack every plan within the real limit stays feasible, and every CP-SAT plan
    # exceeds the real limit by at most cap / LOAD_SCALE <= LOAD_TOL (cap <= 1000)
    wl = np.rint(g.load * LOAD_SCALE).astype(np.int64)
    lim = int(math.floor(g.load_limit * LOAD_SCALE)) + (cap + 1) // 2 if g.limited else None
    if lim is not None:
        for k in range(G):
            es = range(k, E)
            m.add(sum(int(wl[e]) * x[e][k] for e in es) <= lim)
    # value precedence x[e, k] <= sum_{f < e} x[f, k-1] through prefix booleans
    # used[e][k] => (some f <= e is on k): O(E G) short clauses instead of O(E^2 G) terms
    used = [[m.new_bool_var(f"u{e}_{k}") for k in range(min(e + 1, G))] for e in range(E)]
    for e in range(E):
        for k in range(len(used[e])):
            m.add_implication(x[e][k], used[e][k])
            if k < len(used[e - 1]) and e > 0:
                m.add_implication(used[e - 1][k], used[e][k])
                m.add_bool_or([x[e][k], used[e - 1][k], ~used[e][k]])
            else:
                m.add_implication(used[e][k], x[e][k])
            if k >= 1:
                m.add_implication(x[e][k], used[e - 1][k - 1])
    h = []
    for e in range(E):
        he = m.new_int_var(0, min(e, G - 1), f"h{e}")
        m.add(he == sum(k * x[e][k] for k in range(len(x[e]))))
        h.append(he)
    pi, pj, pw = pairs(g.graph)
    scale = WEIGHT_SCALE / max(float(pw.max(initial=0.0)), 1e-300)
    wint = np.rint(pw * scale).astype(np.int64)
    z = []
    for i, j in zip(pi.tolist(), pj.tolist(), strict=True):
        zp = m.new_bool_var(f"z{i}_{j}")
        m.add(h[i] == h[j]).only_enforce_if(zp)
        z.append(zp)
    # star cuts: partners of e number at most cap-1 and their loads fit beside e
    incident: list[list[int]] = [[] for _ in range(E)]
    for p, (i, j) in enumerate(zip(pi.tolist(), pj.tolist(), strict=True)):
        incident[i].append(p)
        incident[j].append(p)
    for e in range(E):
        if len(incident[e]) > cap - 1:
            m.add(sum(z[p] for p in incident[e]) <= cap - 1)
        if lim is not None and incident[e]:
            other = [int(pj[p]) if pi[p] == e else int(pi[p]) for p in incident[e]]
            m.add(sum(int(wl[o]) * z[p] for o, p in zip(other, incident[e], strict=True)) <= lim - int(wl[e]))
    m.maximize(sum(int(w) * zp for w, zp in zip(wint.tolist(), z, strict=True)))
    # each real weight differs from wint / scale by at most 0.5 / scale; at most E (cap-1) / 2 pairs count
    rounding = 0.5 / scale * min(len(z), E * (cap - 1) / 2)
    return CpsatModel(m, x, used, h, z, pi, pj, wint, scale, rounding, time.perf_counter() - t0)


def solve(g: Grouping, settings: ExactSettings) -> ExactOutcome:
    """Solve ``g`` with CP-SAT under ``settings`` (`ExactSettings`).

    CP-SAT ignores a hint that violates a constraint: the hint is renumbered to satisfy the
    symmetry breaking first.
    """
    time_limit, hint = settings.time_limit, settings.hint
    from ortools.sat.python import cp_model

    if settings.refuse:
        check_size(g, time_limit)
    t0 = time.perf_counter()
    cm = build_model(g)
    m = cm.model
    if hint is not None:
        canon = g.canonical(hint)
        for e in range(g.experts):
            for k, var in enumerate(cm.x[e]):
                m.add_hint(var, int(canon[e] == k))
            m.add_hint(cm.h[e], int(canon[e]))
            for k, var in enumerate(cm.used[e]):
                m.add_hint(var, int((canon[: e + 1] == k).any()))
        for zp, i, j in zip(cm.z, cm.pair_i.tolist(), cm.pair_j.tolist(), strict=True):
            m.add_hint(zp, int(canon[i] == canon[j]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit - (time.perf_counter() - t0))
    solver.parameters.num_workers = max(1, settings.threads)
    solver.parameters.random_seed = settings.seed
    solver.parameters.log_search_progress = settings.log
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the run, not just this search
    code = run_interruptible(lambda: solver.solve(m), solver.stop_search)
    wall = time.perf_counter() - t0
    home: np.ndarray | None = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        home = np.array([int(solver.value(v)) for v in cm.h], dtype=np.int64)
    return ExactOutcome.from_termination(
        cpsat_termination(solver.status_name(code), wall, time_limit),
        home=home,
        incumbent=solver.objective_value / cm.scale,
        # without a solution CP-SAT's bound field is not a proved bound (it reads 0)
        bound=None if home is None else solver.best_objective_bound / cm.scale + cm.rounding,
        wall_time=wall,
        build_time=cm.build_time,
        solver_status=solver.status_name(code),
        warm_start=hint is not None,
        info={"pairs": len(cm.z)},
    )
