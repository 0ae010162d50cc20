"""The mesh branch of ``wrap()``: TP / CP / HSDP on a ``ParallelDims`` mesh and meta-device models.

``wrap()`` comes here when it is given ``mesh=`` (a ``ParallelDims`` or its dict) or ``tp`` / ``cp`` /
``hybrid`` degrees (applied as given), when its plan needs a mesh (TP, CP, HSDP), or when a sharded plan
(zero2 / zero3) is applied to a model built on the meta device or a transformers config. It
builds the meshes, applies ``parallelize.apply_mesh`` (TP, checkpointing, FSDP2 or HSDP, then each
rank's shard materialised), checks what was built (process group, every parameter's placement on
every mesh dimension; ``RuntimeError`` otherwise, as ``verify_applied`` does for the DP family) and
shards the loader over the data-parallel ranks only (TP and CP ranks of one replica read the same
batch). The FSDP2 strategy is the plan's, ``zero3`` for a pinned mesh unless another sharded one is asked for.

One process with a meta model or config: nothing to shard, so the model is materialised whole on
the device (the safetensors path still reads tensor by tensor).
"""

from __future__ import annotations

from torch import nn

from advisor.mesh import ParallelDims
from advisor.strategies import StrategyName
from advisor.training import CheckpointMode, Precision
from wrappers.launch_env import LaunchEnv
from wrappers.loader import shard_loader
from wrappers.materialize import materialize
from wrappers.mesh import resolve_dims
from wrappers.optim import param_group_names, rebuild_optimizer
from wrappers.parallelize import apply_mesh, is_meta, model_from_config
from wrappers.recipe import Recipe
from wrappers.verify import group_problem, mesh_problems


def is_config(model: object) -> bool:
    return not isinstance(model, nn.Module) and hasattr(model, "model_type") and hasattr(model, "to_dict")


def _check_dims(dims: ParallelDims, model: nn.Module, env: LaunchEnv) -> None:
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    dims.check_model(num_attention_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads)
    if dims.cp > 1 and env.device.type != "cuda":
        raise ValueError(f"cp {dims.cp}: context parallelism needs CUDA (PyTorch's ring attention runs the CUDA "
                         "SDPA kernels only); use cp=1 on CPU")


def _refuse_pipeline_and_experts(dims: ParallelDims) -> None:
    """A mesh with pp > 1 never comes here (``wrap()`` hands it to ``wrappers.pipeline_wrap``)."""
    assert dims.pp == 1, f"mesh {dims.label}: wrap() routes pipelines to wrap_as_pipeline"
    if dims.ep > 1:
        raise ValueError(f"mesh {dims.label}: expert parallelism under FSDP2 is not built into wrap(); "
                         "wrappers.experts.apply_expert_parallel shards the experts over a group on its own")


def _ensure_group(env: LaunchEnv) -> None:
    from wrappers.process_group import init_launch_group

    init_launch_group(env)


def materialize_whole(model: nn.Module, optimizer, *, env: LaunchEnv, checkpoint) -> tuple:
    """(model, optimizer) with a meta-device model materialised whole on this rank's device, from the
    safetensors directory ``checkpoint`` or initialised; the optimizer rebuilt over the new parameters."""
    if is_meta(model):
        # to_empty() gives the meta parameters new Parameter objects: an optimizer built on the meta
        # model would step tensors the model no longer holds. Rebuild it by name (no state to lose).
        names = param_group_names(optimizer, model) if optimizer is not None else None
        materialize(model, device=env.device, checkpoint=checkpoint)
        if optimizer is not None:
            optimizer = rebuild_optimizer(optimizer, model.named_parameters(), group_param_names=names)
    elif checkpoint is not None:
        raise ValueError("checkpoint= loads into a model built on the meta device; this one has weights already")
    return model.to(env.device), optimizer


def wrap_on_mesh(model, optimizer, loader, *, env: LaunchEnv, mesh, tp: int, cp: int, hybrid: int, checkpoint,
                 strategy: StrategyName | None, precision: Precision | None,
                 activation_checkpointing: CheckpointMode | None, compile: bool = False) -> tuple:
    """(model, optimizer, loader, the Decision's fields) after applying the mesh; ``compile``: each block
    torch.compiled after TP and checkpointing (``apply_mesh``)."""
    if is_config(model):
        model = model_from_config(model)
    dims = resolve_dims(mesh, world_size=env.world_size, tp=tp, cp=cp, hybrid=hybrid)
    _refuse_pipeline_and_experts(dims)
    _check_dims(dims, model, env)
    recipe = Recipe(strategy=strategy or "zero3", precision=precision or "fp32",
                    checkpointing=activation_checkpointing or "off", compile=compile)
    decision = dict(engine="torch", precision=recipe.precision, checkpointing=recipe.checkpointing,
                    world_size=env.world_size, mesh=dims)
    if env.world_size == 1:
        model, optimizer = materialize_whole(model, optimizer, env=env, checkpoint=checkpoint)
        reason = "one process: nothing to shard; the meta-device model was materialised whole"
        return model, optimizer, loader, dict(decision, strategy=None, reason=reason)
    _ensure_group(env)
    applied = apply_mesh(model, dims, recipe, device=env.device, optimizer=optimizer, checkpoint=checkpoint)
    replicate = ("dp_replicate",) if dims.hybrid else ()
    shard = tuple(applied.meshes.fsdp.mesh_dim_names)[len(replicate):]
    problems = [p for p in [group_problem(env.world_size)] if p] or mesh_problems(
        applied.model, shard_dims=shard, replicate_dims=replicate, tp_modules=applied.tp_modules)
    if problems:
        raise RuntimeError(f"wrap() applied mesh {dims.label} but {'; '.join(problems)}; training on would not "
                           "be what the decision says, so wrap() stops here")
    applied.model.advisor_meshes = applied.meshes  # the CP step context and the loader need them
    if loader is not None:
        loader = shard_loader(loader, num_replicas=dims.dp, rank=applied.meshes.dp_rank)
    reason = f"FSDP2 over {'x'.join(shard)}, TP plan from {applied.tp_plan}"
    return applied.model, applied.optimizer, loader, dict(decision, strategy=recipe.strategy, reason=reason)
