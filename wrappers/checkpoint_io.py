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

Every function is collective: call it on every rank. Without a process group it works in one process.
"""

from __future__ import annotations

import contextlib
import os
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

_ZERO_FILE = "zero1_optimizer_rank{rank}.pt"


def save_checkpoint(
    model: nn.Module, path: str | os.PathLike, *, sharded: bool, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Save ``model`` (and ``optimizer``) to ``path``: a file (consolidated) or a directory (sharded)."""
    path = Path(path)
    if sharded:
        _save_sharded(model, path, optimizer)
    else:
        _save_consolidated(model, path, optimizer)
    _barrier()


def load_checkpoint(
    model: nn.Module, path: str | os.PathLike, *, sharded: bool, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Load what ``save_checkpoint`` wrote into ``model`` (and ``optimizer``), already wrapped, in place."""
    path = Path(path)
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


def _save_consolidated(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=options)}
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        if _rank() == 0:
            state["optimizer"] = optimizer.state_dict()
    elif optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=options)
    if _rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)


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
    elif optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state.get("optimizer", {}), options=options)


def _save_sharded(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    with _single_process_quietly():
        dcp.save(state, checkpoint_id=path, no_dist=not _distributed())
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        local = {"world_size": optimizer.world_size, "optimizer": optimizer.optim.state_dict()}
        torch.save(local, path / _ZERO_FILE.format(rank=optimizer.rank))


def _load_sharded(model: nn.Module, path: Path, optimizer: torch.optim.Optimizer | None) -> None:
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    with _single_process_quietly():
        dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
    set_model_state_dict(model, state["model"])
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        _load_zero_partition(optimizer, path)
    elif optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


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
