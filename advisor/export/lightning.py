"""A Lightning (``lightning.pytorch``) strategy snippet for a plan, as Python source text.

``DDPStrategy()``, ``DeepSpeedStrategy(stage=...)`` or, for the torch engine's sharded strategies,
FSDP2 through ``ModelParallelStrategy`` (Lightning 2.4+), plus the ``Trainer`` arguments that go
with it (devices, nodes, precision, accumulation). Lightning's ``FSDPStrategy`` is FSDP1
(``FullyShardedDataParallel`` wrappers, ``sharding_strategy``) and is not what the plan measured;
``ModelParallelStrategy`` builds a device mesh and leaves the sharding to the LightningModule's
``configure_model()`` (it raises ``TypeError`` in ``setup`` when the hook is missing). The snippet
therefore defines ``shard_model(model, device_mesh)``, which does what ``wrappers.fsdp.apply_fsdp``
does: ``fully_shard`` each block, then the root, with the strategy table's ``reshard_after_forward``
and offload, and the precision table's ``MixedPrecisionPolicy`` dtypes.

Blocks are matched by class name, as accelerate's ``TRANSFORMER_BASED_WRAP`` and ``wrap()`` match
them, so nothing is imported from a modeling module: a composite model (Llava: the block is the
language model's ``LlamaDecoderLayer``, defined in ``modeling_llama``, not ``modeling_llava``)
needs no import path, and the vision tower's layers are not blocks.

Precision: under FSDP2 the mixed precisions are the ``MixedPrecisionPolicy`` (bf16/fp16 all-gathered
parameters and compute, fp32 gradient reduction, fp32 sharded master parameters), so the Trainer
runs the row's parameter dtype without autocast (``32-true``; ``bf16-true`` for pure bf16, whose
model is cast before sharding). ``ModelParallelStrategy`` accepts ``32-true``, ``bf16-mixed``,
``bf16-true`` and ``16-true`` only (``_validate_precision_choice`` in Lightning 2.6's accelerator
connector): fp16-mixed has no loss scaler there, which the header says.
"""

from __future__ import annotations

from advisor.export.target import ExportOptions, ExportTarget, resolve_target
from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.precision import PRECISIONS


def _trainer_precision(target: ExportTarget) -> str:
    """Lightning's precision string: the table's, or under FSDP2 that of the unmixed row with the same
    parameter dtype (the MixedPrecisionPolicy does the low-precision compute)."""
    info = target.precision_info
    if not target.fsdp or not info.mixed:
        return info.lightning
    unmixed = next(p for p in PRECISIONS.values() if not p.mixed and p.param_dtype == info.param_dtype)
    return unmixed.lightning


def _precision_comment(target: ExportTarget) -> str:
    info = target.precision_info
    if target.fsdp and info.mixed:
        return f"  # {info.compute_dtype} compute: shard_model's MixedPrecisionPolicy; fp32 master parameters"
    return ""


def _shard_function(target: ExportTarget) -> list[str]:
    """``shard_model``: FSDP2 per block, then the root, as ``wrappers.fsdp.apply_fsdp`` applies it."""
    info, impl = target.precision_info, target.impl
    names = ", ".join(f'"{name}"' for name in target.block_classes)
    known = (f"BLOCK_CLASSES = ({names}{',' if len(target.block_classes) == 1 else ''})  # one FSDP unit each, "
             "matched by class name (like accelerate's TRANSFORMER_BASED_WRAP)")
    unknown = "BLOCK_CLASSES = ()  # block classes unknown: name your blocks' classes to shard per block"
    lines = ["", "", known if target.block_classes else unknown, "", "",
             "def shard_model(model: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:",
             '    """FSDP2: fully_shard each BLOCK_CLASSES module, then the root. Call it in configure_model()."""']
    if target.hybrid:  # the plan's mesh: dp_replicate replicas, each sharded over dp_shard ranks
        mesh = target.mesh
        lines += [f"    # HSDP: replicate over {mesh.dp_replicate} groups, shard over {mesh.dp_shard} ranks in each.",
                  f"    mesh = init_device_mesh(device_mesh.device_type, ({mesh.dp_replicate}, "
                  f"{mesh.dp_shard}), mesh_dim_names=(\"replicate\", \"shard\"))"]
    else:
        lines.append('    mesh = device_mesh["data_parallel"]')
    if info.name == "bf16":
        lines.append("    model.to(torch.bfloat16)  # pure bf16: no fp32 master copy")
    lines += ["", "    def is_block(module: torch.nn.Module) -> bool:",
              "        return type(module).__name__ in BLOCK_CLASSES", ""]
    if target.activation_checkpointing:
        # torch's checkpoint_wrapper leaves a Hugging Face model's KV cache on (transformers turns it off only in
        # its own gradient_checkpointing_enable): each layer's K/V would live to the last block's backward and be
        # appended again by the recomputation (advisor.estimate.kv_cache). wrap() turns it off the same way.
        lines += ["    if getattr(getattr(model, \"config\", None), \"use_cache\", False):",
                  "        model.config.use_cache = False  # checkpoint_wrapper leaves the KV cache on: it would hold "
                  "every layer's K/V",
                  "    apply_activation_checkpointing(model, checkpoint_wrapper_fn="
                  + ("functools.partial(checkpoint_wrapper, context_fn=selective_context)"  # wrappers' per-op policy
                     if target.selective_checkpointing else "checkpoint_wrapper") + ", check_fn=is_block)",
                  "    blocks = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]"]
    else:
        lines.append("    blocks = [m for m in model.modules() if is_block(m)]")
    options = ["mesh=mesh", f"reshard_after_forward={impl.reshard_after_forward}",
               f"offload_policy={'CPUOffloadPolicy()' if impl.offload_params else 'OffloadPolicy()'}"]
    if info.mixed:
        options.append(f"mp_policy=MixedPrecisionPolicy(param_dtype=torch.{info.compute_dtype}, "
                       "reduce_dtype=torch.float32)")
    lines += ["    options = dict("] + [f"        {option}," for option in options]
    lines += ["    )",
              "    for block in blocks:",
              "        fully_shard(block, **options)",
              "    fully_shard(model, **options)",
              "    return model"]
    return lines


def _imports(target: ExportTarget, cls: str) -> list[str]:
    lines = ["from lightning.pytorch import Trainer", f"from lightning.pytorch.strategies import {cls}"]
    if not target.fsdp:
        return lines
    fsdp = ["CPUOffloadPolicy" if target.impl.offload_params else "OffloadPolicy", "fully_shard"]
    if target.precision_info.mixed:
        fsdp.insert(0, "MixedPrecisionPolicy")
    mesh = "DeviceMesh, init_device_mesh" if target.hybrid else "DeviceMesh"
    lines = ["import torch"] + lines + [f"from torch.distributed.device_mesh import {mesh}",
                                        f"from torch.distributed.fsdp import {', '.join(sorted(fsdp))}"]
    if target.activation_checkpointing:
        lines.insert(-2, "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
                     "    CheckpointWrapper, apply_activation_checkpointing, checkpoint_wrapper,\n)")
    if target.selective_checkpointing:  # torchtitan's per-op policy, as wrap() applies it (wrappers.checkpointing)
        lines.insert(0, "import functools")
        lines.append("from wrappers.checkpointing import selective_context")
    return lines


def _strategy(target: ExportTarget) -> tuple[str, list[str]]:
    """(class name, keyword lines) of the strategy."""
    if target.engine == "deepspeed":
        return "DeepSpeedStrategy", [f"stage={target.zero_stage}",
                                     f"offload_optimizer={target.impl.offload_optimizer}",
                                     f"offload_parameters={target.impl.offload_params}"]
    if not target.fsdp:
        return "DDPStrategy", []
    # One data-parallel dimension over every rank: the sampler gives each rank its own data; HSDP
    # builds its 2-D (replicate, shard) mesh in shard_model.
    return "ModelParallelStrategy", [f"data_parallel_size={target.world_size}", "tensor_parallel_size=1"]


def _header(target: ExportTarget, cls: str) -> list[str]:
    per = "process" if target.cpu else "device"
    lines = [f"# Lightning strategy written by dp-advisor: {target.summary}."]
    lines += [f"# {note}" for note in target.notes]
    lines.append(f"# DataLoader batch_size per {per}: {target.micro_batch_size}.")
    if target.fsdp:
        lines.append("# FSDP2 (fully_shard) through ModelParallelStrategy: in your LightningModule, "
                     "def configure_model(self): shard_model(self.model, self.device_mesh)")
        lines.append("# (configure_model can run more than once: skip it when the model is already sharded.)")
        if not target.block_classes:
            lines.append("# Block classes unknown: set BLOCK_CLASSES below, or only the root is sharded (one unit).")
        if target.precision_info.mixed and target.precision_info.compute_dtype == "float16":
            lines.append("# fp16 without a loss scaler: ModelParallelStrategy has no 16-mixed; prefer bf16-mixed "
                         "or --engine deepspeed.")
    elif target.selective_checkpointing:
        lines.append("# Selective activation checkpointing is part of the plan: call "
                     "wrappers.checkpointing.apply_requested_checkpointing(model, \"selective\") before fit().")
    elif target.activation_checkpointing:
        lines.append("# Activation checkpointing is part of the plan: call model.gradient_checkpointing_enable().")
    return lines


def lightning_text(target: ExportTarget) -> str:
    """``build_lightning`` for a resolved target."""
    cls, kwargs = _strategy(target)
    lines = _header(target, cls) + _imports(target, cls)
    if target.fsdp:
        lines += _shard_function(target)
        lines += ["", ""]
    else:
        lines.append("")
    if kwargs:
        lines += [f"strategy = {cls}("] + [f"    {kw}," for kw in kwargs] + [")"]
    else:
        lines.append(f"strategy = {cls}()")
    lines += [
        "trainer = Trainer(",
        f'    accelerator="{"cpu" if target.cpu else "gpu"}",',
        f"    devices={target.gpus_per_node},",
        f"    num_nodes={target.num_nodes},",
        "    strategy=strategy,",
        f'    precision="{_trainer_precision(target)}",{_precision_comment(target)}',
        f"    accumulate_grad_batches={target.gradient_accumulation_steps},",
        ")",
    ]
    return "\n".join(lines) + "\n"


def build_lightning(plan: Plan, options: ExportOptions | None = None) -> str:
    """Python source: imports, (FSDP2) ``shard_model``, ``strategy = ...`` and ``trainer = Trainer(...)``."""
    return lightning_text(resolve_target(plan, "lightning", options))


def render_lightning(plan: Plan, options: ExportOptions | None = None) -> str:
    return build_lightning(plan, options)


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_lightning, render_lightning


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return lightning_text(target)
