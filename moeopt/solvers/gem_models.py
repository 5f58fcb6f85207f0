"""Exact GEM models for one layer: ``min sum_t z_t`` s.t. ``z_t >= C_g(n_g(M, t))`` (SPEC 5.4).

Two backends, each with ``build_*`` kept apart from ``solve_*``:

- MILP through Pyomo (solver API v2, HiGHS): tile counts ``k_gt`` (integer) for affine
  profiles, ordered level binaries ``y_gtj`` ("at least j tiles") for general monotone ones;
- CP-SAT: integer tile counts with a linear latency for affine profiles, an element
  constraint on the tile count for general monotone ones; latencies scaled to integers.

Both take the search's plan as a warm start (HiGHS ``setSolution``, CP-SAT hints), add the
per-step lower bound of `moeopt.utilization.step_lower_bound` as a bound on ``z_t``,
and refuse sizes whose model cannot be built and searched in reasonable time. Symmetry is
broken only among GPUs with identical profiles (``symmetry_pairs``), and hints are
relabelled to satisfy it (``canonical_home``), since CP-SAT silently drops a hint that
violates a constraint.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from moeopt.budget import run_interruptible
from moeopt.errors import InputError
from moeopt.outcome import ExactOutcome
from moeopt.profile import Profile
from moeopt.result import cpsat_termination
from moeopt.solvers.pyomo_solvers import SolveOptions, require, solve_model
from moeopt.utilization import step_lower_bound

#: Largest model accepted, in constraint-matrix nonzeros (load rows E*G*T plus levels).
MAX_NONZEROS = 200_000


@dataclass(frozen=True, eq=False)
class LayerModel:
    """Data of one layer's exact model.

    Attributes
    ----------
    n
        float ``[T, E]`` utilization trace.
    table
        float ``[G, J + 1]`` latency at 0..J tiles (J: tiles of the busiest step's total).
    tiles_max
        int ``[T]``: no GPU needs more than ``ceil(N_t / tile)`` tiles at step t.
    slots
        Slots per GPU.
    tile
        Tile size (tokens).
    affine
        True when ``table[g, j] = table[g, 0] + slope_g * j`` for every g and j.
    step_bound
        float ``[T]``: the per-step lower bound.
    """

    n: np.ndarray
    table: np.ndarray
    tiles_max: np.ndarray
    slots: int
    tile: int
    affine: bool
    step_bound: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.n.shape[0])

    @property
    def experts(self) -> int:
        return int(self.n.shape[1])

    @property
    def gpus(self) -> int:
        return int(self.table.shape[0])

    @property
    def slope(self) -> np.ndarray:
        return self.table[:, 1] - self.table[:, 0]

    def nonzeros(self) -> int:
        """Size estimate: load rows (E per GPU and step) plus level variables if not affine."""
        loads = self.experts * self.gpus * self.steps
        levels = 0 if self.affine else 3 * self.gpus * int(self.tiles_max.sum())
        return loads + levels + 2 * self.experts * self.gpus


def layer_model(n: np.ndarray, profile: Profile, slots: int, *, method: str = "gem") -> LayerModel:
    """Prepare one layer's exact model; raise `InputError` when it is too large.

    Parameters
    ----------
    n
        float ``[T, E]`` utilization trace.
    profile
        Latency profile.
    slots
        Slots per GPU.
    method
        Method name for the error message.
    """
    n = np.asarray(n, dtype=np.float64)
    tiles_max = np.ceil(n.sum(axis=1) / profile.tile - 1e-9).astype(np.int64).clip(0)
    J = max(int(tiles_max.max(initial=0)), 1)
    table = profile.table(J)
    inc = np.diff(table, axis=1)
    affine = bool(np.allclose(inc, inc[:, :1], rtol=1e-9, atol=1e-12))
    model = LayerModel(n, table, tiles_max, slots, profile.tile, affine, step_lower_bound(n, profile, slots=slots))
    size = model.nonzeros()
    if size > MAX_NONZEROS:
        raise InputError(
            None,
            "method.name",
            f"{method}: a layer with E={model.experts} experts, G={model.gpus} GPUs, T={model.steps} steps"
            f" needs about {size:,} nonzeros (limit {MAX_NONZEROS:,}); exact GEM models are for small"
            " instances (proved optimal up to about E=16, G=4): use method 'gem' instead",
        )
    return model


def tile_counts(model: LayerModel, home: np.ndarray) -> np.ndarray:
    """int ``[G, T]``: tiles each GPU needs under ``home``."""
    onehot = np.zeros((model.experts, model.gpus))
    onehot[np.arange(model.experts), home] = 1.0
    loads = model.n @ onehot  # [T, G]
    return np.ceil(loads.T / model.tile - 1e-9).astype(np.int64).clip(0)


def identical_gpus(table: np.ndarray) -> list[np.ndarray]:
    """Classes (of two or more) of GPUs with identical latency rows, each sorted."""
    _, inverse = np.unique(np.round(table, 12), axis=0, return_inverse=True)
    inverse = np.asarray(inverse).ravel()
    return [np.nonzero(inverse == c)[0] for c in np.unique(inverse) if (inverse == c).sum() > 1]


def symmetry_pairs(model: LayerModel) -> list[tuple[int, int]]:
    """``(e, g)`` pairs fixed to 0 by symmetry breaking among identical GPUs.

    Within a class ``g_0 < g_1 < ...`` of identical GPUs, relabel them by their smallest
    expert (empty GPUs last): the i-th then holds no expert below i, so ``x[e, g_i] = 0``
    for ``e < i`` is valid for some optimal plan.
    """
    return [
        (e, int(cls[i]))
        for cls in identical_gpus(model.table)
        for i in range(1, len(cls))
        for e in range(min(i, model.experts))
    ]


def canonical_home(model: LayerModel, home: np.ndarray) -> np.ndarray:
    """``home`` relabelled within each class of identical GPUs so that it satisfies
    `symmetry_pairs` (a hint violating them would be dropped by CP-SAT); S is unchanged."""
    home = np.asarray(home, dtype=np.int64).copy()
    out = home.copy()
    big = model.experts
    for cls in identical_gpus(model.table):
        first = np.array([np.nonzero(home == g)[0].min(initial=big) for g in cls])
        order = cls[np.argsort(first, kind="stable")]  # GPUs by smallest expert, empty last
        for new_g, old_g in zip(cls, order, strict=True):
            out[home == old_g] = new_g
    return out


# ----------------------------------------------------------------------------- MILP (Pyomo)
def build_milp(model: LayerModel):
    """The Pyomo MILP of one layer (see ``formulations/gem.md``).

    Parameters
    ----------
    model
        The layer's data; affine profiles get integer tile counts ``k[g, t]``, general ones
        ordered level binaries ``y[g, t, j]``.

    Returns
    -------
    pyomo.environ.ConcreteModel
        With variables ``x[e, g]``, ``z[t]`` and the objective ``obj``.
    """
    import pyomo.environ as pe

    T, E, G = model.steps, model.experts, model.gpus
    m = pe.ConcreteModel(name="gem")
    m.E, m.G, m.T = pe.RangeSet(0, E - 1), pe.RangeSet(0, G - 1), pe.RangeSet(0, T - 1)
    m.x = pe.Var(m.E, m.G, domain=pe.Binary)
    m.z = pe.Var(m.T, bounds=lambda _, t: (float(model.step_bound[t]), None))
    m.assign = pe.Constraint(m.E, rule=lambda _, e: sum(m.x[e, g] for g in m.G) == 1)
    m.slots = pe.Constraint(m.G, rule=lambda _, g: sum(m.x[e, g] for e in m.E) <= model.slots)
    n = model.n

    def load(g: int, t: int):
        return sum(float(n[t, e]) * m.x[e, g] for e in range(E) if n[t, e] != 0)

    if model.affine:
        m.k = pe.Var(m.G, m.T, domain=pe.NonNegativeIntegers, bounds=lambda _, g, t: (0, int(model.tiles_max[t])))
        m.tiles = pe.Constraint(m.G, m.T, rule=lambda _, g, t: model.tile * m.k[g, t] >= load(g, t))
        m.latency = pe.Constraint(
            m.G,
            m.T,
            rule=lambda _, g, t: m.z[t] >= float(model.table[g, 0]) + float(model.slope[g]) * m.k[g, t],
        )
    else:
        levels = [(g, t, j) for g in range(G) for t in range(T) for j in range(1, int(model.tiles_max[t]) + 1)]
        m.L = pe.Set(initialize=levels, dimen=3)
        m.y = pe.Var(m.L, domain=pe.Binary)
        order = [(g, t, j) for (g, t, j) in levels if j >= 2]
        m.O = pe.Set(initialize=order, dimen=3)
        m.order = pe.Constraint(m.O, rule=lambda _, g, t, j: m.y[g, t, j] <= m.y[g, t, j - 1])
        inc = np.diff(model.table, axis=1)

        def count(g: int, t: int):
            return sum(m.y[g, t, j] for j in range(1, int(model.tiles_max[t]) + 1))

        def tiles_rule(_, g, t):
            if model.tiles_max[t] == 0:
                return pe.Constraint.Skip
            return model.tile * count(g, t) >= load(g, t)

        m.tiles = pe.Constraint(m.G, m.T, rule=tiles_rule)
        m.latency = pe.Constraint(
            m.G,
            m.T,
            rule=lambda _, g, t: (
                m.z[t]
                >= float(model.table[g, 0])
                + sum(float(inc[g, j - 1]) * m.y[g, t, j] for j in range(1, int(model.tiles_max[t]) + 1))
            ),
        )
    for e, g in symmetry_pairs(model):
        m.x[e, g].fix(0)
    m.obj = pe.Objective(expr=sum(m.z[t] for t in m.T), sense=pe.minimize)
    return m


def _milp_values(m, model: LayerModel, home: np.ndarray) -> list[tuple[object, float]]:
    """``(variable, value)`` pairs of the plan ``home`` in the MILP (for the warm start)."""
    k = tile_counts(model, home)
    vals: list[tuple[object, float]] = []
    for e in range(model.experts):
        for g in range(model.gpus):
            vals.append((m.x[e, g], 1.0 if home[e] == g else 0.0))
    lat = model.table[np.arange(model.gpus)[:, None], np.minimum(k, model.table.shape[1] - 1)]  # [G, T]
    for t in range(model.steps):
        vals.append((m.z[t], float(max(lat[:, t].max(), model.step_bound[t]))))
    if model.affine:
        for g in range(model.gpus):
            for t in range(model.steps):
                vals.append((m.k[g, t], float(k[g, t])))
    else:
        for g, t, j in m.L:
            vals.append((m.y[g, t, j], 1.0 if j <= k[g, t] else 0.0))
    return vals


def solve_milp(
    model: LayerModel,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    threads: int = 1,
    solver: str = "highs",
) -> ExactOutcome:
    """Solve one layer's MILP through Pyomo (HiGHS by default).

    Parameters
    ----------
    model
        The layer's data.
    time_limit
        Seconds.
    hint
        Optional home vector ``[E]`` handed to the solver as its starting solution.
    threads
        Solver threads.
    solver
        One of `moeopt.solvers.pyomo_solvers.SOLVERS`.

    Returns
    -------
    ExactOutcome
        The plan (if any), the solver's objective and bound, whether it proved optimality.
    """
    import pyomo.environ as pe

    require(solver, "gem-milp")
    t0 = time.perf_counter()
    m = build_milp(model)
    build = time.perf_counter() - t0
    answer = solve_model(
        m,
        solver,
        SolveOptions(
            time_limit=max(time_limit - (time.perf_counter() - t0), 0.05),  # build included
            threads=threads,
            rel_gap=1e-7,
        ),
        start=None if hint is None else _milp_values(m, model, canonical_home(model, hint)),
    )
    home = None
    if answer.has_solution:
        x = np.array([[pe.value(m.x[e, g]) for g in range(model.gpus)] for e in range(model.experts)])
        home = x.argmax(axis=1)
    return ExactOutcome.from_termination(
        answer.termination,
        home=home,
        incumbent=answer.incumbent,
        bound=answer.bound,
        sense="min",
        wall_time=time.perf_counter() - t0,
        build_time=build,
        solver_status=answer.solver_status,
        warm_start=answer.warm_start,
    )


# ----------------------------------------------------------------------------- CP-SAT
def _scale(model: LayerModel) -> float:
    """Latencies are scaled to integers with about 7 significant digits."""
    return 1e7 / max(float(model.table.max()), 1e-12)


def _integral_counts(model: LayerModel, denominator: int) -> tuple[np.ndarray, int]:
    """Integer counts ``n * D`` (exact when counts are means of ``denominator`` steps)."""
    for d in (1, denominator, 1000 * denominator):
        scaled = model.n * d
        if np.allclose(scaled, np.round(scaled), atol=1e-6):
            return np.round(scaled).astype(np.int64), d
    d = 1000 * denominator
    return np.round(model.n * d).astype(np.int64), d


def scaled_table(model: LayerModel) -> tuple[np.ndarray, float]:
    """int ``[G, J + 1]`` latencies in integer units, and the scale; affine profiles stay
    exactly affine (``q_g0 + s_g j`` with integer ``s_g``)."""
    scale = _scale(model)
    if model.affine:
        q0 = np.round(model.table[:, 0] * scale).astype(np.int64)
        slope = np.round(model.slope * scale).astype(np.int64)
        return q0[:, None] + slope[:, None] * np.arange(model.table.shape[1])[None, :], scale
    return np.round(model.table * scale).astype(np.int64), scale


def build_cpsat(model: LayerModel, denominator: int = 1):
    """The CP-SAT model of one layer.

    Parameters
    ----------
    model
        The layer's data.
    denominator
        Counts times this are integral (group means of aggregated traces).

    Returns
    -------
    tuple
        ``(cp_model, x[e][g], k[g][t], lat[g][t], z[t], q, scale)``: the model, its variables,
        the integer latency table ``q`` and the scale from milliseconds to its units.
    """
    from ortools.sat.python import cp_model

    T, E, G = model.steps, model.experts, model.gpus
    q, scale = scaled_table(model)  # [G, J + 1]
    counts, d = _integral_counts(model, denominator)
    cp = cp_model.CpModel()
    x = [[cp.new_bool_var(f"x{e}_{g}") for g in range(G)] for e in range(E)]
    for e in range(E):
        cp.add_exactly_one(x[e])
    for g in range(G):
        cp.add(sum(x[e][g] for e in range(E)) <= model.slots)
    k = [[cp.new_int_var(0, int(model.tiles_max[t]), f"k{g}_{t}") for t in range(T)] for g in range(G)]
    lat = [
        [cp.new_int_var(int(q[g, 0]), int(q[g, model.tiles_max[t]]), f"c{g}_{t}") for t in range(T)] for g in range(G)
    ]
    # the per-step bound, rounded down so that rounding never cuts off a plan
    lb = np.floor(model.step_bound * scale * (1 - 1e-9)).astype(np.int64) - 1
    z = [cp.new_int_var(int(lb[t]), int(max(q[:, model.tiles_max[t]].max(), lb[t])), f"z{t}") for t in range(T)]
    for g in range(G):
        for t in range(T):
            nz = np.nonzero(counts[t])[0]
            cp.add(model.tile * d * k[g][t] >= sum(int(counts[t, e]) * x[e][g] for e in nz))
            if model.affine:
                cp.add(lat[g][t] == int(q[g, 0]) + int(q[g, 1] - q[g, 0]) * k[g][t])
            else:
                cp.add_element(k[g][t], [int(v) for v in q[g, : model.tiles_max[t] + 1]], lat[g][t])
            cp.add(z[t] >= lat[g][t])
    for e, g in symmetry_pairs(model):
        cp.add(x[e][g] == 0)
    cp.minimize(sum(z))
    return cp, x, k, lat, z, q, scale


def solve_cpsat(
    model: LayerModel,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    seed: int = 0,
    workers: int = 2,
    denominator: int = 1,
) -> ExactOutcome:
    """Solve one layer's CP-SAT model.

    Parameters
    ----------
    model
        The layer's data.
    time_limit
        Seconds.
    hint
        Optional home vector ``[E]``: relabelled to satisfy the symmetry breaking, then given
        as a complete hint of every variable.
    seed, workers
        CP-SAT's random seed and number of workers.
    denominator
        See `build_cpsat`.

    Returns
    -------
    ExactOutcome
        The plan (if any), objective and best bound in milliseconds, whether optimal.
    """
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    cp, x, k, lat, z, q, scale = build_cpsat(model, denominator)
    build = time.perf_counter() - t0
    if hint is not None:
        hint = canonical_home(model, hint)
        kk = tile_counts(model, hint)
        for e in range(model.experts):
            for g in range(model.gpus):
                cp.add_hint(x[e][g], int(hint[e] == g))
        c = q[np.arange(model.gpus)[:, None], kk]  # [G, T]
        for g in range(model.gpus):
            for t in range(model.steps):
                cp.add_hint(k[g][t], int(kk[g, t]))
                cp.add_hint(lat[g][t], int(c[g, t]))
        lb = np.floor(model.step_bound * scale * (1 - 1e-9)).astype(np.int64) - 1
        for t in range(model.steps):
            cp.add_hint(z[t], int(max(c[:, t].max(), lb[t])))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit - (time.perf_counter() - t0), 0.05)  # build included
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the run, not just this search
    status = run_interruptible(lambda: solver.solve(cp), solver.stop_search)
    home = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        xs = np.array([[solver.value(x[e][g]) for g in range(model.gpus)] for e in range(model.experts)])
        home = xs.argmax(axis=1)
    # The model minimizes rounded latencies q = round(C * scale): each step's z_t can sit up to
    # `err` units above the true latency, so the true optimum is at least (bound - T err)/scale.
    err = float(np.abs(q - model.table[:, : q.shape[1]] * scale).max()) if q.size else 0.0
    wall = time.perf_counter() - t0
    return ExactOutcome.from_termination(
        cpsat_termination(solver.status_name(status), wall, time_limit),
        home=home,
        incumbent=solver.objective_value / scale,
        bound=(solver.best_objective_bound - model.steps * err) / scale,
        sense="min",
        wall_time=wall,
        build_time=build,
        solver_status=solver.status_name(status),
        warm_start=hint is not None,
    )


# ----------------------------------------------------------------------------- per-step exact bound
def per_step_bound(
    model: LayerModel,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    denominator: int = 1,
    seed: int = 0,
    workers: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Lower bound on each step's own optimum ``min_M max_g C_g(n_g(M, t))``, by CP-SAT per step.

    Every plan's step latency is at least the optimum of that step alone, so the sum over
    steps is a valid lower bound on S; it can only exceed `step_lower_bound` where the
    integral placement of one step cannot reach the fractional balance. Each step is one-step
    CP-SAT model whose bound carries the rounding correction of `solve_cpsat`; the
    result is never below ``model.step_bound``.

    Parameters
    ----------
    model
        The layer's data.
    time_limit
        Seconds per step.
    hint
        Optional home vector ``[E]`` given to every step's model.
    denominator, seed, workers
        See `solve_cpsat`.

    Returns
    -------
    tuple
        float ``[T]``: the bound per step; bool ``[T]``: steps whose optimum was proved.
    """
    from dataclasses import replace

    bound = model.step_bound.astype(np.float64).copy()
    proved = np.zeros(model.steps, dtype=bool)
    for t in range(model.steps):
        one = replace(
            model,
            n=model.n[t : t + 1],
            tiles_max=model.tiles_max[t : t + 1],
            step_bound=model.step_bound[t : t + 1],
        )
        out = solve_cpsat(one, time_limit=time_limit, hint=hint, seed=seed, workers=workers, denominator=denominator)
        if out.bound is not None and math.isfinite(out.bound):
            bound[t] = max(bound[t], out.bound)
        proved[t] = bool(out.optimal)
    return bound, proved
