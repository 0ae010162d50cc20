# Lightning strategy written by dp-advisor: zero3 on torch (FSDP2 fully_shard(reshard_after_forward=True)) for Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM: micro-batch 1, gradient accumulation 1, activation checkpointing off, precision bf16-mixed.
# DataLoader batch_size per device: 1.
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

strategy = FSDPStrategy(
    sharding_strategy="FULL_SHARD",
    auto_wrap_policy={Qwen2DecoderLayer},
    cpu_offload=False,
    state_dict_type="sharded",
)
trainer = Trainer(
    accelerator="gpu",
    devices=2,
    num_nodes=1,
    strategy=strategy,
    precision="bf16-mixed",
    accumulate_grad_batches=1,
)
