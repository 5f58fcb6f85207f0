"""The only module that reads and writes files: instances (YAML), traces and counts (npz, JSON,
CSV, NPY, SGLang dumps), plans and reports (JSON), latency profiles (YAML).

Every reader validates what it reads and raises :class:`InputError` naming the file, the
field and what was expected; every writer writes atomically (temporary file + rename), so a
failure never leaves a partial file behind.
"""

from __future__ import annotations

import csv
import json
import math
import zipfile
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moeopt import interop, schema
from moeopt.errors import InputError, PlanError
from moeopt.instance import (
    TOKEN_HOMES,
    Cluster,
    ExecutorSpec,
    Instance,
    MethodSpec,
    Model,
    TopologyLevel,
    Workload,
    WorkloadSource,
    default_slots,
)
from moeopt.outputs import atomic_path
from moeopt.plan import Dispatch, Plan
from moeopt.profile import Profile, synthetic_profile
from moeopt.synth import SynthSpec, synthesize
from moeopt.trace import Stats, Trace, stats_from_counts

#: what numpy and zipfile raise for a damaged .npz or .npy file
_NPZ_ERRORS = (OSError, ValueError, EOFError, NotImplementedError, zipfile.BadZipFile, zlib.error)
PLAN_FORMAT = "moeopt.plan/2"
#: The first release's plan files (homes + replicas); still read.
PLAN_FORMAT_V1 = "moeopt.plan/1"
PROFILE_FORMAT = "moeopt.profile/1"
TRACE_FORMATS = ("trace", "counts", "olmoe-domains", "sglang")


# ----------------------------------------------------------------------------- writing
def write_json(path: str | Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_jsonable(data), indent=1) + "\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_graphml(path: str | Path, graph: Any) -> None:
    """A networkx graph as GraphML (``networkx.write_graphml``), written atomically."""
    import networkx as nx

    with atomic_path(path) as tmp:
        nx.write_graphml(graph, tmp)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


# ----------------------------------------------------------------------------- YAML helpers
#: libyaml's safe loader when built (same documents, several times faster), else PyYAML's
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise InputError(str(path), None, "file not found")
    try:
        data = yaml.load(path.read_bytes().decode("utf-8"), Loader=_YAML_LOADER)
    except UnicodeDecodeError as exc:
        raise InputError(
            str(path), None, f"expected UTF-8 text, found byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        ) from None
    except RecursionError:
        raise InputError(str(path), None, "expected YAML nested less deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InputError(str(path), None, f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if schema.nesting(data) > schema.MAX_NESTING:
        raise InputError(str(path), None, f"expected YAML nested at most {schema.MAX_NESTING} levels deep")
    return data


def _mapping(data: Any, src: str, field: str, allowed: set[str] | None = None) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(src, field or None, f"expected a mapping, got {type(data).__name__}")
    if allowed is not None:
        for key in data:
            if key not in allowed:
                raise InputError(
                    src,
                    f"{field}.{key}" if field else str(key),
                    f"unknown field; accepted: {', '.join(sorted(allowed))}",
                )
    return data


def _int(data: dict, key: str, src: str, field: str, default: int | None = None, minimum: int = 1) -> int:
    """``data[key]``, an integer >= ``minimum``; ``default`` when absent (None: required)."""
    if key not in data or data[key] is None:
        if default is None:
            raise InputError(src, f"{field}.{key}", "required field is missing")
        return default
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise InputError(src, f"{field}.{key}", f"expected an integer >= {minimum}, got {v!r}")
    return v


def _choice(data: dict, key: str, src: str, field: str, choices: tuple[str, ...], default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise InputError(src, f"{field}.{key}", f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _bool(data: dict, key: str, src: str, field: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InputError(src, f"{field}.{key}", f"expected true or false, got {value!r}")
    return value


def _float(data: dict, key: str, src: str, field: str, default: float, minimum: float = 0.0) -> float:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < minimum:
        raise InputError(src, f"{field}.{key}", f"expected a number >= {minimum}, got {v!r}")
    return float(v)


# ----------------------------------------------------------------------------- instances
_TOP = {"name", "model", "cluster", "workload", "method", "profile", "description", "executor"}


def load_instance(path: str | Path) -> Instance:
    """Read and validate an instance YAML file (every field is described in the README)."""
    path = Path(path)
    src = str(path)
    data = _mapping(_read_yaml(path), src, "", _TOP)
    checked = schema.validate(schema.InstanceSchema, data, src)
    schema.check_instance_sizes(checked, src)
    m = _mapping(data.get("model"), src, "model", {"layers", "experts", "top_k", "d_model", "d_ff", "dtype"})
    if not m:
        raise InputError(src, "model", "required field is missing")
    model = Model(
        layers=_int(m, "layers", src, "model"),
        experts=_int(m, "experts", src, "model"),
        top_k=_int(m, "top_k", src, "model"),
        d_model=_int(m, "d_model", src, "model", 1024),
        d_ff=_int(m, "d_ff", src, "model", 512),
        dtype=str(m.get("dtype", "bf16")),
    )
    if model.top_k > model.experts:
        raise InputError(src, "model.top_k", f"top_k={model.top_k} exceeds experts={model.experts}")
    c = _mapping(
        data.get("cluster"),
        src,
        "cluster",
        {
            "gpus",
            "gpus_per_node",
            "slots_per_gpu",
            "replica_slots_per_gpu",
            "inter_node_weight",
            "allow_colocated_copies",
            "token_home",
            "topology",
        },
    )
    if not c:
        raise InputError(src, "cluster", "required field is missing")
    gpus = _int(c, "gpus", src, "cluster")
    topology = checked.cluster.topology  # validated by the schema: sizes below the top, weights rising
    tree = None if topology is None else tuple(TopologyLevel(t.size, float(t.weight)) for t in topology.levels)
    gpn = _int(c, "gpus_per_node", src, "cluster", gpus if tree is None or tree[0].size is None else tree[0].size)
    if gpus % gpn:
        raise InputError(src, "cluster.gpus_per_node", f"must divide gpus={gpus}, got {gpn}")
    cluster = Cluster(
        gpus=gpus,
        gpus_per_node=gpn,
        slots_per_gpu=_int(c, "slots_per_gpu", src, "cluster", default_slots(model.experts, gpus)),
        replica_slots_per_gpu=_int(c, "replica_slots_per_gpu", src, "cluster", 0, minimum=0),
        inter_node_weight=_float(c, "inter_node_weight", src, "cluster", 4.0),
        allow_colocated_copies=_bool(c, "allow_colocated_copies", src, "cluster", False),
        token_home=_choice(c, "token_home", src, "cluster", TOKEN_HOMES, "uniform"),
        topology=tree,
    )
    w = _mapping(data.get("workload"), src, "workload", {"calibration", "evaluation", "synthetic"})
    if "calibration" not in w and "synthetic" not in w:
        raise InputError(src, "workload", "needs 'calibration' (a trace or counts file) or 'synthetic'")
    if "calibration" in w and "synthetic" in w:
        raise InputError(src, "workload", "give either 'calibration' or 'synthetic', not both")
    if "synthetic" in w:
        syn = dict(_mapping(w["synthetic"], src, "workload.synthetic"))
        for key, value in (("layers", model.layers), ("experts", model.experts), ("top_k", model.top_k)):
            if syn.setdefault(key, value) != value:
                raise InputError(src, f"workload.synthetic.{key}", f"{syn[key]} disagrees with model.{key}={value}")
        SynthSpec.from_mapping(syn, source=src)
        calibration = WorkloadSource(synthetic=syn)
    else:
        calibration = _source(w["calibration"], path, "workload.calibration")
    evaluation = _source(w["evaluation"], path, "workload.evaluation") if w.get("evaluation") else None
    if evaluation is not None and evaluation.synthetic is not None:
        dims = {"layers": model.layers, "experts": model.experts, "top_k": model.top_k}
        prefix = "workload.evaluation.synthetic"
        for key, value in dims.items():
            if evaluation.synthetic.get(key, value) != value:
                given = evaluation.synthetic[key]
                raise InputError(src, f"{prefix}.{key}", f"{given!r} disagrees with model.{key}={value}")
        SynthSpec.from_mapping({**dims, **evaluation.synthetic}, source=src, field_prefix=prefix)
    meth = _mapping(data.get("method"), src, "method")
    name = meth.get("name", "auto")  # no method: joint on traces, balance on counts
    if not isinstance(name, str):
        raise InputError(src, "method.name", f"expected a method name, got {name!r}")
    method = MethodSpec(name=name, params={k: v for k, v in meth.items() if k != "name"})
    profile = data.get("profile")
    if profile is not None and not isinstance(profile, (str, dict)):
        raise InputError(src, "profile", "expected a mapping {variability, seed, tile} or a profile file path")
    if isinstance(profile, str):
        profile = (path.parent / profile).resolve()
    elif isinstance(profile, dict):
        _mapping(profile, src, "profile", {"variability", "seed", "tile", "alpha", "beta", "max_tiles"})
    return Instance(
        name=str(data.get("name", path.stem)),
        model=model,
        cluster=cluster,
        workload=Workload(calibration=calibration, evaluation=evaluation),
        method=method,
        profile=profile,
        source=path,
        executor=_executor(data.get("executor"), src),
    )


def _executor(value: Any, src: str) -> ExecutorSpec | None:
    """``executor: {workers: N}`` or ``{ray: ADDRESS}`` (``ray: local`` or ``true``: a local Ray)."""
    if value is None:
        return None
    e = _mapping(value, src, "executor", {"workers", "ray"})
    workers = _int(e, "workers", src, "executor", 1)
    ray = e.get("ray")
    if ray is True:
        ray = "local"
    elif ray is False:
        ray = None
    elif ray is not None and not (isinstance(ray, str) and ray.strip()):
        raise InputError(src, "executor.ray", f"expected a cluster address, 'local' or true, got {ray!r}")
    return ExecutorSpec(workers=workers, ray=ray.strip() if isinstance(ray, str) else None)


def _source(value: Any, base: Path, field: str) -> WorkloadSource:
    src = str(base)
    if isinstance(value, str):
        return WorkloadSource(path=(base.parent / value))
    spec = _mapping(value, src, field, {"path", "format", "select", "synthetic"})
    if "synthetic" in spec:
        return WorkloadSource(synthetic=dict(_mapping(spec["synthetic"], src, f"{field}.synthetic")))
    if not isinstance(spec.get("path"), str):
        raise InputError(src, f"{field}.path", "expected a file path")
    fmt = spec.get("format")
    if fmt is not None and fmt not in TRACE_FORMATS:
        raise InputError(src, f"{field}.format", f"expected one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    return WorkloadSource(path=base.parent / spec["path"], format=fmt, select=spec.get("select"))


def load_workload(
    source: WorkloadSource, model: Model, *, seed_offset: int = 0, defaults: dict | None = None
) -> Trace | Stats:
    """A token trace or count-only statistics, checked against the model's shape."""
    if source.synthetic is not None:
        syn = {**(defaults or {}), **source.synthetic}
        syn.setdefault("layers", model.layers)
        syn.setdefault("experts", model.experts)
        syn.setdefault("top_k", model.top_k)
        syn["seed"] = syn.get("seed", 0) + seed_offset
        return synthesize(SynthSpec.from_mapping(syn))
    assert source.path is not None
    result = read_workload_file(source.path, format=source.format, select=source.select, top_k=model.top_k)
    return _check_shape(result, model, str(source.path))


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
    model and widened to ``model.experts`` (see :func:`load_workload`)."""
    return _check_shape(w, model, src)


def read_workload_file(
    path: str | Path, *, format: str | None = None, select: str | None = None, top_k: int | None = None
) -> Trace | Stats:
    """Read a trace or a count file, inferring the format from its content when not given."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise InputError(src, None, "file not found")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            data = np.load(path, allow_pickle=False)
            keys = set(data.files)
        except _NPZ_ERRORS as exc:
            raise InputError(src, None, f"not a readable .npz archive ({exc})") from None
        if format == "trace" or (format is None and "topk" in keys):
            return read_trace(path)
        if format == "olmoe-domains" or (format is None and any("/expert_counts/" in k for k in keys)):
            return _read_domain_counts(data, src, select)
        if format in (None, "counts") and "counts" in keys:
            return _counts_npz(data, src, top_k)
        raise InputError(src, None, "expected a trace (key 'topk'), counts (key 'counts') or per-domain counts")
    if suffix == ".json":
        data = _read_json(path)
        if isinstance(data, dict) and "logical_count" in data:
            return _sglang_counts(np.asarray(_array(data["logical_count"], src, "logical_count")), src, top_k)
        if isinstance(data, dict) and "counts" in data:
            counts = _array(data["counts"], src, "counts")
            k = data.get("top_k", top_k)
            return _counts(counts, src, "counts", k, data.get("family_names"))
        raise InputError(src, None, "expected a JSON object with 'counts' or SGLang's 'logical_count'")
    if suffix == ".csv":
        try:
            return _counts(_read_csv(path), src, "counts", top_k)
        except UnicodeDecodeError as exc:
            raise InputError(src, None, f"expected UTF-8 text, found byte 0x{exc.object[exc.start]:02x}") from None
    if suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except _NPZ_ERRORS as exc:
            raise InputError(src, None, f"not a readable .npy array ({exc})") from None
        return _counts(arr, src, "counts", top_k)
    if suffix == ".pt":
        return _read_sglang_pt(path, top_k)
    raise InputError(src, None, "unknown file type; expected .npz, .json, .csv, .npy or .pt")


def _array(value: Any, src: str, field: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(src, field, "expected a rectangular array of numbers") from None
    return arr


def _counts(arr: np.ndarray, src: str, field: str, top_k: int | None, family_names: Any = None) -> Stats:
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


def _counts_npz(data: Any, src: str, top_k: int | None) -> Stats:
    try:
        counts = data["counts"]
        names = [str(x) for x in data["family_names"]] if "family_names" in data.files else None
        k = data["top_k"] if "top_k" in data.files else top_k
        if k is not None and (np.shape(k) != () or np.asarray(k).dtype.kind not in "iu"):
            raise InputError(src, "top_k", f"expected an integer, found {np.asarray(k).dtype} {list(np.shape(k))}")
        k = None if k is None else int(k)
    except (*_NPZ_ERRORS, TypeError) as exc:  # object arrays need pickle
        raise InputError(src, None, f"expected plain numeric arrays, found one numpy cannot read ({exc})") from None
    stats = _counts(counts, src, "counts", k, names)
    if "step_counts" in data.files:
        sc = np.asarray(data["step_counts"], dtype=np.float64)
        if sc.ndim != 3 or sc.shape[0] != stats.layers or sc.shape[2] != stats.experts:
            raise InputError(src, "step_counts", f"expected [layers, steps, experts], got shape {sc.shape}")
        if not np.isfinite(sc).all() or (sc < 0).any():
            raise InputError(src, "step_counts", "contains NaN, infinite or negative counts")
        stats = stats_from_counts(stats.counts, top_k=stats.top_k, family_names=stats.family_names, step_counts=sc)
    return stats


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


def _sglang_counts(arr: np.ndarray, src: str, top_k: int | None) -> Stats:
    """SGLang ``logical_count`` ``[layers, E]`` (or ``[steps, layers, E]``); dense layers
    (all-zero rows: SGLang counts every hidden layer) are dropped."""
    if arr.ndim == 3:
        steps = arr
        arr = arr.sum(axis=0)
    else:
        steps = None
    if arr.ndim != 2:
        raise InputError(src, "logical_count", f"expected [layers, experts], got shape {arr.shape}")
    keep = arr.sum(axis=1) > 0
    stats = _counts(arr[keep], src, "logical_count", top_k)
    if steps is not None:
        stats = stats_from_counts(stats.counts, top_k=stats.top_k, step_counts=np.transpose(steps[:, keep], (1, 0, 2)))
    return stats


def _read_sglang_pt(path: Path, top_k: int | None) -> Trace | Stats:
    return read_sglang_dump(path, top_k=top_k)


# ----------------------------------------------------------------------------- serving engines
def _torch_load(path: Path, *, trusted: bool = False) -> Any:
    """``torch.load``: tensors and plain containers only unless ``trusted`` (arbitrary pickles
    run code); InputError without torch."""
    try:
        import torch
    except ImportError:
        raise InputError(str(path), None, "reading .pt files needs torch: pip install -e '.[torch]'") from None
    if not path.is_file():
        raise InputError(str(path), None, "file not found")
    try:
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

    ``per_token`` dumps give a :class:`Trace` (physical ids mapped to logical experts),
    ``stat`` dumps count-only :class:`Stats` with per-step counts (``top_k`` required);
    see :mod:`moeopt.interop` for the rules (dense all-zero layers are dropped). Only
    tensors and plain containers are unpickled unless ``trusted``.
    """
    path = Path(path)
    return interop.read_sglang_dump(_torch_load(path, trusted=trusted), top_k=top_k, source=str(path))


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
    dense_layers: int = 0,
) -> list[str]:
    """Write a plan for a serving engine (atomically; layout rules in :mod:`moeopt.interop`).

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
        score-neutral copy can fill (:func:`moeopt.interop.fill_empty_slots`).
    dense_layers
        SGLang only: dense hidden layers to put before the MoE layers.

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
    try:
        if format == "vllm-ascend":
            _, notes = interop.vllm_ascend_layout(plan)
            data: dict[str, Any] = interop.to_vllm_ascend(plan)
        else:
            _, notes = interop.fill_empty_slots(plan, load)
            if format == "sglang":
                data = interop.to_sglang(plan, dense_layers=dense_layers, load=load)
            else:
                data = interop.to_eplb(plan, load=load)
    except PlanError as exc:
        raise InputError(str(path), None, str(exc)) from None
    if suffix == ".pt":
        _torch_save(path, {k: np.asarray(v) for k, v in data.items()})
    elif suffix == ".npz":
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **data)
    else:
        write_text(path, json.dumps(data, separators=(",", ":")) + "\n")
    return notes


def read_engine_plan(
    path: str | Path,
    format: str,
    *,
    gpus: int | None = None,
    experts: int | None = None,
    dense_layers: int = 0,
    dispatch: str | None = None,
) -> Plan:
    """Read a serving-engine plan file into a plan, slot for slot (nothing merged).

    Parameters
    ----------
    path
        A file written by :func:`write_engine_plan` or by the engine's own tools.
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
        The plan's dispatch kind (default: the engine's, :data:`moeopt.interop.ENGINE_DISPATCH`).

    Raises
    ------
    InputError
        On a missing or malformed file (see :mod:`moeopt.interop`).
    """
    path = Path(path)
    src = str(path)
    suffix = path.suffix.lower()
    if format not in interop.ENGINE_FORMATS:
        raise InputError(None, "format", f"expected one of {', '.join(interop.ENGINE_FORMATS)}, got {format!r}")
    try:
        kind = Dispatch(kind=dispatch or interop.ENGINE_DISPATCH[format])
    except PlanError as exc:
        raise InputError(None, "dispatch", str(exc)) from None
    if suffix == ".pt":
        data: Any = _torch_load(path)
    elif not path.is_file():
        raise InputError(src, None, "file not found")
    elif suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except _NPZ_ERRORS as exc:
            raise InputError(src, None, f"not a readable .npz archive ({exc})") from None
    else:
        data = _read_json(path)
    if format == "sglang":
        if gpus is None:
            raise InputError(src, "gpus", "SGLang maps do not record the GPU count; give it (--gpus or --instance)")
        return interop.from_sglang(data, gpus, experts=experts, dense_layers=dense_layers, dispatch=kind, source=src)
    if format == "eplb":
        return interop.from_eplb(data, gpus, experts=experts, dispatch=kind, source=src)
    plan = interop.from_vllm_ascend(data, experts=experts, dispatch=kind, source=src)
    if gpus is not None and gpus != plan.gpus:
        raise InputError(src, "device_count", f"the map has {plan.gpus} devices, expected {gpus}")
    return plan


def _read_domain_counts(data: Any, src: str, select: str | None) -> Stats:
    """The OLMoE-paper per-domain counts: keys ``<model>/expert_counts/<domain>`` [layers, E].

    Families are the domains; ``select`` names the model prefix (olmoe, mistral, ...).
    """
    models = sorted({k.split("/")[0] for k in data.files if "/expert_counts/" in k})
    if select is None:
        if len(models) != 1:
            raise InputError(src, "select", f"file holds several models; choose one of {', '.join(models)}")
        select = models[0]
    if select not in models:
        raise InputError(src, "select", f"no model {select!r}; the file holds {', '.join(models)}")
    prefix = f"{select}/expert_counts/"
    domains = sorted(k[len(prefix) :] for k in data.files if k.startswith(prefix))
    arr = np.stack([data[prefix + d] for d in domains])
    # each row sums to tokens * k: infer k from the first-rank counts where present
    top1 = f"{select}/expert_counts_top1/{domains[0]}"
    k = round(float(arr[0, 0].sum()) / float(data[top1][0].sum())) if top1 in data.files else None
    return _counts(arr, src, f"{prefix}*", k, domains)


def read_trace(path: str | Path) -> Trace:
    """Read a routing trace ``.npz`` (format in the README) and validate every array."""
    path = Path(path)
    src = str(path)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(src, None, "file not found") from None
    except _NPZ_ERRORS as exc:
        raise InputError(src, None, f"not a readable .npz archive ({exc})") from None
    for key in ("topk",):
        if key not in data.files:
            raise InputError(src, key, "required array is missing")

    def array(key: str) -> np.ndarray:
        try:
            return np.asarray(data[key])
        except _NPZ_ERRORS as exc:  # object arrays need pickle
            raise InputError(src, key, f"expected a plain numeric array, found one numpy cannot read ({exc})") from None

    topk = array("topk")
    schema.check_topk(topk, src)
    N = topk.shape[0]
    num_experts = int(topk.max()) + 1
    if "num_experts" in data.files:
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
        if key not in data.files:
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
    if "family_names" in data.files:
        fn = array("family_names")
        if fn.ndim != 1 or fn.dtype.kind not in "US":
            raise InputError(src, "family_names", f"expected a list of names, found {fn.dtype} {list(fn.shape)}")
        names = tuple(str(x) for x in fn)
    else:
        names = tuple(f"family{i}" for i in range(int(family.max()) + 1)) if family.max() > 0 else ("all",)
    if family.max() >= len(names):
        raise InputError(src, "family", f"family id {int(family.max())} has no entry in family_names ({len(names)})")
    weights = None
    if "weights" in data.files:
        weights = array("weights")
        if weights.dtype.kind not in "iuf" or weights.shape != topk.shape or not np.isfinite(weights).all():
            raise InputError(src, "weights", f"expected finite floats of shape {topk.shape}")
    home = vector("home", np.zeros(0, dtype=np.int32)) if "home" in data.files else None
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


# ----------------------------------------------------------------------------- plans
def plan_to_json(plan: Plan, method: str = "", params: dict | None = None) -> dict:
    """The ``moeopt.plan/2`` JSON object of a plan."""
    return {
        "format": PLAN_FORMAT,
        "gpus": plan.gpus,
        "layers": plan.layers,
        "experts": plan.experts,
        "slots_per_gpu": plan.width,
        "slots": plan.slots.tolist(),
        "dispatch": plan.dispatch.to_json(),
        "method": method,
        "params": params or {},
    }


def write_plan(path: str | Path, plan: Plan, method: str = "", params: dict | None = None) -> None:
    write_json(path, plan_to_json(plan, method, params))


@dataclass(frozen=True)
class PlanFile:
    """A plan read from a file, with the method and parameters that wrote it."""

    plan: Plan
    method: str = ""
    params: dict = field(default_factory=dict)


def read_plan(path: str | Path) -> Plan:
    """Read a ``moeopt.plan/2`` (or first-release ``moeopt.plan/1``) JSON file."""
    return read_plan_file(path).plan


def read_plan_file(path: str | Path) -> PlanFile:
    """Read a plan file with its ``method`` and ``params`` (see :func:`read_plan`)."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise InputError(src, None, "file not found")
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("format") not in (PLAN_FORMAT, PLAN_FORMAT_V1):
        raise InputError(src, "format", f"expected {PLAN_FORMAT!r} (or {PLAN_FORMAT_V1!r})")
    schema.check_plan(data, src)
    for key in ("gpus", "layers", "experts"):
        if key not in data:
            raise InputError(src, key, "required field is missing")
        if isinstance(data[key], bool) or not isinstance(data[key], int) or data[key] < 1:
            raise InputError(src, key, f"expected an integer >= 1, got {data[key]!r}")
    G, L, E = data["gpus"], data["layers"], data["experts"]
    method = data.get("method", "")
    params = data.get("params") or {}
    if not isinstance(method, str):
        raise InputError(src, "method", f"expected a method name, got {method!r}")
    if not isinstance(params, dict):
        raise InputError(src, "params", f"expected a mapping, got {params!r}")
    try:
        if data["format"] == PLAN_FORMAT_V1:
            plan = _plan_v1(data, src, G, L, E)
        else:
            if "slots" not in data:
                raise InputError(src, "slots", "required field is missing")
            slots = _int_array(data["slots"], src, "slots", "[layers][gpus][slots] integer expert ids")
            if slots.ndim != 3 or slots.shape[:2] != (L, G):
                raise InputError(src, "slots", f"expected shape [{L}, {G}, slots], got {list(slots.shape)}")
            plan = Plan(slots=slots, experts=E, dispatch=Dispatch.from_json(data.get("dispatch", "even")))
    except PlanError as exc:
        raise InputError(src, None, str(exc)) from None
    return PlanFile(plan, method, params)


def _read_json(path: Path) -> Any:
    """A JSON file's content, or one :class:`InputError` line (bad UTF-8, syntax, nesting)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        if schema.nesting(data) > schema.MAX_NESTING:
            raise RecursionError
        return data
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(str(path), None, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InputError(str(path), None, "not valid JSON: expected less deeply nested arrays") from None


def _int_array(value: Any, src: str, field: str, expected: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise InputError(src, field, f"expected {expected}") from None
    if arr.dtype == object or (arr.size and arr.dtype.kind not in "iu"):
        raise InputError(src, field, f"expected {expected}")
    return arr.astype(np.int64)


def _plan_v1(data: dict, src: str, G: int, L: int, E: int) -> Plan:
    """A ``moeopt.plan/1`` file: ``placement [L][E]`` homes and ``replicas`` (expert, gpu) rows.
    Its replicas were dispatched by the online guard: the plan keeps that rule (``locality``)."""
    if "placement" not in data:
        raise InputError(src, "placement", "required field is missing")
    home = _int_array(data["placement"], src, "placement", "[layers][experts] integer GPU ids")
    if home.shape != (L, E):
        raise InputError(src, "placement", f"expected shape [{L}, {E}], got {list(home.shape)}")
    if home.size and (home.min() < 0 or home.max() >= G):
        raise InputError(src, "placement", f"GPU ids must lie in [0, {G - 1}]")
    reps = []
    for l, r in enumerate(data.get("replicas") or [[] for _ in range(L)]):
        arr = _int_array(r, src, f"replicas[{l}]", "a list of [expert, gpu] pairs")
        if arr.size % 2:
            raise InputError(src, f"replicas[{l}]", "expected a list of [expert, gpu] pairs")
        reps.append(arr.reshape(-1, 2))
    dispatch = Dispatch(kind="locality") if any(len(r) for r in reps) else Dispatch()
    return Plan.from_homes(home, tuple(reps), gpus=G, dispatch=dispatch)


# ----------------------------------------------------------------------------- profiles
def read_profile(path: str | Path) -> Profile:
    """Read a latency profile YAML (``moeopt.profile/1``: tile, and per GPU its latencies)."""
    path = Path(path)
    src = str(path)
    data = _mapping(_read_yaml(path), src, "", {"format", "tile", "unit", "gpus", "meta"})
    schema.validate(schema.ProfileFileSchema, data, src)
    tile = _int(data, "tile", src, "profile")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise InputError(src, "gpus", "expected a list of GPUs, each with 'latency' at tile boundaries")
    rows, names = [], []
    for i, g in enumerate(gpus):
        g = _mapping(g, src, f"gpus[{i}]", {"name", "latency", "speed"})
        lat = g.get("latency")
        if not isinstance(lat, list) or len(lat) < 2:
            raise InputError(src, f"gpus[{i}].latency", "expected a list of at least two latencies")
        rows.append(_array(lat, src, f"gpus[{i}].latency"))
        names.append(str(g.get("name", f"gpu{i}")))
    if len({len(r) for r in rows}) != 1:
        raise InputError(src, "gpus[].latency", "every GPU needs the same number of tile boundaries")
    try:
        return Profile(tile=tile, latency=np.stack(rows), names=tuple(names), meta=dict(data.get("meta") or {}))
    except InputError as exc:
        raise InputError(src, exc.field, exc.message) from None


def write_profile(path: str | Path, profile: Profile) -> None:
    data = {
        "format": PROFILE_FORMAT,
        "tile": profile.tile,
        "unit": "ms",
        "gpus": [
            {
                "name": profile.names[g] if profile.names else f"gpu{g}",
                "latency": [round(float(x), 6) for x in profile.latency[g]],
            }
            for g in range(profile.gpus)
        ],
        "meta": _jsonable(profile.meta),
    }
    write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


def resolve_profile(instance: Instance) -> Profile | None:
    """The instance's latency profile: synthetic spec, file, or None.

    A profile of one GPU on a cluster of ``G > 1`` GPUs is broadcast to ``G`` identical GPUs
    (:meth:`moeopt.profile.Profile.broadcast`; its ``meta['note']`` says so); any other GPU
    count that differs from ``cluster.gpus`` is an :class:`InputError`.
    """
    spec = instance.profile
    src = str(instance.source) if instance.source else None
    if spec is None:
        return None
    if isinstance(spec, (str, Path)):
        profile = read_profile(spec)
    else:
        try:
            profile = synthetic_profile(
                instance.cluster.gpus,
                variability=spec.get("variability", "medium"),
                seed=int(spec.get("seed", 0)),
                tile=int(spec.get("tile", 64)),
                alpha=float(spec.get("alpha", 0.05)),
                beta=float(spec.get("beta", 0.10)),
                max_tiles=int(spec.get("max_tiles", 64)),
            )
        except InputError as exc:
            raise InputError(src, exc.field, exc.message) from None
        except (TypeError, ValueError) as exc:  # e.g. seed: abc, tile: 0
            raise InputError(src, "profile", f"invalid synthetic profile {spec}: {exc}") from None
    if profile.gpus == 1 and instance.cluster.gpus > 1:
        # one measured GPU stands for a cluster of identical GPUs (the cluster model has no GPU types)
        return profile.broadcast(instance.cluster.gpus)
    if profile.gpus != instance.cluster.gpus:
        raise InputError(src, "profile", f"profile has {profile.gpus} GPUs, cluster.gpus is {instance.cluster.gpus}")
    return profile
