"""DeepSeek EPLB tensors: ``phy2log``, ``log2phy``, ``logcnt``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moeopt.errors import InputError
from moeopt.interop.slots import (
    _dispatch,
    engine_slots,
    plan_from_physical,
    to_numpy,
)
from moeopt.plan import Dispatch, Plan


def to_eplb(plan: Plan, *, load: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The DeepSeek EPLB tensors of a plan, as int64 arrays.

    Returns
    -------
    dict
        ``phy2log [L, P]`` logical expert of each physical slot (GPU ``p // (P / G)``, empty
        slots filled by `fill_empty_slots`); ``log2phy [L, E, max copies]`` the
        physical slots of each expert, ascending, padded with -1; ``logcnt [L, E]`` how many
        slots each expert has; and moeopt's ``num_gpus`` (0-d), so the file reads back alone.
    """
    phy2log = engine_slots(plan, load)
    L, P = phy2log.shape
    E = plan.experts
    logcnt = np.stack([np.bincount(row, minlength=E) for row in phy2log])
    log2phy = np.full((L, E, int(logcnt.max())), -1, dtype=np.int64)
    for l in range(L):
        order = np.argsort(phy2log[l], kind="stable")  # physical ids grouped by expert, ascending
        experts_sorted = phy2log[l, order]
        start = np.searchsorted(experts_sorted, np.arange(E))
        rank = np.arange(P) - start[experts_sorted]
        log2phy[l, experts_sorted, rank] = order
    return {
        "phy2log": phy2log,
        "log2phy": log2phy,
        "logcnt": logcnt.astype(np.int64),
        "num_gpus": np.array(plan.gpus, dtype=np.int64),
    }


def _scalar(arrays: Mapping[str, Any], key: str, source: str | None) -> int:
    n = to_numpy(arrays[key], source, key)
    if n.size != 1 or int(n.reshape(())) < 1:
        raise InputError(source, key, "expected one integer >= 1")
    return int(n.reshape(()))


def from_eplb(
    arrays: Mapping[str, Any],
    gpus: int | None = None,
    *,
    experts: int | None = None,
    dispatch: Dispatch | str | None = None,
    source: str | None = None,
) -> Plan:
    """A plan from DeepSeek EPLB tensors (``rebalance_experts`` output, or moeopt's export).

    Parameters
    ----------
    arrays
        ``phy2log`` (required); ``log2phy`` and ``logcnt`` are checked against it when
        present (``log2phy`` may list an expert's slots in any order, as EPLB does), and
        moeopt's optional ``num_gpus``.
    gpus
        G; defaults to the file's ``num_gpus`` (and must agree with it).
    experts
        E; defaults to the width of ``log2phy`` / ``logcnt``, else the largest id + 1.
    dispatch
        The plan's dispatch; default ``even`` (EPLB's own model).
    source
        File name for error messages.

    Raises
    ------
    InputError
        On missing or inconsistent tensors, or no GPU count.
    """
    if not isinstance(arrays, Mapping) or "phy2log" not in arrays:
        raise InputError(source, "phy2log", "required array is missing (expected phy2log, log2phy, logcnt)")
    phy2log = to_numpy(arrays["phy2log"], source, "phy2log")
    if phy2log.ndim != 2 or phy2log.size == 0:
        raise InputError(source, "phy2log", f"expected [layers, physical slots], got shape {list(phy2log.shape)}")
    L, P = phy2log.shape
    if "num_gpus" in arrays:
        n = _scalar(arrays, "num_gpus", source)
        if gpus is not None and gpus != n:
            raise InputError(source, "num_gpus", f"the file is for {n} GPUs, expected {gpus}")
        gpus = n
    if gpus is None:
        raise InputError(source, "num_gpus", "the file does not record the GPU count; give it (--gpus or --instance)")
    E = experts
    for key in ("log2phy", "logcnt"):
        if key in arrays:
            width = to_numpy(arrays[key], source, key).shape
            if len(width) >= 2:
                if E is not None and width[1] != E:
                    raise InputError(source, key, f"has {width[1]} experts, expected {E}")
                E = int(width[1])
    plan = plan_from_physical(
        phy2log, gpus, experts=E, dispatch=_dispatch(dispatch, "eplb"), source=source, field="phy2log"
    )
    E = plan.experts
    if "logcnt" in arrays:
        logcnt = to_numpy(arrays["logcnt"], source, "logcnt")
        if logcnt.shape != (L, E) or (logcnt != plan.copy_counts).any():
            raise InputError(source, "logcnt", "does not match the copies counted in phy2log")
    if "log2phy" in arrays:
        log2phy = to_numpy(arrays["log2phy"], source, "log2phy")
        if log2phy.ndim != 3 or log2phy.shape[:2] != (L, E):
            raise InputError(source, "log2phy", f"expected [{L}, {E}, max copies], got shape {list(log2phy.shape)}")
        if log2phy.min() < -1 or log2phy.max() >= P:
            raise InputError(source, "log2phy", f"physical ids must lie in [0, {P - 1}] or be -1 padding")
        for l in range(L):
            e_idx, r_idx = np.nonzero(log2phy[l] >= 0)
            slots = log2phy[l, e_idx, r_idx]
            mapped = np.full(P, -1, dtype=np.int64)
            mapped[slots] = e_idx
            if len(slots) != P or len(np.unique(slots)) != P or (mapped != phy2log[l]).any():
                raise InputError(source, f"log2phy[{l}]", "does not list exactly the physical slots of phy2log")
    return plan
