"""Fuzz every command in-process: mutated instances, traces, count files, plans, profiles,
engine files, output targets and options give exit 2, one line naming the file or option, no
output file and every input's bytes unchanged; or, when the mutation happens to be valid,
exit 0 with the outputs written. A mutation known to be invalid must give exit 2 (no silent
acceptance); so must an output that is one of the run's inputs (as given, ``./x`` or a
symlink), an input that is a directory, FIFO or device, and a figure of an unknown format.

Examples per command: :data:`EXAMPLES` by hypothesis profile (CI's ``ci``: a few seconds per
command, the same examples every run; ``HYPOTHESIS_PROFILE=explore``: 500 fresh ones per
command); ``MOEOPT_FUZZ_EXAMPLES=N`` sets any other number."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import tempfile
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from moeopt.cli import main

#: examples per command for each hypothesis profile (tests/conftest.py): CI's default profile
#: keeps the fuzz to a few seconds per command; explore (and dev) run at least 500 per command
EXAMPLES = {"ci": 30, "explore": 500, "dev": 600}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ = settings(
    max_examples=int(os.environ.get("MOEOPT_FUZZ_EXAMPLES", EXAMPLES.get(PROFILE, EXAMPLES["ci"]))),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)

BASE_INSTANCE: dict[str, Any] = {
    "name": "tiny",
    "model": {"layers": 1, "experts": 4, "top_k": 2},
    "cluster": {"gpus": 2},
    "workload": {"synthetic": {"tokens": 24, "steps": 2}},
    "method": {"name": "linear"},
}

# ----------------------------------------------------------------------------- values
#: values wrong for any count (positive integer) field
BAD_COUNT = st.one_of(
    st.integers(max_value=0),
    st.sampled_from([2.0, 2.5, "2", "two", True, [2], {"n": 2}, math.nan]),
)
#: values wrong for any non-negative integer field
BAD_NONNEG_INT = st.one_of(st.integers(max_value=-1), st.sampled_from([1.0, 0.5, "1", False, [1], math.inf]))
#: values wrong for any finite non-negative number
BAD_NONNEG_FLOAT = st.one_of(
    st.floats(max_value=-1e-9, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, "1.0", True, None, [1.0]]),
)
BAD_FRACTION = st.one_of(st.floats(min_value=1.0001, allow_nan=False), st.floats(max_value=-1e-9), BAD_NONNEG_FLOAT)
BAD_TEXT_CHOICE = st.one_of(st.text(min_size=1, max_size=6).filter(lambda s: s.isalpha()), st.integers(), st.none())
HUGE = st.integers(min_value=10**10, max_value=10**15)
#: anything at all: such a mutation may or may not be valid
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=12),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-2, max_value=6), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(min_value=-2, max_value=6), max_size=2),
)

#: instance field -> values that make it invalid
INSTANCE_INVALID: dict[str, st.SearchStrategy] = {
    "model.layers": st.one_of(BAD_COUNT, HUGE),
    "model.experts": st.one_of(BAD_COUNT, HUGE, st.sampled_from([1])),  # 1 < top_k
    "model.top_k": st.one_of(BAD_COUNT, st.integers(min_value=5, max_value=99)),  # > experts
    "model.d_model": BAD_COUNT,
    "cluster.gpus": st.one_of(BAD_COUNT, HUGE),
    "cluster.gpus_per_node": st.one_of(BAD_COUNT, st.just(3)),  # 3 does not divide 2
    "cluster.slots_per_gpu": st.one_of(BAD_COUNT, st.just(1), HUGE),  # 2 x 1 < 4 experts
    "cluster.replica_slots_per_gpu": st.one_of(BAD_NONNEG_INT, HUGE),
    "cluster.inter_node_weight": BAD_NONNEG_FLOAT,
    "cluster.allow_colocated_copies": st.sampled_from(["yes", 1, 0, None, 1.0]),
    "cluster.token_home": st.one_of(BAD_TEXT_CHOICE, st.just("trace")),  # trace: a synthetic one has no homes
    "workload.synthetic.tokens": st.one_of(BAD_COUNT, HUGE),
    "workload.synthetic.steps": st.one_of(BAD_COUNT, HUGE),
    "workload.synthetic.layers": st.sampled_from([2, 0, "1", 1.0]),  # disagrees with the model
    "workload.synthetic.families": st.sampled_from([[], ["a", "a"], [""], [1, 2], "code", None, [None]]),
    "workload.synthetic.family_share": st.sampled_from(
        [[1, -1, 0, 0], [0, 0, 0, 0], [1, 1], [math.nan, 1, 1, 1], [1, 1, 1, math.inf], "1,1,1,1", [1, "1", 1, 1]]
    ),
    "workload.synthetic.only_family": st.sampled_from(["nope", 3, ""]),
    "workload.synthetic.communities": st.one_of(BAD_COUNT, st.integers(min_value=5, max_value=50)),
    "workload.synthetic.generic": st.one_of(BAD_NONNEG_INT, st.integers(min_value=5, max_value=50)),
    "workload.synthetic.generic_boost": st.one_of(BAD_NONNEG_FLOAT, st.just(0)),
    "workload.synthetic.community_boost": st.one_of(BAD_NONNEG_FLOAT, st.just(0.0)),
    "workload.synthetic.family_focus": st.one_of(BAD_NONNEG_FLOAT, st.just(0)),
    "workload.synthetic.family_communities": BAD_TEXT_CHOICE,
    "workload.synthetic.skew": BAD_NONNEG_FLOAT,
    "workload.synthetic.burst": st.one_of(BAD_NONNEG_FLOAT, st.just(0)),
    "workload.synthetic.burst_fraction": BAD_FRACTION,
    "workload.synthetic.layer_dependency": BAD_FRACTION,
    "workload.synthetic.seed": BAD_NONNEG_INT,
    "workload.synthetic.structure_seed": BAD_NONNEG_INT,
    "workload.calibration": st.sampled_from(["missing.npz", 5, {"path": 3}, {"format": "trace"}, ""]),
    "workload.evaluation": st.sampled_from(
        [
            {"synthetic": {"tokens": 0}},
            {"synthetic": {"experts": 8}},
            {"synthetic": {"skew": math.nan}},
            {"path": "x.npz", "format": "csv"},
        ]
    ),
    "method.name": st.one_of(st.sampled_from(["magic", "", 3, None, ["linear"]])),
    "method.colour": JUNK,  # linear takes no parameters
    "profile": st.sampled_from(
        [
            5,
            [1],
            "missing.yaml",
            {"variability": "extreme"},
            {"variability": 1.5},
            {"variability": math.nan},
            {"tile": 0},
            {"seed": -1},
            {"alpha": -1},
            {"max_tiles": 0},
            {"speed": 1},
        ]
    ),
    "executor": st.sampled_from(
        [{"workers": 0}, {"workers": "2"}, {"workers": 1.5}, {"ray": 5}, {"ray": ""}, {"pool": 2}, 3]
    ),
    "name": st.sampled_from([3, ["a"], {"a": 1}]),
}
#: (method, parameter) -> values that make it invalid
PARAM_INVALID: dict[tuple[str, str], st.SearchStrategy] = {
    ("greedy", "replicas"): BAD_NONNEG_INT,
    ("greedy", "replicate"): st.sampled_from(["yes", 1, None]),
    ("greedy", "dispatch"): BAD_TEXT_CHOICE,
    ("gem", "starts"): st.one_of(BAD_NONNEG_INT, st.just(0)),
    ("gem", "steps"): BAD_NONNEG_INT,
    ("gem", "noise"): BAD_NONNEG_FLOAT,
    ("gesr", "lam"): BAD_NONNEG_FLOAT,
    ("hypergraph", "runs"): st.one_of(BAD_NONNEG_INT, st.just(0)),
    ("hypergraph", "preset"): st.sampled_from([5, None, 1.0]),
    ("metis", "ufactor"): BAD_NONNEG_INT,
    ("tacg", "eps_load"): st.sampled_from([-0.1, math.nan, -math.inf, "0.1"]),
    ("joint", "eps"): BAD_NONNEG_FLOAT,
    ("balance", "iterations"): BAD_NONNEG_INT,
}
REQUIRED = ["model", "cluster", "workload", "model.layers", "model.experts", "model.top_k", "cluster.gpus"]
MAPPINGS = ["", "model", "cluster", "workload", "workload.synthetic"]


def _dump(data: Any, **kw: Any) -> str:
    """YAML text of ``data`` (libyaml's emitter: the pure-Python one dominates generation time)."""
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), **kw)


def _set(data: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        if not isinstance(data.get(p), dict):
            data[p] = {}
        data = data[p]
    data[last] = value


def _delete(data: dict, path: str) -> None:
    *parents, last = path.split(".")
    for p in parents:
        data = data[p]
    data.pop(last, None)


def _leaves(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return [prefix]
    out = [prefix] if prefix else []
    for k, v in data.items():
        out += _leaves(v, f"{prefix}.{k}" if prefix else k)
    return out


# ----------------------------------------------------------------------------- running
def run(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in-process: exit code and stderr (argparse errors exit via SystemExit).
    Warnings the command lets out are added to stderr as the interpreter would print them
    (Python's default filters: deprecations hidden), so a numpy warning counts as a line."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    return code, err.getvalue() + shown


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _bytes_of(folder: Path | None) -> dict[str, bytes]:
    """Every regular file's bytes under ``folder`` (the example's inputs)."""
    if folder is None:
        return {}
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


def check(
    argv: list[str],
    *,
    invalid: bool,
    blame: tuple[str, ...],
    outputs: tuple[Path | None, ...] = (),
    inputs: Path | None = None,
) -> int:
    """Run ``argv``: exit 2 with one line starting with ``error: <one of blame>`` and no output
    written, or (only when not known invalid) exit 0 with every output written (``None``: an
    output target that must be refused, nothing to look for). Every file that was under
    ``inputs`` before keeps its bytes (outputs never overwrite an input)."""
    outputs = tuple(p for p in outputs if p is not None)
    folders = {p.parent for p in outputs if p.parent.is_dir()}
    before = _bytes_of(inputs)
    code, err = run(argv)
    assert "Traceback" not in err and "Warning: " not in err, (argv, err)
    assert {k: v for k, v in _bytes_of(inputs).items() if k in before} == before, argv
    if invalid or code != 0:
        assert code == 2, (argv, code, err)
        lines = err.splitlines()
        assert len(lines) == 1, (argv, err)
        assert any(lines[0].startswith(f"error: {b}") for b in blame), (argv, lines[0], blame)
        assert "\x1b" not in lines[0]
        for p in outputs:
            assert not p.exists(), (argv, p)
    else:
        for p in outputs:
            assert p.is_file(), (argv, p)
    for folder in folders:
        assert _leftovers(folder) == [], (argv, _leftovers(folder))
    return code


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder for every example's fresh sub-folder."""
    return tmp_path_factory.mktemp("fuzz")


def fresh(root: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=root))


# ----------------------------------------------------------------------------- instances
@st.composite
def instance_text(draw) -> tuple[bytes, bool, bool]:
    """A mutated instance YAML (bytes), whether the mutation is known to be invalid, and whether
    it touches only the instance's method (which ``--method``/``--methods`` override)."""
    data = copy.deepcopy(BASE_INSTANCE)
    kind = draw(
        st.sampled_from(["invalid"] * 10 + ["param", "param", "delete", "extra", "junk", "text", "alias", "none"])
    )
    invalid = kind in ("invalid", "param", "delete", "extra")
    method_only = kind == "param"
    if kind == "invalid":
        path = draw(st.sampled_from(sorted(INSTANCE_INVALID)))
        method_only = path.startswith("method.")
        _set(data, path, draw(INSTANCE_INVALID[path]))
    elif kind == "param":
        (method, name) = draw(st.sampled_from(sorted(PARAM_INVALID)))
        data["method"] = {"name": method, name: draw(PARAM_INVALID[(method, name)])}
    elif kind == "delete":
        _delete(data, draw(st.sampled_from(REQUIRED)))
    elif kind == "extra":
        where = draw(st.sampled_from(MAPPINGS))
        _set(data, f"{where}.surprise" if where else "surprise", draw(JUNK))
    elif kind == "junk":
        _set(data, draw(st.sampled_from(_leaves(data) + sorted(INSTANCE_INVALID))), draw(JUNK))
    text = _dump(data).encode()
    if kind == "alias":  # anchors and aliases: a few are fine, nested ones past the budget are refused
        levels = draw(st.integers(1, 8))
        where = draw(st.sampled_from(["description", "method.junk", "name"]))
        lines = ["x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
            f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)
        ]
        body = "\n".join("  " + line for line in lines)
        head = _dump({k: v for k, v in data.items() if k != where.split(".")[0]}).encode()
        if where == "method.junk":
            text = head + b"method:\n  name: linear\n" + body.encode() + b"\n"
        else:
            text = head + f"{where}:\n".encode() + body.encode() + b"\n"
        invalid = True  # a mapping as description or name, or an unknown parameter of linear
        return text, invalid, where.startswith("method")
    if kind == "text":
        how = draw(st.sampled_from(["latin-1", "utf-16", "truncate", "insert", "deep", "bytes"]))
        if how == "latin-1":
            text = _dump({**data, "name": "tiny\u00e9"}, allow_unicode=True).encode("latin-1")
            invalid = True
        elif how == "utf-16":
            text = text.decode().encode("utf-16")
            invalid = True
        elif how == "deep":
            text = b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n"
            invalid = True
        elif how == "bytes":
            text = draw(st.binary(max_size=64))
        elif how == "truncate":
            text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
        else:
            at = draw(st.integers(min_value=0, max_value=len(text)))
            text = text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at:]
    return text, invalid, method_only


@st.composite
def output_target(
    draw, folder: Path, name: str, inputs: tuple[Path, ...] = (), figure: bool = False
) -> tuple[Path, bool, Path | None]:
    """An output path: plain, in a new folder, a symlink to a new file (all valid), or a
    directory, a FIFO, a device, a path under a file, one of the run's ``inputs`` (as given,
    through ``./``, or through a symlink) and, for a ``figure``, a name whose extension no
    figure format has (invalid). Returns (path, invalid, the file a successful run writes;
    None for an invalid target)."""
    kinds = ["plain"] * 8 + ["newdir", "symlink", "dir", "fifo", "device", "under-file"]
    if inputs:
        kinds += ["input", "input-dot", "input-link"]
    if figure:
        kinds += ["extension", "svg"]
    kind = draw(st.sampled_from(kinds))
    path = folder / name
    if kind == "newdir":
        path = folder / "new" / name
    elif kind == "symlink":
        target = folder / f"target-{name}"
        path.symlink_to(target)
        return path, False, target
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path(os.devnull)
    elif kind == "under-file":
        (folder / "afile").write_text("x")
        path = folder / "afile" / name
    elif kind in ("input", "input-dot", "input-link"):
        source = draw(st.sampled_from(inputs))
        path = source
        if kind == "input-dot":  # the same file by another spelling (pathlib would normalize it away)
            path = draw(
                st.sampled_from(
                    [f"{source.parent}/./{source.name}", f"{source.parent}/../{source.parent.name}/{source.name}"]
                )
            )
        if kind == "input-link":
            path = folder / f"link-{name}"
            path.symlink_to(source)
    elif kind == "extension":
        path = folder / (Path(name).stem + draw(st.sampled_from([".txt", ".docx", ".pngx", ".json", ".pgf"])))
    elif kind == "svg":
        path = folder / (Path(name).stem + ".svg")
    invalid = kind in ("dir", "fifo", "device", "under-file", "input", "input-dot", "input-link", "extension")
    return path, invalid, None if invalid else path


@st.composite
def input_path(draw, path: Path) -> tuple[Path, bool]:
    """The path an input is given as: ``path`` itself (usually), or a missing file, a dangling
    symlink, a directory, a FIFO or ``/dev/null`` in its place (invalid). Returns (path, invalid)."""
    kind = draw(st.sampled_from(["file"] * 10 + ["missing", "dangling", "dir", "fifo", "device"]))
    if kind == "file":
        return path, False
    other = path.parent / f"other-{path.name}"
    if kind == "dangling":
        other.symlink_to(path.parent / "nowhere")
    elif kind == "dir":
        other.mkdir()
    elif kind == "fifo":
        os.mkfifo(other)
    elif kind == "device":
        other = Path(os.devnull)
    return other, True


def _write_instance(folder: Path, text: bytes) -> Path:
    path = folder / "inst.yaml"
    path.write_bytes(text)
    return path


@FUZZ
@given(case=instance_text(), data=st.data())
def test_fuzz_solve(root, case, data):
    """solve: mutated instances (or no regular file in their place), output targets (the
    instance among them) and figure names."""
    text, invalid, method_only = case
    d = fresh(root)
    inst = _write_instance(d, text)
    out, bad_out, out_file = data.draw(output_target(d, "plan.json", inputs=(inst,)))
    given, bad_in = data.draw(input_path(inst))
    report = d / "report.json"
    argv = ["solve", str(given), "--quiet", "--output", str(out), "--report", str(report)]
    plot = data.draw(st.sampled_from([None, "loads.txt", "loads.docx"]))
    if plot:  # an unknown figure format (a valid figure takes a second to draw)
        argv += ["--plot", str(d / plot)]
    check(
        argv,
        invalid=invalid or bad_out or bad_in or bool(plot),
        blame=(str(d), "--output", "--plot", os.devnull),
        outputs=(out_file, report),
        inputs=d,
    )


@FUZZ
@given(
    case=instance_text(),
    methods=st.sampled_from(
        [
            "linear",
            "linear,greedy",
            "magic",
            "",
            ",",
            "linear,3",
            "linear,,greedy",
            "linear,linear",
            "linear,nonexistent",
        ]
    ),
    options=st.lists(
        st.sampled_from(
            [
                ["--seed", "-1"],
                ["--time-limit", "nan"],
                ["--time-limit", "0"],
                ["--workers", "0"],
                ["--seed", "1.5"],
                ["--time-limit", "-1"],
                ["--layer-time-limit", "0"],
                ["--verbose"],
            ]
        ),
        max_size=1,
    ),
)
def test_fuzz_compare(root, case, methods, options):
    """compare: mutated instances, method lists and numeric options."""
    text, invalid, method_only = case
    d = fresh(root)
    inst = _write_instance(d, text)
    known_bad = methods in ("magic", "", ",", "linear,3", "linear,,greedy", "linear,linear", "linear,nonexistent")
    report = d / "cmp.json"
    argv = ["compare", str(inst), "--methods", methods, "--quiet", "--report", str(report)]
    for o in options:
        argv += o
    invalid = (invalid and not method_only) or bool(options) or known_bad
    code = check(
        argv,
        invalid=invalid,
        blame=(str(d), "moeopt compare: argument", "--methods", "--quiet"),
        outputs=(report,),
        inputs=d,
    )
    if known_bad:
        assert code == 2


@FUZZ
@given(
    case=instance_text(),
    eps=st.sampled_from(["0.1", "nan", "-1", "a", "0.1,x", "inf,0.1", "0.1,"]),
    name=st.sampled_from([None] * 4 + ["../escaped", "", ".", "..", "a/b", "alone"]),
)
def test_fuzz_frontier(root, case, eps, name):
    """frontier: mutated instances, load-limit lists and --name stems (the output folder only
    where the run must fail: drawing the plot of a valid run takes a second)."""
    text, invalid, method_only = case
    d = fresh(root)
    inst = _write_instance(d, text)
    invalid = (invalid and not method_only) or eps in ("nan", "-1", "a", "0.1,x", "0.1,") or name is not None
    out = ["--output", str(d / "fr")] if invalid and name != "alone" else []
    named = [] if name is None else ["--name", "x" if name == "alone" else name]  # alone: no --output
    check(
        ["frontier", str(inst), "--methods", "greedy", "--eps", eps, "--quiet", *out, *named],
        invalid=invalid,
        blame=(str(d), "--eps", "--output", "--name"),
        inputs=d,
    )
    assert not (d / "fr").exists() or not any((d / "fr").iterdir())
    assert not (d / "escaped.json").exists() and not (root / "escaped.json").exists()


@FUZZ
@given(
    case=instance_text(),
    option=st.sampled_from(
        [
            ["--repeats", "0"],
            ["--warmup", "-1"],
            ["--world", "0"],
            ["--tile", "x"],
            ["--max-steps", "0"],
            ["--seed", "-3"],
            ["--d-model", "1.5"],
            ["--threads", "0"],
            [],
        ]
    ),
)
def test_fuzz_validate(root, case, option):
    """validate: known-invalid instances or options only (a valid run times torch kernels)."""
    text, invalid, method_only = case
    if (not invalid or method_only) and not option:  # validate solves its own methods
        text, invalid = _dump({**BASE_INSTANCE, "model": {"layers": 0}}).encode(), True
    d = fresh(root)
    inst = _write_instance(d, text)
    report = d / "v.json"
    check(
        ["validate", str(inst), "--report", str(report), *option],
        invalid=True,
        blame=(str(d), "moeopt validate: argument"),
        outputs=(report,),
    )


def _not_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return True
    return False


#: option values argparse must refuse for a count (>= 1) and for a non-negative integer
BAD_COUNT_TEXT = st.one_of(st.integers(max_value=0).map(str), st.text(max_size=5).filter(_not_int))
BAD_NONNEG_TEXT = st.one_of(st.integers(max_value=-1).map(str), st.text(max_size=5).filter(_not_int))
PROFILE_COUNTS = ["--repeats", "--tile", "--max-tokens", "--experts-per-gpu", "--d-ff", "--d-model", "--threads"]


@FUZZ
@given(option=st.sampled_from([*PROFILE_COUNTS, "--warmup"]), data=st.data())
def test_fuzz_profile(root, option, data):
    """profile: invalid numeric options or output targets fail before any measurement."""
    d = fresh(root)
    value = data.draw(BAD_NONNEG_TEXT if option == "--warmup" else BAD_COUNT_TEXT)
    out, _, out_file = data.draw(output_target(d, "prof.yaml"))
    check(
        ["profile", "--device", "cpu", "--output", str(out), f"{option}={value}"],
        invalid=True,
        blame=("moeopt profile: argument", "--output"),
        outputs=(out_file,),
    )


# ----------------------------------------------------------------------------- synth options
SYNTH_OPTIONS = {
    "--layers": (["1", "2"], ["0", "-1", "1.5", "x", ""]),
    "--experts": (["4", "6"], ["0", "-4", "4.0", "four"]),
    "--top-k": (["1", "2"], ["0", "-2", "9", "2.5"]),  # 9 > experts
    "--tokens": (["16", "40"], ["0", "-1", "1e3", "10000000000000"]),
    "--steps": (["1", "3"], ["0", "x", "100000000000000"]),
    "--families": (["a,b", "code"], ["a,a", "", ",", "a,,b"]),
    "--family": (["a"], ["zzz"]),
    "--layer-dependency": (["0", "0.5", "1"], ["nan", "2", "-0.1", "inf", "x"]),
    "--structure-seed": (["0", "7"], ["-1", "1.5", "99999999999"]),
    "--seed": (["0", "3"], ["-1", "x"]),
    "--family-communities": (["shared", "per_family"], ["other"]),
}


@FUZZ
@given(data=st.data())
def test_fuzz_trace_synth(root, data):
    """trace synth: every option valid or known invalid, and output targets."""
    d = fresh(root)
    argv = [
        "trace",
        "synth",
        "--quiet",
        "--layers",
        "1",
        "--experts",
        "4",
        "--tokens",
        "16",
        "--steps",
        "2",
        "--families",
        "a,b",
    ]
    invalid = False
    for option in data.draw(st.lists(st.sampled_from(sorted(SYNTH_OPTIONS)), max_size=3, unique=True)):
        good, bad = SYNTH_OPTIONS[option]
        if data.draw(st.booleans()):
            argv += [option, data.draw(st.sampled_from(bad))]
            invalid = True
        else:
            argv += [option, data.draw(st.sampled_from(good))]
    families = argv[argv.index("--families") + 1].split(",") if "--families" in argv else []
    if "--family" in argv and argv[argv.index("--family") + 1] not in families:
        invalid = True
    name = data.draw(st.sampled_from(["t.npz"] * 6 + ["t.yaml", "t.json", "t"]))  # a trace is an .npz
    out, bad_out, out_file = data.draw(output_target(d, name))
    check(
        [*argv, "--output", str(out)],
        invalid=invalid or bad_out or not name.endswith(".npz"),
        blame=("moeopt trace synth: argument", "--"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- traces
def _base_trace() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    topk = np.stack([rng.permutation(4)[:2] for _ in range(8)])[:, None, :].astype(np.int16)
    return {
        "topk": topk,
        "family": np.array([0, 1] * 4, dtype=np.int32),
        "step": np.array([0, 0, 1, 1, 2, 2, 3, 3], dtype=np.int32),
        "family_names": np.array(["a", "b"]),
        "num_experts": np.array(4),
        "home": np.array([0, 1] * 4, dtype=np.int32),
    }


@st.composite
def trace_file(draw, folder: Path) -> tuple[Path, bool, bool]:
    """A mutated trace ``.npz``, whether it is known to be invalid for a 2-GPU cluster, and
    whether it is known to be invalid on its own (token homes >= 2 are not)."""
    arrays = _base_trace()
    kind = draw(
        st.sampled_from(
            [
                "dtype",
                "shape",
                "range",
                "range",
                "dup",
                "dup",
                "home",
                "home",
                "family",
                "weights",
                "missing",
                "empty",
                "huge",
                "junk",
                "bytes",
                "pickled",
                "not-zip",
                "none",
            ]
        )
    )
    invalid = kind not in ("junk", "bytes", "none")
    alone = invalid
    topk = arrays["topk"]
    if kind == "dtype":
        arrays["topk"] = draw(
            st.sampled_from([topk.astype(np.float64), topk.astype(object), topk.astype(bool), topk.astype(str)])
        )
    elif kind == "shape":
        arrays["topk"] = draw(st.sampled_from([topk[:, 0, :], topk[:, :, :, None], topk.reshape(-1)]))
    elif kind == "range":
        i, j = draw(st.integers(0, 7)), draw(st.integers(0, 1))
        arrays["topk"] = topk.copy()
        arrays["topk"][i, 0, j] = draw(st.sampled_from([-1, -300, 4, 999]))
    elif kind == "dup":
        i = draw(st.integers(0, 7))
        arrays["topk"] = topk.copy()
        arrays["topk"][i, 0, 1] = arrays["topk"][i, 0, 0]
    elif kind == "home":
        arrays["home"] = arrays["home"].copy()
        arrays["home"][draw(st.integers(0, 7))] = home = draw(st.sampled_from([-1, 2, 5, 10**6]))
        alone = home < 0
    elif kind == "family":
        arrays["family"] = draw(
            st.sampled_from(
                [arrays["family"] + 2, -arrays["family"] - 1, arrays["family"][:3], arrays["family"].astype(float)]
            )
        )
    elif kind == "weights":
        w = np.ones(topk.shape)
        w[0, 0, 0] = draw(st.sampled_from([math.nan, math.inf]))
        arrays["weights"] = draw(st.sampled_from([w, np.ones((8, 1))]))
    elif kind == "missing":
        del arrays["topk"]
    elif kind == "huge":
        arrays["num_experts"] = np.array(draw(st.sampled_from([10**5, 10**12, 2**62])))
    elif kind == "empty":
        arrays = {k: v[:0] if v.ndim else v for k, v in arrays.items()}
    elif kind == "junk":
        key = draw(st.sampled_from(sorted(arrays)))
        arrays[key] = draw(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))
    elif kind == "pickled":  # an array of Python objects: numpy would need to unpickle it
        arrays[draw(st.sampled_from(sorted(arrays)))] = np.array([{"a": 1}, None], dtype=object)
    path = folder / "trace.npz"
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    if kind == "not-zip":  # an .npy, a pickle, text or nothing under the .npz name
        with open(path, "wb") as fh:
            how = draw(st.sampled_from(["npy", "pickle", "text", "empty"]))
            if how == "npy":
                np.save(fh, arrays["topk"])
            elif how == "pickle":
                fh.write(b"\x80\x04\x95" + draw(st.binary(max_size=16)))
            elif how == "text":
                fh.write(b"topk,family\n1,2\n")
    if kind == "bytes":
        raw = bytearray(path.read_bytes())
        how = draw(st.sampled_from(["truncate", "flip"]))
        if how == "truncate":
            raw = raw[: draw(st.integers(0, len(raw) - 1))]
            invalid = alone = True
        else:
            for _ in range(draw(st.integers(1, 8))):
                raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
        path.write_bytes(bytes(raw))
    return path, invalid, alone


@FUZZ
@given(data=st.data())
def test_fuzz_trace_stats(root, data):
    """trace stats: mutated trace files (token homes are not checked without a cluster), given
    as themselves or as no regular file, with --select (meaningless on a trace) and --graphml
    targets (the trace among them), sometimes with a mutated --plan (that may or may not fit)."""
    d = fresh(root)
    path, _, invalid = data.draw(trace_file(d))
    given, bad_in = data.draw(input_path(path))
    argv = ["trace", "stats", str(given)]
    select = data.draw(st.booleans()) and data.draw(st.booleans())
    if select:
        argv += ["--select", "olmoe"]
    outputs: tuple[Path | None, ...] = ()
    bad_out = False
    if data.draw(st.booleans()):
        out, bad_out, out_file = data.draw(output_target(d, "g.graphml", inputs=(path,)))
        argv += ["--graphml", str(out)]
        outputs = (out_file,)
    plan_given = outputs and data.draw(st.booleans())
    if plan_given:
        plan, _ = data.draw(plan_file(d))
        argv += ["--plan", str(plan)]
    known = invalid or bad_in or bad_out or select
    code = check(
        argv, invalid=known, blame=(str(d), os.devnull, "--graphml"), outputs=() if plan_given else outputs, inputs=d
    )
    assert code == 2 or not known


@FUZZ
@given(data=st.data())
def test_fuzz_solve_on_trace(root, data):
    """solve with a mutated calibration trace: homes checked against the cluster too."""
    d = fresh(root)
    path, invalid, _ = data.draw(trace_file(d))
    inst = d / "inst.yaml"
    inst.write_text(_dump({**BASE_INSTANCE, "workload": {"calibration": path.name}}))
    out, bad_out, out_file = data.draw(output_target(d, "plan.json", inputs=(inst, path)))
    check(
        ["solve", str(inst), "--quiet", "--output", str(out)],
        invalid=invalid or bad_out,
        blame=(str(d), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- counts
@st.composite
def counts_file(draw, folder: Path) -> tuple[Path, bool, bool]:
    """A mutated counts JSON, whether it is known to be invalid, and whether its counts are (in
    any format)."""
    counts = [[5, 3, 2, 6]]
    data: Any = {"counts": counts, "top_k": 2}
    kind = draw(st.sampled_from(["nan", "negative", "zeros", "top_k", "ragged", "huge", "junk", "text", "none"]))
    invalid = kind not in ("junk", "none")
    if kind == "nan":
        data["counts"] = [[5, math.nan, 2, 6]]
    elif kind == "huge":  # totals past 2**53: loads, squares and bounds would overflow or lose integers
        data["counts"] = [draw(st.sampled_from([[1e308] * 4, [1e17, 1, 1, 1], [5, 3, 2, 1e300]]))]
    elif kind == "negative":
        data["counts"] = [[5, -1, 2, 6]]
    elif kind == "zeros":
        data["counts"] = [[0, 0, 0, 0]]
    elif kind == "top_k":
        data["top_k"] = draw(st.sampled_from([0, -1, 5, 2.5, "2", True, [2]]))
    elif kind == "ragged":
        data["counts"] = [[5, 3], [1]]
    elif kind == "junk":
        data[draw(st.sampled_from(["counts", "top_k", "family_names"]))] = draw(JUNK)
    path = folder / "counts.json"
    text = json.dumps(data).encode()
    if kind == "text":
        text = draw(st.sampled_from([text[:-3], b"\xff\xfe" + text, b"[" * 100000, b'{"counts": NaN}']))
    path.write_bytes(text)
    return path, invalid, kind in ("nan", "negative", "zeros", "huge")


@FUZZ
@given(
    data=st.data(),
    suffix=st.sampled_from([".json", ".csv", ".npy"]),
    top_k=st.one_of(st.just(None), st.sampled_from(["2", "0", "-1", "x", "9"])),
)
def test_fuzz_trace_stats_counts(root, data, suffix, top_k):
    """trace stats on mutated count files (JSON, CSV, NPY) and --top-k values."""
    d = fresh(root)
    path, invalid, bad_counts = data.draw(counts_file(d))
    if suffix != ".json":  # the same counts in another format (or the JSON text as is, when it is not JSON data)
        try:
            counts = np.asarray(json.loads(path.read_bytes())["counts"], dtype=float)
        except (ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError):
            counts = None
        other = d / f"counts{suffix}"
        if counts is None or counts.ndim != 2:
            other.write_bytes(path.read_bytes())
        elif suffix == ".csv":
            other.write_text("\n".join(",".join(repr(float(x)) for x in np.atleast_1d(row)) for row in counts))
        else:
            np.save(other, counts)
        path = other
        invalid = bad_counts or top_k is None  # CSV and NPY counts do not record top_k
    argv = ["trace", "stats", str(path)] + ([] if top_k is None else [f"--top-k={top_k}"])
    # 9 > experts: refused where the file does not record its own top_k (CSV, NPY)
    bad_k = top_k in ("0", "-1", "x") or (top_k == "9" and suffix != ".json")
    check(argv, invalid=invalid or bad_k, blame=(str(path), "moeopt trace stats: argument"), inputs=d)


@FUZZ
@given(data=st.data())
def test_fuzz_solve_on_counts(root, data):
    """solve (greedy) on a mutated counts file."""
    d = fresh(root)
    path, invalid, _ = data.draw(counts_file(d))
    inst = d / "inst.yaml"
    inst.write_text(_dump({**BASE_INSTANCE, "workload": {"calibration": path.name}, "method": {"name": "greedy"}}))
    out, bad_out, out_file = data.draw(output_target(d, "r.json", inputs=(inst, path)))
    check(
        ["solve", str(inst), "--quiet", "--report", str(out)],
        invalid=invalid or bad_out,
        blame=(str(d), "--report"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- profiles
BASE_PROFILE = {
    "format": "moeopt.profile/1",
    "tile": 16,
    "unit": "ms",
    "gpus": [{"name": "g0", "latency": [0.1, 0.2, 0.3]}, {"name": "g1", "latency": [0.1, 0.25, 0.4]}],
}


@st.composite
def profile_file(draw, folder: Path) -> tuple[Path, bool]:
    """A mutated latency profile YAML and whether it is known to be invalid (2 GPUs)."""
    data = copy.deepcopy(BASE_PROFILE)
    kind = draw(st.sampled_from(["tile", "latency", "gpus", "one-gpu", "extra", "format", "junk", "none"]))
    invalid = kind not in ("junk", "none", "one-gpu")  # one GPU is broadcast to the cluster's identical GPUs
    if kind == "tile":
        data["tile"] = draw(BAD_COUNT)
    elif kind == "latency":
        data["gpus"][draw(st.integers(0, 1))]["latency"] = draw(
            st.sampled_from(
                [
                    [0.3, 0.2, 0.1],
                    [math.nan, 1, 2],
                    [-1, 0, 1],
                    [0.1],
                    [],
                    "fast",
                    [0.1, "0.2", 0.3],
                    [0.1, 0.2],
                    [0.1, math.inf, math.inf],
                ]
            )
        )
    elif kind == "gpus":
        data["gpus"] = draw(st.sampled_from([[], data["gpus"] * 2, "two", None]))
    elif kind == "one-gpu":
        data["gpus"] = data["gpus"][:1]
    elif kind == "extra":
        data[draw(st.sampled_from(["colour", "speeds"]))] = 1
    elif kind == "format":
        data["format"] = draw(st.sampled_from(["moeopt.profile/9", 1]))
    elif kind == "junk":
        _set(data, draw(st.sampled_from(["tile", "unit", "meta", "gpus"])), draw(JUNK))
    path = folder / "prof.yaml"
    path.write_text(_dump(data))
    return path, invalid


@FUZZ
@given(data=st.data())
def test_fuzz_solve_with_profile(root, data):
    """solve with a mutated profile file."""
    d = fresh(root)
    path, invalid = data.draw(profile_file(d))
    inst = d / "inst.yaml"
    inst.write_text(_dump({**BASE_INSTANCE, "profile": path.name}))
    out, bad_out, out_file = data.draw(output_target(d, "r.json", inputs=(inst, path)))
    check(
        ["solve", str(inst), "--quiet", "--report", str(out)],
        invalid=invalid or bad_out,
        blame=(str(d), "--report"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- plans
BASE_PLAN = {
    "format": "moeopt.plan/2",
    "gpus": 2,
    "layers": 1,
    "experts": 4,
    "slots_per_gpu": 2,
    "slots": [[[0, 1], [2, 3]]],
    "dispatch": "even",
    "method": "linear",
    "params": {},
}


@st.composite
def plan_file(draw, folder: Path) -> tuple[Path, bool]:
    """A mutated plan JSON and whether it is known to be invalid (for the 2-GPU base instance)."""
    data = copy.deepcopy(BASE_PLAN)
    kind = draw(
        st.sampled_from(
            [
                "header",
                "header",
                "slot",
                "shape",
                "format",
                "method",
                "wide",
                "text",
                "v1",
                "strict",
                "strict",
                "junk",
                "junk",
                "none",
            ]
        )
    )
    invalid = kind not in ("junk", "none")
    if kind == "header":
        key = draw(st.sampled_from(["gpus", "layers", "experts"]))
        data[key] = draw(st.one_of(BAD_COUNT, st.just(3), HUGE))  # 3: disagrees with the slots
    elif kind == "slot":
        g, w = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        data["slots"][0][g][w] = draw(st.sampled_from([-2, 4, 99, 3.9, "3", None, True, 2.0, math.nan]))
    elif kind == "shape":
        data["slots"] = draw(
            st.sampled_from(
                [[[[0, 1]]], [[0, 1, 2, 3]], [[[0, 1], [2]]], [], "0123", [[[0, 1], [2, 3]], [[0, 1], [2, 3]]]]
            )
        )
    elif kind == "format":
        data["format"] = draw(st.sampled_from(["moeopt.plan/3", None, 2, ""]))
    elif kind == "method":
        data[draw(st.sampled_from(["method", "params"]))] = draw(st.sampled_from([3, [1], "x"]))
        invalid = not isinstance(data["method"], str) or not isinstance(data["params"], dict)
    elif kind == "strict":  # what a strict reader refuses: keys of no format, of the other one, a lying header
        how = draw(st.sampled_from(["unknown", "v1-key", "width", "lam", "replicas"]))
        if how == "unknown":
            data[draw(st.sampled_from(["colour", "slot", "Slots", "notes"]))] = draw(JUNK)
        elif how == "v1-key":
            data[draw(st.sampled_from(["placement", "replicas"]))] = [[0, 0, 1, 1]]
        elif how == "width":
            data["slots_per_gpu"] = draw(st.sampled_from([1, 3, 5]))
        elif how == "lam":
            data["dispatch"] = {"kind": draw(st.sampled_from(["even", "lp", "static"])), "lam": 3}
        else:
            data = {**BASE_PLAN, "format": "moeopt.plan/1", "placement": [[0, 0, 1, 1]], "replicas": [[], []]}
            del data["slots"], data["slots_per_gpu"], data["dispatch"]
    elif kind == "wide":  # more slots per GPU than the cluster has (over capacity)
        data["slots"] = [[[0, 1, -1], [2, 3, 0]]]
        data["slots_per_gpu"] = 3
    elif kind == "v1":
        data = {
            "format": "moeopt.plan/1",
            "gpus": 2,
            "layers": 1,
            "experts": 4,
            "placement": draw(st.sampled_from([[[0, 0, 1, 2]], [[0, 0, 1]], [[0, 0, "1", 1]], [[0, -1, 1, 1]]])),
        }
    path = folder / "plan.json"
    text = json.dumps(data).encode()
    if kind == "text":
        text = draw(
            st.sampled_from(
                [
                    text[: len(text) // 2],
                    text.decode().encode("utf-16"),
                    b"[" * 100000,
                    text.replace(b'"even"', b'"\xe9ven"'),
                    b"",
                    b"null",
                ]
            )
        )
    elif kind == "junk":
        data[draw(st.sampled_from(sorted(data)))] = draw(JUNK)
        text = json.dumps(data).encode()
    path.write_bytes(text)
    return path, invalid


@pytest.fixture(scope="module")
def base_instance(root) -> Path:
    """The valid tiny instance the plans are evaluated on."""
    path = root / "base.yaml"
    path.write_text(_dump(BASE_INSTANCE))
    return path


@FUZZ
@given(data=st.data())
def test_fuzz_evaluate(root, base_instance, data):
    """evaluate: mutated plans (and a report target)."""
    d = fresh(root)
    path, invalid = data.draw(plan_file(d))
    report, bad_out, report_file = data.draw(output_target(d, "r.json", inputs=(path,)))
    given, bad_in = data.draw(input_path(path))
    check(
        ["evaluate", str(base_instance), str(given), "--report", str(report)],
        invalid=invalid or bad_out or bad_in,
        blame=(str(path), str(given), "--report"),
        outputs=(report_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data())
def test_fuzz_solve_hint(root, base_instance, data):
    """solve --hint: mutated warm-start plans."""
    d = fresh(root)
    path, invalid = data.draw(plan_file(d))
    out, bad_out, out_file = data.draw(output_target(d, "out.json", inputs=(path,)))
    check(
        ["solve", str(base_instance), "--method", "greedy", "--quiet", "--hint", str(path), "--output", str(out)],
        invalid=invalid or bad_out,
        blame=(str(path), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data())
def test_fuzz_export_load(root, base_instance, data):
    """export --load: mutated traces picking the fill of empty slots."""
    d = fresh(root)
    path, _, invalid = data.draw(trace_file(d))
    p = d / "plan.json"
    p.write_text(json.dumps({**BASE_PLAN, "slots": [[[0, 1, -1], [2, 3, -1]]], "slots_per_gpu": 3}))
    out, bad_out, out_file = data.draw(output_target(d, "e.npz", inputs=(path, p)))
    check(
        ["export", str(p), "--format", "eplb", "--load", str(path), "--output", str(out), "--quiet"],
        invalid=invalid or bad_out,
        blame=(str(path), str(p), str(out), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data(), fmt=st.sampled_from([("eplb", "e.npz"), ("sglang", "s.json"), ("vllm-ascend", "v.json")]))
def test_fuzz_export(root, base_instance, data, fmt):
    """export: mutated plans, checked against the instance, and output targets."""
    d = fresh(root)
    path, invalid = data.draw(plan_file(d))
    out, bad_out, out_file = data.draw(output_target(d, fmt[1], inputs=(path,)))
    dense = ["--dense-layers", "0"] if fmt[0] == "sglang" else []  # the instance does not say (SGLang needs it)
    check(
        ["export", str(path), "--format", fmt[0], "--instance", str(base_instance), "--output", str(out), "--quiet"]
        + dense,
        invalid=invalid or bad_out,
        blame=(str(path), str(out), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- engine files
@st.composite
def engine_file(draw, folder: Path) -> tuple[Path, str, bool]:
    """A mutated SGLang or vLLM-Ascend placement JSON (2 GPUs, 4 experts): path, format, invalid."""
    fmt = draw(st.sampled_from(["sglang", "vllm-ascend"]))
    if fmt == "sglang":
        data: Any = {"physical_to_logical_map": [[0, 1, 2, 3]]}
        key, row = "physical_to_logical_map", data["physical_to_logical_map"][0]
    else:
        data = {
            "moe_layer_count": 1,
            "layer_list": [
                {
                    "layer_id": 0,
                    "device_count": 2,
                    "device_list": [
                        {"device_id": 0, "device_expert": [0, 1]},
                        {"device_id": 1, "device_expert": [2, 3]},
                    ],
                }
            ],
        }
        key, row = "layer_list", data["layer_list"][0]["device_list"][0]["device_expert"]
    kind = draw(st.sampled_from(["id", "id", "missing", "text", "junk", "none"]))
    invalid = kind in ("id", "missing", "text")
    if kind == "id":
        row[draw(st.integers(0, 1))] = draw(st.sampled_from([-5, 4, 99, 1.5, "1", None, math.nan]))
    elif kind == "missing":
        del data[key]
    elif kind == "junk":
        row[draw(st.integers(0, 1))] = draw(JUNK)
    text = json.dumps(data).encode()
    if kind == "text":
        text = draw(st.sampled_from([text[:-2], b"\xff" + text, b"[" * 100000]))
    path = folder / f"{fmt}.json"
    path.write_bytes(text)
    return path, fmt, invalid


@FUZZ
@given(data=st.data(), gpus=st.sampled_from(["2", "2", "0", "-1", "x"]))
def test_fuzz_import(root, data, gpus):
    """import: mutated engine placement files and --gpus values."""
    d = fresh(root)
    path, fmt, invalid = data.draw(engine_file(d))
    out, bad_out, out_file = data.draw(output_target(d, "plan.json", inputs=(path,)))
    check(
        ["import", str(path), "--format", fmt, "--gpus", gpus, "--output", str(out), "--quiet"],
        invalid=invalid or bad_out or gpus != "2",
        blame=(str(path), "--output", "--gpus", "moeopt import:"),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data())
def test_fuzz_trace_import(root, data):
    """trace import: files that are not SGLang dumps, and output targets."""
    d = fresh(root)
    dump = d / "dump.pt"
    dump.write_bytes(data.draw(st.binary(max_size=64)))
    given, _ = data.draw(input_path(dump))
    out, bad_out, out_file = data.draw(output_target(d, "t.npz", inputs=(dump,)))
    check(
        ["trace", "import", str(given), "--output", str(out), "--quiet"],
        invalid=True,
        blame=(str(dump), str(given), "--output", str(out)),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data())
def test_fuzz_plot(root, base_instance, data):
    """plot --kind loads: mutated plans, known-invalid ones only (drawing a valid plan takes a second)."""
    d = fresh(root)
    path, invalid = data.draw(plan_file(d))
    if not invalid:
        path.write_text("{")
    out, _, out_file = data.draw(output_target(d, "loads.png", inputs=(path,), figure=True))
    check(
        ["plot", str(path), "--kind", "loads", "--instance", str(base_instance), "--output", str(out), "--quiet"],
        invalid=True,
        blame=(str(path), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- count archives
@st.composite
def counts_npz(draw, folder: Path, steps: bool = False) -> tuple[Path, bool]:
    """A mutated counts ``.npz`` (1 layer, 4 experts, top-2; with ``step_counts`` when
    ``steps``) or per-domain counts (keys ``MODEL/expert_counts/DOMAIN``), and whether it is
    known to be invalid."""
    rng = np.random.default_rng(draw(st.integers(0, 3)))
    sc = rng.integers(1, 9, size=(1, 3, 4)).astype(np.float64)
    arrays: dict[str, Any] = {"counts": sc.sum(axis=1), "top_k": np.array(2)}
    if steps:
        arrays["step_counts"] = sc
    kind = draw(
        st.sampled_from(
            ["values", "step_counts", "top_k", "names", "pickled", "bytes", "domains", "junk", "none", "none"]
        )
    )
    invalid = kind not in ("junk", "domains", "none")
    if kind == "values":
        bad = draw(st.sampled_from([math.nan, math.inf, -1.0, 1e308, 1e17]))
        key = "step_counts" if steps and draw(st.booleans()) else "counts"
        arrays[key] = arrays[key].copy()
        arrays[key].flat[draw(st.integers(0, 3))] = bad
    elif kind == "step_counts":
        arrays["step_counts"] = draw(st.sampled_from([sc[0], sc[:, :, :2], sc.astype(str), np.zeros((2, 3, 4))]))
    elif kind == "top_k":
        arrays["top_k"] = draw(
            st.sampled_from([np.array([2, 2]), np.array(2.0), np.array(0), np.array(9), np.array("2")])
        )
    elif kind == "names":
        arrays["counts"] = np.stack([arrays["counts"]] * 2)
        arrays["family_names"] = draw(st.sampled_from([np.array([1, 2]), np.array(["a"]), np.array([["a", "b"]])]))
        arrays.pop("step_counts", None)
    elif kind == "pickled":
        arrays[draw(st.sampled_from(sorted(arrays)))] = np.array([{"a": 1}], dtype=object)
    elif kind == "domains":  # the OLMoE per-domain layout: valid, or shapes that disagree
        arrays = {f"m/expert_counts/{d}": sc[0, i : i + 1] + 1 for i, d in enumerate("abc")}
        arrays["m/expert_counts_top1/a"] = draw(st.sampled_from([(sc[0, :1] + 1) / 2, np.zeros((1, 4))]))
        bad = draw(st.sampled_from(["none", "none", "shape", "top1", "dtype"]))
        if bad == "shape":
            arrays["m/expert_counts/b"] = np.ones((1, 5))
        elif bad == "dtype":
            arrays["m/expert_counts/c"] = np.array([["x"] * 4])
        elif bad == "top1":  # the first-choice counts that give top_k: none, text or infinite
            arrays["m/expert_counts_top1/a"] = draw(
                st.sampled_from([np.zeros(0), np.array([["x"] * 4]), np.full((1, 4), math.inf)])
            )
        invalid = bad != "none" or not arrays["m/expert_counts_top1/a"].any()
    elif kind == "junk":
        key = draw(st.sampled_from(sorted(arrays)))
        arrays[key] = draw(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
    path = folder / "counts.npz"
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    if kind == "bytes":
        raw = path.read_bytes()
        path.write_bytes(draw(st.sampled_from([raw[: len(raw) // 2], raw[:4], b"", b"\x80\x04junk", b"counts\n1,2"])))
    return path, invalid


@FUZZ
@given(data=st.data(), select=st.sampled_from([None, None, None, "m", "olmoe"]))
def test_fuzz_counts_npz(root, data, select):
    """trace stats and solve (balance) on mutated count archives, with --select sometimes (it
    names a model of a per-domain file and means nothing elsewhere)."""
    d = fresh(root)
    path, invalid = data.draw(counts_npz(d))
    domains = "m/expert_counts/a" in np.load(path, allow_pickle=False).files if not invalid else False
    bad_select = select is not None and (not domains or select != "m")
    argv = ["trace", "stats", str(path)] + ([] if select is None else ["--select", select])
    check(argv, invalid=invalid or bad_select, blame=(str(path),), inputs=d)
    inst = d / "inst.yaml"
    source: Any = path.name if select is None else {"path": path.name, "select": select}
    inst.write_text(_dump({**BASE_INSTANCE, "workload": {"calibration": source}, "method": {"name": "balance"}}))
    out, bad_out, out_file = data.draw(output_target(d, "plan.json", inputs=(inst, path)))
    # a per-domain file holds 3 families of 1 layer: fine for a 1-layer instance
    check(
        ["solve", str(inst), "--quiet", "--output", str(out)],
        invalid=invalid or bad_select or bad_out,
        blame=(str(d), "--output"),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["sampled", "phase", "domains"]))
def test_fuzz_trace_stream(root, data, kind):
    """trace stream: mutated count archives as --source (and --after), output targets (the
    sources among them) and output names that are not .npz."""
    d = fresh(root)
    path, invalid = data.draw(counts_npz(d))
    given, bad_in = data.draw(input_path(path))
    name = data.draw(st.sampled_from(["s.npz"] * 5 + ["s.json"]))
    out, bad_out, out_file = data.draw(output_target(d, name, inputs=(path,)))
    argv = ["trace", "stream", kind, "--source", str(given), "--steps", "4", "--tokens-per-step", "16", "--quiet"]
    if kind == "phase":
        argv += ["--after", str(given)]
    families = 1
    if not invalid:
        with np.load(path, allow_pickle=False) as z:
            families = 3 if "m/expert_counts/a" in z.files else (2 if np.asarray(z["counts"]).ndim == 3 else 1)
    known = invalid or bad_in or bad_out or not name.endswith(".npz") or (kind == "domains" and families < 2)
    if kind == "domains":
        argv += ["--steps-per-domain", "2"]
        argv.remove("--steps"), argv.remove("4")
    check(
        [*argv, "--output", str(out)],
        invalid=known,
        blame=(str(d), os.devnull, "--output", "--source", "moeopt trace stream: argument"),
        outputs=(out_file,),
        inputs=d,
    )


# ----------------------------------------------------------------------------- replay, evaluate --trace, engine files
@FUZZ
@given(case=instance_text(), data=st.data())
def test_fuzz_replay(root, case, data):
    """replay: mutated instances, or a valid one replaying a mutated --stream of per-step counts;
    report targets (the inputs among them)."""
    text, invalid, method_only = case
    d = fresh(root)
    inst = _write_instance(d, text)
    argv = ["replay", str(inst), "--quiet", "--interval", "1"]
    if data.draw(st.booleans()):  # a valid instance, a mutated stream
        inst.write_text(_dump({**BASE_INSTANCE, "method": {"name": "balance"}}))
        path, invalid = data.draw(counts_npz(d, steps=True))
        argv += ["--stream", str(path)]
    else:
        invalid = invalid and not method_only  # replay plans with its own planner
    inputs = tuple(p for p in d.iterdir() if p.is_file())
    out, bad_out, out_file = data.draw(output_target(d, "replay.json", inputs=inputs))
    check(
        [*argv, "--report", str(out)],
        invalid=invalid or bad_out,
        blame=(str(d), "--report"),
        outputs=(out_file,),
        inputs=d,
    )


@FUZZ
@given(data=st.data())
def test_fuzz_evaluate_trace(root, base_instance, data):
    """evaluate --trace: a plan scored on mutated traces and count files (the trace as --report too)."""
    d = fresh(root)
    if data.draw(st.booleans()):
        path, invalid, _ = data.draw(trace_file(d))
    else:
        path, invalid, _ = data.draw(counts_file(d))
    plan = d / "plan.json"
    plan.write_text(json.dumps(BASE_PLAN))
    report, bad_out, report_file = data.draw(output_target(d, "r.json", inputs=(path, plan)))
    check(
        ["evaluate", str(base_instance), str(plan), "--trace", str(path), "--report", str(report)],
        invalid=invalid or bad_out,
        blame=(str(path), "--report"),
        outputs=(report_file,),
        inputs=d,
    )


@st.composite
def eplb_file(draw, folder: Path) -> tuple[Path, bool]:
    """A mutated DeepSeek EPLB ``.npz`` (``phy2log``, ``log2phy``, ``logcnt``, ``num_gpus``) of
    the base plan (2 GPUs, 4 experts) and whether it is known to be invalid."""
    arrays: dict[str, Any] = {
        "phy2log": np.array([[0, 1, 2, 3]]),
        "log2phy": np.array([[[0], [1], [2], [3]]]),
        "logcnt": np.ones((1, 4), dtype=np.int64),
        "num_gpus": np.array(2),
    }
    kind = draw(st.sampled_from(["id", "shape", "gpus", "pickled", "missing", "bytes", "lenient", "junk", "none"]))
    invalid = kind not in ("junk", "lenient", "none")
    if kind == "id":
        arrays["phy2log"] = arrays["phy2log"].copy()
        arrays["phy2log"][0, draw(st.integers(0, 3))] = draw(st.sampled_from([-1, 4, 99]))
    elif kind == "shape":
        arrays["phy2log"] = draw(
            st.sampled_from([np.array([0, 1, 2, 3]), np.array([[0, 1, 2]]), np.array([[0.5, 1, 2, 3]])])
        )
    elif kind == "gpus":
        arrays["num_gpus"] = draw(st.sampled_from([np.array(3), np.array(0), np.array([2, 2]), np.array(2.5)]))
    elif kind == "lenient":  # read as engines write them (moeopt.interop.to_numpy): whole floats, one-element counts
        arrays.update(draw(st.sampled_from([{"phy2log": np.array([[0.0, 1, 2, 3]])}, {"num_gpus": np.array([2])}])))
    elif kind == "pickled":
        arrays["phy2log"] = np.array([[0, 1, 2, {"x": 3}]], dtype=object)
    elif kind == "missing":
        del arrays["phy2log"]
    elif kind == "junk":
        key = draw(st.sampled_from(sorted(arrays)))
        arrays[key] = draw(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
    path = folder / "eplb.npz"
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    if kind == "bytes":
        path.write_bytes(draw(st.sampled_from([b"", b"\x80\x04x", b"PK\x03\x04", path.read_bytes()[:30]])))
    return path, invalid


@FUZZ
@given(data=st.data())
def test_fuzz_engine_files(root, base_instance, data):
    """solve --from and import: mutated SGLang / vLLM-Ascend JSON and EPLB archives."""
    d = fresh(root)
    if data.draw(st.booleans()):
        path, invalid = data.draw(eplb_file(d))
        fmt = "eplb"
    else:
        path, fmt, invalid = data.draw(engine_file(d))
    out, bad_out, out_file = data.draw(output_target(d, "plan.json", inputs=(path,)))
    if data.draw(st.booleans()):
        argv = ["solve", str(base_instance), "--method", "balance", "--from", str(path), "--from-format", fmt]
        argv += ["--quiet", "--output", str(out)]
    else:
        argv = ["import", str(path), "--format", fmt, "--instance", str(base_instance), "--output", str(out), "--quiet"]
    check(argv, invalid=invalid or bad_out, blame=(str(path), "--output"), outputs=(out_file,), inputs=d)
