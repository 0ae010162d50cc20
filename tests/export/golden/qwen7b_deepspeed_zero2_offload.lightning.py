# Lightning strategy written by dp-advisor: zero2_offload on deepspeed (DeepSpeed ZeRO stage 2 + offload_optimizer(cpu)) for Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM: micro-batch 12 of 2,048 tokens, gradient accumulation 1, activation checkpointing on, precision bf16-mixed.
# DeepSpeed runs with lightning's defaults, which this file does not set and the plan assumed (profiles/zero_defaults.json): reduce_bucket_size 200,000,000, overlap_comm true; --format deepspeed-json writes and plans smaller buckets.
# Optimizer: the plan times DeepSpeed's CPU Adam (offload_optimizer): build deepspeed.ops.adam.DeepSpeedCPUAdam(params, adamw_mode=True) and pass it to deepspeed.initialize, or pass none and add an "optimizer" section of type AdamW to this file (DeepSpeed builds its CPU Adam for it); a torch optimizer is refused with offload_optimizer.
# DataLoader batch_size per device: 12.
# Activation checkpointing is part of the plan: call model.gradient_checkpointing_enable().
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy

strategy = DeepSpeedStrategy(
    stage=2,
    offload_optimizer=True,
    offload_parameters=False,
)
trainer = Trainer(
    accelerator="gpu",
    devices=2,
    num_nodes=1,
    strategy=strategy,
    precision="bf16-mixed",
    accumulate_grad_batches=1,
)
