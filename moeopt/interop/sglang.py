"""SGLang: ``--init-expert-location`` maps, and the expert-distribution recorder's ``per_token``,
``per_pass`` and ``stat`` dumps.
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
        As in [`plan_from_physical`][moeopt.interop.plan_from_physical].
    dense_layers
        Leading rows (dense hidden layers) to drop.
    dispatch
        The plan's dispatch; default ``even``, SGLang's ``dynamic`` (`ENGINE_DISPATCH`);
        ``static`` for a deployment with an all-to-all backend (DeepEP), which then records the
        ``dense_layers`` rows dropped (their draws come first in SGLang's seeded stream, as the
        ``p mod E`` rows [`to_sglang`][moeopt.interop.to_sglang] writes).

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
    rule = _dispatch(dispatch, "sglang")
    if rule.kind == "static" and rule.dense_layers != dense_layers:  # the dropped rows drew from the stream
        rule = Dispatch(kind="static", dense_layers=dense_layers)
    return plan_from_physical(table[dense_layers:], gpus, experts=experts, dispatch=rule, source=source)


# ----------------------------------------------------------------------------- recorder dumps
#: SGLang's ``--expert-distribution-recorder-mode`` values, as `sglang_dump_kind` names the
#: files they write (``stat_approx`` writes the same file as ``stat``).
RECORDER_MODES = ("per_token", "per_pass", "stat")

#: One loaded recorder file: ``(source, what torch.load returned)``; ``source`` names the file
#: in errors and notes.
Dump = tuple[str | None, Any]


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def sglang_dump_kind(obj: Any) -> str:
    """``"per_token"``, ``"per_pass"`` or ``"stat"``: which SGLang recorder mode wrote ``obj``.

    Both detail modes write ``{"records": [...], "last_physical_to_logical_map": ...}``: a
    ``per_token`` record holds ``topk_ids_of_layer`` (and ``global_physical_count``), a
    ``per_pass`` record ``global_physical_count`` alone; records without ``topk_ids_of_layer``
    are read as ``per_pass``. ``stat`` and ``stat_approx`` write ``logical_count`` (a list of
    such dicts reads as one dump).

    Raises
    ------
    InputError
        When ``obj`` is none of these.
    """
    if isinstance(obj, Mapping) and "records" in obj:
        records = obj["records"]
        if (
            _is_list(records)
            and records
            and all(isinstance(r, Mapping) and "topk_ids_of_layer" not in r for r in records)
        ):
            return "per_pass"
        return "per_token"
    if isinstance(obj, Mapping) and "logical_count" in obj:
        return "stat"
    if _is_list(obj) and obj and all(isinstance(x, Mapping) and "logical_count" in x for x in obj):
        return "stat"
    raise InputError(
        None,
        None,
        "expected an SGLang expert-distribution dump: a dict with 'records' (per_token or per_pass mode) "
        "or 'logical_count' (stat mode)",
    )


def _records(obj: Any, source: str | None) -> list[Any]:
    """The ``records`` list of a detail-mode dump (non-empty)."""
    if not isinstance(obj, Mapping):
        raise InputError(source, None, f"expected a dict, got {type(obj).__name__}")
    records = obj.get("records")
    if not _is_list(records) or not records:
        raise InputError(source, "records", "expected a non-empty list of records")
    return list(records)


def _physical_map(obj: Mapping[str, Any], source: str | None) -> np.ndarray:
    """``last_physical_to_logical_map`` ``[hidden layers, P]``, non-negative ids."""
    if "last_physical_to_logical_map" not in obj:
        raise InputError(source, "last_physical_to_logical_map", "required field is missing")
    p2l = to_numpy(obj["last_physical_to_logical_map"], source, "last_physical_to_logical_map")
    if p2l.ndim != 2 or p2l.size == 0 or p2l.min() < 0:
        raise InputError(
            source,
            "last_physical_to_logical_map",
            f"expected non-negative ids [layers, physical slots], got shape {list(p2l.shape)}",
        )
    return p2l


def _one_map(maps: list[tuple[str | None, np.ndarray]]) -> np.ndarray:
    """The map every per-rank file of one recording shares; InputError naming the first that differs."""
    src0, first = maps[0]
    for src, p2l in maps[1:]:
        if p2l.shape != first.shape:
            raise InputError(
                src,
                "last_physical_to_logical_map",
                f"has shape {list(p2l.shape)}, {src0}'s {list(first.shape)}: expected the files of one recording",
            )
        if not np.array_equal(p2l, first):
            raise InputError(
                src,
                "last_physical_to_logical_map",
                f"differs from {src0}'s: the files of one recording share one placement (record with a fixed one)",
            )
    return first


def _record_int(rec: Mapping[str, Any], key: str, source: str | None, where: str) -> int | None:
    """A record's integer field (``forward_pass_id``, ``rank``), None when absent."""
    if key not in rec:
        return None
    try:
        return int(to_numpy(rec[key], source, f"{where}.{key}").reshape(()))
    except ValueError:
        raise InputError(source, f"{where}.{key}", "expected one integer") from None


def _pass_and_rank(
    rec: Mapping[str, Any], i: int, f: int, source: str | None, where: str, seen: dict[tuple[int, int], str | None]
) -> tuple[int, int | None]:
    """A record's ``forward_pass_id`` (its position when absent) and ``rank`` (None when absent);
    InputError when the same rank's pass was read already (a file given twice)."""
    step = _record_int(rec, "forward_pass_id", source, where)
    step = i if step is None else step
    rank = _record_int(rec, "rank", source, where)
    if rank is not None and rank < 0:
        raise InputError(source, f"{where}.rank", f"expected a rank >= 0, got {rank}")
    key = (-1 - f if rank is None else rank, step)  # without a rank, a file stands for its own rank
    if key in seen:
        raise InputError(
            source,
            f"{where}.forward_pass_id",
            f"forward pass {step} of rank {key[0] if rank is not None else '?'} was read already from "
            f"{seen[key] or 'this dump'}: each rank's pass must appear once (a file given twice?)",
        )
    seen[key] = source
    return step, rank


def _label(dumps: Sequence[Dump]) -> str:
    """How a note names the files it speaks of."""
    if len(dumps) == 1:
        return f"{dumps[0][0]}: " if dumps[0][0] else ""
    return f"{dumps[0][0]} and {len(dumps) - 1} more: " if dumps[0][0] else f"{len(dumps)} dumps: "


def _per_token(dumps: Sequence[Dump]) -> tuple[Trace, list[str]]:
    """One trace from the ``per_token`` dumps of one recording (one file per rank), and notes."""
    files = [(src, _records(obj, src), _physical_map(obj, src)) for src, obj in dumps]
    p2l = _one_map([(src, m) for src, _, m in files])
    layers_all, P = p2l.shape
    chunks, steps, homes, origin = [], [], [], []
    width = None
    missing_rank: tuple[str | None, str] | None = None
    seen: dict[tuple[int, int], str | None] = {}
    by_pass: dict[int, list[np.ndarray]] = {}
    for f, (source, records, _) in enumerate(files):
        for i, rec in enumerate(records):
            where = f"records[{i}]"
            if not isinstance(rec, Mapping) or "topk_ids_of_layer" not in rec:
                raise InputError(
                    source,
                    where,
                    "expected a record with 'topk_ids_of_layer' (per_token) or 'global_physical_count' (per_pass)",
                )
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
            pass_id, rank = _pass_and_rank(rec, i, f, source, where, seen)
            if rank is None and missing_rank is None:
                missing_rank = (source, f"{where}.rank")
            chunks.append(np.transpose(ids, (1, 0, 2)))  # [tokens, layers, columns]
            steps.append(np.full(ids.shape[1], pass_id, dtype=np.int64))
            homes.append(np.full(ids.shape[1], -1 if rank is None else rank, dtype=np.int64))
            origin.append(np.full(ids.shape[1], f, dtype=np.int64))
            by_pass.setdefault(pass_id, []).append(ids)
    if missing_rank is not None and len(files) > 1:
        raise InputError(
            missing_rank[0], missing_rank[1], "required to merge per-rank files (the rank is the tokens' home GPU)"
        )
    topk = np.concatenate(chunks)
    step = np.concatenate(steps)
    home = np.concatenate(homes)
    where_from = np.concatenate(origin)  # the file of every token, for errors
    valid = topk >= 0
    moe = valid.any(axis=(0, 2)) if len(topk) else np.zeros(layers_all, dtype=bool)
    if not moe.any():
        raise InputError(files[0][0], "records", "no token was routed to an expert")
    topk, valid = topk[:, moe], valid[:, moe]
    count = valid.sum(axis=2)  # [tokens, MoE layers]: valid ids
    keep = (count > 0).all(axis=1)  # padding tokens have no id at some MoE layer
    if not keep.any():
        raise InputError(files[0][0], "records", "every token has no expert id at some MoE layer (all padding)")
    topk, valid, count, step, home = topk[keep], valid[keep], count[keep], step[keep], home[keep]
    where_from = where_from[keep]
    k = int(count.max())
    if (count != k).any():
        t, l = np.argwhere(count != k)[0]
        raise InputError(
            files[where_from[t]][0],
            "records.topk_ids_of_layer",
            f"token {t} has {count[t, l]} expert ids at MoE layer {l}, others {k}: expected the same top-k "
            f"for every token",
        )
    late = valid[:, :, k:].any(axis=(1, 2))
    if late.any():  # the recorder writes the first k columns; anything else is not its layout
        raise InputError(
            files[where_from[np.argmax(late)]][0], "records.topk_ids_of_layer", f"valid ids after the first {k} columns"
        )
    topk = topk[:, :, :k]
    p2l = p2l[moe]
    logical = p2l[np.arange(len(p2l))[None, :, None], topk]
    E = int(p2l.max()) + 1
    _, step = np.unique(step, return_inverse=True)
    n = len(logical)
    notes = []
    ranks = np.unique(home)
    shared = [group for group in by_pass.values() if len(group) > 1]
    if missing_rank is None and len(ranks) > 1 and shared:
        if all(np.array_equal(group[0], ids) for group in shared for ids in group[1:]):
            notes.append(
                f"note: {_label(dumps)}per_token dumps: ranks {', '.join(map(str, ranks))} recorded the same "
                f"tokens in every forward pass (attention not data-parallel: each rank sees the whole batch), "
                f"so each token is in the trace once per rank; import one rank's file for one copy"
            )
    return (
        Trace(
            topk=logical.astype(np.int16 if E < 2**15 else np.int32),
            family=np.zeros(n, dtype=np.int32),
            step=step.astype(np.int32).reshape(n),
            family_names=("all",),
            num_experts=E,
            home=None if missing_rank is not None else home.astype(np.int32),
        ),
        notes,
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
    record's ``forward_pass_id`` (else its position) is the token's step, and its ``rank``
    (when every record has one) the token's ``home`` GPU. Families are unknown: every token
    is family ``all``. Several ranks' files merge with `read_sglang_dumps`.

    Raises
    ------
    InputError
        On a missing key, a shape mismatch, a physical id outside the map, or tokens with
        different numbers of valid ids.
    """
    return _per_token([(source, obj)])[0]


def _per_pass(dumps: Sequence[Dump], top_k: int | None) -> tuple[Stats, list[str]]:
    """Count-only statistics with one step per forward pass from ``per_pass`` dumps, and notes."""
    files = [(src, _records(obj, src), _physical_map(obj, src)) for src, obj in dumps]
    p2l = _one_map([(src, m) for src, _, m in files])
    L, P = p2l.shape
    E = int(p2l.max()) + 1
    key = (np.arange(L)[:, None] * E + p2l).ravel()  # (layer, logical expert) of every physical slot
    passes: dict[int, np.ndarray] = {}  # forward_pass_id -> logical counts [hidden layers, E], all ranks
    seen: dict[tuple[int, int], str | None] = {}
    for f, (source, records, _) in enumerate(files):
        for i, rec in enumerate(records):
            where = f"records[{i}]"
            if not isinstance(rec, Mapping):
                raise InputError(source, where, f"expected a record (a dict), got {type(rec).__name__}")
            if "global_physical_count" not in rec:
                raise InputError(
                    source,
                    f"{where}.global_physical_count",
                    "required field is missing (a per_pass record holds the pass's tokens per physical slot, "
                    "a per_token record its topk_ids_of_layer)",
                )
            field = f"{where}.global_physical_count"
            count = to_numpy(rec["global_physical_count"], source, field)
            if count.shape != p2l.shape:
                raise InputError(
                    source,
                    field,
                    f"expected [{L} layers, {P} physical slots] like last_physical_to_logical_map, "
                    f"got shape {list(count.shape)}",
                )
            if (count < 0).any():
                raise InputError(source, field, "contains negative counts")
            step, _ = _pass_and_rank(rec, i, f, source, where, seen)
            logical = np.bincount(key, weights=count.ravel(), minlength=L * E).reshape(L, E)
            passes[step] = passes[step] + logical if step in passes else logical
    src0 = files[0][0]
    steps = np.stack([passes[t] for t in sorted(passes)])  # [T, hidden layers, E], in pass order
    moe = steps.sum(axis=(0, 2)) > 0
    if not moe.any():
        raise InputError(src0, "records.global_physical_count", "every count is zero: no token was routed")
    steps = steps[:, moe]
    busy = steps.sum(axis=(1, 2)) > 0
    notes = []
    if not busy.all():
        notes.append(
            f"note: {_label(dumps)}per_pass dump: {int((~busy).sum())} of {len(busy)} forward passes routed no "
            f"token and were dropped"
        )
    steps = steps[busy]
    top_k = check_top_k(top_k, E, src0, "per_pass dumps")
    return stats_from_counts(steps.sum(axis=0), top_k=top_k, step_counts=np.transpose(steps, (1, 0, 2))), notes


def stats_from_sglang_per_pass(obj: Any, *, top_k: int | None, source: str | None = None) -> Stats:
    """Count-only statistics from an SGLang ``per_pass`` recorder dump.

    Each record holds one forward pass's ``global_physical_count`` ``[hidden layers, P]``
    (tokens per *physical* slot); its slots are credited to the logical experts of
    ``last_physical_to_logical_map`` ``[hidden layers, P]`` (the map at dump time: record with
    a fixed placement). Every ``forward_pass_id`` is one step, in id order (records of one pass
    are summed); layers never routed (dense ones) and passes that routed no token are dropped.
    A rank's file counts its own share (the tokens it routed, or with DeepEP low-latency the
    tokens its slots received): `read_sglang_dumps` sums every rank's files per pass.

    Raises
    ------
    InputError
        On a missing field, a count of another shape than the map, negative counts, a pass
        read twice, or no ``top_k`` (the dump does not record it).
    """
    return _per_pass([(source, obj)], top_k)[0]


def ring_time_order(recorded: np.ndarray) -> tuple[np.ndarray, str | None]:
    """The recorded rows of SGLang's ``stat`` ring buffer in time order, and what was done.

    With a ``--expert-distribution-recorder-buffer-size`` of ``R >= 0`` the recorder writes each
    forward pass's counts into row ``i`` of an ``[R, ...]`` ring and moves ``i`` on modulo
    ``R``; starting a recording zeroes the rows but keeps ``i``, and the dump is the raw ring.
    Rows never written are therefore zero, and the written rows form one arc of the ring that
    starts right after the zero gap (and may run past the last row into the first). A ring with
    no zero row was full: where it starts is not recorded, and the rows stay in row order (an
    unbounded buffer, size ``< 0``, has no zero row either and is in row order). When zero rows
    lie in several places (passes that routed no token), the arc starts after the longest run.

    Parameters
    ----------
    recorded
        bool ``[R]``: whether each row holds a count.

    Returns
    -------
    order : numpy.ndarray
        The recorded rows' indices, oldest first.
    note : str or None
        One line saying what was done (None when nothing was: a single recorded row).
    """
    recorded = np.asarray(recorded, dtype=bool)
    R = len(recorded)
    rows = np.flatnonzero(recorded)
    n = len(rows)
    if n == 0:
        raise ValueError("ring_time_order needs a recorded row")
    steps = f"{n} recorded step{'s' if n != 1 else ''}"
    if n == R:
        if R == 1:
            return rows, None
        return rows, (
            f"stat dump: all {R} rows recorded, kept in row order: the time order for an unbounded buffer "
            f"(--expert-distribution-recorder-buffer-size -1), but a full ring's could not be recovered"
        )
    gaps = (np.roll(rows, -1) - rows - 1) % R  # empty rows after each recorded one, round the ring
    longest = int(gaps.max())
    first = (int(np.argmax(gaps)) + 1) % n  # the arc starts at the recorded row after the longest gap
    order = np.roll(rows, -first)
    empty = f"{R - n} empty ring row{'s' if R - n != 1 else ''} dropped"
    runs = int((gaps > 0).sum())
    if runs == 1:
        if first == 0:
            return order, f"stat dump: {empty} ({steps} kept, in time order)"
        return order, (
            f"stat dump: {empty} ({steps} kept, in time order: the ring wrapped, rows {order[0]}-{R - 1} "
            f"before rows 0-{order[-1]})"
        )
    tie = " (several runs as long: the order is a guess)" if int((gaps == longest).sum()) > 1 else ""
    return order, (
        f"stat dump: {empty} ({steps} kept; empty rows in {runs} places, so some passes routed no token: "
        f"time order taken from the longest empty run, oldest step at row {order[0]}{tie})"
    )


def _stat(obj: Any, top_k: int | None, source: str | None) -> tuple[Stats, list[str]]:
    """Count-only statistics from a ``stat`` dump (or a list of them), and at most one note."""
    listed = not isinstance(obj, Mapping)  # a list of dumps: each one step, or its ring's steps
    if isinstance(obj, Mapping) and "logical_count" in obj:
        parts = [(obj["logical_count"], "logical_count")]
    elif _is_list(obj) and obj:
        if not all(isinstance(x, Mapping) and "logical_count" in x for x in obj):
            raise InputError(source, "logical_count", "expected a list of dumps, each with 'logical_count'")
        parts = [(x["logical_count"], f"[{i}].logical_count") for i, x in enumerate(obj)]
    else:
        raise InputError(source, "logical_count", "required field is missing")
    blocks, said = [], []
    shape: tuple[int, ...] | None = None
    for value, field in parts:
        arr = to_numpy(value, source, field, integer=False)
        if arr.ndim not in (2, 3) or arr.shape[-2] == 0 or arr.shape[-1] == 0:
            raise InputError(source, field, f"expected [steps, layers, experts], got shape {list(arr.shape)}")
        if not np.isfinite(arr).all() or (arr < 0).any():
            raise InputError(source, field, "contains negative, NaN or infinite counts")
        if shape is not None and arr.shape[-2:] != shape:
            raise InputError(
                source, field, f"has [layers, experts] {list(arr.shape[-2:])}, the first dump {list(shape)}"
            )
        shape = arr.shape[-2:]
        if arr.ndim == 3:  # SGLang's ring buffer of per-pass counts
            listed = True
            recorded = np.asarray(arr.reshape(len(arr), -1).any(axis=1))
            if not recorded.any():
                raise InputError(source, field, f"no recorded step: all {len(arr)} rows are zero")
            order, note = ring_time_order(recorded)
            arr = arr[order]
            if note:
                said.append(note if len(parts) == 1 else f"{field}: {note}")
        blocks.append(arr if arr.ndim == 3 else arr[None])
    counts = np.concatenate(blocks)  # [steps, hidden layers, E]
    top_k = check_top_k(top_k, counts.shape[2], source, "stat dumps")
    keep = counts.sum(axis=(0, 2)) > 0
    if not keep.any():
        raise InputError(source, "logical_count", "every layer is all zero")
    counts = counts[:, keep]
    steps = np.transpose(counts, (1, 0, 2)) if listed else None
    notes = [f"note: {_label([(source, obj)])}{'; '.join(said)}"] if said else []
    return stats_from_counts(counts.sum(axis=0), top_k=top_k, step_counts=steps), notes


def stats_from_sglang_stat(obj: Any, *, top_k: int | None, source: str | None = None) -> Stats:
    """Count-only statistics from an SGLang ``stat`` (or ``stat_approx``) recorder dump.

    ``logical_count`` is ``[steps, hidden layers, E]`` (or ``[hidden layers, E]``, without
    per-step counts; a list of such dicts is read as one dump, its steps in list order). The
    steps of a ``[steps, ...]`` count are the recorder's ring buffer, read in time order by
    `ring_time_order` (rows never written, all zero, dropped). All-zero layers (dense
    ones: SGLang counts every hidden layer, vLLM only MoE layers) are dropped. The counts keep
    their per-step split as ``step_counts`` ``n[l, t, e]``. `read_sglang_dumps` returns
    the note that says how the ring was read.

    Raises
    ------
    InputError
        On a bad shape, negative counts, a dump with no recorded step, or no ``top_k`` (a stat
        dump does not record it).
    """
    return _stat(obj, top_k, source)[0]


def read_sglang_dumps(dumps: Sequence[Dump], *, top_k: int | None = None) -> tuple[Trace | Stats, list[str]]:
    """A trace or statistics from loaded SGLang recorder dumps, and one-line notes for the user.

    Parameters
    ----------
    dumps
        ``(source, obj)`` pairs, ``obj`` what ``torch.load`` returned. One dump of any mode, or
        several of one recording, all ``per_token`` or all ``per_pass`` (each rank writes its
        own file; the files must share ``last_physical_to_logical_map``): ``per_token`` files
        merge into one trace whose steps are the forward passes of every file and whose token
        ``home`` is the record's ``rank``; ``per_pass`` files are summed per forward pass.
    top_k
        k; required for ``stat`` and ``per_pass`` dumps (``per_token`` dumps carry it).

    Returns
    -------
    workload : Trace or Stats
        See [`trace_from_sglang_per_token`][moeopt.interop.trace_from_sglang_per_token], `stats_from_sglang_per_pass`
        and [`stats_from_sglang_stat`][moeopt.interop.stats_from_sglang_stat].
    notes : list of str
        What the reading did that the user should know (how a ``stat`` ring was ordered,
        passes dropped); empty when nothing.

    Raises
    ------
    InputError
        On a malformed dump (naming the file and the field), several dumps of other modes or
        of mixed modes, or files of one recording that disagree.
    """
    if not dumps:
        raise ValueError("read_sglang_dumps needs at least one dump")
    kinds = []
    for source, obj in dumps:
        try:
            kinds.append(sglang_dump_kind(obj))
        except InputError as exc:
            raise InputError(source, None, exc.message) from None
    if len(dumps) > 1 and (kinds[0] == "stat" or len(set(kinds)) > 1):
        i = next((i for i, k in enumerate(kinds) if k != kinds[0]), 0)
        raise InputError(
            dumps[i][0],
            None,
            f"a {kinds[i]} dump among {len(dumps)}: only per-rank per_token or per_pass files of one recording "
            f"merge (join dumps taken at different times as snapshots)",
        )
    if kinds[0] == "per_token":
        return _per_token(dumps)
    if kinds[0] == "per_pass":
        return _per_pass(dumps, top_k)
    return _stat(dumps[0][1], top_k, dumps[0][0])


def read_sglang_dump(obj: Any, *, top_k: int | None = None, source: str | None = None) -> Trace | Stats:
    """A trace or statistics from a loaded SGLang recorder dump (its notes dropped: see
    `read_sglang_dumps`, which returns them).

    Parameters
    ----------
    obj
        What ``torch.load`` returned.
    top_k
        k; required for ``stat`` and ``per_pass`` dumps (``per_token`` dumps carry it).
    source
        File name for error messages.

    Returns
    -------
    Trace or Stats
        [`trace_from_sglang_per_token`][moeopt.interop.trace_from_sglang_per_token], `stats_from_sglang_per_pass` or
        [`stats_from_sglang_stat`][moeopt.interop.stats_from_sglang_stat] of ``obj``.
    """
    return read_sglang_dumps([(source, obj)], top_k=top_k)[0]
