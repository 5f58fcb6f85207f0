"""The README's results table, generated from ``benchmarks/results/*.json``.

``python benchmarks/readme_table.py`` rewrites the block between ``<!-- results:begin -->`` and
``<!-- results:end -->`` in README.md; ``--check`` exits 1 when that block differs from what the
results files give now (``tests/test_docs.py`` runs the same check). The documentation's
benchmark index shows the same table with links to its generated pages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"


def _load(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text())


#: EPLB's policies the README shows beside ``balance`` (benchmark labels ``eplb-<policy>``)
EPLB_POLICIES = ("global", "hierarchical")


def _auto_ran(rows: list[dict]) -> str:
    """``; SGLang's default `auto` = <policy>`` when every ``eplb-auto`` row of ``rows`` ran one
    policy (the benchmark records it), else nothing."""
    ran = {r.get("policy_resolved") for r in rows if r["method"] == "eplb-auto"}
    return f"; SGLang's default `auto` = {ran.pop()}" if len(ran) == 1 and None not in ran else ""


def _balance_rows(results: Path) -> list[tuple[str, str, str, str]]:
    rows = _load(results, "balance")["rows"]
    by = {
        (r["calibration"], r["evaluation"], r["gpus"], r["method"]): r for r in rows if r["workload"] == "deepseek-v3"
    }
    what = "`balance` vs DeepSeek's EPLB (" + " / ".join(EPLB_POLICIES) + ")"
    out = []
    for calib, ev in (("prefill", "prefill"), ("decode", "decode"), ("prefill", "decode")):
        b = by[(calib, ev, 64, "balance")]
        eplb = [by[(calib, ev, 64, f"eplb-{p}")] for p in EPLB_POLICIES]

        def each(key: str, fmt: str = ".4f", eplb: list[dict] = eplb) -> str:
            return " / ".join(f"{e[key]:{fmt}}" for e in eplb)

        sample = "in sample" if calib == ev else f"planned on {calib}, scored on {ev}"
        result = f"MaxVio {b['maxvio_even']:.4f} vs {each('maxvio_even')} (`even`), "
        lp = by.get((calib, ev, 64, "balance-lp"))  # the plan made for lp dispatch (copy graph connected)
        if lp is not None:
            result += f"{lp['maxvio_lp']:.4f} (`dispatch: lp`) vs {each('maxvio_lp')} (`lp`)"
        else:
            result += f"{b['maxvio_lp']:.4f} vs {each('maxvio_lp')} (`lp`)"
        if calib == ev:
            result += f"; {b['algorithm_s']:.2f} s vs {each('algorithm_s', '.2f')} s; gap to bound {b['gap']:.4f}"
        auto = [r for r in (by.get((calib, ev, 64, "eplb-auto")),) if r is not None]
        out.append(
            (what, f"DeepSeek-V3 {calib} loads, 64 GPUs × (4+1) slots, {sample}{_auto_ran(auto)}", result, "balance")
        )
    ascend = _load(results, "balance").get("ascend", [])
    if ascend:
        cells = sorted({(r["gpus"], r["slots"], r["calibration"]) for r in ascend}, reverse=True)
        at = {(r["gpus"], r["slots"], r["calibration"], r["method"]): r for r in ascend}
        made = [at[c + ("balance (ascend)",)]["maxvio_ascend"] for c in cells]
        even = [at[c + ("balance (even)",)]["maxvio_ascend"] for c in cells]
        eplb = [at[c + ("eplb-global",)]["maxvio_ascend"] for c in cells if c + ("eplb-global",) in at]
        bound = [at[c + ("balance (ascend)",)]["bound_ascend"] for c in cells]
        out.append(
            (
                "`balance` for vLLM-Ascend's rule",
                f"DeepSeek-V3 prefill and decode loads in sample, {len({c[:2] for c in cells})} shapes (64 × (4+1), "
                "32 × (8+1)), scored under `ascend` (rank r uses copy r mod c)",
                f"MaxVio {min(made):.4f} to {max(made):.4f} (`dispatch: ascend`) vs {min(even):.4f} to "
                f"{max(even):.4f} (the `even` plan exported)"
                + (f", EPLB global {min(eplb):.4f} to {max(eplb):.4f}" if eplb else "")
                + f"; lower bound under the rule {max(bound):.4f}",
                "balance",
            )
        )
    static = _load(results, "balance").get("static", [])
    if static:
        at = {(r["calibration"], r["gpus"], r["method"]): r for r in static}
        cells = sorted({(r["calibration"], r["gpus"]) for r in static})

        def span(method: str) -> str:
            v = [at[c + (method,)]["maxvio_static"] for c in cells if c + (method,) in at]
            return f"{min(v):.4f} to {max(v):.4f}" if v else "-"

        out.append(
            (
                "`balance` for SGLang's `static` rule (DeepEP)",
                f"{len(cells)} cells in sample (DeepSeek-V3 prefill and decode at 64 × (4+1) and 32 × (8+1), 8 GPUs "
                "a node, 3 dense rows; OLMoE at 16 × (4+1) and 8 × (8+1)), scored under `static` (SGLang's "
                "seeded draw replayed)",
                f"MaxVio {span('balance (static)')} (`dispatch: static`: planned for the draw) vs "
                f"{span('balance (even)')} (the `even` plan), EPLB global {span('eplb-global')}, "
                f"hierarchical {span('eplb-hierarchical')}",
                "balance",
            )
        )
    stepped = [r for r in rows if "maxvio_step_even" in r]

    def of(method: str) -> dict:
        return {(r["workload"], r["calibration"], r["gpus"]): r for r in stepped if r["method"] == method}

    ours = of("balance")
    parts, lower = [], []
    for p in EPLB_POLICIES:
        eplb = of(f"eplb-{p}")
        pairs = [(ours[c], eplb[c]) for c in ours if c in eplb]
        if pairs:
            ratio = [b["maxvio_step_even"] / e["maxvio_step_even"] for b, e in pairs]
            parts.append(f"{min(ratio):.2f}× to {max(ratio):.2f}× EPLB {p}'s")
            lower.append(f"{sum(b['maxvio_even'] < e['maxvio_even'] for b, e in pairs)} of {len(pairs)} ({p})")
    if parts:
        cells = len(ours)
        out.append(
            (
                what,
                f"per-step loads held out, {cells} configurations (count-sampled, real OLMoE / Mixtral counts, "
                f"no router groups){_auto_ran(stepped)}",
                f"per-step MaxVio {', '.join(parts)} (`robust: auto`); pooled MaxVio below EPLB's in "
                + ", ".join(lower),
                "balance",
            )
        )
    return out


def _joint_rows(results: Path) -> list[tuple[str, str, str, str]]:
    data = _load(results, "joint")
    target = data["info"]["target_maxvio"]
    parts = []
    for s in data["summary"]:
        best = s.get("joint_best_at_target")
        if s["replica_slots"] == 1 and best:
            parts.append(f"{-best['reduction']:.1f} % ({s['instance']}, MaxVio {best['maxvio']:.3f})")
    out = []
    rules = data.get("rules", [])
    if rules:
        by_rule: dict[str, list[dict]] = {}
        for r in rules:
            by_rule.setdefault(r["rule"], []).append(r)
        cells = []
        for rule, rs in by_rule.items():
            ratios = [r["ratio"] for r in rs if r["ratio"] is not None]
            met = sum(r["met"] for r in rs)
            cells.append(
                f"`{rule}`: {min(ratios):.2f}× to {max(ratios):.2f}× agnostic's cut, target met in {met} of {len(rs)}"
                if ratios
                else f"`{rule}`: no plan at agnostic's MaxVio"
            )
        target_ratio = data["info"].get("rule_target", 1.3)
        out.append(
            (
                "`joint` made for the engine's rule vs `agnostic`",
                f"{len({(r['instance'], r['replica_slots']) for r in rules})} cells (3 synthetic shapes, OLMoE "
                f"count-sampled; 1 and 2 replica slots), remote GPUs per token cut at held-out MaxVio ≤ agnostic's "
                f"(target {target_ratio:g}×)",
                "; ".join(cells),
                "joint",
            )
        )
    out += _joint_scale_rows(results)
    bound = [b for b in data.get("bound", []) if b["replica_slots"] == 1 and b["relative_gap"] is not None]
    zero = [b for b in data.get("bound", []) if b["replica_slots"] == 0 and b["relative_gap"] is not None]
    if bound:
        gaps = [100 * b["relative_gap"] for b in bound]
        trivial = sum(abs(b["bound"] - b["trivial_bound"]) < 1e-9 for b in bound)
        check = data["bound_check"]
        out.append(
            (
                "`joint`'s certificate (bound and gap)",
                f"default settings, {len(bound)} cells with 1 replica slot per GPU, calibration remote GPUs per token "
                f"(target: gap ≤ {100 * check['gap_all']:g} % on every cell, ≤ {100 * check['gap_half']:g} % on half)",
                f"gap {min(gaps):.1f} % to {max(gaps):.1f} % ({'met' if check['met'] else 'not met'}); "
                f"the bound is the trivial one (ceil(k / W) GPUs per token) on {trivial} of {len(bound)}"
                + _zero_slot_gaps(zero),
                "joint",
            )
        )
    out.append(
        (
            "`joint` vs `linear`, under `locality` (a research rule no engine runs)",
            f"1 replica slot per GPU, best plan with held-out MaxVio ≤ {target}",
            "remote GPUs per token " + ", ".join(parts),
            "joint",
        )
    )
    return out


def _zero_slot_gaps(zero: list[dict]) -> str:
    """The certificate row's note on the cells with 0 replica slots: the gaps where no slot is spare
    (the bound for the plans within the load limits), where a few are and the flagged LP bounds the
    plans with copies within them, and where the bound is for every plan."""
    flagged = [b for b in zero if b.get("load_limited") and "flagged" in (b.get("bound_kind_per_layer") or [])]
    limited = [100 * b["relative_gap"] for b in zero if b.get("load_limited") and b not in flagged]
    free = [f"{b['instance']} {100 * b['relative_gap']:.1f} %" for b in zero if not b.get("load_limited")]
    parts = []
    if limited:
        parts.append(
            f"without spare slots (0 replica slots) gap {min(limited):.1f} % to {max(limited):.1f} % "
            "for the plans within the load limit"
        )
    if flagged:
        cells = ", ".join(f"{b['instance']} {100 * b['relative_gap']:.1f} %" for b in flagged)
        parts.append(f"0 replica slots with a few spare ones (the plans with copies within the load limit): {cells}")
    if free:
        parts.append(f"0 replica slots with spare ones (every plan): {', '.join(free)}")
    return "".join(f"; {p}" for p in parts)


def _joint_scale_rows(results: Path) -> list[tuple[str, str, str, str]]:
    """The joint benchmark's scale part (``joint_scale.json``, when it has been run): per instance
    and rule, the remote nodes per token cut against EPLB global / hierarchical at a held-out MaxVio
    no worse, and the slowest whole-model ``joint`` run."""
    if not (results / "joint_scale.json").is_file():
        return []
    d = _load(results, "joint_scale")
    info = d["info"]
    cells = []
    for c in d["checks"]:
        if "time" in c:
            continue
        cuts = []
        for policy in ("global", "hierarchical"):
            x = c.get(policy)
            if x is not None:
                cut = "no plan at its MaxVio" if x["cut"] is None else f"{x['cut']:.1f} %"
                cuts.append(f"{cut} ({'met' if x['met'] else 'not met'})")
        short = "count-sampled" if "count-sampled" in c["instance"] else "synthetic"
        cells.append(f"{short}, `{c['rule']}`: {' / '.join(cuts)}")
    times = [
        f"`{c['rule']}` {c['time']['plan_s']:.0f} s ({'met' if c['time']['met'] else 'not met'})"
        for c in d["checks"]
        if "time" in c
    ]
    load = max((c["time"]["load"][0] for c in d["checks"] if "time" in c), default=0.0)
    t = info["targets"]
    return [
        (
            "`joint` at scale (hierarchical, made for the rule) vs EPLB global / hierarchical",
            f"DeepSeek-V3 shape (first {info['layers']} layers × 256 experts, top-8, 8 groups), {info['gpus']} GPUs in "
            f"{info['gpus'] // info['gpus_per_node']} nodes × (1+1) slots, count-sampled and synthetic, held out "
            f"(`joint_scale.json`)",
            f"remote nodes per token cut at a held-out MaxVio ≤ EPLB's (targets {t['global']:g} % / "
            f"{t['hierarchical']:g} %): "
            + "; ".join(cells)
            + f"; {info['timing_layers']} layers planned with `--workers {info['workers']}`: "
            + ", ".join(times)
            + f" (target {t['seconds']:g} s; load average {load:.1f} on 2 cores)",
            "joint",
        )
    ]


def _replay_rows(results: Path) -> list[tuple[str, str, str, str]]:
    d = _load(results, "replay")
    cells = [(s, iv) for s in d["streams"] for iv in s["intervals"] if iv.get("done_when")]
    if not cells:
        return []
    by_stream: dict[str, list[str]] = {}
    for s, iv in cells:
        if iv["done_when"]["met"]:
            by_stream.setdefault(s["label"], []).append(str(iv["interval"]))
    met = [f"{label} (K = {', '.join(ks)})" for label, ks in by_stream.items()]
    n_met = sum(len(ks) for ks in by_stream.values())
    beyond = [
        f"{s['label']} (K = {iv['interval']})"
        for s, iv in cells
        if not iv["done_when"]["met"] and iv["done_when"].get("beyond_floor")
    ]
    mean = [iv["done_when"]["mean_ratio"] for _s, iv in cells]
    worst = [iv["done_when"]["worst_ratio"] for _s, iv in cells]
    moved = [100 * iv["done_when"]["moved_ratio"] for _s, iv in cells]
    intervals = sorted({iv["interval"] for _s, iv in cells})
    result = (
        f"targets (≤ 0.8× time-averaged MaxVio, ≤ 0.6× worst window, ≤ 25 % of the slots moved) met in {n_met} of "
        f"{len(cells)} stream × interval cells ({'; '.join(met) or 'none'}); time-averaged MaxVio {min(mean):.2f}× to "
        f"{max(mean):.2f}×, worst window {min(worst):.2f}× to {max(worst):.2f}×, moved slots {min(moved):.0f} % to "
        f"{max(moved):.0f} % of EPLB's"
    )
    if beyond:
        result += (
            f"; of the {len(cells) - n_met} missed, {len(beyond)} ask for less than the noise floor (every step "
            f"planned on the other steps of its window): {'; '.join(beyond)}"
        )
    windows = [w for w in d.get("windows", []) if w.get("done_when")]
    if windows:
        won = [f"{w['label']} ({w.get('data', 'labelled tokens')})" for w in windows if w["done_when"]["met"]]
        result += (
            f"; re-planned every window ({len(windows)} streams merged into {windows[0]['windows']} windows, "
            f"K = 1): met in {len(won)} of {len(windows)} ({'; '.join(won) or 'none'})"
        )
    setting = (
        f"{len(d['streams'])} bundled streams (real OLMoE, Mixtral, DeepSeek-V3 loads count-sampled, OLMoE and "
        f"Mixtral domain mixes as labelled token traces; 3 synthetic drifts), same interval "
        f"(K = {', '.join(str(k) for k in intervals)}), each step scored"
    )
    return [("`replay`: `auto` vs periodic EPLB", setting, result, "replay")]


def _tacg_rows(results: Path) -> list[tuple[str, str, str, str]]:
    a = _load(results, "tacg")["a"]
    shapes = [w for w in a if "olmoe" not in w]

    def red(m: str) -> float:
        return statistics.fmean(a[w]["methods"][m]["comm_reduction_vs_linear"] for w in shapes)

    def maxvio(m: str) -> float:
        return statistics.fmean(a[w]["methods"][m]["maxvio"] for w in shapes)

    result = (
        f"remote GPUs per token {-red('tacg'):.1f} % at MaxVio {maxvio('tacg'):.2f} (automatic load limit); "
        f"{-red('hypergraph'):.1f} % at MaxVio {maxvio('hypergraph'):.2f} (`hypergraph`, no limit)"
    )
    return [("`tacg` vs `linear`", f"mean of {len(shapes)} synthetic shapes, held out", result, "tacg")]


def _gem_rows(results: Path) -> list[tuple[str, str, str, str]]:
    rows = _load(results, "gem")["rows"]

    def stat(key: str) -> str:
        # the results store improvements (positive = faster); the table shows the change in latency
        v = [-r["methods"]["gem"][key] for r in rows]
        return f"{statistics.fmean(v):+.1f} % mean ({min(v):+.1f} % best)"

    result = f"straggler latency {stat('S_vs_linear')} vs `linear`, {stat('S_vs_speed-greedy')} vs `speed-greedy`"
    return [("`gem`", f"{len(rows)} configurations (shapes, GPUs, variability), held out", result, "gem")]


def _certificate_rows(results: Path) -> list[tuple[str, str, str, str]]:
    d = _load(results, "certificates")
    cells = [c for c in d["cells"] if c.get("target") is not None]
    met = sum(c["met"] for c in cells)
    gaps = sorted(100 * c["best_gap"] for c in cells)
    limit = d["info"]["time_limit"]
    result = (
        f"gap ≤ target (3 % at E = 64, 5 % above) in {met} of {len(cells)} cells; "
        f"median {statistics.median(gaps):.2f} %, worst {gaps[-1]:.1f} %"
    )
    methods = [m for m in ("lagrangian", "cpsat", "colgen", "triangle", "sdp") if any(m in c for c in cells)]
    setting = f"E = 64-256 on 4-64 GPUs, {limit:g} s, best of {len(methods)} bounds"
    if all("auto" in c for c in cells):  # the one choice a user makes: `certificate: auto`
        auto_met = sum(c["auto"]["gap"] <= c["target"] + 1e-12 for c in cells)
        worst = max(100 * c["auto"]["gap"] for c in cells)
        result += f"; `certificate: auto` alone: {auto_met} of {len(cells)}, worst {worst:.1f} %"
    rows = [("Grouping certificates", setting, result, "certificates")]
    gem = d.get("gem")
    if gem:
        ok = sum(c["met"] for c in gem["cells"]) if all("met" in c for c in gem["cells"]) else None
        g = sorted(100 * c["best_gap"] for c in gem["cells"]) if all("best_gap" in c for c in gem["cells"]) else None
        if ok is not None and g is not None:
            rows.append(
                (
                    "GEM certificates",
                    f"E = 64 top-8, 4 and 8 GPUs, {len(gem['cells'])} layers",
                    f"gap ≤ 3 % in {ok} of {len(gem['cells'])}; {g[0]:.2f} % to {g[-1]:.2f} %",
                    "certificates",
                )
            )
    return rows


def _crosslayer_rows(results: Path) -> list[tuple[str, str, str, str]]:
    rows = [r for r in _load(results, "crosslayer")["rows"] if r["method"] == "agnostic + relabel"]
    v = [r["reduction_vs_agnostic_pct"] for r in rows]
    result = f"remote GPUs per token {-max(v):.1f} % to {-min(v):.1f} % vs `agnostic`, at no cost in load"
    out = [("GPU relabeling", f"`previous-layer` token homes, {len(rows)} shapes × dependencies", result, "crosslayer")]
    cl = [r for r in _load(results, "crosslayer")["rows"] if r["method"] == "crosslayer" and "certificate" in r]
    if cl:
        gaps = sorted(100 * r["certificate"]["gap"] for r in cl)
        real = [r for r in cl if r.get("workload", "synthetic") != "synthetic"]
        rg = sorted(100 * r["certificate"]["gap"] for r in real)
        cert = f"gap {gaps[0]:.1f} % to {gaps[-1]:.1f} %" + (
            f" ({rg[0]:.1f}–{rg[-1]:.1f} % on the count-sampled real cells)" if rg else ""
        )
        out.append(
            (
                "Cross-layer certificates",
                f"`crosslayer`'s lower bound, {len(cl)} cells, 8 s per layer",
                cert,
                "crosslayer",
            )
        )
    return out


def _scale_rows(results: Path) -> list[tuple[str, str, str, str]]:
    d = _load(results, "scale")
    cpus = d["info"]["machine"]["cpus"]
    wall = {(r["method"], r["executor"]): r["wall_s"] for r in d["whole_model"]}
    whole = ", ".join(
        f"{wall[(m, 'serial')] / wall[(m, '2 workers')]:.2f}× (`{m}`)"
        for m in ("tacg", "gem")
        if (m, "serial") in wall and (m, "2 workers") in wall
    )
    paired = ", ".join(f"{r['median_speedup']:.2f}× (`{r['method']}`)" for r in d["paired"] if r["method"] != "greedy")
    start = d["startup"]
    result = (
        f"`--workers 2`: {whole} on the whole model, {paired} median of paired runs; start-up: process pool "
        f"{start['pool_start_s']:.1f} s, local Ray {start['ray_init_s']:.1f} s, serial none"
    )
    return [
        ("Scaling out", f"DeepSeek-V3 size ({d['info']['layers']} layers × 256 experts), {cpus} cores", result, "scale")
    ]


def _limits_rows(results: Path) -> list[tuple[str, str, str, str]]:
    d = _load(results, "limits")
    info, rows = d["info"], d["rows"]
    T = info["time_limit"]
    met = sum(r["met"] for r in rows)
    methods = sorted({r["method"] for r in rows})
    worst = max(rows, key=lambda r: r["wall"] - r["allowed"])
    over = worst["wall"] - worst["allowed"]
    result = f"wall ≤ 1.1 × T × layers + start-up in {met} of {len(rows)} runs ({len(methods)} methods); " + (
        f"closest: `{worst['method']}` on {worst['instance']}, {-over:.2f} s to spare"
        if over <= 0
        else f"worst: `{worst['method']}` on {worst['instance']}, {over:.2f} s over"
    )
    out = [
        (
            "Time limits",
            f"every method, `--layer-time-limit {T:g}` (s per layer), 3 × 128 and 4 × 64 (+1) experts, 16 GPUs, "
            f"{info['machine']['cpus']} cores",
            result,
            "limits",
        )
    ]
    repro = d.get("reproducible") or []
    if repro:
        same = sum(r["identical"] for r in repro)
        names = ", ".join(f"`{r['method']}`" for r in repro)
        out.append(
            (
                "Reproducible certificates",
                f"{names}, twice, the second beside two busy loops",
                f"identical reports apart from wall times (plan, bound, gap, certificates) in {same} of {len(repro)}",
                "limits",
            )
        )
    return out


def _install_rows(results: Path) -> list[tuple[str, str, str, str]]:
    if not (results / "install.json").exists():
        return []
    d = _load(results, "install")
    core, full = d["summary"]
    cpus = d["info"]["machine"].get("cpus", "?")

    def cell(s: dict) -> str:
        return (
            f"{s['size_mb']} MB, {s['packages']} packages, pip CPU {s['cpu_s']:.0f} s "
            f"(wall {s['wall_s']:.0f} s, median of {s['runs']})"
        )

    return [
        (
            "Core install",
            f"`pip install -e .` vs `.[plot,sdp]` (the core before matplotlib and CVXPY became extras), fresh "
            f"venv, Python {d['info']['python']}, {cpus} cores",
            f"{cell(core)} vs {cell(full)}",
            "install",
        )
    ]


SECTIONS: tuple[Callable[[Path], list[tuple[str, str, str, str]]], ...] = (
    _balance_rows,
    _joint_rows,
    _replay_rows,
    _tacg_rows,
    _gem_rows,
    _certificate_rows,
    _crosslayer_rows,
    _scale_rows,
    _limits_rows,
    _install_rows,
)


def table(results: Path = RESULTS, link: Callable[[str], str] | None = None) -> str:
    """The headline table as Markdown.

    Parameters
    ----------
    results
        Folder of the benchmark results files.
    link
        Maps a benchmark name to the target of its link; default: its results file, relative
        to the repository root (as README.md links it).
    """
    link = link or (lambda name: f"benchmarks/results/{name}.json")
    rows = [
        [what, setting, result, f"[{name}]({link(name)})"]
        for section in SECTIONS
        for what, setting, result, name in section(results)
    ]
    return tabulate(rows, headers=["what", "setting", "result", "data"], tablefmt="github", disable_numparse=True)


def block(results: Path = RESULTS) -> str:
    """The README block between the markers, markers included."""
    return f"{BEGIN}\n{table(results)}\n{END}"


def replace_block(text: str, new_block: str) -> str:
    """``text`` with its marked block replaced by ``new_block``; ``ValueError`` without markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README needs the markers {BEGIN} and {END}")
    return text[:start] + new_block + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--check", action="store_true", help="exit 1 if README's table is stale; write nothing")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new = replace_block(text, block(args.results))
    if args.check:
        if new != text:
            print(f"{args.readme}: results table is stale; run python benchmarks/readme_table.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    from machine_info import run_script  # benchmarks/ is on sys.path when run as a script; not when imported

    run_script(main)
