"""Instance YAML files, the workloads and the latency profile they name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moeopt import schema
from moeopt.errors import InputError
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
from moeopt.io.files import (
    TRACE_FORMATS,
    _bool,
    _choice,
    _float,
    _int,
    _mapping,
    _read_yaml,
)
from moeopt.io.profiles import read_profile
from moeopt.io.workloads import (
    _check_shape,
    read_workload_file,
)
from moeopt.outputs import note_input
from moeopt.profile import Profile, synthetic_profile
from moeopt.synth import SynthSpec, synthesize
from moeopt.trace import Stats, Trace

_TOP = {"name", "model", "cluster", "workload", "method", "profile", "description", "executor"}


def load_instance(path: str | Path) -> Instance:
    """Read and validate an instance YAML file (every field is described in the README)."""
    path = Path(path)
    data = _read_yaml(path, "the instance")
    if isinstance(data, dict):
        for named, what in named_files(data, path):  # inputs too: never overwritten by an output
            note_input(named, what)
    return instance_from_mapping(data, source=path)


def instance_from_mapping(
    data: Any,
    *,
    source: Path | None = None,
    base: Path | None = None,
    calibration: WorkloadSource | None = None,
    evaluation: WorkloadSource | None = None,
) -> Instance:
    """An instance from the content of an instance file (the YAML schema as a mapping).

    Parameters
    ----------
    data
        The mapping, validated by the same schema as an instance file, with the same messages.
    source
        The file it was read from (named in messages; relative paths start at its folder), or
        None for a mapping built in code (messages name the field alone).
    base
        Without ``source``: the folder relative workload and profile paths start at (default:
        the working directory).
    calibration, evaluation
        Workloads held in memory (a `WorkloadSource` with ``data``): they replace the
        mapping's ``workload``, which must then be absent.

    Raises
    ------
    InputError
        Naming the field and what was expected (and the file, when there is one).
    """
    src = str(source) if source is not None else ""
    folder = source.parent if source is not None else (base if base is not None else Path("."))
    data = _mapping(data, src, "", _TOP)
    if calibration is not None:
        if "workload" in data:
            raise InputError(src, "workload", "expected no workload mapping beside a workload given in memory")
        data = {**data, "workload": {"calibration": "in-memory"}}  # the schema checks the rest
    checked = schema.validate(schema.InstanceSchema, data, src)
    schema.check_instance_sizes(checked, src)
    model_keys = {
        "layers",
        "experts",
        "top_k",
        "d_model",
        "d_ff",
        "dtype",
        "expert_groups",
        "dense_layers",
        "expert_bytes",
    }
    m = _mapping(data.get("model"), src, "model", model_keys)
    if not m:
        raise InputError(src, "model", "required field is missing")
    model = Model(
        layers=_int(m, "layers", src, "model"),
        experts=_int(m, "experts", src, "model"),
        top_k=_int(m, "top_k", src, "model"),
        d_model=_int(m, "d_model", src, "model", 1024),
        d_ff=_int(m, "d_ff", src, "model", 512),
        dtype=str(m.get("dtype", "bf16")),
        expert_groups=None if m.get("expert_groups") is None else _int(m, "expert_groups", src, "model"),
        dense_layers=None if m.get("dense_layers") is None else _int(m, "dense_layers", src, "model", minimum=0),
        expert_bytes=None if m.get("expert_bytes") is None else _int(m, "expert_bytes", src, "model"),
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
            "engine",
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
        engine=checked.cluster.engine,
    )
    w = _mapping(data.get("workload"), src, "workload", {"calibration", "evaluation", "synthetic"})
    if calibration is not None:
        w = {}  # held in memory
    elif "calibration" not in w and "synthetic" not in w:
        raise InputError(src, "workload", "needs 'calibration' (a trace or counts file) or 'synthetic'")
    if "calibration" in w and "synthetic" in w:
        raise InputError(src, "workload", "give either 'calibration' or 'synthetic', not both")
    if calibration is not None:
        pass
    elif "synthetic" in w:
        syn = dict(_mapping(w["synthetic"], src, "workload.synthetic"))
        for key, value in (("layers", model.layers), ("experts", model.experts), ("top_k", model.top_k)):
            if syn.setdefault(key, value) != value:
                raise InputError(src, f"workload.synthetic.{key}", f"{syn[key]} disagrees with model.{key}={value}")
        SynthSpec.from_mapping(syn, source=src)
        calibration = WorkloadSource(synthetic=syn)
    else:
        calibration = _source(w["calibration"], folder, src, "workload.calibration")
    if w.get("evaluation"):
        evaluation = _source(w["evaluation"], folder, src, "workload.evaluation")
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
        profile = (folder / profile).resolve()
    elif isinstance(profile, dict):
        _mapping(profile, src, "profile", {"variability", "seed", "tile", "alpha", "beta", "max_tiles"})
    return Instance(
        name=str(data.get("name") or (source.stem if source is not None else "instance")),
        model=model,
        cluster=cluster,
        workload=Workload(calibration=calibration, evaluation=evaluation),
        method=method,
        profile=profile,
        source=source,
        executor=_executor(data.get("executor"), src),
    )


def named_files(data: Any, path: Path) -> list[tuple[Path, str]]:
    """The files an instance's content ``data`` names (its workloads and latency profile),
    resolved against the instance file ``path``, each with what it is (for messages)."""
    out: list[tuple[Path, str]] = []
    workload = data.get("workload") if isinstance(data, dict) else None
    for key in ("calibration", "evaluation"):
        value = workload.get(key) if isinstance(workload, dict) else None
        if isinstance(value, dict):
            value = value.get("path")
        if isinstance(value, str) and value:
            out.append((path.parent / value, f"workload.{key} of {path}"))
    profile = data.get("profile") if isinstance(data, dict) else None
    if isinstance(profile, str) and profile:
        out.append((path.parent / profile, f"profile of {path}"))
    return out


def instance_inputs(path: str | Path) -> list[tuple[Path, str]]:
    """The instance file and the files it names (`named_files`), each with what it is;
    only the instance when its YAML cannot be read (reading it again says why)."""
    path = Path(path)
    out = [(path, "the instance")]
    try:
        return out + named_files(_read_yaml(path), path)
    except InputError:
        return out


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


def _source(value: Any, folder: Path, src: str, field: str) -> WorkloadSource:
    if isinstance(value, str):
        return WorkloadSource(path=(folder / value))
    spec = _mapping(value, src, field, {"path", "format", "select", "synthetic"})
    if "synthetic" in spec:
        return WorkloadSource(synthetic=dict(_mapping(spec["synthetic"], src, f"{field}.synthetic")))
    if not isinstance(spec.get("path"), str):
        raise InputError(src, f"{field}.path", "expected a file path")
    fmt = spec.get("format")
    if fmt is not None and fmt not in TRACE_FORMATS:
        raise InputError(src, f"{field}.format", f"expected one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    return WorkloadSource(path=folder / spec["path"], format=fmt, select=spec.get("select"))


def load_workload(
    source: WorkloadSource, model: Model, *, seed_offset: int = 0, defaults: dict | None = None
) -> Trace | Stats:
    """A token trace or count-only statistics, checked against the model's shape: read from its
    file, drawn from its synthetic spec, or the one the source holds in memory."""
    if source.synthetic is not None:
        syn = {**(defaults or {}), **source.synthetic}
        syn.setdefault("layers", model.layers)
        syn.setdefault("experts", model.experts)
        syn.setdefault("top_k", model.top_k)
        syn["seed"] = syn.get("seed", 0) + seed_offset
        return synthesize(SynthSpec.from_mapping(syn))
    if source.data is not None:  # held in memory (Instance.from_counts, from_trace, ...)
        return _check_shape(source.data, model, "")
    assert source.path is not None
    result = read_workload_file(source.path, format=source.format, select=source.select, top_k=model.top_k)
    return _check_shape(result, model, str(source.path))


def resolve_profile(instance: Instance) -> Profile | None:
    """The instance's latency profile: synthetic spec, file, or None.

    A profile of one GPU on a cluster of ``G > 1`` GPUs is broadcast to ``G`` identical GPUs
    ([`moeopt.profile.Profile.broadcast`][]; its ``meta['note']`` says so); any other GPU
    count that differs from ``cluster.gpus`` is an `InputError`.
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
