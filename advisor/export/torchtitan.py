"""A torchtitan job config (TOML, torchtitan <= 0.2.2) for a plan: the mesh with every degree, pp and ep included.

Keys are those of torchtitan's own dataclasses (``torchtitan/config/job_config.py`` at v0.2.2), listed with
their types and the commit read in ``profiles/torchtitan_job_config.json``; torchtitan main replaced TOML
job configs with a Python registry (#2386), so the file targets the last TOML releases. What is written:

- ``[parallelism]``: ``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` (DDP is
  replicate = every rank, shard 1), ``tensor_parallel_degree``, ``context_parallel_degree``,
  ``pipeline_parallel_degree`` with its schedule (``torch.distributed.pipelining`` class name, from
  ``profiles/pipeline_schedules.json``), micro-batch size and ``module_fqns_per_model_part`` (the plan's
  split of the decoder layers, embedding on the first stage, norm and head on the last), and
  ``expert_parallel_degree`` (torchtitan carves ep out of dp_shard x cp, as the plan does);
  ``fsdp_reshard_after_forward`` from the strategy (zero3 default, which keeps the norm + head unit as the
  torchtitan recipe plans, or always under pp, where default would keep the blocks; zero2 never).
- ``[training]``: ``local_batch_size`` (the micro-batch, times the pipeline's micro-batches under pp),
  ``global_batch_size``, ``seq_len``, the precision (``mixed_precision_param`` / ``dtype``) and
  ``enable_cpu_offload`` for the offload strategies.
- ``[optimizer]``: ``name`` and ``implementation`` (fused / foreach / for-loop: the plan's step).
- ``[activation_checkpoint]``: ``mode`` full, none, or selective with ``selective_ac_option = "op"``.
- ``--compile``: ``[compile]`` ``enable = true``, ``components = ["model"]`` (torchtitan's apply_compile compiles
  each transformer block: the plan's per-block compile; the loss is not compiled in the plan), ``backend``.
- ``--float8``: ``[model] converters = ["quantize.linear.float8"]`` (the name ``components/quantization/float8.py``
  registers) and ``[quantize.linear.float8]`` (no ``recipe_name``: that is tensorwise), ``filter_fqns = ["output"]``
  (the head stays bf16; torchtitan skips any linear with a dim not a multiple of 16 itself) and
  ``enable_fsdp_float8_all_gather`` / ``precompute_float8_dynamic_scale_for_fsdp`` from ``--float8-all-gather``.

torchtitan builds its own models, so ``[model]`` (name, flavor, tokenizer) is left to the user. What
torchtitan cannot run (fp16, an optimizer other than Adam/AdamW, a multi-stage schedule with one stage
per rank, a split its FQNs cannot say) is a ValueError naming the reason.
"""

from __future__ import annotations

import json
from typing import Any

from advisor.estimate.pipeline_schedules import load_schedules, num_micro_batches
from advisor.export.target import (DEFAULT_PORT, PLACEHOLDER_IP, PLACEHOLDER_RANK, ExportOptions, ExportTarget,
                                   resolve_target)
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.planning.config_torchtitan import torchtitan_keys

_OPTIMIZER = {"adamw": "AdamW", "adam": "Adam"}
# [activation_checkpoint] per CheckpointMode (torchtitan config/job_config.py ActivationCheckpoint; selective with
# its per-op policy, the one wrappers.checkpointing applies).
_CHECKPOINT = {"off": {"mode": "none"}, "on": {"mode": "full"},
               "selective": {"mode": "selective", "selective_ac_option": "op"}}



def _precision(target: ExportTarget) -> dict[str, str]:
    """torchtitan's precision keys, from the precision table's dtypes: mixed precision is FSDP's
    ``mixed_precision_param`` (the compute dtype; fp32 parameters), pure bf16 is ``dtype``."""
    info = target.precision_info
    key, dtype = ("dtype", info.param_dtype) if not info.mixed and info.param_dtype != "float32" else (
        "mixed_precision_param", info.compute_dtype)
    if dtype not in torchtitan_keys()["choices"][f"training.{key}"]:
        raise ValueError(f"torchtitan trains in bfloat16 or float32 (training.mixed_precision_param, training.dtype), "
                         f"not --precision {target.precision}; plan with --precision bf16-mixed")
    return {key: dtype}


def _schedule(mesh: ParallelDims) -> str:
    """torchtitan's ``pipeline_parallel_schedule``: the torch class name less its ``Schedule`` prefix."""
    torch_class = load_schedules()[mesh.pp_schedule].torch_class
    if torch_class is None:
        raise ValueError(f"torch.distributed.pipelining has no {mesh.pp_schedule} schedule for torchtitan to run: "
                         "plan with --pp-schedule 1f1b, interleaved_1f1b, zb_h1 or zbv")
    multi = torch_class in torchtitan_keys()["multi_stage_schedules"]
    if multi and mesh.chunks_per_rank == 1:  # torchtitan's pipeline_llm refuses it (the profile's sources)
        raise ValueError(f"torchtitan runs --pp-schedule {mesh.pp_schedule} as {torch_class}, a multi-stage schedule "
                         "(at least 2 stages per rank), and the plan holds 1 per rank: plan with --pp-schedule zbv, "
                         "or interleaved_1f1b --virtual-stages 2")
    assert multi or mesh.chunks_per_rank == 1, (mesh.pp_schedule, mesh.chunks_per_rank)
    return torch_class.removeprefix("Schedule")


def _stage_owner(stage: int, mesh: ParallelDims) -> int:
    """The pipeline rank of stage ``stage``: looped (stage mod pp), or a V for two chunks per rank."""
    if load_schedules()[mesh.pp_schedule].v_shape:
        return stage if stage < mesh.pp else 2 * mesh.pp - 1 - stage
    return stage % mesh.pp


def module_fqns(mesh: ParallelDims, num_layers: int) -> list[list[str]]:
    """``module_fqns_per_model_part``: the plan's layers per stage, in stage order (torchtitan's names)."""
    per_rank = mesh.stage_layers(num_layers)
    chunks = mesh.chunks_per_rank
    parts, first = [], 0
    for stage in range(mesh.pp * chunks):
        count = per_rank[_stage_owner(stage, mesh)] // chunks
        parts.append([f"layers.{i}" for i in range(first, first + count)])
        first += count
    assert first == num_layers, (first, num_layers)
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _parallelism(target: ExportTarget, model: ModelSpec) -> dict[str, Any]:
    mesh = target.mesh or ParallelDims.data_parallel(target.world_size)
    replicate, shard = mesh.dp_replicate, mesh.dp_shard
    if not target.impl.shard_params:  # DDP: every data-parallel rank a replica
        replicate, shard = replicate * shard, 1
    section: dict[str, Any] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard}
    if target.impl.shard_params:
        # torchtitan's "default" reshards the blocks unless pp is on and keeps the norm + head unit, as the
        # torchtitan recipe plans (Recipe.fsdp_outer_units); "always" reshards that unit too (gathered again in
        # backward), the one way to reshard the blocks under pp.
        section["fsdp_reshard_after_forward"] = ("never" if not target.impl.reshard_after_forward else
                                                 "always" if mesh.pp > 1 else "default")
    section.update({"tensor_parallel_degree": mesh.tp, "context_parallel_degree": mesh.cp,
                    "pipeline_parallel_degree": mesh.pp})
    if mesh.pp > 1:
        if model.num_layers is None:
            raise ValueError("torchtitan: pipeline stages need the model's number of layers, which is not known")
        section.update({"pipeline_parallel_schedule": _schedule(mesh),
                        "pipeline_parallel_microbatch_size": target.micro_batch_size,
                        "module_fqns_per_model_part": module_fqns(mesh, model.num_layers)})
    section["expert_parallel_degree"] = mesh.ep
    return section


def torchtitan_doc(target: ExportTarget, model: ModelSpec) -> dict[str, dict[str, Any]]:
    """The job config's sections for a resolved target of ``model``."""
    if model.trainable_params < model.total_params:  # the recipe row's frozen_base source: torchtitan has no LoRA
        raise ValueError("torchtitan 0.2.2 trains every parameter of the model it builds (no LoRA, no frozen or "
                         "quantised base); export this plan with --format accelerate, trainer-args or torchrun")
    precision = _precision(target)
    if target.optimizer not in _OPTIMIZER:
        raise ValueError(f"torchtitan 0.2.2 builds Adam and AdamW only (components/optimizer.py), not --optimizer "
                         f"{target.optimizer}")
    mesh = target.mesh or ParallelDims.data_parallel(target.world_size)
    accumulation = target.gradient_accumulation_steps if target.global_batch_size is not None else None
    pipeline_micro_batches = num_micro_batches(mesh, accumulation) if mesh.pp > 1 else 1
    local = target.micro_batch_size * pipeline_micro_batches  # one data-parallel rank's samples per forward pass
    steps = 1 if mesh.pp > 1 else target.gradient_accumulation_steps
    training: dict[str, Any] = {"local_batch_size": local, "global_batch_size": local * steps * target.data_parallel_size,
                                "seq_len": target.seq_len, **precision}
    if target.impl.offload_params:
        training["enable_cpu_offload"] = True
    doc = {"job": {"description": f"dp-advisor plan: {target.summary}"}, "training": training,
           "parallelism": _parallelism(target, model),
           "optimizer": {"name": _OPTIMIZER[target.optimizer], "implementation": target.optimizer_impl},
           "activation_checkpoint": dict(_CHECKPOINT[target.checkpointing])}
    return doc | _compile_float8(target)


def _compile_float8(target: ExportTarget) -> dict[str, dict[str, Any]]:
    """[compile] and the float8 converter (module docstring), only when the plan has them."""
    doc: dict[str, dict[str, Any]] = {}
    if target.compile:
        doc["compile"] = {"enable": True, "components": ["model"], "backend": "inductor"}
    if target.float8:
        doc["model"] = {"converters": ["quantize.linear.float8"]}
        # No recipe_name: with one, Float8LinearConverter asserts all-gather off; without, it is tensorwise.
        doc["quantize.linear.float8"] = {"filter_fqns": ["output"],
                                         "enable_fsdp_float8_all_gather": target.float8_all_gather,
                                         "precompute_float8_dynamic_scale_for_fsdp": target.float8_all_gather}
    return doc


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: the same escapes for what plans contain
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def torchtitan_text(target: ExportTarget, model: ModelSpec) -> str:
    doc = torchtitan_doc(target, model)
    lines = [f"# torchtitan job config written by dp-advisor (keys of torchtitan <= 0.2.2): {target.summary}.",
             f"# Launch: torchrun --nproc-per-node {target.gpus_per_node} --nnodes {target.num_nodes}"
             + (f" --node-rank {PLACEHOLDER_RANK} --master-addr {PLACEHOLDER_IP} --master-port {DEFAULT_PORT}"
                if target.num_nodes > 1 else "")
             + " -m torchtitan.train --job.config_file THIS_FILE"
             + (" (on each node, its rank filled in)" if target.num_nodes > 1 else ""),
             f"# [model] is yours to {'complete' if target.float8 else 'add'}: the torchtitan model name, flavor and "
             "hf_assets_path matching "
             f"{target.model_name} (the plan counted that model's layers and shapes)."]
    lines += [f"# {note}" for note in target.notes]
    for section, keys in doc.items():
        lines += ["", f"[{section}]"] + [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def build_torchtitan(plan: Plan, options: ExportOptions | None = None) -> dict[str, dict[str, Any]]:
    return torchtitan_doc(resolve_target(plan, "torchtitan", options), plan.model)


def render_torchtitan(plan: Plan, options: ExportOptions | None = None) -> str:
    return torchtitan_text(resolve_target(plan, "torchtitan", options), plan.model)


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_torchtitan, render_torchtitan


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return torchtitan_text(target, model)
