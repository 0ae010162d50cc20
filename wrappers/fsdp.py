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

MoE experts: transformers stores a layer's routed experts as stacked (E, ...) tensors; ``Shard(0)`` over
more ranks than experts pads each to world x ceil(E / world) rows (``_chunk_with_empty``), so every rank
holds a whole expert. As torchtitan does (torchtitan/distributed/fsdp.py, the MoE branch of its block
loop: ``Shard(1)`` when the FSDP degree > num_experts, "to avoid padding"), ``shard_experts_on_dim1``
shards them on dim 1 then (FSDP2 refuses an uneven dim-1 split: such a tensor stays on dim 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from advisor.precision import Precision
from wrappers.blocks import find_blocks
from wrappers.precision import precision_dtypes


def mixed_precision_policy(precision: Precision, *, reduce_in_compute_dtype: bool = False) -> MixedPrecisionPolicy | None:
    """FSDP2 policy for a mixed precision: gather parameters in half precision, reduce gradients in fp32
    (``reduce_in_compute_dtype``: in half precision, as accelerate's policy does).

    ``None`` for ``fp32`` and ``bf16`` (parameters are already in the dtype they are computed in).
    """
    compute = precision_dtypes(precision).compute_dtype
    if compute is None:
        return None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=compute if reduce_in_compute_dtype else torch.float32)


def stacked_expert_params(module: nn.Module) -> list[nn.Parameter]:
    """The routed experts' stacked (E, ...) parameters under ``module``: those a module holding an int
    ``num_experts`` and a 3-D parameter owns directly whose dim 0 is E (transformers' ``*Experts`` modules;
    a router's 2-D (E, h) weight lives on a module with no 3-D parameter)."""
    found: list[nn.Parameter] = []
    for sub in module.modules():
        num = getattr(sub, "num_experts", None)
        own = list(sub.parameters(recurse=False))
        if isinstance(num, int) and any(p.ndim == 3 for p in own):
            found += [p for p in own if p.ndim >= 2 and p.shape[0] == num]
    return found


def expert_placement_fn(block: nn.Module, shard_world: int):
    """torchtitan's rule as a ``shard_placement_fn`` for ``block``: its stacked experts on ``Shard(1)`` when
    ``shard_world`` exceeds their number and divides their dim 1; None (FSDP2's ``Shard(0)``) otherwise.
    None when no parameter of ``block`` moves."""
    dim1 = {p for p in stacked_expert_params(block) if shard_world > p.shape[0] and p.shape[1] % shard_world == 0}
    if not dim1:
        return None
    return lambda param: Shard(1) if param in dim1 else None


_FINAL_NORMS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")


def _shard_outer_units(model: nn.Module, options: dict, *, head_reshards: bool) -> None:
    """torchtitan's units outside the blocks (``apply_fsdp`` ``outer_units``), on a Hugging Face model: the input
    embedding, and the final norm (the first module outside the blocks named as ``_FINAL_NORMS``) with the output
    embedding."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    inside = {id(m) for block in find_blocks(model) for m in block.modules()}
    norm = next((m for name, m in model.named_modules()
                 if name.rsplit(".", 1)[-1] in _FINAL_NORMS and id(m) not in inside), None)
    last = [m for m in (norm, head) if m is not None]
    if head is not None and head.weight is embedding.weight:  # tied: one unit, as torchtitan's weight tying
        fully_shard([embedding, *last], **{**options, "reshard_after_forward": head_reshards})
        return
    fully_shard(embedding, **options)
    if last:
        fully_shard(last, **{**options, "reshard_after_forward": head_reshards})


def apply_fsdp(
    model: nn.Module,
    *,
    reshard_after_forward: bool,
    precision: Precision,
    cpu_offload: bool,
    mesh: DeviceMesh | None = None,
    blocks: Sequence[nn.Module] | None = None,
    shard_experts_on_dim1: bool = True,
    reduce_in_compute_dtype: bool = False,
    root_reshard_after_forward: bool | None = None,
    outer_units: bool = False,
) -> nn.Module:
    """``fully_shard`` each block of ``model`` and then ``model`` itself, in place; returns ``model``.

    ``blocks`` defaults to ``find_blocks(model)`` (after activation checkpointing, the wrappers).
    ``mesh`` defaults to FSDP2's own default: a 1-D mesh over the world, on CUDA when available.
    ``precision="bf16"`` expects a model already cast to bf16 (``apply_recipe`` does it). The
    parameters are replaced by ``DTensor`` parameters: rebuild any optimizer afterwards
    (``optim.rebuild_optimizer``). With ``cpu_offload`` the optimizer must step on CPU tensors,
    which it does when built on the offloaded parameters. ``shard_experts_on_dim1``: MoE experts on dim 1
    over more ranks than experts (the module docstring); False: FSDP2's dim 0 everywhere (accelerate's
    ``fsdp2_prepare_model`` and Lightning pass no ``shard_placement_fn``). ``reduce_in_compute_dtype``: reduce-scatter
    gradients in bf16/fp16 (accelerate's policy) instead of fp32. ``root_reshard_after_forward``: the root's own
    setting (None: ``reshard_after_forward``); False keeps the root unsharded from its forward to its backward, as
    torch before 2.8 did with any setting (pytorch#154704). ``outer_units``: torchtitan's layout
    (``apply_fsdp_to_decoder``): the token embedding a unit of its own, resharded after forward as the blocks are,
    and the final norm with the head another, resharded after forward as ``root_reshard_after_forward`` says
    (False: torchtitan's default policy; None: as the blocks, its ``always`` policy), both before the blocks; a tied embedding and head share one unit with the
    norm. The root then holds no parameter of its own.
    """
    policy = mixed_precision_policy(precision, reduce_in_compute_dtype=reduce_in_compute_dtype)
    offload: OffloadPolicy = OffloadPolicy()
    if cpu_offload:
        pin = torch.accelerator.is_available() if mesh is None else mesh.device_type != "cpu"
        offload = CPUOffloadPolicy(pin_memory=pin)
    options = dict(mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    if policy is not None:
        options["mp_policy"] = policy
    world = mesh.size(mesh.ndim - 1) if mesh is not None else torch.distributed.get_world_size()
    if outer_units:
        _shard_outer_units(model, options, head_reshards=(reshard_after_forward if root_reshard_after_forward is None
                                                          else root_reshard_after_forward))
    for block in find_blocks(model) if blocks is None else blocks:
        placement = expert_placement_fn(block, world) if shard_experts_on_dim1 else None
        fully_shard(block, **options, **({} if placement is None else {"shard_placement_fn": placement}))
    if root_reshard_after_forward is not None:
        options["reshard_after_forward"] = root_reshard_after_forward
    fully_shard(model, **options)
    return model
