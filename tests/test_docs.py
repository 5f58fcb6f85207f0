"""The documentation site builds strictly, and its numbers and the README's come from the results files."""

from __future__ import annotations

import html as html_lib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK_START = 'pip install -e ".[dev]" && python -m moeopt solve instances/quickstart.yaml\npython -m pytest\n'


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_test_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _text_outside_math(html: str) -> str:
    """The visible text of a page without its math (arithmatex) and code: a ``$`` left there is unrendered math."""
    for pattern in (r'<span class="arithmatex">.*?</span>', r'<div class="arithmatex">.*?</div>', r"<code>.*?</code>"):
        html = re.sub(pattern, "", html, flags=re.S)
    body = re.sub(r"<[^>]*>", "", html.split("<article", 1)[-1].split("</article>", 1)[0])
    return body


@pytest.fixture(scope="module")
def readme_table() -> ModuleType:
    """``benchmarks/readme_table.py`` as a module."""
    return _module(ROOT / "benchmarks" / "readme_table.py")


@pytest.fixture(scope="module")
def pages() -> ModuleType:
    """``docs/benchmark_pages.py`` as a module."""
    return _module(ROOT / "docs" / "benchmark_pages.py")


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds with no warning and writes the generated benchmark and API pages."""
    for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        pytest.importorskip(name, reason=f"{name} is not installed: the docs extra (pip install -e '.[dev]')")
    try:
        importlib.metadata.distribution("django-static-mathjax")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("django-static-mathjax (the site's MathJax) is not installed: pip install -e '.[dev]'")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr
    balance = json.loads((ROOT / "benchmarks" / "results" / "balance.json").read_text())
    html = (site / "benchmarks" / "balance" / "index.html").read_text()
    assert f"{balance['rows'][0]['maxvio_even']:.4f}" in html
    assert balance["info"]["machine"]["git_commit"] in html
    assert (site / "benchmarks" / "balance.png").exists()
    assert "moeopt.plan.Plan" in (site / "reference" / "api" / "plan" / "index.html").read_text()
    for page in (site / "formulations").glob("*/index.html"):
        assert 'class="arithmatex"' in page.read_text()
        assert "$" not in _text_outside_math(page.read_text()), f"unrendered math on {page}"
    assert "usage:" in (site / "reference" / "cli" / "index.html").read_text()
    assert (site / "javascripts" / "vendor" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000
    assert "Apache License" in (site / "javascripts" / "vendor" / "mathjax" / "LICENSE").read_text()
    pages = sorted(site.rglob("*.html"))
    remote = [p for p in pages if re.search(r"<script[^>]*\ssrc=[\"']?(?:https?:)?//", p.read_text())]
    assert not remote, f"pages loading a script from another site (offline they break): {remote}"
    for page in (site / "formulations").glob("*/index.html"):  # MathJax from the site itself
        assert 'src="../../javascripts/vendor/mathjax/tex-svg.js"' in page.read_text(), page
    # no raw Sphinx role on any page, but those still in the docstrings of the files tests/test_docstrings.py skips
    checker = _module(ROOT / "tests" / "test_docstrings.py")
    skipped = {
        re.sub(r"`(.*)`$", r"\1", role)
        for rel in checker.ALLOWED
        if (ROOT / rel).is_file()
        for _, role in checker.raw_roles((ROOT / rel).read_text())
    }
    shown = sorted(
        f"{p.relative_to(site)}: :{m.group(1)}{html_lib.unescape(m.group(2))}"
        for p in pages
        for m in re.finditer(r"(?<![\w`]):((?:[a-z]+:)?[a-z]+:)<code>([^<]*)</code>", p.read_text())
    )
    raw = [r for r in shown if r.split(": ", 1)[1] not in skipped]
    assert not raw, "raw roles rendered as text:\n" + "\n".join(raw)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):  # every notebook is a page, outputs included
        assert (ROOT / "docs" / "notebooks" / notebook.name).resolve() == notebook.resolve(), f"link {notebook.name}"
        html = (site / "notebooks" / notebook.stem / "index.html").read_text()
        assert "data:image/png;base64" in html, f"{notebook.name}: the page shows no figure"


def test_readme_table_is_current(readme_table: ModuleType) -> None:
    """The results table in README.md is what `python benchmarks/readme_table.py` generates now."""
    text = (ROOT / "README.md").read_text()
    assert readme_table.block() in text
    assert readme_table.main(["--check"]) == 0


def test_readme_table_detects_and_fixes_a_stale_table(readme_table: ModuleType, tmp_path: Path) -> None:
    """A README whose table differs from the results fails `--check`; the script rewrites only the block."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    data = json.loads((results / "gem.json").read_text())
    data["rows"][0]["methods"]["gem"]["S_vs_linear"] = 99.0  # a new run with another best configuration
    (results / "gem.json").write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    args = ["--readme", str(readme), "--results", str(results)]
    assert readme_table.main([*args, "--check"]) == 1
    before = readme.read_text()
    assert readme_table.main(args) == 0
    after = readme.read_text()
    assert readme_table.main([*args, "--check"]) == 0
    assert "-99.0 % best" in after and "-99.0 % best" not in before
    head, tail = before.split(readme_table.BEGIN)[0], before.split(readme_table.END)[1]
    assert after.startswith(head) and after.endswith(tail)


def test_readme_without_markers_is_an_error(readme_table: ModuleType) -> None:
    """Replacing the block in a text without the markers raises instead of appending."""
    with pytest.raises(ValueError, match="markers"):
        readme_table.replace_block("# no table here\n", readme_table.block())


def test_readme_keeps_the_quick_start() -> None:
    """The README's two quick-start commands are unchanged and it stays under 200 lines."""
    text = (ROOT / "README.md").read_text()
    assert QUICK_START in text
    assert len(text.splitlines()) < 200


def test_benchmark_pages_follow_the_results_files(pages: ModuleType, tmp_path: Path) -> None:
    """A benchmark page shows the numbers of its results file, not copies: change the file, the page changes."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    data = json.loads((results / "joint.json").read_text())
    data["summary"][0]["unconstrained_reduction"] = 12.345
    (results / "joint.json").write_text(json.dumps(data))
    generated = pages.pages("headline", results)
    lines = generated["benchmarks/joint.md"].splitlines()
    assert any(line.startswith(f"| {data['summary'][0]['instance']}") and "| 12.3 " in line for line in lines)
    assert set(generated) >= {f"benchmarks/{b.name}.md" for b in pages.present(results)} | {"benchmarks/index.md"}
    for b in pages.present(results):
        assert b.command in generated[f"benchmarks/{b.name}.md"]


def test_readme_prose_has_no_hand_copied_numbers(readme_table: ModuleType) -> None:
    """Outside the generated block the README holds no measured numbers (decimals, percentages, timings)."""
    text = (ROOT / "README.md").read_text()
    prose = text.split(readme_table.BEGIN)[0] + text.split(readme_table.END)[1]
    found = re.findall(r"\d+\.\d+|\d+ ?%|\d+ ?(?:s|ms|min)\b|\d+(?:\.\d+)?x\b", prose)
    assert not found, f"numbers in README prose (generate them or link the benchmark pages): {found}"


def test_readme_links_resolve() -> None:
    """Every relative link in README.md points to a file or folder of the repository."""
    text = (ROOT / "README.md").read_text()
    targets = [m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)]
    assert targets
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (ROOT / t).exists()]
    assert not missing
