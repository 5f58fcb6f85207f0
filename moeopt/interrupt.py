"""Ctrl-C and SIGTERM: stop the native solver through its own API, then leave cleanly.

The one place that decides what a signal does. The command line runs every command inside
`handling`; every call into a native solver runs inside `native` with the
solver's own stop (CP-SAT's ``stop_search``; HiGHS's ``cancelSolve`` through its interrupt
callback, directly or behind Pyomo), or in a child process that is killed
(`run_in_child`): calls that have no stop (Mt-KaHyPar, SciPy's HiGHS), and, under the
command line, HiGHS's MILPs, which do not look at their interrupt callback while they solve
the root LP (`moeopt.solvers.highs_common.run_highs`).

Why not Python's own handler: a native solver runs with the interpreter's lock released, and
Python runs a signal handler only in the main thread, between two bytecodes. While CP-SAT
searches, a Ctrl-C would wait for the time limit; running the solver in a helper thread
instead (the earlier design) leaves that thread inside C++ when the interpreter exits, and
C++ aborts the process (``terminate called without an active exception``, exit 134).

How it works here:

1. `handling` installs a handler for SIGINT and SIGTERM and points
   `signal.set_wakeup_fd` at a pipe. The C-level handler writes the signal's number
   into the pipe at once, whatever the main thread is doing.
2. A watcher thread reads the pipe and calls every registered stop hook (again every
   `POLL` seconds while the interrupt is pending, so a solver that was about to start
   when the signal came is stopped too). The solver returns in the main thread; its own
   threads end with it.
3. The Python-level handler then raises `Interrupted` (a `KeyboardInterrupt`,
   carrying the signal) in the main thread, except where raising is unsafe: inside a callback
   that a native library (HiGHS) called, where the exception would be swallowed by C++, or
   inside a `deferred` block (starting worker processes). There the interrupt is
   delivered again a moment later (`_thread.interrupt_main`), or when the block ends.
4. The command line catches it, writes no output, prints ``interrupted`` and exits with
   128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

Only the first signal counts: once `Interrupted` is raised, later signals are
recorded and ignored, so that the clean-up (stopping worker processes, a local Ray) runs to
its end. Without `handling` (moeopt used as a library), `native` blocks in the
main thread install it for SIGINT alone while they run, so Ctrl-C still stops a solver.
"""

from __future__ import annotations

import _thread
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, TypeVar, cast

__all__ = [
    "POLL",
    "Interrupted",
    "active",
    "call",
    "call_in_child",
    "check",
    "deferred",
    "exit_code",
    "handling",
    "native",
    "pending",
    "reclaim",
    "run_in_child",
]

T = TypeVar("T")

#: Seconds between two rounds of stop hooks (and re-deliveries) while an interrupt is pending.
POLL = 0.05

#: Modules whose frames mean "a native library called back into Python": raising there would
#: unwind through C++ (HiGHS catches it and reports a solve error, losing the interrupt). HiGHS
#: calls its interrupt callback (how ``cancelSolve`` reaches it) through ``highspy.highs``.
CALLBACK_MODULES = ("highspy",)

#: Signals `handling` takes over by default.
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_QUIT = b"\x00"  # written into the pipe to end the watcher
_WAKE = b"\xff"  # written into the pipe to make the watcher look again


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT: Ctrl-C, or SIGTERM).

    Parameters
    ----------
    signum
        The signal's number.
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM (the shells' convention)."""
        return 128 + self.signum


class _State:
    """What `handling` installed, and the interrupt it has seen (one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hooks: dict[int, Callable[[], object]] = {}
        self.next_hook = 0
        self.installed = False
        self.process_wide = False  # installed by the command line (not a library call's own)
        self.signals: tuple[int, ...] = ()
        self.previous: dict[int, Any] = {}
        self.previous_fd = -1
        self.read_fd = -1
        self.write_fd = -1
        self.watcher: threading.Thread | None = None
        self.pending: int | None = None
        self.raised = False
        self.held = 0  # deferred() blocks open in the main thread
        self.knock = False  # the handler could not raise: deliver the signal again
        self.last_knock = 0.0


_state = _State()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def active() -> bool:
    """Whether the command line's handling is installed in this process (`handling`
    with ``process_wide``): only then do calls without a stop run in a child process."""
    return _state.installed and _state.process_wide


def pending() -> int | None:
    """The signal that interrupted the run (None: none yet)."""
    return _state.pending


def exit_code() -> int:
    """The exit code of a run ended by a signal: 128 + its number (130 when none was seen:
    a `KeyboardInterrupt` raised by other means). A library may raise its own
    `KeyboardInterrupt` for the signal (Ray does), so the number is taken from here."""
    return 128 + (_state.pending if _state.pending is not None else signal.SIGINT)


def check() -> None:
    """Raise `Interrupted` if a signal came (e.g. after a library swallowed the
    `KeyboardInterrupt` raised in its code, as an import can)."""
    if _state.pending is not None:
        raise Interrupted(_state.pending)


def _stop_all() -> None:
    """Call every registered stop hook (errors ignored: the solver may have just returned)."""
    with _state.lock:
        hooks = list(_state.hooks.values())
    for stop in hooks:
        try:
            stop()
        except Exception:  # noqa: BLE001  (a solver that already ended, a process already reaped)
            pass


def _wake() -> None:
    """Make the watcher look at the state again."""
    if _state.write_fd >= 0:
        try:
            os.write(_state.write_fd, _WAKE)
        except OSError:  # a full pipe wakes it anyway
            pass


def _in_native_callback(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a callback a native library made (see CALLBACK_MODULES)."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and name.startswith(CALLBACK_MODULES):
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler (main thread): stop the solvers, then raise where it is safe."""
    if _state.pending is None:
        _state.pending = signum
    _stop_all()
    if _state.raised:  # the clean-up of the first signal is running: let it finish
        return
    if _state.held or _in_native_callback(frame):
        _state.knock = not _state.held  # a deferred block raises when it ends
        _wake()
        return
    _state.knock = False
    _state.raised = True
    raise Interrupted(_state.pending)


def _watch() -> None:
    """The watcher thread: on a signal, stop the solvers (again every POLL s while pending)."""
    fd = _state.read_fd
    while True:
        busy = _state.pending is not None and not _state.raised
        ready, _, _ = select.select([fd], [], [], POLL if busy or _state.knock else None)
        if ready:
            try:
                data = os.read(fd, 512)
            except BlockingIOError:
                data = _WAKE
            except OSError:
                return
            if not data or _QUIT in data:
                return
            numbers = [b for b in data if b in _state.signals]
            if numbers and _state.pending is None:
                _state.pending = numbers[0]
        if _state.pending is None:
            continue
        _stop_all()
        now = time.monotonic()
        if _state.knock and not _state.raised and now - _state.last_knock >= POLL:
            _state.last_knock = now
            _thread.interrupt_main(signal.Signals(_state.pending))


def _install(signals: tuple[int, ...], process_wide: bool) -> bool:
    """Install the handler for ``signals`` (those Python does not ignore); whether it did."""
    if _state.installed or not _main_thread():
        return False
    wanted = tuple(s for s in signals if signal.getsignal(s) not in (signal.SIG_IGN, None))
    if not wanted:
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    try:
        _state.previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        os.close(read_fd)
        os.close(write_fd)
        return False
    _state.read_fd, _state.write_fd = read_fd, write_fd
    _state.signals = wanted
    _state.previous = {s: signal.signal(s, _on_signal) for s in wanted}
    _state.pending, _state.raised, _state.held, _state.knock = None, False, 0, False
    _state.process_wide = process_wide
    _state.installed = True
    _state.watcher = threading.Thread(target=_watch, name="moeopt-interrupt", daemon=True)
    _state.watcher.start()
    return True


def _uninstall() -> None:
    """Put back what `_install` replaced and end the watcher."""
    _state.raised = True  # a signal from here on is ignored: the run has ended
    for s, previous in _state.previous.items():
        signal.signal(s, previous)
    signal.set_wakeup_fd(_state.previous_fd)
    try:
        os.write(_state.write_fd, _QUIT)
    except OSError:
        pass
    if _state.watcher is not None:
        _state.watcher.join(5.0)
    os.close(_state.read_fd)
    os.close(_state.write_fd)
    _state.installed = False
    _state.process_wide = False
    _state.previous, _state.signals, _state.watcher = {}, (), None
    _state.read_fd = _state.write_fd = _state.previous_fd = -1
    _state.pending, _state.raised, _state.held, _state.knock = None, False, 0, False


@contextmanager
def handling(signals: tuple[int, ...] = SIGNALS, *, process_wide: bool = True) -> Iterator[None]:
    """Run the block with moeopt's handling of ``signals`` (SIGINT and SIGTERM by default).

    A signal raises `Interrupted` in the main thread once the native solver it finds
    running is stopped. Nothing is installed outside the main thread, when handling is
    already installed, or for a signal the process ignores (a run started in the background
    with SIGINT ignored keeps ignoring it). Everything is put back when the block ends.

    Parameters
    ----------
    signals
        The signals to handle.
    process_wide
        The handling of the whole run (the command line): calls that have no stop then run
        in a child process (`call`).
    """
    installed = _install(tuple(signals), process_wide)
    try:
        yield
    finally:
        if installed:
            _uninstall()


def reclaim() -> None:
    """Install moeopt's handler again where a library replaced it (``ray.init`` installs its
    own SIGTERM handler, which would end the process without stopping anything)."""
    if _state.installed and _main_thread():
        for s in _state.signals:
            if signal.getsignal(s) is not _on_signal:
                signal.signal(s, _on_signal)


class native:
    """A block that calls a native solver: ``stop()`` ends it early on a signal.

    On entry the stop hook is registered (and called at once if a signal already came); on
    exit it is removed, and if a signal came meanwhile `Interrupted` is raised, so that
    a search cut short by Ctrl-C never passes for one cut by its time limit. In the main thread
    of a process without `handling` (moeopt as a library), SIGINT handling is installed
    for the block's duration.

    Parameters
    ----------
    stop
        Asks the solver to stop (thread-safe: called from the watcher thread); None: nothing
        to call (the block only reports a signal when it ends).
    """

    def __init__(self, stop: Callable[[], object] | None = None) -> None:
        self.stop = stop
        self.key: int | None = None
        self.own: Any = None

    def __enter__(self) -> native:
        if not _state.installed and _main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.own = handling((signal.SIGINT,), process_wide=False)
            self.own.__enter__()
        if self.stop is not None:
            with _state.lock:
                self.key = _state.next_hook
                _state.next_hook += 1
                _state.hooks[self.key] = self.stop
        if _state.pending is not None and self.stop is not None:
            self.stop()
            _wake()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.key is not None:
            with _state.lock:
                _state.hooks.pop(self.key, None)
        signum = _state.pending
        raise_now = signum is not None and not isinstance(exc, KeyboardInterrupt)
        if raise_now and _main_thread():
            raise_now = not _state.raised and not _state.held
            if raise_now:
                _state.raised = True
        try:
            if self.own is not None:
                self.own.__exit__(None, None, None)  # puts the default handler back
        finally:
            if raise_now and signum is not None:
                raise Interrupted(signum) from exc


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal back while the block runs (e.g. starting worker processes, which a signal
    must not leave half started), then raise `Interrupted` if one came.

    Outside the main thread, or without `handling`, Python's SIGINT handler is held back
    the same way when it is the default one; otherwise the block simply runs.
    """
    if not _main_thread():
        yield
        return
    if not _state.installed:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return
        hit: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        if hit:
            raise Interrupted(hit[0])
        return
    _state.held += 1
    try:
        yield
    finally:
        _state.held -= 1
    if _state.pending is not None and not _state.held and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.pending)


def call(fn: Callable[[], T], stop: Callable[[], object] | None = None) -> T:
    """``fn()``, a native solver's call, such that a signal stops it and raises `Interrupted`.

    With ``stop`` the call runs here inside `native` (``stop`` ends it through the
    solver's own API). Without one, it runs in a child process that is killed on a signal when
    the command line's handling is active (`run_in_child`), and here otherwise.
    """
    if stop is None and active() and _main_thread():
        return run_in_child(fn)
    with native(stop):
        return fn()


def _after_fork_in_child() -> None:
    """Every forked child (`run_in_child`, a ``fork`` multiprocessing process) starts
    without moeopt's handling: the wakeup pipe is the parent's no longer, nothing is registered,
    SIGINT is ignored (a terminal's Ctrl-C reaches the whole process group; the parent handles
    it and kills the child) and SIGTERM ends it (the parent's ``terminate``)."""
    global _state
    if _state.installed:
        signal.set_wakeup_fd(-1)
        for s in _state.signals:
            signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)
    _state = _State()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], read_fd: int, write_fd: int, mask: set[int]
) -> None:
    """Body of the forked child: run ``fn``, send back ``("ok", value)`` or ``("error", exc)``.
    Never returns (the child must not run on into the parent's code): it ends in `os._exit`."""
    status = 1
    try:
        # signals are blocked since before the fork: the handlers become the child's own first
        # (moeopt's handling is already gone: _after_fork_in_child)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides, and kills this process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_fd)
        try:
            reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001  (raised again in the parent)
            reply = ("error", exc)
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001  (an exception that does not pickle)
            error = RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}") if reply[0] == "error" else exc
            data = pickle.dumps(("error", error), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]
        status = 0
    finally:
        os._exit(status)  # no interpreter exit: the parent's atexit hooks, buffers and finalizers are its own


def run_in_child(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a forked child process that a signal kills (SIGKILL), for a native call
    that cannot be stopped otherwise: `call_in_child` without a deadline.

    Raises
    ------
    Interrupted
        On a signal.
    RuntimeError
        When the child ended without an answer (killed from outside, out of memory).
    """
    value, _ = call_in_child(fn, *args)  # no deadline: it answered, or this raised
    return cast(T, value)


def call_in_child(
    fn: Callable[..., T], *args: Any, deadline: float | None = None, **kwargs: Any
) -> tuple[T | None, bool]:
    """``fn(*args, **kwargs)`` in a forked child process: ``(value, True)`` when it answered
    (before ``deadline``, a `time.perf_counter` value, if one is given), ``(None, False)`` when
    the deadline came first and the child was killed.

    The child gets everything by inheritance (nothing is pickled on the way in), runs the call
    with no thread of this process, sends the value (or the exception, raised again here) back
    pickled and leaves with `os._exit`. A signal while waiting kills the child (SIGKILL), reaps
    it and raises `Interrupted` here (through `native`); it leaves no process and no file behind.

    Raises
    ------
    Interrupted
        On a signal.
    RuntimeError
        When the child ended without an answer (killed from outside, out of memory).
    """
    read_fd, write_fd = os.pipe()
    # no signal handler may run in the child before it has its own (it would run on into this
    # process's code): SIGINT and SIGTERM wait, blocked in this thread, until the fork is done
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pid, status, answered = -1, 0, False
    chunks: list[bytes] = []
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child: coverage does not follow it)
            _child(fn, args, kwargs, read_fd, write_fd, mask)
        os.close(write_fd)
        write_fd = -1
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal that came meanwhile acts now
        with native(lambda: _kill(pid)):
            while True:
                if deadline is not None:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    ready, _, _ = select.select([read_fd], [], [], min(left, POLL))
                    if not ready:
                        continue
                data = os.read(read_fd, 1 << 20)
                if not data:
                    answered = True
                    break
                chunks.append(data)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        if pid > 0:
            if not answered:  # the deadline came, a signal, or a failure while the child runs: it goes now
                _kill(pid)
            _, status = os.waitpid(pid, 0)
    if not answered:
        return None, False
    if not chunks:
        name = getattr(fn, "__name__", "a call")
        raise RuntimeError(f"the child process that ran {name} ended without an answer (wait status {status})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise value
    result: T = value
    return result, True
