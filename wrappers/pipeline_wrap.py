"""``wrap_pipeline``: a plan's pipeline mesh applied to a live model, the launch read once.

``wrap()`` returns a model for a plain ``loss = model(...); loss.backward(); optimizer.step()``
loop. A pipeline cannot be driven that way: the schedule runs forward and backward of every
micro-batch itself, and the loss exists on the last stage only. So a mesh with ``pp > 1`` has its
own entry, returning the ``Pipeline`` in the model's place:

    pipeline, optimizer, loader = wrap_pipeline(model, optimizer, loader, mesh=plan.mesh, num_microbatches=8)
    for ids in loader:
        loss = pipeline.step(ids)          # the mean loss on the last stage's ranks, None elsewhere
        optimizer.step(); optimizer.zero_grad()

``wrap()`` routes here (``wrap_as_pipeline``) when its mesh has ``pp > 1``: a pinned one
(``wrap(model, optimizer, loader, mesh=plan.mesh, num_microbatches=8)``) or the plan it made on the
GPUs. It then returns the ``Pipeline`` in the model's place, as this entry does, so the loop is
``pipeline.step(batch)``'s, not ``loss.backward()``'s. The schedule needs the micro-batches per step:
``num_microbatches=``, else the plan's ``gradient_accumulation_steps``; with neither (a pinned mesh
and no ``num_microbatches``) ``wrap()`` stops with one line naming what to pass
(``missing_microbatches``). The stages run in fp32 without activation checkpointing: a precision or
checkpointing asked for (or planned) is not applied, with a warning. The optimizer is rebuilt on this rank's
parameters (FSDP2 replaced them; the other stages' are not here), each group keeping its settings;
the loader is sharded over the data-parallel ranks only (the stages of one pipeline read the same
batch). Checkpoints: ``save_checkpoint(pipeline.rank_model, path, optimizer=optimizer)``.

Built: pp x dp_replicate x dp_shard x tp (TP inside each stage, then FSDP2 or HSDP over the data-parallel
ranks, as torchtitan composes them). Not built (refused with the reason): CP inside the stages (the ring
attention context is entered around a step's forward and backward, and here the schedule runs them; on
CPU it does not run at all), and expert parallelism composed with the pipeline's FSDP2
(``wrappers.experts`` shards experts alone).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from advisor.mesh import ParallelDims
from wrappers.launch_env import LaunchEnv, read_launch_env
from wrappers.loader import shard_loader
from wrappers.mesh import resolve_dims
from wrappers.optim import param_group_names, rebuild_optimizer
from wrappers.pipeline import Pipeline, apply_pipeline, build_pipeline_mesh
from wrappers.process_group import init_launch_group


BUILT_INSIDE_STAGES = "dp_replicate x dp_shard x tp"
_NOT_BUILT = {
    "cp": "context parallelism's ring attention is a context entered around each step's forward and backward "
          "(torch.distributed.tensor.experimental.context_parallel), which the pipeline schedule runs, and is "
          "not wired into it",
    "ep": "the experts' all-to-all (wrappers.experts) is not composed with the stages' FSDP2",
}


def unbuilt_inside_stages(dims: ParallelDims) -> str | None:
    """Why ``wrap_pipeline`` cannot run ``dims`` (cp or ep inside the stages), or None."""
    refused = [f"{name} {getattr(dims, name)} ({why})" for name, why in _NOT_BUILT.items() if getattr(dims, name) > 1]
    if not refused:
        return None
    return (f"wrap_pipeline runs pp x {BUILT_INSIDE_STAGES}; {'; '.join(refused)} inside the stages is not "
            "built yet")


def _check_pipeline_dims(dims: ParallelDims, model: nn.Module) -> None:
    if dims.pp == 1:
        raise ValueError(f"wrap_pipeline: mesh {dims.label} has no pipeline (pp 1); use wrap()")
    problem = unbuilt_inside_stages(dims)
    if problem:
        raise ValueError(problem)
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    dims.check_model(num_attention_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads)


def missing_microbatches(dims: ParallelDims) -> str:
    """The one line ``wrap()`` stops with when a pipeline mesh comes without the micro-batches per step."""
    from advisor.estimate.pipeline_schedules import num_micro_batches

    return (f"wrap(): mesh {dims.label} pipelines the model, and its schedule needs the micro-batches per step: pass "
            f"num_microbatches= (the plan's gradient_accumulation_steps; without --global-batch the plan assumes "
            f"4 x pp = {num_micro_batches(dims, None)}); wrap() then returns the pipeline in the model's place, "
            "stepped by loss = pipeline.step(batch)")


def wrap_as_pipeline(model, optimizer, loader, *, dims: ParallelDims, env: LaunchEnv, num_microbatches: int | None,
                     planned_microbatches: int | None, precision: str | None, checkpointing: str | None,
                     checkpoint: str | None) -> tuple[tuple, dict]:
    """``wrap()``'s branch for a mesh with ``pp > 1`` (module docstring): (what ``wrap_pipeline``
    returns, the Decision's fields). A config or meta-device model is materialised whole first
    (from ``checkpoint`` when given), then split."""
    from wrappers.mesh_wrap import is_config, materialize_whole
    from wrappers.parallelize import is_meta, model_from_config

    problem = unbuilt_inside_stages(dims)
    if problem:
        raise ValueError(f"wrap(): mesh {dims.label} pipelines the model, but {problem}")
    m = num_microbatches or planned_microbatches
    if m is None:
        raise ValueError(missing_microbatches(dims))
    for asked, name in ((precision not in (None, "fp32"), f"precision {precision}"),
                        (checkpointing not in (None, "off"), f"activation checkpointing {checkpointing}")):
        if asked:
            warnings.warn(f"wrap(): the pipeline's stages run in fp32 without activation checkpointing; {name} is "
                          "not applied", stacklevel=3)
    if is_config(model):
        model = model_from_config(model)
    if is_meta(model) or checkpoint is not None:
        model, optimizer = materialize_whole(model, optimizer, env=env, checkpoint=checkpoint)
    result = wrap_pipeline(model, optimizer, loader, mesh=dims, num_microbatches=m, env=env)
    source = "num_microbatches" if num_microbatches else "the plan's gradient accumulation"
    reason = (f"torch.distributed.pipelining, {m} micro-batches a step ({source}); FSDP2 inside each stage, "
              "not resharded between micro-batches")
    fields = dict(engine="torch", precision="fp32", checkpointing="off", world_size=env.world_size, mesh=dims,
                  strategy="zero2" if dims.dp > 1 else None, reason=reason)
    return result, fields


def wrap_pipeline(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  loader: torch.utils.data.DataLoader | None = None, *, mesh: ParallelDims | dict,
                  num_microbatches: int, env: LaunchEnv | None = None) -> tuple:
    """Split ``model`` into the stages of ``mesh`` (its ``pp``, ``pp_schedule``, ``virtual_stages``,
    ``pp_layers``), TP over ``tp`` and FSDP2 over ``dp_shard`` (HSDP with ``dp_replicate``) inside each;
    returns (pipeline, optimizer, loader) for what was passed."""
    env = env or read_launch_env()
    dims = resolve_dims(mesh, world_size=env.world_size)
    _check_pipeline_dims(dims, model)
    init_launch_group(env)
    names = param_group_names(optimizer, model) if optimizer is not None else None
    chunks = dims.chunks_per_rank
    layers = None
    if dims.pp_layers is not None:
        if chunks > 1:
            raise ValueError("pp_layers gives one count per pipeline rank; with several stages per rank give an "
                             "even split")
        layers = dims.pp_layers
    device_mesh = build_pipeline_mesh(pp=dims.pp, dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard,
                                      tp=dims.tp, device_type=env.device.type)
    pipeline = apply_pipeline(model, device_mesh,
                              schedule=dims.pp_schedule, virtual_stages=chunks, num_microbatches=num_microbatches,
                              device=env.device, layers_per_stage=layers)
    result: list = [pipeline]
    if optimizer is not None:
        here = dict(pipeline.rank_model.named_parameters())
        groups = [[name for name in group if name in here] for group in names]
        result.append(rebuild_optimizer(optimizer, here, group_param_names=groups))
    if loader is not None:
        result.append(shard_loader(loader, num_replicas=dims.dp, rank=pipeline.dp_rank))
    return tuple(result)
