"""moeopt: expert-to-GPU placement plans for MoE inference, with exact solvers and certificates.

The public API is what this package exports (``moeopt.__all__``), with two public modules
beside it: `moeopt.replay` (re-planning a serving stream over time) and `moeopt.plot`
(figures; needs matplotlib). Every other module is internal: its names may change without
notice. In three lines, counts in and an SGLang placement file out::

    inst = moeopt.Instance.from_counts(counts, gpus=8, top_k=4, dense_layers=0)
    result = moeopt.solve(inst, method="balance")
    result.plan.to_engine("sglang", "expert-location.json", instance=inst)
"""

import sys as _sys

try:
    from moeopt.api import evaluate, method_available, read_workload
    from moeopt.errors import InfeasibleError, InputError, MoeoptError, PlanError
    from moeopt.frontier import FrontierPoint, mark_pareto
    from moeopt.frontier import frontier as sweep_frontier
    from moeopt.instance import Cluster, Instance, InstanceOptions, Model
    from moeopt.io import load_instance, read_plan, read_trace, write_plan, write_trace
    from moeopt.plan import Dispatch, Plan
    from moeopt.profile import Profile, synthetic_profile
    from moeopt.registry import method_names
    from moeopt.result import Result, Status, Termination
    from moeopt.solve import solve
    from moeopt.synth import SynthSpec, synthesize
    from moeopt.trace import Stats, Trace
except KeyboardInterrupt:
    # Ctrl-C while `python -m moeopt` imports the package (sys.argv[0] is "-m" until its
    # __main__ runs): the command line's answer (moeopt.cli.main), not a traceback
    if _sys.argv[:1] == ["-m"]:
        print("interrupted", file=_sys.stderr, flush=True)
        raise SystemExit(130) from None
    raise

__all__ = [
    "Cluster",
    "Dispatch",
    "FrontierPoint",
    "InfeasibleError",
    "InputError",
    "Instance",
    "InstanceOptions",
    "Model",
    "MoeoptError",
    "Plan",
    "PlanError",
    "Profile",
    "Result",
    "Stats",
    "Status",
    "SynthSpec",
    "Termination",
    "Trace",
    "evaluate",
    "load_instance",
    "mark_pareto",
    "method_available",
    "method_names",
    "read_plan",
    "read_trace",
    "read_workload",
    "solve",
    "sweep_frontier",
    "synthesize",
    "synthetic_profile",
    "write_plan",
    "write_trace",
]
__version__ = "0.1.0"
