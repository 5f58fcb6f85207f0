"""Graph and hypergraph partitioner wrappers: Mt-KaHyPar ((λ − 1) on token hyperedges) and
METIS (edge cut on the coactivation graph).

Each returns a start ``home [E]`` whose block sizes may exceed the slots per GPU by the
partitioner's imbalance; `moeopt.heuristics.local_search.local_search` repairs it.
Both libraries are optional: they are imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import scipy.sparse as sp

from moeopt import interrupt
from moeopt.errors import InputError

if TYPE_CHECKING:
    from moeopt.heuristics.hyperedges import Hyperedges

#: Mt-KaHyPar presets accepted by `mtkahypar_partition`.
PRESETS = ("default", "quality", "highest_quality", "deterministic", "large_k")

_INIT: dict[int, object] = {}

T = TypeVar("T")


def _mtkahypar(threads: int) -> tuple[Any, Any]:
    """One Mt-KaHyPar initializer per process (it may be initialized only once)."""
    import mtkahypar

    if not _INIT:
        _INIT[threads] = mtkahypar.initialize(max(1, threads), False)
    return mtkahypar, next(iter(_INIT.values()))


def initialized() -> bool:
    """Whether Mt-KaHyPar (and its thread pool) was initialized in this process: a process forked
    from this one could then not run it (`moeopt.solvers.forked`)."""
    return bool(_INIT)


def mtkahypar_partition(
    edges: Hyperedges, gpus: int, slots: int, *, seed: int = 0, preset: str = "default", threads: int = 1
) -> tuple[np.ndarray, int]:
    """k-way (λ − 1) partition by Mt-KaHyPar with unit vertex weights, at most ``slots`` per block.

    Parameters
    ----------
    edges
        Weighted hyperedges of one layer (`token_hyperedges`).
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

    Notes
    -----
    Mt-KaHyPar's call cannot be interrupted; under the command line it runs in a child process
    that Ctrl-C kills (`stoppable`).
    """
    E = edges.experts
    if gpus == 1:
        return np.zeros(E, dtype=np.int64), 0
    _check_preset(preset)
    weights = np.rint(edges.weight).astype(np.int64).tolist()
    return stoppable(_km1_partition, E, edges.pins, weights, gpus, slots, None, seed, preset, threads)


def fixed_home_partition(
    edges: Hyperedges, experts: int, gpus: int, slots: int, *, seed: int = 0, preset: str = "default"
) -> np.ndarray:
    """Mt-KaHyPar on experts plus G home vertices fixed to their GPUs (km1 = remote GPUs).

    Vertices ``0..E-1`` are the experts, ``E + g`` the home of GPU g (fixed to block g), so
    a token's hyperedge ``topk ∪ {home}`` counts the GPUs other than its own.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` blocks of the experts (repair follows, as for `mtkahypar_partition`).
    """
    _check_preset(preset)
    weights = np.rint(edges.weight).astype(np.int64).tolist()
    fixed = [-1] * experts + list(range(gpus))
    part, _ = stoppable(
        _km1_partition, experts + gpus, edges.pins, weights, gpus, slots + 1, fixed, seed, preset, 1
    )  # + the fixed home
    return part[:experts]


def stoppable(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a Mt-KaHyPar call, where Ctrl-C can stop it: in a child process that a
    signal kills under the command line (`moeopt.interrupt.run_in_child`), here otherwise
    (a library call, a pool or Ray worker, which its parent stops), and here too once this
    process has started Mt-KaHyPar's threads itself (a forked child would not have them)."""
    if interrupt.active() and not _INIT:
        return interrupt.run_in_child(fn, *args)
    return fn(*args)


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise InputError(None, "method.preset", f"expected one of {', '.join(PRESETS)}, got {preset!r}")


def _km1_partition(
    vertices: int,
    pins: Any,
    weights: list[int],
    gpus: int,
    block_weight: int,
    fixed: list[int] | None,
    seed: int,
    preset: str,
    threads: int,
) -> tuple[np.ndarray, int]:
    """Mt-KaHyPar's (λ − 1) partition of ``vertices`` unit-weight vertices into G blocks of
    ``block_weight``, with the vertices of ``fixed`` (block or -1) fixed: blocks and km1."""
    mtk, init = _mtkahypar(threads)
    ctx = init.context_from_preset(getattr(mtk.PresetType, preset.upper()))
    ctx.set_partitioning_parameters(gpus, 0.0, mtk.Objective.KM1)
    ctx.set_individual_target_block_weights([int(block_weight)] * gpus)
    ctx.logging = False
    mtk.set_seed(int(seed))
    hg = init.create_hypergraph(ctx, vertices, len(pins), pins, [1] * vertices, weights)
    if fixed is not None:
        hg.add_fixed_vertices(fixed, gpus)
    part = hg.partition(ctx)
    return np.asarray(part.get_partition(), dtype=np.int64), int(part.km1())


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
