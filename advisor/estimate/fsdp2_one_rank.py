"""FSDP2 on a shard group of one rank (one GPU under ``--strategy zero2|zero3``, or a mesh whose
``dp_shard x cp`` is 1): what its unshard allocates instead of an all-gather.

torch's ``FSDPParamGroup.unshard`` skips the all-gather on a group of size 1 and ``wait_for_unshard``
copies each parameter's ``all_gather_inputs[0]`` straight into its unsharded tensor
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``if world_size == 1``; pytorch#160135,
in the pinned torch 2.13.0). So no all-gather output exists: not the root's beside its unsharded copy
in the first block's forward, not the previous block's kept for the copy-out's overlap (that deferral
is ``world_size > 1`` only), not the next block's prefetched in backward. What remains is the copy-in
of a parameter held in another dtype than ``param_dtype`` (``_fsdp_param.py`` ``all_gather_inputs``:
``_to_dtype_if_needed``, an fp32 parameter under bf16/fp16 mixed precision): one cast copy at a time,
and the previous one until the loop variable is rebound, so at most the group's unsharded tensors and
one copy of its largest parameter (``unshard_copy_bytes``). A bf16 frozen base (LoRA's
``low_precision_base``) and pure bf16 or fp32 cast nothing. Measured on the simulated step
(tests/estimate/test_fsdp2_one_rank.py). Pure: no torch import.

The same copy-in is time (``one_rank_cast_bytes``, charged by ``step_time`` as autocast's casts are): on a group
of one the shard is the whole parameter, so every unshard casts every fp32 parameter to ``param_dtype`` (4 bytes read,
2 written), once a forward, and again in backward where the group reshards after forward (zero3); and
``foreach_reduce`` copies each unsharded gradient into its ``reduce_dtype`` (fp32) reduce-scatter input (2 read, 4
written) a micro-batch (``_fsdp_collectives.py``). Where the group has more ranks the casts are of a shard, and the
gradients' copy is counted with the collectives' bytes as their cost is, so nothing is added there.
"""

from __future__ import annotations

from advisor.estimate.activations import shape_of
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from advisor.training import TrainingConfig


def unshard_copy_bytes(spec: ModelSpec, training: TrainingConfig, *, ub: int, root_trainable: int,
                       block_trainable: int, outside: int, layer: int) -> tuple[int, int]:
    """(the root's, one block's) largest cast copy while a one-rank group unshards: ``ub`` bytes of its largest
    parameter that is cast (the token embedding or the head, V x h; a block's MLP matrix, i x h), or of its
    trainable parameters where only those are (fp32 adapters over a bf16 base). 0 where nothing is cast."""
    if not training.mixed:
        return 0, 0
    shape = shape_of(spec)
    largest_root = min(outside, shape.vocab_size * shape.hidden_size)
    largest_block = min(layer, (spec.intermediate_size or 0) * (spec.hidden_size or 0))
    if not training.low_precision_base:  # every parameter rests in fp32 (a full fine-tune, or an fp32 base)
        return ub * largest_root, ub * largest_block
    return ub * min(largest_root, root_trainable), ub * min(largest_block, block_trainable)


def one_rank_cast_bytes(spec: ModelSpec, training: TrainingConfig, *,
                        reshard_after_forward: bool) -> tuple[int, int, int]:
    """(forward's casts down, backward's casts down, backward's casts up) in HBM bytes of one micro-batch on an FSDP2
    group of one rank under bf16/fp16 mixed precision (module docstring): the fp32 parameters cast at each unshard
    (every parameter of a full fine-tune or an fp32 LoRA base; a bf16 base's or a quantised base's trainable ones
    only), again in backward where the group reshards after forward, and the trainable ones' gradients cast up for
    the reduce. Zeros where nothing rests in fp32 (pure bf16, fp32, DeepSpeed)."""
    if not training.mixed or training.engine != "torch":
        return 0, 0, 0
    per_weight = FP32 + training.compute_bytes
    cast = spec.trainable_params if (training.low_precision_base or training.quantize is not None) else spec.total_params
    down = cast * per_weight
    return down, down if reshard_after_forward else 0, spec.trainable_params * per_weight
