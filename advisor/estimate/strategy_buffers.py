"""What a strategy holds beyond the model states and the activations, at each moment of the step:
DDP's buckets, autocast's weight copies, FSDP2's unsharded root and blocks, their all-gather outputs,
gradients and reduce-scatter inputs, DeepSpeed's IPG bucket and live parameters. Split from
``advisor.estimate.memory``, which adds these to the states and activations at each moment (its module
docstring lists the moments); a quantised base recomputes them in ``advisor.estimate.quantized``.
Pure: no torch import.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.block_sizes import block_params, blocks_saving
from advisor.estimate.fsdp2_one_rank import unshard_copy_bytes
from advisor.estimate.states import FP32
from advisor.frozen import validated_copy
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


class StrategyBuffers(BaseModel):
    """Bytes a strategy holds beyond model states and activations, at each moment of the step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    persistent: int = Field(description="Held the whole step (DDP buckets, DeepSpeed IPG bucket).")
    at_loss: int = Field(description="Held while the loss is differentiated.")
    in_backward: int = Field(description="Held while a block runs backward.")
    at_forward_end: int | None = Field(default=None, description="Held at the end of forward, if not at_loss.")
    at_forward_start: int | None = Field(default=None, description="Held in the first block's forward (FSDP2); "
                                         "None: not a moment of its own.")
    at_backward_end: int | None = Field(default=None, description="Held at the end of backward beyond the "
                                        "gradients (FSDP2: the root's backward; replicated: the embedding's "
                                        "gradient and a tied head's); None: not a moment of its own.")
    at_embedding_backward: int | None = Field(default=None, description="Of at_backward_end, the embedding's "
                                              "backward alone (FSDP2, the root one unit): where a gradient accumulated "
                                              "over micro-batches sits beside the new one; None: not split out.")
    at_unsynced_embedding_backward: tuple[int, int] | None = Field(
        default=None, description="The embedding's backward in a micro-batch before the last under no_sync (FSDP2, "
        "the root one unit), beyond the gradients held: (the first micro-batch's, a later one's).")
    grads_at_backward_end: int = Field(default=0, description="Gradients (shards) at the end of backward "
                                       "(FSDP2: the blocks' and, with fsdp_outer_units, the head's; the root's is "
                                       "being reduce-scattered; replicated: "
                                       "all but the embedding's).")
    below_top: int = Field(default=0, description="Held in a lower block's backward beyond the top block's "
                           "(FSDP2: the block above's unsharded gradients, until the next reduce-scatter).")
    per_block_done: int = Field(default=0, description="Gradients each finished block leaves (DDP: its "
                                "gradients; FSDP2: their shard): 0 where the lower blocks are not estimated.")
    num_blocks: int = Field(default=1, ge=1, description="Blocks whose backward runs one after another.")
    bottom_less: int = Field(default=0, description="What the bottom block's backward holds less than the "
                             "line through the blocks above it (FSDP2 ZeRO-3: no block below to prefetch; negative "
                             "where it prefetches a larger unit: a trainable embedding of its own, fsdp_outer_units).")
    in_backward_early: int | None = Field(default=None, description="Held early in an MoE block's backward (its "
                                          "routing-weight product's, before any weight gradient of the block), in "
                                          "place of in_backward; None: not a moment of its own.")
    in_backward_late: int | None = Field(default=None, description="Held late in a block's backward (FSDP2), once "
                                         "all its weight gradients exist and its temporaries are gone, in place of "
                                         "in_backward; None: not a moment of its own.")
    top_reduce_scatter: int | None = Field(default=None, description="Held at the top block's reduce-scatter "
                                           "(FSDP2: the block resharded, its gradients and their reduce_dtype copy), "
                                           "in place of in_backward; None: not a moment of its own.")
    saved_gone_at_reduce_scatter: bool = Field(default=False, description="At top_reduce_scatter the top block's "
                                               "own saved tensors are freed (read on the simulated step for MoE "
                                               "blocks; dense blocks keep the older count).")
    at_last_block_forward: int | None = Field(default=None, description="Held at the last block's all-gather "
                                              "copy-out in forward (FSDP2), beside what the blocks before it saved; "
                                              "None: not a moment of its own (one block, or not FSDP2).")
    at_head_backward: int | None = Field(default=None, description="Held at the head unit's post-backward "
                                         "(FSDP2 with fsdp_outer_units: the final norm and head resharded and their "
                                         "gradients reduce-scattered before any block's backward), beside the "
                                         "blocks' saved tensors; None: not a moment of its own.")
    at_backward_start: int | None = Field(default=None, description="Held when the loss backward begins, "
                                          "beside what the loss kept (FSDP2 ZeRO-3: the root gathered again); "
                                          "None: not a moment of its own.")


def estimate_strategy_buffers(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int, *,
                              checkpointing: bool = False) -> StrategyBuffers:
    """What the strategy holds beyond states and activations (FSDP2 figures from
    torch/distributed/fsdp/_fully_shard: _fsdp_param_group.py, _fsdp_collectives.py)."""
    layer, n_layers, outside = block_params(spec)
    if training.engine == "deepspeed":
        from advisor.estimate.buckets import deepspeed_buckets  # DeepSpeed's buckets load only for that engine
        from advisor.estimate.zero_buffers import zero_facts, zero_strategy_buffers

        facts = zero_facts(training, impl)
        if facts is not None:  # ZeRO stage 1+: DeepSpeed's own buffers (profiles/recipes.json)
            return zero_strategy_buffers(spec, training, impl, world, facts)

        # ZeRO stage 0 (dp / ddp on the engine): one reduce bucket of 16-bit gradients (reduce_bucket_size elements).
        bucket = 2 * min(spec.trainable_params, deepspeed_buckets(spec, training.zero).reduce_elements)
        return StrategyBuffers(persistent=bucket, at_loss=0, in_backward=0)
    pb = training.param_bytes
    tb = training.trainable_param_bytes  # a trainable parameter's gradient (fp32 adapters: fp32)
    if impl.shard_params and training.fsdp_version == 1:  # FullyShardedDataParallel's flat parameters
        from advisor.estimate.fsdp1_buffers import fsdp1_buffer_fields

        return StrategyBuffers(**fsdp1_buffer_fields(spec, training, impl, world, layer=layer, n_layers=n_layers,
                                                     outside=outside))
    if impl.shard_params:
        ub = 2 if training.mixed else pb  # MixedPrecisionPolicy(param_dtype=bf16/fp16)
        reduce_b = fsdp2_reduce_bytes(training)  # MixedPrecisionPolicy(reduce_dtype=...)
        root = ub * outside  # unsharded from the root's pre-forward to the end of its forward (see backward_start)
        h2d = pb * layer // world if impl.offload_params else 0
        dim1 = training.recipe.shard_experts_on_dim1
        pad = expert_shard_padding(spec, world, dim1=dim1)  # unsharded experts: world x ceil(E/world) rows
        block_t, root_t = trainable_split(spec, layer, n_layers)
        # Backward of one block: the gradients of its trainable weights (param dtype) and their
        # reduce-scatter input (reduce_dtype); a frozen weight gets neither (LoRA's base).
        per_block_t = layer if root_t >= outside else min(layer, -(-block_t // n_layers))
        # An all-gather output: the root's, a block's. A shard group of one rank gathers nothing, only copies each
        # parameter into its unsharded tensor, casting the one it is at (fsdp2_one_rank). PEFT's fp32 adapters
        # (no policy casts them) are gathered in fp32 beside the 16-bit base: ``fp32_extra`` a block.
        gathers = world > 1
        fp32_extra = (tb - ub) * per_block_t if training.fp32_adapters else 0
        unit = ub * layer + fp32_extra  # one block's unsharded parameters
        ag_root, ag_block = (root, unit + ub * pad) if gathers else (0, 0)
        root_copy, block_copy = (0, 0) if gathers else unshard_copy_bytes(
            spec, training, ub=ub, root_trainable=root_t, block_trainable=per_block_t, outside=outside, layer=layer)
        if impl.reshard_after_forward:
            # ZeRO-3: at the loss, the last block's all-gather (backward prefetch) is in flight; in a
            # block's backward, that block is unsharded and the next one is being gathered.
            held, at_loss, blocks_bwd = unit + ub * pad, ag_block, unit + ub * pad + ag_block
        else:
            # ZeRO-2: every block stays unsharded, each as large as it is (MoE dense layers, Jamba's kinds).
            moe_layers = routed_expert_params(spec)[0] // max(1, routed_expert_params(spec)[1])
            held = at_loss = blocks_bwd = ub * (layer * n_layers - blocks_saving(spec) + moe_layers * pad) + fp32_extra * n_layers
        grads = ((tb if training.fp32_adapters else ub) + reduce_b) * per_block_t  # fp32 adapters: fp32 gradients
        # The first block's forward: the root unsharded and its all-gather output not yet freed (FSDP2
        # frees an all-gather's output when the next all-gather is waited on: _fsdp_param_group.py
        # wait_for_unshard), the block's all-gather output and its copy-out. One rank: the root's copy-in
        # or the block's, beside the unsharded root.
        forward_start = (root + ag_root + 2 * unit if gathers else root + max(root_copy, unit + block_copy)) + h2d
        # A later block's forward: FSDP2 frees the previous all-gather's output only after this block's copy-out
        # (wait_for_unshard clears comm_ctx.all_gather_state, but its local prev_all_gather_state keeps the
        # result until it returns), so the copy-out holds the previous block's all-gather output, this block's
        # and its unsharded copy, beside the unsharded root and, under ZeRO-2, every block before it (held):
        # two all-gather outputs more. The last block's is the largest (the most saved). One rank: its copy-in.
        last_block_forward = (root + held + (2 * ag_block if gathers else block_copy) + h2d
                              if n_layers > 1 else None)
        # ZeRO-3 asks fully_shard(reshard_after_forward=True) of the root too, which torch >= 2.8 respects
        # (pytorch#154704; before, the root stayed unsharded): the root is freed after forward and gathered
        # again in its pre-backward, so the loss backward begins with its all-gather output and its
        # unsharded copy (the output is freed before the last block's prefetch); one rank: its copy-in.
        # Before torch 2.8 FSDP2 kept the root unsharded from its forward to its backward, and torchtune and
        # torchtitan keep it so on every release (TrainingConfig.fsdp_root_regathered): no second gather; the root is
        # in at_loss as it is.
        regathers = impl.reshard_after_forward and training.fsdp_root_regathered
        backward_start = root + (ag_root if gathers else root_copy) + h2d if regathers else None
        # ZeRO-2's forward ends with the last block's all-gather output too: FSDP2 frees one when the next
        # all-gather is waited on (_fsdp_param_group.py wait_for_unshard), and ZeRO-2 gathers nothing more; it is
        # gone by the loss's backward (the root's pre-backward). ZeRO-3 frees it when the block reshards.
        forward_end = None if impl.reshard_after_forward else root + at_loss + h2d + (unit if gathers else 0)
        if own_outer_units(spec, training, world):
            return StrategyBuffers(**_outer_unit_fields(
                spec, impl, world, ub=ub, reduce_b=reduce_b, layer=layer, outside=outside, root_t=root_t, held=held,
                ag_block=ag_block, blocks_bwd=blocks_bwd, grads=grads, h2d=h2d, n_layers=n_layers,
                last_block_rs=reduce_b * per_block_t, pb=tb, grads_at_backward_end=-(-tb * block_t // world)))
        backward_end, embedding_backward, unsynced = _root_backward_end(
            spec, outside, root_t, ub=ub, reduce_b=reduce_b, shard_b=tb, world=world,
            last_block_rs=reduce_b * per_block_t, in_place=tied_sum_in_place(training))
        return StrategyBuffers(persistent=0, at_loss=root + at_loss + h2d, at_forward_end=forward_end,
                               in_backward=root + blocks_bwd + grads + h2d,
                               at_forward_start=forward_start, at_backward_start=backward_start,
                               at_last_block_forward=last_block_forward,
                               at_backward_end=backward_end, at_embedding_backward=embedding_backward,
                               at_unsynced_embedding_backward=unsynced,
                               grads_at_backward_end=-(-tb * block_t // world))
    buckets = ddp_bucket_bytes(tb * spec.trainable_params, impl, world)
    # Autocast casts fp32 weights: the head's gradient reaches the tied matrix as a fresh cast-back copy.
    cast_back = training.mixed and not training.low_precision_base
    backward_end, grads_end = (None, 0) if impl.single_process else _replicated_backward_end(
        spec, tb, cast_back or tied_sum_in_place(training))
    if training.optimizer_in_backward:  # every other gradient already stepped and freed (advisor.estimate.in_backward)
        grads_end = 0
    if not training.mixed:
        return StrategyBuffers(persistent=buckets, at_loss=0, in_backward=0, at_backward_end=backward_end,
                               grads_at_backward_end=grads_end)
    if training.low_precision_base:  # a bf16 base needs no cast; only the fp32 adapters are copied
        forward_end, at_loss, in_backward = _adapter_casts(spec, n_layers, checkpointing)
    else:
        uncast_all, uncast_one = routed_expert_params(spec)  # grouped_mm: no autocast cast of the experts
        forward_end, at_loss, in_backward = _autocast_weight_casts(
            spec, layer * n_layers - blocks_saving(spec) - uncast_all, layer - uncast_one, checkpointing,
            head_cast=not loss_reads_head_weight(training))
    if not training.recipe.autocast_cache:  # no cache: at the end of forward only the copies autograd saved
        forward_end = at_loss
    return StrategyBuffers(persistent=buckets, at_loss=at_loss, in_backward=in_backward, at_forward_end=forward_end,
                           at_backward_end=backward_end, grads_at_backward_end=grads_end)


def loss_reads_head_weight(training: TrainingConfig) -> bool:
    """Whether the loss reads the head's weight itself instead of calling the head (wrappers.losses' fused kernel,
    and TRL's chunked_nll: ``Recipe.chunked_logits`` "checkpointed", which reads it through its transpose, a view
    autocast never caches), so that autocast holds no copy of the head; the loss's own copies are counted in
    ``activations_loss.loss_bytes``."""
    return training.loss == "fused" or training.chunked_nll


def fsdp2_reduce_bytes(training: TrainingConfig) -> int:
    """Bytes an element of FSDP2's reduce-scatter input takes: the recipe's ``fsdp_reduce_dtype`` under mixed
    precision (fp32: wrap()'s and torchtitan's MixedPrecisionPolicy; compute: accelerate's, bf16/fp16), the
    parameters' dtype otherwise."""
    if not training.mixed:
        return training.trainable_param_bytes  # the gradients' dtype: fp32 for PEFT's fp32 adapters
    return FP32 if training.recipe.fsdp_reduce_dtype == "fp32" else training.compute_bytes


def ddp_bucket_bytes(grad_bytes: int, impl: Implementation, world: int) -> int:
    """DDP's gradient buckets, a second copy of the trainable gradients (``gradient_as_bucket_view=False``),
    or none: DataParallel has no buckets, and one GPU runs as the plain model in every stack (accelerate's
    ``prepare_model`` wraps DDP only for several processes, Lightning runs one device under
    ``SingleDeviceStrategy``, ``wrappers.recipe`` leaves a one-rank group unwrapped). Measured on an H100
    through Hugging Face Trainer (``benchmarks/results/gpu_stacks.md``: no DDP wrapper at one GPU)."""
    return 0 if impl.single_process or runs_plain(impl, world) else grad_bytes


def runs_plain(impl: Implementation, world: int) -> bool:
    """A replicated torch strategy on one GPU runs as the plain model (no DDP wrapper, ``ddp_bucket_bytes``);
    ZeroRedundancyOptimizer's recipe wraps DDP at any size, and DataParallel and FSDP2 are not DDP."""
    return world == 1 and impl.engine == "torch" and not (impl.single_process or impl.shard_optimizer
                                                          or impl.shard_params)


def block_backward_buffers(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int,
                           buffers: StrategyBuffers, *, checkpointing: bool = False) -> StrategyBuffers:
    """``buffers`` with the gradients of the blocks' backward as the step holds them, for a full fine-tune
    of a dense model on the torch engine (DDP or FSDP2, nothing offloaded); unchanged elsewhere. At the
    top block's peak (its MLP's backward) the gradients are the head's (FSDP2: the unsharded root's;
    tied: waiting in autograd's input buffer) and down_proj's weight gradient, not the whole block's
    gradients and reduce-scatter input; each finished block then leaves its gradients (DDP) or their
    shard (FSDP2), and under FSDP2 a lower block runs beside the unsharded gradients of the block above
    until the next reduce-scatter. Measured op by op on the simulated step (Qwen2, 256 wide, 4 blocks,
    s 1024 and 2048: tests/estimate/test_block_backward.py)."""
    full = spec.trainable_params >= spec.total_params
    # Traced families (profiles measured without the gradients) are left as they were: some gain (StableLM,
    # GPT-NeoX, StarCoder2 under FSDP2), others are not read op by op yet (Gemma 3, Cohere, OLMo 2).
    if (training.engine != "torch" or impl.single_process or impl.offloads
            or not full or not spec.intermediate_size or not spec.hidden_size
            or (spec.num_experts and (spec.hybrid is not None or spec.mla is not None))):
        return buffers
    layer, n_layers, outside = block_params(spec)
    pb = training.param_bytes
    tied = bool(spec.tied_embeddings) or spec.head_params == 0
    head = 0 if spec.traced and tied else _head_params(spec)
    # down_proj's weight gradient (an MoE block's: every expert's, one grouped product) and the head's. An MoE block
    # has an earlier point, its routing-weight product's backward, before any weight gradient of the block
    # (in_backward_early, beside ActivationEstimate.early_temp_bytes: activations_moe.routing_backward_per_token).
    down = (spec.num_experts or 1) * spec.intermediate_size * spec.hidden_size
    live = down + head
    moe = bool(spec.num_experts)
    if impl.shard_params:
        ub = 2 if training.mixed else pb
        reduce_b = fsdp2_reduce_bytes(training)
        old_grads = (ub + reduce_b) * layer
        if training.fsdp_version == 1:  # FSDP1: the gradients and their flat concatenation (fsdp1_buffers)
            from advisor.estimate.fsdp1_buffers import fsdp1_lower_blocks

            in_backward = buffers.in_backward - 2 * ub * layer + ub * live
            return validated_copy(buffers, dict(in_backward=in_backward,
                                                  in_backward_early=in_backward - ub * down if moe else None,
                                                  **fsdp1_lower_blocks(training, impl, world, layer=layer,
                                                                       n_layers=n_layers)))
        # A finished block's post-backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward,
        # _fsdp_collectives.py foreach_reduce) copies its gradients into a reduce-scatter input of reduce_dtype,
        # frees them, and keeps that input (comm_ctx.reduce_scatter_states, one buffer) until the next block's
        # post-backward: a lower block runs beside the fp32 input of the block above (below_top). It also
        # reshards the block (reshard_after_backward defaults to True), so under ZeRO-2, which kept every block
        # unsharded, a finished block frees its unsharded parameters. Under ZeRO-3 the bottom block has no block
        # below it to prefetch (bottom_less).
        # Two more points of a block's backward: late in it (its attention's input projections: every weight
        # gradient of the block exists, the MLP's wide temporaries are gone), which decides when the weights
        # outweigh the activations (short sequences), and the top block's post-backward, where the block is
        # resharded before its reduce-scatter input is allocated and its gradients are freed after the copy-in.
        # unsharded parameters and reduce-scatter input
        padded = layer + expert_shard_padding(spec, world, dim1=training.recipe.shard_experts_on_dim1)
        resharded, no_prefetch = (0, ub * padded) if impl.reshard_after_forward else (ub * padded, 0)
        no_prefetch = no_prefetch if world > 1 else 0  # one rank prefetches nothing (fsdp2_one_rank)
        head_rs = 0
        if own_outer_units(spec, training, world):
            # The head's gradient was reduce-scattered at its unit's post-backward, before the blocks'; its
            # reduce-scatter input (in buffers.in_backward) lasts to the top block's post-backward, whose own input
            # replaces it; under ZeRO-3 the bottom block prefetches the embedding's unit, not a block
            # (strategy_buffers._outer_unit_fields).
            head, head_rs = 0, reduce_b * (outside - (spec.embedding_params or 0))
            if impl.reshard_after_forward:
                no_prefetch -= ub * (spec.embedding_params or 0)
        common = buffers.in_backward - old_grads + ub * head
        return validated_copy(buffers, dict(in_backward=common + ub * down, in_backward_early=common if moe else None,
                                              in_backward_late=common + ub * layer,
                                              top_reduce_scatter=common - head_rs + reduce_b * padded,
                                              below_top=reduce_b * padded - head_rs,
                                              per_block_done=-(-pb * layer // world) - resharded,
                                              num_blocks=n_layers, bottom_less=no_prefetch,
                                              saved_gone_at_reduce_scatter=moe))
    # DDP under autocast: a finished block also frees the bf16 copies of its weights that autograd saved for
    # its input gradient (``_autocast_weight_casts``: every block's without checkpointing, one recomputed
    # block's with it). Measured on an H100: Qwen2.5-0.5B DDP, seq 256, fused AdamW, 9.79 GiB at the end of
    # backward, where counting every block's copies at the bottom block gave 10.10 (benchmarks/results/gpu_stacks.md).
    casts = training.compute_bytes * (layer - routed_expert_params(spec)[1]) if training.mixed and not checkpointing else 0
    # At the MLP's product rule down_proj's backward has run and freed its weight's autocast copy, saved for its input
    # gradient (read on the simulated step: sweep 99301ffaf053, Phi fp16-mixed, fc2's 2,097,152 bytes gone there;
    # b86536f72b68, Llama bf16-mixed, down_proj's 106,496). The routed experts have no copy (grouped_mm).
    down_copy = training.compute_bytes * down if training.mixed and not training.low_precision_base and not moe else 0
    if training.optimizer_in_backward:  # each gradient is stepped and freed in its AccumulateGrad hook (in_backward)
        # autograd runs AccumulateGrad first among ready nodes (its sequence_nr is UINT64_MAX: torch/csrc/autograd/
        # node.h, NOTE [ Sequence Number ]), so down_proj's and an untied head's are gone by the MLP's product rule;
        # a tied head's waits in autograd's input buffer for the embedding's. Finished blocks leave no gradient.
        live, layer_grads = (head if tied else 0), 0
    else:
        layer_grads = pb * layer
    return validated_copy(buffers, dict(in_backward=buffers.in_backward + pb * live - down_copy,
                                          per_block_done=layer_grads - casts,
                                          num_blocks=n_layers,
                                          in_backward_early=buffers.in_backward + pb * head if moe else None))


def own_outer_units(spec: ModelSpec, training: TrainingConfig, world: int) -> bool:
    """Whether FSDP2 gives the embedding and the final norm + head units of their own here
    (``Recipe.fsdp_outer_units``, torchtitan): an untied model over more than one rank on the torch engine, its head
    unit kept after forward (torchtitan's default policy). A tied model shares one unit kept after forward, counted
    as the root (an upper bound: 2-6% over the simulated step on a 256-wide Llama); one rank is estimated as the root
    too, and a head unit resharded after forward (``fsdp_root_regathered``, torchtitan's ``always`` policy, which
    the planner does not offer) as the root gathered again. Under ``--loss fused`` (wrappers.losses reads the head's
    weight without calling the module, so FSDP2 takes the grouped unit's partial-group path, which the simulator's
    memory tracker cannot follow) the root layout is planned and simulated too."""
    return (training.recipe.fsdp_outer_units and not training.fsdp_root_regathered and training.engine == "torch"
            and training.loss != "fused"
            and training.fsdp_version == 2
            and world > 1 and spec.embedding_params is not None and not spec.tied_embeddings
            and bool(spec.head_params))


def _outer_unit_fields(spec: ModelSpec, impl: Implementation, world: int, *, ub: int, reduce_b: int, layer: int,
                       outside: int, root_t: int, held: int, ag_block: int, blocks_bwd: int, grads: int, h2d: int,
                       n_layers: int, last_block_rs: int, pb: int, grads_at_backward_end: int) -> dict:
    """FSDP2's buffers under torchtitan's units (``own_outer_units``; torchtitan apply_fsdp): the embedding
    (``E`` bytes unsharded) resharded after its forward under ZeRO-3 and kept under ZeRO-2, as the blocks are;
    the final norm and head (``H``) gathered after the last block and kept to their backward, whose
    post-backward reshards them and reduce-scatters their gradients before the blocks' backward begins (FSDP2's
    post-backward hook on the unit's input, torch/distributed/fsdp/_fully_shard/_fsdp_state.py), so neither is
    held through the blocks' backward. An all-gather's output lives until the next one is waited on: the head's
    to the end of forward, the embedding's to the first block's copy-out; the root's post-forward frees the
    last (``_post_forward``: ``all_gather_state = None``), so the loss backward holds the head alone; from the
    head's post-backward on, its gradient shard (the parameters' dtype) is held beside the blocks', and its
    reduce-scatter input (reduce_dtype) through the top block's backward, until the next post-backward reclaims it
    (``_fsdp_param_group.py`` ``post_backward``: ``comm_ctx.reduce_scatter_states``), as a block's is through the
    block below's (``below_top``). Under ZeRO-3 the bottom block prefetches the embedding's unit, trained or not,
    where the others prefetch a block (``bottom_less``). Read moment by moment on the simulated step (wrappers.fsdp
    ``outer_units``: tests/estimate/test_outer_units.py), except the head's reduce-scatter input in the top block:
    under the simulator's memory tracker FSDP2 runs the norm + head unit's post-backward in two parts (its partial
    group path, ``is_partial_group_backward``), and the norm's tiny input replaces the head's before the top block;
    without the tracker the unit's one post-backward reduce-scatters the whole head (tests/estimate/test_outer_units.py).
    At the head's own post-backward the unsharded head, its gradients and their reduce_dtype copy are counted
    together: the simulated step holds them so, though a whole-unit post-backward reshards before the copy-in (an
    upper bound by the head's unsharded bytes)."""
    embedding_p = spec.embedding_params or 0
    head_p = outside - embedding_p
    e_bytes, h_bytes = ub * embedding_p, ub * head_p
    head_t = min(root_t, head_p)  # the head trains first (PEFT's modules_to_save), then the embedding
    embedding_t = root_t - head_t
    head_shard = 0 if impl.offload_params else -(-pb * head_t // world)  # offloaded: the shard goes to the CPU
    head_rs = reduce_b * head_t
    zero3 = impl.reshard_after_forward
    kept_e = 0 if zero3 else e_bytes  # ZeRO-2 keeps the embedding unsharded from its forward to its backward
    fields = dict(
        persistent=0,
        at_forward_start=e_bytes + max(e_bytes if zero3 else 0, 2 * ub * layer) + h2d + kept_e,
        at_last_block_forward=kept_e + held + 2 * ag_block + h2d if n_layers > 1 else None,
        at_forward_end=kept_e + (0 if zero3 else held) + 2 * h_bytes + h2d,
        at_loss=kept_e + (0 if zero3 else held) + h_bytes + h2d,
        in_backward=kept_e + blocks_bwd + grads + head_shard + head_rs + h2d,
        at_head_backward=(kept_e + (0 if zero3 else held) + h_bytes + (ub + reduce_b) * head_t + head_shard + h2d
                          if head_t else None),
        grads_at_backward_end=grads_at_backward_end + head_shard,
    )
    # The embedding's backward, the step's last: its unsharded parameters (gathered again under ZeRO-3) and its
    # gradient beside the last block's reduce-scatter input, then its own reduce-scatter input and output.
    fields["at_backward_end"] = (max(e_bytes + ub * embedding_t + last_block_rs,
                                     e_bytes + reduce_b * embedding_t + reduce_b * -(-embedding_t // world))
                                 if embedding_t else 0)
    if embedding_t < embedding_p and n_layers > 1:
        # Not a full fine-tune (block_backward_buffers reads a full one's blocks): the lower blocks' line, each
        # finished block leaving its gradients' shard and its reduce-scatter input to the block below (the head's
        # leaves with the top block's post-backward); the bottom block prefetching the embedding under ZeRO-3.
        per_block_t = max(0, grads // (ub + reduce_b)) if ub + reduce_b else 0
        fields.update(num_blocks=n_layers, per_block_done=-(-pb * per_block_t // world),
                      below_top=reduce_b * per_block_t - head_rs,
                      bottom_less=(ag_block - e_bytes) if zero3 else 0)
    return fields


def trainable_split(spec: ModelSpec, layer: int, n_layers: int) -> tuple[int, int]:
    """(trainable parameters in the blocks, trainable parameters in the root). Training spreads over the
    blocks first: LoRA's adapters live there, and ``--trainable-params`` leaves whole tensors trainable
    across the blocks (``advisor.simulate.model.freeze_to``); a full fine-tune trains the root too."""
    blocks = layer * n_layers - blocks_saving(spec)
    if spec.trainable_params >= spec.total_params:
        return blocks, spec.total_params - blocks
    inside = min(spec.trainable_params, blocks)
    return inside, spec.trainable_params - inside


def tied_sum_in_place(training: TrainingConfig) -> bool:
    """Whether the head's gradient reaches a tied matrix's ``AccumulateGrad`` as a plain tensor autograd holds
    the last reference to, so that the embedding's gradient is summed into it in place (torch/csrc/autograd/
    input_buffer.cpp ``accumulate`` / ``can_accumulate_inplace``), whatever the precision and strategy: the
    fused loss's own backward returns a fresh product (``wrappers.losses._FusedLinearCrossEntropy.backward``:
    ``grad_weight * grad_loss``), and the chunked loss's head gradients, one transposed view per chunk, are
    first summed among themselves out of place into a fresh tensor (two chunks or more: any sequence of 2
    tokens). Only transformers' loss, one product with the head, hands the matrix the matmul's transposed
    view (``TBackward0``), whose base holds a second reference: out of place, unless autocast's cast node
    stands between (DDP under autocast: ``cast_back`` in ``estimate_strategy_buffers``). Measured on the
    simulated step, which sums in place where a GPU does (``advisor.simulate.cuda_kernels``):
    tests/estimate/test_tied_sum.py."""
    return training.loss == "fused" or (training.loss == "chunked" and training.seq_len >= 2)


def _root_backward_end(spec: ModelSpec, outside: int, root_t: int, *, ub: int, reduce_b: int, shard_b: int,
                       world: int, last_block_rs: int,
                       in_place: bool) -> tuple[int, int | None, tuple[int, int] | None]:
    """FSDP2's buffers at the end of backward, beyond the blocks' gradient shards: the larger of the
    embedding's backward (the unsharded root, the head's gradient waiting in autograd's input buffer,
    the embedding's gradient, the root's other gradients, and under tied weights their sum, out of place unless ``in_place``
    (``tied_sum_in_place``: FSDP2's MixedPrecisionPolicy casts no weight, so only the loss kernel decides);
    the last block's reduce-scatter input, freed only when the next reduce-scatter is waited on) and the
    root's own reduce-scatter (its unsharded gradients and their reduce_dtype copy: _fsdp_collectives.py
    foreach_reduce), and the embedding's backward alone (None where the root makes no gradient): an accumulated
    gradient sits beside it (``accumulation.held_at_backward_end``); and that backward in a micro-batch before the
    last under no_sync, beyond the gradients held (``StrategyBuffers.at_unsynced_embedding_backward``). Measured on
    the simulated step (tests/estimate/test_backward_end.py, tests/estimate/test_accumulation.py)."""
    reduce_root = (ub + reduce_b) * root_t
    if root_t < outside:  # a frozen (or partly frozen) root: no embedding gradient is computed
        return reduce_root, None, None
    head = _head_params(spec)
    embedding = spec.embedding_params if spec.embedding_params is not None else head
    # Then foreach_reduce frees the gradients it copied in and allocates the reduce-scatter output (the rank's
    # shard, reduce_dtype), but the embedding's gradient, the backward's last, is still referenced from C++ (no
    # Python object refers to it: gc at the reduce-scatter, Qwen2 and Phi alike): the input, the output and that
    # gradient. Read op by op on the simulated step: an untied 384-wide Qwen2, V 70,400, zero2 x2, bf16-mixed,
    # fused loss: 216 + 108 + 54 MB (sweep 34a341f64faf, GPT-NeoX alike: -7.25% without the last two). Over two
    # ranks or one the output is half the input or all of it, and this point the larger. Counted for an untied head:
    # tied (StarCoder2's and OLMo 2's rows on one rank) the estimate was exact without it and 0.9-9.5% over with it.
    # Phi's untied rows are over with it too (sweep_cases.known_gap).
    # Where the shard is reduced in another dtype than the parameters' (the Trainer's bf16 over fp32 shards)
    # foreach_reduce casts the output to theirs beside it (_to_dtype_if_needed): the rank's shard once more, which the
    # untied point holds. Simulated (the Trainer, bf16-mixed, zero3, Qwen2.5-0.5B's shapes untied, 4 blocks, seq 256):
    # 4 x 272,270,208 / 2 = 544,540,416 bytes over two ranks, where the estimate's end of backward was 514,717,268
    # short of the simulated one (-13.7%; over four ranks 106,311,956, -4.7%), now 2,516 bytes short on both.
    tied = bool(spec.tied_embeddings) or spec.head_params == 0
    if not tied:
        shard = -(-root_t // world)
        cast = shard_b * shard if shard_b != reduce_b else 0
        reduce_root = max(reduce_root, reduce_b * root_t + reduce_b * shard + cast + ub * embedding)
    head_grad = embedding if tied else (spec.head_params if spec.head_params is not None else head)
    summed = embedding if tied and not in_place else 0
    # The root's other parameters (a learned position table, the final norm) got their gradients earlier in
    # backward, held unsharded until the root's reduce-scatter: GPT-2's wpe runs its backward before wte (made
    # after it in forward). Sweep fe471bf63189 (GPT-2, 8,192 positions, zero3 x4, s128): -5.78% without them.
    others = max(0, outside - embedding - (0 if tied else head_grad))
    embedding_backward = ub * outside + ub * (head_grad + embedding + summed + others) + last_block_rs
    # A micro-batch before the last under no_sync reduce-scatters nothing: no block's input is held, and the
    # gradients it makes here come beside the held ones (the whole model's, counted apart): from the second on
    # these, as in the last one; in the first a tied head's gradient is the held one (its weight had none).
    later = embedding_backward - last_block_rs
    unsynced = (later - (ub * head_grad if tied else 0), later)
    return max(reduce_root, embedding_backward), embedding_backward, unsynced


def _replicated_backward_end(spec: ModelSpec, pb: int, in_place: bool) -> tuple[int | None, int]:
    """(buffers, gradients) at the end of a replicated backward (DDP, torch ZeRO-1, one GPU's plain
    model): the embedding's backward, the step's last. Every other trainable gradient is accumulated in
    the parameters' dtype ``pb`` and the embedding's gradient is computed (in ``pb`` too: autocast leaves
    the embedding in fp32). Untied, that is every gradient: the optimizer step's figure without its
    temporaries. Tied, the head's gradient waits in autograd's input buffer for the embedding's, and the
    engine sums the two in place into the head's only when that is a plain tensor it holds the last
    reference to (torch/csrc/autograd/input_buffer.cpp ``accumulate`` / ``can_accumulate_inplace``):
    under autocast it is the fresh fp32 copy autocast's cast node returns, and under the fused or chunked
    loss a fresh tensor too (``tied_sum_in_place``), so two vocabulary-sized gradients are live (``in_place``);
    with transformers' loss without autocast (fp32, pure bf16, as under FSDP2's MixedPrecisionPolicy) it is
    the matmul's transposed view, whose base holds a second reference, and the sum is out of place: three. Checked with real tensors on the CPU (the summed gradient's data pointer
    is the cast copy's under autocast, a new one without). DDP's buckets (``persistent``) are allocated at
    construction; with ``gradient_as_bucket_view=False`` each gradient is copied into its bucket view
    and back, allocating nothing. Measured on an H100 (Qwen2.5-0.5B, tied, bf16-mixed DDP x2,
    micro-batch 1, seq 256, fused AdamW): 10,516,265,984 B allocated, this moment's 10,425,193,984 plus
    the 87 MiB every DDP row there holds beyond the estimate (tests/estimate/test_ddp_backward_end.py).
    The simulator sums in place where a GPU does (a fake tensor is a tensor subclass, which
    ``can_accumulate_inplace`` refuses: ``advisor.simulate.cuda_kernels`` applies the GPU's rule). None where the root is not wholly trainable (LoRA: the embedding
    gets no gradient)."""
    if spec.trainable_params < spec.total_params:
        return None, 0
    head = _head_params(spec)
    embedding = spec.embedding_params if spec.embedding_params is not None else head
    tied = bool(spec.tied_embeddings) or spec.head_params == 0
    vocab_grads = (2 if in_place else 3) if tied else 1
    return pb * embedding * vocab_grads, pb * (spec.trainable_params - embedding)


def _autocast_weight_casts(spec: ModelSpec, blocks: int, layer: int, checkpointing: bool, *,
                           head_cast: bool = True) -> tuple[int, int, int]:
    """Bytes of the bf16 weight copies autocast makes, at the end of forward, in the loss backward and
    in a block's backward. Autocast caches the copy of a weight that requires grad until the autocast
    region ends (aten/src/ATen/autocast_mode.cpp cached_cast: leaf tensors that require grad), which
    is after the loss; a frozen weight's copy is made anew at each use. Either lives on only where
    autograd saved it for the input gradient: everywhere without checkpointing; under checkpointing
    only at the head (blocks save their input alone and recompute one block at a time).
    Measured: the simulated and the real-GPU DDP steps with checkpointing (benchmarks/results).
    ``head_cast`` False: the fused loss (``wrappers.losses.fused_linear_cross_entropy``) reads the head's
    weight with autocast off and casts it itself, a copy freed with its forward
    (``activations_loss.loss_bytes`` counts it) and saved for nothing, so autocast holds no copy of the head.
    In a block's backward the head's copy is gone: the head's backward, which ran before any block's, freed it (the
    cache went with the autocast region, before the backward; read on the simulated step, sweep b86536f72b68: the
    top block's MLP backward holds the recomputed block's copies alone, 417,792 bytes, not the head's 344,064)."""
    head = _head_params(spec) if head_cast else 0
    full = spec.trainable_params >= spec.total_params
    cached = blocks + head if full else min(spec.trainable_params, blocks)
    saved_blocks = layer if checkpointing else blocks
    forward_end = cached + (0 if full else head + (0 if checkpointing else blocks - cached))
    at_loss = head + (0 if checkpointing else blocks)
    return 2 * forward_end, 2 * at_loss, 2 * saved_blocks


def expert_shard_padding(spec: ModelSpec, world: int, *, dim1: bool = False) -> int:
    """Elements FSDP2 adds to one MoE layer's routed experts on ``world`` ranks: the experts are stacked
    (E, ...) tensors and ``fully_shard`` splits dim 0 into ``ceil(E / world)``-row chunks, every rank holding
    one chunk (zero rows padded to it: torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``_chunk_with_empty``
    and ``padded_sharded_param_size``), and the unsharded parameter is a view of the padded all-gather output.
    So 8 experts over 64 ranks leave each rank a whole expert of each tensor, 8 times its 1/64 share.
    Read on the simulated step (sweep row 656172c5f2ab, Mixtral 8 experts, ZeRO-2 on 64 ranks).

    ``dim1``: the recipe shards the experts on dim 1 over more ranks than experts (``Recipe.shard_experts_on_dim1``,
    torchtitan's rule, ``wrappers.fsdp.expert_placement_fn``). FSDP2 splits dim 1 only evenly (``_init_sharded_param``
    raises on an uneven one), so such a tensor pads nothing: its shard is dim1 / world rows; a tensor whose dim 1
    ``world`` does not divide stays on dim 0 and pads as above. The tensors are transformers' gated experts,
    gate_up_proj (E, 2i, h) and down_proj (E, h, i), i = expert_params / 3h."""
    if not spec.num_experts or not spec.expert_params:
        return 0
    rows = -(-spec.num_experts // world) * world - spec.num_experts
    h = spec.hidden_size or 0
    if not (dim1 and world > spec.num_experts and h):
        return rows * spec.expert_params
    if spec.expert_params % (3 * h):  # not two gated tensors: one expert moves to dim 1 when h splits evenly
        return 0 if h % world == 0 else rows * spec.expert_params
    i = spec.expert_params // (3 * h)
    gate_up, down = (0 if (2 * i) % world == 0 else 2 * h * i), (0 if h % world == 0 else h * i)
    return rows * (gate_up + down)


def routed_expert_params(spec: ModelSpec) -> tuple[int, int]:
    """(every MoE layer's routed experts, one MoE layer's): weights autocast never casts, since the experts run
    ``_grouped_mm`` on their own dtype (``activations_moe.experts_bytes``; measured under CPU autocast: no copy of
    an expert weight is saved, tests/estimate/test_moe_backward.py)."""
    if not spec.num_experts or not spec.expert_params or not spec.num_layers:
        return 0, 0
    one = spec.num_experts * spec.expert_params
    if spec.hybrid is not None:
        return one * sum(spec.hybrid.expert_layers), one
    return one * (spec.num_layers - (spec.moe.num_dense_layers if spec.moe else 0)), one


def _head_params(spec: ModelSpec) -> int:
    if spec.head is not None:  # a task head (advisor.model.heads): its own few outputs, not the vocabulary
        return spec.head_params or 0
    if spec.vocab_size and spec.hidden_size:
        return spec.vocab_size * spec.hidden_size
    return 0


def _adapter_casts(spec: ModelSpec, n_layers: int, checkpointing: bool) -> tuple[int, int, int]:
    """The bf16 copies autocast makes of fp32 adapters over a bf16 base (cached until autocast ends, then
    kept where autograd saved them): all of them at the end of forward; without checkpointing they
    live on through backward, with it one block's are remade at a time."""
    adapters = 2 * spec.trainable_params
    per_block = adapters // max(1, n_layers)
    return adapters, 0 if checkpointing else adapters, per_block if checkpointing else adapters
