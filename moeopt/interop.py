"""Plans and statistics in the formats of serving engines (SPEC sections 8 and 11).

Pure conversions, no file access (:mod:`moeopt.io` reads and writes the files):

* **SGLang** ``--init-expert-location`` JSON: ``{"physical_to_logical_map": [layers][P]}``.
* **DeepSeek EPLB** tensors: ``phy2log [L, P]``, ``log2phy [L, E, max_replicas]`` (padded
  with -1) and ``logcnt [L, E]``.
* **vLLM-Ascend** expert map JSON: ``{"moe_layer_count", "layer_list": [{"layer_id",
  "device_count", "device_list": [{"device_id", "device_expert": [...]}]}]}``.
* **SGLang expert-distribution recorder** dumps: ``per_token`` (token top-k in physical ids)
  and ``stat`` (``logical_count`` per step), read into a :class:`~moeopt.trace.Trace` or
  count-only :class:`~moeopt.trace.Stats`.

Physical slots
--------------
A ``moeopt.plan/2`` plan *is* a physical layout: ``plan.slots[l]`` is ``[G, W]``, and
physical slot ``p`` of layer ``l`` is ``plan.slots[l].reshape(-1)[p]``, on GPU ``p // W``,
which is the SGLang / EPLB rule ``p // (P / G)``. Engine maps therefore read into a plan
and back with nothing lost, colocated copies (two copies of one expert on one GPU, which
EPLB emits) included: ``Plan(slots=phy2log.reshape(L, G, P // G))``.

Empty slots
-----------
SGLang and EPLB need every physical slot to hold an expert, so a plan's empty slots (-1) are
filled on export (:func:`fill_empty_slots`). An empty slot on GPU ``g`` is filled with a
copy of an expert *whose every copy is already on* ``g`` (its first such expert, in slot
order): all of that expert's tokens already went to ``g`` and still do, so under ``even``,
``lp`` and ``locality`` every load and every communication figure is unchanged. Under
``static`` the expert's own tokens stay on ``g`` too, but SGLang draws its fixed per-rank
choices for all multi-copy experts from one seeded stream (layers, then experts, in order),
and the filler's extra copy adds a draw to it: the choices of later experts are re-drawn by
the same fair rule (same distribution, another realization). Only when ``g`` holds no
such expert (every expert on ``g`` also has a copy elsewhere, or ``g`` is empty) is a slot
filled with an extra copy that shifts load: the copy that moves the least load onto ``g``
under an even split (by ``load`` when given, otherwise the expert with the most copies),
one slot at a time; :func:`fill_empty_slots` returns a note for it. A filled slot is a
real copy in the engine, so reading the file back gives the filled plan (the same plan when
no slot was empty).

vLLM-Ascend numbers the physical slots of every device by the count of *distinct* experts on
device 0, so a device listing one expert twice misroutes; the export writes each device's
distinct experts only (:func:`vllm_ascend_layout`) and refuses a plan whose devices would
then hold unequal numbers of experts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moeopt.errors import InputError, PlanError
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Stats, Trace, stats_from_counts

ENGINE_FORMATS = ("sglang", "eplb", "vllm-ascend")

#: The dispatch each engine runs a placement file with by default (recorded on import).
#: SGLang (0.5.23) resolves an unset ``--ep-dispatch-algorithm`` to ``dynamic`` (an even split
#: over an expert's physical slots: moeopt's ``even``) under its default
#: ``--moe-a2a-backend none``, and to ``static`` (moeopt's ``static``) when an all-to-all
#: backend such as DeepEP is set. EPLB's own model is ``even``. vLLM-Ascend sends rank
#: ``r``'s tokens for expert ``e`` to its copy number ``r mod c`` (copies in device order):
#: an even split when c divides G.
ENGINE_DISPATCH = {"sglang": "even", "eplb": "even", "vllm-ascend": "even"}

#: SGLang's ``--ep-dispatch-algorithm`` for each moeopt dispatch kind (none for ``locality``).
SGLANG_DISPATCH = {"even": "dynamic", "static": "static", "lp": "lp"}


# ----------------------------------------------------------------------------- helpers
def to_numpy(value: Any, source: str | None, field: str, *, integer: bool = True) -> np.ndarray:
    """A tensor, nested list or array as a numpy array; InputError when it is not rectangular.

    Parameters
    ----------
    value
        A torch tensor (converted by duck typing, torch is never imported here), a numpy
        array or nested lists.
    source, field
        Named in the error message.
    integer
        Require integer values (floats that are whole numbers are accepted).
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise InputError(source, field, "expected a rectangular array of numbers") from None
    if arr.dtype == object or arr.dtype.kind not in "iufb":
        raise InputError(source, field, f"expected a rectangular array of numbers, got {arr.dtype}")
    if integer and arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or (arr != np.round(arr)).any():
            raise InputError(source, field, "expected integer ids")
    return arr.astype(np.int64) if integer else arr.astype(np.float64)


def _dispatch(dispatch: Dispatch | str | None, fmt: str) -> Dispatch:
    if isinstance(dispatch, Dispatch):
        return dispatch
    return Dispatch(kind=dispatch or ENGINE_DISPATCH[fmt])


# ----------------------------------------------------------------------------- plan -> slots
def fill_empty_slots(plan: Plan, load: np.ndarray | None = None) -> tuple[Plan, list[str]]:
    """The plan with every empty slot (-1) filled, and notes on fills that shift load.

    Rule (module docstring): an empty slot on GPU ``g`` gets a copy of the first expert in
    ``g``'s slots whose every copy is on ``g`` (``even``, ``lp`` and ``locality`` scores stay
    equal; ``static`` re-draws SGLang's seeded choices of later experts).
    If there is none, it gets the copy that moves the least load onto ``g`` under an even
    split, ``load[e] * (c_e - k_e) / (c_e (c_e + 1))`` with ``c_e`` copies of which ``k_e``
    on ``g`` (``load`` float ``[L, E]``; without it, the expert with the most copies, then
    the lowest id), and the returned notes say so.

    Returns
    -------
    tuple of (Plan, list of str)
        The filled plan (same dispatch) and zero or more one-line notes.

    Raises
    ------
    PlanError
        On a ``load`` of the wrong shape.
    """
    slots = plan.slots.copy()
    empty = slots < 0
    if not empty.any():
        return plan, []
    L, G, W = slots.shape
    E = plan.experts
    if load is not None:
        load = np.asarray(load, dtype=np.float64)
        if load.shape != (L, E):
            raise PlanError(f"load: expected shape [{L}, {E}], got {list(load.shape)}")
    copies = plan.copies_on_gpu.copy()  # [L, E, G], updated as slots are filled
    shifted: list[tuple[int, int, int]] = []  # (layer, gpu, expert) of load-shifting fills
    for l, g in zip(*np.nonzero(empty.any(axis=2)), strict=True):
        holes = np.flatnonzero(slots[l, g] < 0)
        total = copies[l].sum(axis=1)  # copies of each expert
        here = [int(e) for e in slots[l, g] if e >= 0]
        neutral = [e for e in here if copies[l, e, g] == total[e]]
        if neutral:
            slots[l, g, holes] = neutral[0]
            copies[l, neutral[0], g] += len(holes)
            continue
        for w in holes:
            total = copies[l].sum(axis=1)
            c = total.astype(np.float64)
            k = copies[l, :, g].astype(np.float64)
            weight = load[l] if load is not None else np.ones(E)
            cost = weight * (c - k) / (c * (c + 1))
            # ties: most copies, then lowest id
            e = int(np.lexsort((np.arange(E), -total, cost))[0])
            slots[l, g, w] = e
            copies[l, e, g] += 1
            shifted.append((int(l), int(g), e))
    notes = []
    if shifted:
        l, g, e = shifted[0]
        layers = len({s[0] for s in shifted})
        notes.append(
            f"note: {len(shifted)} empty slot(s) in {layers} layer(s) could not be filled without changing the "
            f"dispatch (their GPU holds no expert whose every copy is on it; first: layer {l} GPU {g}, filled "
            f"with expert {e}); import the file back and evaluate it to see the effect"
        )
    return Plan(slots=slots, experts=E, dispatch=plan.dispatch), notes


def engine_slots(plan: Plan, load: np.ndarray | None = None) -> np.ndarray:
    """int64 ``[L, P]``: the physical-to-logical map of a plan, empty slots filled.

    Slot ``p`` lies on GPU ``p // W``; fill rule of :func:`fill_empty_slots`.
    """
    filled, _ = fill_empty_slots(plan, load)
    return np.array(filled.slots.reshape(plan.layers, -1))


# ----------------------------------------------------------------------------- slots -> plan
def plan_from_physical(
    phy2log: Any,
    gpus: int,
    *,
    experts: int | None = None,
    dispatch: Dispatch | None = None,
    source: str | None = None,
    field: str = "physical_to_logical_map",
) -> Plan:
    """A plan from a physical-to-logical map ``[L, P]``: slot ``p`` on GPU ``p // (P / G)``.

    Nothing is merged or reordered: ``plan.slots[l].reshape(-1)`` is ``phy2log[l]``.

    Parameters
    ----------
    phy2log
        int ``[L, P]`` logical expert of every physical slot.
    gpus
        G; must divide P.
    experts
        E; by default one more than the largest id.
    dispatch
        The plan's dispatch (default ``even``).
    source, field
        Named in error messages.

    Raises
    ------
    InputError
        On a wrong shape, ids out of range, G not dividing P, or an expert without a slot.
    """
    table = to_numpy(phy2log, source, field)
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise InputError(source, field, f"expected [layers, physical slots], got shape {list(table.shape)}")
    L, P = table.shape
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1 or P % gpus:
        raise InputError(source, "gpus", f"{P} physical slots per layer do not split evenly over {gpus} GPUs")
    if table.min() < 0:
        raise InputError(source, field, f"logical id {int(table.min())} is negative")
    E = int(table.max()) + 1 if experts is None else int(experts)
    if table.max() >= E:
        raise InputError(source, field, f"logical id {int(table.max())} out of range [0, {E - 1}] (E = {E})")
    if E > P:  # checked before the [L, E] table below: a huge id must not allocate
        what = f"logical id {E - 1}" if experts is None else f"{E} experts"
        raise InputError(
            source, field, f"{what} cannot fit: {P} physical slots per layer hold at most {P} logical experts"
        )
    present = np.zeros((L, E), dtype=bool)
    present[np.repeat(np.arange(L), P), table.ravel()] = True
    if not present.all():
        l, e = np.argwhere(~present)[0]
        raise InputError(source, f"{field}[{l}]", f"logical expert {e} has no physical slot")
    try:
        return Plan(slots=table.reshape(L, int(gpus), P // int(gpus)), experts=E, dispatch=dispatch or Dispatch())
    except PlanError as exc:  # pragma: no cover - checked above
        raise InputError(source, field, str(exc)) from None


# ----------------------------------------------------------------------------- SGLang
def to_sglang(plan: Plan, *, dense_layers: int = 0, load: np.ndarray | None = None) -> dict[str, list]:
    """SGLang ``--init-expert-location`` JSON content: ``{"physical_to_logical_map": ...}``.

    SGLang's ``physical_to_logical_map`` has one row per *hidden* layer, dense ones included
    (DeepSeek-V3: 61 rows, the first 3 dense); ``dense_layers`` rows of the trivial layout
    ``p % E`` (SGLang ignores them) are put before the plan's MoE layers. Start SGLang with
    ``--ep-size G`` and ``--ep-num-redundant-experts`` equal to ``P - E``.

    Returns
    -------
    dict
        Only the key ``physical_to_logical_map``: SGLang passes the object's keys as keyword
        arguments, so no other key may be added.
    """
    if dense_layers < 0:
        raise PlanError(f"dense_layers must be >= 0, got {dense_layers}")
    table = engine_slots(plan, load)
    if dense_layers:
        trivial = np.arange(table.shape[1]) % plan.experts
        table = np.concatenate([np.tile(trivial, (dense_layers, 1)), table])
    return {"physical_to_logical_map": table.tolist()}


def from_sglang(
    data: Any,
    gpus: int,
    *,
    experts: int | None = None,
    dense_layers: int = 0,
    dispatch: Dispatch | str | None = None,
    source: str | None = None,
) -> Plan:
    """A plan from SGLang ``--init-expert-location`` content.

    Parameters
    ----------
    data
        The loaded JSON (or ``.pt``) object with ``physical_to_logical_map``
        ``[hidden layers, P]``.
    gpus
        G (SGLang's expert-parallel size; the file does not record it).
    experts, source
        As in :func:`plan_from_physical`.
    dense_layers
        Leading rows (dense hidden layers) to drop.
    dispatch
        The plan's dispatch; default ``even``, SGLang's ``dynamic`` (:data:`ENGINE_DISPATCH`);
        ``static`` for a deployment with an all-to-all backend (DeepEP).

    Raises
    ------
    InputError
        On a missing key, a bad shape or ids, or ``dense_layers`` out of range.
    """
    if not isinstance(data, Mapping) or "physical_to_logical_map" not in data:
        raise InputError(source, None, "expected an object with 'physical_to_logical_map' [layers][physical slots]")
    table = to_numpy(data["physical_to_logical_map"], source, "physical_to_logical_map")
    if table.ndim != 2:
        raise InputError(
            source, "physical_to_logical_map", f"expected [layers, physical slots], got shape {list(table.shape)}"
        )
    if not 0 <= dense_layers < table.shape[0]:
        raise InputError(source, "dense_layers", f"{dense_layers} dense layers, the map has {table.shape[0]} rows")
    return plan_from_physical(
        table[dense_layers:], gpus, experts=experts, dispatch=_dispatch(dispatch, "sglang"), source=source
    )


# ----------------------------------------------------------------------------- DeepSeek EPLB
def to_eplb(plan: Plan, *, load: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The DeepSeek EPLB tensors of a plan, as int64 arrays.

    Returns
    -------
    dict
        ``phy2log [L, P]`` logical expert of each physical slot (GPU ``p // (P / G)``, empty
        slots filled by :func:`fill_empty_slots`); ``log2phy [L, E, max copies]`` the
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


# ----------------------------------------------------------------------------- vLLM-Ascend
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
    """The vLLM-Ascend expert map JSON content of a plan (layout of :func:`vllm_ascend_layout`).

    Returns
    -------
    dict
        ``{"moe_layer_count", "layer_list": [{"layer_id", "device_count", "device_list":
        [{"device_id", "device_expert"}]}]}``; ``layer_id`` counts MoE layers from 0 (vLLM
        numbers only MoE layers; the engine reads ``layer_list`` by position) and every
        device lists the same number ``D`` of distinct experts. The engine's
        ``num_redundant_experts`` is ``G * D - E`` (:func:`vllm_ascend_redundant`).
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
        As in :func:`plan_from_physical`.
    dispatch
        The plan's dispatch; default ``even`` (:data:`ENGINE_DISPATCH`).

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


# ----------------------------------------------------------------------------- engine settings
def engine_settings(fmt: str, plan: Plan, path: str, *, dense_layers: int = 0) -> list[str]:
    """How to start the engine with an exported file: one line per setting.

    ``plan`` is the plan as exported (after :func:`fill_empty_slots`); its dispatch picks
    SGLang's ``--ep-dispatch-algorithm``.
    """
    E, G = plan.experts, plan.gpus
    if fmt == "sglang":
        P = plan.gpus * plan.width
        algo = SGLANG_DISPATCH.get(plan.dispatch.kind)
        flags = f"--ep-size {G} --init-expert-location {path} --ep-num-redundant-experts {P - E}"
        lines = [f"sglang: {flags}" + (f" --ep-dispatch-algorithm {algo}" if algo else "")]
        if algo == "static" or algo == "lp":
            lines.append(
                f"sglang: --ep-dispatch-algorithm {algo} needs an all-to-all backend (e.g. --moe-a2a-backend deepep)"
            )
        if algo is None:
            lines.append(
                f"sglang: dispatch {plan.dispatch.kind!r} has no SGLang equivalent; use --dispatch even, static or lp"
            )
        if dense_layers:
            lines.append(f"sglang: the map has {dense_layers} leading dense-layer rows")
        return lines
    if fmt == "vllm-ascend":
        table, _ = vllm_ascend_layout(plan)
        R = G * table.shape[2] - E
        cfg = json.dumps({"eplb_config": {"expert_map_path": path, "num_redundant_experts": R}})
        return [f"vllm-ascend: --enable-expert-parallel --additional-config '{cfg}'"]
    P = plan.gpus * plan.width
    return [f"eplb: {plan.layers} layers x {P} physical slots ({G} GPUs x {plan.width}), {P - E} redundant"]


# ----------------------------------------------------------------------------- recorder dumps
def sglang_dump_kind(obj: Any) -> str:
    """``"per_token"`` or ``"stat"``: which SGLang recorder mode wrote ``obj``."""
    if isinstance(obj, Mapping) and "records" in obj:
        return "per_token"
    if isinstance(obj, Mapping) and "logical_count" in obj:
        return "stat"
    if isinstance(obj, Sequence) and obj and all(isinstance(x, Mapping) and "logical_count" in x for x in obj):
        return "stat"
    raise InputError(
        None,
        None,
        "expected an SGLang expert-distribution dump: a dict with 'records' (per_token mode) "
        "or 'logical_count' (stat mode)",
    )


def trace_from_sglang_per_token(obj: Any, *, source: str | None = None) -> Trace:
    """A token trace from an SGLang ``per_token`` recorder dump.

    Each record's ``topk_ids_of_layer`` ``[hidden layers, tokens, 8]`` holds *physical* ids:
    the recorder keeps 8 columns (DeepSeek-V3's top-k) and resets them to -1 before every
    forward pass, so a top-k model fills the first k and leaves the rest -1; padded tokens
    and dense layers are all -1. The ids are mapped to logical experts with
    ``last_physical_to_logical_map`` ``[hidden layers, P]`` (a map that changed during
    recording cannot be recovered). Layers never routed (dense ones, which SGLang counts as
    layers) are dropped, as are tokens with no id at some MoE layer (padding); k is the
    number of valid ids per token, and must be the same for every token and MoE layer. A
    record's ``forward_pass_id`` (else its position) is the token's step. Families are
    unknown: every token is family ``all``.

    Raises
    ------
    InputError
        On a missing key, a shape mismatch, a physical id outside the map, or tokens with
        different numbers of valid ids.
    """
    if not isinstance(obj, Mapping):
        raise InputError(source, None, f"expected a dict, got {type(obj).__name__}")
    records = obj.get("records")
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)) or not records:
        raise InputError(source, "records", "expected a non-empty list of records")
    if "last_physical_to_logical_map" not in obj:
        raise InputError(source, "last_physical_to_logical_map", "required field is missing")
    p2l = to_numpy(obj["last_physical_to_logical_map"], source, "last_physical_to_logical_map")
    if p2l.ndim != 2 or p2l.size == 0 or p2l.min() < 0:
        raise InputError(
            source,
            "last_physical_to_logical_map",
            f"expected non-negative ids [layers, physical slots], got shape {list(p2l.shape)}",
        )
    layers_all, P = p2l.shape
    chunks, steps = [], []
    width = None
    for i, rec in enumerate(records):
        where = f"records[{i}]"
        if not isinstance(rec, Mapping) or "topk_ids_of_layer" not in rec:
            raise InputError(source, where, "expected a record with 'topk_ids_of_layer'")
        ids = to_numpy(rec["topk_ids_of_layer"], source, f"{where}.topk_ids_of_layer")
        if ids.ndim != 3 or ids.shape[0] != layers_all:
            raise InputError(
                source,
                f"{where}.topk_ids_of_layer",
                f"expected [{layers_all} layers, tokens, k], got shape {list(ids.shape)}",
            )
        if width is not None and ids.shape[2] != width:
            raise InputError(
                source, f"{where}.topk_ids_of_layer", f"has {ids.shape[2]} columns, earlier records {width}"
            )
        width = ids.shape[2]
        if ids.size and (ids.min() < -1 or ids.max() >= P):
            raise InputError(source, f"{where}.topk_ids_of_layer", f"physical ids must lie in [0, {P - 1}] (or -1)")
        step = rec.get("forward_pass_id", i)
        try:
            step = int(to_numpy(step, source, f"{where}.forward_pass_id").reshape(()))
        except ValueError:
            raise InputError(source, f"{where}.forward_pass_id", "expected one integer") from None
        chunks.append(np.transpose(ids, (1, 0, 2)))  # [tokens, layers, columns]
        steps.append(np.full(ids.shape[1], step, dtype=np.int64))
    topk = np.concatenate(chunks)
    step = np.concatenate(steps)
    valid = topk >= 0
    moe = valid.any(axis=(0, 2)) if len(topk) else np.zeros(layers_all, dtype=bool)
    if not moe.any():
        raise InputError(source, "records", "no token was routed to an expert")
    topk, valid = topk[:, moe], valid[:, moe]
    count = valid.sum(axis=2)  # [tokens, MoE layers]: valid ids
    keep = (count > 0).all(axis=1)  # padding tokens have no id at some MoE layer
    if not keep.any():
        raise InputError(source, "records", "every token has no expert id at some MoE layer (all padding)")
    topk, valid, count, step = topk[keep], valid[keep], count[keep], step[keep]
    k = int(count.max())
    if (count != k).any():
        t, l = np.argwhere(count != k)[0]
        raise InputError(
            source,
            "records.topk_ids_of_layer",
            f"token {t} has {count[t, l]} expert ids at MoE layer {l}, others {k}: expected the same top-k "
            f"for every token",
        )
    if valid[:, :, k:].any():  # the recorder writes the first k columns; anything else is not its layout
        raise InputError(source, "records.topk_ids_of_layer", f"valid ids after the first {k} columns")
    topk = topk[:, :, :k]
    p2l = p2l[moe]
    logical = p2l[np.arange(len(p2l))[None, :, None], topk]
    E = int(p2l.max()) + 1
    _, step = np.unique(step, return_inverse=True)
    n = len(logical)
    return Trace(
        topk=logical.astype(np.int16 if E < 2**15 else np.int32),
        family=np.zeros(n, dtype=np.int32),
        step=step.astype(np.int32).reshape(n),
        family_names=("all",),
        num_experts=E,
    )


def stats_from_sglang_stat(obj: Any, *, top_k: int | None, source: str | None = None) -> Stats:
    """Count-only statistics from an SGLang ``stat`` recorder dump.

    ``logical_count`` is ``[steps, hidden layers, E]`` (or ``[hidden layers, E]``, without
    per-step counts; a list of such dicts is stacked as steps). All-zero layers (dense ones: SGLang
    counts every hidden layer, vLLM only MoE layers) are dropped. The counts keep their
    per-step split as ``step_counts`` ``n[l, t, e]``.

    Raises
    ------
    InputError
        On a bad shape, negative counts, or no ``top_k`` (a stat dump does not record it).
    """
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        try:
            arr = np.stack([to_numpy(x["logical_count"], source, "logical_count", integer=False) for x in obj])
        except (TypeError, KeyError, ValueError):
            raise InputError(
                source, "logical_count", "expected a list of dumps with equal-shape 'logical_count'"
            ) from None
    elif isinstance(obj, Mapping) and "logical_count" in obj:
        arr = to_numpy(obj["logical_count"], source, "logical_count", integer=False)
    else:
        raise InputError(source, "logical_count", "required field is missing")
    stepped = arr.ndim == 3
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] == 0 or arr.shape[2] == 0:
        raise InputError(source, "logical_count", f"expected [steps, layers, experts], got shape {list(arr.shape)}")
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise InputError(source, "logical_count", "contains negative, NaN or infinite counts")
    if top_k is None or top_k < 1:
        raise InputError(source, "top_k", "stat dumps do not record top-k; give the model's top_k (--top-k)")
    keep = arr.sum(axis=(0, 2)) > 0
    if not keep.any():
        raise InputError(source, "logical_count", "every layer is all zero")
    arr = arr[:, keep]
    steps = np.transpose(arr, (1, 0, 2)) if stepped else None
    return stats_from_counts(arr.sum(axis=0), top_k=top_k, step_counts=steps)


def read_sglang_dump(obj: Any, *, top_k: int | None = None, source: str | None = None) -> Trace | Stats:
    """A trace or statistics from a loaded SGLang recorder dump.

    Parameters
    ----------
    obj
        What ``torch.load`` returned.
    top_k
        k; required for ``stat`` dumps (``per_token`` dumps carry it).
    source
        File name for error messages.

    Returns
    -------
    Trace or Stats
        :func:`trace_from_sglang_per_token` or :func:`stats_from_sglang_stat` of ``obj``.
    """
    try:
        kind = sglang_dump_kind(obj)
    except InputError as exc:
        raise InputError(source, None, exc.message) from None
    if kind == "per_token":
        return trace_from_sglang_per_token(obj, source=source)
    return stats_from_sglang_stat(obj, top_k=top_k, source=source)
