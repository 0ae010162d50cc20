"""ZeRO stages 2 and 3 (and their CPU-offload variants) with FSDP2, ``torch.distributed.fsdp.fully_shard``.

Each block is sharded as its own FSDP unit, then the root (embeddings, final norm, head). Parameters
become ``DTensor`` shards on every rank (``Shard(0)``); gradients are reduce-scattered, so the
optimizer state lives on the local shards only. ``reshard_after_forward`` is the ZeRO stage:

- ``False`` (ZeRO-2): a unit's gathered parameters stay from forward to backward; the sharded
  gradients and optimizer state are what is saved.
- ``True`` (ZeRO-3): they are freed after each unit's forward and gathered again in backward.
  FSDP2 never reshards the root after forward (``FSDPState._lazy_init``), whatever is asked.

Offload is ``CPUOffloadPolicy``: FSDP2 keeps the sharded *parameters*, their gradients and hence
the optimizer state on CPU (there is no gradient-only or optimizer-only offload in FSDP2), copies a
unit's shards to the device just before its all-gather, and the optimizer step runs on CPU. Memory
is pinned only when the mesh is on an accelerator (``pin_memory()`` needs one).

The dtypes come from ``wrappers.precision`` (``advisor.precision``'s table).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from advisor.precision import Precision
from wrappers.blocks import find_blocks
from wrappers.precision import precision_dtypes


def mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy | None:
    """FSDP2 policy for a mixed precision: gather parameters in half precision, reduce gradients in fp32.

    ``None`` for ``fp32`` and ``bf16`` (parameters are already in the dtype they are computed in).
    """
    compute = precision_dtypes(precision).compute_dtype
    return None if compute is None else MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)


def apply_fsdp(
    model: nn.Module,
    *,
    reshard_after_forward: bool,
    precision: Precision,
    cpu_offload: bool,
    mesh: DeviceMesh | None = None,
    blocks: Sequence[nn.Module] | None = None,
) -> nn.Module:
    """``fully_shard`` each block of ``model`` and then ``model`` itself, in place; returns ``model``.

    ``blocks`` defaults to ``find_blocks(model)`` (after activation checkpointing, the wrappers).
    ``mesh`` defaults to FSDP2's own default: a 1-D mesh over the world, on CUDA when available.
    ``precision="bf16"`` expects a model already cast to bf16 (``apply_recipe`` does it). The
    parameters are replaced by ``DTensor`` parameters: rebuild any optimizer afterwards
    (``optim.rebuild_optimizer``). With ``cpu_offload`` the optimizer must step on CPU tensors,
    which it does when built on the offloaded parameters.
    """
    policy = mixed_precision_policy(precision)
    offload: OffloadPolicy = OffloadPolicy()
    if cpu_offload:
        pin = torch.accelerator.is_available() if mesh is None else mesh.device_type != "cpu"
        offload = CPUOffloadPolicy(pin_memory=pin)
    options = dict(mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    if policy is not None:
        options["mp_policy"] = policy
    for block in find_blocks(model) if blocks is None else blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model
