"""The metrics of SPEC section 2 for one plan on one workload.

Nothing here trusts a solver: a plan and a workload go in, metrics come out. Tokens are
dispatched over an expert's copies by the plan's own rule ([`moeopt.dispatch`][]), so the
dispatch a plan will run under is the one it is scored with. [`moeopt.scoring.score`][]
adds the comparison with the linear baseline and the method's own metrics (bounds, gaps) on
top, and is what every command calls.
"""

from __future__ import annotations

import numpy as np

from moeopt.dispatch import communication_of, count_loads, remote_nodes_of, route_trace
from moeopt.instance import Cluster
from moeopt.plan import Dispatch, Plan
from moeopt.profile import Profile
from moeopt.trace import Stats, Trace


def linear_plan(layers: int, experts: int, gpus: int, width: int | None = None) -> Plan:
    """vLLM's contiguous mapping: expert e on GPU floor(e * G / E), one copy each."""
    home = (np.arange(experts) * gpus) // experts
    return Plan.from_homes(np.tile(home, (layers, 1)), gpus=gpus, width=width)


# ----------------------------------------------------------------------------- metrics
def jain(loads: np.ndarray) -> np.ndarray:
    """Jain fairness over the last axis: (sum L)^2 / (G sum L^2); 1 for an idle set."""
    loads = np.asarray(loads, dtype=np.float64)
    s, q = loads.sum(axis=-1), (loads**2).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(q > 0, s**2 / (loads.shape[-1] * np.where(q > 0, q, 1)), 1.0)


def maxvio(loads: np.ndarray) -> np.ndarray:
    """MaxVio over the last axis: max / mean - 1; 0 for an idle set."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, loads.max(axis=-1) / np.where(mean > 0, mean, 1) - 1.0, 0.0)


communication = communication_of  # the metric, defined beside the dispatch that feeds it


def loads_from_counts(plan: Plan, counts: np.ndarray, cluster: Cluster) -> np.ndarray:
    """float ``[L, ..., G]`` from per-expert counts ``[L, ..., E]`` under the plan's dispatch."""
    return count_loads(plan, counts, cluster)


def straggler(step_loads: np.ndarray, profile: Profile) -> tuple[float, float, np.ndarray]:
    """S = sum_l sum_t max_g C_g(n[l, t, g]); p90 over t of sum_l max_g C_g; per-step maxima."""
    per = profile(step_loads).max(axis=-1)  # [L, T]
    per_step = per.sum(axis=0)
    return float(per.sum()), float(np.percentile(per_step, 90)), per


def layer_straggler(step_counts: np.ndarray, home: np.ndarray, profile: Profile) -> float:
    """One layer's S(M) = sum_t max_g C_g(n_g(M, t)) from ``n[t, e]`` and homes ``[E]``."""
    onehot = np.zeros((len(home), profile.gpus))
    onehot[np.arange(len(home)), home] = 1.0
    return float(profile(step_counts @ onehot).max(axis=-1).sum())


def grouping_affinity(graph: np.ndarray, home: np.ndarray) -> float:
    """Intra-group affinity sum_g sum_{e < e' in g} graph[e, e'] of one layer's grouping."""
    same = home[:, None] == home[None, :]
    return float(np.triu(graph * same, k=1).sum())


def evaluate(
    plan: Plan,
    workload: Trace | Stats,
    cluster: Cluster,
    *,
    profile: Profile | None = None,
    dispatch: Dispatch | None = None,
) -> dict:
    """Every metric of a plan on a workload (a token trace, or count-only statistics).

    Tokens are split over copies by ``dispatch`` (default: the plan's own rule).

    Returns a dict with ``comm_per_token`` (remote GPUs per token per layer),
    ``comm_nodes_per_token`` (remote nodes per token per layer,
    [`remote_nodes_of`][moeopt.dispatch.remote_nodes_of]), ``comm_weighted_per_token``,
    ``gpus_per_token``, ``jain``, ``maxvio`` (whole workload, mean over layers),
    ``jain_per_step``, ``maxvio_per_step`` (mean over layers and steps), ``maxvio_per_step_max``,
    per-layer lists, ``loads`` ``[L][G]``, and
    ``straggler_latency`` / ``straggler_p90`` when a profile is given and steps are known.
    Communication is None for count-only input.
    """
    if dispatch is not None:
        plan = plan.with_dispatch(dispatch)
    m: dict = {"dispatch": plan.dispatch.kind}
    if isinstance(workload, Trace):
        routing = route_trace(plan, workload, cluster)
        if routing.comm is not None:
            distinct, remote, weighted = routing.comm
        elif routing.gpu is not None:
            distinct, remote, weighted = communication(routing.gpu, cluster, workload.home)
        else:  # Routing's contract: without per-home expectations the GPUs are known
            raise ValueError("route_trace returned neither GPUs nor communication")
        m["gpus_per_token"] = float(distinct.mean())
        m["comm_per_token"] = float(remote.mean())
        m["comm_weighted_per_token"] = float(weighted.mean())
        m["comm_per_layer"] = remote.mean(axis=0).tolist()
        if routing.nodes is not None:
            nodes = routing.nodes
        elif routing.gpu is not None:
            nodes = remote_nodes_of(routing.gpu, cluster, workload.home)
        else:  # Routing's contract: expectations come with their node figures
            raise ValueError("route_trace returned neither GPUs nor remote nodes")
        m["comm_nodes_per_token"] = float(nodes.mean())
        m["comm_nodes_per_layer"] = nodes.mean(axis=0).tolist()
        step_loads = routing.step_loads
    else:
        m["gpus_per_token"] = m["comm_per_token"] = m["comm_weighted_per_token"] = None
        m["comm_nodes_per_token"] = None
        step_loads = None
        if workload.step_counts is not None:
            step_loads = count_loads(plan, workload.step_counts, cluster)
    if step_loads is not None:  # what the dispatch executed, batch by batch
        loads = step_loads.sum(axis=1)
    else:  # pooled counts: one batch
        loads = count_loads(plan, workload.expert_load, cluster)
    jl, ml = jain(loads), maxvio(loads)
    m["jain"], m["maxvio"] = float(jl.mean()), float(ml.mean())
    m["jain_per_layer"], m["maxvio_per_layer"] = jl.tolist(), ml.tolist()
    m["loads"] = loads.tolist()
    m["total_load"] = float(loads.sum())
    if step_loads is not None:
        busy = step_loads.sum(axis=-1) > 0
        js, ms = jain(step_loads), maxvio(step_loads)
        m["jain_per_step"] = float(js[busy].mean()) if busy.any() else 1.0
        m["maxvio_per_step"] = float(ms[busy].mean()) if busy.any() else 0.0
        m["maxvio_per_step_max"] = float(ms.max())
        if profile is not None:
            s, p90, _ = straggler(step_loads, profile)
            m["straggler_latency"], m["straggler_p90"] = s, p90
    return m
