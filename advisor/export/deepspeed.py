"""A DeepSpeed JSON config (``deepspeed.initialize(config=...)``, ``--deepspeed_config_file``,
``TrainingArguments(deepspeed=...)``) for a plan.

Keys from the DeepSpeed config reference (deepspeed.ai/docs/config-json): batch sizes, ``bf16`` /
``fp16``, ``gradient_clipping`` and ``zero_optimization`` (stage, offload_optimizer, offload_param,
overlap_comm, contiguous_gradients, bucket sizes). Every value is concrete, never ``"auto"``: the
file works with plain DeepSpeed, and accelerate's ``DeepSpeedPlugin(hf_ds_config=...)`` reads
stage and offload devices back from it. The plan must be a DeepSpeed plan (``advisor export`` plans this
format with the ``deepspeed`` recipe); a torch plan is refused rather than re-estimated here. Activation checkpointing is the model's own
(``gradient_checkpointing_enable()``), not DeepSpeed's ``activation_checkpointing`` section, which
serves Megatron-style models.
"""

from __future__ import annotations

import json
from typing import Any

from advisor.planning.api import Plan
from advisor.export.target import GRADIENT_CLIPPING, ExportOptions, ExportTarget, resolve_target
from advisor.estimate.buckets import deepspeed_buckets
from advisor.model.spec import ModelSpec
from advisor.recipes import ZeroSettings


def _zero_optimization(target: ExportTarget, model: ModelSpec, settings: ZeroSettings | None) -> dict[str, Any]:
    impl = target.impl
    zero: dict[str, Any] = {"stage": target.zero_stage}
    # The bucket sizes the memory and step-time estimates assumed (one function owns them), with those
    # the user's own config fixed (``--from``).
    buckets = deepspeed_buckets(model, settings)
    if target.zero_stage >= 1:
        # Overlap the reduce with backward and keep gradients in one buffer (DeepSpeed's recommended
        # settings for ZeRO-2/3; ZeRO paper section 7 on fragmentation).
        overlap = settings is None or settings.overlap_comm is not False
        zero.update({"overlap_comm": overlap, "contiguous_gradients": True,
                     "reduce_bucket_size": buckets.reduce_elements})
    if target.zero_stage in (1, 2):
        zero.update({"allgather_partitions": True, "allgather_bucket_size": buckets.allgather_elements, "reduce_scatter": True})
    if impl.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if impl.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if target.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = buckets.prefetch_elements
        zero["stage3_max_live_parameters"] = buckets.max_live_parameters
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if settings is not None and settings.sub_group_size is not None:
            zero["sub_group_size"] = settings.sub_group_size
    return zero


def build_deepspeed(plan: Plan, options: ExportOptions | None = None) -> dict[str, Any]:
    return deepspeed_doc(resolve_target(plan, "deepspeed-json", options), plan.model)


def deepspeed_doc(target: ExportTarget, model: ModelSpec) -> dict[str, Any]:
    """``build_deepspeed`` for a resolved DeepSpeed target of ``model``."""
    assert target.engine == "deepspeed", target.engine
    block = target.precision_info.deepspeed  # the table's "bf16" / "fp16" block, or None for fp32
    micro, accum = target.micro_batch_size, target.gradient_accumulation_steps
    doc: dict[str, Any] = {
        "train_batch_size": micro * accum * target.data_parallel_size,  # Ulysses ranks share a sample
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": block == "bf16"},
        "fp16": {"enabled": block == "fp16"},
        "zero_optimization": _zero_optimization(target, model, target.zero),
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if block == "fp16":
        doc["fp16"].update({"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                            "hysteresis": 2, "min_loss_scale": 1})
    return doc


def render_deepspeed(plan: Plan, options: ExportOptions | None = None) -> str:
    """JSON has no comments: what the file runs and any substitution are printed by the CLI."""
    return json.dumps(build_deepspeed(plan, options), indent=2) + "\n"


def deepspeed_text(target: ExportTarget, model: ModelSpec) -> str:
    return json.dumps(deepspeed_doc(target, model), indent=2) + "\n"


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_deepspeed, render_deepspeed


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return deepspeed_text(target, model)
