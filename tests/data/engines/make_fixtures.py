"""Write the engine-routing fixtures of ``tests/test_engine_routing.py`` by running each engine's own code.

For every plan below, this script exports the plan with moeopt's own command line (``python
-m moeopt export``) and runs the serving engines' *own* routing functions on the exported
files, loaded from the engines' source files (``tests/engine_code.py``: the named
definitions only, parsed with ``ast``; nothing of moeopt's routing code is used here):

* **SGLang 0.5.23** (``sglang/srt/eplb/expert_location.py``): ``ExpertLocationMetadata.
  init_by_mapping`` on the ``--init-expert-location`` map (dense rows included), once per
  rank, with the a2a backend ``deepep`` (static dispatch): each rank's
  ``logical_to_rank_dispatch_physical_map``. The same as the live test, so the fixtures hold
  every engine, and all 64 ranks of the DeepSeek-V3-shaped plan (about 1.5 s a rank: too
  slow for CI, which runs a few ranks of it live).
* **vLLM 0.34.0**: ``compute_logical_maps`` (``vllm/distributed/eplb/eplb_state.py``) on the
  plan's slots as vLLM's ``physical_to_logical_map`` ``[L, P]`` (vLLM reads no placement
  file: its EPLB state holds this map; -1 is an unused slot, which it skips), then the
  router's Triton kernel for real: ``_eplb_map_and_record_triton`` and
  ``_eplb_map_and_record_i32_kernel`` (``vllm/model_executor/layers/fused_moe/router/
  base_router.py``), which call ``eplb_map_and_record`` (``.../fused_moe/eplb_triton.py``),
  run under Triton's CPU interpreter (``TRITON_INTERPRET=1``) on batches of top-k ids: the
  physical id of every (row, top-k entry) and the per-slot load the kernel records.
  Triton 3.9's interpreter types the result of a comparison with its operands' type rather
  than ``int1``: the kernel's ``record = (tl.load(record_enabled) != 0) & ...`` then splats
  a scalar comparison into an int32 block, and ``tl.atomic_add(..., mask=record)`` stops
  with "mask has unsupported dtype" (compiled Triton has ``i1`` there). When that happens
  the script re-types comparison results as ``int1`` (:func:`_fix_triton_comparisons`) and
  runs the kernel unchanged; the kernel's picks are also checked against its integer
  expression as written in ``eplb_triton.py``::

      hashed = (token_idx.to(tl.int64) * KNUTH_MULTIPLIER) & 0xFFFFFFFF
      physical_ids = tl.load(logical_to_physical + safe_ids * map_stride + hashed % replicas, ...)

  with ``token_idx = offs // num_active_experts`` (the row in the batch). Without Triton the
  script falls back to that expression (``--no-triton``) and records so in the fixture.
* **vLLM-Ascend 0.23.0.post1** (``vllm_ascend/eplb/core/eplb_utils.py``): ``init_eplb_config``
  (which calls ``expert_file_to_tensor``, builds ``global_expert_map`` and calls
  ``generate_log2phy_map``) on the JSON that ``export --format vllm-ascend --dispatch ascend``
  writes, for every rank and MoE layer, with ``tp_size`` None, 2 and 4; ``.npu()`` is made a
  no-op on CPU tensors for the run.

Plans: ``deepseek-v3.npz``, moeopt's ``balance`` on the bundled DeepSeek-V3 prefill loads
(``instances/real/deepseek-v3-prefill.yaml``) re-shaped to 64 GPUs x (4 + 1) slots, 8 GPUs a
node, 3 dense layers (copy counts 1 to 10); ``colocated.npz``, 3 layers x 64 experts on 16
GPUs x 7 slots, 4 a node, every GPU holding 6 distinct experts and one colocated second
copy, copy counts 3, 5, 6 and 7 among them (none divides 16); ``random.npz``, small random
plans (seeded, stored with the fixtures): colocated copies, nodes, dense rows, E not dividing
G, empty slots (vLLM and vLLM-Ascend only: SGLang's export fills them, another plan).

Each ``.npz`` holds, per plan (prefix ``<plan>/`` in ``random.npz``): ``slots`` ``[L, G, W]``
and ``experts``; SGLang: ``sglang_dense`` ``[K]`` (dense rows before the MoE ones),
``sglang_nnodes`` ``[K]`` (SGLang's ``nnodes``: node size ``G // nnodes``; 1: no node
preference) and ``sglang`` ``[K, G, L, E]`` (each rank's table, MoE rows only);
vLLM: ``vllm_l2p`` ``[L, E, C]``, ``vllm_count`` ``[L, E]``; two batches, ``vllm_full_*`` (every
row lists all E experts, so every (row, expert) pair is routed) and ``vllm_*`` (top-k rows):
``topk`` ``[N, k]`` logical ids, ``physical`` ``[L, N, k]`` the kernel's picks, ``load``
``[L, P]`` the per-slot load it records;
vLLM-Ascend: ``ascend_device_expert`` ``[L, G, D]`` (the exported map),
``ascend_tp`` ``[3]`` (0 for None) and ``ascend`` ``[3, G, L, E]`` (each rank's ``log2phy``).
Ids are int16, and the files are LZMA-compressed (:func:`save_npz`). ``engines`` names the
versions and how vLLM's kernel ran.

How to run (from the repository root; about 15 minutes on 2 cores, most of it vLLM-Ascend's
``generate_log2phy_map`` over 64 ranks x 58 layers x 3 TP sizes)::

    . /work/venv/bin/activate                                  # the project's venv (torch, sglang)
    pip install --no-deps sglang==0.5.23                       # as CI does
    mkdir -p /tmp/wheels && cd /tmp/wheels
    pip download --no-deps "vllm==0.34.0"                      # 240 MB wheel, not installable here
    python -m zipfile -e vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl vllm
    pip install setuptools_scm
    SOC_VERSION=ascend910b1 pip download --no-deps --no-build-isolation vllm-ascend==0.23.0.post1
    tar -xzf vllm_ascend-0.23.0.post1.tar.gz
    python -m venv /tmp/triton-venv && /tmp/triton-venv/bin/pip install triton==3.9.0
    cd -
    TRITON_INTERPRET=1 PYTHONPATH=.:$VIRTUAL_ENV/lib/python3.11/site-packages \\
        /tmp/triton-venv/bin/python tests/data/engines/make_fixtures.py \\
        --vllm /tmp/wheels/vllm --vllm-ascend /tmp/wheels/vllm_ascend-0.23.0.post1

For a new engine version, download that version the same way, change the versions in
:data:`ENGINES`, re-run, and run ``python -m pytest tests/test_engine_routing.py``: a
routing change in the engine shows there as differing picks. A definition the engine moved
or renamed stops the script with the file and the missing name.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from moeopt import load_instance, solve, write_plan  # noqa: E402
from moeopt.plan import Plan  # noqa: E402
from tests.engine_code import SGLangStatic, ascend_functions, sglang_path, vllm_logical_maps, vllm_router  # noqa: E402
from tests.strategies import random_slots  # noqa: E402

HERE = Path(__file__).resolve().parent
ENGINES = {"sglang": "0.5.23", "vllm": "0.34.0", "vllm-ascend": "0.23.0.post1"}
ASCEND_TP = (None, 2, 4)
#: each fixture's own random stream (plans, vLLM's batches), so any subset re-makes the same files
SEEDS = {"deepseek-v3": 20260601, "colocated": 20260602, "random": 20260603}


# ----------------------------------------------------------------------------- plans
def deepseek_v3_plan() -> Plan:
    """``balance`` on the DeepSeek-V3 prefill loads, 64 GPUs x (4 + 1) slots, 8 GPUs a node."""
    inst = load_instance(ROOT / "instances" / "real" / "deepseek-v3-prefill.yaml")
    cluster = dataclasses.replace(inst.cluster, gpus=64, slots_per_gpu=4, replica_slots_per_gpu=1, gpus_per_node=8)
    result = solve(dataclasses.replace(inst, cluster=cluster), method="balance")
    assert result.plan is not None
    return result.plan


def distinct_per_device(counts: np.ndarray, G: int, D: int, W: int, rng: np.random.Generator, extra: str) -> np.ndarray:
    """int ``[G, W]``: expert e on ``counts[e]`` distinct devices, D distinct experts a device,
    then ``W - D`` more slots a device: a colocated copy of one of its experts (``extra=
    "colocated"``) or empty (``"empty"``); slot order shuffled on every device."""
    assert counts.sum() == G * D and counts.max() <= G
    for _ in range(100):  # a greedy deal that can corner itself: deal again
        held: list[list[int]] = [[] for _ in range(G)]
        for e in np.argsort(-counts, kind="stable"):  # most copies first, each on the emptiest devices
            free = np.array([D - len(h) for h in held], dtype=float) + rng.random(G) * 0.5
            free[[g for g in range(G) if e in held[g]]] = -1
            for g in np.argsort(-free)[: counts[e]]:
                held[g].append(int(e))
        if all(len(h) == D and len(set(h)) == D for h in held):
            break
    else:
        raise RuntimeError("could not deal the copies")
    out = np.full((G, W), -1, dtype=np.int64)
    for g in range(G):
        row = held[g] + ([int(rng.choice(held[g]))] if extra == "colocated" else [-1]) * (W - D)
        out[g] = rng.permutation(row)
    return out


def colocated_plan(rng: np.random.Generator) -> Plan:
    """3 layers x 64 experts, 16 GPUs x 7 slots: 6 distinct experts and a colocated copy a GPU;
    device copy counts 3, 5, 6, 7 and fifteen 2s (the rest 1), on other experts each layer."""
    E, G, D, W, L = 64, 16, 6, 7, 3
    layers = []
    for _ in range(L):
        counts = np.ones(E, dtype=np.int64)
        hot = rng.permutation(E)
        counts[hot[:4]] = [3, 5, 6, 7]
        counts[hot[4:19]] = 2
        layers.append(distinct_per_device(counts, G, D, W, rng, "colocated"))
    return Plan(slots=np.stack(layers), experts=E)


Configs = tuple[tuple[int, "int | None"], ...]


def random_plans(rng: np.random.Generator) -> list[tuple[str, Plan, Configs]]:
    """Small random plans: ``(name, plan, SGLang's (dense rows, GPUs per node) to run)``."""
    out: list[tuple[str, Plan, Configs]] = []
    # (E, G, W, L, colocated, SGLang configs): E not dividing G in most
    shapes: list[tuple[int, int, int, int, bool, Configs]] = [
        (7, 3, 3, 2, False, ((0, None), (2, None))),
        (10, 4, 3, 2, True, ((1, 2), (0, None))),
        (13, 6, 3, 3, False, ((0, 3), (2, 2))),
        (9, 8, 2, 2, True, ((0, 4), (1, 2))),
        (6, 2, 5, 2, True, ((0, None), (1, 1))),
    ]
    for i, (E, G, W, L, coloc, configs) in enumerate(shapes):
        slots = random_slots(E, G, W, L, rng, fill=1.0, colocated=coloc)
        out.append((f"r{i}-E{E}-G{G}-W{W}", Plan(slots=slots, experts=E), configs))
    # vLLM-Ascend needs as many distinct experts on every device: built that way, with
    # colocated copies or empty slots beside them
    for j, (E, G, D, W, extra) in enumerate([(11, 5, 3, 4, "empty"), (12, 8, 3, 4, "colocated")]):
        layers = []
        for _ in range(2):
            counts = np.ones(E, dtype=np.int64)
            extra_copies = G * D - E
            while extra_copies:  # spread the extra device copies over random experts
                e = int(rng.integers(E))
                if counts[e] < G:
                    counts[e] += 1
                    extra_copies -= 1
            layers.append(distinct_per_device(counts, G, D, W, rng, extra))
        plan = Plan(slots=np.stack(layers), experts=E)
        # SGLang's export fills empty slots (another plan): SGLang runs on the colocated one only
        configs = ((0, 4), (1, None)) if extra == "colocated" else ()
        out.append((f"a{j}-E{E}-G{G}-D{D}-W{W}-{extra}", plan, configs))
    return out


# ----------------------------------------------------------------------------- export (moeopt's CLI)
def export(plan_path: Path, fmt: str, out: Path, *extra: str) -> bool:
    """``python -m moeopt export``; False when it refuses the plan (exit code 2, message shown)."""
    cmd = [sys.executable, "-m", "moeopt", "export", str(plan_path), "--format", fmt, "--output", str(out), "--quiet"]
    proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode == 2:
        print(f"    export {fmt} refused: {proc.stderr.strip()}")
        return False
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return True


# ----------------------------------------------------------------------------- SGLang
def run_sglang(
    engine: SGLangStatic, plan: Plan, plan_path: Path, tmp: Path, configs: tuple[tuple[int, int | None], ...]
) -> dict[str, np.ndarray]:
    """Each rank's table for each ``(dense rows, GPUs per node)`` (None: one node), MoE rows only."""
    L, G, W = plan.slots.shape
    tables, nodes = [], []
    for n, gpn in configs:
        path = tmp / f"sglang-{n}.json"
        assert export(plan_path, "sglang", path, "--dense-layers", str(n), "--dispatch", "static")
        phys = np.asarray(json.loads(path.read_text())["physical_to_logical_map"])
        assert phys.shape == (n + L, G * W) and (phys[n:] == plan.slots.reshape(L, -1)).all()
        nnodes = 1 if gpn is None else G // gpn
        t0 = time.perf_counter()
        tables.append(engine.tables(phys, plan.experts, G, nnodes, range(G))[:, n:, :])
        nodes.append(nnodes)
        print(f"    sglang dense={n} nnodes={nnodes}: {G} ranks in {time.perf_counter() - t0:.1f} s")
    if not configs:
        return {}
    return {
        "sglang_dense": np.array([n for n, _ in configs], dtype=np.int16),
        "sglang_nnodes": np.array(nodes, dtype=np.int16),
        "sglang": np.stack(tables).astype(np.int16),
    }


# ----------------------------------------------------------------------------- vLLM
def _fix_triton_comparisons() -> None:
    """Type the results of the interpreter's comparisons as ``int1``, as compiled Triton does
    (Triton 3.9's interpreter keeps the operands' type; see the module docstring)."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    builder = interp.InterpreterBuilder
    for name in [n for n in dir(builder) if n.startswith(("create_icmp", "create_fcmp"))]:
        compare = getattr(builder, name)

        def typed(self: Any, lhs: Any, rhs: Any, _compare: Any = compare) -> Any:
            return interp.TensorHandle(_compare(self, lhs, rhs).data, tl.int1)

        setattr(builder, name, typed)


def kernel_expression(topk: np.ndarray, l2p: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``eplb_map_and_record``'s pick as written in ``eplb_triton.py`` (see the module docstring)."""
    token_idx = np.arange(topk.size).reshape(topk.shape) // topk.shape[-1]  # offs // num_active_experts
    hashed = (token_idx.astype(np.int64) * 2654435769) & 0xFFFFFFFF
    return l2p[topk, hashed % count[topk]]


class VLLMRouter:
    """vLLM's EPLB maps and router kernel (Triton interpreter, or the kernel's expression)."""

    def __init__(self, root: Path, use_triton: bool) -> None:
        self.logical_maps = vllm_logical_maps(root)
        self.route = vllm_router(root) if use_triton else None
        self.how = "triton-interpreter" if use_triton else "expression (no triton)"
        if use_triton and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("run with TRITON_INTERPRET=1 (Triton's CPU interpreter)")

    def pick(self, topk: np.ndarray, l2p: np.ndarray, count: np.ndarray, P: int) -> tuple[np.ndarray, np.ndarray]:
        """Physical ids ``[N, k]`` of one batch at one layer, and the per-slot load ``[P]`` recorded."""
        import torch

        expected = kernel_expression(topk, l2p, count)
        if self.route is None:
            return expected, np.bincount(expected.ravel(), minlength=P)
        load = torch.zeros(P, dtype=torch.int32)
        args = (torch.tensor(topk), torch.tensor(l2p), torch.tensor(count), load, torch.ones(1, dtype=torch.int32))
        try:
            out = self.route(*args, None)
        except Exception as exc:  # the interpreter's int1 typing (module docstring)
            if "mask has unsupported dtype" not in repr(exc) or "patched" in self.how:
                raise
            _fix_triton_comparisons()
            self.how = "triton-interpreter (comparison results typed int1: patched)"
            print(f"    triton interpreter: {exc!r}; comparison results re-typed int1, running again")
            load.zero_()
            out = self.route(*args, None)
        picks = out.numpy()
        assert (picks == expected).all(), "the kernel differs from its own expression"
        return picks, load.numpy()


def run_vllm(router: VLLMRouter, plan: Plan, rng: np.random.Generator) -> dict:
    """vLLM's maps of the plan's physical-to-logical map (vLLM's own placement state; -1: an
    unused slot), and the kernel's picks on two batches (all experts in every row of the
    first; top-k rows in the second), at every layer."""
    import torch

    L, G, W = plan.slots.shape
    E, P = plan.experts, G * W
    phys = plan.slots.reshape(L, P)
    l2p, count = (t.numpy() for t in router.logical_maps(torch.tensor(phys), E))
    rows = 16 if E > 64 else 48
    k = min(8, E - 1)
    full = np.stack([rng.permutation(E) for _ in range(rows)])
    part = np.stack([rng.permutation(E)[:k] for _ in range(2 * rows)])
    topk = [full, part]
    physical = np.full((L, 2, 2 * rows, E), -1, dtype=np.int64)
    loads = np.zeros((L, 2, P), dtype=np.int64)
    t0 = time.perf_counter()
    for l in range(L):
        for b, ids in enumerate(topk):
            picks, load = router.pick(ids.astype(np.int32), l2p[l], count[l], P)
            physical[l, b, : len(ids), : ids.shape[1]] = picks
            loads[l, b] = load
    print(f"    vllm ({router.how}): {L} layers x 2 batches in {time.perf_counter() - t0:.1f} s")
    return {
        "vllm_l2p": l2p.astype(np.int16),
        "vllm_count": count.astype(np.int16),
        "vllm_full_topk": full.astype(np.int16),
        "vllm_full_physical": physical[:, 0, :rows, :].astype(np.int16),
        "vllm_full_load": loads[:, 0].astype(np.int32),
        "vllm_topk": part.astype(np.int16),
        "vllm_physical": physical[:, 1, :, :k].astype(np.int16),
        "vllm_load": loads[:, 1].astype(np.int32),
    }


# ----------------------------------------------------------------------------- vLLM-Ascend
def run_ascend(fns: dict[str, Any], plan: Plan, plan_path: Path, tmp: Path) -> dict:
    """``init_eplb_config`` of every rank and layer on the exported map, per TP size."""
    import torch

    L, G, _ = plan.slots.shape
    path = tmp / "ascend.json"
    if not export(plan_path, "vllm-ascend", path, "--dispatch", "ascend"):
        return {}
    data = json.loads(path.read_text())
    device_expert = np.array([[d["device_expert"] for d in layer["device_list"]] for layer in data["layer_list"]])
    config = SimpleNamespace(expert_map_path=str(path), dynamic_eplb=False, num_redundant_experts=0)
    out = np.empty((len(ASCEND_TP), G, L, plan.experts), dtype=np.int64)
    had_npu = hasattr(torch.Tensor, "npu")
    torch.Tensor.npu = lambda self: self  # the engine moves log2phy to the NPU; stay on the CPU
    try:
        t0 = time.perf_counter()
        for i, tp in enumerate(ASCEND_TP):
            for r in range(G):
                moe = SimpleNamespace(num_experts=plan.experts, ep_size=G, ep_rank=r)
                for l in range(L):
                    global_map, local_map, log2phy, redundant = fns["init_eplb_config"](config, l, moe, tp_size=tp)
                    assert redundant == device_expert[l].size - plan.experts
                    assert (local_map.numpy() == global_map[r].numpy()).all()
                    out[i, r, l] = log2phy.numpy()
        took = time.perf_counter() - t0
        print(f"    vllm-ascend: {G} ranks x {L} layers x {len(ASCEND_TP)} TP sizes in {took:.1f} s")
    finally:
        if not had_npu:
            del torch.Tensor.npu
    return {
        "ascend_device_expert": device_expert.astype(np.int16),
        "ascend_tp": np.array([tp or 0 for tp in ASCEND_TP], dtype=np.int16),
        "ascend": out.astype(np.int16),
    }


# ----------------------------------------------------------------------------- main
def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An ``.npz`` compressed with LZMA, which ``np.load`` reads like any other (its zip reader
    takes every method Python's ``zipfile`` knows): the 64 ranks' tables of one plan are
    nearly alike, farther apart than deflate's 32 kB window reaches (2.4 MB with
    ``np.savez_compressed``, 0.6 MB so)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as z:
        for key, value in arrays.items():
            buf = io.BytesIO()
            np.save(buf, value, allow_pickle=False)
            z.writestr(f"{key}.npy", buf.getvalue())


def run_plan(name: str, plan: Plan, configs: Configs, engines: SimpleNamespace, rng: np.random.Generator) -> dict:
    """Every engine's fixture arrays for one plan."""
    L, G, W = plan.slots.shape
    print(f"  {name}: {L} layers x {plan.experts} experts, {G} GPUs x {W} slots")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plan_path = tmp / "plan.json"
        write_plan(plan_path, plan)
        arrays: dict[str, np.ndarray] = {
            "slots": plan.slots.astype(np.int16),
            "experts": np.array(plan.experts, dtype=np.int16),
        }
        arrays |= run_sglang(engines.sglang, plan, plan_path, tmp, configs)
        arrays |= run_vllm(engines.vllm, plan, rng)
        arrays |= run_ascend(engines.ascend, plan, plan_path, tmp)
    return arrays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm", type=Path, required=True, help="unpacked vLLM wheel (the folder holding vllm/)")
    parser.add_argument("--vllm-ascend", type=Path, required=True, help="unpacked vLLM-Ascend sdist")
    parser.add_argument("--no-triton", action="store_true", help="evaluate vLLM's kernel expression instead")
    parser.add_argument("--only", nargs="*", choices=list(SEEDS), help="fixture files to write (default: all)")
    args = parser.parse_args(argv)
    path = sglang_path()
    if path is None:
        raise SystemExit("needs sglang: pip install --no-deps sglang==0.5.23")
    engines = SimpleNamespace(
        sglang=SGLangStatic(path),
        vllm=VLLMRouter(args.vllm, not args.no_triton),
        ascend=ascend_functions(args.vllm_ascend),
    )
    for fixture in args.only or list(SEEDS):
        print(f"{fixture}.npz")
        rng = np.random.default_rng(SEEDS[fixture])
        if fixture == "deepseek-v3":  # the deployment (3 dense rows, 8 GPUs a node), and neither
            arrays = run_plan("deepseek-v3", deepseek_v3_plan(), ((3, 8), (0, None)), engines, rng)
        elif fixture == "colocated":
            arrays = run_plan("colocated", colocated_plan(rng), ((1, 4), (0, None)), engines, rng)
        else:
            arrays = {}
            for name, plan, configs in random_plans(rng):
                arrays |= {f"{name}/{k}": v for k, v in run_plan(name, plan, configs, engines, rng).items()}
        arrays["engines"] = np.array(
            f"sglang {ENGINES['sglang']}; vllm {ENGINES['vllm']} ({engines.vllm.how}); "
            f"vllm-ascend {ENGINES['vllm-ascend']}"
        )
        out = HERE / f"{fixture}.npz"
        save_npz(out, arrays)
        print(f"  wrote {out.relative_to(ROOT)} ({out.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
