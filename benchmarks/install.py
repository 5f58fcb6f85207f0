"""The core install's size, package count and time, beside the same install with the extras ``plot`` and ``sdp``.

``pip install -e .`` is the core; ``pip install -e ".[plot,sdp]"`` adds matplotlib and CVXPY, which were
core dependencies before they moved to those extras, so it is the core as it was. Each run makes a fresh
virtual environment, upgrades pip in it (not timed), installs from the configured package index with no
pip cache, and records the wall time, pip's CPU time (user + system of pip and every process it starts),
the size of site-packages (``du``) and the packages installed besides pip and moeopt. The variants
alternate, so that both see the machine's load alike.

    python benchmarks/install.py [--runs 2]     # -> benchmarks/results/install.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import machine, run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "install.json"

#: (variant, what pip installs): the core, and the core with the extras that used to be core
VARIANTS = (("core", "."), ("core + plot, sdp", ".[plot,sdp]"))


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(target: str, workdir: Path) -> dict:
    """One fresh install of ``target`` (``pip install -e TARGET`` from the repository root)."""
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True, capture_output=True)
    cpu0, t0 = _cpu_of_children(), time.perf_counter()
    pip = [python, "-m", "pip", "install", "-q", "--no-cache-dir", "-e", target]
    subprocess.run(pip, cwd=ROOT, check=True, capture_output=True)
    wall, cpu = time.perf_counter() - t0, _cpu_of_children() - cpu0
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    size_mb = int(subprocess.run(["du", "-sm", site], check=True, capture_output=True, text=True).stdout.split()[0])
    frozen = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    ).stdout
    names = sorted(p["name"] for p in json.loads(frozen) if p["name"].lower() not in ("pip", "moeopt"))
    out = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "size_mb": size_mb, "packages": len(names)}
    return {**out, "names": names}


def summary(rows: list[dict]) -> list[dict]:
    """Per variant: size and packages (the same every run), median CPU and wall time, the wall range."""
    out = []
    for variant, target in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        out.append(
            {
                "variant": variant,
                "install": f"pip install -e {target!r}" if target != "." else "pip install -e .",
                "size_mb": mine[-1]["size_mb"],
                "packages": mine[-1]["packages"],
                "cpu_s": statistics.median(r["cpu_s"] for r in mine),
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "wall_min_s": min(r["wall_s"] for r in mine),
                "wall_max_s": max(r["wall_s"] for r in mine),
                "runs": len(mine),
            }
        )
    core, full = (set(s["names"]) for s in (rows[0], rows[1]))
    out[1]["extra_packages"] = sorted(full - core)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="installs of each variant (alternating)")
    parser.add_argument("--out", type=Path, default=OUT, help="the results file to write")
    args = parser.parse_args(argv)
    info = {
        "machine": machine(),
        "python": sys.version.split()[0],
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "index": "pip's configured package index (on the machine of the recorded run: a local mirror of PyPI)",
    }
    rows = []
    for run in range(args.runs):
        for variant, target in VARIANTS:
            with tempfile.TemporaryDirectory() as tmp:
                row = {"variant": variant, "run": run, **measure(target, Path(tmp))}
            print(
                f"{variant}: {row['size_mb']} MB, {row['packages']} packages, cpu {row['cpu_s']} s, "
                f"wall {row['wall_s']} s",
                flush=True,
            )
            rows.append(row)
    args.out.write_text(json.dumps({"info": info, "rows": rows, "summary": summary(rows)}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main)
