"""The package's version and, from a git checkout, its commit: what every report carries.

The version has one source of truth, ``[project] version`` in ``pyproject.toml``, read back
from the installed package's metadata (``importlib.metadata.version``). The commit is
asked of git only when the package runs from a git checkout (the folder above ``moeopt/``
holds ``.git``); anywhere else, or when git is missing or fails, it is absent, never an error.
"""

from __future__ import annotations

import functools
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "package_version", "provenance"]

#: the distribution name in ``pyproject.toml``
DISTRIBUTION = "moeopt"
#: the package's checkout, when it runs from one
ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def package_version() -> str:
    """The installed package's version (``pyproject.toml``'s), ``"0+unknown"`` when moeopt
    runs without being installed (no metadata to read)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


@functools.cache
def git_commit() -> str | None:
    """The commit of the git checkout the package runs from (40 hex digits, ``+dirty`` appended
    when tracked files differ from it), or None: not a checkout, git missing, or git failing."""
    if not (ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--"],
            capture_output=True,
            timeout=5,
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    if len(head) != 40 or any(c not in "0123456789abcdef" for c in head):
        return None
    return head + ("+dirty" if changed == 1 else "")


def provenance() -> dict[str, Any]:
    """The fields every JSON report carries: ``moeopt_version`` and, from a git checkout,
    ``git_commit`` (absent elsewhere)."""
    out: dict[str, Any] = {"moeopt_version": package_version()}
    commit = git_commit()
    if commit is not None:
        out["git_commit"] = commit
    return out
