"""Writing files atomically (JSON, text, GraphML) and reading YAML / JSON with one-line errors."""

from __future__ import annotations

import json
import math
import os
import stat
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moeopt import schema
from moeopt.errors import InputError
from moeopt.outputs import atomic_path, note_input
from moeopt.result import json_text, jsonable

#: what numpy and zipfile raise for a damaged .npz or .npy file
_NPZ_ERRORS = (OSError, ValueError, EOFError, NotImplementedError, zipfile.BadZipFile, zlib.error)
PLAN_FORMAT = "moeopt.plan/2"
#: The first release's plan files (homes + replicas); still read.
PLAN_FORMAT_V1 = "moeopt.plan/1"
PROFILE_FORMAT = "moeopt.profile/1"
TRACE_FORMATS = schema.TRACE_FORMATS  # one list: the schema validates it too


def write_json(path: str | Path, data: Any) -> None:
    """``data`` as indented JSON (`json_text`: numpy values as plain
    numbers and lists, NaN and infinities as null), written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json_text(data))


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_graphml(path: str | Path, graph: Any) -> None:
    """A networkx graph as GraphML (``networkx.write_graphml``), written atomically."""
    import networkx as nx

    with atomic_path(path) as tmp:
        nx.write_graphml(graph, tmp)


_jsonable = jsonable  # the name the readers and writers of this package use


# ----------------------------------------------------------------------------- input files
def input_file(path: str | Path, what: str | None = None) -> Path:
    """``path`` checked as a readable regular file and recorded as an input of the running
    command (`moeopt.outputs.note_input`: no output may overwrite it).

    Raises
    ------
    InputError
        Naming the file and what it is instead: missing (or a dangling symbolic link), a
        directory, a FIFO, a device (``/dev/null``), a socket, or unreadable.
    """
    path = Path(path)
    src = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = os.path.islink(path)
        raise InputError(
            src, None, "file not found" + (" (a symbolic link to a missing file)" if dangling else "")
        ) from None
    except NotADirectoryError:
        raise InputError(src, None, "file not found (a folder on its path is a file)") from None
    except OSError as exc:
        raise InputError(src, None, f"cannot be read ({exc.strerror or exc})") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise InputError(src, None, "is a directory, expected a file")
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a special file"
        )
        raise InputError(src, None, f"is {kind}, not a regular file")
    if not os.access(path, os.R_OK):
        raise InputError(src, None, "cannot be read (no read permission)")
    note_input(path, what)
    return path


#: the first bytes of a zip archive (an .npz), of an .npy array and of a pickle (protocol 2+)
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


def _sniff(path: Path) -> str:
    """What a binary file's first bytes say it is, for a message."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    if not head:
        return "an empty file"
    if head.startswith(_ZIP_MAGIC):
        return "a zip archive"
    if head.startswith(_NPY_MAGIC):
        return "a single .npy array"
    if head[:1] == b"\x80":
        return "a pickle (never loaded: it could run code)"
    return "bytes of another format"


def open_npz(path: str | Path) -> Any:
    """An ``.npz`` archive opened without pickles (`numpy.load`, ``allow_pickle=False``);
    `InputError` for a file that is not one (checked by its first bytes, so numpy's
    pickle fallback never sees it)."""
    path = input_file(path)
    src = str(path)
    kind = _sniff(path)
    if kind != "a zip archive":
        raise InputError(src, None, f"not an npz archive (a zip of .npy arrays): found {kind}")
    try:
        return np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise InputError(src, None, f"not a readable npz archive ({_npz_reason(exc)})") from None


def open_npy(path: str | Path) -> np.ndarray:
    """A ``.npy`` array without pickles; `InputError` for any other file."""
    path = input_file(path)
    src = str(path)
    kind = _sniff(path)
    if kind != "a single .npy array":
        raise InputError(src, None, f"not an .npy array: found {kind}")
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except _NPZ_ERRORS as exc:
        raise InputError(src, None, f"not a readable .npy array ({_npz_reason(exc)})") from None


def npz_array(data: Any, key: str, src: str) -> np.ndarray:
    """``data[key]`` of an open npz archive; `InputError` (naming the key) for an array
    numpy cannot read: damaged, or of objects (pickled: moeopt never loads pickles)."""
    try:
        return np.asarray(data[key])
    except (*_NPZ_ERRORS, TypeError) as exc:
        raise InputError(src, key, f"expected a plain numeric array, found {_npz_reason(exc)}") from None


def _npz_reason(exc: BaseException) -> str:
    """numpy's error for an unreadable array, without its invitation to load pickles."""
    text = str(exc)
    if "allow_pickle" in text or "pickle" in text.lower():
        return "an array of Python objects (pickled: moeopt never loads pickles; save numeric arrays)"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"damaged data: {first}"


# ----------------------------------------------------------------------------- YAML helpers
#: libyaml's safe loader when built (same documents, several times faster), else PyYAML's
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: nodes that YAML aliases may add when expanded (``*anchor`` repeats its node); beyond it a
#: document is refused before it is constructed (nested aliases grow exponentially: a
#: "billion laughs" document of 600 bytes would expand to gigabytes)
MAX_ALIAS_NODES = 100_000


class YamlAliasError(Exception):
    """A YAML document whose aliases expand past `MAX_ALIAS_NODES` or refer to themselves."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_aliases(root: yaml.Node, budget: int = MAX_ALIAS_NODES) -> None:
    """Raise `YamlAliasError` when the node graph ``root`` (aliases are shared nodes)
    expands to more than ``budget`` nodes beyond its distinct ones, or holds a cycle. Counts
    each distinct node once (post-order, no recursion), so the check itself is linear."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > len(size) + budget:
                raise YamlAliasError(
                    f"expected aliases (*name) that add at most {budget:,} nodes when expanded, found one node "
                    f"that expands to {size[key]:,} (anchors repeated inside anchors)"
                )
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise YamlAliasError("expected no recursive alias (an anchor used inside itself)")
            if id(child) not in size:
                stack.append((child, False))


class _BoundedLoader(_YAML_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, with aliases checked before the document is constructed."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_aliases(node)
        return super().construct_document(node)


def load_yaml_text(text: str) -> Any:
    """A YAML document with the safe loader, aliases bounded (`check_aliases`)."""
    return yaml.load(text, Loader=_BoundedLoader)


def _read_yaml(path: Path, what: str | None = None) -> Any:
    input_file(path, what)
    try:
        data = load_yaml_text(path.read_bytes().decode("utf-8"))
    except YamlAliasError as exc:
        raise InputError(str(path), None, f"{exc}") from None
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
    """A JSON file's content, or one `InputError` line (not a regular file, bad UTF-8,
    syntax, nesting)."""
    input_file(path)
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
