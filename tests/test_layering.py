"""Imports only point down: every moeopt module sits in a layer and imports none above it.

The layers, lowest first (a module may import its own layer and those below):

* ``data``: the problem, the plan, the result and plain helpers (errors, signals, clock, console),
  and ``services``: what the data classes call above them, provided by ``api`` (dependency inversion);
* ``scoring``: dispatch and the metrics, the single judge of every plan;
* ``models``: problem models and their bounds (balance, joint, relabel), trace synthesis, and
  the search parts they share with the heuristics (``moves``: the slot state and the descent
  driver; ``packing``: LPT packing);
* ``search``: heuristics and exact solver backends (a backend imports no other backend,
  only the shared ``highs_common``);
* ``methods``: the method protocol and registry, the layer-by-layer executor, the methods
  (``moeopt.methods`` registers the built-in ones; the registry imports it to fill itself);
* ``files``: reading and writing files, engine formats;
* ``api``: ``solve``, ``frontier``, ``replay`` (the re-planning replay) and ``api`` (the public
  API's own functions, and the ``services`` implementation);
* ``front``: the command line, plots, the GPU harness and the package's re-exports.

Imports under ``if TYPE_CHECKING:`` are exempt (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "moeopt"

LAYERS: list[tuple[str, list[str]]] = [
    (
        "data",
        [
            "errors",
            "version",
            "extras",
            "services",
            "interrupt",
            "budget",
            "console",
            "schema",
            "instance",
            "topology",
            "plan",
            "grouping",
            "trace",
            "profile",
            "result",
            "outcome",
        ],
    ),
    ("scoring", ["dispatch", "evaluate", "scoring", "utilization"]),
    (
        "models",
        [
            "bounds",
            "balance",
            "balance.*",
            "joint",
            "joint.*",
            "relabel",
            "synth",
            "streams",
            "moves",
            "moves.*",
            "packing",
        ],
    ),
    (
        "search",
        [
            "heuristics",
            "heuristics.*",
            "solvers",
            "solvers.*",
            "colgen",
            "colgen.*",
            "crosslayer",
            "crosslayer.*",
            "joint.layers",  # joint's per-layer search (hierarchical mode uses heuristics.hierarchy)
        ],
    ),
    # joint.certify and joint.planner: joint's certificate and pipeline, run on the executor
    ("methods", ["registry", "execute", "methods", "methods.*", "joint.certify", "joint.planner"]),
    ("files", ["io", "io.*", "interop", "interop.*", "outputs"]),
    ("api", ["solve", "frontier", "replay", "replay.*", "api"]),
    ("front", ["", "__main__", "cli", "cli.*", "plot", "harness", "harness.*"]),
]

#: solver backends: none imports another (they may share ``solvers.highs_common`` and the Pyomo
#: solver choice, ``solvers.pyomo_solvers``)
BACKENDS_SHARED = {"moeopt.solvers", "moeopt.solvers.highs_common", "moeopt.solvers.pyomo_solvers"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """Index of ``module``'s layer (most specific pattern wins), None if unassigned."""
    rel = module.removeprefix("moeopt").removeprefix(".")
    for i, (_, patterns) in enumerate(LAYERS):
        if rel in patterns:
            return i
    for i, (_, patterns) in enumerate(LAYERS):
        for pat in patterns:
            if pat.endswith(".*") and rel.startswith(pat[:-1]):
                return i
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def imports(module: str) -> list[tuple[str, int]]:
    """The moeopt modules ``module`` imports (top level and inside functions), with line numbers."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "moeopt"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "moeopt":
                continue
            for alias in node.names:  # ``from moeopt import io`` imports the module moeopt.io
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in MODULES else target, node.lineno))
    return sorted(set(found))


def test_every_module_has_a_layer() -> None:
    """Each module of the package is placed in a layer (a new module must be placed)."""
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, f"modules without a layer in tests/test_layering.py: {missing}"


def test_imports_point_down() -> None:
    """No module imports a module of a higher layer (top-level or function-level imports)."""
    upward = []
    for module in MODULES:
        own = layer_of(module)
        for target, line in imports(module):
            there = layer_of(target)
            if own is not None and there is not None and there > own:
                upward.append(
                    f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} ({LAYERS[own][0]}) "
                    f"imports {target} ({LAYERS[there][0]})"
                )
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_solver_backends_are_independent() -> None:
    """A solver backend imports no other backend, only the shared HiGHS helpers."""
    crossing = []
    for module in MODULES:
        if not module.startswith("moeopt.solvers.") or module in BACKENDS_SHARED:
            continue
        for target, line in imports(module):
            if target.startswith("moeopt.solvers") and target not in BACKENDS_SHARED and target != module:
                crossing.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} imports {target}")
    assert not crossing, "solver backends importing each other:\n" + "\n".join(crossing)


def test_checker_sees_function_level_imports() -> None:
    """The parser finds imports inside functions and skips TYPE_CHECKING blocks."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from moeopt.cli import main\n"
        "def f():\n    from moeopt.solve import solve\n"
    )
    tree = ast.parse(source)
    skip = _type_checking_nodes(tree)
    seen = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and id(n) not in skip]
    assert seen == ["typing", "moeopt.solve"]
    assert layer_of("moeopt.methods.gem") > layer_of("moeopt.heuristics.gem_search")
    assert layer_of("moeopt") == len(LAYERS) - 1
