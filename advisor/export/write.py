"""Writing an exported file safely: never clobber, never leave a half-written file.

The text goes to a temporary file in the destination's directory (same filesystem), is flushed
and fsynced, then ``os.replace``d onto the destination, which is atomic on POSIX and Windows: a
reader sees the old file or the new one, never a mix. An existing file is replaced only with
``force=True``; one whose content is already identical is left alone (re-exporting the same plan
is not an overwrite). Only a regular file is ever read or replaced: a FIFO, a device (``/dev/null``,
``/dev/full``) or ``/dev/stdout`` is refused before it is opened (reading a FIFO blocks until a
writer comes; a device never ends), and the comparison reads at most one byte more than the new text.
A symbolic link is refused too: ``os.replace`` would replace the link itself, so ``-o /dev/stdout``
with stdout redirected to a file (``/dev/stdout -> /proc/self/fd/1``, a regular file once
followed) would turn the system's ``/dev/stdout`` link into a plain file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


#: How a command that writes a chart names its file (``--chart``, ``--timeline``): no stdout, an .svg or .html name.
CHART = {"example": "chart.svg", "stdout": None}


def check_destination(path: str | os.PathLike[str], *, force: bool = False, example: str = "chart.svg",
                      stdout: str | None = None) -> Path:
    """What ``write_export`` would refuse, checked before a long computation produces the text: an
    existing file without ``force`` is refused here even if the new text would turn out identical."""
    target = _writable(path, example=example, stdout=stdout)
    if target.exists() and not force:
        raise ValueError(f"{target} already exists; pass --force to overwrite it")
    return target


def check_writable(path: str | os.PathLike[str], *, example: str = "accelerate_config.yaml",
                   stdout: str | None = "-o -") -> Path:
    """What ``write_export`` refuses whatever the file holds and whatever ``force`` says (an empty name, a directory,
    a link, a pipe or device, a missing directory), checked before anything is planned or written: ``advisor launch``
    and its ``--dry-run`` run this same check on ``--config-file``."""
    return _writable(path, example=example, stdout=stdout)


def _writable(path: str | os.PathLike[str], *, example: str = "accelerate_config.yaml",
              stdout: str | None = "-o -") -> Path:
    """``path`` unless it is empty, a directory (or names one with a trailing slash), a link, a non-regular
    file or in a missing directory. ``example`` names a file the command writes; ``stdout``, how it prints to
    stdout instead (None: it does not)."""
    text = os.fspath(path)
    instead = f", or {stdout} for stdout" if stdout else ""
    if not str(text).strip():
        raise ValueError(f"the file name is empty: give a file name{instead}")
    target = Path(text)
    if str(text).endswith(("/", os.sep)) or target.is_dir():  # Path drops the slash: "newdir/" -> "newdir"
        raise ValueError(f"{text} names a directory; give a file name, e.g. {target / example}")
    if target.is_symlink():
        raise ValueError(f"{target} is a symbolic link; give the file it points to{instead}")
    if target.exists():
        if not stat.S_ISREG(target.stat().st_mode):
            raise ValueError(f"{target} exists and is not a regular file (a pipe, device or terminal); "
                             f"give a file name{instead}")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{parent} is a file, not a directory" if parent.exists() else f"directory {parent} does not exist")
    return target


def write_export(path: str | os.PathLike[str], text: str, *, force: bool = False, example: str = "accelerate_config.yaml",
                 stdout: str | None = "-o -") -> Path:
    """Write ``text`` to ``path`` atomically and return the path; ValueError on a directory or an existing file
    (``example`` and ``stdout`` as ``_writable`` says them: ``**CHART`` for a chart)."""
    return write_or_keep(path, text, force=force, example=example, stdout=stdout)[0]


def written(path: Path, changed: bool) -> str:
    """What a command says of ``write_or_keep``'s file: it wrote it, or the file held that text already."""
    return f"wrote {path}" if changed else f"kept {path}, which holds this already"


def write_or_keep(path: str | os.PathLike[str], text: str, *, force: bool = False,
                  example: str = "accelerate_config.yaml", stdout: str | None = "-o -") -> tuple[Path, bool]:
    """``write_export``, and whether the file was written (False: it held exactly ``text`` and is left as it was)."""
    target = _writable(path, example=example, stdout=stdout)
    if target.exists():
        if _same_content(target, text):
            return target, False
        if not force:
            raise ValueError(f"{target} already exists; pass --force to overwrite it")
    parent = target.parent if str(target.parent) else Path(".")
    try:  # the file is written beside the target and renamed onto it: a directory that takes no new file says so
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as err:
        raise ValueError(f"cannot write {target}: {err.strerror or err} in {parent}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target, True


def _same_content(path: Path, text: str) -> bool:
    """Whether ``path`` holds exactly ``text``, reading no more than ``len(text)`` + 1 bytes."""
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            return handle.read(len(data) + 1) == data
    except OSError as err:  # a file that cannot be read back (/proc/self/mem): not one to replace either
        raise ValueError(f"cannot read {path} to compare it: {err.strerror or err}; give another file name") from None


def _umask() -> int:
    """The process umask (read by setting and restoring it; there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
