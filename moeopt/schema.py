"""Validated schemas of everything moeopt reads: instances, synthetic specs, profiles, plans,
traces and method parameters.

Pydantic v2 models in strict mode (no ``"3"`` -> 3 or ``3.9`` -> 3 coercion, finite floats
only, unknown fields refused) check the structure; `input_error` turns the first
`pydantic.ValidationError` into one `InputError` line ``file: field: expected
..., found ...``. Sizes (``G x W`` slots, ``L x E x E`` coactivation, tokens x experts) are
checked against `MEMORY_BUDGET` before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from moeopt.errors import InputError

#: Bytes any one array derived from an input may take (``MOEOPT_MEMORY_BUDGET`` overrides it).
MEMORY_BUDGET = 8 * 2**30


def memory_budget() -> int:
    """`MEMORY_BUDGET`, or the positive integer number of bytes ``MOEOPT_MEMORY_BUDGET`` gives."""
    text = os.environ.get("MOEOPT_MEMORY_BUDGET")
    if text is None:
        return MEMORY_BUDGET
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(None, "MOEOPT_MEMORY_BUDGET", f"expected a positive integer number of bytes, found {text!r}")
    return value


PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
PosFloat = Annotated[float, Field(gt=0.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
TOKEN_HOMES = ("uniform", "trace", "previous-layer")
TRACE_FORMATS = ("trace", "counts", "olmoe-domains", "sglang")
VARIABILITY_LEVELS = ("none", "low", "medium", "high")


class Strict(BaseModel):
    """Strict, closed, finite: the base of every input schema."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


#: deepest nesting of lists and mappings accepted in YAML and JSON inputs
MAX_NESTING = 32


def nesting(data: Any) -> int:
    """Depth of nested lists, tuples and dicts in ``data`` (iterative: no recursion limit);
    stops counting past `MAX_NESTING`."""
    depth, level = 0, [data]
    while level and depth <= MAX_NESTING:
        nxt: list = []
        for x in level:
            if isinstance(x, dict):
                nxt.extend(x.values())
            elif isinstance(x, (list, tuple)):
                nxt.extend(x)
        if nxt or any(isinstance(x, (dict, list, tuple)) for x in level):
            depth += 1
        level = nxt
    return depth


# ----------------------------------------------------------------------------- errors
def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check_size(what: str, elements: int, source: str | None, field: str | None, itemsize: int = 8) -> None:
    """Raise `InputError` when an array of ``elements`` items would exceed the budget."""
    nbytes = int(elements) * itemsize
    budget = memory_budget()
    if nbytes > budget:
        raise InputError(
            source,
            field,
            f"expected sizes within the memory budget of {_human_bytes(budget)}, found {what} = "
            f"{int(elements):,} entries ({_human_bytes(nbytes)}; MOEOPT_MEMORY_BUDGET sets the budget)",
        )


def _found(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _accepted(model: Any, loc: tuple) -> list[str] | None:
    """The fields accepted where ``loc`` points (for 'unknown field' messages)."""
    for part in loc[:-1]:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        f = model.model_fields.get(part) if isinstance(part, str) else None
        if f is None:
            return None
        options = typing.get_args(f.annotation) or (f.annotation,)
        model = next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return None


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping",
    "none_required": "nothing (null)",
}


def _expected(err: ErrorDetails) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind == "greater_than_equal":
        return f"a value >= {ctx.get('ge')}"
    if kind == "greater_than":
        return f"a value > {ctx.get('gt')}"
    if kind == "less_than_equal":
        return f"a value <= {ctx.get('le')}"
    if kind == "less_than":
        return f"a value < {ctx.get('lt')}"
    if kind == "literal_error":
        return f"one of {ctx.get('expected')}"
    if kind == "too_short":
        return f"at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"at most {ctx.get('max_length')} item(s)"
    return err["msg"][0].lower() + err["msg"][1:]


def _is_branch_tag(part: Any) -> bool:
    """A loc part naming a union branch or validator rather than a field (fields are lower-case
    identifiers; list indices are ints)."""
    if not isinstance(part, str):
        return False
    return (
        not part.isidentifier() or part[:1].isupper() or part in ("str", "int", "float", "bool", "list", "dict", "none")
    )


def input_error(
    exc: ValidationError, source: str | None, prefix: str = "", model: Any = None, option: bool = False
) -> InputError:
    """The first error of ``exc`` as one `InputError`: ``field: expected ..., found ...``.

    ``prefix`` is prepended to the dotted field; ``option`` renders a top-level field as a
    command-line option (``tokens`` -> ``--tokens``).
    """
    errors = exc.errors(include_url=False)
    # a union reports every branch: the error of the branch that took the value's type says most
    # (other errors of the same field only: the first field in error is the one reported); failing
    # that, the deepest error: the branch that took the value's container type
    same = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]]
    err = min(same, key=lambda e: (e["type"].endswith("_type") or e["type"] == "literal_error", -len(e["loc"])))
    loc = tuple(err["loc"])
    # union branches appear as extra loc parts ('str', 'constrained-str', 'ProfileSpecSchema', ...)
    keep_last = err["type"] == "extra_forbidden"  # the user's own key
    loc = tuple(p for i, p in enumerate(loc) if not _is_branch_tag(p) or (keep_last and i == len(loc) - 1))
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int) and parts:
            parts[-1] += f"[{p}]"
        else:
            parts.append(str(p))
    field = ".".join(parts)
    if option and field:
        field = "--" + field.replace("_", "-")
    elif prefix:
        field = f"{prefix}.{field}" if field else prefix
    kind = err["type"]
    if kind == "missing":
        return InputError(source, field or None, "required field is missing")
    if kind == "extra_forbidden":
        accepted = _accepted(model, tuple(p for p in err["loc"][:-1] if not _is_branch_tag(p)) + (None,))
        tail = f"; accepted: {', '.join(accepted)}" if accepted else ""
        return InputError(source, field or None, f"unknown field{tail}")
    if kind == "value_error":
        msg = err["msg"].removeprefix("Value error, ")
        named = re.match(r"([A-Za-z_][\w.\[\]]*): (.*)", msg)
        if named:  # a cross-field check names its field in front of the message
            name, msg = named.groups()
            if option:
                name = "--" + name.replace("_", "-")
            field = f"{field}.{name}" if field and not option else name
        return InputError(source, field or None, msg)
    return InputError(source, field or None, f"expected {_expected(err)}, found {_found(err.get('input'))}")


def validate(model: type[BaseModel], data: Any, source: str | None, prefix: str = "") -> Any:
    """``model.model_validate(data)`` with errors as one `InputError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, source, prefix, model) from None


# ----------------------------------------------------------------------------- instances
class ModelSchema(Strict):
    layers: PosInt
    experts: PosInt
    top_k: PosInt
    d_model: PosInt = 1024
    d_ff: PosInt = 512
    dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] = "bf16"
    expert_groups: PosInt | None = None
    dense_layers: NonNegInt | None = None
    expert_bytes: PosInt | None = None

    @model_validator(mode="after")
    def _shape(self) -> ModelSchema:
        if self.top_k > self.experts:
            raise ValueError(f"top_k: expected at most experts={self.experts}, found {self.top_k}")
        if self.expert_groups is not None and self.experts % self.expert_groups:
            raise ValueError(
                f"expert_groups: expected a divisor of experts={self.experts} (groups of consecutive "
                f"expert ids, like DeepSeek-V3's n_group = 8), found {self.expert_groups}"
            )
        return self


class TopologyLevelSchema(Strict):
    """One level of ``cluster.topology.levels``: members per switch (absent at the top), hop cost."""

    size: PosInt | None = None
    weight: NonNegFloat


class TopologySchema(Strict):
    """A switch tree, levels from the GPUs up (see `moeopt.topology`)."""

    levels: Annotated[list[TopologyLevelSchema], Field(min_length=2)]

    @model_validator(mode="after")
    def _tree(self) -> TopologySchema:
        top = len(self.levels) - 1
        for i, level in enumerate(self.levels):
            if i < top and level.size is None:
                raise ValueError(f"levels[{i}].size: required below the top level")
            if i == top and level.size is not None:
                raise ValueError(f"levels[{i}].size: expected none at the top level (it joins everything)")
            if i and level.weight < self.levels[i - 1].weight:
                raise ValueError(
                    f"levels[{i}].weight: expected at least levels[{i - 1}].weight={self.levels[i - 1].weight}, "
                    f"found {level.weight}"
                )
        return self


class ClusterSchema(Strict):
    gpus: PosInt
    gpus_per_node: PosInt | None = None
    slots_per_gpu: PosInt | None = None
    replica_slots_per_gpu: NonNegInt = 0
    inter_node_weight: NonNegFloat = 4.0
    allow_colocated_copies: bool = False
    token_home: Literal["uniform", "trace", "previous-layer"] = "uniform"
    topology: TopologySchema | None = None
    engine: Literal["sglang", "sglang-static", "sglang-lp", "vllm", "vllm-ascend"] | None = None

    @model_validator(mode="after")
    def _topology(self) -> ClusterSchema:
        if self.topology is None:
            return self
        if "inter_node_weight" in self.model_fields_set:
            raise ValueError("inter_node_weight: expected either inter_node_weight or topology, found both")
        sizes = [level.size or 1 for level in self.topology.levels[:-1]]
        if self.gpus_per_node is not None and self.gpus_per_node != sizes[0]:
            raise ValueError(f"gpus_per_node: expected topology.levels[0].size={sizes[0]}, found {self.gpus_per_node}")
        span = math.prod(sizes)
        if self.gpus % span:
            raise ValueError(f"topology.levels: expected sizes whose product divides gpus={self.gpus}, found {span}")
        return self


FilePath = Annotated[str, Field(min_length=1)]


class SourceSchema(Strict):
    path: FilePath | None = None
    format: Literal["trace", "counts", "olmoe-domains", "sglang"] | None = None
    select: str | None = None
    synthetic: dict | None = None

    @model_validator(mode="after")
    def _one(self) -> SourceSchema:
        if self.synthetic is None and self.path is None:
            raise ValueError("expected a file path ('path') or a 'synthetic' spec")
        return self


class WorkloadSchema(Strict):
    calibration: FilePath | SourceSchema | None = None
    evaluation: FilePath | SourceSchema | None = None
    synthetic: dict | None = None

    @model_validator(mode="after")
    def _which(self) -> WorkloadSchema:
        if self.calibration is None and self.synthetic is None:
            raise ValueError("expected 'calibration' (a trace or counts file) or 'synthetic'")
        if self.calibration is not None and self.synthetic is not None:
            raise ValueError("expected either 'calibration' or 'synthetic', found both")
        return self


class ProfileSpecSchema(Strict):
    """A synthetic latency profile (instance ``profile:`` mapping)."""

    variability: Literal["none", "low", "medium", "high"] | Annotated[float, Field(ge=0.0, lt=1.0)] = "medium"
    seed: NonNegInt = 0
    tile: PosInt = 64
    alpha: NonNegFloat = 0.05
    beta: NonNegFloat = 0.10
    max_tiles: PosInt = 64


class ExecutorSchema(Strict):
    workers: PosInt = 1
    ray: bool | str | None = None

    @field_validator("ray", mode="before")
    @classmethod
    def _address(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool) or (isinstance(value, str) and value.strip()):
            return value
        raise ValueError(f"expected a cluster address, 'local' or true, found {_found(value)}")


class MethodSchema(BaseModel):
    """``method:``: a name and the method's parameters (checked by `parse_params`)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    name: str = "auto"


class InstanceSchema(Strict):
    name: str | None = None
    description: str | None = None
    model: ModelSchema
    cluster: ClusterSchema
    workload: WorkloadSchema
    method: MethodSchema | None = None
    profile: Annotated[str, Field(min_length=1)] | ProfileSpecSchema | None = None
    executor: ExecutorSchema | None = None

    @model_validator(mode="after")
    def _fits(self) -> InstanceSchema:
        c = self.cluster
        gpn = c.gpus_per_node or c.gpus
        if c.gpus % gpn:
            raise ValueError(f"cluster.gpus_per_node: expected a divisor of gpus={c.gpus}, found {gpn}")
        return self


def check_instance_sizes(schema: InstanceSchema, source: str | None) -> None:
    """Slots, coactivation and profile tables checked against the memory budget."""
    m, c = schema.model, schema.cluster
    width = (c.slots_per_gpu or math.ceil(m.experts / c.gpus)) + c.replica_slots_per_gpu
    widest = "cluster.gpus" if c.gpus >= width else "cluster.slots_per_gpu"
    check_size(f"layers x gpus x slots ({m.layers} x {c.gpus} x {width})", m.layers * c.gpus * width, source, widest)
    check_size(f"layers x experts^2 ({m.layers} x {m.experts}^2)", m.layers * m.experts**2, source, "model.experts")
    if isinstance(schema.profile, ProfileSpecSchema):
        p = schema.profile
        check_size(
            f"gpus x (max_tiles + 1) ({c.gpus} x {p.max_tiles + 1})",
            c.gpus * (p.max_tiles + 1),
            source,
            "profile.max_tiles",
        )


# ----------------------------------------------------------------------------- synthetic specs
def group_routing_problem(experts: int, top_k: int, groups: int | None, topk_group: int | None) -> str | None:
    """What is wrong with a group-limited routing spec (``field: expected ..., found ...``), None if nothing.

    ``expert_groups`` must divide the experts, ``topk_group`` needs ``expert_groups`` and lies in
    ``[1, expert_groups]``, and the chosen groups must hold ``top_k`` experts."""
    if groups is None:
        return None if topk_group is None else "topk_group: only used with expert_groups"
    if experts % groups:
        return f"expert_groups: expected a divisor of experts={experts}, found {groups}"
    if topk_group is None:
        return None
    if topk_group > groups:
        return f"topk_group: expected at most expert_groups={groups}, found {topk_group}"
    if topk_group * (experts // groups) < top_k:
        return (
            f"topk_group: expected {topk_group} groups of {experts // groups} experts to hold top_k={top_k}, "
            f"found {topk_group * (experts // groups)} experts"
        )
    return None


class SynthSchema(Strict):
    """Parameters of a synthetic workload (``workload.synthetic`` or ``trace synth``)."""

    layers: PosInt = 2
    experts: PosInt = 16
    top_k: PosInt = 2
    tokens: PosInt = 4096
    steps: PosInt = 16
    families: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = [
        "code",
        "query",
        "math",
        "reasoning",
    ]
    family_share: list[NonNegFloat] | None = None
    only_family: str | None = None
    communities: PosInt | None = None
    generic: NonNegInt | None = None
    generic_boost: PosFloat = 4.0
    community_boost: PosFloat = 30.0
    family_focus: PosFloat = 0.3
    family_communities: Literal["shared", "per_family"] = "shared"
    skew: NonNegFloat = 0.8
    burst: PosFloat = 2.0
    burst_fraction: Probability = 0.1
    layer_dependency: Probability = 0.0
    successors: NonNegInt = 0
    structure_seed: NonNegInt = 0
    seed: NonNegInt = 0
    drift: Literal["none", "mix", "popularity", "switch"] = "none"
    drift_share: list[NonNegFloat] | None = None
    drift_focus: Probability | None = None
    drift_rate: PosFloat | None = None
    switch_step: PosInt | None = None
    switch_seed: NonNegInt | None = None
    expert_groups: PosInt | None = None
    topk_group: PosInt | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SynthSchema:
        if self.top_k > self.experts:
            raise ValueError(f"top_k: expected at most experts={self.experts}, found {self.top_k}")
        problem = group_routing_problem(self.experts, self.top_k, self.expert_groups, self.topk_group)
        if problem is not None:
            raise ValueError(problem)
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"families: expected distinct names, found {self.families}")
        if self.only_family is not None and self.only_family not in self.families:
            raise ValueError(f"only_family: expected one of {self.families}, found {self.only_family!r}")
        if self.family_share is not None:
            if len(self.family_share) != len(self.families):
                raise ValueError(
                    f"family_share: expected one share per family ({len(self.families)}), "
                    f"found {len(self.family_share)}"
                )
            if not sum(self.family_share) > 0:
                raise ValueError(f"family_share: expected a positive total, found {self.family_share}")
        if self.generic is not None and self.generic > self.experts:
            raise ValueError(f"generic: expected at most experts={self.experts}, found {self.generic}")
        if self.communities is not None and self.communities > self.experts:
            raise ValueError(f"communities: expected at most experts={self.experts}, found {self.communities}")
        if self.successors > self.experts:  # an expert has at most E distinct successors
            raise ValueError(f"successors: expected at most experts={self.experts}, found {self.successors}")
        self._check_drift()
        return self

    def _check_drift(self) -> None:
        """Each drift parameter belongs to one drift kind, and fits the rest of the spec."""
        owner = {
            "drift_share": "mix",
            "drift_focus": "mix",
            "drift_rate": "popularity",
            "switch_step": "switch",
            "switch_seed": "switch",
        }
        for name, kind in owner.items():
            if getattr(self, name) is not None and self.drift != kind:
                raise ValueError(f"{name}: only used with drift: {kind}, found drift: {self.drift}")
        if self.drift == "mix" and self.only_family is not None:
            raise ValueError("drift: only_family fixes every token's family; drift: mix needs a mix")
        if self.drift_share is not None:
            if len(self.drift_share) != len(self.families):
                raise ValueError(
                    f"drift_share: expected one share per family ({len(self.families)}), found {len(self.drift_share)}"
                )
            if not sum(self.drift_share) > 0:
                raise ValueError(f"drift_share: expected a positive total, found {self.drift_share}")
            if self.drift_focus is not None:
                raise ValueError("drift_focus: give drift_share or drift_focus, not both")
        if self.drift == "switch":
            if self.steps < 2:
                raise ValueError(f"steps: drift: switch needs at least 2 steps, found {self.steps}")
            if self.switch_step is not None and self.switch_step >= self.steps:
                raise ValueError(f"switch_step: expected 1..{self.steps - 1} (steps - 1), found {self.switch_step}")
            if self.switch_seed is not None and self.switch_seed == self.structure_seed:
                raise ValueError(f"switch_seed: expected a seed other than structure_seed={self.structure_seed}")


def check_synthetic(
    data: dict, source: str | None, prefix: str = "workload.synthetic", option: bool = False
) -> SynthSchema:
    """Validate a synthetic spec mapping and its sizes (``option``: fields are CLI options)."""
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
    try:
        spec = SynthSchema.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, source, prefix, SynthSchema, option=option) from None

    def where(name: str) -> str:
        return "--" + name.replace("_", "-") if option else f"{prefix}.{name}"

    # synthesize() holds a few float64 [tokens, experts] arrays and the [steps, experts] bursts
    check_size(
        f"tokens x experts ({spec.tokens} x {spec.experts})", 4 * spec.tokens * spec.experts, source, where("tokens")
    )
    check_size(
        f"steps x experts ({spec.steps} x {spec.experts})",
        spec.layers * spec.steps * spec.experts,
        source,
        where("steps"),
    )
    check_size(
        f"tokens x layers x top_k ({spec.tokens} x {spec.layers} x {spec.top_k})",
        spec.tokens * spec.layers * spec.top_k,
        source,
        where("tokens"),
    )
    check_size(
        f"layers x experts^2 ({spec.layers} x {spec.experts}^2)",
        spec.layers * spec.experts**2 * len(spec.families),
        source,
        where("experts"),
    )
    return spec


# ----------------------------------------------------------------------------- profiles
class ProfileGpuSchema(Strict):
    name: str | None = None
    latency: Annotated[list[NonNegFloat], Field(min_length=2)]
    speed: NonNegFloat | None = None


class ProfileFileSchema(Strict):
    format: Literal["moeopt.profile/1"] | None = None
    tile: PosInt
    unit: Literal["ms"] | None = None
    gpus: Annotated[list[ProfileGpuSchema], Field(min_length=1)]
    meta: dict | None = None


# ----------------------------------------------------------------------------- plans
class PlanSchema(Strict):
    """``moeopt.plan/2`` and ``moeopt.plan/1`` files, as strictly as instances: unknown keys and
    the other format's keys are refused (the shape is checked against the header)."""

    format: Literal["moeopt.plan/2", "moeopt.plan/1"]
    gpus: PosInt
    layers: PosInt
    experts: PosInt
    slots_per_gpu: PosInt | None = None
    slots: list[list[list[int]]] | None = None
    placement: list[list[int]] | None = None
    replicas: list[list[list[int]]] | None = None
    dispatch: Any = "even"
    method: str = ""
    params: dict | None = None

    @model_validator(mode="after")
    def _body(self) -> PlanSchema:
        if self.format == "moeopt.plan/2" and self.slots is None:
            raise ValueError("slots: required field is missing")
        if self.format == "moeopt.plan/1" and self.placement is None:
            raise ValueError("placement: required field is missing")
        other = PLAN_V1_ONLY if self.format == "moeopt.plan/2" else PLAN_V2_ONLY
        foreign = sorted(other & self.model_fields_set)
        if foreign:
            raise ValueError(f"{foreign[0]}: not a field of {self.format} (it belongs to the other plan format)")
        if self.replicas is not None and len(self.replicas) != self.layers:
            raise ValueError(f"replicas: expected one list per layer ({self.layers}), found {len(self.replicas)}")
        return self


#: fields of one plan format only
PLAN_V1_ONLY = frozenset({"placement", "replicas"})
PLAN_V2_ONLY = frozenset({"slots", "slots_per_gpu", "dispatch"})


def check_plan(data: Any, source: str) -> PlanSchema:
    """Validate a plan file's JSON object (types, sizes); the plan's own check follows."""
    if isinstance(data, dict):
        sizes = {k: data.get(k) for k in ("gpus", "layers", "experts", "slots_per_gpu")}
        ok = {k: v for k, v in sizes.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
        g, lay, e, w = ok.get("gpus"), ok.get("layers"), ok.get("experts"), ok.get("slots_per_gpu")
        if lay is not None and g is not None and w is not None:
            check_size(f"layers x gpus x slots ({lay} x {g} x {w})", lay * g * w, source, "slots_per_gpu")
        if lay is not None and e is not None:
            check_size(f"layers x experts ({lay} x {e})", lay * e, source, "experts")
        if lay is not None and g is not None:
            check_size(f"layers x gpus ({lay} x {g})", lay * g, source, "gpus")
    try:
        return PlanSchema.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, source, "", PlanSchema) from None


# ----------------------------------------------------------------------------- traces
def check_topk(topk: np.ndarray, source: str, num_experts: int | None = None) -> None:
    """A trace's ``topk``: integer ``[tokens, layers, k]`` ids in range, distinct per row."""
    if topk.dtype.kind not in "iu":
        raise InputError(source, "topk", f"expected integer expert ids, found dtype {topk.dtype}")
    if topk.ndim != 3:
        raise InputError(source, "topk", f"expected shape [tokens, layers, k], found {list(topk.shape)}")
    if topk.shape[0] == 0 or topk.shape[1] == 0 or topk.shape[2] == 0:
        raise InputError(
            source, "topk", f"expected at least one token, layer and expert per row, found {list(topk.shape)}"
        )
    if topk.min() < 0:
        raise InputError(source, "topk", f"expected expert ids >= 0, found {int(topk.min())}")
    if num_experts is not None and topk.max() >= num_experts:
        raise InputError(source, "topk", f"expected expert ids in [0, {num_experts - 1}], found {int(topk.max())}")
    if topk.shape[2] > 1:
        s = np.sort(topk, axis=2)
        dup = (s[:, :, 1:] == s[:, :, :-1]).any(axis=2)
        if dup.any():
            n, l = (int(x) for x in np.argwhere(dup)[0])
            raise InputError(
                source,
                "topk",
                f"expected distinct experts in each token's top-k, found {topk[n, l].tolist()} (token {n}, layer {l})",
            )


def check_homes(home: np.ndarray | None, gpus: int, source: str | None) -> None:
    """A trace's ``home`` GPU ids must lie in ``[0, gpus - 1]``."""
    if home is not None and home.size and int(home.max()) >= gpus:
        raise InputError(
            source, "home", f"expected GPU ids in [0, {gpus - 1}] (cluster.gpus={gpus}), found {int(home.max())}"
        )


# ----------------------------------------------------------------------------- method parameters
def param_constraints(f: dataclasses.Field, base: Any) -> dict[str, Any]:
    """Range of a method parameter: ``ge``/``gt``/``le``/``lt`` and ``inf`` (allow +inf) from
    the field's metadata; numbers default to ``>= 0`` and finite."""
    meta = dict(f.metadata or {})
    if base in (int, float) and not any(k in meta for k in ("ge", "gt")):
        meta["ge"] = 0
    return meta


def check_param(value: Any, base: Any, meta: dict[str, Any], source: str | None, field: str) -> Any:
    """One method parameter checked strictly against its type and range."""
    if base is float and meta.get("inf") and value == math.inf:
        return math.inf
    bounds = {k: meta[k] for k in ("ge", "gt", "le", "lt") if k in meta}
    if base is int:
        ann: Any = Annotated[int, Field(**bounds)]
    elif base is float:
        ann = Annotated[float, Field(allow_inf_nan=False, **bounds)]
    else:
        ann = base
    try:
        return TypeAdapter(ann).validate_python(value, strict=True)
    except ValidationError as exc:
        raise input_error(exc, source, field) from None
