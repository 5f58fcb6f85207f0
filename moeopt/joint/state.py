"""A plan's slot contents as a mutable state (a `moeopt.moves.slots.SlotTable`), and its moves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeopt.moves.slots import SlotTable


class SlotState(SlotTable):
    """Slot contents ``[G, W]`` (``-1``: empty) of the joint planner: a
    `moeopt.moves.slots.SlotTable` with its moves as `Move` records."""

    __slots__ = ()

    def __init__(self, slots: np.ndarray, experts: int) -> None:
        super().__init__(slots, experts)
        bad = self.colocated()
        if len(bad):
            raise ValueError(f"GPU {int(bad[0][0])} holds two copies of one expert")
        if (self.c == 0).any():
            raise ValueError(f"expert {int(np.argmin(self.c))} has no copy")

    @property
    def slots(self) -> np.ndarray:
        """int ``[G, W]`` expert per slot (``-1``: empty); the table itself, not a copy."""
        return self.e

    @property
    def holds(self) -> np.ndarray:
        """bool ``[E, G]``: GPU g holds a copy of the expert."""
        return (self.M > 0).T

    def copy(self) -> SlotState:
        out: SlotState = super().copy()
        return out

    def apply(self, move: Move) -> None:
        """Apply a valid move in place."""
        if move.kind == "swap":
            self.swap(move.a, move.i, move.b, move.j)
        else:
            self.replace(move.a, move.i, move.expert)

    def valid(self, move: Move) -> bool:
        """Whether a move keeps every expert covered and no expert twice on a GPU."""
        if move.kind == "swap":
            return self.can_swap(move.a, move.i, move.b, move.j)
        return self.can_replace(move.a, move.i, move.expert)

    def changed_experts(self, move: Move) -> tuple[int, ...]:
        """The experts whose holder sets a move changes."""
        if move.kind == "swap":
            ids = (int(self.e[move.a, move.i]), int(self.e[move.b, move.j]))
        else:
            ids = (int(self.e[move.a, move.i]), move.expert)
        return tuple(e for e in ids if e >= 0)


@dataclass(frozen=True)
class Move:
    """``swap``: slot (a, i) <-> slot (b, j); ``replace``: slot (a, i) := ``expert``."""

    kind: str
    a: int
    i: int
    b: int = -1
    j: int = -1
    expert: int = -1
