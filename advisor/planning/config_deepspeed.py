"""The DeepSpeed JSON reader (``advisor plan --from ds_config.json``), also run on the DeepSpeed config an
accelerate YAML or a TrainingArguments JSON names.

Which keys it reads, and what they mean, from the framework's own definitions: DeepSpeed JSON
(deepspeed.ai/docs/config-json): ``zero_optimization.stage``, ``offload_optimizer`` / ``offload_param``
devices, ``bf16`` / ``fp16`` blocks, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``train_batch_size``, ``optimizer.type``, the ZeRO bucket sizes and ``overlap_comm`` (``take_zero_sizes``);
``"auto"`` is filled in by the Trainer or accelerate, so it is left to the plan.
"""

from __future__ import annotations

from typing import Any

from advisor.planning.config_file import Reader, strategy_for, take_batch, take_precision
from advisor.recipes import zero_config_defaults

OFFLOAD_DEVICES = {"none": None, "cpu": "cpu", "nvme": "nvme"}  # offload_*.device -> the device planned for


def take_zero_strategy(r: Reader, key: str, value: str, *, stage: int, optimizer: str | None, params: str | None) -> None:
    """The strategy of a ZeRO stage and its offload devices (nvme is planned as CPU offload)."""
    if "nvme" in (optimizer, params):
        r.notes.append(f"{r.prefix}{key}: NVMe offload is planned as CPU offload (NVMe bandwidth is not modelled)")
    flags = dict(shard_optimizer=stage >= 1, shard_grads=stage >= 2, shard_params=stage == 3,
                 reshard_after_forward=stage == 3)
    offload_optimizer, offload_params = optimizer is not None, params is not None and stage == 3
    if params is not None and stage < 3:
        r.notes.append(f"{r.prefix}{key}: offload_param needs ZeRO-3; DeepSpeed ignores it at stage {stage}")
    name = strategy_for("deepspeed", **flags, offload_optimizer=offload_optimizer, offload_params=offload_params)
    if name is None and stage == 3:  # ZeRO-3 with one of the two offloaded: the table offloads both
        name = "zero3_offload"
        r.notes.append(f"{r.prefix}{key}: ZeRO-3 with only {'offload_optimizer' if offload_optimizer else 'offload_param'} "
                       "is planned as zero3_offload (both offloaded)")
    if name is None:  # ZeRO-0/1 with offload_optimizer: DeepSpeed offloads from stage 1, the table from stage 2
        name = strategy_for("deepspeed", **flags, offload_optimizer=False, offload_params=False)
        r.notes.append(f"{r.prefix}{key}: offload_optimizer at stage {stage} is not modelled; planned without it")
    value += "".join(f", {part} {device}" for part, device in (("offload_optimizer", optimizer), ("offload_param", params))
                     if device is not None)
    r.take(key, value, "engine", "deepspeed")
    r.take(key, value, "strategy", name)  # type: ignore[arg-type]


def read_deepspeed(r: Reader) -> None:
    """A DeepSpeed config (standalone, accelerate's deepspeed_config_file, or the Trainer's ``deepspeed``). No
    ``zero_optimization.stage`` is DeepSpeed's default, stage 0 (deepspeed/runtime/zero/config.py
    DeepSpeedZeroConfig.stage: ZeroStageEnum.disabled): the data-parallel engine, no state sharded."""
    devices: list[str | None] = [None, None]
    stage = None
    if r.section("zero_optimization") is not None:
        stage = r.integer("zero_optimization.stage")
        if stage is not None and stage > 3:
            raise r.fail("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage}")
        for i, part in enumerate(("offload_optimizer", "offload_param")):
            if r.section(f"zero_optimization.{part}") is not None:
                devices[i] = r.choice(f"zero_optimization.{part}.device", OFFLOAD_DEVICES)
        if r.flag("zero_optimization.cpu_offload"):  # the old spelling of offload_optimizer: cpu
            devices[0] = "cpu"
    if stage is not None:
        take_zero_strategy(r, "zero_optimization.stage", str(stage), stage=stage, optimizer=devices[0], params=devices[1])
        take_zero_sizes(r, stage)
    elif f"{r.prefix}zero_optimization.stage" in r.auto:
        _auto_stage(r, devices)
    else:
        take_zero_strategy(r, "zero_optimization.stage", "not set: DeepSpeed's default 0", stage=0,
                           optimizer=devices[0], params=devices[1])
    for block in ("bf16", "bfloat16", "fp16"):  # DeepSpeedBF16Config(**value): a bool is no block DeepSpeed reads
        if block in r.doc and not isinstance(r.doc[block], dict):
            raise r.fail(block, f'must be a block such as {{"enabled": true}}, got {r.doc[block]!r:.40} (DeepSpeed '
                                "refuses anything else)")
    bf16_key = "bfloat16.enabled" if "bfloat16" in r.doc else "bf16.enabled"
    take_precision(r, "deepspeed", bf16_key, "fp16.enabled")
    take_batch(r, micro="train_micro_batch_size_per_gpu", accumulation="gradient_accumulation_steps", total="train_batch_size")
    if r.section("optimizer") is not None:
        kind = r.text("optimizer.type")
        if kind is not None and kind.lower() in ("adam", "adamw"):
            r.take("optimizer.type", kind, "optimizer", kind.lower())
        elif kind is not None:
            r.notes.append(f"{r.prefix}optimizer.type {kind} is not modelled: planned with --optimizer's default")
        if r.flag("optimizer.params.torch_adam"):  # torch.optim.Adam(W) with its default, foreach on CUDA
            r.take("optimizer.params.torch_adam", True, "optimizer_impl", "foreach")


def _auto_stage(r: Reader, devices: list[str | None]) -> None:
    """``"stage": "auto"``: no stage DeepSpeed takes (DeepSpeedZeroConfig.stage is 0 to 3), and the Trainer's own
    "auto" filling (HfTrainerDeepSpeedConfig.trainer_config_process) leaves it; accelerate's DeepSpeedPlugin, which
    the Trainer builds too, fills it from its zero_stage (the accelerate config's, else ACCELERATE_DEEPSPEED_ZERO_STAGE
    or 2: accelerate/utils/dataclasses.py). The file still runs DeepSpeed; which stage is left to the plan."""
    key = "zero_optimization.stage"
    r.auto.remove(f"{r.prefix}{key}")  # said on its own line, not again among the keys not read
    r.take(key, "auto: the stage left to the plan", "engine", "deepspeed")
    given = [f"{part} {device}" for part, device in (("offload_optimizer", devices[0]), ("offload_param", devices[1]))
             if device is not None]
    r.notes.append(f"{r.prefix}{key} 'auto' is no stage DeepSpeed itself takes: accelerate (and the Trainer, through "
                   "it) fills it from accelerate's zero_stage, 2 unless its config sets one; the plan picks the stage"
                   + (f" and whether to offload ({', '.join(given)} is read with a stage only)" if given else ""))


ZERO_SIZES = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
              "sub_group_size")


def zero_keys_read(stage: int) -> tuple[str, ...]:
    """The ``zero_optimization`` keys of ``advisor.recipes.ZeroSettings`` that DeepSpeed reads at ``stage``:
    none at stage 0; the stage-3 sizes at stage 3 (which keeps its one IPG buffer with or without
    overlap_comm); the all-gather bucket and overlap_comm below it; the reduce bucket at every stage."""
    if stage == 0:
        return ()
    stage3 = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "sub_group_size")
    return ("reduce_bucket_size",) + (stage3 if stage == 3 else ("allgather_bucket_size", "overlap_comm"))


MAX_ZERO_ELEMENTS = 10**12  # a bucket or sub-group past a trillion elements is no model's: a typo, refused in one line


def take_zero_sizes(r: Reader, stage: int) -> None:
    """The bucket sizes and overlap_comm under ``zero_optimization`` that ``stage`` reads (the plan's
    ``zero`` settings): a number is taken, ``"auto"`` is left to the plan (the Trainer and accelerate fill it
    from the hidden size, as the planner does), and a key the file leaves out runs at DeepSpeed's own
    default (profiles/zero_defaults.json), which is taken and said so."""
    defaults = zero_config_defaults("deepspeed")
    for name in zero_keys_read(stage):
        key = f"zero_optimization.{name}"
        if name == "overlap_comm":
            value = r.flag(key)
            value = None if value is None else str(value).lower()
        else:
            value = r.integer(key, low=1 if name != "stage3_prefetch_bucket_size" else 0, high=MAX_ZERO_ELEMENTS)
        if value is not None:
            r.take(key, value, f"zero.{name}", value)
        elif f"{r.prefix}{key}" not in r.auto:
            default = getattr(defaults, name)
            shown = str(default).lower() if isinstance(default, bool) else f"{default:,}"
            r.take(key, f"not set: DeepSpeed's default {shown}", f"zero.{name}",
                   str(default).lower() if isinstance(default, bool) else default)


def read_nested_deepspeed(r: Reader, doc: dict[str, Any], prefix: str) -> Reader:
    """Read a DeepSpeed config named inside another file and take its values into ``r``."""
    sub = Reader(doc, where=r.where, prefix=prefix)
    read_deepspeed(sub)
    for value in sub.values:
        r.take(value.key, value.value, value.option, value.setting)
    r.notes.extend(sub.notes)
    r.nested.extend(sub.unread())
    return sub
