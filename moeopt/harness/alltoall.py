"""The plans' token all-to-all timed with torch.distributed (NCCL on several CUDA devices, gloo
on the CPU): every emulated GPU is folded onto a rank, each step's exchange is timed until its
slowest rank ends, and the median over repeats is summed over layers and steps.

The gloo path has been exercised on the CPU only; NCCL has not run on a multi-GPU machine.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt.errors import MoeoptError

if TYPE_CHECKING:
    from moeopt.harness.run import PlanLoads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_traffic(traffic: np.ndarray, world: int) -> np.ndarray:
    """``[L, T, W, W]``: emulated GPUs folded onto ``world`` ranks (g -> g mod W), local dropped."""
    L, T, G, _ = traffic.shape
    ranks = np.arange(G) % world
    onehot = np.zeros((G, world), dtype=np.int64)
    onehot[np.arange(G), ranks] = 1
    folded = np.einsum("ltij,ia,jb->ltab", traffic, onehot, onehot)
    idx = np.arange(world)
    folded[:, :, idx, idx] = 0
    return folded


def _all_to_all_worker(
    rank: int, world: int, backend: str, port: int, path: str, d_model: int, dtype: str, repeats: int, warmup: int
) -> None:
    import torch
    import torch.distributed as dist

    from moeopt.harness import torch_dtype

    data = np.load(path)
    names = [str(n) for n in data["names"]]
    cuda = backend == "nccl"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dt = torch_dtype(dtype)

        def once(traffic: np.ndarray) -> float:
            send = traffic[rank].tolist()
            recv = traffic[:, rank].tolist()
            inp = torch.ones(sum(send), d_model, device=device, dtype=dt)
            out = torch.empty(sum(recv), d_model, device=device, dtype=dt)
            dist.barrier()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dist.all_to_all_single(out, inp, recv, send)
                end.record()
                torch.cuda.synchronize(device)
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                dist.all_to_all_single(out, inp, recv, send)
                ms = 1e3 * (time.perf_counter() - t0)
            # the step's all-to-all ends when its slowest rank ends
            step = torch.tensor([ms], dtype=torch.float64, device=device)
            dist.all_reduce(step, op=dist.ReduceOp.MAX)
            return float(step.item())

        # untimed first exchanges: connection set-up and buffer allocation are not traffic
        first = data["traffic0"].reshape(-1, world, world)
        for _ in range(max(1, warmup)):
            once(first[int(first.sum(axis=(1, 2)).argmax())])
        results = {}
        for p, name in enumerate(names):
            traffic = data[f"traffic{p}"]  # [L, T, W, W]
            total = 0.0
            for l in range(traffic.shape[0]):
                for t in range(traffic.shape[1]):
                    total += float(np.median([once(traffic[l, t]) for _ in range(repeats)]))
            results[name] = total
        if rank == 0:
            Path(path).with_suffix(".json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def time_all_to_all(
    loads: Sequence[PlanLoads],
    *,
    world: int,
    backend: str,
    steps: int,
    d_model: int,
    dtype: str,
    repeats: int = 3,
    warmup: int = 1,
) -> dict[str, Any]:
    """Time each plan's token all-to-all on ``world`` real ranks (torch.distributed).

    Emulated GPU g is rank ``g mod world``; a step's all-to-all sends each token's hidden
    state (``d_model`` values) from its home rank to every distinct remote rank holding one
    of its experts, timed per step (CUDA events for NCCL; the median of ``repeats`` after
    ``warmup`` untimed exchanges, the slowest rank's time) and summed over layers and steps.

    Parameters
    ----------
    loads
        Plans with ``traffic`` (token traces).
    world
        Ranks (processes, one per CUDA device for NCCL).
    backend
        ``"nccl"`` (several CUDA devices) or ``"gloo"`` (CPU; used to test this code path).
    steps
        Steps measured.
    d_model, dtype
        Size and dtype of one token's hidden state.
    repeats, warmup
        Timed exchanges per step (median) and untimed exchanges before any timing.

    Returns
    -------
    dict
        ``ran``, ``backend``, ``world``, ``ms`` (per plan name) and ``bytes`` (per plan).
    """
    import torch.multiprocessing as mp

    usable = [pl for pl in loads if pl.traffic is not None]
    if not usable:
        return {"ran": False, "reason": "count-only workload: no token traffic"}
    width = {"fp32": 4, "float32": 4}.get(dtype, 2)
    with tempfile.TemporaryDirectory(prefix="moeopt-a2a-") as tmp:
        path = os.path.join(tmp, "traffic.npz")
        traffic = [pl.traffic for pl in usable if pl.traffic is not None]  # all of them
        arrays: dict[str, Any] = {f"traffic{p}": rank_traffic(t[:, :steps], world) for p, t in enumerate(traffic)}
        np.savez(path, names=np.array([pl.name for pl in usable]), **arrays)
        mp.spawn(
            _all_to_all_worker,
            args=(world, backend, _free_port(), path, d_model, dtype, repeats, warmup),
            nprocs=world,
            join=True,
        )
        ms = json.loads(Path(path).with_suffix(".json").read_text())
    return {
        "ran": True,
        "backend": backend,
        "repeats": repeats,
        "world": world,
        "ms": ms,
        "bytes": {pl.name: int(arrays[f"traffic{p}"].sum()) * d_model * width for p, pl in enumerate(usable)},
    }


def maybe_all_to_all(
    loads: Sequence[PlanLoads],
    mode: str,
    world: int | None,
    dev: str,
    info: dict,
    steps: int,
    shape: Any,
    repeats: int,
    warmup: int,
) -> dict[str, Any]:
    if mode not in ("auto", "off", "nccl", "gloo"):
        raise MoeoptError(f"--all-to-all: expected auto, off, nccl or gloo, got {mode!r}")
    if mode == "off":
        return {"ran": False, "reason": "disabled (--all-to-all off)"}
    import torch.distributed as dist

    if mode == "auto":
        if not (dev.startswith("cuda") and info["count"] > 1):
            return {"ran": False, "reason": f"needs several CUDA devices; {info['count']} visible"}
        mode = "nccl"
    if mode == "nccl" and (info["count"] < 2 or not dist.is_nccl_available()):
        raise MoeoptError("--all-to-all nccl: needs at least two CUDA devices and NCCL")
    if not dist.is_available():
        raise MoeoptError("--all-to-all: this torch build has no torch.distributed")
    ranks = world or (info["count"] if mode == "nccl" else 2)
    if mode == "nccl":
        ranks = min(ranks, info["count"])
    if ranks < 2:
        raise MoeoptError(f"--world: the all-to-all needs at least 2 ranks, got {ranks}")
    return time_all_to_all(
        loads,
        world=ranks,
        backend=mode,
        steps=steps,
        d_model=shape.d_model,
        dtype=shape.dtype,
        repeats=repeats,
        warmup=warmup,
    )
