"""Writing an exported file safely: never clobber, never leave a half-written file.

The text goes to a temporary file in the destination's directory (same filesystem), is flushed
and fsynced, then ``os.replace``d onto the destination, which is atomic on POSIX and Windows: a
reader sees the old file or the new one, never a mix. An existing file is replaced only with
``force=True``; one whose content is already identical is left alone (re-exporting the same plan
is not an overwrite).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_export(path: str | os.PathLike[str], text: str, *, force: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically and return the path; ValueError on a directory or an existing file."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{target} is a directory; give a file name, e.g. {target / 'accelerate_config.yaml'}")
    if target.exists():
        if target.read_text(encoding="utf-8", errors="replace") == text:
            return target
        if not force:
            raise ValueError(f"{target} already exists; pass --force to overwrite it")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
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
    return target


def _umask() -> int:
    """The process umask (read by setting and restoring it; there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
