"""The one search driver: descent over a neighbourhood, and iterated local search over descents.

Every slot- or home-level search of the package runs through these two loops; what differs
between objectives is behind two small protocols:

* `Neighbourhood`: ``best(state)``, the best improving step of the objective's
  neighbourhood at ``state`` (None at a local optimum), and ``apply(state, step)``. The
  balance kernels (max-bin swaps, smoothing swaps, replacements, robust and variance-aware
  swaps) are vectorized ``best`` functions over a `SlotTable`;
  the joint planner's neighbourhood screens and prices moves a chunk at a time.
  `descend` applies best steps until none is left or a step budget is spent.
* `Landscape`: ``descend(state, round)`` (a whole descent, e.g. alternating
  neighbourhoods), ``kick(state, rng, round)`` (a perturbation into a new state) and
  ``value(state)`` (lower is better). `iterate` is the iterated local search: descend
  from the start, then kick the current plan, descend, accept the result by a rule (strictly
  better, or not worse with ``sideways``), and keep the best; it stops after ``rounds``
  kicks, ``patience`` kicks without a new best, at a ``deadline`` or when the landscape says
  its own budget is spent (``stopped()``).

Users: the homes engine (`moeopt.heuristics.local_search.local_search`: slot repair,
load repair and refinement, hence TACG, agnostic, METIS/hypergraph refinement), TACG's
iterated search (`moeopt.heuristics.local_search.iterated_local_search`), the balance
planner (`moeopt.balance.layout`, `moeopt.balance.packing`,
`moeopt.balance.robust`, `moeopt.balance.shift`, the migration walks of
`moeopt.balance.migration`), the joint planner
(`moeopt.joint.search.local_search`), the cross-layer planner's kicks
(`moeopt.crosslayer.search.sweep`) and GEM's perturbation rounds
(`moeopt.heuristics.gem_search.search_layer`, with its own acceptance rule).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

S = TypeVar("S")
S_in = TypeVar("S_in", contravariant=True)
Step = TypeVar("Step")


class Neighbourhood(Protocol[S_in, Step]):
    """The improving steps of one objective's neighbourhood."""

    def best(self, state: S_in) -> Step | None:
        """The best improving step at ``state``, None at a local optimum (or when a budget
        of the neighbourhood's own is spent)."""
        ...

    def apply(self, state: S_in, step: Step) -> None:
        """Apply ``step`` to ``state`` in place."""
        ...


@dataclass(frozen=True)
class Moves(Generic[S, Step]):
    """A `Neighbourhood` from two functions (e.g. a state's vectorized kernel and its move)."""

    best: Callable[[S], Step | None]
    apply: Callable[[S, Step], Any]


def descend(state: S, moves: Neighbourhood[S, Any], max_steps: int = 100_000, deadline: float | None = None) -> int:
    """Apply ``moves``' best improving step until there is none; returns the steps applied.

    Parameters
    ----------
    state
        Changed in place.
    moves
        The neighbourhood (`Neighbourhood`).
    max_steps
        Stop after this many steps.
    deadline
        `time.perf_counter` time after which no further step is looked for (None: none).
    """
    n = 0
    while n < max_steps:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        step = moves.best(state)
        if step is None:
            break
        moves.apply(state, step)
        n += 1
    return n


class Landscape(Protocol[S]):
    """What `iterate` needs of an objective: a descent, a kick and a value."""

    def descend(self, state: S, round: int) -> S:
        """A local optimum from ``state`` (may change ``state`` in place and return it);
        ``round`` is -1 for the start, else the kick's round."""
        ...

    def kick(self, state: S, rng: np.random.Generator, round: int) -> S:
        """A perturbed copy of ``state`` (``state`` itself is left unchanged)."""
        ...

    def value(self, state: S) -> float:
        """The objective of a descended state; lower is better."""
        ...


@dataclass
class IterateLog:
    """What `iterate` did: kick rounds, new bests, whether the deadline ended it."""

    rounds: int = 0
    improvements: int = 0
    capped: bool = False
    start_value: float = math.nan


def iterate(
    space: Landscape[S],
    start: S,
    rng: np.random.Generator,
    *,
    rounds: int,
    patience: int | None = None,
    sideways: bool = False,
    tol: float = 0.0,
    deadline: float | None = None,
    accept: Callable[[float, float, float], bool] | None = None,
) -> tuple[S, float, IterateLog]:
    """Iterated local search: descend, then kick, descend and accept, keeping the best.

    Parameters
    ----------
    space
        The objective's descent, kick and value (`Landscape`); a landscape with a
        method ``stopped()`` returning True ends the search after the current descent.
    start
        The starting state (the first descent may change it in place).
    rng
        Source of the kicks (the result is deterministic given its state and no deadline).
    rounds
        Kicks at most.
    patience
        Stop after this many kicks without a new best (None: never).
    sideways
        Accept a descended kick that is not worse than the current state by more than
        ``tol`` (else only one strictly better by ``tol``; kicks then always start from the
        best state).
    tol
        Tolerance of the comparisons: a new best is better by more than ``tol``.
    deadline
        ``time.perf_counter()`` value after which no further kick starts (``log.capped``;
        a search that patience or its rounds ended first is not capped).
    accept
        A rule of its own instead of ``sideways``: ``accept(value, current, best)`` (the
        descended kick's value, the current state's and the best's, after the best is
        updated) says whether the walk moves to the kick; when it does not, the walk goes
        back to the best state (e.g. GEM's: accept local optima up to a share worse than
        the best, else restart from the best).

    Returns
    -------
    best, value, log
        The best state found, its value and an `IterateLog`.
    """
    log = IterateLog()
    stopped = getattr(space, "stopped", None)
    cur = space.descend(start, -1)
    cur_val = space.value(cur)
    log.start_value = cur_val
    best, best_val = cur, cur_val
    since = 0
    for it in range(rounds):
        if patience is not None and since >= patience:
            break
        if deadline is not None and time.perf_counter() > deadline:
            log.capped = True
            break
        if stopped is not None and stopped():
            break
        log.rounds += 1
        cand = space.descend(space.kick(cur, rng, it), it)
        val = space.value(cand)
        if val < best_val - tol:
            best, best_val = cand, val
            log.improvements += 1
            since = 0
        else:
            since += 1
        if accept is not None:
            cur, cur_val = (cand, val) if accept(val, cur_val, best_val) else (best, best_val)
        elif val < cur_val - tol or (sideways and val <= cur_val + tol):
            cur, cur_val = cand, val
    return best, best_val, log
