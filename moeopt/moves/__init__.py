"""The one local-search engine's shared parts: the slot state and the descent driver.

* :mod:`moeopt.moves.slots`: :class:`~moeopt.moves.slots.SlotTable`, one layer's slot table
  with presence and copy counts kept in step under swaps and replacements (the balance and
  joint planners' states are its subclasses);
* :mod:`moeopt.moves.driver`: :func:`~moeopt.moves.driver.descend` (apply a neighbourhood's
  best improving step until there is none) and :func:`~moeopt.moves.driver.iterate`
  (iterated local search: descend, kick, accept), which TACG/agnostic
  (:mod:`moeopt.heuristics.local_search`), the balance planner and the joint planner run.

Objectives stay with their owners: a neighbourhood object scores the moves of its objective
(vectorized kernels) and the driver only sequences them.
"""
