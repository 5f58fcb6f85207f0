"""CLI output discipline: results on stdout, progress and notes on stderr unless --quiet (bars on a
terminal only), one status vocabulary, a help that lists every command."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moeopt import console
from moeopt.cli import build_parser, main
from moeopt.result import Status, Termination

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "instances" / "quickstart.yaml"
LAYER_LINE = re.compile(r"\blayer \d+: ")
#: the words a layer line may state its state in (moeopt.result), e.g. "optimal, optimal plan"
PLAN_WORD = re.compile(r"\b(optimal|feasible|none) plan\b")
TERMINATIONS = {t.value for t in Termination}


def _run(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in a child process whose stdout and stderr are pipes (not terminals)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "moeopt", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(autouse=True)
def _auto_mode():
    """Each test starts (and leaves) the console in its library default, ``auto``."""
    console.configure()
    yield
    console.configure()


def test_solve_through_a_pipe_prints_only_the_table():
    """solve | cat: stdout holds the summary line and the table; stderr (a pipe) the layer lines, no bars."""
    proc = _run("solve", str(QUICKSTART), "--method", "tacg")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tacg: completed, feasible plan; objective affinity = ")
    assert lines[1].startswith("| metric") and any(line.startswith("| MaxVio ") for line in lines)
    assert not any(LAYER_LINE.search(line) for line in lines)
    assert "\r" not in proc.stdout and "\r" not in proc.stderr
    assert len(LAYER_LINE.findall(proc.stderr)) == 2 and "%|" not in proc.stderr


def test_verbose_shows_layer_lines_without_bars():
    """--verbose on a non-terminal stderr: every layer's line, in the result vocabulary, and no \\r bar."""
    proc = _run("solve", str(QUICKSTART), "--method", "tacg", "--verbose")
    assert proc.returncode == 0, proc.stderr
    layer_lines = [line for line in proc.stderr.splitlines() if LAYER_LINE.search(line)]
    assert [int(re.search(r"layer (\d+)", line).group(1)) for line in layer_lines] == [0, 1]
    assert all(PLAN_WORD.search(line) for line in layer_lines), layer_lines
    assert "\r" not in proc.stderr
    assert not any(LAYER_LINE.search(line) for line in proc.stdout.splitlines())


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_terminal_stderr_shows_progress():
    """With stderr on a (pseudo-)terminal and no flag, the layer lines show there, not on stdout."""
    import select

    master, slave = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moeopt", "solve", str(QUICKSTART), "--method", "tacg"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    chunks = []
    while True:  # drain the terminal while the child runs (it would block on a full one)
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    out = proc.communicate(timeout=300)[0]
    os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0
    assert "tacg layer 0: feasible plan" in err and "tacg layer 1: feasible plan" in err
    assert not any(LAYER_LINE.search(line) for line in out.splitlines())


def test_quiet_writes_nothing_on_stderr(capsys, pooled_balance_quickstart):
    """--quiet: results on stdout, nothing at all on stderr, even the note a --verbose run shows
    (balance on pooled loads plans all layers in one pass: --workers gets a note)."""
    argv = ["solve", str(pooled_balance_quickstart), "--workers", "2"]
    assert main([*argv, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "| MaxVio" in out
    assert main(argv) == 0  # auto mode, stderr not a terminal: the note still shows
    err = capsys.readouterr().err
    assert err.strip() == "note: method 'balance' solves all layers together; running it serially here"


def test_progress_decision(monkeypatch):
    """Progress lines show unless --quiet; bars redraw on a terminal, elsewhere they are line bars."""
    for tty in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty, raising=False)
        assert console.configure() == "auto" and console.progress() is True
        made = console.bar(range(3), total=3)
        assert made.disable is False and isinstance(made, console.LineBar) is (not tty)
        made.close()
        console.configure(verbose=True)
        assert console.progress() is True and console.bar(range(3)).disable is False
        console.configure(verbose=True, quiet=True)
        assert console.progress() is False and console.bar(range(3)).disable is True


@pytest.mark.parametrize("method", ["tacg", "greedy", "gem", "hypergraph", "tacg-cpsat"])
def test_layer_lines_use_the_result_vocabulary(method, monkeypatch, capsys):
    """Every per-layer line names its plan in Status words; a termination word, when present, is one of ours."""
    from moeopt.registry import get_method

    if not get_method(method).available():
        pytest.skip(f"{method} not available")
    args = ["solve", str(QUICKSTART), "--method", method, "--verbose", "--layer-time-limit", "5"]
    if method == "gem":
        args = ["solve", str(ROOT / "tests" / "data" / "four_layers.yaml"), "--method", "gem", "--verbose"]
    code = main(args)
    err = capsys.readouterr().err
    if code == 2:
        pytest.skip(f"{method} cannot solve this instance: {err.strip()}")
    lines = [line for line in err.splitlines() if LAYER_LINE.search(line)]
    assert lines, err
    for line in lines:
        assert PLAN_WORD.search(line), line
        first = line.split(": ", 1)[1].split(",")[0]
        assert first in TERMINATIONS or PLAN_WORD.fullmatch(first), line


def test_history_is_recorded_per_layer(tmp_path, capsys):
    """A layer-by-layer solve records each layer's (seconds, objective, bound); the objectives add up
    to the report's (tacg combines by sum)."""
    report = tmp_path / "r.json"
    assert main(["solve", str(QUICKSTART), "--method", "tacg", "--quiet", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    hist = data["stats"]["history"]
    assert sorted(h["layer"] for h in hist) == [0, 1]
    assert all(h["seconds"] > 0 for h in hist) and [h["seconds"] for h in hist] == sorted(h["seconds"] for h in hist)
    assert sum(h["objective"] for h in hist) == pytest.approx(data["objective"], rel=1e-9)
    assert all(h["status"] in {s.value for s in Status} and h["termination"] in TERMINATIONS for h in hist)


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_help_lists_every_command(capsys):
    """moeopt --help lists every subcommand (trace's too) with its one-line help, and no RST markup."""
    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    sub = _commands(parser)
    for action in sub._choices_actions:
        assert re.search(rf"^\s+{re.escape(action.dest)}\s+{re.escape(action.help.split()[0])}", text, re.M), action
    for name in ("synth", "stats", "import"):
        assert f"trace {name}" in text
    assert "plot" in sub.choices and "``" not in text


def test_every_subcommand_help_is_readable(capsys):
    """Each subcommand's --help exits 0, starts with its usage and has no RST markup."""
    sub = _commands(build_parser())
    names = [[n] for n in sub.choices if n != "trace"] + [["trace", n] for n in ("synth", "stats", "import")]
    for argv in names:
        with pytest.raises(SystemExit) as info:
            main([*argv, "--help"])
        text = capsys.readouterr().out
        assert info.value.code == 0 and text.startswith(f"usage: moeopt {' '.join(argv)}"), argv
        assert "``" not in text


def test_compare_table_is_aligned(capsys):
    """Every row of the compare table has the same width, the wall time and dispatch rows included."""
    assert main(["compare", str(QUICKSTART), "--methods", "linear,greedy", "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len({len(r) for r in rows}) == 1, rows
    assert any(r.startswith("| wall time (s) ") for r in rows) and any(r.startswith("| dispatch ") for r in rows)
    assert len({r.index("|", 1) for r in rows}) == 1  # the first column ends at one place


def test_options_are_never_abbreviated(tmp_path, capsys):
    """``frontier --out x`` is refused (one line, exit 2) rather than taken for ``--output``, and
    ``solve --time 1`` rather than taken for ``--time-limit`` (the total) by its spelling."""
    target = tmp_path / "x"
    with pytest.raises(SystemExit) as info:
        main(["frontier", str(QUICKSTART), "--out", str(target)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --out" in err
    assert not target.exists()
    for abbreviated in ("--time", "--layer-time"):
        with pytest.raises(SystemExit):
            main(["solve", str(QUICKSTART), abbreviated, "1"])
        assert f"unrecognized arguments: {abbreviated}" in capsys.readouterr().err
