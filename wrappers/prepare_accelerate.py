"""``wrap()``'s accelerate path: ``Accelerator().prepare``, then a check that accelerate runs what the
launch asked for, and the precision it really runs (read back, not assumed).

Why the check: ``accelerate launch`` with an FSDP (or DeepSpeed) config on a machine without a GPU
does not fail. ``Accelerator()`` falls back to ``DistributedType.NO`` with ``num_processes=1`` in
every process (the process group still exists), ``prepare`` returns the bare model, and each rank
trains on the whole dataset with no gradient synchronisation, identical losses and exit status 0.
So: the launcher's world size (``WORLD_SIZE``) must equal ``accelerator.num_processes``, and an FSDP
or DeepSpeed config must give ``DistributedType.FSDP`` / ``DEEPSPEED``; otherwise ``RuntimeError``.

The strategy: the row of the strategy table whose ``Implementation`` fields match accelerate's
plugin (FSDP: resharding and offload; DeepSpeed: ZeRO stage and offload devices; several processes
without a plugin: DDP).

The precision: the parameters' dtype after ``prepare`` and accelerate's autocast dtype
(``accelerator.mixed_precision``, spelled as in ``advisor.precision``'s ``accelerate`` column)
name one row of the precision table.

Activation checkpointing: what ``wrap(activation_checkpointing=...)`` asks is applied to the model before
``prepare`` (the exports send selective checkpointing here, as no config key carries it). An FSDP
config's own ``fsdp_activation_checkpointing`` (full, per block) is switched off then, with a warning,
so blocks are not checkpointed twice; without a request it is what runs, and the decision reports it.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch
from torch import nn

from advisor.precision import PRECISIONS, Precision
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import CheckpointMode
from wrappers.checkpointing import apply_requested_checkpointing
from wrappers.launch_env import LaunchEnv
from wrappers.precision import precision_dtypes, precision_named

# accelerate's DistributedType value that each launch plugin must produce.
_PLUGIN_TYPE = {"fsdp": "FSDP", "deepspeed": "DEEPSPEED"}


class Prepared(NamedTuple):
    objects: tuple
    accelerator: Any
    precision: Precision
    strategy: StrategyName | None  # the row of the strategy table accelerate runs, None: no such row
    runs_as: str  # e.g. "FSDP on 2 processes"
    checkpointing: CheckpointMode  # applied, by wrap() before prepare or by accelerate's FSDP plugin


def _strategy_with(engine: str, **fields: bool) -> StrategyName | None:
    """The strategy whose ``engine`` implementation has exactly these ``Implementation`` fields."""
    for name, strategy in STRATEGIES.items():
        impl = strategy.engines.get(engine)
        if impl is not None and impl.available and all(getattr(impl, k) == v for k, v in fields.items()):
            return name
    return None


def _fsdp_strategy(plugin: Any) -> StrategyName | None:
    """FSDP2's ``reshard_after_forward`` is a bool; FSDP1's a ``ShardingStrategy`` (or, deprecated,
    ``sharding_strategy``): FULL_SHARD reshards, SHARD_GRAD_OP keeps, NO_SHARD is DDP, HYBRID_* no row."""
    mode = plugin.reshard_after_forward if plugin.reshard_after_forward is not None else plugin.sharding_strategy
    offload = plugin.cpu_offload
    offload = bool(getattr(offload, "offload_params", False)) or type(offload).__name__ == "CPUOffloadPolicy"
    if isinstance(mode, bool):
        reshard = mode
    else:
        name = getattr(mode, "name", str(mode)).upper()
        if name == "NO_SHARD":
            return _strategy_with("torch", shard_params=False, shard_optimizer=False, single_process=False)
        if name not in ("FULL_SHARD", "SHARD_GRAD_OP"):
            return None
        reshard = name == "FULL_SHARD"
    return _strategy_with("torch", shard_params=True, reshard_after_forward=reshard, offload_params=offload)


def _deepspeed_strategy(plugin: Any) -> StrategyName | None:
    stage = int(plugin.zero_stage or 0)
    return _strategy_with("deepspeed", shard_optimizer=stage >= 1, shard_grads=stage >= 2, shard_params=stage == 3,
                          offload_optimizer=plugin.offload_optimizer_device in ("cpu", "nvme"),
                          offload_params=plugin.offload_param_device in ("cpu", "nvme"))


def accelerate_strategy(distributed_type: str, state: Any) -> StrategyName | None:
    """What accelerate runs, as a row of the strategy table (by its ``Implementation`` fields)."""
    if distributed_type == "FSDP":
        return _fsdp_strategy(state.fsdp_plugin)
    if distributed_type == "DEEPSPEED":
        return _deepspeed_strategy(state.deepspeed_plugin)
    if distributed_type.startswith("MULTI_"):  # MULTI_GPU, MULTI_CPU, ...: DistributedDataParallel
        return _strategy_with("torch", shard_params=False, shard_optimizer=False, single_process=False)
    return None


def _compute_dtype(mixed_precision: str) -> torch.dtype | None:
    """accelerate's autocast dtype for its ``mixed_precision`` value: the compute dtype of the precision
    table's mixed row spelled so; None for the value only unmixed rows spell (fp32's "no")."""
    spelled = [name for name, info in PRECISIONS.items() if info.accelerate == mixed_precision]
    rows = [name for name in spelled if PRECISIONS[name].mixed]
    if spelled and not rows:
        return None
    if not rows:
        raise RuntimeError(f"wrap(): accelerate runs mixed_precision={mixed_precision!r}, which the advisor's "
                           "precision table does not describe; use wrap(engine=\"torch\") or bf16/fp16/no")
    return precision_dtypes(rows[0]).compute_dtype


def running_precision(model: nn.Module, mixed_precision: str, distributed_type: str) -> Precision:
    """The precision ``model`` trains in after ``prepare``: its parameters' dtype and accelerate's autocast.

    DeepSpeed is the exception: its engine casts the module to bf16/fp16 and keeps fp32 master
    weights in the optimizer, which is the table's mixed row for that dtype (its ``deepspeed`` block).
    """
    if distributed_type == "DEEPSPEED":
        compute = _compute_dtype(mixed_precision)
        return "fp32" if compute is None else precision_named(torch.float32, compute)
    stored = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(stored) != 1:
        raise RuntimeError(f"wrap(): parameters after accelerate's prepare are in {sorted(map(str, stored))}, "
                           "not one dtype; the precision is not one the advisor describes")
    param_dtype = stored.pop()
    compute = _compute_dtype(mixed_precision)
    return precision_named(param_dtype, None if compute == param_dtype else compute)


def launch_problem(env: LaunchEnv, plugin: str | None, distributed_type: str, num_processes: int) -> str | None:
    """What differs between the launch (``env``, the ``plugin`` asked for) and what accelerate set up."""
    if num_processes != env.world_size:
        return (f"the launcher started {env.world_size} processes (WORLD_SIZE={env.world_size}) but accelerate "
                f"runs {distributed_type} on {num_processes}")
    expected = _PLUGIN_TYPE.get(plugin or "")
    if expected is not None and distributed_type != expected:
        return (f"the launch asks for {plugin} but accelerate runs {distributed_type} "
                f"on {num_processes} process(es)")
    return None


def _wrapping_problem(model: nn.Module, distributed_type: str, num_processes: int) -> str | None:
    """Whether the prepared model is wrapped as ``distributed_type`` says (by class: accelerate's FSDP1
    ``FullyShardedDataParallel`` or FSDP2 ``FSDPModule``, ``DeepSpeedEngine``, or DDP)."""
    names = {cls.__name__ for cls in type(model).__mro__}
    expected = {"FSDP": {"FullyShardedDataParallel", "FSDPModule"}, "DEEPSPEED": {"DeepSpeedEngine"}}.get(
        distributed_type, {"DistributedDataParallel"} if num_processes > 1 else None)
    if expected is None or names & expected:
        return None
    return f"the prepared model is a {type(model).__name__}, not {' or '.join(sorted(expected))}"


def _apply_checkpointing(model: nn.Module, accelerator: Any,
                         asked: CheckpointMode | None) -> CheckpointMode:
    """Checkpointing before ``prepare``: the one asked for (the FSDP plugin's own turned off), else the
    plugin's (full, per block). Returns the mode that will run."""
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)
    plugin_checkpoints = bool(getattr(fsdp_plugin, "activation_checkpointing", False))
    if asked in ("on", "selective"):
        if plugin_checkpoints:
            warnings.warn(f"wrap(activation_checkpointing={asked!r}) replaces the accelerate config's "
                          "fsdp_activation_checkpointing (full, per block)", stacklevel=3)
            fsdp_plugin.activation_checkpointing = False
        return apply_requested_checkpointing(model, asked)
    if plugin_checkpoints and asked == "off":
        warnings.warn("wrap(activation_checkpointing=False) is ignored: the accelerate config sets "
                      "fsdp_activation_checkpointing, which accelerate applies", stacklevel=3)
    return "on" if plugin_checkpoints else "off"


def prepare_with_accelerate(objects: list, env: LaunchEnv, plugin: str | None, *,
                            checkpointing: CheckpointMode | None = None) -> Prepared:
    """``Accelerator().prepare(*objects)``, checked against ``env`` and the ``plugin`` ("fsdp",
    "deepspeed" or None) the launch asks for; ``RuntimeError`` on a mismatch. ``checkpointing``: the
    activation checkpointing to apply to the model (``objects[0]``) first."""
    from accelerate import Accelerator

    accelerator = Accelerator()
    checkpointing = _apply_checkpointing(objects[0], accelerator, checkpointing)
    prepared = accelerator.prepare(*objects)
    prepared = prepared if isinstance(prepared, tuple) else (prepared,)
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    problem = launch_problem(env, plugin, kind, accelerator.num_processes)
    if problem is not None:
        raise RuntimeError(
            f"wrap(): {problem}. accelerate falls back without saying so (FSDP and DeepSpeed need CUDA GPUs; "
            "without them every process runs alone), and then each rank would train on the whole dataset "
            "with no gradient synchronisation and exit 0. Run this config on GPUs, export a CPU config for a "
            "CPU cluster, or start the script with `advisor launch` / torchrun so that wrap() applies the "
            "torch recipe itself."
        )
    model_problem = _wrapping_problem(prepared[0], kind, accelerator.num_processes)
    if model_problem is not None:
        raise RuntimeError(f"wrap(): accelerate reports {kind} on {accelerator.num_processes} process(es), but "
                           f"{model_problem}; the decision would not describe the model that trains.")
    precision = running_precision(prepared[0], accelerator.mixed_precision, kind)
    strategy = accelerate_strategy(kind, accelerator.state)
    return Prepared(prepared, accelerator, precision, strategy, f"{kind} on {accelerator.num_processes} process(es)",
                    checkpointing)
