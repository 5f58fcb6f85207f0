"""A load stream: the steps a replay serves, one after another (SPEC section 12).

A [`Stream`][moeopt.replay.stream.Stream] holds the per-step counts ``n[l, t, e]`` (``step_counts``, float
``[L, T, E]``, finite and ``>= 0``) and, when it came from a token trace, the trace itself
(its ``step`` are the stream's steps), so that communication can be counted and trace
planners (``joint``) can plan on a window of tokens. ``window_steps`` is the length of the
stream's natural window (one recorded snapshot, one synthetic phase) when it has one: the
worst-window MaxVio of a replay is read over those windows.

[`load_stream`][moeopt.replay.stream.load_stream] builds a stream from an instance's calibration workload (every source
[`moeopt.io.load_workload`][] reads: a counts ``.npz`` with ``step_counts``, a trace with
``step``, SGLang ``stat`` dumps joined by ``moeopt trace import``, vLLM EPLB load windows,
synthetic workloads) or from a file (``replay --stream FILE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from moeopt.errors import InputError
from moeopt.instance import Instance
from moeopt.io import fit_workload, load_workload, read_workload_file
from moeopt.schema import check_homes
from moeopt.trace import Stats, Trace, stats_from_counts

__all__ = ["Stream", "load_stream"]


@dataclass(frozen=True, eq=False)
class Stream:
    """Per-step expert loads served in order, with the token trace when there is one.

    Attributes
    ----------
    step_counts
        float ``[L, T, E]``: tokens routed to expert ``e`` of layer ``l`` at step ``t``.
    top_k
        The model's ``k`` (count-only windows are turned into [`Stats`][moeopt.trace.Stats]).
    trace
        The token trace the counts come from (its ``step`` in ``0..T-1``), or None.
    window_steps
        Steps per natural window of the stream (one snapshot, one phase); None: none known.
    name
        A name for reports and tables.
    source
        Where it came from (a file name, ``synthetic``), for reports and error lines.
    """

    step_counts: np.ndarray
    top_k: int
    trace: Trace | None = None
    window_steps: int | None = None
    name: str = "stream"
    source: str | None = None

    def __post_init__(self) -> None:
        src = self.source
        sc = np.asarray(self.step_counts)
        if sc.dtype.kind not in "iuf":
            raise InputError(src, "step_counts", f"expected numbers, got dtype {sc.dtype}")
        if sc.ndim != 3 or 0 in sc.shape:
            raise InputError(src, "step_counts", f"expected a non-empty [layers, steps, experts] array, got {sc.shape}")
        sc = sc.astype(np.float64)
        if not np.isfinite(sc).all():
            raise InputError(src, "step_counts", "contains NaN or infinite counts")
        if (sc < 0).any():
            raise InputError(src, "step_counts", "contains negative counts")
        object.__setattr__(self, "step_counts", sc)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 1:
            raise InputError(src, "top_k", f"expected an integer >= 1, got {self.top_k!r}")
        if self.window_steps is not None and (
            isinstance(self.window_steps, bool) or not isinstance(self.window_steps, (int, np.integer))
        ):
            raise InputError(src, "window_steps", f"expected an integer >= 1, got {self.window_steps!r}")
        if self.window_steps is not None and self.window_steps < 1:
            raise InputError(src, "window_steps", f"expected an integer >= 1, got {self.window_steps}")
        if self.trace is not None and (self.trace.layers, self.trace.steps, self.trace.num_experts) != sc.shape:
            raise InputError(
                src,
                "trace",
                f"trace of {self.trace.layers} layers x {self.trace.steps} steps x {self.trace.num_experts} experts "
                f"does not match step_counts {list(sc.shape)}",
            )

    # ------------------------------------------------------------------ shape
    @property
    def layers(self) -> int:
        return int(self.step_counts.shape[0])

    @property
    def steps(self) -> int:
        """T, the number of steps."""
        return int(self.step_counts.shape[1])

    @property
    def experts(self) -> int:
        return int(self.step_counts.shape[2])

    @property
    def has_tokens(self) -> bool:
        """Whether the stream carries its token trace (communication can be counted)."""
        return self.trace is not None

    def summary(self) -> dict:
        """Name, shape and source (the file's name: no path that depends on the checkout), as
        written in a replay report."""
        return {
            "name": self.name,
            "source": Path(self.source).name if self.source else None,
            "layers": self.layers,
            "steps": self.steps,
            "experts": self.experts,
            "tokens": self.trace.tokens if self.trace is not None else None,
            "window_steps": self.window_steps,
        }

    # ------------------------------------------------------------------ windows
    def counts(self, start: int, end: int) -> np.ndarray:
        """float ``[L, end - start, E]``: the counts of steps ``start .. end - 1``."""
        return self.step_counts[:, start:end, :]

    @cached_property
    def _token_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens in step order (stable: a step's tokens keep their order) and where each step starts."""
        assert self.trace is not None
        order = np.argsort(self.trace.step, kind="stable")
        bounds = np.searchsorted(self.trace.step[order], np.arange(self.steps + 1))
        return order, bounds

    def trace_window(self, start: int, end: int) -> Trace:
        """The trace's tokens of steps ``start .. end - 1``, their steps shifted to ``0 .. end - start - 1``
        (steps without tokens keep their place: step ``i`` of the window is stream step ``start + i``)."""
        if self.trace is None:
            raise ValueError("the stream has no token trace")
        order, bounds = self._token_bounds
        return self.trace.take(order[bounds[start] : bounds[end]], start)

    def stats(self, start: int, end: int) -> Stats:
        """Count-only statistics of steps ``start .. end - 1`` (pooled counts and their steps)."""
        window = self.counts(start, end)
        return stats_from_counts(window.sum(axis=1), top_k=int(self.top_k), step_counts=window)

    # ------------------------------------------------------------------ checks
    def check(self, instance: Instance) -> None:
        """Raise `InputError` (naming the stream's source) when its layers or experts
        differ from the instance's model."""
        m = instance.model
        if self.layers != m.layers:
            raise InputError(self.source, "layers", f"the stream has {self.layers} layers, model.layers is {m.layers}")
        if self.experts != m.experts:
            raise InputError(
                self.source, "experts", f"the stream has {self.experts} experts, model.experts is {m.experts}"
            )
        if self.trace is not None:
            check_homes(self.trace.home, instance.cluster.gpus, self.source)

    def require_steps(self, needed: int, what: str) -> None:
        """Raise `InputError` unless the stream has at least ``needed`` steps (``what`` says why)."""
        if self.steps < needed:
            raise InputError(
                self.source, "steps", f"the stream has {self.steps} steps, fewer than {what} ({needed} steps)"
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_workload(
        cls,
        workload: Trace | Stats,
        *,
        name: str = "stream",
        source: str | None = None,
        window_steps: int | None = None,
    ) -> Stream:
        """A stream from a loaded workload: a trace (its steps) or statistics with ``step_counts``."""
        if isinstance(workload, Trace):
            return cls(workload.step_counts, workload.top_k, workload, window_steps, name, source)
        if workload.step_counts is None:
            raise InputError(
                source,
                "step_counts",
                "a stream needs per-step counts: a counts .npz with 'step_counts' [layers, steps, experts], "
                "a trace with 'step', or several SGLang stat dumps joined by 'moeopt trace import'",
            )
        return cls(workload.step_counts, workload.top_k, None, window_steps, name, source)


def load_stream(
    instance: Instance,
    path: str | Path | None = None,
    *,
    window_steps: int | None = None,
    name: str | None = None,
) -> Stream:
    """The stream a replay serves: ``path`` (any trace or count file with steps), else the
    instance's calibration workload; checked against the instance's model.

    Parameters
    ----------
    instance
        The instance (its model's layers, experts and ``top_k``; its cluster's GPUs for token homes).
    path
        A trace or count file (``replay --stream``); None: the instance's ``workload.calibration``.
    window_steps
        Steps per natural window of the stream (one snapshot), when known.
    name
        The stream's name in reports (default: the file's stem, else the instance's name).

    Raises
    ------
    InputError
        When the workload has no steps, or its layers or experts differ from the model's.
    """
    model = instance.model
    if path is not None:
        src = str(path)
        workload = read_workload_file(path, top_k=model.top_k)
        if isinstance(workload, Stats) and workload.experts != model.experts:
            raise InputError(
                src, "experts", f"the stream has {workload.experts} experts, model.experts is {model.experts}"
            )
        workload = fit_workload(workload, model, src)
        stem = Path(path).stem
    else:
        spec = instance.workload.calibration
        workload = load_workload(spec, model)
        src = str(spec.path) if spec.path is not None else "synthetic"
        stem = instance.name
    stream = Stream.from_workload(workload, name=name or stem, source=src, window_steps=window_steps)
    stream.check(instance)
    return stream
