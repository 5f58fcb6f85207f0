"""Pricing a plan under a serving engine's own dispatch rule (`RuleCost`).

The joint planner's first objective (`moeopt.joint.costs.SampleCost`) routes every token
locality first, as the ``locality`` guard does: a rule no serving engine runs. The engines pick
a copy without looking at the token's other experts (`moeopt.dispatch`):

* ``even`` (SGLang ``dynamic``): the token in row ``r`` of its batch uses copy ``r mod c``;
* ``vllm``: copy ``hash(r) mod c``;
* ``ascend`` (vLLM-Ascend): the token's source rank ``h`` uses copy ``h mod c`` (with TP,
  ``(h mod tp + h div tp + e) mod c``);
* ``static`` (SGLang): the copy on the token's own GPU ``h``, else the first in its node when
  that narrows the choice, else one fixed per (rank, expert) by a seeded fair draw;
* ``lp`` (SGLang): a per-batch split that minimizes the largest GPU load, each token drawn at
  random by the split's probabilities, whatever its other experts.

So copies help communication only where the rule lines them up: copies of two experts that a
token picks by the same row (``even``, ``vllm``: experts with the same copy count on the same
GPUs in the same order go to the same GPU for every row), a copy on the token's own GPU
(``static``), or the same rank's pick (``ascend``). `RuleCost` prices exactly that on a
token sample: every sampled token is routed by the rule (rows from its step, homes from the
trace or drawn uniformly, the fair draw and ``lp``'s draw by a fixed uniform number per pair,
``lp``'s split taken even), and counts its
remote GPUs as the scorer does (``distinct * (1 - 1/G)`` without homes; ``distinct - [home
used]`` with them). GPU loads are the rule's shares of the weighted expert loads: ``1 / c`` per
copy (``even``, ``vllm``; ``lp`` too, an upper bound for its optimal split), vLLM-Ascend's
rank-modulo shares (`moeopt.balance.ranks`), and for ``static`` the largest share its fair
draw may give a copy (``(1 + ceil((G - c) / c)) / G``: exact when ``c`` divides ``G``; with node
preference, ``1 / c``). The objective is the joint planner's: the
mean remote GPUs per token of the calibration workload and (weight ``robust``) of each family's,
plus ``penalty`` per pair over each workload's load limit.
"""

from __future__ import annotations

import math

import numpy as np

from moeopt.balance.ranks import share_table
from moeopt.dispatch import popcount64
from moeopt.joint.costs import MAX_GPUS, tokens_of_experts
from moeopt.joint.data import JointLayer
from moeopt.joint.search import screened_moves
from moeopt.joint.state import Move, SlotState
from moeopt.packing import round_robin_lpt

#: the rules `RuleCost` prices (``locality`` is `moeopt.joint.costs.SampleCost`'s)
RULE_KINDS = ("even", "vllm", "static", "ascend", "lp")
#: rules whose copy choice depends on the token's source rank
_HOMED = ("static", "ascend")
#: vLLM's replica hash (``moeopt.dispatch.VLLM_HASH``)
_HASH = 2654435769


def rule_shares(
    holds: np.ndarray, experts: np.ndarray, rule: str, *, node: int | None = None, table: np.ndarray | None = None
) -> np.ndarray:
    """float ``[m, G]``: the share of each expert's load (``experts [m]``, holding GPUs ``holds
    [m, G]``) each GPU serves under ``rule`` as `RuleCost` prices it: ``1 / c`` per copy, for
    ``static`` without a node preference (``node`` None) the largest share SGLang's fair draw may
    deal a copy, for ``ascend`` the rank-modulo shares of ``table`` (`moeopt.balance.ranks.share_table`)."""
    c = np.maximum(holds.sum(axis=1), 1)
    if rule == "static" and node is None:
        # SGLang's fair draw deals the G - c ranks without a copy over the c copies: floor or
        # ceil of (G - c) / c each, which ones by its seeded stream (not known per layer).
        # Priced at the ceil: copy counts that divide G are exact, the others carry the
        # share the draw may give them, so a plan within the limit here stays within it
        G = holds.shape[1]
        return holds * ((1.0 + np.ceil((G - c) / c)) / G)[:, None]
    if table is None or rule != "ascend":
        return holds / c[:, None]
    rank = np.clip(np.cumsum(holds, axis=1) - 1, 0, holds.shape[1] - 1)
    return np.where(holds, table[experts[:, None], c[:, None], rank], 0.0)


def rule_gpu_loads(
    slots: np.ndarray, load: np.ndarray, rule: str, *, gpus_per_node: int | None = None, tp_size: int | None = None
) -> np.ndarray:
    """float ``[G]``: one layer's GPU loads under ``rule`` as `RuleCost` prices them, for the plan
    ``slots [G, W]`` (-1 empty) and expert loads ``load [E]``."""
    G, E = slots.shape[0], len(load)
    holds = np.zeros((E, G), dtype=bool)
    g, _ = np.nonzero(slots >= 0)
    holds[slots[slots >= 0], g] = True
    node = None if gpus_per_node is None or gpus_per_node >= G else int(gpus_per_node)
    table = share_table(G, E, tp_size)[:, : G + 1] if rule == "ascend" else None
    share = rule_shares(holds, np.arange(E), rule, node=node, table=table)
    return np.asarray(np.asarray(load, dtype=np.float64) @ share)


def distinct_per_row(gpu: np.ndarray, G: int) -> np.ndarray:
    """int ``[m]``: the distinct values of each row of ``gpu [m, k]`` (values in ``0 .. G - 1``):
    the popcount of the rows' OR of ``1 << gpu`` when ``G <= MAX_GPUS`` (a few vector operations
    per column), else by sorting each row."""
    if G <= MAX_GPUS and gpu.shape[1]:
        g = gpu.astype(np.uint64)
        one = np.uint64(1)
        acc = np.left_shift(one, g[:, 0])
        for j in range(1, g.shape[1]):
            acc |= np.left_shift(one, g[:, j])
        return popcount64(acc)
    s = np.sort(gpu, axis=1)
    return np.asarray((s.shape[1] > 0) + (s[:, 1:] != s[:, :-1]).sum(axis=1), dtype=np.int64)


def rows_any(mask: np.ndarray) -> np.ndarray:
    """bool ``[m]``: whether each row of the bool ``mask [m, k]`` holds a True; one integer
    comparison per row when a row is 1, 2, 4 or 8 bytes (``any(axis=1)`` reduces short rows
    slowly)."""
    k = mask.shape[1]
    if k in (1, 2, 4, 8) and mask.dtype == np.bool_ and mask.flags.c_contiguous:
        return np.asarray(mask.view(f"u{k}").reshape(-1) != 0)
    return np.asarray(mask.any(axis=1))


class RuleCost:
    """The joint objective of one layer under an engine's dispatch rule, on a token sample.

    Parameters
    ----------
    layer
        The layer's sample (tokens, families, weights, limits, penalty).
    rule
        One of `RULE_KINDS`.
    row
        int ``[n]``: each sampled token's row in its batch (``even``, ``vllm``).
    home
        int ``[n]``: each sampled token's source GPU (``static``, ``ascend``).
    draw
        float ``[n, k]`` in ``[0, 1)``: the fair draw of each pair (``static``).
    gpus_per_node
        SGLang's node size for ``static``'s same-node preference (None or >= G: none).
    tp_size
        vLLM-Ascend's tensor-parallel size (``ascend``).
    homes_known
        Whether ``home`` is where the tokens really live (a trace with homes): remote GPUs are
        then ``distinct - [home used]`` under every rule, as the scorer counts them; otherwise
        only the per-rank rules (``static``, ``ascend``) use ``home``, a uniform draw standing for
        the expectation over homes, and the others count ``distinct (1 - 1/G)``.
    bin_size
        GPUs per bin of the layer (1: the layer's "GPUs" are GPUs). The hierarchical planner's
        node level plans nodes as bins of ``gpus_per_node`` GPUs (`moeopt.heuristics.hierarchy`):
        ``home`` stays a GPU rank (``ascend``'s modulo runs over the ``G * bin_size`` ranks), the
        token's home bin is ``home // bin_size``, ``static`` uses the copy in the home bin (its
        own GPU or node), and the objective counts remote bins: remote nodes per token.
    slot_width
        With ``bin_size > 1``: the slots of each GPU in a bin (W). The calibration load over the
        GPU limit, ``(1 + eps)`` times the mean GPU load, is then priced too (``penalty`` per pair),
        each bin's copies packed onto its ``bin_size`` GPUs of ``slot_width`` slots as the GPU level
        will start (`moeopt.packing.round_robin_lpt`): a node within its own limit can still
        hold copies no packing of its GPUs balances (one copy hotter than a GPU may be).
    """

    def __init__(
        self,
        layer: JointLayer,
        rule: str,
        *,
        row: np.ndarray,
        home: np.ndarray,
        draw: np.ndarray,
        gpus_per_node: int | None = None,
        tp_size: int | None = None,
        homes_known: bool = False,
        bin_size: int = 1,
        slot_width: int | None = None,
    ) -> None:
        if rule not in RULE_KINDS:
            raise ValueError(f"rule must be one of {', '.join(RULE_KINDS)}, got {rule!r}")
        self.layer, self.rule = layer, rule
        n, k = layer.topk.shape
        G, E, F = layer.gpus, layer.experts, layer.families
        self.row = np.asarray(row, dtype=np.int64)
        self.hashed = (self.row * _HASH) & 0xFFFFFFFF
        self.home = np.asarray(home, dtype=np.int64)
        self.draw = np.asarray(draw, dtype=np.float64)
        self.bin = max(1, int(bin_size))
        self.home_bin = self.home // self.bin
        # per sampled pair: its row in the flattened [E, G] tables (expert * G), and for the per-rank
        # rules the flat index of (expert, the token's home bin): gathers of precomputed indices
        # instead of two-dimensional fancy indexing in the search's hot loop
        if len(self.home_bin) != n:
            raise ValueError(f"home must give each of the {n} sampled tokens a GPU, got {len(self.home_bin)}")
        self._pair_row = layer.topk.astype(np.int64) * G
        self._pair_home = self._pair_row + self.home_bin[:, None]
        self.node = None if gpus_per_node is None or gpus_per_node >= G or self.bin > 1 else int(gpus_per_node)
        self.table = share_table(G * self.bin, E, tp_size)[:, : G + 1] if rule == "ascend" else None
        self.tp_size = tp_size
        self.by_home = rule in _HOMED or homes_known
        order = np.argsort(layer.topk.ravel(), kind="stable")
        self._tok = (order // k).astype(np.int64)
        self._start = np.searchsorted(layer.topk.ravel()[order], np.arange(E + 1))
        self._mark = np.zeros(n, dtype=bool)  # scratch of `tokens_of_experts`
        # loads of every workload (0: calibration, 1 + f: family f), in weighted sample pairs
        key = layer.family[:, None] * E + layer.topk
        fam = np.bincount(key.ravel(), weights=layer.weights.ravel(), minlength=F * E).reshape(F, E)
        self.expert_loads = np.concatenate([fam.sum(axis=0, keepdims=True), fam])  # [1 + F, E]
        self.slot_width = slot_width if self.bin > 1 else None
        #: the GPU limit in calibration pairs: (1 + eps) times the mean over the bins' GPUs
        self._gpu_limit = (1.0 + float(layer.eps)) * float(self.expert_loads[0].sum()) / (G * self.bin)
        self._eps = layer.limits
        self._wts = layer.workload_weights
        ntok = layer.family_tokens
        self._ntok = np.concatenate([[max(float(ntok.sum()), 1.0)], np.maximum(ntok, 1.0)])
        self.affinity = layer.coactivation()
        self.value = math.inf
        self._remote = np.zeros(n)
        self._loads = np.zeros((1 + F, G))

    # ------------------------------------------------------------------ the rule
    def _copies(self, holds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int ``[m, G]``: each expert's GPUs ascending (-1 padded) and int ``[m]`` its count."""
        G = holds.shape[1]
        c = holds.sum(axis=1)
        order = np.argsort(~holds, axis=1, kind="stable")  # holding GPUs first, ascending
        return np.where(np.arange(G)[None, :] < c[:, None], order, -1), c

    def _shares(self, holds: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """float ``[m, G]``: the share of each expert's load each GPU serves under the rule."""
        return rule_shares(holds, experts, self.rule, node=self.node, table=self.table)

    def _route(self, tokens: np.ndarray, copies: np.ndarray, c: np.ndarray, holds: np.ndarray) -> np.ndarray:
        """float ``[m]``: remote GPUs of each token of ``tokens`` under the rule."""
        ids = self.layer.topk[tokens]  # [m, k]
        ce = np.maximum(c[ids], 1)
        G = holds.shape[1]
        if self.rule == "even":
            j = self.row[tokens][:, None] % ce
        elif self.rule == "vllm":
            j = self.hashed[tokens][:, None] % ce
        elif self.rule == "ascend":
            h = self.home[tokens][:, None]
            if self.tp_size is None or self.tp_size <= 1:
                j = h % ce
            else:
                j = (h % self.tp_size + h // self.tp_size + ids) % ce
        else:  # lp (a draw per pair, as SGLang's probabilities), static (the fair draw, then near copies)
            j = np.minimum((self.draw[tokens] * ce).astype(np.int64), ce - 1)
        row = self._pair_row[tokens]
        gpu = copies.reshape(-1)[row + j]  # copies[ids, j] (copies is C-contiguous [E, G])
        at_home = None
        if self.rule == "static":
            h = self.home_bin[tokens][:, None]
            if self.node is not None:
                nd = self.node
                node_of = np.where(copies >= 0, copies // nd, -1)  # [E, G]
                in_node = node_of[ids] == (h // nd)[:, :, None]  # [m, k, G]
                n_in = in_node.sum(axis=2)
                first = copies[ids, np.argmax(in_node, axis=2)]
                gpu = np.where((n_in > 0) & (n_in < ce), first, gpu)
            # holds[ids, h]; a pair whose expert has a copy in its home bin uses it, no other pair does
            at_home = holds.reshape(-1)[self._pair_home[tokens]]
            gpu = np.where(at_home, h, gpu)
        distinct = distinct_per_row(gpu, G)
        if self.by_home:
            used = rows_any(at_home if at_home is not None else gpu == self.home_bin[tokens][:, None])
            return np.asarray(distinct - used, dtype=np.float64)
        return np.asarray(distinct * (1.0 - 1.0 / G), dtype=np.float64)

    def _value(self, remote_sum: np.ndarray, loads: np.ndarray, hot: float = 0.0) -> float:
        """The objective from per-workload remote sums ``[1 + F]``, loads ``[1 + F, G]`` and the
        calibration load over the GPU limit inside bins (``hot``)."""
        mean = loads.mean(axis=1, keepdims=True)
        over = np.maximum(loads - (1.0 + self._eps[:, None]) * mean, 0.0).sum(axis=1)
        over[0] += hot
        per = (remote_sum + self.layer.penalty * over) / self._ntok
        return float((self._wts * per).sum())

    def over_share(self) -> float:
        """How far the plan `reset` last priced lies over its limits: the largest load over the
        limit of one bin (``(1 + eps)`` times the mean) or, summed, of one bin's GPUs (packed),
        over the mean load of what it is over (a bin's, a GPU's); 0 within them."""
        loads = self._loads[0]
        mean = float(loads.mean())
        if mean <= 0:
            return 0.0
        bins = float(np.maximum(loads - (1.0 + self._eps[0]) * mean, 0.0).max(initial=0.0)) / mean
        gpus = float(self._gpu.max(initial=0.0)) / (mean / self.bin) if self.slot_width is not None else 0.0
        return max(bins, gpus)

    def _gpu_over(self, holds: np.ndarray, share: np.ndarray, bins: np.ndarray) -> np.ndarray:
        """float ``[len(bins)]``: per bin, the calibration load over the GPU limit when its copies
        (``holds [E, G]``, shares ``[E, G]``) are packed onto its GPUs (`round_robin_lpt`)."""
        out = np.zeros(len(bins))
        if self.slot_width is None:
            return out
        for i, b in enumerate(bins):
            items = np.flatnonzero(holds[:, b])
            q = self.expert_loads[0, items] * share[items, b]
            home = round_robin_lpt(q, self.bin, self.slot_width)
            gpu = np.bincount(home, weights=q, minlength=self.bin)
            out[i] = float(np.maximum(gpu - self._gpu_limit, 0.0).sum())
        return out

    def _remote_by_workload(self, remote: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        F = self.layer.families
        fam = self.layer.family if tokens is None else self.layer.family[tokens]
        by_f = np.bincount(fam, weights=remote, minlength=F)
        return np.concatenate([[by_f.sum()], by_f])

    # ------------------------------------------------------------------ the Cost protocol
    def reset(self, state: SlotState) -> float:
        holds = state.holds
        copies, c = self._copies(holds)
        self._holds, self._copies_t, self._c = holds.copy(), copies, c
        E = self.layer.experts
        self._share = self._shares(holds, np.arange(E))
        self._loads = self.expert_loads @ self._share
        self._remote = self._route(np.arange(self.layer.tokens), copies, c, holds)
        self._remote_sum = self._remote_by_workload(self._remote)
        self._gpu = self._gpu_over(holds, self._share, np.arange(holds.shape[1]))
        self.value = self._value(self._remote_sum, self._loads, float(self._gpu.sum()))
        return self.value

    def delta(self, state: SlotState, move: Move) -> float:
        """The change of `reset`'s value if ``move`` were applied (the state is not changed). The
        move is applied to the priced plan's tables in place, on its experts' rows alone, and
        undone before returning (no copy of the whole tables per priced move)."""
        changed = np.array(state.changed_experts(move), dtype=np.int64)
        holds, copies, c, shares = self._holds, self._copies_t, self._c, self._share
        kept = (holds[changed], copies[changed], c[changed], shares[changed])  # copies (fancy indexing)
        try:
            if move.kind == "swap":
                ea, eb = int(state.slots[move.a, move.i]), int(state.slots[move.b, move.j])
                if ea >= 0:
                    holds[ea, move.a], holds[ea, move.b] = False, True
                if eb >= 0:
                    holds[eb, move.b], holds[eb, move.a] = False, True
            else:
                old = int(state.slots[move.a, move.i])
                if old >= 0:
                    holds[old, move.a] = False
                holds[move.expert, move.a] = True
            copies[changed], c[changed] = self._copies(holds[changed])
            share = self._shares(holds[changed], changed)
            loads = self._loads + self.expert_loads[:, changed] @ (share - kept[3])
            hot = float(self._gpu.sum())
            if self.slot_width is not None:  # the bins the move touches are packed again
                bins = np.array(sorted({move.a, move.b} - {-1}), dtype=np.int64)
                shares[changed] = share
                hot += float((self._gpu_over(holds, shares, bins) - self._gpu[bins]).sum())
            tokens = tokens_of_experts(self._tok, self._start, changed, self._mark)
            remote_sum = self._remote_sum.copy()
            if tokens.size:
                new = self._route(tokens, copies, c, holds)
                remote_sum += self._remote_by_workload(new - self._remote[tokens], tokens)
            return self._value(remote_sum, loads, hot) - self.value
        finally:
            holds[changed], copies[changed], c[changed], shares[changed] = kept

    def delta_many(self, state: SlotState, moves: list[Move]) -> list[float]:
        return [self.delta(state, m) for m in moves]

    def loads(self) -> np.ndarray:
        """float ``[1 + F, G]``: the loads of the last `reset` (calibration, then families)."""
        return self._loads

    def screen(self, state: SlotState, rng: np.random.Generator, count: int) -> list[Move]:
        """Promising moves: the joint search's screening on the sample's co-activation and loads."""
        return screened_moves(state, self.affinity, self._loads, rng, count)
