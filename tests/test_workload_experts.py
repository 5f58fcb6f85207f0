"""The instance's ``model.experts`` is the truth: a workload that never routes its highest
expert ids is widened to it; ids at or above it are an error naming the file and field."""

from __future__ import annotations

import numpy as np
import pytest

from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.io import load_instance, write_trace
from moeopt.solve import load_workloads, solve
from moeopt.trace import Stats, Trace

L, E, K = 2, 8, 2


def _trace(top: int, *, num_experts: int | None = None, tokens: int = 40) -> Trace:
    """A trace whose ids lie in [0, top]; every id in that range is routed."""
    rng = np.random.default_rng(top)
    ids = np.stack([np.argsort(rng.random((tokens, top + 1)), axis=1)[:, :K] for _ in range(L)], axis=1)
    ids[0, 0] = [top, top - 1]
    return Trace(
        topk=ids.astype(np.int16),
        family=np.zeros(tokens, dtype=np.int32),
        step=(np.arange(tokens) // 10).astype(np.int32),
        family_names=("all",),
        num_experts=num_experts or top + 1,
    )


def _instance(tmp_path, workload: str, experts: int = E) -> str:
    path = tmp_path / "inst.yaml"
    path.write_text(
        f"name: t\nmodel: {{layers: {L}, experts: {experts}, top_k: {K}}}\ncluster: {{gpus: 4}}\n"
        f"workload: {{calibration: {workload}}}\nmethod: {{name: linear}}\n"
    )
    return str(path)


def test_trace_with_unused_top_expert_is_widened(tmp_path):
    """A single-task trace whose expert 7 is never routed loads as E = 8 (model.experts)."""
    write_trace(tmp_path / "t.npz", _trace(E - 2))  # ids 0..6: the file says 7 experts
    inst = load_instance(_instance(tmp_path, "t.npz"))
    wl = load_workloads(inst)
    assert isinstance(wl.calibration, Trace) and wl.calibration.num_experts == E
    stats = wl.calibration.stats()
    assert stats.experts == E and stats.expert_load[:, E - 1].sum() == 0
    result = solve(inst)
    assert result.plan.experts == E
    assert main(["solve", _instance(tmp_path, "t.npz"), "--quiet"]) == 0


@pytest.mark.parametrize("suffix", [".npy", ".csv", ".npz"])
def test_counts_with_fewer_columns_are_widened(tmp_path, suffix):
    """Count files with E - 1 columns are padded with a zero column (per-step counts too)."""
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 50, (L, E - 1)).astype(float)
    path = tmp_path / f"c{suffix}"
    if suffix == ".npy":
        np.save(path, counts)
    elif suffix == ".csv":
        np.savetxt(path, counts, delimiter=",")
    else:
        steps = rng.integers(0, 9, (L, 3, E - 1)).astype(float)
        np.savez(path, counts=counts, top_k=np.array(K), step_counts=steps)
    wl = load_workloads(load_instance(_instance(tmp_path, path.name)))
    st = wl.calibration
    assert isinstance(st, Stats) and st.experts == E
    assert np.array_equal(st.expert_load[:, : E - 1], counts) and (st.expert_load[:, E - 1] == 0).all()
    if suffix == ".npz":
        assert st.step_counts.shape == (L, 3, E) and (st.step_counts[:, :, E - 1] == 0).all()
    assert solve(load_instance(_instance(tmp_path, path.name))).plan.experts == E


def test_ids_beyond_model_experts_are_errors(tmp_path):
    """An id >= model.experts (or more count columns, or a larger recorded E) is an error
    naming the file and the field."""
    write_trace(tmp_path / "big.npz", _trace(E))  # ids 0..8 with model.experts = 8
    with pytest.raises(InputError) as err:
        load_workloads(load_instance(_instance(tmp_path, "big.npz")))
    assert "big.npz: topk: expert id 8 out of range: model.experts is 8" in str(err.value)
    write_trace(tmp_path / "meta.npz", _trace(E - 2, num_experts=E + 4))
    with pytest.raises(InputError, match=r"meta\.npz: num_experts: trace has 12 experts, model.experts is 8"):
        load_workloads(load_instance(_instance(tmp_path, "meta.npz")))
    np.save(tmp_path / "wide.npy", np.ones((L, E + 1)))
    with pytest.raises(InputError, match=r"wide\.npy: counts: workload has 9 experts \(columns\), model.experts is 8"):
        load_workloads(load_instance(_instance(tmp_path, "wide.npy")))
    np.save(tmp_path / "layers.npy", np.ones((L + 1, E)))
    with pytest.raises(InputError, match="layers"):
        load_workloads(load_instance(_instance(tmp_path, "layers.npy")))


def test_fit_workload_for_files_read_outside_an_instance():
    """fit_workload (used for workloads given on the command line) widens the same way."""
    from moeopt.instance import Model
    from moeopt.io import fit_workload

    fitted = fit_workload(_trace(E - 3), Model(layers=L, experts=E, top_k=K), "x.npz")
    assert fitted.num_experts == E and fitted.stats().experts == E
    with pytest.raises(InputError, match="x.npz: topk"):
        fit_workload(_trace(E), Model(layers=L, experts=E, top_k=K), "x.npz")
