"""Per-GPU memory of one steady-state training step: the worst rank's peak, split by category.

``estimate_memory(spec, hardware, training, strategy, micro_batch_size=, checkpointing=)`` is a
pure function returning integer bytes. The peak is the largest of four moments of the step:

- end of forward: model states at rest + saved activations + the logits, their fp32 copy and the
  saved log-softmax output + what the strategy holds during compute;
- loss backward: the same, with the logits freed (the loop keeps only the loss) and three fp32
  N x V tensors (log-softmax output, NLL gradient, log-softmax gradient) live;
- a block's backward: saved activations (+ the recomputed block under checkpointing), the block's
  backward temporaries, and the strategy's backward buffers (FSDP2: unsharded block and its
  gradients, the reduce-scatter input in fp32);
- optimizer step: model states + full (or sharded) gradients + the optimizer's temporaries.

What the strategy holds: autocast weight copies and DDP buckets; FSDP2's unsharded root (never
resharded), all unsharded blocks (ZeRO-2) or the block being gathered (ZeRO-3). Every moment is
checked against PyTorch's own execution of the step (``advisor.simulate.step``,
``benchmarks/accuracy.py``: 30 cases, 5 architectures, within 5%).

Two views, both in ``MemoryBreakdown``: the breakdown is what is live at the winning moment
(``peak_moment``), so ``params + grads + optimizer + activations + temporary == peak_allocated``
(what ``torch.cuda.max_memory_allocated()`` reports); a strategy whose peak falls in backward
shows no resting gradients while one whose peak is the optimizer step shows them all, because the
moments differ. ``states_params / states_grads / states_optimizer`` are the model states per rank
at rest, wherever they live (the ZeRO paper's quantity, the same at every moment), so strategies
compare on one footing.

Model states follow the engine (``advisor.estimate.states``). What the strategy holds beyond
them, torch engine: DDP keeps a second copy of the gradients in its buckets
(``gradient_as_bucket_view=False``); autocast keeps bf16 copies of the weights for backward; FSDP2
all-gathers bf16 blocks.

A quantised base (``--quantize``, QLoRA): ``advisor.estimate.quantized`` replaces the parameter bytes
and the strategy's buffers, and adds one dequantised linear to a block's backward.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field

from advisor.estimate.activations import ActivationEstimate, Adapters, Dtypes, estimate_activations, shape_of
from advisor.estimate.activations_llava import clip_weight_casts
from advisor.estimate.states import FP32, ModelStates, model_states
from advisor.estimate.activations_vision import vision_saved_bytes
from advisor.estimate.traced import activations_from_profile, find_profile, profile_key
from advisor.model.lora import adapter_inputs, selective_kept_linears, tower_adapter_params
from advisor.hardware.cluster import Hardware
from advisor.model.spec import ModelSpec
from advisor.model.llava import ClipTowerFacts
from advisor.strategies import Implementation
from advisor.training import TrainingConfig

PeakMoment = Literal["end_of_forward", "loss_backward", "block_backward", "optimizer_step"]


class MemoryBreakdown(BaseModel):
    """Per-GPU memory in two views. The peak view (``params`` .. ``temporary``, ``runtime_overhead``,
    ``total``) is what is live at ``peak_moment``, so it differs between strategies whose peaks fall
    at different moments. The at-rest view (``states_*``) is each rank's share of the model states,
    the same at every moment: compare strategies there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(ge=0, description="Parameters resident on the GPU at the peak.")
    grads: int = Field(ge=0, description="Gradients resident at the peak.")
    optimizer: int = Field(ge=0, description="Optimizer state (and master weights) on the GPU.")
    activations: int = Field(ge=0, description="Saved activations and returned logits.")
    temporary: int = Field(ge=0, description="Buffers: comm buckets, all-gathers, casts, loss, optimizer temps.")
    runtime_overhead: int = Field(ge=0, description="The allocator's gap (reserved minus allocated) plus "
                                  "outside_allocator: what the GPU holds beyond peak_allocated.")
    outside_allocator: int = Field(default=0, ge=0, description="CUDA context and NCCL buffers, part of "
                                   "runtime_overhead, that torch.cuda.max_memory_reserved() does not count.")
    cpu_bytes: int = Field(default=0, ge=0, description="CPU RAM per rank (offloaded states).")
    peak_phase: Literal["forward_backward", "optimizer_step"] = Field(
        description="When the peak happens (coarse; kept for old readers, see peak_moment).")
    peak_moment: PeakMoment = Field(
        description="Which of the four moments of the step is the peak: end_of_forward, loss_backward, "
                    "block_backward or optimizer_step. params..temporary above are what is live then.")
    states_params: int = Field(ge=0, description="Model states at rest, per rank: parameters "
                               "(on the CPU when states_on_cpu is 'all').")
    states_grads: int = Field(ge=0, description="Model states at rest, per rank: gradients (on the CPU "
                              "when states_on_cpu is not 'none'; the torch engines allocate them in backward).")
    states_optimizer: int = Field(ge=0, description="Model states at rest, per rank: optimizer "
                                  "state and fp32 master weights (on the CPU when states_on_cpu is not 'none').")
    states_on_cpu: Literal["none", "optimizer", "all"] = Field(
        description="What rests on the CPU: 'none' (all on the GPU), 'optimizer' (gradients and optimizer "
                    "state: DeepSpeed ZeRO-Offload) or 'all' (parameters too).")
    # peak_allocated at each of the four moments (the largest is peak_moment's); the timeline chart
    # marks all four. None where a breakdown was not built by estimate_memory.
    at_end_of_forward: int | None = Field(default=None, ge=0, description="peak_allocated at the end of forward.")
    at_loss_backward: int | None = Field(default=None, ge=0, description="peak_allocated in the loss's backward.")
    at_block_backward: int | None = Field(default=None, ge=0, description="peak_allocated in a block's backward.")
    at_optimizer_step: int | None = Field(default=None, ge=0, description="peak_allocated in the optimizer step.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_allocated(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary

    @property
    def moments(self) -> dict[str, int] | None:
        """The four moments' peak_allocated by name (``PeakMoment``), or None where not estimated."""
        values = {name: getattr(self, f"at_{name}") for name in get_args(PeakMoment)}
        return None if None in values.values() else values

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.peak_allocated + self.runtime_overhead

    @computed_field  # type: ignore[prop-decorator]
    @property
    def allocator_gap(self) -> int:
        """The caching allocator's reserved-minus-allocated gap, the calibrated part of runtime_overhead
        (``profiles/allocator_overhead.json``); the rest is outside_allocator, an assumption (--context-gib)."""
        return self.runtime_overhead - self.outside_allocator

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reserved(self) -> int:
        """What ``torch.cuda.max_memory_reserved()`` should report: total less the CUDA context and NCCL."""
        return self.total - self.outside_allocator

    @computed_field  # type: ignore[prop-decorator]
    @property
    def states_total(self) -> int:
        """Model states at rest per rank (params + grads + optimizer), wherever they live."""
        return self.states_params + self.states_grads + self.states_optimizer


def _recipe_dtypes(training: TrainingConfig, impl: Implementation) -> Dtypes:
    """Residual/compute widths under the engine's recipe (see module docstring)."""
    if training.precision == "fp32":
        return Dtypes(residual=4, compute=4, input_casts=False, buffer=4)
    if training.precision == "bf16" or training.engine == "deepspeed":
        return Dtypes(residual=2, compute=2, input_casts=False)  # the whole module cast: no autocast
    if impl.shard_params:  # FSDP2's MixedPrecisionPolicy casts parameters, not buffers
        return Dtypes(residual=2, compute=2, input_casts=False, buffer=4)
    if training.low_precision_base:  # autocast over a bf16 base: a bf16 residual; fp32 adapters cast their input
        return Dtypes(residual=2, compute=2, input_casts=True, buffer=4)
    return Dtypes(residual=4, compute=2, input_casts=True, buffer=4)  # autocast over fp32 weights


recipe_dtypes = _recipe_dtypes  # public name for the planner's tracing edge (advisor.planning.api)


def _block_params(spec: ModelSpec) -> tuple[int, int, int]:
    """(one block, number of blocks, everything outside the blocks)."""
    if spec.layer_params is not None and spec.num_layers:
        # MoE models with dense layers (DeepSeek): those hold less than the MoE block counted here.
        inside = spec.layer_params * spec.num_layers - spec.dense_layer_saving
        return spec.layer_params, spec.num_layers, spec.total_params - inside
    shape = shape_of(spec)
    outside = 2 * shape.vocab_size * shape.hidden_size
    layers = shape.num_layers
    return max(1, (spec.total_params - outside) // layers), layers, outside


class StrategyBuffers(BaseModel):
    """Bytes a strategy holds beyond model states and activations, at each moment of the step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    persistent: int = Field(description="Held the whole step (DDP buckets, DeepSpeed IPG bucket).")
    at_loss: int = Field(description="Held while the loss is differentiated.")
    in_backward: int = Field(description="Held while a block runs backward.")
    at_forward_end: int | None = Field(default=None, description="Held at the end of forward, if not at_loss.")


def _strategy_buffers(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int, *,
                      checkpointing: bool = False) -> StrategyBuffers:
    """What the strategy holds beyond states and activations (FSDP2 figures from
    torch/distributed/fsdp/_fully_shard: _fsdp_param_group.py, _fsdp_collectives.py)."""
    layer, n_layers, outside = _block_params(spec)
    if training.engine == "deepspeed":
        from advisor.estimate.buckets import deepspeed_buckets  # DeepSpeed's buckets load only for that engine

        buckets = deepspeed_buckets(spec)
        # The IPG buffer: one reduce bucket of 16-bit gradients (reduce_bucket_size elements).
        bucket = 2 * min(spec.trainable_params, buckets.reduce_elements)
        # Gathered parameters, capped by stage3_max_live_parameters. On
        # the GPU the rank's own partition is part of the gathered tensor, so at most the whole
        # model is resident, as under ZeRO-2; offloaded partitions live on the CPU.
        own = 0 if impl.offload_params else spec.total_params // world
        gathered = spec.total_params - own
        live = 2 * min(gathered, buckets.max_live_parameters) if impl.shard_params else 0
        return StrategyBuffers(persistent=bucket, at_loss=live, in_backward=live)
    pb = training.param_bytes
    if impl.shard_params:
        ub = 2 if training.mixed else pb  # MixedPrecisionPolicy(param_dtype=bf16/fp16)
        reduce_b = FP32 if training.mixed else pb  # reduce_dtype=fp32
        root = ub * outside  # FSDP2 never reshards the root after forward (FSDPState._lazy_init)
        h2d = pb * layer // world if impl.offload_params else 0
        if impl.reshard_after_forward:
            # ZeRO-3: at the loss, the last block's all-gather (backward prefetch) is in flight; in a
            # block's backward, that block is unsharded and the next one is being gathered.
            at_loss, blocks_bwd = ub * layer, 2 * ub * layer
        else:
            # ZeRO-2: every block stays unsharded, each as large as it is (MoE dense layers, Jamba's kinds).
            at_loss = blocks_bwd = ub * (layer * n_layers - spec.dense_layer_saving)
        # Backward of one block: its unsharded gradients (param dtype) and the reduce-scatter input
        # (reduce_dtype).
        grads = ub * layer + reduce_b * layer
        return StrategyBuffers(persistent=0, at_loss=root + at_loss + h2d, in_backward=root + blocks_bwd + grads + h2d)
    buckets = 0 if impl.single_process else pb * spec.trainable_params  # DDP gradient buckets
    if not training.mixed:
        return StrategyBuffers(persistent=buckets, at_loss=0, in_backward=0)
    if training.low_precision_base:  # a bf16 base needs no cast; only the fp32 adapters are copied
        forward_end, at_loss, in_backward = _adapter_casts(spec, n_layers, checkpointing)
    else:
        forward_end, at_loss, in_backward = _autocast_weight_casts(spec, layer * n_layers - spec.dense_layer_saving,
                                                                   layer, checkpointing)
    return StrategyBuffers(persistent=buckets, at_loss=at_loss, in_backward=in_backward, at_forward_end=forward_end)


def _autocast_weight_casts(spec: ModelSpec, blocks: int, layer: int, checkpointing: bool) -> tuple[int, int, int]:
    """Bytes of the bf16 weight copies autocast makes, at the end of forward, in the loss backward and
    in a block's backward. Autocast caches the copy of a weight that requires grad until the autocast
    region ends (aten/src/ATen/autocast_mode.cpp cached_cast: leaf tensors that require grad), which
    is after the loss; a frozen weight's copy is made anew at each use. Either lives on only where
    autograd saved it for the input gradient: everywhere without checkpointing; under checkpointing
    only at the head (blocks save their input alone and recompute one block at a time).
    Measured: the simulated and the real-GPU DDP steps with checkpointing (benchmarks/results)."""
    head = _head_params(spec)
    full = spec.trainable_params >= spec.total_params
    cached = blocks + head if full else min(spec.trainable_params, blocks)
    saved_blocks = layer if checkpointing else blocks
    forward_end = cached + (0 if full else head + (0 if checkpointing else blocks - cached))
    at_loss = head + (0 if checkpointing else blocks)
    return 2 * forward_end, 2 * at_loss, 2 * (head + saved_blocks)


def _adapter_casts(spec: ModelSpec, n_layers: int, checkpointing: bool) -> tuple[int, int, int]:
    """The bf16 copies autocast makes of fp32 adapters over a bf16 base (cached until autocast ends, then
    kept where autograd saved them): all of them at the end of forward; without checkpointing they
    live on through backward, with it one block's are remade at a time."""
    adapters = 2 * spec.trainable_params
    per_block = adapters // max(1, n_layers)
    return adapters, 0 if checkpointing else adapters, per_block if checkpointing else adapters


def _head_params(spec: ModelSpec) -> int:
    if spec.vocab_size and spec.hidden_size:
        return spec.vocab_size * spec.hidden_size
    return 0


def _activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, *, micro_batch_size: int,
                 checkpointing: bool) -> ActivationEstimate:
    dtypes = _recipe_dtypes(training, impl)
    # A traced profile of this recipe and shape (families without a formula) replaces the formula.
    profile = find_profile(spec, profile_key(dtypes, training, checkpointing=checkpointing)) if spec.traced else None
    if profile is not None and spec.num_layers:
        return activations_from_profile(profile, num_layers=spec.num_layers, micro_batch_size=micro_batch_size,
                                        vocab_size=spec.vocab_size or 0)
    images = image_tokens(spec, training)
    est = estimate_activations(
        shape_of(spec),
        dtypes,
        micro_batch_size=micro_batch_size,
        seq_len=training.seq_len + images,
        target_len=training.target_len,
        checkpointing=checkpointing,
        eager=training.attention == "eager",
        adapters=_adapters(spec, training),
        loss_kernel=training.loss,
        selective=checkpointing and training.activation_checkpointing == "selective",
        kept_width=sum(fan_out for _, fan_out in selective_kept_linears(spec) or ()),
    )
    frozen_tower = training.lora is not None and not tower_adapter_params(spec, training.lora)
    if spec.vision is None or not images or frozen_tower:  # a frozen tower saves nothing
        return est
    tower = micro_batch_size * vision_saved_bytes(dtypes.compute, spec.vision, image_tokens=images,
                                                  residual=dtypes.residual, input_casts=dtypes.input_casts)
    if dtypes.input_casts and isinstance(spec.vision, ClipTowerFacts):  # autocast's saved bf16 weight copies
        tower += clip_weight_casts(spec.vision)
    return est.model_copy(update={"saved_bytes": est.saved_bytes + tower})


def image_tokens(spec: ModelSpec, training: TrainingConfig) -> int:
    """Language-model tokens the images of one sample add: (side / pixels per token)^2 each, rounded up
    (Qwen2.5-VL: 14-pixel patches merged 2 x 2, one token per 28 x 28 pixels; a 448 x 448 image is 256)."""
    if not training.images_per_sample:
        return 0
    if spec.tokens_per_image is not None:  # Llava: every image resized to the tower's side
        return training.images_per_sample * spec.tokens_per_image
    if spec.image_token_pixels is None:
        raise ValueError(f"--images-per-sample needs a vision-language model; {spec.name[:60]} takes no images")
    side = -(-training.image_size // spec.image_token_pixels)
    return training.images_per_sample * side * side


def _adapters(spec: ModelSpec, training: TrainingConfig) -> Adapters | None:
    """LoRA on a frozen base, where the activation model knows the block's inputs."""
    if training.lora is None:
        return None
    inputs = adapter_inputs(spec, training.lora)
    if inputs is None:
        return None
    return Adapters(rank=training.lora.rank, dropout=training.lora.dropout > 0, inputs=tuple(inputs))


def estimate_memory(
    spec: ModelSpec,
    hardware: Hardware,
    training: TrainingConfig,
    impl: Implementation,
    *,
    micro_batch_size: int,
    checkpointing: bool,
) -> MemoryBreakdown:
    """The worst rank's peak during a steady-state step (see module docstring)."""
    world = hardware.world_size
    states = model_states(spec, training, impl, world)
    acts = _activations(spec, training, impl, micro_batch_size=micro_batch_size, checkpointing=checkpointing)
    buffers = _strategy_buffers(spec, training, impl, world, checkpointing=checkpointing)
    dequantized = 0  # --quantize: packed base weights, their buffers, one dequantised linear in backward
    if training.quantize is not None:
        from advisor.estimate.quantized import apply_quantization

        states, buffers, dequantized = apply_quantization(spec, training, impl, world, states,
                                                          checkpointing=checkpointing,
                                                          micro_batch_size=micro_batch_size)
    return memory_at_moments(states, acts, buffers, training, impl, world=world, dequantized=dequantized)


def memory_at_moments(states: ModelStates, acts: ActivationEstimate, buffers: StrategyBuffers,
                      training: TrainingConfig, impl: Implementation, *, world: int,
                      dequantized: int = 0) -> MemoryBreakdown:
    """The four moments of the step from one rank's states, activations and strategy buffers; the
    largest is the peak. Shared by the data-parallel estimate above and the mesh estimate
    (``advisor.estimate.model_parallel``), which passes its own per-rank shares. ``dequantized``: one
    dequantised linear of a quantised base, live in a block's backward (``advisor.estimate.quantized``)."""
    loss, logits = acts.loss_transient_bytes, acts.logits_bytes
    gathered = 0
    if impl.single_process:  # DataParallel: GPU0 gathers every replica's logits and computes the loss
        logits, loss = logits * world, loss * world
        # The gathered output (all replicas' logits) lives on GPU0 until the loop drops it.
        gathered = acts.returned_logits_bytes * world
    gpu_params = 0 if states.on_cpu else states.params
    cpu_side = states.on_cpu or states.cpu_only_optimizer
    gpu_opt = 0 if cpu_side else states.optimizer
    gpu_grads = 0 if cpu_side else states.grads
    # DeepSpeed keeps a flat gradient buffer at rest; the torch engines allocate gradients in backward.
    rest_grads = gpu_grads if training.engine == "deepspeed" and not impl.shard_grads else 0
    base = dict(params=gpu_params, grads=rest_grads, optimizer=gpu_opt)
    moments = {
        # End of forward: logits, their fp32 copy and the log-softmax output.
        "end_of_forward": dict(base, activations=acts.saved_bytes + logits,
                               temporary=buffers.persistent + (buffers.at_loss if buffers.at_forward_end is None
                                                               else buffers.at_forward_end)),
        # Loss backward: the log-softmax output and two fp32 N x V gradients.
        "loss_backward": dict(base, activations=acts.saved_bytes + gathered,
                              temporary=buffers.persistent + buffers.at_loss + loss),
        # A block's backward: its recomputed activations (checkpointing) and its backward temporaries.
        "block_backward": dict(base, activations=acts.saved_bytes + acts.recompute_bytes,
                               temporary=buffers.persistent + buffers.in_backward + acts.backward_temp_bytes
                               + dequantized),
        "optimizer_step": dict(params=gpu_params, grads=gpu_grads, optimizer=gpu_opt, activations=0,
                               temporary=buffers.persistent + (0 if cpu_side else states.step_temporary)),
    }
    moment, parts = max(moments.items(), key=lambda item: sum(item[1].values()))
    phase = "optimizer_step" if moment == "optimizer_step" else "forward_backward"
    peak = sum(parts.values())
    cpu = 0
    if states.on_cpu:
        cpu = states.params + states.grads + states.optimizer + states.step_temporary
    elif states.cpu_only_optimizer:
        cpu = states.grads + states.optimizer + states.step_temporary
    return MemoryBreakdown(
        **parts,
        runtime_overhead=training.reserve_bytes + int(training.fragmentation * peak) + training.context_bytes,
        outside_allocator=training.context_bytes,
        cpu_bytes=cpu,
        peak_phase=phase,
        peak_moment=moment,
        states_params=states.params,
        states_grads=states.grads,
        states_optimizer=states.optimizer,
        states_on_cpu="all" if states.on_cpu else ("optimizer" if states.cpu_only_optimizer else "none"),
        **{f"at_{name}": sum(live.values()) for name, live in moments.items()},
    )
