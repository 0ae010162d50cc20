"""``apply_mesh``: TP, activation checkpointing, then FSDP2 / HSDP on a ``ParallelDims`` mesh, and the
meta-device materialisation; ``wrap(mesh=...)`` calls it, and so can a training script directly.

The order is torchtitan's (``parallelize_llama``): tensor parallelism first (it replaces the linear
weights by TP ``DTensor`` shards), activation checkpointing of the blocks, the recipe's per-block
``torch.compile`` (``wrappers.compile_float8.apply_compile``; refused with tp or cp > 1, see ``apply_mesh``),
then ``fully_shard`` of
each block and the root on the data-parallel mesh, which shards the TP shards again over dp_shard
(x cp) and, for HSDP, replicates over dp_replicate. A model on the meta device is then materialised
rank by rank (``wrappers.materialize``): only after sharding, so no rank allocates more than its
shards. The FSDP2 settings (mixed precision policy, reshard after forward, offload) are the
recipe's, through ``wrappers.fsdp.apply_fsdp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from advisor.mesh import ParallelDims
from wrappers.blocks import find_blocks
from wrappers.checkpointing import apply_activation_checkpointing
from wrappers.fsdp import apply_fsdp
from wrappers.materialize import materialize
from wrappers.mesh import Meshes, build_meshes
from wrappers.optim import param_group_names, rebuild_optimizer
from wrappers.recipe import Recipe
from wrappers.tensor_parallel import apply_tensor_parallel


@dataclass(frozen=True)
class MeshApplied:
    """What ``apply_mesh`` built: the model, the optimizer to step, the meshes and the TP plan's source."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    meshes: Meshes
    tp_plan: str
    tp_modules: tuple[str, ...]


def is_meta(model: nn.Module) -> bool:
    """Whether ``model`` was built on the meta device (parameters with no storage)."""
    return any(p.is_meta for p in model.parameters())


def model_from_config(config) -> nn.Module:
    """A causal LM of a transformers ``PretrainedConfig`` on the meta device (no storage at all)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def mesh_compile_problem(dims: ParallelDims) -> str | None:
    """Why per-block compile is not applied on ``dims`` (None: it is). With tp > 1 the compiled blocks left the
    embedding without a gradient (gloo, torch 2.13: tests/wrappers/test_mesh_compile.py keeps that finding);
    context parallelism runs on CUDA only, where compiling it was not checked."""
    if dims.tp > 1 or dims.cp > 1:
        return (f"compile on a {dims.label} mesh is not applied by wrap(): with tp > 1 the compiled blocks left the "
                "embedding without a gradient (measured on torch 2.13), and cp > 1 was not checked compiled; "
                "compile with tp = cp = 1 (FSDP2, HSDP)")
    return None


def apply_mesh(model: nn.Module, dims: ParallelDims, recipe: Recipe, *, device: torch.device,
               optimizer: torch.optim.Optimizer | None = None, checkpoint: str | Path | None = None,
               seed: int = 0) -> MeshApplied:
    """Apply ``dims`` and ``recipe`` to ``model`` (see the module docstring); the optimizer is rebuilt.

    ``checkpoint`` (a Hugging Face safetensors directory) and ``seed`` only matter for a meta model.
    """
    if recipe.spec.applier != "fsdp":
        raise ValueError(f"a {dims.label} mesh shards with FSDP2; strategy {recipe.strategy!r} does not")
    if recipe.float8:  # torchtitan swaps in torchao's float8 TP styles for it; not done here
        raise ValueError(f"float8 on a device mesh ({dims.label}) is not applied by wrap(): only on the data-parallel path")
    problem = mesh_compile_problem(dims) if recipe.compile else None
    if problem:
        raise ValueError(problem)
    if checkpoint is not None and not is_meta(model):
        raise ValueError("checkpoint= loads into a model built on the meta device; this one has weights already")
    meshes = build_meshes(dims, device_type=device.type)
    names = param_group_names(optimizer, model) if optimizer is not None else None
    if recipe.precision == "bf16" and recipe.cast_model:
        model.to(torch.bfloat16)
    source, tp_modules = apply_tensor_parallel(model, meshes.tp)
    if recipe.checkpointing != "off":
        apply_activation_checkpointing(model, blocks=find_blocks(model), selective=recipe.checkpointing == "selective")
    if recipe.compile:  # after TP and checkpointing, before FSDP: torchtitan's order (parallelize_llama)
        from wrappers.compile_float8 import apply_compile

        apply_compile(model)
    spec = recipe.spec
    apply_fsdp(model, reshard_after_forward=spec.reshard_after_forward, precision=recipe.precision,
               cpu_offload=spec.cpu_offload, mesh=meshes.fsdp)
    if is_meta(model):
        materialize(model, device="cpu" if spec.cpu_offload else device, checkpoint=checkpoint, seed=seed)
    if optimizer is not None:
        optimizer = rebuild_optimizer(optimizer, model.named_parameters(), group_param_names=names)
    return MeshApplied(model=model, optimizer=optimizer, meshes=meshes, tp_plan=source,
                       tp_modules=tp_modules)
