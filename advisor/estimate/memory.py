"""Per-GPU memory of one steady-state training step: the worst rank's peak, split by category.

``estimate_memory(spec, hardware, training, strategy, micro_batch_size=, checkpointing=)`` is a
pure function returning integer bytes. The peak is the largest of the moments of the step:

- start of forward (FSDP2): the first block's forward, while the root's all-gather output is still
  held (FSDP2 frees an all-gather's output when the next one is waited on) beside the unsharded root,
  and the first block's all-gather output and its copy into the unsharded parameters; or, where it holds
  more, the last block's copy-out, beside the previous block's all-gather output, the unsharded root
  (ZeRO-2: and every block) and what the blocks before it saved (``last_block_activations``);
- end of forward: model states at rest + saved activations + the logits, their fp32 copy and the
  saved log-softmax output + what the strategy holds during compute;
- loss backward: the same, with the logits freed (the loop keeps only the loss) and three fp32
  N x V tensors (log-softmax output, NLL gradient, log-softmax gradient) live;
- a block's backward: saved activations (+ the recomputed block under checkpointing; the labels and the
  final norm's tensors already freed), the block's backward temporaries, and the strategy's backward
  buffers (FSDP2: unsharded block and its gradients, the reduce-scatter input in fp32; only the block's
  trainable weights have gradients). For a full fine-tune of a dense formula family on the torch
  engine the gradients are read as the step holds them (``strategy_buffers.block_backward_buffers``):
  the head's and down_proj's at the top block, and each finished block's (DDP) or their shards (FSDP2)
  below it, so the top, next or bottom block decides;
- end of backward (FSDP2): every block's gradient shard exists, and the root (embeddings, final norm,
  head: one FSDP unit) is at its widest point: either the embedding's backward (the unsharded root,
  the head's and the embedding's bf16 gradients, a third for their sum when tied (not under the fused
  or chunked loss, summed in place: ``strategy_buffers.tied_sum_in_place``), the last block's
  reduce-scatter input) or the root's reduce-scatter (its bf16 gradients and their fp32 copy);
  replicated (DDP, torch ZeRO-1, one GPU), a full fine-tune: the embedding's backward, every other
  gradient accumulated, the embedding's computed and, tied, the head's waiting to be summed into
  (``strategy_buffers._replicated_backward_end``);
- optimizer step: model states + full (or sharded) gradients + the optimizer's temporaries.

What the strategy holds (``advisor.estimate.strategy_buffers``): autocast weight copies and DDP
buckets; FSDP2's unsharded root (never resharded), all unsharded blocks (ZeRO-2) or the block being
gathered (ZeRO-3). Every moment is
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
all-gathers bf16 blocks. Deepspeed engine at ZeRO stage 1 or more, whichever recipe drives it (DeepSpeed's ZeRO facts, the deepspeed row):
ZeRO's IPG buffers, flat gradient partition and the step's copies (``advisor.estimate.zero_buffers``), and
its flat states get no allocator gap (``_flat_bytes``).

A quantised base (``--quantize``, QLoRA): ``advisor.estimate.quantized`` replaces the parameter bytes
and the strategy's buffers, and adds one dequantised linear to a block's backward.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_serializer

from advisor.estimate.accumulation import (accumulates_unsharded, accumulation_steps, accumulator_beside_embedding,
                                          held_accumulated_grads, held_at_backward_end)
from advisor.estimate.activation_kinds import activation_kind
from advisor.estimate.activations import ActivationEstimate, Adapters, Dtypes, estimate_activations, shape_of
from advisor.estimate.activations_encdec import ENCDEC_DORA_REFUSED
from advisor.estimate.activations_blocks import dora_weight_bytes
from advisor.estimate.activations_loss import loss_kept_bytes
from advisor.estimate.kv_cache import KvCacheBytes, estimate_kv_cache, kv_cache_not_modelled
from advisor.estimate.states import ModelStates, model_states
from advisor.estimate.strategy_buffers import StrategyBuffers, block_backward_buffers, estimate_strategy_buffers
from advisor.estimate.traced import activations_from_profile, find_profile, profile_key, saved_head_gradient
from advisor.precision import FP32
from advisor.frozen import in_json_order, validated_copy
from advisor.model.saved_modules import head_frozen
from advisor.model.block_kinds import kind_of
from advisor.model.lora import adapter_inputs, dora_outputs, tower_adapter_params
from advisor.model.selective import SelectiveKept, selective_kept
from advisor.hardware.cluster import Hardware
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig

PeakMoment = Literal["start_of_forward", "end_of_forward", "loss_backward", "block_backward", "end_of_backward",
                     "optimizer_step"]
# The moments every strategy has; start_of_forward holds more than these only under FSDP2, and
# end_of_backward only under FSDP2 and for a replicated full fine-tune (a tied embedding's two gradients:
# elsewhere the optimizer step holds all the end of backward does, and more), so they are estimated there alone.
CORE_MOMENTS = ("end_of_forward", "loss_backward", "block_backward", "optimizer_step")
# The first keys of a breakdown in --json, in the order readers have always seen (peak_phase is a property now,
# which pydantic would write last); the others follow as declared.
_KEYS = ("params", "grads", "optimizer", "activations", "temporary", "runtime_overhead", "outside_allocator",
         "cpu_bytes", "peak_phase", "peak_moment")


def _cached_bytes(description: str):
    """A field of bytes in reserved, not in total (cached blocks the allocator frees before an allocation fails),
    left out of the JSON when 0."""
    return Field(default=0, ge=0, exclude_if=lambda cached: cached == 0,
                 description=f"{description} Left out of the JSON when 0.")


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
    runtime_overhead: int = Field(ge=0, description="The part of the allocator's gap (reserved minus allocated) that "
                                  "must fit, plus outside_allocator: what the GPU needs beyond peak_allocated.")
    outside_allocator: int = Field(default=0, ge=0, description="CUDA context and NCCL buffers, part of "
                                   "runtime_overhead, that torch.cuda.max_memory_reserved() does not count.")
    cpu_bytes: int = Field(default=0, ge=0, description="CPU RAM per rank (offloaded states).")
    allocator_cache: int = _cached_bytes(
        "The part of the allocator's calibrated gap it caches while memory allows and frees before an allocation fails "
        "(fragmentation less fit_fragmentation of the peak, profiles/allocator_overhead.json: read from runs under a "
        "cap on reserved memory): in reserved, not in total.")
    gradient_stream_pool: int = _cached_bytes(
        "What FSDP's gradient shards, cached for its reduce-scatter stream alone, add to "
        "torch.cuda.max_memory_reserved() beyond the calibrated gap (reduce_scatter_pool_bytes): in "
        "reserved, not in total, since the allocator frees another stream's cached blocks before it "
        "fails an allocation, so they do not decide whether a plan fits.")
    recompute_cache: int = _cached_bytes(
        "What the caching allocator holds beyond the calibrated gap where the blocks are recomputed "
        "(checkpointing_fragmentation of the peak, profiles/allocator_overhead.json): in reserved, not in "
        "total, since the allocator frees its cached blocks before it fails an allocation (a Llama-3.1-8B "
        "full fine-tune under checkpointing trained on a 24 GB RTX 4090 where reserved with it would be "
        "24.1 GiB: benchmarks/results/published_jobs.md).")
    paged_on_cpu: int = Field(default=0, ge=0, exclude_if=lambda paged: paged == 0,
                              description="Paged optimizer state the driver evicts to CPU RAM (part of cpu_bytes; "
                                          "advisor.estimate.in_backward); left out of the JSON when 0.")
    activations_on_cpu: int = Field(default=0, ge=0, exclude_if=lambda offloaded: offloaded == 0,
                                    description="Saved activations of one micro-batch held in pinned CPU memory "
                                                "(--activation-offload; part of cpu_bytes, crossing PCIe out in "
                                                "forward and back in backward); left out of the JSON when 0.")
    peak_moment: PeakMoment = Field(
        description="Which moment of the step is the peak: start_of_forward (FSDP2), end_of_forward, "
                    "loss_backward, block_backward, end_of_backward (FSDP2, replicated full fine-tunes) or optimizer_step. "
                    "params..temporary above are what is live then.")
    states_params: int = Field(ge=0, description="Model states at rest, per rank: parameters "
                               "(on the CPU when states_on_cpu is 'all').")
    states_grads: int = Field(ge=0, description="Model states at rest, per rank: gradients (on the CPU "
                              "when states_on_cpu is not 'none'; the torch engines allocate them in backward).")
    states_optimizer: int = Field(ge=0, description="Model states at rest, per rank: optimizer "
                                  "state and fp32 master weights (on the CPU when states_on_cpu is not 'none').")
    states_on_cpu: Literal["none", "optimizer", "all"] = Field(
        description="What rests on the CPU: 'none' (all on the GPU), 'optimizer' (gradients and optimizer "
                    "state: DeepSpeed ZeRO-Offload) or 'all' (parameters too).")
    # peak_allocated at each moment (the largest is peak_moment's); the timeline chart marks them.
    # None where a breakdown was not built by estimate_memory, or the moment is not estimated.
    at_start_of_forward: int | None = Field(default=None, ge=0, description="peak_allocated in a block's "
                                            "forward, the first's or the last's copy-out (FSDP2; None elsewhere).")
    at_end_of_forward: int | None = Field(default=None, ge=0, description="peak_allocated at the end of forward.")
    at_loss_backward: int | None = Field(default=None, ge=0, description="peak_allocated in the loss's backward.")
    at_block_backward: int | None = Field(default=None, ge=0, description="peak_allocated in a block's backward.")
    at_end_of_backward: int | None = Field(default=None, ge=0, description="peak_allocated at the end of "
                                           "backward (FSDP2 and replicated full fine-tunes; None elsewhere).")
    at_optimizer_step: int | None = Field(default=None, ge=0, description="peak_allocated in the optimizer step.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_phase(self) -> Literal["forward_backward", "optimizer_step"]:
        """When the peak happens (coarse; kept for old readers, see peak_moment)."""
        return "optimizer_step" if self.peak_moment == "optimizer_step" else "forward_backward"

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        return in_json_order(handler(self), _KEYS)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_allocated(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary

    @property
    def moments(self) -> dict[str, int] | None:
        """The estimated moments' peak_allocated by name (``PeakMoment``), in step order, or None where
        not estimated."""
        values = {name: getattr(self, f"at_{name}") for name in get_args(PeakMoment)}
        if any(values[name] is None for name in CORE_MOMENTS):
            return None
        return {name: value for name, value in values.items() if value is not None}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.peak_allocated + self.runtime_overhead

    @computed_field  # type: ignore[prop-decorator]
    @property
    def allocator_gap(self) -> int:
        """The caching allocator's gap counted in what must fit (total), the calibrated part of runtime_overhead
        (``profiles/allocator_overhead.json``); the rest is outside_allocator, an assumption (--context-gib).
        reserved - peak_allocated is this plus allocator_cache, gradient_stream_pool and recompute_cache."""
        return self.runtime_overhead - self.outside_allocator

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reserved(self) -> int:
        """What ``torch.cuda.max_memory_reserved()`` should report: total less the CUDA context and NCCL, plus the
        cached part of the calibrated gap (``allocator_cache``), FSDP's gradient blocks cached for its reduce-scatter
        stream (``gradient_stream_pool``) and the blocks cached around recomputation (``recompute_cache``), which the
        allocator keeps while memory allows and frees before an allocation would fail (c10/cuda/
        CUDACachingAllocator.cpp ``malloc``: ``release_cached_blocks`` and a retry before out-of-memory)."""
        return (self.total - self.outside_allocator + self.allocator_cache + self.gradient_stream_pool
                + self.recompute_cache)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def states_total(self) -> int:
        """Model states at rest per rank (params + grads + optimizer), wherever they live."""
        return self.states_params + self.states_grads + self.states_optimizer


def recipe_dtypes(training: TrainingConfig, impl: Implementation) -> Dtypes:
    """Residual/compute widths under the engine's recipe (see module docstring)."""
    if training.precision == "fp32":
        return Dtypes(residual=4, compute=4, input_casts=False, buffer=4)
    if training.precision == "bf16" or training.engine == "deepspeed":  # the whole module 16-bit: no autocast
        return Dtypes(residual=2, compute=2, input_casts=False, adapter=FP32 if training.fp32_adapters else None)
    if impl.shard_params:  # FSDP2's MixedPrecisionPolicy casts parameters, not buffers
        return Dtypes(residual=2, compute=2, input_casts=False, buffer=4)
    if training.low_precision_base:  # autocast over a bf16 base: a bf16 residual; fp32 adapters cast their input
        return Dtypes(residual=2, compute=2, input_casts=True, buffer=4)
    if training.quantize is not None and not training.kbit_upcast and training.precision == "bf16-mixed":
        # a QLoRA base left in bf16, norms too: a bf16 residual, and PEFT's bitsandbytes LoRA layers cast no input
        # under autocast (peft/tuners/lora/bnb.py: the cast only where autocast is off). fp16-mixed stores the
        # unquantised base in fp32 (advisor.estimate.quantized.frozen_dense_bytes), so its norms are fp32 there.
        return Dtypes(residual=2, compute=2, input_casts=False, buffer=4)
    # 4-bit linears (bitsandbytes' Linear4bit returns its input's dtype) read the fp32 norms' outputs of a QLoRA base
    # upcast by prepare_model_for_kbit_training (or stored in fp32 under fp16): the gated MLP's tensors are fp32 too
    mlp = 4 if training.quantize in ("nf4", "fp4") and training.lora is not None else None
    return Dtypes(residual=4, compute=2, input_casts=True, buffer=4, mlp=mlp)  # autocast over fp32 weights


def memory_loss_kernel(training: TrainingConfig) -> str:
    """The loss path the single-mesh estimate counts: 'compiled' where --compile meets a stack that compiles its
    loss too (``Recipe.compile_loss``: torchtitan) over the plain cross-entropy; under --loss chunked a stack's own
    chunked loss (``Recipe.chunked_logits``: torchtune's, its chunks compiled likewise,
    ``activations_loss.chunked_loss_bytes``; TRL's chunked_nll, ``chunked_nll_bytes``); else the --loss kernel."""
    compiled = training.compile and training.recipe.compile_loss
    if training.chunked_nll:  # TRL's, under the Trainer's
        # autocast where accelerate runs one (native_amp: a mixed precision on the torch engine)
        return "chunked_nll_autocast" if training.mixed and training.engine == "torch" else "chunked_nll"
    if training.loss == "chunked" and training.recipe.chunked_logits is not None:
        held = "_held" if training.recipe.chunked_logits == "model" else ""
        return ("chunked_compiled" if compiled else "chunked") + held
    if training.loss == "fused" and training.recipe.fused_loss_in_place:
        return "fused_in_place"  # Liger's kernel (Recipe.fused_loss_in_place)
    return "compiled" if compiled and training.loss == "hf" else training.loss


def _activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, *, micro_batch_size: int,
                 checkpointing: bool) -> ActivationEstimate:
    dtypes = recipe_dtypes(training, impl)
    if training.activation_offload:
        check_offload_family(spec, training)
    # A traced profile of this recipe and shape (families without a formula) replaces the formula.
    profile = find_profile(spec, profile_key(dtypes, training, checkpointing=checkpointing)) if spec.traced else None
    if profile is not None and spec.num_layers:
        return activations_from_profile(profile, num_layers=spec.num_layers, micro_batch_size=micro_batch_size,
                                        vocab_size=spec.vocab_size or 0, hidden_size=spec.hidden_size or 0)
    images = image_tokens(spec, training)
    kept = selective_kept(spec, training.lora) or SelectiveKept(0, 0, 0, ())
    est = estimate_activations(
        shape_of(spec),
        dtypes,
        micro_batch_size=micro_batch_size,
        seq_len=training.seq_len + images,
        target_len=training.target_len,
        checkpointing=checkpointing,
        eager=training.attention == "eager",
        adapters=_adapters(spec, training),
        head_frozen=head_frozen(spec, training.lora),  # a frozen base's head, whatever the family, unless PEFT trains a copy
        loss_kernel=memory_loss_kernel(training),
        head_bytes=training.compute_bytes if training.copies_in_compute_dtype or training.trl_bf16_trainables else None,
        selective=checkpointing and training.activation_checkpointing == "selective",
        kept_width=kept.width,
        kept_tail_width=kept.tail_width,
        kept_elements=kept.elements,
    )
    if training.compile:  # each block saves what torch.compile's partitioner keeps, where measured
        from advisor.estimate.compile_memory import compiled_activations

        est = compiled_activations(est, shape_of(spec), dtypes, tokens=micro_batch_size * (training.seq_len + images),
                                   checkpointing=checkpointing, eager_attention=training.attention == "eager",
                                   lora=training.lora is not None, adapters=_adapters(spec, training),
                                   quantized=training.quantize is not None,
                                   selective=checkpointing and training.activation_checkpointing == "selective")
    if training.activation_offload:  # each block's input (checkpointed) or saved tensors in CPU memory
        from advisor.estimate.activation_offload import offloaded_activations

        est = offloaded_activations(est, shape_of(spec), dtypes, tokens=micro_batch_size * (training.seq_len + images),
                                    checkpointing=checkpointing, frozen=training.lora is not None)
    tower = vision_tower_bytes(spec, training, dtypes, micro_batch_size=micro_batch_size)
    if not tower:
        return est
    return validated_copy(est, {"saved_bytes": est.saved_bytes + tower})


# Block kinds whose blocks each take the text's residual stream: one block input per token, what
# advisor.estimate.activation_offload moves (checked on the simulated step: Llama, Qwen2, Mixtral exact, GPT-2 above).
OFFLOAD_KINDS = ("decoder", "moe", "gpt2", "gpt_neox")


def check_offload_family(spec: ModelSpec, training: TrainingConfig) -> None:
    """ValueError where --activation-offload is not modelled: an encoder-decoder's two streams, a vision tower's
    patches, Mamba's and Jamba's blocks, a model planned from a traced profile (which holds no block input apart)."""
    kind = activation_kind(spec).name
    if spec.traced:
        kind = "traced (no activation formula)"
    if kind not in OFFLOAD_KINDS or training.images_per_sample:
        raise ValueError(f"--activation-offload is planned for text decoders whose blocks take the residual stream "
                         f"({', '.join(OFFLOAD_KINDS)} blocks); {spec.model_type or spec.name[:40]} has {kind} blocks"
                         f"{' and images' if training.images_per_sample else ''}: drop --activation-offload")


def vision_tower_bytes(spec: ModelSpec, training: TrainingConfig, dtypes: Dtypes, *, micro_batch_size: int) -> int:
    """What the vision tower (and Llava's projector) of one micro-batch leaves saved for backward, with
    autocast's saved weight copies: 0 without a tower, without images, or with the tower frozen. The tower's
    formula is its block kind's (``advisor.estimate.activation_kinds``: Qwen2-VL's patches, Llava's CLIP)."""
    images, kind = image_tokens(spec, training), activation_kind(spec)
    frozen_tower = training.lora is not None and not tower_adapter_params(spec, training.lora)
    if kind.tower is None or not images or frozen_tower:  # a frozen tower saves nothing
        return 0
    return kind.tower(spec, dtypes, micro_batch_size=micro_batch_size, images=images)


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
    if training.lora.dora and kind_of(spec).family == "encdec":
        raise ValueError(ENCDEC_DORA_REFUSED)
    inputs = adapter_inputs(spec, training.lora)
    if inputs is None:
        return None
    return Adapters(rank=training.lora.rank, dropout=training.lora.dropout > 0, inputs=tuple(inputs),
                    dora_outputs=dora_outputs(spec, training.lora))


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
    buffers = estimate_strategy_buffers(spec, training, impl, world, checkpointing=checkpointing)
    buffers = block_backward_buffers(spec, training, impl, world, buffers, checkpointing=checkpointing)
    dequantized = 0  # --quantize: packed base weights, their buffers, one dequantised linear in backward
    if training.quantize is not None:
        from advisor.estimate.quantized import apply_quantization

        states, buffers, dequantized = apply_quantization(spec, training, impl, world, states,
                                                          checkpointing=checkpointing,
                                                          micro_batch_size=micro_batch_size)
    # ZeRO flattens the trainable parameters only; a frozen base stays in per-parameter tensors.
    flat_params = training.compute_bytes * spec.trainable_params // (world if impl.shard_params else 1)
    held = held_accumulated_grads(spec, training, impl, states, world=world, dp_world=world,
                                  micro_batch_size=micro_batch_size)
    steps = accumulation_steps(training, dp_world=world, micro_batch_size=micro_batch_size)
    return memory_at_moments(states, acts, buffers, training, impl, world=world, dequantized=dequantized,
                             flat_param_bytes=flat_params, gpu=hardware.gpu.name, held_grads=held,
                             held_at_backward_end=held_at_backward_end(
                                 spec, training, impl, held=held, split=buffers.at_embedding_backward is not None)
                             if steps > 1 else None,  # kept zeros (torch < 2.0) without accumulation: the
                             micro_batches=steps,       # held shards stand
                             checkpointing=checkpointing,
                             **whole_rank_extras(spec, training, impl, acts, micro_batch_size=micro_batch_size,
                                                 checkpointing=checkpointing),
                             kv_cache=_kv_cache(spec, training, impl, micro_batch_size=micro_batch_size,
                                                checkpointing=checkpointing),
                             capacity_bytes=hardware.gpu_memory_bytes, device_bytes=hardware.gpu_memory_bytes)


def whole_rank_extras(spec: ModelSpec, training: TrainingConfig, impl: Implementation, acts: ActivationEstimate, *,
                      micro_batch_size: int, checkpointing: bool) -> dict[str, int | None]:
    """``memory_at_moments``' inputs read off the whole model's tokens on a rank (data parallelism, or a mesh
    with tp = cp = 1): what the loss keeps, what the last block's forward holds, a traced head gradient."""
    tokens = micro_batch_size * (training.target_len or training.seq_len + image_tokens(spec, training))
    dtypes = recipe_dtypes(training, impl)
    kept = loss_kept_bytes(memory_loss_kernel(training), tokens=tokens, vocab=spec.vocab_size or 0, hidden=spec.hidden_size or 0,
                           dt=dtypes, head_frozen=head_frozen(spec, training.lora))
    head_grad = saved_head_gradient(spec, profile_key(dtypes, training, checkpointing=checkpointing))
    last_acts = last_block_activations(spec, acts, tokens=tokens, residual_bytes=dtypes.residual, head_grad=head_grad)
    adapters = _adapters(spec, training) if training.lora is not None and training.lora.dora else None
    def dora(checkpointed: bool) -> int:
        return 0 if adapters is None else dora_weight_bytes(dtypes, adapters, tokens=tokens, checkpointing=checkpointed,
                                                            quantized=training.quantize is not None)

    # a checkpointed forward saves nothing; its recomputation saves as a plain forward does
    return dict(loss_kept=kept, last_block_acts=last_acts, saved_head_grad=head_grad, dora_weight=dora(checkpointing),
                dora_recompute=dora(False) if checkpointing else 0)


def last_block_activations(spec: ModelSpec, acts: ActivationEstimate, *, tokens: int, residual_bytes: int,
                           head_grad: int) -> int | None:
    """What is saved when the last block's forward begins: every block's kept tensors but its own, what the
    blocks' backward needs from outside them (``saved_bytes`` less ``outside_freed_bytes``), and its input, the
    residual stream; less ``head_grad``, a traced profile's tied head gradient (``traced.saved_head_gradient``),
    which does not exist in forward. None where one block's share is not known."""
    if not (acts.block_kept_bytes or acts.offloaded_bytes) or not spec.hidden_size or (spec.num_layers or 0) < 2:
        return None
    block_input = tokens * spec.hidden_size * residual_bytes
    return max(0, acts.saved_bytes - acts.outside_freed_bytes - acts.block_kept_bytes + block_input - head_grad)


def _kv_cache(spec: ModelSpec, training: TrainingConfig, impl: Implementation, *, micro_batch_size: int,
              checkpointing: bool) -> KvCacheBytes | None:
    """The KV cache's bytes when the stack keeps it (``--use-cache``, advisor.estimate.kv_cache); ValueError
    where it is not modelled or cannot run."""
    if not training.keeps_kv_cache:
        return None
    shape, eager = shape_of(spec), training.attention == "eager"
    why = kv_cache_not_modelled(shape, eager=eager, lora=training.lora is not None, checkpointing=checkpointing,
                                selective=checkpointing and training.activation_checkpointing == "selective")
    if why is not None:
        raise ValueError(why)
    return estimate_kv_cache(shape, recipe_dtypes(training, impl), micro_batch_size=micro_batch_size,
                             seq_len=training.seq_len + image_tokens(spec, training), checkpointing=checkpointing,
                             eager=eager, values_own_dtype=spec.kv_cache_values_own_dtype is not None)


def _lower_blocks(acts: ActivationEstimate, buffers: StrategyBuffers, held_grads: int,
                  kv: KvCacheBytes | None = None) -> int:
    """What a lower block's backward holds beyond the top block's, at the worst of them: each finished
    block frees what it saved and leaves its gradients (``StrategyBuffers.per_block_done``), so the
    blocks' backward peaks at the top block, the one below it or the bottom one (a line in between)."""
    n = buffers.num_blocks
    top, bottom_kv = (kv.block_backward_top, kv.block_backward_bottom) if kv is not None else (0, 0)
    if n < 2 or not (acts.block_kept_bytes or acts.offloaded_bytes) or held_grads:  # num_blocks stays 1 where lower blocks are not read
        return bottom_kv  # the kept cache grows to the bottom block: counted there (an upper bound)
    step = buffers.per_block_done - acts.block_kept_bytes
    bottom = buffers.below_top + (n - 1) * step - buffers.bottom_less + bottom_kv
    if n == 2:  # the block below the top is the bottom one (ZeRO-3: no block below it to prefetch; with fsdp_outer_units the embedding)
        return max(top, bottom)
    return max(top, buffers.below_top + step + top, buffers.below_top + max(1, n - 2) * step + top, bottom)


def _block_backward(base: dict[str, int], acts: ActivationEstimate, buffers: StrategyBuffers, *, dequantized: int,
                    held_grads: int, kv: KvCacheBytes | None = None, dora_weight: int = 0) -> dict[str, int]:
    """The largest point of the blocks' backward: in a block's MLP (its recomputed activations and backward
    temporaries beside ``in_backward``; an MoE block's routing-weight product before it, ``in_backward_early``), late in a block (FSDP2: all its weight gradients, ``in_backward_late``),
    each in the top block or a lower one (``_lower_blocks``), or the top block's reduce-scatter (FSDP2)."""
    kept = acts.saved_bytes - acts.outside_freed_bytes
    lower = _lower_blocks(acts, buffers, held_grads, kv)
    held = buffers.persistent + dequantized
    points = [dict(base, activations=kept + acts.recompute_bytes - acts.mlp_freed_bytes,
                   temporary=held + buffers.in_backward + acts.backward_temp_bytes + lower)]
    if buffers.in_backward_early is not None and acts.early_temp_bytes:  # an MoE block's routing-weight product
        points.append(dict(base, activations=kept + acts.recompute_bytes,
                           temporary=held + buffers.in_backward_early + acts.early_temp_bytes + lower))
    if dora_weight and acts.recompute_bytes:  # a recomputed DoRA layer building its weight (dora_weight_bytes)
        points.append(dict(base, activations=kept + acts.recompute_bytes,
                           temporary=held + buffers.in_backward + dora_weight + lower))
    if acts.recompute_end_bytes:  # a checkpointed block's recomputation stopping, its forward's locals still held
        points.append(dict(base, activations=kept + acts.recompute_bytes,
                           temporary=held + buffers.in_backward + acts.recompute_end_bytes + lower))
    if buffers.in_backward_late is not None:  # the block's own saved tensors are gone by then (not checkpointed)
        late = kept + acts.late_temp_bytes - (acts.block_kept_bytes if not acts.recompute_bytes else 0)
        points.append(dict(base, activations=late, temporary=held + buffers.in_backward_late + lower))
    if buffers.top_reduce_scatter is not None:  # after the block's backward (read for MoE blocks: its saved are gone)
        top_kv = kv.block_backward_top if kv is not None else 0
        done = kept - (acts.block_kept_bytes if buffers.saved_gone_at_reduce_scatter and not acts.recompute_bytes else 0)
        points.append(dict(base, activations=done + top_kv, temporary=held + buffers.top_reduce_scatter))
    return max(points, key=lambda live: sum(live.values()))  # ties: the MLP's point (the first)


def memory_at_moments(states: ModelStates, acts: ActivationEstimate, buffers: StrategyBuffers,
                      training: TrainingConfig, impl: Implementation, *, world: int,
                      dequantized: int = 0, held_grads: int = 0, flat_param_bytes: int | None = None,
                      loss_kept: int = 0, processes: int | None = None, gpu: str = "",
                      kv_cache: KvCacheBytes | None = None, last_block_acts: int | None = None,
                      saved_head_grad: int = 0, capacity_bytes: int | None = None,
                      device_bytes: int | None = None, held_at_backward_end: int | None = None,
                      micro_batches: int = 1, dora_weight: int = 0, dora_recompute: int = 0,
                      checkpointing: bool) -> MemoryBreakdown:
    """The moments of the step from one rank's states, activations and strategy buffers; the
    largest is the peak. Shared by the data-parallel estimate above and the mesh estimate
    (``advisor.estimate.model_parallel``), which passes its own per-rank shares. ``dequantized``: one
    dequantised linear of a quantised base, live in a block's backward (``advisor.estimate.quantized``).
    ``held_grads``: gradients already allocated during forward and backward (a pipeline rank's own,
    from its first backward on: ``advisor.estimate.pipeline``; accumulated over micro-batches:
    ``advisor.estimate.accumulation``). ``flat_param_bytes``: the parameters a
    ZeRO holds flat (its trainable ones; None: all of them), which get no allocator gap. ``loss_kept``:
    what the loss keeps for its backward (``activations_loss.loss_kept_bytes``), live when the loss backward begins.
    ``kv_cache``: what a kept KV cache adds at each moment (``advisor.estimate.kv_cache``). ``last_block_acts``:
    the activations live at the last block's forward (``last_block_activations``; None: not estimated).
    ``saved_head_grad``: the part of ``acts.saved_bytes`` that is a tied head's gradient, made by the loss
    backward (``traced.saved_head_gradient``): not there yet when that backward begins. ``capacity_bytes``: the
    GPU's memory, where bitsandbytes' paged optimizer state is placed (``in_backward.place_paged_state``); None
    counts it on the device. ``held_at_backward_end``: what the held gradients are at the end of backward where
    that differs (``accumulation.held_at_backward_end``); ``micro_batches``: how many a step runs (an earlier one's
    end of backward, under no_sync, can be the larger). ``dora_weight``: what a DoRA layer's forward holds to build
    and norm its adapter's weight (``activations_blocks.dora_weight_bytes``), in the last block's forward beside what
    the blocks saved; ``dora_recompute`` the same in a checkpointed block's recomputation. ``device_bytes``: the GPU's memory, where the reserved memory stops
    (``reduce_scatter_pool_bytes``: the allocator frees cached blocks before it fails); None: no cap."""
    loss, logits = acts.loss_transient_bytes, acts.logits_bytes
    gathered = 0
    if impl.single_process:  # DataParallel: GPU0 gathers every replica's logits and computes the loss
        logits, loss = logits * world, loss * world
        # The gathered output (all replicas' logits) lives on GPU0 until the loop drops it.
        gathered = acts.returned_logits_bytes * world
    gpu_params = 0 if states.on_cpu else states.params
    cpu_side = states.on_cpu or states.cpu_only_optimizer
    # Paged state (advisor.estimate.in_backward) is placed after the moments, where the GPU's capacity is known;
    # without it (mesh and pipeline estimates) it is counted as device memory, an upper bound.
    paged = states.paged if capacity_bytes is not None and not cpu_side else 0
    gpu_opt = 0 if cpu_side else states.optimizer - paged
    gpu_grads = 0 if cpu_side else states.grads
    # DeepSpeed keeps a flat gradient buffer at rest; the torch engines allocate gradients in backward.
    rest_grads = gpu_grads if training.engine == "deepspeed" and not impl.shard_grads else 0
    base = dict(params=gpu_params, grads=rest_grads + held_grads, optimizer=gpu_opt)
    # A loop that frees the previous step's gradients only before the backward (Lightning's closure) holds them
    # through the forward and the loss.
    stale = gpu_grads if training.recipe.zero_grad == "before_backward" and training.engine == "torch" else 0
    stale = 0 if training.optimizer_in_backward else stale  # every gradient freed by its step in backward
    stale = 0 if held_grads else stale  # accumulating: the held gradients are those (base counts them)
    kv_forward, kv_loss = (kv_cache.end_of_forward, kv_cache.loss_backward) if kv_cache is not None else (0, 0)
    moments = {
        # End of forward: logits, their fp32 copy and the log-softmax output.
        "end_of_forward": dict(base, grads=base["grads"] + stale, activations=acts.saved_bytes + logits + kv_forward,
                               temporary=buffers.persistent + (buffers.at_loss if buffers.at_forward_end is None
                                                               else buffers.at_forward_end)),
        # Loss backward: the log-softmax output and two fp32 N x V gradients.
        "loss_backward": dict(base, activations=acts.saved_bytes + gathered + kv_loss,
                              temporary=buffers.persistent + buffers.at_loss + loss),
        # A block's backward: its recomputed activations (checkpointing) and its backward temporaries; the
        # labels and the final norm's saved tensors are gone (their backward ran first).
        "block_backward": _block_backward(base, acts, buffers, dequantized=dequantized, held_grads=held_grads,
                                          kv=kv_cache, dora_weight=dora_recompute),
        "optimizer_step": dict(params=gpu_params, grads=gpu_grads, optimizer=gpu_opt, activations=0,
                               temporary=buffers.persistent + (0 if cpu_side else states.step_temporary)),
    }
    if dora_weight:  # DoRA's weight built in the last block's forward, before the head and the loss run
        during = (moments["end_of_forward"]["temporary"] if buffers.at_last_block_forward is None
                  else buffers.persistent + buffers.at_last_block_forward)  # FSDP2: the last block gathered
        inside = dict(moments["end_of_forward"], activations=acts.saved_bytes - acts.outside_freed_bytes
                      - saved_head_grad + kv_forward, temporary=during + dora_weight)
        if sum(inside.values()) > sum(moments["end_of_forward"].values()):
            moments["end_of_forward"] = inside
    if buffers.at_backward_start is not None:  # FSDP2 ZeRO-3: the root gathered again as the loss backward begins
        saved = acts.saved_bytes - saved_head_grad  # what forward saved; the loss's own kept, up to its forward's
        start = dict(base, activations=saved + gathered + min(loss_kept, acts.logits_bytes + saved_head_grad) + kv_loss,
                     temporary=buffers.persistent + buffers.at_backward_start)
        if sum(start.values()) > sum(moments["loss_backward"].values()):
            moments["loss_backward"] = start
    if buffers.at_head_backward is not None:  # FSDP2, the head a unit of its own: its post-backward's reduce-scatter
        head = dict(base, activations=acts.saved_bytes - acts.outside_freed_bytes,
                    temporary=buffers.persistent + buffers.at_head_backward)
        if sum(head.values()) > sum(moments["loss_backward"].values()):
            moments["loss_backward"] = head
    if buffers.at_forward_start is not None:  # FSDP2: the first (or last) block's forward (module docstring)
        moments["start_of_forward"] = dict(base, grads=base["grads"] + stale, activations=0,
                                           temporary=buffers.persistent + buffers.at_forward_start)
        if buffers.at_last_block_forward is not None and last_block_acts is not None:
            # or the last block's all-gather copy-out, beside what the blocks before it saved (strategy_buffers)
            last = dict(base, grads=base["grads"] + stale, activations=last_block_acts,
                        temporary=buffers.persistent + buffers.at_last_block_forward)
            if sum(last.values()) > sum(moments["start_of_forward"].values()):
                moments["start_of_forward"] = last
    if buffers.at_backward_end is not None:  # the embedding's (FSDP2: the root's) backward, other gradients kept
        shards = 0 if cpu_side else buffers.grads_at_backward_end  # offloaded shards go to the CPU
        late = max(shards, held_grads) if held_at_backward_end is None else shards + held_at_backward_end
        end = buffers.at_backward_end
        # The Trainer's no_sync accumulator, split out where the buffers give the embedding's backward apart
        beside = (held_at_backward_end is not None and buffers.at_embedding_backward is not None
                  and accumulator_beside_embedding(training))
        if beside:  # the accumulator beside the embedding's backward only
            end = max(end - held_at_backward_end, buffers.at_embedding_backward)
        moments["end_of_backward"] = dict(base, grads=rest_grads + late, activations=0,
                                          temporary=buffers.persistent + end)
        if beside:  # an earlier micro-batch's end of backward: every gradient held
            first, later = buffers.at_unsynced_embedding_backward
            earlier = dict(base, activations=0, temporary=buffers.persistent + (later if micro_batches > 2 else first))
            if sum(earlier.values()) > sum(moments["end_of_backward"].values()):
                moments["end_of_backward"] = earlier
    moments = {name: moments[name] for name in get_args(PeakMoment) if name in moments}  # step order
    # Ties go to the core moments (so a plan whose peak is unchanged keeps its peak_moment).
    moment, parts = max(moments.items(), key=lambda item: (sum(item[1].values()), item[0] in CORE_MOMENTS))
    peak = sum(parts.values())
    cpu = 0
    if states.on_cpu:
        cpu = states.params + states.grads + states.optimizer + states.step_temporary
    elif states.cpu_only_optimizer:
        cpu = states.grads + states.optimizer + states.step_temporary
    cpu += acts.offloaded_bytes  # --activation-offload: pinned host copies (advisor.estimate.activation_offload)
    gapped = peak - _flat_bytes(parts, moment, training, impl, flat_param_bytes)
    context = training.context_bytes_at(world if processes is None else processes, gpu)  # one process: no NCCL
    # What must fit holds the part of the allocator's gap it cannot free (fit_fraction); the rest it caches while
    # memory allows (allocator_cache, in reserved only)
    must_fit = int(training.fit_fraction() * gapped)
    cache = int(training.fragmentation * gapped) - must_fit
    overhead = training.reserve_bytes + must_fit + context
    pool = reduce_scatter_pool_bytes(moments, peak, training, impl, gpu_grads=gpu_grads, held_grads=held_grads,
                                     fragmentation=training.gap_fraction(checkpointing))
    recompute = int(training.recompute_fraction(checkpointing) * gapped)
    if device_bytes is not None:  # cached blocks go before an allocation fails: reserved stops at the GPU's memory
        cache, pool, recompute = cached_within(device_bytes - peak - overhead, cache=cache, pool=pool,
                                               recompute=recompute)
    memory = MemoryBreakdown(
        **parts,
        runtime_overhead=overhead,
        outside_allocator=context,
        allocator_cache=cache,
        gradient_stream_pool=pool,
        recompute_cache=recompute,
        cpu_bytes=cpu,
        activations_on_cpu=acts.offloaded_bytes,
        peak_moment=moment,
        states_params=states.params,
        states_grads=states.grads,
        states_optimizer=states.optimizer,
        states_on_cpu="all" if states.on_cpu else ("optimizer" if states.cpu_only_optimizer else "none"),
        **{f"at_{name}": sum(live.values()) for name, live in moments.items()},
    )
    if not paged:
        return memory
    from advisor.estimate.in_backward import place_paged_state  # bitsandbytes' paged optimizer state

    return place_paged_state(memory, paged, capacity_bytes=capacity_bytes)


def cached_within(room: int, *, cache: int, pool: int, recompute: int) -> tuple[int, int, int]:
    """The allocator's cached part of its gap, FSDP's gradient pool and the recompute cache (in that order) cut to
    ``room`` bytes of the GPU: the caching allocator frees cached blocks before an allocation fails, so reserved stops
    at the GPU's memory."""
    cache = max(0, min(cache, room))
    pool = max(0, min(pool, room - cache))
    return cache, pool, max(0, min(recompute, room - cache - pool))


def reduce_scatter_pool_bytes(moments: dict[str, dict[str, int]], peak: int, training: TrainingConfig,
                              impl: Implementation, *, gpu_grads: int, held_grads: int = 0,
                              fragmentation: float) -> int:
    """What FSDP's gradient shards add to the reserved memory beyond the calibrated gap on the peak.

    FSDP2 allocates each unit's reduce-scatter output, which its sharded gradients view, inside the
    reduce-scatter stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``: "the GPU
    sharded gradient is allocated in the RS stream"); FSDP1 its ``new_sharded_grad`` in the post-backward stream
    (torch/distributed/fsdp/_runtime_utils.py ``_reduce_grad``). The caching allocator hands a freed block only
    to the stream it was allocated for (c10/cuda/CUDACachingAllocator.cpp ``get_free_block`` matches the stream,
    expandable segments too), so the shards' blocks stay that stream's between steps, and the default stream's
    own blocks (activations, parameters, optimizer state) are reserved beside them: reserved = gap(the default
    stream's largest moment) + the shards, where the default stream's part of a moment is the moment less the
    shards it holds (none before backward; all at the end of backward and the step). Returned: how much that
    exceeds the gap on the peak alone (0 where it does not). No gap on the shards (the same sizes return every
    step). At a block's backward the shards of the blocks already done are read as the default stream's (they
    sit in the block buffers): an upper bound. Seen in our H100 runs (benchmarks/results/gpu_truth.csv, not
    fitted): FSDP rows' reserved ran 0.3-1.7 GiB above the calibrated gap where their shards were 0.2-1.2 GiB.
    Nothing where the shards are offloaded (each leaves for the CPU as it is made) or on the deepspeed engine (its
    flat buffers); unsharded gradients accumulated under no_sync (``advisor.estimate.accumulation``) are the
    default stream's."""
    if training.engine != "torch" or not impl.shard_grads or not gpu_grads:
        return 0
    unsharded = held_grads if accumulates_unsharded(training, impl) else 0
    default = max(sum(live.values()) - max(0, live["grads"] - unsharded) for live in moments.values())
    return max(0, gpu_grads - int((1 + fragmentation) * (peak - default)))


def _flat_bytes(parts: dict[str, int], moment: str, training: TrainingConfig, impl: Implementation,
                flat_param_bytes: int | None) -> int:
    """Bytes of the peak the caching allocator holds without a gap: on DeepSpeed's ZeRO (stage 1 or more), the model states of the trainable parameters (ZeRO keeps their weights, gradient partition,
    master weights and moments as a few flat tensors; a frozen base stays in per-parameter tensors) and,
    at the step, its flat copies of the gradient partition. A plain-torch replay of
    the ZeRO-2 step's allocations (Llama-2-7B, one rank of two, H100; benchmarks/zero2_step_replay.py)
    peaked at 75.31 GiB allocated and 75.63 GiB reserved: a gap of 0.4%, not the calibrated 10.4%, which
    was fitted on torch runs of many tensors. Elsewhere: 0 (the calibrated gap applies to the whole peak)."""
    if training.engine != "deepspeed":
        return 0
    from advisor.estimate.zero_buffers import zero_facts  # loaded only for the deepspeed engine

    if zero_facts(training, impl) is None:
        return 0
    params = parts["params"] if flat_param_bytes is None else min(parts["params"], flat_param_bytes)
    return params + parts["grads"] + parts["optimizer"] + (parts["temporary"] if moment == "optimizer_step" else 0)

