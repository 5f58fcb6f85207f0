"""Docstrings are Markdown that mkdocstrings renders: no raw Sphinx roles (``:func:`x```) in moeopt/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A reStructuredText role (``:func:`x```, ``:py:class:`x```, ``:math:`x```): mkdocstrings prints it as
# it stands. Write an autorefs cross-reference ``[`name`][moeopt.module.name]`` to an object the API
# pages document (``mkdocs build --strict`` fails on one that does not resolve), else ``name`` in backticks.
ROLE = re.compile(r"(?<![\w`]):(?:[a-z]+:)?[a-z]+:`[^`\n]+`")

# Files other engineers were editing when the roles were converted (issue 43): the same conversion is
# to be run on them, and then this list goes.
ALLOWED: set[str] = set()


def docstrings(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring of a module: module, class, function and attribute ones
    (every bare string statement), ``text`` as written in the source."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int, col: int) -> int:  # ast columns count UTF-8 bytes
        text = source[starts[line - 1] : starts[line]]
        return starts[line - 1] + len(text.encode()[:col].decode(errors="ignore"))

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            value = node.value
            end = offset(value.end_lineno or value.lineno, value.end_col_offset or 0)
            out.append((value.lineno, source[offset(value.lineno, value.col_offset) : end]))
    return sorted(out)


def raw_roles(source: str) -> list[tuple[int, str]]:
    """``(line, role)`` of every raw role in the docstrings of ``source``."""
    found = []
    for line, text in docstrings(source):
        found += [(line + text.count("\n", 0, m.start()), m.group(0)) for m in ROLE.finditer(text)]
    return found


def test_docstrings_have_no_raw_roles() -> None:
    """No docstring in moeopt/ holds a raw Sphinx role (outside the files still to convert)."""
    found = []
    for path in sorted((ROOT / "moeopt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in ALLOWED:
            found += [f"{rel}:{line}: {role}" for line, role in raw_roles(path.read_text())]
    assert not found, "raw roles mkdocstrings does not render (use [`name`][moeopt.x.name] or `name`):\n" + "\n".join(
        found
    )


def test_raw_roles_are_found_in_every_kind_of_docstring() -> None:
    """The check finds a role in module, class, method and attribute docstrings, at its line, and nothing else."""
    source = '''"""Module: see :mod:`moeopt.plan`."""

LIMIT = 3
"""Attribute, :data:`LIMIT`."""
NOTE = ":func:`not_a_docstring`"  # a comment with :func:`f`


class A:
    """A class; its method
    :meth:`A.run` and :py:class:`~moeopt.plan.Plan`."""

    def run(self) -> None:
        """Fine: [`Plan`][moeopt.plan.Plan], `name`, ``:func:`literal` ``, then
        :func:`bad`, and math :math:`x^2`."""
'''
    assert raw_roles(source) == [
        (1, ":mod:`moeopt.plan`"),
        (4, ":data:`LIMIT`"),
        (10, ":meth:`A.run`"),
        (10, ":py:class:`~moeopt.plan.Plan`"),
        (14, ":func:`bad`"),
        (14, ":math:`x^2`"),
    ]
