"""Run a method layer by layer: serially, in a local process pool, or as Ray tasks.

Layers are independent placement problems. ``run`` splits a ``moeopt.registry.Problem``
into single-layer sub-problems (the instance with ``layers = 1``, the layer's slice of the
calibration statistics, of the trace when the method reads it, the hint and the current plan;
the profile unchanged), runs the method on each with the seed ``layer_seed`` ``(seed, l)``
and stitches the answers: plans concatenated along the layer axis (dispatch of the first),
statuses by ``moeopt.result.combine_status``, objectives and bounds by the method's
``combine`` rule (``"sum"`` or ``"mean"``), statistics by ``combine_stats``.

The serial run uses the same decomposition, so ``workers=1``, ``workers=N`` and Ray give the
same plans byte for byte for one seed (as long as no time limit cuts a search short: a
search stopped by the clock depends on the machine's speed, in any executor).

Time limits: each layer gets, when it starts, the smaller of the per-layer limit
(``Context.time_limit``, ``--layer-time-limit``) and its share of what is left of the run's
total (``deadline``, ``--time-limit``) over the layers still to plan
(``moeopt.budget.share``); a method solved whole gets ``min(L x T, what is left)``.

Backends, all running ``run_layer`` on the same ``LayerTask`` objects:

* serial: in this process;
* ``workers=N``: a ``concurrent.futures.ProcessPoolExecutor`` (``forkserver`` start
  method on POSIX, with moeopt preloaded, ``spawn`` elsewhere);
* ``ray``: ``ray.remote`` tasks on an existing cluster (``ray.init(address=...)``), or on a
  local Ray started for the run (``"local"``); a Ray session already initialized in this
  process (a notebook, the tests) is used as it is.

A method is split per layer when it declares ``combine`` and does not set
``layerwise = False``; other methods see the whole problem in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from moeopt import console, interrupt
from moeopt.budget import Budget, share
from moeopt.errors import InputError, MoeoptError
from moeopt.instance import Instance
from moeopt.plan import Plan
from moeopt.profile import Profile
from moeopt.registry import Context, Problem
from moeopt.result import Result, Status, combine_status, combine_termination
from moeopt.trace import Stats, Trace, layer_stats, layer_trace

__all__ = [
    "RAY_INSTALL_HINT",
    "Executor",
    "LayerTask",
    "combine_stats",
    "is_layerwise",
    "layer_problem",
    "layer_seed",
    "map_items",
    "pool_map",
    "run",
    "run_layer",
]

#: The one line shown when ``--ray`` is asked for and Ray is not installed.
RAY_INSTALL_HINT = 'Ray is not installed: pip install -e ".[ray]" (or pip install "ray>=2.9")'

_COMBINE = ("sum", "mean")


# ----------------------------------------------------------------------------- executor
@dataclass(frozen=True)
class Executor:
    """Where the layers run.

    Attributes
    ----------
    workers
        Local worker processes (1: this process). With ``ray``: the CPUs of a local Ray
        (default: every CPU of this machine); ignored on an existing cluster.
    ray
        None: no Ray; ``"local"``: a local Ray started for the run; anything else: the
        address of an existing cluster (``ray.init(address=...)``, e.g. ``"auto"`` or
        ``"ray://head:10001"``).
    """

    workers: int = 1
    ray: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise InputError(None, "--workers", f"expected an integer >= 1, got {self.workers!r}")

    @property
    def kind(self) -> str:
        """``serial``, ``pool`` or ``ray``."""
        if self.ray is not None:
            return "ray"
        return "pool" if self.workers > 1 else "serial"

    def width(self, items: int) -> int:
        """How many of ``items`` run at the same time (1 on a Ray cluster, whose size is not
        known here: a total limit's share is then the serial one, never too large)."""
        if self.kind == "ray":
            cpus = self.workers if self.workers > 1 else (os.cpu_count() or 1)
            return max(1, min(items, cpus if self.ray == "local" else 1))
        return max(1, min(items, self.workers))

    def describe(self) -> str:
        if self.kind == "ray":
            return "ray (local)" if self.ray == "local" else f"ray ({self.ray})"
        return f"{self.workers} workers" if self.kind == "pool" else "serial"


def resolve(instance: Instance, workers: int | None, ray: str | bool | None) -> Executor:
    """The executor of a run: ``workers`` / ``ray`` when given, else the instance's
    ``executor:`` mapping, else serial. ``ray=True`` or ``""`` means a local Ray."""
    spec = getattr(instance, "executor", None)
    if ray is None and spec is not None:
        ray = spec.ray
    if workers is None:
        workers = spec.workers if spec is not None else 1
    if ray is True or ray == "":
        ray = "local"
    if ray is False:
        ray = None
    return Executor(workers=workers, ray=ray)


def is_layerwise(method: Any, problem: Problem | None = None, params: Any = None, ctx: Context | None = None) -> bool:
    """Whether ``method`` is solved one layer at a time: it declares how to combine layers and
    does not set ``layerwise = False``; a method with ``split_layers(problem, params, ctx)``
    decides per run (given the run's ``problem``), e.g. ``balance`` splits when each layer's
    work (robust or migration-aware planning) outweighs its batched pass over all layers."""
    if getattr(method, "combine", None) not in _COMBINE:
        return False
    split = getattr(method, "split_layers", None)
    if split is not None and problem is not None:
        return bool(split(problem, params, ctx))
    return bool(getattr(method, "layerwise", True))


def layer_seed(seed: int, layer: int) -> int:
    """The seed of layer ``layer`` of a run seeded ``seed`` (31 bits: every backend takes it)."""
    return int(np.random.SeedSequence([int(seed) % 2**64, int(layer)]).generate_state(1)[0] >> 1)


# ----------------------------------------------------------------------------- tasks
@dataclass(frozen=True, eq=False)
class LayerTask:
    """One layer's work: everything a worker needs, and nothing of the other layers."""

    method: type
    params: Any
    instance: Instance
    stats: Stats
    trace: Trace | None
    profile: Profile | None
    layer: int
    model_layers: int
    seed: int
    time_limit: float | None = None
    hint: Plan | None = None
    current: Plan | None = None
    quiet: bool = True
    #: the run's wall-clock deadline (``moeopt.budget.deadline_after``), None: no total limit
    deadline: float | None = None
    #: layers not started before this one (this one included) and how many run at once: the
    #: layer's share of the time left before ``deadline`` (``moeopt.budget.share``)
    left: int = 1
    width: int = 1


@dataclass(frozen=True, eq=False)
class LayerOutcome:
    """What a worker sends back: the layer's result, its progress lines, or its error."""

    layer: int
    result: Result | None
    lines: list[str] = field(default_factory=list)
    wall_time: float = 0.0
    cpu_time: float = 0.0  # CPU seconds of the process that solved it
    error: tuple | None = None  # (class, message, attributes, traceback text)
    time_limit: float | None = None  # the seconds the layer was given (its share of a total limit)

    @property
    def solved(self) -> Result:
        """The layer's result (an outcome without an error has one)."""
        if self.result is None:
            raise RuntimeError(f"layer {self.layer}: no result")
        return self.result


def _layer_plan(plan: Plan | None, l: int) -> Plan | None:
    return None if plan is None else Plan(slots=plan.slots[l : l + 1], experts=plan.experts, dispatch=plan.dispatch)


def layer_problem(problem: Problem, l: int, *, with_trace: bool = True, with_coactivation: bool = True) -> Problem:
    """Layer ``l`` of ``problem`` as a one-layer problem (without the trace or the coactivation
    when the method does not read them: less to ship)."""
    inst = problem.instance
    sub = inst.replace(model=replace(inst.model, layers=1))
    trace = layer_trace(problem.trace, l) if (with_trace and problem.trace is not None) else None
    return Problem(sub, layer_stats(problem.stats, l, with_coactivation), trace, problem.profile)


def layer_tasks(
    method: Any, problem: Problem, params: Any, ctx: Context, *, deadline: float | None = None, width: int = 1
) -> list[LayerTask]:
    """One task per layer of ``problem`` (started in layer order, ``width`` at a time, all
    ending by ``deadline`` when given)."""
    with_trace = bool(getattr(method, "uses_trace", True))
    with_coactivation = bool(getattr(method, "uses_coactivation", True))
    tasks = []
    for l in range(problem.layers):
        sub = layer_problem(problem, l, with_trace=with_trace, with_coactivation=with_coactivation)
        tasks.append(
            LayerTask(
                method=type(method),
                params=params,
                instance=sub.instance,
                stats=sub.stats,
                trace=sub.trace,
                profile=sub.profile,
                layer=l,
                model_layers=problem.layers,
                seed=layer_seed(ctx.seed, l),
                time_limit=ctx.time_limit,
                hint=_layer_plan(ctx.hint, l),
                current=_layer_plan(ctx.current, l),
                quiet=ctx.quiet,
                deadline=deadline,
                left=problem.layers - l,
                width=width,
            )
        )
    return tasks


_LAYER0 = re.compile(r"\blayer 0\b")


def _relabel(text: str, layer: int) -> str:
    """A one-layer run's messages name its layer 0: give them the model's layer index."""
    return _LAYER0.sub(f"layer {layer}", text) if layer else text


def run_layer(task: LayerTask) -> LayerOutcome:
    """Solve one layer (in a worker or in this process); errors come back as values."""
    lines: list[str] = []
    limit = share(task.time_limit, task.deadline, task.left, task.width)  # measured as the layer starts
    ctx = Context(
        time_limit=limit,
        seed=task.seed,
        hint=task.hint,
        current=task.current,
        quiet=task.quiet,
        log=lines.append,
        model_layers=task.model_layers,
    )
    problem = Problem(task.instance, task.stats, task.trace, task.profile)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result = task.method().solve(problem, task.params, ctx)
    except Exception as exc:  # noqa: BLE001  (sent back and raised again by the caller)
        msg = _relabel(str(exc), task.layer)
        attrs = {k: (_relabel(v, task.layer) if isinstance(v, str) else v) for k, v in vars(exc).items()}
        return LayerOutcome(
            task.layer,
            None,
            [_relabel(x, task.layer) for x in lines],
            time.perf_counter() - t0,
            time.process_time() - c0,
            (type(exc), msg, attrs, traceback.format_exc()),
        )
    if "reason" in result.stats and isinstance(result.stats["reason"], str):
        result = result.replace(stats={**result.stats, "reason": _relabel(result.stats["reason"], task.layer)})
    return LayerOutcome(
        task.layer,
        result,
        [_relabel(x, task.layer) for x in lines],
        time.perf_counter() - t0,
        time.process_time() - c0,
        time_limit=limit,
    )


def _raise(layer: int, error: tuple) -> None:
    """Raise a layer's error (``LayerOutcome.error``) again in this process, as the class it was
    raised as."""
    cls, msg, attrs, tb = error
    try:
        exc = cls.__new__(cls)
        exc.args = (msg,)
        exc.__dict__.update(attrs)
    except Exception:  # noqa: BLE001
        exc = None
    if not isinstance(exc, BaseException):
        raise RuntimeError(f"layer {layer}: {cls.__name__}: {msg}")
    if isinstance(exc, MoeoptError):
        raise exc
    raise exc from RuntimeError(f"in the worker of layer {layer}:\n{tb}")


# ----------------------------------------------------------------------------- backends
def worker_init() -> None:
    """Workers leave SIGINT to the parent, which stops them all (``stop_pool``).

    A stopped worker runs no exit code, so nothing it makes may need some: its progress bars
    (disabled) lock with a thread lock, and the locks a library makes in it (Pyomo makes a
    ``multiprocessing.Lock`` on first use) follow the fork context's rule, unlinked when made,
    rather than named semaphores a resource tracker would report leaked once the worker is gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tqdm.set_lock(threading.RLock())
    multiprocessing.set_start_method("fork", force=True)  # this worker's own default only


#: One BLAS / OpenMP thread per worker (as Ray does for its tasks): N workers on N cores, not
#: N x cores threads spinning against each other. Set only where the user has not.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def mp_context() -> Any:
    """The fork server (moeopt preloaded, one BLAS thread) on POSIX; ``spawn`` elsewhere.

    The server starts with SIGINT blocked (its workers inherit that; they ignore it anyway): a
    terminal's Ctrl-C reaches the whole process group, and a server still importing moeopt would
    die of it with a traceback. This process handles the signal and stops the pool. (CPython's
    resource tracker starts first: it blocks and then unblocks SIGINT around its own start.)
    """
    if sys.platform != "win32" and "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver, resource_tracker

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["moeopt.execute", "moeopt.methods"])
        saved = {k: os.environ.get(k) for k in _THREAD_VARS}
        resource_tracker.ensure_running()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:  # the server inherits the environment when it starts (once per process)
            for k in _THREAD_VARS:
                os.environ.setdefault(k, "1")
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return ctx
    return multiprocessing.get_context("spawn")


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now (not after their current layer)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    if manager is not None:
        manager.join(timeout=5)  # the workers are gone: it notices and ends


def pool_map(
    fn: Callable[..., Any],
    items: Sequence[tuple[Any, ...]],
    workers: int,
    done: Callable[[Any], None],
    *,
    initializer: Callable[..., None] = worker_init,
    initargs: tuple[Any, ...] = (),
) -> None:
    """``fn(*item)`` for every item in ``workers`` local processes, ``done`` called with each
    result as it finishes; Ctrl-C or an error stops every worker. ``initializer(*initargs)``
    runs once in each worker (it must leave SIGINT to the parent, as ``worker_init`` does)."""
    pool = None
    try:
        with interrupt.deferred():  # Ctrl-C waits until every worker is known, so all are stopped
            pool = ProcessPoolExecutor(
                max_workers=min(workers, len(items)),
                mp_context=mp_context(),
                initializer=initializer,
                initargs=initargs,
            )
            pending = {pool.submit(fn, *item) for item in items}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=id):
                done(fut.result())
    except BaseException:  # SIGINT, a layer's error: stop every worker
        if pool is not None:
            stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def map_items(
    fn: Callable[..., Any],
    items: Sequence[tuple[Any, ...]],
    executor: Executor | None,
    done: Callable[[Any], object] | None = None,
) -> list[Any]:
    """``fn(*item)`` for every item on ``executor`` (None or serial: in this process, in order;
    a pool of one item too); the results in the order of ``items``. ``done`` is called with
    each result as it finishes (progress). ``fn`` must be importable by name."""
    out: dict[int, Any] = {}

    def got(pair: tuple[int, Any]) -> None:
        out[pair[0]] = pair[1]
        if done is not None:
            done(pair[1])

    numbered = [(fn, i, *item) for i, item in enumerate(items)]  # fn by name: a Ray task takes a function
    if executor is None or executor.kind == "serial" or (executor.kind == "pool" and len(items) <= 1):
        for item in numbered:
            got(_numbered(*item))
    elif executor.kind == "ray":
        ray_map(_numbered, numbered, executor, got)
    else:
        pool_map(_numbered, numbered, executor.workers, got)
    return [out[i] for i in range(len(items))]


def _numbered(fn: Callable[..., Any], i: int, *item: Any) -> tuple[int, Any]:
    """``(i, fn(*item))``: a result that knows its item (results arrive out of order)."""
    return i, fn(*item)


def import_ray() -> Any:
    """The ray module, or a one-line error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MoeoptError(RAY_INSTALL_HINT) from None
    return ray


#: seconds to wait for a Ray head's port before saying it is unreachable (Ray itself retries
#: for minutes, with no ``ray.init`` argument to shorten it)
RAY_CONNECT_TIMEOUT = 5.0


def _check_reachable(address: str, timeout: float = RAY_CONNECT_TIMEOUT) -> None:
    """Fail in one line when ``address`` names a ``host:port`` (or ``ray://host:port``) that
    accepts no TCP connection; ``"auto"`` and other forms are left to Ray."""
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise MoeoptError(
            f"--ray {address}: cannot connect to a Ray cluster: nothing answers at {host}:{port} ({exc}); "
            "start one with `ray start --head`, or use --ray local"
        ) from None


def ray_map(
    fn: Callable[..., Any],
    items: Sequence[tuple[Any, ...]],
    executor: Executor,
    done: Callable[[Any], None],
    *,
    shared: Any = None,
) -> None:
    """``fn(*item)`` for every item as Ray tasks (one CPU each), ``done`` called with each
    result as it finishes. With ``shared``, it is put in Ray's object store once and every
    task gets it first, ``fn(shared, *item)``. A Ray already running in this process is used
    (and left running); otherwise one is started (``"local"``) or joined (an address) and shut
    down at the end. Ctrl-C or an error cancels the tasks still pending on a Ray that is not
    this run's own (a local Ray started here is shut down instead, which stops them)."""
    ray = import_ray()
    started = False
    try:
        if not ray.is_initialized():
            opts: dict[str, Any] = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
            # Ctrl-C waits until Ray is up (a half-started Ray would leave its processes behind)
            with interrupt.deferred():
                started = True
                if executor.ray == "local":
                    cpus = executor.workers if executor.workers > 1 else (os.cpu_count() or 2)
                    ray.init(address="local", num_cpus=cpus, **opts)  # a new Ray, even beside a running cluster
                else:
                    if executor.ray is not None:
                        _check_reachable(executor.ray)
                    try:
                        ray.init(address=executor.ray, **opts)
                    except (ConnectionError, RuntimeError, ValueError) as exc:
                        raise MoeoptError(f"--ray {executor.ray}: cannot connect to a Ray cluster: {exc}") from None
                interrupt.reclaim()  # ray.init sets a SIGTERM handler that would exit without stopping Ray
        # a local Ray of this run's own is stopped whole by its shutdown; cancelling its tasks
        # first would race their replies (a task that ends as it is force-cancelled aborts
        # Ray 2.x's driver, "Tried to complete task that was not pending", exit 1), and
        # Ctrl-C reaches its workers anyway. Tasks on a cluster are cancelled.
        _ray_tasks(ray, fn, items, done, shared, cancel=not (started and executor.ray == "local"))
    finally:
        if started and ray.is_initialized():
            ray.shutdown()  # a local Ray's processes end with it


def _ray_tasks(
    ray: Any,
    fn: Callable[..., Any],
    items: Sequence[tuple[Any, ...]],
    done: Callable[[Any], None],
    shared: Any,
    *,
    cancel: bool = True,
) -> None:
    """Run the tasks of ``ray_map`` on an initialized Ray; with ``cancel``, Ctrl-C or an error
    cancels (kills) the tasks still pending."""
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    pending: list = []
    try:
        first = () if shared is None else (ray.put(shared),)
        pending = [remote.remote(*first, *item) for item in items]
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                done(ray.get(ref))
    except BaseException:
        for ref in pending if cancel else ():
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001  (already finished or gone)
                pass
        raise


# ----------------------------------------------------------------------------- combine
def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _combine_values(values: list, rule: str) -> Any:
    if rule in ("sum", "mean", "max", "min"):
        if any(v is None for v in values):
            return None
        if rule == "sum":
            total = sum(values)
            return int(total) if all(isinstance(v, (int, np.integer)) for v in values) else float(total)
        if rule == "mean":
            return float(np.mean(values))
        return max(values) if rule == "max" else min(values)
    if rule == "concat":
        return [x for v in values for x in v]
    if rule == "status":
        return combine_status([Status(v) for v in values]).value
    if rule == "same":
        return values[0] if all(v == values[0] for v in values) else list(values)
    if rule == "first":
        return values[0]
    if rule == "list":
        return list(values)
    raise ValueError(f"unknown stats rule {rule!r}")


def combine_stats(per_layer: list[dict], combine: str, rules: dict[str, str] | None = None) -> dict:
    """Statistics of a whole model from its layers' statistics.

    Each key follows ``rules[key]`` when given (``sum``, ``mean``, ``max``, ``min``,
    ``concat``, ``list``, ``same``, ``first``, ``status``), else: lists of one item per layer
    are concatenated (per-layer lists), integers are summed (counts: moves, rounds), other
    numbers follow the method's ``combine`` rule (None when a layer has None), and other
    values are kept when every layer agrees, else listed per layer.
    """
    rules = rules or {}
    keys: list[str] = []
    for s in per_layer:
        keys += [k for k in s if k not in keys]
    out: dict[str, Any] = {}
    for k in keys:
        values = [s[k] for s in per_layer if k in s]
        rule = rules.get(k)
        if rule is None:
            if all(isinstance(v, list) and len(v) == 1 for v in values):
                rule = "concat"
            elif all(v is None or _number(v) for v in values) and any(v is not None for v in values):
                ints = all(isinstance(v, (int, np.integer)) for v in values if v is not None)
                rule = "sum" if ints else combine
            else:
                rule = "same"
        out[k] = _combine_values(values, rule)
    return out


def _combine_number(values: list[float | None], rule: str) -> float | None:
    numbers = [v for v in values if v is not None]
    if not values or len(numbers) < len(values):
        return None
    return float(sum(numbers)) if rule == "sum" else float(np.mean(numbers))


def combine(method: Any, outcomes: list[LayerOutcome], params: Any) -> Result:
    """One result for the whole model from the layers' results (in layer order)."""
    results = [o.solved for o in outcomes]
    rule = method.combine
    first = results[0]
    plans = [r.plan for r in results if r.plan is not None]
    plan = None
    if len(plans) == len(results):
        plan = Plan(
            slots=np.concatenate([p.slots for p in plans], axis=0), experts=plans[0].experts, dispatch=plans[0].dispatch
        )
    status = combine_status([r.status for r in results])
    if plan is None and status.has_plan:
        status = Status.NO_SOLUTION
    own = getattr(method, "combine_stats", None)
    per_layer = [r.stats for r in results]
    if callable(own):
        stats = own(per_layer, params)
    else:
        stats = combine_stats(per_layer, rule, getattr(method, "stats_rules", None))
    return Result(
        method=first.method,
        status=status,
        plan=plan,
        objective=_combine_number([r.objective for r in results], rule) if plan is not None else None,
        bound=_combine_number([r.bound for r in results], rule),
        sense=first.sense,
        objective_name=first.objective_name,
        params=first.params,
        stats=stats,
        termination=combine_termination([r.termination for r in results]),
    )


# ----------------------------------------------------------------------------- run
def _history_point(outcome: LayerOutcome, seconds: float) -> dict[str, Any]:
    """A finished layer as one point of the run's history: when (seconds since the run
    started), its objective (incumbent) and bound, and why it stopped."""
    r = outcome.solved
    assert r.termination is not None  # Result.__post_init__ sets it
    return {
        "layer": outcome.layer,
        "seconds": round(seconds, 4),
        "objective": None if r.objective is None else float(r.objective),
        "bound": None if r.bound is None else float(r.bound),
        "termination": r.termination.value,
        "status": r.status.value,
    }


def _layer_line(name: str, outcome: LayerOutcome) -> str:
    """The progress line of a finished layer, in the words of ``moeopt.result``."""
    r = outcome.solved
    assert r.termination is not None  # Result.__post_init__ sets it

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.6g}"

    return (
        f"{name} layer {outcome.layer}: {r.termination.value}, {r.status.solution} plan, "
        f"objective {num(r.objective)}, bound {num(r.bound)}, {outcome.wall_time:.2f} s"
    )


def run(
    method: Any,
    problem: Problem,
    params: Any,
    ctx: Context,
    executor: Executor | None = None,
    *,
    note: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> Result:
    """Solve ``problem`` with ``method`` layer by layer on ``executor`` (default: serial).

    Methods that are not layerwise (``is_layerwise``) are solved whole in this process;
    ``note`` then gets a one-line remark when a parallel executor was asked for.
    ``ctx.time_limit`` is seconds per layer; ``deadline`` (``moeopt.budget.deadline_after``)
    ends the whole run: each layer gets the smaller of the two shares
    (``moeopt.budget.share``), a whole-model method ``min(L x T, what is left)``.
    """
    executor = executor or Executor()
    began = time.perf_counter()
    total = None if deadline is None else max(deadline - time.time(), 0.0)  # seconds the run may take
    if not is_layerwise(method, problem, params, ctx):
        if executor.kind != "serial" and note is not None and not getattr(method, "spreads_layers", False):
            note(f"note: method {method.name!r} solves all layers together; running it serially here")
        # a method planning every layer at once gets L x T (--layer-time-limit), at most the total
        whole = None if ctx.time_limit is None else ctx.time_limit * problem.layers
        if total is not None:
            whole = total if whole is None else min(whole, total)
        per_layer = share(ctx.time_limit, deadline, problem.layers)  # what a phase reading time_limit sees
        # the executor goes along: a whole-model method may still spread its per-layer phases
        sub = replace(ctx, time_limit=per_layer, budget=Budget(whole), executor=executor)
        result = method.solve(problem, params, sub)
        where = "serial (whole model)"
        if executor.kind != "serial" and getattr(method, "spreads_layers", False):
            where = f"whole model, its per-layer searches and bounds on {executor.describe()}"
        result = result.replace(stats={**result.stats, "executor": where})
        return limit_kept(result, ctx.time_limit, problem.layers, time.perf_counter() - began, total)
    tasks = layer_tasks(method, problem, params, ctx, deadline=deadline, width=executor.width(problem.layers))
    outcomes: list[LayerOutcome | None] = [None] * len(tasks)
    say = ctx.log or console.progress_line
    bar = console.bar(
        total=len(tasks), desc=method.name, unit="layer", disable=len(tasks) <= 1, quiet=ctx.quiet, leave=False
    )
    start = time.perf_counter()
    history: list[dict[str, Any]] = []

    def done(outcome: LayerOutcome) -> None:
        if not ctx.quiet:
            for line in outcome.lines:
                say(line)
        if outcome.error is not None:
            _raise(outcome.layer, outcome.error)
        outcomes[outcome.layer] = outcome
        history.append(_history_point(outcome, time.perf_counter() - start))
        if not ctx.quiet and not outcome.lines:  # a layer that said nothing: its outcome, in one line
            say(_layer_line(method.name, outcome))
        bar.update(1)

    try:
        map_items(run_layer, [(t,) for t in tasks], executor, done)
    finally:
        bar.close()
    finished = [o for o in outcomes if o is not None]
    result = combine(method, finished, params)
    timing = {
        "executor": executor.describe(),
        "layer_wall_times": [round(o.wall_time, 4) for o in finished],
        "layer_cpu_times": [round(o.cpu_time, 4) for o in finished],
        "history": history,
    }
    if deadline is not None:  # each layer's share of the total, as it started
        timing["layer_time_limits"] = [None if o.time_limit is None else round(o.time_limit, 4) for o in finished]
    result = result.replace(stats={**result.stats, **timing})
    return limit_kept(result, ctx.time_limit, problem.layers, time.perf_counter() - began, total)


def limit_kept(
    result: Result, time_limit: float | None, layers: int, seconds: float, total: float | None = None
) -> Result:
    """``result`` with ``stats["time_limit_exceeded_s"]``, the seconds by which the run took
    longer than it was allowed, when it did: ``layers x time_limit`` (per layer), or ``total``
    (the seconds left of the run's total limit when it started), whichever is smaller (nothing
    without a time limit)."""
    allowed = [x for x in (None if time_limit is None else time_limit * layers, total) if x is not None]
    if not allowed or seconds <= min(allowed):
        return result
    return result.replace(stats={**result.stats, "time_limit_exceeded_s": round(seconds - min(allowed), 3)})
