"""The serving engines' own routing code, loaded from their files without importing their packages.

SGLang, vLLM and vLLM-Ascend are whole serving stacks: importing one of their modules runs the
package's ``__init__`` and imports CUDA kernels, transformers, ... . The functions that decide
where a token goes are plain Python (and torch) inside those modules, so this module parses
the engine's *file* with :mod:`ast`, keeps only the named top-level definitions (functions
and classes, also those defined inside a top-level ``if``, as vLLM's Triton kernels are),
and executes them in a namespace holding ``torch``, ``random``, the ``typing`` names and
small stubs for the engine's configuration getters. The code objects keep the file's name
and line numbers, so tracebacks (and Triton's ``inspect.getsource``) point into the engine's
own file.

Used by ``tests/test_engine_routing.py`` (SGLang, live) and by
``tests/data/engines/make_fixtures.py`` (all three engines, to write the fixtures).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import random
import sys
import typing
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

#: SGLang's file holding the static dispatch (relative to the ``sglang`` package).
SGLANG_FILE = ("srt", "eplb", "expert_location.py")
#: What ``init_by_mapping`` runs down to ``compute_logical_to_rank_dispatch_physical_map``.
SGLANG_NAMES = (
    "ExpertLocationMetadata",
    "_compute_elastic_expert_layout",
    "append_trivial_expert_slots",
    "_compute_logical_to_all_physical_map",
    "_pad_nested_array",
    "compute_logical_to_rank_dispatch_physical_map",
    "_logical_to_all_physical_raw",
    "_compute_gpu_id_of_physical_expert",
    "_compute_node_id_of_physical_expert",
    "_find_nearest_expert",
    "_fair_choices",
)

#: vLLM 0.34 files (relative to the unpacked wheel's root, the folder holding ``vllm/``).
VLLM_STATE_FILE = ("vllm", "distributed", "eplb", "eplb_state.py")
VLLM_KERNEL_FILE = ("vllm", "model_executor", "layers", "fused_moe", "eplb_triton.py")
VLLM_ROUTER_FILE = ("vllm", "model_executor", "layers", "fused_moe", "router", "base_router.py")
#: vLLM-Ascend 0.23 file (relative to the unpacked sdist's root, the folder holding ``vllm_ascend/``).
ASCEND_FILE = ("vllm_ascend", "eplb", "core", "eplb_utils.py")


def load_definitions(path: Path, names: Sequence[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute only the definitions ``names`` of the Python file ``path`` in ``namespace``.

    A definition is a top-level ``def`` / ``class``, or one in the first branch of a top-level
    ``if`` (vLLM defines its Triton kernels under ``if current_platform.is_cuda_alike()``).
    The file's ``from __future__ import annotations``, if any, is kept (annotations then stay
    unevaluated, as in the engine). Returns ``namespace``.

    Raises
    ------
    LookupError
        If a name is not defined in the file (the engine moved or renamed it).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, ast.stmt] = {}
    future: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future.append(node)
        candidates = node.body if isinstance(node, ast.If) else [node]
        for sub in candidates:
            if isinstance(sub, (ast.FunctionDef, ast.ClassDef)) and sub.name in names:
                found.setdefault(sub.name, sub)
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{path}: no definition of {', '.join(missing)}")
    chosen = sorted(found.values(), key=lambda n: n.lineno)
    for node in chosen:  # a def found inside an ``if`` keeps its line but leaves its indentation
        node.col_offset = 0
    module = ast.Module(body=future + chosen, type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    return namespace


def module_namespace(name: str, **names: Any) -> dict[str, Any]:
    """The ``__dict__`` of a new module ``name`` holding ``names``, registered in ``sys.modules``
    (``dataclass`` looks a class's module up there to read its string annotations)."""
    module = ModuleType(name)
    module.__dict__.update(names)
    sys.modules[name] = module
    return module.__dict__


def sglang_path() -> Path | None:
    """SGLang's ``expert_location.py``, located without running ``sglang/__init__`` (None if absent)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*SGLANG_FILE)
        if path.is_file():
            return path
    return None


class SGLangStatic:
    """SGLang's static dispatch, run through its own ``ExpertLocationMetadata.init_by_mapping``.

    Stubs stand for the serving stack's configuration: ``get_parallel()`` (``ep_size``,
    ``nnodes``, no elastic EP), ``get_exec().moe`` (``moe_a2a_backend="deepep"``, under which
    SGLang collapses each rank's candidate list to its near copy; ``ep_dispatch_algorithm=
    "static"``; ``ep_num_redundant_experts = P - E``; ``ep_join_mode`` not ``"scale"``),
    ``get_device()`` (CPU), ``_prefer_same_node_experts`` (the engine's own expression without
    elastic EP: ``ep_join_mode != "scale"``) and ``ModelConfigForExpertLocation`` (the map's
    rows and E, as the model class would report them).
    """

    def __init__(self, path: Path | None = None) -> None:
        import torch
        import torch.nn.functional as F

        path = path or sglang_path()
        if path is None:
            raise ImportError("sglang is not installed")
        self.path = path
        self._parallel = SimpleNamespace(ep_size=1, nnodes=1, elastic_ep_initial_size=None, tp_size=1)
        self._moe = SimpleNamespace(
            moe_a2a_backend="deepep",
            ep_join_mode="none",
            ep_dispatch_algorithm="static",
            ep_num_redundant_experts=0,
        )
        self._model = SimpleNamespace(num_layers=0, num_logical_experts=0, num_groups=None)
        model = self._model

        class ModelConfigForExpertLocation:  # the model class's report, without loading a model
            @staticmethod
            def from_model_config(model_config: Any) -> SimpleNamespace:
                return model

        exec_config = SimpleNamespace(moe=self._moe)
        self.ns = module_namespace(
            "_moeopt_tests_sglang_expert_location",
            torch=torch,
            F=F,
            random=random,
            json=json,
            dataclass=dataclass,
            logger=logging.getLogger("sglang.srt.eplb.expert_location"),
            get_parallel=lambda: self._parallel,
            get_exec=lambda: exec_config,
            get_device=lambda: SimpleNamespace(device="cpu"),
            _prefer_same_node_experts=lambda: exec_config.moe.ep_join_mode != "scale",
            ModelConfigForExpertLocation=ModelConfigForExpertLocation,
            **{name: getattr(typing, name) for name in ("List", "Optional", "Iterable", "TYPE_CHECKING")},
        )
        load_definitions(path, SGLANG_NAMES, self.ns)

    def rank_table(self, phys_to_log: np.ndarray, experts: int, ep_size: int, nnodes: int, rank: int) -> np.ndarray:
        """int ``[rows, E]``: rank ``rank``'s ``logical_to_rank_dispatch_physical_map``.

        ``phys_to_log`` is the ``--init-expert-location`` map ``[rows, P]`` (dense rows
        included); SGLang's node size is ``ep_size // nnodes``.
        """
        import torch

        rows, P = phys_to_log.shape
        self._parallel.ep_size, self._parallel.nnodes = ep_size, nnodes
        self._moe.ep_num_redundant_experts = P - experts
        self._model.num_layers, self._model.num_logical_experts = rows, experts
        meta = self.ns["ExpertLocationMetadata"].init_by_mapping(
            None, physical_to_logical_map=torch.tensor(np.asarray(phys_to_log, dtype=np.int64)), moe_ep_rank=rank
        )
        return np.asarray(meta.logical_to_rank_dispatch_physical_map.numpy())

    def tables(
        self, phys_to_log: np.ndarray, experts: int, ep_size: int, nnodes: int, ranks: Sequence[int]
    ) -> np.ndarray:
        """int ``[len(ranks), rows, E]``: :meth:`rank_table` of each rank."""
        return np.stack([self.rank_table(phys_to_log, experts, ep_size, nnodes, r) for r in ranks])


#: SGLang's LP dispatch: its solver class (the LP's matrices); the three CUDA kernels it launches
#: are transcribed below from ``sglang/kernels/jit/csrc/lplb/{lp_prep,ipm,lp_post}.cuh``
SGLANG_LPLB_FILE = ("srt", "eplb", "lplb_solver.py")


def _lp_prep(
    A_full: Any, b: Any, t1: Any, global_counts: Any, log_single: Any, log_replicated: Any, B1: Any, A_base_row_sum: Any
) -> None:
    """``lp_prep.cuh``: its "Python equivalent" comment, line for line."""
    import torch

    total = global_counts.sum()
    counts_norm = global_counts / total.clamp(min=1.0)
    t1.copy_(counts_norm[log_single])
    b1 = counts_norm[log_replicated]
    b2 = -(B1 @ t1).flatten()
    b.copy_(torch.cat([b1, b2]))
    A_full[:, -1] = b - A_base_row_sum


def _ipm(A: Any, b: Any, c: Any, num_iters: int = 5, result: Any = None) -> Any:
    """``ipm.cuh`` (``ipm_solve_kernel``) in float32: affine scaling from every variable 1, the
    Cholesky with its pivot floor, the step ``0.999 / max d``, the convergence test and the 0.5
    written on failure."""
    import torch

    nc, nv = A.shape
    x = torch.ones(nv, dtype=torch.float32)
    d_max = torch.tensor(0.0)
    for _ in range(num_iters):
        ax2 = A * x * x
        ax2a = ax2 @ A.T
        ax2c = ax2 @ c
        low = ax2a.clone()
        for k in range(nc):  # cholesky_factor
            low[k, k] = torch.sqrt(torch.clamp(low[k, k], min=1e-12))
            low[k + 1 :, k] /= low[k, k]
            col = low[k + 1 :, k]
            low[k + 1 :, k + 1 :] -= torch.tril(torch.outer(col, col))
        w = ax2c.clone()
        for i in range(nc):  # cholesky_apply: forward, then backward
            w[i] = (w[i] - low[i, :i] @ w[:i]) / low[i, i]
        for i in range(nc - 1, -1, -1):
            w[i] = (w[i] - low[i + 1 :, i] @ w[i + 1 :]) / low[i, i]
        r = w @ A
        d = x * (c - r)
        d_max = torch.clamp(d.max(), min=0.0)
        alpha = 0.999 / d_max if d_max > 1e-9 else torch.tensor(1.0)
        x = x * (1.0 - alpha * d)
    residual = (A @ x - b).abs().max()
    ok = bool(d_max < 0.1) and bool(x[-1] >= 0.0) and bool(x[-1] < 1e-4) and bool(residual < 0.05)
    out = x if ok else torch.full_like(x, 0.5)
    if result is not None:
        result.copy_(out)
        return result
    return out


def _lp_post(log2phy_prob: Any, x: Any, t1: Any, phy_single: Any, phy_replicated: Any, log2phy: Any) -> None:
    """``lp_post.cuh``: its "Python equivalent" comment (-1 entries land on the zero sink)."""
    import torch

    x_ratios = torch.clamp(x[: len(phy_replicated)], min=0)
    phy_prob = torch.zeros(len(phy_single) + len(phy_replicated) + 1)
    phy_prob[phy_replicated] = x_ratios
    phy_prob[phy_single] = t1
    log2phy_prob.copy_(torch.take(phy_prob, torch.where(log2phy < 0, log2phy + len(phy_prob), log2phy)))


class SGLangLPLB:
    """SGLang's LP dispatch (``--ep-dispatch-algorithm lp``) on CPU: its own ``LPLBSolver`` (the
    LP's matrices, the counts and the dispatch probabilities) with the kernels it calls standing
    in as transcriptions (`_lp_prep`, `_ipm`, `_lp_post`) and the JIT warm-up a no-op."""

    def __init__(self) -> None:
        import torch

        root = sglang_path()
        if root is None:
            raise ImportError("sglang is not installed")
        path = root.parents[2].joinpath(*SGLANG_LPLB_FILE)
        self.ns = module_namespace(
            "_moeopt_tests_sglang_lplb",
            torch=torch,
            logger=logging.getLogger("sglang.srt.eplb.lplb_solver"),
            Optional=typing.Optional,
        )
        load_definitions(path, ("LPLBSolver",), self.ns)
        kernels = SimpleNamespace(prep_lp_inputs=_lp_prep, solve_ipm=_ipm, extract_log2phy_prob=_lp_post)
        self.stubs = {
            "sglang.kernels.ops.lplb": SimpleNamespace(cuda_solver=kernels),
            "sglang.kernels.ops.lplb.cuda_solver": kernels,
            "sglang.kernels.ops.lplb.torch_solver": SimpleNamespace(warmup=lambda *a, **k: None),
        }

    def shares(self, slots: np.ndarray, experts: int, counts: np.ndarray) -> np.ndarray:
        """float ``[T, G * W]``: each physical slot's share of its expert's tokens in each batch, as
        SGLang's dispatch kernel draws (the probabilities of the expert's copies, normalized)."""
        import torch

        G, W = slots.shape
        phys = np.asarray(slots).reshape(-1)
        copies = [np.flatnonzero(phys == e) for e in range(experts)]
        width = max(len(c) for c in copies)
        log2phy = torch.tensor([list(c) + [-1] * (width - len(c)) for c in copies], dtype=torch.int64)
        saved = {name: sys.modules.get(name) for name in self.stubs}
        sys.modules.update(self.stubs)  # the solver's imports inside __init__ and _solve
        try:
            solver = self.ns["LPLBSolver"](
                torch.tensor(phys, dtype=torch.int64),
                log2phy,
                G,
                logical_to_all_physical_map_num_valid=torch.tensor([len(c) for c in copies]),
            )
            out = np.zeros((len(counts), G * W))
            for t, row in enumerate(np.asarray(counts)):
                prob = solver._solve(torch.tensor(row, dtype=torch.float32)).numpy().astype(np.float64)
                for e, c in enumerate(copies):
                    p = prob[e, : len(c)]
                    out[t, c] = p / p.sum() if p.sum() > 0 else 1.0 / len(c)
            return out
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


def vllm_logical_maps(root: Path) -> Any:
    """vLLM's ``compute_logical_maps`` (``eplb_state.py``; pure torch on CPU)."""
    import torch

    ns = module_namespace("_moeopt_tests_vllm_eplb_state", torch=torch)
    return load_definitions(root.joinpath(*VLLM_STATE_FILE), ["compute_logical_maps"], ns)["compute_logical_maps"]


def vllm_router(root: Path) -> Any:
    """vLLM's ``_eplb_map_and_record_triton`` (``router/base_router.py``): the host function that
    launches ``_eplb_map_and_record_i32_kernel``, which calls ``eplb_map_and_record``
    (``eplb_triton.py``). Needs ``triton`` (``TRITON_INTERPRET=1`` runs it on the CPU)."""
    import torch
    import triton
    import triton.language as tl

    kernel_ns = module_namespace("_moeopt_tests_vllm_eplb_triton", triton=triton, tl=tl)
    load_definitions(root.joinpath(*VLLM_KERNEL_FILE), ["eplb_map_and_record"], kernel_ns)
    ns = module_namespace(
        "_moeopt_tests_vllm_base_router",
        torch=torch,
        triton=triton,
        tl=tl,
        eplb_map_and_record=kernel_ns["eplb_map_and_record"],
    )
    names = ["_eplb_map_and_record_i32_kernel", "_eplb_map_and_record_triton"]
    return load_definitions(root.joinpath(*VLLM_ROUTER_FILE), names, ns)["_eplb_map_and_record_triton"]


def ascend_functions(root: Path) -> dict[str, Any]:
    """vLLM-Ascend's ``expert_file_to_tensor``, ``init_eplb_config`` and ``generate_log2phy_map``
    (``eplb_utils.py``), with ``vllm.logger`` and ``determine_expert_map`` stubbed (the latter is
    only called without an expert map file, which never happens here)."""
    import torch

    def determine_expert_map(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("determine_expert_map is only called without an expert map file")

    ns = module_namespace(
        "_moeopt_tests_vllm_ascend_eplb_utils",
        torch=torch,
        np=np,
        json=json,
        defaultdict=defaultdict,
        logger=logging.getLogger("vllm_ascend"),
        determine_expert_map=determine_expert_map,
    )
    names = ["expert_file_to_tensor", "init_eplb_config", "generate_log2phy_map"]
    return load_definitions(root.joinpath(*ASCEND_FILE), names, ns)
