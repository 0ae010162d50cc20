"""The torchtitan TOML reader (``advisor plan --from job.toml``).

Which keys it reads, and what they mean, from the framework's own definitions: torchtitan TOML
(torchtitan/config/job_config.py): ``[parallelism]`` degrees (``data_parallel_shard_degree = -1`` takes the
remaining GPUs), the pipeline's schedule, stages and micro-batch size (``_torchtitan_pipeline``), the expert degree, ``fsdp_reshard_after_forward`` default / always / never, ``[training] local_batch_size``
(``batch_size`` before), ``global_batch_size``, ``seq_len``, ``mixed_precision_param``,
``[activation_checkpoint] mode`` none / selective / full, ``[optimizer] name`` and ``implementation``,
``training.enable_cpu_offload`` (the offload strategies).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from advisor.training import MAX_SEQ_LEN
from advisor.planning.config_file import FILE_FORMAT, Reader, fsdp_strategy, precision_for, take_batch
from profiles import PROFILES_DIR


TORCHTITAN_LOCAL_BATCH = 8  # training.local_batch_size's default (torchtitan/config/job_config.py at v0.2.2)


@lru_cache(maxsize=1)
def torchtitan_keys() -> dict[str, Any]:
    """The verified key table of torchtitan's job config (``profiles/torchtitan_job_config.json``): what the reader
    reads and the export writes."""
    return json.loads((PROFILES_DIR / "torchtitan_job_config.json").read_text())


def read_torchtitan(r: Reader) -> None:
    replicate = r.integer("parallelism.data_parallel_replicate_degree", low=1) or 1
    shard = r.integer("parallelism.data_parallel_shard_degree", low=-1)
    if shard == 0:
        raise r.fail("parallelism.data_parallel_shard_degree", "must be -1 (the remaining GPUs) or at least 1")
    degrees = {name: r.integer(f"parallelism.{key}", low=1) for name, key in (
        ("tp", "tensor_parallel_degree"), ("cp", "context_parallel_degree"), ("pp", "pipeline_parallel_degree"),
        ("ep", "expert_parallel_degree"))}
    if (degrees["ep"] or 1) > 1:  # carved out of dp_shard x cp (torchtitan's ParallelDims): not in the GPU count
        r.take("parallelism.expert_parallel_degree", degrees["ep"], "ep", degrees["ep"])
    pipelined = (degrees["pp"] or 1) > 1
    if pipelined:
        _torchtitan_pipeline(r, degrees["pp"])
    # Degree 1 is data parallelism alone: nothing to pin (the planner's default), except beside a pipeline, whose
    # mesh search would otherwise add the tp or cp the file runs without
    left = []
    for name, key in (("tp", "tensor_parallel_degree"), ("cp", "context_parallel_degree")):
        if (degrees[name] or 1) > 1 or pipelined:
            r.take(f"parallelism.{key}", degrees[name] or "1 (torchtitan's default)", name, degrees[name] or 1)
        elif degrees[name] == 1:
            left.append((name, key))
    if left:  # read, not pinned: said, so a plan on a mesh the file does not run is not a surprise
        r.notes.append(f"{' and '.join(key for _, key in left)} 1: left to the plan, which adds "
                       f"{' or '.join(name for name, _ in left)} where data parallelism alone does not fit on the "
                       f"GPUs (or, under --policy fastest, runs slower); pin with "
                       f"{' '.join(f'--{name} 1' for name, _ in left)}")
    policy = r.raw("parallelism.fsdp_reshard_after_forward")
    reshard = r.choice("parallelism.fsdp_reshard_after_forward", {"default": True, "always": True, "never": False})
    if isinstance(policy, str) and policy.strip().lower() == "always":
        r.notes.append("fsdp_reshard_after_forward always: the norm + output unit reshards too and is gathered again "
                       "in backward, which the torchtitan recipe (its default policy keeps it) does not count")
    key = "parallelism.data_parallel_shard_degree"
    # training.enable_cpu_offload: FSDP2's CPUOffloadPolicy on every unit (torchtitan/distributed/fsdp.py), what our
    # export writes for zero3_offload / zero2_offload
    offload = r.flag("training.enable_cpu_offload")
    if shard is None or shard == -1 or shard > 1:
        fsdp_strategy(r, key, reshard=reshard is not False, offload=bool(offload),
                      value=str(shard if shard is not None else -1), offload_key="training.enable_cpu_offload")
        if replicate > 1 or pipelined:
            r.take("parallelism.data_parallel_replicate_degree", replicate, "hybrid", replicate)
    elif replicate > 1:
        r.take("parallelism.data_parallel_replicate_degree", replicate, "strategy", "ddp")
    if offload and not (shard is None or shard == -1 or shard > 1):  # apply_fsdp alone takes the CPUOffloadPolicy
        r.notes.append("training.enable_cpu_offload with data_parallel_shard_degree 1: torchtitan offloads only "
                       "through FSDP (apply_fsdp), so this run does not offload and is planned without it")
    if shard is not None and shard > 0:
        world = replicate * shard * (degrees["tp"] or 1) * (degrees["cp"] or 1) * (degrees["pp"] or 1)
        r.take("parallelism", "degrees multiplied", "num_gpus", world)
    else:
        r.notes.append("data_parallel_shard_degree -1 takes the GPUs left: their count comes from --gpus")
    training = r.section("training") or {}  # a 'training' that is not a table: one line naming it
    batch_key = "training.local_batch_size" if "local_batch_size" in training else "training.batch_size"
    total = r.integer("training.global_batch_size", low=-1)
    if not pipelined:
        take_batch(r, micro=batch_key)
    else:  # the local batch is split into the pipeline's micro-batches of pipeline_parallel_microbatch_size
        # (pipeline_parallel.py: n_microbatches = local_batch_size // microbatch_size); a global batch, when given,
        # says the whole step: its micro-batches a rank are the pipeline's times torchtitan's gradient accumulation
        given = r.integer(batch_key, low=1)
        local = given or TORCHTITAN_LOCAL_BATCH
        micro = r.integer("parallelism.pipeline_parallel_microbatch_size", low=1)
        r.take("parallelism.pipeline_parallel_microbatch_size", micro or "1 (torchtitan's default)", "micro_batch",
               micro or 1)
        if local % (micro or 1):
            raise r.fail(batch_key, f"is {local}{'' if given else ' (torchtitan default)'}, not a whole number of "
                         f"pipeline micro-batches of {micro or 1}")
        if total is None or total <= 0:
            r.take(batch_key, local if given else f"{local} (torchtitan's default)", "gradient_accumulation",
                   local // (micro or 1))
    if total is not None and total > 0:
        r.take("training.global_batch_size", total, "global_batch", total)
    length = r.integer("training.seq_len", low=1, high=MAX_SEQ_LEN)
    if length is not None:
        r.take("training.seq_len", length, "seq_len", length)
    param = r.choice("training.mixed_precision_param", {"bfloat16": "bf16", "float32": "no"})
    if param is not None:
        r.take("training.mixed_precision_param", param, "precision", precision_for("accelerate", param))
    mode = r.choice("activation_checkpoint.mode", {"none": "off", "selective": "selective", "full": "on"})
    if mode is not None:
        r.take("activation_checkpoint.mode", mode, "activation_checkpointing", mode)
    _torchtitan_optimizer(r)
    _torchtitan_compile_float8(r)
    model = r.section("model")
    if model is not None:
        r.notes.append(f"[model] {model.get('name', '?')} {model.get('flavor', '')}: give the model with --model "
                       "(torchtitan flavors are not mapped to checkpoints)".replace("  ", " "))
        r.read.update({"model.name", "model.flavor"})
    r.take(FILE_FORMAT, "torchtitan", "recipe", "torchtitan")
    r.take(FILE_FORMAT, "torchtitan", "engine", "torch")


def _torchtitan_optimizer(r: Reader) -> None:
    name = r.text("optimizer.name")
    if name is not None and name.lower() in ("adamw", "adam"):
        r.take("optimizer.name", name, "optimizer", name.lower())
    elif name is not None:
        r.notes.append(f"[optimizer] name {name} is not modelled: planned with --optimizer's default")
    impl = r.choice("optimizer.implementation", {"fused": "fused", "foreach": "foreach", "for-loop": "for-loop"})
    if impl is not None:
        r.take("optimizer.implementation", impl, "optimizer_impl", impl)
    fused = r.flag("optimizer.fused")  # before `implementation` existed
    if fused is not None:
        r.take("optimizer.fused", fused, "optimizer_impl", "fused" if fused else "foreach")


def _torchtitan_compile_float8(r: Reader) -> None:
    """``[compile] enable`` is --compile; the ``quantize.linear.float8`` converter (``float8`` before v0.2) --float8,
    with ``enable_fsdp_float8_all_gather`` (torchtitan/config/job_config.py, components/quantization/float8.py)."""
    if r.flag("compile.enable"):
        r.take("compile.enable", True, "compile", 1)
    converters = r.raw("model.converters") or []
    if isinstance(converters, str):
        converters = converters.split(",")
    if not isinstance(converters, list) or not all(isinstance(name, str) for name in converters):
        raise r.fail("model.converters", f"must be a list of converter names, got {str(converters)[:60]}")
    if any(name.strip() in ("quantize.linear.float8", "float8") for name in converters):
        r.take("model.converters", ",".join(converters), "float8", 1)
        if r.flag("quantize.linear.float8.enable_fsdp_float8_all_gather"):
            r.take("quantize.linear.float8.enable_fsdp_float8_all_gather", True, "float8_all_gather", 1)


def _torchtitan_pipeline(r: Reader, pp: int) -> None:
    """``pipeline_parallel_degree`` > 1 (torchtitan/distributed/pipeline_parallel.py at v0.2.2): the schedule by
    its torch class name less ``Schedule`` (default 1F1B); stages per rank from ``module_fqns_per_model_part``, else
    1 for a single-stage schedule and 2 for a multi-stage one (torchtitan's fallback), and the layers of each rank
    from the same list (``--pp-layers`` when uneven)."""
    from advisor.estimate.pipeline_schedules import load_schedules

    r.take("parallelism.pipeline_parallel_degree", pp, "pp", pp)
    key = "parallelism.pipeline_parallel_schedule"
    schedules = load_schedules()
    by_class = {facts.torch_class.removeprefix("Schedule").lower(): name for name, facts in schedules.items()
                if facts.torch_class}
    given = r.text(key)
    name = by_class.get((given or "1F1B").lower())
    if name is None:
        runs = ", ".join(sorted(facts.torch_class.removeprefix("Schedule") for facts in schedules.values()
                                if facts.torch_class))
        raise r.fail(key, f"is {given}: the schedules planned are {runs}")
    multi = schedules[name].torch_class in torchtitan_keys()["multi_stage_schedules"]
    parts = r.raw("parallelism.module_fqns_per_model_part")
    if parts is not None and (not isinstance(parts, list) or not all(
            isinstance(part, list) and all(isinstance(m, str) for m in part) for part in parts)):
        raise r.fail("parallelism.module_fqns_per_model_part", "must be a list of lists of module names")
    chunks = len(parts) // pp if parts else (2 if multi else 1)
    if parts and len(parts) % pp:
        raise r.fail("parallelism.module_fqns_per_model_part", f"has {len(parts)} parts, not a whole number per "
                     f"each of {pp} pipeline ranks")
    if schedules[name].v_shape and chunks != 2:
        raise r.fail(key, f"{given} runs two stages a rank (a V), and the file gives {chunks}")
    if multi and chunks < 2 or not multi and chunks != 1:
        raise r.fail(key, f"{given or '1F1B'} runs {'at least 2 stages' if multi else 'one stage'} per rank, and "
                     f"the file gives {chunks}")
    if name == "zb_h1" and chunks > 1:  # torch's InterleavedZeroBubble over several stages a rank: not the ZB-H1 planned
        raise r.fail(key, f"is {given}: torch's InterleavedZeroBubble with {chunks} stages a rank is not planned "
                     "(dp-advisor's zb_h1 runs one); plan it as ZBVZeroBubble or Interleaved1F1B")
    r.take(key, given or "1F1B (torchtitan's default)", "pp_schedule", name)
    if chunks > 1 and not schedules[name].v_shape:
        r.take("parallelism.module_fqns_per_model_part" if parts else key, f"{chunks} stages a rank",
               "virtual_stages", chunks)
    if parts:
        per_rank = [0] * pp
        for stage, part in enumerate(parts):
            owner = (stage if stage < pp else 2 * pp - 1 - stage) if schedules[name].v_shape else stage % pp
            per_rank[owner] += sum(1 for module in part if module.startswith("layers."))
        if min(per_rank) < 1:
            raise r.fail("parallelism.module_fqns_per_model_part", "leaves a pipeline rank without a decoder layer")
        if len(set(per_rank)) > 1:
            r.take("parallelism.module_fqns_per_model_part", "an uneven split", "pp_layers",
                   ",".join(map(str, per_rank)))
    elif r.raw("parallelism.pipeline_parallel_layers_per_stage") is not None:
        per_stage = r.raw("parallelism.pipeline_parallel_layers_per_stage")
        r.notes.append(f"pipeline_parallel_layers_per_stage {str(per_stage)[:20]}: the stages torchtitan builds from it "
                       "(ceil((layers + 2) / it), the embedding and head counted as a layer each) are not read; planned "
                       f"with {chunks} stage{'s' if chunks > 1 else ''} a rank and the layers split evenly "
                       "(--virtual-stages and --pp-layers set them)")
