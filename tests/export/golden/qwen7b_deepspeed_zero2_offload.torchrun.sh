#!/usr/bin/env bash
# torchrun command written by dp-advisor: zero2_offload on deepspeed (DeepSpeed ZeRO stage 2 + offload_optimizer(cpu)) for Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM: micro-batch 12 of 2,048 tokens, gradient accumulation 1, activation checkpointing on, precision bf16-mixed.
# torchrun starts the processes; the script applies the strategy (e.g. wrappers.wrap()).
# Per-GPU batch size in the script: 12.
# Activation checkpointing is part of the plan and this file has no key for it: call model.gradient_checkpointing_enable() in the script (the Trainer: TrainingArguments(activation_checkpointing=True); wrap() applies the plan's own); the plan's memory assumes it.
# Optimizer: the plan times DeepSpeed's CPU Adam (offload_optimizer): build deepspeed.ops.adam.DeepSpeedCPUAdam(params, adamw_mode=True) and pass it to deepspeed.initialize, or pass none and add an "optimizer" section of type AdamW to this file (DeepSpeed builds its CPU Adam for it); a torch optimizer is refused with offload_optimizer.
set -euo pipefail
torchrun --nproc-per-node 2 --nnodes 1 --standalone train.py "$@"
