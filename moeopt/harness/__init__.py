"""GPU validation harness (SPEC section 7): a latency profiler and measured plan runs.

torch is an optional extra (``pip install -e ".[torch]"``). Nothing here imports torch at
module level, so ``import moeopt`` and the CLI work without it; every entry point calls
`require_torch`, which turns a missing torch into one clear `TorchMissingError`
(the CLI prints it as one line and exits with code 2).
"""

from __future__ import annotations

from typing import Any

from moeopt.errors import MoeoptError

#: Accepted ``--dtype`` names and their torch attribute.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Other spellings (as instance files may write them) of the same dtypes.
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


class TorchMissingError(MoeoptError):
    """The harness was asked to run but torch is not installed."""


def require_torch() -> Any:
    """Import and return torch, or raise `TorchMissingError` with the install command.

    Returns
    -------
    module
        The ``torch`` module.

    Raises
    ------
    TorchMissingError
        When torch cannot be imported.
    """
    try:
        import torch
    except ImportError:
        raise TorchMissingError(
            'the GPU validation harness needs torch: pip install -e ".[torch]" (CPU build: pip install torch)'
        ) from None
    return torch


def resolve_device(name: str | None) -> str:
    """``cuda`` when requested or (for ``None``) when available, else ``cpu``.

    Parameters
    ----------
    name
        ``"cuda"``, ``"cpu"``, ``"cuda:N"`` or ``None`` (auto).

    Returns
    -------
    str
        A torch device string.

    Raises
    ------
    MoeoptError
        When CUDA is requested but not available.
    """
    torch = require_torch()
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MoeoptError(f"--device {name}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if not (name == "cpu" or name.startswith("cuda")):
        raise MoeoptError(f"--device: expected cuda or cpu, got {name!r}")
    return name


def torch_dtype(name: str) -> Any:
    """The torch dtype for ``fp32`` / ``fp16`` / ``bf16``.

    Raises
    ------
    MoeoptError
        For any other name.
    """
    torch = require_torch()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise MoeoptError(f"--dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, DTYPES[name])
