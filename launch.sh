#!/usr/bin/env bash
# torchrun command written by dp-advisor: ddp on torch (DistributedDataParallel) for Qwen/Qwen2.5-0.5B on 1 x A100-80GB-SXM: micro-batch 9, gradient accumulation 1, activation checkpointing off, precision bf16-mixed.
# torchrun starts the processes; the script applies the strategy (e.g. wrappers.wrap()).
# Per-GPU batch size in the script: 9.
# The plan steps the optimizer in backward (--optimizer-in-backward): no file says it; in the script build one optimizer per parameter and a post-accumulate-grad hook that steps it and frees its gradient, as torchtune.training.register_optim_in_bwd_hooks does, or the run holds every gradient the plan did not count.
# Optimizer: the plan assumes bitsandbytes.optim.PagedAdamW8bit(params) (recipe torch, foreach step); build it so in the script.
set -euo pipefail
torchrun --nproc-per-node 1 --nnodes 1 --standalone train.py "$@"
