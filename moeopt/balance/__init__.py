"""Load-balance planner core: copy counts, slot packing, lower bounds, robust and migration-aware re-plans.

One MoE layer at a time, pure numpy (plus ``scipy.optimize.linear_sum_assignment``).

Problem
-------
A layer has ``E`` experts with loads ``load[E] >= 0`` (token counts) and ``G`` GPUs with exactly ``W``
physical slots each, ``P = G * W >= E`` slots in all. A plan ``slots[G, W]`` puts one expert id in every
slot; every expert gets ``c_e >= 1`` copies. Under ``even`` dispatch every copy of ``e`` receives
``load_e / c_e`` tokens, so a GPU's load is the sum of its slots' per-copy loads. The objective is the
largest GPU load, reported as ``MaxVio = max / mean - 1``. By default two copies of one expert never
share a GPU (``allow_colocated=False``).

Algorithm (`plan_layer`)
------------------------------
1. **Copy counts** (`copy_counts`). Water-filling: repeatedly give one more copy to the expert
   with the largest per-copy load ``load_e / c_e``. Implemented without a heap: the ``R = P - E``
   extra copies are exactly the ``R`` largest values of the multiset ``{load_e / k : 1 <= k < cap_e}``
   (the value ``load_e / k`` is what the ``(k+1)``-th copy of ``e`` removes), selected with one
   partition + sort. Greedy is optimal for ``min_c max_e load_e / c_e``. Let ``V = load_e / c_e`` be
   the greedy maximum. If ``c_e = cap_e`` nothing beats ``V``. Otherwise ``V`` is an unselected
   multiset value and every selected value is ``>= V``, so at least ``R + 1`` values are ``>= V``; a
   vector with maximum ``< V`` needs ``c'_f >= k + 1`` for every value ``load_f / k >= V``, i.e. one
   extra copy per such value, ``R + 1`` in all: infeasible.
2. **Packing** (`pack`): the ``P`` copies (items) are partitioned into ``G`` bins of exactly ``W``
   items, no two copies of one expert in a bin. Two starts: LPT (heaviest item first onto the
   lightest bin that has a free slot and does not hold that expert; a heap, a Python loop over the
   ``P`` items only) and balanced largest differencing (Karmarkar--Karp for cardinality-constrained
   partitioning: rows of ``G`` sorted items are partial solutions; the two partial solutions with
   the largest spread are merged by a minimum sum-of-squares assignment, solved with
   ``linear_sum_assignment`` with a penalty on merging two bins that share an expert). The better
   start is improved by **swap local search**: from the heaviest bin, every exchange of one of its
   items with any item of another bin is scored at once (a ``W x P`` numpy array of new pair
   maxima, colocation masks included); the best exchange that brings both bins below the current
   maximum is applied, until a local optimum. Optionally (``smooth_moves > 0``) a sum-of-squares
   smoothing pass (items of the heaviest bins against all items; it never raises the maximum)
   reshapes the plateau and the descent resumes. Then an iterated local search applies a few seeded
   random swaps among the heaviest bin and some random bins, descends again and keeps the result
   only if the maximum dropped. Every loop is bounded by iteration counts, never by wall time, so a
   seed fixes the result.
3. **Joint step** (counts and placement together): the local search also *replaces* the content of
   one slot: a copy of an expert with spare copies (``c_a >= 2``) becomes a copy of another expert
   ``x``; this re-splits both experts' loads on every GPU that holds them. Two families are scored
   vectorized over all GPUs: a donor slot on the heaviest GPU becomes any expert, or an expert on the
   heaviest GPU gains a copy at any donor slot elsewhere. Swaps and replacements alternate until
   neither lowers the maximum (after the first descent and on the best layout of the iterated
   search; the perturbation rounds use swaps only, since on real loads replacements almost never
   apply once the counts are water-filled). Finally a lookahead tries the few count changes with
   the lowest new maximum *even if they do not improve at once*, repairs each with a swap descent
   and keeps the best if the maximum dropped: this finds plans whose counts differ from the
   water-filled ones (on brute-forced tiny layers it raises the share of optimal plans from 89 % to
   94 %).
4. **Lower bound** (`lower_bound`): valid over every count vector and every placement; see its
   docstring for the pigeonhole argument.

The search of steps 2-3 runs on the package's one engine (`moeopt.moves`): the layouts are
`SlotTable` subclasses, each neighbourhood (max-bin swaps, smoothing,
replacements; the robust and variance-aware swaps of the extensions) is a vectorized ``best``
kernel run by `descend`, and the perturbation rounds are
`iterate`. LPT is `moeopt.packing.lpt_pack`, the one packing
module's. The all-layers fast path (`moeopt.balance.batch`) keeps its own batched kernel over
``[L, G, W]`` arrays (per-layer state objects would bring back the Python loop over layers).

Extensions
----------
* `plan_layer_robust`: per-step counts ``[T, E]``; minimizes the mean (or worst) over steps of
  the per-step largest GPU load (normalized by the step's mean by default), starting from the pooled
  plan and accepting only improving swap/replace moves evaluated on all steps at once.
* Hierarchical mode (``hierarchical=True, gpus_per_node=n``): each expert's copies stay inside one
  node. Experts are first packed over nodes (cardinality-constrained, minimizing the largest node
  load), then each node is planned on its own ``n x W`` slots.
* `replan_from` / `migration_frontier`: from a current plan, greedy best-gain-per-moved
  slot replace/swap moves under a budget or until a MaxVio target; with enough budget the
  unconstrained plan, relabeled to the current GPUs (``linear_sum_assignment`` on overlap) and slot
  positions, is used when it is better, so an unlimited budget reaches `plan_layer`'s MaxVio.
"""

from __future__ import annotations

from moeopt.balance.bound import lower_bound
from moeopt.balance.copies import copy_counts
from moeopt.balance.loads import DEFAULT_ITERATIONS, gpu_loads, maxvio
from moeopt.balance.migration import count_moves, migration_frontier, relabel, replan_from
from moeopt.balance.packing import pack
from moeopt.balance.planner import plan_layer, plan_layers
from moeopt.balance.robust import Objective, plan_layer_robust, robust_objective, robust_pays
from moeopt.packing import lpt_pack

__all__ = [
    "DEFAULT_ITERATIONS",
    "Objective",
    "copy_counts",
    "count_moves",
    "gpu_loads",
    "lower_bound",
    "lpt_pack",
    "maxvio",
    "migration_frontier",
    "pack",
    "plan_layer",
    "plan_layer_robust",
    "plan_layers",
    "relabel",
    "replan_from",
    "robust_objective",
    "robust_pays",
]
