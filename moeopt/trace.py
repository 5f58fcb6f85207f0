"""Routing traces and the statistics every method reads (SPEC section 1).

A [`Trace`][moeopt.trace.Trace] holds, per token, its family, its timestep and its top-k experts at every
layer. [`Stats`][moeopt.trace.Stats] holds what methods consume: per-family usage ``u[f, l, e]``, family
shares ``pi[f]``, coactivation ``C[f, l, e, e']`` and per-timestep counts ``n[l, t, e]``.
Stats can also come from count-only sources (serving-engine recorders), in which case
coactivation is absent and only count-based methods apply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import scipy.sparse as sp

DEFAULT_FAMILY = "all"
#: ε of the log-lift preference score (SPEC 3.1 and 4.1).
LIFT_EPS = 1e-6


def log_lift(usage: np.ndarray, global_usage: np.ndarray, eps: float = LIFT_EPS) -> np.ndarray:
    """The log-lift ``s[f, e] = log((u[f, e] + eps) / (ubar[e] + eps))`` (any leading axes of
    ``usage`` beyond the family axis must match ``global_usage``): how much more family f
    uses expert e than the workload does. TACG's preferences and GESR's deviation read it."""
    return np.log((usage + eps) / (global_usage[None] + eps))


@dataclass(frozen=True, eq=False)
class Trace:
    """A token-level routing trace.

    Attributes
    ----------
    topk
        int ``[tokens, L, k]``: expert ids chosen at each layer.
    family
        int ``[tokens]``: task family id, indexing ``family_names``.
    step
        int ``[tokens]``: timestep (batch) id, renumbered to ``0..T-1``.
    family_names
        ``[F]`` names of the families.
    num_experts
        E, the number of routed experts per layer.
    weights
        optional float ``[tokens, L, k]`` gate weights.
    home
        optional int ``[tokens]`` GPU each token lives on (else drawn uniformly).
    """

    topk: np.ndarray
    family: np.ndarray
    step: np.ndarray
    family_names: tuple[str, ...]
    num_experts: int
    weights: np.ndarray | None = None
    home: np.ndarray | None = None

    @property
    def tokens(self) -> int:
        return int(self.topk.shape[0])

    @property
    def layers(self) -> int:
        return int(self.topk.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[2])

    @property
    def steps(self) -> int:
        return int(self.step.max()) + 1 if self.tokens else 0

    @cached_property
    def step_counts(self) -> np.ndarray:
        """n[l, t, e]: tokens routed to expert e at layer l in timestep t, ``[L, T, E]`` (one
        bincount; the same attribute as `Stats.step_counts`)."""
        L, T, E = self.layers, self.steps, self.num_experts
        key = (np.arange(L)[None, :, None] * T + self.step[:, None, None]) * E + self.topk.astype(np.int64)
        return np.asarray(np.bincount(key.ravel(), minlength=L * T * E).reshape(L, T, E), dtype=np.float64)

    @property
    def expert_load(self) -> np.ndarray:
        """Token-slots routed to each expert, ``[L, E]`` (as [`Stats.expert_load`][moeopt.trace.Stats.expert_load])."""
        return np.asarray(self.step_counts.sum(axis=1))

    def subset(self, mask: np.ndarray) -> Trace:
        """The tokens selected by a boolean mask (steps renumbered, families kept)."""
        sub = self.take(mask)
        _, step = np.unique(sub.step, return_inverse=True)
        return replace(sub, step=step.astype(np.int32))

    def take(self, index: np.ndarray, step_offset: int = 0) -> Trace:
        """The tokens at ``index`` (in that order), their steps less ``step_offset`` (steps are
        not renumbered, so steps without tokens keep their place; families kept)."""
        return Trace(
            topk=self.topk[index],
            family=self.family[index],
            step=(self.step[index] - step_offset).astype(np.int32),
            family_names=self.family_names,
            num_experts=self.num_experts,
            weights=None if self.weights is None else self.weights[index],
            home=None if self.home is None else self.home[index],
        )

    def only_family(self, name: str) -> Trace:
        """The single-family (out-of-distribution) workload of family ``name``."""
        return self.subset(self.family == self.family_names.index(name))

    def stats(self) -> Stats:
        """Derived statistics of this trace (vectorized; no loop over tokens)."""
        return stats_from_trace(self)


@dataclass(frozen=True, eq=False)
class Stats:
    """Statistics of a workload, per family ``f``, layer ``l``, expert ``e``.

    Attributes
    ----------
    family_names
        ``[F]`` family names.
    counts
        float ``[F, L, E]``: token-slots of family f routed to e at layer l.
    family_tokens
        float ``[F]``: tokens of each family.
    top_k
        k.
    step_counts
        optional float ``[L, T, E]``: tokens routed to e at timestep t, n[l, t, e].
    coactivation
        optional float ``[F, L, E, E]``: C[f, l, e, e'], the fraction of family-f tokens with
        both e and e' in their top-k (zero diagonal). None for count-only sources.
    """

    family_names: tuple[str, ...]
    counts: np.ndarray
    family_tokens: np.ndarray
    top_k: int
    step_counts: np.ndarray | None = None
    coactivation: np.ndarray | None = None

    @property
    def families(self) -> int:
        return int(self.counts.shape[0])

    @property
    def layers(self) -> int:
        return int(self.counts.shape[1])

    @property
    def experts(self) -> int:
        return int(self.counts.shape[2])

    @property
    def tokens(self) -> float:
        return float(self.family_tokens.sum())

    @cached_property
    def family_share(self) -> np.ndarray:
        """pi[f]: each family's share of tokens."""
        total = self.family_tokens.sum()
        return self.family_tokens / total if total > 0 else np.full(self.families, 1 / self.families)

    @cached_property
    def usage(self) -> np.ndarray:
        """u[f, l, e]: fraction of family-f token-slots routed to e (sums to 1 over e)."""
        totals = self.counts.sum(axis=2, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            u = np.where(totals > 0, self.counts / np.where(totals > 0, totals, 1), 0.0)
        return u

    @cached_property
    def global_usage(self) -> np.ndarray:
        """ubar[l, e] = sum_f pi_f u[f, l, e]."""
        return np.asarray(np.einsum("f,fle->le", self.family_share, self.usage))

    @cached_property
    def expert_load(self) -> np.ndarray:
        """Token-slots routed to each expert over all families, ``[L, E]``."""
        return np.asarray(self.counts.sum(axis=0))

    @cached_property
    def affinity(self) -> np.ndarray | None:
        """Task-agnostic coactivation graph A[l] = sum_f pi_f C[f, l], ``[L, E, E]``."""
        if self.coactivation is None:
            return None
        return np.asarray(np.einsum("f,flij->lij", self.family_share, self.coactivation))

    @property
    def has_coactivation(self) -> bool:
        return self.coactivation is not None

    def only_family(self, name: str) -> Stats:
        """Statistics restricted to one family (step counts dropped: they mix families)."""
        f = self.family_names.index(name)
        return Stats(
            family_names=(name,),
            counts=self.counts[f : f + 1],
            family_tokens=self.family_tokens[f : f + 1],
            top_k=self.top_k,
            step_counts=None,
            coactivation=None if self.coactivation is None else self.coactivation[f : f + 1],
        )


def token_expert_matrix(topk_layer: np.ndarray, num_experts: int) -> sp.csr_matrix:
    """Sparse 0/1 matrix ``[tokens, E]`` with a 1 where a token routed to an expert."""
    n, k = topk_layer.shape
    rows = np.repeat(np.arange(n), k)
    x = sp.csr_matrix(
        (np.ones(n * k, dtype=np.float64), (rows, topk_layer.ravel().astype(np.int64))),
        shape=(n, num_experts),
    )
    x.data[:] = 1.0  # a repeated id within one token counts once
    return x


def stats_from_trace(trace: Trace) -> Stats:
    """Compute usage, coactivation and per-step counts of a trace with sparse algebra."""
    F = len(trace.family_names)
    L, E, k = trace.layers, trace.num_experts, trace.top_k
    family_tokens = np.bincount(trace.family, minlength=F).astype(np.float64)
    counts = np.zeros((F, L, E))
    coact = np.zeros((F, L, E, E))
    for l in range(L):
        ids = trace.topk[:, l, :].astype(np.int64)
        flat_f = np.repeat(trace.family, k)
        counts[:, l, :] = np.bincount(flat_f * E + ids.ravel(), minlength=F * E).reshape(F, E)
        x = token_expert_matrix(ids, E)
        for f in range(F):
            if family_tokens[f] == 0:
                continue
            xf = x[trace.family == f]
            c = (xf.T @ xf).toarray()
            np.fill_diagonal(c, 0.0)
            coact[f, l] = c / family_tokens[f]
    return Stats(
        family_names=trace.family_names,
        counts=counts,
        family_tokens=family_tokens,
        top_k=k,
        step_counts=trace.step_counts,
        coactivation=coact,
    )


def stats_from_counts(
    counts: np.ndarray,
    *,
    top_k: int,
    family_names: tuple[str, ...] | None = None,
    step_counts: np.ndarray | None = None,
) -> Stats:
    """Count-only statistics: ``counts`` is ``[L, E]`` or ``[F, L, E]`` token-slot counts.

    Tokens per family are estimated as ``counts[f, 0].sum() / top_k``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim == 2:
        counts = counts[None]
    if family_names is None:
        family_names = (
            (DEFAULT_FAMILY,) if counts.shape[0] == 1 else tuple(f"family{i}" for i in range(counts.shape[0]))
        )
    family_tokens = counts.sum(axis=2).max(axis=1) / top_k
    return Stats(
        family_names=tuple(family_names),
        counts=counts,
        family_tokens=family_tokens,
        top_k=top_k,
        step_counts=None if step_counts is None else np.asarray(step_counts, dtype=np.float64),
    )


# ----------------------------------------------------------------------------- one layer
def layer_stats(stats: Stats, l: int, coactivation: bool = True) -> Stats:
    """Layer ``l`` of ``stats`` as one-layer statistics (family token totals unchanged;
    without ``coactivation``, none)."""
    if not coactivation:
        stats = replace(stats, coactivation=None)
    return Stats(
        family_names=stats.family_names,
        counts=np.ascontiguousarray(stats.counts[:, l : l + 1]),
        family_tokens=stats.family_tokens,
        top_k=stats.top_k,
        step_counts=None if stats.step_counts is None else np.ascontiguousarray(stats.step_counts[l : l + 1]),
        coactivation=None if stats.coactivation is None else np.ascontiguousarray(stats.coactivation[:, l : l + 1]),
    )


def layer_trace(trace: Trace, l: int) -> Trace:
    """Layer ``l`` of ``trace`` as a one-layer trace (the same tokens, steps and homes)."""
    return Trace(
        topk=np.ascontiguousarray(trace.topk[:, l : l + 1]),
        family=trace.family,
        step=trace.step,
        family_names=trace.family_names,
        num_experts=trace.num_experts,
        weights=None if trace.weights is None else np.ascontiguousarray(trace.weights[:, l : l + 1]),
        home=trace.home,
    )


def layer_workload(workload: Trace | Stats, l: int) -> Trace | Stats:
    """Layer ``l`` of a trace or of count statistics, as a one-layer workload."""
    return layer_trace(workload, l) if isinstance(workload, Trace) else layer_stats(workload, l)
