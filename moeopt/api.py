"""The public API's own functions, and the services the data classes call through it.

``import moeopt`` exposes the public API (``moeopt.__all__``): the data classes
(`Instance`, `Plan`, `Result`,
...), `solve` and the functions of this module. The data classes sit in the
lowest layer of the package; what their constructors and writers need from the layers above
(the instance schema reader, the engine files, atomic writes) they reach through
`moeopt.services`, which this module provides at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from moeopt import io as files
from moeopt.errors import InputError, PlanError
from moeopt.instance import Instance, Workload, WorkloadSource
from moeopt.io.instances import instance_from_mapping
from moeopt.io.workloads import count_stats, fit_workload, trace_from_arrays, with_step_counts
from moeopt.plan import Dispatch, Plan
from moeopt.registry import get_method, metric_hooks
from moeopt.schema import check_homes
from moeopt.scoring import score
from moeopt.services import provide
from moeopt.solve import load_workloads
from moeopt.trace import Stats, Trace

__all__ = ["evaluate", "method_available", "read_workload"]

#: keyword options of the in-memory constructors, by the instance-file mapping they belong to
_MODEL = ("experts", "top_k", "dense_layers", "expert_groups", "d_model", "d_ff", "dtype", "expert_bytes")
_CLUSTER = (
    "gpus",
    "gpus_per_node",
    "slots_per_gpu",
    "replica_slots_per_gpu",
    "inter_node_weight",
    "allow_colocated_copies",
    "token_home",
    "engine",
    "topology",
)
_OTHER = ("name", "method", "params", "profile")


def as_array(value: Any, name: str) -> np.ndarray:
    """``value`` as a numpy array: a numpy array, a torch tensor on any device (copied to the
    CPU; torch is never imported here), nested lists or anything numpy reads.

    Raises
    ------
    InputError
        Naming ``name``, for ragged lists or values that are not numbers.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        tensor = value.detach().cpu()
        try:
            value = tensor.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy has not
            value = tensor.double().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise InputError(None, name, "expected a rectangular array of numbers, found ragged or mixed values") from None
    if arr.dtype == object:
        raise InputError(None, name, "expected a rectangular array of numbers, found ragged or mixed values")
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iufUS":
        raise InputError(None, name, f"expected numbers, found dtype {arr.dtype}")
    return arr


def _numbers(value: Any, name: str, ndim: int, shape: str) -> np.ndarray:
    arr = as_array(value, name)
    if arr.dtype.kind not in "iuf":
        raise InputError(None, name, f"expected numbers, found dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise InputError(None, name, f"expected shape {shape}, found {list(arr.shape)}")
    return arr


def _workload(kind: str, value: Any, name: str, top_k: Any, experts: Any) -> Trace | Stats:
    """The in-memory workload of ``kind`` (``counts``, ``step_counts``, ``trace``), validated."""
    if kind == "counts":
        arr = as_array(value, name)
        if arr.dtype.kind not in "iuf":
            raise InputError(None, name, f"expected numbers, found dtype {arr.dtype}")
        return count_stats(arr, "", name, top_k)
    if kind == "step_counts":
        arr = _numbers(value, name, 3, "[layers, steps, experts]")
        if arr.shape[1] == 0:
            raise InputError(None, name, "expected at least one step, found none")
        pooled = count_stats(arr.astype(np.float64).sum(axis=1), "", name, top_k)
        return with_step_counts(pooled, arr, "", name)
    arrays = value if isinstance(value, Mapping) else {"topk": value}
    topk = arrays.get("topk")
    if isinstance(topk, Trace):
        given = [k for k, v in arrays.items() if k != "topk" and v is not None]
        if given:
            raise InputError(None, given[0], "expected nothing beside a Trace (it holds its own arrays)")
        return topk
    found: dict[str, np.ndarray] = {}
    for key, v in arrays.items():
        if v is None:
            continue
        found[key] = as_array(v, name if key == "topk" else key)
    if experts is not None:
        found["num_experts"] = np.asarray(experts)
    if "topk" not in found:
        raise InputError(None, name, "expected a [tokens, layers, k] array of expert ids")
    if found["topk"].dtype.kind == "f":  # whole-number floats (a float tensor of ids) are ids
        ids = found["topk"]
        if not np.isfinite(ids).all() or (ids != np.round(ids)).any():
            raise InputError(None, name, "expected integer expert ids, found fractions or NaN")
        found["topk"] = ids.astype(np.int64)
    if "family_names" in found and found["family_names"].dtype.kind not in "US":
        raise InputError(None, "family_names", f"expected a list of names, found {found['family_names'].dtype}")
    return trace_from_arrays(found, "")


class _Services:
    """What the data classes call (`Services`)."""

    def instance(self, kind: str, workload: Any, evaluation: Any, options: Mapping[str, Any]) -> Instance:
        unknown = sorted(set(options) - set(_MODEL) - set(_CLUSTER) - set(_OTHER))
        if unknown:
            known = ", ".join(sorted(set(_MODEL + _CLUSTER + _OTHER)))
            raise InputError(None, unknown[0], f"unknown option; expected one of {known}")
        opts = {k: v for k, v in options.items() if v is not None}
        top_k, experts = opts.get("top_k"), opts.get("experts")
        first = "topk" if kind == "trace" else kind
        data = _workload(kind, workload, first, top_k, experts if kind == "trace" else None)
        held = None
        if evaluation is not None:
            k = top_k if top_k is not None else data.top_k
            held = _workload(kind, evaluation, "evaluation", k, experts if kind == "trace" else None)
        layers = data.layers
        width = data.num_experts if isinstance(data, Trace) else data.experts
        model = {"layers": layers, "experts": width, "top_k": data.top_k}
        model.update({k: opts[k] for k in _MODEL if k in opts})
        mapping: dict[str, Any] = {
            "name": opts.get("name", kind),
            "model": model,
            "cluster": {k: opts[k] for k in _CLUSTER if k in opts},
            "method": {"name": opts.get("method", "auto"), **opts.get("params", {})},
        }
        if "profile" in opts:
            mapping["profile"] = str(opts["profile"]) if isinstance(opts["profile"], Path) else opts["profile"]
        inst = instance_from_mapping(
            mapping,
            calibration=WorkloadSource(data=data),
            evaluation=None if held is None else WorkloadSource(data=held),
        )
        # the arrays checked against the model now (and widened to its experts), not at the first solve
        fitted = _fit(data, inst, "")  # messages name the array (topk, counts) alone
        held_source = None if held is None else WorkloadSource(data=_fit(held, inst, "evaluation"))
        return inst.replace(workload=Workload(calibration=WorkloadSource(data=fitted), evaluation=held_source))

    def instance_from_dict(self, data: Any, base: Path | None) -> Instance:
        return instance_from_mapping(data, base=base)

    def write_engine_plan(
        self,
        plan: Plan,
        engine: str,
        path: str | Path,
        *,
        instance: Instance | None,
        dense_layers: int | None,
        load: Any,
    ) -> list[str]:
        _check_engine(engine)
        if instance is not None:
            plan = _fitted(plan, instance, "plan")
        if dense_layers is not None and engine != "sglang":
            raise InputError(None, "dense_layers", "applies to sglang only (EPLB and vLLM count MoE layers)")
        dense = dense_layers
        if dense is None and engine == "sglang":
            dense = instance.model.dense_layers if instance is not None else None
            if dense is None:
                raise InputError(
                    None,
                    "dense_layers",
                    "SGLang's map needs a row for every hidden layer, dense ones included, and reads a map "
                    "without them silently, shifting every MoE layer: give dense_layers=N (or an instance made "
                    "with dense_layers=N; DeepSeek-V3 / R1: 3, models without dense layers: 0)",
                )
        loads = None
        if load is not None:
            loads = _numbers(load, "load", 2, "[layers, experts]").astype(np.float64)
            if loads.shape != (plan.layers, plan.experts):
                raise InputError(
                    None,
                    "load",
                    f"expected [{plan.layers}, {plan.experts}] (layers, experts), found {list(loads.shape)}",
                )
        return files.write_engine_plan(path, plan, engine, load=loads, dense_layers=dense)

    def read_engine_plan(
        self,
        path: str | Path,
        engine: str,
        *,
        instance: Instance | None,
        gpus: int | None,
        dense_layers: int | None,
        dispatch: str | None,
    ) -> Plan:
        _check_engine(engine)
        if instance is not None and gpus not in (None, instance.cluster.gpus):
            raise InputError(None, "gpus", f"{gpus} disagrees with the instance's cluster.gpus={instance.cluster.gpus}")
        if dense_layers is not None and engine != "sglang":
            raise InputError(None, "dense_layers", "applies to sglang only (EPLB and vLLM count MoE layers)")
        dense = dense_layers
        if dense is None and instance is not None and engine == "sglang":
            dense = instance.model.dense_layers
        plan = files.read_engine_plan(
            path,
            engine,
            gpus=gpus if instance is None else instance.cluster.gpus,
            experts=None if instance is None else instance.model.experts,
            dense_layers=dense or 0,
            dispatch=dispatch,
            model_layers=instance.model.layers if instance is not None and dense is None else None,
        )
        return plan if instance is None else _fitted(plan, instance, str(path))

    def write_text(self, path: str | Path, text: str) -> None:
        files.write_text(path, text)


def _fit(data: Trace | Stats, instance: Instance, name: str) -> Trace | Stats:
    """An in-memory workload checked against the instance's model and GPUs (``name`` in messages)."""
    fitted = fit_workload(data, instance.model, name)
    if isinstance(fitted, Trace):
        check_homes(fitted.home, instance.cluster.gpus, name or None)
    return fitted


def _check_engine(engine: str) -> None:
    from moeopt.interop import ENGINE_FORMATS

    if engine not in ENGINE_FORMATS:
        raise InputError(None, "engine", f"expected one of {', '.join(ENGINE_FORMATS)}, found {engine!r}")


def _fitted(plan: Plan, instance: Instance, source: str) -> Plan:
    """``plan`` checked against ``instance`` and padded to its slots per GPU."""
    try:
        plan.check(instance.cluster, layers=instance.model.layers, experts=instance.model.experts)
        return plan.padded(instance.cluster.width)
    except PlanError as exc:
        raise InputError(source, None, str(exc)) from None


provide(_Services())


def read_workload(path: str | Path, *, top_k: int | None = None) -> Trace | Stats:
    """Read a workload file: a token trace (``.npz``) or per-expert counts (``.npz``, ``.json``,
    ``.csv``, ``.npy``, SGLang and vLLM recordings), its format read from its content.

    Parameters
    ----------
    path
        The file.
    top_k
        k, for count files that do not record it.

    Returns
    -------
    Trace or Stats
        A token trace, or count-only statistics (``expert_load`` ``[layers, experts]``).

    Raises
    ------
    InputError
        Naming the file, the field and what was expected.
    """
    return files.read_workload_file(path, top_k=top_k)


def evaluate(
    plan: Plan,
    instance: Instance,
    *,
    workload: Trace | Stats | Any = None,
    dispatch: str | Dispatch | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """Score a plan on an instance: every metric, as ``moeopt evaluate`` prints it.

    Parameters
    ----------
    plan
        The plan (checked against the instance and padded to its slots per GPU).
    instance
        The instance; plans are scored on its evaluation workload (in sample when it has none).
    workload
        Score on this workload instead: a `Trace`,
        `Stats`, or ``[layers, experts]`` counts (numpy, torch, lists).
    dispatch
        Score under this dispatch rule (a kind such as ``"lp"``, or a
        `Dispatch`) instead of the plan's own.
    method
        The method that made the plan: its own metrics are added (``balance``: the lower bound
        on MaxVio, ``balance_bound_maxvio`` and ``balance_bound_per_layer``).

    Returns
    -------
    dict
        The metrics (``maxvio``, ``maxvio_per_layer``, ``comm_per_token``, ``loads``, ... and
        the reductions against vLLM's linear plan); the metrics reference lists them.

    Raises
    ------
    InputError
        For a plan that does not fit the instance or a workload of another shape.
    """
    plan = _fitted(plan, instance, "plan")
    if isinstance(dispatch, str):
        from moeopt.plan import rule_dispatch

        dispatch = rule_dispatch(dispatch, instance.model)
    if dispatch is not None:
        plan = plan.with_dispatch(dispatch)
    wl = load_workloads(instance)
    target = None
    if workload is not None:
        if not isinstance(workload, (Trace, Stats)):
            workload = _workload("counts", workload, "workload", instance.model.top_k, None)
        target = fit_workload(workload, instance.model, "workload")
        if isinstance(target, Trace):
            check_homes(target.home, instance.cluster.gpus, "workload")
    hooks = metric_hooks(method) if method else ()
    return score(plan, instance, wl, workload=target, hooks=hooks)


def method_available(name: str) -> bool:
    """Whether the registered method ``name`` can run here (its optional packages installed).

    Raises
    ------
    InputError
        For an unknown method, listing the registered ones.
    """
    return bool(get_method(name).available())
