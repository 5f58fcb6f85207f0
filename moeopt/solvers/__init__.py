"""Solvers: building blocks used by the methods (no registration here).

`available` tells whether an optional solver backend can be used: every backend module
and method asks it rather than trying the import itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from moeopt import interrupt

#: CP-SAT (OR-Tools)
CPSAT = "ortools.sat.python.cp_model"
#: HiGHS through highspy's own API
HIGHSPY = "highspy"
#: HiGHS through Pyomo's solver API v2
PYOMO_HIGHS = "pyomo-highs"


def available(backend: str) -> bool:
    """Whether the optional solver backend ``backend`` can be used.

    Parameters
    ----------
    backend
        `PYOMO_HIGHS` (Pyomo's solver API v2 with a usable HiGHS), or the name of the
        module the backend needs (`CPSAT`, `HIGHSPY`, ``"pymetis"``, ...).

    Returns
    -------
    bool
        False when the import or the solver's own check fails, whatever the reason.
    """
    try:
        if backend == PYOMO_HIGHS:
            import pyomo.environ  # noqa: F401  (registers the solver plugins)
            from pyomo.contrib.solver.common.factory import SolverFactory

            return bool(SolverFactory("highs").available())
        importlib.import_module(backend)
    except Exception:  # noqa: BLE001  (a missing or broken install, a licence problem: unavailable)
        interrupt.check()  # unless Ctrl-C broke the import (a native module may turn it into an ImportError)
        return False
    return True


@dataclass(frozen=True)
class ExactSettings:
    """How an exact grouping backend (``grouping_cpsat``, ``grouping_highs``, ``grouping_milp``)
    runs: each backend's ``solve(g, settings)`` reads these.

    Attributes
    ----------
    time_limit
        Seconds for build and search.
    hint
        A feasible plan (expert -> group), renumbered by the backend with
        `canonical` so that it satisfies the symmetry breaking,
        and passed as the solver's start or hint; None for none.
    threads, seed, log
        Solver threads (CP-SAT workers), random seed and console log.
    refuse
        Raise InputError (before building) when the model is too large for ``time_limit``.
    solver
        The MILP solver of a Pyomo backend (``grouping_milp``): one of
        `moeopt.solvers.pyomo_solvers.SOLVERS`; the other backends ignore it.
    """

    time_limit: float
    hint: np.ndarray | None = None
    threads: int = 2
    seed: int = 0
    log: bool = False
    refuse: bool = True
    solver: str = "highs"
