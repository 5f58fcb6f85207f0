"""The plot command and the load bars that solve and compare draw."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from moeopt import console
from moeopt.cli.args import _current_plan, _read_plan_for
from moeopt.errors import MoeoptError
from moeopt.io import (
    load_instance,
)
from moeopt.solve import Workloads, load_workloads


def _plot_loads(
    path: str,
    inst: Any,
    metrics: dict[str, dict],
    workloads: Workloads | None = None,
    *,
    current: Any = None,
    layer: int | None = None,
) -> None:
    """Per-GPU loads of each plan (its ``metrics``) against linear, or against ``current``
    (``--from``), on the instance's evaluation workload: one panel per plan."""
    from moeopt import plot
    from moeopt.evaluate import evaluate, linear_plan

    wl = workloads or load_workloads(inst)
    m = inst.model
    base = current if current is not None else linear_plan(m.layers, m.experts, inst.cluster.gpus)
    before = evaluate(base, wl.evaluation, inst.cluster)
    label = "current" if current is not None else "linear"
    metrics = {k: v for k, v in metrics.items() if k != label} or metrics  # no panel of linear against itself
    panels = [plot.load_bars(v, before, layer=layer, after_label=k, before_label=label) for k, v in metrics.items()]
    plot.draw_loads(panels, path, title=f"{inst.name}: tokens per GPU, {label} vs plan ({plot.scored_on(inst)})")
    console.note(f"wrote {path}")


def _plot_input(path: str) -> dict:
    """A JSON file for ``moeopt plot``: a plan, a solve or compare report, or a frontier file."""
    import json

    from moeopt.io import input_file

    try:
        with open(input_file(path, "the input file"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MoeoptError(f"{path}: not a JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise MoeoptError(f"{path}: expected a JSON object (plan, report or frontier file)")
    return data


def _plot_kind(data: dict) -> str:
    """What a file is drawn as by default: replay report -> replay, replay frontier ->
    replay-frontier, frontier file -> frontier, plan -> loads, report -> gap."""
    if data.get("report") in ("replay", "replay-frontier"):
        return str(data["report"])
    if "points" in data:
        return "frontier"
    if "format" in data:
        return "loads"
    return "gap"


def _reports(data: dict) -> list[dict]:
    """The solve reports in a ``solve --report`` (one) or ``compare --report`` (several) file."""
    return list(data["results"]) if isinstance(data.get("results"), list) else [data]


def cmd_plot(args: argparse.Namespace) -> int:
    from moeopt import plot

    data = _plot_input(args.file)
    kind = args.kind or _plot_kind(data)
    own = _plot_kind(data)
    replays = {"replay": "moeopt replay --report", "replay-frontier": "moeopt replay --frontier --report"}
    if kind != own and own in replays:  # a replay report is drawn as what it is
        raise MoeoptError(f"{args.file}: a {own} report is drawn with --kind {own} (or no --kind), not {kind}")
    if kind != own and kind in replays:
        raise MoeoptError(f"{args.file}: --kind {kind} needs a report of {replays[kind]}")
    if kind == "replay":
        plot.draw_replay(data, args.output)
    elif kind == "replay-frontier":
        plot.draw_replay_frontier(data, args.output)
    elif kind == "frontier":
        plot.draw_frontier(data, args.output)
    elif kind == "gap":
        if "points" in data or "format" in data:
            raise MoeoptError(f"{args.file}: --kind gap needs a solve or compare report (--report)")
        histories = [h for h in map(plot.gap_history, _reports(data)) if h is not None]
        if not histories:
            methods = ", ".join(str(r.get("method")) for r in _reports(data))
            raise MoeoptError(
                f"{args.file}: the report has no history ({methods} solved all layers together and recorded none)"
            )
        plot.draw_gap(histories, args.output, title=f"{data.get('instance', '')}: incumbent and bound per layer")
    else:
        if not args.instance:
            raise MoeoptError("--kind loads needs --instance (the workload the loads are counted on)")
        inst = load_instance(args.instance)
        current = _current_plan(args.from_plan, args.from_format, inst) if args.from_plan else None
        wl = load_workloads(inst)
        if "format" in data:
            from moeopt.evaluate import evaluate

            pf = _read_plan_for(args.file, inst)
            metrics = {pf.method or Path(args.file).stem: evaluate(pf.plan, wl.evaluation, inst.cluster)}
        elif "points" in data:
            raise MoeoptError(f"{args.file}: a frontier file has no plans; --kind loads needs a plan or a report")
        else:
            metrics = {str(r.get("method")): r.get("metrics") or {} for r in _reports(data)}
            if not all("loads" in m for m in metrics.values()):
                raise MoeoptError(f"{args.file}: the report carries no per-GPU loads")
        _plot_loads(args.output, inst, metrics, wl, current=current, layer=args.layer)
        return 0
    console.note(f"wrote {args.output}")
    return 0
