"""Synthetic task-structured routing traces (seeded).

Each layer has a hidden structure drawn from ``structure_seed``: a few *generic* experts hot
for every family, the rest split into communities of co-activated experts, Zipf-skewed
popularity, and per-family preferences over communities. Tokens are then sampled from
``seed``: a family, a community from that family's preference, and k distinct experts by
Gumbel top-k on the boosted popularities; some experts burst in some timesteps. Calibration
and evaluation splits share the structure and differ in ``seed``; a single-family
(out-of-distribution) workload puts every token in one family.

``drift`` makes the workload a *stream* whose load moves over the steps (SPEC section 12):

* ``mix``: the family shares move from the start mix (``family_share``, default uniform) to
  ``drift_share`` at the last step, or, without it, through mixes concentrated on each family
  in turn (``drift_focus`` of the tokens on the focused family); each token's family is drawn
  from its own step's shares ([`family_shares`][moeopt.synth.family_shares]).
* ``popularity``: each layer's expert popularity performs a multiplicative random walk over the
  steps (log-scale step ``drift_rate``, drawn from ``structure_seed``).
* ``switch``: from ``switch_step`` on, tokens follow the hidden structure of another structure
  seed (``switch_seed``, default ``structure_seed + 1``): popularity, communities and family
  preferences change at once.

``drift: none`` (the default) draws exactly the traces of earlier releases.

``expert_groups`` with ``topk_group`` routes *group-limited*, as DeepSeek-V3 / R1's router does
(``n_group = 8``, ``topk_group = 4``): the experts are ``expert_groups`` contiguous groups, each
token scores every group by the sum of its two best expert scores, keeps the ``topk_group``
best groups and picks its k experts inside them ([`group_limited_topk`][moeopt.synth.group_limited_topk]), so a token's
experts lie in at most ``topk_group`` groups. [`trace_from_counts`][moeopt.synth.trace_from_counts] takes the same
option.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from moeopt.schema import check_synthetic, group_routing_problem
from moeopt.trace import Stats, Trace

DEFAULT_FAMILIES = ("code", "query", "math", "reasoning")
#: the kinds of drift (``SynthSpec.drift``)
DRIFT_KINDS = ("none", "mix", "popularity", "switch")
#: ``drift: mix`` without ``drift_share``: the focused family's share at each waypoint
DEFAULT_DRIFT_FOCUS = 0.85
#: ``drift: popularity``: the default log-scale step of the random walk
DEFAULT_DRIFT_RATE = 0.1


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
    drift: str = "none"  # none | mix | popularity | switch (see the module docstring)
    drift_share: tuple[float, ...] | None = None  # mix: the family shares at the last step
    drift_focus: float | None = None  # mix without drift_share: focused family's share (default 0.85)
    drift_rate: float | None = None  # popularity: log-scale step of the random walk (default 0.1)
    switch_step: int | None = None  # switch: first step of the new structure (default steps // 2)
    switch_seed: int | None = None  # switch: the new structure's seed (default structure_seed + 1)
    expert_groups: int | None = None  # the router's groups of E / expert_groups contiguous experts
    topk_group: int | None = None  # with expert_groups: each token's experts lie in its best topk_group groups

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


def _start_share(spec: SynthSpec) -> np.ndarray:
    """The family shares without drift (``only_family``, ``family_share`` or uniform), ``[F]``."""
    F = len(spec.families)
    if spec.only_family is not None:
        share = np.zeros(F)
        share[spec.families.index(spec.only_family)] = 1.0
    elif spec.family_share is not None:
        share = np.asarray(spec.family_share, dtype=np.float64)
        share = share / share.sum()
    else:
        share = np.full(F, 1.0 / F)
    return share


def family_shares(spec: SynthSpec) -> np.ndarray:
    """The family shares of every step, float ``[T, F]`` (rows sum to 1).

    Without ``drift: mix`` every row is the start mix (``only_family``, ``family_share`` or
    uniform). With it the shares move piecewise linearly over the steps through waypoints
    spaced evenly from step 0 to step ``T - 1``: the start mix, then ``drift_share`` (two
    waypoints: a linear drift), or, without ``drift_share``, a mix concentrated on each family
    in turn (``drift_focus`` on the family, the rest spread evenly over the others), the last
    family's at the last step.

    Parameters
    ----------
    spec
        The synthetic workload.

    Returns
    -------
    numpy.ndarray
        ``[steps, families]`` shares.
    """
    T, F = spec.steps, len(spec.families)
    start = _start_share(spec)
    if spec.drift != "mix":
        return np.tile(start, (T, 1))
    if spec.drift_share is not None:
        end = np.asarray(spec.drift_share, dtype=np.float64)
        waypoints = np.stack([start, end / end.sum()])
    else:
        focus = DEFAULT_DRIFT_FOCUS if spec.drift_focus is None else spec.drift_focus
        rest = (1.0 - focus) / (F - 1) if F > 1 else 0.0
        concentrated = np.where(np.eye(F, dtype=bool), focus if F > 1 else 1.0, rest)
        waypoints = np.vstack([start[None], concentrated])
    at = np.linspace(0.0, max(T - 1, 1), len(waypoints))
    t = np.arange(T, dtype=np.float64)
    shares = np.stack([np.interp(t, at, waypoints[:, f]) for f in range(F)], axis=1)
    return np.asarray(shares / shares.sum(axis=1, keepdims=True))


def _popularity_walk(spec: SynthSpec, l: int) -> np.ndarray:
    """``drift: popularity``: the log-popularity offsets of layer ``l`` per step, ``[T, E]`` (a
    Gaussian random walk of step ``drift_rate`` from 0 at step 0; its own stream of
    ``structure_seed``, so the rest of the structure is unchanged)."""
    rate = DEFAULT_DRIFT_RATE if spec.drift_rate is None else spec.drift_rate
    rng = np.random.default_rng([spec.structure_seed, 3, l])
    steps = rng.normal(0.0, rate, size=(spec.steps - 1, spec.experts))
    return np.vstack([np.zeros((1, spec.experts)), np.cumsum(steps, axis=0)])


def switch_point(spec: SynthSpec) -> tuple[int, int]:
    """``drift: switch``: the first step of the new structure and its structure seed (the
    defaults filled in: ``steps // 2`` and ``structure_seed + 1``)."""
    step = spec.steps // 2 if spec.switch_step is None else spec.switch_step
    seed = spec.structure_seed + 1 if spec.switch_seed is None else spec.switch_seed
    return step, seed


def synthesize(spec: SynthSpec) -> Trace:
    """Draw a trace from ``spec`` (vectorized over tokens: Gumbel top-k per layer).

    With ``drift`` the parameters of each step differ (module docstring); each token reads its
    own step's by indexing, so no loop runs over tokens. ``drift: none`` draws exactly the
    traces of earlier releases.
    """
    spec.validate()
    structures = [_structure(spec, np.random.default_rng(spec.structure_seed))]
    rng = np.random.default_rng([spec.structure_seed, spec.seed])
    N, E, k, F, T = spec.tokens, spec.experts, spec.top_k, len(spec.families), spec.steps
    if spec.drift == "mix":
        # each token's family from its own step's shares (inverse CDF, vectorized)
        step = np.sort(rng.integers(0, T, size=N)).astype(np.int32)
        cum = family_shares(spec).cumsum(axis=1)
        cum[:, -1] = 1.0  # exact: u < 1 never passes the last family, a zero share is never drawn
        family = (rng.random(N)[:, None] >= cum[step]).sum(axis=1).astype(np.int32)
    else:
        family = rng.choice(F, size=N, p=_start_share(spec)).astype(np.int32)
        step = np.sort(rng.integers(0, T, size=N)).astype(np.int32)
    # which hidden structure each token follows (index into `structures`)
    which = np.zeros(N, dtype=np.intp)
    if spec.drift == "switch":
        switch_step, switch_seed = switch_point(spec)
        other = replace(spec, structure_seed=switch_seed)
        structures.append(_structure(other, np.random.default_rng(switch_seed)))
        which = (step >= switch_step).astype(np.intp)
    topk = np.empty((N, spec.layers, k), dtype=np.int16)
    for l in range(spec.layers):
        layer = [st[l] for st in structures]
        s = layer[0]
        C = s.preference.shape[1]
        cum = np.stack([x.preference.cumsum(axis=1) for x in layer])  # [S, F, C]
        comm = (rng.random(N)[:, None] > cum[which, family]).sum(axis=1).clip(max=C - 1)
        if l > 0 and spec.layer_dependency > 0:
            # the token follows its previous top-1 expert's community into this layer's linked one
            prev_community = np.stack([st[l - 1].community for st in structures])  # [S, F, E]
            link = np.stack([x.link for x in layer])  # [S, C]
            prev_comm = prev_community[which, family, topk[:, l - 1, 0]]
            follow = (rng.random(N) < spec.layer_dependency) & (prev_comm >= 0)
            comm = np.where(follow, link[which, np.maximum(prev_comm, 0) % C], comm)
        member = np.stack([x.community for x in layer])[:, :, None, :] == np.arange(C)[None, None, :, None]
        logboost = np.where(member, np.log(spec.community_boost), 0.0)  # [S, F, C, E]
        if spec.drift == "popularity":
            logbase = (np.log(s.base)[None, :] + _popularity_walk(spec, l))[step]  # [N, E]
        elif spec.drift == "switch":
            logbase = np.log(np.stack([x.base for x in layer]))[which]  # [N, E]
        else:
            logbase = np.log(s.base)[None, :]
        logbursts = np.log(np.stack([x.bursts for x in layer]))  # [S, T, E]
        logw = logbase + logboost[which, family, comm] + logbursts[which, step]
        if l > 0 and spec.layer_dependency > 0 and spec.successors > 0:
            # expert-level dependency: a following token also favours its previous top-1
            # expert's successors (inside the linked community) by another community_boost
            successor = np.stack([x.successor for x in layer])  # [S, F, E_prev, s]
            succ = successor[which, family, topk[:, l - 1, 0]]  # [N, s]
            extra = np.zeros((N, E))
            np.put_along_axis(extra, succ, np.log(spec.community_boost), axis=1)
            logw = logw + np.where(follow[:, None], extra, 0.0)
        scores = logw + rng.gumbel(size=(N, E))
        topk[:, l, :] = group_limited_topk(scores, k, spec.expert_groups, spec.topk_group)
    return Trace(
        topk=topk,
        family=family,
        step=step,
        family_names=tuple(spec.families),
        num_experts=E,
    )


def group_limited_topk(
    scores: np.ndarray, k: int, groups: int | None = None, topk_group: int | None = None
) -> np.ndarray:
    """Each row's k best experts by ``scores [N, E]``, best first; group-limited as DeepSeek-V3's
    router when ``groups`` and ``topk_group`` are given.

    Group-limited routing (DeepSeek-V3 ``n_group``, ``topk_group``): the experts form ``groups``
    contiguous groups of ``E / groups``; a group's score is the sum of its two best expert
    scores (its best one in groups of one expert); the ``topk_group`` best groups are kept and
    the k experts picked among theirs, so a row's experts lie in at most ``topk_group`` groups.

    Parameters
    ----------
    scores
        float ``[N, E]``: the router's scores (here log weights plus Gumbel noise).
    k
        Experts per row.
    groups, topk_group
        The router's groups and the groups a row may use (None: no limit).

    Returns
    -------
    numpy.ndarray
        int ``[N, k]``: expert ids in descending score (position 0 is the top-1 expert).
    """
    N, E = scores.shape
    if groups is not None and topk_group is not None and topk_group < groups:
        per = scores.reshape(N, groups, E // groups)
        best = -np.sort(-per, axis=2)[:, :, : min(2, E // groups)].sum(axis=2)  # [N, groups]
        keep = np.argpartition(-best, topk_group - 1, axis=1)[:, :topk_group]
        allowed = np.zeros((N, groups), dtype=bool)
        np.put_along_axis(allowed, keep, True, axis=1)
        scores = np.where(np.repeat(allowed, E // groups, axis=1), scores, -np.inf)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    # ordered by router score, as engines record them: position 0 is the top-1 expert
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.asarray(np.take_along_axis(part, order, axis=1))


def trace_from_counts(
    stats: Stats,
    *,
    tokens: int = 8192,
    steps: int = 16,
    family_mix: float | None = None,
    seed: int = 0,
    expert_groups: int | None = None,
    topk_group: int | None = None,
) -> Trace:
    """A token trace whose per-family expert usage follows count statistics (real data).

    Each token of family f picks k distinct experts at each layer by Gumbel top-k on
    ``log u[f, l, :]`` (Plackett-Luce sampling, which keeps the hottest experts hottest).
    Experts are drawn independently across tokens, so coactivation carries no structure
    beyond the marginals: label results on such traces as *count-sampled*.

    ``family_mix``: None keeps the families' shares in every step; a positive number draws
    each step's family mix from a Dirichlet with that concentration (bursty temporal load).

    ``expert_groups`` and ``topk_group``: route group-limited, as DeepSeek-V3's router does
    ([`group_limited_topk`][moeopt.synth.group_limited_topk]: the token's best ``topk_group`` groups by their two best
    perturbed scores, then its k experts inside them); coactivation then carries the groups.
    The marginals stay close to the counts' but not equal to them (a group's experts are
    picked more often together). Without them, the draws of earlier releases.
    """
    problem = group_routing_problem(stats.experts, stats.top_k, expert_groups, topk_group)
    if problem is not None:
        raise ValueError(problem)
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
        if expert_groups is None or topk_group is None:
            topk[:, l, :] = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        else:
            topk[:, l, :] = group_limited_topk(scores, k, expert_groups, topk_group)
    return Trace(topk=topk, family=family, step=step, family_names=stats.family_names, num_experts=E)
