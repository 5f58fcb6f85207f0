"""MkDocs hooks: pages generated at build time from the repository's own truth.

- ``benchmarks/*.md`` and their figures, from ``benchmarks/results/*.json`` (``docs/benchmark_pages.py``),
  with the README's headline table (``benchmarks/readme_table.py``);
- ``reference/cli.md``, from the command-line parser itself (``moeopt.cli.build_parser``);
- ``javascripts/vendor/mathjax/``: MathJax 3's ``tex-svg`` bundle (one file, no fonts to fetch) and its
  licence, copied from the installed ``django-static-mathjax`` package, so the site serves its own
  MathJax and formulas render offline (``mkdocs.yml`` loads it after ``javascripts/mathjax.js``);

The notebooks (``docs/notebooks/*.ipynb``, links to ``notebooks/``) are rendered with their
committed outputs by mkdocs-jupyter, which does not execute them (the tests do).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}"
                nested = _subcommands(sub, full)
                out += nested or [(full, sub)]
    return out


def cli_page() -> str:
    """Every command's ``--help``, as the parser prints it."""
    if str(ROOT) not in sys.path:  # mkdocs restores sys.path after loading a hook module
        sys.path.insert(0, str(ROOT))
    from moeopt.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it so the page does not depend on it
    try:
        parser = build_parser()
        parser.prog = "python -m moeopt"
        lines = [
            "# Command-line reference",
            "",
            "Generated from the parser (`moeopt.cli.build_parser`) when the site is built; "
            "[Command line](../guides/cli.md) has examples.",
            "",
        ]
        for name, sub in _subcommands(parser, "python -m moeopt"):
            lines += [
                f"## `{name.removeprefix('python -m moeopt ')}`",
                "",
                "```text",
                sub.format_help().rstrip(),
                "```",
                "",
            ]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(lines)


MATHJAX_DIST = "django-static-mathjax"
MATHJAX_DIR = "javascripts/vendor/mathjax"
MATHJAX_FILES = {"tex-svg.js": "mathjax/static/mathjax/es5/tex-svg.js", "LICENSE": "mathjax/static/mathjax/LICENSE"}


def mathjax_files() -> dict[str, Path]:
    """Site path -> installed file of the MathJax bundle the pages load (see ``extra_javascript``)."""
    try:
        dist = importlib.metadata.distribution(MATHJAX_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise PluginError(
            f"MathJax is not installed: the docs serve it from the {MATHJAX_DIST} package (pip install -e '.[dev]')"
        ) from None
    out = {f"{MATHJAX_DIR}/{name}": Path(str(dist.locate_file(rel))) for name, rel in MATHJAX_FILES.items()}
    missing = [str(path) for path in out.values() if not path.is_file()]
    if missing:
        raise PluginError(f"{MATHJAX_DIST} {dist.version} lacks {', '.join(missing)}: expected MathJax 3's es5 bundles")
    return out


def on_files(files: Files, config) -> Files:
    pages = _module(ROOT / "docs" / "benchmark_pages.py")
    readme_table = _module(ROOT / "benchmarks" / "readme_table.py")
    headline = readme_table.table(link=lambda name: f"{name}.md")
    generated = dict(pages.pages(headline))
    generated["reference/cli.md"] = cli_page()
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    for uri, path in {**pages.figures(), **mathjax_files()}.items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
