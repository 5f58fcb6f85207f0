"""Latency profiles: a measured one-GPU profile stands for a cluster of identical GPUs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeopt.errors import InputError
from moeopt.io import load_instance, read_profile, resolve_profile
from moeopt.profile import Profile
from moeopt.solve import solve

DATA = Path(__file__).parent / "data"


def test_one_gpu_profile_broadcasts_to_identical_gpus():
    """Profile.broadcast repeats the single row G times and notes it in meta."""
    one = read_profile(DATA / "profile-1gpu.yaml")
    four = one.broadcast(4)
    assert four.gpus == 4 and four.tile == one.tile
    assert np.array_equal(four.latency, np.repeat(one.latency, 4, axis=0))
    assert four.meta["note"] == "profile: one GPU broadcast to 4 identical GPUs"
    assert four.meta["speeds"] == [1.0] * 4 and len(set(four.names)) == 4
    tokens = np.array([[10.0, 70.0, 130.0, 500.0]])
    assert np.allclose(four(tokens)[0], [one(np.array([[n]]))[0, 0] for n in tokens[0]])
    assert np.allclose(four.speed, 1.0)


def test_only_a_one_gpu_profile_broadcasts():
    """A profile of several GPUs is not silently broadcast."""
    three = read_profile(DATA / "profile-3gpus.yaml")
    with pytest.raises(InputError, match="only a one-GPU profile"):
        three.broadcast(4)
    with pytest.raises(InputError):
        Profile(tile=64, latency=np.array([[0.0, 1.0]])).broadcast(0)


def test_instance_with_one_gpu_profile_resolves_and_notes_it():
    """An instance on 4 GPUs with a one-GPU profile file gets 4 rows; solve reports the broadcast."""
    inst = load_instance(DATA / "profile_one_gpu_cluster.yaml")
    profile = resolve_profile(inst)
    assert profile is not None and profile.gpus == 4
    result = solve(inst)
    assert result.stats["profile"] == "profile: one GPU broadcast to 4 identical GPUs"


def test_other_gpu_count_mismatch_is_still_refused():
    """A 3-GPU profile on a 4-GPU cluster stays an input error."""
    inst = load_instance(DATA / "invalid_profile_gpus.yaml")
    with pytest.raises(InputError, match="profile has 3 GPUs, cluster.gpus is 4"):
        resolve_profile(inst)


def test_validate_broadcasts_a_one_gpu_profile_file(tmp_path):
    """validate --profile with a one-GPU file on 2 GPUs: broadcast, noted in the report and the Markdown."""
    pytest.importorskip("torch")
    import json

    from moeopt.cli import main

    inst = tmp_path / "tiny.yaml"
    inst.write_text(
        "model: {layers: 1, experts: 8, top_k: 2}\ncluster: {gpus: 2}\n"
        "workload:\n  synthetic: {tokens: 256, steps: 4, seed: 3}\n"
    )
    rep, md = tmp_path / "r.json", tmp_path / "r.md"
    size = ["--device", "cpu", "--d-model", "32", "--d-ff", "64", "--quiet"]
    assert (
        main(
            [
                "validate",
                str(inst),
                *size,
                "--profile",
                str(DATA / "profile-1gpu.yaml"),
                "--max-steps",
                "2",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--report",
                str(rep),
                "--markdown",
                str(md),
            ]
        )
        == 0
    )
    report = json.loads(rep.read_text())
    assert report["modelled_profile"]["note"] == "profile: one GPU broadcast to 2 identical GPUs"
    assert report["speeds"] == [1.0, 1.0]
    assert "one GPU broadcast to 2 identical GPUs" in md.read_text()
