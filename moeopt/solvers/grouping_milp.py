"""The grouping MILP stated algebraically in Pyomo, solved by HiGHS (formulations/tacg.md, §4).

Same model as `moeopt.solvers.grouping_highs` (binaries ``x[e, k]``, pair variables
``y[p, k]``, slots, load limit, pair linearization, star cuts, value-precedence symmetry
breaking), solved through Pyomo's solver API v2 (``pyomo.contrib.solver``), which reports the
termination condition, incumbent and proved bound. The heuristic plan is passed as HiGHS's
start through the persistent interface when it exposes the highspy model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from moeopt.grouping import Grouping, pairs
from moeopt.outcome import ExactOutcome
from moeopt.solvers import PYOMO_HIGHS, ExactSettings
from moeopt.solvers import available as solver_available
from moeopt.solvers.highs_common import GROUPING_OPTIONS, refuse_large
from moeopt.solvers.pyomo_solvers import SolveOptions, require, solve_model

#: matrix nonzeros per second of time limit before refusing: Pyomo builds about 270k/s on one
#: core, so a model within this rate leaves at least 60 % of the limit to HiGHS
NONZEROS_PER_SECOND = 100_000


def available() -> bool:
    """Whether Pyomo with HiGHS can be used."""
    return solver_available(PYOMO_HIGHS)


def check_size(g: Grouping, time_limit: float) -> None:
    """Refuse (InputError) models too large to build through Pyomo within ``time_limit``."""
    refuse_large(g, time_limit, "tacg-milp", NONZEROS_PER_SECOND)


def build_model(g: Grouping):
    """The Pyomo ``ConcreteModel`` of ``g`` (not solved)."""
    import pyomo.environ as pyo

    E, G, cap = g.experts, g.groups, g.cap
    pi, pj, pw = pairs(g.graph)
    P = len(pi)
    m = pyo.ConcreteModel(name="tacg-grouping")
    m.E = pyo.RangeSet(0, E - 1)
    m.G = pyo.RangeSet(0, G - 1)
    m.P = pyo.RangeSet(0, P - 1) if P else pyo.Set(initialize=[])
    # symmetry breaking: expert e uses groups 0..e only
    m.EG = pyo.Set(dimen=2, initialize=[(e, k) for e in range(E) for k in range(min(e + 1, G))])
    m.x = pyo.Var(m.EG, domain=pyo.Binary)
    m.y = pyo.Var(m.P, m.G, bounds=(0.0, 1.0))
    groups_of = {e: range(min(e + 1, G)) for e in range(E)}
    experts_in = {k: range(k, E) for k in range(G)}

    m.assign = pyo.Constraint(m.E, rule=lambda m, e: sum(m.x[e, k] for k in groups_of[e]) == 1)
    m.slots = pyo.Constraint(m.G, rule=lambda m, k: sum(m.x[e, k] for e in experts_in[k]) <= cap)
    if g.limited:
        w, lim = g.load, g.load_limit
        m.gpu_load = pyo.Constraint(m.G, rule=lambda m, k: sum(float(w[e]) * m.x[e, k] for e in experts_in[k]) <= lim)

    def link(end: np.ndarray):
        def rule(m, p, k):
            e = int(end[p])
            return m.y[p, k] <= (m.x[e, k] if k <= e else 0)

        return rule

    m.link_i = pyo.Constraint(m.P, m.G, rule=link(pi))
    m.link_j = pyo.Constraint(m.P, m.G, rule=link(pj))
    incident: list[list[tuple[int, int]]] = [[] for _ in range(E)]  # (pair, other end)
    for p in range(P):
        incident[int(pi[p])].append((p, int(pj[p])))
        incident[int(pj[p])].append((p, int(pi[p])))
    with_pairs = [(e, k) for e in range(E) for k in groups_of[e] if incident[e]]
    m.star = pyo.Constraint(
        with_pairs, rule=lambda m, e, k: sum(m.y[p, k] for p, _ in incident[e]) <= (cap - 1) * m.x[e, k]
    )
    if g.limited:
        w, lim = g.load, g.load_limit
        m.star_load = pyo.Constraint(
            with_pairs,
            rule=lambda m, e, k: (
                sum(float(w[o]) * m.y[p, k] for p, o in incident[e]) <= (lim - float(w[e])) * m.x[e, k]
            ),
        )
    prec = [(e, k) for e in range(1, E) for k in range(1, min(e + 1, G))]
    m.precedence = pyo.Constraint(prec, rule=lambda m, e, k: m.x[e, k] <= sum(m.x[f, k - 1] for f in range(k - 1, e)))
    weights = {p: float(pw[p]) for p in range(P)}
    m.obj = pyo.Objective(
        expr=sum(weights[p] * m.y[p, k] for p in range(P) for k in range(G)) if P else 0.0, sense=pyo.maximize
    )
    m._pairs = list(zip(pi.tolist(), pj.tolist(), strict=True))
    return m


def start_values(m: Any, home: np.ndarray) -> Iterator[tuple[Any, float]]:
    """``(variable, value)`` pairs of the plan ``home`` in the model ``m`` (for the warm start)."""
    for (e, k), var in m.x.items():
        yield var, float(home[e] == k)
    for (p, k), var in m.y.items():
        i, j = m._pairs[p]
        yield var, float(home[i] == k and home[j] == k)


def solve(g: Grouping, settings: ExactSettings) -> ExactOutcome:
    """Solve ``g`` through Pyomo with ``settings.solver`` (HiGHS by default) under ``settings``
    (`ExactSettings`)."""
    time_limit, hint = settings.time_limit, settings.hint
    import pyomo.environ as pyo

    if settings.refuse:
        check_size(g, time_limit)
    require(settings.solver, "tacg-milp")
    t0 = time.perf_counter()
    m = build_model(g)
    build = time.perf_counter() - t0
    answer = solve_model(
        m,
        settings.solver,
        SolveOptions(
            time_limit=max(0.05, time_limit - (time.perf_counter() - t0)),
            threads=settings.threads,
            seed=settings.seed,
            rel_gap=GROUPING_OPTIONS["mip_rel_gap"],
            abs_gap=GROUPING_OPTIONS["mip_abs_gap"],
            feasibility_tol=GROUPING_OPTIONS["primal_feasibility_tolerance"],
            tee=settings.log,
            highs_options=GROUPING_OPTIONS,
        ),
        start=None if hint is None else start_values(m, g.canonical(hint)),
    )
    wall = time.perf_counter() - t0
    home = None
    if answer.has_solution:
        x = np.zeros((g.experts, g.groups))
        for (e, k), var in m.x.items():
            x[e, k] = pyo.value(var)
        home = x.argmax(axis=1).astype(np.int64)
    return ExactOutcome.from_termination(
        answer.termination,
        home=home,
        incumbent=answer.incumbent,
        bound=answer.bound,
        wall_time=wall,
        build_time=build,
        solver_status=answer.solver_status,
        warm_start=answer.warm_start,
    )
