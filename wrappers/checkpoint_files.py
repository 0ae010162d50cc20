"""The files of a checkpoint on disk: written aside and renamed into place, sealed by a manifest, and
read back without running anything they hold.

What belongs here: the manifest (every file ``save_checkpoint`` wrote, with its size and SHA-256,
written last), the check that a path may be replaced, the swap of a finished checkpoint into place,
and the DCP reader and planner that unpickle nothing but DCP's own metadata classes. What does not:
state dicts and process groups (``wrappers.checkpoint_io``).

Why: DCP's ``FileSystemReader.read_metadata`` is ``pickle.load`` and ``DefaultLoadPlanner.load_bytes``
is ``torch.load(weights_only=False)`` (torch 2.13, ``torch/distributed/checkpoint/filesystem.py`` and
``default_planner.py``), so a crafted ``.metadata`` runs code on load. A directory is read only when
its manifest lists ``.metadata`` and every listed file has the size and hash the manifest gives, and
even then ``.metadata`` goes through an unpickler that builds only DCP's metadata dataclasses (a
manifest forged together with the files still runs nothing). Saves write into a hidden sibling
(``.NAME.partial-*``) and rename it over ``path`` only once complete, so a killed save leaves the old
checkpoint whole; a path that is not a checkpoint (a user's file, a link, a FIFO) is never replaced.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo

MANIFEST = "dp-advisor-manifest.json"
_FORMAT = "dp-advisor checkpoint manifest 1"
_MAX_MANIFEST_BYTES = 16 * 2**20
# Every name save_checkpoint writes into a sharded checkpoint directory (DCP: .metadata and __R_N.distcp).
_OUR_NAMES = re.compile(r"^(\.metadata|__\d+_\d+\.distcp|rng_rank\d+\.pt|zero1_optimizer_rank\d+\.pt|"
                        + re.escape(MANIFEST) + r")$")
_CHUNK = 8 * 2**20


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex) of a regular file, read without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        digest, size = hashlib.sha256(), 0
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def list_files(directory: Path) -> list[str]:
    """The names in a finished, not yet sealed checkpoint directory (sorted)."""
    return sorted(entry.name for entry in os.scandir(directory))


def write_manifest(directory: Path, digests: dict[str, tuple[int, str]], *, world_size: int) -> None:
    """Seal ``directory``: the manifest is the last file written, flushed before the swap."""
    content = {"format": _FORMAT, "world_size": world_size,
               "files": {name: {"bytes": size, "sha256": sha} for name, (size, sha) in sorted(digests.items())}}
    _write_durably(directory / MANIFEST, json.dumps(content, indent=1).encode())


def read_manifest(directory: Path) -> dict[str, tuple[int, str]]:
    """The files a sealed directory should hold, ``{name: (bytes, sha256)}``; ValueError when there is no
    manifest of ours (the directory was not written by ``save_checkpoint``, or the save did not finish)."""
    where = directory / MANIFEST
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ValueError(f"{directory}: not a checkpoint written by save_checkpoint (no {MANIFEST}: "
                         f"{error.strerror}); refusing to read it, since DCP's loader unpickles what it finds") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        raw = f.read(_MAX_MANIFEST_BYTES + 1) if stat.S_ISREG(info.st_mode) else b""
    try:
        content = json.loads(raw) if 0 < len(raw) <= _MAX_MANIFEST_BYTES else None
        files = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in content["files"].items()}
        assert content["format"] == _FORMAT and ".metadata" in files
        assert all(_OUR_NAMES.match(name) for name in files)  # plain names: nothing outside the directory
    except (ValueError, TypeError, KeyError, AttributeError, AssertionError, RecursionError):
        raise ValueError(f"{where}: not a manifest written by save_checkpoint; refusing to read the checkpoint") from None
    return files


def verify_files(directory: Path, expected: dict[str, tuple[int, str]]) -> list[str]:
    """What differs between ``expected`` and the files on disk (empty: all match)."""
    problems = []
    for name, (size, sha) in sorted(expected.items()):
        try:
            found = file_digest(directory / name)
        except (OSError, ValueError) as error:
            problems.append(f"{name}: {getattr(error, 'strerror', None) or error}")
            continue
        if found != (size, sha):
            problems.append(f"{name}: {found[0]} bytes with another SHA-256 than the manifest's ({size} bytes)")
    return problems


def replace_refusal(path: Path) -> str | None:
    """Why ``path`` must not be replaced by a checkpoint (None: absent, empty, or a checkpoint of ours)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link; refusing to replace it with a checkpoint (save to its target)"
    if stat.S_ISDIR(info.st_mode):
        strangers = [name for name in os.listdir(path) if not _OUR_NAMES.match(name)]
        if strangers:
            return (f"{path} is a directory holding files save_checkpoint does not write ({', '.join(strangers[:3])}); "
                    "refusing to replace it")
        return None
    if stat.S_ISREG(info.st_mode) and _is_consolidated_checkpoint(path):
        return None
    return f"{path} exists and is not a checkpoint written by save_checkpoint; refusing to replace it"


def _is_consolidated_checkpoint(path: Path) -> bool:
    """A ``torch.save`` dict with our keys; read with ``weights_only`` and ``mmap`` (no tensor data read)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any unreadable file is simply not ours
        return False
    return isinstance(state, dict) and {"model", "rng"} <= set(state)


def aside_path(path: Path, what: str) -> Path:
    """A hidden sibling of ``path`` on the same file system (so that ``os.rename`` is atomic)."""
    return path.parent / f".{path.name}.{what}-{uuid.uuid4().hex[:12]}"


def interrupted_saves(path: Path) -> list[Path]:
    """Previous checkpoints a save killed between its two renames left aside."""
    return sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []


def swap_into_place(finished: Path, path: Path) -> None:
    """Rename ``finished`` to ``path``. A file over a file is one atomic ``os.replace``; a directory is
    involved: the old checkpoint is renamed aside first and removed last, so that a kill between the
    renames leaves it whole (``load_checkpoint`` names it)."""
    if finished.is_dir():
        _fsync_directory(finished)
    if path.is_dir() or (finished.is_dir() and path.exists()):
        old = aside_path(path, "old")
        os.rename(path, old)
        os.rename(finished, path)
        _fsync_directory(path.parent)
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(finished, path)
    _fsync_directory(path.parent)


def write_file_durably(path: Path, save: Any) -> None:
    """Call ``save(file_object)`` on a fresh file at ``path`` and flush it to disk."""
    with open(path, "xb") as f:
        save(f)
        f.flush()
        os.fsync(f.fileno())


def _write_durably(path: Path, data: bytes) -> None:
    write_file_durably(path, lambda f: f.write(data))


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse to sync a directory; the renames are still in order
    finally:
        os.close(fd)


# -- reading DCP files without running them --------------------------------------------------------------

def _allowed_globals() -> dict[tuple[str, str], Any]:
    """The classes DCP's ``.metadata`` pickle names (torch 2.13): its metadata dataclasses and enums,
    ``torch.Size``, dtypes and layouts, and the path the save was given."""
    allowed = {(obj.__module__, obj.__name__): obj for obj in vars(dcp_metadata).values()
               if isinstance(obj, type) and obj.__module__ == dcp_metadata.__name__
               and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))}
    allowed[(_StorageInfo.__module__, _StorageInfo.__name__)] = _StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for cls in (Path, type(Path()), __import__("pathlib").PurePosixPath):
        allowed[(cls.__module__, cls.__name__)] = cls
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._allowed:
            return self._allowed[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's checkpoint metadata")


def read_dcp_metadata(path: Path) -> dcp_metadata.Metadata:
    """DCP's pickled ``Metadata`` at ``path``, built by ``_MetadataUnpickler``; ValueError when it names
    anything else."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError,
                KeyError, RecursionError) as error:
            raise ValueError(f"{path}: not DCP checkpoint metadata ({error}); refusing to read it") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise ValueError(f"{path}: not DCP checkpoint metadata; refusing to read it")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file system reader, with ``.metadata`` read by ``_MetadataUnpickler`` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        metadata = read_dcp_metadata(Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata"))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor items (optimizer hyper-parameters: numbers, tuples,
    strings) read by ``torch.load(weights_only=True)`` instead of ``weights_only=False``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
