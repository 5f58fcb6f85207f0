"""GEM's utilization trace, expert classification and straggler lower bound (SPEC section 5).

The *utilization trace* of a layer is ``n[t, e]``: tokens routed to expert e at step t.
GEM uses T = 16 steps by default; a trace with more steps is aggregated into T contiguous
groups of (nearly) equal size, each group holding the **mean** per-step counts of its steps.
The mean, not the sum, keeps a group's token counts on the scale of one step, which is what
the latency profile's tile boundaries are measured against.

The lower bound of `step_lower_bound` holds for every plan (with or without
replicas) and is computed in microseconds; its validity argument is in
``formulations/gem.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt.profile import Profile

if TYPE_CHECKING:
    from moeopt.instance import Instance
    from moeopt.plan import Plan

#: Default number of utilization-trace steps (the GEM paper: 16 steps suffice).
DEFAULT_STEPS = 16


@dataclass(frozen=True, eq=False)
class Utilization:
    """Per-step expert counts ``n[l, t, e]`` after aggregation into at most ``T`` groups.

    Attributes
    ----------
    counts
        float ``[L, T, E]``: mean tokens per step routed to each expert, per step group.
    group
        int ``[T_source]``: the group of each source step.
    sizes
        int ``[T]``: source steps per group.
    """

    counts: np.ndarray
    group: np.ndarray
    sizes: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.counts.shape[1])

    @property
    def aggregated(self) -> bool:
        return bool((self.sizes > 1).any())

    @property
    def denominator(self) -> int:
        """An integer D with ``counts * D`` integral when the source counts are integral."""
        return int(np.lcm.reduce(self.sizes)) if len(self.sizes) else 1


def utilization_trace(step_counts: np.ndarray, steps: int | None = DEFAULT_STEPS) -> Utilization:
    """Aggregate per-step counts ``[L, T_source, E]`` into at most ``steps`` step groups.

    Parameters
    ----------
    step_counts
        float ``[L, T_source, E]``, the trace's ``n[l, t, e]``.
    steps
        Number of groups T; None or ``steps >= T_source`` keeps every source step.

    Returns
    -------
    Utilization
        Group ``i`` holds source steps ``t`` with ``floor(t * T / T_source) == i`` (contiguous,
        sizes differing by at most one) and their mean counts.
    """
    sc = np.asarray(step_counts, dtype=np.float64)
    if sc.ndim != 3:
        raise ValueError(f"step counts must be [layers, steps, experts], got shape {sc.shape}")
    t_src = sc.shape[1]
    if steps is None or steps >= t_src:
        return Utilization(sc, np.arange(t_src), np.ones(t_src, dtype=np.int64))
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    group = (np.arange(t_src) * steps) // t_src
    sizes = np.bincount(group, minlength=steps)
    sums = np.zeros((sc.shape[0], steps, sc.shape[2]))
    np.add.at(np.moveaxis(sums, 1, 0), group, np.moveaxis(sc, 1, 0))  # a view: adds into sums
    return Utilization(sums / sizes[None, :, None], group, sizes)


# ----------------------------------------------------------------------------- classification
@dataclass(frozen=True, eq=False)
class ExpertClasses:
    """GEM's classification of one layer's experts.

    Attributes
    ----------
    consistent
        bool ``[E]``: above the step's mean load in at least half of the steps.
    temporal
        bool ``[E]``: not consistent, but heavy (at or above the step's 90th percentile and
        above its mean) in at least one step and in fewer than half of them.
    pairs
        int ``[P, 2]``: correlated temporal pairs ``(e, e')``, ``e < e'``, Pearson
        correlation of their series at least ``rho``.
    correlation
        float ``[P]``: the correlation of each pair.
    """

    consistent: np.ndarray
    temporal: np.ndarray
    pairs: np.ndarray
    correlation: np.ndarray

    @property
    def heavy(self) -> np.ndarray:
        return np.asarray(self.consistent | self.temporal)

    def partners(self) -> np.ndarray:
        """bool ``[E, E]``: symmetric adjacency of the correlated temporal pairs."""
        E = len(self.consistent)
        adj = np.zeros((E, E), dtype=bool)
        adj[self.pairs[:, 0], self.pairs[:, 1]] = True
        return np.asarray(adj | adj.T)


def classify_experts(
    n: np.ndarray, *, heavy_quantile: float = 0.9, share: float = 0.5, rho: float = 0.5
) -> ExpertClasses:
    """Classify experts from one layer's utilization trace ``n[t, e]``.

    Parameters
    ----------
    n
        float ``[T, E]`` per-step counts.
    heavy_quantile
        An expert is *heavy* at step t when ``n[t, e]`` reaches this quantile of ``n[t, :]``.
    share
        Fraction of steps separating consistent (``>=``) from temporal (``<``) behaviour.
    rho
        Pearson correlation threshold of correlated temporal pairs.
    """
    n = np.asarray(n, dtype=np.float64)
    T, E = n.shape
    above = n > n.mean(axis=1, keepdims=True)
    consistent = above.mean(axis=0) >= share
    q = np.quantile(n, heavy_quantile, axis=1, keepdims=True)
    heavy = (n >= q) & above  # "above the mean" keeps flat steps from making everyone heavy
    frac = heavy.mean(axis=0)
    temporal = ~consistent & heavy.any(axis=0) & (frac < share)
    idx = np.nonzero(temporal)[0]
    if len(idx) >= 2 and T >= 2:
        x = n[:, idx] - n[:, idx].mean(axis=0)
        norm = np.sqrt((x**2).sum(axis=0))
        with np.errstate(invalid="ignore", divide="ignore"):
            corr = (x.T @ x) / np.outer(norm, norm)
        corr = np.nan_to_num(corr, nan=0.0)
        i, j = np.nonzero(np.triu(corr >= rho, k=1))
        pairs = np.stack([idx[i], idx[j]], axis=1)
        values = corr[i, j]
    else:
        pairs, values = np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    return ExpertClasses(consistent, temporal, pairs.astype(np.int64), values)


def classification_report(stats: object, steps: int | None = DEFAULT_STEPS) -> dict | None:
    """GEM's expert classes per layer as data (None without per-step counts): the steps used
    (``steps``, ``aggregated_from`` when steps were merged) and per layer the ``consistent`` and
    ``temporal`` experts and the correlated temporal ``pairs``."""
    step_counts = getattr(stats, "step_counts", None)
    if step_counts is None:
        return None
    util = utilization_trace(step_counts, steps)
    layers = []
    for l in range(util.counts.shape[0]):
        c = classify_experts(util.counts[l])
        layers.append(
            {
                "consistent": np.nonzero(c.consistent)[0].tolist(),
                "temporal": np.nonzero(c.temporal)[0].tolist(),
                "pairs": [[int(a), int(b)] for a, b in c.pairs],
            }
        )
    return {
        "steps": util.steps,
        "aggregated_from": len(util.group) if util.aggregated else None,
        "layers": layers,
    }


def classification_lines(stats: object, steps: int | None = DEFAULT_STEPS) -> list[str]:
    """``trace stats`` section: GEM's expert classes per layer (needs per-step counts)."""
    return classification_text(classification_report(stats, steps))


def classification_text(report: dict | None) -> list[str]:
    """The lines of `classification_lines` from a `classification_report`."""
    if report is None:
        return ["GEM classification: needs per-step counts (a trace with 'step'); none here"]
    rows = []
    for l, c in enumerate(report["layers"]):
        pairs = c["pairs"]
        shown = ", ".join(f"{a}-{b}" for a, b in pairs[:6]) + (" ..." if len(pairs) > 6 else "")
        rows.append(f"| {l} | {len(c['consistent'])} | {len(c['temporal'])} | {len(pairs)} | {shown or '-'} |")
    head = (
        f"GEM classification ({report['steps']} steps"
        + (f", aggregated from {report['aggregated_from']}" if report["aggregated_from"] else "")
        + "; consistent: above the step mean in >= 50 % of steps; temporal: >= 90th percentile in"
        " some but < 50 % of steps; pairs: Pearson >= 0.5)"
    )
    return [
        head,
        "| layer | consistent | temporal | correlated temporal pairs | pairs |",
        "|------:|-----------:|---------:|--------------------------:|-------|",
        *rows,
    ]


# ----------------------------------------------------------------------------- lower bound
def step_lower_bound(
    n: np.ndarray, profile: Profile, *, single_expert: bool = True, slots: int | None = None
) -> np.ndarray:
    """Per-step lower bound on ``max_g C_g(n_g(M, t))`` valid for every plan M.

    Three necessary conditions on any latency z reached at step t: every GPU runs the layer,
    so ``z >= max_g C_g(0)``; the GPUs together must hold all ``N_t = sum_e n[t, e]`` tokens,
    GPU g at most ``tile * j_g(z)`` of them with ``j_g(z) = max{j : P_g[j] <= z}`` (the
    speed-weighted fractional balance under the step function), so
    ``sum_g j_g(z) >= ceil(N_t / tile)``; and (``single_expert``, plans without replicas) the
    hottest expert sits on some GPU, so ``z >= min_g C_g(max_e n[t, e])``. The smallest z
    meeting the second condition is the ``ceil(N_t / tile)``-th smallest tile-boundary
    latency over all GPUs. With ``slots`` (and no replicas) a fourth: the other G - 1 GPUs
    hold at most ``(G - 1) * slots`` experts, so every GPU holds at least
    ``m = E - (G - 1) * slots`` of them, carrying at least the m lightest loads:
    ``z >= max_g C_g(sum of the m smallest n[t, e])``.

    Parameters
    ----------
    n
        float ``[..., T, E]`` per-step expert counts (any leading axes, e.g. layers).
    profile
        The latency profile ``C_g``.
    single_expert
        Include the hottest-expert condition; disable for plans with replicas (a replicated
        expert's load is split).
    slots
        Expert slots per GPU, for the fourth condition (ignored with ``single_expert=False``).

    Returns
    -------
    numpy.ndarray
        float ``[..., T]``: the bound per step; sum it over steps (and layers) to bound S(M).
    """
    n = np.asarray(n, dtype=np.float64)
    total = n.sum(axis=-1)
    need = np.ceil(total / profile.tile - 1e-9).astype(np.int64).clip(0)
    J = max(int(need.max(initial=0)), 1)
    table = profile.table(J)  # [G, J + 1]
    values = np.sort(table[:, 1:].ravel())
    balance = np.where(need > 0, values[np.maximum(need - 1, 0)], -np.inf)
    bound = np.maximum(balance, table[:, 0].max())
    if single_expert and n.shape[-1]:
        hottest = n.max(axis=-1)
        alone = profile(np.broadcast_to(hottest[..., None], hottest.shape + (profile.gpus,))).min(axis=-1)
        bound = np.maximum(bound, alone)
        least = 0 if slots is None else n.shape[-1] - (profile.gpus - 1) * slots
        if least > 0:
            floor = np.sort(n, axis=-1)[..., :least].sum(axis=-1)
            bound = np.maximum(
                bound, profile(np.broadcast_to(floor[..., None], floor.shape + (profile.gpus,))).max(axis=-1)
            )
    return np.asarray(bound)


def straggler_lower_bound(
    n: np.ndarray, profile: Profile, *, single_expert: bool = True, slots: int | None = None
) -> float:
    """Lower bound on ``S(M) = sum_t max_g C_g(n_g(M, t))`` (summed over any leading axes)."""
    return float(step_lower_bound(n, profile, single_expert=single_expert, slots=slots).sum())


# ----------------------------------------------------------------------------- metric hook
def straggler_bound_hook(plan: Plan, instance: Instance, workloads: Any, metrics: dict, params: Any = None) -> None:
    """Metric hook: add ``straggler_lower_bound`` and ``gap_to_bound = (S - LB) / S``.

    Parameters
    ----------
    plan
        The result's plan (with replicas only the fractional-balance terms are used).
    instance
        The plan's instance (slots per GPU).
    workloads
        The instance's workloads: the bound is computed on the evaluation workload, like S.
    metrics
        The evaluator's metrics, updated in place (nothing is added without a profile or
        per-step counts).
    """
    profile = workloads.profile
    if profile is None or metrics.get("straggler_latency") is None:
        return
    counts = workloads.evaluation.step_counts  # [L, T, E]; None for counts without steps
    if counts is None:
        return
    single = not plan.has_replicas
    slots = instance.cluster.slots_per_gpu
    bound = float(step_lower_bound(counts, profile, single_expert=single, slots=slots).sum())
    s = float(metrics["straggler_latency"])
    metrics["straggler_lower_bound"] = bound
    metrics["gap_to_bound"] = max(s - bound, 0.0) / max(abs(s), 1e-12)
