"""Shared fixtures and the hypothesis profiles: ``ci`` (default, derandomized), ``explore`` and ``dev`` (random)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

#: examples per property test in the default profile (hypothesis's own default); ``examples(n)`` in tests/strategies.py
#: scales a test's own ``max_examples`` by the loaded profile's share of this
BASE_EXAMPLES = 100
# The default profile (what CI runs) is derandomized: the same examples on every run, so a
# green main stays green; the data is drawn by hypothesis itself, so a failure shrinks to a
# minimal example. ``explore`` draws fresh random data (3x the examples; ``dev`` 4x) for local bug hunts.
_common = {"deadline": None, "print_blob": True, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=BASE_EXAMPLES, derandomize=True, database=None, **_common)
settings.register_profile("explore", max_examples=3 * BASE_EXAMPLES, derandomize=False, **_common)
settings.register_profile("dev", max_examples=4 * BASE_EXAMPLES, derandomize=False, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A shell starts a background job (``pytest ... &``) with SIGINT ignored, and an ignored signal stays
# ignored (moeopt keeps it so, as a command should); the Ctrl-C tests send SIGINT as a terminal
# would, so the suite takes Python's own handler back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
DATA = Path(__file__).resolve().parent / "data"
REAL = ROOT.parent / "shared" / "data" / "real"


@pytest.fixture(autouse=True)
def _console_mode():
    """Every test starts with the console in its default mode (a command run in-process with
    ``--quiet`` sets the module's mode for the rest of the process)."""
    from moeopt import console

    console.configure()
    yield
    console.configure()


@pytest.fixture(scope="session")
def quickstart_path() -> Path:
    """The bundled quickstart instance."""
    return INSTANCES / "quickstart.yaml"


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real router statistics: the shared originals when present, else the bundled copies."""
    return REAL if REAL.is_dir() else INSTANCES / "real"


@pytest.fixture
def pooled_balance_quickstart(tmp_path) -> Path:
    """The quickstart instance with ``balance`` on pooled loads (``robust: none``): one batched
    pass over all layers, solved whole (robust planning on its steps is split per layer)."""
    import yaml

    src = INSTANCES / "quickstart.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["workload"] = {k: str(src.parent / v) for k, v in doc["workload"].items()}
    doc["method"] = {"name": "balance", "robust": "none"}
    path = tmp_path / "pooled-balance.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def deepseek_few_layers(tmp_path_factory):
    """Layers 3-6 of the real DeepSeek-V3 prefill loads (plus the three dense rows SGLang records)."""
    import json

    data = json.loads((INSTANCES / "real" / "deepseek_v3_prefill_in1024.json").read_text())
    path = tmp_path_factory.mktemp("ds") / "ds.json"
    path.write_text(json.dumps({"logical_count": data["logical_count"][:7]}))
    return path
