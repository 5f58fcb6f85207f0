"""Measured plan runs: emulate G expert-parallel GPUs on one device (SPEC section 7).

For every layer l and timestep t of the instance's evaluation workload, each emulated GPU
g runs its experts on the tokens the plan sends them, ``n[l, t, g, e]``, as one group of
SwiGLU GEMMs (see `ExpertBank`). The group's median time is
divided by g's emulated speed; the step's latency is the slowest GPU; the plan's measured
straggler latency is the sum over layers and steps, the same sum as the evaluator's
``S = sum_l sum_t max_g C_g(n_g)``, which is the modelled value reported beside it.

Token counts come from the plan's own dispatch rule ([`moeopt.dispatch`][]):
``route_trace`` for token traces, ``count_flows`` for per-step count statistics. All groups of
all plans are timed in interleaved rounds and each keeps its median, so slow drift of the
device (clock, temperature) or a burst of contention does not favour one plan.

Where several CUDA devices are visible, the plan's token all-to-all is also timed with
NCCL (`moeopt.harness.alltoall`). That path has been exercised on the CPU with the gloo
backend only; it has not run on a multi-GPU machine. The report's Markdown is
`moeopt.harness.report`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moeopt import console
from moeopt.dispatch import RANK_TABLE_KINDS, count_flows, route_trace
from moeopt.errors import InputError, MoeoptError
from moeopt.evaluate import straggler
from moeopt.harness.alltoall import maybe_all_to_all
from moeopt.harness.report import report_markdown
from moeopt.instance import Cluster, Instance
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.trace import Stats, Trace

REPORT_FORMAT = "moeopt.validate/1"
#: Keys of every per-plan entry of a validate report (the same on CPU and GPU).
PLAN_KEYS = (
    "name",
    "source",
    "measured_straggler_ms",
    "modelled_straggler",
    "measured_over_modelled",
    "measured_p90_ms",
    "modelled_p90",
    "measured_improvement_vs_linear",
    "modelled_improvement_vs_linear",
    "step_correlation",
    "measured_per_step_ms",
    "modelled_per_step",
    "assignments",
    "max_gpu_tokens",
    "measure_seconds",
)
#: Top-level keys of a validate report.
REPORT_KEYS = (
    "format",
    "instance",
    "device",
    "ffn",
    "gpus",
    "layers",
    "steps",
    "speeds",
    "speed_source",
    "timing",
    "modelled_profile",
    "plans",
    "ranking",
    "all_to_all",
    "wall_seconds",
)


@dataclass(frozen=True, eq=False)
class PlanLoads:
    """What one plan makes each emulated GPU compute.

    Attributes
    ----------
    name
        Plan name (file stem or method name).
    per_expert
        int ``[L, T, G, E]``: tokens expert e processes on GPU g at step t of layer l.
    step_loads
        float ``[L, T, G]``: the evaluator's per-step GPU loads (``n_g(M, t)``).
    traffic
        int ``[L, T, G, G]`` tokens sent from their home GPU to each remote GPU
        (token traces only; ``None`` for count statistics).
    """

    name: str
    per_expert: np.ndarray
    step_loads: np.ndarray
    traffic: np.ndarray | None = None


def plan_loads(
    name: str,
    plan: Plan,
    workload: Trace | Stats,
    cluster: Cluster,
    *,
    seed: int = 0,
) -> PlanLoads:
    """Per-expert token counts of a plan on a workload, through the evaluator's dispatch.

    Parameters
    ----------
    name
        Plan name carried into the report.
    plan
        The placement (with replicas, if any).
    workload
        The evaluation workload: a token trace, or statistics with ``step_counts``.
    cluster
        The instance's cluster (G).
    seed
        Seed of the uniform token homes used for traffic when the trace has none (and, under
        ``static`` dispatch, to choose each token's copy).

    Returns
    -------
    PlanLoads
        Counts per (layer, step, GPU, expert): the tokens the plan's dispatch sends to each
        GPU (for ``even`` and ``lp`` an integer rounding of the evaluator's fractional split).

    Raises
    ------
    InputError
        For count statistics without per-step counts.
    """
    G, E, L = cluster.gpus, plan.experts, plan.layers
    if isinstance(workload, Trace):
        home = workload.home
        if home is None:
            home = np.random.default_rng(seed).integers(0, G, size=workload.tokens)
            if plan.dispatch.kind in RANK_TABLE_KINDS:  # the copy a token uses depends on its home
                workload = dataclasses.replace(workload, home=home)
        gpu = route_trace(plan, workload, cluster).gpu
        assert gpu is not None
        step = workload.step.astype(np.int64)
        T = int(step.max()) + 1
        experts = workload.topk.astype(np.int64)
        key = ((np.arange(L)[None, :, None] * T + step[:, None, None]) * G + gpu) * E + experts
        per_expert = np.bincount(key.ravel(), minlength=L * T * G * E).reshape(L, T, G, E)
        step_loads = per_expert.sum(axis=-1).astype(np.float64)
        traffic = token_traffic(gpu, step, home.astype(np.int64), G, T)
    else:
        if workload.step_counts is None:
            raise InputError(
                None,
                "workload.evaluation",
                "validate needs per-timestep counts: a token trace or counts with step_counts",
            )
        counts = np.asarray(workload.step_counts, dtype=np.float64)  # [L, T, E]
        flows = count_flows(plan, counts, cluster)  # [L, T, E, G]
        step_loads = flows.sum(axis=2)
        per_expert = np.rint(np.swapaxes(flows, 2, 3)).astype(np.int64)
        traffic = None
    return PlanLoads(name=name, per_expert=per_expert, step_loads=step_loads, traffic=traffic)


def token_traffic(gpu: np.ndarray, step: np.ndarray, home: np.ndarray, gpus: int, steps: int) -> np.ndarray:
    """int ``[L, T, G, G]``: tokens sent from their home GPU to each distinct remote GPU.

    A token goes once to every distinct GPU among its top-k placements other than its
    home, so ``traffic[l].sum()`` equals the evaluator's remote GPUs summed over tokens.

    Parameters
    ----------
    gpu
        int ``[tokens, L, k]`` executing GPU of each token-expert assignment.
    step
        int ``[tokens]`` timestep of each token.
    home
        int ``[tokens]`` home GPU of each token.
    gpus, steps
        G and T.
    """
    N, L, k = gpu.shape
    s = np.sort(gpu, axis=-1)
    first = np.ones(s.shape, dtype=bool)
    first[..., 1:] = s[..., 1:] != s[..., :-1]
    send = first & (s != home[:, None, None])
    layer = np.broadcast_to(np.arange(L)[None, :, None], s.shape)
    src = np.broadcast_to(home[:, None, None], s.shape)
    t = np.broadcast_to(step[:, None, None], s.shape)
    key = ((layer * steps + t) * gpus + src) * gpus + s
    return np.bincount(key[send], minlength=L * steps * gpus * gpus).reshape(L, steps, gpus, gpus)


# ----------------------------------------------------------------------------- measuring
def measure_plans(
    loads: Sequence[PlanLoads],
    bank: Any,
    timer: Any,
    speeds: np.ndarray,
    *,
    steps: int,
    quiet: bool = True,
) -> list[np.ndarray]:
    """Measured step latencies ``[L, steps]`` (ms) of each plan.

    Every non-idle (plan, layer, step, GPU) group runs its experts' GEMMs; groups are timed
    in interleaved rounds (`rounds`: all plans in every
    round, so drift favours none) and each keeps its median; that is divided by the GPU's
    speed, and the step latency is the maximum over GPUs (an idle GPU takes 0).
    """
    L = loads[0].per_expert.shape[0]
    G = loads[0].per_expert.shape[2]
    E = loads[0].per_expert.shape[3]
    where: list[tuple[int, int, int, int]] = []
    fns = []
    for p, pl in enumerate(loads):
        for l in range(L):
            for t in range(steps):
                for g in range(G):
                    active = np.nonzero(pl.per_expert[l, t, g])[0]
                    if not len(active):
                        continue
                    ids = (l * E + active).tolist()  # distinct weights per (layer, expert)
                    tokens = pl.per_expert[l, t, g, active].tolist()
                    where.append((p, l, t, g))
                    fns.append(lambda ids=ids, tokens=tokens: bank.run(ids, tokens))
    with console.bar(total=len(fns) * timer.repeats, desc="validate", unit="run", quiet=quiet, leave=False) as bar:
        ms = timer.rounds(fns, progress=bar.update)
    group = np.zeros((len(loads), L, steps, G))
    if where:
        p, l, t, g = np.array(where).T
        group[p, l, t, g] = ms / np.asarray(speeds)[g]
    return list(group.max(axis=-1))


def ranking(names: Sequence[str], measured: Sequence[float], modelled: Sequence[float]) -> dict[str, Any]:
    """Does the measured order of plans agree with the model's?

    Parameters
    ----------
    names
        Plan names.
    measured, modelled
        Straggler latency of each plan (lower is better).

    Returns
    -------
    dict
        ``measured`` and ``modelled`` (names, best first), ``kendall_tau`` and ``p_value``
        (``scipy.stats.kendalltau``; None with fewer than two plans or constant values),
        ``discordant_pairs`` (pairs ordered oppositely; ties agree with anything) and
        ``agrees`` (no discordant pair; None with fewer than two plans).
    """
    from scipy.stats import kendalltau

    a, b = np.asarray(measured, dtype=np.float64), np.asarray(modelled, dtype=np.float64)
    out: dict[str, Any] = {
        "measured": [names[i] for i in np.argsort(a, kind="stable")],
        "modelled": [names[i] for i in np.argsort(b, kind="stable")],
        "kendall_tau": None,
        "p_value": None,
        "discordant_pairs": 0,
        "agrees": None,
    }
    if len(names) < 2:
        return out
    i, j = np.triu_indices(len(names), k=1)
    out["discordant_pairs"] = int((np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) < 0).sum())
    out["agrees"] = out["discordant_pairs"] == 0
    if np.ptp(a) > 0 and np.ptp(b) > 0:
        res = kendalltau(a, b)
        out["kendall_tau"] = float(res.statistic) if math.isfinite(res.statistic) else None
        out["p_value"] = float(res.pvalue) if math.isfinite(res.pvalue) else None
    return out


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    x, y = np.ravel(x), np.ravel(y)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


# ----------------------------------------------------------------------------- validate
def _speeds(text_speeds: Sequence[float] | None, profile: Profile | None, gpus: int) -> tuple[np.ndarray, str]:
    if text_speeds is not None:
        if len(text_speeds) != gpus:
            raise MoeoptError(f"--speeds: expected {gpus} values (one per GPU), got {len(text_speeds)}")
        return np.asarray(text_speeds, dtype=np.float64), "cli"
    if profile is not None:
        # a measured profile records the speeds its rows were divided by: use them exactly
        recorded = profile.meta.get("speeds") if isinstance(profile.meta, dict) else None
        if isinstance(recorded, list) and len(recorded) == gpus:
            return np.asarray(recorded, dtype=np.float64), "profile"
        return profile.speed, "profile"
    return np.ones(gpus), "uniform"


def validate(
    instance: Instance,
    plans: Sequence[tuple[str, str, Plan]] = (),
    *,
    device: str | None = None,
    speeds: Sequence[float] | None = None,
    max_steps: int | None = None,
    d_model: int | None = None,
    d_ff: int | None = None,
    dtype: str | None = None,
    profile: Profile | None = None,
    tile: int | None = None,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    all_to_all: str = "auto",
    world: int | None = None,
    quiet: bool = True,
    seed: int = 0,
    statistic: str = "median",
) -> dict[str, Any]:
    """Measure plans on this device as G emulated GPUs and compare with the model.

    Parameters
    ----------
    instance
        The instance (cluster, evaluation workload, optional latency profile).
    plans
        ``(name, source, plan)`` triples; none: solve ``linear``, ``greedy`` and, when
        registered, ``gem`` here.
    device
        ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
    speeds
        Emulated GPU speeds (length G); default: the modelled profile's speeds, else 1.
    max_steps
        Measure only the first steps of the workload (both measured and modelled).
    d_model, d_ff, dtype
        Expert FFN shape; defaults: the instance's model on a GPU, tiny fp32 on the CPU.
    profile
        Modelled profile; default the instance's, else one measured here on the fly.
    tile
        Tile of an on-the-fly profile (default 64).
    repeats, warmup
        Timed and untimed runs of every group.
    threads
        CPU threads for torch (CPU default 1).
    all_to_all
        ``"auto"`` (NCCL when several CUDA devices are visible), ``"off"``, ``"nccl"``
        or ``"gloo"``.
    world
        Ranks of the all-to-all (default: visible CUDA devices, or 2 for gloo).
    quiet
        No progress bar.
    seed
        Seed of the weights and of on-the-spot solves.
    statistic
        ``"median"`` or ``"min"`` of each group's timed runs.

    Returns
    -------
    dict
        The report; keys `REPORT_KEYS`, each plan entry keys `PLAN_KEYS`.
    """
    from moeopt.harness import require_torch, resolve_device
    from moeopt.harness.profile import ExpertBank, Timer, device_info, measure_profile, set_threads, shape_for
    from moeopt.io import resolve_profile
    from moeopt.solve import load_workloads

    t_start = time.perf_counter()
    require_torch()
    dev = resolve_device(device)
    threads = set_threads(dev, threads)
    shape = shape_for(dev, d_model, d_ff, dtype, instance.model)
    cluster = instance.cluster
    G, L, E = cluster.gpus, instance.model.layers, instance.model.experts
    wl = load_workloads(instance)
    evaluation = wl.evaluation
    if isinstance(evaluation, Trace):
        T = int(evaluation.step.max()) + 1
    elif evaluation.step_counts is not None:
        T = int(evaluation.step_counts.shape[1])
    else:
        raise InputError(
            str(instance.source) if instance.source else None,
            "workload.evaluation",
            "validate needs per-timestep counts: a token trace or counts with step_counts",
        )
    if max_steps is not None and max_steps < 1:
        raise MoeoptError(f"--max-steps: expected a positive integer, got {max_steps}")
    steps = min(T, max_steps) if max_steps else T

    if profile is not None and profile.gpus == 1 and G > 1:
        profile = profile.broadcast(G)  # one measured GPU stands for G identical ones
    base_profile = profile if profile is not None else resolve_profile(instance)
    emulated, speed_source = _speeds(speeds, base_profile, G)
    modelled_info: dict[str, Any]
    if profile is not None:
        modelled_info = {"source": "file", "tile": profile.tile, "unit": "ms"}
        if profile.gpus != G:
            raise MoeoptError(f"--profile: has {profile.gpus} GPUs, the instance has {G}")
    elif base_profile is not None:
        modelled_info = {"source": "instance", "tile": base_profile.tile, "unit": "instance profile units"}
    else:
        # no profile anywhere: measure one here, with the emulated speeds, as the model
        busiest = int(np.ceil(_step_totals(evaluation).max()))
        run = measure_profile(
            shape,
            device=dev,
            experts_per_gpu=cluster.slots_per_gpu,
            max_tokens=max(1, busiest),
            tile=64 if tile is None else tile,
            repeats=repeats,
            warmup=warmup,
            speeds=emulated.tolist(),
            threads=threads,
            quiet=quiet,
            seed=seed,
            statistic=statistic,
        )
        base_profile = run.profile
        modelled_info = {
            "source": "measured",
            "tile": base_profile.tile,
            "unit": "ms",
            "sampling_seconds": run.seconds["tile"],
        }
    if base_profile is None:  # every branch above sets one
        raise RuntimeError("validate: no profile to model the plans with")
    modelled_profile = base_profile
    if modelled_profile.meta.get("note"):  # e.g. "profile: one GPU broadcast to G identical GPUs"
        modelled_info["note"] = modelled_profile.meta["note"]
    wl = dataclasses.replace(wl, profile=modelled_profile)

    entries: list[tuple[str, str, Plan]] = list(plans)
    if not entries:
        entries = solve_here(instance, wl, seed=seed)
    for _, src, plan in entries:
        try:
            plan.check(cluster, layers=L, experts=E)
        except MoeoptError as exc:
            raise MoeoptError(f"{src}: {exc}") from None
    names = _unique([n for n, _, _ in entries])
    loads = [
        plan_loads(n, plan, evaluation, cluster, seed=seed) for n, (_, _, plan) in zip(names, entries, strict=True)
    ]

    busiest_group = max(int(pl.per_expert[:, :steps].max()) for pl in loads)
    bank = ExpertBank(shape, dev, L * E, max(1, busiest_group), seed=seed)
    timer = Timer(dev, warmup=warmup, repeats=repeats, statistic=statistic)
    t0 = time.perf_counter()
    measured = measure_plans(loads, bank, timer, emulated, steps=steps, quiet=quiet)
    measure_seconds = time.perf_counter() - t0

    plan_reports = []
    for (name, (_, src, _)), pl, meas in zip(zip(names, entries, strict=True), loads, measured, strict=True):
        s_mod, p90_mod, per_mod = straggler(pl.step_loads[:, :steps], modelled_profile)
        per_meas_step = meas.sum(axis=0)
        s_meas = float(meas.sum())
        plan_reports.append(
            {
                "name": name,
                "source": src,
                "measured_straggler_ms": s_meas,
                "modelled_straggler": s_mod,
                "measured_over_modelled": s_meas / s_mod if s_mod > 0 else None,
                "measured_p90_ms": float(np.percentile(per_meas_step, 90)),
                "modelled_p90": p90_mod,
                "measured_improvement_vs_linear": None,
                "modelled_improvement_vs_linear": None,
                "step_correlation": _corr(meas, per_mod),
                "measured_per_step_ms": per_meas_step.tolist(),
                "modelled_per_step": per_mod.sum(axis=0).tolist(),
                "assignments": int(pl.per_expert[:, :steps].sum()),
                "max_gpu_tokens": int(pl.step_loads[:, :steps].max()),
                "measure_seconds": measure_seconds / len(loads),
            }
        )

    _improvements(plan_reports)
    info = device_info(dev, threads)
    a2a = maybe_all_to_all(loads, all_to_all, world, dev, info, steps, shape, repeats, warmup)
    return {
        "format": REPORT_FORMAT,
        "instance": instance.name,
        "device": info,
        "ffn": {"d_model": shape.d_model, "d_ff": shape.d_ff, "dtype": shape.dtype, "weight_pool": bank.pool},
        "gpus": G,
        "layers": L,
        "steps": steps,
        "speeds": emulated.round(6).tolist(),
        "speed_source": speed_source,
        "timing": {"timer": timer.kind, "statistic": statistic, "repeats": repeats, "warmup": warmup},
        "modelled_profile": modelled_info,
        "plans": plan_reports,
        "ranking": ranking(
            names, [p["measured_straggler_ms"] for p in plan_reports], [p["modelled_straggler"] for p in plan_reports]
        ),
        "all_to_all": a2a,
        "wall_seconds": time.perf_counter() - t_start,
    }


def _improvements(entries: list[dict[str, Any]]) -> None:
    """Percent by which each plan's S is below the plan named ``linear`` (measured and modelled)."""
    base = next((e for e in entries if e["name"] == "linear"), None)
    if base is None:
        return
    for e in entries:
        for kind, key in (("measured", "measured_straggler_ms"), ("modelled", "modelled_straggler")):
            if base[key] > 0:
                e[f"{kind}_improvement_vs_linear"] = 100.0 * (base[key] - e[key]) / base[key]


def _step_totals(workload: Trace | Stats) -> np.ndarray:
    """Token-expert assignments per (layer, step): what one GPU would get holding every expert."""
    if isinstance(workload, Trace):
        per_step = np.bincount(workload.step, minlength=int(workload.step.max()) + 1)
        return per_step * workload.top_k
    return np.asarray(workload.step_counts).sum(axis=-1)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def solve_here(instance: Instance, workloads: Any, *, seed: int = 0) -> list[tuple[str, str, Plan]]:
    """Plans of ``linear``, ``greedy`` and (when registered) ``gem``, solved now."""
    from moeopt.registry import method_names
    from moeopt.solve import solve

    names = ["linear", "greedy"] + (["gem"] if "gem" in method_names() else [])
    out = []
    for name in names:
        result = solve(instance, method=name, seed=seed, workloads=workloads)
        if result.plan is None:
            raise MoeoptError(f"method {name!r} found no plan for {instance.name}: {result.status.value}")
        out.append((name, f"solved:{name}", result.plan))
    return out


def validate_command(args: Any) -> int:
    """``moeopt validate``: read instance and plans, measure, print and write the report."""
    from moeopt.cli.reports import emit
    from moeopt.harness import require_torch
    from moeopt.harness.profile import parse_speeds
    from moeopt.io import load_instance, read_plan, read_profile, write_text

    # bad files are reported first: a user needs no torch to learn that an input is wrong
    inst = load_instance(args.instance)
    plans = []
    for path in args.plans:
        plan = read_plan(path)
        try:
            plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
        except MoeoptError as exc:
            raise MoeoptError(f"{path}: {exc}") from None
        plans.append((Path(path).stem, str(path), plan))
    speeds = parse_speeds(args.speeds)
    profile = read_profile(args.profile) if args.profile else None
    require_torch()
    report = validate(
        inst,
        plans,
        device=args.device,
        speeds=speeds,
        max_steps=args.max_steps,
        d_model=args.d_model,
        d_ff=args.d_ff,
        dtype=args.dtype,
        profile=profile,
        tile=args.tile,
        repeats=args.repeats,
        warmup=args.warmup,
        threads=args.threads,
        all_to_all=args.all_to_all,
        world=args.world,
        quiet=args.quiet,
        seed=args.seed,
        statistic=args.statistic,
    )
    text = report_markdown(report)
    if args.markdown:
        write_text(args.markdown, text)
    emit(args, report, text.rstrip("\n"))  # --report, and --json in place of the text
    return 0
