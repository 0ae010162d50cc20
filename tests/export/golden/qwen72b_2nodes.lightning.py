# Lightning strategy written by dp-advisor: zero3_offload on torch (FSDP2 fully_shard(reshard_after_forward=True, offload_policy=CPUOffloadPolicy())) for Qwen/Qwen2.5-72B on 2 nodes x 8 x H100-80GB-SXM: micro-batch 11, gradient accumulation 1, activation checkpointing on, precision bf16-mixed, hybrid sharding (HSDP).
# Hybrid sharding (HSDP): one node's share of the model states fits, so parameters are sharded over the 8 GPUs of each node and replicated over the 2 nodes (only the gradient all-reduce crosses nodes). --hybrid off to disable.
# DataLoader batch_size per device: 11.
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

strategy = FSDPStrategy(
    sharding_strategy="HYBRID_SHARD",
    auto_wrap_policy={Qwen2DecoderLayer},
    activation_checkpointing_policy={Qwen2DecoderLayer},
    cpu_offload=True,
    state_dict_type="sharded",
)
trainer = Trainer(
    accelerator="gpu",
    devices=8,
    num_nodes=2,
    strategy=strategy,
    precision="bf16-mixed",
    accumulate_grad_batches=1,
)
