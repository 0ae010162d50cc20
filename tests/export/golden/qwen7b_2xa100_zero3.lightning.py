# Lightning strategy written by dp-advisor: zero3 on torch (FSDP2 fully_shard(reshard_after_forward=True)) for Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM: micro-batch 1 of 2,048 tokens, gradient accumulation 1, activation checkpointing selective, precision bf16-mixed.
# Optimizer: the plan assumes torch.optim.AdamW(params, foreach=True) (recipe lightning, foreach step); build it so in the script.
# DataLoader batch_size per device: 1.
# FSDP2 (fully_shard) through ModelParallelStrategy: in your LightningModule, def configure_model(self): shard_model(self.model, self.device_mesh)
# (configure_model can run more than once: skip it when the model is already sharded.)
import functools
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper, apply_activation_checkpointing, checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard
from wrappers.checkpointing import selective_context


BLOCK_CLASSES = ("Qwen2DecoderLayer",)  # one FSDP unit each, matched by class name (like accelerate's TRANSFORMER_BASED_WRAP)


def shard_model(model: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
    """FSDP2: fully_shard each BLOCK_CLASSES module, then the root. Call it in configure_model()."""
    mesh = device_mesh["data_parallel"]

    def is_block(module: torch.nn.Module) -> bool:
        return type(module).__name__ in BLOCK_CLASSES

    if getattr(getattr(model, "config", None), "use_cache", False):
        model.config.use_cache = False  # checkpoint_wrapper leaves the KV cache on: it would hold every layer's K/V
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, context_fn=selective_context), check_fn=is_block)
    blocks = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    options = dict(
        mesh=mesh,
        reshard_after_forward=True,
        offload_policy=OffloadPolicy(),
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    )
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


strategy = ModelParallelStrategy(
    data_parallel_size=2,
    tensor_parallel_size=1,
)
trainer = Trainer(
    accelerator="gpu",
    devices=2,
    num_nodes=1,
    strategy=strategy,
    precision="32-true",  # bfloat16 compute: shard_model's MixedPrecisionPolicy; fp32 master parameters
    accumulate_grad_batches=1,
)
