"""A recipe (strategy, precision, activation checkpointing, offload) and the one call that applies it.

``apply_recipe`` is what ``wrap()`` and the CPU simulator call: it plans nothing, reads no
environment and prints nothing; every choice arrives in its arguments. The order is fixed:

1. cast the model for ``precision="bf16"`` (mixed precisions keep fp32 parameters);
2. activation checkpointing of the blocks (before any wrapping, as torchtitan does);
3. the strategy's applier, from the one table ``_APPLIERS``;
4. the optimizer: unchanged (DP, DDP), ``ZeroRedundancyOptimizer`` (ZeRO-1), or rebuilt on the
   sharded parameters (FSDP2).

Mixed precision under DP, DDP and ZeRO-1 is ``torch.autocast`` around the forward, entered by the
training loop with ``autocast_context`` (``wrap()`` registers it on the model instead,
``wrappers.precision.apply_autocast``); under FSDP2 it is the ``MixedPrecisionPolicy`` instead.
``fp16-mixed`` also needs a gradient scaler (``torch.amp.GradScaler``, or FSDP's sharded one),
which is the training loop's business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from advisor.precision import Precision
from advisor.strategies import STRATEGIES as PLAN_STRATEGIES
from advisor.strategies import Implementation, StrategyName as Strategy
from advisor.training import CheckpointMode
from wrappers.blocks import find_blocks
from wrappers.checkpointing import apply_activation_checkpointing
from wrappers.ddp import apply_ddp
from wrappers.dp import apply_dp
from wrappers.fsdp import apply_fsdp
from wrappers.optim import param_group_names, rebuild_optimizer
from wrappers.precision import autocast_context, precision_dtypes

__all__ = ["STRATEGIES", "Applied", "Applier", "Recipe", "StrategySpec", "apply_recipe", "applier_for",
           "autocast_context"]

# Which ``apply_*`` function of this package applies a strategy (not the planner's engine,
# ``advisor.training.Engine``, which is always torch here): DataParallel, DDP, DDP +
# ZeroRedundancyOptimizer, or FSDP2 ``fully_shard``.
Applier = Literal["dp", "ddp", "zero1", "fsdp"]


class StrategySpec(NamedTuple):
    """How a strategy is applied: the applier and the FSDP2 settings it uses."""

    applier: Applier
    reshard_after_forward: bool = False
    cpu_offload: bool = False


def applier_for(impl: Implementation) -> Applier:
    """The applier the torch implementation's fields call for (what it shards, how many processes)."""
    return ("dp" if impl.single_process else "fsdp" if impl.shard_params
            else "zero1" if impl.shard_optimizer else "ddp")


def _torch_spec(impl: Implementation) -> StrategySpec:
    return StrategySpec(applier_for(impl), reshard_after_forward=impl.reshard_after_forward,
                        cpu_offload=impl.offload_params)


# Derived from the planner's one strategy table (advisor/strategies.py), torch engine: what the
# estimates assume is exactly what gets applied.
STRATEGIES: dict[str, StrategySpec] = {name: _torch_spec(s.on("torch")) for name, s in PLAN_STRATEGIES.items()}


class Recipe(BaseModel):
    """What to apply to a model. ``cpu_offload`` follows from the strategy when not given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: Strategy = Field(description="Data-parallel strategy; a key of STRATEGIES.")
    precision: Precision = Field(default="fp32", description="fp32, bf16-mixed, fp16-mixed or bf16 (pure).")
    checkpointing: CheckpointMode = Field(default="off", description="Recompute each block in backward: on (full), "
                                          "off, or selective (keeps attention outputs and every other matrix "
                                          "product: torchtitan's per-op policy).")
    cpu_offload: bool = Field(default=False, description="Parameters and optimizer state on CPU (FSDP2 offload).")
    compile: bool = Field(default=False, description="torch.compile each block (the plan's --compile; "
                          "wrappers.compile_float8).")
    float8: bool = Field(default=False, description="torchao float8 on the blocks' linears (the plan's --float8).")
    float8_all_gather: bool = Field(default=False, description="With float8: FSDP all-gathers fp8 weights.")
    reduce_in_compute_dtype: bool = Field(default=False, description="FSDP2 reduce-scatters gradients in the "
                                          "compute dtype (accelerate's MixedPrecisionPolicy, the trainer recipe's "
                                          "fsdp_reduce_dtype) instead of fp32.")
    shard_experts_on_dim1: bool = Field(default=True, description="FSDP2 shards MoE experts on dim 1 over more ranks "
                                        "than experts (torchtitan's rule, wrappers.fsdp); False: dim 0, padded.")
    root_reshard_after_forward: bool | None = Field(default=None, description="FSDP2's root unit resharded after "
                                                    "forward; None: as the blocks. False is what torch before 2.8 "
                                                    "ran whatever was asked (the simulator passes it for "
                                                    "TrainingConfig.torch_release before 2.8).")
    cast_model: bool = Field(default=True, description="Under pure bf16, cast the whole model to bf16 first (what "
                             "wrap() does); False: leave it as loaded, as HF Trainer does, so a PEFT model's fp32 "
                             "adapters stay fp32 beside its bf16 base.")
    outer_units: bool = Field(default=False, description="FSDP2: the embedding and the final norm + head get units of "
                              "their own, as torchtitan's apply_fsdp_to_decoder gives them (wrappers.fsdp); False: "
                              "the root holds them.")

    @model_validator(mode="before")
    @classmethod
    def _derive_offload(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("strategy") in STRATEGIES:
            implied = STRATEGIES[data["strategy"]].cpu_offload
            if "cpu_offload" not in data:
                return {**data, "cpu_offload": implied}
            if data["cpu_offload"] != implied:
                raise ValueError(
                    f"cpu_offload={data['cpu_offload']} contradicts strategy {data['strategy']!r}; "
                    "offload is chosen with the *_offload strategies"
                )
        return data

    @property
    def spec(self) -> StrategySpec:
        return STRATEGIES[self.strategy]


@dataclass(frozen=True)
class Applied:
    """The result of ``apply_recipe``: the wrapped model, the optimizer to step, and the recipe."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    recipe: Recipe


@dataclass(frozen=True)
class _Context:
    recipe: Recipe
    device: torch.device
    optimizer: torch.optim.Optimizer | None
    process_group: dist.ProcessGroup | None
    mesh: DeviceMesh | None = None


def _apply_dp(model: nn.Module, ctx: _Context) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    return apply_dp(model, device=ctx.device), ctx.optimizer


def _apply_ddp(model: nn.Module, ctx: _Context) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    group = ctx.process_group if ctx.process_group is not None else dist.group.WORLD
    if dist.get_world_size(group) == 1:
        # One rank has nothing to all-reduce; DDP would only add its buckets (a copy of the gradients).
        # Every stack runs one GPU as the plain model (accelerate, Lightning), and so does this.
        if not any(p.is_meta for p in model.parameters()):
            model.to(ctx.device)
        return model, ctx.optimizer
    return apply_ddp(model, device=ctx.device, process_group=ctx.process_group), ctx.optimizer


def _apply_zero1(model: nn.Module, ctx: _Context) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    if ctx.optimizer is None:
        raise ValueError("zero1 partitions the optimizer: pass the optimizer to apply_recipe")
    from wrappers.zero1 import apply_zero1  # torch.distributed.optim: TorchScript compiles, ~0.45 s to import

    return apply_zero1(model, ctx.optimizer, device=ctx.device, process_group=ctx.process_group)


def _apply_fsdp(model: nn.Module, ctx: _Context) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    names = param_group_names(ctx.optimizer, model) if ctx.optimizer is not None else None
    # The mesh follows ``device`` (FSDP2's default would pick CUDA whenever it is available).
    group = ctx.process_group if ctx.process_group is not None else dist.group.WORLD
    mesh = ctx.mesh if ctx.mesh is not None else DeviceMesh.from_group(group, device_type=ctx.device.type)
    spec = ctx.recipe.spec
    apply_fsdp(
        model,
        reshard_after_forward=spec.reshard_after_forward,
        precision=ctx.recipe.precision,
        cpu_offload=spec.cpu_offload,
        mesh=mesh,
        shard_experts_on_dim1=ctx.recipe.shard_experts_on_dim1,
        reduce_in_compute_dtype=ctx.recipe.reduce_in_compute_dtype,
        root_reshard_after_forward=ctx.recipe.root_reshard_after_forward,
        outer_units=ctx.recipe.outer_units,
    )
    if ctx.optimizer is None:
        return model, None
    return model, rebuild_optimizer(ctx.optimizer, model.named_parameters(), group_param_names=names)


_APPLIERS: dict[Applier, Callable[[nn.Module, _Context], tuple[nn.Module, torch.optim.Optimizer | None]]] = {
    "dp": _apply_dp,
    "ddp": _apply_ddp,
    "zero1": _apply_zero1,
    "fsdp": _apply_fsdp,
}


def apply_recipe(
    model: nn.Module,
    recipe: Recipe,
    *,
    device: torch.device | str,
    optimizer: torch.optim.Optimizer | None = None,
    process_group: dist.ProcessGroup | None = None,
    mesh: DeviceMesh | None = None,
) -> Applied:
    """Apply ``recipe`` to ``model`` (in place where the applier works in place) on ``device``.

    ``optimizer``, if given, must be built on ``model``'s parameters; the returned optimizer is the
    one to step. ``process_group`` defaults to the default (world) group. The process group must be
    initialised by the caller, except for ``dp``. ``mesh`` (FSDP2 only) overrides the mesh built from
    the group and ``device``.
    """
    bf16 = precision_dtypes("bf16").param_dtype
    if recipe.precision == "bf16" and recipe.cast_model and any(p.dtype != bf16 for p in model.parameters()):
        model.to(bf16)  # in place: parameter identity is kept
    if recipe.float8:  # before checkpointing and sharding, as torchtitan converts first
        from wrappers.compile_float8 import apply_float8
        names = param_group_names(optimizer, model) if optimizer is not None else None
        before = {id(p) for p in model.parameters()}
        apply_float8(model, all_gather=recipe.float8_all_gather)
        if names is not None and any(id(p) not in before for p in model.parameters()):
            # float8 all-gather wraps each converted weight in a new Parameter (torchao Float8Linear.from_float)
            optimizer = rebuild_optimizer(optimizer, model.named_parameters(), group_param_names=names)
    if recipe.checkpointing != "off":
        apply_activation_checkpointing(model, blocks=find_blocks(model), selective=recipe.checkpointing == "selective")
    if recipe.compile:  # after checkpointing, before DDP/FSDP (torchtitan's apply_compile order)
        from wrappers.compile_float8 import apply_compile
        apply_compile(model)
    ctx = _Context(recipe=recipe, device=torch.device(device), optimizer=optimizer, process_group=process_group,
                   mesh=mesh)
    wrapped, new_optimizer = _APPLIERS[recipe.spec.applier](model, ctx)
    return Applied(model=wrapped, optimizer=new_optimizer, recipe=recipe)
