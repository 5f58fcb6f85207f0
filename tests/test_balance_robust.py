"""Invariants of the out-of-sample planner (moeopt.balance.shift)."""

from __future__ import annotations

import numpy as np
import pytest

from moeopt.balance.shift import (
    choose_alpha,
    layer_maxvio,
    plan_layer_oos,
    plan_layers_oos,
    shrink_loads,
)


def _load(E: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(0.0, 1.0, E) * 1000


def _check(slots: np.ndarray, E: int, G: int, W: int) -> None:
    assert slots.shape == (G, W)
    assert slots.min() >= 0 and slots.max() < E
    assert np.all(np.bincount(slots.ravel(), minlength=E) >= 1)  # every expert has a copy
    for g in range(G):  # no colocated copies
        assert len(set(slots[g].tolist())) == W


@pytest.mark.parametrize("dispatch", ["even", "lp"])
@pytest.mark.parametrize("E,G,W", [(64, 16, 5), (64, 8, 9), (32, 8, 5), (20, 4, 6)])
def test_invariants(dispatch: str, E: int, G: int, W: int) -> None:
    L = _load(E, E + G)
    for kappa in (0.0, 1.0):
        s = plan_layer_oos(L, G, W, dispatch=dispatch, kappa=kappa, iterations=2)
        _check(s, E, G, W)


def test_deterministic() -> None:
    L = _load(64, 3)
    a = plan_layer_oos(L, 16, 5, dispatch="lp", kappa=0.5, seed=7, iterations=3)
    b = plan_layer_oos(L, 16, 5, dispatch="lp", kappa=0.5, seed=7, iterations=3)
    assert np.array_equal(a, b)


def test_zero_and_skewed_loads() -> None:
    L = np.zeros(40)
    _check(plan_layer_oos(L, 8, 6, iterations=1), 40, 8, 6)
    L[0] = 1e6  # one hot expert: gets G copies
    s = plan_layer_oos(L, 8, 6, iterations=1)
    _check(s, 40, 8, 6)
    assert np.bincount(s.ravel(), minlength=40)[0] == 8


def test_shrink_loads() -> None:
    L = _load(50, 1)
    assert np.allclose(shrink_loads(L, 1.0), L)
    h = shrink_loads(L, 0.5)
    assert np.isclose(h.sum(), L.sum())
    assert np.all(np.argsort(h) == np.argsort(L))  # order kept
    assert h.std() < L.std()
    assert np.allclose(shrink_loads(L, 0.0), L.mean())
    with pytest.raises(ValueError):
        shrink_loads(L, 1.5)


def test_alpha_one_is_plan_layer() -> None:
    from moeopt.balance import plan_layer

    L = _load(64, 5)
    ours = plan_layer_oos(L, 16, 5, alpha=1.0, seed=2, iterations=2)
    assert np.array_equal(ours, plan_layer(L, 16, 5, seed=2, iterations=2))


def test_variance_descent_lowers_its_objective() -> None:
    L = _load(64, 9)
    s0 = plan_layer_oos(L, 16, 5, dispatch="even", alpha=1.0, iterations=2)
    s1 = plan_layer_oos(L, 16, 5, dispatch="even", alpha=1.0, kappa=1.0, iterations=2)
    c0, c1 = np.bincount(s0.ravel(), minlength=64), np.bincount(s1.ravel(), minlength=64)
    assert np.array_equal(c0, c1)  # counts fixed

    def obj(s: np.ndarray, c: np.ndarray) -> float:
        w = (L / c)[s]
        return float((w.sum(1) + np.sqrt((w**2).sum(1))).max())

    assert obj(s1, c1) <= obj(s0, c0) + 1e-9


def test_layers_and_maxvio() -> None:
    loads = np.stack([_load(32, k) for k in range(3)])
    s = plan_layers_oos(loads, 8, 5, dispatch="lp", iterations=1)
    assert s.shape == (3, 8, 5)
    for l in range(3):
        _check(s[l], 32, 8, 5)
        ve, vl = layer_maxvio(s[l], loads[l], "even"), layer_maxvio(s[l], loads[l], "lp")
        assert vl <= ve + 1e-6  # the LP split is never worse than the even one


def test_choose_alpha() -> None:
    rng = np.random.default_rng(0)
    base = rng.lognormal(0, 1, 32)
    snaps = np.stack([base * rng.lognormal(0, 0.5, 32) for _ in range(3)])
    grid = (1.0, 0.5)
    a = choose_alpha(snaps, 8, 5, dispatch="even", grid=grid, iterations=1)
    assert a in grid
    assert a == choose_alpha(snaps, 8, 5, dispatch="even", grid=grid, iterations=1)
    with pytest.raises(ValueError):
        choose_alpha(snaps[:1], 8, 5)
