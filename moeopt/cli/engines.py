"""Serving-engine commands: export a plan, import an engine placement or a recorded trace."""

from __future__ import annotations

import argparse
from pathlib import Path

from moeopt import console
from moeopt.cli.args import _check_against, _engine_instance
from moeopt.errors import MoeoptError
from moeopt.io import (
    read_plan,
    read_workload_file,
    write_plan,
    write_trace,
)
from moeopt.plan import Dispatch
from moeopt.trace import Stats, Trace


def cmd_export(args: argparse.Namespace) -> int:
    import numpy as np

    from moeopt.interop import engine_settings
    from moeopt.io import write_engine_plan

    plan = read_plan(args.plan)
    inst = _engine_instance(args)
    if inst is not None:
        _check_against(plan, inst, args.plan)
        plan = plan.padded(inst.cluster.width)
    if args.dense_layers is not None and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    dense = args.dense_layers
    if dense is None and args.format == "sglang" and inst is not None:
        dense = inst.model.dense_layers
        if dense is None:
            raise MoeoptError(
                f"{args.instance}: model.dense_layers: SGLang's map needs a row for every hidden layer and the "
                f"instance does not say how many are dense: set model.dense_layers (DeepSeek-V3 / R1: 3, "
                f"models without dense layers: 0) or give --dense-layers"
            )
    if args.dispatch:
        rule = Dispatch(kind=args.dispatch, dense_layers=dense or 0) if args.dispatch == "static" else None
        new = rule or Dispatch(kind=args.dispatch)
        if new.kind != plan.dispatch.kind:
            console.note(
                f"note: {args.plan} was planned and scored under dispatch {plan.dispatch.kind!r}; the file runs "
                f"under {new.kind!r}: evaluate it with --dispatch {new.kind} to see what the engine will do"
            )
        plan = plan.with_dispatch(new)
    load = None
    if args.load:
        w = read_workload_file(args.load, top_k=inst.model.top_k if inst is not None else 1)
        load = (w.stats() if isinstance(w, Trace) else w).expert_load
        if load.shape[0] == plan.layers and load.shape[1] < plan.experts:  # highest ids never routed
            load = np.pad(load, ((0, 0), (0, plan.experts - load.shape[1])))
        if load.shape != (plan.layers, plan.experts):
            raise MoeoptError(
                f"{args.load}: counts: expected {plan.layers} layers x {plan.experts} experts, got {list(load.shape)}"
            )
    notes = write_engine_plan(args.output, plan, args.format, load=load, dense_layers=dense)
    if not args.quiet:
        W = plan.width
        if args.format == "vllm-ascend":  # each device's distinct experts only
            W = int((plan.copies_on_gpu > 0).sum(axis=1).max())
        print(
            f"wrote {args.output}: {args.format}, {plan.layers + (dense or 0)} layers x {plan.gpus * W} "
            f"physical slots ({plan.gpus} GPUs x {W}), {plan.experts} experts, dispatch {plan.dispatch.kind}"
        )
        for line in engine_settings(args.format, plan, str(args.output), dense_layers=dense or 0):
            print(line)
    for line in notes:
        console.note(line)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from moeopt.io import read_engine_plan

    inst = _engine_instance(args)
    gpus = args.gpus if inst is None else inst.cluster.gpus
    if args.dense_layers is not None and args.format != "sglang":
        raise MoeoptError("--dense-layers applies to --format sglang only (EPLB and vLLM count MoE layers)")
    dense = args.dense_layers
    if dense is None and inst is not None and args.format == "sglang":
        dense = inst.model.dense_layers
    plan = read_engine_plan(
        args.file,
        args.format,
        gpus=gpus,
        experts=None if inst is None else inst.model.experts,
        dense_layers=dense or 0,
        dispatch=args.dispatch,
        model_layers=inst.model.layers if inst is not None and dense is None else None,
    )
    if inst is not None:
        _check_against(plan, inst, args.file)
        plan = plan.padded(inst.cluster.width)
    write_plan(args.output, plan, f"import:{args.format}", {"source": str(args.file)})
    if not args.quiet:
        P = plan.gpus * plan.width
        print(
            f"wrote {args.output}: {plan.layers} layers x {P} physical slots ({plan.gpus} GPUs x {plan.width}), "
            f"{plan.experts} experts, dispatch {plan.dispatch.kind}"
        )
    for line in plan.notes():
        console.note(line)
    return 0


def cmd_trace_import(args: argparse.Namespace) -> int:
    import numpy as np

    from moeopt.io import combine_snapshots, read_workload_file, write_counts
    from moeopt.io.engines import read_engine_dumps

    if Path(args.output).suffix.lower() != ".npz":
        raise MoeoptError(f"{args.output}: expected an .npz output (a trace or a counts file)")
    notes: list[str] = []
    w: Trace | Stats
    if all(Path(path).suffix.lower() == ".pt" for path in args.dump):
        # per-rank per_token / per_pass files of one recording merge; other sets join as snapshots
        w, notes = read_engine_dumps(args.dump, top_k=args.top_k, trusted=args.trust_pickle)
    else:

        def read(path: str) -> Trace | Stats:
            if Path(path).suffix.lower() == ".pt":
                one, said = read_engine_dumps([path], top_k=args.top_k, trusted=args.trust_pickle)
                notes.extend(said)
                return one
            return read_workload_file(path, top_k=args.top_k)  # an SGLang JSON dump, counts, a trace

        items = [(path, read(path)) for path in args.dump]
        # several snapshots: one count workload, each file's steps in turn (robust mode's input)
        w = items[0][1] if len(items) == 1 else combine_snapshots(items)
    if isinstance(w, Trace):
        write_trace(args.output, w)
        homes = "" if w.home is None else f", homes on {len(np.unique(w.home))} GPUs"
        what = (
            f"trace, {w.tokens} tokens, {w.layers} MoE layers, E={w.num_experts}, top-{w.top_k}, {w.steps} steps{homes}"
        )
    else:
        write_counts(args.output, w)
        steps = 0 if w.step_counts is None else w.step_counts.shape[1]
        what = f"counts, {w.layers} MoE layers, E={w.experts}, top-{w.top_k}, {steps} steps"
    if not args.quiet:
        print(f"wrote {args.output}: {what}")
    for line in notes:
        console.note(line)
    return 0
