"""Hugging Face ``TrainingArguments`` keys (transformers 5.x) for a plan, as JSON.

FSDP is ``fsdp: true`` plus ``fsdp_config`` with the keys ``TrainingArguments._process_fsdp_args``
reads (``version``, ``reshard_after_forward``, ``cpu_offload``, ``activation_checkpointing``,
``auto_wrap_policy``, ``transformer_layer_cls_to_wrap``, ``state_dict_type``,
``cpu_ram_efficient_loading``); with FSDP, checkpointing is FSDP's own flag (the top-level one adds
an all-gather in backward, transformers issue 30404). DeepSpeed is the DeepSpeed config inlined
under ``deepspeed``. ``activation_checkpointing`` replaces the deprecated ``gradient_checkpointing``
alias in transformers 5. ``optim`` names the optimizer step the plan counted (``advisor.export.optimizer``:
``adamw_torch_fused`` for fused AdamW, ``adamw_torch`` for foreach). A mesh (HSDP, tp, cp) is
``parallelism_config``. ``--compile`` is ``torch_compile`` with ``torch_compile_backend: inductor`` (the fields
``TrainingArguments.__post_init__`` reads into accelerate's dynamo plugin; it compiles the model as a whole, not
block by block, so graph breaks may differ from the plan's per-block compile). ``--float8`` has no
``TrainingArguments`` key: a note says so (``advisor.export.optimizer``). DDP writes ``ddp_bucket_cap_mb``, the
bucket the plan timed (25 MiB, torch's default): the key that tells DDP from an FSDP chosen by accelerate's own
config, so ``advisor plan --from`` reads the strategy back. FSDP with gradient accumulation planned as reduced every
micro-batch (``--accumulation-sync every_micro_batch``) writes ``accelerator_config``'s
``gradient_accumulation_kwargs: {sync_each_batch: true}``; without it the Trainer keeps every unit's unsharded
gradient until the last micro-batch (``advisor.estimate.accumulation``), the recipe's default.
"""

from __future__ import annotations

import json
from typing import Any

from advisor.planning.api import Plan
from advisor.export.deepspeed import deepspeed_doc
from advisor.export.optimizer import trainer_optim
from advisor.export.target import ExportOptions, ExportTarget, resolve_target
from advisor.hardware.efficiency import load_efficiency
from advisor.model.spec import ModelSpec


def build_trainer_args(plan: Plan, options: ExportOptions | None = None) -> dict[str, Any]:
    return trainer_doc(resolve_target(plan, "trainer-args", options), plan.model)


def trainer_doc(target: ExportTarget, model: ModelSpec) -> dict[str, Any]:
    """``build_trainer_args`` for a resolved target of ``model``."""
    flag = target.precision_info.trainer  # "bf16", "fp16" or None, from the precision table
    args: dict[str, Any] = {
        "per_device_train_batch_size": target.micro_batch_size,
        "gradient_accumulation_steps": target.gradient_accumulation_steps,
        "bf16": flag == "bf16",
        "fp16": flag == "fp16",
        "activation_checkpointing": target.activation_checkpointing and not target.fsdp,
    }
    args.update(trainer_optim(target.optimizer, target.optimizer_impl)[0])  # the step the plan counted
    if target.compile:
        args.update(torch_compile=True, torch_compile_backend="inductor")
    if target.cpu:
        args["use_cpu"] = True
    if target.loss == "fused":
        args["use_liger_kernel"] = True  # Liger's fused linear cross-entropy: the algorithm --loss fused models
    if target.fsdp:
        fsdp_config: dict[str, Any] = {
            "version": 2,
            "reshard_after_forward": target.impl.reshard_after_forward,
            "cpu_offload": target.impl.offload_params,
            "activation_checkpointing": target.activation_checkpointing,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if target.block_classes else "SIZE_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "cpu_ram_efficient_loading": True,
        }
        if target.block_classes:
            fsdp_config["transformer_layer_cls_to_wrap"] = list(target.block_classes)
        else:
            fsdp_config["min_num_params"] = 100_000_000
        args.update(fsdp=True, fsdp_config=fsdp_config)
        if target.gradient_accumulation_steps > 1 and target.accumulation_sync == "every_micro_batch":
            # the plan reduce-scattered every micro-batch (its fp32 shards held), not accelerate's no_sync default
            args["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
        if target.mesh is not None:  # accelerate ParallelismConfig arguments (TrainingArguments.parallelism_config)
            mesh = target.mesh
            args["parallelism_config"] = {"dp_replicate_size": mesh.dp_replicate, "dp_shard_size": mesh.dp_shard,
                                          "tp_size": mesh.tp, "cp_size": mesh.cp}
    elif target.engine == "deepspeed":
        # The same target: every pair the Trainer expresses on DeepSpeed is one a DeepSpeed JSON expresses.
        args["deepspeed"] = deepspeed_doc(target, model)
    elif target.strategy == "ddp" and not target.cpu and target.num_nodes * target.gpus_per_node > 1:
        # DDP's bucket, the one the plan timed (torch's 25 MiB default): says DDP (one GPU runs the plain model)
        args["ddp_bucket_cap_mb"] = load_efficiency().communication.ddp_bucket_bytes // 2**20
    return args


def render_trainer_args(plan: Plan, options: ExportOptions | None = None) -> str:
    return json.dumps(build_trainer_args(plan, options), indent=2) + "\n"


def trainer_text(target: ExportTarget, model: ModelSpec) -> str:
    return json.dumps(trainer_doc(target, model), indent=2) + "\n"


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_trainer_args, render_trainer_args


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return trainer_text(target, model)
