"""FSDP1's buffers (``FullyShardedDataParallel`` with flat parameters, as accelerate's ``fsdp_version: 1`` runs
it), beside FSDP2's in ``advisor.estimate.strategy_buffers``. Selected by ``TrainingConfig.fsdp_version``.

What FSDP1 allocates, read from the installed torch (2.13) and accelerate:

- One ``FlatParameter`` per unit (each transformer block, and the root: embeddings, final norm, head), its
  fp32 shard padded to divide the world (torch/distributed/fsdp/_flat_param.py ``FlatParamHandle.shard``):
  the padding is under ``world`` elements a unit and is left out.
- accelerate's FSDP1 ``MixedPrecision`` under bf16 (fp16) sets param_dtype = reduce_dtype = buffer_dtype =
  bf16 (accelerate/utils/dataclasses.py ``FullyShardedDataParallelPlugin.set_mixed_precision``:
  ``dtype_args = {"param_dtype": dtype, "reduce_dtype": dtype}``, ``buffer_dtype`` too; accelerate/state.py
  calls it with the run's mixed_precision): the reduce-scatter runs in bf16, half of FSDP2's fp32 input.
- Before its all-gather a unit casts its shard to bf16 (``_use_low_precision_shard``: ``_mp_shard``, freed
  after the all-gather by ``_free_low_precision_sharded_param``) and gathers into ``_full_param_padded``.
- The root is never resharded after forward (_runtime_utils.py ``_post_forward_reshard``:
  ``free_unsharded_flat_param = not state._is_root and ...``): it stays unsharded through the loss and the
  backward, where FSDP2 ZeRO-3 frees it and gathers it again.
- BACKWARD_PRE (accelerate's config default) with limit_all_gathers (at most two all-gathers in flight,
  _limiter_utils.py ``_max_num_inflight_all_gathers = 2``): in a block's backward, that block and the next
  one (prefetched) are unsharded.
- A unit's gradient: each original parameter's gradient (the param dtype) reaches the flat parameter
  through the views' split, giving one unsharded gradient in the param dtype; ``_reduce_grad`` reduce-scatters
  it into a new bf16 shard (``_get_reduce_scatter_tensors``: ``torch.empty_like(chunks[0])``), which is cast
  to the fp32 sharded gradient (``_cast_grad_to_param_dtype``, ``_accumulate_sharded_grad``).
- use_orig_params=True lets one unit mix frozen and trainable parameters; the flat parameter then requires
  grad as a whole and its gradient (and fp32 gradient shard) covers the frozen part too
  (fully_sharded_data_parallel.py class docstring, ``use_orig_params``). A LoRA unit's gradient is the unit's.
- Unless the stack gives the adapters units of their own (``Recipe.adapter_units``: HF Trainer sets PEFT's
  ``fsdp_auto_wrap_policy``, every lora_A / lora_B its own unit): then a block's unit holds only frozen weights,
  its FlatParameter requires no grad (no gradient, no reduce-scatter, no fp32 shard of one) and accelerate
  leaves it in its loaded dtype (``TrainingConfig.low_precision_base``: bf16 from a bf16 checkpoint, which
  needs no ``_mp_shard`` to gather from). The adapters' own units are too small to count apart.

Pure: no torch import.
"""

from __future__ import annotations

from advisor.estimate.block_sizes import block_params, blocks_saving
from advisor.estimate.states import FP32
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def fsdp1_reduce_bytes(training: TrainingConfig) -> int:
    """Bytes of one element of FSDP1's reduce-scatter: accelerate's reduce_dtype is the param_dtype (bf16)."""
    return 2 if training.mixed else training.param_bytes


def adapters_own_units(spec: ModelSpec, training: TrainingConfig) -> bool:
    """A partly frozen model (LoRA) whose stack gives the adapters FSDP units of their own (``Recipe.adapter_units``),
    so a block's unit holds only frozen weights."""
    return spec.trainable_params < spec.total_params and training.recipe.adapter_units


def fsdp1_trainable_units(spec: ModelSpec, training: TrainingConfig, *, layer: int, n_layers: int,
                          outside: int) -> tuple[int, int]:
    """(parameters with a gradient in the blocks, in the root) under use_orig_params: a unit with any
    trainable parameter has a gradient for all of it. LoRA's adapters sit in every block, unless the stack
    gives them units of their own (``Recipe.adapter_units``); a frozen root (LoRA's embeddings and head) has
    none."""
    blocks = layer * n_layers - blocks_saving(spec)
    if spec.trainable_params >= spec.total_params:
        return blocks, outside
    return (0 if spec.trainable_params == 0 or adapters_own_units(spec, training) else blocks), 0


def fsdp1_gradient_params(spec: ModelSpec, training: TrainingConfig) -> int:
    """Parameters with a gradient (the sharded fp32 gradient the optimizer steps beside): whole units."""
    layer, n_layers, outside = block_params(spec)
    blocks, root = fsdp1_trainable_units(spec, training, layer=layer, n_layers=n_layers, outside=outside)
    return max(spec.trainable_params, blocks + root)


def fsdp1_buffer_fields(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int, *,
                        layer: int, n_layers: int, outside: int) -> dict[str, int | None]:
    """The ``StrategyBuffers`` fields of FSDP1 (module docstring), for a sharded torch strategy."""
    pb = training.param_bytes
    ub = 2 if training.mixed else pb
    rb = fsdp1_reduce_bytes(training)
    root = ub * outside  # unsharded from the root's pre-forward to the end of backward
    block_g, root_g = fsdp1_trainable_units(spec, training, layer=layer, n_layers=n_layers, outside=outside)
    # A block's unit as stored: a frozen one (adapters in units of their own) stays in its loaded dtype.
    stored = pb if block_g else training.frozen_param_bytes
    h2d = stored * layer // world if impl.offload_params else 0
    per_block_g = -(-block_g // n_layers) if block_g else 0
    # the bf16 shard a unit gathers from (``_mp_shard``), per parameter; none where the unit is stored in bf16
    low = ub if training.mixed and stored != ub else 0
    if impl.reshard_after_forward:
        # FULL_SHARD: the root's pre-backward (on the loss) prefetches the last block; in a block's backward
        # that block and the one prefetched below it are unsharded. With the adapters in units of their own, the
        # unit BACKWARD_PRE prefetches next is an adapter of the same block (they ran inside it in forward), so one
        # block is unsharded at a time.
        at_loss, blocks_bwd = ub * layer, (1 if adapters_own_units(spec, training) else 2) * ub * layer
        # Forward begins with the root's all-gather (its bf16 shard beside the gathered root), then each block's.
        forward_start = root + max(low * outside // world, ub * layer + low * layer // world) + h2d
    else:
        # SHARD_GRAD_OP: every block stays unsharded from its forward to its backward.
        at_loss = blocks_bwd = ub * (layer * n_layers - blocks_saving(spec))
        forward_start = None
    # A block's gradient: the parameters' gradients and their concatenation into the flat gradient (the views'
    # split backward); the unit is resharded before its bf16 reduce-scatter output and fp32 shard are made.
    grads = 2 * ub * per_block_g
    # End of backward: the root's gradients and their concatenation beside the unsharded root, or (once it is
    # resharded) the flat gradient, its bf16 reduce-scatter output and the fp32 cast of that. A tied embedding's
    # two gradients (the head's, waiting in autograd's input buffer, and the embedding's) are first summed out
    # of place: three vocabulary-sized gradients (as strategy_buffers._root_backward_end counts for FSDP2 under
    # transformers' loss; whether the fused and chunked losses' fresh head gradient is summed in place through
    # FSDP1's flat-parameter views, tied_sum_in_place, is not measured: kept at three).
    backward_end = max(root + 2 * ub * root_g, ub * root_g + (rb + FP32) * root_g // world)
    if root_g and (bool(spec.tied_embeddings) or spec.head_params == 0):
        embedding = spec.embedding_params or (spec.vocab_size or 0) * (spec.hidden_size or 0)
        backward_end = max(backward_end, root + 3 * ub * embedding)
    # The end of forward holds no prefetched block (the root's pre-backward has not run yet).
    forward_end = root + (0 if impl.reshard_after_forward else at_loss) + h2d
    return dict(persistent=0, at_loss=root + at_loss + h2d, at_forward_end=forward_end,
                in_backward=root + blocks_bwd + grads + h2d, at_forward_start=forward_start, at_backward_start=None, at_backward_end=backward_end,
                grads_at_backward_end=-(-pb * block_g // world))


def fsdp1_lower_blocks(training: TrainingConfig, impl: Implementation, world: int, *, layer: int,
                       n_layers: int) -> dict[str, int]:
    """The ``StrategyBuffers`` fields for the blocks below the top one (``block_backward_buffers``). A block's
    post-backward hook reduce-scatters its gradient at once and frees it (_runtime_utils.py ``_reduce_grad``:
    ``flat_param.grad = None``), so nothing of the block above is left beside a lower block (FSDP2's
    ``below_top``); each finished block leaves its fp32 shard. FULL_SHARD: the bottom block has no block to
    prefetch, which makes it lower than the one above it whenever a shard is smaller than an unsharded block
    (param bytes / world <= the bf16 block's), so the lowest block with a prefetch beside it is the worst:
    ``num_blocks`` counts the n - 1 blocks that have one. SHARD_GRAD_OP frees each block's unsharded
    parameters after its backward (``_should_free_in_backward``), more than its shard: the top block is the
    worst. Measured on the FSDP1 simulated step (advisor.simulate.fsdp1_step; tests/estimate/test_fsdp1.py)."""
    done = -(-training.param_bytes * layer // world)  # full fine-tunes only (block_backward_buffers)
    return dict(below_top=0, per_block_done=done, num_blocks=max(1, n_layers - 1) if impl.reshard_after_forward else 1)
