"""The communication-vs-balance frontier of several methods on one instance (SPEC 11).

For each method and each load limit ``eps`` of a sweep, one plan is solved on the calibration
workload and scored by the one scorer ([`moeopt.scoring.score`][]) on the held-out
evaluation workload and on each family's own part of it (the single-family shift). The
``eps`` knob of each kind of method:

* ``joint``: ``eps`` (its calibration load limit);
* grouping methods (``agnostic``, ``tacg``, ``hypergraph``, ``metis``): ``eps_load``, plus
  one point at their automatic limit;
* replication methods (``hottest-replication``, ``gesr``): the base grouping's ``eps_load``
  (base ``agnostic``), plus one point at its automatic limit;
* others (``greedy`` with replication, ``balance``, ``linear``, ...): no knob, one point.

A point is on the Pareto set when no other point has both fewer remote GPUs per token and a
lower held-out MaxVio (ties: both lower or equal, one strictly).

The points are independent: with ``workers=N`` they are solved in a local process pool (the
fork server of [`moeopt.execute`][], each point's layers serial in its worker), with the same
seed per point as the serial sweep, hence the same plans and metrics (wall times aside).
With ``ray`` the points are Ray tasks (each point's layers serial in its task), again with the
serial sweep's seeds, plans and metrics.

Time limits: ``layer_time_limit`` is seconds per layer of every point; ``time_limit`` is
seconds for the whole sweep, each point taking, as it starts, its share of what is left over
the points still to solve (``moeopt.budget.share``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tabulate import tabulate

from moeopt import console, execute
from moeopt.budget import share
from moeopt.errors import MoeoptError
from moeopt.instance import Instance
from moeopt.registry import get_method, method_names, metric_hooks
from moeopt.scoring import Workloads, score
from moeopt.solve import load_workloads, solve
from moeopt.trace import Trace

#: The methods of ``moeopt frontier`` by default: joint, the grouping methods, the
#: replication baselines (on the task-agnostic grouping) and the load balancers.
DEFAULT_METHODS = ("joint", "agnostic", "tacg", "hypergraph", "hottest-replication", "gesr", "greedy", "balance")
DEFAULT_EPS = (0.02, 0.05, 0.1, 0.2)
GROUPING = frozenset({"agnostic", "tacg", "hypergraph", "metis", "tacg-cpsat", "tacg-milp", "tacg-highs"})
REPLICATION = frozenset({"hottest-replication", "gesr", "random-replication"})


def has_knob(method: str) -> bool:
    """Whether ``method`` has a load limit the sweep sets."""
    return method.startswith("joint") or method in GROUPING or method in REPLICATION


def sweep_params(method: str, eps: float | None) -> dict[str, Any]:
    """The parameters that set ``method``'s load limit to ``eps`` (``eps`` None, or a method
    without the knob: its defaults; ``greedy`` replicates)."""
    if method.startswith("joint"):  # no certificate per point (seconds per layer each; the sweep shows no bounds)
        return {"bound_time": 0.0} if eps is None else {"eps": eps, "bound_time": 0.0}
    if method in GROUPING:
        return {} if eps is None else {"eps_load": eps}
    if method in REPLICATION:
        base: dict[str, Any] = {"base": "agnostic", "certificate": False}
        if eps is not None:
            base["base_params"] = {"eps_load": eps}
        return base
    if method == "greedy":
        return {"replicate": True}
    return {}


@dataclass
class FrontierPoint:
    """One plan of the sweep and its held-out metrics."""

    method: str
    eps: float | None
    params: dict[str, Any]
    comm_per_token: float | None
    comm_reduction: float | None
    maxvio: float
    maxvio_per_step: float | None
    family_maxvio: dict[str, float]
    dispatch: str
    wall_time: float
    calibration_maxvio: float | None = None
    pareto: bool = False
    error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def worst_family_maxvio(self) -> float | None:
        return max(self.family_maxvio.values()) if self.family_maxvio else None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "stats"}
        out["worst_family_maxvio"] = self.worst_family_maxvio
        out["stats"] = self.stats
        return out


def family_workloads(workload: Any) -> dict[str, Any]:
    """Each family's own part of a workload (a trace's tokens, or a count table's row)."""
    names = workload.family_names
    if len(names) <= 1:
        return {}
    out = {}
    for name in names:
        part = workload.only_family(name)
        if isinstance(part, Trace) and part.tokens == 0:
            continue
        out[name] = part
    return out


def point_of(
    instance: Instance,
    wl: Workloads,
    method: str,
    eps: float | None,
    params: dict[str, Any],
    *,
    time_limit: float | None,
    seed: int,
    families: dict[str, Any],
    workers: int | None = None,
    ray: str | bool | None = None,
    layer_time_limit: float | None = None,
) -> FrontierPoint:
    """Solve one method at one ``eps`` and score it (held-out, and per family); ``time_limit``
    is the point's own total, ``layer_time_limit`` per layer."""
    t0 = time.perf_counter()
    result = solve(
        instance,
        method=method,
        params=params,
        time_limit=time_limit,
        layer_time_limit=layer_time_limit,
        seed=seed,
        workloads=wl,
        workers=workers,
        ray=ray,
    )
    wall = time.perf_counter() - t0
    assert result.termination is not None  # Result.__post_init__ sets it
    if result.plan is None:  # e.g. a load limit the method could not reach: a point without a plan
        return FrontierPoint(
            method,
            eps,
            params,
            None,
            None,
            float("nan"),
            None,
            {},
            "-",
            wall,
            error=f"no plan ({result.termination.value})",
        )
    m = result.metrics
    hooks = metric_hooks(method)
    fam = {
        name: float(score(result.plan, instance, wl, workload=w, hooks=hooks, params=result.params)["maxvio"])
        for name, w in families.items()
    }
    cal = result.stats.get("calibration_maxvio")
    if cal is None and result.objective_name in ("maxvio", "calibration_maxvio"):
        cal = result.objective
    return FrontierPoint(
        method=method,
        eps=eps,
        params=params,
        comm_per_token=m.get("comm_per_token"),
        comm_reduction=m.get("comm_reduction_vs_linear"),
        maxvio=float(m["maxvio"]),
        maxvio_per_step=m.get("maxvio_per_step"),
        family_maxvio=fam,
        dispatch=result.plan.dispatch.kind
        + (f" λ={result.plan.dispatch.lam:g}" if result.plan.dispatch.kind == "locality" else ""),
        wall_time=wall,
        calibration_maxvio=None if cal is None else float(cal),
    )


def mark_pareto(points: Sequence[FrontierPoint]) -> None:
    """Flag the points no other point dominates in (communication, held-out MaxVio)."""
    ok = [(p, p.comm_per_token) for p in points if p.error is None and p.comm_per_token is not None]
    for p, pc in ok:
        p.pareto = not any(
            q is not p and qc <= pc and q.maxvio <= p.maxvio and (qc < pc or q.maxvio < p.maxvio) for q, qc in ok
        )


def _sweep_units(methods: Sequence[str], eps: Sequence[float], wl: Workloads) -> list[tuple[str, float | None]]:
    """The (method, eps) points of the sweep, in order (unavailable methods, and methods
    needing a trace on a count-only workload, left out)."""
    known = set(method_names())
    units: list[tuple[str, float | None]] = []
    for method in methods:
        if method not in known:
            get_method(method)  # raises the one-line error listing the registered methods
        impl = get_method(method)
        if not impl.available():
            continue
        if "coactivation" in impl.requires and not wl.calibration_stats.has_coactivation:
            continue
        sweep: list[float | None] = [None]
        if has_knob(method) and eps:
            # grouping and replication methods also at their automatic limit: a tight eps_load
            # is often unreachable for them (the hottest expert alone exceeds it)
            sweep = list(eps) if method.startswith("joint") else [None, *eps]
        units += [(method, e) for e in sweep]
    return units


def _solve_point(
    instance: Instance,
    wl: Workloads,
    method: str,
    e: float | None,
    *,
    time_limit: float | None,
    seed: int,
    families: dict[str, Any],
    workers: int | None,
    ray: str | bool | None,
    layer_time_limit: float | None = None,
) -> FrontierPoint:
    """One point of the sweep; a load limit the method cannot reach is a point with an error."""
    params = sweep_params(method, e)
    try:
        return point_of(
            instance,
            wl,
            method,
            e,
            params,
            time_limit=time_limit,
            layer_time_limit=layer_time_limit,
            seed=seed,
            families=families,
            workers=workers,
            ray=ray,
        )
    except MoeoptError as exc:  # an unattainable eps_load is a point the method cannot reach
        return FrontierPoint(method, e, params, None, None, float("nan"), None, {}, "-", 0.0, error=str(exc))


#: What every worker of a parallel sweep shares (the instance, its workloads, the family
#: workloads, limits, deadline and seed): shipped once per worker by the pool's initializer,
#: not per point.
_shared: dict[str, Any] = {}


def _point_worker_init(shared: dict[str, Any]) -> None:
    execute.worker_init()  # SIGINT left to the parent, which stops every worker
    _shared.clear()
    _shared.update(shared)


def _point_task(index: int, method: str, e: float | None) -> tuple[int, FrontierPoint]:
    s = _shared
    # the point's layers run serially in this worker (ray=False: not the instance's executor)
    return index, _solve_point(
        s["instance"],
        s["wl"],
        method,
        e,
        time_limit=share(None, s["deadline"], s["points"] - index, s["width"]),  # as the point starts
        layer_time_limit=s["layer_time_limit"],
        seed=s["seed"],
        families=s["families"],
        workers=1,
        ray=False,
    )


def _ray_point(shared: dict[str, Any], index: int, method: str, e: float | None) -> tuple[int, FrontierPoint]:
    """One point as a Ray task: ``shared`` comes from Ray's object store (put there once)."""
    _shared.clear()
    _shared.update(shared)
    return _point_task(index, method, e)


def frontier(
    instance: Instance,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    eps: Sequence[float] = DEFAULT_EPS,
    time_limit: float | None = None,
    seed: int = 0,
    workloads: Workloads | None = None,
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
    ray: str | bool | None = None,
    layer_time_limit: float | None = None,
) -> list[FrontierPoint]:
    """Every method at every ``eps`` (once for methods without a load-limit knob), scored on
    the held-out evaluation workload; the Pareto set flagged.

    Parameters
    ----------
    time_limit
        Seconds for the whole sweep (loading the workloads included): each point gets, as it
        starts, its share of what is left over the points still to solve. None: no total.
    layer_time_limit
        Seconds per layer of every point. None: no per-layer limit.
    log
        Gets one line per finished point (in the order they finish); given, a progress bar
        over the points is also drawn (on a terminal only, `moeopt.console.bar`).
    workers
        Solve the points in this many local processes (each point's layers serially in its
        worker); the points, plans and metrics are those of the serial sweep, in the same
        order. None: the instance's ``executor:`` mapping, else 1.
    ray
        Run the points as Ray tasks (a cluster address, or ``"local"`` / True; a Ray already
        running in this process is used), each point's layers serially in its task.

    Returns
    -------
    list of FrontierPoint
        In sweep order (method, then eps), whatever the executor.
    """
    deadline = None if time_limit is None else time.time() + time_limit
    executor = execute.resolve(instance, workers, ray)
    if executor.kind == "ray":
        execute.import_ray()  # fail before loading anything
    wl = workloads or load_workloads(instance)
    families = family_workloads(wl.evaluation)
    units = _sweep_units(methods, eps, wl)
    points: list[FrontierPoint | None] = [None] * len(units)
    bar = console.bar(total=len(units), desc="frontier", unit="point", quiet=log is None, leave=False)

    def done(index: int, p: FrontierPoint) -> None:
        points[index] = p
        if log is not None:
            log(_line(p))
        bar.update(1)

    try:
        parallel = executor.kind in ("pool", "ray") and len(units) > 1
        shared = dict(
            instance=instance,
            wl=wl,
            families=families,
            deadline=deadline,
            layer_time_limit=layer_time_limit,
            points=len(units),
            width=executor.width(len(units)) if parallel else 1,
            seed=seed,
        )
        if executor.kind == "pool" and len(units) > 1:
            items = [(i, m, e) for i, (m, e) in enumerate(units)]
            execute.pool_map(
                _point_task,
                items,
                executor.workers,
                lambda out: done(*out),
                initializer=_point_worker_init,
                initargs=(shared,),
            )
        elif executor.kind == "ray" and len(units) > 1:
            items = [(i, m, e) for i, (m, e) in enumerate(units)]
            execute.ray_map(_ray_point, items, executor, lambda out: done(*out), shared=shared)
        else:  # serial points (one point on Ray: its layers as Ray tasks)
            for i, (method, e) in enumerate(units):
                done(
                    i,
                    _solve_point(
                        instance,
                        wl,
                        method,
                        e,
                        time_limit=share(None, deadline, len(units) - i),
                        layer_time_limit=layer_time_limit,
                        seed=seed,
                        families=families,
                        workers=executor.workers,
                        ray=executor.ray or False,
                    ),
                )
    finally:
        bar.close()
    out = [p for p in points if p is not None]
    mark_pareto(out)
    return out


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _line(p: FrontierPoint) -> str:
    if p.error:
        return f"{p.method} eps={p.eps}: {p.error}"
    return (
        f"{p.method} eps={p.eps}: comm {_fmt(p.comm_per_token)} ({_fmt(p.comm_reduction, 2)} %), "
        f"MaxVio {_fmt(p.maxvio)}, worst family {_fmt(p.worst_family_maxvio)}, {p.wall_time:.1f} s"
    )


def table(points: Sequence[FrontierPoint], fmt: str = "github") -> str:
    """The sweep as a table, best communication first; Pareto points starred."""
    rows = []
    for p in sorted(points, key=lambda p: (p.comm_per_token is None, p.comm_per_token or 0.0, p.maxvio)):
        rows.append(
            [
                "*" if p.pareto else "",
                p.method,
                _fmt(p.eps, 3),
                _fmt(p.comm_per_token),
                _fmt(p.comm_reduction, 2),
                _fmt(p.maxvio),
                _fmt(p.maxvio_per_step, 3),
                _fmt(p.worst_family_maxvio, 3),
                _fmt(p.calibration_maxvio),
                p.dispatch,
                f"{p.wall_time:.1f}",
                p.error or "",
            ]
        )
    headers = [
        "Pareto",
        "method",
        "eps",
        "remote GPUs/token",
        "reduction vs linear %",
        "MaxVio (held-out)",
        "MaxVio per step",
        "worst family MaxVio",
        "calibration MaxVio",
        "dispatch",
        "time s",
        "note",
    ]
    return tabulate(rows, headers=headers, tablefmt=fmt)


def plot(points: Sequence[FrontierPoint], path: Any, title: str = "") -> None:
    """Communication reduction vs held-out MaxVio (left) and vs the worst single-family
    MaxVio (right), one marker per method, the Pareto set joined."""
    from moeopt.extras import load

    matplotlib = load("matplotlib", "plot", "drawing the frontier's figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from moeopt.outputs import atomic_path, figure_format

    ok = [p for p in points if p.error is None and p.comm_reduction is not None]
    methods = list(dict.fromkeys(p.method for p in ok))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = "os^vD<>pPX*h"
    for i, m in enumerate(methods):
        mine = sorted((p for p in ok if p.method == m), key=lambda p: p.maxvio)
        style = dict(marker=markers[i % len(markers)], label=m, alpha=0.85)
        axes[0].plot([p.maxvio for p in mine], [p.comm_reduction for p in mine], linestyle=":", **style)
        fam = [p for p in mine if p.worst_family_maxvio is not None]
        if fam:
            axes[1].plot([p.worst_family_maxvio for p in fam], [p.comm_reduction for p in fam], linestyle="", **style)
    front = sorted((p for p in ok if p.pareto), key=lambda p: p.maxvio)
    if front:
        axes[0].step(
            [p.maxvio for p in front],
            [p.comm_reduction for p in front],
            where="post",
            color="k",
            linewidth=1,
            label="Pareto set",
        )
    axes[0].set_xlabel("held-out MaxVio")
    axes[1].set_xlabel("worst single-family MaxVio")
    for ax in axes:
        ax.set_ylabel("remote GPUs per token: reduction vs linear (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=figure_format(path))  # the extension's format (png without one)
    plt.close(fig)
