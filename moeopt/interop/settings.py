"""The serving-engine command-line settings that load a written placement file."""

from __future__ import annotations

import json

from moeopt.interop.slots import (
    SGLANG_DISPATCH,
)
from moeopt.interop.vllm_ascend import vllm_ascend_layout
from moeopt.plan import Plan


def engine_settings(fmt: str, plan: Plan, path: str, *, dense_layers: int = 0) -> list[str]:
    """How to start the engine with an exported file: one line per setting.

    ``plan`` is the plan as exported (after `fill_empty_slots`); its dispatch picks
    SGLang's ``--ep-dispatch-algorithm``.
    """
    E, G = plan.experts, plan.gpus
    if fmt == "sglang":
        P = plan.gpus * plan.width
        algo = SGLANG_DISPATCH.get(plan.dispatch.kind)
        flags = f"--ep-size {G} --init-expert-location {path} --ep-num-redundant-experts {P - E}"
        lines = [f"sglang: {flags}" + (f" --ep-dispatch-algorithm {algo}" if algo else "")]
        if algo == "static" or algo == "lp":
            lines.append(
                f"sglang: --ep-dispatch-algorithm {algo} needs an all-to-all backend (e.g. --moe-a2a-backend deepep)"
            )
        if algo is None:
            lines.append(
                f"sglang: dispatch {plan.dispatch.kind!r} has no SGLang equivalent; use --dispatch even, static or lp"
            )
        if dense_layers:
            lines.append(f"sglang: the map has {dense_layers} leading dense-layer rows")
        return lines
    if fmt == "vllm-ascend":
        table, _ = vllm_ascend_layout(plan)
        R = G * table.shape[2] - E
        cfg = json.dumps({"eplb_config": {"expert_map_path": path, "num_redundant_experts": R}})
        return [f"vllm-ascend: --enable-expert-parallel --additional-config '{cfg}'"]
    P = plan.gpus * plan.width
    return [f"eplb: {plan.layers} layers x {P} physical slots ({G} GPUs x {plan.width}), {P - E} redundant"]
