"""Cross-layer benchmark: communication when tokens stay on the GPU of their last expert.

Synthetic task-structured traces with layer-to-layer dependency (``layer_dependency`` 0, 0.5,
0.9: the chance a token's community at layer l follows its layer l - 1 top-1 expert's
community through a fixed link; the dependent cells add expert-level dependency,
``successors`` 2: a following token also favours 2 successor experts of its previous top-1
expert), 4 MoE layers, on three shapes: 8 GPUs x 32 experts
(top-4), 16 GPUs x 64 experts (top-6) and 64 GPUs x 128 experts (top-8), 8 GPUs per node,
``ceil(E / G)`` slots per GPU (4, 4, 2). Calibrate on seed 0, evaluate on seed 1 (same
structure, fresh tokens).

Real data (:data:`REAL_CELLS`, :func:`real_instance`): traces count-sampled from the bundled
OLMoE per-domain counts (16 GPUs) and DeepSeek-V3 SGLang loads (MoE layers 0-3, 64 GPUs;
calibrated on prefill, held out on decode). Count-sampled tokens draw their experts
independently at every layer, so these cells carry no layer-to-layer dependency: they are the
control on real loads (what the methods give, and cost, where there is nothing to stay for).

Methods, every plan scored by the one scorer:

* ``linear``: vLLM's contiguous layout;
* ``agnostic``: TACG on the task-agnostic graph, as planned (``solve --no-relabel``);
* ``agnostic + relabel``: the same plan with the free GPU relabeling of ``solve``;
* ``crosslayer``: the cross-layer planner (starts ``agnostic`` and ``hypergraph``, each
  relabeled, then sweeps with chain moves and ``KICKS`` rounds of iterated local search within a
  ``TIME_LIMIT`` per layer), under the same automatic load limit as ``agnostic``; its
  ``agnostic`` start is the plan computed above, passed as the hint (the plan
  ``starts=agnostic`` would compute), to save time;
* ``crosslayer, no load limit`` (``eps_load=.inf``): what the load limit costs.

``crosslayer``'s certificate (``CrossLayer.certificate``, :data:`BOUND_TIME` s per layer, on the
plan the search returned) is reported with its gap on the calibration trace; its seconds are not
in the planner's wall time.

For each: held-out remote GPUs per token per layer under ``token_home: uniform`` (the
expectation over uniform homes) and ``previous-layer`` (homes = GPU of the previous layer's
top-1 expert; layer 0 uniform), the topology-weighted figure under ``previous-layer``
(inter-node hop 4), the reduction vs ``agnostic`` as planned, the held-out MaxVio (whole
workload, mean over layers), the calibration figure under ``previous-layer``, the stay
ceiling (the figure if every token at layers >= 1 found an expert on its home GPU, at the
plan's own spans) and the wall time.

One cell: ``--shapes 16 --dependencies 0.9 --real '' --out /tmp/cl`` (writes there, not in
results/); the real cells alone: ``--shapes 0 --out /tmp/cl``.

Run: ``python benchmarks/crosslayer.py`` (about 9 min on 2 cores). Writes
``benchmarks/results/crosslayer.json``, ``crosslayer.md`` and ``crosslayer.png``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from machine_info import machine as machine_info  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from machine_info import run_script, workers_arg  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from tabulate import tabulate

from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.io import read_workload_file, write_json, write_text
from moeopt.methods.crosslayer import CrossLayer, CrossLayerParams, maxvio_budget_bound
from moeopt.registry import Context, Problem
from moeopt.relabel import relabel_gpus
from moeopt.scoring import Workloads
from moeopt.solve import load_workloads, solve
from moeopt.synth import trace_from_counts
from moeopt.trace import stats_from_counts

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
SHAPES = ((8, 32, 4), (16, 64, 6), (64, 128, 8))  # (GPUs, experts, top-k)
DEPENDENCIES = (0.0, 0.5, 0.9)
#: expert-level successors of the dependent cells (0 for the control, dependency 0)
SUCCESSORS = 2
LAYERS, TOKENS, GPUS_PER_NODE = 4, 4096, 8
#: iterated local search of the cross-layer planner after its sweeps (rounds, patience), and
#: its time limit per layer (seconds): the kicks stop there
KICKS, PATIENCE, TIME_LIMIT = 150, 40, 5.0
#: seconds per layer of the cross-layer planner's certificate (a lower bound on every plan's
#: calibration objective), after the search; not in the search's wall time
BOUND_TIME = 8.0
#: ... and its work budget (master LP solves per layer): more than the default (4 to 30 by size),
#: so that the LP is solved where 8 s allow it (16 GPUs, dependency 0: 4.7 % gap, every layer
#: solved, against 13.5 % at the default budget)
BOUND_ROUNDS = 200
#: the done-when's held-out MaxVio allowance above ``agnostic``'s (mean over layers)
MAXVIO_SLACK = 0.02
#: MaxVio levels per layer of the held-out headroom (from ``agnostic``'s to the most a layer can take)
HEADROOM_LEVELS = 5
LABELS = ("linear", "agnostic", "agnostic + relabel", "crosslayer", "crosslayer, no load limit")
#: real data (count-sampled: tokens drawn independently per layer, so no layer-to-layer
#: dependency; the control on real loads): name -> (GPUs, tokens)
REAL_CELLS = {"olmoe (count-sampled)": (16, 8192), "deepseek-v3 (count-sampled)": (64, 8192)}
REAL = ROOT / "instances" / "real"
SYNTHETIC = "synthetic"


def machine() -> dict:
    """The run's machine, versions and git state (:func:`machine_info.machine`)."""
    return machine_info()


def instance(G: int, E: int, k: int, dep: float) -> Instance:
    synthetic = {
        "tokens": TOKENS,
        "steps": 16,
        "layer_dependency": dep,
        "successors": SUCCESSORS if dep > 0 else 0,
        "structure_seed": 0,
        "seed": 0,
    }
    return Instance(
        name=f"crosslayer-{G}x{E}-dep{dep}",
        model=Model(LAYERS, E, k),
        cluster=Cluster(
            gpus=G, gpus_per_node=min(G, GPUS_PER_NODE), slots_per_gpu=-(-E // G), token_home="previous-layer"
        ),
        workload=Workload(WorkloadSource(synthetic=synthetic)),
        method=MethodSpec("agnostic"),
    )


def real_instance(name: str) -> tuple[Instance, Workloads]:
    """A real-data cell: traces count-sampled from real expert counts (calibration seed 0).

    * ``olmoe (count-sampled)``: the OLMoE per-domain counts (3 layers x 64 experts, top-8, 6
      domains as families), 16 GPUs; held out: seed 1 of the same counts;
    * ``deepseek-v3 (count-sampled)``: the SGLang DeepSeek-V3 loads, MoE layers 0-3 (256 experts,
      top-8), 64 GPUs; calibrated on the prefill recording, held out on the decode one (seed 1):
      the shift between two real workloads.
    """
    G, tokens = REAL_CELLS[name]
    if name.startswith("olmoe"):
        stats = read_workload_file(
            REAL / "olmoe_mixtral_domain_expert_counts.npz", format="olmoe-domains", select="olmoe"
        )
        calib = trace_from_counts(stats, tokens=tokens, steps=16, seed=0)
        held = trace_from_counts(stats, tokens=tokens, steps=16, seed=1)
    else:
        four = [
            stats_from_counts(read_workload_file(REAL / f, top_k=8).counts[:, :LAYERS], top_k=8)
            for f in ("deepseek_v3_prefill_in1024.json", "deepseek_v3_decode_in1000out1000.json")
        ]
        calib = trace_from_counts(four[0], tokens=tokens, steps=16, seed=0)
        held = trace_from_counts(four[1], tokens=tokens, steps=16, seed=1)
        stats = four[0]
    E, k = stats.experts, stats.top_k
    inst = Instance(
        name=f"crosslayer-{name}",
        model=Model(stats.layers, E, k),
        cluster=Cluster(
            gpus=G, gpus_per_node=min(G, GPUS_PER_NODE), slots_per_gpu=-(-E // G), token_home="previous-layer"
        ),
        workload=Workload(WorkloadSource()),
        method=MethodSpec("agnostic"),
    )
    return inst, Workloads(calib, held, calib.stats(), None)


def row(label: str, G: int, E: int, k: int, dep: float | None, plan, wall: float, inst: Instance, wl) -> dict:
    prev = inst.cluster
    uni = replace(prev, token_home="uniform")
    held_prev = evaluate(plan, wl.evaluation, prev)
    held_uni = evaluate(plan, wl.evaluation, uni)
    calib = evaluate(plan, wl.calibration, prev)
    # the stay ceiling: the figure if every token at layers >= 1 found an expert on its home
    # GPU, with this plan's spans (distinct GPUs per token; layer 0's homes are uniform)
    spans = np.asarray(held_uni["comm_per_layer"]) / (1.0 - 1.0 / G)
    ceiling = (held_prev["comm_per_layer"][0] + float(np.sum(spans[1:] - 1.0))) / len(spans)
    return {
        "method": label,
        "gpus": G,
        "experts": E,
        "top_k": k,
        "slots_per_gpu": prev.slots_per_gpu,
        "layer_dependency": dep,
        "remote_uniform": held_uni["comm_per_token"],
        "remote_previous_layer": held_prev["comm_per_token"],
        "remote_previous_layer_weighted": held_prev["comm_weighted_per_token"],
        "remote_previous_layer_per_layer": held_prev["comm_per_layer"],
        "remote_previous_layer_calibration": calib["comm_per_token"],
        "stay_ceiling_previous_layer": ceiling,
        "maxvio_heldout": held_prev["maxvio"],
        "maxvio_calibration": calib["maxvio"],
        "wall_s": wall,
    }


def run_cell(G: int, E: int, k: int, dep: float, log, workers: int = 1) -> list[dict]:
    """A synthetic cell (``dep``: its layer dependency)."""
    inst = instance(G, E, k, dep)
    return run_plans(inst, load_workloads(inst), dep, SYNTHETIC, log, workers)


def run_real(name: str, log, workers: int = 1) -> list[dict]:
    """A real-data cell (:func:`real_instance`; no layer dependency)."""
    inst, wl = real_instance(name)
    return run_plans(inst, wl, None, name, log, workers)


def run_plans(inst: Instance, wl, dep: float | None, workload: str, log, workers: int = 1) -> list[dict]:
    """Every method's plan on one cell, scored (rows of the tables)."""
    G, E, k = inst.cluster.gpus, inst.model.experts, inst.model.top_k
    out = []

    def timed(method: str, **kw):
        t0 = time.perf_counter()
        res = solve(inst, method=method, workloads=wl, workers=workers, **kw)
        return res, time.perf_counter() - t0

    lin, t_lin = timed("linear", relabel=False)
    out.append(row("linear", G, E, k, dep, lin.plan, t_lin, inst, wl))
    ag, t_ag = timed("agnostic", relabel=False)
    out.append(row("agnostic", G, E, k, dep, ag.plan, t_ag, inst, wl))
    t0 = time.perf_counter()  # what solve() does after agnostic under previous-layer
    relabeled, _ = relabel_gpus(ag.plan, wl.calibration, inst.cluster, wl.profile)
    out.append(row("agnostic + relabel", G, E, k, dep, relabeled, t_ag + time.perf_counter() - t0, inst, wl))
    kicks = {"kicks": KICKS, "patience": PATIENCE}
    cl, t_cl = timed(
        "crosslayer",
        hint=ag.plan,
        params={"starts": "hypergraph", "bound_time": 0, **kicks},
        layer_time_limit=TIME_LIMIT,
    )
    out.append(row("crosslayer", G, E, k, dep, cl.plan, t_ag + t_cl, inst, wl))
    out[-1]["best_start"] = "agnostic" if cl.stats.get("best_start") == "hint" else cl.stats.get("best_start")
    # the method's certificate, with its own BOUND_TIME per layer (outside the search's time limit)
    t0 = time.perf_counter()
    problem = Problem(inst, wl.calibration_stats, wl.calibration, wl.profile)
    bound, cert = CrossLayer.certificate(
        problem,
        cl.plan,
        CrossLayerParams(bound_time=BOUND_TIME, bound_rounds=BOUND_ROUNDS),
        Context(seed=0, quiet=True),
    )
    objective = out[-1]["remote_previous_layer_calibration"]
    assert bound is not None
    out[-1]["certificate"] = {
        "objective_calibration": objective,
        "bound_calibration": bound,
        "gap": (objective - bound) / objective if objective > 0 else 0.0,
        "bound_per_layer": cert["communication_lower_bound_per_layer"],
        "lp_solved_per_layer": cert["bound_lp_solved_per_layer"],
        "load_limited_per_layer": cert["bound_load_limited_per_layer"],
        "seconds": time.perf_counter() - t0,
    }
    # the most any plan within the same load limits can cut from agnostic's calibration figure
    agn = out[1]["remote_previous_layer_calibration"]
    out[-1]["certificate"]["headroom_vs_agnostic_pct"] = 100.0 * (agn - bound) / agn
    if dep:  # the done-when's cells (with dependency): what any plan can reach in its terms
        out[-1]["heldout_headroom"] = heldout_headroom(inst, wl, ag.plan)
    free, t_free = timed("crosslayer", params={"eps_load": float("inf"), "starts": "agnostic", "bound_time": 0})
    out.append(row("crosslayer, no load limit", G, E, k, dep, free.plan, t_free, inst, wl))
    base = out[1]["remote_previous_layer"]
    for r in out:
        r["workload"] = workload
        r["reduction_vs_agnostic_pct"] = 100.0 * (base - r["remote_previous_layer"]) / base
        r["maxvio_above_agnostic"] = r["maxvio_heldout"] - out[1]["maxvio_heldout"]
        r["stay_ceiling_vs_agnostic_pct"] = 100.0 * (base - r["stay_ceiling_previous_layer"]) / base
    for r in out:
        log(
            f"  {workload} {G:>2} GPUs dep {dep_label(dep)} {r['method']:<26} uniform {r['remote_uniform']:.3f} "
            f"previous-layer {r['remote_previous_layer']:.3f} ({r['reduction_vs_agnostic_pct']:+.1f} %) "
            f"MaxVio {r['maxvio_heldout']:.3f} {r['wall_s']:.1f} s"
        )
    return out


def heldout_headroom(inst: Instance, wl, plan) -> dict:
    """The most any single-copy plan can cut from ``plan``'s (``agnostic``'s) held-out figure
    under ``previous-layer`` homes while its held-out MaxVio (mean over layers) stays within
    ``MAXVIO_SLACK`` of ``plan``'s: the done-when's terms, on the held-out trace itself (an oracle
    that knows it, so a bound on every planner): :func:`moeopt.methods.crosslayer.maxvio_budget_bound`
    at :data:`HEADROOM_LEVELS` levels, :data:`BOUND_TIME` s per layer and level."""
    held = wl.evaluation
    problem = Problem(inst, held.stats(), held, wl.profile)
    t0 = time.perf_counter()
    out = maxvio_budget_bound(
        problem, plan, MAXVIO_SLACK, levels=HEADROOM_LEVELS, bound_time=BOUND_TIME, bound_rounds=BOUND_ROUNDS
    )
    base, bound = out["base"], out["bound"]
    return {
        "bound_heldout": bound,
        "headroom_vs_agnostic_pct": 100.0 * (base - bound) / base,
        "maxvio_levels_per_layer": out["maxvio_levels_per_layer"],
        "bound_per_level": out["bound_per_level"],
        "load_limited": out["load_limited"],
        "seconds": time.perf_counter() - t0,
    }


def dep_label(dep: float | None) -> str:
    """A cell's dependency as the tables print it (None: a count-sampled real cell)."""
    return "none (count-sampled)" if dep is None else f"{dep:g}"


def shape_label(r: dict, top_k: bool = True) -> str:
    shape = f"{r['gpus']} × {r['experts']}" + (f" (top-{r['top_k']})" if top_k else "")
    workload = r.get("workload", SYNTHETIC)
    return shape if workload == SYNTHETIC else f"{workload}: {shape}"


def markdown(rows: list[dict], info: dict) -> str:
    head = [
        "GPUs × experts (top-k)",
        "dependency",
        "method",
        "remote, uniform",
        "remote, previous-layer",
        "vs agnostic",
        "weighted, previous-layer",
        "held-out MaxVio",
        "wall s",
    ]
    body = [
        [
            shape_label(r),
            dep_label(r["layer_dependency"]),
            r["method"],
            f"{r['remote_uniform']:.3f}",
            f"{r['remote_previous_layer']:.3f}",
            f"{r['reduction_vs_agnostic_pct']:+.1f} %",
            f"{r['remote_previous_layer_weighted']:.3f}",
            f"{r['maxvio_heldout']:.3f}",
            f"{r['wall_s']:.1f}",
        ]
        for r in rows
    ]
    cl = [r for r in rows if r["method"] == "crosslayer"]

    def key(r: dict) -> tuple:
        return r.get("workload", SYNTHETIC), r["gpus"], r["layer_dependency"]

    rl = {key(r): r for r in rows if r["method"] == "agnostic + relabel"}

    def met(r: dict) -> str:
        if not r["layer_dependency"]:  # the target is for the cells with dependency
            return "(control)"
        return "yes" if r["reduction_vs_agnostic_pct"] >= 10.0 and r["maxvio_above_agnostic"] <= 0.02 else "no"

    summary = [
        [
            shape_label(r, top_k=False),
            dep_label(r["layer_dependency"]),
            f"{r['reduction_vs_agnostic_pct']:+.1f} %",
            f"{rl[key(r)]['reduction_vs_agnostic_pct']:+.1f} %",
            f"{r['maxvio_above_agnostic']:+.3f}",
            f"{r['stay_ceiling_vs_agnostic_pct']:+.1f} %",
            f"{r['certificate']['headroom_vs_agnostic_pct']:.1f} %" if "certificate" in r else "-",
            f"{r['heldout_headroom']['headroom_vs_agnostic_pct']:.1f} %" if "heldout_headroom" in r else "-",
            met(r),
        ]
        for r in cl
    ]
    certificates = [
        [
            shape_label(r, top_k=False),
            dep_label(r["layer_dependency"]),
            f"{r['certificate']['objective_calibration']:.4f}",
            f"{r['certificate']['bound_calibration']:.4f}",
            f"{100 * r['certificate']['gap']:.1f} %",
            f"{sum(r['certificate']['lp_solved_per_layer'])}/{len(r['certificate']['lp_solved_per_layer'])}",
            f"{sum(r['certificate']['load_limited_per_layer'])}/{len(r['certificate']['load_limited_per_layer'])}",
            f"{r['certificate']['seconds']:.1f}",
        ]
        for r in cl
        if "certificate" in r
    ]
    m = info["machine"]
    return "\n".join(
        [
            "# Cross-layer placement: tokens stay on the GPU of their last expert",
            "",
            f"Generated by `benchmarks/crosslayer.py` in {info['wall_s']:.0f} s on {m['cpus']} CPUs "
            f"({m['processor']}, Python {m['python']}, commit {str(m['git_commit'])[:10]}).",
            "",
            f"{LAYERS} MoE layers, synthetic task-structured traces ({TOKENS} tokens; calibrate seed 0, "
            "evaluate seed 1), `layer_dependency` = chance a token's community follows its previous "
            f"top-1 expert's community; the dependent cells use `successors: {SUCCESSORS}` (a following "
            f"token also favours {SUCCESSORS} successor experts of its previous top-1 expert: expert-level "
            "dependency). `crosslayer`: starts agnostic (relabeled) and hypergraph, sweeps with chain moves, then "
            f"at most {KICKS} kicks (patience {PATIENCE}, {TIME_LIMIT:g} s per layer). "
            "Remote GPUs per token per layer on the held-out trace; "
            "`uniform`: expectation over uniform homes; `previous-layer`: a token lives on the GPU of "
            "its previous-layer top-1 expert (layer 0 uniform); weighted: inter-node hop = 4 "
            f"({GPUS_PER_NODE} GPUs per node). MaxVio: held-out, whole workload, mean over layers.",
            "",
            "Real data (the rows named after it): traces count-sampled from real expert counts, OLMoE "
            "(3 layers × 64 experts, top-8, 6 domains; calibrate seed 0, evaluate seed 1) on 16 GPUs and "
            f"DeepSeek-V3 (MoE layers 0–{LAYERS - 1}, 256 experts, top-8; calibrate on the prefill recording, "
            "evaluate on the decode one) on 64 GPUs. Count-sampled tokens pick their experts independently "
            "at every layer, so these traces carry no layer-to-layer dependency (no real routing trace with "
            "token identity across layers is bundled): they are the control on real loads, where staying "
            "can only come from the relabeling's load-driven coincidences.",
            "",
            tabulate(body, headers=head, tablefmt="github"),
            "",
            "## Done-when check: crosslayer vs agnostic as planned (previous-layer, held-out)",
            "",
            tabulate(
                summary,
                headers=[
                    "shape",
                    "dependency",
                    "crosslayer",
                    "agnostic + relabel",
                    "MaxVio − agnostic's",
                    "stay ceiling at its spans",
                    "any plan within the limit: at most (calibration)",
                    "any plan at MaxVio <= +0.02: at most (held out)",
                    ">= 10 % at MaxVio <= +0.02",
                ],
                tablefmt="github",
            ),
            "",
            "Stay ceiling: `crosslayer`'s figure if every token at layers >= 1 found one of its "
            "experts on its home GPU (remote = its distinct GPUs − 1), with the plan's own spans; "
            "layer 0's homes are uniform. Not a bound on other plans (a plan may span fewer GPUs), "
            "but below 10 % it says that staying alone cannot reach the target: the spans, which the "
            "load limit pins near `agnostic`'s, would have to shrink too. "
            "Any plan within the limit: (agnostic's calibration figure − the certificate's lower bound) / "
            "agnostic's calibration figure, the most that any single-copy plan within the same load limits "
            "can cut on the calibration trace (a proof, not an estimate; below 10 % no planner can reach the "
            "target there). Any plan at MaxVio <= +0.02 (held out): `maxvio_budget_bound` on the held-out "
            "trace, over every single-copy plan whose held-out MaxVio (mean over layers) is at most "
            f"`agnostic`'s + {MAXVIO_SLACK:g} (a plan may spend that budget unevenly over the layers, each "
            f"layer no lower than the least largest load any plan has there; the certificate at {HEADROOM_LEVELS} "
            "MaxVio levels per layer, coupled by the budget): the most any planner, even one that saw the "
            "held-out tokens, can cut in the done-when's own terms (dependent cells only).",
            "",
            "## Certificate of the cross-layer plans (calibration)",
            "",
            f"`crosslayer`'s lower bound on every plan's calibration objective ({BOUND_TIME:g} s per layer, "
            "after the search, not in its wall time): per layer, a bound on distinct GPUs per token by "
            "column generation (a pair LP where that is cut short), less the share of tokens whose home can "
            "hold one of their experts (an LP over which previous-layer experts can share a GPU with which "
            "experts of the layer; times 1 − 1/G at layer 0, uniform homes). The distinct-GPU bound holds "
            "for every single-copy plan within the layer's load limit (its columns, the GPU contents, are "
            "the sets within the limit: `load-limited`); the stay share ignores the limit; "
            "gap = (objective − bound) / objective.",
            "",
            tabulate(
                certificates,
                headers=[
                    "shape",
                    "dependency",
                    "objective",
                    "lower bound",
                    "gap",
                    "layers' LP solved",
                    "load-limited",
                    "bound s",
                ],
                tablefmt="github",
            ),
            "",
        ]
    )


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.get("workload", SYNTHETIC) != SYNTHETIC, r["gpus"], r["experts"], r["top_k"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    width = 0.8 / len(LABELS)
    for ax, (real, G, E, k) in zip(axes[0], panels, strict=True):
        cell = [
            r
            for r in rows
            if r["gpus"] == G and r["experts"] == E and (r.get("workload", SYNTHETIC) != SYNTHETIC) == real
        ]
        deps = sorted({r["layer_dependency"] for r in cell}, key=lambda d: -1.0 if d is None else d)
        x = np.arange(len(deps))
        for i, label in enumerate(LABELS):
            ys = [
                next(r["remote_previous_layer"] for r in cell if r["method"] == label and r["layer_dependency"] == d)
                for d in deps
            ]
            ax.bar(x + (i - (len(LABELS) - 1) / 2) * width, ys, width, label=label)
        uni = [
            next(r["remote_uniform"] for r in cell if r["method"] == "agnostic" and r["layer_dependency"] == d)
            for d in deps
        ]
        ax.plot(x, uni, "k_", ms=28, mew=2, label="agnostic, uniform homes")
        ax.set_xticks(x, ["count-sampled" if d is None else f"dep {d}" for d in deps])
        name = cell[0].get("workload", SYNTHETIC).replace(" (count-sampled)", "") if real else ""
        ax.set_title(f"{name}: {G} GPUs × {E} (top-{k})" if real else f"{G} GPUs × {E} experts (top-{k})")
        ax.set_ylabel("remote GPUs / token / layer (held-out)")
        lo = min(r["remote_previous_layer"] for r in cell)
        ax.set_ylim(0.8 * lo, None)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle("token_home: previous-layer")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--workers", type=workers_arg, default=1, help="solve each plan's layers in N local processes")
    ap.add_argument("--shapes", default=",".join(str(s[0]) for s in SHAPES), help="GPU counts to run (8,16,64)")
    ap.add_argument(
        "--dependencies", default=",".join(str(d) for d in DEPENDENCIES), help="layer_dependency values (0,0.5,0.9)"
    )
    ap.add_argument(
        "--real", default=",".join(REAL_CELLS), help="real-data cells to run (comma-separated names; '' for none)"
    )
    ap.add_argument("--out", default=str(OUT), help="folder for crosslayer.{json,md,png} (a one-cell run: elsewhere)")
    args = ap.parse_args()
    log = (lambda *_: None) if args.quiet else print
    try:
        wanted = {int(x) for x in args.shapes.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--shapes: expected comma-separated GPU counts, got {args.shapes!r}")
    try:
        deps = {float(x) for x in args.dependencies.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--dependencies: expected comma-separated numbers, got {args.dependencies!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows: list[dict] = []
    for G, E, k in SHAPES:
        if G not in wanted:
            continue
        for dep in DEPENDENCIES:
            if dep not in deps:
                continue
            rows += run_cell(G, E, k, dep, log, args.workers)
    for name in (x.strip() for x in args.real.split(",") if x.strip()):
        if name not in REAL_CELLS:
            ap.error(f"--real: unknown cell {name!r}; expected some of {', '.join(REAL_CELLS)}")
        rows += run_real(name, log, args.workers)
    if not rows:
        ap.error("no cell to run: --shapes, --dependencies and --real select none")
    info = {"machine": machine(), "wall_s": time.perf_counter() - t0, "layers": LAYERS, "tokens": TOKENS}
    write_json(out / "crosslayer.json", {"info": info, "rows": rows})
    write_text(out / "crosslayer.md", markdown(rows, info))
    plot(rows, out / "crosslayer.png")
    log(f"wrote {out / 'crosslayer.json'}, crosslayer.md, crosslayer.png ({info['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    run_script(main)
