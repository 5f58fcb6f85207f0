"""The optimal single-copy plan of tiny instances under ``previous-layer`` homes (exhaustive
search), to check the planner and its certificate."""

from __future__ import annotations

import numpy as np

from moeopt.crosslayer.objective import layer_remote
from moeopt.errors import InfeasibleError, InputError
from moeopt.heuristics.local_search import TOL

#: Largest number of joint placements `exact_crosslayer` enumerates.
EXACT_MAX_PLANS = 2_000_000


def layer_placements(
    experts: int, gpus: int, slots: int, load: np.ndarray | None = None, limit: float | None = None
) -> np.ndarray:
    """int ``[P, E]``: every assignment of E experts to G GPUs with at most ``slots`` each
    (and GPU loads within ``limit`` when given)."""
    grids = np.stack(np.meshgrid(*[np.arange(gpus)] * experts, indexing="ij"), axis=-1).reshape(-1, experts)
    counts = np.stack([(grids == g).sum(axis=1) for g in range(gpus)], axis=1)
    ok = (counts <= slots).all(axis=1)
    if limit is not None and load is not None:
        gl = np.stack([((grids == g) * load[None, :]).sum(axis=1) for g in range(gpus)], axis=1)
        ok &= (gl <= limit + TOL).all(axis=1)
    return grids[ok]


def exact_crosslayer(
    topk: np.ndarray,
    gpus: int,
    slots: int,
    *,
    first: np.ndarray | None = None,
    loads: list[np.ndarray] | None = None,
    limits: list[float | None] | None = None,
    experts: int | None = None,
) -> tuple[np.ndarray, float]:
    """The optimal single-copy plan under ``previous-layer`` homes, by exhaustive search.

    Dynamic programming over the layers: the remote GPUs of layer l depend only on the
    plans of layers l - 1 and l, so ``best[l][p]`` (least remote GPUs of layers 0..l with
    layer l placed as p) is a min over the previous layer's placements. Exact, and tractable
    for tiny instances only (placements per layer squared times layers).

    Parameters
    ----------
    topk
        int ``[tokens, L, k]`` (top-1 first).
    gpus, slots
        G and slots per GPU.
    first
        Layer-0 token homes (None: uniform, expected ``λ (1 - 1/G)``).
    loads, limits
        Per layer, expert loads and the largest GPU load allowed (None: no limit).
    experts
        E (default: the largest id in ``topk`` plus one).

    Returns
    -------
    homes, remote
        The optimal homes ``[L, E]`` and its remote GPUs summed over tokens and layers.
    """
    topk = np.asarray(topk, dtype=np.int64)
    L = topk.shape[1]
    E = experts if experts is not None else int(topk.max()) + 1
    per = [
        layer_placements(E, gpus, slots, None if loads is None else loads[l], None if limits is None else limits[l])
        for l in range(L)
    ]
    if sum(len(per[l - 1]) * len(per[l]) for l in range(1, L)) + len(per[0]) > EXACT_MAX_PLANS:
        raise InputError(None, "exact_crosslayer", "instance too large for exhaustive search")
    if any(len(p) == 0 for p in per):
        raise InfeasibleError("no placement meets the slot and load limits")
    cost0 = np.array([layer_remote(p, topk[:, 0, :], first, gpus) for p in per[0]])
    best = [cost0]
    back: list[np.ndarray] = []
    for l in range(1, L):
        prev, cur = per[l - 1], per[l]
        # pair cost [P_prev, P_cur]: layer l's remote GPUs with homes from the previous placement
        pair = np.empty((len(prev), len(cur)))
        for i, p in enumerate(prev):
            th = p[topk[:, l - 1, 0]]
            pair[i] = [layer_remote(q, topk[:, l, :], th, gpus) for q in cur]
        total = best[-1][:, None] + pair
        back.append(np.argmin(total, axis=0))
        best.append(total.min(axis=0))
    j = int(np.argmin(best[-1]))
    value = float(best[-1][j])
    idx = [j]
    for l in range(L - 1, 0, -1):
        j = int(back[l - 1][j])
        idx.append(j)
    idx.reverse()
    return np.stack([per[l][idx[l]] for l in range(L)]), value
