#!/usr/bin/env bash
# torchrun command written by dp-advisor: zero3_offload on torch (FSDP2 fully_shard(reshard_after_forward=True, offload_policy=CPUOffloadPolicy())) for Qwen/Qwen2.5-72B on 2 nodes x 8 x H100-80GB-SXM: micro-batch 9 of 2,048 tokens, gradient accumulation 1, activation checkpointing on, precision bf16-mixed.
# torchrun starts the processes; the script applies the strategy (e.g. wrappers.wrap()).
# Per-GPU batch size in the script: 9.
# Activation checkpointing is part of the plan and this file has no key for it: call model.gradient_checkpointing_enable() in the script (the Trainer: TrainingArguments(activation_checkpointing=True); wrap() applies the plan's own); the plan's memory assumes it.
# Optimizer: the plan assumes torch.optim.AdamW(params, foreach=True) (recipe torch, foreach step); build it so in the script.
# Run on each of the 2 nodes after filling in <MACHINE_RANK> (0..1) and <MAIN_NODE_IP> (the rank-0 node).
set -euo pipefail
torchrun --nproc-per-node 8 --nnodes 2 --node-rank '<MACHINE_RANK>' --master-addr '<MAIN_NODE_IP>' --master-port 29500 train.py "$@"
