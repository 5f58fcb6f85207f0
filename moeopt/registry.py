"""Methods registered by name; each declares its parameters as a dataclass."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from moeopt import console
from moeopt.budget import Budget
from moeopt.errors import InputError, PlanError
from moeopt.instance import Instance
from moeopt.plan import Dispatch, Plan
from moeopt.profile import Profile
from moeopt.result import Result
from moeopt.schema import check_param, param_constraints
from moeopt.trace import Stats, Trace


@dataclass(frozen=True, eq=False)
class Problem:
    """What a method sees: the instance, calibration statistics, trace and latency profile."""

    instance: Instance
    stats: Stats
    trace: Trace | None = None
    profile: Profile | None = None

    @property
    def layers(self) -> int:
        return self.instance.model.layers

    @property
    def experts(self) -> int:
        return self.instance.model.experts

    @property
    def gpus(self) -> int:
        return self.instance.cluster.gpus

    def plan(
        self,
        home: np.ndarray,
        replicas: tuple[np.ndarray, ...] | list[np.ndarray] = (),
        dispatch: Dispatch | None = None,
    ) -> Plan:
        """A plan/2 from homes ``[L, E]`` and extra copies, in this instance's ``G x W`` slots."""
        c = self.instance.cluster
        return Plan.from_homes(home, replicas, gpus=c.gpus, width=c.width, dispatch=dispatch)


#: Context's default ``budget``: replaced by a budget of its ``time_limit`` (a sentinel, never used
#: as a clock)
_NO_BUDGET = Budget(None)


@dataclass
class Context:
    """Run-time settings common to every method."""

    time_limit: float | None = None
    seed: int = 0
    hint: Plan | None = None
    #: the plan running now (``solve --from``): migration-aware methods re-plan from it
    current: Plan | None = None
    quiet: bool = True
    log: Callable[[str], None] | None = None
    #: layers of the whole model when this problem is one layer of it (``moeopt.execute``);
    #: None: the problem is the whole model
    model_layers: int | None = None
    #: the clock every phase takes its share from (`moeopt.budget`); default: a budget of
    #: ``time_limit`` started when the context is made
    budget: Budget = _NO_BUDGET
    #: where a method solved whole (``layerwise = False``) may spread its per-layer phases
    #: (`moeopt.execute.map_items`); None: serially
    executor: Any = None

    def __post_init__(self) -> None:
        if self.budget is _NO_BUDGET:
            self.budget = Budget(self.time_limit)

    def say(self, line: str) -> None:
        """A progress line (incumbent/bound) unless quiet: to ``log``, else to stderr."""
        if not self.quiet:
            (self.log or console.progress_line)(line)

    def layers(self, n: int, desc: str):
        """Iterate over layers with a progress bar unless quiet (drawn on a terminal only)."""
        return console.bar(range(n), desc=desc, unit="layer", disable=n <= 1, quiet=self.quiet, leave=False)


class Method(Protocol):
    """A placement method. ``Params`` is a dataclass of its parameters with defaults."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type]
    #: What the calibration workload must provide: "coactivation", "steps", "profile".
    requires: ClassVar[frozenset[str]]
    #: Metrics the method adds to every score of its plans (bounds, certificates), each called
    #: as ``hook(plan, instance, workloads, metrics, params)``; see `moeopt.scoring.score`.
    metric_hooks: ClassVar[tuple]
    #: How per-layer objectives and bounds add up to the model's: "sum" or "mean". A method
    #: that declares it is solved one layer at a time by `moeopt.execute` (serially, in
    #: a process pool or on Ray), unless it sets ``layerwise = False``. Optional companions:
    #: ``uses_trace`` / ``uses_coactivation`` (ship each layer's trace slice / coactivation;
    #: default true), ``stats_rules`` (how a
    #: statistic combines, see `moeopt.execute.combine_stats`) or a ``combine_stats``
    #: method.
    combine: ClassVar[str]

    def available(self) -> bool: ...

    def solve(self, problem: Problem, params: Any, ctx: Context) -> Result: ...


_REGISTRY: dict[str, type[Any]] = {}

M = TypeVar("M", bound=type[Any])


def register(cls: M) -> M:
    """Class decorator: make a method available by its ``name``."""
    if cls.name in _REGISTRY:
        raise RuntimeError(f"method {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def method_names() -> list[str]:
    """Names of the registered methods, the built-in ones included.

    The registry sits in the methods layer (tests/test_layering.py): importing the package
    `moeopt.methods`, whose ``__init__`` imports each method module, is what registers
    the built-in methods; nothing registers into a lower layer's globals.
    """
    import moeopt.methods  # noqa: F401  (registers the built-in methods)

    return sorted(_REGISTRY)


def metric_hooks(name: str) -> tuple:
    """The metric hooks a registered method declares (none for unknown names, e.g. imports)."""
    method_names()
    cls = _REGISTRY.get(name)
    return tuple(getattr(cls, "metric_hooks", ())) if cls is not None else ()


def get_method(name: str, *, source: str | None = None) -> Method:
    """The registered method ``name``, or an `InputError` listing the known ones."""
    names = method_names()
    if name not in _REGISTRY:
        raise InputError(source, "method.name", f"unknown method {name!r}; registered: {', '.join(names)}")
    return _REGISTRY[name]()


def param_fields(method: Method) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(method.Params)}


def parse_params(
    method: Method, given: dict[str, Any] | None, *, source: str | None = None, strict: bool = True
) -> Any:
    """Build ``method.Params`` from a mapping, checking names and types.

    With ``strict=False`` unknown names are dropped (used when ``--method`` overrides the
    instance's method: parameters the new method accepts are kept).
    """
    fields = param_fields(method)
    hints = typing.get_type_hints(method.Params)
    values: dict[str, Any] = {}
    for key, value in (given or {}).items():
        if key not in fields:
            if strict:
                accepted = ", ".join(fields) or "none"
                raise InputError(
                    source, f"method.{key}", f"unknown parameter for method {method.name!r}; accepted: {accepted}"
                )
            continue
        values[key] = _coerce(value, hints.get(key), source, f"method.{key}", fields[key])
    try:
        params = method.Params(**values)
    except (TypeError, ValueError, PlanError) as exc:
        # "certificate must be one of ..." names its parameter: report it as method.certificate
        name, _, rest = str(exc).partition(" must ")
        if name in fields and rest:
            raise InputError(source, f"method.{name}", f"must {rest}") from None
        raise InputError(source, "method", str(exc)) from None
    return params


def _coerce(value: Any, hint: Any, source: str | None, field: str, spec: dataclasses.Field | None = None) -> Any:
    """Check a YAML value against a parameter's annotation (bool/int/float/str/optional) and,
    for numbers, its range (`moeopt.schema.param_constraints`: ``>= 0`` and finite unless
    the field's metadata says otherwise)."""
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None:
        if optional:
            return None
        raise InputError(source, field, "must not be empty")
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base is bool:
        if isinstance(value, bool):
            return value
        raise InputError(source, field, f"expected true or false, got {value!r}")
    if base in (int, float):
        meta = param_constraints(spec, base) if spec is not None else {}
        return check_param(value, base, meta, source, field)
    if base is str:
        if isinstance(value, str):
            return value
        raise InputError(source, field, f"expected a string, got {value!r}")
    return value
