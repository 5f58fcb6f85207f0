"""Shared types, validation, and the scores of a layout: per-GPU loads and MaxVio."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: relative tolerance used to decide that a move strictly improves a maximum
_RTOL = 1e-12
#: default number of perturbation rounds of the iterated local search
DEFAULT_ITERATIONS = 12


def _as_load(load: ArrayLike, ndim: int = 1) -> FloatArray:
    arr = np.asarray(load, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"load must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.shape[-1] < 1:
        raise ValueError("load must have at least one expert")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("load must be finite and >= 0")
    return arr


def _check_shape(E: int, G: int, W: int, allow_colocated: bool = True) -> None:
    if int(G) < 1 or int(W) < 1:
        raise ValueError(f"G and W must be >= 1, got G={G}, W={W}")
    if G * W < E:
        raise ValueError(f"{G} x {W} = {G * W} slots cannot hold {E} experts")
    if not allow_colocated and W > E:
        raise ValueError(f"W={W} slots per GPU need colocated copies with only {E} experts")


def _node_shape(E: int, G: int, W: int, n: int, allow_colocated: bool) -> tuple[int, int]:
    """Nodes ``N = G / n`` and the most experts a node holds (``ceil(E / N)``) under the hierarchical
    constraint; raises ValueError when the nodes cannot hold their experts."""
    if n < 1 or G % n:
        raise ValueError(f"G={G} is not a multiple of gpus_per_node={n}")
    N = G // n
    per_node = -(-E // N)
    bigger = "use larger nodes (cluster.gpus_per_node)"
    if per_node > n * W:
        raise ValueError(
            f"{N} nodes of {n} GPUs x {W} slots hold at most {n * W} experts each, but {E} experts need "
            f"{per_node} in some node; {bigger} or hierarchical: false"
        )
    if not allow_colocated and E // N < W:
        raise ValueError(
            f"{N} nodes of {n} GPUs get {E // N} experts each, fewer than the {W} slots of a GPU, so some GPU "
            f"would hold two copies of one expert; {bigger}, cluster.allow_colocated_copies: true, or "
            "hierarchical: false"
        )
    return N, per_node


def _cap(E: int, G: int, W: int, allow_colocated: bool) -> int:
    """Largest useful copy count of one expert: ``G`` without colocation, else all spare slots + 1."""
    spare = G * W - E + 1
    return spare if allow_colocated else min(G, spare)


def gpu_loads(slots: ArrayLike, load: ArrayLike, counts: ArrayLike | None = None) -> FloatArray:
    """Per-GPU load under ``even`` dispatch.

    Parameters
    ----------
    slots : array_like of int, shape (G, W)
        Expert id in every slot.
    load : array_like of float, shape (E,) or (T, E)
        Expert loads (one layer), optionally per step.
    counts : array_like of int, shape (E,), optional
        Copy counts; by default counted from ``slots``.

    Returns
    -------
    ndarray, shape (G,) or (T, G)
        Sum over each GPU's slots of ``load_e / c_e``.

    Raises
    ------
    ValueError
        If an expert has no copy or an id is out of range.
    """
    s = np.asarray(slots, dtype=np.int64)
    L = np.asarray(load, dtype=np.float64)
    E = L.shape[-1]
    if s.ndim != 2:
        raise ValueError(f"slots must be [G, W], got shape {s.shape}")
    if s.size and (s.min() < 0 or s.max() >= E):
        raise ValueError("slot holds an expert id outside [0, E)")
    c = np.bincount(s.ravel(), minlength=E) if counts is None else np.asarray(counts, dtype=np.int64)
    if np.any(c < 1):
        raise ValueError(f"experts without a copy: {np.flatnonzero(c < 1)[:10].tolist()}")
    share = L / c
    return share[..., s].sum(axis=-1)


def maxvio(slots: ArrayLike, load: ArrayLike) -> float | FloatArray:
    """``max / mean - 1`` of the GPU loads (0 for a layer without load).

    Parameters
    ----------
    slots : array_like of int, shape (G, W)
    load : array_like of float, shape (E,) or (T, E)

    Returns
    -------
    float or ndarray, shape (T,)
        MaxVio of the layer, per step when ``load`` is 2-D.
    """
    gl = gpu_loads(slots, load)
    mean = gl.mean(axis=-1)
    out = np.where(mean > 0, gl.max(axis=-1) / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)
    return float(out) if np.ndim(out) == 0 else out
