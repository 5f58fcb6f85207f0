"""The problem data: model shape, cluster, workload and method choice (frozen dataclasses)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from moeopt.errors import InfeasibleError
from moeopt.services import services

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from moeopt.trace import Stats, Trace

#: Bytes per parameter of each ``model.dtype`` (an expert's size, what a re-plan moves).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class Model:
    """MoE model shape: ``layers`` (L), routed ``experts`` per layer (E), ``top_k`` (k).

    ``expert_groups``: the router's expert groups when it routes group-limited (DeepSeek-V3 / R1:
    ``n_group = 8``; expert ``e`` is in group ``e // (E / expert_groups)``); None: no groups.

    ``dense_layers``: the model's dense (non-MoE) hidden layers before its MoE layers
    (DeepSeek-V3 / R1: 3; Qwen3, Mixtral: 0). SGLang's placement map has a row for every hidden
    layer, so an exported map needs them; None: not known.

    ``expert_bytes``: bytes of one expert's weights, what a re-plan moves per moved slot; None:
    ``3 * d_model * d_ff`` parameters of ``dtype`` (`expert_size`).
    """

    layers: int
    experts: int
    top_k: int
    d_model: int = 1024
    d_ff: int = 512
    dtype: str = "bf16"
    expert_groups: int | None = None
    dense_layers: int | None = None
    expert_bytes: int | None = None

    @property
    def expert_size(self) -> int:
        """Bytes of one expert's weights: ``expert_bytes``, else its three ``d_model x d_ff``
        matrices (gate, up, down) at ``dtype``'s width (`DTYPE_BYTES`): DeepSeek-V3
        (7168 x 2048, fp8) 44,040,192 bytes; Qwen3-235B-A22B (4096 x 1536, bf16) 37,748,736."""
        if self.expert_bytes is not None:
            return int(self.expert_bytes)
        return int(round(3 * self.d_model * self.d_ff * DTYPE_BYTES[self.dtype]))


TOKEN_HOMES = ("uniform", "trace", "previous-layer")

#: The serving engines an instance can name (``cluster.engine``) and the dispatch rule each runs
#: (`moeopt.dispatch`): SGLang's ``--ep-dispatch-algorithm`` ``dynamic`` (its default
#: without an all-to-all backend), ``static`` (its default with DeepEP) and ``lp``; vLLM's EPLB
#: routing; vLLM-Ascend's rank-modulo rule.
ENGINES: dict[str, str] = {
    "sglang": "even",
    "sglang-static": "static",
    "sglang-lp": "lp",
    "vllm": "vllm",
    "vllm-ascend": "ascend",
}


@dataclass(frozen=True)
class TopologyLevel:
    """One level of the cluster's switch tree (``cluster.topology.levels``).

    ``size``: members of the level below (GPUs at level 0) under one switch of this level; None
    at the top level, whose one switch joins everything. ``weight``: the hop cost between two
    GPUs whose paths first meet at this level.
    """

    size: int | None
    weight: float


@dataclass(frozen=True)
class Cluster:
    """Expert-parallel GPUs (G), grouped into nodes, each with ``slots_per_gpu`` expert slots.

    ``slots_per_gpu`` defaults to ``ceil(E / G)``; ``replica_slots_per_gpu`` extra slots per GPU
    hold replicas; ``inter_node_weight`` is the cost of an inter-node hop (intra-node costs 1).
    ``topology`` (optional) replaces that two-level model by a deeper switch tree, levels from
    the GPUs up (`moeopt.topology` turns either into hop costs).
    A plan may fill any of a GPU's ``W = slots_per_gpu + replica_slots_per_gpu`` physical slots
    with any expert; ``allow_colocated_copies`` lets moeopt's planners put two copies of one
    expert on one GPU (engines' plans may hold them regardless).
    """

    gpus: int
    gpus_per_node: int
    slots_per_gpu: int
    replica_slots_per_gpu: int = 0
    inter_node_weight: float = 4.0
    allow_colocated_copies: bool = False
    #: where a token lives when it is dispatched: ``uniform`` (the trace's ``home`` when it
    #: records one, else uniform), ``trace`` (the trace's ``home``) or ``previous-layer`` (the
    #: GPU that ran its top-1 expert at the previous MoE layer)
    token_home: str = "uniform"
    topology: tuple[TopologyLevel, ...] | None = None
    #: the serving engine the plans will run on (`ENGINES`); its dispatch rule is the one
    #: planners plan for and plans are scored under. None: no engine named (planners choose)
    engine: str | None = None

    @property
    def engine_rule(self) -> str | None:
        """The dispatch kind `engine` runs (None without an engine)."""
        return None if self.engine is None else ENGINES[self.engine]

    @property
    def width(self) -> int:
        """W: physical slots per GPU (``slots_per_gpu + replica_slots_per_gpu``)."""
        return self.slots_per_gpu + self.replica_slots_per_gpu

    @property
    def physical_slots(self) -> int:
        """P = G * W physical slots per layer."""
        return self.gpus * self.width

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


@dataclass(frozen=True, eq=False)
class WorkloadSource:
    """Where a workload comes from: a file (trace or counts), a synthetic generator spec, or
    ``data`` held in memory (a `Trace` or count-only
    `Stats`, as `Instance.from_counts` and the other in-memory
    constructors make)."""

    path: Path | None = None
    format: str | None = None  # None: inferred from the file's content
    select: str | None = None  # e.g. model prefix inside a multi-model count file
    synthetic: dict[str, Any] | None = None
    data: Trace | Stats | None = None


@dataclass(frozen=True)
class Workload:
    """Calibration workload (methods see it) and evaluation workload (metrics use it)."""

    calibration: WorkloadSource
    evaluation: WorkloadSource | None = None


@dataclass(frozen=True)
class MethodSpec:
    """A registered method's name plus its parameters, as written under ``method:``."""

    name: str = "linear"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecutorSpec:
    """Where the layers are solved (YAML ``executor:``): ``workers`` local processes, or a Ray
    cluster at ``ray`` (an address, or ``"local"`` for a local Ray started for the run)."""

    workers: int = 1
    ray: str | None = None


class InstanceOptions(TypedDict, total=False):
    """The keyword options of the in-memory constructors (`Instance.from_counts`, ...):
    the fields of an instance file's ``cluster``, ``model`` and ``method`` mappings, with the
    same defaults and checks."""

    #: GPUs per node (default: ``gpus``, one node)
    gpus_per_node: int
    #: expert slots per GPU (default: ``ceil(experts / gpus)``)
    slots_per_gpu: int
    #: extra slots per GPU for copies of hot experts (default 0)
    replica_slots_per_gpu: int
    #: cost of an inter-node hop, intra-node costing 1 (default 4.0)
    inter_node_weight: float
    #: planners may put two copies of one expert on one GPU (default False)
    allow_colocated_copies: bool
    #: ``uniform``, ``trace`` or ``previous-layer`` (default ``uniform``)
    token_home: str
    #: the serving engine (``sglang``, ``sglang-static``, ``sglang-lp``, ``vllm``,
    #: ``vllm-ascend``): planners plan for its dispatch rule; default None
    engine: str
    #: the switch tree (``{"levels": [{"size": 8, "weight": 1}, {"weight": 4}]}``)
    topology: dict[str, Any]
    #: routed experts per layer (traces: default one more than the largest id; counts: at
    #: least the columns)
    experts: int
    #: dense hidden layers before the MoE layers (SGLang's map needs them; DeepSeek-V3: 3)
    dense_layers: int
    #: the router's expert groups (DeepSeek-V3: 8)
    expert_groups: int
    #: expert shape and dtype: what a re-plan moves per moved slot
    d_model: int
    d_ff: int
    dtype: str
    expert_bytes: int
    #: the default method of `moeopt.solve` (default ``auto``)
    method: str
    #: that method's parameters
    params: dict[str, Any]
    #: a latency profile: a synthetic spec (``{"variability": "medium", "seed": 0}``) or a file
    profile: Any


@dataclass(frozen=True)
class Instance:
    """One placement problem: model, cluster, workload, method, optional latency profile."""

    name: str
    model: Model
    cluster: Cluster
    workload: Workload
    method: MethodSpec = field(default_factory=MethodSpec)
    profile: Any = None  # ProfileSpec (synthetic dict) or Path to a profile YAML, or None
    source: Path | None = None  # the YAML file it was read from
    executor: ExecutorSpec | None = None  # YAML ``executor:``; None: serial

    def replace(self, **changes: Any) -> Instance:
        """A copy with ``changes`` (field name -> new value), like `dataclasses.replace`."""
        return replace(self, **changes)

    @classmethod
    def from_counts(
        cls,
        counts: Any,
        *,
        gpus: int,
        top_k: int,
        evaluation: Any = None,
        name: str = "counts",
        **options: Unpack[InstanceOptions],
    ) -> Instance:
        """An instance whose workload is a table of per-expert counts held in memory.

        Parameters
        ----------
        counts
            ``[layers, experts]`` token-slot counts (how many tokens each expert of each
            layer received; a row sums to tokens x ``top_k``), or ``[families, layers,
            experts]``: a numpy array, a torch tensor on any device, or nested lists. The
            model's ``layers`` and ``experts`` are its shape.
        gpus
            G, the expert-parallel GPUs.
        top_k
            k, the experts each token is routed to.
        evaluation
            Counts of the same shape to score plans on (a held-out workload); None: plans are
            scored on ``counts`` themselves (in sample).
        name
            The instance's name (in reports).
        **options
            The cluster, model and method fields of an instance file
            (`InstanceOptions`): ``gpus_per_node``, ``slots_per_gpu``,
            ``replica_slots_per_gpu``, ``engine``, ``dense_layers``, ``method``, ...

        Returns
        -------
        Instance
            Validated like an instance file (same checks, same messages).

        Raises
        ------
        InputError
            For a bad array (shape, dtype, NaN, negative, a layer without tokens) or option,
            naming the argument or the field.
        """
        return services().instance(
            "counts", counts, evaluation, {"gpus": gpus, "top_k": top_k, "name": name, **options}
        )

    @classmethod
    def from_step_counts(
        cls,
        step_counts: Any,
        *,
        gpus: int,
        top_k: int,
        evaluation: Any = None,
        name: str = "step-counts",
        **options: Unpack[InstanceOptions],
    ) -> Instance:
        """An instance whose workload is per-step counts held in memory.

        Parameters
        ----------
        step_counts
            ``[layers, steps, experts]`` token-slot counts per step (forward pass, window or
            snapshot): numpy, torch or nested lists. Methods that plan robustly over steps
            (``balance``) and the re-planning replay read the steps; the pooled counts are their
            sum over the steps.
        gpus, top_k, evaluation, name, **options
            As for `from_counts` (``evaluation``: per-step counts too).

        Returns
        -------
        Instance

        Raises
        ------
        InputError
            For a bad array or option, naming the argument or the field.
        """
        return services().instance(
            "step_counts", step_counts, evaluation, {"gpus": gpus, "top_k": top_k, "name": name, **options}
        )

    @classmethod
    def from_trace(
        cls,
        topk: Any,
        *,
        gpus: int,
        top_k: int | None = None,
        step: Any = None,
        home: Any = None,
        family: Any = None,
        family_names: Any = None,
        weights: Any = None,
        evaluation: Any = None,
        name: str = "trace",
        **options: Unpack[InstanceOptions],
    ) -> Instance:
        """An instance whose workload is a token routing trace held in memory.

        Parameters
        ----------
        topk
            ``[tokens, layers, k]`` integer expert ids (each token's top-k experts at each MoE
            layer; numpy, torch or nested lists), or a `Trace`. ``layers``
            and ``top_k`` come from its shape, ``experts`` from its largest id unless the
            ``experts`` option says more.
        gpus
            G, the expert-parallel GPUs.
        top_k
            k, checked against the trace's when given.
        step
            Optional ``[tokens]`` step (batch) ids: steps are renumbered ``0..T-1``.
        home
            Optional ``[tokens]`` GPU each token lives on (``cluster.token_home``).
        family, family_names
            Optional ``[tokens]`` family ids and their names (``[F]``), for the methods robust
            to single-family workloads.
        weights
            Optional ``[tokens, layers, k]`` gate weights.
        evaluation
            A held-out trace (the same kinds as ``topk``) to score plans on; None: in sample.
        name, **options
            As for `from_counts`.

        Returns
        -------
        Instance

        Raises
        ------
        InputError
            For a bad array (ids out of range, repeated experts in a row, shapes that disagree)
            or option, naming the argument or the field.
        """
        arrays = {"topk": topk, "step": step, "home": home, "family": family, "family_names": family_names}
        arrays["weights"] = weights
        given = {"gpus": gpus, "top_k": top_k, "name": name, **options}
        return services().instance("trace", arrays, evaluation, given)

    @classmethod
    def from_dict(cls, data: Any, *, base: str | Path | None = None) -> Instance:
        """An instance from a mapping with the content of an instance file.

        Parameters
        ----------
        data
            The instance-file schema as a mapping (``model``, ``cluster``, ``workload``,
            ``method``, ... as in the YAML files: the guide on instances lists the fields),
            validated by the same schema with the same messages.
        base
            The folder relative workload and profile paths start at (default: the working
            directory).

        Returns
        -------
        Instance

        Raises
        ------
        InputError
            Naming the field and what was expected.
        """
        return services().instance_from_dict(data, None if base is None else Path(base))

    def check_feasible(self) -> None:
        """Raise `InfeasibleError` when no plan can place every expert (naming the file)."""
        try:
            check_capacity(self.model, self.cluster)
        except InfeasibleError as exc:
            if self.source is None:
                raise
            raise InfeasibleError(f"{self.source}: {exc}") from None


def default_slots(experts: int, gpus: int) -> int:
    """Slots per GPU when the instance does not say: ``ceil(E / G)``."""
    return math.ceil(experts / gpus)


def check_capacity(model: Model, cluster: Cluster) -> None:
    """Raise `InfeasibleError` if ``gpus * slots_per_gpu < experts``."""
    total = cluster.gpus * cluster.slots_per_gpu
    if total < model.experts:
        need = default_slots(model.experts, cluster.gpus)
        raise InfeasibleError(
            f"infeasible: {cluster.gpus} GPUs x {cluster.slots_per_gpu} slots = {total} slots "
            f"< {model.experts} experts; set cluster.slots_per_gpu >= {need} "
            f"or use at least {math.ceil(model.experts / cluster.slots_per_gpu)} GPUs"
        )
