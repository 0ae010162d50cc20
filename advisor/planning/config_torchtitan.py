"""The torchtitan TOML reader (``advisor plan --from job.toml``).

Which keys it reads, and what they mean, from the framework's own definitions: torchtitan TOML
(torchtitan/config/job_config.py): ``[parallelism]`` degrees (``data_parallel_shard_degree = -1`` takes the
remaining GPUs), ``fsdp_reshard_after_forward`` default / always / never, ``[training] local_batch_size``
(``batch_size`` before), ``global_batch_size``, ``seq_len``, ``mixed_precision_param``,
``[activation_checkpoint] mode`` none / selective / full, ``[optimizer] name`` and ``implementation``.
"""

from __future__ import annotations

from advisor.planning.config_file import FILE_FORMAT, Reader, fsdp_strategy, precision_for, take_batch


def read_torchtitan(r: Reader) -> None:
    replicate = r.integer("parallelism.data_parallel_replicate_degree", low=1) or 1
    shard = r.integer("parallelism.data_parallel_shard_degree", low=-1)
    if shard == 0:
        raise r.fail("parallelism.data_parallel_shard_degree", "must be -1 (the remaining GPUs) or at least 1")
    degrees = {name: r.integer(f"parallelism.{key}", low=1) for name, key in (
        ("tp", "tensor_parallel_degree"), ("cp", "context_parallel_degree"), ("pp", "pipeline_parallel_degree"))}
    if (degrees["pp"] or 1) > 1:
        raise r.fail("parallelism.pipeline_parallel_degree", f"is {degrees['pp']}: dp-advisor does not plan pipeline parallelism")
    for name in ("tp", "cp"):  # degree 1 is data parallelism alone: nothing to pin (the planner's default)
        if (degrees[name] or 1) > 1:
            r.take(f"parallelism.{ {'tp': 'tensor', 'cp': 'context'}[name]}_parallel_degree", degrees[name], name,
                   degrees[name])
    policy = r.raw("parallelism.fsdp_reshard_after_forward")
    reshard = r.choice("parallelism.fsdp_reshard_after_forward", {"default": True, "always": True, "never": False})
    if isinstance(policy, str) and policy.strip().lower() == "always":
        r.notes.append("fsdp_reshard_after_forward always: the norm + output unit reshards too and is gathered again "
                       "in backward, which the torchtitan recipe (its default policy keeps it) does not count")
    key = "parallelism.data_parallel_shard_degree"
    if shard is None or shard == -1 or shard > 1:
        fsdp_strategy(r, key, reshard=reshard is not False, offload=False, value=str(shard if shard is not None else -1))
        if replicate > 1:
            r.take("parallelism.data_parallel_replicate_degree", replicate, "hybrid", replicate)
    elif replicate > 1:
        r.take("parallelism.data_parallel_replicate_degree", replicate, "strategy", "ddp")
    if shard is not None and shard > 0:
        world = replicate * shard * (degrees["tp"] or 1) * (degrees["cp"] or 1)
        r.take("parallelism", "degrees multiplied", "num_gpus", world)
    else:
        r.notes.append("data_parallel_shard_degree -1 takes the GPUs left: their count comes from --gpus")
    training = r.section("training") or {}  # a 'training' that is not a table: one line naming it
    batch_key = "training.local_batch_size" if "local_batch_size" in training else "training.batch_size"
    take_batch(r, micro=batch_key)
    total = r.integer("training.global_batch_size", low=-1)
    if total is not None and total > 0:
        r.take("training.global_batch_size", total, "global_batch", total)
    length = r.integer("training.seq_len", low=1)
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
    if any(name.strip() in ("quantize.linear.float8", "float8") for name in converters):
        r.take("model.converters", ",".join(converters), "float8", 1)
        if r.flag("quantize.linear.float8.enable_fsdp_float8_all_gather"):
            r.take("quantize.linear.float8.enable_fsdp_float8_all_gather", True, "float8_all_gather", 1)
