"""Plans (``moeopt.plan/2``): per layer, the logical expert held by every physical slot.

Each layer has ``G`` GPUs with ``W`` physical slots each (``W = slots_per_gpu +
replica_slots_per_gpu``); a plan writes one logical expert id into every slot (``-1`` for a
slot left empty) so that every expert has at least one copy. Copies are not "homes" or
"replicas": they are equal, and the plan's `Dispatch` says how tokens choose among
them. Two copies of one expert on one GPU ("colocated", which DeepSeek's EPLB emits) are
legal and scored as the engine runs them; moeopt's planners emit them only when
``cluster.allow_colocated_copies`` is true.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from moeopt.errors import PlanError
from moeopt.instance import Cluster, Instance, Model
from moeopt.services import services

#: Dispatch policies (SPEC sections 11 and 12): how a token chooses among the copies of an expert.
DISPATCH_KINDS = ("even", "static", "lp", "vllm", "ascend", "locality")

#: What each kind is, in one line (the CLI's help and the docs' table).
DISPATCH_RULES = {
    "even": "every copy 1/c of the tokens (SGLang dynamic, EPLB's model)",
    "static": "SGLang static: a fixed copy per source rank (same GPU, then node, then a seeded draw)",
    "lp": "SGLang lp: per batch, the split that minimizes the largest GPU load",
    "vllm": "vLLM EPLB: the copy picked by a hash of the token's row in its batch",
    "ascend": "vLLM-Ascend: rank r uses copy r mod c of its expert",
    "locality": "research rule (no engine runs it): load-guarded nearest copy per token",
}

#: Kinds no serving engine runs today (scores under them are labelled as such).
RESEARCH_KINDS = ("locality",)


@dataclass(frozen=True)
class Dispatch:
    """How tokens are split over the copies of an expert; part of every plan.

    ``kind``:

    * ``even``: every copy receives ``1/c`` of its expert's tokens (EPLB's model; SGLang's
      ``dynamic`` dispatch, which on a trace sends a token's row ``r`` of its batch to copy
      ``r mod c``).
    * ``static``: SGLang's static rule: a token uses the copy on its own GPU, else a copy
      fixed per (source GPU, expert) drawn fairly over the expert's physical slots; the draws
      run over every row of the engine's map, so ``dense_layers`` (the map's leading dense
      rows, ``p mod E`` as moeopt writes them) is part of the rule.
    * ``lp``: per batch, each expert's tokens are split over its copies as SGLang's LP
      dispatch splits them (``--ep-dispatch-algorithm lp``: 5 affine-scaling steps towards the
      split with the smallest largest load; `moeopt.dispatch.lplb_split`).
    * ``vllm``: vLLM's EPLB routing: the token in row ``i`` of its rank's batch uses copy
      ``((i * 2654435769) mod 2**32) mod c`` (copies in physical-slot order).
    * ``ascend``: vLLM-Ascend: rank ``r`` sends every token for expert ``e`` to copy
      ``r mod c`` of ``e`` (its ``c`` devices in rank order); with ``tp_size > 1``, copy
      ``(r mod tp + r div tp + e) mod c``.
    * ``locality`` (a research rule: no engine runs it): the online guard of SPEC 4.3,
      ``argmax locality(g) - lam * Lhat_g / mean(Lhat)`` with ``Lhat`` decayed by ``decay``
      after each batch of ``batch_tokens`` tokens (``None``: one batch per trace step).
    """

    kind: str = "even"
    lam: float = 1.0
    decay: float = 0.9
    batch_tokens: int | None = None
    #: ``static``: dense hidden layers in the engine's map before the MoE layers
    dense_layers: int = 0
    #: ``ascend``: tensor-parallel size (None or 1: rank r uses copy r mod c)
    tp_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DISPATCH_KINDS:
            raise PlanError(f"dispatch.kind: expected one of {', '.join(DISPATCH_KINDS)}, got {self.kind!r}")
        if not np.isfinite(self.lam) or self.lam < 0:
            raise PlanError(f"dispatch.lam: expected a finite number >= 0, got {self.lam!r}")
        if not np.isfinite(self.decay) or not 0 <= self.decay <= 1:
            raise PlanError(f"dispatch.decay: expected a number in [0, 1], got {self.decay!r}")
        if self.batch_tokens is not None and (isinstance(self.batch_tokens, bool) or self.batch_tokens < 1):
            raise PlanError(f"dispatch.batch_tokens: expected an integer >= 1, got {self.batch_tokens!r}")
        if isinstance(self.dense_layers, bool) or not isinstance(self.dense_layers, (int, np.integer)):
            raise PlanError(f"dispatch.dense_layers: expected an integer >= 0, got {self.dense_layers!r}")
        if self.dense_layers < 0:
            raise PlanError(f"dispatch.dense_layers: expected an integer >= 0, got {self.dense_layers!r}")
        if self.dense_layers and self.kind != "static":
            raise PlanError("dispatch.dense_layers: only the static rule depends on dense layers")
        if self.tp_size is not None:
            if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, (int, np.integer)) or self.tp_size < 1:
                raise PlanError(f"dispatch.tp_size: expected an integer >= 1, got {self.tp_size!r}")
            if self.kind != "ascend":
                raise PlanError("dispatch.tp_size: only the ascend rule depends on the tensor-parallel size")

    @property
    def engine_runs(self) -> bool:
        """Whether a serving engine runs this rule (``locality`` is a research rule)."""
        return self.kind not in RESEARCH_KINDS

    def to_json(self) -> dict[str, Any]:
        """The plan file's ``dispatch`` object (only the fields the kind uses)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "locality":
            out.update(lam=self.lam, decay=self.decay, batch_tokens=self.batch_tokens)
        if self.kind == "static" and self.dense_layers:
            out["dense_layers"] = int(self.dense_layers)
        if self.kind == "ascend" and self.tp_size is not None:
            out["tp_size"] = int(self.tp_size)
        return out

    @classmethod
    def from_json(cls, data: Any) -> Dispatch:
        """Read a ``dispatch`` object (a mapping, or a bare kind string); a field the kind does
        not use is an error."""
        if isinstance(data, str):
            return cls(kind=data)
        if not isinstance(data, dict):
            raise PlanError(f"dispatch: expected a mapping with 'kind', got {data!r}")
        unknown = set(data) - {"kind", "lam", "decay", "batch_tokens", "dense_layers", "tp_size"}
        if unknown:
            raise PlanError(f"dispatch: unknown field(s) {', '.join(sorted(unknown))}")
        kind = data.get("kind", "even")
        own = {
            "locality": {"lam", "decay", "batch_tokens"},
            "static": {"dense_layers"},
            "ascend": {"tp_size"},
        }.get(str(kind), set())
        foreign = sorted(k for k in set(data) - {"kind"} - own if data[k] is not None)
        if foreign:
            raise PlanError(f"dispatch: field(s) {', '.join(foreign)} do not apply to kind {kind!r}")
        for key in ("lam", "decay"):
            v = data.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise PlanError(f"dispatch.{key}: expected a number, got {v!r}")
        for key in ("batch_tokens", "dense_layers", "tp_size"):
            v = data.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise PlanError(f"dispatch.{key}: expected an integer, got {v!r}")
        return cls(
            kind=str(kind),
            lam=float(data.get("lam", 1.0) if data.get("lam") is not None else 1.0),
            decay=float(data.get("decay", 0.9) if data.get("decay") is not None else 0.9),
            batch_tokens=data.get("batch_tokens"),
            dense_layers=int(data.get("dense_layers") or 0),
            tp_size=data.get("tp_size"),
        )


def rule_dispatch(kind: str, model: Model | None = None) -> Dispatch:
    """The `Dispatch` of rule ``kind`` for a model: SGLang's ``static`` rule takes the
    model's ``dense_layers`` (the engine's map has their rows; None counts as 0)."""
    if kind == "static" and model is not None and model.dense_layers:
        return Dispatch(kind="static", dense_layers=model.dense_layers)
    return Dispatch(kind=kind)


def engine_dispatch(model: Model, cluster: Cluster) -> Dispatch | None:
    """The dispatch the instance's engine (``cluster.engine``) runs, or None without one."""
    rule = cluster.engine_rule
    return None if rule is None else rule_dispatch(rule, model)


@dataclass(frozen=True, eq=False)
class Plan:
    """A placement of expert copies in physical slots, with its dispatch rule.

    Attributes
    ----------
    slots
        int ``[L, G, W]``: the logical expert in slot w of GPU g at layer l; ``-1`` = empty.
    experts
        E, the number of logical experts per layer (every id in ``[0, E)`` has a copy).
        Defaults to the largest id + 1.
    dispatch
        How tokens choose among an expert's copies.
    """

    slots: np.ndarray
    experts: int = -1
    dispatch: Dispatch = field(default_factory=Dispatch)

    def __post_init__(self) -> None:
        try:
            raw = np.asarray(self.slots)
        except (TypeError, ValueError):
            raise PlanError("plan.slots: expected [layers][gpus][slots] integer expert ids") from None
        if raw.dtype.kind == "f" and raw.size and not np.array_equal(raw, np.round(raw)):
            raise PlanError("plan.slots: expected integer expert ids")
        if raw.dtype.kind not in "iuf" and raw.size:
            raise PlanError(f"plan.slots: expected integer expert ids, got {raw.dtype}")
        slots = raw.astype(np.int64)
        if slots.ndim != 3:
            raise PlanError(f"plan.slots: expected [layers, gpus, slots], got shape {slots.shape}")
        object.__setattr__(self, "slots", slots)
        E = int(self.experts)
        if E < 0:
            E = int(slots.max()) + 1 if slots.size else 0
        object.__setattr__(self, "experts", E)
        if not isinstance(self.dispatch, Dispatch):
            raise PlanError("plan.dispatch: expected a Dispatch")
        if slots.size and (slots.min() < -1 or slots.max() >= E):
            l, g, w = np.argwhere((slots < -1) | (slots >= E))[0]
            raise PlanError(
                f"plan.slots: layer {l} GPU {g} slot {w} holds expert {slots[l, g, w]}, expected an id in [0, {E - 1}]"
            )
        missing = self.copy_counts == 0
        if missing.any():
            l, e = np.argwhere(missing)[0]
            raise PlanError(f"plan.slots: layer {l} has no copy of expert {e}; every expert needs at least one slot")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_homes(
        cls,
        home: np.ndarray,
        replicas: tuple[np.ndarray, ...] | list[np.ndarray] = (),
        *,
        gpus: int,
        width: int | None = None,
        dispatch: Dispatch | None = None,
    ) -> Plan:
        """A plan from a home GPU per expert ``[L, E]`` plus extra copies ``(expert, gpu)`` rows.

        Each GPU's slots list its home experts in ascending id, then its extra copies in
        ascending id, then empty slots (``-1``) up to ``width`` (default: the fullest GPU).
        """
        home = np.asarray(home, dtype=np.int64)
        if home.ndim != 2:
            raise PlanError(f"plan.placement: expected [layers, experts], got shape {home.shape}")
        L, E = home.shape
        if home.size and (home.min() < 0 or home.max() >= gpus):
            raise PlanError(f"plan.placement: GPU ids must lie in [0, {gpus - 1}]")
        reps = [np.asarray(r, dtype=np.int64).reshape(-1, 2) for r in (replicas or ())]
        reps += [np.zeros((0, 2), dtype=np.int64)] * (L - len(reps))
        if len(reps) != L:
            raise PlanError(f"plan.replicas: expected one list per layer ({L}), got {len(reps)}")
        per_layer = []
        for l in range(L):
            r = reps[l]
            if len(r) and (r[:, 0].min() < 0 or r[:, 0].max() >= E or r[:, 1].min() < 0 or r[:, 1].max() >= gpus):
                raise PlanError(f"plan.replicas[{l}]: expert or GPU id out of range")
            e = np.concatenate([np.arange(E), r[:, 0]])
            g = np.concatenate([home[l], r[:, 1]])
            extra = np.concatenate([np.zeros(E, dtype=np.int64), np.ones(len(r), dtype=np.int64)])
            per_layer.append((g, extra, e))
        counts = [np.bincount(g, minlength=gpus) for g, _, _ in per_layer]
        need = max((int(c.max()) for c in counts if c.size), default=0)
        W = need if width is None else int(width)
        if need > W:
            l = next(i for i, c in enumerate(counts) if c.max() > W)
            worst = int(np.argmax(counts[l]))
            raise PlanError(f"plan: layer {l} puts {counts[l][worst]} copies on GPU {worst}, which has {W} slots")
        slots = np.full((L, gpus, W), -1, dtype=np.int64)
        for l, (g, extra, e) in enumerate(per_layer):
            order = np.lexsort((e, extra, g))
            gs = g[order]
            rank = np.arange(len(gs)) - np.searchsorted(gs, gs)
            slots[l, gs, rank] = e[order]
        return cls(slots=slots, experts=E, dispatch=dispatch or Dispatch())

    @classmethod
    def from_engine(
        cls,
        path: str | Path,
        engine: str,
        *,
        instance: Instance | None = None,
        gpus: int | None = None,
        dense_layers: int | None = None,
        dispatch: str | None = None,
    ) -> Plan:
        """Read a serving engine's placement file slot for slot (as ``moeopt import`` does).

        Parameters
        ----------
        path
            The file: SGLang's ``--init-expert-location`` map (``.json`` / ``.pt``), DeepSeek
            EPLB tensors (``.npz`` / ``.pt``) or a vLLM-Ascend expert map (``.json``).
        engine
            Its format: ``sglang``, ``eplb`` or ``vllm-ascend``.
        instance
            The instance the plan is for: gives the GPUs, the experts and (SGLang) the dense
            layers, and the plan is checked against it and padded to its slots per GPU.
        gpus
            G, without an instance (SGLang maps do not record it).
        dense_layers
            SGLang: the map's leading dense rows (default: the instance's
            ``model.dense_layers``, else the rows beyond the instance's MoE layers).
        dispatch
            The plan's dispatch kind (default: the one the engine runs by default).

        Returns
        -------
        Plan

        Raises
        ------
        InputError
            On a missing or malformed file, or a plan that does not fit the instance.
        """
        return services().read_engine_plan(
            path, engine, instance=instance, gpus=gpus, dense_layers=dense_layers, dispatch=dispatch
        )

    def to_engine(
        self,
        engine: str,
        path: str | Path,
        *,
        instance: Instance | None = None,
        dense_layers: int | None = None,
        load: Any = None,
    ) -> list[str]:
        """Write the plan as a serving engine's placement file (as ``moeopt export`` does).

        The same checks as the command: the engine must run the plan's dispatch rule, SGLang's
        map needs the model's dense layers, vLLM-Ascend's map equal experts per device; empty
        slots are filled by the rule of `moeopt.interop`. The file is written atomically.

        Parameters
        ----------
        engine
            ``sglang`` (``.json`` or ``.pt``), ``eplb`` (``.npz`` or ``.pt``) or
            ``vllm-ascend`` (``.json``).
        path
            The file to write; its suffix must be one the engine reads.
        instance
            The instance the plan is for: the plan is checked against it and padded to its
            slots per GPU, and SGLang's dense layers default to its ``model.dense_layers``.
        dense_layers
            SGLang only: the model's dense hidden layers, written before the MoE layers
            (DeepSeek-V3 / R1: 3; 0 for a model without any).
        load
            Optional ``[layers, experts]`` expert loads, used only to fill an empty slot no
            score-neutral copy can fill.

        Returns
        -------
        list of str
            Notes on the export (fills that shift load, colocated copies written once).

        Raises
        ------
        InputError
            On an unknown engine, a wrong suffix, missing dense layers, or a plan the engine
            cannot run as scored.
        """
        return services().write_engine_plan(self, engine, path, instance=instance, dense_layers=dense_layers, load=load)

    def with_dispatch(self, dispatch: Dispatch) -> Plan:
        """The same slots under another dispatch rule."""
        return replace(self, dispatch=dispatch)

    def padded(self, width: int) -> Plan:
        """The same plan with ``width`` slots per GPU (extra slots empty)."""
        W = self.width
        if width == W:
            return self
        if width < W:
            used = (self.slots >= 0).sum(axis=2).max(initial=0)
            if used > width:
                raise PlanError(f"plan: a GPU holds {used} copies, more than {width} slots")
            # keep slot order: stable compaction of the non-empty slots to the front
            order = np.argsort(self.slots < 0, axis=2, kind="stable")
            compact = np.take_along_axis(self.slots, order, axis=2)[:, :, :width]
            return replace(self, slots=compact)
        pad = np.full(self.slots.shape[:2] + (width - W,), -1, dtype=np.int64)
        return replace(self, slots=np.concatenate([self.slots, pad], axis=2))

    # ------------------------------------------------------------------ shape
    @property
    def layers(self) -> int:
        return int(self.slots.shape[0])

    @property
    def gpus(self) -> int:
        return int(self.slots.shape[1])

    @property
    def width(self) -> int:
        """W: physical slots per GPU."""
        return int(self.slots.shape[2])

    # ------------------------------------------------------------------ derived views
    @cached_property
    def copy_counts(self) -> np.ndarray:
        """int ``[L, E]``: copies of each expert (colocated copies counted each)."""
        L, E = self.layers, self.experts
        filled = self.slots >= 0
        key = (np.arange(L)[:, None, None] * E + self.slots)[filled]
        return np.bincount(key, minlength=L * E).reshape(L, E)

    @cached_property
    def copies_on_gpu(self) -> np.ndarray:
        """int ``[L, E, G]``: copies of each expert on each GPU (2+ = colocated)."""
        L, G, W = self.slots.shape
        E = self.experts
        filled = self.slots >= 0
        g = np.broadcast_to(np.arange(G)[None, :, None], self.slots.shape)
        key = ((np.arange(L)[:, None, None] * E + self.slots) * G + g)[filled]
        return np.bincount(key, minlength=L * E * G).reshape(L, E, G)

    @cached_property
    def home(self) -> np.ndarray:
        """int ``[L, E]``: the GPU of each expert's first copy (in GPU, then slot, order)."""
        L, G, W = self.slots.shape
        flat = self.slots.reshape(L, G * W)
        home = np.zeros((L, self.experts), dtype=np.int64)
        for l in range(L):
            ids = flat[l]
            pos = np.nonzero(ids >= 0)[0]
            e, first = np.unique(ids[pos], return_index=True)  # first occurrence in slot order
            home[l, e] = pos[first] // W
        return home

    @property
    def has_replicas(self) -> bool:
        """Whether any expert has more than one copy."""
        return bool((self.copy_counts > 1).any())

    @property
    def colocated(self) -> int:
        """Number of copies that share a GPU with another copy of the same expert."""
        s = np.sort(self.slots, axis=-1)  # a GPU's copies of one expert end up side by side
        return int(((s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)).sum())

    @property
    def replicas(self) -> tuple[np.ndarray, ...]:
        """Per layer int ``[R_l, 2]`` rows ``(expert, gpu)``: every copy but the first."""
        out = []
        L, G, W = self.slots.shape
        for l in range(L):
            ids = self.slots[l].reshape(-1)
            pos = np.nonzero(ids >= 0)[0]
            e = ids[pos]
            order = np.argsort(e, kind="stable")
            e_sorted = e[order]
            first = np.ones(len(e_sorted), dtype=bool)
            first[1:] = e_sorted[1:] != e_sorted[:-1]
            extra = order[~first]
            rows = np.stack([e[extra], pos[extra] // W], axis=1) if len(extra) else np.zeros((0, 2), np.int64)
            out.append(rows[np.lexsort((rows[:, 1], rows[:, 0]))] if len(rows) else rows)
        return tuple(out)

    def copies(self, layer: int) -> np.ndarray:
        """int ``[E, C]``: the GPU of each copy of each expert (first copy first), -1 padded.

        A colocated copy appears once per slot, so an even split gives that GPU its share
        twice, as engines do.
        """
        W = self.width
        ids = self.slots[layer].reshape(-1)
        pos = np.nonzero(ids >= 0)[0]
        e = ids[pos]
        order = np.argsort(e, kind="stable")
        e_sorted, gpu = e[order], pos[order] // W
        counts = np.bincount(e_sorted, minlength=self.experts)
        table = np.full((self.experts, max(int(counts.max(initial=1)), 1)), -1, dtype=np.int64)
        start = np.searchsorted(e_sorted, np.arange(self.experts))
        rank = np.arange(len(e_sorted)) - start[e_sorted]
        table[e_sorted, rank] = gpu
        return table

    def physical(self, layer: int) -> np.ndarray:
        """int ``[G * W]``: the layer's slots flattened (slot ``p`` on GPU ``p // W``)."""
        return np.asarray(self.slots[layer].reshape(-1))

    def experts_per_gpu(self) -> np.ndarray:
        """int ``[L, G]``: filled slots on each GPU."""
        return np.asarray((self.slots >= 0).sum(axis=2))

    def same_layout(self, other: Plan) -> bool:
        """Whether two plans hold the same multiset of experts on every GPU of every layer."""
        if self.slots.shape[:2] != other.slots.shape[:2] or self.experts != other.experts:
            return False
        return bool(np.array_equal(self.copies_on_gpu, other.copies_on_gpu))

    # ------------------------------------------------------------------ checks
    def check(
        self,
        cluster: Cluster,
        *,
        layers: int | None = None,
        experts: int | None = None,
        own: bool = False,
        kept: Plan | None = None,
    ) -> None:
        """Raise `PlanError` (one line) unless the plan fits the instance.

        ``own=True`` is for moeopt's own planners: colocated copies are then an error unless
        ``cluster.allow_colocated_copies``, or unless ``kept`` (the plan a re-plan started from,
        same shape) already has them on that GPU. Plans read from engines may hold them.
        """
        G, W = cluster.gpus, cluster.width
        if layers is not None and self.layers != layers:
            raise PlanError(f"plan.slots: {self.layers} layers, the instance has {layers}")
        if experts is not None and self.experts != experts:
            raise PlanError(f"plan.slots: {self.experts} experts per layer, the instance has {experts}")
        if self.gpus != G:
            raise PlanError(f"plan.slots: plan is for {self.gpus} GPUs, the instance has {G}")
        used = self.experts_per_gpu()
        if (used > W).any():
            l, g = np.argwhere(used > W)[0]
            raise PlanError(
                f"plan.slots: layer {l} puts {used[l, g]} copies on GPU {g}, which has {W} slots "
                f"(cluster.slots_per_gpu + replica_slots_per_gpu)"
            )
        if own and not cluster.allow_colocated_copies and self.colocated:
            allowed = 1 if kept is None else np.maximum(kept.copies_on_gpu, 1)
            added = self.copies_on_gpu > allowed
            if not added.any():
                return
            l, e, g = np.argwhere(added)[0]
            raise PlanError(
                f"plan.slots: layer {l} puts two copies of expert {e} on GPU {g}; "
                f"set cluster.allow_colocated_copies: true to allow it"
            )

    def notes(self) -> list[str]:
        """Remarks a user should see (not errors), e.g. colocated copies."""
        out = []
        if self.colocated:
            layers = int((self.copies_on_gpu > 1).any(axis=(1, 2)).sum())
            out.append(
                f"note: {self.colocated} colocated copies (two copies of one expert on one GPU) in {layers} "
                f"layers; scored as the engine runs them"
            )
        return out
