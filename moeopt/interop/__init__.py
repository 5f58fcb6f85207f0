"""Plans and statistics in the formats of serving engines (SPEC sections 8 and 11).

Pure conversions, no file access ([`moeopt.io`][] reads and writes the files):

* **SGLang** ``--init-expert-location`` JSON: ``{"physical_to_logical_map": [layers][P]}``.
* **DeepSeek EPLB** tensors: ``phy2log [L, P]``, ``log2phy [L, E, max_replicas]`` (padded
  with -1) and ``logcnt [L, E]``.
* **vLLM-Ascend** expert map JSON: ``{"moe_layer_count", "layer_list": [{"layer_id",
  "device_count", "device_list": [{"device_id", "device_expert": [...]}]}]}``.
* **SGLang expert-distribution recorder** dumps: ``per_token`` (token top-k in physical ids)
  and ``stat`` (``logical_count`` per step), read into a [`Trace`][moeopt.trace.Trace] or
  count-only [`Stats`][moeopt.trace.Stats].
* **vLLM EPLB state** tensors (``physical_to_logical_map`` with ``expert_load_window`` or
  ``expert_load_pass``, or ``last_expert_load``): the loads vLLM rebalances on, read into
  count-only [`Stats`][moeopt.trace.Stats] (`vllm_eplb`).

Physical slots
--------------
A ``moeopt.plan/2`` plan *is* a physical layout: ``plan.slots[l]`` is ``[G, W]``, and
physical slot ``p`` of layer ``l`` is ``plan.slots[l].reshape(-1)[p]``, on GPU ``p // W``,
which is the SGLang / EPLB rule ``p // (P / G)``. Engine maps therefore read into a plan
and back with nothing lost, colocated copies (two copies of one expert on one GPU, which
EPLB emits) included: ``Plan(slots=phy2log.reshape(L, G, P // G))``.

Empty slots
-----------
SGLang and EPLB need every physical slot to hold an expert, so a plan's empty slots (-1) are
filled on export ([`fill_empty_slots`][moeopt.interop.fill_empty_slots]). An empty slot on GPU ``g`` is filled with a
copy of an expert *whose every copy is already on* ``g`` (its first such expert, in slot
order): all of that expert's tokens already went to ``g`` and still do, so under ``even``,
``lp`` and ``locality`` every load and every communication figure is unchanged. Under
``static`` the expert's own tokens stay on ``g`` too, but SGLang draws its fixed per-rank
choices for all multi-copy experts from one seeded stream (layers, then experts, in order),
and the filler's extra copy adds a draw to it: the choices of later experts are re-drawn by
the same fair rule (same distribution, another realization). Only when ``g`` holds no
such expert (every expert on ``g`` also has a copy elsewhere, or ``g`` is empty) is a slot
filled with an extra copy that shifts load: the copy that moves the least load onto ``g``
under an even split (by ``load`` when given, otherwise the expert with the most copies),
one slot at a time; [`fill_empty_slots`][moeopt.interop.fill_empty_slots] returns a note for it. A filled slot is a
real copy in the engine, so reading the file back gives the filled plan (the same plan when
no slot was empty).

vLLM-Ascend numbers the physical slots of every device by the count of *distinct* experts on
device 0, so a device listing one expert twice misroutes; the export writes each device's
distinct experts only ([`vllm_ascend_layout`][moeopt.interop.vllm_ascend_layout]) and refuses a plan whose devices would
then hold unequal numbers of experts.

Modules: `slots` (fill rule, maps to plans), `sglang`,
`eplb`, `vllm_ascend`, `vllm_eplb`,
`settings`.
"""

from __future__ import annotations

from moeopt.interop.eplb import from_eplb, to_eplb
from moeopt.interop.settings import engine_settings
from moeopt.interop.sglang import (
    from_sglang,
    read_sglang_dump,
    sglang_dump_kind,
    stats_from_sglang_stat,
    to_sglang,
    trace_from_sglang_per_token,
)
from moeopt.interop.slots import (
    ENGINE_DISPATCH,
    ENGINE_FORMATS,
    ENGINE_NAMES,
    ENGINE_RULES,
    SGLANG_DISPATCH,
    check_engine_rule,
    engine_slots,
    fill_empty_slots,
    plan_from_physical,
    to_numpy,
)
from moeopt.interop.vllm_ascend import from_vllm_ascend, to_vllm_ascend, vllm_ascend_layout, vllm_ascend_redundant
from moeopt.interop.vllm_eplb import is_vllm_eplb_state, stats_from_vllm_eplb

__all__ = [
    "ENGINE_DISPATCH",
    "ENGINE_FORMATS",
    "ENGINE_NAMES",
    "ENGINE_RULES",
    "SGLANG_DISPATCH",
    "check_engine_rule",
    "engine_settings",
    "engine_slots",
    "fill_empty_slots",
    "from_eplb",
    "from_sglang",
    "from_vllm_ascend",
    "is_vllm_eplb_state",
    "plan_from_physical",
    "read_sglang_dump",
    "sglang_dump_kind",
    "stats_from_sglang_stat",
    "stats_from_vllm_eplb",
    "to_eplb",
    "to_numpy",
    "to_sglang",
    "to_vllm_ascend",
    "trace_from_sglang_per_token",
    "vllm_ascend_layout",
    "vllm_ascend_redundant",
]
