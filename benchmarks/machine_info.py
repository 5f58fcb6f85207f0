"""What every benchmark records about the run: Python, CPUs, load and the git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """Python version, processor, CPU count, load average at the start, and the git commit."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "git_commit": commit,
            "load_average": list(os.getloadavg())}
