"""moeopt routes tokens exactly as each serving engine's own code does (SGLang, vLLM, vLLM-Ascend).

Two kinds of test:

* **live SGLang** (needs torch and ``pip install --no-deps sglang==0.5.23``; skipped without):
  SGLang's own ``ExpertLocationMetadata.init_by_mapping`` (loaded from its installed file by
  ``tests/engine_code.py``) on the map ``moeopt.interop.to_sglang`` writes, for every rank,
  against :func:`moeopt.dispatch.static_map`, :func:`~moeopt.dispatch.count_loads` and
  :func:`~moeopt.dispatch.route_trace` under ``static``; and SGLang's own ``LPLBSolver``
  (its LP, its counts and probabilities; the CUDA kernels it launches transcribed) against
  :func:`~moeopt.dispatch.lplb_split` under ``lp``, to float32 rounding;
* **fixtures** (always run, no torch): what SGLang 0.5.23, vLLM 0.34.0 and vLLM-Ascend
  0.23.0.post1 computed on committed plans (``tests/data/engines/*.npz``, written by
  ``tests/data/engines/make_fixtures.py``, whose docstring says how to re-make them), against
  :func:`~moeopt.dispatch.static_map`, :func:`~moeopt.dispatch.physical_copies` with
  :func:`~moeopt.dispatch.vllm_copy_index`, and :func:`~moeopt.dispatch.ascend_map`.

Every comparison is exact (0 differing picks); a failure names how many picks differ and the
first one.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.dispatch import (
    STATIC_SEED,
    ascend_map,
    count_loads,
    lp_layer_loads,
    lplb_split,
    physical_copies,
    route_trace,
    static_map,
    vllm_copy_index,
)
from moeopt.errors import PlanError
from moeopt.instance import Cluster
from moeopt.interop import to_sglang
from moeopt.interop.vllm_ascend import vllm_ascend_layout
from moeopt.plan import Dispatch, Plan
from moeopt.trace import Trace
from tests.strategies import engine_plans, float_arrays, int_arrays, topk_arrays

ENGINES = Path(__file__).resolve().parent / "data" / "engines"
FIXTURES = ("deepseek-v3", "colocated", "random")
#: DeepSeek-V3 ranks SGLang's own code runs on live (about 1.5 s a rank); the fixture holds all 64
LIVE_RANKS = (0, 37, 63)


def assert_same(ours: np.ndarray, engine: np.ndarray, axes: tuple[str, ...], what: str = "") -> None:
    """Fail with 'N of M picks differ' and the first differing pick (its index named by ``axes``)."""
    assert ours.shape == engine.shape, f"{what}shapes differ: moeopt {ours.shape}, engine {engine.shape}"
    bad = np.argwhere(ours != engine)
    if len(bad):
        where = ", ".join(f"{a} {i}" for a, i in zip(axes, bad[0], strict=True))
        first = tuple(bad[0])
        raise AssertionError(
            f"{what}{len(bad)} of {ours.size} picks differ; first at {where}: "
            f"moeopt {ours[first]}, engine {engine[first]}"
        )


def cluster_of(plan: Plan, gpus_per_node: int | None) -> Cluster:
    """The plan's cluster: its G and W, nodes of ``gpus_per_node`` GPUs (None: one node)."""
    G, W = plan.gpus, plan.width
    return Cluster(gpus=G, gpus_per_node=gpus_per_node or G, slots_per_gpu=W, allow_colocated_copies=True)


def table_loads(tables: np.ndarray, counts: np.ndarray, W: int, G: int) -> np.ndarray:
    """float ``[L, G]``: GPU loads when each of the G source ranks sends ``counts / G`` of every
    expert where its table ``tables [G, L, E]`` (physical slots) says."""
    _, L, E = tables.shape
    loads = np.zeros((L, G))
    layer = np.broadcast_to(np.arange(L)[None, :, None], tables.shape)
    share = np.broadcast_to(counts[None] / G, tables.shape)
    np.add.at(loads, (layer.ravel(), (tables // W).ravel()), share.ravel())
    return loads


# ----------------------------------------------------------------------------- live SGLang
def live_sglang(name: str):
    """An instance of ``tests.engine_code.<name>`` (SGLang's own code); skips without torch or sglang."""
    pytest.importorskip("torch", reason="SGLang's code needs torch")
    from tests import engine_code

    if engine_code.sglang_path() is None:
        pytest.skip("needs sglang: pip install --no-deps sglang==0.5.23")
    return getattr(engine_code, name)()


@pytest.fixture(scope="module")
def sglang():
    """SGLang's own static dispatch (``tests/engine_code.py``)."""
    return live_sglang("SGLangStatic")


def sglang_tables(engine, plan: Plan, gpus_per_node: int | None, dense: int, ranks=None) -> np.ndarray:
    """int ``[ranks, L, E]``: SGLang's tables of the map moeopt exports (MoE rows only)."""
    phys = np.asarray(to_sglang(plan, dense_layers=dense)["physical_to_logical_map"])
    nnodes = 1 if gpus_per_node is None else plan.gpus // gpus_per_node
    ranks = range(plan.gpus) if ranks is None else ranks
    return engine.tables(phys, plan.experts, plan.gpus, nnodes, ranks)[:, dense:, :]


def test_sglang_flow_by_hand(sglang):
    """SGLang's code, run as the engine runs it, gives the tables its rules give by hand, and so does static_map."""
    # 4 GPUs x 2 slots, 2 GPUs a node; expert 0 in slots 2 (GPU 1), 4 (GPU 2) and 6 (GPU 3)
    plan = Plan(slots=np.array([[[1, 2], [0, 3], [0, 4], [0, 5]]]), experts=6)
    # ranks 1, 2, 3 use their own copy; rank 0 has none: with nodes, its node's only copy
    # (slot 2); without, the fair choice: one of [2, 4, 6] sampled by random.Random(42)
    drawn = random.Random(42).sample([2, 4, 6], k=1)[0]
    assert drawn == 6  # rank 0's only draw (shuffling one item draws nothing)
    others = [0, 1, 3, 5, 7]  # experts 1..5 have one slot each
    for gpn, rank0 in ((2, 2), (None, drawn)):
        expected = np.array([[[rank0, *others]], [[2, *others]], [[4, *others]], [[6, *others]]])
        assert (sglang_tables(sglang, plan, gpn, 0) == expected).all()
        assert (static_map(plan, gpn) == expected).all()
    # a dense row first (p mod 6: experts 0 and 1 twice) draws ranks 1 and 2's streams first
    plan2 = Plan(slots=np.array([[[0, 1], [2, 3], [4, 5], [0, 1]]]), experts=6)
    engine = sglang_tables(sglang, plan2, None, 1)
    assert (engine == static_map(plan2, None, 42, 1)).all()
    assert not (engine == static_map(plan2, None, 42, 0)).all()  # the dense row's draws matter here


@given(engine_plans())
def test_static_map_equals_sglang(sglang, case):
    """static_map equals SGLang's own table on every rank, layer and expert (dense rows, nodes, colocated copies)."""
    plan, gpn, dense = case
    for nodes in (gpn, None):
        engine = sglang_tables(sglang, plan, nodes, dense)
        ours = static_map(plan, nodes, 42, dense)
        assert_same(ours, engine, ("rank", "layer", "expert"))


@given(engine_plans(max_experts=10, max_gpus=6, max_layers=2), st.data())
def test_static_loads_and_routes_equal_sglang(sglang, case, data):
    """Under static, count_loads equals the loads of SGLang's tables (uniform homes), and route_trace
    sends every token of a trace with homes where SGLang's table of its home rank does."""
    plan, gpn, dense = case
    plan = plan.with_dispatch(Dispatch(kind="static", dense_layers=dense))
    L, G, W = plan.slots.shape
    E = plan.experts
    cluster = cluster_of(plan, gpn)
    engine = sglang_tables(sglang, plan, gpn, dense)
    counts = data.draw(float_arrays((L, E), 0.0, 100.0))
    np.testing.assert_allclose(count_loads(plan, counts, cluster), table_loads(engine, counts, W, G), atol=1e-9)
    N = data.draw(st.integers(1, 40))
    k = data.draw(st.integers(1, min(E, 3)))
    topk = data.draw(topk_arrays((N, L), E, k))
    home = data.draw(int_arrays(N, 0, G - 1))
    trace = Trace(topk, np.zeros(N, np.int32), np.zeros(N, np.int32), ("all",), E, home=home)
    routing = route_trace(plan, trace, cluster)
    expected = engine[home[:, None, None], np.arange(L)[None, :, None], topk.astype(np.int64)] // W
    assert routing.gpu is not None
    assert_same(routing.gpu, expected, ("token", "layer", "k"))


def test_static_map_equals_sglang_on_deepseek_v3(sglang):
    """On the DeepSeek-V3-shaped plan (3 dense rows, 8 GPUs a node), static_map equals SGLang's own tables
    of a few ranks run live (all 64 ranks: the fixture test)."""
    plan = static_plan("deepseek-v3", "", 3)
    engine = sglang_tables(sglang, plan, 8, 3, LIVE_RANKS)
    ours = static_map(plan, 8, STATIC_SEED, 3)[list(LIVE_RANKS)]  # the fixture test's call: computed once
    assert_same(ours, engine, ("rank", "layer", "expert"))


# ----------------------------------------------------------------------------- live SGLang: lp
#: largest difference in a copy's share of its expert's tokens between moeopt's split and SGLang's
#: (both float32; five long affine-scaling steps amplify the order of the float operations)
LPLB_SHARE_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def sglang_lplb():
    """SGLang's own LP dispatch solver (``tests/engine_code.py``)."""
    return live_sglang("SGLangLPLB")


@given(engine_plans(max_experts=10, max_gpus=5, max_layers=1), st.data())
def test_lp_split_equals_sglang(sglang_lplb, case, data):
    """Under lp each copy's share of its expert's tokens is SGLang's LPLB split (its LP, 5
    affine-scaling steps, the 0.5 fallback), batch by batch, to float32 rounding."""
    plan, _, _ = case
    E = plan.experts
    counts = data.draw(int_arrays((3, E), 0, 60)).astype(float)
    ours, _ = lplb_split(counts, plan.slots[0])
    engine = sglang_lplb.shares(plan.slots[0], E, counts)
    routed = counts[:, plan.slots[0].reshape(-1)] > 0  # an expert without tokens: any split
    np.testing.assert_allclose(ours[routed], engine[routed], atol=LPLB_SHARE_TOLERANCE)


def test_lp_split_equals_sglang_on_deepseek_v3(sglang_lplb):
    """On the DeepSeek-V3-shaped plan (64 GPUs x 5 slots, EPLB's copies) with real prefill counts
    the split is SGLang's, converged, at or above the LP's optimum (and not at it: the engine's
    split is interior)."""
    from moeopt.io import read_workload_file

    plan = fixture_plan("deepseek-v3", "")
    real = Path(__file__).resolve().parents[1] / "instances" / "real"
    stats = read_workload_file(real / "deepseek_v3_prefill_in1024.json", top_k=8)
    for l in (0, 29):
        counts = stats.expert_load[l : l + 1]
        ours, converged = lplb_split(counts, plan.slots[l])
        engine = sglang_lplb.shares(plan.slots[l], plan.experts, counts)
        np.testing.assert_allclose(ours, engine, atol=LPLB_SHARE_TOLERANCE)
        assert converged.all()
        one = Plan(slots=plan.slots[l : l + 1], experts=plan.experts, dispatch=Dispatch(kind="lp"))
        cluster = Cluster(gpus=plan.gpus, gpus_per_node=8, slots_per_gpu=plan.width, allow_colocated_copies=True)
        loads = count_loads(one, counts, cluster)[0]
        best = lp_layer_loads(counts, plan.copies_on_gpu[l] > 0)[0][0]
        assert loads.max() >= best.max() - 1e-6 * counts.sum()
        assert not np.allclose(loads, best)


# ----------------------------------------------------------------------------- fixtures
@cache
def fixture(name: str) -> dict[str, np.ndarray]:
    """The arrays of ``tests/data/engines/<name>.npz``."""
    with np.load(ENGINES / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def cases() -> list[tuple[str, str]]:
    """``(fixture file, plan prefix)`` of every plan in the fixtures."""
    out = []
    for name in FIXTURES:
        prefixes = sorted({k.rsplit("/", 1)[0] + "/" for k in fixture(name) if "/" in k}) or [""]
        out += [(name, p) for p in prefixes]
    return out


CASES = cases()
IDS = [f"{n}:{p.rstrip('/')}" if p else n for n, p in CASES]


@cache
def fixture_plan(name: str, prefix: str) -> Plan:
    """The plan of a fixture (its slots as the engines ran them)."""
    f = fixture(name)
    return Plan(slots=f[prefix + "slots"].astype(np.int64), experts=int(f[prefix + "experts"]))


@cache
def static_plan(name: str, prefix: str, dense: int) -> Plan:
    """The fixture's plan under SGLang's static rule with ``dense`` dense rows (one object per
    rule, so :func:`static_map`'s cache serves the tests that ask for the same table)."""
    return fixture_plan(name, prefix).with_dispatch(Dispatch(kind="static", dense_layers=dense))


def test_fixtures_cover_the_engines():
    """The fixtures hold every engine's output on the DeepSeek-V3-shaped plan, colocated copies and copy
    counts 3, 5, 6, 7 that do not divide G, and fit in well under 2 MB."""
    f = fixture("deepseek-v3")
    assert (
        f["slots"].shape == (58, 64, 5) and f["sglang"].shape == (2, 64, 58, 256) and f["ascend"].shape[:2] == (3, 64)
    )
    assert {"vllm_physical", "vllm_full_physical", "vllm_l2p"} <= set(f)
    plan = fixture_plan("colocated", "")
    device_copies = (plan.copies_on_gpu > 0).sum(axis=2)
    assert plan.colocated and {3, 5, 6, 7} <= set(device_copies.ravel().tolist()) and plan.gpus % 5 and plan.gpus % 3
    assert sum(ENGINES.joinpath(f"{n}.npz").stat().st_size for n in FIXTURES) < 2_000_000
    assert all("sglang 0.5.23" in str(fixture(n)["engines"]) for n in FIXTURES)


@pytest.mark.parametrize(("name", "prefix"), CASES, ids=IDS)
def test_static_map_equals_sglang_fixture(name, prefix):
    """static_map equals SGLang's tables on every rank, layer and expert, with and without dense rows and nodes."""
    f, plan = fixture(name), fixture_plan(name, prefix)
    if prefix + "sglang" not in f:  # SGLang's export fills empty slots: another plan, not run
        assert (plan.slots < 0).any()
        return
    configs = zip(f[prefix + "sglang_dense"], f[prefix + "sglang_nnodes"], f[prefix + "sglang"], strict=True)
    for dense, nnodes, engine in configs:
        rule = static_plan(name, prefix, int(dense))
        cluster = cluster_of(plan, plan.gpus // int(nnodes))  # SGLang's node size; one node: no preference
        ours = static_map(rule, cluster.gpus_per_node, STATIC_SEED, int(dense))  # as count_loads asks for it
        assert_same(ours, engine, ("rank", "layer", "expert"), f"dense rows {dense}, nnodes {nnodes}: ")
        counts = np.random.default_rng(0).random((plan.layers, plan.experts))
        loads = count_loads(rule, counts, cluster)
        np.testing.assert_allclose(loads, table_loads(engine, counts, plan.width, plan.gpus), atol=1e-12)


@pytest.mark.parametrize(("name", "prefix"), CASES, ids=IDS)
def test_vllm_maps_equal_fixture(name, prefix):
    """physical_copies and copy_counts equal vLLM's compute_logical_maps (logical_to_physical_map, replica count)."""
    f, plan = fixture(name), fixture_plan(name, prefix)
    l2p = f[prefix + "vllm_l2p"]
    ours = np.full(l2p.shape, -1)
    for l in range(plan.layers):
        c = physical_copies(plan, l)
        ours[l, :, : c.shape[1]] = c
    assert_same(ours, l2p, ("layer", "expert", "copy"))
    assert (plan.copy_counts == f[prefix + "vllm_count"]).all()


@pytest.mark.parametrize(("name", "prefix"), CASES, ids=IDS)
@pytest.mark.parametrize("batch", ["vllm_full_", "vllm_"])
def test_vllm_picks_equal_fixture(name, prefix, batch):
    """physical_copies + vllm_copy_index pick vLLM's kernel's physical slot for every (row, expert) of a batch,
    and route_trace under vllm serves every token on that slot's GPU with the GPU loads the kernel records."""
    f, plan = fixture(name), fixture_plan(name, prefix)
    topk = f[prefix + batch + "topk"].astype(np.int64)  # [N, k]: one batch, the same at every layer
    engine = f[prefix + batch + "physical"]  # [L, N, k]
    N, k = topk.shape
    row = np.arange(N)[:, None]
    ours = np.stack(
        [physical_copies(plan, l)[topk, vllm_copy_index(row, plan.copy_counts[l][topk])] for l in range(plan.layers)]
    )
    assert_same(ours, engine, ("layer", "row", "k"))
    trace = Trace(
        np.repeat(topk[:, None, :], plan.layers, axis=1),
        np.zeros(N, np.int32),
        np.zeros(N, np.int32),
        ("all",),
        plan.experts,
    )
    routing = route_trace(plan.with_dispatch(Dispatch(kind="vllm")), trace, cluster_of(plan, None))
    assert routing.gpu is not None
    gpu = np.moveaxis(engine, 0, 1) // plan.width
    assert_same(routing.gpu, gpu, ("row", "layer", "k"))
    load = f[prefix + batch + "load"].reshape(plan.layers, plan.gpus, plan.width).sum(axis=2)  # per slot -> GPU
    assert (routing.step_loads[:, 0, :] == load).all()


@pytest.mark.parametrize(("name", "prefix"), CASES, ids=IDS)
def test_ascend_map_equals_fixture(name, prefix):
    """ascend_map equals vLLM-Ascend's generate_log2phy_map of every rank (TP None, 2, 4), its physical ids
    mapped through the engine's numbering (rank * D + position in the device's list) to moeopt's slots;
    count_loads under ascend equals the loads of those tables."""
    f, plan = fixture(name), fixture_plan(name, prefix)
    if prefix + "ascend" not in f:  # the export refused it: devices with unequal numbers of distinct experts
        with pytest.raises(PlanError, match="same number of distinct experts"):
            vllm_ascend_layout(plan)
        return
    device_expert = f[prefix + "ascend_device_expert"].astype(np.int64)  # [L, G, D]: the file the engine read
    assert (vllm_ascend_layout(plan)[0] == device_expert).all()  # moeopt writes that file today
    L, G, D = device_expert.shape
    W = plan.width
    # the slot of (device g, expert e): its first slot on g
    first = np.full((L, G, plan.experts), -1)
    for w in reversed(range(W)):
        e = plan.slots[:, :, w]
        ll, gg = np.nonzero(e >= 0)
        first[ll, gg, e[ll, gg]] = w
    for tp, engine in zip(f[prefix + "ascend_tp"], f[prefix + "ascend"], strict=True):
        device, pos = engine // D, engine % D  # [G_src, L, E]
        layer = np.broadcast_to(np.arange(L)[None, :, None], engine.shape)
        expert = device_expert[layer, device, pos]
        assert (expert == np.arange(plan.experts)).all(), f"tp {tp}: the engine sends an expert to another one"
        slot = device * W + first[layer, device, expert]
        ours = ascend_map(plan, int(tp) or None)
        assert_same(ours, slot, ("rank", "layer", "expert"), f"tp_size {int(tp) or None}: ")
        counts = np.random.default_rng(1).random((L, plan.experts))
        rule = plan.with_dispatch(Dispatch(kind="ascend", tp_size=int(tp) or None))
        np.testing.assert_allclose(count_loads(rule, counts, cluster_of(plan, None)), table_loads(slot, counts, W, G))
