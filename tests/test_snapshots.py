"""Several recorded snapshots as one count workload (``trace import A B ...``): robust mode's input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moeopt.cli import main
from moeopt.io import combine_snapshots, load_instance, read_workload_file
from moeopt.solve import load_workloads, solve
from tests.conftest import INSTANCES

PREFILL = INSTANCES / "real" / "deepseek_v3_prefill_in1024.json"
DECODE = INSTANCES / "real" / "deepseek_v3_decode_in1000out1000.json"


def dump(path, source, experts=256):
    """The first 4 MoE layers of a bundled SGLang recording (plus its 3 dense rows)."""
    rows = json.loads(source.read_text())["logical_count"][:7]
    path.write_text(json.dumps({"logical_count": [r[:experts] for r in rows]}))
    return path


def test_snapshots_stack_as_steps_and_sum_as_counts(tmp_path, capsys):
    a, b = dump(tmp_path / "a.json", PREFILL), dump(tmp_path / "b.json", DECODE)
    out = tmp_path / "ab.npz"
    assert main(["trace", "import", str(a), str(b), str(a), "--top-k", "8", "--output", str(out)]) == 0
    assert "3 steps" in capsys.readouterr().out
    got = read_workload_file(out)
    sa, sb = read_workload_file(a, top_k=8), read_workload_file(b, top_k=8)
    assert got.step_counts is not None and got.step_counts.shape == (4, 3, 256)
    for t, s in enumerate((sa, sb, sa)):
        assert np.array_equal(got.step_counts[:, t, :], s.counts.sum(axis=0))
    assert np.allclose(got.counts.sum(axis=0), 2 * sa.counts.sum(axis=0) + sb.counts.sum(axis=0))
    # a file that already holds steps keeps them, in order
    both = combine_snapshots([("ab", got), ("a", sa)])
    assert both.step_counts is not None and both.step_counts.shape == (4, 4, 256)
    assert np.array_equal(both.step_counts[:, :3], got.step_counts)


def test_snapshots_feed_robust_mode(tmp_path):
    a, b = dump(tmp_path / "a.json", PREFILL), dump(tmp_path / "b.json", DECODE)
    assert (
        main(["trace", "import", str(a), str(b), "--top-k", "8", "--output", str(tmp_path / "ab.npz"), "--quiet"]) == 0
    )
    (tmp_path / "i.yaml").write_text(
        "model: {layers: 4, experts: 256, top_k: 8}\ncluster: {gpus: 32, slots_per_gpu: 8, replica_slots_per_gpu: 1}\n"
        "workload: {calibration: ab.npz}\nmethod: {name: balance, robust: mean}\n"
    )
    inst = load_instance(tmp_path / "i.yaml")
    r = solve(inst, workloads=load_workloads(inst))
    assert r.stats["robust"] == "mean" and r.stats["robust_snapshots"] == 2


def test_snapshots_of_another_model_are_one_line_errors(tmp_path, capsys):
    a, c = dump(tmp_path / "a.json", PREFILL), dump(tmp_path / "c.json", DECODE, experts=128)
    out = tmp_path / "ac.npz"
    assert main(["trace", "import", str(a), str(c), "--top-k", "8", "--output", str(out)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1
    assert str(c) in err.err and "expected 256 experts" in err.err
    assert not out.exists()
    with pytest.raises(ValueError, match="at least one"):
        combine_snapshots([])
