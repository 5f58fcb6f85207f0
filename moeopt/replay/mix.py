"""Plan for every task family when the task mix moves (SPEC section 12).

A layer's load is the sum of what each kind of request asks of it: a stream whose *mix* of
requests drifts (more code in the afternoon, a batch of math) moves its load even when each
kind's own routing holds still. A plan made for the recent steps follows the mix it saw; a plan
that balances every family's load on its own balances any mix of them, since a GPU's load under
a mix is the mix of its loads under each family (its MaxVio at most the mix of theirs). When a
token trace labels its tokens with their family and the mix moves beyond what sampling explains
([`mix_moves`][moeopt.replay.mix.mix_moves]: a chi-square test of the families' shares over the
steps), ``auto`` plans robustly over each family's load
([`family_loads`][moeopt.replay.mix.family_loads], over the steps of the current regime) beside
its forecast. On a mix that holds still (the shares vary only by sampling) the family snapshots
would only narrow the plan: the test leaves them out. A surge starts a new regime for the
families only when their own routing moved across it
([`routing_shift`][moeopt.replay.mix.routing_shift]): a surge that the moving mix explains keeps
the steps before it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import chi2_contingency

from moeopt.trace import Trace

__all__ = [
    "MIN_FAMILY_SHARE",
    "MIX_P",
    "ROUTING_SHIFT",
    "family_loads",
    "family_snapshots",
    "mix_moves",
    "routing_shift",
]

#: the test's level: the mix moves when the families' shares over the steps are this unlikely
#: under one fixed mix (p-value of the chi-square test of homogeneity)
MIX_P = 0.01
#: a family with fewer of the steps' tokens than this share is left out (its load too noisy to plan for)
MIN_FAMILY_SHARE = 0.05
#: the families' routing moved across a surge when each family's own change is at least this
#: share of how much the families differ from one another ([`routing_shift`][moeopt.replay.mix.routing_shift])
ROUTING_SHIFT = 0.5


def mix_moves(trace: Trace, alpha: float = MIX_P) -> tuple[bool, float]:
    """Whether the families' shares of the tokens differ across the steps of ``trace`` beyond
    sampling (chi-square test of homogeneity of the step-by-family token counts).

    Returns
    -------
    tuple[bool, float]
        ``p <= alpha`` and the p-value (1.0 when there is nothing to test: one family, one step,
        or no tokens; so ``alpha = 1`` always says the mix moves).
    """
    F = len(trace.family_names)
    if F < 2 or trace.tokens == 0:
        return 1.0 <= alpha, 1.0
    steps = np.unique(trace.step, return_inverse=True)[1]
    table = np.zeros((int(steps.max()) + 1, F))
    np.add.at(table, (steps, np.asarray(trace.family, dtype=np.int64)), 1)
    table = table[:, table.sum(axis=0) > 0]  # families absent from every step carry no evidence
    if table.shape[0] < 2 or table.shape[1] < 2:
        return 1.0 <= alpha, 1.0
    p = float(chi2_contingency(table, correction=False).pvalue)
    return p <= alpha, p


def family_loads(trace: Trace, layers: int, min_share: float = MIN_FAMILY_SHARE) -> np.ndarray:
    """float ``[layers, n, E]``: each family's share of every expert's picks per layer (rows sum to
    1), for the ``n`` families with at least ``min_share`` of the tokens, in family order."""
    F = len(trace.family_names)
    fam = np.asarray(trace.family, dtype=np.int64)
    kept = np.flatnonzero((np.bincount(fam, minlength=F) >= max(min_share * len(fam), 1))[:F])
    counts = _family_counts(trace, layers)[:, kept]  # [layers, n, E]
    sums = counts.sum(axis=2, keepdims=True)
    return np.asarray(np.divide(counts, sums, out=np.zeros_like(counts), where=sums > 0))


def family_snapshots(trace: Trace, base: np.ndarray, alpha: float = MIX_P) -> np.ndarray | None:
    """float ``[L, n + F', E]``: the load snapshots ``base [L, n, E]``, then each family's load
    on ``trace`` ([`family_loads`][moeopt.replay.mix.family_loads]) at the snapshots' mean load
    per step, when the mix of ``trace`` moves at level ``alpha``
    ([`mix_moves`][moeopt.replay.mix.mix_moves]); None when it does not, or no family has its
    share of the tokens (plan on ``base`` as it is)."""
    if not mix_moves(trace, alpha)[0]:
        return None
    fam = family_loads(trace, base.shape[0])
    if fam.shape[1] == 0:
        return None
    scale = base.sum(axis=2).mean(axis=1)  # [L]: the snapshots' load per step
    return np.concatenate([base, fam * scale[:, None, None]], axis=1)


def _family_counts(trace: Trace, layers: int) -> np.ndarray:
    """float ``[layers, F, E]``: each family's picks of every expert per layer."""
    E, F, k = int(trace.num_experts), len(trace.family_names), trace.top_k
    flat = np.repeat(np.asarray(trace.family, dtype=np.int64), k) * E
    return np.stack(
        [np.bincount(flat + trace.topk[:, l].ravel(), minlength=F * E).reshape(F, E) for l in range(layers)]
    ).astype(np.float64)


def _divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The chi-square distance between the distributions of the count rows ``a`` and ``b``
    (``[..., E]``), less what sampling alone gives: ``max(0, S - dof) / (n_a n_b / (n_a + n_b))``,
    ``S`` the chi-square statistic of the two rows' contingency table (experts picked by neither
    left out), ``dof`` its degrees of freedom."""
    na, nb = a.sum(axis=-1, keepdims=True), b.sum(axis=-1, keepdims=True)
    n = na + nb
    col = a + b
    with np.errstate(invalid="ignore", divide="ignore"):
        ea, eb = na * col / n, nb * col / n
        stat = np.where(col > 0, (a - ea) ** 2 / ea + (b - eb) ** 2 / eb, 0.0).sum(axis=-1)
        dof = np.maximum((col > 0).sum(axis=-1) - 1, 0)
        scale = (na * nb / n)[..., 0]
        return np.asarray(np.where(scale > 0, np.maximum(stat - dof, 0.0) / scale, 0.0))


def routing_shift(before: Trace, after: Trace, layers: int, min_share: float = MIN_FAMILY_SHARE) -> float:
    """How far each family's own routing moved from ``before`` to ``after``, as a share of how
    much the families' routing differ from one another in ``before``.

    Both are the chi-square distance between expert distributions less its sampling part
    (``_divergence``), averaged over the layers and the families with at least ``min_share`` of
    the tokens on both sides (their pairs for the spread). A surge that a moving mix explains
    leaves every family's routing where it was (near 0); a new workload moves it as far as the
    families lie apart, or further. 0.0 when there is nothing to compare (fewer than two
    families on both sides); ``inf`` when the families do not differ but their routing moved.
    """
    if len(before.family_names) < 2 or before.tokens == 0 or after.tokens == 0:
        return 0.0
    cb, ca = _family_counts(before, layers), _family_counts(after, layers)
    share_b, share_a = cb[0].sum(axis=1) / cb[0].sum(), ca[0].sum(axis=1) / ca[0].sum()  # every token picks k
    kept = np.flatnonzero((share_b >= min_share) & (share_a >= min_share))
    if len(kept) < 2:
        return 0.0
    cb, ca = cb[:, kept], ca[:, kept]
    within = float(_divergence(cb, ca).mean())
    i, j = np.triu_indices(len(kept), 1)
    spread = float(_divergence(cb[:, i], cb[:, j]).mean())
    if spread <= 0.0:
        return 0.0 if within <= 0.0 else math.inf
    return within / spread
