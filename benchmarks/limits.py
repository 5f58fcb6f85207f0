"""Time limits and reproducible certificates (issue 42, items 2 and 3).

Usage::

    python benchmarks/limits.py                  # both instances, every method, T = 2 s per layer
    python benchmarks/limits.py --quick          # the 3 x 128 instance (and crosslayer's) only
    python benchmarks/limits.py --layer-time-limit 0.5 --methods hypergraph,joint

Writes ``benchmarks/results/limits.json`` (every run: command, exit code, wall time, the report's
termination and notes) and ``limits.md`` (the tables).

**Limits.** Every registered method that is available here runs through the command line,
``python -m moeopt solve INSTANCE --method M --layer-time-limit T`` (``T`` seconds per layer), on two
instances (synthetic top-8 traces of 8192 tokens, 16 GPUs): 3 layers x 128 experts (8 slots per
GPU), and 4 layers x 64 experts with one replica slot per GPU; ``crosslayer``, the planner of
``token_home: previous-layer``, also on 4 layers x 128 experts with those homes. Its wall time
(the whole process: start-up, loading, solving, scoring, writing) is compared with
``1.1 x T x layers + start-up``, start-up being the wall time of the trivial method ``linear``
on the same instance run just before it (so that both see about the same load on a shared
machine; the median of three runs at the start is shown too). A method that refuses the instance
(exit 2, one line: e.g. an exact model too large for the limit) is listed with its message and
judged the same way.

**Reproducibility.** ``joint``, ``crosslayer`` and ``tacg`` with ``certificate: auto`` run twice
without a time limit on 2 layers x 64 experts (top-8, 4096 tokens; 16 GPUs for ``joint`` and ``crosslayer``,
the latter with ``token_home: previous-layer``; 8 GPUs for ``tacg``), the second time beside two
busy loops (one per core); their
reports (plan, bound, gap, the certificates' records, every statistic) must be identical apart
from the fields that hold wall times (keys with ``seconds``, ``time`` or ``wall`` in their
names). The fields that differ, if any, are listed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import machine, run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

RESULTS = ROOT / "benchmarks" / "results"

#: the instances of the limits table: name -> (YAML, the methods it runs: None for every one)
INSTANCES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "3x128": (
        """\
name: limits-3x128
model: {layers: 3, experts: 128, top_k: 8}
cluster: {gpus: 16}
workload:
  synthetic: {tokens: 8192, steps: 16, structure_seed: 5, seed: 0}
profile: {variability: medium, seed: 0, tile: 64}
method: {name: linear}
""",
        None,
    ),
    "4x64+1": (
        """\
name: limits-4x64-replica
model: {layers: 4, experts: 64, top_k: 8}
cluster: {gpus: 16, replica_slots_per_gpu: 1}
workload:
  synthetic: {tokens: 8192, steps: 16, structure_seed: 5, seed: 0}
profile: {variability: medium, seed: 0, tile: 64}
method: {name: linear}
""",
        None,
    ),
    # the planner of previous-layer homes, on its own kind of instance (every plan is then also
    # relabeled and scored under those homes, which costs every method the same)
    "4x128 prev": (
        """\
name: limits-4x128-previous-layer
model: {layers: 4, experts: 128, top_k: 8}
cluster: {gpus: 16, token_home: previous-layer}
workload:
  synthetic: {tokens: 8192, steps: 16, structure_seed: 5, seed: 0, layer_dependency: 0.5}
method: {name: linear}
""",
        ("crosslayer",),
    ),
}

#: the reproducibility check: label -> (instance YAML, method): each certified method on an
#: instance where its certificate does real work: joint's cover bound with fewer slots per GPU
#: (4) than experts per token (8), crosslayer's under the previous-layer homes it plans for,
#: tacg's column generation on groups of 8 (where it gives up and the SDP runs)
REPRO_BASE = """\
name: limits-reproducible
model: {{layers: 2, experts: 64, top_k: 8}}
cluster: {{gpus: {gpus}{homes}}}
workload:
  synthetic: {{tokens: 4096, steps: 16, structure_seed: 7, seed: 0, layer_dependency: 0.5}}
method: {method}
"""
REPRODUCED = {
    "joint": REPRO_BASE.format(gpus=16, homes="", method="{name: joint}"),
    "crosslayer": REPRO_BASE.format(gpus=16, homes=", token_home: previous-layer", method="{name: crosslayer}"),
    "tacg (certificate: auto)": REPRO_BASE.format(gpus=8, homes="", method="{name: tacg, certificate: auto}"),
}

#: the limit: 1.1 x T x layers + start-up
SLACK = 1.1
#: report keys that hold wall times, the only fields two runs may differ in
WALL = re.compile(r"seconds|time|wall")
#: runs of the trivial method whose median is the start-up
STARTUP_RUNS = 3


def say(msg: str) -> None:
    print(msg, flush=True)


def method_names() -> list[str]:
    """Every registered method that is available here."""
    from moeopt.registry import get_method
    from moeopt.registry import method_names as names

    return [n for n in names() if get_method(n).available()]


def run_cli(args: list[str], timeout: float) -> dict[str, Any]:
    """``python -m moeopt ARGS``: exit code, wall seconds, the last line of stderr."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "moeopt", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        code, err = out.returncode, out.stderr
    except subprocess.TimeoutExpired as exc:
        code, err = None, (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    wall = time.perf_counter() - t0
    lines = [x for x in err.strip().splitlines() if x.strip()]
    return {"exit": code, "wall": wall, "stderr_tail": lines[-1] if lines else ""}


def startup(instance: Path, folder: Path, runs: int = STARTUP_RUNS) -> list[float]:
    """Wall times of the trivial method ``linear`` on ``instance`` (the start-up of every run)."""
    walls = []
    for i in range(runs):
        args = ["solve", str(instance), "--method", "linear", "--quiet", "--report", str(folder / f"lin{i}.json")]
        r = run_cli(args, 600)
        walls.append(r["wall"])
    return walls


def limit_row(name: str, method: str, instance: Path, layers: int, T: float, folder: Path) -> dict:
    """One method at ``--layer-time-limit T`` on one instance, right after a run of ``linear`` (its start-up)."""
    stem = f"{name.replace(' ', '-')}-{method}"
    start = startup(instance, folder, runs=1)[0]
    report = folder / f"{stem}.json"
    args = [
        "solve",
        str(instance),
        "--method",
        method,
        "--layer-time-limit",
        f"{T:g}",
        "--quiet",
        "--report",
        str(report),
        "--output",
        str(folder / f"{stem}-plan.json"),
    ]
    r = run_cli(args, timeout=max(600.0, 20 * T * layers))
    allowed = SLACK * T * layers + start
    row: dict[str, Any] = {
        "instance": name,
        "method": method,
        "layers": layers,
        "time_limit": T,
        "wall": r["wall"],
        "allowed": allowed,
        "startup": start,
        "exit": r["exit"],
        "met": r["exit"] is not None and r["wall"] <= allowed,
        "ratio": (r["wall"] - start) / (T * layers),
    }
    if report.exists():
        rep = json.loads(report.read_text())
        stats = rep.get("stats", {})
        row.update(
            termination=rep.get("termination"),
            solve_wall=rep.get("wall_time"),
            note=stats.get("note"),
            exceeded=stats.get("time_limit_exceeded_s"),
        )
    else:
        row["message"] = r["stderr_tail"]
    return row


def without_wall_times(value: Any) -> Any:
    """``value`` (a report) without the keys that hold wall times, recursively."""
    if isinstance(value, dict):
        return {k: without_wall_times(v) for k, v in value.items() if not WALL.search(str(k))}
    if isinstance(value, list):
        return [without_wall_times(v) for v in value]
    return value


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where two reports differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}.{k}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) else [path or "."]


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning on a core each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def reproducibility(folder: Path) -> list[dict]:
    """Each certified method twice, the second run beside two busy loops."""
    out = []
    for label, text in REPRODUCED.items():
        inst = folder / f"repro-{len(out)}.yaml"
        inst.write_text(text)
        runs = []
        for busy in (False, True):
            hogs = busy_loops(2) if busy else []
            try:
                time.sleep(0.5 if busy else 0.0)
                report = folder / f"repro-{len(out)}-{int(busy)}.json"
                r = run_cli(["solve", str(inst), "--quiet", "--report", str(report)], timeout=3600)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            rep = json.loads(report.read_text()) if report.exists() else {}
            runs.append({**r, "report": rep})
        a, b = (without_wall_times(x["report"]) for x in runs)
        diff = differences(a, b)
        rep = runs[0]["report"]
        row = {
            "method": label,
            "walls": [x["wall"] for x in runs],
            "bound": rep.get("bound"),
            "objective": rep.get("objective"),
            "gap": rep.get("gap"),
            "termination": [x["report"].get("termination") for x in runs],
            "identical": not diff and all(x["exit"] == 0 for x in runs),
            "differences": diff,
        }
        say(
            f"  {label}: {'identical' if row['identical'] else 'DIFFERENT: ' + ', '.join(diff)}; "
            f"walls {runs[0]['wall']:.1f} / {runs[1]['wall']:.1f} s (idle / busy)"
        )
        out.append(row)
    return out


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def body(data: dict) -> str:
    """The Markdown tables (also the documentation page's body)."""
    info = data["info"]
    m = info["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["load_average"])
    head = [
        "instance",
        "method",
        "wall (s)",
        "start-up (s)",
        "allowed (s)",
        "met",
        "(wall - start-up) / (T L)",
        "solve (s)",
        "termination",
        "note / message",
    ]
    rows = [
        [
            r["instance"],
            r["method"],
            fmt(r["wall"]),
            fmt(r["startup"]),
            fmt(r["allowed"]),
            "yes" if r["met"] else "**no**",
            fmt(r["ratio"]),
            fmt(r.get("solve_wall")),
            r.get("termination") or (f"exit {r['exit']}" if r["exit"] else "-"),
            (r.get("note") or r.get("message") or "")[:120],
        ]
        for r in data["rows"]
    ]
    met = sum(r["met"] for r in data["rows"])
    starts = ", ".join(f"{k} {v:.2f} s" for k, v in info["startup"].items())
    out = [
        "# Time limits and reproducible certificates",
        "",
        f"Machine: {m['cpus']} CPUs ({m['machine']}), Python {m['python']}, load average at start {load} (the CPUs "
        f"are shared with other work: timings are noisy). Commit {str(m['git_commit'])[:10]}. Run time "
        f"{info['wall_s']:.0f} s. Produced by `python benchmarks/limits.py{' --quick' if info['quick'] else ''}`.",
        "",
        f"## Wall time at `--layer-time-limit {info['time_limit']:g}` (seconds per layer)",
        "",
        "Every available method through the command line; wall = the whole process (start-up, loading, "
        "solving, scoring, writing the plan and the report); allowed = 1.1 x T x layers + start-up, start-up = "
        "the wall of `linear` on the same instance run just before it (the CPUs are shared: both see about the "
        f"same load; its median of three at the start: {starts}). Met: {met} of {len(data['rows'])}.",
        "",
        tabulate(rows, headers=head, tablefmt="github", disable_numparse=True),
        "",
    ]
    repro = data.get("reproducible") or []
    again = info.get("reproducible_run")
    if repro and again:  # rerun apart: its own machine line
        rm = again["machine"]
        rload = ", ".join(f"{x:.2f}" for x in rm["load_average"])
        note = f"The check below ran apart (`--repro-only`): commit {str(rm['git_commit'])[:10]}, load {rload}."
        out += [note, ""]
    if repro:
        rrows = [
            [
                r["method"],
                "yes" if r["identical"] else "**no**",
                fmt(r["objective"], 4),
                fmt(r["bound"], 4),
                "-" if r["gap"] is None else f"{100 * r['gap']:.2f} %",
                " / ".join(fmt(w, 1) for w in r["walls"]),
                ", ".join(r["differences"]) or "-",
            ]
            for r in repro
        ]
        out += [
            "## The same certificate on a busy machine",
            "",
            "Each certified method twice on 2 layers x 64 experts (top-8, 4096 tokens; 16 GPUs for `joint` and "
            "`crosslayer`, the latter with `token_home: previous-layer`; 8 GPUs for `tacg`), no time limit, the "
            "second run beside two busy loops (one per core); identical = the two reports are byte for byte the "
            "same once the fields holding wall times are left out.",
            "",
            tabulate(
                rrows,
                headers=[
                    "method",
                    "identical",
                    "objective",
                    "bound",
                    "gap",
                    "wall idle / busy (s)",
                    "fields that differ",
                ],
                tablefmt="github",
                disable_numparse=True,
            ),
            "",
        ]
    return "\n".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the 3 x 128 instance (and crosslayer's) only")
    p.add_argument(
        "--layer-time-limit", dest="time_limit", type=float, default=2.0, help="seconds per layer (default 2)"
    )
    p.add_argument("--methods", help="comma-separated methods (default: every available one)")
    p.add_argument("--no-repro", action="store_true", help="skip the reproducibility check")
    p.add_argument(
        "--repro-only",
        action="store_true",
        help="rerun only the reproducibility check, keeping the limits table of the existing limits.json",
    )
    p.add_argument("--output", type=Path, default=RESULTS, help="folder of limits.json and limits.md")
    args = p.parse_args(argv)
    if not args.time_limit > 0:
        p.error(f"--layer-time-limit: expected a number > 0, got {args.time_limit}")
    if args.methods is not None:
        names = [m.strip() for m in args.methods.split(",") if m.strip()]
        known = method_names()
        bad = [m for m in names if m not in known]
        if not names or bad:
            p.error(f"--methods: expected available methods ({', '.join(known)}), got {args.methods!r}")
        args.methods = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    if args.repro_only:  # the table as it was, the check anew (its machine and commit recorded)
        data = json.loads((args.output / "limits.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            data["reproducible"] = reproducibility(Path(tmp))
        data["info"]["reproducible_run"] = {"machine": machine(), "wall_s": time.perf_counter() - t0}
        (args.output / "limits.json").write_text(json.dumps(data, indent=1) + "\n")
        (args.output / "limits.md").write_text(body(data) + "\n")
        say(f"wrote {args.output / 'limits.json'} and limits.md (reproducibility rerun)")
        return 0
    info: dict[str, Any] = {"machine": machine(), "time_limit": args.time_limit, "quick": args.quick, "startup": {}}
    methods = args.methods or method_names()
    names = ["3x128", "4x128 prev"] if args.quick else list(INSTANCES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in names:
            text, only = INSTANCES[name]
            runs = [m for m in methods if only is None or m in only]
            if not runs:
                continue
            inst = folder / f"{name.replace(' ', '-')}.yaml"
            inst.write_text(text)
            layers = int(re.search(r"layers: (\d+)", text).group(1))  # type: ignore[union-attr]
            walls = startup(inst, folder)
            start = statistics.median(walls)
            info["startup"][name] = start
            say(f"{name}: start-up {start:.2f} s ({', '.join(f'{w:.2f}' for w in walls)})")
            for method in runs:
                row = limit_row(name, method, inst, layers, args.time_limit, folder)
                rows.append(row)
                say(
                    f"  {method}: {row['wall']:.2f} s of {row['allowed']:.2f} allowed "
                    f"({'met' if row['met'] else 'NOT MET'}), {row.get('termination') or row.get('message')}"
                )
        repro = [] if args.no_repro else reproducibility(folder)
    info["wall_s"] = time.perf_counter() - t0
    data = {"info": info, "rows": rows, "reproducible": repro}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "limits.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.output / "limits.md").write_text(body(data) + "\n")
    say(f"wrote {args.output / 'limits.json'} and limits.md ({info['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    run_script(main)
