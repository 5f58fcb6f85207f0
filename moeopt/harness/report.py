"""The Markdown summary of a ``moeopt validate`` report."""

from __future__ import annotations

from typing import Any


def report_markdown(report: dict[str, Any]) -> str:
    """A Markdown summary of a validate report (device, table of plans, ranking)."""
    dev, ffn = report["device"], report["ffn"]
    unit = report["modelled_profile"]["unit"]
    lines = [
        f"# Measured plan runs: {report['instance']}",
        "",
        f"- device: **{dev['name']}** ({dev['type']}; torch {dev['torch']}, {dev['threads']} thread(s))",
        f"- expert FFN: SwiGLU d_model={ffn['d_model']}, d_ff={ffn['d_ff']}, {ffn['dtype']}",
        f"- emulated: {report['gpus']} GPUs, {report['layers']} layer(s) x {report['steps']} step(s); "
        f"speeds ({report['speed_source']}): {', '.join(f'{s:.3f}' for s in report['speeds'])}",
        f"- timing: {report['timing']['timer']}, {report['timing']['statistic']} of "
        f"{report['timing']['repeats']} interleaved rounds after "
        f"{report['timing']['warmup']} warm-up run(s)",
        f"- modelled: evaluator's S with the {report['modelled_profile']['source']} profile ({unit})"
        + (f"; {report['modelled_profile']['note']}" if report["modelled_profile"].get("note") else ""),
        "",
        "| plan | measured S (ms) | modelled S | measured / modelled | vs linear, measured | "
        "vs linear, modelled | measured p90 (ms) | per-step corr. |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for p in report["plans"]:
        lines.append(
            f"| {p['name']} | {p['measured_straggler_ms']:.3f} | {p['modelled_straggler']:.3f} | "
            f"{num(p['measured_over_modelled'], '.3f')} | {num(p['measured_improvement_vs_linear'], '+.1f')} % | "
            f"{num(p['modelled_improvement_vs_linear'], '+.1f')} % | {p['measured_p90_ms']:.3f} | "
            f"{num(p['step_correlation'], '.3f')} |"
        )
    r = report["ranking"]
    tau = "-" if r["kendall_tau"] is None else f"{r['kendall_tau']:.3f}"
    agrees = {True: "yes", False: "no", None: "-"}[r["agrees"]]
    lines += [
        "",
        f"Ranking (best first): measured {' < '.join(r['measured'])}; modelled {' < '.join(r['modelled'])}; "
        f"Kendall tau {tau}; agrees: {agrees}.",
    ]
    a2a = report["all_to_all"]
    if a2a.get("ran"):
        lines.append(
            f"All-to-all ({a2a['backend']}, {a2a['world']} ranks): "
            + ", ".join(f"{k} {v:.3f} ms" for k, v in a2a["ms"].items())
        )
    else:
        lines.append(f"All-to-all not timed: {a2a['reason']}.")
    return "\n".join(lines) + "\n"
