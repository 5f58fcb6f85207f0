"""A plan's slot contents as a mutable state, and the moves over it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SlotState:
    """Slot contents ``[G, W]`` with the holder matrix and copy counts kept in step."""

    def __init__(self, slots: np.ndarray, experts: int) -> None:
        self.slots = np.asarray(slots, dtype=np.int64).copy()
        self.experts = experts
        G = self.slots.shape[0]
        self.holds = np.zeros((experts, G), dtype=bool)
        self.copies = np.zeros(experts, dtype=np.int64)
        for g in range(G):
            ids = self.slots[g][self.slots[g] >= 0]
            if len(np.unique(ids)) != len(ids):
                raise ValueError(f"GPU {g} holds two copies of one expert")
            self.holds[ids, g] = True
            self.copies[ids] += 1
        if (self.copies == 0).any():
            raise ValueError(f"expert {int(np.argmin(self.copies))} has no copy")

    @property
    def gpus(self) -> int:
        return int(self.slots.shape[0])

    @property
    def width(self) -> int:
        return int(self.slots.shape[1])

    def copy(self) -> SlotState:
        out = SlotState.__new__(SlotState)
        out.slots, out.experts = self.slots.copy(), self.experts
        out.holds, out.copies = self.holds.copy(), self.copies.copy()
        return out

    def _set(self, g: int, w: int, e: int) -> None:
        old = int(self.slots[g, w])
        if old >= 0:
            self.holds[old, g] = False
            self.copies[old] -= 1
        if e >= 0:
            self.holds[e, g] = True
            self.copies[e] += 1
        self.slots[g, w] = e

    def apply(self, move: Move) -> None:
        """Apply a valid move in place."""
        if move.kind == "swap":
            e, f = int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j])
            self._set(move.a, move.i, -1)
            self._set(move.b, move.j, -1)
            self._set(move.a, move.i, f)
            self._set(move.b, move.j, e)
        else:
            self._set(move.a, move.i, move.expert)

    def valid(self, move: Move) -> bool:
        """Whether a move keeps every expert covered and no expert twice on a GPU."""
        if move.kind == "swap":
            if move.a == move.b:
                return False
            e, f = int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j])
            if e == f:
                return False
            return (e < 0 or not self.holds[e, move.b]) and (f < 0 or not self.holds[f, move.a])
        e, f = int(self.slots[move.a, move.i]), move.expert
        if f == e or (f >= 0 and self.holds[f, move.a]):
            return False
        return e < 0 or self.copies[e] >= 2

    def changed_experts(self, move: Move) -> tuple[int, ...]:
        """The experts whose holder sets a move changes."""
        if move.kind == "swap":
            ids = (int(self.slots[move.a, move.i]), int(self.slots[move.b, move.j]))
        else:
            ids = (int(self.slots[move.a, move.i]), move.expert)
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
