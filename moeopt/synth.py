"""Synthetic task-structured routing traces (seeded).

Each layer has a hidden structure drawn from ``structure_seed``: a few *generic* experts hot
for every family, the rest split into communities of co-activated experts, Zipf-skewed
popularity, and per-family preferences over communities. Tokens are then sampled from
``seed``: a family, a community from that family's preference, and k distinct experts by
Gumbel top-k on the boosted popularities; some experts burst in some timesteps. Calibration
and evaluation splits share the structure and differ in ``seed``; a single-family
(out-of-distribution) workload puts every token in one family.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from moeopt.schema import check_synthetic
from moeopt.trace import Stats, Trace

DEFAULT_FAMILIES = ("code", "query", "math", "reasoning")


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of a synthetic workload (all documented in the README)."""

    layers: int = 2
    experts: int = 16
    top_k: int = 2
    tokens: int = 4096
    steps: int = 16
    families: tuple[str, ...] = DEFAULT_FAMILIES
    family_share: tuple[float, ...] | None = None  # default uniform
    only_family: str | None = None  # single-family (OOD) workload
    communities: int | None = None  # default max(2, E // (2 k))
    generic: int | None = None  # generic experts per layer; default max(1, E // 16)
    generic_boost: float = 4.0
    community_boost: float = 30.0
    family_focus: float = 0.3  # Dirichlet concentration of family community preferences
    family_communities: str = "shared"  # "per_family": each family partitions the experts anew
    skew: float = 0.8  # Zipf exponent of expert popularity
    burst: float = 2.0  # multiplicative boost of bursting experts
    burst_fraction: float = 0.1  # share of experts bursting in a given step
    layer_dependency: float = 0.0  # chance a token's community follows its previous top-1's
    successors: int = 0  # > 0: a following token also favours its previous top-1's successor experts
    structure_seed: int = 0
    seed: int = 0

    @classmethod
    def from_mapping(
        cls, data: dict, *, source: str | None = None, field_prefix: str = "workload.synthetic"
    ) -> SynthSpec:
        checked = check_synthetic(dict(data), source, field_prefix)
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in checked.model_dump().items()}
        return cls(**values)

    def validate(self, source: str | None = None, prefix: str = "workload.synthetic") -> None:
        """Check every field (types, ranges, sizes); ``prefix="--"`` names CLI options."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        # programmatic specs may hold numpy scalars: the strict schema takes Python numbers
        values = {k: v.item() if isinstance(v, np.generic) else v for k, v in values.items()}
        check_synthetic(values, source, prefix, option=prefix == "--")


@dataclass
class _LayerStructure:
    base: np.ndarray  # [E] popularity
    community: np.ndarray  # [F, E] community id per family, -1 for generic
    preference: np.ndarray  # [F, C] family -> community probabilities
    bursts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [T, E] multipliers
    link: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [C] prev -> this community
    successor: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [F, E_prev, s] this layer's


def _structure(spec: SynthSpec, rng: np.random.Generator) -> list[_LayerStructure]:
    E, F, T = spec.experts, len(spec.families), spec.steps
    C = spec.communities or max(2, E // (2 * spec.top_k))
    n_gen = spec.generic if spec.generic is not None else max(1, E // 16)
    out = []
    for l in range(spec.layers):
        perm = rng.permutation(E)
        community = np.full(E, -1)
        rest = perm[n_gen:]
        community[rest] = np.arange(len(rest)) % C
        base = (1.0 + rng.permutation(E)) ** -spec.skew
        base[perm[:n_gen]] = base.max() * spec.generic_boost
        preference = rng.dirichlet(np.full(C, spec.family_focus), size=F)
        bursts = np.where(rng.random((T, E)) < spec.burst_fraction, spec.burst, 1.0)
        community = np.tile(community, (F, 1))
        if spec.family_communities == "per_family":
            # an expert's co-activation partners depend on the task: each family after the
            # first draws its own partition of the non-generic experts
            for f in range(1, F):
                community[f, rng.permutation(rest)] = np.arange(len(rest)) % C
        # community c of the previous layer leads to community link[c] (its own stream, so the
        # rest of the structure does not depend on it)
        link = np.random.default_rng([spec.structure_seed, 1, l]).permutation(C)
        out.append(_LayerStructure(base, community, preference, bursts, link))
    if spec.successors > 0:
        for l in range(1, spec.layers):
            prev = out[l - 1].community
            if spec.family_communities == "shared":
                # one transition structure for every family, as the communities
                prev = prev[:1]
            succ = _successors(prev, out[l], spec.successors, spec.structure_seed, l)
            out[l].successor = np.broadcast_to(succ, (len(spec.families), *succ.shape[1:]))
    return out


def _successors(prev_community: np.ndarray, s: _LayerStructure, count: int, structure_seed: int, l: int) -> np.ndarray:
    """int ``[F, E, count]``: per family, the layer-l successors of each layer l - 1 expert
    (F = 1 with shared communities: one structure for every family).

    Expert e of community c at layer l - 1 leads to ``count`` distinct experts of the linked
    community ``link[c]`` at layer l (all of them when it has fewer; generic experts lead to
    the generic ones). Drawn from its own stream, so the rest of the structure is the same
    with or without successors.
    """
    rng = np.random.default_rng([structure_seed, 2, l])
    F, E = prev_community.shape
    C = len(s.link)
    # the community each (family, previous expert) leads to; -1 (generic) leads to the generic experts
    target = np.where(prev_community >= 0, s.link[np.maximum(prev_community, 0) % C], -1)  # [F, E]
    member = s.community[:F, None, :] == target[:, :, None]  # [F, E_prev, E]
    empty = ~member.any(axis=2)
    member[empty] = True  # no such experts: any expert
    # a random order of the members first (random keys, non-members last), then the first `count`
    keys = np.where(member, rng.random((F, E, s.community.shape[1])), 2.0)
    order = np.argsort(keys, axis=2, kind="stable")
    n = member.sum(axis=2)  # [F, E_prev]
    # fewer members than count: repeat them cyclically (boosted once)
    idx = np.arange(count)[None, None, :] % n[:, :, None]
    out = np.take_along_axis(order, idx, axis=2).astype(np.int64)
    return out


def synthesize(spec: SynthSpec) -> Trace:
    """Draw a trace from ``spec`` (vectorized over tokens: Gumbel top-k per layer)."""
    spec.validate()
    structure = _structure(spec, np.random.default_rng(spec.structure_seed))
    rng = np.random.default_rng([spec.structure_seed, spec.seed])
    N, E, k, F, T = spec.tokens, spec.experts, spec.top_k, len(spec.families), spec.steps
    if spec.only_family is not None:
        share = np.zeros(F)
        share[spec.families.index(spec.only_family)] = 1.0
    elif spec.family_share is not None:
        share = np.asarray(spec.family_share, dtype=np.float64)
        share = share / share.sum()
    else:
        share = np.full(F, 1.0 / F)
    family = rng.choice(F, size=N, p=share).astype(np.int32)
    step = np.sort(rng.integers(0, T, size=N)).astype(np.int32)
    topk = np.empty((N, spec.layers, k), dtype=np.int16)
    for l, s in enumerate(structure):
        C = s.preference.shape[1]
        cum = s.preference.cumsum(axis=1)
        comm = (rng.random(N)[:, None] > cum[family]).sum(axis=1).clip(max=C - 1)
        if l > 0 and spec.layer_dependency > 0:
            # the token follows its previous top-1 expert's community into this layer's linked one
            prev_comm = structure[l - 1].community[family, topk[:, l - 1, 0]]
            follow = (rng.random(N) < spec.layer_dependency) & (prev_comm >= 0)
            comm = np.where(follow, s.link[np.maximum(prev_comm, 0) % C], comm)
        member = s.community[:, None, :] == np.arange(C)[None, :, None]  # [F, C, E]
        logboost = np.where(member, np.log(spec.community_boost), 0.0)
        logw = np.log(s.base)[None, :] + logboost[family, comm] + np.log(s.bursts)[step]
        if l > 0 and spec.layer_dependency > 0 and spec.successors > 0:
            # expert-level dependency: a following token also favours its previous top-1
            # expert's successors (inside the linked community) by another community_boost
            succ = s.successor[family, topk[:, l - 1, 0]]  # [N, s]
            extra = np.zeros((N, E))
            np.put_along_axis(extra, succ, np.log(spec.community_boost), axis=1)
            logw = logw + np.where(follow[:, None], extra, 0.0)
        scores = logw + rng.gumbel(size=(N, E))
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        # ordered by router score, as engines record them: position 0 is the top-1 expert
        order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
        topk[:, l, :] = np.take_along_axis(part, order, axis=1)
    return Trace(
        topk=topk,
        family=family,
        step=step,
        family_names=tuple(spec.families),
        num_experts=E,
    )


def trace_from_counts(
    stats: Stats,
    *,
    tokens: int = 8192,
    steps: int = 16,
    family_mix: float | None = None,
    seed: int = 0,
) -> Trace:
    """A token trace whose per-family expert usage follows count statistics (real data).

    Each token of family f picks k distinct experts at each layer by Gumbel top-k on
    ``log u[f, l, :]`` (Plackett-Luce sampling, which keeps the hottest experts hottest).
    Experts are drawn independently across tokens, so coactivation carries no structure
    beyond the marginals: label results on such traces as *count-sampled*.

    ``family_mix``: None keeps the families' shares in every step; a positive number draws
    each step's family mix from a Dirichlet with that concentration (bursty temporal load).
    """
    rng = np.random.default_rng(seed)
    F, L, E, k = stats.families, stats.layers, stats.experts, stats.top_k
    step = np.sort(rng.integers(0, steps, size=tokens)).astype(np.int32)
    if family_mix is None:
        family = rng.choice(F, size=tokens, p=stats.family_share).astype(np.int32)
    else:
        mix = rng.dirichlet(np.full(F, family_mix), size=steps)  # [T, F]
        cum = mix.cumsum(axis=1)
        family = (rng.random(tokens)[:, None] > cum[step]).sum(axis=1).clip(max=F - 1).astype(np.int32)
    logu = np.log(np.maximum(stats.usage, 1e-12))  # [F, L, E]
    topk = np.empty((tokens, L, k), dtype=np.int16 if E < 2**15 else np.int32)
    for l in range(L):
        scores = logu[family, l] + rng.gumbel(size=(tokens, E))
        topk[:, l, :] = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return Trace(topk=topk, family=family, step=step, family_names=stats.family_names, num_experts=E)
