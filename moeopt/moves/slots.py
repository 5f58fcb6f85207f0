"""The one mutable slot state: a layer's slot table with presence and copy counts kept in step.

A plan of one layer fills ``G x W`` physical slots with expert ids (``-1``: an empty slot,
which only the joint planner uses). `SlotTable` holds the table ``e [G, W]``, the
presence counts ``M [G, E]`` (copies of expert x on GPU g) and the copy counts ``c [E]``, and
keeps them consistent under the two moves every slot-level search uses:

* ``swap(g1, i1, g2, i2)``: two slots exchange their experts (copy counts unchanged);
* ``replace(g, i, x)``: one slot takes expert ``x`` (or ``-1``), copy counts change.

`WeightedSlots` adds per-slot weights and per-GPU sums that move with the swaps, item
ids for packings, and the colocation repair (`WeightedSlots.repair`).

The balance planner's layouts (`moeopt.balance.layout._Layout`, a
`WeightedSlots`; `moeopt.balance.robust._RobustLayout`) and the joint planner's
`moeopt.joint.state.SlotState` are subclasses that add their cached weights (per-slot
weights and per-GPU sums, per-step loads, the joint move records); the search driver over them
is `moeopt.moves.driver`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]


def presence(slots: np.ndarray, experts: int) -> NDArray[np.int32]:
    """``M[g, x]``: copies of expert ``x`` in row ``g`` of ``slots [G, W]`` (``-1`` slots skipped)."""
    G, W = slots.shape
    M = np.zeros((G, experts), dtype=np.int32)
    filled = slots >= 0
    np.add.at(M, (np.repeat(np.arange(G), W)[filled.ravel()], slots[filled]), 1)
    return M


class SlotTable:
    """Slot contents ``e [G, W]`` with presence ``M [G, E]`` and copy counts ``c [E]`` in step.

    Attributes
    ----------
    e
        int ``[G, W]`` expert per slot (``-1``: empty).
    M
        int32 ``[G, E]`` copies of each expert on each GPU.
    c
        int ``[E]`` copies of each expert.
    G, W, E
        GPUs, slots per GPU, experts.
    gf
        int ``[G * W]`` GPU of each flat slot (shared between copies, never written).
    """

    __slots__ = ("e", "M", "c", "G", "W", "E", "gf")

    #: attributes a copy shares instead of copying (read-only arrays)
    _shared: tuple[str, ...] = ("gf",)

    def __init__(self, slots: np.ndarray, experts: int) -> None:
        self.e = np.array(slots, dtype=np.int64)
        self.G, self.W = self.e.shape
        self.E = int(experts)
        self.M = presence(self.e, self.E)
        self.c = self.M.sum(axis=0).astype(np.int64)
        self.gf = np.repeat(np.arange(self.G), self.W)

    def copy(self) -> Any:
        """An independent copy (of the subclass, its arrays copied except the shared ones)."""
        new = object.__new__(type(self))
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                v = getattr(self, name)
                setattr(new, name, v.copy() if isinstance(v, np.ndarray) and name not in self._shared else v)
        return new

    def assign(self, other: SlotTable) -> None:
        """Take ``other``'s contents in place (same class and shape)."""
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                v = getattr(other, name)
                setattr(self, name, v.copy() if isinstance(v, np.ndarray) and name not in self._shared else v)

    # -- moves ------------------------------------------------------------------------------------
    def swap(self, g1: int, i1: int, g2: int, i2: int) -> tuple[int, int]:
        """Slots ``(g1, i1)`` and ``(g2, i2)`` exchange experts; returns the two old experts."""
        e1, e2 = int(self.e[g1, i1]), int(self.e[g2, i2])
        self.e[g1, i1], self.e[g2, i2] = e2, e1
        M = self.M
        if e1 >= 0:
            M[g1, e1] -= 1
            M[g2, e1] += 1
        if e2 >= 0:
            M[g2, e2] -= 1
            M[g1, e2] += 1
        return e1, e2

    def replace(self, g: int, i: int, x: int) -> int:
        """Slot ``i`` of GPU ``g`` takes expert ``x`` (``-1``: empties it); returns the old expert."""
        a = int(self.e[g, i])
        self.e[g, i] = x
        if a >= 0:
            self.M[g, a] -= 1
            self.c[a] -= 1
        if x >= 0:
            self.M[g, x] += 1
            self.c[x] += 1
        return a

    # -- checks -----------------------------------------------------------------------------------
    def can_swap(self, g1: int, i1: int, g2: int, i2: int, allow: bool = False) -> bool:
        """Whether a swap changes the plan and (unless ``allow``) colocates no two copies."""
        if g1 == g2:
            return False
        e1, e2 = int(self.e[g1, i1]), int(self.e[g2, i2])
        if e1 == e2:
            return False
        return allow or ((e1 < 0 or self.M[g2, e1] == 0) and (e2 < 0 or self.M[g1, e2] == 0))

    def can_replace(self, g: int, i: int, x: int, allow: bool = False) -> bool:
        """Whether a replacement changes the plan, leaves the old expert a copy and (unless
        ``allow``) colocates no two copies."""
        a = int(self.e[g, i])
        if x == a or (not allow and x >= 0 and self.M[g, x] > 0):
            return False
        return a < 0 or self.c[a] >= 2

    def colocated(self) -> IntArray:
        """``(g, x)`` rows where GPU g holds two or more copies of expert x."""
        return np.argwhere(self.M > 1)


class WeightedSlots(SlotTable):
    """A `SlotTable` whose slots carry weights: ``w [G, W]`` moves with its expert in a
    swap, ``s [G]`` holds each GPU's sum, and ``item [G, W]`` (optional) the id of the item in
    each slot when the slots are a packing of items."""

    __slots__ = ("w", "s", "item")

    def __init__(self, slots: np.ndarray, weights: np.ndarray, experts: int, item: np.ndarray | None = None) -> None:
        super().__init__(slots, experts)
        self.w = np.array(weights, dtype=np.float64)
        self.s = self.w.sum(axis=1)
        self.item = None if item is None else np.array(item, dtype=np.int64)

    @property
    def placed(self) -> IntArray:
        """Item indices per bin, ``[G, W]`` (built with ``item=``)."""
        if self.item is None:
            raise RuntimeError("placed needs slots built with item=")
        return self.item

    def swap(self, g1: int, i1: int, g2: int, i2: int) -> tuple[int, int]:
        out = super().swap(g1, i1, g2, i2)
        w1, w2 = self.w[g1, i1], self.w[g2, i2]
        self.w[g1, i1], self.w[g2, i2] = w2, w1
        if self.item is not None:
            self.item[g1, i1], self.item[g2, i2] = self.item[g2, i2], self.item[g1, i1]
        self.s[g1] += w2 - w1
        self.s[g2] += w1 - w2
        return out

    def repair(self) -> bool:
        """Remove colocated copies by swaps, each with the partner slot that gives the smallest
        larger sum of the two GPUs; ``False`` if stuck."""
        for _ in range(self.G * self.W):
            bad = self.colocated()
            if bad.size == 0:
                return True
            g, x = bad[0]
            i = int(np.flatnonzero(self.e[g] == x)[0])
            ef = self.e.ravel()
            ok = (self.gf != g) & (self.M[self.gf, x] == 0) & (self.M[g, ef] == 0)
            if not ok.any():
                return False
            d = self.w.ravel() - self.w[g, i]
            val = np.where(ok, np.maximum(self.s[g] + d, self.s[self.gf] - d), np.inf)
            j = int(np.argmin(val))
            self.swap(int(g), i, j // self.W, j % self.W)
        return not np.any(self.M > 1)
