"""The cross-layer planner: plan the layers together when tokens stay on the GPU of their last expert.

Under ``cluster.token_home: previous-layer`` (ExFlow, MoETuner) a token's hidden state lives,
at layer l, on the GPU that ran its top-1 expert at layer l - 1, so its dispatch at layer l
costs the distinct GPUs of its top-k experts *other than that GPU*. The objective (remote
GPUs per token, summed over layers) couples each layer only to its neighbours, and for a
layer l with both neighbours' plans fixed it is exact and simple:

* layer l's own remote GPUs: the (λ − 1) connectivity of the net ``topk ∪ {home}`` with the
  token's home as a pin fixed to its GPU (`stay_edges`, `StayGain`); tokens
  with the same (top-k set, home) share one net;
* layer l + 1's: a token lives on the GPU of its layer-l top-1 expert e, so placing e on g
  saves ``B[e, g]`` remote GPUs there, the tokens with top-1 e that find one of their
  layer l + 1 experts on g (`next_layer_benefit`): a linear term.

The planner (the method ``crosslayer``, `moeopt.methods.crosslayer`, registers it, reads its
parameters and assembles the result; the algorithm is here):

1. **starts**: ``agnostic``'s plan (and optionally ``hypergraph``'s, or a forward pass of
   Mt-KaHyPar with the home pins fixed, or the caller's hint), each with the free GPU
   relabeling every method gets (`moeopt.relabel.relabel_gpus`);
2. **sweeps**: forward, then backward, and so on, each layer is re-planned knowing both
   neighbours: the best renumbering of its GPU ids against both (one linear assignment,
   `permute_layer`; GPUs of different speed classes never trade ids), then
   best-improvement swaps and moves on the exact gains (`CrossGain`) within the slot
   counts and the same automatic load limit as ``agnostic`` / ``tacg`` / ``hypergraph``;
   after each pass, **chain moves** (`chain_pass`): per pair of GPUs, the best joint
   re-split of the experts they hold in every layer (a dynamic program over the layers), which
   moves an expert together with the experts its tokens go to next; until a pass saves less
   than ``tolerance``;
3. optional **kicks** (iterated local search: random feasible swaps in one layer, then the
   layer and its neighbours re-planned, kept when not worse);
4. the best plan over the starts on the calibration trace.

Every step is a descent on the calibration objective, so the result is never worse than its
relabeled starts.

**Certificate** (``bound_rounds`` of column generation per layer, capped at ``bound_time``
seconds and by the time limit; ``bound_time: 0``: none): a token's remote GPUs at a layer are
its distinct GPUs less at most one (its home), so every plan's objective is at least, per layer,
the lower bound on distinct GPUs per token of `moeopt.colgen.cover.distinct_lower_bound`
(column generation over GPU contents, seeded with the plan; a pair LP where that is cut short;
a semidefinite bound on the pairs that share a GPU, up to 64 experts)
less the share of tokens that can stay at all (`moeopt.colgen.cover.stay_upper_bound`, an
LP over which previous-layer experts can share a GPU with which experts of this layer), or
times ``1 - 1/G`` at layer 0 under uniform homes (`moeopt.colgen.cover.remote_lower_bound`).
It ignores the load limit, so it is valid for every plan and loose.

`exact_crosslayer` computes the optimum of tiny instances (dynamic programming over all
placements of each layer) to check the planner and the certificate.

Modules: `moeopt.crosslayer.objective` (the objective and its gains), `moeopt.crosslayer.chain`
(chain moves), `moeopt.crosslayer.search` (the sweeps and kicks), `moeopt.crosslayer.bounds`
(load bounds the certificate uses), `moeopt.crosslayer.exact` (the exact optimum of tiny
instances).
"""

from __future__ import annotations

from moeopt.crosslayer.bounds import cheapest_levels, largest_loads, least_largest_load
from moeopt.crosslayer.chain import CHAIN_MAX_SPLITS, chain_pass
from moeopt.crosslayer.exact import EXACT_MAX_PLANS, exact_crosslayer, layer_placements
from moeopt.crosslayer.objective import (
    CrossGain,
    StayGain,
    layer_remote,
    next_layer_benefit,
    plan_remote,
    stay_edges,
    token_homes,
)
from moeopt.crosslayer.search import improve_layer, kick_layer, permute_layer, sweep

__all__ = [
    "CHAIN_MAX_SPLITS",
    "EXACT_MAX_PLANS",
    "CrossGain",
    "StayGain",
    "chain_pass",
    "cheapest_levels",
    "exact_crosslayer",
    "improve_layer",
    "kick_layer",
    "largest_loads",
    "layer_placements",
    "layer_remote",
    "least_largest_load",
    "next_layer_benefit",
    "permute_layer",
    "plan_remote",
    "stay_edges",
    "sweep",
    "token_homes",
]
