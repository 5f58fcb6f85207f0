"""The optional parts of moeopt and the one-line error when one is missing.

The core install solves, evaluates and writes plans; the heavy parts that only some commands use
come with extras (``pip install 'moeopt[plot]'``): matplotlib draws the figures (``plot``), CVXPY
solves the semidefinite certificate (``sdp``), pyscipopt brings SCIP for the Pyomo models
(``scip``), Ray runs layers as Ray tasks (``ray``) and torch runs the GPU harness (``torch``).
Every place that needs one loads its module with ``load``, never at import time of moeopt or
its command line, so a missing extra costs nothing until it is needed, and then says which extra
to install in one line (``MissingExtra``: exit 2 on the command line).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from moeopt.errors import MoeoptError

#: extra -> (the module it brings, what it is for): the table of the README's install section
EXTRAS: dict[str, tuple[str, str]] = {
    "plot": ("matplotlib", "figures: moeopt plot, --plot, frontier's figure"),
    "sdp": ("cvxpy", "the semidefinite certificate of the grouping methods (certificate: sdp or auto)"),
    "scip": ("pyscipopt", "SCIP as the solver of the Pyomo models (solver: scip)"),
    "ray": ("ray", "layers as Ray tasks (--ray)"),
    "torch": ("torch", "the GPU validation harness, torch tensors as counts"),
}


class MissingExtra(MoeoptError):
    """A command or method needs an optional part that is not installed.

    Parameters
    ----------
    extra
        The extra that brings it (a key of ``EXTRAS``).
    what
        What needed it (``moeopt plot``, ``certificate: sdp``, ...).
    """

    def __init__(self, extra: str, what: str) -> None:
        self.extra = extra
        self.what = what
        super().__init__(f"{what} needs the '{extra}' extra: pip install 'moeopt[{extra}]'")


def load(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` (a module of the extra ``extra``), or raise ``MissingExtra``.

    Parameters
    ----------
    module
        The module to import (``matplotlib``, ``matplotlib.pyplot``, ``cvxpy``, ...).
    extra
        The extra that brings it.
    what
        What needs it, for the message.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    MissingExtra
        When the import fails because the module (or a module it needs) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(extra, what) from None


def installed(extra: str) -> bool:
    """Whether the module of ``extra`` can be imported (it is not imported).

    Parameters
    ----------
    extra
        A key of ``EXTRAS``.
    """
    from importlib.util import find_spec

    try:
        return find_spec(EXTRAS[extra][0]) is not None
    except (ImportError, ValueError):
        return False
