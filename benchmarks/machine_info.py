"""What every benchmark records about the run: Python, CPUs, load, solver versions and the git state;
how a benchmark script ends (`run_script`) and how it reads a worker count (`workers_arg`)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Distributions whose versions change benchmark numbers (the solvers and the array stack).
PACKAGES = ("numpy", "scipy", "highspy", "ortools", "pyomo")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when it is not installed)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict:
    """Python version, processor, CPU count, load average at the start, the versions of
    :data:`PACKAGES`, the git commit and whether the tree had uncommitted changes (``git_dirty``:
    None when git is not available)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "git_commit": None if commit is None else commit.strip(),
        "git_dirty": None if status is None else bool(status.strip()),
        "load_average": list(os.getloadavg()),
        "versions": versions(),
    }


def run_script(main: Callable[[], int | None]) -> None:
    """Exit with ``main()``'s code; on Ctrl-C (or SIGTERM), ``interrupted`` on stderr and exit 130
    (143). The run is inside moeopt's signal handling (`moeopt.interrupt.handling`), so a signal
    stops the native solver running and is raised in the script even where a library would
    swallow it (a part that merges into existing results writes them only at its end, so nothing
    is written)."""
    from moeopt import interrupt

    try:
        with interrupt.handling(process_wide=False):
            code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        code = interrupt.exit_code()
    raise SystemExit(code)


def workers_arg(text: str) -> int:
    """``--workers``: an integer >= 1 (argparse then says so in one line and exits 2)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n
