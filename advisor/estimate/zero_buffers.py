"""DeepSpeed ZeRO's own buffers (``advisor.recipes.ZeroFacts``: the deepspeed row of ``profiles/recipes.json``,
each fact cited there from DeepSpeed's source). They are the engine's, so every recipe on the deepspeed engine
plans with them: HF Trainer (through accelerate), Lightning's DeepSpeedStrategy and ``wrap()`` hand the model
and their optimizer to ``deepspeed.initialize``, which wraps that optimizer in ZeRO's own
(deepspeed/runtime/engine.py ``_configure_zero_optimizer``); the recipe still decides how that optimizer steps
the flat partition (its ``optimizer_impl``). ZeRO stage 0 (ddp on the engine) keeps the paper's accounting
(``advisor.estimate.strategy_buffers``).

What the facts add to the resting states (2 bytes a parameter, 2 a gradient, 12 of optimizer state):

- ZeRO-1/2 backward: the IPG buffers (``reduce_bucket_size`` elements each in the parameters' dtype,
  two with overlap_comm as our export writes it), allocated at the first gradient and released at the
  end of backward; ZeRO-2 also holds the rank's gradient partition flat (contiguous gradients) from its
  first gradient on: the worst rank is the last, which owns the head's end of the flat buffer.
- ZeRO-3: one IPG buffer, kept from initialisation; the gradient partition's flat buffer, never freed
  (so held in forward and backward too; the step's moment counts it as the gradients).
- The step (no optimizer offload): the gradient partition is flattened into a new tensor and cast to
  fp32 while the partition's views still hold the flat gradients; then the optimizer steps that one flat
  fp32 tensor, so a foreach or for-loop AdamW's temporaries are partition-sized (ZeRO-3: sub-group
  sized, ``sub_group_size`` elements at most).

Bucket sizes come from ``advisor.estimate.buckets.deepspeed_buckets``, which the export writes, so an
exported run is the run planned; a user's own config (``TrainingConfig.zero``, read by ``--from``) fixes
them, ``overlap_comm`` (one IPG buffer without it, buf_0 alone) and ``sub_group_size`` instead. Pure: no torch import.
"""

from __future__ import annotations

from advisor.estimate.buckets import deepspeed_buckets
from advisor.estimate.states import FP32, optimizer_step_temporary
from advisor.estimate.strategy_buffers import StrategyBuffers
from advisor.model.spec import ModelSpec
from advisor.recipes import ZeroFacts, deepspeed_zero_facts
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def zero_facts(training: TrainingConfig, impl: Implementation) -> ZeroFacts | None:
    """DeepSpeed's ZeRO facts where they apply: the deepspeed engine at ZeRO stage 1 or more, whichever recipe
    drives it (the module docstring)."""
    if training.engine != "deepspeed" or not impl.shard_optimizer:
        return None
    return deepspeed_zero_facts()


def _partition_elements(spec: ModelSpec, world: int) -> int:
    """Trainable elements in one rank's partition (DeepSpeed pads the flat buffer to split evenly)."""
    return -(-spec.trainable_params // world)


def zero_strategy_buffers(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int,
                          facts: ZeroFacts, *, packed_bytes: int | None = None) -> StrategyBuffers:
    """What ZeRO holds beyond the states and activations at each moment of forward and backward.

    ``packed_bytes``: a quantised base's parameters as ZeRO-3 stores and gathers them (the packed 4-bit
    weights viewed as the compute dtype, ``bnb_4bit_quant_storage``, plus the rest: ``advisor.estimate.
    quantized.stored_param_bytes``); None: every parameter in the compute dtype."""
    cb = training.compute_bytes  # the module is cast to bf16/fp16: gradients and IPG buffers in that dtype
    buckets = deepspeed_buckets(spec, training.zero)
    if impl.shard_params:  # ZeRO-3
        ipg = facts.ipg_buffers_stage3 * cb * buckets.reduce_elements
        grads = cb * _partition_elements(spec, world) if facts.stage3_grad_buffer and not impl.offload_optimizer else 0
        # Gathered parameters, capped by stage3_max_live_parameters (and kept while reused within
        # stage3_max_reuse_distance, 1e9 elements by default); the rank's own partition is part of the
        # gathered tensor. Offloaded partitions live on the CPU.
        if packed_bytes is None:
            own = 0 if impl.offload_params else spec.total_params // world
            live = cb * min(spec.total_params - own, buckets.max_live_parameters)
        else:  # stage3_max_live_parameters counts elements of the storage dtype, the compute dtype here
            own = 0 if impl.offload_params else packed_bytes // world
            live = min(packed_bytes - own, cb * buckets.max_live_parameters)
        return StrategyBuffers(persistent=ipg, at_loss=live + grads, in_backward=live + grads)
    overlap = training.zero is None or training.zero.overlap_comm is not False  # our export writes it on
    ipg = (facts.ipg_buffers_overlap_comm if overlap else 1) * cb * buckets.reduce_elements
    # With the optimizer offloaded, copy_grads_in_partition sends each gradient to the CPU instead.
    partition = (cb * _partition_elements(spec, world)
                 if facts.partition_grads_in_backward and impl.shard_grads and not impl.offload_optimizer else 0)
    return StrategyBuffers(persistent=0, at_loss=0, in_backward=ipg + partition)


def held_partition_bytes(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> int | None:
    """What a ZeRO-2/3 run keeps of the gradients between accumulated micro-batches beyond what its moments
    already hold (``advisor.estimate.accumulation``); None without ZeRO facts. ZeRO-2's flat partition: each
    backward's epilogue drops the optimizer's reference to it (stage_1_and_2.py ``_release_ipg_buffers``) but the
    parameters' gradients stay views of it until the next backward copies them into a new one
    (``copy_grads_in_partition``). ZeRO-3 keeps its partition buffer anyway; an offloaded optimizer accumulates
    on the CPU."""
    facts = zero_facts(training, impl)
    if facts is None:
        return None
    if impl.shard_params or impl.offload_optimizer or not facts.partition_grads_in_backward:
        return 0
    return training.compute_bytes * _partition_elements(spec, world)


def zero_step_temporary(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int,
                        facts: ZeroFacts) -> int:
    """Bytes the ZeRO step holds beyond the resting states (whose gradients are the rank's partition,
    or all of them under ZeRO-1): the larger of the cast (the flat copy and its fp32 cast beside the
    partition's views) and the optimizer's step over the flat fp32 tensor (its fp32 gradient and the
    implementation's temporaries)."""
    if not facts.step_grad_copies:
        return 0
    cb = training.compute_bytes
    elements = _partition_elements(spec, world)
    if impl.shard_params:  # ZeRO-3 steps sub-group by sub-group; the gradient buffer stays
        elements = min(elements, (training.zero and training.zero.sub_group_size) or facts.sub_group_size)
    flat = cb * elements
    fp32 = FP32 * elements if cb != FP32 else 0  # .to(fp32) of an fp32 tensor is the tensor itself
    stepped = fp32 or flat  # the fp32 gradient the optimizer reads
    temp = optimizer_step_temporary(training, trainable_bytes=FP32 * elements, largest_bytes=FP32 * elements,
                                    element_bytes=FP32)
    # ZeRO-1/2 free the partition's views once cast (stage_1_and_2.py step); ZeRO-3 keeps its buffer.
    freed = 0 if impl.shard_params else cb * elements
    return max(flat + fp32, stepped - freed + temp, 0)
