"""The joint certificate (moeopt/colgen/cover.py) against brute-force optima on tiny layers."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.colgen.cover import (
    HypergraphPricer,
    distinct_lower_bound,
    pair_saving_bound,
    remote_lower_bound,
    stay_upper_bound,
    token_patterns,
)
from moeopt.colgen.pair_sdp import lagrangian_bound, pair_sdp_saving_bound, pair_weights, secant_weights
from moeopt.evaluate import evaluate
from moeopt.io import load_instance
from moeopt.solve import load_workloads, solve
from tests.conftest import INSTANCES


def random_tokens(seed: int, E: int, k: int, tokens: int) -> np.ndarray:
    """Tokens with skewed, correlated expert choices (two preference profiles)."""
    rng = np.random.default_rng(seed)
    pref = rng.dirichlet(np.full(E, 0.6), size=2)
    return np.array([rng.choice(E, size=k, replace=False, p=pref[t % 2]) for t in range(tokens)])


@st.composite
def tiny_layers(draw, max_experts: int = 5, max_tokens: int = 12) -> tuple[int, int, int, int, int, int]:
    """``(seed, E, G, W, k, tokens)`` of a tiny layer whose slots hold every expert."""
    seed, E = draw(st.integers(0, 10_000)), draw(st.integers(2, max_experts))
    G, W, k = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return seed, E, G, max(W, -(-E // G)), min(k, E), draw(st.integers(1, max_tokens))


def brute_force(topk: np.ndarray, E: int, G: int, W: int) -> float:
    """Least mean distinct GPUs per token over every plan (GPUs of ``min(W, E)`` distinct experts,
    every expert held): a plan with smaller GPUs extends to full ones with no token using more."""
    sets = [sum(1 << e for e in c) for c in itertools.combinations(range(E), min(W, E))]
    tok = [sum(1 << int(e) for e in row) for row in topk]
    full = (1 << E) - 1
    best = np.inf
    for plan in itertools.combinations_with_replacement(sets, G):
        union = 0
        for s in plan:
            union |= s
        if union != full:
            continue
        covers = [(m, sum(1 << i for i in c)) for m in range(1, G + 1) for c in itertools.combinations(range(G), m)]
        unions = [(m, np.bitwise_or.reduce([plan[i] for i in range(G) if idx >> i & 1])) for m, idx in covers]
        total = sum(min(m, *(mm for mm, u in unions if u & t == t)) for t in tok for m in [G])
        best = min(best, total / len(tok))
    return float(best)


@pytest.mark.parametrize(
    ("seed", "E", "G", "W", "k"),
    [(0, 5, 3, 2, 3), (1, 6, 2, 3, 3), (2, 6, 3, 2, 3), (3, 6, 3, 3, 4), (4, 5, 3, 3, 2), (5, 6, 3, 3, 3)],
)
def test_bound_is_below_the_brute_force_optimum(seed, E, G, W, k):
    """The bound on mean distinct GPUs per token never exceeds the best plan's (any dispatch)."""
    topk = random_tokens(seed, E, k, 30)
    b = distinct_lower_bound(topk, E, G, W, time_limit=5.0)
    opt = brute_force(topk, E, G, W)
    assert b.distinct <= opt + 1e-9
    assert b.distinct >= 1.0


def test_bound_is_not_trivial_when_the_lp_is_solved():
    """On a tiny layer the LP is solved and the bound is well above one GPU per token."""
    topk = random_tokens(7, 6, 3, 40)
    b = distinct_lower_bound(topk, 6, 3, 2, time_limit=5.0)
    assert b.proven
    assert 1.5 < b.distinct <= brute_force(topk, 6, 3, 2) + 1e-9


@settings(max_examples=25)
@given(tiny_layers(), st.sampled_from([0.05, 2.0]))
def test_bound_property(layer, time_limit):
    """Random small layers, solved or cut short: the bound stays below the optimum."""
    seed, E, G, W, k, tokens = layer
    topk = random_tokens(seed, E, k, tokens)
    b = distinct_lower_bound(topk, E, G, W, time_limit=time_limit)
    assert b.distinct <= brute_force(topk, E, G, W) + 1e-9


def direct_value(pats: np.ndarray, w: np.ndarray, S: np.ndarray) -> float:
    """``sum_t w_t (|S ∩ T_t| - 1)^+`` token by token."""
    return float(sum(wt * max(len(set(S.tolist()) & set(p.tolist())) - 1, 0) for p, wt in zip(pats, w, strict=True)))


@pytest.mark.parametrize("W", [2, 3, 4, 5])
def test_pricing_upper_bounds_every_column(W):
    """Exact pricing's upper bound is at least every column's reduced value (by enumeration),
    and equal to the best when it enumerates (W <= 4); column values match a direct count."""
    E = 8
    topk = random_tokens(11, E, 5, 50)
    pats, w = token_patterns(topk)
    pricer = HypergraphPricer(pats, w, E, W)
    pi = -np.random.default_rng(3).uniform(0, 3, E)
    pr = pricer.exact(pi, time_limit=5.0)
    sets = [np.array(c) for m in range(1, W + 1) for c in itertools.combinations(range(E), m)]
    values = pricer.value(sets)
    assert values[:30] == pytest.approx([direct_value(pats, w, s) for s in sets[:30]])
    best = float(max(values - np.array([pi[s].sum() for s in sets])))
    assert pr.upper >= best - 1e-9
    if W <= 4:
        assert pr.proven and pr.upper == pytest.approx(best)
    assert (pricer.reduced(pr.groups, pi) <= pr.upper + 1e-9).all()


@settings(max_examples=40, deadline=None)
@given(tiny_layers())
def test_pair_bound_is_below_the_brute_force_optimum(layer):
    """The bound without column generation (pair LP and star), spare slots included, never
    exceeds the best plan's mean distinct GPUs per token."""
    seed, E, G, W, k, tokens = layer
    topk = random_tokens(seed, E, k, tokens)
    pats, w = token_patterns(topk)
    need = float(sum(len(set(p.tolist())) * x for p, x in zip(pats, w, strict=True)))
    saving = pair_saving_bound(pats, w, E, G, W)
    assert saving >= -1e-9
    assert (need - saving) / w.sum() <= brute_force(topk, E, G, W) + 1e-9


@pytest.mark.parametrize(("E", "G", "W"), [(12, 4, 3), (12, 4, 4), (16, 4, 4), (10, 3, 5)])
def test_pair_bound_holds_for_random_plans_with_copies(E, G, W):
    """Against the saving of many random plans (replicated experts in the spare slots, counted
    by hand), on layers larger than brute force can reach."""
    rng = np.random.default_rng(E * G * W)
    topk = random_tokens(E + W, E, 4, 200)
    pats, w = token_patterns(topk)
    bound = pair_saving_bound(pats, w, E, G, W)
    best = 0.0
    for _ in range(300):
        slots = np.concatenate([rng.permutation(E), rng.integers(0, E, G * W - E)])
        rng.shuffle(slots)
        groups = [np.unique(g) for g in slots.reshape(G, W)]
        if len(set().union(*map(set, groups))) < E:
            continue
        best = max(best, sum(direct_value(pats, w, g) for g in groups))
    assert 0 < best <= bound + 1e-9


def test_pair_bound_certifies_a_large_layer_the_column_generation_cannot_finish():
    """256 experts on 64 GPUs, 2 seconds: no exact pricing in time, the pair bound is the
    certificate, far above one GPU per token and below the agnostic-like chunk plan's figure."""
    topk = random_tokens(5, 256, 8, 4000)
    b = distinct_lower_bound(topk, 256, 64, 4, time_limit=0.5)
    assert b.info["gen_kind"] == "pair"
    linear = np.mean([len(np.unique(t // 4)) for t in topk])  # GPU g holds experts 4g .. 4g + 3
    assert 5.0 < b.distinct <= linear + 1e-9


def layer_plans(E: int, G: int, W: int) -> list[list[int]]:
    """Every plan of one layer as G bitmasks of at most W distinct experts covering all E."""
    sets = [sum(1 << e for e in c) for m in range(1, min(W, E) + 1) for c in itertools.combinations(range(E), m)]
    full = (1 << E) - 1
    return [list(p) for p in itertools.combinations_with_replacement(sets, G) if np.bitwise_or.reduce(p) == full]


@settings(max_examples=30, deadline=None)
@given(tiny_layers(max_experts=4, max_tokens=10))
def test_stay_bound_is_above_every_pair_of_plans(layer):
    """The share of tokens whose previous top-1 expert shares a GPU with one of their experts
    (in the best case for them: any GPU holding it) never exceeds the bound, over every pair of
    plans of tiny layers, spare slots included."""
    seed, E, G, W, k, tokens = layer
    rng = np.random.default_rng(seed)
    prev = rng.integers(0, E, tokens)
    topk = random_tokens(seed + 1, E, k, tokens)
    bound = stay_upper_bound(prev, topk, E, G, W)
    tok = [sum(1 << int(e) for e in row) for row in topk]
    plans = layer_plans(E, G, W)
    best = 0
    for before in plans:
        for now in plans:
            stay = sum(
                any(g0 >> int(e) & 1 and g1 & t for g0, g1 in zip(before, now, strict=True))
                for e, t in zip(prev, tok, strict=True)
            )
            best = max(best, stay)
    assert 0.0 <= bound <= 1.0
    assert best / tokens <= bound + 1e-9


def test_stay_bound_is_tight_when_one_gpu_can_keep_every_token():
    """Two experts, one GPU of two slots: every token stays (bound 1); on 2 GPUs of one slot a
    token whose previous expert is 0 and whose expert is 1 cannot stay."""
    prev, topk = np.array([0, 1, 0]), np.array([[1], [1], [0]])
    assert stay_upper_bound(prev, topk, 2, 1, 2) == pytest.approx(1.0)
    assert stay_upper_bound(prev, topk, 2, 2, 1) == pytest.approx(2 / 3)


def test_remote_conversion():
    """Uniform homes: distinct (1 - 1/G); known homes: distinct - 1, never below 0."""
    assert remote_lower_bound(3.0, 4, True) == pytest.approx(2.25)
    assert remote_lower_bound(3.0, 4, False) == pytest.approx(2.0)
    assert remote_lower_bound(0.5, 4, False) == 0.0
    assert remote_lower_bound(3.0, 4, False, stay=0.25) == pytest.approx(2.75)


def test_joint_reports_a_valid_bound():
    """``joint``'s bound is at most the evaluator's calibration figure for its own plan, per layer
    too, and a zero bound_time turns the certificate off."""
    inst = load_instance(INSTANCES / "gesr-small.yaml")
    wl = load_workloads(inst)
    r = solve(inst, method="joint", params={"time_per_layer": 0.3, "bound_time": 2.0}, workloads=wl)
    cal = evaluate(r.plan, wl.calibration, inst.cluster)
    assert r.bound is not None and 0 < r.bound <= cal["comm_per_token"] + 1e-9
    per = r.stats["communication_lower_bound_per_layer"]
    assert all(b <= c + 1e-9 for b, c in zip(per, cal["comm_per_layer"], strict=True))
    assert r.stats["communication_gap"] == pytest.approx(r.objective - r.bound)
    kinds = r.stats["bound_kind_per_layer"]
    assert len(kinds) == len(per) and set(kinds) <= {"trivial", "colgen", "pair", "sdp"}
    off = solve(inst, method="joint", params={"time_per_layer": 0.3, "bound_time": 0}, workloads=wl)
    assert off.bound is None


def single_copy_plans(E: int, G: int, W: int, load: np.ndarray, limit: float) -> list[np.ndarray]:
    """Every single-copy plan (expert -> GPU) of at most W experts per GPU with each GPU's load
    within ``limit``."""
    out = []
    for home in itertools.product(range(G), repeat=E):
        h = np.array(home)
        if np.bincount(h, minlength=G).max() <= W and np.bincount(h, weights=load, minlength=G).max() <= limit + 1e-9:
            out.append(h)
    return out


def mean_distinct(topk: np.ndarray, home: np.ndarray) -> float:
    return float(np.mean([len(set(home[t].tolist())) for t in topk]))


def as_slots(home: np.ndarray, G: int, W: int) -> np.ndarray:
    slots = np.full((G, W), -1)
    for g in range(G):
        held = np.flatnonzero(home == g)
        slots[g, : len(held)] = held
    return slots


@st.composite
def limited_layers(draw) -> tuple[int, int, int, int, int, float]:
    """``(seed, E, G, W, k, slack)``: a tiny single-copy layer and a load limit ``slack`` above
    the least reachable largest GPU load."""
    seed, E = draw(st.integers(0, 10_000)), draw(st.integers(3, 6))
    G = draw(st.integers(2, 3))
    W = max(draw(st.integers(2, 4)), -(-E // G))
    return seed, E, G, W, draw(st.integers(2, 3)), draw(st.sampled_from([0.0, 0.05, 0.3]))


@settings(max_examples=30, deadline=None)
@given(limited_layers())
def test_load_limited_bound_is_below_the_best_plan_within_the_limit(layer):
    """With loads and a limit, the bound holds for every single-copy plan within the limit
    (brute force), is at least the bound without the limit when both LPs are solved, and is used
    only when the start plan is within the limit."""
    seed, E, G, W, k, slack = layer
    rng = np.random.default_rng(seed)
    topk = random_tokens(seed, E, k, 40)
    load = rng.dirichlet(np.full(E, 0.7))
    least = min(np.bincount(h, weights=load, minlength=G).max() for h in single_copy_plans(E, G, W, load, 1.0))
    limit = least * (1.0 + slack)
    plans = single_copy_plans(E, G, W, load, limit)
    opt = min(mean_distinct(topk, h) for h in plans)
    start = plans[int(rng.integers(len(plans)))]
    b = distinct_lower_bound(
        topk, E, G, W, time_limit=5.0, start_slots=as_slots(start, G, W), load=load, load_limit=limit
    )
    assert b.info["load_limited"]
    assert b.distinct <= opt + 1e-9
    free = distinct_lower_bound(topk, E, G, W, time_limit=5.0, start_slots=as_slots(start, G, W))
    if b.proven and free.proven:
        assert b.distinct >= free.distinct - 1e-9
    # a start over the limit: the limit is dropped (the bound is the one without it)
    over = [h for h in itertools.product(range(G), repeat=E) if np.bincount(np.array(h), minlength=G).max() <= W]
    over = [np.array(h) for h in over if np.bincount(np.array(h), weights=load, minlength=G).max() > limit + 1e-6]
    if over:
        d = distinct_lower_bound(
            topk, E, G, W, time_limit=5.0, start_slots=as_slots(over[0], G, W), load=load, load_limit=limit
        )
        assert not d.info["load_limited"]


def test_load_limit_tightens_the_bound_where_it_binds():
    """Two heavy experts that every token uses together may not share a GPU: without the limit
    the bound is one GPU per token, with it two."""
    E, G, W = 4, 2, 2
    topk = np.array([[0, 1]] * 30 + [[2, 3]] * 2)
    load = np.array([0.4, 0.4, 0.1, 0.1])
    start = np.array([0, 1, 0, 1])  # loads 0.5, 0.5
    free = distinct_lower_bound(topk, E, G, W, time_limit=5.0, start_slots=as_slots(start, G, W))
    tight = distinct_lower_bound(
        topk, E, G, W, time_limit=5.0, start_slots=as_slots(start, G, W), load=load, load_limit=0.5
    )
    best = min(mean_distinct(topk, h) for h in single_copy_plans(E, G, W, load, 0.5))
    assert free.distinct == pytest.approx(1.0)
    assert tight.distinct == pytest.approx(best) == pytest.approx(2.0)


@pytest.mark.parametrize("W", [2, 3, 4, 5])
def test_load_limited_pricing_upper_bounds_every_admissible_column(W):
    """Within a load limit, exact pricing's upper bound is at least every admissible column's
    reduced value, of every size (equal to the best when it enumerates), and every column it
    returns is admissible."""
    E = 8
    topk = random_tokens(12, E, 5, 50)
    pats, w = token_patterns(topk)
    load = np.random.default_rng(4).dirichlet(np.full(E, 0.5))
    limit = 0.3
    pricer = HypergraphPricer(pats, w, E, W, load, limit)
    pi = -np.random.default_rng(5).uniform(0, 3, E)
    pr = pricer.exact(pi, time_limit=5.0)
    sets = [np.array(c) for m in range(1, W + 1) for c in itertools.combinations(range(E), m)]
    ok = [s for s in sets if load[s].sum() <= limit]
    assert len(ok) < len(sets)  # the limit binds
    best = float(max(pricer.value(ok) - np.array([pi[s].sum() for s in ok])))
    assert pr.upper >= best - 1e-9
    if W <= 4:
        assert pr.proven and pr.upper == pytest.approx(best)
    assert all(pricer.admissible(s) for s in pr.groups)


@settings(max_examples=30, deadline=None)
@given(limited_layers())
def test_load_limited_stay_and_pair_bounds_hold_for_every_plan_within_the_limits(layer):
    """Within load limits (single copy): the stay bound is at least the share of tokens that stay
    for every pair of plans within the two layers' limits, and the pair bound at least every such
    plan's saving (brute force)."""
    seed, E, G, W, k, slack = layer
    rng = np.random.default_rng(seed)
    prev = rng.integers(0, E, 30)
    topk = random_tokens(seed + 1, E, k, 30)
    u0, u1 = rng.dirichlet(np.full(E, 0.7)), rng.dirichlet(np.full(E, 0.7))
    lim = []
    for u in (u0, u1):
        least = min(np.bincount(h, weights=u, minlength=G).max() for h in single_copy_plans(E, G, W, u, 1.0))
        lim.append(least * (1.0 + slack))
    before, now = single_copy_plans(E, G, W, u0, lim[0]), single_copy_plans(E, G, W, u1, lim[1])
    stay = stay_upper_bound(prev, topk, E, G, W, loads=(u0, u1), load_limits=(lim[0], lim[1]))
    best = max(
        np.mean([b[p] in set(h[t].tolist()) for p, t in zip(prev, topk, strict=True)]) for b in before for h in now
    )
    assert best <= stay + 1e-9 <= stay_upper_bound(prev, topk, E, G, W) + 2e-9
    pats, w = token_patterns(topk)
    pair = pair_saving_bound(pats, w, E, G, W, u1, lim[1])
    need = float(sum(len(set(p.tolist())) * x for p, x in zip(pats, w, strict=True)))
    saving = max(need - mean_distinct(topk, h) * len(topk) for h in now)
    assert saving <= pair + 1e-9


def test_load_limit_tightens_the_stay_bound():
    """Every token's previous top-1 expert is 0 or 1 and its expert is 2. Without a limit, 0 and
    1 may share a GPU (3 slots) and 2 sit on it next: every token stays (bound 1). Within the
    limit 0 and 1 (0.4 each of a 0.5 limit) cannot share a GPU, so at most half the tokens stay;
    the LP row of expert 2, ``0.4 z_02 + 0.4 z_12 <= 0.5``, gives 0.625."""
    E, G, W = 6, 2, 3
    prev = np.array([0] * 10 + [1] * 10)
    topk = np.array([[2]] * 20)
    u_prev = np.array([0.4, 0.4, 0.05, 0.05, 0.05, 0.05])
    u_now = np.full(E, 1.0 / E)
    free = stay_upper_bound(prev, topk, E, G, W)
    tight = stay_upper_bound(prev, topk, E, G, W, loads=(u_prev, u_now), load_limits=(0.5, 0.5))
    assert free == pytest.approx(1.0)
    assert tight == pytest.approx(0.625, abs=1e-5)


def test_stay_bound_counts_a_token_once():
    """A token with several experts beside its home stays once: the LP over token patterns is
    below the one weighting each (previous expert, expert) pair by its tokens, which counts it
    once per expert (32 experts on 8 GPUs of 4 slots, skewed tokens)."""
    from moeopt.colgen.cover import _copy_graph_rows, _lp_upper_bound

    E, G, W = 32, 8, 4
    prev = np.random.default_rng(0).integers(0, E, 300)
    topk = random_tokens(1, E, 4, 300)
    key = np.unique((np.arange(len(prev))[:, None] * E + prev[:, None]) * E + topk)
    B = np.bincount(key % (E * E), minlength=E * E).astype(np.float64)
    nz = np.flatnonzero(B)
    A_ub, b_ub, lo, hi = _copy_graph_rows(nz // E, E + nz % E, np.repeat(np.arange(2), E), float(W), G, W, False)
    per_pair = _lp_upper_bound(np.r_[B[nz], np.zeros(len(lo) - nz.size)], A_ub, b_ub, lo, hi)
    assert per_pair is not None
    assert stay_upper_bound(prev, topk, E, G, W) < min(1.0, per_pair / len(prev)) - 0.02


def test_stay_bound_under_a_time_limit_falls_back_to_a_valid_looser_bound():
    """With no time for the pattern LP the per-pair LP answers: never below the pattern LP's
    bound (the tighter valid one), and at most 1."""
    E, G, W = 64, 16, 4
    prev = np.random.default_rng(2).integers(0, E, 4000)
    topk = random_tokens(3, E, 6, 4000)
    full = stay_upper_bound(prev, topk, E, G, W)
    quick = stay_upper_bound(prev, topk, E, G, W, time_limit=1e-6)
    assert full - 1e-9 <= quick <= 1.0


def test_stay_bound_keeps_the_per_pair_bound_when_the_pattern_lp_is_cut(monkeypatch):
    """The per-pair LP is solved first: when the pattern LP is then stopped by its cap, the bound
    is the per-pair one (not 1), and the report says which answered."""
    from moeopt.colgen import cover

    E, G, W = 64, 16, 4
    prev = np.random.default_rng(1).integers(0, E, 4000)
    topk = random_tokens(2, E, 6, 4000)
    full: dict = {}
    tight = stay_upper_bound(prev, topk, E, G, W, report=full)

    def spends_its_cap(*args):  # the pattern LP stopped by its cap, having used all of it
        time.sleep(args[-1])
        return None, True

    monkeypatch.setattr(cover, "_stay_lp", spends_its_cap)
    cut: dict = {}
    looser = stay_upper_bound(prev, topk, E, G, W, time_limit=1.0, report=cut)
    assert full == {"stay_lp": "patterns", "capped": False}
    assert cut == {"stay_lp": "pairs", "capped": True}
    assert tight + 0.05 < looser < 0.7


def least_distinct(plan: list[int], token: int) -> int:
    """The fewest GPUs of ``plan`` (bitmasks) whose union holds every expert of ``token`` (a
    bitmask): the distinct GPUs of the token under the best dispatch."""
    G = len(plan)
    for m in range(1, G + 1):
        for gs in itertools.combinations(range(G), m):
            if np.bitwise_or.reduce([plan[g] for g in gs]) & token == token:
                return m
    raise AssertionError("the plan does not hold the token's experts")


@settings(max_examples=30, deadline=None)
@given(tiny_layers(max_experts=5, max_tokens=10))
def test_pair_sdp_bound_is_above_every_plans_saving(layer):
    """The semidefinite bound on the saving (copies included) is at least the saving
    ``k - distinct`` of every plan under its best dispatch (by enumeration)."""
    seed, E, G, W, k, tokens = layer
    topk = random_tokens(seed, E, k, tokens)
    pats, w = token_patterns(topk)
    bound = pair_sdp_saving_bound(pats, w, E, G, W)
    masks = [sum(1 << int(e) for e in np.unique(p)) for p in pats]
    best = max(
        sum(x * (bin(t).count("1") - least_distinct(plan, t)) for t, x in zip(masks, w, strict=True))
        for plan in layer_plans(E, G, W)
    )
    assert bound >= best - 1e-6


@pytest.mark.parametrize(("E", "G", "W"), [(12, 4, 3), (12, 4, 4), (16, 4, 4), (10, 3, 5)])
def test_pair_sdp_bound_holds_for_random_plans_with_copies(E, G, W):
    """Against random plans with copies in the spare slots, each token dispatched to the fewest
    GPUs (by enumeration), on layers larger than brute force reaches."""
    rng = np.random.default_rng(E * G + W)
    topk = random_tokens(E * W, E, 4, 150)
    pats, w = token_patterns(topk)
    bound = pair_sdp_saving_bound(pats, w, E, G, W)
    masks = [sum(1 << int(e) for e in p) for p in pats]
    for _ in range(40):
        slots = np.concatenate([rng.permutation(E), rng.integers(0, E, G * W - E)])
        rng.shuffle(slots)
        plan = [sum(1 << int(e) for e in set(g.tolist())) for g in slots.reshape(G, W)]
        saving = sum(x * (bin(t).count("1") - least_distinct(plan, t)) for t, x in zip(masks, w, strict=True))
        assert saving <= bound + 1e-6


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 1000), st.floats(0.0, 2.0))
def test_lagrangian_bound_is_valid_for_any_multipliers(seed, scale):
    """The recomputed bound holds whatever the multipliers (here random, of any sign): it is at
    least the best plan's pair count ``max <A / 2, X>`` by enumeration (X: the experts sharing
    some GPU)."""
    rng = np.random.default_rng(seed)
    E, G, W = 4, 2, 3
    pats = np.sort(np.array([rng.choice(E, 2, replace=False) for _ in range(8)]), axis=1)
    A = pair_matrix(pats, np.ones(len(pats)), E)
    best = 0.0
    for plan in layer_plans(E, G, W):
        X = np.array([[any(p >> e & 1 and p >> f & 1 for p in plan) for f in range(E)] for e in range(E)], float)
        best = max(best, float((A / 2 * X).sum()))
    P, N = rng.normal(0, scale, (E, E)), rng.normal(0, scale, (E, E))
    r, mu, nu = rng.normal(0, scale, E), rng.normal(0, scale, E), rng.normal(0, scale, E)
    assert lagrangian_bound(A, G, W, P, N, r, mu, nu, float(rng.normal(0, scale))) >= best - 1e-9


def test_pair_sdp_bound_without_spare_slots_is_the_grouping_relaxation():
    """Without spare slots every expert has one copy, and the bound is at most the grouping's
    semidefinite relaxation of the pair affinity (`moeopt.solvers.grouping_sdp`, the same
    relaxation with the secant of ``1 / n`` through 1 and 2 for every expert; the per-expert
    secants can only tighten it); and on a spread-out layer whose column generation is cut short
    (one round) it is above the pair LP's bound, and the bound reports it."""
    from moeopt.grouping import Grouping
    from moeopt.solvers.grouping_sdp import sdp_bound

    topk = random_tokens(3, 16, 4, 300)
    pats, w = token_patterns(topk)
    mine = pair_sdp_saving_bound(pats, w, 16, 4, 4, iterations=20_000)
    theirs = sdp_bound(Grouping(pair_matrix(pats, w, 16), np.full(16, 1 / 16), 4, 4), structured=False).bound
    assert mine <= theirs * (1 + 2e-3)
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(32, 5.0))
    topk = np.array([rng.choice(32, size=8, replace=False, p=p) for _ in range(400)])
    b = distinct_lower_bound(topk, 32, 8, 4, rounds=1)
    assert b.info["gen_kind"] == "sdp" and b.info["pair_sdp"].startswith("optimal")
    assert b.distinct > distinct_lower_bound(topk, 32, 8, 4, rounds=1, sdp=False).distinct + 0.1


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000))
def test_secant_combinations_stay_below_one_over_n(largest, seed):
    """Any convex combination of the lower bounds of ``1 / n`` (``1 / largest`` and the secants
    through m and m + 1) is at most ``1 / n`` at every block size ``n = 1 .. largest``, and below
    it wherever ``n`` is larger (the bound uses an upper bound on the block)."""
    rng = np.random.default_rng(seed)
    lam = rng.dirichlet(np.full(largest, 0.5), size=5)
    alpha, beta = secant_weights(lam, largest)
    for size in range(1, largest + 1):
        assert (alpha - beta * (size - 1) <= 1.0 / size + 1e-12).all()
        for upper in range(size, largest + 4):  # evaluated at any n >= the block
            assert (alpha - beta * (upper - 1) <= 1.0 / size + 1e-12).all()


def pair_matrix(pats: np.ndarray, w: np.ndarray, E: int) -> np.ndarray:
    """The pair weights without their diagonal (the pair affinity ``A``)."""
    A = pair_weights(pats, w, E).toarray()
    np.fill_diagonal(A, 0.0)
    return A


def test_pair_weights_count_each_token_once():
    """Diagonal: the weight of the tokens holding each expert; off it, of those holding both (a
    repeated expert of a row counts once)."""
    pats = np.array([[0, 1, 2], [1, 1, 3], [0, 2, 3]])
    C = pair_weights(pats, np.array([1.0, 2.0, 0.5]), 5).toarray()
    assert C.diagonal().tolist() == [1.5, 3.0, 1.5, 2.5, 0.0]
    assert (C == C.T).all() and C[0, 1] == 1.0 and C[0, 2] == 1.5 and C[1, 3] == 2.0 and C[2, 3] == 0.5
    assert C[1, 1] == 3.0 and C[0, 3] == 0.5 and C[4].sum() == 0.0


def test_without_cvxpy_the_bound_skips_the_semidefinite_cap(monkeypatch):
    """A core install (no ``sdp`` extra): the semidefinite cap is skipped, and the bound is the
    covering and pair LPs' alone, still valid."""
    from moeopt import extras

    def missing(module, extra, what):
        raise extras.MissingExtra(extra, what)

    monkeypatch.setattr(extras, "load", missing)
    topk = random_tokens(5, 6, 3, 30)
    pats, w = token_patterns(topk)
    report: dict = {}
    assert pair_sdp_saving_bound(pats, w, 6, 3, 2, report=report) == np.inf
    assert report["pair_sdp"] == "skipped"
    b = distinct_lower_bound(topk, 6, 3, 2, time_limit=5.0)
    assert b.info["pair_sdp"] == "skipped" and b.info["gen_kind"] != "sdp"
    assert b.distinct <= brute_force(topk, 6, 3, 2) + 1e-9


# ----------------------------------------------------------------------------- joint without spare slots
def _bare_instance(seed: int, E: int, G: int, k: int, tokens: int = 120, slots: int | None = None):
    """An instance of ``G`` GPUs of ``E / G`` slots (no spare slot: every plan holds each
    expert once; or ``slots`` per GPU) and its workloads, from two-profile token choices over 2
    layers."""
    from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
    from moeopt.scoring import Workloads
    from moeopt.trace import Trace

    topk = np.stack([random_tokens(seed + l, E, k, tokens) for l in range(2)], axis=1).astype(np.int16)
    N = len(topk)
    trace = Trace(
        topk=topk, family=np.zeros(N, np.int32), step=np.zeros(N, np.int32), family_names=("a",), num_experts=E
    )
    inst = Instance(
        name="bare",
        model=Model(layers=2, experts=E, top_k=k),
        cluster=Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=E // G if slots is None else slots),
        workload=Workload(calibration=WorkloadSource(synthetic={})),  # unused: the workloads are given
    )
    return inst, Workloads(trace, trace, trace.stats(), None)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([(6, 3, 2), (6, 2, 3), (8, 4, 3), (8, 2, 2)]),
    st.sampled_from([0.0, 0.2]),
)
def test_joint_without_spare_slots_is_certified_within_its_load_limits(seed, shape, eps):
    """Without spare slots `joint`'s bound holds for every plan within the MaxVio it reports per
    layer (the planner's limit, or the plan's own where that is over it): per layer, at most the
    fewest remote GPUs per token of any such plan (brute force over every plan), and the plan is
    one of them."""
    E, G, k = shape
    inst, wl = _bare_instance(seed, E, G, k)
    r = solve(inst, method="joint", params={"eps": eps, "evaluations": 200, "bound_rounds": 30}, workloads=wl)
    st_ = r.stats
    assert st_["bound_load_limited_per_layer"] == [True, True]
    covered = st_["bound_maxvio_limit_per_layer"]
    cal = evaluate(r.plan, wl.calibration, inst.cluster)
    trace = wl.calibration
    for l in range(2):
        assert covered[l] >= max(eps, cal["maxvio_per_layer"][l]) - 1e-9
        load = np.bincount(trace.topk[:, l].reshape(-1).astype(np.int64), minlength=E).astype(float)
        share = load / load.sum()
        plans = single_copy_plans(E, G, E // G, share, (1.0 + covered[l]) / G)
        best = min(mean_distinct(trace.topk[:, l], h) for h in plans) * (1.0 - 1.0 / G)
        assert st_["communication_lower_bound_per_layer"][l] <= best + 1e-9
        assert st_["communication_lower_bound_per_layer"][l] <= cal["comm_per_layer"][l] + 1e-9


def test_joint_load_limit_lifts_the_bound_and_needs_a_full_cluster():
    """Two hot experts most tokens use together may not share a GPU within the limit: the bound
    is the best plan's figure, above the one over every plan; with a spare slot a plan may copy
    them, and the bound (the flagged LP's) is below the best plan with copies."""
    from dataclasses import replace

    from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
    from moeopt.scoring import Workloads
    from moeopt.trace import Trace

    E, G = 4, 2
    pairs = np.array([[0, 1]] * 40 + [[2, 3]] * 4 + [[0, 2]] * 2 + [[1, 3]] * 2)
    topk = np.stack([pairs, pairs], axis=1).astype(np.int16)
    N = len(topk)
    trace = Trace(
        topk=topk, family=np.zeros(N, np.int32), step=np.zeros(N, np.int32), family_names=("a",), num_experts=E
    )
    wl = Workloads(trace, trace, trace.stats(), None)
    inst = Instance(
        name="hot",
        model=Model(layers=2, experts=E, top_k=2),
        cluster=Cluster(gpus=G, gpus_per_node=G, slots_per_gpu=2),
        workload=Workload(calibration=WorkloadSource(synthetic={})),  # unused: the workloads are given
    )
    r = solve(inst, method="joint", params={"eps": 0.1}, workloads=wl)
    assert r.stats["bound_load_limited_per_layer"] == [True, True]
    # 0 and 1 apart ({0, 2} {1, 3} the best): 40 tokens on two GPUs, [2, 3] on two, the rest on one
    assert r.bound == pytest.approx((40 * 2 + 4 * 2 + 2 + 2) / 48 * (1 - 1 / G))
    assert r.objective == pytest.approx(r.bound)
    free = solve(inst, method="joint", params={"eps": 10.0}, workloads=wl)  # 0 and 1 may share
    assert free.bound <= free.objective + 1e-9 and free.bound < r.bound
    spare = inst.replace(cluster=replace(inst.cluster, replica_slots_per_gpu=1))
    s = solve(spare, method="joint", params={"eps": 0.1}, workloads=wl)
    # copies of 0 and 1 on both GPUs split their load: the flagged LP's bound, below the best
    # plan with copies within the limit it covers (brute force), and below the one without copies
    from tests.test_copies_bound import best_within

    covered = s.stats["bound_maxvio_limit_per_layer"]
    for l in range(2):
        best = best_within(topk[:, l], E, G, 3, (1.0 + covered[l]) / G) * (1 - 1 / G)
        assert s.stats["communication_lower_bound_per_layer"][l] <= best + 1e-7
    assert s.bound <= s.objective + 1e-9 and s.bound < r.bound


@pytest.mark.parametrize(
    ("slots", "scope"),
    [(4, "for plans within MaxVio"), (5, "for every plan at any load")],
)
def test_joint_says_which_plans_its_bound_covers(capsys, slots, scope):
    """The summary line names the plans the bound is for: within the load limit without spare
    slots; with spare slots past the flagged LP (5 slots per GPU), every plan at any load."""
    inst, wl = _bare_instance(2, 8, 2, 2, slots=slots)
    r = solve(inst, method="joint", workloads=wl, quiet=False)
    assert r.bound is not None
    line = [x for x in capsys.readouterr().err.splitlines() if "remote GPUs per token, lower bound" in x]
    assert len(line) == 1 and scope in line[0]
    assert ("within" in line[0]) == ("bound_maxvio_limit_per_layer" in r.stats)


def test_limited_layers_get_the_rounds_that_prove_their_lp():
    """Within a load limit, layers whose columns exact pricing enumerates get the rounds that
    prove their LP; larger ones the rounds of their size, as without a limit."""
    from moeopt.colgen.cover import COVER_LIMITED_ROUNDS, COVER_MAX_ROUNDS, cover_rounds

    assert cover_rounds(64, 8000, 4, limited=True) == COVER_LIMITED_ROUNDS > cover_rounds(64, 8000, 4) >= 4
    assert cover_rounds(8, 10, 2) == COVER_MAX_ROUNDS < COVER_LIMITED_ROUNDS == cover_rounds(8, 10, 2, limited=True)
    assert cover_rounds(256, 8000, 4, limited=True) == cover_rounds(256, 8000, 4)


@pytest.mark.parametrize("rule", ["static", "ascend"])
def test_per_rank_rules_are_certified_only_without_spare_slots(rule):
    """Under SGLang's static and vLLM-Ascend's rules a copy on the token's own GPU is free, which
    the distinct-GPU bound does not see: no bound with spare slots; without them every rule sends
    an expert to its one GPU, and the bound holds for the plans within the limits (brute force)."""
    from dataclasses import replace

    E, G, k = 6, 3, 2
    inst, wl = _bare_instance(5, E, G, k)
    params = {"dispatch": rule, "eps": 0.2, "evaluations": 200, "restarts": 1}
    r = solve(inst, method="joint", params=params, workloads=wl)
    assert r.plan.dispatch.kind == rule and r.bound is not None
    trace, covered = wl.calibration, r.stats["bound_maxvio_limit_per_layer"]
    cal = evaluate(r.plan, trace, inst.cluster)
    assert r.bound <= cal["comm_per_token"] + 1e-9
    for l in range(2):
        load = np.bincount(trace.topk[:, l].reshape(-1).astype(np.int64), minlength=E).astype(float)
        plans = single_copy_plans(E, G, E // G, load / load.sum(), (1.0 + covered[l]) / G)
        best = min(mean_distinct(trace.topk[:, l], h) for h in plans) * (1.0 - 1.0 / G)
        assert r.stats["communication_lower_bound_per_layer"][l] <= best + 1e-9
    spare = inst.replace(cluster=replace(inst.cluster, replica_slots_per_gpu=1))
    assert solve(spare, method="joint", params=params, workloads=wl).bound is None
