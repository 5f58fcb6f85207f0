"""``eplb``: DeepSeek's Expert-Parallelism Load Balancer, as shipped in SGLang, as a baseline.

This calls the real algorithm (``rebalance_experts`` of DeepSeek's ``eplb.py``, vendored by
SGLang as ``sglang.srt.eplb.eplb_algorithms.deepseek``) on the calibration workload's
per-expert loads and turns its physical-to-logical map into a plan/2 with ``even``
dispatch, which is EPLB's own load model (every copy serves ``1/c`` of its expert's tokens).
The plan is scored by moeopt's own code, not by EPLB.

Install (optional): ``pip install -e '.[eplb]'`` (torch) and ``pip install --no-deps
'sglang>=0.5'``. SGLang is installed without its dependencies on purpose: they are a whole
serving stack (CUDA kernels, transformers, FlashInfer, ...), and the one file used here
imports only ``torch``. Importing ``sglang.srt.eplb.eplb_algorithms.deepseek`` the usual
way would run ``sglang/__init__.py``, which imports that stack (``psutil``, ``transformers``,
...) and fails without it, so `load_deepseek_eplb` locates the installed ``sglang``
package with `importlib.util.find_spec` (which does not execute the package's
``__init__``) and loads only ``srt/eplb/eplb_algorithms/deepseek.py`` from it, under a
private module name.

EPLB may put two copies of one expert on one GPU ("colocated"); they are kept, as an engine
running EPLB's map would hold them, so this method declares ``emits_colocated = True`` and
``solve`` does not apply the own-planner colocation check to it.

Policies: ``global`` and ``hierarchical`` are EPLB's two; ``auto`` (the default) picks one as
SGLang's default ``--eplb-algorithm auto`` does (``compute_algorithm`` in
``sglang/srt/eplb/eplb_algorithms/__init__.py``, re-implemented in `resolve_policy`):
hierarchical when the model has expert groups (SGLang's ``num_groups``: the router's
``n_group``, ``model.expert_groups`` here) and they are a multiple of the nodes (SGLang's
``nnodes``; ``gpus / cluster.gpus_per_node`` here), else global.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from moeopt import console
from moeopt.errors import InputError
from moeopt.instance import Model
from moeopt.methods.baselines import baseline_result
from moeopt.plan import Dispatch, Plan
from moeopt.registry import Context, Problem, register
from moeopt.result import Result

#: The one line shown when sglang or torch is missing (``solve`` wraps it).
INSTALL_HINT = "needs sglang and torch: pip install -e '.[eplb]' then pip install --no-deps 'sglang>=0.5'"

#: Where SGLang keeps DeepSeek's EPLB, relative to the ``sglang`` package (newest first).
_CANDIDATES = (
    ("srt", "eplb", "eplb_algorithms", "deepseek.py"),  # sglang >= 0.4.8 / 0.5
    ("srt", "managers", "eplb_algorithms", "deepseek.py"),  # older 0.4.x layout
)
_MODULE_NAME = "_moeopt_sglang_eplb_deepseek"
_PACKAGE = "sglang"  # the installed package to look in (tests point it elsewhere)

POLICIES = ("auto", "global", "hierarchical")


def load_deepseek_eplb() -> ModuleType:
    """SGLang's copy of DeepSeek's ``eplb.py``, loaded with only torch.

    Raises `ImportError` (with the reason) when torch, sglang or the file is missing.
    """
    cached = sys.modules.get(_MODULE_NAME)
    if cached is not None:
        return cached
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"torch is not installed ({exc})") from None
    spec = importlib.util.find_spec(_PACKAGE)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    for root in spec.submodule_search_locations:
        for parts in _CANDIDATES:
            path = Path(root).joinpath(*parts)
            if path.is_file():
                file_spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
                assert file_spec is not None and file_spec.loader is not None
                module = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(module)
                if not callable(getattr(module, "rebalance_experts", None)):
                    raise ImportError(f"{path} has no rebalance_experts")
                sys.modules[_MODULE_NAME] = module
                return module
    raise ImportError("this sglang has no eplb_algorithms/deepseek.py (need sglang >= 0.5)")


def rebalance(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int, hierarchical: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run EPLB's ``rebalance_experts``: ``(phy2log [L, P], log2phy [L, E, X], logcnt [L, E])``.

    ``hierarchical=False`` is EPLB's global policy (one group, one node).
    """
    import torch

    eplb = load_deepseek_eplb()
    w = torch.as_tensor(np.asarray(weight, dtype=np.float64))
    kwargs: dict[str, Any] = dict(
        num_replicas=num_replicas, num_groups=num_groups, num_nodes=num_nodes, num_gpus=num_gpus
    )
    if "enable_hierarchical" in inspect.signature(eplb.rebalance_experts).parameters:
        kwargs["enable_hierarchical"] = hierarchical
    elif not hierarchical:  # DeepSeek's original file: the global policy is groups = nodes = 1
        kwargs.update(num_groups=1, num_nodes=1)
    phy2log, log2phy, logcnt = eplb.rebalance_experts(w, **kwargs)
    return phy2log.cpu().numpy(), log2phy.cpu().numpy(), logcnt.cpu().numpy()


def resolve_policy(num_groups: int | None, num_nodes: int) -> tuple[str, str]:
    """The policy SGLang's default ``--eplb-algorithm auto`` runs, and why.

    SGLang's ``compute_algorithm("auto", num_groups, num_nodes)`` (SGLang 0.5) picks the
    hierarchical policy when ``num_groups is not None and num_groups % num_nodes == 0``, else
    the global one (``deepseek``). SGLang takes ``num_groups`` from the model
    (``ModelConfigForExpertLocation.num_groups``: DeepSeek-V2/V3's router ``n_group``, None
    for models without expert groups) and ``num_nodes`` from the server's node count.

    Parameters
    ----------
    num_groups
        The router's expert groups (``model.expert_groups``, or ``method.num_groups`` when
        given); None: the model has none.
    num_nodes
        Nodes of the cluster (``gpus / cluster.gpus_per_node``).

    Returns
    -------
    tuple[str, str]
        ``("hierarchical" | "global", reason)``; the reason is a phrase for the note line.
    """
    if num_groups is not None and num_groups % num_nodes == 0:
        return "hierarchical", f"{num_groups} expert groups over {num_nodes} node{'s' * (num_nodes != 1)}"
    if num_groups is None:
        return "global", "the model has no expert groups (model.expert_groups)"
    return "global", f"{num_groups} expert groups are not a multiple of the {num_nodes} nodes"


def default_groups(model: Model, nodes: int) -> int:
    """EPLB's ``num_groups`` when the user gives none: the router's expert groups
    (``model.expert_groups``, SGLang passes DeepSeek-V3's ``n_group``) when the hierarchical
    policy can use them (a multiple of the nodes), else one group per node."""
    groups = model.expert_groups
    return groups if groups is not None and groups % nodes == 0 else nodes


@register
class Eplb:
    """DeepSeek's EPLB on the calibration loads: the policy SGLang's default picks (``auto``),
    or the global or hierarchical policy by name."""

    name: ClassVar[str] = "eplb"
    summary: ClassVar[str] = (
        "DeepSeek's EPLB as shipped in SGLang (auto = SGLang's default, global, hierarchical); needs the eplb extra"
    )
    requires: ClassVar[frozenset[str]] = frozenset()
    metric_hooks: ClassVar[tuple] = ()
    #: EPLB may place two copies of one expert on one GPU; they are kept (solve reads this).
    emits_colocated: ClassVar[bool] = True
    install_hint: ClassVar[str] = INSTALL_HINT
    #: EPLB balances each layer on its own: solved layer by layer, MaxVio averaged
    combine: ClassVar[str] = "mean"
    #: EPLB balances every layer in one batched torch call
    layerwise: ClassVar[bool] = False
    uses_trace: ClassVar[bool] = True
    stats_rules: ClassVar[dict] = {
        "eplb_wall_time": "sum",
        "policy": "same",
        "policy_resolved": "same",
        "num_groups": "same",
        "num_nodes": "same",
        "num_replicas": "same",
        "max_copies": "max",
    }

    @dataclass
    class Params:
        #: "auto" (SGLang's default): hierarchical when the expert groups are a multiple of the
        #: nodes, else global (`resolve_policy`); "global": replicate and pack over all
        #: GPUs; "hierarchical": pack expert groups to nodes first (nodes = gpus /
        #: cluster.gpus_per_node), then replicate within nodes.
        policy: str = "auto"
        #: hierarchical and auto: expert groups (EPLB's ``num_groups``, DeepSeek-V3's ``n_group``
        #: = 8); must divide the experts and, for hierarchical, be a multiple of the nodes.
        #: Default: the model's ``expert_groups`` (what SGLang passes: the router's ``n_group``);
        #: for hierarchical, when that is not a multiple of the nodes (or absent), the nodes.
        num_groups: int | None = field(default=None, metadata={"ge": 1})

        def __post_init__(self) -> None:
            if self.policy not in POLICIES:
                raise ValueError(f"policy must be one of {', '.join(map(repr, POLICIES))}, got {self.policy!r}")
            if self.num_groups is not None:
                if self.num_groups < 1:
                    raise ValueError(f"num_groups must be >= 1, got {self.num_groups}")
                if self.policy == "global":
                    raise ValueError("num_groups applies only to policy: hierarchical or auto")

    def available(self) -> bool:
        try:
            load_deepseek_eplb()
        except Exception:  # noqa: BLE001 - any failure to load the file means "not available"
            return False
        return True

    def solve(self, problem: Problem, params: Params, ctx: Context) -> Result:
        t0 = time.perf_counter()
        src = str(problem.instance.source) if problem.instance.source else None
        try:
            load_deepseek_eplb()
        except Exception as exc:  # noqa: BLE001
            raise InputError(src, "method.name", f"method 'eplb' {INSTALL_HINT} ({exc})") from None
        c = problem.instance.cluster
        L, E, G, W = problem.layers, problem.experts, c.gpus, c.width
        P = G * W
        if P < E:
            raise InputError(src, "cluster", f"eplb needs at least {E} slots per layer (one per expert), got {G} x {W}")
        model, nodes = problem.instance.model, c.nodes
        note = None
        policy = params.policy
        if policy == "auto":  # SGLang's num_groups is the model's router groups, unless given here
            given = params.num_groups if params.num_groups is not None else model.expert_groups
            policy, why = resolve_policy(given, nodes)
            note = f"eplb: auto -> {policy}: {why}, as SGLang's default (--eplb-algorithm auto)"
        hierarchical = policy == "hierarchical"
        groups = params.num_groups if params.num_groups is not None else default_groups(model, nodes)
        if hierarchical:
            if E % groups:
                raise InputError(
                    src, "method.num_groups", f"eplb hierarchical: {groups} groups must divide {E} experts"
                )
            if groups % nodes:
                raise InputError(
                    src,
                    "method.num_groups",
                    f"eplb hierarchical: {groups} groups must be a multiple of the {nodes} nodes "
                    f"(gpus / cluster.gpus_per_node)",
                )
        weight = np.asarray(problem.stats.expert_load, dtype=np.float64)
        t1 = time.perf_counter()
        phy2log, _log2phy, logcnt = rebalance(
            weight, P, groups if hierarchical else 1, nodes if hierarchical else 1, G, hierarchical
        )
        eplb_time = time.perf_counter() - t1
        plan = Plan(slots=phy2log.reshape(L, G, W), experts=E, dispatch=Dispatch(kind="even"))
        stats = {
            "eplb_wall_time": eplb_time,
            "policy": params.policy,
            "policy_resolved": policy,
            "num_groups": groups if hierarchical else 1,
            "num_nodes": nodes if hierarchical else 1,
            "num_replicas": P,
            "colocated_copies": plan.colocated,
            "max_copies": int(logcnt.max()),
        }
        if note is not None:
            stats["note"] = note
            console.note(f"note: {note}")
        return baseline_result(self.name, plan, problem, params, t0, stats)
