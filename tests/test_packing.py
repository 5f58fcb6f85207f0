"""Packing experts onto GPUs by load (moeopt.packing) and the balanced start."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moeopt.heuristics.local_search import balanced_start
from moeopt.packing import balanced_homes, first_fit, round_robin_lpt
from tests.strategies import float_arrays, int_arrays


@st.composite
def cases(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    """(load, G, slots): E <= G * slots skewed loads (cubes of uniform draws)."""
    G = draw(st.integers(1, 5))
    slots = draw(st.integers(1, 4))
    E = draw(st.integers(1, G * slots))
    return draw(float_arrays(E, 0.0, 1.0)) ** 3, G, slots


@given(cases(), st.data())
def test_every_packing_places_each_expert_within_the_slots(
    case: tuple[np.ndarray, int, int], data: st.DataObject
) -> None:
    """LPT, round-robin LPT, first fit and the balanced start put every expert on a GPU with at most `slots` experts."""
    load, G, slots = case
    preferred = data.draw(int_arrays(len(load), 0, G - 1), label="preferred")
    for home in (
        balanced_homes(load, G, slots),
        round_robin_lpt(load, G, slots),
        first_fit(load, preferred, G, slots, limit=0.5 * load.sum()),
        balanced_start(load, G, slots),
    ):
        assert home.shape == load.shape and home.min() >= 0 and home.max() < G
        assert np.bincount(home, minlength=G).max() <= slots


def test_lpt_matches_the_hand_computed_packing() -> None:
    """Heaviest first onto the least-loaded GPU with a free slot (ties to the lowest id)."""
    load = np.array([0.1, 0.5, 0.25, 0.4, 0.3, 0.05])
    # 0.5 -> 0, 0.4 -> 1, 0.3 -> 1 (0.7), 0.25 -> 0 (0.75), 0.1 -> 1 (full), 0.05 -> 0
    assert balanced_homes(load, 2, 3).tolist() == [1, 0, 0, 1, 1, 0]
    # with speeds the earliest finish wins: GPU 1 is twice as fast (0.4 -> 1 at 0.2; 0.3 -> 0 at 0.3 < 0.35)
    assert balanced_homes(np.array([0.4, 0.3]), 2, 2, speed=np.array([1.0, 2.0])).tolist() == [1, 0]


def test_first_fit_keeps_the_preferred_gpu_when_it_has_room() -> None:
    """Without a binding limit every expert stays on its preferred GPU while that GPU has slots."""
    load = np.array([0.3, 0.2, 0.2, 0.1, 0.1, 0.1])
    preferred = np.array([0, 0, 0, 1, 1, 1])
    assert first_fit(load, preferred, 2, 3).tolist() == [0, 0, 0, 1, 1, 1]
    # a limit of 0.55 pushes the lightest of GPU 0's three (heaviest first: 0.3, 0.2, then 0.2 > room) away
    assert first_fit(load, preferred, 2, 3, limit=0.55).tolist() == [0, 0, 1, 1, 1, 0]


@given(cases())
def test_balanced_start_never_worse_than_its_round_robin_start(case: tuple[np.ndarray, int, int]) -> None:
    """The descent on the sum of squared GPU loads only lowers it."""
    load, G, slots = case

    def square(h: np.ndarray) -> float:
        return float((np.bincount(h, weights=load, minlength=G) ** 2).sum())

    assert square(balanced_start(load, G, slots)) <= square(round_robin_lpt(load, G, slots)) + 1e-12


@given(cases())
def test_round_robin_lpt_pairs_heavy_with_light_round_by_round(case: tuple[np.ndarray, int, int]) -> None:
    """Round-robin LPT against its definition, written out: heaviest first, each round of G
    experts onto the open GPUs, the heaviest of the round onto the least loaded (ties: lower id)."""
    load, G, slots = case
    home = round_robin_lpt(load, G, slots)
    expect = np.empty(len(load), dtype=np.int64)
    gl, count = [0.0] * G, [0] * G
    order = sorted(range(len(load)), key=lambda e: (-load[e], e))
    for start in range(0, len(load), G):
        open_ = sorted((g for g in range(G) if count[g] < slots), key=lambda g: (gl[g], g))
        for e, g in zip(order[start : start + G], open_, strict=False):
            expect[e] = g
            gl[g] += float(load[e])
            count[g] += 1
    assert (home == expect).all()


def test_round_robin_lpt_refuses_more_experts_than_slots() -> None:
    with pytest.raises(ValueError, match="do not fit 2 GPUs x 1 slots"):
        round_robin_lpt(np.ones(3), 2, 1)
