"""Gradients held across gradient accumulation. Pure: no torch import.

With ``--global-batch`` above micro-batch x data-parallel ranks, a step runs k > 1 micro-batches, each a
forward and a backward, before one optimizer step, and the gradients of the micro-batches before the last
are kept and summed into. From the second micro-batch on they live through the forward, the loss and every
block's backward, where a step without accumulation has none until its backward makes them (the moments of
``advisor.estimate.memory``, which take them as ``held_grads``). What is held depends on the strategy and
on how the stack accumulates (``TrainingConfig.accumulation_mode``: --accumulation-sync, else the recipe's
``accumulation_sync``, cited in ``profiles/recipes.json``):

- replicated (one GPU, DDP, torch ZeRO-1): every trainable gradient, as the optimizer reads it
  (``ModelStates.grads``): autograd sums each new gradient into ``param.grad``; DDP's ``no_sync`` changes
  when it reduces, not what it holds;
- FSDP (FSDP2, and FSDP1 under accelerate's ``fsdp_version: 1``), the gradients reduced after every
  micro-batch (the torch, Lightning and torchtitan loops): the rank's gradient shards, which FSDP sums
  each new reduce-scatter output into (``_fsdp_collectives.py`` ``foreach_reduce``);
- FSDP, sync switched off until the last micro-batch (Hugging Face Trainer through accelerate's
  ``no_sync``): every FSDP unit keeps its unsharded gradient, in the compute dtype (accelerate's FSDP2
  policy reduces in the parameter dtype, so nothing is upcast; FSDP1 keeps the low-precision FlatParameter
  gradient), or in fp32 where an FSDP2 policy reduces in fp32 under mixed precision (``Recipe.fsdp_reduce_dtype``:
  wrap()'s and torchtitan's; torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``to_accumulated_grad_if_needed``
  upcasts the unsharded gradient to the policy's reduce_dtype when the sync is off, and later micro-batches sum
  into it), of every trainable parameter: the whole model's, not a shard; on the GPU even where the
  states are offloaded (FSDP1's ``no_sync`` docstring: "the gradients will not be offloaded to CPU when inside
  the context manager"; FSDP2 offloads a gradient only when it reduces it);
- DeepSpeed ZeRO-2: the flat gradient partition (``advisor.estimate.zero_buffers``), which the parameters'
  gradients view between micro-batches; ZeRO-1 keeps its gradients at rest and ZeRO-3 its partition buffer
  anyway (counted there);
- gradients offloaded as they are reduced (the other loops): nothing on the GPU.
"""

from __future__ import annotations

from advisor.estimate.states import ModelStates
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def accumulation_steps(training: TrainingConfig, *, dp_world: int, micro_batch_size: int) -> int:
    """Micro-batches per optimizer step: ``--global-batch`` over micro-batch x data-parallel ranks (1 without it)."""
    if training.global_batch_size is None:
        return 1
    return max(1, training.global_batch_size // (micro_batch_size * dp_world))


def accumulates_unsharded(training: TrainingConfig, impl: Implementation) -> bool:
    """FSDP with its gradient sync off until the last micro-batch (accelerate's no_sync, the Trainer's default):
    each unit keeps its unsharded gradient between micro-batches (module docstring)."""
    return training.engine == "torch" and impl.shard_grads and training.accumulation_mode == "last_micro_batch"


def reduces_once_a_step(training: TrainingConfig, impl: Implementation) -> bool:
    """Whether FSDP's reduce-scatter (and an offloaded shard's trip to the CPU) runs once a step, not every
    micro-batch: under no_sync, with a global batch (without one a step is one micro-batch, and the step time is
    summed as before, the same float)."""
    return accumulates_unsharded(training, impl) and training.global_batch_size is not None


def unsharded_grad_bytes(training: TrainingConfig) -> int:
    """Bytes of one element of the unsharded gradient an FSDP unit accumulates under no_sync: fp32 where an FSDP2
    policy reduces in fp32 under mixed precision (FSDP2 upcasts it to the reduce dtype), fp32 for PEFT's fp32
    adapters (no policy casts them), else the compute dtype (module docstring)."""
    if training.fp32_adapters:
        return training.trainable_param_bytes
    if training.mixed and training.fsdp_version == 2 and training.recipe.fsdp_reduce_dtype == "fp32":
        return FP32
    return training.compute_bytes


def held_accumulated_grads(spec: ModelSpec, training: TrainingConfig, impl: Implementation, states: ModelStates, *,
                           world: int, dp_world: int, micro_batch_size: int) -> int:
    """Gradient bytes on one rank's GPU from the second micro-batch of a step on (module docstring); 0 without
    accumulation. ``spec``: the rank's model (a tensor-parallel rank's share); ``world``: the ranks its states
    are sharded over; ``dp_world``: the ranks that take distinct micro-batches."""
    accumulating = accumulation_steps(training, dp_world=dp_world, micro_batch_size=micro_batch_size) >= 2
    if not accumulating and not training.grads_kept_as_zeros:
        return 0
    if training.optimizer_in_backward:
        return 0
    if not accumulating:  # torch before 2.0: zero_grad() left the previous step's gradients allocated, as zeros
        return 0 if states.on_cpu or states.cpu_only_optimizer else states.grads
    if accumulates_unsharded(training, impl):  # on the GPU, offloaded or not
        return unsharded_grad_bytes(training) * spec.trainable_params
    if states.on_cpu or states.cpu_only_optimizer:
        return 0
    if training.engine == "deepspeed":
        if not impl.shard_grads:  # ZeRO-1 keeps its gradients at rest: held already
            return 0
        from advisor.estimate.zero_buffers import held_partition_bytes

        held = held_partition_bytes(spec, training, impl, world)
        return states.grads if held is None else held
    return states.grads


def accumulator_beside_embedding(training: TrainingConfig) -> bool:
    """Whether a unit's accumulated gradient is the gradient autograd sums the new one into (no_sync in the
    gradient's own dtype, the Trainer's): at the end of backward it sits beside the embedding's backward, and the
    root's reduce-scatter reduces it in the new gradient's place. An fp32 accumulator under a policy that reduces in
    fp32 is a tensor of FSDP's own beside the gradient (module docstring)."""
    return unsharded_grad_bytes(training) == training.compute_bytes


def held_at_backward_end(spec: ModelSpec, training: TrainingConfig, impl: Implementation, *, held: int,
                         split: bool) -> int | None:
    """What accumulation adds at the end of the last micro-batch's backward (beside the new gradients that moment
    already counts), where it differs from ``held``: under no_sync FSDP reduce-scatters each block's accumulated
    gradient in its post-backward and frees it, so only the root's are left. ``split``: the buffers give the
    embedding's backward apart (``StrategyBuffers.at_embedding_backward``).

    In the gradient's dtype (``accumulator_beside_embedding``: the Trainer) and ``split``, the embedding's
    accumulator, vocabulary x hidden in the compute dtype, beside the embedding's backward only (the root's
    reduce-scatter then reduces it where it would reduce the new gradient): simulated with Qwen2.5-0.5B's shapes
    (4 blocks, seq 256, the Trainer, zero3), tied over 8 ranks and untied over 2, 4 and 8, that moment is the
    step's without accumulation plus 272,269,312 bytes (2 x 151,936 x 896), or the reduce-scatter's where that
    is larger (untied over 2 ranks), to the byte (tests/estimate/test_accumulation.py). Counting the accumulator
    and an out-of-place sum, as before, put the moment one such tensor over.

    Otherwise (an fp32 accumulator, FSDP1, the head and embedding units of their own) 2 x vocabulary x hidden
    in the compute dtype, as before: with FSDP2 reducing in fp32 (the torch recipe under --accumulation-sync
    last_micro_batch) exact over two ranks and 2 x vocabulary x hidden bytes short over four and eight (the same
    untied shapes). None: ``held`` stands (nothing held, or shards reduced every micro-batch)."""
    if not held or not accumulates_unsharded(training, impl):
        return None
    from advisor.estimate.block_sizes import block_params
    from advisor.estimate.strategy_buffers import trainable_split

    layer, n_layers, _ = block_params(spec)
    embedding = min(trainable_split(spec, layer, n_layers)[1], (spec.vocab_size or 0) * (spec.hidden_size or 0))
    copies = 1 if split and accumulator_beside_embedding(training) else 2
    return copies * training.compute_bytes * embedding
