"""The one local-search engine's shared parts: the slot state and the descent driver.

* `moeopt.moves.slots`: `SlotTable`, one layer's slot table
  with presence and copy counts kept in step under swaps and replacements (the balance and
  joint planners' states are its subclasses);
* `moeopt.moves.driver`: `descend` (apply a neighbourhood's
  best improving step until there is none) and `iterate`
  (iterated local search: descend, kick, accept), which TACG/agnostic
  (`moeopt.heuristics.local_search`), the balance planner and the joint planner run.

Objectives stay with their owners: a neighbourhood object scores the moves of its objective
(vectorized kernels) and the driver only sequences them.
"""
