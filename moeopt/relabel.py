"""GPU relabeling: a free post-pass when tokens stay on the GPU of their last expert.

Under ``cluster.token_home: previous-layer`` a token lives, at layer l, on the GPU that ran
its top-1 expert at layer l - 1, so a dispatch is cheaper when the layer's experts for that
token sit on that same GPU. Renumbering the GPUs of layer l (moving every slot of GPU h to
GPU pi(h)) changes no per-layer load, group or balance metric, only which GPU ids
consecutive layers share. Layer by layer, from the first, the permutation maximizing the
tokens that stay (a token stays when its home serves one of its layer-l experts) is a linear
assignment on the counts ``M[g, h]`` = tokens living on g whose layer-l experts run on h
(`scipy.optimize.linear_sum_assignment`).

Heterogeneous GPUs (a latency profile whose rows differ) may only trade ids within a class of
identical rows: moving a group to a slower GPU would change its latency, so pairs across
classes are forbidden in the assignment. The relabeled plan is kept only when the scorer
says it does not raise communication under ``previous-layer`` (so it never does).

Only layers where every expert has one copy are renumbered. With replicas every dispatch
rule picks among an expert's copies by GPU or physical-slot order (``even``: copy ``row mod
c`` in slot order; ``static``: the engine's per-rank deal; ``lp``: quotas filled in GPU
order; ``locality``: ties), so renumbering such a layer would change which copy tokens use,
hence communication and, for ``static`` / ``lp`` / ``locality``, loads: not free.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from moeopt.dispatch import HOME_SEED, RANK_TABLE_KINDS, _route_layer, batch_rows
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.trace import Trace


def speed_classes(gpus: int, profile: Profile | None) -> np.ndarray:
    """int ``[G]``: GPUs with identical latency rows share a class (all one class without a profile)."""
    if profile is None:
        return np.zeros(gpus, dtype=np.int64)
    _, cls = np.unique(np.round(np.asarray(profile.latency, dtype=np.float64), 12), axis=0, return_inverse=True)
    return np.asarray(cls, dtype=np.int64).reshape(-1)


def stay_counts(home: np.ndarray, gpu: np.ndarray, gpus: int) -> np.ndarray:
    """int ``[G, G]``: ``M[g, h]`` = tokens living on g with at least one expert run on h."""
    s = np.sort(gpu, axis=1)
    first = np.ones(s.shape, dtype=bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    rows = np.repeat(home, s.shape[1])[first.ravel()]
    return np.bincount(rows * gpus + s.ravel()[first.ravel()], minlength=gpus * gpus).reshape(gpus, gpus)


def relabel_gpus(plan: Plan, trace: Trace, cluster: Cluster, profile: Profile | None = None) -> tuple[Plan, dict]:
    """Renumber each layer's GPUs so that more tokens stay where their previous expert ran.

    Parameters
    ----------
    plan
        Any plan; its per-layer loads and groups are kept (layers with replicas are left
        as they are, see the module docstring).
    trace
        The calibration trace (top-1 expert first in each token's top-k).
    cluster
        Its cluster; scored under ``token_home: previous-layer``.
    profile
        Optional latency profile: ids move only among GPUs with identical rows.

    Returns
    -------
    plan, info
        The relabeled plan (or ``plan`` itself when relabeling would not lower the calibration
        communication) and ``{"comm_before", "comm_after", "kept", "moved_layers"}``.
    """
    from dataclasses import replace

    L, G, _ = plan.slots.shape
    prev = replace(cluster, token_home="previous-layer")
    cls = speed_classes(G, profile)
    forbid = cls[:, None] != cls[None, :]
    step = trace.step.astype(np.int64)
    T = int(step.max()) + 1 if trace.tokens else 1
    row = batch_rows(trace, plan.dispatch.kind)
    home = trace.home
    if home is None and plan.dispatch.kind in RANK_TABLE_KINDS:
        home = np.random.default_rng(HOME_SEED).integers(0, G, size=trace.tokens)
    slots = plan.slots.copy()
    single = (plan.copy_counts == 1).all(axis=1)  # [L]: layers a renumbering leaves unchanged
    moved = 0
    for l in range(L):
        current = replace(plan, slots=slots)
        if l > 0 and home is not None and single[l]:
            gpu, _ = _route_layer(current, l, trace, prev, step, row, T, home)
            M = stay_counts(home, gpu, G).astype(np.float64)
            M[forbid] = -1e18
            g_new, h_old = linear_sum_assignment(M, maximize=True)
            perm = np.empty(G, dtype=np.int64)
            perm[g_new] = h_old  # new GPU g takes the slots GPU perm[g] had
            if not np.array_equal(perm, np.arange(G)):
                slots[l] = slots[l][perm]
                moved += 1
                current = replace(plan, slots=slots)
        gpu, _ = _route_layer(current, l, trace, prev, step, row, T, home)
        home = gpu[:, 0]
    new = replace(plan, slots=slots)
    before = evaluate(plan, trace, prev)["comm_per_token"]
    after = evaluate(new, trace, prev)["comm_per_token"]
    kept = after <= before
    info = {"comm_before": before, "comm_after": after if kept else before, "kept": kept, "moved_layers": moved}
    return (new if kept else plan), info
