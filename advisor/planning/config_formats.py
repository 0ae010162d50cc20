"""One reader per training-config format (``advisor plan --from FILE``), and ``read_config_file``.

Which keys each reads, and what they mean, from the frameworks' own definitions:

- accelerate YAML (``accelerate config``; accelerate/commands/config/config_args.py ``ClusterConfig`` and
  the ``fsdp_config`` / ``deepspeed_config`` keys of accelerate/utils/dataclasses.py
  ``FullyShardedDataParallelPlugin`` / ``DeepSpeedPlugin``): ``num_processes`` counts every process of
  every machine; ``fsdp_sharding_strategy`` FULL_SHARD (1) / SHARD_GRAD_OP (2) / NO_SHARD (3) /
  HYBRID_SHARD (4) / HYBRID_SHARD_ZERO2 (5); ``fsdp_reshard_after_forward`` is FSDP2's bool (or, for
  FSDP1, one of those names); ``fsdp_offload_params`` offloads parameters, gradients and optimizer state.
- DeepSpeed JSON (deepspeed.ai/docs/config-json): ``zero_optimization.stage``, ``offload_optimizer`` /
  ``offload_param`` devices, ``bf16`` / ``fp16`` blocks, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``, ``train_batch_size``, ``optimizer.type``; ``"auto"`` is filled in
  by the Trainer or accelerate, so it is left to the plan.
- torchtitan TOML (torchtitan/config/job_config.py): ``[parallelism]`` degrees (``data_parallel_shard_degree
  = -1`` takes the remaining GPUs), ``fsdp_reshard_after_forward`` default / always / never,
  ``[training] local_batch_size`` (``batch_size`` before), ``global_batch_size``, ``seq_len``,
  ``mixed_precision_param``, ``[activation_checkpoint] mode`` none / selective / full, ``[optimizer]
  name`` and ``implementation``.
- TrainingArguments JSON (transformers/training_args.py): ``per_device_train_batch_size``,
  ``gradient_accumulation_steps``, ``bf16`` / ``fp16``, ``optim`` (transformers/trainer_optimizer.py maps
  ``adamw_torch`` to torch.optim.AdamW's default, foreach on CUDA, and ``adamw_torch_fused`` to fused=True),
  ``gradient_checkpointing`` (``activation_checkpointing`` in transformers 5), ``fsdp`` / ``fsdp_config``,
  ``deepspeed`` (a DeepSpeed config inline or a path), ``use_liger_kernel``, ``parallelism_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from advisor.planning.config_file import (ConfigFile, Reader, beside, fsdp_strategy, load_json, precision_for,
                                          strategy_for, take_batch, take_precision)

_OFFLOAD_DEVICES = {"none": None, "cpu": "cpu", "nvme": "nvme"}
# FSDP sharding names and accelerate's numbers for them -> (reshard_after_forward, hybrid); None: NO_SHARD.
_SHARDING: dict[str, tuple[bool, bool] | None] = {
    "FULL_SHARD": (True, False), "SHARD_GRAD_OP": (False, False), "NO_SHARD": None, "HYBRID_SHARD": (True, True),
    "HYBRID_SHARD_ZERO2": (False, True), "_HYBRID_SHARD_ZERO2": (False, True),
    "1": (True, False), "2": (False, False), "3": None, "4": (True, True), "5": (False, True)}
_TRAINER_OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw_torch_fused": ("adamw", "fused"), "adamw_torch": ("adamw", "foreach"), "adamw_apex_fused": ("adamw", "fused"),
    "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None), "paged_adamw_8bit": ("adamw-8bit", None),
    "adafactor": ("adafactor", None), "sgd": ("sgd", None)}
_FORMAT = "(file format)"


def _zero_strategy(r: Reader, key: str, value: str, *, stage: int, optimizer: str | None, params: str | None) -> None:
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
    """A DeepSpeed config (standalone, accelerate's deepspeed_config_file, or the Trainer's ``deepspeed``)."""
    if r.section("zero_optimization") is not None:
        stage = r.integer("zero_optimization.stage")
        if stage is not None and stage > 3:
            raise r.fail("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage}")
        devices = []
        for part in ("offload_optimizer", "offload_param"):
            device = None
            if r.section(f"zero_optimization.{part}") is not None:
                device = r.choice(f"zero_optimization.{part}.device", _OFFLOAD_DEVICES)
            devices.append(device)
        if r.flag("zero_optimization.cpu_offload"):  # the old spelling of offload_optimizer: cpu
            devices[0] = "cpu"
        if stage is not None:
            _zero_strategy(r, "zero_optimization.stage", str(stage), stage=stage, optimizer=devices[0], params=devices[1])
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


def _accelerate_fsdp(r: Reader, machines: int) -> None:
    r.section("fsdp_config")
    version = r.choice("fsdp_config.fsdp_version", {"1": 1, "2": 2})
    if version == 1:
        r.notes.append("fsdp_version 1 (FSDP1, flat parameters) is planned as FSDP2 (fully_shard)")
    key, sharding = "fsdp_config.fsdp_sharding_strategy", r.choice("fsdp_config.fsdp_sharding_strategy", _SHARDING)
    raw = r.raw("fsdp_config.fsdp_reshard_after_forward")
    if isinstance(raw, bool) or (isinstance(raw, str) and raw.lower() in ("true", "false")):
        hybrid = bool(sharding and sharding[1])  # HYBRID_SHARD still says replicate across machines
        key, sharding = "fsdp_config.fsdp_reshard_after_forward", (r.flag("fsdp_config.fsdp_reshard_after_forward"), hybrid)
    elif raw is not None:  # FSDP1 spelt its sharding strategy here too (accelerate >= 1.6)
        key, sharding = "fsdp_config.fsdp_reshard_after_forward", r.choice("fsdp_config.fsdp_reshard_after_forward", _SHARDING)
    elif sharding is None and r.raw(key) is None:
        key, sharding = "distributed_type", (True, False)  # accelerate's default: FULL_SHARD
    checkpointing = r.flag("fsdp_config.fsdp_activation_checkpointing")
    if checkpointing is not None:
        r.take("fsdp_config.fsdp_activation_checkpointing", checkpointing, "activation_checkpointing",
               "on" if checkpointing else "off")
    if sharding is None:  # NO_SHARD: DDP
        r.take(key, "NO_SHARD", "engine", "torch")
        r.take(key, "NO_SHARD", "strategy", "ddp")
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
        sub = _merge(r, load_json(beside(path, base, r)), f"{Path(path).name}:")
        r.take("deepspeed_config.deepspeed_config_file", path, "recipe", "deepspeed" if "optimizer" in sub.doc else "torch")
        return
    stage = r.integer("deepspeed_config.zero_stage")
    devices = [r.choice(f"deepspeed_config.{k}", _OFFLOAD_DEVICES) for k in ("offload_optimizer_device", "offload_param_device")]
    if stage is not None:
        if stage > 3:
            raise r.fail("deepspeed_config.zero_stage", f"must be 0, 1, 2 or 3, got {stage}")
        _zero_strategy(r, "deepspeed_config.zero_stage", str(stage), stage=stage, optimizer=devices[0], params=devices[1])
    else:
        r.take("distributed_type", "DEEPSPEED", "engine", "deepspeed")
    take_batch(r, accumulation="deepspeed_config.gradient_accumulation_steps")
    r.take("distributed_type", "DEEPSPEED", "recipe", ACCELERATE_RECIPE)  # the script's own torch optimizer


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
    if processes is not None:
        if processes % machines:
            raise r.fail("num_processes", f"{processes} is not divisible by num_machines {machines}")
        r.take("num_processes", processes, "num_gpus", processes)
        if machines > 1:
            r.take("num_machines", machines, "nodes", machines)
    mixed = r.choice("mixed_precision", {"no": "no", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"})
    if mixed == "fp8":
        r.notes.append("mixed_precision fp8 is not modelled: planned with --precision's default")
    elif mixed is not None:
        r.take("mixed_precision", mixed, "precision", precision_for("accelerate", mixed))
    if r.section("parallelism_config") is not None:  # accelerate's ParallelismConfig (FSDP2 / TP / CP mesh)
        _degrees(r, "parallelism_config.parallelism_config_", {"dp_replicate_size": "hybrid", "tp_size": "tp",
                                                              "cp_size": "cp"}, implied="dp_shard_size")
    if kind != "DEEPSPEED":
        r.take("distributed_type", kind, "recipe", ACCELERATE_RECIPE)
    if kind == "MULTI_GPU":
        r.take("distributed_type", kind, "engine", "torch")
        r.take("distributed_type", kind, "strategy", "ddp")
    elif kind == "FSDP":
        _accelerate_fsdp(r, machines)
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(r, base)


def _degrees(r: Reader, prefix: str, options: dict[str, str], *, implied: str) -> None:
    """Mesh degrees above 1 pin --hybrid (replicas), --tp, --cp; 1 is data parallelism alone, the default.
    ``implied`` (the shard degree) follows from the GPU count and the others."""
    for field, option in options.items():
        number = r.integer(prefix + field, low=1)
        if number is not None and number > 1:
            r.take(prefix + field, number, option, number)
    r.raw(prefix + implied)


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
    reshard = r.choice("parallelism.fsdp_reshard_after_forward", {"default": True, "always": True, "never": False})
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
    batch_key = "training.local_batch_size" if "local_batch_size" in r.doc.get("training", {}) else "training.batch_size"
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
    model = r.section("model")
    if model is not None:
        r.notes.append(f"[model] {model.get('name', '?')} {model.get('flavor', '')}: give the model with --model "
                       "(torchtitan flavors are not mapped to checkpoints)".replace("  ", " "))
        r.read.update({"model.name", "model.flavor"})
    r.take(_FORMAT, "torchtitan", "recipe", "torchtitan")
    r.take(_FORMAT, "torchtitan", "engine", "torch")


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


def read_trainer(r: Reader, base: Path) -> None:
    take_batch(r, micro="per_device_train_batch_size", accumulation="gradient_accumulation_steps")
    take_precision(r, "trainer", "bf16", "fp16")
    optim = r.text("optim")
    optim = optim.lower() if optim is not None else None
    if optim in _TRAINER_OPTIM:
        optimizer, impl = _TRAINER_OPTIM[optim]
        r.take("optim", optim, "optimizer", optimizer)
        if impl is not None:
            r.take("optim", optim, "optimizer_impl", impl)
    elif optim is not None:
        r.notes.append(f"optim {optim} is not modelled: planned with --optimizer's default")
    if r.flag("use_liger_kernel"):
        r.take("use_liger_kernel", True, "loss", "fused")
    fsdp_checkpointing = _trainer_fsdp(r)
    # Checkpointing is on when any of its keys says so: with FSDP, fsdp_config's own flag is the one that
    # counts and the top-level one is false (transformers issue 30404; advisor export writes it that way).
    said = {key: r.flag(key) for key in ("gradient_checkpointing", "activation_checkpointing")}
    said["fsdp_config.activation_checkpointing"] = fsdp_checkpointing
    given = {key: on for key, on in said.items() if on is not None}
    if given:
        key = next((k for k, on in given.items() if on), next(iter(given)))
        r.take(key, given[key], "activation_checkpointing", "on" if given[key] else "off")
    _trainer_deepspeed(r, base)
    if r.section("parallelism_config") is not None:
        _degrees(r, "parallelism_config.", {"dp_replicate_size": "hybrid", "tp_size": "tp", "cp_size": "cp"},
                 implied="dp_shard_size")
    r.take(_FORMAT, "TrainingArguments", "recipe", "trainer")


def _trainer_fsdp(r: Reader) -> bool | None:
    """FSDP from ``fsdp`` / ``fsdp_config``; returns fsdp_config's activation_checkpointing (None: not given)."""
    raw = r.raw("fsdp")
    if raw is None or raw is False or raw == "" or raw == []:
        return None
    if not isinstance(raw, (bool, str, list)):
        raise r.fail("fsdp", "must be true, a string such as 'full_shard auto_wrap', or a list of such words")
    words = _words(raw).lower().split()
    if "no_shard" in words:
        r.take("fsdp", raw, "engine", "torch")
        r.take("fsdp", raw, "strategy", "ddp")
        return None
    config = r.raw("fsdp_config")
    if isinstance(config, str):
        r.notes.append(f"fsdp_config {config[:40]} is a file: not read (its keys may change the plan)")
        config = None
    elif config is not None and not isinstance(config, dict):
        raise r.fail("fsdp_config", "must be a mapping of keys or a file path")
    # TrainingArguments strips the fsdp_ prefix of fsdp_config keys (training_args.py _process_fsdp_args).
    sub = Reader({k.removeprefix("fsdp_"): v for k, v in (config or {}).items()}, where=r.where, prefix="fsdp_config.")
    key, value = "fsdp", _words(raw)
    reshard = not any(w in ("shard_grad_op", "hybrid_shard_zero2") for w in words)
    written = sub.raw("reshard_after_forward")
    if written is not None:
        key, value = "fsdp_config.reshard_after_forward", str(written).lower()
        if isinstance(written, bool) or str(written).lower() in ("true", "false"):
            reshard = bool(sub.flag("reshard_after_forward"))
        else:  # FSDP1 spelt a sharding strategy here
            reshard = (sub.choice("reshard_after_forward", _SHARDING) or (False, False))[0]
    offload = bool(sub.flag("cpu_offload")) or bool(sub.flag("offload_params")) or "offload" in words
    if sub.raw("version") not in (None, 2):
        r.notes.append("fsdp_config.version 1 (FSDP1, flat parameters) is planned as FSDP2 (fully_shard)")
    fsdp_strategy(r, key, reshard=reshard, offload=offload, value=value)
    checkpointing = sub.flag("activation_checkpointing")
    if any(w.startswith("hybrid_shard") for w in words):
        r.notes.append("fsdp hybrid_shard: replicas across nodes are planned with --hybrid N (the Trainer "
                       "arguments do not say how many nodes)")
    r.nested.extend(sub.unread())
    return checkpointing


def _words(raw: Any) -> str:
    return raw if isinstance(raw, str) else " ".join(map(str, raw)) if isinstance(raw, list) else str(raw).lower()


def _trainer_deepspeed(r: Reader, base: Path) -> None:
    raw = r.raw("deepspeed")
    if raw is None or raw == "":
        return
    if isinstance(raw, str):
        doc, prefix = load_json(beside(raw, base, r)), f"{Path(raw).name}:"
    elif isinstance(raw, dict):
        doc, prefix = raw, "deepspeed."
    else:
        raise r.fail("deepspeed", "must be a DeepSpeed config (a mapping) or the path of one")
    _merge(r, doc, prefix)
    r.take("deepspeed", "DeepSpeed config", "engine", "deepspeed")


def _merge(r: Reader, doc: dict[str, Any], prefix: str) -> Reader:
    """Read a DeepSpeed config named inside another file and take its values into ``r``."""
    sub = Reader(doc, where=r.where, prefix=prefix)
    read_deepspeed(sub)
    for value in sub.values:
        r.take(value.key, value.value, value.option, value.setting)
    r.notes.extend(sub.notes)
    r.nested.extend(sub.unread())
    return sub


_TRAINER_KEYS = ("per_device_train_batch_size", "output_dir", "optim", "fsdp", "deepspeed", "gradient_checkpointing",
                 "activation_checkpointing", "learning_rate", "num_train_epochs", "gradient_accumulation_steps")
_DEEPSPEED_KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")


def _json_format(doc: dict[str, Any], path: Path) -> str:
    if any(key in doc for key in _DEEPSPEED_KEYS) or isinstance(doc.get("bf16"), dict) or isinstance(doc.get("fp16"), dict):
        return "deepspeed"
    if any(key in doc for key in _TRAINER_KEYS) or isinstance(doc.get("bf16"), bool):
        return "trainer"
    raise ValueError(f"--from {path}: neither a DeepSpeed config (no zero_optimization, train_micro_batch_size_per_gpu "
                     "or bf16/fp16 block) nor TrainingArguments (no per_device_train_batch_size, bf16, optim, ...)")


def _parse(path: Path) -> tuple[str, dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"--from {path}: not a text file") from None
    if suffix in (".yaml", ".yml"):
        import yaml  # PyYAML (accelerate's dependency): only for a YAML file

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"--from {path}: not valid YAML ({' '.join(str(err).split())[:120]})") from None
        kind = "accelerate"
    elif suffix == ".toml":
        import tomllib

        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--from {path}: not valid TOML ({' '.join(str(err).split())[:120]})") from None
        kind = "torchtitan"
    elif suffix == ".json":
        doc = load_json(path)
        kind = _json_format(doc, path)
    else:
        raise ValueError(f"--from {path}: unknown format '{suffix or path.name}': give an accelerate .yaml, a DeepSpeed "
                         "or TrainingArguments .json, or a torchtitan .toml")
    if not isinstance(doc, dict):
        raise ValueError(f"--from {path}: the file holds no mapping of keys")
    return kind, doc


_READERS: dict[str, Callable[[Reader, Path], None]] = {
    "accelerate": read_accelerate,
    "deepspeed": lambda r, base: (read_deepspeed(r), r.take(_FORMAT, "DeepSpeed", "recipe", "deepspeed")),
    "torchtitan": lambda r, base: read_torchtitan(r),
    "trainer": read_trainer,
}


def read_config_file(path: str | Path) -> ConfigFile:
    """Read ``path`` (format from its suffix, and for JSON from its keys) into the plan settings it fixes."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--from {path}: no such file")
    kind, doc = _parse(path)
    reader = Reader(doc, where=str(path))
    _READERS[kind](reader, path.parent)
    return ConfigFile(path=str(path), format=kind, values=tuple(reader.values),  # type: ignore[arg-type]
                      not_read=tuple(reader.unread()), notes=tuple(reader.notes))
