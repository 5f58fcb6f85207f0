"""Latency profiles: ``moeopt.profile/1`` YAML."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from moeopt import schema
from moeopt.errors import InputError
from moeopt.io.files import (
    PROFILE_FORMAT,
    _array,
    _int,
    _jsonable,
    _mapping,
    _read_yaml,
    write_text,
)
from moeopt.profile import Profile


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
