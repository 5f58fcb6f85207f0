"""Plan files: ``moeopt.plan/2`` JSON (and the first release's ``moeopt.plan/1``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moeopt import schema
from moeopt.errors import InputError, PlanError
from moeopt.io.files import (
    PLAN_FORMAT,
    PLAN_FORMAT_V1,
    _read_json,
    write_json,
)
from moeopt.plan import Dispatch, Plan


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
    """Write a plan file (``moeopt.plan/2`` JSON, atomically), recording the method and
    parameters that made it (what ``moeopt evaluate`` reads back for the method's metrics)."""
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
    """Read a plan file with its ``method`` and ``params`` (see [`read_plan`][moeopt.io.read_plan])."""
    path = Path(path)
    src = str(path)
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
            width = data.get("slots_per_gpu")
            if width is not None and width != slots.shape[2]:
                raise InputError(
                    src, "slots_per_gpu", f"expected {slots.shape[2]} (the slots of each GPU in 'slots'), got {width}"
                )
            plan = Plan(slots=slots, experts=E, dispatch=Dispatch.from_json(data.get("dispatch", "even")))
    except PlanError as exc:
        raise InputError(src, None, str(exc)) from None
    return PlanFile(plan, method, params)


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
