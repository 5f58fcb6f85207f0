"""The only package that reads and writes files: instances (YAML), traces and counts (npz, JSON,
CSV, NPY, SGLang dumps), plans and reports (JSON), latency profiles (YAML).

Every reader validates what it reads and raises `InputError` naming the file, the
field and what was expected; every writer writes atomically (temporary file + rename), so a
failure never leaves a partial file behind.

Modules: `instances` (instance YAML), `workloads` (traces and
counts), `engines` (serving-engine files), `plans`,
`profiles`, `files` (atomic writers, YAML / JSON readers).
"""

from __future__ import annotations

from moeopt.io.engines import (
    combine_snapshots,
    read_engine_dump,
    read_engine_plan,
    read_sglang_dump,
    write_counts,
    write_engine_plan,
)
from moeopt.io.files import (
    PLAN_FORMAT,
    PLAN_FORMAT_V1,
    PROFILE_FORMAT,
    TRACE_FORMATS,
    input_file,
    write_graphml,
    write_json,
    write_text,
)
from moeopt.io.instances import load_instance, load_workload, resolve_profile
from moeopt.io.plans import PlanFile, plan_to_json, read_plan, read_plan_file, write_plan
from moeopt.io.profiles import read_profile, write_profile
from moeopt.io.workloads import fit_workload, read_trace, read_workload_file, write_trace

__all__ = [
    "combine_snapshots",
    "PLAN_FORMAT",
    "PLAN_FORMAT_V1",
    "PROFILE_FORMAT",
    "PlanFile",
    "TRACE_FORMATS",
    "fit_workload",
    "input_file",
    "load_instance",
    "load_workload",
    "plan_to_json",
    "read_engine_plan",
    "read_plan",
    "read_plan_file",
    "read_profile",
    "read_engine_dump",
    "read_sglang_dump",
    "read_trace",
    "read_workload_file",
    "resolve_profile",
    "write_counts",
    "write_engine_plan",
    "write_graphml",
    "write_json",
    "write_plan",
    "write_profile",
    "write_text",
    "write_trace",
]
