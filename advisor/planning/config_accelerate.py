"""The accelerate YAML reader (``advisor plan --from accelerate_config.yaml``).

Which keys it reads, and what they mean, from the framework's own definitions: accelerate YAML
(``accelerate config``; accelerate/commands/config/config_args.py ``ClusterConfig`` and the ``fsdp_config`` /
``deepspeed_config`` keys of accelerate/utils/dataclasses.py ``FullyShardedDataParallelPlugin`` /
``DeepSpeedPlugin``): ``num_processes`` counts every process of every machine; ``fsdp_sharding_strategy``
FULL_SHARD (1) / SHARD_GRAD_OP (2) / NO_SHARD (3) / HYBRID_SHARD (4) / HYBRID_SHARD_ZERO2 (5);
``fsdp_reshard_after_forward`` is FSDP2's bool (or, for FSDP1, one of those names); ``fsdp_offload_params``
offloads parameters, gradients and optimizer state; ``fsdp_version`` 1 (accelerate's default) plans FSDP1
(``TrainingConfig.fsdp_version``), 2 FSDP2.
"""

from __future__ import annotations

from pathlib import Path

from advisor.planning.config_deepspeed import OFFLOAD_DEVICES, read_nested_deepspeed, take_zero_strategy, zero_keys_read
from advisor.planning.config_file import (SHARDING, Reader, ddp_strategy, fsdp_strategy, named_deepspeed,
                                          precision_for, take_batch, take_degrees)
from advisor.recipes import zero_config_defaults

# An accelerate config runs the stack the accelerate export plans with (advisor/export/formats.py's row:
# the Trainer through accelerate, fused AdamW), so reading our own export back reproduces its plan.
ACCELERATE_RECIPE = "trainer"


def read_accelerate(r: Reader, base: Path) -> None:
    kind = r.raw("distributed_type") or "NO"
    if not isinstance(kind, str) or kind.upper() not in ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED"):
        raise r.fail("distributed_type", f"{kind!s:.40} is not planned (dp-advisor plans NO, MULTI_GPU, FSDP and "
                     "DEEPSPEED)")
    kind = kind.upper()
    if r.flag("use_cpu"):
        raise r.fail("use_cpu", "is true: a CPU run (dp-advisor plans GPUs)")
    processes, machines = r.integer("num_processes", low=1), r.integer("num_machines", low=1) or 1
    if kind == "NO" and r.raw("distributed_type") is not None:  # accelerate launch's simple launcher: one process
        if processes is not None and processes > 1:
            r.notes.append(f"num_processes {processes}: distributed_type NO runs one process whatever it says "
                           "(accelerate launch's simple launcher)")
        r.take("distributed_type", "NO: one process", "num_gpus", 1)
    elif processes is not None:
        if processes % machines:
            raise r.fail("num_processes", f"{processes} is not divisible by num_machines {machines}")
        r.take("num_processes", processes, "num_gpus", processes)
        if machines > 1:
            r.take("num_machines", machines, "nodes", machines)
    mixed = r.choice("mixed_precision", {"no": "no", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"})
    if mixed == "fp8" and _accelerate_float8(r, kind):
        r.take("mixed_precision", mixed, "precision", "bf16-mixed")  # AO: bf16 autocast around Float8Linear
    elif mixed == "fp8":
        r.notes.append("mixed_precision fp8 is not modelled: planned with --precision's default")
    elif mixed is not None:
        r.take("mixed_precision", mixed, "precision", precision_for("accelerate", mixed))
    else:  # the launcher passes none; Accelerator(mixed_precision=None) reads ACCELERATE_MIXED_PRECISION, default "no"
        r.notes.append("mixed_precision not set: accelerate runs fp32 (its default no) unless the script's "
                       "Accelerator(mixed_precision=...) or the Trainer's bf16 / fp16 sets it; planned with "
                       "--precision's default")
    _accelerate_compile(r)
    if r.section("parallelism_config") is not None:  # accelerate's ParallelismConfig (FSDP2 / TP / CP mesh)
        take_degrees(r, "parallelism_config.parallelism_config_", {"dp_replicate_size": "hybrid", "tp_size": "tp",
                                                              "cp_size": "cp"}, implied="dp_shard_size")
    if kind != "DEEPSPEED":
        r.take("distributed_type", kind, "recipe", ACCELERATE_RECIPE)
    if kind == "MULTI_GPU":
        ddp_strategy(r, "distributed_type", kind)
    elif kind == "FSDP":
        _accelerate_fsdp(r, machines)
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(r, base)


def _accelerate_float8(r: Reader, kind: str) -> bool:
    """``fp8_config`` with backend AO is torchao Float8Linear, the planner's --float8 (TE and MS-AMP are not)."""
    backend = r.text("fp8_config.backend")
    if backend is None or backend.upper() != "AO":
        return False
    r.take("fp8_config.backend", backend, "float8", 1)
    gather = r.flag("fp8_config.enable_fsdp_float8_all_gather")  # the launcher's default is true
    if kind == "FSDP" and gather is not False:
        r.take("fp8_config.enable_fsdp_float8_all_gather", True if gather is None else gather, "float8_all_gather", 1)
    return True


def _accelerate_compile(r: Reader) -> None:
    """``dynamo_config`` with the inductor backend is the planner's --compile (modelled per block)."""
    backend = r.text("dynamo_config.dynamo_backend")
    if backend is None or backend.upper() == "NO":
        return
    if backend.upper() != "INDUCTOR":
        r.notes.append(f"dynamo_backend {backend} is not modelled: planned eager")
        return
    r.take("dynamo_config.dynamo_backend", backend, "compile", 1)
    if not r.flag("dynamo_config.dynamo_use_regional_compilation"):
        r.notes.append("dynamo_config compiles the whole model; the plan models each block compiled "
                       "(dynamo_use_regional_compilation: true)")


def _accelerate_fsdp(r: Reader, machines: int) -> None:
    r.section("fsdp_config")
    version = r.choice("fsdp_config.fsdp_version", {"1": 1, "2": 2})
    key, sharding = "fsdp_config.fsdp_sharding_strategy", r.choice("fsdp_config.fsdp_sharding_strategy", SHARDING)
    raw = r.raw("fsdp_config.fsdp_reshard_after_forward")
    # FSDP1's flat parameters (advisor.estimate.fsdp1_buffers). A file that names no version runs FSDP1 too:
    # ``accelerate launch --fsdp_version`` defaults to "1" (accelerate/commands/launch.py) and so does the
    # plugin (utils/dataclasses.py ``FullyShardedDataParallelPlugin``: FSDP_VERSION, else 1), unless its
    # reshard_after_forward is FSDP2's bool, which the FSDP1 plugin refuses ("not supported with FSDP1").
    fsdp2_bool = isinstance(raw, bool) or (isinstance(raw, str) and raw.lower() in ("true", "false"))
    if version == 1:
        r.take("fsdp_config.fsdp_version", 1, "fsdp_version", 1)
    elif version is None and not fsdp2_bool:
        r.take("distributed_type", "FSDP, no fsdp_version: accelerate launch's default 1", "fsdp_version", 1)
    if isinstance(raw, bool) or (isinstance(raw, str) and raw.lower() in ("true", "false")):
        hybrid = bool(sharding and sharding[1])  # HYBRID_SHARD still says replicate across machines
        key, sharding = "fsdp_config.fsdp_reshard_after_forward", (r.flag("fsdp_config.fsdp_reshard_after_forward"), hybrid)
    elif raw is not None:  # FSDP1 spelt its sharding strategy here too (accelerate >= 1.6)
        key, sharding = "fsdp_config.fsdp_reshard_after_forward", r.choice("fsdp_config.fsdp_reshard_after_forward", SHARDING)
    elif version == 2:
        # FSDP2 with no reshard key: accelerate launch's --fsdp_reshard_after_forward defaults to "true"
        # (commands/launch.py), and FullyShardedDataParallelPlugin reads sharding_strategy under fsdp_version 1 only
        if r.raw(key) is not None:
            r.notes.append(f"fsdp_sharding_strategy {r.raw(key)} is FSDP1's: accelerate's FSDP2 ignores it and "
                           "reshards after forward (fsdp_reshard_after_forward's default true), as zero3")
        key, sharding = "fsdp_config.fsdp_version", (True, False)
    elif sharding is None and r.raw(key) is None:
        key, sharding = "distributed_type", (True, False)  # accelerate's default: FULL_SHARD
    checkpointing = r.flag("fsdp_config.fsdp_activation_checkpointing")
    if checkpointing is not None:
        r.take("fsdp_config.fsdp_activation_checkpointing", checkpointing, "activation_checkpointing",
               "on" if checkpointing else "off")
    if sharding is None:  # NO_SHARD: DDP
        ddp_strategy(r, key, "NO_SHARD")
        return
    offload = bool(r.flag("fsdp_config.fsdp_offload_params"))
    reshard, hybrid = sharding
    said = r.raw(key)
    fsdp_strategy(r, key, reshard=reshard, offload=offload,
                  value=str(said).lower() if isinstance(said, bool) else str(said if said is not None else "FSDP"))
    if hybrid and machines > 1:
        where = "fsdp_config.fsdp_sharding_strategy" if "fsdp_sharding_strategy" in r.doc["fsdp_config"] else key
        r.take(where, str(r.raw(where)), "hybrid", machines)
    elif hybrid:
        r.notes.append("HYBRID_SHARD on one machine shards within it, as FULL_SHARD does")


def _accelerate_deepspeed(r: Reader, base: Path) -> None:
    r.section("deepspeed_config")
    path = r.text("deepspeed_config.deepspeed_config_file")
    if path:
        sub = read_nested_deepspeed(r, named_deepspeed(r, "deepspeed_config.deepspeed_config_file", path, base),
                                    f"{Path(path).name}:")
        r.take("deepspeed_config.deepspeed_config_file", path, "recipe", "deepspeed" if "optimizer" in sub.doc else "torch")
        return
    stage = r.integer("deepspeed_config.zero_stage")
    devices = [r.choice(f"deepspeed_config.{k}", OFFLOAD_DEVICES) for k in ("offload_optimizer_device", "offload_param_device")]
    said = str(stage)
    if stage is None:  # DeepSpeedPlugin: zero_stage = int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", 2))
        stage, said = 2, "not set: accelerate's default 2"
    if stage > 3:
        raise r.fail("deepspeed_config.zero_stage", f"must be 0, 1, 2 or 3, got {stage}")
    take_zero_strategy(r, "deepspeed_config.zero_stage", said, stage=stage, optimizer=devices[0], params=devices[1])
    defaults = zero_config_defaults("accelerate")  # the config accelerate builds sets no bucket size
    for name in zero_keys_read(stage):
        value = getattr(defaults, name)
        r.take("deepspeed_config", "no deepspeed_config_file: accelerate leaves DeepSpeed's defaults",
               f"zero.{name}", str(value).lower() if isinstance(value, bool) else value)
    take_batch(r, accumulation="deepspeed_config.gradient_accumulation_steps")
    r.take("distributed_type", "DEEPSPEED", "recipe", ACCELERATE_RECIPE)  # the script's own torch optimizer
