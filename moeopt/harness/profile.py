"""Latency profiler: time one MoE layer's expert FFNs for token counts n (SPEC sections 5, 7).

Each expert is a SwiGLU FFN, ``y = (silu(x W_gate) * (x W_up)) W_down``: two GEMMs up
(``d_model -> d_ff``), one down. A GPU holding ``experts_per_gpu`` experts that receives n
token-expert assignments runs them as a group of GEMMs, the n tokens split as evenly as
possible over its experts. The profile ``C(n)`` is the median latency of that group over
``repeats`` runs after ``warmup`` runs, timed with CUDA events on a GPU and
``time.perf_counter`` on the CPU; the runs of all token counts are interleaved in rounds
(`Timer.rounds`), so a burst of contention does not bend the curve at a few n.

Two samplings: at tile boundaries ``n = j * tile`` (what the profile file stores, so that
``C(n) = P[ceil(n / tile)]``) and, with ``dense``, at every n up to the last boundary; the
relative error of the tile-sampled step function against the dense sweep says how much the
tile model loses on this device.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from moeopt import console
from moeopt.errors import MoeoptError
from moeopt.harness import require_torch, resolve_device, torch_dtype
from moeopt.profile import Profile

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: FFN sizes and dtype used on the CPU when none are given: tiny, so CI runs in seconds.
CPU_DEFAULTS: dict[str, Any] = {"d_model": 64, "d_ff": 128, "dtype": "fp32"}
#: ... and on a GPU (Mixtral-like expert width, bf16).
CUDA_DEFAULTS: dict[str, Any] = {"d_model": 4096, "d_ff": 14336, "dtype": "bf16"}


@dataclass(frozen=True)
class FFNShape:
    """One expert's SwiGLU FFN: ``d_model``, ``d_ff`` and the dtype name (fp32/fp16/bf16)."""

    d_model: int
    d_ff: int
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MoeoptError(f"--{name.replace('_', '-')}: expected a positive integer, got {v!r}")

    @property
    def bytes_per_expert(self) -> int:
        width = 4 if self.dtype in ("fp32", "float32") else 2
        return 3 * self.d_model * self.d_ff * width

    def flops(self, tokens: float) -> float:
        """Floating-point operations of one expert on ``tokens`` tokens (3 GEMMs)."""
        return 6.0 * tokens * self.d_model * self.d_ff


def device_info(device: str, threads: int | None = None) -> dict[str, Any]:
    """Name, type, torch version and visible device count of a torch device.

    Parameters
    ----------
    device
        ``"cpu"`` or ``"cuda[:N]"``.
    threads
        CPU threads torch uses (recorded as given; ``None`` reads torch's setting).

    Returns
    -------
    dict
        ``type``, ``name``, ``torch``, ``count`` (visible CUDA devices) and ``threads``.
    """
    torch = require_torch()
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        name = torch.cuda.get_device_name(index)
        cuda = torch.version.cuda
    else:
        name = _cpu_name()
        cuda = None
    return {
        "type": "cuda" if device.startswith("cuda") else "cpu",
        "name": name,
        "torch": str(torch.__version__),
        "cuda": cuda,
        "count": int(torch.cuda.device_count()) if torch.cuda.is_available() else 0,
        "threads": int(threads if threads is not None else torch.get_num_threads()),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


class Timer:
    """Latency (ms) of callables: CUDA events on a GPU, perf_counter on the CPU.

    `rounds` is what the harness uses: every callable is warmed up, then timed once
    per round for ``repeats`` rounds, and the median over rounds is kept. Interleaving the
    callables (rather than timing each ``repeats`` times in a row) spreads a burst of
    contention or a clock change over many callables, where the median discards it.

    Parameters
    ----------
    device
        The torch device the callables run on.
    warmup, repeats
        Untimed runs of each callable first, then timed runs (rounds) whose median is kept.
    statistic
        ``"median"`` (default) or ``"min"``: the minimum is steadier on a CPU shared with
        other jobs, where preemption only ever adds time.
    """

    def __init__(self, device: str, warmup: int = 2, repeats: int = 5, statistic: str = "median") -> None:
        if warmup < 0 or repeats < 1:
            raise MoeoptError(f"--warmup must be >= 0 and --repeats >= 1, got {warmup} and {repeats}")
        if statistic not in ("median", "min"):
            raise MoeoptError(f"--statistic: expected median or min, got {statistic!r}")
        self.statistic = statistic
        self.torch = require_torch()
        self.device = device
        self.cuda = device.startswith("cuda")
        self.warmup = warmup
        self.repeats = repeats
        self.kind = "cuda-events" if self.cuda else "perf_counter"

    def once_ms(self, fn: Callable[[], Any]) -> float:
        """One timed run of ``fn`` (ms), synchronized on a GPU."""
        if self.cuda:
            torch = self.torch
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)

    def rounds(self, fns: Sequence[Callable[[], Any]], *, progress: Callable[[int], Any] | None = None) -> np.ndarray:
        """Median (or min) over ``repeats`` interleaved rounds of each callable's time (ms).

        Parameters
        ----------
        fns
            The callables; each is run ``warmup`` times untimed first.
        progress
            Called with the number of timed runs done since the last call.

        Returns
        -------
        numpy.ndarray
            float ``[len(fns)]`` median milliseconds.
        """
        for fn in fns:
            for _ in range(self.warmup):
                fn()
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
        times = np.empty((self.repeats, len(fns)))
        for r in range(self.repeats):
            for i, fn in enumerate(fns):
                times[r, i] = self.once_ms(fn)
            if progress is not None:
                progress(len(fns))
        if not len(fns):
            return np.zeros(0)
        return np.median(times, axis=0) if self.statistic == "median" else times.min(axis=0)

    def median_ms(self, fn: Callable[[], Any]) -> float:
        """Run ``fn`` ``warmup`` times, then time ``repeats`` runs; the median in ms."""
        for _ in range(self.warmup):
            fn()
        if self.cuda:
            torch = self.torch
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(self.repeats)
            ]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize(self.device)
            samples = [start.elapsed_time(end) for start, end in events]
        else:
            samples = []
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                samples.append(1e3 * (time.perf_counter() - t0))
        return float(statistics.median(samples))


class ExpertBank:
    """SwiGLU expert weights on a device, and the grouped run of several experts.

    Real models have more expert weights than one device holds, so the bank keeps a pool
    of ``pool`` distinct weight sets and expert ``i`` uses set ``i mod pool``; the pool is
    as large as ``memory_budget`` bytes allow (at least 1), so on a GPU the weights of one
    group are still streamed from memory rather than served from cache.

    Parameters
    ----------
    shape
        The FFN shape.
    device
        The torch device.
    experts
        How many distinct experts the caller will address (upper bound of the pool).
    max_tokens
        Largest token count one expert will be given.
    memory_budget
        Bytes the weight pool may use; default 256 MiB on the CPU and a quarter of free
        memory (at most 32 GiB) on a GPU.
    seed
        Seed of the random weights and activations.
    """

    def __init__(
        self,
        shape: FFNShape,
        device: str,
        experts: int,
        max_tokens: int,
        *,
        memory_budget: int | None = None,
        seed: int = 0,
    ) -> None:
        torch = require_torch()
        self.torch = torch
        self.shape = shape
        self.device = device
        dtype = torch_dtype(shape.dtype)
        if memory_budget is None:
            if device.startswith("cuda"):
                free, _ = torch.cuda.mem_get_info(torch.device(device))
                memory_budget = min(free // 4, 32 << 30)
            else:
                memory_budget = 256 << 20
        self.pool = max(1, min(int(experts), int(memory_budget // shape.bytes_per_expert)))
        # drawn on the device in the target dtype: no multi-GB float32 staging on the host
        gen = torch.Generator(device=device).manual_seed(seed)
        d, f = shape.d_model, shape.d_ff

        def weights(rows: int, cols: int) -> Tensor:
            w = torch.randn(self.pool, rows, cols, generator=gen, device=device, dtype=dtype)
            return w.mul_(1.0 / math.sqrt(rows))

        self.w_gate = weights(d, f)
        self.w_up = weights(d, f)
        self.w_down = weights(f, d)
        self.x = torch.randn(max(1, int(max_tokens)), d, generator=gen, device=device, dtype=dtype)
        self.silu = torch.nn.functional.silu

    def ensure_tokens(self, tokens: int) -> None:
        """Grow the activation buffer to hold ``tokens`` rows."""
        if tokens > self.x.shape[0]:
            torch = self.torch
            extra = torch.randn(tokens - self.x.shape[0], self.shape.d_model, device=self.device, dtype=self.x.dtype)
            self.x = torch.cat([self.x, extra])

    def run(self, experts: Sequence[int], tokens: Sequence[int]) -> None:
        """Run expert ``experts[i]`` on ``tokens[i]`` tokens, one after the other (one group)."""
        x, silu = self.x, self.silu
        for e, n in zip(experts, tokens, strict=True):
            if n <= 0:
                continue
            i = int(e) % self.pool
            xs = x[: int(n)]
            hidden = silu(xs @ self.w_gate[i]) * (xs @ self.w_up[i])
            _ = hidden @ self.w_down[i]


def split_tokens(tokens: int, experts: int) -> list[int]:
    """``tokens`` spread as evenly as possible over ``experts`` experts (larger first)."""
    base, extra = divmod(int(tokens), int(experts))
    return [base + (i < extra) for i in range(experts)]


@dataclass(frozen=True, eq=False)
class ProfileRun:
    """A measured profile plus the raw samplings behind it.

    Attributes
    ----------
    profile
        The profile written to file (tile-boundary latencies, one row per emulated GPU).
    tile_ms
        float ``[K + 1]``: measured latency at ``n = j * tile`` (before `monotone_fit`).
    dense_ms
        float ``[K * tile + 1]``: latency at every n (``None`` without ``dense``).
    seconds
        Wall time of each sampling, ``{"tile": s, "dense": s}``.
    """

    profile: Profile
    tile_ms: np.ndarray
    dense_ms: np.ndarray | None
    seconds: dict[str, float] = field(default_factory=dict)


def monotone_fit(values: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators).

    A profile must be non-decreasing; timing noise can break that. Unlike a running
    maximum, the fit is not dragged up for good by one slow outlier.

    Parameters
    ----------
    values
        float ``[K]`` measurements in order of increasing token count.

    Returns
    -------
    numpy.ndarray
        float ``[K]``, non-decreasing, closest to ``values`` in squared error.
    """
    means: list[float] = []
    sizes: list[int] = []
    for v in np.asarray(values, dtype=np.float64):
        means.append(float(v))
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m, s = means.pop(), sizes.pop()
            total = sizes[-1] + s
            means[-1] = (means[-1] * sizes[-1] + m * s) / total
            sizes[-1] = total
    return np.repeat(means, sizes)


def step_function_error(tile_ms: np.ndarray, dense_ms: np.ndarray, tile: int) -> dict[str, float]:
    """Relative error of the tile-sampled step function against a dense sweep.

    The step function is ``C(n) = P[ceil(n / tile)]`` with ``P`` made non-decreasing
    (`monotone_fit`);
    the error is ``|C(n) - D(n)| / D(n)`` over ``n = 1 .. len(dense_ms) - 1``.

    Parameters
    ----------
    tile_ms
        Latencies at tile boundaries ``j = 0..K``.
    dense_ms
        Latencies at every ``n = 0..N``.
    tile
        Tile size in tokens.

    Returns
    -------
    dict
        ``max_rel_error``, ``mean_rel_error`` and ``n_at_max`` (the token count of the max).
    """
    p = monotone_fit(tile_ms)
    dense = np.asarray(dense_ms, dtype=np.float64)
    n = np.arange(1, len(dense))
    j = np.minimum(np.ceil(n / tile).astype(np.int64), len(p) - 1)
    rel = np.abs(p[j] - dense[n]) / np.maximum(dense[n], 1e-12)
    k = int(rel.argmax())
    return {"max_rel_error": float(rel.max()), "mean_rel_error": float(rel.mean()), "n_at_max": int(n[k])}


def measure_profile(
    shape: FFNShape,
    *,
    device: str | None = None,
    experts_per_gpu: int = 1,
    max_tokens: int = 1024,
    tile: int = 64,
    dense: bool = False,
    repeats: int = 5,
    warmup: int = 2,
    speeds: Sequence[float] | None = None,
    threads: int | None = None,
    quiet: bool = True,
    seed: int = 0,
    statistic: str = "median",
) -> ProfileRun:
    """Measure ``C(n)`` of one MoE layer on this device and build a profile.

    Parameters
    ----------
    shape
        Expert FFN shape and dtype.
    device
        ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
    experts_per_gpu
        Experts the n tokens are spread over (one grouped run).
    max_tokens
        Largest n; rounded up to a tile boundary, ``K = ceil(max_tokens / tile)``.
    tile
        Tile size: the profile stores ``C`` at ``n = 0, tile, ..., K * tile``.
    dense
        Also time every n up to ``K * tile`` and report the step function's error.
    repeats, warmup
        Timed and untimed runs per n (median of the timed runs).
    speeds
        Emulated GPU speeds: row g of the profile is the measurement divided by
        ``speeds[g]`` (one row at speed 1 when ``None``).
    threads
        CPU threads for torch (the CPU default is 1 for steady timings).
    quiet
        No progress bar.
    seed
        Seed of the random weights.
    statistic
        ``"median"`` or ``"min"`` over the timed runs (`Timer`).

    Returns
    -------
    ProfileRun
        The profile (meta: device, torch, dtype, sizes, sampling seconds and, with
        ``dense``, the step function's error) and the raw samplings.

    Raises
    ------
    MoeoptError
        For invalid sizes or an unavailable device.
    """
    dev = resolve_device(device)
    if tile < 1 or max_tokens < 1 or experts_per_gpu < 1:
        raise MoeoptError(
            f"--tile, --max-tokens and --experts-per-gpu must be >= 1, got {tile}, {max_tokens}, {experts_per_gpu}"
        )
    speeds = [1.0] if speeds is None else [float(s) for s in speeds]
    if not speeds or any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise MoeoptError(f"--speeds: expected positive numbers, got {speeds}")
    threads = set_threads(dev, threads)
    K = max(1, math.ceil(max_tokens / tile))
    top = K * tile
    bank = ExpertBank(shape, dev, experts_per_gpu, math.ceil(top / experts_per_gpu), seed=seed)
    timer = Timer(dev, warmup=warmup, repeats=repeats, statistic=statistic)
    ids = list(range(experts_per_gpu))

    def sweep(points: np.ndarray, label: str) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        fns = [(lambda counts=split_tokens(int(n), experts_per_gpu): bank.run(ids, counts)) for n in points]
        bar_args: dict[str, Any] = dict(desc=f"profile ({label})", unit="run", quiet=quiet, leave=False)
        with console.bar(total=len(fns) * repeats, **bar_args) as bar:
            out = timer.rounds(fns, progress=bar.update)
        return out, time.perf_counter() - t0

    # one untimed pass at the largest n first: the first runs after allocation are slow
    # (page faults, cold caches, kernel selection) and would otherwise bias small n
    counts_top = split_tokens(top, experts_per_gpu)
    Timer(dev, warmup=max(2, warmup), repeats=1).median_ms(lambda: bank.run(ids, counts_top))
    tile_ms, tile_s = sweep(np.arange(K + 1) * tile, "tile boundaries")
    seconds = {"tile": tile_s}
    dense_ms = None
    error = None
    if dense:
        dense_ms, seconds["dense"] = sweep(np.arange(top + 1), "dense")
        error = step_function_error(tile_ms, dense_ms, tile)
    steps = monotone_fit(tile_ms)
    info = device_info(dev, threads)
    meta: dict[str, Any] = {
        "source": "measured",
        "device": info["name"],
        "device_type": info["type"],
        "torch": info["torch"],
        "cuda": info["cuda"],
        "threads": info["threads"],
        "dtype": shape.dtype,
        "d_model": shape.d_model,
        "d_ff": shape.d_ff,
        "experts_per_gpu": experts_per_gpu,
        "max_tokens": top,
        "timer": timer.kind,
        "repeats": repeats,
        "warmup": warmup,
        "statistic": statistic,
        "weight_pool": bank.pool,
        "sampling_seconds": {k: round(v, 4) for k, v in seconds.items()},
        "points": {"tile": K + 1, **({"dense": top + 1} if dense else {})},
        "monotone_fixes": int((np.abs(steps - tile_ms) > 1e-12).sum()),
        "speeds": [round(s, 6) for s in speeds],
        "tflops_at_max": round(experts_per_gpu * shape.flops(top / experts_per_gpu) / (tile_ms[-1] * 1e9), 4)
        if tile_ms[-1] > 0
        else None,
    }
    if error is not None:
        meta["dense_vs_tile"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in error.items()}
    latency = steps[None, :] / np.asarray(speeds)[:, None]
    if len(speeds) == 1:
        names: tuple[str, ...] = (info["name"],)
    else:
        names = tuple(f"{info['name']} #{g} (speed {s:g})" for g, s in enumerate(speeds))
    profile = Profile(tile=tile, latency=latency, names=names, meta=meta)
    return ProfileRun(profile=profile, tile_ms=tile_ms, dense_ms=dense_ms, seconds=seconds)


def set_threads(device: str, threads: int | None) -> int:
    """Set torch's CPU thread count (CPU default 1, for steady timings); returns it."""
    torch = require_torch()
    if threads is None:
        if not device.startswith("cpu"):
            return int(torch.get_num_threads())
        threads = 1
    if threads < 1:
        raise MoeoptError(f"--threads: expected a positive integer, got {threads}")
    torch.set_num_threads(int(threads))
    return int(threads)


def parse_speeds(text: str | None) -> list[float] | None:
    """``"1,0.9,1.1"`` -> ``[1.0, 0.9, 1.1]``; ``None`` stays ``None``."""
    if text is None:
        return None
    try:
        speeds = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise MoeoptError(f"--speeds: expected comma-separated numbers, got {text!r}") from None
    if not speeds or any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise MoeoptError(f"--speeds: expected positive numbers, got {text!r}")
    return speeds


def shape_for(device: str, d_model: int | None, d_ff: int | None, dtype: str | None, model: Any = None) -> FFNShape:
    """FFN shape from flags, else the instance's model (on a GPU), else the device defaults."""
    defaults = CUDA_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS
    if model is not None and device.startswith("cuda"):
        defaults = {"d_model": model.d_model, "d_ff": model.d_ff, "dtype": model.dtype}
    return FFNShape(
        d_model=defaults["d_model"] if d_model is None else d_model,
        d_ff=defaults["d_ff"] if d_ff is None else d_ff,
        dtype=defaults["dtype"] if dtype is None else dtype,
    )


def profile_command(args: Any) -> int:
    """``moeopt profile``: measure, write the profile file, print a summary."""
    from moeopt.io import write_profile

    require_torch()
    device = resolve_device(args.device)
    shape = shape_for(device, args.d_model, args.d_ff, args.dtype)
    tile = 64 if args.tile is None else args.tile
    max_tokens = args.max_tokens if args.max_tokens is not None else (4096 if device.startswith("cuda") else 512)
    run = measure_profile(
        shape,
        device=device,
        experts_per_gpu=args.experts_per_gpu,
        max_tokens=max_tokens,
        tile=tile,
        dense=args.dense,
        repeats=args.repeats,
        warmup=args.warmup,
        speeds=parse_speeds(args.speeds),
        threads=args.threads,
        quiet=args.quiet,
        statistic=args.statistic,
    )
    write_profile(args.output, run.profile)
    meta = run.profile.meta
    lines = [
        f"wrote {args.output}: {meta['device']} ({meta['device_type']}, torch {meta['torch']}), "
        f"{shape.dtype} d_model={shape.d_model} d_ff={shape.d_ff}, {args.experts_per_gpu} expert(s)/GPU",
        f"tile {tile}: {meta['points']['tile']} points in {run.seconds['tile']:.2f} s; "
        f"C(0)={run.profile.latency[0, 0]:.4f} ms, C({meta['max_tokens']})={run.profile.latency[0, -1]:.4f} ms",
    ]
    if "dense_vs_tile" in meta:
        err = meta["dense_vs_tile"]
        lines.append(
            f"dense: {meta['points']['dense']} points in {run.seconds['dense']:.2f} s; step function vs dense: "
            f"max rel. error {100 * err['max_rel_error']:.1f} % (n={err['n_at_max']}), "
            f"mean {100 * err['mean_rel_error']:.1f} %"
        )
    print("\n".join(lines))
    return 0
