"""GCG (SCIP's generic branch-and-price) against moeopt's column generation on grouping layers.

Issue 12 names PyGCGOpt as one option to compare the set-partitioning bound against. This
script gives GCG the grouping problem with the decomposition spelled out, and puts its
bound next to :func:`moeopt.colgen.column_generation` on the same cells of
``benchmarks/certificates.py``.

GCG's model is the linearized grouping MILP:
- ``x[e, g]`` binary (expert ``e`` on GPU ``g``);
- ``y[i, j, g] <= x[i, g], x[j, g]`` for every pair with positive affinity;
- maximize ``sum W_ij y[i, j, g]``.

The assignment rows ``sum_g x[e, g] = 1`` form the master. Each GPU's rows (at most ``cap``
experts, the load limit, the ``y`` rows) form one block. GCG finds that the blocks are
identical, aggregates them into one pricing problem, and solves it as a MIP with SCIP.
This is the same Dantzig–Wolfe relaxation that moeopt prices with its own heuristics,
enumeration and CP-SAT.

Each cell runs in a child process, because the PyGCGOpt wheel can crash (segmentation fault)
during a solve. A crash is recorded as such. The child writes SCIP's log, and the
``(time, dual bound, primal bound)`` rows of its table are kept.

Needs (not a moeopt dependency)::

    pip install "pygcgopt==0.4.0" "pyscipopt==5.2.1"   # the wheel is built against pyscipopt 5.2

Usage::

    python benchmarks/gcg.py                        # 32x8, 64x4, 64x8, 64x16, both kinds, 120 s
    python benchmarks/gcg.py --cells 32x8 --kinds synthetic --time-limit 30

Writes ``benchmarks/results/gcg.json`` and ``gcg.md``. The column generation numbers come
from ``benchmarks/results/certificates.json`` (60 s per cell there). Rerun that file first
if the instances change.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from certificates import gap, grouping, pct  # noqa: E402  (the same instances and gap as there)
from machine_info import machine, run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from moeopt.io import write_json, write_text  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CELLS = ((32, 8), (64, 4), (64, 8), (64, 16))
KINDS = ("synthetic", "count-sampled")
#: a row of SCIP's/GCG's progress table: time in the first column, dual and primal bound
#: in the two columns before "deg" and "gap"
ROW = re.compile(r"^\s*(?:\S\s+)?(\d+(?:\.\d+)?)s\|.*\|\s*(\S+)\s*\|\s*(\S+)\s*\|\s*\S+\s*\|\s*\S+\s*$")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "--": no primal solution yet


def solve_one(kind: str, E: int, G: int, limit: float) -> dict[str, Any]:
    """In the child: build the cell's model, solve it with GCG, return its numbers."""
    from pygcgopt import Model

    g, desc = grouping(kind, E, G)
    W, w = g.graph, g.load
    m = Model()
    m.setParam("limits/time", float(limit))
    x = {(e, k): m.addVar(vtype="B", name=f"x{e}_{k}") for e in range(E) for k in range(G)}
    pairs = [(i, j) for i in range(E) for j in range(i + 1, E) if W[i, j] > 0]
    master = [m.addCons(sum(x[e, k] for k in range(G)) == 1, name=f"assign{e}") for e in range(E)]
    blocks = []
    objective = []
    for k in range(G):
        rows = [m.addCons(sum(x[e, k] for e in range(E)) <= g.cap, name=f"cap{k}")]
        if g.limited:
            rows.append(m.addCons(sum(float(w[e]) * x[e, k] for e in range(E)) <= float(g.load_limit), name=f"load{k}"))
        for i, j in pairs:
            y = m.addVar(vtype="C", lb=0.0, ub=1.0, name=f"y{i}_{j}_{k}")
            rows.append(m.addCons(y <= x[i, k], name=f"a{i}_{j}_{k}"))
            rows.append(m.addCons(y <= x[j, k], name=f"b{i}_{j}_{k}"))
            objective.append(float(W[i, j]) * y)
        blocks.append(rows)
    m.setObjective(sum(objective), "maximize")
    m.addDecompositionFromConss(master, *blocks)
    t0 = time.perf_counter()
    m.optimize()
    seconds = time.perf_counter() - t0
    return {
        "instance": desc,
        "status": m.getStatus(),
        "dual_bound": m.getDualbound(),
        "primal": m.getPrimalbound() if m.getNSols() else None,
        "time": seconds,
        "variables": len(x) + len(pairs) * G,
    }


def run_cell(kind: str, E: int, G: int, limit: float) -> dict[str, Any]:
    """In the parent: one child process per cell; its log's table rows and its result line."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(E), str(G), str(limit)],
        capture_output=True,
        text=True,
        timeout=limit + 300,
    )
    wall = time.perf_counter() - t0
    history = []
    result: dict[str, Any] | None = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            continue
        hit = ROW.match(line)
        if hit:
            history.append([float(hit.group(1)), _number(hit.group(2)), _number(hit.group(3))])
    if result is None:
        result = {"status": f"crashed (exit code {proc.returncode})", "dual_bound": None, "primal": None}
    return {**result, "wall": wall, "returncode": proc.returncode, "history": history}


def colgen_of(kind: str, E: int, G: int) -> dict[str, Any] | None:
    path = RESULTS / "certificates.json"
    if not path.is_file():
        return None
    for cell in json.loads(path.read_text())["cells"]:
        if (cell["kind"], cell["E"], cell["G"]) == (kind, E, G):
            cg = cell["colgen"]
            first = next((t for t, b, _ in cg["history"] if b <= cg["bound"] * (1 + 1e-9)), cg["time"])
            return {
                "bound": cg["bound"],
                "proven": cg["proven"],
                "time": cg["time"],
                "time_to_bound": first,
                "best_plan": cell["best_plan"],
            }
    return None


def _first_at(history: list, bound: float | None) -> str:
    """When GCG's dual bound first came within 0.1 % of column generation's bound."""
    if bound is None:
        return "-"
    for t, dual, _ in history:
        if dual is not None and dual <= bound * 1.001:
            return f"{t:.1f} s"
    return "never"


HEAD = [
    "kind",
    "E × G",
    "GCG status",
    "GCG bound",
    "GCG gap",
    "GCG reaches colgen's bound at",
    "colgen bound",
    "colgen gap",
    "colgen bound at",
]


def table_rows(res: dict[str, Any]) -> list[list[str]]:
    """One row per cell (:data:`HEAD`), as the Markdown file and the documentation page show it."""
    rows = []
    for c in res["cells"]:
        cg, gc = c["colgen"], c["gcg"]
        plan = None if cg is None else cg["best_plan"]
        rows.append(
            [
                c["kind"],
                f"{c['E']} × {c['G']}",
                gc["status"],
                "-" if gc["dual_bound"] is None else f"{gc['dual_bound']:.4f}",
                pct(None if gc["dual_bound"] is None else gap(gc["dual_bound"], plan)),
                _first_at(gc["history"], None if cg is None else cg["bound"]),
                "-" if cg is None else f"{cg['bound']:.4f}",
                pct(None if cg is None else gap(cg["bound"], plan)),
                "-" if cg is None else f"{cg['time_to_bound']:.1f} s",
            ]
        )
    return rows


def setting(info: dict[str, Any]) -> str:
    return (
        f"GCG: PyGCGOpt {info['pygcgopt']} (pyscipopt {info['pyscipopt']}), {info['time_limit']:.0f} s per cell,"
        " with the decomposition given (master: the assignment rows; one block per GPU, aggregated)."
        " Column generation: `benchmarks/results/certificates.json` (60 s per cell). Gap = (bound − best plan)"
        " / bound, against the best plan of the certificates benchmark."
    )


def report(res: dict[str, Any]) -> str:
    info = res["info"]
    m = info["machine"]
    return "\n".join(
        [
            "# GCG against column generation (grouping set-partitioning bound)",
            "",
            setting(info) + f" Machine: {m['cpus']} CPUs, commit {m['git_commit']}.",
            "",
            tabulate(table_rows(res), headers=HEAD, tablefmt="github"),
            "",
            f"Written by `benchmarks/gcg.py` in {info['elapsed']:.0f} s.",
            "",
        ]
    )


def _cells(text: str) -> list[tuple[int, int]]:
    """``"32x8,64x4"`` -> ``[(32, 8), (64, 4)]``: E experts on G GPUs, G dividing E."""
    out = []
    for cell in text.split(","):
        parts = cell.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"expected cells like 64x8 (E x G), got {cell!r}")
        E, G = int(parts[0]), int(parts[1])
        if G < 1 or E < G or E % G:
            raise argparse.ArgumentTypeError(f"{cell}: needs 1 <= G <= E with G dividing E")
        out.append((E, G))
    return out


def _kinds(text: str) -> list[str]:
    bad = [k for k in text.split(",") if k not in KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"expected kinds among {', '.join(KINDS)}, got {', '.join(bad)}")
    return text.split(",")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=_cells, default=list(CELLS), help="ExG cells, comma-separated")
    ap.add_argument("--kinds", type=_kinds, default=list(KINDS))
    ap.add_argument("--time-limit", type=_seconds, default=120.0, help="seconds per cell")
    ap.add_argument("--child", nargs=4, metavar=("KIND", "E", "G", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, E, G, limit = args.child
        out = solve_one(kind, int(E), int(G), float(limit))
        print("RESULT " + json.dumps(out), flush=True)
        return 0
    try:
        import pygcgopt
        import pyscipopt
    except ImportError:
        print('needs PyGCGOpt: pip install "pygcgopt==0.4.0" "pyscipopt==5.2.1"', file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    cells = []
    for kind in args.kinds:
        for E, G in args.cells:
            gc = run_cell(kind, E, G, args.time_limit)
            cells.append({"kind": kind, "E": E, "G": G, "gcg": gc, "colgen": colgen_of(kind, E, G)})
            print(f"{kind} {E}x{G}: {gc['status']}, bound {gc['dual_bound']}, {gc['wall']:.0f} s", flush=True)
    res = {
        "info": {
            "machine": machine(),
            "pygcgopt": getattr(pygcgopt, "__version__", "?"),
            "pyscipopt": getattr(pyscipopt, "__version__", "?"),
            "time_limit": args.time_limit,
            "elapsed": time.perf_counter() - t0,
        },
        "cells": cells,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "gcg.json", res)
    write_text(RESULTS / "gcg.md", report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    run_script(main)
