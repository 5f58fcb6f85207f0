"""Errors that reach users: each names the file, the field and what was expected."""

from __future__ import annotations


class MoeoptError(Exception):
    """Base class of every error moeopt reports to a user (exit code 2 in the CLI)."""


class InputError(MoeoptError):
    """Bad input: a missing file, a malformed field, a value out of range.

    Parameters
    ----------
    source
        The file (or other origin) that held the bad value, e.g. ``instances/x.yaml``.
    field
        Dotted path of the offending field, e.g. ``cluster.gpus``.
    message
        What was wrong and what was expected.
    """

    def __init__(self, source: str | None, field: str | None, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        where = ": ".join(str(p) for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class InfeasibleError(MoeoptError):
    """No plan can satisfy the instance; the message says why and what would fix it."""


class PlanError(MoeoptError):
    """A plan violates the instance: wrong shape, slot or replica limits exceeded."""
