"""vLLM EPLB state: physical-slot loads credited to logical experts, as vLLM's rearrangement does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt import interop
from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.io import read_workload_file
from moeopt.trace import Stats


def _state(rng: np.random.Generator, T: int, L: int, E: int, P: int, unused: int = 0):
    """A physical map with every expert at least once (``unused`` trailing slots -1), per-step
    logical loads, and the same loads split at random over each expert's slots."""
    phys = np.full((L, P), -1, dtype=np.int64)
    for l in range(L):
        ids = np.concatenate([np.arange(E), rng.integers(0, E, P - unused - E)])
        phys[l, : P - unused] = rng.permutation(ids)
    logical = rng.integers(0, 40, (T, L, E))
    window = np.zeros((T, L, P), dtype=np.int64)
    for t in range(T):
        for l in range(L):
            for e in range(E):
                slots = np.flatnonzero(phys[l] == e)
                window[t, l, slots] = rng.multinomial(logical[t, l, e], np.full(slots.size, 1 / slots.size))
    return phys, logical, window


@given(
    seed=st.integers(0, 2**32 - 1),
    T=st.integers(1, 4),
    L=st.integers(1, 3),
    E=st.integers(2, 6),
    extra=st.integers(0, 4),
    unused=st.integers(0, 2),
)
def test_window_credits_every_slot_to_its_expert(seed, T, L, E, extra, unused):
    """Counts and per-step counts equal the logical loads the physical window was split from."""
    rng = np.random.default_rng(seed)
    phys, logical, window = _state(rng, T, L, E, E + extra + unused, unused)
    logical[:, :, 0] += 1  # no all-zero step: every recorded pass is kept
    window = window.copy()
    for t in range(T):
        for l in range(L):
            window[t, l, np.flatnonzero(phys[l] == 0)[0]] += 1
    got = interop.stats_from_vllm_eplb({"physical_to_logical_map": phys, "expert_load_window": window}, top_k=2)
    assert isinstance(got, Stats) and got.layers == L and got.experts == E and got.top_k == 2
    assert np.array_equal(got.expert_load, logical.sum(axis=0))
    assert np.array_equal(got.step_counts, logical.transpose(1, 0, 2))


def test_ring_order_and_unrecorded_passes():
    """Passes not yet recorded (all zero) are dropped; with the ring's next slot saved, the
    steps run oldest first; ``expert_load_pass`` is one step."""
    phys = np.array([[0, 1, 0]])
    window = np.zeros((4, 1, 3), dtype=np.int64)
    window[0, 0] = [1, 0, 0]  # newest (written last, the ring wrapped)
    window[2, 0] = [2, 5, 1]  # oldest
    window[3, 0] = [0, 7, 0]
    obj = {"physical_to_logical_map": phys, "expert_load_window": window}
    plain = interop.stats_from_vllm_eplb(obj, top_k=1)
    assert plain.step_counts.tolist() == [[[1, 0], [3, 5], [0, 7]]]
    ring = interop.stats_from_vllm_eplb({**obj, "expert_load_window_step": np.array(1)}, top_k=1)
    assert ring.step_counts.tolist() == [[[3, 5], [0, 7], [1, 0]]]
    assert ring.expert_load.tolist() == [[4, 12]]
    one = interop.stats_from_vllm_eplb({"physical_to_logical_map": phys, "expert_load_pass": window[2]}, top_k=1)
    assert one.expert_load.tolist() == [[3, 5]] and one.step_counts.shape == (1, 1, 2)
    totals = interop.stats_from_vllm_eplb({"last_expert_load": [[3, 5], [2, 2]]}, top_k=1)
    assert totals.expert_load.tolist() == [[3, 5], [2, 2]] and totals.step_counts is None


def test_replica_count_widens_experts():
    """An expert with no slot (a zero-load tail) still counts when logical_replica_count says so."""
    obj = {
        "physical_to_logical_map": [[0, 1, 1]],
        "expert_load_pass": [[2, 1, 1]],
        "logical_replica_count": [[1, 2, 0]],
    }
    assert interop.stats_from_vllm_eplb(obj, top_k=1).expert_load.tolist() == [[2, 2, 0]]


@pytest.mark.parametrize(
    "obj,field,message",
    [
        ({"expert_load_window": np.ones((2, 1, 3))}, "physical_to_logical_map", "required with expert_load_window"),
        (
            {"physical_to_logical_map": [[0, 1]], "expert_load_window": np.ones((2, 1, 3))},
            "physical_to_logical_map",
            "[1, 3]",
        ),
        ({"physical_to_logical_map": [[0, -2, 1]], "expert_load_pass": [[1, 1, 1]]}, "physical_to_logical_map", ">= 0"),
        ({"physical_to_logical_map": [[0, -1, 1]], "expert_load_pass": [[1, 1, 1]]}, "expert_load_pass", "unused"),
        (
            {"physical_to_logical_map": [[0, 10**12, 1]], "expert_load_pass": [[1, 1, 1]]},
            "physical_to_logical_map",
            "below the 3 physical slots",
        ),
        ({"physical_to_logical_map": [[0, 1]], "expert_load_pass": [[1, -1]]}, "expert_load_pass", "negative"),
        (
            {"physical_to_logical_map": [[0, 1]], "expert_load_window": np.zeros((3, 1, 2))},
            "expert_load_window",
            "no forward",
        ),
        ({"physical_to_logical_map": [[0, 1]], "expert_load_window": [1, 2]}, "expert_load_window", "[window"),
        ({"last_expert_load": [1, 2]}, "last_expert_load", "[MoE layers, experts]"),
    ],
)
def test_bad_state_names_the_field(obj, field, message):
    with pytest.raises(InputError) as err:
        interop.stats_from_vllm_eplb(obj, top_k=2, source="state.pt")
    text = str(err.value)
    assert "state.pt" in text and field in text and message in text and "\n" not in text


def test_top_k_is_required():
    with pytest.raises(InputError, match="top_k"):
        interop.stats_from_vllm_eplb({"last_expert_load": [[1, 2]]}, top_k=None)
    # more than the experts counted (here and in SGLang's stat dumps): one line naming top_k
    with pytest.raises(InputError, match="top_k: expected at most the 2 experts"):
        interop.stats_from_vllm_eplb({"last_expert_load": [[1, 2]]}, top_k=3)
    with pytest.raises(InputError, match="top_k: expected at most the 2 experts"):
        interop.stats_from_vllm_eplb({"physical_to_logical_map": [[0, 1, 1]], "expert_load_pass": [[1, 1, 1]]}, top_k=3)
    with pytest.raises(InputError, match="top_k: expected at most the 2 experts"):
        interop.read_sglang_dump({"logical_count": [[1, 2]]}, top_k=3)


def test_npz_and_pt_files(tmp_path, capsys):
    """Read from .npz (numpy) and .pt (torch); ``trace import`` writes the counts; ``solve`` plans on them."""
    phys, logical, window = _state(np.random.default_rng(5), 3, 2, 8, 12)
    logical[:, :, 0] += 1
    for t in range(3):
        for l in range(2):
            window[t, l, np.flatnonzero(phys[l] == 0)[0]] += 1
    np.savez(tmp_path / "state.npz", physical_to_logical_map=phys, expert_load_window=window)
    got = read_workload_file(tmp_path / "state.npz", top_k=2)
    assert np.array_equal(got.expert_load, logical.sum(axis=0)) and got.step_counts.shape == (2, 3, 8)
    inst = tmp_path / "inst.yaml"
    inst.write_text(
        "model: {layers: 2, experts: 8, top_k: 2}\ncluster: {gpus: 4, slots_per_gpu: 2, replica_slots_per_gpu: 1}\n"
        "workload: {calibration: state.npz}\nmethod: {name: balance}\n"
    )
    assert main(["solve", str(inst), "--quiet", "--output", str(tmp_path / "plan.json")]) == 0
    torch = pytest.importorskip("torch")
    torch.save(
        {"physical_to_logical_map": torch.from_numpy(phys), "expert_load_window": torch.from_numpy(window)},
        tmp_path / "state.pt",
    )
    assert np.array_equal(read_workload_file(tmp_path / "state.pt", top_k=2).expert_load, logical.sum(axis=0))
    args = ["trace", "import", str(tmp_path / "state.pt"), "--output", str(tmp_path / "c.npz"), "--top-k", "2"]
    assert main(args) == 0
    assert "counts, 2 MoE layers, E=8, top-2, 3 steps" in capsys.readouterr().out
    assert main(["trace", "import", str(tmp_path / "state.pt"), "--output", str(tmp_path / "d.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert "state.pt" in err and "top_k" in err and "\n" not in err


def test_state_as_the_current_plan(tmp_path, capsys):
    """``solve --from`` reads the placement in a .pt / .npz by its keys: vLLM's state and SGLang's
    map as ``sglang``, EPLB tensors as ``eplb`` (a .pt once crashed decoding it as JSON)."""
    torch = pytest.importorskip("torch")
    phys, _, window = _state(np.random.default_rng(7), 2, 2, 8, 12)
    window[:, :, 0] += 1
    torch.save(
        {"physical_to_logical_map": torch.from_numpy(phys), "expert_load_window": torch.from_numpy(window)},
        tmp_path / "state.pt",
    )
    np.savez(tmp_path / "eplb.npz", phy2log=phys, num_gpus=np.array(4))
    inst = tmp_path / "inst.yaml"
    inst.write_text(
        "model: {layers: 2, experts: 8, top_k: 2}\ncluster: {gpus: 4, slots_per_gpu: 2, replica_slots_per_gpu: 1}\n"
        "workload: {calibration: state.pt}\nmethod: {name: balance}\n"
    )
    for extra in ([], ["--from-format", "sglang"]):
        assert main(["solve", str(inst), "--from", str(tmp_path / "state.pt"), *extra, "--quiet"]) == 0
        assert "migration frontier" in capsys.readouterr().out
    assert main(["solve", str(inst), "--from", str(tmp_path / "eplb.npz"), "--quiet"]) == 0
    assert "migration frontier" in capsys.readouterr().out
