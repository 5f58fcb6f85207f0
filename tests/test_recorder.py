"""SGLang expert-distribution recorder dumps of every mode (stat, stat_approx, per_pass, per_token),
built as SGLang's own classes build them (``sglang/srt/eplb/expert_distribution.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt import console
from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.instance import Cluster, Instance, MethodSpec, Model, Workload, WorkloadSource
from moeopt.interop.sglang import read_sglang_dumps, ring_time_order, sglang_dump_kind, stats_from_sglang_stat
from moeopt.io import read_trace, read_workload_file
from moeopt.io.engines import read_engine_dumps
from moeopt.solve import solve
from moeopt.trace import Stats, Trace

torch = pytest.importorskip("torch")

DENSE = 1  # leading dense hidden layers: SGLang records them as all-zero rows


class Ring:
    """SGLang's ``_CircularBuffer``: ``append`` writes row ``i`` and moves ``i`` on modulo the size;
    ``reset`` (every ``start_record`` / ``dump_record``) zeroes the rows but keeps ``i``."""

    def __init__(self, size: int, shape: tuple[int, ...]) -> None:
        self.buffer = np.zeros((size, *shape), dtype=np.int32)
        self.index = 0

    def append(self, value: np.ndarray) -> None:
        self.buffer[self.index] = value
        self.index = (self.index + 1) % len(self.buffer)

    def reset(self) -> None:
        self.buffer[...] = 0


def passes(rng: np.random.Generator, n: int, layers: int = 2, experts: int = 6) -> np.ndarray:
    """int ``[n, DENSE + layers, E]``: per-pass logical counts, the dense rows zero, every pass routed."""
    out = np.zeros((n, DENSE + layers, experts), dtype=np.int32)
    out[:, DENSE:] = rng.integers(0, 9, (n, layers, experts))
    out[:, DENSE:, 0] += 1
    return out


def stat_dump(logical_count: np.ndarray) -> dict:
    """What ``_StatAccumulator.dump`` saves (rank 0, after the all-reduce)."""
    return {
        "rank": 0,
        "logical_count": torch.from_numpy(logical_count),
        "average_utilization_rate_over_window": None,
    }


def recorded(ring_size: int, sessions: list[int], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The raw ring after recording sessions of the given lengths (dumping, which resets, after
    each), and the passes of the last session in time order."""
    ring = Ring(ring_size, (DENSE + 2, 6))
    last = np.zeros((0, DENSE + 2, 6), dtype=np.int32)
    for n in sessions:
        ring.reset()  # start_record
        last = passes(rng, n)
        for value in last:
            ring.append(value)
    return ring.buffer.copy(), last


def moe(counts: np.ndarray) -> np.ndarray:
    """Per-step MoE-layer counts ``[layers, steps, E]``, as Stats.step_counts holds them."""
    return np.transpose(counts[:, DENSE:], (1, 0, 2)).astype(np.float64)


# ----------------------------------------------------------------------------- stat ring
def test_short_stat_recording_keeps_its_steps(tmp_path):
    """5 passes into the default 1000-row ring: the 995 empty rows are dropped, one note says so."""
    buffer, last = recorded(1000, [5], np.random.default_rng(0))
    torch.save(stat_dump(buffer), tmp_path / "stat.pt")
    w, notes = read_engine_dumps([tmp_path / "stat.pt"], top_k=2)
    assert isinstance(w, Stats) and w.step_counts is not None
    assert np.array_equal(w.step_counts, moe(last))
    assert np.array_equal(w.expert_load, last[:, DENSE:].sum(axis=0))
    said = "stat dump: 995 empty ring rows dropped (5 recorded steps kept, in time order)"
    assert notes == [f"note: {tmp_path / 'stat.pt'}: {said}"]


def test_wrapped_ring_is_put_back_in_time_order():
    """A second recording that runs past the ring's last row: rotated so its first pass comes first."""
    buffer, last = recorded(8, [5, 6], np.random.default_rng(1))  # rows 5, 6, 7, 0, 1, 2
    assert not buffer[3:5].any() and buffer[[5, 6, 7, 0, 1, 2]].any(axis=(1, 2)).all()
    w, notes = read_sglang_dumps([("d.pt", stat_dump(buffer))], top_k=2)
    assert isinstance(w, Stats) and np.array_equal(w.step_counts, moe(last))
    assert len(notes) == 1 and "2 empty ring rows dropped (6 recorded steps kept, in time order" in notes[0]
    assert "rows 5-7 before rows 0-2" in notes[0]


def test_full_ring_keeps_row_order_and_says_so():
    """A ring with no empty row (more passes than rows): row order kept, the note says time order is lost."""
    buffer, last = recorded(4, [6], np.random.default_rng(2))  # rows hold passes 4, 5, 2, 3
    w, notes = read_sglang_dumps([("d.pt", stat_dump(buffer))], top_k=2)
    assert isinstance(w, Stats) and np.array_equal(w.step_counts, moe(buffer))
    assert np.array_equal(w.step_counts, moe(last[[4, 5, 2, 3]]))
    assert len(notes) == 1 and "all 4 rows recorded, kept in row order" in notes[0]
    assert "could not be recovered" in notes[0]


def test_unbounded_buffer_and_old_shapes():
    """An _InfiniteBuffer dump (rows in order), [layers, E] without steps, a list of dumps: as before."""
    rng = np.random.default_rng(3)
    rows = passes(rng, 3)
    one = stats_from_sglang_stat(stat_dump(rows), top_k=2)
    assert np.array_equal(one.step_counts, moe(rows))
    flat = stats_from_sglang_stat({"logical_count": rows.sum(axis=0)}, top_k=2)
    assert flat.step_counts is None and np.array_equal(flat.expert_load, rows[:, DENSE:].sum(axis=0))
    listed = stats_from_sglang_stat([{"logical_count": r} for r in rows], top_k=2)
    assert np.array_equal(listed.step_counts, moe(rows))


@given(
    size=st.integers(1, 12),
    sessions=st.lists(st.integers(1, 20), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_ring_read_back_is_the_last_recording(size, sessions, seed):
    """Any sequence of recordings into SGLang's ring reads back as the last one, in time order,
    unless it filled the ring (then the rows in row order)."""
    buffer, last = recorded(size, sessions, np.random.default_rng(seed))
    w, notes = read_sglang_dumps([(None, stat_dump(buffer))], top_k=1)
    assert isinstance(w, Stats)
    expected = last if len(last) < size else buffer
    assert np.array_equal(w.step_counts, moe(expected))
    assert len(notes) == (0 if size == 1 else 1)


@given(size=st.integers(1, 40), start=st.integers(0, 39), length=st.integers(1, 40))
def test_ring_time_order_of_any_arc(size, start, length):
    """The written rows of a ring form one arc: read back from its first row, wrapped or not."""
    start, length = start % size, min(length, size)
    rows = (start + np.arange(length)) % size
    filled = np.zeros(size, dtype=bool)
    filled[rows] = True
    order, note = ring_time_order(filled)
    assert np.array_equal(order, rows if length < size else np.arange(size))
    assert (note is None) == (size == 1)


def test_ring_with_empty_passes_starts_after_the_longest_gap():
    """Zero rows in two places (a recorded pass that routed nothing): the arc starts after the longest run."""
    filled = np.zeros(10, dtype=bool)
    filled[[2, 3, 5, 6, 7]] = True  # row 4 a pass without tokens, rows 8-1 never written
    order, note = ring_time_order(filled)
    assert order.tolist() == [2, 3, 5, 6, 7]
    assert note is not None and "empty rows in 2 places" in note and "oldest step at row 2" in note
    filled = np.zeros(10, dtype=bool)
    filled[[0, 1, 7, 8]] = True  # wrapped: rows 7, 8, (9 empty), 0, 1
    order, _ = ring_time_order(filled)
    assert order.tolist() == [7, 8, 0, 1]


def test_empty_ring_rows_do_not_change_the_robust_plan(tmp_path):
    """balance plans the same robust plan from a stat dump with its empty ring tail as without it."""
    rng = np.random.default_rng(0)
    counts = np.zeros((5, DENSE + 2, 16), dtype=np.int32)
    for t in range(5):
        counts[t, DENSE:] = rng.multinomial(800, rng.dirichlet(np.full(16, 0.3)), size=2)
    ring = np.zeros((1000, *counts.shape[1:]), dtype=np.int32)
    ring[:5] = counts
    results = []
    for name, arr in (("tail.pt", ring), ("plain.pt", counts)):
        torch.save(stat_dump(arr), tmp_path / name)
        inst = Instance(
            name=name,
            model=Model(layers=2, experts=16, top_k=2),
            cluster=Cluster(gpus=4, gpus_per_node=4, slots_per_gpu=4, replica_slots_per_gpu=1),
            workload=Workload(calibration=WorkloadSource(path=tmp_path / name)),
            method=MethodSpec(name="balance"),
        )
        results.append(solve(inst))
    tail, plain = results
    assert tail.stats["robust_snapshots"] == plain.stats["robust_snapshots"] == 5
    assert np.array_equal(tail.plan.slots, plain.plan.slots)


def test_stat_dump_note_reaches_the_user(tmp_path, capsys):
    """trace import and every workload reader show the ring note on stderr (not with --quiet)."""
    buffer, _ = recorded(1000, [5], np.random.default_rng(4))
    torch.save(stat_dump(buffer), tmp_path / "stat.pt")
    out = str(tmp_path / "c.npz")
    assert main(["trace", "import", str(tmp_path / "stat.pt"), "--top-k", "2", "--output", out]) == 0
    got = capsys.readouterr()
    assert "counts, 2 MoE layers, E=6, top-2, 5 steps" in got.out
    assert got.err.strip().splitlines() == [
        f"note: {tmp_path / 'stat.pt'}: stat dump: 995 empty ring rows dropped (5 recorded steps kept, in time order)"
    ]
    assert read_workload_file(out).step_counts.shape == (2, 5, 6)
    read_workload_file(tmp_path / "stat.pt", top_k=2)  # an instance's workload file
    assert "995 empty ring rows dropped" in capsys.readouterr().err
    try:
        assert main(["trace", "import", str(tmp_path / "stat.pt"), "--top-k", "2", "--output", out, "--quiet"]) == 0
        assert capsys.readouterr().err == ""
    finally:
        console.configure()  # --quiet set the process-wide mode


# ----------------------------------------------------------------------------- per_pass
def physical_map(rng: np.random.Generator, layers: int = 2, experts: int = 6, slots: int = 8) -> np.ndarray:
    """``[DENSE + layers, P]`` physical-to-logical map: trivial dense rows, every expert once plus
    redundant copies on the MoE rows."""
    p2l = np.tile(np.arange(slots) % experts, (DENSE + layers, 1))
    for l in range(DENSE, DENSE + layers):
        p2l[l] = rng.permutation(np.concatenate([np.arange(experts), rng.integers(0, experts, slots - experts)]))
    return p2l


def to_logical(count: np.ndarray, p2l: np.ndarray, experts: int = 6) -> np.ndarray:
    """SGLang's ``_convert_global_physical_count_to_logical_count`` of one pass, written out."""
    out = np.zeros((len(p2l), experts))
    for l in range(len(p2l)):
        for p in range(p2l.shape[1]):
            out[l, p2l[l, p]] += count[l, p]
    return out


def per_pass_dump(p2l: np.ndarray, counts: dict[int, np.ndarray], rank: int) -> dict:
    """What ``_DetailAccumulator.dump`` saves in per_pass mode: one record per forward pass."""
    records = [
        {
            "forward_pass_id": fid,
            "rank": rank,
            "gatherer_key": "primary",
            "global_physical_count": torch.from_numpy(count.astype(np.int32)),
        }
        for fid, count in counts.items()
    ]
    return {"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)}


def physical_counts(rng: np.random.Generator, p2l: np.ndarray) -> np.ndarray:
    """One pass's ``global_physical_count``: the dense rows zero."""
    count = rng.integers(0, 7, p2l.shape)
    count[:DENSE] = 0
    return count


def test_per_pass_dump_to_per_step_counts(tmp_path):
    """One step per forward pass (id order), physical slots credited to their logical experts."""
    rng = np.random.default_rng(5)
    p2l = physical_map(rng)
    counts = {fid: physical_counts(rng, p2l) for fid in (12, 10, 11)}
    dump = per_pass_dump(p2l, counts, rank=0)
    assert sglang_dump_kind(dump) == "per_pass"
    torch.save(dump, tmp_path / "pass.pt")
    w = read_workload_file(tmp_path / "pass.pt", top_k=2)
    assert isinstance(w, Stats) and w.layers == 2 and w.experts == 6 and w.top_k == 2
    expected = np.stack([to_logical(counts[fid], p2l)[DENSE:] for fid in (10, 11, 12)], axis=1)
    assert np.array_equal(w.step_counts, expected)
    assert np.array_equal(w.expert_load, expected.sum(axis=1))


def test_per_pass_ranks_sum_per_forward_pass(tmp_path, capsys):
    """Per-rank per_pass files of one recording: summed per forward pass; a pass without tokens dropped."""
    rng = np.random.default_rng(6)
    p2l = physical_map(rng)
    ranks = [{fid: physical_counts(rng, p2l) for fid in (20, 21, 22)} for _ in range(3)]
    for r in ranks:
        r[23] = np.zeros_like(p2l)  # an idle pass on every rank
    paths = []
    for rank, counts in enumerate(ranks):
        paths.append(str(tmp_path / f"expert_distribution_recorder_1.0_{rank}.pt"))
        torch.save(per_pass_dump(p2l, counts, rank), paths[-1])
    out = tmp_path / "c.npz"
    assert main(["trace", "import", *paths, "--top-k", "2", "--output", str(out)]) == 0
    got = capsys.readouterr()
    assert "counts, 2 MoE layers, E=6, top-2, 3 steps" in got.out
    assert "1 of 4 forward passes routed no token and were dropped" in got.err
    w = read_workload_file(out)
    expected = np.stack([sum(to_logical(r[fid], p2l) for r in ranks)[DENSE:] for fid in (20, 21, 22)], axis=1)
    assert np.array_equal(w.step_counts, expected)


# ----------------------------------------------------------------------------- per_token
def per_token_dump(
    rng: np.random.Generator, p2l: np.ndarray, rank: int, fids: list[int], k: int = 2, experts: int = 6
) -> tuple[dict, list[np.ndarray]]:
    """What ``_DetailAccumulator.dump`` saves in per_token mode (the fields of
    ``_DetailSinglePassGatherer.collect``), and each record's logical top-k ``[tokens, layers, k]``."""
    records, truth = [], []
    for fid in fids:
        n = int(rng.integers(1, 5))
        logical = np.stack([np.argsort(rng.random((n, experts)), axis=1)[:, :k] for _ in range(len(p2l) - DENSE)], 1)
        ids = np.full((len(p2l), n, 8), -1, dtype=np.int32)
        for l in range(DENSE, len(p2l)):
            for i in range(n):
                for j in range(k):
                    ids[l, i, j] = rng.choice(np.flatnonzero(p2l[l] == logical[i, l - DENSE, j]))
        count = np.zeros(p2l.shape, dtype=np.int32)
        for l in range(len(p2l)):
            np.add.at(count[l], ids[l][ids[l] >= 0], 1)
        records.append(
            {
                "forward_pass_id": fid,
                "rank": rank,
                "gatherer_key": "primary",
                "input_ids": list(range(n)),
                "positions": list(range(n)),
                "extend_seq_lens": [n],
                "forward_mode": 1,
                "topk_ids_of_layer": torch.from_numpy(ids),
                "misc_objects": [],
                "global_physical_count": torch.from_numpy(count),
            }
        )
        truth.append(logical)
    return {"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)}, truth


def test_per_token_ranks_merge_into_one_trace(tmp_path, capsys):
    """Per-rank per_token files: one trace, every rank's tokens, the rank as home, passes as steps."""
    rng = np.random.default_rng(7)
    p2l = physical_map(rng)
    paths, topk, homes, passes_ = [], [], [], []
    for rank in range(3):
        dump, truth = per_token_dump(rng, p2l, rank, [31, 30, 33])
        paths.append(str(tmp_path / f"expert_distribution_recorder_1.0_{rank}.pt"))
        torch.save(dump, paths[-1])
        for fid, t in zip([31, 30, 33], truth, strict=True):
            topk.append(t)
            homes += [rank] * len(t)
            passes_ += [fid] * len(t)
    out = tmp_path / "t.npz"
    assert main(["trace", "import", *paths, "--output", str(out)]) == 0
    tokens = sum(len(t) for t in topk)
    assert f"trace, {tokens} tokens, 2 MoE layers, E=6, top-2, 3 steps, homes on 3 GPUs" in capsys.readouterr().out
    tr = read_trace(out)
    assert tr.tokens == tokens and np.array_equal(tr.topk, np.concatenate(topk))
    assert np.array_equal(tr.home, homes)
    assert np.array_equal(tr.step, np.searchsorted([30, 31, 33], passes_))
    one = read_workload_file(paths[1])  # one file alone: its own tokens, home = its rank
    assert isinstance(one, Trace) and one.tokens == sum(len(t) for t in topk[3:6])
    assert np.array_equal(one.home, np.ones(one.tokens))


def test_identical_ranks_are_noted():
    """Ranks that recorded the same tokens (attention not data-parallel) are merged but noted."""
    p2l = physical_map(np.random.default_rng(8))
    dumps = []
    for rank in range(2):
        dump, _ = per_token_dump(np.random.default_rng(9), p2l, rank, [1, 2])
        dumps.append((f"r{rank}.pt", dump))
    w, notes = read_sglang_dumps(dumps)
    assert isinstance(w, Trace) and len(notes) == 1 and "recorded the same tokens" in notes[0]


# ----------------------------------------------------------------------------- bad input
def _two_ranks(rng: np.random.Generator) -> tuple[np.ndarray, dict, dict]:
    p2l = physical_map(rng)
    a = per_pass_dump(p2l, {1: physical_counts(rng, p2l)}, 0)
    b = per_pass_dump(p2l, {1: physical_counts(rng, p2l)}, 1)
    return p2l, a, b


def _bad_cases() -> list[tuple[str, list[tuple[str, object]], str]]:
    rng = np.random.default_rng(10)
    p2l, a, b = _two_ranks(rng)
    cases: list[tuple[str, list[tuple[str, object]], str]] = []
    missing = per_pass_dump(p2l, {1: physical_counts(rng, p2l), 2: physical_counts(rng, p2l)}, 0)
    del missing["records"][1]["global_physical_count"]
    cases.append(("no count", [("a.pt", missing)], "a.pt: records[1].global_physical_count: required field"))
    wide = dict(b, last_physical_to_logical_map=torch.from_numpy(np.pad(p2l, ((0, 0), (0, 1)))))
    cases.append(("map shapes", [("a.pt", a), ("b.pt", wide)], "b.pt: last_physical_to_logical_map: has shape"))
    other = dict(b, last_physical_to_logical_map=torch.from_numpy(p2l[:, ::-1].copy()))
    cases.append(("maps differ", [("a.pt", a), ("b.pt", other)], "b.pt: last_physical_to_logical_map: differs"))
    short = per_pass_dump(p2l, {1: physical_counts(rng, p2l)[:, :-1]}, 0)
    cases.append(("count shape", [("a.pt", short)], "records[0].global_physical_count: expected [3 layers, 8"))
    cases.append(("twice", [("a.pt", a), ("a2.pt", a)], "a2.pt: records[0].forward_pass_id: forward pass 1 of rank 0"))
    tok, _ = per_token_dump(rng, p2l, 0, [1])
    tok2, _ = per_token_dump(rng, p2l, 1, [1])
    del tok2["records"][0]["rank"]
    cases.append(("no rank", [("a.pt", tok), ("b.pt", tok2)], "b.pt: records[0].rank: required to merge"))
    cases.append(("mixed", [("a.pt", a), ("b.pt", tok)], "b.pt: a per_token dump among 2"))
    empty = stat_dump(np.zeros((1000, 3, 6), dtype=np.int32))
    cases.append(("empty ring", [("s.pt", empty)], "s.pt: logical_count: no recorded step: all 1000 rows are zero"))
    return cases


@pytest.mark.parametrize("case", range(8))
def test_bad_recordings_are_one_line_errors(case):
    """Malformed or inconsistent recorder files: one InputError line naming the file and the field."""
    name, dumps, message = _bad_cases()[case]
    with pytest.raises(InputError) as err:
        read_sglang_dumps(dumps, top_k=2)
    assert message in str(err.value), name
    assert "\n" not in str(err.value)


def test_per_pass_needs_top_k_and_cli_exits_2(tmp_path, capsys):
    """A per_pass dump does not record top-k; on the command line a bad file is one line, exit 2."""
    rng = np.random.default_rng(11)
    p2l, a, _ = _two_ranks(rng)
    with pytest.raises(InputError, match="top_k"):
        read_sglang_dumps([("a.pt", a)])
    del a["records"][0]["global_physical_count"]
    torch.save(a, tmp_path / "a.pt")
    out = tmp_path / "c.npz"
    assert main(["trace", "import", str(tmp_path / "a.pt"), "--top-k", "2", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records[0].global_physical_count" in err[0] and not out.exists()
