"""``moeopt replay``: serve a load stream under re-planning policies; table, report, frontier."""

from __future__ import annotations

import argparse
from typing import Any

import yaml
from tabulate import tabulate

from moeopt import console
from moeopt.cli.args import _nonneg_int, _number_type, _positive_int, report_args, verbosity
from moeopt.cli.reports import emit
from moeopt.errors import MoeoptError
from moeopt.io import load_instance
from moeopt.io.files import YamlAliasError, load_yaml_text

#: command-line options that set a policy parameter: (option attribute, policy field)
POLICY_OPTIONS = (
    ("planner", "planner"),
    ("interval", "interval"),
    ("window", "window"),
    ("calibration", "calibration"),
    ("budget", "budget"),
    ("budget_bytes", "budget_bytes"),
    ("level", "level"),
    ("lag", "lag"),
    ("history", "history"),
    ("relabel", "relabel"),
    ("planner_params", "planner_params"),
)

_level = _number_type(float, lambda v: v >= 0 and v != float("inf"), "a finite number >= 0")


def _history(text: str) -> int | str:
    if text == "all":
        return "all"
    return int(_positive_int(text))


def _int_list(option: str, text: str, low: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MoeoptError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < low for v in values):
        raise MoeoptError(f"{option}: expected comma-separated integers >= {low}, got {text!r}")
    return values


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``replay`` on the sub-command parsers ``sub``."""
    r = sub.add_parser(
        "replay",
        help="serve a load stream under re-planning policies: MaxVio over time, moved slots and bytes",
        description="Replay the instance's calibration workload (or --stream) step by step: the first plan is "
        "made on the first --calibration steps, every later step is scored under the plan in service, and the "
        "policy re-plans as it decides. Prints one row per policy; --report writes the per-step series.",
    )
    r.add_argument("instance", help="the instance YAML (its calibration workload is the stream, unless --stream)")
    r.add_argument(
        "--policy",
        default=None,
        help="policy, or several comma-separated to compare them on one stream: static, periodic, threshold, "
        "incremental, auto (the default), oracle",
    )
    r.add_argument(
        "--planner", default=None, help="periodic / threshold / static / oracle: the planner (default balance)"
    )
    r.add_argument(
        "--planner-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the planner (YAML value), e.g. --planner-param robust=none; repeatable",
    )
    r.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any policy parameter (YAML value), e.g. --param from_current=false or --param budget_share=0.1; "
        "repeatable",
    )
    r.add_argument("--interval", type=_positive_int, default=None, help="steps between re-plan decisions")
    r.add_argument("--window", type=_positive_int, default=None, help="steps planned on (default: the interval)")
    r.add_argument(
        "--calibration", type=_positive_int, default=None, help="steps of the first plan (default: the window)"
    )
    r.add_argument(
        "--budget",
        type=_nonneg_int,
        default=None,
        help="moved slots per layer (incremental: per re-plan; auto: per interval)",
    )
    r.add_argument(
        "--budget-bytes",
        type=_positive_int,
        default=None,
        help="moved bytes per layer (incremental: per re-plan; auto: per interval)",
    )
    r.add_argument("--level", type=_level, default=None, help="threshold / auto: re-plan only above this MaxVio")
    r.add_argument("--lag", type=_nonneg_int, default=None, help="steps before a new plan serves (default 0)")
    r.add_argument("--history", type=_history, default=None, help="auto: windows planned on, or 'all' (default 2)")
    r.add_argument(
        "--relabel",
        action="store_const",
        const=True,
        default=None,
        help="periodic / threshold: renumber GPUs onto the plan in service",
    )
    r.add_argument("--stream", default=None, help="replay this trace or count file instead of the calibration workload")
    r.add_argument(
        "--window-steps", type=_positive_int, default=None, help="steps per natural window of the stream (worst window)"
    )
    report_args(r, "every run's per-step series, or the frontier's points")
    r.add_argument("--plot", metavar="FILE.png", help="also draw MaxVio over time and bytes moved (or the frontier)")
    r.add_argument("--timings", action="store_true", help="put planning times in the report (not reproducible)")
    r.add_argument(
        "--frontier", action="store_true", help="sweep --intervals and --budgets: bytes moved vs time-averaged MaxVio"
    )
    r.add_argument("--intervals", default="1,2,4", help="--frontier: intervals (comma-separated)")
    r.add_argument("--budgets", default="4,8,16", help="--frontier: budgets per layer (comma-separated)")
    r.add_argument("--seed", type=_nonneg_int, default=None, help="seed of every plan (default: the policy's, 0)")
    r.add_argument("--workers", type=_positive_int, default=None, metavar="N", help="plan layers in N local processes")
    r.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS", help="plan layers as Ray tasks")
    verbosity(r)
    r.set_defaults(func=cmd_replay)
    return r


def _key_values(option: str, items: list[str]) -> dict[str, Any] | None:
    """``KEY=VALUE`` items (YAML values) as a mapping; None when there are none."""
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise MoeoptError(f"{option}: expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = load_yaml_text(text)  # aliases bounded, as in every YAML moeopt reads
        except YamlAliasError as exc:
            raise MoeoptError(f"{option}: {key}: {exc}") from None
        except yaml.YAMLError:
            raise MoeoptError(f"{option}: {key}: not a YAML value: {text!r}") from None
    return out


def policy_params(args: argparse.Namespace, names: list[str], skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Each policy's parameters from the options; an option none of ``names`` takes is an error."""
    from moeopt.replay.policies import make_policy, policy_fields

    given: dict[str, Any] = dict(_key_values("--param", args.param) or {})
    origin = {key: f"--param {key}" for key in given}
    for attr, key in POLICY_OPTIONS:
        value = _key_values("--planner-param", args.planner_param) if attr == "planner_params" else getattr(args, attr)
        if value is not None and attr not in skip:
            if key in given:
                raise MoeoptError(f"--param {key}: also given as --{key.replace('_', '-')}")
            given[key] = None if value == "all" else value
            origin[key] = "--" + attr.replace("_", "-")
    for key in skip:
        if key in given:
            raise MoeoptError(f"--param {key}: the frontier sweeps it (--{key}s)")
    for name in names:
        make_policy(name)  # unknown names first
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in given.items():
        takers = [n for n in names if key in policy_fields(n)]
        if not takers:
            option = origin[key]
            which = ", ".join(names)
            raise MoeoptError(f"{option}: policy {which} takes no {key.replace('_', ' ')}")
        for n in takers:
            out[n][key] = value
    return out


def replans_cell(replans: int, transfers: int) -> str:
    """The re-plans, and how many of them moved weights when some moved none."""
    return str(replans) if transfers == replans else f"{replans} ({transfers} moving)"


def _row(result: Any) -> list[Any]:
    m = result.metrics
    label = run_label(result.policy.to_json())
    row = [
        label,
        f"{m['maxvio_mean']:.4f}",
        f"{m['maxvio_worst']:.4f}",
        f"{m['maxvio_max']:.4f}",
        replans_cell(m["replans"], m["transfers"]),
        f"{m['moved_slots_per_layer_per_replan']:.1f} / {m['slots_per_layer']}",
        f"{m['moved_bytes'] / 1e9:.3f}",
    ]
    if "comm_per_token_mean" in m:
        row.append("-" if m["comm_per_token_mean"] is None else f"{m['comm_per_token_mean']:.4f}")
    return row


def run_label(policy: dict) -> str:
    """A run's name in tables and figures: the policy, and its planner when not balance."""
    from moeopt.plot import replay_label

    return replay_label(policy)


def replay_table(results: list[Any]) -> str:
    """One row per policy: MaxVio (time average, worst window, worst step), re-plans, moves, GB."""
    rows = [_row(r) for r in results]
    first = results[0].metrics
    headers = [
        "policy",
        "MaxVio (time avg)",
        f"worst window ({first['worst_window_steps']} steps)",
        "worst step",
        "re-plans",
        "moved slots / layer / re-plan",
        "moved GB",
    ]
    if "comm_per_token_mean" in first:
        headers.append("remote GPUs / token")
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def cmd_replay(args: argparse.Namespace) -> int:
    from moeopt.replay import frontier_report, frontier_table, load_stream, replay, replay_frontier, runs_report

    inst = load_instance(args.instance)
    default = "periodic,incremental,auto" if args.frontier else "auto"
    names = [n.strip() for n in (args.policy or default).split(",") if n.strip()]
    if not names:
        raise MoeoptError(f"--policy: expected comma-separated policy names, got {args.policy!r}")
    if args.frontier:
        intervals = _int_list("--intervals", args.intervals, 1)
        budgets = _int_list("--budgets", args.budgets, 0)
        params = policy_params(args, names, skip=("interval", "budget"))
    else:
        params = policy_params(args, names)
    stream = load_stream(inst, args.stream, window_steps=args.window_steps)
    quiet = not console.progress()
    if args.frontier:
        points = replay_frontier(
            inst,
            stream,
            names,
            intervals=intervals,
            budgets=budgets,
            params=params,
            seed=args.seed,
            workers=args.workers,
            ray=args.ray,
            quiet=quiet,
        )
        report = emit(args, frontier_report(points, inst, stream), frontier_table(points))
        if args.plot:
            from moeopt import plot

            plot.draw_replay_frontier(report, args.plot)
            console.note(f"wrote {args.plot}")
        return 0
    # every policy resolved (and checked) before the first one runs
    from moeopt.replay.policies import make_policy

    policies = [make_policy(n, **params[n]) for n in names]
    results = [
        replay(
            inst,
            stream,
            p,
            seed=args.seed,
            workers=args.workers,
            ray=args.ray,
            quiet=quiet,
            timings=args.timings,
        )
        for p in policies
    ]
    report = emit(args, runs_report(results, timings=args.timings), replay_table(results))
    if args.plot:
        from moeopt import plot

        plot.draw_replay(report, args.plot)
        console.note(f"wrote {args.plot}")
    return 0
