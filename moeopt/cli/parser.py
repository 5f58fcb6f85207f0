"""The argument parser: one sub-command per job, usage errors as one line."""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
from typing import Any, NoReturn

from moeopt.cli.args import (
    _fraction,
    _harness_args,
    _nonneg_int,
    _number_type,
    _positive_int,
    limit_args,
    output_arg,
    report_args,
    verbosity,
)
from moeopt.cli.commands import (
    cmd_compare,
    cmd_evaluate,
    cmd_frontier,
    cmd_methods,
    cmd_profile,
    cmd_solve,
    cmd_trace_stats,
    cmd_trace_stream,
    cmd_trace_synth,
    cmd_validate,
)
from moeopt.cli.engines import cmd_export, cmd_import, cmd_trace_import
from moeopt.cli.plots import cmd_plot
from moeopt.cli.replay import add_parser as add_replay_parser
from moeopt.errors import MoeoptError
from moeopt.outputs import check_directory, check_target
from moeopt.plan import DISPATCH_KINDS
from moeopt.version import package_version

#: the help text's description (``moeopt --help``)
DESCRIPTION = """moeopt: place the experts of a Mixture-of-Experts model on GPUs; solve, score, compare and plot plans.

Results go to stdout (--json: the JSON report alone); progress (per-layer lines; bars on a terminal,
a line a minute elsewhere) and notes to stderr unless --quiet (see moeopt.console). Every command
names its main output -o/--output and its JSON report --report. --time-limit is seconds for the
whole run, --layer-time-limit seconds per layer. Ctrl-C or SIGTERM: no output, exit 130 / 143."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), like every other moeopt error. Options
    are never abbreviated: ``solve --time 5`` is refused rather than taken for ``--time-limit``
    (argparse's prefix matching would pick one of ``--time-limit`` and ``--layer-time-limit``
    by their spelling)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="moeopt", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    version = f"moeopt {package_version()}"
    p.add_argument("--version", action="version", version=version, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        limit_args(sp)
        sp.add_argument("--seed", type=_nonneg_int, default=0, help="seed of every search (layer l: derived from it)")
        verbosity(sp)
        sp.add_argument(
            "--workers",
            type=_positive_int,
            default=None,
            metavar="N",
            help="solve layers in N local processes (same plans as serial; default: the instance's executor, else 1)",
        )
        sp.add_argument(
            "--ray",
            nargs="?",
            const="local",
            default=None,
            metavar="ADDRESS",
            help="solve layers as Ray tasks on the cluster at ADDRESS, or on a local Ray when no address "
            '(needs pip install -e ".[ray]")',
        )

    def plot_args(sp: argparse.ArgumentParser, layer: bool = True) -> None:
        sp.add_argument("--plot", metavar="FILE.png", help="also draw a figure (matplotlib) to this file")
        if layer:
            sp.add_argument(
                "--layer",
                type=_nonneg_int,
                default=None,
                help="layer of the load plot (default: the plan's worst layer)",
            )

    def dispatch_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--dispatch",
            choices=DISPATCH_KINDS,
            default=None,
            help="how tokens split over an expert's copies (default: the plan's own rule)",
        )

    s = sub.add_parser("solve", help="solve an instance, print metrics vs linear, write plan and report")
    s.add_argument("instance", help="the instance YAML")
    s.add_argument("--method", default=None, help="override the instance's method name")
    output_arg(s, "the plan JSON to write", metavar="PLAN.json")
    report_args(s, "status, objective, bound, gap, metrics, stats")
    s.add_argument("--hint", help="warm-start plan JSON (exact solvers start from it)")
    s.add_argument(
        "--from",
        dest="from_plan",
        metavar="CURRENT_PLAN",
        help="the plan running now (moeopt plan or engine file): re-plan moving few expert weights (balance)",
    )
    s.add_argument(
        "--no-relabel",
        action="store_true",
        help="with token_home: previous-layer, keep the method's GPU ids (no free relabeling)",
    )
    s.add_argument(
        "--from-format",
        choices=["plan", "sglang", "eplb", "vllm-ascend"],
        default=None,
        help="format of --from (default: from the file's content: its keys for .pt / .npz)",
    )
    dispatch_arg(s)
    common(s)
    plot_args(s)
    s.set_defaults(func=cmd_solve)

    e = sub.add_parser("evaluate", help="score a plan on an instance's evaluation workload (or --trace)")
    e.add_argument("instance", help="the instance YAML")
    e.add_argument("plan", help="the plan JSON to score (a moeopt plan file)")
    e.add_argument("--trace", help="evaluate on this trace or count file instead")
    report_args(e, "the plan's metrics")
    dispatch_arg(e)
    verbosity(e)
    e.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("compare", help="several methods side by side")
    c.add_argument("instance", help="the instance YAML")
    c.add_argument("--methods", required=True, help="comma-separated method names")
    report_args(c, "one solve report per method")
    dispatch_arg(c)
    common(c)
    plot_args(c)
    c.set_defaults(func=cmd_compare)

    fr_ = sub.add_parser(
        "frontier", help="communication vs held-out MaxVio of several methods over a load-limit sweep (Pareto set)"
    )
    fr_.add_argument("instance", help="the instance YAML")
    fr_.add_argument("--eps", default="0.02,0.05,0.1,0.2", help="load limits to sweep (comma-separated)")
    fr_.add_argument(
        "--methods",
        default="joint,agnostic,tacg,hypergraph,hottest-replication,gesr,greedy,balance",
        help="comma-separated methods (grouping: eps_load; replication: the base's eps_load; joint: eps)",
    )
    output_arg(fr_, "a folder: write STEM.json, STEM.md and STEM.png there", metavar="DIR")
    fr_.add_argument("--output-dir", dest="output_dir", default=None, help=argparse.SUPPRESS)  # deprecated: -o
    fr_.add_argument("--name", metavar="STEM", help="file stem inside -o/--output (default: the instance name)")
    report_args(fr_, "every point of the sweep, as STEM.json")
    common(fr_)
    plot_args(fr_, layer=False)
    fr_.set_defaults(func=cmd_frontier)

    m = sub.add_parser("methods", help="list registered methods and whether they are available")
    report_args(m, "every method with its parameters' defaults, every MILP solver")
    verbosity(m)
    m.set_defaults(func=cmd_methods)

    t = sub.add_parser("trace", help="synthesize, inspect or import traces")
    tsub = t.add_subparsers(dest="trace_command", required=True, metavar="TRACE_COMMAND")
    ts = tsub.add_parser("synth", help="write a synthetic task-structured trace (.npz)")
    ts.add_argument("--layers", type=_positive_int, default=2, help="MoE layers (default 2)")
    ts.add_argument("--experts", type=_positive_int, default=16, help="routed experts per layer (default 16)")
    ts.add_argument("--top-k", type=_positive_int, default=2, help="experts per token (default 2)")
    ts.add_argument("--tokens", type=_positive_int, default=4096, help="tokens in the trace (default 4096)")
    ts.add_argument("--steps", type=_positive_int, default=16, help="timesteps the tokens fall in (default 16)")
    ts.add_argument("--families", default="code,query,math,reasoning", help="comma-separated task families")
    ts.add_argument("--family-share", default=None, help="comma-separated family shares (default uniform)")
    ts.add_argument("--family", default=None, help="single-family (out-of-distribution) workload")
    ts.add_argument(
        "--family-communities",
        choices=["shared", "per_family"],
        default="shared",
        help="one partition of experts into co-activated communities, or one per family",
    )
    ts.add_argument(
        "--layer-dependency",
        type=_fraction,
        default=0.0,
        help="chance in [0, 1] that a token's community follows its previous top-1 expert's",
    )
    ts.add_argument(
        "--successors",
        type=_nonneg_int,
        default=0,
        help="a following token also favours this many successor experts of its previous top-1 (0: none)",
    )
    ts.add_argument("--structure-seed", type=_nonneg_int, default=0, help="seed of the hidden expert structure")
    ts.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the token sample")
    ts.add_argument(
        "--drift",
        choices=["none", "mix", "popularity", "switch"],
        default="none",
        help="how the load moves over the steps: none (default), mix (family shares), popularity (a random "
        "walk of expert popularity), switch (another hidden structure from --switch-step on)",
    )
    ts.add_argument(
        "--drift-share",
        default=None,
        help="mix: comma-separated family shares at the last step (default: each family in turn)",
    )
    ts.add_argument(
        "--drift-focus",
        type=_fraction,
        default=None,
        help="mix without --drift-share: the focused family's share as the mix visits each family (default 0.85)",
    )
    ts.add_argument(
        "--drift-rate",
        type=_number_type(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
        default=None,
        help="popularity: log-scale step of each expert's popularity random walk per step (default 0.1)",
    )
    ts.add_argument(
        "--switch-step",
        type=_positive_int,
        default=None,
        help="switch: the first step drawn from the new structure (default steps // 2)",
    )
    ts.add_argument(
        "--switch-seed",
        type=_nonneg_int,
        default=None,
        help="switch: the structure seed after the switch (default --structure-seed + 1)",
    )
    output_arg(ts, "the trace .npz to write", required=True, metavar="TRACE.npz")
    verbosity(ts, quiet="print nothing on success")
    ts.set_defaults(func=cmd_trace_synth)
    tst = tsub.add_parser(
        "stream",
        help="write a count stream (per-step counts that drift) from real or any count data (.npz), or (mix) a "
        "token trace whose domain mix drifts",
    )
    tst.add_argument(
        "kind",
        choices=["domains", "phase", "sampled", "mix"],
        help="domains: per-domain counts visited in sequence; phase: --source's load, then --after's from "
        "--switch on; sampled: steps sampled from --source's load, stationary or with --drift; mix: a token "
        "trace, each token labelled with its domain, the domains' mix drifting from even through mixes focused "
        "on each domain in turn",
    )
    tst.add_argument(
        "--source",
        required=True,
        help="count file: per-domain counts .npz (domains, mix), the load before the switch (phase), the load "
        "(sampled)",
    )
    tst.add_argument("--after", default=None, help="phase: count file of the load from --switch on")
    tst.add_argument("--select", default=None, help="domains, sampled, mix: model inside a multi-model count file")
    tst.add_argument("--order", default=None, help="domains, mix: comma-separated domains in turn (default: all)")
    tst.add_argument(
        "--steps-per-domain", type=_positive_int, default=None, help="domains: steps in each domain (default 8)"
    )
    tst.add_argument(
        "--blend",
        type=_nonneg_int,
        default=None,
        help="domains: the last N steps of each domain shift linearly into the next (default 0: abrupt)",
    )
    tst.add_argument(
        "--steps", type=_positive_int, default=None, help="phase, sampled: steps (default 48); mix: (default 32)"
    )
    tst.add_argument(
        "--focus",
        type=_number_type(float, lambda v: math.isfinite(v) and 0 < v <= 1, "a share in (0, 1]"),
        default=None,
        help="mix: the focused domain's share at its waypoint (default 0.85; above 1 / domains)",
    )
    tst.add_argument(
        "--switch", type=_positive_int, default=None, help="phase: first step of --after's load (default steps // 2)"
    )
    tst.add_argument(
        "--ramp",
        type=_nonneg_int,
        default=None,
        help="phase: steps of linear shift from --switch on (default 0: at once)",
    )
    tst.add_argument(
        "--drift",
        type=_number_type(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
        default=None,
        help="sampled: log-scale step of each expert's share random walk per step (default 0: stationary)",
    )
    tst.add_argument(
        "--tokens-per-step",
        type=_positive_int,
        default=4096,
        help="tokens per step: each step and layer is a multinomial draw of this many x top-k (default 4096)",
    )
    tst.add_argument("--top-k", type=_positive_int, default=None, help="model top-k of files that do not record it")
    tst.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the sample (and of --drift's walk)")
    output_arg(
        tst,
        "the counts .npz (with step_counts) to write (mix: the token trace .npz)",
        required=True,
        metavar="STREAM.npz",
    )
    verbosity(tst, quiet="print nothing on success")
    tst.set_defaults(func=cmd_trace_stream)
    tt = tsub.add_parser("stats", help="summarize a trace or count file")
    tt.add_argument("trace", help="the trace or count file (.npz, .json, an SGLang dump)")
    tt.add_argument("--top-k", type=_positive_int, default=None, help="top-k of count files that do not record it")
    tt.add_argument("--select", default=None, help="model inside a multi-model count file")
    tt.add_argument("--graphml", default=None, help="write a layer's coactivation graph as GraphML")
    tt.add_argument("--layer", type=_nonneg_int, default=0, help="the layer --graphml writes (default 0)")
    tt.add_argument("--plan", default=None, help="plan file: each expert's GPU as a --graphml node attribute")
    report_args(tt, "shape, families, per-layer skew and coactivation density, GEM classification")
    verbosity(tt)
    tt.set_defaults(func=cmd_trace_stats)
    ti = tsub.add_parser(
        "import",
        help="SGLang expert-distribution dump(s) of any recorder mode or vLLM EPLB state (.pt) -> trace or "
        "counts .npz; per-rank per_token files -> one trace (homes = ranks), per-rank per_pass files -> one "
        "counts file (steps = passes); other sets -> one counts .npz with every file's steps in turn",
    )
    ti.add_argument("dump", nargs="+", help="the dump files, in time order")
    output_arg(
        ti,
        "TRACE.npz (per_token dumps) or COUNTS.npz (stat / stat_approx / per_pass dumps, vLLM state)",
        required=True,
        metavar="OUT.npz",
    )
    ti.add_argument(
        "--top-k", type=_positive_int, default=None, help="model top-k (stat dumps and vLLM do not record it)"
    )
    ti.add_argument("--trust-pickle", action="store_true", help="also unpickle non-tensor objects (runs code)")
    verbosity(ti, quiet="print nothing on success (no 'wrote' line, no notes)")
    ti.set_defaults(func=cmd_trace_import)
    # the nested trace commands, listed under the top-level help too (from their parsers)
    p.epilog = (
        "trace commands:\n"
        + "\n".join(f"  trace {a.dest:<8}{a.help}" for a in tsub._choices_actions)
        + "\n\nEach command: moeopt COMMAND --help."
    )

    engines = ("sglang", "eplb", "vllm-ascend")
    x = sub.add_parser("export", help="write a plan for a serving engine (SGLang, DeepSeek EPLB, vLLM-Ascend)")
    x.add_argument("plan", help="the plan JSON to export")
    x.add_argument("--format", required=True, choices=engines, help="the engine whose file to write")
    output_arg(x, "the engine file: sglang .json / .pt, eplb .npz / .pt, vllm-ascend .json", required=True)
    x.add_argument("--instance", help="check the plan against it and write cluster's slots_per_gpu + replica ones")
    x.add_argument("--load", help="trace or count file: picks the fill of an empty slot no neutral copy can fill")
    x.add_argument(
        "--dispatch",
        choices=DISPATCH_KINDS,
        default=None,
        help="the rule the engine will run the file under (default: the plan's, which the engine must run: "
        "sglang even/static/lp, eplb even/vllm, vllm-ascend ascend); sets SGLang's --ep-dispatch-algorithm",
    )
    x.add_argument(
        "--dense-layers",
        type=_nonneg_int,
        default=None,
        help="sglang (required there unless --instance sets model.dense_layers): the model's dense hidden "
        "layers, written before the MoE ones (DeepSeek-V3: 3)",
    )
    verbosity(x, quiet="print nothing on success (no summary, no engine settings, no notes)")
    x.set_defaults(func=cmd_export)
    im = sub.add_parser("import", help="read a serving engine's expert placement back into a plan JSON")
    im.add_argument("file", help="the engine's placement file (SGLang map, EPLB tensors, vLLM-Ascend JSON)")
    im.add_argument("--format", required=True, choices=engines, help="the engine that wrote the file")
    output_arg(im, "the plan JSON to write", required=True, metavar="PLAN.json")
    im.add_argument("--instance", help="take gpus and experts from it and check the plan")
    im.add_argument("--gpus", type=_positive_int, default=None, help="GPU count (SGLang maps do not record it)")
    im.add_argument(
        "--dispatch",
        choices=DISPATCH_KINDS,
        default=None,
        help="the rule the engine ran (default: sglang even, SGLang's dynamic, or static / lp if it ran those; "
        "eplb even; vllm-ascend ascend)",
    )
    im.add_argument(
        "--dense-layers",
        type=_nonneg_int,
        default=None,
        help="sglang: leading dense-layer rows to drop (default: --instance's model.dense_layers, else the rows "
        "beyond its MoE layers, else 0)",
    )
    verbosity(im, quiet="print nothing on success (no summary, no notes)")
    im.set_defaults(func=cmd_import)

    pr = sub.add_parser("profile", help="measure a latency profile C(n) of one MoE layer (needs torch)")
    _harness_args(pr)
    pr.add_argument("--experts-per-gpu", type=_positive_int, default=1, help="experts the n tokens are spread over")
    pr.add_argument(
        "--max-tokens", type=_positive_int, default=None, help="largest n (default 4096 on GPU, 512 on CPU)"
    )
    pr.add_argument("--dense", action="store_true", help="also time every n; report the step function's error")
    pr.add_argument("--repeats", type=_positive_int, default=5, help="timed runs per n (median)")
    pr.add_argument("--warmup", type=_nonneg_int, default=2, help="untimed runs per n")
    output_arg(pr, "the profile YAML to write", required=True, metavar="PROFILE.yaml")
    pr.set_defaults(func=cmd_profile)

    v = sub.add_parser("validate", help="run plans on this device as G emulated GPUs; measured vs modelled S")
    v.add_argument("instance", help="the instance YAML")
    v.add_argument("plans", nargs="*", help="plan JSON files (none: linear, greedy and gem solved here)")
    _harness_args(v)
    v.add_argument("--max-steps", type=_positive_int, default=None, help="measure only the first N steps")
    v.add_argument("--profile", default=None, help="modelled profile file (default: the instance's)")
    v.add_argument("--repeats", type=_positive_int, default=3, help="timed runs per GPU group (median)")
    v.add_argument("--warmup", type=_nonneg_int, default=1, help="untimed runs per GPU group")
    v.add_argument(
        "--all-to-all",
        default="auto",
        choices=["auto", "off", "nccl", "gloo"],
        help="time the token all-to-all (auto: NCCL when several CUDA devices are visible)",
    )
    v.add_argument("--world", type=_positive_int, default=None, help="ranks of the all-to-all")
    v.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the emulated tokens and of solved plans")
    report_args(v, "measured and modelled latency per plan")
    v.add_argument("--markdown", metavar="FILE.md", help="also write the report as Markdown")
    v.set_defaults(func=cmd_validate)

    add_replay_parser(sub)

    pl = sub.add_parser(
        "plot", help="draw per-GPU loads, a frontier, or incumbent and bound over time (PNG, matplotlib)"
    )
    pl.add_argument(
        "file", help="plan JSON, solve/compare --report JSON, frontier JSON (STEM.json), or replay --report JSON"
    )
    pl.add_argument(
        "--kind",
        choices=["loads", "frontier", "gap", "replay", "replay-frontier"],
        default=None,
        help="what to draw (default: plan -> loads, frontier file -> frontier, report -> gap, "
        "replay report -> replay, replay --frontier report -> replay-frontier)",
    )
    output_arg(pl, "the figure to write (its extension names the format)", required=True, metavar="OUT.png")
    pl.add_argument("--instance", help="loads: the instance whose evaluation workload is counted")
    pl.add_argument(
        "--from",
        dest="from_plan",
        metavar="CURRENT_PLAN",
        help="loads: compare with this plan (moeopt or engine file) instead of linear",
    )
    pl.add_argument(
        "--from-format",
        choices=["plan", "sglang", "eplb", "vllm-ascend"],
        default=None,
        help="format of --from (default: from the file's content)",
    )
    pl.add_argument("--layer", type=_nonneg_int, default=None, help="loads: layer to draw (default: the worst)")
    verbosity(pl, quiet="no note on stderr")
    pl.set_defaults(func=cmd_plot)
    return p


#: terminal escape sequences (CSI, OSC) and other control characters kept out of error lines
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x1f\x7f-\x9f]")


def one_line(message: str) -> str:
    """An error message as one printable line: escape sequences dropped, line breaks joined."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\n\r\t" else "", message).strip()


#: options naming files a command writes (``--output`` of ``frontier`` names a folder)
OUTPUT_FILE_OPTIONS = ("output", "report", "markdown", "plot", "graphml")
#: commands whose ``-o/--output`` is a folder they write files into
OUTPUT_DIR_COMMANDS = ("frontier",)
#: arguments and options naming files a command reads, and what each is (for messages); an
#: instance's own named files (workloads, profile) are inputs too
INPUT_OPTIONS = {
    "instance": "the instance",
    "plan": "the plan",
    "plans": "a plan",
    "file": "the input file",
    "dump": "a dump",
    "trace": "the trace",
    "hint": "--hint",
    "from_plan": "--from",
    "load": "--load",
    "source": "--source",
    "after": "--after",
    "profile": "--profile",
    "stream": "--stream",
}


def _input_files(args: argparse.Namespace) -> dict[object, str]:
    """The files ``args`` names as inputs (and those each instance names), keyed as
    ``moeopt.outputs.file_keys`` keys them, with what each is."""
    from moeopt.io.instances import instance_inputs
    from moeopt.outputs import file_keys

    inputs: dict[object, str] = {}
    for name, what in INPUT_OPTIONS.items():
        value = getattr(args, name, None)
        for path in value if isinstance(value, list) else [value]:
            if not isinstance(path, str) or not path:
                continue
            named = instance_inputs(path) if name == "instance" else [(path, what)]
            for file, label in named:
                for key in file_keys(file):
                    inputs.setdefault(key, label)
    return inputs


def check_options(args: argparse.Namespace) -> None:
    """Refuse options that contradict each other or mean nothing here (one line each)."""
    if getattr(args, "quiet", False) and getattr(args, "verbose", False):
        raise MoeoptError("--quiet and --verbose: expected at most one of them (quiet: no progress or notes)")
    if args.command == "frontier":
        frontier_folder(args)
    name = getattr(args, "name", None)
    if args.command == "frontier" and name is not None:
        if not getattr(args, "output", None):
            raise MoeoptError(
                f"--name: names the files -o/--output writes; expected -o/--output too, got --name {name!r}"
            )
        if name in ("", ".", "..") or "/" in name or os.sep in name or (os.altsep and os.altsep in name):
            raise MoeoptError(f"--name: expected a file stem inside -o/--output (no folder), got {name!r}")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that cannot be written (directories, FIFOs, devices,
    unwritable folders) or that are one of the run's inputs (the instance, the files it names,
    plans, traces: compared as files, so ``./x``, a symlink or a hard link to an input is
    refused too), figures of an unknown format, and options that contradict each other
    (``check_options``), naming the option; two options naming one file are refused too."""
    from moeopt.outputs import figure_format, input_named, refuse_input

    check_options(args)
    inputs = _input_files(args)
    seen: dict[str, str] = {}
    folder = args.command in OUTPUT_DIR_COMMANDS
    for name in OUTPUT_FILE_OPTIONS:
        value = getattr(args, name, None)
        if value is None or (folder and name == "output"):
            continue
        option = "--" + name.replace("_", "-")
        target = str(check_target(value, option))
        what = input_named(value, inputs)
        if what is not None:
            raise refuse_input(value, what, option)
        if name == "plot" or (name == "output" and args.command == "plot"):
            figure_format(value, option)
        if target in seen:
            raise MoeoptError(f"{option}: {value} is also given as {seen[target]}; expected distinct files")
        seen[target] = option
    if folder and getattr(args, "output", None):
        check_directory(args.output, "--output")


def frontier_folder(args: argparse.Namespace) -> None:
    """``frontier --output-dir DIR``, the old spelling of ``-o/--output DIR``: taken as it, with
    one note (refused beside ``-o/--output``)."""
    old = getattr(args, "output_dir", None)
    if old is None:
        return
    if getattr(args, "output", None) is not None:
        raise MoeoptError("--output-dir: the old spelling of -o/--output; expected one of them, got both")
    from moeopt import console

    console.note("note: frontier --output-dir is deprecated: use -o/--output DIR")
    args.output, args.output_dir = old, None


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (building costs tens of ms, mostly gettext look-ups)."""
    return build_parser()
