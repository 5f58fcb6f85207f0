"""Plans and statistics in the formats of serving engines (SPEC section 8).

Pure conversions, no file access (:mod:`moeopt.io` reads and writes the files):

* **SGLang** ``--init-expert-location`` JSON: ``{"physical_to_logical_map": [layers][P]}``.
* **DeepSeek EPLB** tensors: ``phy2log [L, P]``, ``log2phy [L, E, max_replicas]`` (padded
  with -1) and ``logcnt [L, E]``.
* **vLLM-Ascend** expert map JSON: ``{"moe_layer_count", "layer_list": [{"layer_id",
  "device_count", "device_list": [{"device_id", "device_expert": [...]}]}]}``.
* **SGLang expert-distribution recorder** dumps: ``per_token`` (token top-k in physical ids)
  and ``stat`` (``logical_count`` per step), read into a :class:`~moeopt.trace.Trace` or
  count-only :class:`~moeopt.trace.Stats`.

The physical layout
-------------------
All three plan formats describe *physical expert slots*: ``P = G * W`` slots per layer, slot
``p`` on GPU ``p // W``, every GPU with the same ``W = slots_per_gpu + replica_slots_per_gpu``
slots. moeopt writes each GPU's slots as a *home region* (its first ``slots_per_gpu`` slots:
its home experts in ascending id) followed by a *replica region* (its replicas in ascending
id). The engines require every slot to hold a logical expert, so unused slots are filled:

* an unused home slot holds another copy of the GPU's first home expert;
* an unused replica slot holds another copy of the GPU's first replica (else its first home);
* a GPU that holds nothing at all in a layer gets copies of the layer's hottest expert (by
  ``load`` when given, otherwise the most replicated expert: planners replicate hot
  experts), which adds one copy of that expert to the plan.

A filler never puts a new expert on a GPU (except the last case), so the set of (expert,
GPU) copies, which is what engines route by, is exactly the plan's. Reading a layout back,
an expert's home is the GPU that has it in its home region (see :func:`plan_from_physical`),
so ``plan -> export -> import`` returns the same homes and replica sets whenever every GPU
homes at least one expert in every layer (and ``slots_per_gpu`` is known on import).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moeopt.errors import InputError, PlanError
from moeopt.plan import Plan
from moeopt.trace import Stats, Trace, stats_from_counts

ENGINE_FORMATS = ("sglang", "eplb", "vllm-ascend")


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


def default_slots(plan: Plan, gpus: int) -> tuple[int, int]:
    """The fewest ``(slots_per_gpu, replica_slots_per_gpu)`` that hold ``plan``.

    ``slots_per_gpu`` is at least ``ceil(E / G)`` (the instance default), so a plan exported
    without its instance is read back with the same home region.
    """
    homes = plan.experts_per_gpu(gpus)
    reps = max(
        (int(np.bincount(r[:, 1], minlength=gpus).max()) for r in plan.replicas if len(r)),
        default=0,
    )
    return max(math.ceil(plan.experts / gpus), int(homes.max(initial=0))), reps


# ----------------------------------------------------------------------------- plan -> layout
def physical_layout(
    plan: Plan,
    gpus: int,
    *,
    slots_per_gpu: int | None = None,
    replica_slots_per_gpu: int | None = None,
    load: np.ndarray | None = None,
) -> np.ndarray:
    """The physical-to-logical map of a plan: int ``[L, G * W]``, slot ``p`` on GPU ``p // W``.

    Parameters
    ----------
    plan
        The placement; ``plan.check`` should already have passed.
    gpus
        G.
    slots_per_gpu, replica_slots_per_gpu
        The home and replica region sizes (``W`` is their sum); by default the fewest that
        hold the plan (:func:`default_slots`).
    load
        Optional float ``[L, E]`` expert loads: a GPU holding nothing in a layer is filled
        with that layer's hottest expert.

    Returns
    -------
    numpy.ndarray
        int64 ``[L, G * W]`` logical expert id of every physical slot (fill rule in the
        module docstring).

    Raises
    ------
    PlanError
        If a GPU holds more homes or replicas than its region has slots.
    """
    L, E = plan.layers, plan.experts
    S0, R0 = default_slots(plan, gpus)
    S = S0 if slots_per_gpu is None else int(slots_per_gpu)
    R = R0 if replica_slots_per_gpu is None else int(replica_slots_per_gpu)
    if plan.experts_per_gpu(gpus).max() > S:
        raise PlanError(f"plan.placement: a GPU holds more than slots_per_gpu={S} home experts")
    if R0 > R:
        raise PlanError(f"plan.replicas: a GPU holds {R0} replicas, replica_slots_per_gpu is {R}")
    if S * gpus < E:
        raise PlanError(f"{gpus} GPUs x {S} slots cannot hold {E} experts")
    if load is not None:
        load = np.asarray(load, dtype=np.float64)
        if load.shape != (L, E):
            raise PlanError(f"load: expected shape [{L}, {E}], got {load.shape}")
    W = S + R
    out = np.empty((L, gpus, W), dtype=np.int64)
    for l in range(L):
        reps = plan.replicas[l]
        copies = 1 + np.bincount(reps[:, 0], minlength=E) if len(reps) else np.ones(E, dtype=np.int64)
        hottest = int(np.argmax(load[l] if load is not None else copies))
        home_ids = np.argsort(plan.home[l], kind="stable")  # experts grouped by GPU, ascending
        bounds = np.searchsorted(plan.home[l][home_ids], np.arange(gpus + 1))
        rep_sorted = reps[np.lexsort((reps[:, 0], reps[:, 1]))] if len(reps) else reps
        rep_bounds = (
            np.searchsorted(rep_sorted[:, 1], np.arange(gpus + 1)) if len(reps) else np.zeros(gpus + 1, dtype=np.int64)
        )
        for g in range(gpus):
            h = home_ids[bounds[g] : bounds[g + 1]]
            r = rep_sorted[rep_bounds[g] : rep_bounds[g + 1], 0]
            home_fill = h[0] if len(h) else (r[0] if len(r) else hottest)
            out[l, g, :S] = home_fill
            out[l, g, : len(h)] = h
            out[l, g, S:] = r[0] if len(r) else home_fill
            out[l, g, S : S + len(r)] = r
    return out.reshape(L, gpus * W)


# ----------------------------------------------------------------------------- layout -> plan
def plan_from_physical(
    phy2log: np.ndarray,
    gpus: int,
    *,
    experts: int | None = None,
    slots_per_gpu: int | None = None,
    source: str | None = None,
) -> Plan:
    """Read a physical-to-logical map ``[L, P]`` back into a plan (homes and replicas).

    Slot ``p`` lies on GPU ``p // (P / G)``. Each expert's home is a GPU that holds it in
    its home region (the GPU's first ``slots_per_gpu`` slots); several such GPUs are told
    apart by, in order: more distinct experts in the home region (a GPU padded with one
    expert's copies has one), the expert absent from the GPU's replica region, the lower
    GPU id. An expert with no copy in any home region is homed on the GPU holding it that
    has the fewest homes so far. Every other GPU holding the expert holds a replica.

    Parameters
    ----------
    phy2log
        int ``[L, P]`` logical expert of every physical slot.
    gpus
        G; must divide P.
    experts
        E; by default one more than the largest id.
    slots_per_gpu
        Home region size; by default ``ceil(E / G)`` capped at ``P / G``.
    source
        File name for error messages.

    Raises
    ------
    InputError
        On a wrong shape, ids out of range, G not dividing P, or an expert without a slot.
    """
    phy2log = to_numpy(phy2log, source, "physical_to_logical_map")
    if phy2log.ndim != 2 or phy2log.shape[1] == 0:
        raise InputError(
            source, "physical_to_logical_map", f"expected [layers, physical slots], got shape {phy2log.shape}"
        )
    L, P = phy2log.shape
    if gpus < 1 or P % gpus:
        raise InputError(source, "gpus", f"{P} physical slots per layer do not split evenly over {gpus} GPUs")
    if phy2log.min() < 0:
        raise InputError(source, "physical_to_logical_map", f"logical id {int(phy2log.min())} is negative")
    E = int(phy2log.max()) + 1 if experts is None else int(experts)
    if phy2log.max() >= E:
        raise InputError(
            source, "physical_to_logical_map", f"logical id {int(phy2log.max())} out of range [0, {E - 1}]"
        )
    W = P // gpus
    S = min(W, math.ceil(E / gpus) if slots_per_gpu is None else int(slots_per_gpu))
    home = np.empty((L, E), dtype=np.int64)
    replicas = []
    for l in range(L):
        table = phy2log[l].reshape(gpus, W)
        held = np.zeros((gpus, E), dtype=bool)
        held[np.repeat(np.arange(gpus), W), table.ravel()] = True
        missing = np.flatnonzero(~held.any(axis=0))
        if len(missing):
            raise InputError(
                source, f"physical_to_logical_map[{l}]", f"logical expert {int(missing[0])} has no physical slot"
            )
        in_home = np.zeros((gpus, E), dtype=bool)
        in_home[np.repeat(np.arange(gpus), S), table[:, :S].ravel()] = True
        in_rep = np.zeros((gpus, E), dtype=bool)
        if W > S:
            in_rep[np.repeat(np.arange(gpus), W - S), table[:, S:].ravel()] = True
        distinct = in_home.sum(axis=1)
        # lexicographic preference, higher is better: home region, distinct, not in replicas, -id
        score = (
            in_home * (4 * (E + 1) * gpus)
            + distinct[:, None] * (2 * gpus)
            + (~in_rep) * gpus
            + (gpus - 1 - np.arange(gpus))[:, None]
        )
        score = np.where(held, score, -1)
        choice = np.argmax(score, axis=0)
        orphan = np.flatnonzero(~in_home.any(axis=0))
        if len(orphan):
            count = np.bincount(choice[in_home.any(axis=0)], minlength=gpus)
            for e in orphan:
                cand = np.flatnonzero(held[:, e])
                g = int(cand[np.argmin(count[cand])])
                choice[e] = g
                count[g] += 1
        home[l] = choice
        held[choice, np.arange(E)] = False
        g_idx, e_idx = np.nonzero(held)
        order = np.lexsort((g_idx, e_idx))
        replicas.append(np.stack([e_idx[order], g_idx[order]], axis=1))
    return Plan(home=home, replicas=tuple(replicas))


# ----------------------------------------------------------------------------- SGLang
def to_sglang(
    plan: Plan,
    gpus: int,
    *,
    slots_per_gpu: int | None = None,
    replica_slots_per_gpu: int | None = None,
    load: np.ndarray | None = None,
    dense_layers: int = 0,
) -> dict[str, list]:
    """SGLang ``--init-expert-location`` JSON content: ``{"physical_to_logical_map": ...}``.

    SGLang's ``physical_to_logical_map`` has one row per *hidden* layer, dense ones included
    (DeepSeek-V3: 61 rows, the first 3 dense); ``dense_layers`` rows of the trivial layout
    ``p % E`` (SGLang ignores them) are put before the plan's MoE layers. Start SGLang with
    ``--ep-num-redundant-experts`` equal to ``P - E``.

    Returns
    -------
    dict
        Only the key ``physical_to_logical_map``: SGLang passes the object's keys as keyword
        arguments, so no other key may be added.
    """
    table = physical_layout(
        plan, gpus, slots_per_gpu=slots_per_gpu, replica_slots_per_gpu=replica_slots_per_gpu, load=load
    )
    if dense_layers < 0:
        raise PlanError(f"dense_layers must be >= 0, got {dense_layers}")
    if dense_layers:
        trivial = np.arange(table.shape[1]) % plan.experts
        table = np.concatenate([np.tile(trivial, (dense_layers, 1)), table])
    return {"physical_to_logical_map": table.tolist()}


def from_sglang(
    data: Any,
    gpus: int,
    *,
    experts: int | None = None,
    slots_per_gpu: int | None = None,
    dense_layers: int = 0,
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
    experts, slots_per_gpu, source
        As in :func:`plan_from_physical`.
    dense_layers
        Leading rows (dense hidden layers) to drop.

    Returns
    -------
    Plan
        Homes and replicas of the MoE layers (see :func:`plan_from_physical`).

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
            source, "physical_to_logical_map", f"expected [layers, physical slots], got shape {table.shape}"
        )
    if not 0 <= dense_layers < table.shape[0]:
        raise InputError(source, "dense_layers", f"{dense_layers} dense layers, the map has {table.shape[0]} rows")
    return plan_from_physical(table[dense_layers:], gpus, experts=experts, slots_per_gpu=slots_per_gpu, source=source)


# ----------------------------------------------------------------------------- DeepSeek EPLB
def to_eplb(
    plan: Plan,
    gpus: int,
    *,
    slots_per_gpu: int | None = None,
    replica_slots_per_gpu: int | None = None,
    load: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The DeepSeek EPLB tensors of a plan, as int64 arrays.

    Returns
    -------
    dict
        ``phy2log [L, P]`` logical expert of each physical slot (GPU ``p // (P / G)``);
        ``log2phy [L, E, max_replicas]`` the physical slots of each expert, ascending,
        padded with -1; ``logcnt [L, E]`` how many slots each expert has; and, moeopt's
        additions so the file reads back alone, ``num_gpus`` and ``slots_per_gpu`` (0-d).
    """
    phy2log = physical_layout(
        plan, gpus, slots_per_gpu=slots_per_gpu, replica_slots_per_gpu=replica_slots_per_gpu, load=load
    )
    L, P = phy2log.shape
    E = plan.experts
    logcnt = np.stack([np.bincount(row, minlength=E) for row in phy2log])
    width = int(logcnt.max())
    log2phy = np.full((L, E, width), -1, dtype=np.int64)
    for l in range(L):
        order = np.argsort(phy2log[l], kind="stable")  # physical ids grouped by expert, ascending
        experts_sorted = phy2log[l, order]
        start = np.searchsorted(experts_sorted, np.arange(E))
        rank = np.arange(P) - start[experts_sorted]
        log2phy[l, experts_sorted, rank] = order
    S = default_slots(plan, gpus)[0] if slots_per_gpu is None else int(slots_per_gpu)
    return {
        "phy2log": phy2log,
        "log2phy": log2phy,
        "logcnt": logcnt,
        "num_gpus": np.array(gpus, dtype=np.int64),
        "slots_per_gpu": np.array(S, dtype=np.int64),
    }


def from_eplb(
    arrays: Mapping[str, Any],
    gpus: int | None = None,
    *,
    slots_per_gpu: int | None = None,
    source: str | None = None,
) -> tuple[Plan, int]:
    """A plan from DeepSeek EPLB tensors.

    Parameters
    ----------
    arrays
        ``phy2log`` (required), ``log2phy`` and ``logcnt`` (checked against ``phy2log`` when
        present), and moeopt's optional ``num_gpus`` and ``slots_per_gpu``.
    gpus
        G; defaults to the file's ``num_gpus``.
    slots_per_gpu
        Home region size; defaults to the file's ``slots_per_gpu``, else ``ceil(E / G)``.
    source
        File name for error messages.

    Returns
    -------
    tuple of (Plan, int)
        The plan and G.

    Raises
    ------
    InputError
        On missing or inconsistent tensors, or no GPU count.
    """
    if not isinstance(arrays, Mapping) or "phy2log" not in arrays:
        raise InputError(source, "phy2log", "required array is missing (expected phy2log, log2phy, logcnt)")
    phy2log = to_numpy(arrays["phy2log"], source, "phy2log")
    if phy2log.ndim != 2:
        raise InputError(source, "phy2log", f"expected [layers, physical slots], got shape {phy2log.shape}")
    if gpus is None:
        if "num_gpus" not in arrays:
            raise InputError(source, "num_gpus", "the file does not record the GPU count; give it (--gpus)")
        n = to_numpy(arrays["num_gpus"], source, "num_gpus")
        if n.size != 1:
            raise InputError(source, "num_gpus", "expected one integer")
        gpus = int(n.reshape(()))
    if slots_per_gpu is None and "slots_per_gpu" in arrays:
        n = to_numpy(arrays["slots_per_gpu"], source, "slots_per_gpu")
        if n.size != 1 or int(n.reshape(())) < 1:
            raise InputError(source, "slots_per_gpu", "expected one integer >= 1")
        slots_per_gpu = int(n.reshape(()))
    experts = None
    L, P = phy2log.shape
    if "log2phy" in arrays:
        log2phy = to_numpy(arrays["log2phy"], source, "log2phy")
        if log2phy.ndim != 3 or log2phy.shape[0] != L:
            raise InputError(source, "log2phy", f"expected [{L}, experts, max replicas], got shape {log2phy.shape}")
        experts = log2phy.shape[1]
        if log2phy.min() < -1 or log2phy.max() >= P:
            raise InputError(source, "log2phy", f"physical ids must lie in [0, {P - 1}] or be -1 padding")
        for l in range(L):
            e_idx, r_idx = np.nonzero(log2phy[l] >= 0)
            mapped = np.full(P, -1, dtype=np.int64)
            mapped[log2phy[l, e_idx, r_idx]] = e_idx
            if (mapped != phy2log[l]).any() or len(e_idx) != P:
                raise InputError(source, f"log2phy[{l}]", "does not list exactly the physical slots of phy2log")
    if "logcnt" in arrays:
        logcnt = to_numpy(arrays["logcnt"], source, "logcnt")
        E = experts if experts is not None else logcnt.shape[-1]
        if phy2log.min() < 0 or phy2log.max() >= E:
            raise InputError(source, "phy2log", f"logical ids must lie in [0, {E - 1}]")
        expect = np.stack([np.bincount(r, minlength=E) for r in phy2log])
        if logcnt.shape != expect.shape or (logcnt != expect).any():
            raise InputError(source, "logcnt", "does not match the copies counted in phy2log")
        experts = E
    plan = plan_from_physical(phy2log, gpus, experts=experts, slots_per_gpu=slots_per_gpu, source=source)
    return plan, gpus


# ----------------------------------------------------------------------------- vLLM-Ascend
def to_vllm_ascend(
    plan: Plan,
    gpus: int,
    *,
    slots_per_gpu: int | None = None,
    replica_slots_per_gpu: int | None = None,
    load: np.ndarray | None = None,
) -> dict[str, Any]:
    """The vLLM-Ascend expert map JSON content of a plan.

    Parameters
    ----------
    plan, gpus, slots_per_gpu, replica_slots_per_gpu, load
        As in :func:`physical_layout`.

    Returns
    -------
    dict
        ``{"moe_layer_count", "layer_list": [{"layer_id", "device_count", "device_list":
        [{"device_id", "device_expert"}]}]}``; ``layer_id`` counts MoE layers from 0 (vLLM
        numbers only MoE layers) and every device lists its ``W`` physical slots.
    """
    table = physical_layout(
        plan, gpus, slots_per_gpu=slots_per_gpu, replica_slots_per_gpu=replica_slots_per_gpu, load=load
    ).reshape(plan.layers, gpus, -1)
    return {
        "moe_layer_count": plan.layers,
        "layer_list": [
            {
                "layer_id": l,
                "device_count": gpus,
                "device_list": [{"device_id": g, "device_expert": table[l, g].tolist()} for g in range(gpus)],
            }
            for l in range(plan.layers)
        ],
    }


def from_vllm_ascend(
    data: Any, *, experts: int | None = None, slots_per_gpu: int | None = None, source: str | None = None
) -> tuple[Plan, int]:
    """A plan from a vLLM-Ascend expert map.

    Parameters
    ----------
    data
        The loaded JSON object. Layers are ordered by ``layer_id``, devices by
        ``device_id`` (list order when absent); every device must list as many experts.
    experts, slots_per_gpu, source
        As in :func:`plan_from_physical`.

    Returns
    -------
    tuple of (Plan, int)
        The plan and G (``device_count``).

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
    rows: list[tuple[int, np.ndarray]] = []
    gpus = None
    for i, layer in enumerate(layers):
        where = f"layer_list[{i}]"
        if not isinstance(layer, Mapping) or not isinstance(layer.get("device_list"), list) or not layer["device_list"]:
            raise InputError(source, where, "expected an object with a non-empty 'device_list'")
        devices = layer["device_list"]
        n = layer.get("device_count", len(devices))
        if isinstance(n, bool) or not isinstance(n, int) or n != len(devices):
            raise InputError(source, f"{where}.device_count", f"is {n!r}, but device_list has {len(devices)} devices")
        if gpus is not None and n != gpus:
            raise InputError(source, f"{where}.device_count", f"is {n}, earlier layers have {gpus}")
        gpus = n
        ids, lists = [], []
        for j, dev in enumerate(devices):
            if not isinstance(dev, Mapping) or not isinstance(dev.get("device_expert"), list):
                raise InputError(source, f"{where}.device_list[{j}]", "expected an object with a 'device_expert' list")
            ids.append(dev.get("device_id", j))
            lists.append(to_numpy(dev["device_expert"], source, f"{where}.device_list[{j}].device_expert").ravel())
        if sorted(ids) != list(range(n)):
            raise InputError(source, f"{where}.device_list", f"device_id values must be 0..{n - 1}, got {ids}")
        width = {len(x) for x in lists}
        if len(width) != 1 or 0 in width:
            raise InputError(source, f"{where}.device_list", "every device needs the same, non-zero number of experts")
        table = np.stack([lists[ids.index(g)] for g in range(n)])
        layer_id = layer.get("layer_id", i)
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise InputError(source, f"{where}.layer_id", f"expected an integer, got {layer_id!r}")
        rows.append((layer_id, table.ravel()))
    ids = [r[0] for r in rows]
    if len(set(ids)) != len(ids):
        raise InputError(source, "layer_list", "duplicate layer_id")
    if len({len(r[1]) for r in rows}) != 1:
        raise InputError(source, "layer_list", "every layer needs the same number of slots")
    table = np.stack([r[1] for r in sorted(rows, key=lambda r: r[0])])
    assert gpus is not None
    return plan_from_physical(table, gpus, experts=experts, slots_per_gpu=slots_per_gpu, source=source), gpus


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

    Each record's ``topk_ids_of_layer`` ``[hidden layers, tokens, k]`` holds *physical* ids,
    mapped to logical experts with ``last_physical_to_logical_map`` ``[hidden layers, P]``
    (a map that changed during recording cannot be recovered). Layers never routed (all
    ids -1: dense layers, which SGLang counts as layers) are dropped, as are tokens with a
    -1 at a MoE layer (padding). A record's ``forward_pass_id`` (else its position) is the
    token's step. Families are unknown: every token is family ``all``.

    Raises
    ------
    InputError
        On a missing key, a shape mismatch or a physical id outside the map.
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
            f"expected non-negative ids [layers, physical slots], got shape {p2l.shape}",
        )
    layers_all, P = p2l.shape
    chunks, steps = [], []
    k = None
    for i, rec in enumerate(records):
        where = f"records[{i}]"
        if not isinstance(rec, Mapping) or "topk_ids_of_layer" not in rec:
            raise InputError(source, where, "expected a record with 'topk_ids_of_layer'")
        ids = to_numpy(rec["topk_ids_of_layer"], source, f"{where}.topk_ids_of_layer")
        if ids.ndim != 3 or ids.shape[0] != layers_all:
            raise InputError(
                source,
                f"{where}.topk_ids_of_layer",
                f"expected [{layers_all} layers, tokens, k], got shape {ids.shape}",
            )
        if k is not None and ids.shape[2] != k:
            raise InputError(source, f"{where}.topk_ids_of_layer", f"top-{ids.shape[2]}, earlier records top-{k}")
        k = ids.shape[2]
        if ids.size and (ids.min() < -1 or ids.max() >= P):
            raise InputError(source, f"{where}.topk_ids_of_layer", f"physical ids must lie in [0, {P - 1}] (or -1)")
        step = rec.get("forward_pass_id", i)
        try:
            step = int(to_numpy(step, source, f"{where}.forward_pass_id").reshape(()))
        except ValueError:
            raise InputError(source, f"{where}.forward_pass_id", "expected one integer") from None
        chunks.append(np.transpose(ids, (1, 0, 2)))  # [tokens, layers, k]
        steps.append(np.full(ids.shape[1], step, dtype=np.int64))
    topk = np.concatenate(chunks)
    step = np.concatenate(steps)
    moe = (topk >= 0).any(axis=(0, 2)) if len(topk) else np.zeros(layers_all, dtype=bool)
    if not moe.any():
        raise InputError(source, "records", "no token was routed to an expert")
    topk = topk[:, moe]
    keep = (topk >= 0).all(axis=(1, 2))
    topk, step = topk[keep], step[keep]
    if not len(topk):
        raise InputError(source, "records", "every token has a -1 (unrouted) id at some MoE layer")
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
        raise InputError(source, "logical_count", f"expected [steps, layers, experts], got shape {arr.shape}")
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
