"""Benchmark pages of the documentation, generated from ``benchmarks/results/*.json``.

Every number on these pages is read from a results file when the site is built
(``docs/hooks.py`` calls :func:`pages`); nothing is copied by hand. Each page names the
machine and git commit the results file records, its figures, and the command that
regenerates it.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _benchmark_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (with ``benchmarks/`` on the path, as when it runs)."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(rows: list[list[Any]], headers: list[str]) -> str:
    """A GitHub-style Markdown table (``tabulate``), numbers already formatted as strings."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def num(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, ``-`` when missing."""
    return "-" if value is None else f"{value:.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    """A signed percentage, ``-`` when missing."""
    return "-" if value is None else f"{value:+.{digits}f} %"


def mean(values: list[float]) -> float:
    return statistics.fmean(values)


@dataclass(frozen=True)
class Benchmark:
    """One results file and how its page is written."""

    name: str
    title: str
    command: str
    render: Callable[[dict], str]
    figures: tuple[str, ...] = ()
    method_page: str | None = None


def provenance(data: dict) -> tuple[str, str, str]:
    """(machine, git commit, date or wall time) as the results file records them."""
    info = data.get("info") or data.get("meta") or {}
    machine: Any = info.get("machine", data.get("machine"))
    commit = "not recorded by this benchmark"
    if isinstance(machine, dict):
        commit = machine.get("git_commit") or commit
        parts = [str(machine.get("machine", "?"))]
        if "cpus" in machine:
            parts.append(f"{machine['cpus']} CPUs")
        if "python" in machine:
            parts.append(f"Python {machine['python']}")
        if "load_average" in machine:
            parts.append("load average " + ", ".join(f"{x:.2f}" for x in machine["load_average"]))
        machine = ", ".join(parts)
    if machine is None and "device" in data:
        dev = data["device"]
        machine = f"{dev.get('type')}: {dev.get('name')}, torch {dev.get('torch')}, {dev.get('threads')} thread(s)"
    when = data.get("generated") or info.get("date")
    wall = info.get("wall_s", info.get("wall_time_s", data.get("elapsed_s", data.get("wall_seconds"))))
    if wall is None and isinstance(info.get("seconds"), dict):
        wall = sum(info["seconds"].values())
    extra = []
    if when:
        extra.append(str(when))
    if wall is not None:
        extra.append(f"{wall:.0f} s of wall time")
    return str(machine or "not recorded"), str(commit), ", ".join(extra) or "not recorded"


# --------------------------------------------------------------------------- balance
def render_balance(d: dict) -> str:
    rows = d["rows"]
    out = ["## DeepSeek-V3 loads (58 layers × 256 experts)", ""]
    body = []
    for r in rows:
        if r["workload"] != "deepseek-v3":
            continue
        body.append(
            [
                f"{r['calibration']} → {r['evaluation']}",
                f"{r['gpus']} × ({r['slots']})",
                r["method"],
                num(r["maxvio_even"], 4),
                num(r["maxvio_lp"], 4),
                num(r.get("bound_maxvio"), 4),
                num(r.get("gap"), 4),
                num(r.get("algorithm_s"), 2),
                num(r["wall_s"], 2),
            ]
        )
    heads = ["calibration → evaluation", "GPUs × slots", "method", "MaxVio (even)", "MaxVio (lp)"]
    heads += ["lower bound", "gap", "algorithm (s)", "wall (s)"]
    out += [table(body, heads), ""]

    out += ["## `balance` against EPLB (global), same setting", ""]
    by = {}
    for r in rows:
        by[(r["workload"], r["calibration"], r["evaluation"], r["gpus"], r["slots"], r["method"])] = r
    body = []
    for key, r in by.items():
        if key[-1] != "balance":
            continue
        e = by.get(key[:-1] + ("eplb-global",))
        if e is None:
            continue
        body.append(
            [
                key[0],
                f"{key[1]} → {key[2]}",
                f"{key[3]} × ({key[4]})",
                num(e["maxvio_even"], 4),
                num(r["maxvio_even"], 4),
                num(r["maxvio_even"] / e["maxvio_even"], 2) + "x",
                num(e.get("maxvio_lp"), 4),
                num(r.get("maxvio_lp"), 4),
            ]
        )
    heads = ["workload", "calibration → evaluation", "GPUs × slots", "EPLB MaxVio (even)", "balance MaxVio (even)"]
    heads += ["ratio", "EPLB MaxVio (lp)", "balance MaxVio (lp)"]
    out += [table(body, heads), ""]

    moves = [r for r in rows if r.get("moves_from_eplb")]
    if moves:
        out += ["## Expert weights moved from the EPLB plan (`solve --from`)", ""]
        body = [
            [
                f"{r['calibration']}",
                f"{r['gpus']} × ({r['slots']})",
                r["moves_from_eplb"]["full_plan"],
                r["moves_from_eplb"]["to_tenth_of_eplb"],
                num(r["moves_from_eplb"]["maxvio_at_tenth"], 4),
                r["moves_from_eplb"]["slots"],
            ]
            for r in moves
        ]
        heads = ["loads", "GPUs × slots", "moves, full plan", "moves to a tenth of EPLB's MaxVio", "MaxVio reached"]
        out += [table(body, heads + ["slots in all"]), ""]

    stepped = [r for r in rows if "maxvio_step_even" in r]
    if stepped:
        out += ["## Per-step loads, held out (count-sampled from real per-domain counts)", ""]
        out += [
            "Planned on the calibration trace's steps, scored on another trace of the same mix; "
            "`balance` plans on the steps (`robust: auto`), `balance-pooled` on the pooled loads.",
            "",
        ]
        body = [
            [
                r["workload"],
                r["calibration"],
                f"{r['gpus']} × ({r['slots']})",
                r["method"],
                num(r["maxvio_step_even"], 4),
                num(r["maxvio_even"], 4),
            ]
            for r in stepped
        ]
        heads = ["workload", "calibration", "GPUs × slots", "method", "per-step MaxVio (even)", "pooled MaxVio (even)"]
        out += [table(body, heads), ""]

    out += ["## OLMoE per-domain counts", ""]
    body = [
        [
            f"{r['calibration']} → {r['evaluation']}",
            f"{r['gpus']} × ({r['slots']})",
            r["method"],
            num(r["maxvio_even"], 4),
            num(r["maxvio_lp"], 4),
            num(r["wall_s"], 2),
        ]
        for r in rows
        if r["workload"] == "olmoe"
    ]
    out += [
        table(body, ["calibration → evaluation", "GPUs × slots", "method", "MaxVio (even)", "MaxVio (lp)", "wall (s)"])
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- crosslayer
def _crosslayer_cell(r: dict, top_k: bool = True) -> tuple[str, str]:
    """A crosslayer row's shape (named after its real data, if any) and dependency."""
    shape = f"{r['gpus']} × {r['experts']}" + (f" (top-{r['top_k']})" if top_k else "")
    workload = r.get("workload", "synthetic")
    dep = r["layer_dependency"]
    return (
        shape if workload == "synthetic" else f"{workload}: {shape}",
        "none (count-sampled)" if dep is None else num(dep, 1),
    )


def render_crosslayer(d: dict) -> str:
    info = d["info"]
    out = [
        f"{info.get('layers')} layers, {info.get('tokens')} tokens per trace; remote GPUs per token per layer on the "
        "held-out trace, under `uniform` and `previous-layer` token homes; change vs `agnostic` as planned.",
        "",
    ]
    body = [
        [
            *_crosslayer_cell(r),
            r["method"],
            num(r["remote_uniform"]),
            num(r["remote_previous_layer"]),
            pct(-r["reduction_vs_agnostic_pct"]) if r.get("reduction_vs_agnostic_pct") is not None else "-",
            num(r["remote_previous_layer_weighted"]),
            num(r["maxvio_heldout"]),
            num(r["wall_s"], 1),
        ]
        for r in d["rows"]
    ]
    heads = ["GPUs × experts", "dependency", "method", "remote, uniform", "remote, previous-layer", "vs agnostic"]
    heads += ["weighted, previous-layer", "held-out MaxVio", "wall (s)"]
    out.append(table(body, heads))
    cl = [r for r in d["rows"] if r["method"] == "crosslayer" and r.get("maxvio_above_agnostic") is not None]
    if cl:
        out += [
            "",
            "Done-when check of the issue (`crosslayer` at least 10 % below `agnostic` under `previous-layer`, "
            "held-out MaxVio at most 0.02 above `agnostic`'s). Stay ceiling: the plan's figure if every token at "
            "layers ≥ 1 found an expert on its home GPU, at the plan's own spans.",
            "",
        ]
        summary = [
            [
                *_crosslayer_cell(r, top_k=False),
                pct(-r["reduction_vs_agnostic_pct"]),
                num(r["maxvio_above_agnostic"]),
                pct(-r["stay_ceiling_vs_agnostic_pct"]) if r.get("stay_ceiling_vs_agnostic_pct") is not None else "-",
                "(control)"
                if not r["layer_dependency"]
                else "yes"
                if r["reduction_vs_agnostic_pct"] >= 10.0 and r["maxvio_above_agnostic"] <= 0.02
                else "no",
            ]
            for r in cl
        ]
        heads = ["GPUs × experts", "dependency", "crosslayer vs agnostic", "MaxVio − agnostic's", "stay ceiling"]
        out.append(table(summary, heads + ["met"]))
    return "\n".join(out)


# --------------------------------------------------------------------------- certificates
def render_certificates(d: dict) -> str:
    info = d["info"]
    out = [
        f"{num(info.get('time_limit'), 0)} s per bound method and cell; gap = (bound − best plan) / bound, the best "
        "plan being the best of `agnostic`'s, CP-SAT's and the column generation's restricted master MILP; "
        "best: the smallest of the (valid) bounds. `target`: the gap the certificates issue asks for, checked on "
        "the best bound.",
        "",
    ]

    def gap(entry: dict | None) -> str:
        return "-" if not entry or entry.get("gap") is None else f"{100 * entry['gap']:.2f} %"

    body = []
    for c in d["cells"]:
        target, met = c.get("target"), c.get("met")
        body.append(
            [
                c["kind"],
                str(c["E"]),
                str(c["G"]),
                str(c["cap"]),
                gap(c.get("lagrangian")),
                gap(c.get("cpsat")),
                gap(c.get("colgen")),
                gap(c.get("triangle")),
                gap({"gap": c.get("best_gap")}),
                "-" if target is None else f"{100 * target:.0f} %",
                "-" if met is None else ("yes" if met else "no"),
            ]
        )
    heads = ["instance", "E", "G", "slots / GPU", "Lagrangian gap", "CP-SAT gap", "column generation gap"]
    heads += ["triangle gap", "best gap", "target", "met"]
    out.append(table(body, heads))
    gem = d.get("gem")
    if gem:
        out += ["", "## GEM layers (straggler latency, E = 64 top-8)", ""]
        body = [
            [
                c["trace"],
                str(c["G"]),
                str(c["layer"]),
                num(c["best_S"], 4),
                f"{100 * c['best_gap']:.2f} %",
                "yes" if c["met"] else "no",
            ]
            for c in gem["cells"]
        ]
        out.append(table(body, ["trace", "G", "layer", "best S (ms)", "best gap", "≤ 3 %"]))
    return "\n".join(out)


def render_gcg(d: dict) -> str:
    gcg = _benchmark_script("gcg")  # the rows the benchmark writes to gcg.md
    return "\n".join([gcg.setting(d["info"]), "", table(gcg.table_rows(d), gcg.HEAD)])


# --------------------------------------------------------------------------- gem
GEM_KEYS = ("S_vs_linear", "p90_vs_linear", "S_vs_greedy", "S_vs_speed-greedy")


def render_gem(d: dict) -> str:
    rows = d["rows"]
    groups: list[tuple[str, list[dict]]] = []
    for v in dict.fromkeys(r["variability"] for r in rows):
        groups.append((f"variability {v}", [r for r in rows if r["variability"] == v]))
    for kind in dict.fromkeys(r["trace"] for r in rows):
        groups.append((f"trace {kind}", [r for r in rows if r["trace"] == kind]))
    groups.append(("count-sampled, 4 GPUs", [r for r in rows if r["trace"] != "bursty" and r["gpus"] == 4]))
    groups.append(("all", rows))
    out = [
        f"{d.get('steps')} steps of {d.get('tokens_per_step')} tokens; `gem`'s improvement in straggler latency S "
        "and p90 step latency, out of sample, mean / max over the configurations (positive = faster).",
        "",
    ]
    body = []
    for label, sel in groups:
        if not sel:
            continue
        line: list[Any] = [label, len(sel)]
        for key in GEM_KEYS:
            v = [r["methods"]["gem"][key] for r in sel]
            line.append(f"{mean(v):+.1f} / {max(v):+.1f}")
        gaps = [
            r["methods"]["gem"]["gap_to_optimum"] for r in sel if r["methods"]["gem"].get("gap_to_optimum") is not None
        ]
        line.append("-" if not gaps else f"{100 * max(gaps):.2f} ({len(gaps)})")
        body.append(line)
    heads = ["configurations", "n", "S vs linear %", "p90 vs linear %", "S vs greedy %", "S vs speed-greedy %"]
    out += [table(body, heads + ["max gap to proved optimum % (n)"]), "", "## Every configuration", ""]
    gem = _benchmark_script("gem")  # its own per-configuration table, as the benchmark prints it
    body = [[str(v) for v in line] for line in gem.summary_rows(rows)]
    heads = list(gem.HEADERS)
    out.append(table(body, heads))
    return "\n".join(out)


# --------------------------------------------------------------------------- gesr
GESR_PLANS = ("base_plan", "gesr", "gesr-tuned", "hottest-replication", "random-replication")


def render_gesr(d: dict) -> str:
    summ = d["info"]["summary"]
    out = [
        "Means over the synthetic TACG workloads, evaluation trace; `mixed` is the family mix, `single-family` the "
        "mean over each family's own workload (comm = remote GPUs per token per layer, guard-dispatched).",
        "",
    ]
    body = []
    for slots in d["info"]["budgets"]:
        mixed, ood = summ.get(f"slots{slots}_mixed"), summ.get(f"slots{slots}_ood")
        if not mixed:
            continue
        for plan in GESR_PLANS:
            m, o = mixed[plan], ood[plan]
            body.append(
                [slots, plan, num(m["jain"], 4), num(m["maxvio"], 4), num(m["comm_per_token"]), num(o["maxvio"])]
            )
    heads = ["replica slots / GPU", "plan", "Jain (mixed)", "MaxVio (mixed)", "comm (mixed)", "MaxVio (single-family)"]
    out += [table(body, heads), "", "## Every workload", ""]
    body = []
    for r in d["rows"]:
        line = [r["workload"], r["evaluation"], r["base"], r["replica_slots"]]
        for plan in GESR_PLANS:
            p = r[plan]
            value = p["maxvio"] if p.get("maxvio") is not None else None
            line.append(num(value, 4))
        c = r.get("certificate") or {}
        line.append(f"{num(c.get('bound_maxvio'))} ({c.get('status', '-')})")
        body.append(line)
    heads = ["workload", "evaluation", "base", "slots", "MaxVio base", "+GESR", "+GESR tuned", "+hottest", "+random"]
    out += [table(body, heads + ["replication bound (status)"]), ""]
    cert = [r["certificate"] for r in d["rows"] if r.get("certificate")]
    optimal = sum(c.get("status") == "optimal" for c in cert)
    out.append(f"The replication certificate proved the optimum in {optimal} of {len(cert)} cases.")
    return "\n".join(out)


# --------------------------------------------------------------------------- joint
def render_joint(d: dict) -> str:
    info = d["info"]
    target = info["target_maxvio"]
    out = [
        f"`joint` at `eps` {', '.join(str(e) for e in info['joint_eps'])} ({info['joint_seconds_per_layer']} s of "
        f"search per layer) against the other methods, every plan scored on a held-out split. Target: held-out "
        f"MaxVio ≤ {target}. The frontier's `joint` plans run under `locality`, a research rule no serving "
        "engine runs; the first section scores `joint` made for each engine's rule under that rule.",
        "",
    ]
    rules = d.get("rules") or []
    if rules:
        goal = info.get("rule_target", 1.3)
        body = []
        for r in rules:
            a, b, u = r["agnostic"], r["best"], r["locality_joint_under_rule"]
            body.append(
                [
                    r["instance"],
                    r["replica_slots"],
                    f"`{r['rule']}`",
                    f"{num(a['reduction'], 1)} % at {num(a['maxvio'])}",
                    "-" if b is None else f"{num(b['reduction'], 1)} % at {num(b['maxvio'])} (eps {b['eps']})",
                    "-" if r["ratio"] is None else f"{r['ratio']:.2f}× " + ("(met)" if r["met"] else "(not met)"),
                    f"{num(u['reduction'], 1)} % at {num(u['maxvio'])}",
                ]
            )
        heads = ["instance", "replica slots", "rule", "`agnostic`: cut at held-out MaxVio"]
        heads += ["`joint` made for the rule: best cut at MaxVio ≤ agnostic's", f"ratio (target {goal}×)"]
        heads += ["default `joint` (`locality`) under the rule"]
        out += ["## Under the engines' rules", "", table(body, heads), ""]
    out += ["## Summary (`locality`)", ""]
    body = []
    for s in d["summary"]:
        best = s.get("joint_best_at_target") or {}
        w = s["worst_family_maxvio"]
        body.append(
            [
                s["instance"],
                s["replica_slots"],
                num(s["unconstrained_reduction"], 1),
                f"{num(best.get('reduction'), 1)} % at {num(best.get('maxvio'))}" if best else "-",
                (
                    f"{100 * best['share_of_unconstrained']:.1f} % "
                    + ("(met)" if best["share_of_unconstrained"] >= info["target_share"] else "(not met)")
                )
                if best and best.get("share_of_unconstrained") is not None
                else "-",
                len(s["other_points_beating_a_joint_point"]),
                f"{num(w['joint_min_over_eps'], 2)} – {num(w['joint_max_over_eps'], 2)}",
                num(w["hottest_replication"], 2),
                "-"
                if w["joint_max_over_eps"] is None or w["hottest_replication"] is None
                else ("yes" if w["joint_max_over_eps"] < w["hottest_replication"] else "no"),
            ]
        )
    heads = ["instance", "replica slots", "unconstrained grouping: reduction %", f"`joint`, best at MaxVio ≤ {target}"]
    heads += ["share of the unconstrained reduction", "other plans beating a `joint` plan on both axes"]
    heads += ["worst single-family MaxVio, `joint` over `eps`", "… `hottest-replication`"]
    heads += ["`joint`'s below at every `eps`"]
    out += [table(body, heads), ""]
    for f in d["frontiers"]:
        out += [f"## {f['instance']}, {f['replica_slots']} replica slot(s) per GPU", ""]
        body = []
        for p in sorted(f["points"], key=lambda p: (p.get("maxvio") is None, p.get("maxvio") or 0.0)):
            label = p["method"] + ("" if p.get("eps") is None else f" eps={p['eps']}")
            if p.get("error"):
                body.append(["", label, "-", "-", "-", "-", p["error"][:80]])
                continue
            body.append(
                [
                    "*" if p.get("pareto") else "",
                    label,
                    num(p["comm_per_token"], 4),
                    num(p["comm_reduction"], 2),
                    num(p["maxvio"], 4),
                    num(p.get("worst_family_maxvio")),
                    p.get("dispatch", "-"),
                ]
            )
        heads = ["Pareto", "plan", "remote GPUs/token", "reduction vs linear %", "held-out MaxVio"]
        out += [table(body, heads + ["worst family MaxVio", "dispatch"]), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- scale
def render_scale(d: dict) -> str:
    info = d["info"]
    out = [f"Whole model: {info['layers']} layers, {info['tokens']} tokens; fixed work budgets per method.", ""]
    body = [
        [
            r["method"],
            r["executor"],
            num(r["wall_s"], 2),
            num(r.get("layer_sum_s"), 2),
            num(r.get("layer_cpu_s"), 2),
            "yes" if r.get("same_plan_as_serial") else "no",
        ]
        for r in d["whole_model"]
    ]
    out += [table(body, ["method", "executor", "wall (s)", "layer sum (s)", "layer CPU (s)", "same plan as serial"])]
    out += ["", "## Paired runs: serial vs `--workers 2`", ""]
    body = [
        [
            p["method"],
            p["layers"],
            ", ".join(num(x, 1) for x in p["serial_s"]),
            ", ".join(num(x, 1) for x in p["2_workers_s"]),
            num(p["median_speedup"], 2) + "x",
            ", ".join(num(x, 2) for x in p.get("cpus_available", [])),
        ]
        for p in d["paired"]
    ]
    out += [table(body, ["method", "layers", "serial (s)", "2 workers (s)", "median speed-up", "CPUs free (probe)"])]
    out += ["", "## One layer: cost vs experts and tokens (seconds)", ""]
    methods = [m for m in d["info"]["methods"] if m in d["one_layer"][0]]
    body = [
        [r["experts"], f"{r['tokens']:,}", num(r["stats_s"])] + [num(r.get(m)) for m in methods] for r in d["one_layer"]
    ]
    out += [table(body, ["E", "tokens", "trace → statistics"] + methods)]
    out += ["", "## Estimate (not measured): a Ray cluster of 16 nodes", ""]
    body = [
        [
            e["method"],
            num(e["serial_s"], 1),
            num(e["2_workers_s"], 1),
            num(e["slowest_layer_s"], 2),
            num(e["ray_overhead_s"], 1),
            num(e["16x2_cpus_s"], 1),
            num(e["16x8_cpus_s"], 1),
        ]
        for e in d["cluster_estimate"]
    ]
    heads = ["method", "serial (s)", "2 workers (s)", "slowest layer (s)", "Ray overhead (s)", "16 × 2 CPUs (s)"]
    out += [table(body, heads + ["16 × 8 CPUs (s)"]), ""]
    st = d["startup"]
    out.append(
        f"Start-up: process pool {num(st['pool_start_s'], 2)} s, local Ray {num(st['ray_init_s'], 2)} s to start and "
        f"{num(st['ray_shutdown_s'], 2)} s to stop."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------- tacg
def render_tacg(d: dict) -> str:
    a = d["a"]
    workloads = list(a)
    shapes = [w for w in workloads if "count-sampled" not in w and "olmoe" not in w]
    methods = list(a[workloads[0]]["methods"])
    out = [
        "Reduction of remote GPUs per token vs linear (%) per workload; MaxVio, Jain and wall time averaged over the "
        f"synthetic shapes ({', '.join(shapes)}); `@tacg-limit`: under `tacg`'s automatic per-layer load limits.",
        "",
        "## Summary",
        "",
    ]
    body = []
    for m in methods:
        line = [m]
        for w in workloads:
            r = a[w]["methods"].get(m)
            line.append(num(r.get("comm_reduction_vs_linear") or 0.0, 2) if r else "-")
        rs = [a[w]["methods"][m] for w in shapes if m in a[w]["methods"]]
        line += [num(mean([r["maxvio"] for r in rs])), num(mean([r["jain"] for r in rs]), 4)]
        line.append(num(mean([r.get("wall_time", 0.0) for r in rs]), 2))
        body.append(line)
    heads = ["method"] + [f"{w} red. %" for w in workloads] + ["MaxVio (mean)", "Jain (mean)", "wall s (mean)"]
    out += [table(body, heads), ""]

    families = list(a[shapes[0]].get("ood", {}))
    if families:
        out += ["## Single-family (OOD) workloads, same plans (mean over the shapes)", ""]
        body = []
        for m in methods:
            if not all(m in a[w]["ood"][f] for w in shapes for f in families):
                continue
            line = [m, num(mean([a[w]["methods"][m]["maxvio"] for w in shapes]), 2)]
            for f in families:
                mv = mean([a[w]["ood"][f][m]["maxvio"] for w in shapes])
                red = mean([a[w]["ood"][f][m].get("comm_reduction_vs_linear") or 0.0 for w in shapes])
                line.append(f"{mv:.2f}; {red:.1f} %")
            body.append(line)
        out += [table(body, ["method", "MaxVio mixed"] + [f"{f}: MaxVio; red." for f in families]), ""]

    out += ["## Exact solvers on one grouping layer", ""]
    body = []
    runs: list[str] = []
    for cell in d["b"].values():
        runs += [k for k in cell if "@" in k and k not in runs]
    for cell in d["b"].values():
        h = cell["tacg"]
        line = [cell["E"], cell["G"], num(cell["eps_load"])]
        line.append(f"{h['objective']:.4f} / {h['bound']:.4f} ({100 * h['gap']:.1f} %, {h['wall_time']:.1f} s)")
        for k in runs:
            r = cell.get(k)
            if not r:
                line.append("-")
            elif r.get("status") in (None, "refused") or r.get("incumbent") is None:
                line.append(str(r.get("status", "refused")))
            else:
                line.append(
                    f"{r['status']}: {r['incumbent']:.4f} / {r['bound']:.4f} ({100 * r['gap']:.1f} %, "
                    f"{r['wall_time']:.1f} s)"
                )
        body.append(line)
    out.append(table(body, ["E", "G", "eps_load", "tacg heuristic: obj / bound (gap, wall)"] + runs))
    return "\n".join(out)


# --------------------------------------------------------------------------- task signal
def render_task_signal(d: dict) -> str:
    rows = d["rows"]
    out = [
        "Reduction of remote GPUs per token vs linear (%), mean over the structure seeds, for mixture-calibrated "
        "plans evaluated on a fresh mixture and on each single-family workload.",
        "",
    ]
    for structure in dict.fromkeys(r["structure"] for r in rows):
        sel = [r for r in rows if r["structure"] == structure]
        workloads = list(sel[0]["reduction"])
        body = []
        for m in dict.fromkeys(r["method"] for r in sel):
            rs = [r for r in sel if r["method"] == m]
            line = [m] + [num(mean([r["reduction"][w] for r in rs]), 2) for w in workloads]
            ood = [mean([r["reduction"][w] for r in rs]) for w in workloads if w != "mixture"]
            line += [num(mean(ood), 2), num(mean([r["maxvio"] for r in rs]))]
            body.append(line)
        out += [f"## communities: {structure}", "", table(body, ["method"] + workloads + ["OOD mean", "MaxVio"]), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- harness
def render_harness(d: dict) -> str:
    ffn = d["ffn"]
    out = [
        f"Instance `{d['instance']}`, {d['gpus']} emulated GPUs, {d['layers']} layers, {d['steps']} steps; expert FFN "
        f"d_model {ffn['d_model']}, d_ff {ffn['d_ff']}, {ffn['dtype']}; timing {d['timing']['timer']}, "
        f"{d['timing']['statistic']} of {d['timing']['repeats']} rounds; speeds "
        f"{', '.join(str(s) for s in d['speeds'])} ({d['speed_source']}).",
        "",
    ]
    body = [
        [
            p["name"],
            num(p["measured_straggler_ms"]),
            num(p["modelled_straggler"]),
            num(p["measured_over_modelled"]),
            pct(p.get("measured_improvement_vs_linear")),
            pct(p.get("modelled_improvement_vs_linear")),
            num(p["step_correlation"]),
        ]
        for p in d["plans"]
    ]
    heads = ["plan", "measured S (ms)", "modelled S (ms)", "measured / modelled", "vs linear, measured"]
    out += [table(body, heads + ["vs linear, modelled", "per-step corr."]), ""]
    rk = d["ranking"]
    out.append(
        f"Ranking measured {' < '.join(rk['measured'])}, modelled {' < '.join(rk['modelled'])}: Kendall tau "
        f"{num(rk['kendall_tau'], 2)}, {'agrees' if rk['agrees'] else 'disagrees'}. All-to-all: "
        + ("ran" if d["all_to_all"].get("ran") else f"not run ({d['all_to_all'].get('reason')})")
        + "."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------- replay
def render_replay(d: dict) -> str:
    return str(_benchmark_script("replay").body(d))  # the tables the benchmark writes to replay.md


# --------------------------------------------------------------------------- limits
def render_limits(d: dict) -> str:
    body = str(_benchmark_script("limits").body(d))  # the tables the benchmark writes to limits.md
    return body.split("\n", 1)[1].lstrip("\n")  # the page has its own title


# --------------------------------------------------------------------------- install
def render_install(d: dict) -> str:
    summary = d["summary"]
    out = [
        "The core install (`pip install -e .`) beside the core with the extras `plot` and `sdp`, whose",
        "matplotlib and CVXPY were core dependencies before they moved to those extras: each run a fresh",
        "virtual environment, no pip cache, the variants alternating. pip's CPU time is user + system of",
        "pip and every process it starts; the wall time follows the machine's load.",
        "",
    ]
    body = [
        [
            s["variant"],
            f"`{s['install']}`",
            s["size_mb"],
            s["packages"],
            num(s["cpu_s"], 1),
            f"{num(s['wall_s'], 1)} ({num(s['wall_min_s'], 1)} to {num(s['wall_max_s'], 1)})",
            s["runs"],
        ]
        for s in summary
    ]
    heads = ["variant", "install", "site-packages (MB)", "packages", "pip CPU (s, median)", "wall (s, median, range)"]
    out += [table(body, heads + ["runs"]), ""]
    if d["info"].get("index"):
        out += [f"Packages from {d['info']['index']}.", ""]
    if d["info"].get("note"):
        out += [d["info"]["note"], ""]
    extra = summary[-1].get("extra_packages") or []
    if extra:
        out += [f"The packages `plot` and `sdp` add ({len(extra)}): " + ", ".join(f"`{n}`" for n in extra) + ".", ""]
    runs = [
        [r["variant"], r["run"], r["size_mb"], r["packages"], num(r["cpu_s"], 1), num(r["wall_s"], 1)]
        for r in d["rows"]
    ]
    out += ["## Every run", "", table(runs, ["variant", "run", "MB", "packages", "pip CPU (s)", "wall (s)"]), ""]
    return "\n".join(out)


BENCHMARKS = (
    Benchmark(
        "balance",
        "Balance vs DeepSeek's EPLB",
        "python benchmarks/balance.py",
        render_balance,
        ("balance.png",),
        "balance",
    ),
    Benchmark("tacg", "TACG", "python benchmarks/tacg.py --full", render_tacg, ("tacg_frontier.png",), "tacg"),
    Benchmark(
        "task_signal", "Does the task signal help?", "python benchmarks/task_signal.py", render_task_signal, (), "tacg"
    ),
    Benchmark(
        "certificates",
        "Grouping certificates",
        "python benchmarks/certificates.py",
        render_certificates,
        ("certificates.png",),
        "tacg",
    ),
    Benchmark(
        "gcg",
        "GCG against column generation",
        'pip install "pygcgopt==0.4.0" "pyscipopt==5.2.1" && python benchmarks/gcg.py',
        render_gcg,
        (),
        "tacg",
    ),
    Benchmark("gesr", "GESR", "python benchmarks/gesr.py", render_gesr, (), "gesr"),
    Benchmark("gem", "GEM", "python benchmarks/gem.py", render_gem, (), "gem"),
    Benchmark("joint", "Joint planner", "python benchmarks/joint.py", render_joint, ("joint.png",), "joint"),
    Benchmark("replay", "Re-planning online", "python benchmarks/replay.py", render_replay, ("replay.png",)),
    Benchmark(
        "crosslayer",
        "Cross-layer placement",
        "python benchmarks/crosslayer.py",
        render_crosslayer,
        ("crosslayer.png",),
        "crosslayer",
    ),
    Benchmark("scale", "Scaling out", "python benchmarks/scale.py", render_scale, ("scale.png",)),
    Benchmark("limits", "Time limits and reproducible certificates", "python benchmarks/limits.py", render_limits),
    Benchmark("install", "Install size and time", "python benchmarks/install.py", render_install),
    Benchmark("harness-cpu", "GPU validation harness, CPU run", "bash benchmarks/harness_gpu.sh cpu", render_harness),
    Benchmark("harness-gpu", "GPU validation harness, GPU run", "bash benchmarks/harness_gpu.sh", render_harness),
)


def present(results: Path = RESULTS) -> list[Benchmark]:
    """The benchmarks whose results file exists (the GPU run only once it has been made)."""
    return [b for b in BENCHMARKS if (results / f"{b.name}.json").exists()]


def load(name: str, results: Path = RESULTS) -> dict:
    """The parsed results file ``benchmarks/results/NAME.json``."""
    return json.loads((results / f"{name}.json").read_text())


def page(b: Benchmark, results: Path = RESULTS) -> str:
    """The Markdown page of one benchmark."""
    data = load(b.name, results)
    machine, commit, when = provenance(data)
    lines = [
        f"# {b.title}",
        "",
        '!!! info "Generated from `benchmarks/results/' + b.name + '.json`"',
        f"    - Machine: {machine}",
        f"    - Git commit: `{commit}`"
        if commit != "not recorded by this benchmark"
        else f"    - Git commit: {commit}",
        f"    - Run: {when}",
        f"    - Reproduce: `{b.command}` (rewrites `benchmarks/results/{b.name}.*`; rebuild the docs after)",
    ]
    if b.method_page:
        lines.append(f"    - Method: [{b.method_page}](../methods/{b.method_page}.md)")
    lines += ["", b.render(data), ""]
    for fig in b.figures:
        if (results / fig).exists():
            lines += [f"![{b.title}]({fig})", ""]
    return "\n".join(lines)


def index_page(headline: str) -> str:
    """The benchmarks landing page: the README's headline table and one line per benchmark."""
    lines = [
        "# Benchmarks",
        "",
        "Every page in this section is generated from `benchmarks/results/*.json` when the site is built; "
        "the scripts under `benchmarks/` write those files. The headline table (the one in the README, "
        "regenerated by `python benchmarks/readme_table.py`):",
        "",
        headline,
        "",
        "| benchmark | results file | reproduce |",
        "|---|---|---|",
    ]
    for b in present():
        lines.append(f"| [{b.title}]({b.name}.md) | `benchmarks/results/{b.name}.json` | `{b.command}` |")
    return "\n".join(lines) + "\n"


def pages(headline: str, results: Path = RESULTS) -> dict[str, str]:
    """Every generated page, keyed by its path under ``docs/``."""
    out = {"benchmarks/index.md": index_page(headline)}
    for b in present(results):
        out[f"benchmarks/{b.name}.md"] = page(b, results)
    return out


def figures(results: Path = RESULTS) -> dict[str, Path]:
    """Every figure the pages show, keyed by its path under ``docs/``."""
    return {
        f"benchmarks/{fig}": results / fig for b in present(results) for fig in b.figures if (results / fig).exists()
    }
