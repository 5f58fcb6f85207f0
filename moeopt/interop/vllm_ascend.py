"""vLLM-Ascend expert maps (each device's distinct experts only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moeopt.errors import InputError, PlanError
from moeopt.interop.slots import (
    _dispatch,
    plan_from_physical,
    to_numpy,
)
from moeopt.plan import Dispatch, Plan


def vllm_ascend_layout(plan: Plan) -> tuple[np.ndarray, list[str]]:
    """int ``[L, G, D]``: each device's distinct experts (slot order), and notes.

    vLLM-Ascend (``vllm_ascend/eplb/core/eplb_utils.py``) numbers the physical slots of rank
    ``r`` as ``r * D0 + i`` with ``D0`` the number of *distinct* experts of device 0, and
    stacks the device lists into one tensor, so every device must list the same number of
    distinct experts and none twice. Empty slots are skipped and a colocated copy is written
    once (it adds nothing at device level; under an even split it gave its GPU a double
    share, which the engine then does not); notes say so.

    Raises
    ------
    PlanError
        If devices (or layers) would hold unequal numbers of distinct experts.
    """
    L, G, W = plan.slots.shape
    distinct = (plan.copies_on_gpu > 0).sum(axis=1)  # [L, G]
    D = int(distinct[0, 0])
    if (distinct != D).any():
        l, g = np.argwhere(distinct != D)[0]
        raise PlanError(
            f"vllm-ascend: layer {l} GPU {g} holds {distinct[l, g]} distinct experts, layer 0 GPU 0 holds {D}; "
            f"vLLM-Ascend needs the same number of distinct experts on every device of every layer (it numbers "
            f"physical slots by device 0's count)"
        )
    out = np.empty((L, G, D), dtype=np.int64)
    for l in range(L):
        for g in range(G):
            row = plan.slots[l, g]
            row = row[row >= 0]
            _, first = np.unique(row, return_index=True)
            out[l, g] = row[np.sort(first)]
    notes = []
    if plan.colocated:
        notes.append(
            f"note: {plan.colocated} colocated copies written once (vLLM-Ascend cannot hold two copies of one "
            f"expert on a device); the engine splits those experts over devices, not slots"
        )
    return out, notes


def to_vllm_ascend(plan: Plan) -> dict[str, Any]:
    """The vLLM-Ascend expert map JSON content of a plan (layout of
    [`vllm_ascend_layout`][moeopt.interop.vllm_ascend_layout]).

    Returns
    -------
    dict
        ``{"moe_layer_count", "layer_list": [{"layer_id", "device_count", "device_list":
        [{"device_id", "device_expert"}]}]}``; ``layer_id`` counts MoE layers from 0 (vLLM
        numbers only MoE layers; the engine reads ``layer_list`` by position) and every
        device lists the same number ``D`` of distinct experts. The engine's
        ``num_redundant_experts`` is ``G * D - E`` ([`vllm_ascend_redundant`][moeopt.interop.vllm_ascend_redundant]).
    """
    table, _ = vllm_ascend_layout(plan)
    return {
        "moe_layer_count": plan.layers,
        "layer_list": [
            {
                "layer_id": l,
                "device_count": plan.gpus,
                "device_list": [{"device_id": g, "device_expert": table[l, g].tolist()} for g in range(plan.gpus)],
            }
            for l in range(plan.layers)
        ],
    }


def vllm_ascend_redundant(data: Mapping[str, Any], experts: int) -> int:
    """``num_redundant_experts`` of an expert map: its physical slots per layer minus E."""
    first = data["layer_list"][0]["device_list"]
    return sum(len(d["device_expert"]) for d in first) - experts


def from_vllm_ascend(
    data: Any,
    *,
    experts: int | None = None,
    dispatch: Dispatch | str | None = None,
    source: str | None = None,
) -> Plan:
    """A plan from a vLLM-Ascend expert map, read as the engine reads it.

    Layers are taken in ``layer_list`` order and devices in ``device_list`` order (the
    engine indexes both by position); ``layer_id`` and ``device_id``, when present, must
    equal the position. Every device must list the same number of experts, none twice (the
    engine misroutes a device listing an expert twice).

    Parameters
    ----------
    data
        The loaded JSON object.
    experts, source
        As in [`plan_from_physical`][moeopt.interop.plan_from_physical].
    dispatch
        The plan's dispatch; default ``even`` (`ENGINE_DISPATCH`).

    Raises
    ------
    InputError
        On a missing or inconsistent field.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("layer_list"), list):
        raise InputError(source, "layer_list", "expected an object with 'moe_layer_count' and a 'layer_list' list")
    layers = data["layer_list"]
    count = data.get("moe_layer_count", len(layers))
    if isinstance(count, bool) or not isinstance(count, int) or count != len(layers) or not layers:
        raise InputError(source, "moe_layer_count", f"is {count!r}, but layer_list has {len(layers)} layers")
    rows: list[np.ndarray] = []
    gpus = None
    for i, layer in enumerate(layers):
        where = f"layer_list[{i}]"
        if not isinstance(layer, Mapping) or not isinstance(layer.get("device_list"), list) or not layer["device_list"]:
            raise InputError(source, where, "expected an object with a non-empty 'device_list'")
        layer_id = layer.get("layer_id", i)
        if isinstance(layer_id, bool) or layer_id != i:
            raise InputError(
                source, f"{where}.layer_id", f"is {layer_id!r}; vLLM-Ascend reads layers by position ({i})"
            )
        devices = layer["device_list"]
        n = layer.get("device_count", len(devices))
        if isinstance(n, bool) or not isinstance(n, int) or n != len(devices):
            raise InputError(source, f"{where}.device_count", f"is {n!r}, but device_list has {len(devices)} devices")
        if gpus is not None and n != gpus:
            raise InputError(source, f"{where}.device_count", f"is {n}, earlier layers have {gpus}")
        gpus = n
        lists = []
        for j, dev in enumerate(devices):
            dwhere = f"{where}.device_list[{j}]"
            if not isinstance(dev, Mapping) or not isinstance(dev.get("device_expert"), list):
                raise InputError(source, dwhere, "expected an object with a 'device_expert' list")
            device_id = dev.get("device_id", j)
            if isinstance(device_id, bool) or device_id != j:
                raise InputError(
                    source, f"{dwhere}.device_id", f"is {device_id!r}; vLLM-Ascend reads devices by position ({j})"
                )
            ids = to_numpy(dev["device_expert"], source, f"{dwhere}.device_expert").ravel()
            if len(np.unique(ids)) != len(ids):
                dup = int(next(e for e in ids if (ids == e).sum() > 1))
                raise InputError(
                    source,
                    f"{dwhere}.device_expert",
                    f"lists expert {dup} twice; vLLM-Ascend misroutes such a map (it numbers slots by device 0's "
                    f"distinct experts)",
                )
            lists.append(ids)
        if len({len(x) for x in lists}) != 1 or not len(lists[0]):
            raise InputError(source, f"{where}.device_list", "every device needs the same, non-zero number of experts")
        rows.append(np.concatenate(lists))
    if len({len(r) for r in rows}) != 1:
        raise InputError(source, "layer_list", "every layer needs the same number of slots")
    assert gpus is not None
    return plan_from_physical(
        np.stack(rows),
        gpus,
        experts=experts,
        dispatch=_dispatch(dispatch, "vllm-ascend"),
        source=source,
        field="layer_list",
    )
