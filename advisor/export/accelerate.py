"""``accelerate launch --config_file`` YAML for a plan (accelerate 1.15 key names).

Key names follow accelerate's own reader and writer: ``commands/config/config_args.py``
(``ClusterConfig`` fields), ``commands/config/cluster.py`` (the keys ``accelerate config`` writes
into ``fsdp_config`` and ``deepspeed_config``) and ``commands/launch.py`` (how each key becomes a
launcher argument). FSDP is written as FSDP2 (``fsdp_version: 2``), where ``fsdp_reshard_after_forward``
is a bool (``FullyShardedDataParallelPlugin.__post_init__`` rejects strategy names) and hybrid
sharding is a ``parallelism_config`` (``dp_replicate_size`` x ``dp_shard_size``):
``fsdp_sharding_strategy: HYBRID_SHARD`` is read only by FSDP1.

Two launcher facts shape the CPU test config. accelerate starts a ``MULTI_CPU`` config with a
single process unless mpirun is configured (``simple_launcher``); ``MULTI_GPU`` goes through
``torch.distributed.run``, which starts one process per rank on any machine. So ``--cpu`` writes
``distributed_type: MULTI_GPU`` with ``use_cpu: true``; processes then use gloo.

``--compile`` is ``dynamo_config`` with ``dynamo_backend: INDUCTOR`` and ``dynamo_use_regional_compilation: true``
(``commands/config/cluster.py`` writes these keys; ``commands/launch.py`` copies them to ``--dynamo_*`` and
``utils/launch.py`` to ``ACCELERATE_DYNAMO_*``): ``Accelerator.prepare`` then compiles each repeated block
(``utils/other.py`` ``compile_regions``, ``compile_regions_fsdp2`` under FSDP2), the per-block compile the plan
counts. ``--float8`` is ``mixed_precision: fp8`` with ``fp8_config: {backend: AO}`` (torchao Float8Linear,
``Accelerator._prepare_ao``) and ``enable_fsdp_float8_all_gather`` from ``--float8-all-gather`` (the launcher's
default is true, so it is always written).
"""

from __future__ import annotations

from typing import Any

import yaml

from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.export.target import (
    DEFAULT_PORT, GRADIENT_CLIPPING, PLACEHOLDER_IP, PLACEHOLDER_RANK, ExportOptions, ExportTarget, resolve_target,
)

_PLACEHOLDER_COMMENTS = {
    PLACEHOLDER_IP: "FILL IN: IP or hostname of the machine with machine_rank 0, reachable from every node",
    PLACEHOLDER_RANK: "FILL IN: 0 on the main node, 1..num_machines-1 on the others (or pass --machine_rank)",
}


def _fsdp_config(target: ExportTarget) -> dict[str, Any]:
    impl = target.impl
    config: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": impl.reshard_after_forward,
        "fsdp_offload_params": impl.offload_params,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if target.block_classes else "SIZE_BASED_WRAP",
    }
    if target.block_classes:  # one comma-separated string: FullyShardedDataParallelPlugin splits it on ","
        config["fsdp_transformer_layer_cls_to_wrap"] = ",".join(target.block_classes)
    else:
        config["fsdp_min_num_params"] = 100_000_000  # accelerate's own default for size-based wrapping
    config.update({
        "fsdp_activation_checkpointing": target.activation_checkpointing,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        # Rank 0 reads the checkpoint, the others start empty and receive it; the launcher requires
        # sync_module_states with it (utils/launch.py), although FSDP2 itself no longer reads it.
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,
    })
    return config


def _deepspeed_config(target: ExportTarget) -> dict[str, Any]:
    impl = target.impl
    config: dict[str, Any] = {
        "zero_stage": target.zero_stage,
        "offload_optimizer_device": "cpu" if impl.offload_optimizer else "none",
        "offload_param_device": "cpu" if impl.offload_params else "none",
        "gradient_accumulation_steps": target.gradient_accumulation_steps,
        "gradient_clipping": GRADIENT_CLIPPING,
        "zero3_init_flag": target.zero_stage == 3,
    }
    if target.zero_stage == 3:
        config["zero3_save_16bit_model"] = True
    if target.multi_node:
        config["deepspeed_multinode_launcher"] = "standard"  # torch.distributed.run on each node, no pdsh/ssh
    return config


def build_accelerate(plan: Plan, options: ExportOptions | None = None) -> dict[str, Any]:
    """The config as a dict, in the order ``accelerate config`` writes it."""
    return accelerate_doc(resolve_target(plan, "accelerate", options))


def accelerate_doc(target: ExportTarget) -> dict[str, Any]:
    """``build_accelerate`` for a resolved target."""
    if target.engine == "deepspeed":
        distributed_type = "DEEPSPEED"
    elif target.fsdp:
        distributed_type = "FSDP"
    else:
        distributed_type = "MULTI_GPU"  # also for --cpu: see the module docstring
    doc: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": distributed_type}
    if distributed_type == "DEEPSPEED":
        doc["deepspeed_config"] = _deepspeed_config(target)
    if distributed_type == "FSDP":
        doc["fsdp_config"] = _fsdp_config(target)
    if target.mesh is not None:  # the four sizes accelerate's launcher reads (commands/launch.py)
        mesh = target.mesh
        doc["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": mesh.dp_replicate,
            "parallelism_config_dp_shard_size": mesh.dp_shard,
            "parallelism_config_tp_size": mesh.tp,
            "parallelism_config_cp_size": mesh.cp,
        }
        if mesh.cp > 1:
            doc["parallelism_config"]["parallelism_config_cp_backend"] = "torch"
    if target.compile:  # per-block compile (module docstring)
        doc["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True}
    if target.float8:
        doc["fp8_config"] = {"backend": "AO", "enable_fsdp_float8_all_gather": target.float8_all_gather}
    doc.update({
        "machine_rank": PLACEHOLDER_RANK if target.multi_node else 0,
        "mixed_precision": "fp8" if target.float8 else target.precision_info.accelerate,
        "num_machines": target.num_nodes,
        "num_processes": target.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": target.cpu,
    })
    if target.multi_node:
        doc["main_process_ip"] = PLACEHOLDER_IP
        doc["main_process_port"] = DEFAULT_PORT
    return doc


def _comment_lines(text: str) -> list[str]:
    return [f"# {line}" if line else "#" for line in text.splitlines()]


def render_accelerate(plan: Plan, options: ExportOptions | None = None) -> str:
    """YAML with a header saying what it runs and why, and every placeholder marked."""
    return accelerate_text(resolve_target(plan, "accelerate", options), options)


def accelerate_text(target: ExportTarget, options: ExportOptions | None = None) -> str:
    """``render_accelerate`` for a resolved target."""
    doc = accelerate_doc(target)
    per = "process" if target.cpu else "GPU"
    header = [f"accelerate config written by dp-advisor: {target.summary}.",
              f"Launch: accelerate launch --config_file THIS_FILE {(options or ExportOptions()).script} ...",
              f"Per-{per} batch size in the script: {target.micro_batch_size}."]
    if target.engine == "deepspeed":
        header.append(f"gradient_clipping {GRADIENT_CLIPPING:g} is a default, not part of the plan.")
    # FSDP's own flag turns checkpointing on (elsewhere target.checkpointing_notes says how); torch's
    # checkpoint_wrapper (fsdp2_apply_ac) leaves the KV cache on
    if target.activation_checkpointing and target.fsdp:
        header.append("fsdp_activation_checkpointing leaves a model's KV cache on: set model.config.use_cache = False "
                      "in your script (HF Trainer does), or it holds every layer's K/V to the last block's backward.")
    if target.precision == "bf16":
        header.append("Precision bf16 (pure): load the model in torch.bfloat16; there is no fp32 master copy.")
    if target.float8:  # accelerate/utils/ao.py filter_first_and_last_linear_layers, its default module filter
        header.append("fp8 (torchao): accelerate's default filter keeps the model's first and last Linear in bf16 (the "
                      "plan converts every block linear, not the head): pass AORecipeKwargs(module_filter_func=...) "
                      "to Accelerator for the plan's set (wrappers.compile_float8.float8_filter(find_blocks(model))).")
    header += list(target.notes)
    if target.multi_node:
        header.append(f"Several machines: copy this file to each of the {target.num_nodes} nodes, fill in the "
                      "<...> placeholders, and run the same command on every node.")
    lines = ["# " + h for h in header]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    for line in body.splitlines():
        comment = next((c for p, c in _PLACEHOLDER_COMMENTS.items() if p in line), None)
        if line.startswith("main_process_port:") and target.multi_node:
            comment = "a free TCP port on the main node, the same on every node"
        lines.append(f"{line}  # {comment}" if comment else line)
    return "\n".join(lines) + "\n"


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_accelerate, render_accelerate


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return accelerate_text(target, options)
