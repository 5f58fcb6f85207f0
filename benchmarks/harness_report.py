"""Combine a measured profile (YAML) and a validate report (JSON) into one Markdown page.

Usage: ``python benchmarks/harness_report.py PROFILE.yaml REPORT.json OUT.md [--label TEXT]``
(called by ``benchmarks/harness_gpu.sh``).
"""

from __future__ import annotations

import argparse
import json

from machine_info import machine, run_script  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from moeopt.harness.report import report_markdown
from moeopt.io import read_profile, write_json, write_text


def profile_section(path: str) -> list[str]:
    """Markdown lines describing a measured profile: device, sizes, samplings, step error."""
    prof = read_profile(path)
    m = prof.meta
    pts, secs = m.get("points", {}), m.get("sampling_seconds", {})
    lines = [
        "## Latency profile",
        "",
        f"- file: `{path}`; device **{m.get('device')}** ({m.get('device_type')}, torch {m.get('torch')}, "
        f"{m.get('threads')} thread(s)); timer {m.get('timer')}, {m.get('statistic', 'median')} of "
        f"{m.get('repeats')} interleaved rounds after {m.get('warmup')} warm-up run(s)",
        f"- SwiGLU d_model={m.get('d_model')}, d_ff={m.get('d_ff')}, {m.get('dtype')}; "
        f"{m.get('experts_per_gpu')} expert(s) per GPU; n up to {m.get('max_tokens')}; tile {prof.tile}",
        f"- tile-boundary sampling: {pts.get('tile')} points in {secs.get('tile', float('nan')):.2f} s",
    ]
    if "dense" in pts:
        err = m.get("dense_vs_tile", {})
        lines.append(
            f"- dense sweep: {pts['dense']} points in {secs.get('dense', float('nan')):.2f} s; step function "
            f"vs dense: max relative error {100 * err.get('max_rel_error', float('nan')):.1f} % "
            f"(at n={err.get('n_at_max')}), mean {100 * err.get('mean_rel_error', float('nan')):.1f} %"
        )
    lat = prof.latency[0]
    picks = sorted({1, len(lat) // 4, len(lat) // 2, len(lat) - 1})
    lines += [
        "",
        "| n (tokens) | " + " | ".join(str(j * prof.tile) for j in picks) + " |",
        "|---|" + "---|" * len(picks),
        f"| C(n) at speed {m.get('speeds', [1.0])[0]:g} (ms) | " + " | ".join(f"{lat[j]:.4f}" for j in picks) + " |",
        "",
    ]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("profile")
    p.add_argument("report")
    p.add_argument("output")
    p.add_argument("--label", default="")
    args = p.parse_args()
    report = json.loads(open(args.report).read())
    report["machine"] = machine()  # the host: Python, CPUs, git commit, solver versions (the device is in "device")
    write_json(args.report, report)
    body = report_markdown(report).splitlines()
    head = [body[0], ""]
    if args.label:
        head += [f"**{args.label}**", ""]
    text = "\n".join(head + profile_section(args.profile) + ["## Plan runs", ""] + body[2:]) + "\n"
    write_text(args.output, text)


if __name__ == "__main__":
    run_script(main)
