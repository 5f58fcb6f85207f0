"""Balance under SGLang's ``static`` rule: its seeded draw, replayed one layer at a time, and a
polish of the GPUs' positions for it.

SGLang's static dispatch (`moeopt.dispatch.static_map`) sends a rank's tokens for expert ``e``
to the copy on its own GPU, else to the first copy in its node when only some copies are there,
else to the copy its *own* seeded stream deals it: every rank builds its own table with its own
``random.Random(42)``, consumed only by the experts it has no near copy of, in layer-then-expert
order, and takes its place in its own deal. Ranks whose streams have diverged (they skipped
different experts, as ranks holding different copies do) draw independently, so the ``G - c``
ranks without a near copy do not split evenly over the ``c`` copies: at 16 GPUs a copy of a
two-copy expert serves 5 or 9 of the 14 other ranks as often as 7 (a ``balance`` plan packed for
the even split, MaxVio 0.0005 on count-sampled OLMoE loads, runs at 0.14 to 0.27 there).

The draw is fixed by the map: which GPU holds which contents decides which ranks draw for which
expert and how far each stream has run. `StaticStreams` replays it layer by layer (each rank's
stream state carried from one layer to the next, the model's dense rows first, as the engine's
map has them), and `polish_static_positions` uses it: layer by layer, in the order the streams
run, it tries seeded permutations of the layer's GPUs (within each node, so that the node of
every copy stays the same) and keeps the one whose replayed shares give the smallest largest
GPU load on the calibration loads. The contents of every GPU are unchanged (and so is every
token's set of GPUs up to their labels); only the draw they get changes.
"""

from __future__ import annotations

import math
import random
import time

import numpy as np

from moeopt.dispatch import STATIC_SEED, _fair_choices, _uniform_home_share, near_copies
from moeopt.evaluate import maxvio

__all__ = [
    "STATIC_WORK",
    "StaticStreams",
    "polish_static_positions",
    "repack_singles",
    "static_layer_share",
    "static_replay_fits",
    "static_trials",
]

#: the polish's work per layer in rank x expert draws (a trial replays about ``G x E`` of them):
#: 64 trials at 16 GPUs x 64 experts (a fraction of a second per layer), 1 at 256 x 256
STATIC_WORK = 65_536
#: most permutations tried per layer
STATIC_TRIALS = 64
#: the largest ``G^2 x E`` whose draw is replayed for a polish: a layer's replay runs every rank's own
#: deal (about ``G`` ranks x ``E`` experts x ``G`` picks); 0.06 s a layer at 64 GPUs x 256 experts
#: (1 M), seconds at 256 x 256 (17 M), where plans keep their positions
STATIC_REPLAY_LIMIT = 4_200_000


def static_replay_fits(gpus: int, experts: int) -> bool:
    """Whether a layer of ``gpus`` x ``experts`` is small enough to replay SGLang's draw for a
    polish (`STATIC_REPLAY_LIMIT`)."""
    return gpus * gpus * experts <= STATIC_REPLAY_LIMIT


def static_trials(gpus: int, experts: int) -> int:
    """Permutations `polish_static_positions` tries per layer for ``gpus`` GPUs and ``experts``
    experts (`STATIC_WORK` over ``G x E``, between 1 and `STATIC_TRIALS`): work, not
    the clock, fixes the plan."""
    return int(max(1, min(STATIC_TRIALS, STATIC_WORK // max(gpus * experts, 1))))


class StaticStreams:
    """Every rank's seeded stream of SGLang's static rule, replayed one layer at a time.

    Parameters
    ----------
    gpus, width, experts
        G, W (slots per GPU) and E.
    gpus_per_node
        SGLang's node size (None or >= G: one node, no node preference).
    dense_layers
        Dense rows of the trivial layout ``p mod E`` that come first in the engine's map (they
        consume draws before the MoE layers do).
    seed
        The engine's seed (`moeopt.dispatch.STATIC_SEED`).
    """

    def __init__(
        self,
        gpus: int,
        width: int,
        experts: int,
        gpus_per_node: int | None = None,
        dense_layers: int = 0,
        seed: int = STATIC_SEED,
    ) -> None:
        self.G, self.W, self.E = gpus, width, experts
        self.node = None if gpus_per_node is None or gpus_per_node >= gpus else int(gpus_per_node)
        self.streams = [random.Random(seed) for _ in range(gpus)]
        trivial = np.arange(gpus * width) % experts
        for _ in range(dense_layers):
            self.advance(trivial)

    def table(self, row: np.ndarray, commit: bool = False) -> np.ndarray:
        """int ``[G, E]``: the physical slot each rank sends each expert's tokens to, for one layer's
        physical-to-logical ``row [G * W]`` (-1 empty), from the streams as they stand; with
        ``commit`` the streams advance past the layer, else they are left as they were."""
        G, W, E = self.G, self.W, self.E
        row = np.asarray(row, dtype=np.int64)
        out = np.full((G, E), -1, dtype=np.int64)
        order = np.argsort(row, kind="stable")
        valid = row[order] >= 0
        order, ids = order[valid], row[order][valid]
        start = np.searchsorted(ids, np.arange(E + 1))
        streams = self.streams if commit else [_copy(s) for s in self.streams]
        for e in range(E):
            cand = order[start[e] : start[e + 1]]  # ascending physical ids
            if len(cand) == 0:
                continue
            if len(cand) == 1:
                out[:, e] = cand[0]
                continue
            chosen = near_copies(cand, G, W, self.node)
            left = np.nonzero(chosen < 0)[0]
            items = cand.tolist()
            for i, r in enumerate(left):  # each rank its own deal, from its own stream
                chosen[r] = _fair_choices(items, len(left), streams[r])[i]
            out[:, e] = chosen
        return out

    def advance(self, row: np.ndarray) -> None:
        """Run every stream past one layer's ``row [G * W]``."""
        self.table(row, commit=True)


def _copy(stream: random.Random) -> random.Random:
    out = random.Random()
    out.setstate(stream.getstate())
    return out


def static_layer_share(table: np.ndarray, width: int, experts: int) -> np.ndarray:
    """float ``[E, G]``: the share of each expert's tokens each GPU serves under one layer's
    per-rank ``table [G, E]`` (physical slots), token homes uniform over the G ranks."""
    return np.asarray(_uniform_home_share(table[:, None, :] // width, experts)[0])


def _maxvio(loads: np.ndarray) -> float:
    return float(maxvio(loads))


def polish_static_positions(
    slots: np.ndarray,
    load: np.ndarray,
    *,
    gpus_per_node: int | None = None,
    dense_layers: int = 0,
    trials: int = 64,
    seed: int = 0,
    deadline: float | None = None,
    repack: bool = False,
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray, dict]:
    """Permute each layer's GPUs (within nodes) for SGLang's static draw; with ``repack``, also
    re-deal each layer's single-copy experts for the draw's loads (`repack_singles`).

    Parameters
    ----------
    slots
        int ``[L, G, W]``: the plan (-1 empty).
    load
        float ``[L, E]``: the calibration loads the largest GPU load is measured on.
    gpus_per_node, dense_layers
        As `StaticStreams`.
    trials
        Seeded permutations tried per layer (the identity is always one).
    seed
        Seed of the permutations.
    deadline
        ``time.perf_counter()`` value: when it passes before the last layer, the plan given is
        returned as it was, with only ``static_polish_cut`` (the layer reached) in the statistics.
    repack, groups
        After each permutation, re-deal the single-copy experts (`repack_singles`, within router
        ``groups [E]`` when given) for the permutation's draw, and judge it by the result: GPU
        contents change, no draw does.

    Returns
    -------
    slots, stats
        The permuted plan (same contents per GPU, relabelled) and per layer the MaxVio under the
        replayed draw of the plan given and of the plan returned (``static_maxvio_before`` /
        ``_after``).
        Layer by layer each permutation is judged after the layers before it as chosen (a layer's
        draw depends on every stream's past), so a later layer can lose what an earlier one won:
        when the mean over layers would rise, the plan given is returned. With ``trials <= 1``,
        the plan as it was and no statistics.
    """
    slots = np.array(slots, dtype=np.int64, copy=True)
    if trials <= 1 and not repack:  # the identity alone: nothing to choose (nor to replay)
        return slots, {}
    L, G, W = slots.shape
    E = load.shape[1]
    loads = np.asarray(load, dtype=np.float64)
    given = StaticStreams(G, W, E, gpus_per_node, dense_layers)  # the plan as given, for its figures
    streams = StaticStreams(G, W, E, gpus_per_node, dense_layers)  # the plan as polished
    node = streams.node or G
    rng = np.random.default_rng([seed, 42])
    out = slots.copy()
    before: list[float] = []
    after: list[float] = []
    for l in range(L):
        if deadline is not None and time.perf_counter() >= deadline:
            # a layer's draw depends on every layer before it: a plan polished part way has no known
            # figures for the rest (and could lose there what it won): the plan given, as it was
            return slots.copy(), {"static_polish_cut": l}
        before.append(_maxvio(loads[l] @ static_layer_share(given.table(slots[l].reshape(-1), commit=True), W, E)))
        multi = np.bincount(slots[l][slots[l] >= 0], minlength=E) > 1
        best, best_v = slots[l], math.inf
        for t in range(max(trials, 1)):
            if t and deadline is not None and time.perf_counter() >= deadline:
                break
            perm = np.arange(G) if t == 0 else np.concatenate([b + rng.permutation(node) for b in range(0, G, node)])
            cand = slots[l][perm]
            table = streams.table(cand.reshape(-1))
            if repack:
                # the single-copy experts change no draw: the table stands, their slots renamed
                pre = (loads[l] * multi) @ static_layer_share(table, W, E)
                cand = repack_singles(cand, loads[l], pre, groups=groups)
                flat = cand.reshape(-1)
                single = np.nonzero((flat >= 0) & ~multi[np.maximum(flat, 0)])[0]
                table[:, flat[single]] = single[None, :]  # every rank sends a single-copy expert to its one slot
            v = _maxvio(loads[l] @ static_layer_share(table, W, E))
            if v < best_v - 1e-12:
                best, best_v = cand, v
        out[l] = best
        after.append(best_v)
        streams.advance(best.reshape(-1))
    if float(np.mean(after)) > float(np.mean(before)):  # a later layer's new draw cost more than was won
        out, after = slots.copy(), list(before)
    return out, {"static_maxvio_before": before, "static_maxvio_after": after}


def repack_singles(
    slots: np.ndarray,
    load: np.ndarray,
    pre: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    iterations: int = 2_000,
) -> np.ndarray:
    """One layer's single-copy experts re-dealt over the slots they hold, for the smallest largest
    GPU load given the load ``pre [G]`` the replicated experts' copies already put on each GPU.

    The static draw concerns only experts with several copies: a single-copy expert's tokens all
    go to its one slot, and where it sits changes no rank's stream. So with the copies of the
    replicated experts left in their slots (their draw as it was), the single-copy experts
    (and the empty slots) can trade places freely. A descent: the most loaded GPU's single
    (or empty) slot swaps with the one elsewhere that lowers the larger of the two GPUs' loads
    most, until no swap lowers it (at most ``iterations`` swaps). With ``groups [E]`` (router
    groups) a swap stays inside one group, so every GPU keeps its count of each group's experts.

    Parameters
    ----------
    slots
        int ``[G, W]``: the layer (-1 empty).
    load
        float ``[E]``: the expert loads.
    pre
        float ``[G]``: each GPU's load from the replicated experts (their realized shares).

    Returns
    -------
    int ``[G, W]``: the layer with its single-copy experts moved.
    """
    slots = np.array(slots, dtype=np.int64, copy=True)
    G, W = slots.shape
    E = len(load)
    held = slots[slots >= 0]
    count = np.bincount(held, minlength=E)
    free = (slots < 0) | (count[np.maximum(slots, 0)] == 1)  # single-copy or empty: movable
    pos = np.argwhere(free)  # [m, 2]: (gpu, slot)
    item = slots[pos[:, 0], pos[:, 1]]
    a = np.where(item >= 0, np.asarray(load, dtype=np.float64)[np.maximum(item, 0)], 0.0)
    gid = np.full(len(item), -1) if groups is None else np.where(item >= 0, groups[np.maximum(item, 0)], -1)
    gpu = pos[:, 0]
    total = pre + np.bincount(gpu, weights=a, minlength=G)
    for _ in range(iterations):
        h = int(np.argmax(total))
        mine = np.nonzero(gpu == h)[0]
        if not len(mine):
            break
        other = np.nonzero(gpu != h)[0]
        if not len(other):
            break
        d = a[mine][:, None] - a[other][None, :]  # load leaving h for each pair
        new_h = total[h] - d
        new_g = total[gpu[other]][None, :] + d
        worse = np.maximum(new_h, new_g)
        same = gid[mine][:, None] == gid[other][None, :]
        worse = np.where(same & (d > 0), worse, np.inf)
        i, j = np.unravel_index(int(np.argmin(worse)), worse.shape)
        if not worse[i, j] < total[h] - 1e-12:
            break
        p, q = mine[i], other[j]
        total[h] -= d[i, j]
        total[gpu[q]] += d[i, j]
        item[p], item[q] = item[q], item[p]
        a[p], a[q] = a[q], a[p]
        gid[p], gid[q] = gid[q], gid[p]
    slots[pos[:, 0], pos[:, 1]] = item
    return slots
