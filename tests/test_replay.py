"""The replay of a load stream under re-planning policies (moeopt.replay, moeopt replay)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moeopt.cli import main
from moeopt.errors import InputError
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, Model, Workload, WorkloadSource
from moeopt.io import load_instance
from moeopt.replay import (
    Observation,
    Stream,
    forecast_loads,
    load_stream,
    make_policy,
    noise_floor,
    replay,
    replay_frontier,
)
from moeopt.replay.forecast import ewma_weights, shrunk_slopes, step_shares
from moeopt.replay.policies import Forecasting
from moeopt.replay.run import allocate_moves, planning_counts
from moeopt.trace import stats_from_counts
from tests.strategies import examples, float_arrays, int_arrays

#: the hot expert of both layers switches at step 4: [8, 2, 1, 1] (layer 1 reversed), then [1, 1, 2, 8]
PHASE_1, PHASE_2 = [8.0, 2.0, 1.0, 1.0], [1.0, 1.0, 2.0, 8.0]
#: 2 GPUs x (2 + 1) slots: the balanced plan of each phase is unique up to GPU order (phase 1:
#: {0, 1, 2} | {0, 1, 3}; phase 2: {3, 2, 0} | {3, 2, 1}); phase 1's plan on phase 2 loads the
#: GPUs 3 and 9 (MaxVio 0.5); the best plan one moved slot away loads them 6.5 and 5.5 (1/12)
HALF, ONE_MOVE = 0.5, 1.0 / 12.0


def tiny_instance(layers: int = 2, experts: int = 4, gpus: int = 2, slots: int = 2, replicas: int = 1) -> Instance:
    """A count-only instance (the workload is unused: the stream is given)."""
    return Instance(
        "tiny",
        Model(layers, experts, 1, expert_bytes=1000),
        Cluster(gpus, gpus, slots, replicas),
        Workload(WorkloadSource(synthetic={})),
    )


def switch_counts() -> np.ndarray:
    """float ``[2, 8, 4]``: four steps of phase 1, four of phase 2 (layer 1 with experts reversed)."""
    layer0 = [PHASE_1] * 4 + [PHASE_2] * 4
    return np.array([layer0, [row[::-1] for row in layer0]])


@pytest.fixture(scope="module")
def switch() -> Stream:
    """The hot-expert switch as a stream."""
    return Stream(switch_counts(), 1, name="switch")


def series(result) -> list[float]:
    return np.round(result.maxvio, 6).tolist()


def moves(result) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(r.decided, r.effective, r.moved_slots_per_layer) for r in result.replans]


# ----------------------------------------------------------------------------- hand-computed
def test_static_serves_its_first_plan(switch: Stream) -> None:
    """static: planned on steps 0-1, balanced until the switch, MaxVio 0.5 after it; nothing moves."""
    r = replay(tiny_instance(), switch, make_policy("static", interval=2))
    assert series(r) == [0, 0, HALF, HALF, HALF, HALF]
    assert r.replans == [] and r.plan_of_step.tolist() == [0] * 6
    assert r.metrics["moved_bytes"] == 0 and r.metrics["maxvio_worst"] == pytest.approx(HALF)


def test_periodic_replans_on_the_last_window(switch: Stream) -> None:
    """periodic: at step 4 it plans on steps 2-3 (phase 1 again, nothing moves), at 6 on 4-5 (2 slots per layer)."""
    r = replay(tiny_instance(), switch, make_policy("periodic", interval=2))
    assert series(r) == [0, 0, HALF, HALF, 0, 0]
    assert moves(r) == [(4, 4, (0, 0)), (6, 6, (2, 2))]
    assert [(x.start, x.end) for x in r.replans] == [(2, 4), (4, 6)]
    assert r.metrics["moved_slots"] == 4 and r.metrics["moved_bytes"] == 4000
    assert r.metrics["moved_slots_per_layer_per_replan"] == 1.0
    assert r.metrics["maxvio_mean"] == pytest.approx(2 * HALF / 6)


def test_lag_delays_the_new_plan(switch: Stream) -> None:
    """With lag 1 the plan decided at step 6 serves from step 7; step 6 stays under the old plan."""
    r = replay(tiny_instance(), switch, make_policy("periodic", interval=2, lag=1))
    assert series(r) == [0, 0, HALF, HALF, HALF, 0]
    assert r.plan_of_step.tolist() == [0, 0, 0, 1, 1, 2]
    assert moves(r) == [(4, 5, (0, 0)), (6, 7, (2, 2))]


def test_threshold_waits_for_the_level(switch: Stream) -> None:
    """threshold 0.1: steps 2-3 are balanced (no re-plan at 4); steps 4-5 average 0.5 (re-plan at 6)."""
    r = replay(tiny_instance(), switch, make_policy("threshold", interval=2, level=0.1))
    assert series(r) == [0, 0, HALF, HALF, 0, 0]
    assert moves(r) == [(6, 6, (2, 2))]


def test_incremental_keeps_its_budget(switch: Stream) -> None:
    """incremental with 1 slot per layer: one move leaves MaxVio 1/12 after the switch (two reach 0)."""
    r = replay(tiny_instance(), switch, make_policy("incremental", interval=2, budget=1))
    assert r.maxvio == pytest.approx([0, 0, HALF, HALF, ONE_MOVE, ONE_MOVE], abs=1e-12)
    assert moves(r) == [(4, 4, (0, 0)), (6, 6, (1, 1))]
    r2 = replay(tiny_instance(), switch, make_policy("incremental", interval=2, budget=2))
    assert series(r2) == [0, 0, HALF, HALF, 0, 0] and moves(r2)[-1][2] == (2, 2)


def test_auto_plans_from_the_plan_in_service(switch: Stream) -> None:
    """auto over one window with 2 slots per layer re-plans at 6 to the balanced plan, moving 2 per layer."""
    policy = make_policy("auto", interval=2, history=1, budget=2, surge=None, carry=None, cadence=None, forecast="none")
    r = replay(tiny_instance(), switch, policy)
    assert series(r) == [0, 0, HALF, HALF, 0, 0]
    assert moves(r) == [(4, 4, (0, 0)), (6, 6, (2, 2))]
    assert r.replans[-1].effective == 6 and (r.replans[-1].start, r.replans[-1].end) == (4, 6)


def test_oracle_plans_each_block_on_itself(switch: Stream) -> None:
    """oracle: every block of 2 steps balanced by its own plan; the switch costs 2 slots per layer."""
    r = replay(tiny_instance(), switch, make_policy("oracle", interval=2))
    assert series(r) == [0] * 6
    assert moves(r) == [(4, 4, (2, 2)), (6, 6, (0, 0))]


def test_auto_schedule_windows_and_snapshots() -> None:
    """auto plans on its last history windows, one robust snapshot per window, from the plan in service."""
    inst = tiny_instance()
    policy = make_policy("auto", interval=3, window=2, history=3, budget=1, carry=None, cadence=None, forecast="none")
    policy = policy.resolve(40, None, inst)
    sched = policy.schedule(inst)
    obs = Observation(step=11, steps=40, calibration=2, maxvio=np.zeros(9), planned_until=8, pending=False)
    req = sched.decide(obs)
    assert req is not None and (req.start, req.end, req.effective) == (5, 11, 11)
    assert req.params == {"robust": "mean", "robust_steps": 3, "max_moves": 1, "migration_frontier": False}
    assert req.from_current
    assert sched.decide(Observation(10, 40, 2, np.zeros(8), 8, False)) is None  # not a decision step
    assert sched.decide(Observation(11, 40, 2, np.zeros(9), 8, True)) is None  # a plan is pending
    assert sched.initial(40).params == {"robust": "none", "robust_steps": 1}  # one snapshot: pooled
    everything = make_policy("auto", interval=3, history=None, forecast="none").resolve(40, None, inst).schedule(inst)
    whole = everything.decide(Observation(9, 40, 3, np.zeros(6), 6, False))
    assert whole is not None and (whole.start, whole.end) == (0, 9) and whole.params["robust_steps"] == 3
    fresh = make_policy("auto", interval=3, from_current=False).resolve(40, None, inst)
    req = fresh.schedule(inst).decide(Observation(9, 40, 3, np.zeros(6), 6, False))
    assert fresh.budget is None and req is not None and not req.from_current and req.relabel
    assert "max_moves" not in req.params
    with pytest.raises(InputError, match="from_current"):
        make_policy("auto", from_current=False, budget=4)


def test_auto_surge_replans_at_once(switch: Stream) -> None:
    """The surge watch re-plans after the first step of the switch (step 4), on that step alone."""
    windows = {"cadence": None, "forecast": "none"}
    policy = make_policy("auto", interval=3, calibration=2, history=1, budget=2, carry=None, surge=2.0, **windows)
    r = replay(tiny_instance(), switch, policy)
    assert series(r) == [0, 0, HALF, 0, 0, 0]
    assert moves(r) == [(5, 5, (2, 2))] and (r.replans[0].start, r.replans[0].end) == (4, 5)
    calm = replay(
        tiny_instance(),
        switch,
        make_policy(
            "auto", interval=3, calibration=2, history=1, budget=2, carry=None, surge=2.0, surge_margin=0.6, **windows
        ),
    )
    assert series(calm)[:3] == [0, 0, HALF] and [x.decided for x in calm.replans] == [5]  # the decision point
    assert (calm.replans[0].start, calm.replans[0].end) == (2, 5)


def test_surge_onset_needs_every_step_above() -> None:
    """A surge starts at the earliest step from which every step exceeds surge x the median before it."""
    inst = tiny_instance()
    sched = make_policy("auto", interval=4, window=3, budget=1, surge_margin=0.1).resolve(40, None, inst).schedule(inst)
    mv = np.array([0.1, 0.12, 0.1, 0.5, 0.6])  # steps 3..7
    obs = Observation(8, 40, 3, mv, 3, False, service_start=3)
    assert sched.surge_onset(obs) == 6
    assert sched.surge_onset(Observation(8, 40, 3, mv, 3, False, service_start=7)) == 7  # only steps in service
    noisy = np.array([0.1, 0.12, 0.1, 0.19, 0.15])
    assert sched.surge_onset(Observation(8, 40, 3, noisy, 3, False)) is None
    low = np.array([0.01, 0.01, 0.01, 0.01, 0.05])  # five times the median, but under the margin (0.1)
    assert sched.surge_onset(Observation(8, 40, 3, low, 3, False)) is None


def test_transfer_bucket() -> None:
    """The bucket fills at budget per interval from one interval's worth, caps at carry intervals, and
    a decision point spends only what lies above the reserve of carry - 1 intervals."""
    inst = tiny_instance()
    policy = make_policy("auto", interval=2, calibration=2, budget=4, carry=3.0, cadence=None)
    sched = policy.resolve(40, None, inst).schedule(inst)
    zero = np.zeros(38)

    def obs(step: int, spent: tuple = ()) -> Observation:
        return Observation(step, 40, 2, zero[: step - 2], 2, False, spent=spent)

    assert [sched.bucket(obs(t)) for t in (2, 3, 4, 6, 30)] == [4, 6, 8, 12, 12]
    assert sched.bucket(obs(6, ((4, 5),))) == 7  # 8 at step 4, less 5, plus 4
    assert sched.decide(obs(4)) is None  # 8 in the bucket: nothing above the reserve of 8
    req = sched.decide(obs(6))
    assert req is not None and req.budget == 4 and req.params["max_moves"] == 4


def test_min_gain_keeps_the_plan(switch: Stream) -> None:
    """min_gain 1: no re-plan can lower MaxVio by all of it, so the first plan serves throughout."""
    policy = make_policy("auto", interval=2, history=1, budget=2, carry=None, surge=None, min_gain=1.0, cadence=None)
    r = replay(tiny_instance(), switch, policy)
    assert r.replans == [] and set(r.plan_of_step.tolist()) == {0}


def test_forecast_level_and_trend() -> None:
    """A straight-line drift of the shares: the level alone lags it, the trend (no residual, so not
    shrunk) extrapolates it to the horizon; a constant stream forecasts itself."""
    shares = np.array([[0.4, 0.6], [0.45, 0.55], [0.5, 0.5], [0.55, 0.45]])
    counts = (shares * 10.0)[None]  # [1, 4, 2], 10 per step
    flat = forecast_loads(counts, 1.0, halflife=float("inf"), trend=False)
    np.testing.assert_allclose(flat.loads, [[4.75, 5.25]])  # the mean of the four steps
    line = forecast_loads(counts, 1.0, halflife=float("inf"), trend=True)
    np.testing.assert_allclose(line.trend, [[0.05, -0.05]])
    np.testing.assert_allclose(line.loads, [[6.0, 4.0]])  # 0.475 + 0.05 x (1.5 steps of lag + 1 ahead)
    last = forecast_loads(counts, 1.0, halflife=0.5, trend=False)  # weights 1/85, 4/85, 16/85, 64/85
    np.testing.assert_allclose(last.loads[0, 0], 10 * (0.4 + 4 * 0.45 + 16 * 0.5 + 64 * 0.55) / 85)
    still = forecast_loads(np.full((2, 5, 3), 2.0), 3.0)
    np.testing.assert_allclose(still.loads, 2.0) and np.testing.assert_allclose(still.trend, 0.0)
    np.testing.assert_allclose(ewma_weights(3, 1.0), [0.25 / 1.75, 0.5 / 1.75, 1 / 1.75])


def test_forecast_halflife_follows_the_stream() -> None:
    """The chosen half-life is long for noise around a still load and short for a load that moves and
    stays; a slope within its noise is shrunk to nothing."""
    noise = np.array([[6.0, 4.0], [4.0, 6.0]] * 4)[None]  # alternating around 5 / 5
    assert forecast_loads(noise, 1.0).halflife[0] == np.inf
    np.testing.assert_allclose(shrunk_slopes(step_shares(noise))[0], 0.0)
    walk = np.array([[5.0, 5.0], [7.0, 3.0], [7.0, 3.0], [9.0, 1.0], [9.0, 1.0], [3.0, 7.0], [3.0, 7.0]])[None]
    assert forecast_loads(walk, 1.0).halflife[0] <= 1.0


def test_planning_counts_forecast_then_windows() -> None:
    """With recent windows the snapshots are the forecast, then each window's mean, oldest first."""
    window = np.arange(10.0).reshape(1, 5, 2) + 1.0
    fc = Forecasting(horizon=1.0, halflife=float("inf"), recent=True, snapshot=2)
    snaps = planning_counts(window, fc)
    assert snaps.shape == (1, 4, 2)
    np.testing.assert_allclose(snaps[0, 1:], [window[0, 0], window[0, 1:3].mean(0), window[0, 3:5].mean(0)])
    np.testing.assert_allclose(snaps[0, 0].sum(), window[0].sum(1).mean())
    alone = planning_counts(window, Forecasting(horizon=1.0))
    assert alone.shape == (1, 1, 2)


def test_auto_cadence_spends_the_rate() -> None:
    """Decisions after every step spend what the bucket (1.5 slots per interval of 3, unrounded) holds
    above the reserve, whole slots only; each plans for the forecast alone."""
    inst = tiny_instance()  # 2 GPUs x (2 + 1) slots: budget_share 0.25 is 1.5 slots per interval
    policy = make_policy("auto", interval=3, calibration=3, budget_share=0.25, carry=2.0).resolve(40, None, inst)
    assert (policy.rate, policy.budget) == (1.5, 2)
    sched = policy.schedule(inst)

    def obs(step: int, spent: tuple = ()) -> Observation:
        return Observation(step, 40, 3, np.zeros(step - 3), 3, False, spent=spent)

    assert [sched.bucket(obs(t)) for t in (3, 4, 5, 6, 9)] == [1, 2, 2, 3, 3]
    req = sched.decide(obs(4))  # 2.0 in the bucket, the reserve 1
    assert req is not None and req.budget == 1 and req.forecast is not None and req.forecast.horizon == 1.0
    assert req.params["robust"] == "none" and (req.start, req.end) == (0, 4)
    assert sched.decide(obs(5, ((4, 1),))) is None  # 1.5 left: nothing above the reserve
    six = sched.decide(obs(6))
    assert six is not None and six.budget == 2
    whole = make_policy("auto", interval=3, budget_share=0.25, round_down=True).resolve(40, None, inst)
    assert (whole.rate, whole.budget) == (1.0, 1)


def test_accept_keeps_the_plan_unless_it_pays(switch: Stream) -> None:
    """held-out: the trial re-plan (made without the last window) never beats the plan in service on
    the switch, so nothing is re-planned (taken always: one slot per layer at 6, robust over both
    phases); paired: only the re-plan at 6 lowers the steps' MaxVio."""
    given = {"interval": 2, "history": 2, "budget": 2, "carry": None, "surge": None, "cadence": None}
    always = replay(tiny_instance(), switch, make_policy("auto", forecast="none", **given))
    assert moves(always) == [(4, 4, (0, 0)), (6, 6, (1, 1))]
    held = replay(tiny_instance(), switch, make_policy("auto", forecast="none", accept="held-out", **given))
    assert held.replans == [] and series(held) == [0, 0, HALF, HALF, HALF, HALF]
    one = {**given, "history": 1}
    paired = replay(tiny_instance(), switch, make_policy("auto", forecast="none", accept="paired", **one))
    assert moves(paired) == [(6, 6, (2, 2))] and series(paired) == [0, 0, HALF, HALF, 0, 0]


def test_allocate_moves_by_gain_per_slot() -> None:
    """The pool goes first to the best drop per moved slot, never past the pool."""
    values = np.array([[1.0, 1.0], [0.6, 0.9], [0.5, 0.24]])  # candidates x layers; 0: the plan in service
    moves_ = np.array([[0, 0], [2, 2], [4, 4]])
    assert allocate_moves(values, moves_, 6).tolist() == [1, 2]  # 0.2 per slot, then 0.19
    assert allocate_moves(values, moves_, 3).tolist() == [1, 0]
    assert allocate_moves(values, moves_, 0).tolist() == [0, 0]


@settings(max_examples=examples(20))
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 12), st.data())
def test_allocate_moves_stays_in_the_pool(C: int, L: int, pool: int, data: st.DataObject) -> None:
    """Whatever the candidates, the picks move at most the pool and are never worse than keeping."""
    values = data.draw(float_arrays((C + 1, L), 0.0, 2.0))
    moves_ = np.vstack([np.zeros((1, L), dtype=np.int64), data.draw(int_arrays((C, L), 0, 6))])
    pick = allocate_moves(values, moves_, pool)
    assert moves_[pick, np.arange(L)].sum() <= pool
    assert values[pick, np.arange(L)].sum() <= values[0].sum() + 1e-12


def test_allocate_pools_the_layers_budgets() -> None:
    """Only layer 1 switches: with the layers' budgets pooled it takes both slots and is balanced;
    with one slot per layer it reaches 1/12."""
    layer0 = [PHASE_1] * 8
    layer1 = [PHASE_1[::-1]] * 4 + [PHASE_2[::-1]] * 4
    stream = Stream(np.array([layer0, layer1]), 1, name="one layer")
    given = {"interval": 2, "history": 1, "budget": 1, "carry": None, "surge": None, "cadence": None}
    alone = replay(tiny_instance(), stream, make_policy("auto", forecast="none", **given))
    pooled = replay(tiny_instance(), stream, make_policy("auto", forecast="none", allocate=True, **given))
    assert series(alone)[-2:] == [round(ONE_MOVE / 2, 6)] * 2
    assert series(pooled)[-2:] == [0, 0] and moves(pooled)[-1][2] == (0, 2)


def test_noise_floor_plans_each_step_without_it(switch: Stream) -> None:
    """Every step is served by a plan made on the other steps of its block: blocks of one phase are
    balanced; a step's own counts never reach its plan; blocks of one step are refused."""
    floor = noise_floor(tiny_instance(), switch, 2)
    assert series(floor) == [0] * 6 and floor.replans == [] and len(floor.plans) == 6
    assert floor.policy.to_json()["name"] == "noise floor" and floor.metrics["maxvio_worst"] == 0
    counts = switch_counts()
    counts[:, 3] = counts[:, 3][:, ::-1] * 7  # step 3 alone is very different
    odd = noise_floor(tiny_instance(), Stream(counts, 1), 2)
    np.testing.assert_array_equal(odd.plans[1].slots, floor.plans[1].slots)  # step 3's plan: from step 2 alone
    assert odd.maxvio[1] > 0
    with pytest.raises(InputError, match="interval"):
        noise_floor(tiny_instance(), switch, 1)


# ----------------------------------------------------------------------------- the one scorer
def test_replay_maxvio_is_evaluate_of_the_plan_in_service() -> None:
    """Every step's MaxVio is evaluate's on that step alone under the plan that served it (lp dispatch)."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 30, size=(2, 10, 6)).astype(float)
    inst = tiny_instance(experts=6, gpus=3, slots=2, replicas=1)
    stream = Stream(counts, 1)
    policy = make_policy("periodic", interval=3, window=2, planner_params={"dispatch": "lp"})
    r = replay(inst, stream, policy)
    assert len(r.replans) == 2
    for i, t in enumerate(r.steps):
        one = stats_from_counts(counts[:, t], top_k=1, step_counts=counts[:, t : t + 1])
        plan = r.plans[r.plan_of_step[i]]
        assert plan.dispatch.kind == "lp"
        assert r.maxvio[i] == pytest.approx(evaluate(plan, one, inst.cluster)["maxvio"], abs=1e-9)


def test_replay_on_tokens_matches_evaluate(quickstart_path: Path) -> None:
    """On a token trace, each step's MaxVio and remote GPUs per token are evaluate's on that step's tokens."""
    inst = load_instance(quickstart_path)
    stream = load_stream(inst)
    r = replay(inst, stream, make_policy("incremental", interval=5, budget=2))
    assert r.comm is not None and "comm_per_token_mean" in r.metrics
    for i, t in enumerate(r.steps[::4]):
        m = evaluate(r.plans[r.plan_of_step[4 * i]], stream.trace_window(t, t + 1), inst.cluster)
        assert r.maxvio[4 * i] == pytest.approx(m["maxvio"], abs=1e-12)
        assert r.comm[4 * i] == pytest.approx(m["comm_per_token"], abs=1e-12)


# ----------------------------------------------------------------------------- properties
@st.composite
def small_streams(draw: st.DrawFn) -> tuple[Instance, Stream]:
    """A random count stream of 1-2 layers, 4-5 experts, 2 GPUs x (3 + 1) slots, 6-9 steps."""
    layers, experts, steps = draw(st.integers(1, 2)), draw(st.integers(4, 5)), draw(st.integers(6, 9))
    counts = draw(float_arrays((layers, steps, experts), 0.0, 20.0))
    counts[:, :, 0] += 1.0  # every layer and step routes some tokens
    return tiny_instance(layers, experts, 2, 3, 1), Stream(counts, 1)


@settings(max_examples=examples(12))
@given(small_streams(), st.integers(0, 3), st.integers(1, 3))
def test_incremental_never_exceeds_its_budget(case: tuple[Instance, Stream], budget: int, interval: int) -> None:
    """No re-plan of incremental moves more than its budget in any layer."""
    inst, stream = case
    r = replay(inst, stream, make_policy("incremental", interval=interval, window=2, budget=budget))
    assert r.replans
    assert all(max(x.moved_slots_per_layer) <= budget for x in r.replans)


@settings(max_examples=examples(12))
@given(small_streams(), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1.0, 2.0, 3.0]))
def test_auto_spends_no_more_than_its_bucket(
    case: tuple[Instance, Stream], budget: int, interval: int, carry: float
) -> None:
    """auto's moves (the most in one layer, summed over re-plans) never exceed what its bucket took in."""
    inst, stream = case
    r = replay(inst, stream, make_policy("auto", interval=interval, window=2, budget=budget, carry=carry))
    C = int(r.steps[0])
    spent = 0
    for x in r.replans:
        spent += max(x.moved_slots_per_layer)
        assert spent <= budget + budget * (x.decided - C) / interval + 1e-9


@settings(max_examples=examples(12))
@given(small_streams(), st.integers(1, 3))
def test_static_never_moves(case: tuple[Instance, Stream], interval: int) -> None:
    """static serves its first plan to the end: no re-plan, no moved slot."""
    inst, stream = case
    r = replay(inst, stream, make_policy("static", interval=interval, window=2))
    assert r.replans == [] and r.metrics["moved_slots"] == 0 and set(r.plan_of_step.tolist()) == {0}


@settings(max_examples=examples(12))
@given(small_streams(), st.integers(0, 4))
def test_lag_delays_exactly(case: tuple[Instance, Stream], lag: int) -> None:
    """A plan decided after step d - 1 serves from step d + lag exactly; before that the old plan serves."""
    inst, stream = case
    r = replay(inst, stream, make_policy("periodic", interval=2, lag=lag))
    C = int(r.steps[0])
    for x in r.replans:
        assert x.effective == x.decided + lag
        assert r.plan_of_step[x.effective - C] == x.index
        assert r.plan_of_step[x.effective - 1 - C] != x.index or x.effective == C


@settings(max_examples=examples(8))
@given(small_streams())
def test_relabel_moves_no_more_at_the_same_balance(case: tuple[Instance, Stream]) -> None:
    """Relabeled GPUs never move more slots than the fresh plan, and the MaxVio series is the same."""
    inst, stream = case
    plain = replay(inst, stream, make_policy("periodic", interval=2))
    relabeled = replay(inst, stream, make_policy("periodic", interval=2, relabel=True))
    assert relabeled.maxvio == pytest.approx(plain.maxvio, abs=1e-12)
    for a, b in zip(plain.replans, relabeled.replans, strict=True):
        assert all(y <= x for x, y in zip(a.moved_slots_per_layer, b.moved_slots_per_layer, strict=True))


# ----------------------------------------------------------------------------- eplb
def test_periodic_eplb_relabeled() -> None:
    """periodic EPLB (SGLang's / vLLM's schedule) runs; relabeling its GPUs moves no more slots."""
    pytest.importorskip("torch", reason="the eplb planner needs torch: pip install -e '.[eplb]'")
    from moeopt.methods.eplb import load_deepseek_eplb

    try:
        load_deepseek_eplb()
    except ImportError as exc:
        pytest.skip(f"the eplb planner needs sglang: pip install --no-deps 'sglang>=0.5' ({exc})")
    rng = np.random.default_rng(0)
    inst = tiny_instance(experts=8, gpus=4, slots=2, replicas=1)
    stream = Stream(rng.gamma(0.6, 10.0, size=(2, 12, 8)) + 0.1, 1)
    plain = replay(inst, stream, make_policy("periodic", interval=3, planner="eplb"))
    relabeled = replay(inst, stream, make_policy("periodic", interval=3, planner="eplb", relabel=True))
    assert plain.replans and relabeled.maxvio == pytest.approx(plain.maxvio)
    assert relabeled.metrics["moved_slots"] <= plain.metrics["moved_slots"]


# ----------------------------------------------------------------------------- frontier
def test_frontier_sweeps_intervals_and_budgets(switch: Stream) -> None:
    """One point per interval (periodic) and per interval and budget (incremental); Pareto flags set."""
    points = replay_frontier(tiny_instance(), switch, ["periodic", "incremental"], intervals=[1, 2], budgets=[1, 2])
    assert [(p.policy, p.interval, p.budget) for p in points] == [
        ("periodic", 1, None),
        ("periodic", 2, None),
        ("incremental", 1, 1),
        ("incremental", 1, 2),
        ("incremental", 2, 1),
        ("incremental", 2, 2),
    ]
    assert any(p.pareto for p in points)
    best = min(points, key=lambda p: (p.maxvio_mean, p.moved_bytes))
    assert best.pareto
    for p in points:  # a point is Pareto iff nothing dominates it
        dominated = any(
            q.moved_bytes <= p.moved_bytes
            and q.maxvio_mean <= p.maxvio_mean
            and (q.moved_bytes, q.maxvio_mean) != (p.moved_bytes, p.maxvio_mean)
            for q in points
        )
        assert p.pareto == (not dominated)


# ----------------------------------------------------------------------------- command line
@pytest.fixture
def switch_instance(tmp_path: Path) -> Path:
    """The switch stream as a counts .npz (with step_counts) and an instance YAML reading it."""
    sc = switch_counts()
    np.savez(tmp_path / "switch.npz", counts=sc.sum(axis=1), step_counts=sc, top_k=np.array(1))
    doc = {
        "name": "switch",
        "model": {"layers": 2, "experts": 4, "top_k": 1, "expert_bytes": 1000},
        "cluster": {"gpus": 2, "slots_per_gpu": 2, "replica_slots_per_gpu": 1},
        "workload": {"calibration": "switch.npz"},
    }
    path = tmp_path / "switch.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cli_report_and_table(switch_instance: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """replay --report holds policy, stream, metrics, series and re-plans; the table has one row per policy."""
    report = tmp_path / "r.json"
    argv = [str(switch_instance), "--policy", "static,periodic", "--interval", "2", "--report", str(report), "--quiet"]
    assert main(["replay", *argv]) == 0
    out = capsys.readouterr().out
    assert "| static" in out and "| periodic" in out
    data = json.loads(report.read_text())
    assert data["report"] == "replay" and [r["policy"]["name"] for r in data["runs"]] == ["static", "periodic"]
    run = data["runs"][1]
    assert run["policy"] == {
        "name": "periodic",
        "interval": 2,
        "window": 2,
        "calibration": 2,
        "lag": 0,
        "seed": 0,
        "planner": "balance",
        "planner_params": {},
        "relabel": False,
    }
    assert run["stream"]["source"] == "switch.npz" and run["stream"]["steps"] == 8
    m = run["metrics"]
    assert (m["replans"], m["moved_slots"], m["moved_bytes"]) == (2, 4, 4000)
    # the first re-plan (steps 2-3, the calibration's traffic again) keeps every GPU's experts
    assert run["replans"][0]["moved_slots"] == 0 and m["transfers"] == 1
    assert "| 2 (1 moving) " in out  # the table says which re-plans moved weights
    assert m["maxvio_worst"] == pytest.approx(HALF) and m["worst_window_basis"] == "interval"
    assert run["series"]["step"] == list(range(2, 8)) and run["series"]["plan"] == [0, 0, 1, 1, 2, 2]
    assert run["replans"][1] == {
        "index": 2,
        "decided": 6,
        "window": [4, 6],
        "effective": 6,
        "planner": "balance",
        "moved_slots": 4,
        "moved_slots_per_layer": [2, 2],
        "moved_bytes": 4000,
    }
    assert "plan_time" not in json.dumps(data)


def test_cli_same_seed_same_bytes(switch_instance: Path, tmp_path: Path) -> None:
    """Two runs with the same seed write the same report, byte for byte."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        argv = ["replay", str(switch_instance), "--policy", "auto", "--interval", "2", "--budget", "1"]
        assert main([*argv, "--seed", "3", "--report", str(path), "--quiet"]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["policy"]["seed"] == 3
    c = tmp_path / "c.json"
    argv = ["replay", str(switch_instance), "--interval", "2", "--param", "from_current=false", "--param", "history=1"]
    assert main([*argv, "--report", str(c), "--quiet"]) == 0
    policy = json.loads(c.read_text())["policy"]
    assert (policy["from_current"], policy["history"], policy["budget"]) == (False, 1, None)


def test_cli_timings_and_plot(switch_instance: Path, tmp_path: Path) -> None:
    """--timings adds planning times; moeopt plot draws the report (and the frontier report)."""
    report, fig = tmp_path / "t.json", tmp_path / "t.png"
    assert (
        main(["replay", str(switch_instance), "--interval", "2", "--timings", "--report", str(report), "--quiet"]) == 0
    )
    data = json.loads(report.read_text())
    assert all("plan_time" in r for r in data["replans"]) and "timings" in data
    assert main(["plot", str(report), "-o", str(fig), "--quiet"]) == 0 and fig.stat().st_size > 0
    front, ffig = tmp_path / "f.json", tmp_path / "f.png"
    argv = [
        "replay",
        str(switch_instance),
        "--frontier",
        "--intervals",
        "1,2",
        "--budgets",
        "1",
        "--report",
        str(front),
    ]
    assert main([*argv, "--quiet"]) == 0
    assert json.loads(front.read_text())["report"] == "replay-frontier"
    assert main(["plot", str(front), "-o", str(ffig), "--quiet"]) == 0 and ffig.stat().st_size > 0
    assert main(["plot", str(front), "--kind", "replay", "-o", str(ffig), "--quiet"]) == 2


def _bad_stream(tmp_path: Path, step_counts: np.ndarray, name: str) -> str:
    path = tmp_path / f"{name}.npz"
    np.savez(
        path, counts=np.abs(np.nan_to_num(step_counts)).sum(axis=1) + 1, step_counts=step_counts, top_k=np.array(1)
    )
    return str(path)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--window", "9"], "fewer than the policy's window"),
        (["--calibration", "8"], "the calibration prefix"),
        (["--interval", "0"], "--interval"),
        (["--window", "0"], "--window"),
        (["--policy", "sometimes"], "unknown policy 'sometimes'"),
        (["--policy", "periodic", "--planner", "nope"], "unknown planner 'nope'"),
        (["--policy", "periodic", "--budget", "4"], "takes no budget"),
        (["--policy", "static", "--level", "0.1"], "takes no level"),
        (["--policy", "periodic", "--param", "history=2"], "--param history: policy periodic takes no history"),
        (["--policy", "auto", "--param", "budget_share=2"], "policy.budget_share"),
        (["--policy", "incremental", "--planner", "greedy"], "does not re-plan from the plan in service"),
        (["nan"], "NaN"),
        (["negative"], "negative"),
        (["layers"], "layers"),
        (["experts"], "experts"),
    ],
)
def test_cli_bad_input(
    switch_instance: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    """Bad streams and options: one line on stderr, exit 2, no report written."""
    sc = switch_counts()
    streams = {
        "nan": np.where(np.arange(4) == 1, np.nan, sc),
        "negative": sc - 2.0,
        "layers": np.concatenate([sc, sc[:1]]),
        "experts": sc[:, :, :3],
    }
    if extra[0] in streams:
        extra = ["--stream", _bad_stream(tmp_path, streams[extra[0]], extra[0])]
    report = tmp_path / "bad.json"
    try:
        code = main(["replay", str(switch_instance), *extra, "--report", str(report)])
    except SystemExit as exc:  # argparse's usage errors (one line too)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not report.exists()


def test_stream_checks() -> None:
    """A stream refuses NaN or negative counts and a shape that does not fit the instance, naming the field."""
    with pytest.raises(InputError, match="step_counts: contains NaN"):
        Stream(np.full((1, 3, 4), np.nan), 1, source="s.npz")
    with pytest.raises(InputError, match="negative"):
        Stream(-np.ones((1, 3, 4)), 1)
    with pytest.raises(InputError, match="model.experts is 4"):
        Stream(np.ones((2, 3, 5)), 1).check(tiny_instance())
    with pytest.raises(InputError, match="a stream needs per-step counts"):
        Stream.from_workload(stats_from_counts(np.ones((2, 4)), top_k=1))


def test_workers_plan_the_same(switch: Stream) -> None:
    """--workers applies to the planning inside: two processes give the serial report, byte for byte."""
    policy = make_policy("incremental", interval=2, budget=1)
    serial = replay(tiny_instance(), switch, policy).to_json()
    pooled = replay(tiny_instance(), switch, policy, workers=2).to_json()
    assert json.dumps(pooled) == json.dumps(serial)
