"""Joint planner core: slot contents chosen for communication and balance together (SPEC 11).

One MoE layer at a time. A plan fills the ``G x W`` physical slots with expert ids (every
expert at least one copy, no two copies of one expert on one GPU, ``-1`` for an empty slot).
The *ideal dispatch* of a plan on a token workload sends every (token, expert) pair to one
GPU holding the expert, as a fractional flow over the tokens, so that

    minimize   mean over tokens of the distinct GPUs a token uses (hypergraph connectivity)
    subject to every GPU's load <= (1 + eps) * mean load   (soft: ``penalty`` per unit over)

The joint objective of a plan is that value on the calibration workload and, robustly, on
each family's own workload (single-family workloads are the shift a deployment sees):

    J = (1 - robust) * D_cal(eps) + robust * sum_f pi_f * D_f(family_eps)

Two cost objects price a plan and the moves of the local search:

* `SampleCost` (the search's engine): on a token sample, each token's experts go
  *locality first*, as the online guard of SPEC 4.3 routes at small λ (an expert with one
  copy runs there; one with several on the holder with most of the token's other experts,
  ties spread evenly over the tied holders); then each GPU over its limit sheds pairs to
  their next-best holders, free ones first (a holder the token already uses), then at one
  GPU each, and load left over a limit (on the source, or pushed over on a receiver) costs
  ``penalty`` per pair. The sample's pairs are weighted so that each family's expert loads
  are the whole trace's. A move changes the holders of at most two experts, so only the
  tokens that chose them are routed again: gains are exact and incremental.
* `ExactCost`: the ideal dispatch as a linear program over each token pattern's
  routings (every assignment of its experts to holders), for small layers; the exact MILP
  over slot contents (`solve_exact`) uses the same model with binary holders, and
  `brute_force` enumerates every plan of tiny layers to check both.

`local_search` is one engine over slot contents with three operators: swap two slots
(a swap with an empty slot moves a copy), replace a copy (an expert with spare copies gives a
slot to another expert), and add a copy into an empty slot. On small layers each round
prices the whole neighbourhood and applies the best improving move; on larger ones moves are
screened by first-order gains (`SampleCost.screen`), ranked on a sub-sample
(`SampleCost.prescreen`) and priced a chunk at a time. At a local optimum a kick of
random swaps restarts the descent from the best plan (iterated local search). Bounded by
rounds, kicks and an optional deadline; a seed fixes the result when no deadline cuts it.

The search runs on the package's one engine (`moeopt.moves`): `SlotState` is a
`moeopt.moves.slots.SlotTable` and `local_search` is the driver's
`moeopt.moves.driver.descend` over the joint neighbourhood plus its
`moeopt.moves.driver.iterate` for the kicks.

Modules: `moeopt.joint.data` (the problem), `moeopt.joint.state` (plans and moves),
`moeopt.joint.costs` (sample pricing), `moeopt.joint.exact` (exact pricing, MILP, brute
force), `moeopt.joint.search` (the local search).
"""

from __future__ import annotations

from moeopt.joint.costs import Cost, SampleCost, holder_masks, route_locality_first, route_masks
from moeopt.joint.data import TOL, JointLayer, layer_from_trace, subsample
from moeopt.joint.exact import (
    ExactCost,
    ExactResult,
    brute_force,
    check_exact_size,
    fill_slots,
    holds_to_slots,
    ideal_dispatch,
    routings,
    solve_exact,
)
from moeopt.joint.rules import RULE_KINDS, RuleCost
from moeopt.joint.search import SearchStats, kick, local_search, neighbourhood, screened_moves
from moeopt.joint.state import Move, SlotState

__all__ = [
    "RULE_KINDS",
    "RuleCost",
    "Cost",
    "ExactCost",
    "ExactResult",
    "JointLayer",
    "Move",
    "SampleCost",
    "SearchStats",
    "SlotState",
    "TOL",
    "brute_force",
    "check_exact_size",
    "fill_slots",
    "holder_masks",
    "holds_to_slots",
    "ideal_dispatch",
    "kick",
    "layer_from_trace",
    "local_search",
    "neighbourhood",
    "route_locality_first",
    "route_masks",
    "routings",
    "screened_moves",
    "solve_exact",
    "subsample",
]
