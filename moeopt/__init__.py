"""moeopt: expert-to-GPU placement plans for MoE inference, with exact solvers and certificates."""

from moeopt.errors import InfeasibleError, InputError, MoeoptError, PlanError
from moeopt.evaluate import evaluate
from moeopt.instance import Cluster, Instance, Model
from moeopt.io import load_instance, read_plan, read_trace, write_plan
from moeopt.plan import Plan
from moeopt.profile import Profile, synthetic_profile
from moeopt.result import Result, Status
from moeopt.solve import solve
from moeopt.trace import Stats, Trace

__all__ = [
    "Cluster",
    "InfeasibleError",
    "InputError",
    "Instance",
    "Model",
    "MoeoptError",
    "Plan",
    "PlanError",
    "Profile",
    "Result",
    "Stats",
    "Status",
    "Trace",
    "evaluate",
    "load_instance",
    "read_plan",
    "read_trace",
    "solve",
    "synthetic_profile",
    "write_plan",
]
__version__ = "0.1.0"
