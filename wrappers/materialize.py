"""Give a meta-device model, already split by TP and FSDP2, real storage for this rank's shards only.

``materialize(model, device=..., checkpoint=dir | None)``:

1. ``model.to_empty(device=...)``: every ``DTensor`` parameter allocates only its local shard;
2. then either loads a Hugging Face checkpoint directory (``model.safetensors`` or the shards named by
   ``model.safetensors.index.json``) or initialises.

Loading: for each parameter, the slice of the global tensor this rank owns is computed from its
DTensor mesh and placements (``compute_local_shape_and_global_offset``, the function DCP uses to
write the same shards), read with ``safetensors.safe_open(file).get_slice(name)[slices]`` and copied
into the local shard. A file is opened once per tensor and closed at once, so the memory map never
keeps more than the tensor being read resident; no process ever holds the whole model.

Initialising: module by module, the module's parameters are swapped for full-size temporaries, the
model's own rule runs on them (transformers' ``_init_weights``, else ``reset_parameters``) under a
generator seeded from ``seed`` and the module's name, and each rank keeps its slice. Every rank
therefore draws the same full tensor: replicas (dp_replicate, and TP for replicated parameters)
agree, and the values do not depend on the mesh. The peak is one module's full parameters.

Buffers (rotary ``inv_freq``) are recomputed in both cases by the module's own init rule.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from wrappers.optim import canonical_param_name


def local_slices(param: torch.Tensor) -> tuple[slice, ...]:
    """Index of this rank's shard of ``param`` in the global tensor (everything for a plain tensor)."""
    if not isinstance(param, DTensor):
        return tuple(slice(0, size) for size in param.shape)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape))


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _unique_params(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(checkpoint name, parameter), once per parameter (a tied head comes under the embedding's name)."""
    for name, param in model.named_parameters():
        yield canonical_param_name(name), param


def _init_rule(model: nn.Module):
    if hasattr(model, "_init_weights") and hasattr(model, "config"):
        return model._init_weights
    return lambda module: module.reset_parameters() if hasattr(module, "reset_parameters") else None


@contextmanager
def _full_size(module: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Swap ``module``'s own parameters for full-size CPU temporaries, yielding them by name."""
    originals = dict(module._parameters)
    full = {name: torch.empty(p.shape, dtype=p.dtype) for name, p in originals.items() if p is not None}
    for name, tensor in full.items():
        module._parameters[name] = nn.Parameter(tensor, requires_grad=False)
    try:
        yield full
    finally:
        module._parameters.update(originals)


def _seed_for(name: str, seed: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def initialize(model: nn.Module, *, seed: int = 0) -> None:
    """Initialise every parameter shard and buffer in place (see the module docstring)."""
    rule = _init_rule(model)
    done: set[int] = set()
    for name, module in model.named_modules():
        own = [p for p in module._parameters.values() if p is not None and id(p) not in done]
        if not own and not list(module.buffers(recurse=False)):
            continue
        torch.manual_seed(_seed_for(canonical_param_name(name), seed))
        originals = dict(module._parameters)
        with _full_size(module) as full:
            rule(module)
        for key, param in originals.items():
            if param is not None and id(param) not in done:
                _local(param).copy_(full[key][local_slices(param)])
                done.add(id(param))
    _tie(model)


def _tie(model: nn.Module) -> None:
    if hasattr(model, "tie_weights") and hasattr(model, "config"):
        model.tie_weights()


def checkpoint_files(directory: str | Path) -> dict[str, Path]:
    """Tensor name -> safetensors file of a Hugging Face checkpoint directory."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    if not single.is_file():
        raise ValueError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(single, framework="pt") as handle:
        return {name: single for name in handle.keys()}


@torch.no_grad()
def load_safetensors(model: nn.Module, directory: str | Path) -> None:
    """Fill each parameter's local shard from the checkpoint, reading only the owned slice."""
    from safetensors import safe_open

    files = checkpoint_files(directory)
    missing = [name for name, _ in _unique_params(model) if name not in files]
    if missing:
        raise ValueError(f"{directory}: the checkpoint has no tensor {missing[0]} ({len(missing)} missing)")
    for name, param in _unique_params(model):
        with safe_open(files[name], framework="pt") as handle:
            part = handle.get_slice(name)
            if list(part.get_shape()) != list(param.shape):
                raise ValueError(f"{directory}: {name} has shape {part.get_shape()}, the model {list(param.shape)}")
            _local(param).copy_(part[local_slices(param)])


@torch.no_grad()
def _init_buffers(model: nn.Module) -> None:
    """Recompute buffers (rotary frequencies) that ``to_empty`` left uninitialised."""
    rule = _init_rule(model)
    for module in model.modules():
        if list(module.buffers(recurse=False)) and not list(module.parameters(recurse=False)):
            rule(module)


def materialize(model: nn.Module, *, device: torch.device | str, checkpoint: str | Path | None = None,
                seed: int = 0) -> nn.Module:
    """Allocate this rank's shards on ``device`` and load ``checkpoint`` or initialise; returns ``model``."""
    model.to_empty(device=device)
    if checkpoint is None:
        initialize(model, seed=seed)
    else:
        load_safetensors(model, checkpoint)
        _init_buffers(model)
    return model
