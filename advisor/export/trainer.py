"""Hugging Face ``TrainingArguments`` keys (transformers 5.x) for a plan, as JSON.

FSDP is ``fsdp: true`` plus ``fsdp_config`` with the keys ``TrainingArguments._process_fsdp_args``
reads (``version``, ``reshard_after_forward``, ``cpu_offload``, ``activation_checkpointing``,
``auto_wrap_policy``, ``transformer_layer_cls_to_wrap``, ``state_dict_type``,
``cpu_ram_efficient_loading``); with FSDP, checkpointing is FSDP's own flag (the top-level one adds
an all-gather in backward, transformers issue 30404). DeepSpeed is the DeepSpeed config inlined
under ``deepspeed``. ``activation_checkpointing`` replaces the deprecated ``gradient_checkpointing``
alias in transformers 5. Hybrid sharding has no Trainer key with FSDP2: use the accelerate config.
"""

from __future__ import annotations

import json
from typing import Any

from advisor.planning.api import Plan
from advisor.export.deepspeed import build_deepspeed
from advisor.export.target import ExportOptions, resolve_target


def build_trainer_args(plan: Plan, options: ExportOptions | None = None) -> dict[str, Any]:
    target = resolve_target(plan, "trainer-args", options)
    args: dict[str, Any] = {
        "per_device_train_batch_size": target.micro_batch_size,
        "gradient_accumulation_steps": target.gradient_accumulation_steps,
        "bf16": target.mixed_precision == "bf16" and not target.cpu,
        "fp16": target.mixed_precision == "fp16" and not target.cpu,
        "activation_checkpointing": target.activation_checkpointing and not target.fsdp,
    }
    if target.cpu:
        args["use_cpu"] = True
    if target.fsdp:
        fsdp_config: dict[str, Any] = {
            "version": 2,
            "reshard_after_forward": target.impl.reshard_after_forward,
            "cpu_offload": target.impl.offload_params,
            "activation_checkpointing": target.activation_checkpointing,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if target.block_class else "SIZE_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "cpu_ram_efficient_loading": True,
        }
        if target.block_class:
            fsdp_config["transformer_layer_cls_to_wrap"] = [target.block_class]
        else:
            fsdp_config["min_num_params"] = 100_000_000
        args.update(fsdp=True, fsdp_config=fsdp_config)
    elif target.engine == "deepspeed":
        # The DeepSpeed target of this same plan: build_deepspeed resolves it the same way.
        args["deepspeed"] = build_deepspeed(plan, options)
    return args


def render_trainer_args(plan: Plan, options: ExportOptions | None = None) -> str:
    return json.dumps(build_trainer_args(plan, options), indent=2) + "\n"
