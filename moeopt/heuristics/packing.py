"""Packing experts onto GPUs by load: the one home of longest-processing-time (LPT) packing.

* :func:`balanced_homes`: LPT, heaviest expert first onto the least-loaded (or, with speeds,
  earliest-finishing) GPU with a free slot (the greedy baseline's, GEM's and load repair's start);
* :func:`round_robin_lpt`: LPT in rounds of G (every GPU gets one expert per round), the
  start of the engine's balanced start (:func:`moeopt.heuristics.local_search.balanced_start`);
* :func:`first_fit`: capacity-aware first fit that keeps each expert in a preferred GPU
  when that GPU has a slot and room under a load limit (the ``repair=false`` ablation of TACG).

Every function returns homes ``[E]`` with at most ``slots`` experts per GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def balanced_homes(load: np.ndarray, gpus: int, slots: int, speed: np.ndarray | None = None) -> np.ndarray:
    """Longest-processing-time packing: heaviest expert first onto the least-loaded GPU.

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    gpus, slots
        G and slots per GPU (``gpus * slots >= E``).
    speed
        Optional float ``[G]`` GPU speeds: the GPU chosen is the one finishing earliest,
        ``(load_g + w) / speed_g``.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes; ties go to the lowest GPU id.
    """
    speed = np.ones(gpus) if speed is None else np.asarray(speed, dtype=np.float64)

    def earliest_finish(e: int, w: float, loads: np.ndarray, free: np.ndarray) -> int:
        return int(np.argmin(np.where(free, (loads + w) / speed, np.inf)))

    return _heaviest_first(load, gpus, slots, earliest_finish)


def _heaviest_first(
    load: np.ndarray, gpus: int, slots: int, choose: Callable[[int, float, np.ndarray, np.ndarray], int]
) -> np.ndarray:
    """Greedy packing: experts by decreasing load (stable), each onto ``choose(e, w_e, loads,
    free)``, a GPU among those with a free slot (``free`` bool ``[G]``, ``loads`` so far)."""
    load = np.asarray(load, dtype=np.float64)
    home = np.empty(len(load), dtype=np.int64)
    loads = np.zeros(gpus)
    sizes = np.zeros(gpus, dtype=np.int64)
    for e in np.argsort(-load, kind="stable"):
        g = choose(int(e), float(load[e]), loads, sizes < slots)
        home[e] = g
        loads[g] += load[e]
        sizes[g] += 1
    return home


def round_robin_lpt(load: np.ndarray, gpus: int, slots: int) -> np.ndarray:
    """LPT in rounds of G: heaviest expert first, every GPU gets one expert per round.

    Within a round the heaviest expert goes to the least-loaded GPU with a free slot, so heavy
    experts are paired with light ones, which plain LPT under slot limits misses (the start of
    :func:`moeopt.heuristics.local_search.balanced_start`).

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    gpus, slots
        G and slots per GPU (``gpus * slots >= E``).

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes within the slot capacities.
    """
    load = np.asarray(load, dtype=np.float64)
    home = np.empty(len(load), dtype=np.int64)
    gl = np.zeros(gpus)
    count = np.zeros(gpus, dtype=np.int64)
    order = np.argsort(-load, kind="stable")
    for start in range(0, len(load), gpus):
        chunk = order[start : start + gpus]
        open_ = np.nonzero(count < slots)[0]
        dest = open_[np.argsort(gl[open_], kind="stable")][: len(chunk)]
        home[chunk] = dest
        np.add.at(gl, dest, load[chunk])
        np.add.at(count, dest, 1)
    return home


def first_fit(load: np.ndarray, preferred: np.ndarray, gpus: int, slots: int, limit: float = np.inf) -> np.ndarray:
    """Capacity-aware first fit: heaviest expert first into its preferred GPU when that GPU has
    a slot and room under ``limit``, else into the least-loaded GPU with a slot and room (or,
    when none has room, the least-loaded GPU with a slot).

    Parameters
    ----------
    load
        float ``[E]`` expert loads.
    preferred
        int ``[E]`` each expert's preferred GPU (e.g. its spectral cluster).
    gpus, slots
        G and slots per GPU.
    limit
        Largest load a GPU should carry (tolerance included); the result may exceed it when
        no GPU with a slot has room (a load repair follows).

    Returns
    -------
    numpy.ndarray
        int ``[E]`` homes within the slot capacities.
    """

    def preferred_or_least_loaded(e: int, w: float, loads: np.ndarray, free: np.ndarray) -> int:
        g = int(preferred[e])
        if free[g] and loads[g] + w <= limit:
            return g
        fits = free & (loads + w <= limit)
        pool = fits if fits.any() else free
        return int(np.flatnonzero(pool)[np.argmin(loads[pool])])

    return _heaviest_first(load, gpus, slots, preferred_or_least_loaded)
