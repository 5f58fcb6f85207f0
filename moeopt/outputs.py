"""Output files: checked before any work, written through temporary files, all or none.

Every writer in [`moeopt.io`][] writes through `atomic_path`: a temporary file in the
target's directory (the target of a symlink), renamed onto the target only when complete.
Inside `all_or_none` (the CLI runs every command in one) the renames wait until the
command succeeds, so a failure leaves no output at all. Targets that are not regular files
(directories, FIFOs, devices, sockets) are refused, never replaced, and so is a target that is
one of the command's inputs: inside `all_or_none` every file a reader of [`moeopt.io`][]
opens is recorded (`note_input`), and `check_target` compares the target with them
as files (resolved paths, and device and inode: symlinks, ``./x`` and ``x``, hard links).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moeopt.errors import InputError

#: (temporary, target) renames waiting for the end of `all_or_none`; None: rename at once
_pending: list[tuple[str, Path]] | None = None
#: the files the command reads (inside `all_or_none`): file key -> what the file is
_inputs: dict[object, str] | None = None


def resolve(path: str | Path) -> Path:
    """The file a write to ``path`` lands in: symlinks followed (even dangling ones)."""
    return Path(os.path.realpath(path))


def file_keys(path: str | Path) -> list[object]:
    """What identifies the file at ``path``: its resolved path and, when it exists, its
    ``(device, inode)`` (hard links and case-insensitive names included)."""
    target = resolve(path)
    keys: list[object] = [str(target)]
    try:
        st = os.stat(target)
    except OSError:
        return keys
    keys.append((st.st_dev, st.st_ino))
    return keys


def note_input(path: str | Path, what: str | None = None) -> None:
    """Record ``path`` as an input of the running command (inside `all_or_none`; a no-op
    outside one): no output of the command may be written onto it. ``what`` names it for
    the message (default: the path itself)."""
    if _inputs is None:
        return
    for key in file_keys(path):
        _inputs.setdefault(key, what or str(path))


def input_named(path: str | Path, inputs: dict[object, str] | None = None) -> str | None:
    """What the input at ``path`` is, when ``path`` is one of ``inputs`` (default: the files the
    running command has read, `note_input`); None otherwise."""
    known = _inputs if inputs is None else inputs
    if not known:
        return None
    for key in file_keys(path):
        if key in known:
            return known[key]
    return None


def refuse_input(path: str | Path, what: str, option: str | None) -> InputError:
    """The error for an output ``path`` that is an input of the run (``what`` it is)."""
    source, field = (None, option) if option else (str(path), None)
    where = f"{path}: " if option else ""
    named = "" if what == str(path) else f" ({what})"
    return InputError(
        source, field, f"{where}expected a new file, found an input of this run{named}: it would be overwritten"
    )


def check_target(path: str | Path, option: str | None = None) -> Path:
    """Raise `InputError` unless ``path`` can be written as a regular file.

    Parameters
    ----------
    path
        The output path as given.
    option
        The command-line option that named it (``--output``), for the message.

    Returns
    -------
    Path
        The resolved target (symlinks followed).
    """
    source, field = (None, option) if option else (str(path), None)
    where = f"{path}: " if option else ""
    if str(path) == "":
        raise InputError(source, field, "expected a file path, found an empty string")
    if str(path).endswith(("/", os.sep)):
        raise InputError(source, field, f"{where}expected a file path, found a directory path (ends with '/')")
    target = resolve(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(source, field, f"{where}cannot be written ({exc.strerror})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise InputError(source, field, f"{where}expected a file path, found a directory")
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket or special file"
            )
            raise InputError(source, field, f"{where}expected a regular file path, found {kind}")
        what = input_named(target)
        if what is not None:
            raise refuse_input(path, what, option)
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(source, field, f"{where}cannot be written: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(source, field, f"{where}cannot be written: no write permission in {parent}")
    return target


def check_directory(path: str | Path, option: str) -> None:
    """Raise `InputError` unless ``path`` is (or can be made) a writable directory."""
    target = resolve(path)
    if target.exists():
        if not target.is_dir():
            raise InputError(None, option, f"{path}: expected a directory, found a file")
        if not os.access(target, os.W_OK | os.X_OK):
            raise InputError(None, option, f"{path}: cannot be written: no write permission")
        return
    check_target(target / "x", option)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``'s target; rename it onto the target on success
    (at the end of `all_or_none` when inside one). Raises `InputError` for a
    target that is not a regular file or a directory that cannot be written."""
    target = check_target(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    except OSError as exc:
        raise InputError(str(path), None, f"cannot be written ({exc.strerror or exc})") from None
    os.close(fd)
    handed_over = False
    try:
        try:
            yield Path(tmp)
        except OSError as exc:  # e.g. disk full
            raise InputError(str(path), None, f"cannot be written ({exc.strerror or exc})") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual mode
        if _pending is not None:
            _pending.append((tmp, target))
            handed_over = True
        else:
            _rename(tmp, target, path)
    finally:
        if not handed_over and os.path.exists(tmp):
            os.unlink(tmp)


def _rename(tmp: str, target: Path, shown: str | Path) -> None:
    try:
        os.replace(tmp, target)
    except OSError as exc:
        raise InputError(str(shown), None, f"cannot be written ({exc.strerror or exc})") from None


@contextmanager
def all_or_none() -> Iterator[None]:
    """Hold every `atomic_path` rename until the block succeeds; on an error remove the
    temporary files, so either every output is written or none (nested blocks join the outer).
    Inside the block the files read are recorded (`note_input`) and never written."""
    global _pending, _inputs
    if _pending is not None:
        yield
        return
    _pending = []
    _inputs = {}
    try:
        yield
        for tmp, target in _pending:
            _rename(tmp, target, target)
    finally:
        for tmp, _ in _pending:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _pending = None
        _inputs = None


#: figure formats matplotlib writes that need a program beside it (pgf: a TeX system)
_FIGURE_FORMATS_NEEDING_TEX = frozenset({"pgf"})


def figure_formats() -> list[str]:
    """The figure formats a file may be written in: those matplotlib's Agg canvas writes by
    itself (``png``, ``pdf``, ``svg``, ``jpg``, ...; not ``pgf``, which needs TeX)."""
    from moeopt.extras import load

    canvas = load("matplotlib.backend_bases", "plot", "writing a figure").FigureCanvasBase
    return sorted(set(canvas.get_supported_filetypes()) - _FIGURE_FORMATS_NEEDING_TEX)


def figure_format(path: str | Path, option: str | None = None) -> str:
    """The format a figure at ``path`` is written in: the one its extension names (``png``
    without an extension).

    Raises
    ------
    InputError
        For an extension no figure format has (``o.txt``, ``p.docx``), naming ``option``.
    """
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    formats = figure_formats()
    if suffix not in formats:
        source, field = (None, option) if option else (str(path), None)
        where = f"{path}: " if option else ""
        raise InputError(
            source,
            field,
            f"{where}expected a figure file ending in .{', .'.join(formats)} (the format is the extension's), "
            f"found .{suffix}",
        )
    return suffix
