"""SGLang: ``--init-expert-location`` maps, and the expert-distribution recorder's ``per_token`` /
``stat`` dumps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moeopt.errors import InputError, PlanError
from moeopt.interop.slots import (
    _dispatch,
    check_top_k,
    engine_slots,
    plan_from_physical,
    to_numpy,
)
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Stats, Trace, stats_from_counts


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
    top_k = check_top_k(top_k, arr.shape[2], source, "stat dumps")
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
