"""Writing files atomically (JSON, text, GraphML) and reading YAML / JSON with one-line errors."""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moeopt import schema
from moeopt.errors import InputError
from moeopt.outputs import atomic_path

#: what numpy and zipfile raise for a damaged .npz or .npy file
_NPZ_ERRORS = (OSError, ValueError, EOFError, NotImplementedError, zipfile.BadZipFile, zlib.error)
PLAN_FORMAT = "moeopt.plan/2"
#: The first release's plan files (homes + replicas); still read.
PLAN_FORMAT_V1 = "moeopt.plan/1"
PROFILE_FORMAT = "moeopt.profile/1"
TRACE_FORMATS = schema.TRACE_FORMATS  # one list: the schema validates it too


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


def _array(value: Any, src: str, field: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(src, field, "expected a rectangular array of numbers") from None
    return arr
