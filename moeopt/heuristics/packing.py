"""Longest-processing-time packing of experts onto GPUs (the greedy baseline's and GEM's start)."""

from __future__ import annotations

import numpy as np


def balanced_homes(load: np.ndarray, gpus: int, slots: int, speed: np.ndarray | None = None) -> np.ndarray:
    """Longest-processing-time packing: heaviest expert first onto the least-loaded GPU.

    With ``speed`` the GPU chosen is the one finishing earliest, ``(load + w) / speed``.
    """
    speed = np.ones(gpus) if speed is None else np.asarray(speed, dtype=np.float64)
    home = np.empty(len(load), dtype=np.int64)
    acc = np.zeros(gpus)
    used = np.zeros(gpus, dtype=np.int64)
    for e in np.argsort(-load, kind="stable"):
        finish = np.where(used < slots, (acc + load[e]) / speed, np.inf)
        g = int(np.argmin(finish))
        home[e], acc[g], used[g] = g, acc[g] + load[e], used[g] + 1
    return home
