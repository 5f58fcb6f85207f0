"""What the data classes need from the layers above them, provided by `moeopt.api`.

``Instance.from_counts`` validates through the instance schema reader of `moeopt.io`,
``Plan.to_engine`` writes an engine's file through `moeopt.io`, ``Result.to_json`` writes
a file: all of them sit above the data layer, and imports only point down
(``tests/test_layering.py``). So the data layer names here what it needs (`Services`),
and `moeopt.api`, which ``import moeopt`` loads before anything else can run, provides it
(`provide`). Importing any moeopt module imports the package first, so the services are
always there when a method of a data class runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from moeopt.instance import Instance
    from moeopt.plan import Plan


class Services(Protocol):
    """The calls the data classes make into the layers above them (`moeopt.api`)."""

    def instance(self, kind: str, workload: Any, evaluation: Any, options: Mapping[str, Any]) -> Instance:
        """An instance from in-memory data: ``kind`` is ``counts``, ``step_counts`` or ``trace``."""
        ...

    def instance_from_dict(self, data: Any, base: Path | None) -> Instance:
        """An instance from the instance-file schema as a mapping."""
        ...

    def write_engine_plan(
        self,
        plan: Plan,
        engine: str,
        path: str | Path,
        *,
        instance: Instance | None,
        dense_layers: int | None,
        load: np.ndarray | None,
    ) -> list[str]:
        """Write ``plan`` as ``engine``'s placement file; the notes of the export."""
        ...

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
        """Read ``engine``'s placement file into a plan."""
        ...

    def write_text(self, path: str | Path, text: str) -> None:
        """Write ``text`` to ``path`` atomically."""
        ...


_provided: Services | None = None


def provide(services: Services) -> None:
    """Install the implementation of `Services` (`moeopt.api` does, at import)."""
    global _provided
    _provided = services


def services() -> Services:
    """The installed `Services`."""
    if _provided is None:  # only when moeopt.api failed to import, which raised already
        raise RuntimeError("moeopt.api is not loaded: import moeopt")
    return _provided
