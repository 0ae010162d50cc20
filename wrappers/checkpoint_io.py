"""Save and load model (and optimizer) checkpoints under every strategy, consolidated or sharded.

Two layouts:

- consolidated (``sharded=False``): one ``torch.save`` file holding the full, unsharded state dicts,
  written by rank 0 only. Built with ``torch.distributed.checkpoint.state_dict.get_model_state_dict``
  / ``get_optimizer_state_dict`` and ``StateDictOptions(full_state_dict=True, cpu_offload=True)``
  (which gathers FSDP2 shards and leaves the result on rank 0); loaded by rank 0 and broadcast with
  ``broadcast_from_rank0=True``. Readable by plain ``torch.load`` and any world size.
- sharded (``sharded=True``): a directory written by ``torch.distributed.checkpoint.save`` (DCP),
  every rank writing its own shards (replicated DDP tensors are written once); loads at any world
  size with ``dcp.load``. ``path`` must be on a file system every rank sees.

``ZeroRedundancyOptimizer`` is outside DCP's state-dict API: consolidated, its
``consolidate_state_dict(to=0)`` result is saved and broadcast back; sharded, each rank saves its
local partition (``zero1_optimizer_rank{R}.pt`` next to the DCP files), which loads only at the same
world size (checked).

``sharded`` may be left out: ``save_checkpoint`` then writes the layout that matches the model
(sharded when its parameters are FSDP2 ``DTensor`` shards, so no rank gathers the whole model;
consolidated otherwise), and ``load_checkpoint`` reads the layout it finds at ``path`` (a directory:
sharded; a file: consolidated), as rank 0 sees it.

Both layouts also hold every rank's random number generator states (``rng_state``: torch CPU and
CUDA, Python, NumPy), restored by ``load_checkpoint``, so that a resumed run draws the same dropout
masks as an uninterrupted one. Consolidated: gathered into the file (``"rng"``, one entry per
rank); sharded: ``rng_rank{R}.pt`` next to the DCP files. Loading at another world size restores
saved rank r's state on rank r where there is one, with a warning.

Both are written aside and renamed into place once complete (a killed save leaves the previous
checkpoint loadable), and neither replaces a path that is not a checkpoint. A sharded directory is
sealed by a manifest of its files' hashes, written last, and ``load_checkpoint`` reads no byte of a
directory whose manifest is missing or does not match; DCP's pickled ``.metadata`` is then read by
an unpickler that builds only DCP's metadata classes (``wrappers.checkpoint_files``). A consolidated
file is read with ``torch.load(weights_only=True)``, which runs nothing.

Every function is collective: call it on every rank. Without a process group it works in one process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from wrappers.checkpoint_files import (
    SafeLoadPlanner,
    SafeReader,
    aside_path,
    file_digest,
    interrupted_saves,
    list_files,
    read_dcp_metadata,
    read_manifest,
    replace_refusal,
    swap_into_place,
    verify_files,
    write_file_durably,
    write_manifest,
)
from wrappers.rng_state import capture_rng_state, restore_rng_state

_ZERO_FILE = "zero1_optimizer_rank{rank}.pt"
# Sharded optimizer state is saved flattened (``param_groups.<name>.lr``, one key per parameter, as
# torchtitan does): nested ``param_groups`` lists are one object per rank, and where ranks hold
# different parameters (pipeline stages) DCP kept one rank's list and the others loaded it.
_SHARDED_OPTIMIZER = StateDictOptions(flatten_optimizer_state_dict=True)
_RNG_FILE = "rng_rank{rank}.pt"


def save_checkpoint(
    model: nn.Module, path: str | os.PathLike, *, sharded: bool | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Save ``model`` (and ``optimizer``, and every rank's RNG state) to ``path``: a file
    (consolidated) or a directory (sharded). ``sharded=None``: sharded for an FSDP2 model."""
    path = Path(path)
    if sharded is None:
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
    refusal = _broadcast(replace_refusal(path) if _rank() == 0 else None)  # every rank raises, none waits
    if refusal is not None:
        raise FileExistsError(refusal)
    if sharded:
        _save_sharded(model, path, optimizer)
    else:
        _save_consolidated(model, path, optimizer)
    _barrier()


def load_checkpoint(
    model: nn.Module, path: str | os.PathLike, *, sharded: bool | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Load what ``save_checkpoint`` wrote into ``model`` (and ``optimizer``), already wrapped, in
    place, and restore this rank's RNG state. ``sharded=None``: the layout found at ``path``."""
    path = Path(path)
    left = _broadcast([str(p) for p in interrupted_saves(path)] if _rank() == 0 and not path.exists() else [])
    if left:
        raise ValueError(f"{path}: absent; a save was interrupted while replacing it and left the previous "
                         f"checkpoint at {left[-1]} (rename it to {path.name} to load it)")
    if sharded is None:
        sharded = _broadcast(path.is_dir() if _rank() == 0 else None)
    if sharded:
        _load_sharded(model, path, optimizer)
    else:
        _load_consolidated(model, path, optimizer)
    _barrier()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """Silence DCP's warning that it runs in one process: without a process group that is intended."""
    with warnings.catch_warnings():
        if not _distributed():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _broadcast(obj: Any) -> Any:
    """``obj`` from rank 0 on every rank (pickled; small objects only)."""
    if not _distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather_all(obj: Any) -> list:
    """Every rank's ``obj``, on every rank."""
    if not _distributed():
        return [obj]
    out: list = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _gather_rng() -> list | None:
    """Every rank's RNG state, on rank 0 (None elsewhere)."""
    if not _distributed():
        return [capture_rng_state()]
    states = [None] * _world() if _rank() == 0 else None
    dist.gather_object(capture_rng_state(), states, dst=0)
    return states


def _restore_rank_rng(states: list | None, where: Path) -> None:
    """Restore this rank's entry of ``states`` (one per saving rank); warn when the world size changed."""
    if states is None:
        warnings.warn(f"{where}: no RNG state saved for rank {_rank()}; its random draws will not repeat the "
                      "interrupted run's",
                      stacklevel=3)
        return
    if len(states) != _world() and _rank() == 0:
        warnings.warn(f"{where}: RNG states were saved by {len(states)} ranks and load on {_world()}; rank r "
                      "restores saved rank r's state where there is one", stacklevel=3)
    if _rank() < len(states) and states[_rank()] is not None:
        restore_rng_state(states[_rank()])


def _save_consolidated(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=options), "rng": _gather_rng()}
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        if _rank() == 0:
            state["optimizer"] = optimizer.state_dict()
    elif optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=options)
    if _rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = aside_path(path, "partial")
        try:
            write_file_durably(partial, lambda f: torch.save(state, f))
            swap_into_place(partial, path)
        finally:
            partial.unlink(missing_ok=True)


def _load_consolidated(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    state: dict[str, Any] = {}
    if _rank() == 0:
        state = torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else {}
    keys = _broadcast(sorted(state))  # every rank raises the same error, none waits forever
    needed = ["model"] + (["optimizer"] if optimizer is not None else [])
    if any(key not in keys for key in needed):
        raise ValueError(f"{path}: no consolidated checkpoint with {' and '.join(needed)} (found {keys or 'nothing'})")
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=_distributed())
    set_model_state_dict(model, state.get("model", {}), options=options)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.load_state_dict(_broadcast(state.get("optimizer")))
    elif optimizer is not None and not _broadcast(bool(state.get("optimizer", {}).get("state"))):
        _set_hyperparameters(optimizer, _broadcast(state.get("optimizer", {}).get("param_groups")))
    elif optimizer is not None:
        groups = _broadcast(state.get("optimizer", {}).get("param_groups"))
        if groups is not None and len(groups) == len(optimizer.param_groups):
            _check_same_settings(optimizer, groups)
        set_optimizer_state_dict(model, optimizer, state.get("optimizer", {}), options=options)
    _restore_rank_rng(_broadcast(state.get("rng")), path)


def _set_hyperparameters(optimizer: torch.optim.Optimizer, groups: list[dict]) -> None:
    """A stateless optimizer (plain SGD): only its groups' hyper-parameters to restore. torch 2.13's
    ``set_optimizer_state_dict(full_state_dict=True)`` fails on it ("Expected device to be set": it
    looks for the device among state tensors, and there are none)."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(groups)} param groups, this one "
                         f"{len(optimizer.param_groups)}")
    _check_same_settings(optimizer, groups)
    for group, saved in zip(optimizer.param_groups, groups):
        group.update({key: value for key, value in saved.items() if key != "params"})


def _check_same_settings(optimizer: torch.optim.Optimizer, groups: list[dict]) -> None:
    """Refuse a checkpoint written by another optimizer class: its hyper-parameter names differ (SGD's
    ``momentum`` / ``dampening`` against AdamW's ``betas``), and copying them over would, for example,
    set AdamW's learning rate to SGD's."""
    ignored = {"params", "param_names"}
    for index, (group, saved) in enumerate(zip(optimizer.param_groups, groups)):
        theirs, ours = set(saved) - ignored, set(group) - ignored
        if theirs != ours:
            differ = sorted(theirs ^ ours)
            raise ValueError(f"the checkpoint's optimizer is not a {type(optimizer).__name__}: param group {index} "
                             f"differs in {', '.join(differ[:4])}; load it into the optimizer class that saved it")


def _save_sharded(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=_SHARDED_OPTIMIZER)
    partial = None
    if _rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = aside_path(path, "partial")
        partial.mkdir()
    partial = Path(_broadcast(str(partial)))
    try:
        with _single_process_quietly():
            dcp.save(state, checkpoint_id=partial, no_dist=not _distributed())
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            local = {"world_size": optimizer.world_size, "optimizer": optimizer.optim.state_dict()}
            write_file_durably(partial / _ZERO_FILE.format(rank=optimizer.rank), lambda f: torch.save(local, f))
        saved = {"world_size": _world(), "rng": capture_rng_state()}
        write_file_durably(partial / _RNG_FILE.format(rank=_rank()), lambda f: torch.save(saved, f))
        _barrier()
        _seal(partial, path)
    finally:
        if _rank() == 0 and partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _seal(partial: Path, path: Path) -> None:
    """Hash the finished files (each rank a share), write the manifest last, rename into place."""
    names = _broadcast(list_files(partial) if _rank() == 0 else None)
    digests: dict = {}
    for share in _gather_all({name: file_digest(partial / name) for name in names[_rank()::_world()]}):
        digests.update(share)
    if _rank() == 0:
        write_manifest(partial, digests, world_size=_world())
        swap_into_place(partial, path)


def _verify(path: Path) -> None:
    """Raise ValueError on every rank unless ``path`` holds exactly what its manifest lists (each rank
    hashes a share of the files)."""
    expected: Any = None
    if _rank() == 0:
        try:
            expected = read_manifest(path)
            problems = verify_files(path, {".metadata": expected[".metadata"]})
            if problems:
                raise ValueError(f"{path}: the files differ from the manifest save_checkpoint wrote "
                                 f"({problems[0]}); refusing to load it")
            read_dcp_metadata(path / ".metadata")  # a forged manifest: still only DCP's own classes
        except ValueError as error:
            expected = str(error)
    expected = _broadcast(expected)
    if isinstance(expected, str):
        raise ValueError(expected)
    names = sorted(expected)[_rank()::_world()]
    problems = [p for share in _gather_all(verify_files(path, {n: expected[n] for n in names})) for p in share]
    if problems:
        raise ValueError(f"{path}: the files differ from the manifest save_checkpoint wrote "
                         f"({'; '.join(problems[:3])}); refusing to load it")


def _load_sharded(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    _verify(path)  # before DCP reads a byte
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=_SHARDED_OPTIMIZER)
    with _single_process_quietly():
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(), no_dist=not _distributed())
    set_model_state_dict(model, state["model"])
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        _load_zero_partition(optimizer, path)
    elif optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=_SHARDED_OPTIMIZER)
    _load_rank_rng(path)


def _load_rank_rng(path: Path) -> None:
    file = path / _RNG_FILE.format(rank=_rank())
    saved = torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None
    if saved is None:
        _restore_rank_rng(None, path)
        return
    states: list = [None] * saved["world_size"]
    if _rank() < len(states):
        states[_rank()] = saved["rng"]
    _restore_rank_rng(states, path)


def _load_zero_partition(optimizer: ZeroRedundancyOptimizer, path: Path) -> None:
    file = path / _ZERO_FILE.format(rank=optimizer.rank)
    local = torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None
    saved_world = None if local is None else local["world_size"]
    if saved_world != optimizer.world_size:
        raise ValueError(
            f"{path}: sharded ZeroRedundancyOptimizer state was saved by {saved_world} ranks, "
            f"loading on {optimizer.world_size}; save a consolidated checkpoint to change world size"
        )
    optimizer.optim.load_state_dict(local["optimizer"])
    # ZeroRedundancyOptimizer.step copies its exposed groups onto the local ones: align them first.
    for exposed, loaded in zip(optimizer.param_groups, optimizer.optim.param_groups):
        exposed.update({key: value for key, value in loaded.items() if key != "params"})
