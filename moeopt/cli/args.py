"""Argument types and the readers the commands share (plans checked against an instance, engine files)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moeopt.errors import MoeoptError
from moeopt.io import (
    PlanFile,
    load_instance,
    read_plan_file,
)
from moeopt.plan import Dispatch, rule_dispatch


def _number_type(parse: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type=``: ``parse`` the text, keep it when ``ok``, else one line saying what was expected."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return convert


_positive_int = _number_type(int, lambda v: v >= 1, "an integer >= 1")
#: ``--seed``, ``--layer``, ``--dense-layers``: an integer in ``[0, 2**31 - 1]``
_nonneg_int = _number_type(int, lambda v: 0 <= v < 2**31, f"an integer in [0, {2**31 - 1}]")
#: ``--time-limit``: a finite number of seconds > 0
_positive_seconds = _number_type(float, lambda v: math.isfinite(v) and v > 0, "a finite number of seconds > 0")
#: a probability: a number in ``[0, 1]``
_fraction = _number_type(float, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


#: the help of the options every command shares
QUIET_HELP = "nothing on stderr but errors (no progress, no notes)"
VERBOSE_HELP = "when stderr is not a terminal, a progress line per bar step (default: one a minute)"
JSON_HELP = "print the JSON report on stdout instead of the tables (the same JSON --report writes)"


def verbosity(sp: argparse.ArgumentParser, quiet: str = QUIET_HELP) -> None:
    """``--verbose`` and ``--quiet``, on every command (``quiet``: what --quiet leaves out)."""
    sp.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sp.add_argument("--quiet", action="store_true", help=quiet)


def output_arg(sp: argparse.ArgumentParser, help: str, *, required: bool = False, metavar: str = "FILE") -> None:
    """``-o/--output``: the command's main artifact (a plan, a figure, an npz, a YAML, a folder)."""
    sp.add_argument("-o", "--output", required=required, metavar=metavar, help=help)


def report_args(sp: argparse.ArgumentParser, what: str = "the result") -> None:
    """``--report FILE`` and ``--json``: the command's JSON report, to a file or on stdout."""
    sp.add_argument(
        "--report", metavar="FILE.json", help=f"write the JSON report ({what}, moeopt version and commit) here"
    )
    sp.add_argument("--json", action="store_true", help=JSON_HELP)


def limit_args(sp: argparse.ArgumentParser) -> None:
    """``--time-limit`` (the whole run) and ``--layer-time-limit`` (each layer)."""
    sp.add_argument(
        "--time-limit",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="seconds for the whole run: its layers (methods, points) each get their share of what is "
        "left as they start (default: the instance's method.time_limit, else none)",
    )
    sp.add_argument(
        "--layer-time-limit",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="seconds per layer (exact solvers stop there, searches use it as a cap; default: the "
        "instance's method.layer_time_limit, else none)",
    )


def method_list(text: str, option: str) -> list[str]:
    """``--methods a,b,c`` (or ``--method a``): registered method names, none empty or twice;
    ``MoeoptError`` naming ``option`` otherwise (never the instance's ``method.name``)."""
    from moeopt.registry import method_names

    names = [m.strip() for m in text.split(",")]
    if not text.strip() or any(not m for m in names):
        raise MoeoptError(f"{option}: expected comma-separated method names, none empty, got {text!r}")
    known = method_names()
    for name in names:
        if name not in known:
            raise MoeoptError(f"{option}: unknown method {name!r}; registered: {', '.join(known)}")
    twice = sorted({m for m in names if names.count(m) > 1})
    if twice:
        raise MoeoptError(f"{option}: expected each method once, got {', '.join(twice)} twice in {text!r}")
    return names


def _dispatch(args: argparse.Namespace, model: Any = None) -> Dispatch | None:
    """``--dispatch KIND`` as the model's rule (SGLang static with ``model.dense_layers``), or None."""
    return rule_dispatch(args.dispatch, model) if getattr(args, "dispatch", None) else None


def _read_plan_for(path: str, inst: Any) -> PlanFile:
    """A plan file checked against an instance (errors name the plan file)."""
    pf = read_plan_file(path)
    _check_against(pf.plan, inst, path)
    return pf


def _engine_format(path: str) -> str:
    """Guess a plan file's format from its content (``moeopt.io.engines.engine_file_format``:
    SGLang, EPLB, vLLM-Ascend); otherwise a moeopt plan (JSON) or EPLB tensors (``.pt`` / ``.npz``)."""
    from moeopt.io.engines import engine_file_format, load_engine_file

    try:
        data = load_engine_file(path)
    except MoeoptError:
        data = None  # the reader of the guessed format says what is wrong with it
    return engine_file_format(data) or ("eplb" if Path(path).suffix.lower() in (".pt", ".npz") else "plan")


def _current_plan(path: str, fmt: str | None, inst: Any) -> Any:
    """The plan running now (``solve --from``): a moeopt plan or any engine's placement file."""
    from moeopt.io import read_engine_plan

    fmt = fmt or _engine_format(path)
    if fmt == "plan":
        return _read_plan_for(path, inst).plan
    c = inst.cluster
    plan = read_engine_plan(path, fmt, gpus=c.gpus, experts=inst.model.experts, model_layers=inst.model.layers)
    _check_against(plan, inst, path)
    return plan


def _harness_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    sp.add_argument("--d-model", type=_positive_int, default=None, help="expert FFN width (CPU default 64)")
    sp.add_argument("--d-ff", type=_positive_int, default=None, help="expert FFN hidden size (CPU default 128)")
    sp.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="CPU default fp32")
    sp.add_argument("--tile", type=_positive_int, default=None, help="tokens per tile of the profile (default 64)")
    sp.add_argument("--speeds", default=None, help="emulated GPU speeds, comma-separated")
    sp.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads (CPU default 1)")
    sp.add_argument(
        "--statistic",
        default="median",
        choices=["median", "min"],
        help="of the timed runs (min is steadier on a shared CPU)",
    )
    verbosity(sp, quiet="nothing on stderr but errors (no progress bar)")


def _engine_instance(args: argparse.Namespace) -> Any:
    """The --instance of export/import (or None); --gpus must agree with it."""
    if not getattr(args, "instance", None):
        return None
    inst = load_instance(args.instance)
    if getattr(args, "gpus", None) not in (None, inst.cluster.gpus):
        raise MoeoptError(f"--gpus {args.gpus} disagrees with {args.instance}: cluster.gpus is {inst.cluster.gpus}")
    return inst


def _check_against(plan: Any, inst: Any, src: str) -> None:
    """Check a plan against an instance; errors name its source ``src``."""
    try:
        plan.check(inst.cluster, layers=inst.model.layers, experts=inst.model.experts)
    except MoeoptError as exc:
        raise MoeoptError(f"{src}: {exc}") from None
