"""``wrap_pipeline``: a plan's pipeline mesh applied to a live model, the launch read once.

``wrap()`` returns a model for a plain ``loss = model(...); loss.backward(); optimizer.step()``
loop. A pipeline cannot be driven that way: the schedule runs forward and backward of every
micro-batch itself, and the loss exists on the last stage only. So a mesh with ``pp > 1`` has its
own entry, returning the ``Pipeline`` in the model's place:

    pipeline, optimizer, loader = wrap_pipeline(model, optimizer, loader, mesh=plan.mesh, num_microbatches=8)
    for ids in loader:
        loss = pipeline.step(ids)          # the mean loss on the last stage's ranks, None elsewhere
        optimizer.step(); optimizer.zero_grad()

``wrap(mesh=...)`` with ``pp > 1`` does not route here: it refuses in one line that spells out the
call to make instead (``pipeline_call``), because it cannot keep its own contract for a pipeline. What
``wrap()`` returns is driven by ``loss.backward()``, while a pipeline is driven by ``pipeline.step``
(a caller's loop written for ``wrap()`` would break on the first batch), and the schedule needs the
micro-batches per step, which neither ``wrap()``'s arguments nor a plan's mesh carry (it is the plan's
``gradient_accumulation_steps``). The optimizer is rebuilt on this rank's
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


def pipeline_call(dims: ParallelDims, num_microbatches: int | None = None) -> str:
    """The one-line ``wrap_pipeline`` call for a pipeline mesh ``wrap()`` was given (module docstring);
    ``num_microbatches``: the plan's gradient_accumulation_steps, else the planner's default (4 x pp)."""
    from advisor.estimate.pipeline_schedules import num_micro_batches

    degrees = ", ".join(f"{name}={value!r}" for name, value in dims if value != ParallelDims.model_fields[name].default)
    m = num_microbatches or num_micro_batches(dims, None)
    source = "the plan's gradient_accumulation_steps" if num_microbatches else (
        "what the plan assumes without --global-batch; with it, the plan's gradient_accumulation_steps")
    runs = unbuilt_inside_stages(dims) or f"it runs pp x {BUILT_INSIDE_STAGES}: TP and FSDP2/HSDP inside the stages"
    return (f"mesh {dims.label} pipelines the model: a schedule runs each step, not loss.backward(), so wrap() has "
            f"no model to return; call pipeline, optimizer, loader = wrappers.wrap_pipeline(model, optimizer, loader, "
            f"mesh=ParallelDims({degrees}), num_microbatches={m}) and loop loss = pipeline.step(batch) "
            f"(num_microbatches {m}: {source}; {runs})")


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
