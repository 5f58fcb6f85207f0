"""The public API is what notebooks and documentation use: no example imports an internal module,
and the README's and the API guide's examples run."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

import moeopt
from tests.conftest import ROOT

#: modules a user may import beside ``moeopt`` itself (moeopt/__init__.py's docstring, docs/guides/api.md)
PUBLIC_MODULES = {"moeopt", "moeopt.replay", "moeopt.plot"}
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one Python source (IPython magics and shell lines dropped)."""
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            lines += [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def markdown_code(path: Path) -> list[str]:
    """The fenced ``python`` blocks of a Markdown file."""
    return FENCE.findall(path.read_text())


def private_uses(source: str) -> list[str]:
    """Every use of an internal module in ``source``: ``import moeopt.x``, ``from moeopt.x import``,
    ``from moeopt import name`` or ``moeopt.name`` for a name outside the public API."""
    public_names = set(moeopt.__all__) | {m.rpartition(".")[2] for m in PUBLIC_MODULES if m != "moeopt"}
    public_names |= {"__version__", "__file__"}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("moeopt.") and a.name not in PUBLIC_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "moeopt":
            if node.module not in PUBLIC_MODULES:
                found.append(f"from {node.module} import ...")
            elif node.module == "moeopt":
                found += [f"from moeopt import {a.name}" for a in node.names if a.name not in public_names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "moeopt":
            if node.attr not in public_names:
                found.append(f"moeopt.{node.attr}")
    return found


def example_sources() -> list[tuple[str, str]]:
    """(where, source) of every notebook and of every Python block in README.md and docs/**/*.md."""
    out = [(p.relative_to(ROOT).as_posix(), notebook_code(p)) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, block in enumerate(markdown_code(md)):
            out.append((f"{md.relative_to(ROOT).as_posix()} block {i + 1}", block))
    return out


def test_examples_use_only_the_public_api():
    """No notebook, README or docs example imports an internal module or a name outside ``moeopt.__all__``."""
    sources = example_sources()
    assert any(where.startswith("notebooks/") for where, _ in sources)
    assert any(where.startswith("README.md") for where, _ in sources)
    bad = [f"{where}: {use}" for where, source in sources for use in private_uses(source)]
    assert not bad, "internal modules used by examples (use the public API, moeopt.__all__):\n" + "\n".join(bad)


def test_the_check_finds_internal_imports():
    """The checker flags internal modules and names, and passes the public ones."""
    source = (
        "import moeopt\nimport moeopt.io\nfrom moeopt.registry import get_method\n"
        "from moeopt import solve, registry\nfrom moeopt.replay import replay\nfrom moeopt.plot import draw_loads\n"
        "moeopt.solve(x)\nmoeopt.scoring.score(p)\n"
    )
    assert private_uses(source) == [
        "moeopt.io",
        "from moeopt.registry import ...",
        "from moeopt import registry",
        "moeopt.scoring",
    ]


def test_the_public_api_is_documented():
    """Every name of ``moeopt.__all__`` exists and has a docstring; the public modules list theirs."""
    for name in moeopt.__all__:
        obj = getattr(moeopt, name)
        assert (obj.__doc__ or "").strip(), name
    for name in ("moeopt.plot", "moeopt.replay"):
        module = importlib.import_module(name)
        assert all(hasattr(module, n) for n in module.__all__), name
    listed = (ROOT / "docs" / "guides" / "api.md").read_text()
    missing = [n for n in moeopt.__all__ if f"`{n}" not in listed and f"{n}`" not in listed and f" {n}," not in listed]
    assert not missing, f"docs/guides/api.md does not name {missing}"


def readme_api_block() -> str:
    """The Python block of the README's "Python API" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    (block,) = markdown_code_text(section)
    return block


def markdown_code_text(text: str) -> list[str]:
    return FENCE.findall(text)


def test_readme_example_runs(tmp_path, monkeypatch):
    """The README's three lines run as written: a counts tensor in, an SGLang placement file out."""
    monkeypatch.chdir(tmp_path)
    counts = np.random.default_rng(3).integers(1, 500, size=(3, 32))
    try:
        import torch

        counts = torch.tensor(counts)  # what a live engine's counters are
    except ImportError:
        pass
    block = readme_api_block()
    assert "from_counts(counts" in block and "to_engine(" in block
    namespace: dict = {"counts": counts}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102  (the README's own example)
    written = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    assert len(written) == 1
    inst = namespace["inst"]
    back = moeopt.Plan.from_engine(written[0], "sglang", instance=inst)
    assert back.same_layout(namespace["result"].plan)


def test_api_guide_examples_run(tmp_path, monkeypatch):
    """The blocks of docs/guides/api.md run in order, in one namespace, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    blocks = markdown_code(ROOT / "docs" / "guides" / "api.md")
    assert len(blocks) >= 6
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/guides/api.md block {i + 1}", "exec"), namespace)  # noqa: S102
    assert (tmp_path / "expert-location.json").is_file() and (tmp_path / "report.json").is_file()
    assert json.loads((tmp_path / "report.json").read_text()) == namespace["report"]


@pytest.mark.parametrize("name", ["replay", "plot"])
def test_public_modules_are_named_in_the_package_docstring(name):
    """The package docstring names each public module beside it."""
    assert f"moeopt.{name}" in (moeopt.__doc__ or "")
