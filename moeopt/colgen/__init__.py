"""Grouping bounds that close: the set-partitioning relaxation solved by column generation.

The Dantzig-Wolfe reformulation of the grouping problem (formulations/tacg.md, section 7)
has one column per feasible group ``S`` (at most ``cap`` experts, load at most
``load_limit``) with value ``v(S) = sum_{e < e' in S} W[e, e']``:

    max sum_S v(S) x_S   s.t.   sum_{S ni e} x_S = 1 (each expert e),   sum_S x_S <= G,   x >= 0.

Its LP value bounds the optimum from above and is much tighter than the cheap bounds of
`moeopt.bounds`. Column generation solves it over a growing set of columns (the
restricted master, HiGHS); pricing looks for a group of positive reduced cost
``v(S) - pi(S) - mu`` (a small quadratic knapsack): a vectorized greedy + swap heuristic
first, then exactly (branch and bound over the groups in lexicographic order; CP-SAT
beside it for groups of more than 4 experts).

Every exact pricing at duals ``pi`` gives a valid bound, the Lagrangian (Farley) bound

    z <= L(pi) = sum_e pi_e + G max(0, max_S [v(S) - pi(S)]),

whatever ``pi`` (``pi >= 0`` when expert rows are ``<= 1``), so the bound is valid at every
iteration, not only at convergence; an exact pricing that stops early contributes its proved
upper bound on the reduced cost. Duals are smoothed (Wentges): pricing happens at a convex
combination of the best-bound duals and the master's. A restricted master MILP (HiGHS, the
incumbent as a start) over the generated columns can improve the plan.

Every part is bounded by work, never by the clock: master LP solves (``rounds``), heuristic
pricing rounds between exact pricings (``exact_every``), the exact pricings' branch-and-bound
work and CP-SAT deterministic time (one worker), the MILP's nodes. The bound and the plan are
then a function of the problem, the seed and these budgets, the same on a busy machine as on an
idle one; a time limit is only an outer cap, and a result it stopped says so (termination
``time_limit``, ``info["capped"]``).

The package: `pricing` (the quadratic-knapsack pricing, and the `Pricer` protocol a
column value implements), `master` (the restricted master LP and MILP in highspy, over a
`ColumnSpace`), `driver` (`generate`, the loop and its bounds for any column
space, and `column_generation` on a grouping). The joint planner's certificate
(`moeopt.colgen.cover`) is the same loop over hypergraph columns with rows ``>= 1``.
"""

from moeopt.colgen.driver import (
    CONVERGED_WORK,
    EXACT_EVERY,
    MILP_NODES,
    MILP_SHARE,
    PRICING_TOLERANCE,
    RC_TOL,
    ROUNDS,
    STALL_ITERATIONS,
    ColgenResult,
    Generation,
    column_generation,
    generate,
)
from moeopt.colgen.master import ColumnSpace, Master, grouping_space, restricted_milp
from moeopt.colgen.pricing import (
    LOAD_SCALE,
    PRICING_SCALE,
    PRICING_WORK,
    WORK_PER_DTIME,
    GroupingPricer,
    Pricer,
    Pricing,
    group_value,
    price_branch_and_bound,
    price_cpsat,
    price_enumerate,
    price_exact,
    price_heuristic,
    pricing_candidates,
    reduced_values,
)

__all__ = [
    "CONVERGED_WORK",
    "EXACT_EVERY",
    "LOAD_SCALE",
    "MILP_NODES",
    "MILP_SHARE",
    "PRICING_SCALE",
    "PRICING_TOLERANCE",
    "PRICING_WORK",
    "RC_TOL",
    "ROUNDS",
    "STALL_ITERATIONS",
    "WORK_PER_DTIME",
    "ColgenResult",
    "ColumnSpace",
    "Generation",
    "GroupingPricer",
    "Master",
    "Pricer",
    "Pricing",
    "column_generation",
    "generate",
    "group_value",
    "grouping_space",
    "price_branch_and_bound",
    "price_cpsat",
    "price_enumerate",
    "price_exact",
    "price_heuristic",
    "pricing_candidates",
    "reduced_values",
    "restricted_milp",
]
