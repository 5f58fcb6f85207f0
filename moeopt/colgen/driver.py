"""The column generation driver: master LP, pricing, Lagrangian bounds, the final master MILP.

`generate` is the loop over any column space (a `Master` and a
`Pricer`); `column_generation` runs it on a grouping problem.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from moeopt.bounds import grouping_bound
from moeopt.colgen.master import Master, grouping_space, restricted_milp
from moeopt.colgen.pricing import PRICING_WORK, GroupingPricer, Pricer
from moeopt.errors import InfeasibleError
from moeopt.grouping import Grouping
from moeopt.heuristics.spectral import grouping_heuristic
from moeopt.result import Termination

#: reduced costs below this (relative to the largest affinity) count as zero
RC_TOL = 1e-7
#: share of the time limit kept for the restricted master MILP at the end (when a time limit caps
#: the generation: the MILP's branch and bound is bounded by `MILP_NODES` otherwise)
MILP_SHARE = 0.15
#: master LP solves without progress before an exact pricing (for a bound and a new center)
STALL_ITERATIONS = 8
#: exact pricing may stop this far (relative to the LP value, over G) from the best reduced cost
PRICING_TOLERANCE = 2e-4
#: full columns: an exact pricing at least every this many ``exact_every`` stretches, converged or not
#: (full groups' exact pricing is the costly part, 5-12 s at 64 experts in groups of 16, where the
#: iterated local search is near exact: at 3, the synthetic 64 x 4 grouping's LP was not proved in
#: 60 s; at 10 it is in 26 s, as before the work budgets)
FULL_EXACT_EVERY = 10
#: master LP solves (pricing rounds) of `column_generation` by default: its work budget
ROUNDS = 200
#: heuristic pricing rounds between two exact pricings at most (a bound and a new center)
EXACT_EVERY = 10
#: an exact pricing at the master's own duals after the heuristic found nothing there (the
#: certificate of the LP) gets this many times the work of the others
CONVERGED_WORK = 4.0
#: branch-and-bound nodes of the restricted master MILP (HiGHS ``mip_max_nodes``)
MILP_NODES = 2000


@dataclass(frozen=True, eq=False)
class ColgenResult:
    """What `column_generation` found for one grouping problem.

    Attributes
    ----------
    bound
        A valid upper bound on the optimal intra-group affinity (the least of the
        Lagrangian bounds of the exactly priced iterations and the cheap bounds).
    objective
        ``problem.objective(home)`` of the best plan found, or None.
    home
        That plan (expert -> group), feasible; None when there is none.
    history
        ``(seconds, bound, incumbent)`` after each event (start, each exact pricing, MILP).
    columns
        Columns in the restricted master at the end.
    iterations
        Master LP solves.
    proven
        Whether pricing proved the master LP optimal (its value is then the LP bound).
    termination
        Why the search stopped: OPTIMAL (LP proved and, where possible, the plan too), COMPLETED
        (LP proved), ITERATION_LIMIT (the work budget ran out first), TIME_LIMIT (the outer
        wall-clock cap stopped it: the bound then depends on the machine's speed).
    lp_value
        The last restricted master LP value (a lower bound on the LP optimum).
    bound_kind
        ``'colgen'`` when the column generation bound is the tightest, else the cheap bound's name.
    info
        Counters: pricing calls by kind, time in each part, ``capped`` (the time limit stopped
        some part), ``gave_up``.
    """

    bound: float
    objective: float | None
    home: np.ndarray | None
    history: list[tuple[float, float, float | None]]
    columns: int
    iterations: int
    proven: bool
    termination: Termination
    lp_value: float | None = None
    bound_kind: str = "colgen"
    info: dict = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """``(bound - objective) / bound`` (None without a plan; 0 for a zero bound)."""
        if self.objective is None:
            return None
        if self.bound <= 0:
            return 0.0
        return max(self.bound - self.objective, 0.0) / self.bound


def _start_plan(
    problem: Grouping, start_home: np.ndarray | None, seed: int, deadline: float | None
) -> tuple[np.ndarray | None, bool]:
    """The start plan (``start_home``, else ``agnostic``'s heuristic) and whether ``deadline``
    cut the heuristic short."""
    if start_home is not None:
        home = np.asarray(start_home, dtype=np.int64)
        return (home if problem.feasible(home) else None), False
    try:  # agnostic's defaults (moeopt.methods.tacg.heuristic_home with AgnosticParams())
        home, info = grouping_heuristic(problem, np.random.default_rng(seed), deadline=deadline)
    except InfeasibleError:
        return None, False
    return (home if problem.feasible(home) else None), bool(info.get("capped", False))


@threadpool_limits.wrap(limits=1, user_api="blas")
def column_generation(
    problem: Grouping,
    time_limit: float | None = None,
    *,
    start_home: np.ndarray | None = None,
    log: Callable[[str], None] | None = None,
    seed: int = 0,
    smoothing: float = 0.8,
    rounds: int = ROUNDS,
    exact_every: int = EXACT_EVERY,
    pricing_work: float = PRICING_WORK,
    milp_nodes: int = MILP_NODES,
    give_up: bool = False,
) -> ColgenResult:
    """Upper bound (and maybe a better plan) for ``problem`` by column generation.

    The work is bounded by counts (master LP solves, exact pricings' work, MILP nodes), so that
    the bound and the plan are a function of the problem, ``seed`` and these parameters, the same
    on a busy machine as on an idle one; ``time_limit`` is only an outer cap, and when it stops
    the loop the termination is ``TIME_LIMIT`` (and ``info["capped"]``).

    Parameters
    ----------
    problem
        The grouping problem (W, w, G, cap, load limit).
    time_limit
        Outer wall-clock cap in seconds for everything (start plan, pricing, master LPs, final
        MILP); None: none.
    start_home
        A feasible plan: its groups seed the master and it is the first incumbent. None:
        ``agnostic``'s heuristic (`moeopt.heuristics.spectral.grouping_heuristic`, bounded
        by its iterations).
    log
        Called with one line per exact pricing.
    seed
        Random seed of the start heuristic and CP-SAT.
    smoothing
        Wentges dual smoothing alpha in [0, 1) (0: price at the master's duals); after k
        consecutive exact pricings without a column, ``max(0, 1 - (k + 1)(1 - alpha))``.
    rounds
        Master LP solves at most (each followed by a pricing): the loop's work budget.
    exact_every
        Heuristic pricing rounds between two exact pricings at most (``FULL_EXACT_EVERY`` times
        as many when every column is full).
    pricing_work
        Work units of one exact pricing (`moeopt.colgen.pricing.price_exact`).
    milp_nodes
        Branch-and-bound nodes of the restricted master MILP at the end.
    give_up
        Stop at the first exact pricing that ends without proving its optimum, and skip the
        restricted master MILP: for a caller with another bound to spend its effort on
        (``certificate: auto``). Measured on the certificates benchmark, every layer whose LP
        was proved had all its exact pricings proved, and every layer whose LP was not had
        its first one unproved. ``info["gave_up"]`` says whether it happened.

    Returns
    -------
    ColgenResult
        Bound valid at every recorded point, best plan and history.

    Notes
    -----
    Runs with one BLAS thread (as `moeopt.solvers.grouping_sdp.sdp_bound`): the pricing's
    products are small, and two threads spinning against other work on a busy machine are far
    slower than one.
    """
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    say = log or (lambda _msg: None)
    W = problem.graph
    E, G = problem.experts, problem.groups
    info: dict = {
        "heuristic_pricings": 0,
        "exact_pricings": 0,
        "mispricings": 0,
        "lp_time": 0.0,
        "pricing_time": 0.0,
        "milp_time": 0.0,
        "gave_up": False,
        "capped": False,
    }
    home, capped = _start_plan(problem, start_home, seed, deadline)
    info["capped"] = capped
    incumbent = None if home is None else problem.objective(home)
    cheap, cheap_kind = grouping_bound(problem)
    bound, kind = cheap, cheap_kind
    history: list[tuple[float, float, float | None]] = [(time.perf_counter() - t0, bound, incumbent)]
    tol = RC_TOL * max(float(W.max(initial=0.0)), 1e-12)
    if E == 0 or min(problem.cap, E) <= 1 or bound <= tol:
        # no pair can share a group, or no pair has affinity: every plan is worth 0
        done = Termination.OPTIMAL if home is not None else Termination.COMPLETED
        return ColgenResult(bound, incumbent, home, history, 0, 0, True, done, 0.0, kind, info)

    partition = home is not None
    master = Master(grouping_space(problem, partition))
    master.add([np.array([e]) for e in range(E)])
    if home is not None:
        master.add([np.flatnonzero(home == g) for g in range(G)])
    # stability center of the dual smoothing: first each expert's share of its group's value
    # in the start plan (sum = its objective)
    center = None if home is None else 0.5 * (W * (home[:, None] == home[None, :])).sum(axis=1)
    gen = generate(
        master,
        GroupingPricer(problem, partition),
        bound=bound,
        kind=kind,
        rounds=rounds,
        exact_every=exact_every,
        pricing_work=pricing_work,
        deadline=None if deadline is None or time_limit is None else deadline - MILP_SHARE * time_limit,
        tol=tol,
        center=center,
        incumbent=incumbent,
        smoothing=smoothing,
        seed=seed,
        t0=t0,
        history=history,
        info=info,
        log=say,
        give_up=give_up,
    )
    bound, kind, lp_value, proven, iterations = gen.bound, gen.kind, gen.lp_value, gen.proven, gen.iterations
    info["gave_up"] = gen.gave_up
    info["capped"] = info["capped"] or gen.capped
    # restricted master MILP over the generated columns
    ts = time.perf_counter()
    left = None if deadline is None else deadline - ts
    if (
        (proven or not gen.gave_up)
        and (left is None or left > 0.05)
        and (incumbent is None or incumbent < bound - 1e-9 * max(abs(bound), 1.0))
    ):
        milp: dict = {}
        plan = restricted_milp(
            problem, master.groups, partition, time_limit=left, nodes=milp_nodes, start=home, report=milp
        )
        info["capped"] = info["capped"] or milp["capped"]
        if plan is not None and problem.feasible(plan):
            value = problem.objective(plan)
            if incumbent is None or value > incumbent:
                home, incumbent = plan, value
        history.append((time.perf_counter() - t0, bound, incumbent))
    info["milp_time"] = time.perf_counter() - ts
    closed = incumbent is not None and bound - incumbent <= 1e-6 * max(abs(bound), 1e-12)
    if closed or proven:
        termination = Termination.OPTIMAL if closed else Termination.COMPLETED
    elif info["capped"]:
        termination = Termination.TIME_LIMIT
    else:
        termination = Termination.ITERATION_LIMIT
    return ColgenResult(
        bound, incumbent, home, history, len(master.groups), iterations, proven, termination, lp_value, kind, info
    )


def _disjoint_first(groups: list[np.ndarray], experts: int, limit: int) -> list[np.ndarray]:
    """Up to ``limit`` groups, best first, preferring ones disjoint from those already taken."""
    used = np.zeros(experts, dtype=bool)
    first, rest = [], []
    for s in groups:
        if not used[s].any():
            first.append(s)
            used[s] = True
        else:
            rest.append(s)
    return (first + rest)[:limit]


@dataclass
class Generation:
    """Where `generate` stopped: the best Lagrangian bound (or the starting one, ``kind``
    naming it), the last master LP value, whether the LP was proved solved, master LP solves,
    whether it gave up at an unproved exact pricing (``give_up``) and whether the outer
    wall-clock cap (``deadline``), not the work budget, stopped it or one of its pricings."""

    bound: float
    kind: str
    lp_value: float | None
    proven: bool
    iterations: int
    gave_up: bool = False
    capped: bool = False


def generate(
    master: Master,
    pricer: Pricer,
    *,
    bound: float,
    kind: str,
    tol: float,
    rounds: int = ROUNDS,
    exact_every: int = EXACT_EVERY,
    pricing_work: float = PRICING_WORK,
    deadline: float | None = None,
    center: np.ndarray | None = None,
    incumbent: float | None = None,
    smoothing: float = 0.8,
    seed: int = 0,
    t0: float | None = None,
    history: list[tuple[float, float, float | None]] | None = None,
    info: dict | None = None,
    log: Callable[[str], None] | None = None,
    give_up: bool = False,
) -> Generation:
    """The column generation loop over any column space: master LP, pricing, Lagrangian bounds.

    Each master LP solve is followed by heuristic pricing (at Wentges-smoothed duals, then at the
    master's); when it finds nothing, the master stalls, or ``exact_every`` rounds have passed
    since the last one, an exact pricing gives the Lagrangian (Farley) bound

        L(pi) = sum_e pi_e + G max(0, upper),   upper >= max_S [v(S) - pi(S)],

    valid for any ``pi`` that `Pricer.project` returns (e.g. ``pi >= 0`` for rows ``<= 1``,
    ``pi <= 0`` for rows ``>= 1``), so ``bound`` is valid at every iteration.

    Every decision counts work, never the clock: the same input, seed and budgets give the same
    columns and bound on any machine. ``deadline`` is an outer cap (``Generation.capped``).

    Parameters
    ----------
    master
        The restricted master, seeded with columns that make it feasible.
    pricer
        Column pricing for the master's problem.
    bound, kind
        A valid upper bound on the master's optimum to start from, and its name.
    tol
        Reduced values at or below this count as zero.
    rounds
        Master LP solves at most.
    exact_every
        Heuristic pricing rounds between two exact pricings at most (``FULL_EXACT_EVERY`` times
        as many with full columns, whose heuristic is near exact).
    pricing_work
        Work units of one exact pricing (`CONVERGED_WORK` times as many for the one that
        certifies the LP).
    deadline
        ``time.perf_counter()`` value at which to stop whatever the work left (None: none).
    center
        First stability center of the dual smoothing (None: the master's duals).
    incumbent
        Value of the best known plan (only scales the exact pricing's tolerance).
    smoothing
        Wentges alpha, as in `column_generation`.
    seed, t0, history, info, log
        Exact pricing's seed; the clock's origin, the ``(seconds, bound, incumbent)`` list, the
        counters (``heuristic_pricings``, ``exact_pricings``, ``mispricings``, ``lp_time``,
        ``pricing_time``) and the log line sink, updated in place.
    give_up
        Stop after the first exact pricing that ends unproved (its bound is kept).
    """
    t0 = time.perf_counter() if t0 is None else t0
    history = [] if history is None else history
    info = {} if info is None else info
    for key in ("heuristic_pricings", "exact_pricings", "mispricings"):
        info.setdefault(key, 0)
    for key in ("lp_time", "pricing_time"):
        info.setdefault(key, 0.0)
    say = log or (lambda _msg: None)
    G = master.space.groups
    floor = -math.inf if pricer.full else 0.0  # the empty column's value, unless every column is full
    center_value = math.inf  # the exact Lagrangian bound at the center
    center_estimate = math.inf  # the heuristic's estimate of it (full columns)
    since_exact = 0  # pricing rounds since the last exact pricing
    best_lp, stalled = -math.inf, 0  # master LP iterations without progress
    mispriced = 0  # consecutive exact pricings that found nothing for the master
    iterations = 0
    proven = gave_up = capped = False
    lp_value = None
    hint = None
    while iterations < rounds:
        if deadline is not None and time.perf_counter() >= deadline:
            capped = True
            break
        ts = time.perf_counter()
        lp_value, pi, mu, _x = master.solve()
        info["lp_time"] += time.perf_counter() - ts
        iterations += 1
        since_exact += 1
        if deadline is not None and time.perf_counter() >= deadline:
            capped = True
            break
        if lp_value >= bound - 1e-9 * max(abs(bound), 1.0):
            break  # the master meets a valid bound: LP (and bound) optimal
        # Wentges smoothing; after each misprice the pricing duals move towards the master's
        alpha = 1.0 - (mispriced + 1) * (1.0 - smoothing)
        alpha = alpha if alpha > 1e-9 else 0.0
        pi_price = pi if center is None or alpha == 0.0 else alpha * center + (1.0 - alpha) * pi
        pi_price = pricer.project(pi_price)  # duals where the Lagrangian bound holds
        ts = time.perf_counter()
        found = pricer.heuristic(pi_price)
        info["heuristic_pricings"] += 1
        # the best reduced value found: a floor for the exact pricing
        threshold = max(floor, float(pricer.reduced(found[:1], pi_price).max(initial=floor)))
        rc = pricer.reduced(found, pi) - mu
        good = [s for s, r in zip(found, rc, strict=True) if r > tol]
        if not good and pi_price is not pi:  # nothing at the smoothed duals: try the master's
            extra = pricer.heuristic(pi)
            rc = pricer.reduced(extra, pi) - mu
            good = [s for s, r in zip(extra, rc, strict=True) if r > tol]
        info["pricing_time"] += time.perf_counter() - ts
        if lp_value > best_lp + 1e-4 * max(abs(lp_value), 1e-12):
            best_lp, stalled = lp_value, 0
        else:
            stalled += 1
        if pricer.full:
            # full columns: the heuristic (iterated local search) is near exact, so its estimate
            # of the Lagrangian steers the center, and the exact pricing waits until the heuristic
            # finds nothing at the master's own duals (then it gets more work) or until
            # FULL_EXACT_EVERY stretches have passed without one (a bound now and then)
            estimate = float(pi_price.sum()) + G * threshold
            if math.isfinite(estimate) and estimate < center_estimate:  # -inf: no full group found
                center, center_estimate = pi_price.copy(), estimate
            due = since_exact >= FULL_EXACT_EVERY * exact_every
            heuristic_only = not due and (bool(good) or alpha > 0.0)
            mispriced = 0 if good else mispriced + heuristic_only
        else:
            due = since_exact >= exact_every  # a bound (and a center) now and then
            heuristic_only = bool(good) and stalled < STALL_ITERATIONS and iterations > 1 and not due
        converged = pricer.full and not good
        if deadline is not None and time.perf_counter() >= deadline:
            capped = True  # no time left for what follows (columns found now could not be priced)
            break
        if heuristic_only:
            if good:
                hint = good[0]
                master.add(_disjoint_first(good, master.space.experts, limit=max(10, 2 * G)))
            continue
        stall_added = bool(good)
        if good:  # the master stalls (degenerate pivots): price exactly for a bound and a new center
            master.add(_disjoint_first(good, master.space.experts, limit=max(10, 2 * G)))
            stalled = 0
        # exact pricing at the smoothed duals: a Lagrangian bound, and columns if any
        ts = time.perf_counter()
        # far from the LP optimum a rough pricing is worth more than an exact one: prune within a
        # tenth of the current gap (the bound loses at most that), then tighter as the gap closes
        slack = max(PRICING_TOLERANCE * max(abs(lp_value), abs(incumbent or 0.0)), 0.1 * (bound - lp_value)) / G
        if converged:  # the heuristic found nothing at the master's duals: this pricing is the certificate
            slack = PRICING_TOLERANCE * max(abs(lp_value), abs(incumbent or 0.0)) / G
        pr = pricer.exact(
            pi_price,
            work=pricing_work * (CONVERGED_WORK if converged else 1.0),
            deadline=deadline,
            hint=hint,
            seed=seed,
            threshold=threshold,
            tolerance=slack,
        )
        info["exact_pricings"] += 1
        since_exact = 0
        info["pricing_time"] += time.perf_counter() - ts
        capped = capped or pr.capped
        lag = float(pi_price.sum()) + G * max(floor, pr.upper)
        if lag < center_value and not pricer.full:
            center, center_value = pi_price.copy(), lag
        if lag < bound:
            bound, kind = lag, "colgen"
        history.append((time.perf_counter() - t0, bound, incumbent))
        say(
            f"colgen it {iterations} ({time.perf_counter() - ts:.2f} s): lp {lp_value:.6g}, bound {bound:.6g}, "
            f"pricing {pr.kind} "
            f"upper {pr.upper:.4g}{'' if pr.proven else ' (unproven)'}, alpha {alpha:.2g}, "
            f"columns {len(master.groups)}"
        )
        if pr.capped:  # the clock stopped the pricing: nothing more can be done in time
            break
        if give_up and not pr.proven:
            gave_up = True
            break
        rc = pricer.reduced(pr.groups, pi) - mu
        good = [s for s, r in zip(pr.groups, rc, strict=True) if r > tol and pricer.admissible(s)]
        if good:
            master.add(good)
        master.add([s for s in pr.partners if pricer.admissible(s)])
        if good or stall_added:
            mispriced = 0
            continue
        mispriced += 1
        info["mispricings"] += 1
        if alpha == 0.0 and pr.proven and lag <= lp_value + PRICING_TOLERANCE * abs(lp_value) + 1e-12:
            proven = True  # priced at the master's duals, nothing to add: the LP is solved (to the tolerance)
            break
    if lp_value is not None and lp_value >= bound - 1e-9 * max(abs(bound), 1.0):
        proven = True
    return Generation(bound, kind, lp_value, proven, iterations, gave_up, capped and not proven)
