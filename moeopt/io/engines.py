"""Serving-engine files: SGLang dumps and placement maps, EPLB tensors, vLLM-Ascend maps (``.pt`` via torch)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np

from moeopt import console, interop
from moeopt.errors import InputError, PlanError
from moeopt.interop.sglang import read_sglang_dumps
from moeopt.io.files import (
    _read_json,
    input_file,
    npz_array,
    open_npz,
    write_text,
)
from moeopt.outputs import atomic_path
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Stats, Trace


def _torch_load(path: Path, *, trusted: bool = False) -> Any:
    """``torch.load``: tensors and plain containers only unless ``trusted`` (arbitrary pickles
    run code); InputError for a missing or irregular file, then without torch."""
    input_file(path)
    try:
        import torch
    except ImportError:
        raise InputError(str(path), None, "reading .pt files needs torch: pip install -e '.[torch]'") from None
    try:
        with warnings.catch_warnings():  # a damaged file makes torch warn before it raises: one line only
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as exc:  # torch raises many types for a bad file
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "" if trusted else "; if it holds other objects and you trust it, use --trust-pickle"
        raise InputError(str(path), None, f"not a readable torch file of tensors ({msg}){hint}") from None


def _torch_save(path: str | Path, obj: dict[str, np.ndarray]) -> None:
    try:
        import torch
    except ImportError:
        raise InputError(str(path), None, "writing .pt files needs torch: pip install -e '.[torch]'") from None
    with atomic_path(path) as tmp:
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in obj.items()}, tmp)


def read_sglang_dump(path: str | Path, *, top_k: int | None = None, trusted: bool = False) -> Trace | Stats:
    """Read an SGLang expert-distribution recorder dump (``.pt``, needs torch).

    ``per_token`` dumps give a [`Trace`][moeopt.trace.Trace] (physical ids mapped to logical experts, the
    records' ``rank`` as token homes), ``per_pass`` and ``stat`` dumps count-only
    [`Stats`][moeopt.trace.Stats] with per-step counts (``top_k`` required; a ``stat`` ring read in time
    order); see `moeopt.interop.sglang` for the rules (dense all-zero layers are dropped).
    Only tensors and plain containers are unpickled unless ``trusted``. Notes on what the
    reading did (`read_engine_dumps` returns them) are shown with `moeopt.console.note`.
    """
    path = Path(path)
    workload, notes = read_sglang_dumps([(str(path), _torch_load(path, trusted=trusted))], top_k=top_k)
    for line in notes:
        console.note(line)
    return workload


def _kind(obj: Any) -> str | None:
    """The SGLang recorder mode of a loaded ``.pt`` object, None for vLLM EPLB state or anything else."""
    if interop.is_vllm_eplb_state(obj):
        return None
    try:
        return interop.sglang_dump_kind(obj)
    except InputError:
        return None


def _read_loaded(source: str, obj: Any, top_k: int | None) -> tuple[Trace | Stats, list[str]]:
    if interop.is_vllm_eplb_state(obj):
        return interop.stats_from_vllm_eplb(obj, top_k=top_k, source=source), []
    return read_sglang_dumps([(source, obj)], top_k=top_k)


def read_engine_dumps(
    paths: Sequence[str | Path], *, top_k: int | None = None, trusted: bool = False
) -> tuple[Trace | Stats, list[str]]:
    """Read one or several engine recordings (``.pt``, needs torch) as one workload.

    Parameters
    ----------
    paths
        vLLM EPLB state files (`moeopt.interop.vllm_eplb`) or SGLang recorder dumps
        (`moeopt.interop.sglang.read_sglang_dumps`). When every file is an SGLang
        ``per_token`` dump, or every one a ``per_pass`` dump, they are the per-rank files of
        one recording: ``per_token`` files become one trace (every rank's tokens, the rank as
        their home, one step per forward pass), ``per_pass`` files one count workload summed
        per forward pass. Any other set is snapshots taken at different times, joined in the
        given order by [`combine_snapshots`][moeopt.io.combine_snapshots].
    top_k
        k, for the files that do not record it (``stat``, ``per_pass``, vLLM).
    trusted
        Unpickle any object, not only tensors and plain containers (runs code).

    Returns
    -------
    workload : Trace or Stats
        The workload.
    notes : list of str
        One-line notes for the user (how a ``stat`` ring was ordered, passes dropped).

    Raises
    ------
    InputError
        On an unreadable or malformed file (naming it and the field).
    """
    if not paths:
        raise ValueError("read_engine_dumps needs at least one file")
    dumps = [(str(p), _torch_load(Path(p), trusted=trusted)) for p in paths]
    kinds = {_kind(obj) for _, obj in dumps}
    if len(dumps) > 1 and len(kinds) == 1 and kinds <= {"per_token", "per_pass"}:
        return read_sglang_dumps(dumps, top_k=top_k)
    items, notes = [], []
    for source, obj in dumps:
        workload, said = _read_loaded(source, obj, top_k)
        items.append((source, workload))
        notes += said
    if len(items) == 1:
        return items[0][1], notes
    return combine_snapshots(items), notes


def read_engine_dump(path: str | Path, *, top_k: int | None = None, trusted: bool = False) -> Trace | Stats:
    """Read an engine's recorded expert loads from a ``.pt`` file (needs torch): vLLM's EPLB state
    tensors (`moeopt.interop.vllm_eplb`) or an SGLang recorder dump of any mode
    ([`read_sglang_dump`][moeopt.io.read_sglang_dump]); its notes are shown with `moeopt.console.note`
    (`read_engine_dumps` returns them)."""
    workload, notes = read_engine_dumps([path], top_k=top_k, trusted=trusted)
    for line in notes:
        console.note(line)
    return workload


def combine_snapshots(items: list[tuple[str, Trace | Stats]]) -> Stats:
    """Several recordings of one model (e.g. SGLang dumps taken at intervals, or one per workload)
    as one count workload whose per-step counts are every file's steps in the given order (a file
    without steps is one step: its counts), for ``balance``'s robust mode.

    ``items`` are ``(source, workload)`` pairs; traces count through their statistics. Every file
    must have the same MoE layers, experts and top-k (an error names the first that differs). The
    counts are the files' sums, per family when every file has the same families, else as one
    family ``all``; co-activations are dropped (counts only).
    """
    if not items:
        raise ValueError("combine_snapshots needs at least one workload")
    stats = [(src, w.stats() if isinstance(w, Trace) else w) for src, w in items]
    src0, first = stats[0]
    for src, s in stats[1:]:
        for what, a, b in (
            ("MoE layers", s.layers, first.layers),
            ("experts", s.experts, first.experts),
            ("top_k", s.top_k, first.top_k),
        ):
            if a != b:
                raise InputError(src, None, f"expected {b} {what} like {src0}, found {a}")
    steps = [s.step_counts if s.step_counts is not None else s.counts.sum(axis=0)[:, None, :] for _, s in stats]
    same = all(s.family_names == first.family_names for _, s in stats)
    if same:
        counts = np.sum([s.counts for _, s in stats], axis=0)
        tokens = np.sum([s.family_tokens for _, s in stats], axis=0)
        names = first.family_names
    else:
        counts = np.sum([s.counts.sum(axis=0) for _, s in stats], axis=0)[None]
        tokens = np.array([sum(float(s.family_tokens.sum()) for _, s in stats)])
        names = ("all",)
    return Stats(
        family_names=tuple(names),
        counts=counts.astype(np.float64),
        family_tokens=np.asarray(tokens, dtype=np.float64),
        top_k=first.top_k,
        step_counts=np.concatenate(steps, axis=1).astype(np.float64),
    )


def write_counts(path: str | Path, stats: Stats) -> None:
    """Write count-only statistics as a counts ``.npz`` (``counts``, ``top_k``,
    ``family_names``, and ``step_counts`` when known), readable by ``read_workload_file``."""
    arrays: dict[str, Any] = {  # np.savez_compressed's **kwds (typed as its keyword options)
        "counts": stats.counts,
        "top_k": np.array(stats.top_k),
        "family_names": np.array(stats.family_names),
    }
    if stats.step_counts is not None:
        arrays["step_counts"] = stats.step_counts
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)


def write_engine_plan(
    path: str | Path,
    plan: Plan,
    format: str,
    *,
    load: np.ndarray | None = None,
    dense_layers: int | None = None,
) -> list[str]:
    """Write a plan for a serving engine (atomically; layout rules in [`moeopt.interop`][]).

    The engine must run the plan's dispatch rule (`moeopt.interop.ENGINE_RULES`): a plan
    planned and scored under another rule is refused, so that no file promises loads its engine
    will not produce (re-label it with `Plan.with_dispatch` to export it as the engine
    will run it). SGLang's map needs a row per hidden layer: ``dense_layers`` must be given.

    Parameters
    ----------
    path
        Output file: ``.json`` or ``.pt`` for ``sglang``, ``.npz`` or ``.pt`` for ``eplb``,
        ``.json`` for ``vllm-ascend``.
    plan
        The plan; physical slot ``p`` of layer ``l`` is ``plan.slots[l].reshape(-1)[p]``.
    format
        ``sglang``, ``eplb`` or ``vllm-ascend``.
    load
        Optional float ``[L, E]`` expert loads, used only to fill an empty slot that no
        score-neutral copy can fill ([`moeopt.interop.fill_empty_slots`][]).
    dense_layers
        SGLang only, required there: the model's dense hidden layers, written before the MoE
        layers (DeepSeek-V3: 3; 0 for a model without any). SGLang reads a map without them
        silently and shifts every MoE layer; a ``static`` plan must have been scored with the
        same count (its draws depend on it).

    Returns
    -------
    list of str
        One-line notes for the user (fills that shift load, colocated copies written once).

    Raises
    ------
    InputError
        On an unknown format, a wrong suffix, a plan the engine cannot represent, or a
        ``.pt`` path without torch.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    allowed = {"sglang": (".json", ".pt"), "eplb": (".npz", ".pt"), "vllm-ascend": (".json",)}
    if format not in allowed:
        raise InputError(None, "format", f"expected one of {', '.join(interop.ENGINE_FORMATS)}, got {format!r}")
    if suffix not in allowed[format]:
        raise InputError(str(path), None, f"{format} plans are written as {' or '.join(allowed[format])}")
    if format == "sglang" and dense_layers is None:
        raise InputError(
            str(path),
            "dense_layers",
            "SGLang's map has a row for every hidden layer, dense ones included, and reads a map without "
            "them silently, shifting every MoE layer: give the model's dense layers (--dense-layers N, "
            "or --instance with model.dense_layers; DeepSeek-V3 / R1: 3, models without dense layers: 0)",
        )
    if format != "sglang" and dense_layers:
        raise InputError(str(path), "dense_layers", f"{format} maps count MoE layers only; dense layers are SGLang's")
    if plan.dispatch.kind == "static" and plan.dispatch.dense_layers != (dense_layers or 0):
        raise InputError(
            str(path),
            "dense_layers",
            f"the plan was scored under SGLang static with {plan.dispatch.dense_layers} dense rows, the map "
            f"would have {dense_layers}: the engine's seeded choices would differ from the scored ones",
        )
    try:
        if format == "vllm-ascend":
            _, notes = interop.vllm_ascend_layout(plan)
            data: dict[str, Any] = interop.to_vllm_ascend(plan)
        else:
            _, notes = interop.fill_empty_slots(plan, load)
            if format == "sglang":
                data = interop.to_sglang(plan, dense_layers=dense_layers or 0, load=load)
            else:
                data = interop.to_eplb(plan, load=load)
    except PlanError as exc:
        raise InputError(str(path), None, str(exc)) from None
    try:
        interop.check_engine_rule(plan, format)
    except PlanError as exc:
        raise InputError(str(path), "dispatch", str(exc).removeprefix("dispatch: ")) from None
    if suffix == ".pt":
        _torch_save(path, {k: np.asarray(v) for k, v in data.items()})
    elif suffix == ".npz":
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **data)
    else:
        write_text(path, json.dumps(data, separators=(",", ":")) + "\n")
    return notes


def load_engine_file(path: str | Path) -> Any:
    """The content of an engine file: a ``.pt`` (tensors only, needs torch), an ``.npz`` (as a
    dict of arrays) or JSON; InputError when it cannot be read."""
    path = Path(path)
    src = str(path)
    suffix = path.suffix.lower()
    if suffix == ".pt":
        return _torch_load(path)
    if suffix == ".npz":
        with open_npz(path) as z:
            return {k: npz_array(z, k, src) for k in z.files}
    return _read_json(path)


def engine_file_format(data: Any) -> str | None:
    """The placement format of an engine file's content (`load_engine_file`): ``sglang``
    (``physical_to_logical_map``, also what vLLM's EPLB state holds), ``eplb`` (``phy2log``),
    ``vllm-ascend`` (``layer_list``), or None."""
    if isinstance(data, dict):
        for key, fmt in (("physical_to_logical_map", "sglang"), ("phy2log", "eplb"), ("layer_list", "vllm-ascend")):
            if key in data:
                return fmt
    return None


def read_engine_plan(
    path: str | Path,
    format: str,
    *,
    gpus: int | None = None,
    experts: int | None = None,
    dense_layers: int = 0,
    dispatch: str | None = None,
    model_layers: int | None = None,
) -> Plan:
    """Read a serving-engine plan file into a plan, slot for slot (nothing merged).

    Parameters
    ----------
    path
        A file written by [`write_engine_plan`][moeopt.io.write_engine_plan] or by the engine's own tools.
    format
        ``sglang``, ``eplb`` or ``vllm-ascend``.
    gpus
        G: required for SGLang maps (they do not record it) and EPLB files without
        ``num_gpus``; checked against the file otherwise.
    experts
        E (default: from the file, else one more than the largest id).
    dense_layers
        SGLang only: leading dense-layer rows to drop.
    dispatch
        The plan's dispatch kind (default: the engine's, `moeopt.interop.ENGINE_DISPATCH`).
    model_layers
        SGLang only, without ``dense_layers``: the model's MoE layers; the map's rows beyond them
        are its leading dense layers (SGLang counts every hidden layer).

    Raises
    ------
    InputError
        On a missing or malformed file (see [`moeopt.interop`][]).
    """
    path = Path(path)
    src = str(path)
    if format not in interop.ENGINE_FORMATS:
        raise InputError(None, "format", f"expected one of {', '.join(interop.ENGINE_FORMATS)}, got {format!r}")
    try:
        kind = Dispatch(kind=dispatch or interop.ENGINE_DISPATCH[format])
    except PlanError as exc:
        raise InputError(None, "dispatch", str(exc)) from None
    data = load_engine_file(path)
    if format == "sglang":
        if model_layers is not None and not dense_layers:
            table = data.get("physical_to_logical_map") if isinstance(data, dict) else None
            dense_layers = max(0, len(table) - model_layers) if isinstance(table, Sized) else 0
        if gpus is None:
            raise InputError(src, "gpus", "SGLang maps do not record the GPU count; give it (--gpus or --instance)")
        return interop.from_sglang(data, gpus, experts=experts, dense_layers=dense_layers, dispatch=kind, source=src)
    if format == "eplb":
        return interop.from_eplb(data, gpus, experts=experts, dispatch=kind, source=src)
    plan = interop.from_vllm_ascend(data, experts=experts, dispatch=kind, source=src)
    if gpus is not None and gpus != plan.gpus:
        raise InputError(src, "device_count", f"the map has {plan.gpus} devices, expected {gpus}")
    return plan
