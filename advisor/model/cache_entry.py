"""One cache entry on disk: read only from a regular file, written atomically, checked before use.

The spec cache (``advisor.model.spec_cache``) and the profile cache (``advisor.simulate.profile_cache``)
keep JSON files in the user's cache directory. What belongs here is how such a file is read and
written, not what it holds.

Reading opens the file with ``O_NOFOLLOW | O_NONBLOCK`` and keeps it only when ``fstat`` says it is
a regular file of at most ``MAX_BYTES``: a symbolic link (to ``/dev/zero``, to a user's file), a FIFO
(which would block ``open`` and ``read`` forever) or a directory is a miss. Writing goes to a fresh
``mkstemp`` file in the same directory, renamed over the entry (``os.replace`` replaces a link
itself, never its target). A subdirectory that is a link is neither read nor written.

Each file is an envelope: a schema tag, the entry's kind and file name (so an entry copied to
another name is a miss), and the SHA-256 of the entry's canonical JSON. An entry edited by hand, cut
short by a full disk or written by another release is a miss, and the caller counts or traces again.
The checksum finds damage, not a forger who recomputes it: the caller's pydantic model still
validates what it reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

SCHEMA = "dp-advisor cache 1"
MAX_BYTES = 4 * 2**20  # a spec is a few kB, a profile under 1 kB


def _digest(entry: dict) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _real_directory(directory: Path) -> bool:
    try:
        return stat.S_ISDIR(directory.lstat().st_mode)
    except OSError:
        return False


def read_entry(path: Path, *, kind: str) -> dict | None:
    """The entry stored at ``path`` under ``kind``, or None when absent, not a regular file, too large,
    not our envelope, for another file name, or damaged."""
    if not _real_directory(path.parent):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
                return None
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    try:
        envelope = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("entry"), dict):
        return None
    if (envelope.get("schema"), envelope.get("kind"), envelope.get("name")) != (SCHEMA, kind, path.name):
        return None
    return envelope["entry"] if envelope.get("sha256") == _digest(envelope["entry"]) else None


def write_entry(path: Path, entry: dict, *, kind: str) -> None:
    """Store ``entry`` at ``path`` atomically; a cache that cannot be written costs only speed."""
    envelope = {"schema": SCHEMA, "kind": kind, "name": path.name, "sha256": _digest(entry), "entry": entry}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not _real_directory(path.parent):
            return
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(envelope, f, indent=1)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
