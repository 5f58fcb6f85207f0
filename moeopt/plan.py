"""Plans: each (layer, expert) has a home GPU and optionally replica GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeopt.errors import PlanError
from moeopt.instance import Cluster


@dataclass(frozen=True, eq=False)
class Plan:
    """An expert-to-GPU placement.

    Attributes
    ----------
    home
        int ``[L, E]``: home GPU of expert e at layer l.
    replicas
        per layer, int ``[R_l, 2]`` rows ``(expert, gpu)``: extra copies held in replica slots.
    """

    home: np.ndarray
    replicas: tuple[np.ndarray, ...] = ()

    def __post_init__(self) -> None:
        home = np.asarray(self.home, dtype=np.int64)
        if home.ndim != 2:
            raise PlanError(f"plan.placement: expected [layers, experts], got shape {home.shape}")
        object.__setattr__(self, "home", home)
        reps = tuple(
            np.asarray(r, dtype=np.int64).reshape(-1, 2) for r in (self.replicas or ())
        ) or tuple(np.zeros((0, 2), dtype=np.int64) for _ in range(home.shape[0]))
        if len(reps) != home.shape[0]:
            raise PlanError(
                f"plan.replicas: expected one list per layer ({home.shape[0]}), got {len(reps)}"
            )
        object.__setattr__(self, "replicas", reps)

    @property
    def layers(self) -> int:
        return int(self.home.shape[0])

    @property
    def experts(self) -> int:
        return int(self.home.shape[1])

    @property
    def has_replicas(self) -> bool:
        return any(len(r) for r in self.replicas)

    @classmethod
    def from_homes(cls, home: np.ndarray) -> Plan:
        return cls(home=np.asarray(home))

    def without_replicas(self) -> Plan:
        return Plan(home=self.home.copy())

    def copies(self, layer: int) -> np.ndarray:
        """int ``[E, 1 + max replicas]``: GPUs holding each expert, home first, -1 padded."""
        reps = self.replicas[layer]
        E = self.experts
        per = np.bincount(reps[:, 0], minlength=E) if len(reps) else np.zeros(E, dtype=np.int64)
        width = 1 + (int(per.max()) if len(reps) else 0)
        table = np.full((E, width), -1, dtype=np.int64)
        table[:, 0] = self.home[layer]
        if len(reps):
            order = np.argsort(reps[:, 0], kind="stable")
            sorted_e = reps[order, 0]
            start = np.searchsorted(sorted_e, np.arange(E))
            rank = np.arange(len(sorted_e)) - start[sorted_e]
            table[sorted_e, 1 + rank] = reps[order, 1]
        return table

    def experts_per_gpu(self, gpus: int) -> np.ndarray:
        """int ``[L, G]``: home experts on each GPU."""
        L = self.layers
        flat = (np.arange(L)[:, None] * gpus + self.home).ravel()
        return np.bincount(flat, minlength=L * gpus).reshape(L, gpus)

    def check(self, cluster: Cluster, *, layers: int | None = None, experts: int | None = None) -> None:
        """Raise :class:`PlanError` unless the plan fits the cluster's slots and replica slots."""
        G = cluster.gpus
        if layers is not None and self.layers != layers:
            raise PlanError(f"plan.placement: {self.layers} layers, instance has {layers}")
        if experts is not None and self.experts != experts:
            raise PlanError(f"plan.placement: {self.experts} experts per layer, instance has {experts}")
        if self.home.size and (self.home.min() < 0 or self.home.max() >= G):
            raise PlanError(f"plan.placement: GPU ids must lie in [0, {G - 1}]")
        used = self.experts_per_gpu(G)
        if (used > cluster.slots_per_gpu).any():
            l, g = np.argwhere(used > cluster.slots_per_gpu)[0]
            raise PlanError(
                f"plan.placement: layer {l} puts {used[l, g]} experts on GPU {g}, "
                f"which has {cluster.slots_per_gpu} slots"
            )
        for l, reps in enumerate(self.replicas):
            if not len(reps):
                continue
            e, g = reps[:, 0], reps[:, 1]
            if e.min() < 0 or e.max() >= self.experts or g.min() < 0 or g.max() >= G:
                raise PlanError(f"plan.replicas[{l}]: expert or GPU id out of range")
            if (self.home[l, e] == g).any():
                i = int(np.argmax(self.home[l, e] == g))
                raise PlanError(
                    f"plan.replicas[{l}]: expert {e[i]} replicated on its home GPU {g[i]}"
                )
            if len(np.unique(e * G + g)) != len(e):
                raise PlanError(f"plan.replicas[{l}]: two copies of one expert on one GPU")
            per_gpu = np.bincount(g, minlength=G)
            if (per_gpu > cluster.replica_slots_per_gpu).any():
                gg = int(np.argmax(per_gpu))
                raise PlanError(
                    f"plan.replicas[{l}]: GPU {gg} holds {per_gpu[gg]} replicas, "
                    f"replica_slots_per_gpu is {cluster.replica_slots_per_gpu}"
                )
