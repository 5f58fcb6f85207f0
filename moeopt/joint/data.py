"""The joint problem of one layer: tokens' expert choices, families, loads and limits; samples."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

#: Improvements smaller than this (in GPUs per token) are noise.
TOL = 1e-9


@dataclass(frozen=True, eq=False)
class JointLayer:
    """One layer's joint problem on a token sample.

    Attributes
    ----------
    topk
        int ``[N, k]``: the sampled tokens' experts.
    family
        int ``[N]``: family id of each token, in ``[0, families)``.
    families
        F.
    experts, gpus, width
        E, G and W (physical slots per GPU).
    eps
        Load limit on the calibration workload: every GPU <= ``(1 + eps)`` times the mean.
    family_eps
        The same limit on each family's own workload (None: ``eps``).
    robust
        Weight of the family workloads in the objective, in [0, 1] (0: calibration only).
    penalty
        Cost, in GPUs per token, of one (token, expert) pair over a load limit that no
        holder can take (the soft constraint's price).
    family_cap
        A looser limit on each family's own workload (``inf``: none): a family's pair over
        ``(1 + family_cap)`` times that family's mean costs ``penalty`` with the weight of
        the calibration workload, ``(1 - robust) * pi_f``, so the cap binds where the
        ``robust`` term is too light to (one domain's experts grouped on one GPU).
    pair_weight
        Optional float ``[N, k]``: the load each sampled pair stands for (default 1). A
        sample of a larger trace weighs each pair by its expert's count in the trace over
        its count in the sample (per family), so loads follow the whole trace and only the
        split over copies and the communication come from the sample.
    """

    topk: np.ndarray
    family: np.ndarray
    families: int
    experts: int
    gpus: int
    width: int
    eps: float = 0.05
    family_eps: float | None = None
    robust: float = 0.5
    penalty: float = 4.0
    pair_weight: np.ndarray | None = None
    family_cap: float = math.inf
    #: optional int ``[N]``: each sampled token's index in the trace it was sampled from
    token_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        topk = np.asarray(self.topk, dtype=np.int64)
        if topk.ndim != 2:
            raise ValueError(f"topk: expected [tokens, k], got shape {topk.shape}")
        object.__setattr__(self, "topk", topk)
        object.__setattr__(self, "family", np.asarray(self.family, dtype=np.int64).reshape(-1))
        if len(self.family) != len(topk):
            raise ValueError("family: one id per token expected")
        if topk.size and (topk.min() < 0 or topk.max() >= self.experts):
            raise ValueError(f"topk: expert ids must lie in [0, {self.experts - 1}]")
        if self.gpus * self.width < self.experts:
            raise ValueError(f"{self.gpus} GPUs x {self.width} slots cannot hold {self.experts} experts")
        if not self.eps >= 0 or (self.family_eps is not None and not self.family_eps >= 0):
            raise ValueError("eps and family_eps must be >= 0")
        if not 0.0 <= self.robust <= 1.0:
            raise ValueError(f"robust must lie in [0, 1], got {self.robust}")
        if not self.penalty >= 0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}")
        if not self.family_cap >= 0:
            raise ValueError(f"family_cap must be >= 0, got {self.family_cap}")
        w = np.ones(topk.shape) if self.pair_weight is None else np.asarray(self.pair_weight, dtype=np.float64)
        if w.shape != topk.shape or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("pair_weight: expected finite weights >= 0, one per (token, expert)")
        object.__setattr__(self, "pair_weight", w)

    @property
    def weights(self) -> np.ndarray:
        """float ``[n, k]``: ``pair_weight``, ones when none was given (set by ``__post_init__``)."""
        if self.pair_weight is None:
            raise RuntimeError("pair_weight is set by __post_init__")
        return self.pair_weight

    @property
    def tokens(self) -> int:
        return int(self.topk.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[1])

    @property
    def family_tokens(self) -> np.ndarray:
        """float ``[F]``: sampled tokens of each family."""
        return np.bincount(self.family, minlength=self.families).astype(np.float64)

    @property
    def family_weights(self) -> np.ndarray:
        """float ``[F]``: ``robust * pi_f`` (zero for a family without tokens, and when F = 1)."""
        n = self.family_tokens
        if self.families <= 1 or self.robust == 0 or n.sum() == 0:
            return np.zeros(self.families)
        return self.robust * n / n.sum()

    @property
    def limits(self) -> np.ndarray:
        """float ``[1 + F]``: ``eps`` of the calibration workload, then of each family."""
        fe = self.eps if self.family_eps is None else self.family_eps
        return np.concatenate([[self.eps], np.full(self.families, fe)])

    @property
    def workload_weights(self) -> np.ndarray:
        """float ``[1 + F]``: weight of the calibration workload and of each family's."""
        w = self.family_weights
        return np.concatenate([[1.0 - w.sum()], w])

    @property
    def cap_limits(self) -> np.ndarray:
        """float ``[1 + F]``: the family cap of each workload (``inf`` for the calibration one)."""
        return np.concatenate([[math.inf], np.full(self.families, self.family_cap)])

    @property
    def cap_weights(self) -> np.ndarray:
        """float ``[1 + F]``: weight of a pair over the family cap, ``(1 - robust) * pi_f``
        (zero for the calibration workload, without a cap, and when F = 1)."""
        n = self.family_tokens
        if self.families <= 1 or not math.isfinite(self.family_cap) or n.sum() == 0:
            return np.zeros(1 + self.families)
        return np.concatenate([[0.0], (1.0 - self.robust) * n / n.sum()])

    @property
    def has_cap(self) -> bool:
        """Whether a family cap is priced at all."""
        return bool(self.cap_weights.any())

    @property
    def expert_load(self) -> np.ndarray:
        """float ``[E]``: load of each expert (weighted sampled pairs)."""
        return np.bincount(self.topk.ravel(), weights=self.weights.ravel(), minlength=self.experts)

    def coactivation(self) -> np.ndarray:
        """float ``[E, E]``: tokens choosing both e and e' (zero diagonal)."""
        n, k = self.topk.shape
        x = sp.csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), self.topk.ravel())), shape=(n, self.experts))
        a = (x.T @ x).toarray()
        np.fill_diagonal(a, 0.0)
        return a


def layer_from_trace(
    topk: np.ndarray,
    family: np.ndarray,
    families: int,
    *,
    experts: int,
    gpus: int,
    width: int,
    sample_tokens: int | None = None,
    rng: np.random.Generator | None = None,
    **kwargs,
) -> JointLayer:
    """A `JointLayer` on (a uniform sample of) one layer's tokens ``topk [N, k]``; a
    sample's pairs are weighted so that each family's expert loads are the whole trace's."""
    topk = np.asarray(topk, dtype=np.int64)
    family = np.asarray(family, dtype=np.int64)
    n, k = topk.shape
    if sample_tokens is None or n <= sample_tokens:
        return JointLayer(
            topk=topk,
            family=family,
            families=families,
            experts=experts,
            gpus=gpus,
            width=width,
            token_ids=np.arange(n),
            **kwargs,
        )
    rng = rng or np.random.default_rng(0)
    idx = np.sort(rng.choice(n, size=sample_tokens, replace=False))
    full = np.bincount((family[:, None] * experts + topk).ravel(), minlength=families * experts)
    part = np.bincount((family[idx, None] * experts + topk[idx]).ravel(), minlength=families * experts)
    tok_full = np.bincount(family, minlength=families).astype(np.float64)
    tok_part = np.bincount(family[idx], minlength=families).astype(np.float64)
    scale = np.where(tok_full > 0, tok_part / np.maximum(tok_full, 1), 0.0)  # sample scale per family
    ratio = np.where(part > 0, full * np.repeat(scale, experts) / np.maximum(part, 1), 0.0)
    weight = ratio[family[idx, None] * experts + topk[idx]]
    return JointLayer(
        topk=topk[idx],
        family=family[idx],
        families=families,
        experts=experts,
        gpus=gpus,
        width=width,
        pair_weight=weight,
        token_ids=idx,
        **kwargs,
    )


def subsample(layer: JointLayer, tokens: int, rng: np.random.Generator) -> JointLayer:
    """A uniform sub-sample of a layer's tokens, its pairs weighted so that each family's
    expert loads keep the layer's proportions (at the sub-sample's scale)."""
    n = layer.tokens
    if tokens >= n:
        return layer
    E, F = layer.experts, layer.families
    idx = np.sort(rng.choice(n, size=tokens, replace=False))
    key = layer.family[:, None] * E + layer.topk
    full = np.bincount(key.ravel(), weights=layer.weights.ravel(), minlength=F * E)
    part = np.bincount(key[idx].ravel(), minlength=F * E).astype(np.float64)
    tok_full = np.bincount(layer.family, minlength=F).astype(np.float64)
    tok_part = np.bincount(layer.family[idx], minlength=F).astype(np.float64)
    scale = np.where(tok_full > 0, tok_part / np.maximum(tok_full, 1), 0.0)
    ratio = np.where(part > 0, full * np.repeat(scale, E) / np.maximum(part, 1), 0.0)
    return JointLayer(
        topk=layer.topk[idx],
        family=layer.family[idx],
        families=F,
        experts=E,
        gpus=layer.gpus,
        width=layer.width,
        eps=layer.eps,
        family_eps=layer.family_eps,
        robust=layer.robust,
        penalty=layer.penalty,
        pair_weight=ratio[key[idx]],
        family_cap=layer.family_cap,
        token_ids=None if layer.token_ids is None else layer.token_ids[idx],
    )
