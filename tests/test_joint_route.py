"""``route_masks`` against its original bit-sliced implementation, kept here as the reference:
identical outputs on random holder configurations (single- and multi-holder experts, ties,
empty masks, up to 64 GPUs, both the dense and the bit-sliced paths)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.joint.costs import holder_masks, route_masks
from tests.strategies import examples, int_arrays, topk_arrays

# ---------------------------------------------------------------- reference (original implementation)
_ONE = np.uint64(1)
_BYTE_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def _reference_popcount(x: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (8,))
    return _BYTE_POP[b].sum(axis=-1).astype(np.int64)


def _reference_lowest_bit(x: np.ndarray) -> np.ndarray:
    return _reference_popcount((x & (~x + _ONE)) - _ONE)


def _reference_pick(mask: np.ndarray, rot: np.ndarray, G: int) -> np.ndarray:
    r = rot.astype(np.uint64)
    full = np.uint64((1 << G) - 1) if G < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    rotated = (np.right_shift(mask, r) | np.left_shift(mask, (np.uint64(G) - r) % np.uint64(64))) & full
    rotated = np.where(r == 0, mask, rotated)
    return (_reference_lowest_bit(rotated) + rot) % G


def _reference_route_masks(
    tok_masks: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    gpu, used, fixed = _reference_route(tok_masks, rot, G)
    alt, alt_gpu = _reference_alternatives(tok_masks, gpu, used, fixed, rot, G)
    return gpu, alt, alt_gpu, _reference_popcount(used)


def _reference_planes(k: int) -> int:
    return max(1, int(math.ceil(math.log2(k + 1))))


def _reference_count_planes(contrib: np.ndarray, skip: int, nplanes: int) -> list[np.ndarray]:
    m, k = contrib.shape
    planes = [np.zeros(m, dtype=np.uint64) for _ in range(nplanes)]
    for j in range(k):
        if j == skip:
            continue
        carry = contrib[:, j]
        for i in range(nplanes):
            nxt = planes[i] & carry
            planes[i] = planes[i] ^ carry
            carry = nxt
        for i in range(nplanes):
            planes[i] |= carry
    return planes


def _reference_most(cand: np.ndarray, planes: list[np.ndarray]) -> np.ndarray:
    zero = np.uint64(0)
    best = cand.copy()
    for plane in reversed(planes):
        x = best & plane
        best = np.where(x != zero, x, best)
    return best


def _reference_count_at(planes: list[np.ndarray], b: np.ndarray) -> np.ndarray:
    bb = b.astype(np.uint64)
    return sum(((np.right_shift(pl, bb) & _ONE).astype(np.int64) << i) for i, pl in enumerate(planes))


def _reference_route(tok_masks: np.ndarray, rot: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, k = tok_masks.shape
    zero = np.uint64(0)
    fixed = _reference_popcount(tok_masks) == 1
    gpu = np.where(fixed, _reference_lowest_bit(tok_masks), -1)
    used = np.bitwise_or.reduce(np.where(fixed, tok_masks, zero), axis=1)
    rows = np.nonzero((~fixed).any(axis=1))[0]
    if not len(rows):
        return gpu, used, fixed
    nplanes = _reference_planes(k)
    contrib = tok_masks[rows].copy()
    for j in range(k):
        r = np.nonzero(~fixed[rows, j])[0]
        if not len(r):
            continue
        planes = _reference_count_planes(contrib[r], j, nplanes)
        g = _reference_pick(_reference_most(contrib[r, j], planes), rot[rows[r]], G)
        gpu[rows[r], j] = g
        contrib[r, j] = np.left_shift(_ONE, g.astype(np.uint64))
        used[rows[r]] |= contrib[r, j]
    return gpu, used, fixed


def _reference_alternatives(
    tok_masks: np.ndarray, gpu: np.ndarray, used: np.ndarray, fixed: np.ndarray, rot: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray]:
    n, k = tok_masks.shape
    zero = np.uint64(0)
    alt = np.full((n, k), np.inf)
    alt_gpu = np.full((n, k), -1, dtype=np.int64)
    rows = np.nonzero((~fixed).any(axis=1))[0]
    if not len(rows):
        return alt, alt_gpu
    nplanes = _reference_planes(k)
    contrib = np.left_shift(_ONE, gpu[rows].astype(np.uint64))
    for j in range(k):
        r = np.nonzero(~fixed[rows, j])[0]
        if not len(r):
            continue
        t = rows[r]
        planes = _reference_count_planes(contrib[r], j, nplanes)
        b = gpu[t, j]
        opts = tok_masks[t, j] & ~np.left_shift(_ONE, b.astype(np.uint64))
        has = opts != zero
        ab = _reference_pick(np.where(has, _reference_most(opts, planes), _ONE), rot[t], G)
        drop = _reference_count_at(planes, b) - _reference_count_at(planes, ab)
        alone = (gpu[t] == b[:, None]).sum(axis=1) == 1
        on_used = (np.right_shift(used[t], ab.astype(np.uint64)) & _ONE) == _ONE
        cost = np.where((drop <= 0) & (on_used | alone), 0.0, np.where(drop <= 1, 1.0, np.inf))
        alt[t, j] = np.where(has, cost, np.inf)
        alt_gpu[t, j] = np.where(has, ab, -1)
    return alt, alt_gpu


# ---------------------------------------------------------------- checks
def assert_same_routing(tok_masks: np.ndarray, rot: np.ndarray, G: int) -> None:
    got = route_masks(tok_masks, rot, G)
    want = _reference_route_masks(tok_masks, rot, G)
    for name, a, b in zip(("gpu", "alt", "alt_gpu", "distinct"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), name


def _bits(masks: list[int], G: int) -> np.ndarray:
    """bool ``[E, G]`` of holder masks given as ints."""
    m = np.array(masks, dtype=np.uint64)
    return ((m[:, None] >> np.arange(G, dtype=np.uint64)) & _ONE).astype(bool)


@st.composite
def routing_cases(draw: st.DrawFn, empty: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Token holder masks ``[n, k]``, rotations ``[n]`` and G: each expert on one GPU, a few,
    any non-empty subset or every GPU (and, with ``empty``, on none)."""
    G = draw(st.integers(2, 64))
    k = draw(st.integers(1, 8))
    E = draw(st.integers(k, 80))
    n = draw(st.integers(1, 40))
    gpus = st.integers(0, G - 1)
    holders = [
        gpus.map(lambda g: 1 << g),
        gpus.map(lambda g: 1 << g),
        st.lists(gpus, min_size=2, max_size=3).map(lambda gs: sum(1 << g for g in set(gs))),
        st.integers(1, (1 << G) - 1),
        st.just((1 << G) - 1),
    ]
    if empty:
        holders.append(st.just(0))
    masks = draw(st.lists(st.one_of(holders), min_size=E, max_size=E))
    topk = draw(topk_arrays((n,), E, k))
    rot = draw(int_arrays(n, 0, G - 1))
    return holder_masks(_bits(masks, G))[topk], rot, G


@settings(max_examples=examples(300))
@given(routing_cases())
def test_route_masks_matches_reference(case: tuple[np.ndarray, np.ndarray, int]) -> None:
    assert_same_routing(*case)


@settings(max_examples=examples(100))
@given(routing_cases(empty=True))
def test_route_masks_matches_reference_with_unheld_experts(case: tuple[np.ndarray, np.ndarray, int]) -> None:
    assert_same_routing(*case)


@pytest.mark.parametrize(
    ("G", "k", "n"),
    [
        (16, 6, 12000),  # the moonlight shape; several dense chunks
        (8, 8, 5000),
        (32, 6, 5000),  # dense, (k + 1) * G = 224
        (42, 5, 3000),  # dense at the bound, (k + 1) * G = 252
        (43, 5, 3000),  # bit-sliced just past it
        (32, 8, 5000),
        (64, 8, 6000),
        (64, 1, 3000),  # dense at 64 GPUs
        (2, 1, 2000),
    ],
)
def test_route_masks_matches_reference_large(G: int, k: int, n: int) -> None:
    rng = np.random.default_rng([G, k, n])
    E = max(k, 64 if G <= 16 else 2 * G)
    holds = np.zeros((E, G), dtype=bool)
    holds[np.arange(E), rng.integers(0, G, E)] = True
    for e in rng.choice(E, E // 3, replace=False):  # a third replicated: 2 to 4 holders, some on every GPU
        holds[e, rng.choice(G, int(rng.integers(1, min(4, G) + 1)), replace=False)] = True
    holds[rng.choice(E, 2, replace=False)] = True
    topk = np.argsort(rng.random((n, E)), axis=1)[:, :k]
    assert_same_routing(holder_masks(holds)[topk], rng.integers(0, G, n), G)
