"""Token hyperedges of one layer and the gains of the (λ − 1) connectivity objective.

The expected number of distinct GPUs a token is dispatched to at a layer is the
connectivity ``λ(m)`` of its top-k set ``m`` under the partition of experts into GPUs:
experts are vertices, each distinct top-k set of the calibration trace is a hyperedge
weighted by the number of tokens that chose it (`token_hyperedges`).
`ConnectivityGain` prices moves and swaps for the one local-search engine
(`moeopt.heuristics.local_search`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True, eq=False)
class Hyperedges:
    """The distinct top-k sets of one layer of a trace, as weighted hyperedges.

    Attributes
    ----------
    incidence
        csr ``[M, E]`` 0/1: pin ``e`` of hyperedge ``m``.
    weight
        float ``[M]``: tokens that chose exactly this set (the hyperedge weight).
    pins
        The pins of each hyperedge as lists (what Mt-KaHyPar takes).
    """

    incidence: sp.csr_matrix
    weight: np.ndarray
    pins: list[list[int]]

    @property
    def tokens(self) -> float:
        return float(self.weight.sum())

    @property
    def experts(self) -> int:
        return int(self.incidence.shape[1])

    def connectivity(self, home: np.ndarray) -> np.ndarray:
        """λ(m): distinct GPUs holding the pins of each hyperedge under homes ``[E]``."""
        return np.diff(self._pin_blocks(home).indptr)

    def cost(self, home: np.ndarray) -> float:
        """Σ_m w_m λ(m): the token-weighted number of distinct GPUs."""
        return float(self.weight @ self.connectivity(home))

    def _pin_blocks(self, home: np.ndarray) -> sp.csr_matrix:
        gpus = int(home.max()) + 1
        onehot = sp.csr_matrix((np.ones(len(home)), (np.arange(len(home)), home)), shape=(len(home), gpus))
        blocks = (self.incidence @ onehot).tocsr()
        blocks.eliminate_zeros()
        return blocks


def token_hyperedges(topk_layer: np.ndarray, num_experts: int) -> Hyperedges:
    """Deduplicate one layer's top-k sets into weighted hyperedges (no loop over tokens).

    Parameters
    ----------
    topk_layer
        int ``[tokens, k]`` expert ids of one layer.
    num_experts
        E.

    Returns
    -------
    Hyperedges
        One hyperedge per distinct set; its weight is the number of tokens with that set.
    """
    ids = np.sort(np.asarray(topk_layer, dtype=np.int64), axis=1)
    dup = np.zeros(ids.shape, dtype=bool)
    dup[:, 1:] = ids[:, 1:] == ids[:, :-1]
    if dup.any():
        # canonical row of a set with repeats: repeats replaced by the row minimum, re-sorted
        ids = np.sort(np.where(dup, ids[:, :1], ids), axis=1)
    rows, weight = np.unique(ids, axis=0, return_counts=True)
    first = np.ones(rows.shape, dtype=bool)
    first[:, 1:] = rows[:, 1:] != rows[:, :-1]
    size = first.sum(axis=1)
    r = np.repeat(np.arange(len(rows)), size)
    c = rows[first]
    incidence = sp.csr_matrix((np.ones(len(c)), (r, c)), shape=(len(rows), num_experts))
    if first.all():
        pins = rows.tolist()
    else:
        pins = [p.tolist() for p in np.split(c, np.cumsum(size)[:-1])]
    return Hyperedges(incidence=incidence, weight=weight.astype(np.float64), pins=pins)


class ConnectivityGain:
    """Gains of the (λ − 1) objective Σ_m w_m λ(m) (a reduction is a positive gain).

    Moving e from a to b saves ``w_m`` on every hyperedge where e is a's only pin and costs
    ``w_m`` on every hyperedge with no pin on b. Swapping e (on a) and f (on b) leaves the
    hyperedges containing both unchanged, which the pair correction
    ``S + Sᵀ``, ``S[e, f] = Σ_m w_m x[m, e] x[m, f] [e is a's only pin of m]``, removes.
    """

    def __init__(self, edges: Hyperedges) -> None:
        self.edges = edges
        self._xt = edges.incidence.T.tocsr()
        self._wx = (sp.diags(edges.weight) @ edges.incidence).tocsr()
        self._rows = np.repeat(np.arange(edges.incidence.shape[0]), np.diff(edges.incidence.indptr))

    def gains(self, home: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        X = self.edges.incidence
        E = X.shape[1]
        onehot = np.zeros((E, gpus))
        onehot[np.arange(E), home] = 1.0
        pins = np.asarray(X @ onehot)  # [M, G] pins of each hyperedge on each GPU
        w = self.edges.weight
        empty = self._xt @ (w[:, None] * (pins == 0))  # [E, G] cost of adding e to g
        # [M, E]: e is its GPU's only pin of m (flags on the incidence's nonzeros)
        flag = pins[self._rows, home[X.indices]] == 1
        sole = sp.csr_matrix((flag.astype(np.float64), X.indices, X.indptr), shape=X.shape)
        save = np.asarray(sole.T @ w).ravel()  # [E]
        move = save[:, None] - empty
        move[np.arange(E), home] = 0.0
        s = (sole.T @ self._wx).toarray()
        return move, s + s.T
