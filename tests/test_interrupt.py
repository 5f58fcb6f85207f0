"""moeopt.interrupt in this process: a signal stops the native call through its stop hook (or
kills its child process) and raises Interrupted, held back where raising is unsafe."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from moeopt import interrupt
from moeopt.budget import run_interruptible


def _signal_soon(signum: int, after: float = 0.2) -> threading.Timer:
    timer = threading.Timer(after, lambda: os.kill(os.getpid(), signum))
    timer.start()
    return timer


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_native_call_and_raises(signum):
    """Under handling(), a signal calls the stop hook of the running call (from the watcher: the
    main thread is blocked) and raises Interrupted with the signal's exit code."""
    stopped = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.handling():
        _signal_soon(signum)
        t0 = time.perf_counter()
        with pytest.raises(interrupt.Interrupted) as info:
            with interrupt.native(stopped.set):
                stopped.wait(10.0)  # a solver that returns once asked to stop
        assert time.perf_counter() - t0 < 2.0 and stopped.is_set()
        assert info.value.signum == signum and interrupt.exit_code() == 128 + signum
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_run_interruptible_raises_keyboard_interrupt_and_stops_the_solver():
    """Used as a library (no handling()), SIGINT during a native-style call still calls stop()
    and raises a KeyboardInterrupt; without a signal the value comes back."""
    stopped = threading.Event()
    t0 = time.perf_counter()
    _signal_soon(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run_interruptible(lambda: stopped.wait(10.0), stopped.set)
    assert time.perf_counter() - t0 < 2.0 and stopped.is_set()
    assert run_interruptible(lambda: 3) == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_deferred_holds_the_signal_until_the_block_ends():
    """A deferred block runs to its end, then the signal is raised."""
    with interrupt.handling():
        ended = False
        with pytest.raises(interrupt.Interrupted):
            with interrupt.deferred():
                _signal_soon(signal.SIGINT, 0.05)
                time.sleep(0.3)
                ended = True
        assert ended


def test_run_in_child_answers_and_raises_as_the_call_did():
    """A call in a child process returns its value, and its exception is raised here."""
    assert interrupt.run_in_child(sum, [1, 2, 3]) == 6

    def fails() -> None:
        raise ValueError("bad input in the child")

    with pytest.raises(ValueError, match="bad input in the child"):
        interrupt.run_in_child(fails)


def _children() -> set[int]:
    """The live child processes of this process."""
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and _running(int(p)) and _parent(int(p)) == os.getpid()}


def _parent(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_signal_kills_the_child_of_an_unstoppable_call():
    """A call without a stop runs in a child under the command line's handling; a signal kills
    and reaps that child and raises Interrupted at once."""
    before = _children()
    with interrupt.handling():
        assert interrupt.active()
        _signal_soon(signal.SIGINT, 0.3)
        t0 = time.perf_counter()
        with pytest.raises(interrupt.Interrupted):
            interrupt.call(lambda: time.sleep(30))  # a native call nothing can stop
        assert time.perf_counter() - t0 < 3.0
    assert _children() - before == set()


def test_interrupt_in_a_highs_callback_is_not_lost():
    """HiGHS calls Python back (its interrupt callback): a KeyboardInterrupt raised there would be
    swallowed (a solve error). The handler waits until HiGHS returns, then raises."""
    highspy = pytest.importorskip("highspy")
    import numpy as np
    import scipy.sparse as sp

    from moeopt.solvers.highs_common import highs_milp

    rng = np.random.default_rng(0)
    n, m = 400, 300
    matrix = sp.random(m, n, density=0.05, random_state=0, format="csc")
    h = highs_milp(-rng.random(n), np.zeros(n), np.ones(n), matrix, np.full(m, -np.inf), np.full(m, 3.0), np.ones(n))
    h.setOptionValue("time_limit", 2.0)
    h.HandleUserInterrupt = True  # Python callbacks during the solve; nobody calls cancelSolve
    with interrupt.handling():
        _signal_soon(signal.SIGINT, 0.5)
        with pytest.raises(interrupt.Interrupted):
            h.run()  # no stop hook: HiGHS runs to its time limit (2 s), then the interrupt is raised
            time.sleep(1.0)  # the re-delivery lands here at the latest
    assert h.getModelStatus() != highspy.HighsModelStatus.kSolveError


def test_ctrl_c_while_the_command_line_imports(tmp_path):
    """Ctrl-C while `python -m moeopt` imports the package gives the command line's answer,
    `interrupted` and exit 130, and no traceback (the interrupt is raised by a `numpy` module
    shadowing the real one)."""
    module = "numpy"
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / f"{module}.py").write_text("raise KeyboardInterrupt\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    done = subprocess.run(
        [sys.executable, "-m", "moeopt", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "interrupted" and done.stdout == ""


def test_every_cp_sat_call_leaves_ctrl_c_to_moeopt():
    """CP-SAT catches SIGINT itself by default (it stops only its own search and returns as if
    its time ran out, so the run goes on): every CpSolver in the package turns that off and
    solves through ``run_interruptible`` with ``stop_search``."""
    root = Path(__file__).resolve().parents[1] / "moeopt"
    seen = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        for part in text.split("cp_model.CpSolver()")[1:]:
            seen += 1
            body = part[:1500]
            assert "catch_sigint_signal = False" in body, path
            assert "stop_search" in body, path
    assert seen >= 4
