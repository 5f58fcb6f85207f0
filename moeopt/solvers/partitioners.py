"""Graph and hypergraph partitioner wrappers: Mt-KaHyPar ((λ − 1) on token hyperedges) and
METIS (edge cut on the coactivation graph).

Each returns a start ``home [E]`` whose block sizes may exceed the slots per GPU by the
partitioner's imbalance; :func:`moeopt.heuristics.local_search.local_search` repairs it.
Both libraries are optional: they are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from moeopt.errors import InputError

if TYPE_CHECKING:
    from moeopt.heuristics.hyperedges import Hyperedges

#: Mt-KaHyPar presets accepted by :func:`mtkahypar_partition`.
PRESETS = ("default", "quality", "highest_quality", "deterministic", "large_k")

_INIT: dict[int, object] = {}


def _mtkahypar(threads: int) -> tuple[Any, Any]:
    """One Mt-KaHyPar initializer per process (it may be initialized only once)."""
    import mtkahypar

    if not _INIT:
        _INIT[threads] = mtkahypar.initialize(max(1, threads), False)
    return mtkahypar, next(iter(_INIT.values()))


def mtkahypar_partition(
    edges: Hyperedges, gpus: int, slots: int, *, seed: int = 0, preset: str = "default", threads: int = 1
) -> tuple[np.ndarray, int]:
    """k-way (λ − 1) partition by Mt-KaHyPar with unit vertex weights, at most ``slots`` per block.

    Parameters
    ----------
    edges
        Weighted hyperedges of one layer (:func:`token_hyperedges`).
    gpus, slots
        k = G blocks, each with target weight ``slots`` (exact slot balance).
    seed, preset, threads
        Mt-KaHyPar's seed, preset (one of ``default``, ``quality``, ``highest_quality``,
        ``deterministic``, ``large_k``) and thread count (1 keeps it deterministic; Mt-KaHyPar
        is initialized once per process, so the first call's thread count applies).

    Returns
    -------
    home, km1
        int ``[E]`` blocks (may exceed ``slots`` when the partitioner could not balance
        exactly: repair follows) and Mt-KaHyPar's own (λ − 1) value (weighted, integer).
    """
    E = edges.experts
    if gpus == 1:
        return np.zeros(E, dtype=np.int64), 0
    mtk, init, ctx = _km1_context(gpus, slots, seed=seed, preset=preset, threads=threads)
    hg = init.create_hypergraph(
        ctx, E, len(edges.pins), edges.pins, [1] * E, np.rint(edges.weight).astype(np.int64).tolist()
    )
    part = hg.partition(ctx)
    return np.asarray(part.get_partition(), dtype=np.int64), int(part.km1())


def fixed_home_partition(
    edges: Hyperedges, experts: int, gpus: int, slots: int, *, seed: int = 0, preset: str = "default"
) -> np.ndarray:
    """Mt-KaHyPar on experts plus G home vertices fixed to their GPUs (km1 = remote GPUs).

    Vertices ``0..E-1`` are the experts, ``E + g`` the home of GPU g (fixed to block g), so
    a token's hyperedge ``topk ∪ {home}`` counts the GPUs other than its own.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` blocks of the experts (repair follows, as for :func:`mtkahypar_partition`).
    """
    mtk, init, ctx = _km1_context(gpus, slots + 1, seed=seed, preset=preset, threads=1)  # + the fixed home
    n = experts + gpus
    hg = init.create_hypergraph(
        ctx, n, len(edges.pins), edges.pins, [1] * n, np.rint(edges.weight).astype(np.int64).tolist()
    )
    hg.add_fixed_vertices([-1] * experts + list(range(gpus)), gpus)
    part = np.asarray(hg.partition(ctx).get_partition(), dtype=np.int64)
    return part[:experts]


def _km1_context(gpus: int, block_weight: int, *, seed: int, preset: str, threads: int) -> tuple[Any, Any, Any]:
    """Mt-KaHyPar module, initializer and a (λ − 1) context: G blocks of ``block_weight``."""
    if preset not in PRESETS:
        raise InputError(None, "method.preset", f"expected one of {', '.join(PRESETS)}, got {preset!r}")
    mtk, init = _mtkahypar(threads)
    ctx = init.context_from_preset(getattr(mtk.PresetType, preset.upper()))
    ctx.set_partitioning_parameters(gpus, 0.0, mtk.Objective.KM1)
    ctx.set_individual_target_block_weights([int(block_weight)] * gpus)
    ctx.logging = False
    mtk.set_seed(int(seed))
    return mtk, init, ctx


def metis_partition(graph: np.ndarray, gpus: int, *, seed: int = 0, ufactor: int = 1) -> tuple[np.ndarray, int]:
    """METIS k-way partition of a weighted graph ``[E, E]`` into G parts of equal vertex count.

    Edge weights are scaled to integers in ``[1, 10^6]`` (zero-weight pairs are dropped).

    Returns
    -------
    home, edgecut
        int ``[E]`` parts (sizes may exceed ``cap`` by METIS's imbalance ``ufactor``‰: repair
        follows) and METIS's integer edge cut.
    """
    import pymetis

    E = len(graph)
    if gpus == 1:
        return np.zeros(E, dtype=np.int64), 0
    w = np.asarray(graph, dtype=np.float64)
    w = (w + w.T) / 2.0
    np.fill_diagonal(w, 0.0)
    top = w.max()
    iw = np.zeros((E, E), dtype=np.int64) if top <= 0 else np.rint(w / top * 1e6).astype(np.int64)
    iw[(w > 0) & (iw == 0)] = 1
    csr = sp.csr_matrix(iw)
    opts = pymetis.Options(seed=int(seed), ufactor=int(ufactor))
    if csr.nnz == 0:  # METIS needs edges: fall back to contiguous balanced parts
        return (np.arange(E) * gpus) // E, 0
    adjacency = pymetis.CSRAdjacency(csr.indptr.astype(np.int64), csr.indices.astype(np.int64))
    cut, parts = pymetis.part_graph(gpus, adjacency, eweights=csr.data.astype(np.int64), options=opts)
    return np.asarray(parts, dtype=np.int64), int(cut)
