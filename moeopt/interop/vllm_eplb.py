"""vLLM's EPLB state: the expert loads vLLM records for its own rebalancing, read as statistics.

vLLM (``--enable-eplb``) keeps, per MoE model, an ``EplbModelState`` whose tensors a user can
save with ``torch.save`` (or ``np.savez``) from a worker:

* ``physical_to_logical_map`` int ``[MoE layers, P]``: the logical expert of every physical
  slot (-1: an unused slot of an elastic deployment);
* ``expert_load_window`` int ``[window, MoE layers, P]``: tokens each physical slot served in
  each of the last ``window`` recorded forward passes (a ring buffer; passes not yet recorded
  are all zero), or ``expert_load_pass`` ``[MoE layers, P]``: the current pass only;
* ``last_expert_load`` ``[MoE layers, E]``: the logical totals of the last rearrangement
  (already summed over ranks and passes).

The loads of a window are per rank (the tokens this rank dispatched; vLLM sums them over
ranks when it rearranges), so one rank's file is a sample of the traffic: save every rank's,
or sum them, for all of it. Physical loads are credited to the logical expert the map names,
as vLLM does; save the map and the loads together (the map changes at every rearrangement).
vLLM counts MoE layers only (no dense rows to drop, unlike SGLang), and records no top-k.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moeopt.errors import InputError
from moeopt.interop.slots import check_top_k, to_numpy
from moeopt.trace import Stats, stats_from_counts

#: the load tensors of vLLM's EPLB state, in the order they are preferred
LOAD_KEYS = ("expert_load_window", "expert_load_pass", "last_expert_load")


def is_vllm_eplb_state(obj: Any) -> bool:
    """Whether ``obj`` (a loaded ``.pt`` or ``.npz``) holds vLLM EPLB loads."""
    return isinstance(obj, Mapping) and any(k in obj for k in LOAD_KEYS)


def _loads(obj: Mapping[str, Any], key: str, source: str | None) -> np.ndarray:
    arr = to_numpy(obj[key], source, key, integer=False)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise InputError(source, key, "contains negative, NaN or infinite loads")
    return arr


def stats_from_vllm_eplb(obj: Mapping[str, Any], *, top_k: int | None, source: str | None = None) -> Stats:
    """Count-only statistics from vLLM EPLB state tensors (see the module notes).

    ``expert_load_window`` gives per-step counts (``step_counts``: the recorded passes, oldest
    first when ``expert_load_window_step`` is saved too, all-zero passes dropped);
    ``expert_load_pass`` one step; ``last_expert_load`` the logical totals without steps (no map
    needed).

    Raises
    ------
    InputError
        On a missing map, shapes that disagree, ids out of range, negative loads, no recorded
        load, or no ``top_k`` (vLLM does not record it).
    """
    if not is_vllm_eplb_state(obj):
        raise InputError(source, None, f"expected vLLM EPLB state with one of {', '.join(LOAD_KEYS)}")
    check_top_k(top_k, None, source, "vLLM's EPLB state tensors")  # missing: said before any shape
    key = next(k for k in LOAD_KEYS if k in obj)
    arr = _loads(obj, key, source)
    if key == "last_expert_load":
        if arr.ndim != 2 or 0 in arr.shape:
            raise InputError(source, key, f"expected [MoE layers, experts], got shape {list(arr.shape)}")
        top_k = check_top_k(top_k, arr.shape[1], source, "vLLM's EPLB state tensors")
        if not arr.sum() > 0:
            raise InputError(source, key, "every load is zero: no traffic was recorded")
        return stats_from_counts(arr, top_k=top_k)
    if key == "expert_load_pass":
        arr = arr[None]
    if arr.ndim != 3 or 0 in arr.shape:
        raise InputError(source, key, f"expected [window, MoE layers, physical slots], got shape {list(arr.shape)}")
    if "physical_to_logical_map" not in obj:
        raise InputError(source, "physical_to_logical_map", f"required with {key} (its loads are per physical slot)")
    phys = to_numpy(obj["physical_to_logical_map"], source, "physical_to_logical_map")
    T, L, P = arr.shape
    if phys.shape != (L, P):
        raise InputError(
            source,
            "physical_to_logical_map",
            f"expected [MoE layers, physical slots] = [{L}, {P}] like {key}, got shape {list(phys.shape)}",
        )
    if (phys < -1).any():
        raise InputError(source, "physical_to_logical_map", "expected logical ids >= 0 (-1: an unused slot)")
    if phys.max() >= P:  # every logical expert has a physical slot: fewer experts than slots
        raise InputError(
            source, "physical_to_logical_map", f"expected logical ids below the {P} physical slots, found {phys.max()}"
        )
    used = phys >= 0
    if not used.any():
        raise InputError(source, "physical_to_logical_map", "maps no slot to an expert")
    if (arr[:, ~used] > 0).any():
        raise InputError(source, key, "an unused physical slot (-1 in physical_to_logical_map) has load")
    E = int(phys.max()) + 1
    if "logical_replica_count" in obj:
        E = max(E, to_numpy(obj["logical_replica_count"], source, "logical_replica_count").shape[-1])
    # credit every slot's load to its logical expert: one bincount over flat (step, layer, expert)
    idx = np.where(used, np.arange(L)[:, None] * E + phys, L * E)  # unused slots to a spill bin
    flat = (np.arange(T)[:, None] * (L * E + 1) + idx.ravel()[None, :]).ravel()
    binned = np.bincount(flat, weights=arr.ravel(), minlength=T * (L * E + 1)).reshape(T, L * E + 1)
    steps = binned[:, :-1].reshape(T, L, E)
    recorded = steps.sum(axis=(1, 2)) > 0
    if not recorded.any():
        raise InputError(source, key, "every load is zero: no forward pass was recorded")
    if "expert_load_window_step" in obj and key == "expert_load_window":  # the next ring slot: oldest first
        start = int(to_numpy(obj["expert_load_window_step"], source, "expert_load_window_step").reshape(-1)[0])
        steps, recorded = np.roll(steps, -start, axis=0), np.roll(recorded, -start)
    steps = steps[recorded]
    top_k = check_top_k(top_k, E, source, "vLLM's EPLB state tensors")
    return stats_from_counts(steps.sum(axis=0), top_k=top_k, step_counts=np.transpose(steps, (1, 0, 2)))
