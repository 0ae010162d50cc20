#!/usr/bin/env bash
# torchrun command written by dp-advisor: zero3 on torch (FSDP2 fully_shard(reshard_after_forward=True)) for Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM: micro-batch 1 of 2,048 tokens, gradient accumulation 1, activation checkpointing off, precision bf16-mixed.
# torchrun starts the processes; the script applies the strategy (e.g. wrappers.wrap()).
# Per-GPU batch size in the script: 1.
# Optimizer: the plan assumes torch.optim.AdamW(params, foreach=True) (recipe torch, foreach step); build it so in the script.
set -euo pipefail
torchrun --nproc-per-node 2 --nnodes 1 --standalone train.py "$@"
