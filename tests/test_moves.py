"""The one search engine's shared parts: the slot state (moeopt.moves.slots) and the driver
(moeopt.moves.driver)."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.moves.driver import Moves, descend, iterate
from moeopt.moves.slots import SlotTable, WeightedSlots, presence
from tests.strategies import examples, float_arrays, slot_layouts

E, G, W = 5, 3, 3


def _consistent(t: SlotTable) -> None:
    """Presence and copy counts agree with the slot table recomputed from scratch."""
    assert np.array_equal(t.M, presence(t.e, t.E))
    assert np.array_equal(t.c, np.bincount(t.e[t.e >= 0], minlength=t.E))


# ----------------------------------------------------------------------------- slot state
@settings(max_examples=examples(25))
@given(
    slot_layouts(E, G, W, 1, fill=None),
    st.lists(st.tuples(st.integers(0, G * W - 1), st.integers(0, G * W - 1), st.integers(-1, E - 1)), max_size=12),
)
def test_swaps_and_replacements_keep_counts_and_checks_are_exact(slots, steps):
    """Every swap and replacement keeps M and c in step; can_swap / can_replace accept exactly
    the moves that change the plan, keep every expert a copy and colocate nothing."""
    t = SlotTable(slots[0], E)
    for p, q, x in steps:
        (g1, i1), (g2, i2) = divmod(p, W), divmod(q, W)
        trial = t.copy()
        trial.swap(g1, i1, g2, i2)
        _consistent(trial)
        changed = not np.array_equal(trial.e, t.e) and g1 != g2
        assert t.can_swap(g1, i1, g2, i2) == (changed and not (trial.M > 1).any())
        assert t.can_swap(g1, i1, g2, i2, allow=True) == changed
        if t.can_swap(g1, i1, g2, i2):
            t = trial
        trial = t.copy()
        trial.replace(g1, i1, x)
        _consistent(trial)
        a = int(t.e[g1, i1])
        ok = a != x and (a < 0 or trial.c[a] >= 1) and not (trial.M > 1).any()
        assert t.can_replace(g1, i1, x) == ok
        if ok:
            t = trial
    _consistent(t)


def test_copy_is_independent():
    t = SlotTable(np.array([[0, 1], [2, -1]]), 3)
    u = t.copy()
    u.replace(1, 1, 0)
    assert t.e[1, 1] == -1 and t.c[0] == 1 and u.c[0] == 2
    assert u.gf is t.gf  # the read-only GPU index is shared


@settings(max_examples=examples(25))
@given(slot_layouts(E, G, W, 1, fill=True, colocated=True), float_arrays(G * W, 0.0, 10.0))
def test_repair_removes_colocations_and_keeps_the_items(slots, weights):
    """Repair only swaps: the items and their weights stay the same, the sums stay exact,
    and when it reports success no GPU holds two copies of an expert."""
    e = slots[0]
    e = np.where(e < 0, 0, e)  # every slot filled
    item = np.arange(G * W).reshape(G, W)
    b = WeightedSlots(e, weights.reshape(G, W), E, item=item)
    ok = b.repair()
    _consistent(b)
    assert sorted(b.placed.ravel().tolist()) == list(range(G * W))
    assert np.array_equal(b.w, weights[b.placed])
    assert np.array_equal(b.e, e.ravel()[b.placed])
    assert np.allclose(b.s, b.w.sum(axis=1))
    assert ok == (not (b.M > 1).any())
    if (presence(e, E) <= 1).all():
        assert ok and np.array_equal(b.placed, item)


def test_repair_succeeds_when_a_fix_exists():
    b = WeightedSlots(np.array([[0, 0], [1, 2]]), np.ones((2, 2)), 3)
    assert b.repair()
    assert not (b.M > 1).any()


# ----------------------------------------------------------------------------- driver
def _halving() -> Moves:
    """Toy neighbourhood on [x]: the best step halves an even x (odd x is a local optimum)."""
    return Moves(lambda s: s[0] // 2 if s[0] % 2 == 0 and s[0] > 0 else None, lambda s, v: s.__setitem__(0, v))


def test_descend_stops_at_a_local_optimum_or_the_budget():
    s = [48]
    assert descend(s, _halving()) == 4 and s == [3]
    s = [48]
    assert descend(s, _halving(), max_steps=2) == 2 and s == [12]


class _Line:
    """Toy landscape: states are integers, value |x - 7| on even x and a plateau of 100 on
    odd x; descent does nothing, a kick adds ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.kicked: list[int] = []

    def descend(self, x: int, round: int) -> int:
        return x

    def kick(self, x: int, rng: np.random.Generator, round: int) -> int:
        self.kicked.append(x)
        return x + self.step

    def value(self, x: int) -> float:
        return abs(x - 7) if x % 2 == 0 else 100.0


def test_iterate_accepts_only_better_unless_sideways():
    rng = np.random.default_rng(0)
    # better only: every kick starts from the best (0): 1 is worse, so the search stays at 0
    line = _Line(1)
    best, value, log = iterate(line, 0, rng, rounds=3)
    assert (best, value, log.rounds, log.improvements) == (0, 7, 3, 0) and line.kicked == [0, 0, 0]
    # sideways: equal values are accepted, so the walk moves on along a plateau
    line = _Line(2)
    best, value, log = iterate(line, 0, rng, rounds=5)
    assert best == 6 and value == 1 and log.improvements == 3
    assert line.kicked == [0, 2, 4, 6, 6]  # 8 ties 6 (|8-7| = 1) but is not strictly better
    line = _Line(2)
    _, _, log = iterate(line, 0, rng, rounds=5, sideways=True)
    assert line.kicked == [0, 2, 4, 6, 8]


def test_iterate_stops_on_patience_and_deadline():
    rng = np.random.default_rng(0)
    _, _, log = iterate(_Line(1), 0, rng, rounds=50, patience=4)
    assert log.rounds == 4 and not log.capped
    _, _, log = iterate(_Line(2), 0, rng, rounds=50, deadline=time.perf_counter() - 1.0)
    assert log.rounds == 0 and log.capped
