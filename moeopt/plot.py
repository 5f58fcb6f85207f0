"""Figures of plans and runs: per-GPU loads, the frontier, and a solve's gap over time.

Each figure has a data function (tested on numbers) and a drawing function (matplotlib with
the Agg backend, imported only when drawing):

* `load_bars` / `draw_loads`: per-GPU token loads of one layer under a plan and
  under a baseline (the ``linear`` plan, or the plan running now), their mean and MaxVio;
* `frontier_points` / `draw_frontier`: the sweep written by ``moeopt frontier``
  (drawn by `moeopt.frontier.plot`);
* `gap_history` / `draw_gap`: each layer's incumbent and bound against the
  seconds since the run started, from ``stats['history']`` of a report (recorded by
  `moeopt.execute` for every method solved layer by layer);
* `replay_series` / `draw_replay`: a ``moeopt replay`` report (one run or
  several): per-step MaxVio over time for each policy, and the bytes each re-plan moved;
* `replay_frontier_series` / `draw_replay_frontier`: a ``replay --frontier``
  report: bytes moved against time-averaged MaxVio, one colour per policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moeopt.errors import MoeoptError
from moeopt.frontier import plot as plot_frontier
from moeopt.instance import Instance

__all__ = [
    "GapHistory",
    "LoadBars",
    "ReplaySeries",
    "draw_frontier",
    "draw_gap",
    "draw_loads",
    "draw_replay",
    "draw_replay_frontier",
    "frontier_points",
    "gap_history",
    "load_bars",
    "plot_frontier",
    "scored_on",
    "replay_frontier_series",
    "replay_label",
    "replay_series",
]

#: GPUs up to which `draw_loads` draws a bar per GPU; more are drawn as sorted load curves.
BAR_GPUS = 32

#: The kinds of ``moeopt plot``.
KINDS = ("loads", "frontier", "gap", "replay", "replay-frontier")


# ----------------------------------------------------------------------------- loads
@dataclass(frozen=True)
class LoadBars:
    """One layer's per-GPU loads (tokens routed to each GPU) after and before a plan."""

    layer: int
    after: np.ndarray  # float [G]
    before: np.ndarray  # float [G]
    after_label: str
    before_label: str

    @property
    def mean(self) -> float:
        """Mean load per GPU (the same for both: one workload)."""
        return float(self.after.mean())

    @staticmethod
    def _maxvio(loads: np.ndarray) -> float:
        m = float(loads.mean())
        return float(loads.max() / m - 1.0) if m > 0 else 0.0

    @property
    def maxvio_after(self) -> float:
        return self._maxvio(self.after)

    @property
    def maxvio_before(self) -> float:
        return self._maxvio(self.before)


def scored_on(instance: Instance) -> str:
    """What an instance's plans are scored on, for a figure's title: ``held-out workload`` when
    it has an evaluation workload (or a synthetic one, scored on a fresh sample), else
    ``in sample``."""
    w = instance.workload
    held_out = w.evaluation is not None or w.calibration.synthetic is not None
    return "held-out workload" if held_out else "in sample"


def load_bars(
    after: dict,
    before: dict,
    *,
    layer: int | None = None,
    after_label: str = "plan",
    before_label: str = "linear",
) -> LoadBars:
    """The bars of one layer from two metric dicts of `score`.

    Parameters
    ----------
    after, before
        Metrics of the plan and of the baseline on the same workload (their ``loads`` ``[L][G]``).
    layer
        The layer to show; None: the plan's worst layer (largest MaxVio; the first on ties).
    after_label, before_label
        Legend names.

    Raises
    ------
    MoeoptError
        When ``layer`` is out of range or the metrics carry no loads.
    """
    if "loads" not in after or "loads" not in before:
        raise MoeoptError("these metrics carry no per-GPU loads")
    a = np.asarray(after["loads"], dtype=np.float64)
    b = np.asarray(before["loads"], dtype=np.float64)
    if a.shape != b.shape:
        raise MoeoptError(f"loads of different shapes: {list(a.shape)} vs {list(b.shape)}")
    L = a.shape[0]
    if layer is None:
        mean = a.mean(axis=1, keepdims=True)
        vio = np.where(mean > 0, a.max(axis=1, keepdims=True) / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)
        layer = int(np.argmax(vio[:, 0]))
    if not 0 <= layer < L:
        raise MoeoptError(f"--layer {layer}: the plan has layers 0..{L - 1}")
    return LoadBars(layer, a[layer], b[layer], after_label, before_label)


def _pyplot() -> Any:
    from moeopt.extras import load

    matplotlib = load("matplotlib", "plot", "drawing a figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    from moeopt.outputs import atomic_path, figure_format

    fmt = figure_format(path)  # refused before a temporary file is made
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=fmt)


def draw_loads(panels: Sequence[LoadBars], path: str | Path, *, title: str = "") -> None:
    """Per-GPU loads of the baseline and the plan, one panel per `LoadBars`, the mean as a
    dashed line and both MaxVio values in each panel's title: grouped bars per GPU up to
    `BAR_GPUS` GPUs, beyond that (64 to 320 GPUs and more) each plan's loads sorted from the
    heaviest GPU down, which shows the peak, the spread and the idle tail at any size."""
    plt = _pyplot()
    n = len(panels)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.4, 5.2 * cols), 3.8 * rows), squeeze=False)
    for ax, p in zip(axes.flat, panels, strict=False):
        G = len(p.after)
        if G <= BAR_GPUS:
            x = np.arange(G)
            ax.bar(x - 0.2, p.before, width=0.4, label=p.before_label, color="#bbbbbb", edgecolor="#777777")
            ax.bar(x + 0.2, p.after, width=0.4, label=p.after_label, color="#3b75af")
            ax.set_xticks(x, [str(g) for g in range(G)])
            ax.set_xlabel("GPU")
        else:  # too many bars to read: each plan's loads sorted, heaviest GPU first
            rank = np.arange(1, G + 1)
            ax.step(rank, np.sort(p.before)[::-1], where="mid", color="#777777", label=p.before_label)
            ax.fill_between(rank, np.sort(p.after)[::-1], step="mid", color="#3b75af", alpha=0.35)
            ax.step(rank, np.sort(p.after)[::-1], where="mid", color="#3b75af", label=p.after_label)
            ax.set_xlim(0.5, G + 0.5)
            ax.set_xlabel(f"GPUs sorted by load, heaviest first ({G} GPUs)")
        ax.axhline(p.mean, color="k", linestyle="--", linewidth=1, label=f"mean {p.mean:,.0f}")
        ax.set_ylabel("tokens routed (expert activations)")
        ax.set_title(
            f"layer {p.layer}: MaxVio {p.before_label} {p.maxvio_before:.3f} -> {p.after_label} {p.maxvio_after:.3f}",
            fontsize=9,
        )
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# ----------------------------------------------------------------------------- frontier
def frontier_points(data: dict) -> list:
    """The `FrontierPoint` list of a ``moeopt frontier`` JSON file."""
    from dataclasses import fields

    from moeopt.frontier import FrontierPoint

    names = {f.name for f in fields(FrontierPoint)}
    points = data.get("points")
    if not isinstance(points, list):
        raise MoeoptError("not a frontier file (no 'points' list): write one with moeopt frontier -o DIR")
    out = []
    for p in points:
        q = {k: v for k, v in p.items() if k in names}
        if q.get("maxvio") is None:
            q["maxvio"] = float("nan")
        out.append(FrontierPoint(**q))
    return out


def draw_frontier(data: dict, path: str | Path) -> None:
    """The frontier figure of a ``moeopt frontier`` JSON file (see `moeopt.frontier.plot`)."""
    from moeopt.frontier import plot

    plot(frontier_points(data), path, title=str(data.get("instance", "")))


# ----------------------------------------------------------------------------- gap
@dataclass(frozen=True)
class GapHistory:
    """A run's finished layers in time order: seconds since the start, incumbent, bound."""

    method: str
    objective_name: str
    sense: str
    layer: np.ndarray  # int [n]
    seconds: np.ndarray  # float [n]
    incumbent: np.ndarray  # float [n] (nan: no plan for that layer)
    bound: np.ndarray  # float [n] (nan: no bound)

    @property
    def gap(self) -> np.ndarray:
        """Relative gap per layer, ``|incumbent - bound| / max(|incumbent|, 1e-9)`` (nan without a bound)."""
        diff = self.incumbent - self.bound if self.sense == "min" else self.bound - self.incumbent
        return np.maximum(diff, 0.0) / np.maximum(np.abs(self.incumbent), 1e-9)


def gap_history(report: dict) -> GapHistory | None:
    """The history of one solve report (``solve --report``, or one entry of ``compare --report``);
    None when the report has none (a method that solves all layers together records none)."""
    hist = (report.get("stats") or {}).get("history")
    if not hist:
        return None
    hist = sorted(hist, key=lambda h: h["seconds"])

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if h.get(key) is None else float(h[key]) for h in hist])

    return GapHistory(
        method=str(report.get("method", "")),
        objective_name=str(report.get("objective_name") or "objective"),
        sense=str(report.get("sense", "min")),
        layer=np.array([int(h["layer"]) for h in hist]),
        seconds=col("seconds"),
        incumbent=col("objective"),
        bound=col("bound"),
    )


def draw_gap(histories: Sequence[GapHistory], path: str | Path, *, title: str = "") -> None:
    """Per method: each layer's incumbent (o) and bound (x) against the seconds at which the
    layer finished (top), and the relative gap in percent (bottom). Points are not joined:
    each layer is its own problem."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.2), sharex=True)
    for i, h in enumerate(histories):
        color = f"C{i}"
        top.plot(h.seconds, h.incumbent, "o", color=color, label=f"{h.method}: incumbent")
        if np.isfinite(h.bound).any():
            top.plot(h.seconds, h.bound, "x", markersize=9, color=color, label=f"{h.method}: bound")
            bottom.plot(h.seconds, 100 * h.gap, "o", color=color, label=h.method)
        for s, v, l in zip(h.seconds, h.incumbent, h.layer, strict=True):
            if np.isfinite(v):
                top.annotate(f"L{l}", (s, v), textcoords="offset points", xytext=(4, 4), fontsize=7)
    names = {h.objective_name for h in histories}
    top.set_ylabel(f"layer {'/'.join(sorted(names))}")
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.set_ylabel("gap (%)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds since the solve started (layer finished)")
    bottom.grid(alpha=0.3)
    if not any(np.isfinite(h.bound).any() for h in histories):
        bottom.text(0.5, 0.5, "no bounds recorded", ha="center", va="center", transform=bottom.transAxes)
    else:
        bottom.legend(fontsize=7)
    fig.suptitle(title or "incumbent and bound per layer over time")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# ----------------------------------------------------------------------------- replay
def replay_label(policy: dict) -> str:
    """A replay run's name: the policy, with its planner when that is not ``balance`` and
    ``relabeled`` when it renumbers GPUs (e.g. ``periodic (eplb, relabeled)``)."""
    name = str(policy.get("name", "?"))
    extra = []
    planner = policy.get("planner")
    if planner is not None and planner != "balance":
        extra.append(str(planner))
    if policy.get("relabel") and not policy.get("from_current", False):  # a plan from the current one needs none
        extra.append("relabeled")
    return f"{name} ({', '.join(extra)})" if extra else name


@dataclass(frozen=True)
class ReplaySeries:
    """One replay run's per-step MaxVio and its re-plans' moved bytes."""

    label: str
    step: np.ndarray  # int [S]
    maxvio: np.ndarray  # float [S]
    replan_step: np.ndarray  # int [R]: the step each re-plan's plan started serving
    replan_bytes: np.ndarray  # float [R]
    maxvio_mean: float
    maxvio_worst: float


def _runs(data: dict) -> list[dict]:
    if data.get("report") != "replay":
        raise MoeoptError("not a replay report (no 'report: replay'): write one with moeopt replay --report")
    runs = data.get("runs")
    return list(runs) if isinstance(runs, list) else [data]


def replay_series(data: dict) -> list[ReplaySeries]:
    """The runs of a ``moeopt replay --report`` file (one run, or ``runs``), in order.

    Raises
    ------
    MoeoptError
        When ``data`` is not a replay report or a run lacks its series.
    """
    out = []
    for run in _runs(data):
        series, metrics = run.get("series"), run.get("metrics")
        if not isinstance(series, dict) or not isinstance(metrics, dict):
            raise MoeoptError("a replay run without 'series' and 'metrics'")
        replans = run.get("replans") or []
        out.append(
            ReplaySeries(
                label=replay_label(run.get("policy") or {}),
                step=np.asarray(series["step"], dtype=np.int64),
                maxvio=np.asarray(series["maxvio"], dtype=np.float64),
                replan_step=np.array([int(r["effective"]) for r in replans], dtype=np.int64),
                replan_bytes=np.array([float(r["moved_bytes"]) for r in replans], dtype=np.float64),
                maxvio_mean=float(metrics["maxvio_mean"]),
                maxvio_worst=float(metrics["maxvio_worst"]),
            )
        )
    return out


def draw_replay(data: dict, path: str | Path) -> None:
    """Per-step MaxVio of each run over time, with its time average dashed (top), and the GB
    each re-plan moved at the step its plan started serving (bottom)."""
    runs = replay_series(data)
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 6.4), sharex=True, height_ratios=(2, 1))
    width = 0.8 / max(len(runs), 1)
    for i, r in enumerate(runs):
        color = f"C{i}"
        top.plot(r.step, r.maxvio, "-", color=color, linewidth=1.2, label=f"{r.label}: mean {r.maxvio_mean:.3f}")
        top.axhline(r.maxvio_mean, color=color, linestyle="--", linewidth=0.8)
        if len(r.replan_step):
            bottom.bar(
                r.replan_step + (i - (len(runs) - 1) / 2) * width,
                r.replan_bytes / 1e9,
                width=width,
                color=color,
                label=f"{r.label}: {r.replan_bytes.sum() / 1e9:.2f} GB",
            )
    top.set_ylabel("MaxVio per step")
    top.set_ylim(bottom=0)
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.set_ylabel("GB moved per re-plan")
    bottom.set_xlabel("step")
    bottom.grid(axis="y", alpha=0.3)
    if any(len(r.replan_step) for r in runs):
        bottom.legend(fontsize=7)
    else:
        bottom.text(0.5, 0.5, "no re-plan", ha="center", va="center", transform=bottom.transAxes)
    stream = (data.get("stream") or {}).get("name", "")
    fig.suptitle(f"{data.get('instance', '')}: replay of {stream}".strip())
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def replay_frontier_series(data: dict) -> dict[str, list[tuple[float, float, str, bool]]]:
    """Per policy, its points ``(GB moved, time-averaged MaxVio, label, Pareto)`` sorted by GB,
    from a ``replay --frontier`` report."""
    if data.get("report") != "replay-frontier" or not isinstance(data.get("points"), list):
        raise MoeoptError("not a replay frontier report: write one with moeopt replay --frontier --report")
    out: dict[str, list[tuple[float, float, str, bool]]] = {}
    for p in data["points"]:
        label = f"K={p['interval']}" + ("" if p.get("budget") is None else f" B={p['budget']}")
        out.setdefault(str(p["policy"]), []).append(
            (float(p["moved_bytes"]) / 1e9, float(p["maxvio_mean"]), label, bool(p.get("pareto")))
        )
    return {k: sorted(v) for k, v in out.items()}


def draw_replay_frontier(data: dict, path: str | Path) -> None:
    """Bytes moved (GB) against time-averaged MaxVio, one colour per policy, each point labelled
    with its interval K and budget B; Pareto points ringed."""
    series = replay_frontier_series(data)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for i, (policy, pts) in enumerate(series.items()):
        gb = np.array([p[0] for p in pts])
        mv = np.array([p[1] for p in pts])
        ax.plot(gb, mv, "o", color=f"C{i}", label=policy)  # points, not a path: the grid has no order
        for x, y, label, pareto in pts:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6)
            if pareto:
                ax.plot([x], [y], "o", markersize=11, markerfacecolor="none", markeredgecolor="k")
    ax.set_xlabel("GB moved (all re-plans)")
    ax.set_ylabel("MaxVio (time average)")
    if any(p[0] > 0 for pts in series.values() for p in pts):
        ax.set_xscale("symlog", linthresh=0.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{data.get('instance', '')}: bytes moved vs balance over time (ringed: Pareto)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
