"""A Lightning (``lightning.pytorch``) strategy snippet for a plan, as Python source text.

``DDPStrategy()``, ``FSDPStrategy(...)`` or ``DeepSpeedStrategy(stage=...)`` plus the ``Trainer``
arguments that go with it (devices, nodes, precision, accumulation). Lightning's ``FSDPStrategy``
takes FSDP1-style arguments: ``sharding_strategy`` FULL_SHARD (zero3), SHARD_GRAD_OP (zero2) or
HYBRID_SHARD / _HYBRID_SHARD_ZERO2 (torch's ``ShardingStrategy`` names), ``cpu_offload``,
``auto_wrap_policy`` and ``activation_checkpointing_policy`` as sets of block classes, ``state_dict_type``. The block class is imported from transformers'
``models.<model_type>.modeling_<model_type>`` module, where transformers defines it.
"""

from __future__ import annotations

from advisor.planning.api import Plan
from advisor.export.target import ExportOptions, ExportTarget, resolve_target

def _block_import(target: ExportTarget) -> str | None:
    if not (target.block_class and target.model_type):
        return None
    module = target.model_type.replace("-", "_")
    return f"from transformers.models.{module}.modeling_{module} import {target.block_class}"


def _strategy(target: ExportTarget) -> tuple[str, list[str]]:
    """(class name, keyword lines) of the strategy."""
    if target.engine == "deepspeed":
        return "DeepSpeedStrategy", [f"stage={target.zero_stage}",
                                     f"offload_optimizer={target.impl.offload_optimizer}",
                                     f"offload_parameters={target.impl.offload_params}"]
    if not target.fsdp:
        return "DDPStrategy", []
    if target.hybrid:
        sharding = "HYBRID_SHARD" if target.impl.reshard_after_forward else "_HYBRID_SHARD_ZERO2"
    else:
        sharding = "FULL_SHARD" if target.impl.reshard_after_forward else "SHARD_GRAD_OP"
    kwargs = [f'sharding_strategy="{sharding}"']
    if target.block_class and target.model_type:
        kwargs.append(f"auto_wrap_policy={{{target.block_class}}}")
        if target.activation_checkpointing:
            kwargs.append(f"activation_checkpointing_policy={{{target.block_class}}}")
    kwargs += [f"cpu_offload={target.impl.offload_params}", 'state_dict_type="sharded"']
    return "FSDPStrategy", kwargs


def build_lightning(plan: Plan, options: ExportOptions | None = None) -> str:
    """Python source: imports, ``strategy = ...`` and ``trainer = Trainer(...)``."""
    return lightning_text(resolve_target(plan, "lightning", options))


def lightning_text(target: ExportTarget) -> str:
    """``build_lightning`` for a resolved target."""
    cls, kwargs = _strategy(target)
    lines = [f"# Lightning strategy written by dp-advisor: {target.summary}."]
    lines += [f"# {note}" for note in target.notes]
    lines.append(f"# DataLoader batch_size per device: {target.micro_batch_size}.")
    if target.activation_checkpointing and cls != "FSDPStrategy":
        lines.append("# Activation checkpointing is part of the plan: call model.gradient_checkpointing_enable().")
    elif target.activation_checkpointing and "activation_checkpointing_policy" not in " ".join(kwargs):
        lines.append("# Activation checkpointing is part of the plan: enable it in the model (block class unknown).")
    if target.fsdp and not (target.block_class and target.model_type):
        lines.append("# Block class unknown: pass auto_wrap_policy={YourBlock} to wrap per block.")
    lines += ["from lightning.pytorch import Trainer", f"from lightning.pytorch.strategies import {cls}"]
    block_import = _block_import(target) if cls == "FSDPStrategy" else None
    if block_import:
        lines.append(block_import)
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
        f'    precision="{target.precision_info.lightning}",',
        f"    accumulate_grad_batches={target.gradient_accumulation_steps},",
        ")",
    ]
    return "\n".join(lines) + "\n"


def render_lightning(plan: Plan, options: ExportOptions | None = None) -> str:
    return build_lightning(plan, options)
