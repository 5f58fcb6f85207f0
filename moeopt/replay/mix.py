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
import warnings

import numpy as np
from scipy.cluster.vq import kmeans2
from scipy.stats import chi2_contingency

from moeopt.trace import Trace

__all__ = [
    "MIN_FAMILY_SHARE",
    "MIX_P",
    "ROUTING_SHIFT",
    "family_loads",
    "family_snapshots",
    "latent_families",
    "latent_signal",
    "mix_moves",
    "routing_shift",
    "step_window",
]

#: the test's level: the mix moves when the families' shares over the steps are this unlikely
#: under one fixed mix (p-value of the chi-square test of homogeneity)
MIX_P = 0.01
#: a family with fewer of the steps' tokens than this share is left out (its load too noisy to plan for)
MIN_FAMILY_SHARE = 0.05
#: the families' routing moved across a surge when each family's own change is at least this
#: share of how much the families differ from one another ([`routing_shift`][moeopt.replay.mix.routing_shift])
ROUTING_SHIFT = 0.5
#: clusters ``latent_families`` makes of an unlabelled trace's tokens
LATENT_FAMILIES = 8
#: tokens the clusters are fitted on (every token is then assigned to the nearest)
LATENT_SAMPLE = 4000
#: most entries of the token x (layer, expert) matrix the clusters are fitted on (fewer tokens on wide models)
LATENT_ENTRIES = 16_000_000
#: bits per pick below which the clusters are not taken for task families (`latent_signal`)
LATENT_MIN_BITS = 0.02


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


def step_window(trace: Trace, start: int, end: int) -> Trace:
    """The tokens of steps ``start .. end - 1`` of ``trace``, their steps shifted to start at 0
    (steps without tokens keep their place; families kept)."""
    return trace.take(np.flatnonzero((trace.step >= start) & (trace.step < end)), start)


def _sample(sample: int, layers: int, experts: int) -> int:
    """Tokens to fit on: ``sample``, fewer where their 0/1 matrix would pass `LATENT_ENTRIES`
    (DeepSeek-V3's 58 layers x 256 experts: about 1,000), never under 200."""
    return max(200, min(int(sample), LATENT_ENTRIES // max(1, layers * experts)))


def _picks(topk: np.ndarray, E: int) -> np.ndarray:
    """float ``[tokens, L * E]``: each token's picks as a 0/1 vector over (layer, expert)."""
    T, L, _ = topk.shape
    X = np.zeros((T, L * E))
    np.put_along_axis(X, (np.arange(L)[None, :, None] * E + topk.astype(np.int64)).reshape(T, -1), 1.0, axis=1)
    return X


def _centres(topk: np.ndarray, E: int, k: int, seed: int) -> np.ndarray:
    """float ``[k, L, E]``: k-means centres of the tokens' picks (scipy's ``kmeans2``, k-means++)."""
    with warnings.catch_warnings():  # an empty cluster keeps its centre (and no token)
        warnings.simplefilter("ignore", UserWarning)
        centres, _ = kmeans2(_picks(topk, E), k, minit="++", seed=np.random.default_rng(seed), iter=20)
    return np.asarray(centres).reshape(k, topk.shape[1], E)


def _nearest(topk: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """int ``[tokens]``: the nearest centre to each token's picks (``|c|^2 - 2 x . c``; the
    dot product gathered from the picks, no dense token matrix)."""
    k, L, _ = centres.shape
    near = np.zeros((topk.shape[0], k))
    for l in range(L):
        near += centres[:, l][:, topk[:, l]].sum(axis=2).T
    return np.asarray(np.argmin((centres**2).sum(axis=(1, 2))[None, :] - 2.0 * near, axis=1))


def latent_signal(trace: Trace, families: int = LATENT_FAMILIES, sample: int = LATENT_SAMPLE, seed: int = 0) -> float:
    """Bits per pick that a token's cluster, found from half the layers, tells about its picks at
    the other half (held-out tokens; both halves in turn; 0.0 with fewer than two layers).

    Tasks route alike at every layer, so a token's task shows in all its layers: clusters made
    on the even layers then predict the odd layers' picks better than their pooled
    distribution does. Clusters that only split the picks of a layer predict nothing beyond it.
    Measured on the bundled streams: 0.14 on the OLMoE domain mix, 0.07 to 0.37 on the
    synthetic streams, -0.004 on the Mixtral domain mix (3 layers, top-2 of 8).
    """
    T, L, K = trace.topk.shape
    E = int(trace.num_experts)
    if L < 2 or T < 4 * families:
        return 0.0
    order = np.random.default_rng(seed).permutation(T)[: min(2 * _sample(sample, (L + 1) // 2, E), T)]
    fit, test = order[: order.size // 2], order[order.size // 2 :]
    fit_picks, test_picks = trace.topk[fit].astype(np.int64), trace.topk[test].astype(np.int64)
    bits = []
    for A, B in ((np.arange(0, L, 2), np.arange(1, L, 2)), (np.arange(1, L, 2), np.arange(0, L, 2))):
        centres = _centres(fit_picks[:, A], E, families, seed)
        label_fit = np.repeat(_nearest(fit_picks[:, A], centres), K) * E
        label_test = _nearest(test_picks[:, A], centres)
        gain = 0.0
        for l in B:
            # each cluster's picks at layer l (add-half smoothing), and the pooled ones
            by = np.bincount(label_fit + fit_picks[:, l].ravel(), minlength=families * E).reshape(families, E) + 0.5
            pooled = by.sum(axis=0)
            by /= by.sum(axis=1, keepdims=True)
            pooled /= pooled.sum()
            picks = test_picks[:, l]
            gain += float(np.log2(by[label_test[:, None], picks]).sum() - np.log2(pooled[picks]).sum())
        bits.append(gain / (test.size * len(B) * K))
    return float(np.mean(bits))


def latent_families(trace: Trace, families: int = LATENT_FAMILIES, sample: int = LATENT_SAMPLE, seed: int = 0) -> Trace:
    """``trace`` with its tokens labelled by routing: k-means (scipy's ``kmeans2``, k-means++
    seeding) of the tokens' picks, each token a 0/1 vector over (layer, expert), fitted on
    ``sample`` tokens drawn with ``seed`` and every token assigned to the nearest centre.

    Tokens of one task route alike over the layers (the families' loads differ), so on a trace
    whose requests carry no task label the clusters stand for the tasks: measured on the
    bundled labelled streams with the labels removed, 8 clusters put 82 % of the OLMoE domain
    mix's tokens (3 layers, top-8 of 64) and 80 % of the synthetic mix's in a cluster's majority
    task (chance: 18 % and 27 %), but only 23 % of Mixtral's (3 layers, top-2 of 8; chance 21 %):
    with few picks per token the clusters split the picks, not the tasks. The families are
    named ``latent 1`` .. ``latent k``; empty clusters keep their name and no token.
    """
    T, L, K = trace.topk.shape
    E = int(trace.num_experts)
    k = max(1, min(int(families), T))
    names = tuple(f"latent {i + 1}" for i in range(k))
    if T == 0 or k < 2:
        return Trace(trace.topk, np.zeros(T, dtype=np.int32), trace.step, names, E, trace.weights, trace.home)
    fit = np.sort(np.random.default_rng(seed).choice(T, size=min(_sample(sample, L, E), T), replace=False))
    label = _nearest(trace.topk, _centres(trace.topk[fit], E, k, seed))
    return Trace(trace.topk, label.astype(np.int32), trace.step, names, E, trace.weights, trace.home)
