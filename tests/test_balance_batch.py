"""Whole-model planner (moeopt.balance.batch): same plans' invariants as the per-layer planner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt import balance as B
from moeopt.balance import batch as BB
from moeopt.balance.layout import _Layout
from moeopt.balance.loads import _cap

REAL = Path(__file__).resolve().parents[1] / "instances" / "real" / "deepseek_v3_prefill_in1024.json"


@st.composite
def layers(draw, max_l: int = 4, max_e: int = 12, max_g: int = 6, max_w: int = 4):
    """``loads[L, E]`` (small integers, many ties and zeros), ``G``, ``W``, ``allow_colocated``."""
    nL = draw(st.integers(1, max_l))
    E = draw(st.integers(1, max_e))
    G = draw(st.integers(1, max_g))
    allow = draw(st.booleans())
    lo = max(1, -(-E // G))
    hi = max(max_w, lo) if allow else max(min(max_w, E), lo)
    W = draw(st.integers(lo, hi))
    vals = draw(st.lists(st.integers(0, 50), min_size=nL * E, max_size=nL * E))
    return np.array(vals, dtype=float).reshape(nL, E), G, W, allow


def lpt_reference(load: np.ndarray, G: int, W: int, allow: bool) -> np.ndarray:
    """Plain LPT with the water-filled copy counts, from the per-layer module."""
    E = load.size
    c = B.copy_counts(load, G * W, _cap(E, G, W, allow))
    e = np.repeat(np.arange(E), c)
    return e[B.lpt_pack((load / c)[e], e, G, W, allow)]


def check_layer(slots: np.ndarray, E: int, G: int, W: int, allow: bool) -> None:
    assert slots.shape == (G, W)
    assert slots.min() >= 0 and slots.max() < E
    assert np.all(np.bincount(slots.ravel(), minlength=E) >= 1), "an expert has no copy"
    if not allow:
        for row in slots:
            assert len(set(row.tolist())) == W, f"colocated copies on a GPU: {row}"


def real_loads(n: int = 8) -> np.ndarray:
    return np.array(json.loads(REAL.read_text())["logical_count"], dtype=float)[3 : 3 + n]


# --------------------------------------------------------------------------------------------------
# building blocks equal the per-layer functions
# --------------------------------------------------------------------------------------------------


@given(layers(max_l=5, max_e=10, max_g=6, max_w=5))
def test_copy_counts_batch_equals_per_layer(case):
    loads, G, W, allow = case
    E = loads.shape[1]
    cap = _cap(E, G, W, allow)
    got = BB.copy_counts_batch(loads, G * W, cap)
    for l, row in enumerate(loads):
        assert got[l].tolist() == B.copy_counts(row, G * W, cap).tolist()


def test_copy_counts_batch_caps_ties_and_errors():
    loads = np.array([[1000.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    for total, cap in ((12, 3), (12, None), (8, 2), (4, None)):
        got = BB.copy_counts_batch(loads, total, cap)
        ref = [B.copy_counts(row, total, cap).tolist() for row in loads]
        assert got.tolist() == ref
    with pytest.raises(ValueError):
        BB.copy_counts_batch(loads, 3)  # fewer copies than experts
    with pytest.raises(ValueError):
        BB.copy_counts_batch(loads, 13, 3)  # caps allow 12


@given(layers(max_l=4, max_e=12, max_g=6, max_w=4))
def test_lpt_pack_batch_equals_per_layer(case):
    loads, G, W, allow = case
    E = loads.shape[1]
    c = BB.copy_counts_batch(loads, G * W, _cap(E, G, W, allow))
    got = BB.lpt_pack_batch(loads, c, G, W, allow)
    for l, row in enumerate(loads):
        assert np.array_equal(got[l], lpt_reference(row, G, W, allow))


def test_lpt_pack_batch_repairs_stuck_layers_like_per_layer():
    # found by search: LPT's last copies of an expert find only GPUs that already hold it, so the
    # per-layer function repairs; the batch re-packs those layers with it, next to a plain layer
    cases = [
        (2, 3, [8.0, 1.0, 2.0, 1.0, 2.0], [1, 2, 1, 1, 1]),
        (3, 3, [3.0, 8.0, 5.0, 6.0, 3.0], [3, 1, 2, 2, 1]),
        (3, 3, [8.0, 6.0, 3.0, 5.0, 9.0], [2, 2, 2, 2, 1]),
    ]
    for G, W, load, counts in cases:
        loads = np.array([load, [1.0] * len(load)])
        c = np.array([counts, counts])
        out = BB.lpt_pack_batch(loads, c, G, W)
        for l in range(2):
            e = np.repeat(np.arange(len(load)), c[l])
            ref = e[B.lpt_pack((loads[l] / c[l])[e], e, G, W)]
            assert np.array_equal(out[l], ref)
            check_layer(out[l], len(load), G, W, False)


# --------------------------------------------------------------------------------------------------
# whole-model plans
# --------------------------------------------------------------------------------------------------


@settings(deadline=None)
@given(layers(max_l=4, max_e=12, max_g=6, max_w=4), st.sampled_from([None, 1, 8]))
def test_plan_layers_fast_valid_never_worse_than_lpt(case, partners):
    loads, G, W, allow = case
    nL, E = loads.shape
    out = BB.plan_layers_fast(loads, G, W, allow_colocated=allow, partners=partners)
    assert out.shape == (nL, G, W)
    for l, row in enumerate(loads):
        check_layer(out[l], E, G, W, allow)
        lpt = lpt_reference(row, G, W, allow)
        assert B.gpu_loads(out[l], row).max() <= B.gpu_loads(lpt, row).max() * (1 + 1e-12) + 1e-12
    again = BB.plan_layers_fast(loads, G, W, allow_colocated=allow, partners=partners)
    assert np.array_equal(out, again)


def test_plan_layers_fast_real_loads_beat_lpt_and_are_deterministic():
    loads = real_loads()
    for G, W in ((64, 5), (32, 9)):
        out = BB.plan_layers_fast(loads, G, W)
        assert np.array_equal(out, BB.plan_layers_fast(loads, G, W))
        mv = BB.maxvio_batch(out, loads)
        lpt = np.array([B.maxvio(lpt_reference(row, G, W, False), row) for row in loads])
        for l, row in enumerate(loads):
            check_layer(out[l], 256, G, W, False)
            assert mv[l] == pytest.approx(B.maxvio(out[l], row), abs=1e-12)
        assert np.all(mv <= lpt + 1e-12)
        assert mv.mean() < lpt.mean() / 5  # LPT alone is about EPLB's balance; the descent is far better
        assert mv.max() < 0.003


def test_swap_descent_reaches_local_optimum_of_per_layer_descent():
    # from the same LPT start, the per-layer max-bin descent finds no improving swap in the result
    loads = real_loads(3)
    G, W = 32, 9
    out = BB.plan_layers_fast(loads, G, W)
    for l, row in enumerate(loads):
        lay = _Layout(out[l], None, 256, allow=False, load=row, cap=G)
        assert lay.best_swap(int(np.argmax(lay.s))) is None


def test_target_and_max_rounds_stop_early():
    loads = real_loads(4)
    G, W = 64, 5
    c = BB.copy_counts_batch(loads, G * W, G)
    start = BB.lpt_pack_batch(loads, c, G, W)
    same, swaps = BB.swap_descent_batch(start, loads, target=1.0)  # LPT already meets it
    assert np.array_equal(same, start) and swaps.tolist() == [0] * 4
    _, swaps = BB.swap_descent_batch(start, loads, max_rounds=3)
    assert swaps.max() <= 3
    full = BB.maxvio_batch(BB.plan_layers_fast(loads, G, W), loads)
    target = 0.005
    mid = BB.maxvio_batch(BB.plan_layers_fast(loads, G, W, target=target), loads)
    lpt = BB.maxvio_batch(start, loads)
    assert np.all(mid <= np.maximum(target, full) + 1e-12)
    assert np.all(mid <= lpt + 1e-12)


def test_polish_never_worse():
    loads = real_loads(3)
    G, W = 64, 5
    base = BB.maxvio_batch(BB.plan_layers_fast(loads, G, W), loads)
    pol = BB.plan_layers_fast(loads, G, W, polish_above=0.0, polish_iterations=0)
    for l in range(3):
        check_layer(pol[l], 256, G, W, False)
    assert np.all(BB.maxvio_batch(pol, loads) <= base + 1e-12)


def test_edge_layers_zero_load_and_one_gpu():
    loads = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 1.0]])
    for G, W, allow in ((2, 2, False), (1, 3, False), (3, 1, False), (2, 3, True)):
        out = BB.plan_layers_fast(loads, G, W, allow_colocated=allow)
        for l in range(2):
            check_layer(out[l], 3, G, W, allow)
    assert BB.maxvio_batch(BB.plan_layers_fast(loads, 2, 2), loads)[0] == 0.0
    assert BB.plan_layers_fast(np.zeros((0, 4)), 2, 2).shape == (0, 2, 2)


def test_input_errors():
    with pytest.raises(ValueError):
        BB.plan_layers_fast(np.ones(4), 2, 2)  # 1-D
    with pytest.raises(ValueError):
        BB.plan_layers_fast(np.ones((2, 5)), 2, 2)  # 5 experts, 4 slots
    with pytest.raises(ValueError):
        BB.plan_layers_fast(np.ones((2, 2)), 2, 3)  # W > E needs colocation
    with pytest.raises(ValueError):
        BB.plan_layers_fast(-np.ones((2, 4)), 2, 2)
    with pytest.raises(ValueError):
        BB.swap_descent_batch(np.zeros((1, 2, 2), dtype=int), np.ones((1, 4)))  # experts without a copy
    with pytest.raises(ValueError):
        BB.swap_descent_batch(np.array([[[0, 0], [1, 2]]]), np.ones((1, 3)))  # colocated start
    out, _ = BB.swap_descent_batch(np.array([[[0, 0], [1, 2]]]), np.ones((1, 3)), allow_colocated=True)
    assert sorted(out.ravel().tolist()) == [0, 0, 1, 2]
