"""Shared fixtures and the hypothesis profile used in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
DATA = Path(__file__).resolve().parent / "data"
REAL = ROOT.parent / "shared" / "data" / "real"


@pytest.fixture(scope="session")
def quickstart_path() -> Path:
    """The bundled quickstart instance."""
    return INSTANCES / "quickstart.yaml"


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real router statistics: the shared originals when present, else the bundled copies."""
    return REAL if REAL.is_dir() else INSTANCES / "real"
