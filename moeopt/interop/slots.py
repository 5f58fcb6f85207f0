"""Plans as physical slot maps: empty slots filled for export, maps read back into plans, and the
engines' formats and dispatch rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moeopt.errors import InputError, PlanError
from moeopt.plan import Dispatch, Plan

ENGINE_FORMATS = ("sglang", "eplb", "vllm-ascend")

#: The dispatch each engine runs a placement file with by default (recorded on import).
#: SGLang (0.5.23) resolves an unset ``--ep-dispatch-algorithm`` to ``dynamic`` (an even split
#: over an expert's physical slots: moeopt's ``even``) under its default
#: ``--moe-a2a-backend none``, and to ``static`` (moeopt's ``static``) when an all-to-all
#: backend such as DeepEP is set. EPLB's own model is ``even``. vLLM-Ascend sends rank
#: ``r``'s tokens for expert ``e`` to its copy number ``r mod c`` (copies in device order):
#: moeopt's ``ascend``, an even split only when c divides G.
ENGINE_DISPATCH = {"sglang": "even", "eplb": "even", "vllm-ascend": "ascend"}

#: The dispatch rules each engine file can run under: SGLang's three ``--ep-dispatch-algorithm``
#: values; DeepSeek EPLB's tensors under EPLB's own model (``even``) or vLLM's routing (vLLM's
#: EPLB state holds the same ``physical_to_logical_map``); vLLM-Ascend's one rule.
ENGINE_RULES: dict[str, tuple[str, ...]] = {
    "sglang": ("even", "static", "lp"),
    "eplb": ("even", "vllm"),
    "vllm-ascend": ("ascend",),
}

#: Engine names in messages.
ENGINE_NAMES = {"sglang": "SGLang", "eplb": "DeepSeek EPLB", "vllm-ascend": "vLLM-Ascend"}


def check_engine_rule(plan: Plan, fmt: str) -> None:
    """Raise `PlanError` unless the engine of ``fmt`` runs the plan's dispatch rule: a plan
    scored under a rule its engine does not run would serve other loads than it promised."""
    rules = ENGINE_RULES[fmt]
    if plan.dispatch.kind in rules:
        return
    what = "a research rule no engine runs" if not plan.dispatch.engine_runs else "a rule it does not run"
    raise PlanError(
        f"dispatch: the plan runs under {plan.dispatch.kind!r}, {what} ({ENGINE_NAMES[fmt]} runs "
        f"{' or '.join(repr(r) for r in rules)}); plan for the engine's rule (the method's dispatch, or "
        f"cluster.engine), or export it as the engine will run it with --dispatch {rules[0]} and "
        f"evaluate it so"
    )


#: SGLang's ``--ep-dispatch-algorithm`` for each moeopt dispatch kind (none for ``locality``).
SGLANG_DISPATCH = {"even": "dynamic", "static": "static", "lp": "lp"}


# ----------------------------------------------------------------------------- helpers
def to_numpy(value: Any, source: str | None, field: str, *, integer: bool = True) -> np.ndarray:
    """A tensor, nested list or array as a numpy array; InputError when it is not rectangular.

    Parameters
    ----------
    value
        A torch tensor (converted by duck typing, torch is never imported here), a numpy
        array or nested lists.
    source, field
        Named in the error message.
    integer
        Require integer values (floats that are whole numbers are accepted).
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise InputError(source, field, "expected a rectangular array of numbers") from None
    if arr.dtype == object or arr.dtype.kind not in "iufb":
        raise InputError(source, field, f"expected a rectangular array of numbers, got {arr.dtype}")
    if integer and arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or (arr != np.round(arr)).any():
            raise InputError(source, field, "expected integer ids")
    if integer and arr.dtype.kind in "fu" and arr.size and float(np.abs(arr).max()) >= 2.0**63:
        raise InputError(source, field, f"expected integer ids below 2**63, found {arr.max():.6g}")
    return arr.astype(np.int64) if integer else arr.astype(np.float64)


def check_top_k(top_k: int | None, experts: int | None, source: str | None, what: str) -> int:
    """The ``top_k`` a count-only dump needs (``what`` records none): an InputError naming
    ``top_k`` when it is missing, below 1 or above the ``experts`` the counts have (when known)."""
    if top_k is None or top_k < 1:
        raise InputError(source, "top_k", f"{what} do not record top-k; give the model's top_k (--top-k)")
    if experts is not None and top_k > experts:
        raise InputError(source, "top_k", f"expected at most the {experts} experts the counts have, got {top_k}")
    return top_k


def _dispatch(dispatch: Dispatch | str | None, fmt: str) -> Dispatch:
    if isinstance(dispatch, Dispatch):
        return dispatch
    return Dispatch(kind=dispatch or ENGINE_DISPATCH[fmt])


# ----------------------------------------------------------------------------- plan -> slots
def fill_empty_slots(plan: Plan, load: np.ndarray | None = None) -> tuple[Plan, list[str]]:
    """The plan with every empty slot (-1) filled, and notes on fills that shift load.

    Rule (module docstring): an empty slot on GPU ``g`` gets a copy of the first expert in
    ``g``'s slots whose every copy is on ``g`` (``even`` and ``locality`` scores stay equal;
    under ``lp`` the copy is one more variable of SGLang's LP, whose interior split moves by a
    hair; ``static`` re-draws SGLang's seeded choices of later experts).
    If there is none, it gets the copy that moves the least load onto ``g`` under an even
    split, ``load[e] * (c_e - k_e) / (c_e (c_e + 1))`` with ``c_e`` copies of which ``k_e``
    on ``g`` (``load`` float ``[L, E]``; without it, the expert with the most copies, then
    the lowest id), and the returned notes say so.

    Returns
    -------
    tuple of (Plan, list of str)
        The filled plan (same dispatch) and zero or more one-line notes.

    Raises
    ------
    PlanError
        On a ``load`` of the wrong shape.
    """
    slots = plan.slots.copy()
    empty = slots < 0
    if not empty.any():
        return plan, []
    L, G, W = slots.shape
    E = plan.experts
    if load is not None:
        load = np.asarray(load, dtype=np.float64)
        if load.shape != (L, E):
            raise PlanError(f"load: expected shape [{L}, {E}], got {list(load.shape)}")
    copies = plan.copies_on_gpu.copy()  # [L, E, G], updated as slots are filled
    shifted: list[tuple[int, int, int]] = []  # (layer, gpu, expert) of load-shifting fills
    for l, g in zip(*np.nonzero(empty.any(axis=2)), strict=True):
        holes = np.flatnonzero(slots[l, g] < 0)
        total = copies[l].sum(axis=1)  # copies of each expert
        here = [int(e) for e in slots[l, g] if e >= 0]
        neutral = [e for e in here if copies[l, e, g] == total[e]]
        if neutral:
            slots[l, g, holes] = neutral[0]
            copies[l, neutral[0], g] += len(holes)
            continue
        for w in holes:
            total = copies[l].sum(axis=1)
            c = total.astype(np.float64)
            k = copies[l, :, g].astype(np.float64)
            weight = load[l] if load is not None else np.ones(E)
            cost = weight * (c - k) / (c * (c + 1))
            # ties: most copies, then lowest id
            e = int(np.lexsort((np.arange(E), -total, cost))[0])
            slots[l, g, w] = e
            copies[l, e, g] += 1
            shifted.append((int(l), int(g), e))
    notes = []
    if shifted:
        l, g, e = shifted[0]
        layers = len({s[0] for s in shifted})
        notes.append(
            f"note: {len(shifted)} empty slot(s) in {layers} layer(s) could not be filled without changing the "
            f"dispatch (their GPU holds no expert whose every copy is on it; first: layer {l} GPU {g}, filled "
            f"with expert {e}); import the file back and evaluate it to see the effect"
        )
    return Plan(slots=slots, experts=E, dispatch=plan.dispatch), notes


def engine_slots(plan: Plan, load: np.ndarray | None = None) -> np.ndarray:
    """int64 ``[L, P]``: the physical-to-logical map of a plan, empty slots filled.

    Slot ``p`` lies on GPU ``p // W``; fill rule of [`fill_empty_slots`][moeopt.interop.fill_empty_slots].
    """
    filled, _ = fill_empty_slots(plan, load)
    return np.array(filled.slots.reshape(plan.layers, -1))


# ----------------------------------------------------------------------------- slots -> plan
def plan_from_physical(
    phy2log: Any,
    gpus: int,
    *,
    experts: int | None = None,
    dispatch: Dispatch | None = None,
    source: str | None = None,
    field: str = "physical_to_logical_map",
) -> Plan:
    """A plan from a physical-to-logical map ``[L, P]``: slot ``p`` on GPU ``p // (P / G)``.

    Nothing is merged or reordered: ``plan.slots[l].reshape(-1)`` is ``phy2log[l]``.

    Parameters
    ----------
    phy2log
        int ``[L, P]`` logical expert of every physical slot.
    gpus
        G; must divide P.
    experts
        E; by default one more than the largest id.
    dispatch
        The plan's dispatch (default ``even``).
    source, field
        Named in error messages.

    Raises
    ------
    InputError
        On a wrong shape, ids out of range, G not dividing P, or an expert without a slot.
    """
    table = to_numpy(phy2log, source, field)
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise InputError(source, field, f"expected [layers, physical slots], got shape {list(table.shape)}")
    L, P = table.shape
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1 or P % gpus:
        raise InputError(source, "gpus", f"{P} physical slots per layer do not split evenly over {gpus} GPUs")
    if table.min() < 0:
        raise InputError(source, field, f"logical id {int(table.min())} is negative")
    E = int(table.max()) + 1 if experts is None else int(experts)
    if table.max() >= E:
        raise InputError(source, field, f"logical id {int(table.max())} out of range [0, {E - 1}] (E = {E})")
    if E > P:  # checked before the [L, E] table below: a huge id must not allocate
        what = f"logical id {E - 1}" if experts is None else f"{E} experts"
        raise InputError(
            source, field, f"{what} cannot fit: {P} physical slots per layer hold at most {P} logical experts"
        )
    present = np.zeros((L, E), dtype=bool)
    present[np.repeat(np.arange(L), P), table.ravel()] = True
    if not present.all():
        l, e = np.argwhere(~present)[0]
        raise InputError(source, f"{field}[{l}]", f"logical expert {e} has no physical slot")
    try:
        return Plan(slots=table.reshape(L, int(gpus), P // int(gpus)), experts=E, dispatch=dispatch or Dispatch())
    except PlanError as exc:  # pragma: no cover - checked above
        raise InputError(source, field, str(exc)) from None
