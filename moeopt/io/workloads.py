"""Workload files: routing traces (npz), expert counts (npz, CSV, NPY, SGLang), per-domain counts."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from moeopt import console, schema
from moeopt.errors import InputError
from moeopt.instance import (
    Model,
)
from moeopt.interop import is_vllm_eplb_state, stats_from_vllm_eplb
from moeopt.interop.sglang import read_sglang_dumps
from moeopt.io.engines import (
    read_engine_dumps,
)
from moeopt.io.files import (
    _array,
    _read_json,
    input_file,
    npz_array,
    open_npy,
    open_npz,
)
from moeopt.outputs import atomic_path
from moeopt.trace import Stats, Trace, stats_from_counts


def _check_shape(w: Trace | Stats, model: Model, src: str) -> Trace | Stats:
    """The workload checked against the model, widened to ``model.experts`` when its highest
    expert ids were never routed (experts inferred from the largest id, or count columns):
    the instance is the truth. Ids at or above ``model.experts`` are an error."""
    layers = w.layers
    experts = w.num_experts if isinstance(w, Trace) else w.experts
    if layers != model.layers:
        raise InputError(src, "layers", f"workload has {layers} layers, model.layers is {model.layers}")
    if isinstance(w, Trace) and w.top_k != model.top_k:
        raise InputError(src, "topk", f"trace has top-{w.top_k} routing, model.top_k is {model.top_k}")
    E = model.experts
    if experts > E:
        if isinstance(w, Trace):
            top = int(w.topk.max()) if w.tokens else -1
            if top >= E:
                raise InputError(src, "topk", f"expert id {top} out of range: model.experts is {E}")
            raise InputError(src, "num_experts", f"trace has {experts} experts, model.experts is {E}")
        raise InputError(src, "counts", f"workload has {experts} experts (columns), model.experts is {E}")
    if experts == E:
        return w
    if isinstance(w, Trace):
        return replace(w, num_experts=E)
    pad = E - experts

    def widen(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        width = [(0, 0)] * a.ndim
        for ax in axes:
            width[ax] = (0, pad)
        return np.pad(a, width)

    return replace(
        w,
        counts=widen(w.counts, (2,)),
        step_counts=None if w.step_counts is None else widen(w.step_counts, (2,)),
        coactivation=None if w.coactivation is None else widen(w.coactivation, (2, 3)),
    )


def fit_workload(w: Trace | Stats, model: Model, src: str) -> Trace | Stats:
    """A workload read outside an instance (e.g. ``evaluate --trace``) checked against the
    model and widened to ``model.experts`` (see `load_workload`)."""
    return _check_shape(w, model, src)


def read_workload_file(
    path: str | Path, *, format: str | None = None, select: str | None = None, top_k: int | None = None
) -> Trace | Stats:
    """Read a trace or a count file, inferring the format from its content when not given.

    ``.pt`` files are engine recordings (`moeopt.io.engines.read_engine_dumps`): an SGLang
    recorder dump of any mode or vLLM EPLB state; SGLang's ``logical_count`` also reads from
    JSON. Notes on what the reading did (a ``stat`` ring put in time order) are shown with
    `moeopt.console.note`.
    """
    path = input_file(path)
    src = str(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        data = open_npz(path)
        keys = set(data.files)
        domains = format == "olmoe-domains" or (format is None and any("/expert_counts/" in k for k in keys))
        if select is not None and not domains:
            raise InputError(
                src,
                "select",
                f"names a model inside a multi-model per-domain count file (keys MODEL/expert_counts/DOMAIN), "
                f"found a file without models; expected no select, got {select!r}",
            )
        if format == "trace" or (format is None and "topk" in keys):
            return read_trace(path)
        if format is None and "counts" not in keys and is_vllm_eplb_state(dict.fromkeys(keys)):
            return stats_from_vllm_eplb({k: npz_array(data, k, src) for k in keys}, top_k=top_k, source=src)
        if domains:
            return _read_domain_counts(data, src, select)
        if format in (None, "counts") and "counts" in keys:
            return _counts_npz(data, src, top_k)
        raise InputError(
            src, None, "expected a trace (key 'topk'), counts (key 'counts'), per-domain counts or vLLM EPLB loads"
        )
    if select is not None:
        raise InputError(
            src,
            "select",
            f"names a model inside a multi-model per-domain count file (.npz, keys MODEL/expert_counts/DOMAIN), "
            f"found a {suffix or 'suffix-less'} file; expected no select, got {select!r}",
        )
    if suffix == ".json":
        data = _read_json(path)
        if isinstance(data, dict) and "logical_count" in data:
            return _noted(read_sglang_dumps([(src, data)], top_k=top_k))
        if isinstance(data, dict) and "counts" in data:
            counts = _array(data["counts"], src, "counts")
            k = data.get("top_k", top_k)
            return count_stats(counts, src, "counts", k, data.get("family_names"))
        raise InputError(src, None, "expected a JSON object with 'counts' or SGLang's 'logical_count'")
    if suffix == ".csv":
        try:
            return count_stats(_read_csv(path), src, "counts", top_k)
        except UnicodeDecodeError as exc:
            raise InputError(src, None, f"expected UTF-8 text, found byte 0x{exc.object[exc.start]:02x}") from None
    if suffix == ".npy":
        return count_stats(open_npy(path), src, "counts", top_k)
    if suffix == ".pt":
        return _noted(read_engine_dumps([path], top_k=top_k))
    raise InputError(src, None, "unknown file type; expected .npz, .json, .csv, .npy or .pt")


def count_stats(arr: np.ndarray, src: str, field: str, top_k: int | None, family_names: Any = None) -> Stats:
    """Count-only statistics from ``[layers, experts]`` or ``[families, layers, experts]`` counts,
    checked: numbers, finite, non-negative, every layer with tokens, ``top_k`` in range."""
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iuf":
        raise InputError(src, field, f"expected numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim not in (2, 3):
        raise InputError(
            src, field, f"expected [layers, experts] or [families, layers, experts], got shape {arr.shape}"
        )
    if not np.isfinite(arr).all():
        raise InputError(src, field, "contains NaN or infinite values")
    if (arr < 0).any():
        raise InputError(src, field, "contains negative counts")
    _check_totals(arr, src, field)
    per_layer = arr.sum(axis=tuple(i for i in range(arr.ndim) if i != arr.ndim - 2)) if arr.size else arr
    if arr.size == 0 or not (per_layer > 0).all():
        raise InputError(src, field, "expected every layer to count some routed tokens, found a layer of zeros")
    if top_k is None:
        raise InputError(src, "top_k", "count files need the model's top_k")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= arr.shape[-1]:
        raise InputError(src, "top_k", f"expected an integer in [1, {arr.shape[-1]}] (experts), found {top_k!r}")
    if family_names is not None and (
        not isinstance(family_names, (list, tuple)) or not all(isinstance(n, str) for n in family_names)
    ):
        raise InputError(src, "family_names", f"expected a list of names, found {family_names!r:.60}")
    names = tuple(family_names) if family_names is not None else None
    if names is not None and (arr.ndim != 3 or len(names) != arr.shape[0]):
        raise InputError(src, "family_names", "needs one name per family (first axis of counts)")
    return stats_from_counts(arr, top_k=top_k, family_names=names)


#: the largest count total accepted: float64 holds every integer up to 2**53 exactly, and loads,
#: their squares (Jain fairness) and sums stay finite far beyond any real token count
MAX_COUNT_TOTAL = float(2**53)


def _check_totals(arr: np.ndarray, src: str, field: str) -> None:
    """Refuse finite, non-negative counts whose total would leave float64's exact range (1e308
    counts sum to inf, and every load, MaxVio and bound derived from them to NaN)."""
    if arr.size == 0:
        return
    peak = float(arr.max())
    with np.errstate(over="ignore"):
        total = float(arr.sum(dtype=np.float64)) if math.isfinite(peak) else math.inf
    if not total <= MAX_COUNT_TOTAL:
        raise InputError(
            src, field, f"expected counts totalling at most 2**53 (about 9.0e15), found a total of {total:.3g}"
        )


def _counts_npz(data: Any, src: str, top_k: int | None) -> Stats:
    counts = npz_array(data, "counts", src)
    names = None
    if "family_names" in data.files:
        fn = npz_array(data, "family_names", src)
        if fn.ndim != 1 or fn.dtype.kind not in "US":
            raise InputError(src, "family_names", f"expected a list of names, found {fn.dtype} {list(fn.shape)}")
        names = [str(x) for x in fn]
    k: Any = npz_array(data, "top_k", src) if "top_k" in data.files else top_k
    if k is not None and (np.shape(k) != () or np.asarray(k).dtype.kind not in "iu"):
        raise InputError(src, "top_k", f"expected an integer, found {np.asarray(k).dtype} {list(np.shape(k))}")
    k = None if k is None else int(k)
    stats = count_stats(counts, src, "counts", k, names)
    if "step_counts" in data.files:
        stats = with_step_counts(stats, npz_array(data, "step_counts", src), src, "step_counts")
    return stats


def with_step_counts(stats: Stats, step_counts: np.ndarray, src: str, field: str) -> Stats:
    """``stats`` with its per-step counts ``[layers, steps, experts]``, checked (numbers, the
    layers and experts of ``stats``, finite, non-negative, totals in float64's exact range)."""
    sc = step_counts
    if sc.dtype.kind not in "iuf":
        raise InputError(src, field, f"expected numbers, got dtype {sc.dtype}")
    sc = sc.astype(np.float64)
    if sc.ndim != 3 or sc.shape[0] != stats.layers or sc.shape[2] != stats.experts:
        raise InputError(src, field, f"expected [layers, steps, experts], got shape {sc.shape}")
    if not np.isfinite(sc).all() or (sc < 0).any():
        raise InputError(src, field, "contains NaN, infinite or negative counts")
    _check_totals(sc, src, field)
    return stats_from_counts(stats.counts, top_k=stats.top_k, family_names=stats.family_names, step_counts=sc)


def _read_csv(path: Path) -> np.ndarray:
    rows = []
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.reader(fh)):
            if not row or row[0].startswith("#"):
                continue
            try:
                rows.append([float(x) for x in row])
            except ValueError:
                if i == 0:
                    continue  # a header line
                raise InputError(str(path), f"line {i + 1}", "expected comma-separated numbers") from None
    if not rows or len({len(r) for r in rows}) != 1:
        raise InputError(str(path), "counts", "expected one row per layer, all rows the same length")
    return np.array(rows)


def _noted(read: tuple[Trace | Stats, list[str]]) -> Trace | Stats:
    """The workload of a reader that returns notes, its notes shown (a workload has no room for them)."""
    workload, notes = read
    for line in notes:
        console.note(line)
    return workload


def _read_domain_counts(data: Any, src: str, select: str | None) -> Stats:
    """The OLMoE-paper per-domain counts: keys ``<model>/expert_counts/<domain>`` [layers, E].

    Families are the domains; ``select`` names the model prefix (olmoe, mistral, ...).
    """
    models = sorted({k.split("/")[0] for k in data.files if "/expert_counts/" in k})
    if not models:
        raise InputError(src, None, "expected per-domain counts (arrays MODEL/expert_counts/DOMAIN), found none")
    if select is None:
        if len(models) != 1:
            raise InputError(src, "select", f"file holds several models; choose one of {', '.join(models)}")
        select = models[0]
    if select not in models:
        raise InputError(src, "select", f"no model {select!r}; the file holds {', '.join(models)}")
    prefix = f"{select}/expert_counts/"
    domains = sorted(k[len(prefix) :] for k in data.files if k.startswith(prefix))
    rows = [npz_array(data, prefix + d, src) for d in domains]
    if len({(r.shape, r.dtype.kind in "iuf") for r in rows}) != 1 or rows[0].dtype.kind not in "iuf":
        shapes = ", ".join(f"{d} {r.dtype} {list(r.shape)}" for d, r in zip(domains, rows, strict=True))
        raise InputError(src, f"{prefix}*", f"expected numeric arrays of one shape [layers, experts], found {shapes}")
    arr = count_stats(np.stack(rows), src, f"{prefix}*", 1, domains).counts  # checked before k is inferred from it
    # each row sums to tokens * k: infer k from the first-rank counts where present
    top1 = f"{select}/expert_counts_top1/{domains[0]}"
    k = None
    if top1 in data.files:
        first = npz_array(data, top1, src)
        if first.dtype.kind not in "iuf" or first.ndim < 1 or first.shape[0] < 1:
            raise InputError(src, top1, f"expected numeric counts [layers, experts], found {first.dtype} {first.shape}")
        ones = float(np.asarray(first[0], dtype=np.float64).sum())
        ratio = float(arr[0, 0].sum()) / ones if ones > 0 and math.isfinite(ones) else math.nan
        if not (math.isfinite(ratio) and ratio >= 0.5):
            raise InputError(src, top1, "expected positive first-choice counts (they give the model's top_k)")
        k = round(ratio)
    return count_stats(arr, src, f"{prefix}*", k, domains)


#: the arrays of a trace file (format in the README); ``topk`` is required
TRACE_KEYS = ("topk", "num_experts", "family", "step", "family_names", "weights", "home")


def read_trace(path: str | Path) -> Trace:
    """Read a routing trace ``.npz`` (format in the README) and validate every array."""
    path = Path(path)
    src = str(path)
    data = open_npz(path)
    return trace_from_arrays({k: npz_array(data, k, src) for k in TRACE_KEYS if k in data.files}, src)


def trace_from_arrays(arrays: dict[str, np.ndarray], src: str) -> Trace:
    """A routing trace from its arrays (the keys of `TRACE_KEYS`), every one validated.

    Parameters
    ----------
    arrays
        ``topk`` (required) and the optional arrays of a trace file, as numpy arrays.
    src
        The file they come from, named in messages ("" for arrays handed over in code: the
        messages then name the array alone).

    Raises
    ------
    InputError
        Naming the array and what was expected.
    """
    if "topk" not in arrays:
        raise InputError(src, "topk", "required array is missing")

    def array(key: str) -> np.ndarray:
        return arrays[key]

    topk = array("topk")
    schema.check_topk(topk, src)
    N = topk.shape[0]
    num_experts = int(topk.max()) + 1
    if "num_experts" in arrays:
        ne = array("num_experts")
        if ne.shape != () or ne.dtype.kind not in "iu" or int(ne) < 1:
            raise InputError(src, "num_experts", f"expected an integer >= 1, found {ne.dtype} {list(ne.shape)}")
        num_experts = int(ne)
    schema.check_topk(topk, src, num_experts)
    # statistics hold [layers, experts, experts] coactivation counts
    schema.check_size(
        f"layers x experts^2 ({topk.shape[1]} x {num_experts}^2)", topk.shape[1] * num_experts**2, src, "num_experts"
    )

    def vector(key: str, default: np.ndarray) -> np.ndarray:
        if key not in arrays:
            return default
        v = array(key)
        if v.dtype.kind not in "iu" or v.shape != (N,):
            raise InputError(src, key, f"expected integers of shape [{N}], got {v.dtype} {v.shape}")
        if v.min() < 0:
            raise InputError(src, key, "contains negative ids")
        return v.astype(np.int32)

    family = vector("family", np.zeros(N, dtype=np.int32))
    step = vector("step", np.zeros(N, dtype=np.int32))
    _, step = np.unique(step, return_inverse=True)
    if "family_names" in arrays:
        fn = array("family_names")
        if fn.ndim != 1 or fn.dtype.kind not in "US":
            raise InputError(src, "family_names", f"expected a list of names, found {fn.dtype} {list(fn.shape)}")
        names = tuple(str(x) for x in fn)
    else:
        names = tuple(f"family{i}" for i in range(int(family.max()) + 1)) if family.max() > 0 else ("all",)
    if family.max() >= len(names):
        raise InputError(src, "family", f"family id {int(family.max())} has no entry in family_names ({len(names)})")
    weights = None
    if "weights" in arrays:
        weights = array("weights")
        if weights.dtype.kind not in "iuf" or weights.shape != topk.shape or not np.isfinite(weights).all():
            raise InputError(src, "weights", f"expected finite floats of shape {topk.shape}")
    home = vector("home", np.zeros(0, dtype=np.int32)) if "home" in arrays else None
    return Trace(
        topk=topk.astype(np.int16 if num_experts < 2**15 else np.int32),
        family=family,
        step=step.astype(np.int32),
        family_names=names,
        num_experts=num_experts,
        weights=weights,
        home=home,
    )


def write_trace(path: str | Path, trace: Trace) -> None:
    """Write a routing trace as ``.npz`` (the format `read_trace` reads), atomically."""
    arrays: dict[str, Any] = {  # np.savez_compressed's **kwds (typed as its keyword options)
        "topk": trace.topk,
        "family": trace.family,
        "step": trace.step,
        "family_names": np.array(trace.family_names),
        "num_experts": np.array(trace.num_experts),
    }
    if trace.weights is not None:
        arrays["weights"] = trace.weights
    if trace.home is not None:
        arrays["home"] = trace.home
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)
