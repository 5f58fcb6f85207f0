"""The notebooks run top to bottom with small parameters (their cells hold their own assertions).

Each notebook is committed with the outputs of a full run; here papermill injects small sizes
and short time limits (the cell tagged ``parameters``) and writes its figures to a temporary
directory, so the committed figures are never touched. The kernel starts in a folder outside
the repository: a notebook finds the repository from its own location (or moeopt's checkout),
never from the working directory, and its relative paths (instances, figures) start there.
"""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

papermill = pytest.importorskip("papermill")

#: notebook -> the small parameters of its test run (about 100 s for all of them on 2 cores)
SMALL = {
    "grouping-exact-vs-heuristic.ipynb": {
        "FULL": False,
        "SIZES": [[8, 2], [16, 4]],
        "EXACT_LIMITS": [1.5],
        "HEURISTIC_LIMIT": 1.0,
        "TOKENS": 2048,
    },
    "gem.ipynb": {
        "FULL": False,
        "SHAPES": {"Mixtral-8x7B": [8, 2, 4]},
        "SPREADS": [0.0, 0.3],
        "LAYERS": 1,
        "STEPS": 8,
        "TOKENS_PER_STEP": 256,
        "EXACT_LIMIT": 1.0,
        "GEM_PARAMS": {"rounds": 40, "patience": 10},
    },
    "balance-replication.ipynb": {
        "FULL": False,
        "FRONTIER_INSTANCE": "instances/quickstart.yaml",
        "FRONTIER_METHODS": ["joint", "agnostic", "hottest-replication", "balance"],
        "FRONTIER_EPS": [],
        "JOINT_EPS": [],
        "TIME_LIMIT": 0.5,
        "EPLB_POLICIES": ["global"],
    },
    "replanning.ipynb": {
        "FULL": False,
        "INSTANCE": "instances/replay/mixtral-domains-stream.yaml",
        "MODEL_SIZES": {"d_model": 4096, "d_ff": 14336},
        "FRONTIER_INTERVALS": [4, 8],
        "FRONTIER_BUDGETS": [2, 4],
        "MOVE_BUDGET_GB": 5.0,
    },
}


def test_every_notebook_has_small_parameters():
    """Every committed notebook is executed by the test below."""
    assert sorted(SMALL) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_executes(name, tmp_path):
    """Execute every cell with small parameters; an exception or failed assertion fails the test."""
    params = {**SMALL[name], "FIG_DIR": str(tmp_path / "figures")}
    elsewhere = tmp_path / "elsewhere"  # not the repository, nor the notebooks' folder
    elsewhere.mkdir()
    papermill.execute_notebook(
        str(ROOT / "notebooks" / name),
        str(tmp_path / name),
        parameters=params,
        kernel_name="python3",
        cwd=str(elsewhere),
        progress_bar=False,
    )
    assert any((tmp_path / "figures").glob("*.png"))
    assert not list(elsewhere.iterdir())  # nothing written where the kernel started


def test_notebooks_write_figures_next_to_them():
    """Each notebook's default figure folder is notebooks/figures (relative to the repository)."""
    import json

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        (params,) = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert 'FIG_DIR = "notebooks/figures"' in "".join(params["source"]), path.name
