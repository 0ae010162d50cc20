# Lightning strategy written by dp-advisor: ddp on torch (DistributedDataParallel) for Qwen/Qwen2.5-0.5B on 2 x A100-80GB-SXM: micro-batch 8 of 2,048 tokens, gradient accumulation 1, activation checkpointing off, precision bf16-mixed.
# Optimizer: the plan assumes torch.optim.AdamW(params, foreach=True) (recipe lightning, foreach step); build it so in the script.
# DataLoader batch_size per device: 8.
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy

strategy = DDPStrategy()
trainer = Trainer(
    accelerator="gpu",
    devices=2,
    num_nodes=1,
    strategy=strategy,
    precision="bf16-mixed",
    accumulate_grad_batches=1,
)
