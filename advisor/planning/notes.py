"""The plan's notes and assumptions: every default the planner chose, the recipe's facts, the allocator
overhead, LoRA's counting and what ``--seq-len max`` found, each as one sentence whose numbers come from
the candidates (``advisor.planning.api.plan`` collects them); what another loss kernel would save is a
reason (``advisor.planning.reasons.LossPeak``), rendered with the others.
"""

from __future__ import annotations

from advisor.calibration import allocator_overhead
from advisor.estimate.activations import shape_of
from advisor.estimate.memory import image_tokens
from advisor.estimate.traced import needs_trace
from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.model.block_kinds import kind_of
from advisor.model.lora import LoraConfig, adapter_inputs, default_targets
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import Candidate, Recommendation, evaluate_candidate
from advisor.planning.policy import SAME_SPEED, choose
from advisor.precision import precision_info
from advisor.training import TrainingConfig
from advisor.units import GIB

DEFAULT_NOTES = {
    "optimizer": "optimizer {v} (default; --optimizer to change)",
    "precision": "precision {v} (default): fp32 master weights, bf16 compute",
    "seq_len": "sequence length {v} tokens (default; --seq-len)",
    "engine": "engine {v} (default): DDP / ZeroRedundancyOptimizer / FSDP2",
    "attention": "attention {v}: no s^2 term (eager attention would add one; fp32 with grouped-query attention runs CUDA's math kernel and is counted like eager)",
}


ACTIVATION_OFFLOAD_NOTE = (
    "--activation-offload: torchtune's OffloadActivations (TRL's activation_offloading copies it) over the model's "
    "body, under activation checkpointing: every block's input waits in pinned CPU memory (activations_on_cpu), "
    "out over PCIe during forward and back during backward beside the compute; the "
    "head and the loss keep theirs on the GPU (TRL's hooks also take an HF loss's, not counted: an upper bound)")


def longest_note(spec: ModelSpec, longest: dict[str, int | None], best: int, micro_batch_size: int) -> str:
    """What --seq-len max found, and whether it is past the model's own context."""
    context = spec.max_position_embeddings
    beyond = ""
    if context and best > context:
        beyond = (f"; the plan is shown at the model's context, {context:,} tokens (max_position_embeddings): its "
                  "positions are a learned table, so no longer input runs" if spec.learned_positions else
                  f"; beyond the model's context of {context:,} tokens (max_position_embeddings): it needs RoPE "
                  "scaling or a longer-context checkpoint")
    return (f"--seq-len max: the longest sequence each strategy fits at micro-batch {micro_batch_size}, by search on "
            "the estimate; "
            f"the candidates are shown at the longest on the GPUs alone (where one holds a token), {best:,} tokens{beyond}")


def loss_notes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, candidates: list[Candidate],
                recommendation: Recommendation | None) -> list[r.LossPeak | r.LossWouldFit]:
    """When the hf loss's logits decide the fit: what each other loss kernel would save, in GiB (none
    when wrappers.losses cannot run the kernels on this model: ``spec.loss_kernel_refusal``)."""
    if training.loss != "hf" or not shape_of(spec).vocab_size or not candidates or spec.loss_kernel_refusal:
        return []  # no candidates: data parallelism alone was blocked (the global batch), nothing to compare
    if recommendation is None:
        if any(c.fits for c in candidates):  # pinned mesh degrees left one that fits unchosen: the hf loss is not why
            return []
        for kernel in ("chunked", "fused"):
            other = validated_copy(training, {"loss": kernel})
            alternative = [evaluate_candidate(spec, hw, other, c.strategy) for c in candidates]
            only = alternative[0].strategy if len(alternative) == 1 else None  # --strategy: that one alone
            chosen, _ = choose(spec, alternative, only=only)
            if chosen is not None:
                best = next(c for c in alternative if c.strategy == chosen.strategy)
                return [r.LossWouldFit(kernel=kernel, strategy=best.strategy, micro_batch_size=best.micro_batch_size,
                                       total_bytes=best.memory_bytes.total)]
        return []
    chosen = next(c for c in candidates if c.strategy == recommendation.strategy and c.mesh == recommendation.mesh)
    fixed = validated_copy(training, {"micro_batch_size": chosen.micro_batch_size,
                                      "activation_checkpointing": chosen.checkpointing})
    total = chosen.memory_bytes.total
    saved = {}
    for kernel in ("chunked", "fused"):
        try:  # on a mesh: a kernel the mesh cannot run (fused under tp) has no saving to quote
            other = evaluate_candidate(spec, hw, validated_copy(fixed, {"loss": kernel}), chosen.strategy, chosen.mesh)
        except ValueError:
            continue
        if other.memory_bytes is not None:
            saved[kernel] = total - other.memory_bytes.total
    if not saved or max(saved.values()) < 0.1 * total:
        return []
    # Only savings: a kernel whose own buffers outweigh the logits it drops (fused under a quantised base)
    # is left out rather than quoted as a negative saving.
    savings = tuple(r.LossSaving(kernel=kernel, saved_bytes=bytes_) for kernel, bytes_ in saved.items()
                    if bytes_ >= 0.05 * GIB)
    return [r.LossPeak(strategy=chosen.strategy, total_bytes=total, micro_batch_size=chosen.micro_batch_size,
                       savings=savings, mesh_label=chosen.mesh.label if chosen.mesh is not None else None)]


def lora_note(base: ModelSpec, lora: LoraConfig, training: TrainingConfig, *, traced: bool) -> str:
    targets = ", ".join(lora.targets) if isinstance(lora.targets, tuple) else (
        lora.targets or f"{', '.join(default_targets(base))} (PEFT's default for {base.model_type})")
    activations = ("a frozen base saves only what input gradients need, plus each adapter's input, x·A and "
                   "dropout mask" if adapter_inputs(base, lora) is not None else
                   "activations traced with PEFT's adapters on the frozen model (see the traced-activations line)"
                   if traced and needs_trace(base, training) is not None else
                   f"activations are counted as for a full fine-tune (an overestimate: adapters on {base.model_type} "
                   "blocks are not modelled yet)")
    if training.quantize is not None:
        dtypes = ("; PEFT keeps the adapters in fp32, which recipe " + training.recipe.name + " never casts under pure "
                  f"{training.precision}: counted in {training.precision_info.param_dtype} over a quantised base "
                  "(not modelled yet)" if training.keeps_peft_fp32_adapters else "")
    elif training.fp32_adapters:
        counted = adapter_inputs(base, lora) is not None  # a traced family's profile holds bf16 adapters
        dtypes = (f"; the frozen base is held in {training.precision_info.compute_dtype} as loaded, the adapters in fp32 "
                  f"(PEFT's autocast_adapter_dtype; recipe {training.recipe.name} never casts the model), and with no "
                  "autocast each adapter computes in fp32 and saves an fp32 copy of its input" +
                  ("" if counted else f" (those copies are counted in {training.precision_info.compute_dtype} for "
                   f"{base.model_type}: an underestimate, not modelled yet)"))
    elif training.keeps_peft_fp32_adapters and training.lora.modules_to_save:
        dtypes = (f"; every weight is counted in {training.precision_info.compute_dtype}, though PEFT keeps the adapters "
                  "in fp32 beside modules_to_save copies, which recipe "
                  f"{training.recipe.name} never casts: the adapters' fp32 bytes are not modelled with modules_to_save "
                  "(an underestimate)")
    elif training.low_precision_base:
        dtypes = (f"; the frozen base is held in {training.precision_info.compute_dtype} (recipe {training.recipe.name}: "
                  f"loaded in the checkpoint's dtype, from_pretrained's dtype='auto'), the adapters in "
                  f"{training.precision_info.param_dtype} (PEFT's autocast_adapter_dtype)")
    elif training.frozen_base == "param" and training.base_dtype_counts:
        held = training.precision_info.param_dtype
        dtypes = (f"; every weight is held in {held}, the frozen base too (--frozen-base param: loaded in {held}, "
                  "as TRL loads a model whose dtype is not set)")
    elif training.engine == "deepspeed" and training.mixed:
        dtypes = (f"; every weight is held in {training.precision_info.compute_dtype} (DeepSpeed casts the whole "
                  "module), the adapters' fp32 master copies in its optimizer state")
    else:
        dtypes = "; every weight is held in the precision's parameter dtype"
    if training.base_dtype_ignored:
        dtypes += (f"; the frozen-base dtype ({training.frozen_base}) changes nothing here "
                   f"({training.base_dtype_ignored})")
    return (f"{'DoRA' if lora.dora else 'LoRA'} rank {lora.rank} on {targets}: only the adapters train (counted as "
            f"PEFT counts them); {activations}{dtypes}")


def context_basis(gpu: str, world: int) -> str:
    """Where the default context figure for ``gpu`` comes from (profiles/allocator_overhead.json)."""
    if gpu in allocator_overhead().measured_context:
        return (f"measured on one {gpu}" + ("; NCCL's buffers at world size 1, more peers add more" if world > 1
                                            else "") + ": --context-gib")
    return "an assumption, not measured on this GPU: --context-gib"


def overhead_notes(training: TrainingConfig, world: int, gpu: str = "") -> list[str]:
    """The allocator gap (calibrated unless overridden) and which end of the range decides the fit."""
    calibrated = {"reserve_gib", "fragmentation"}.isdisjoint(training.model_fields_set)
    # ZeRO's flat states and step copies get no gap (advisor.estimate.memory._flat_bytes).
    flat = " less ZeRO's flat states and step copies" if training.engine == "deepspeed" else ""
    gap = (f"runtime overhead per GPU: the allocator's gap, {training.fragmentation:.1%} of the peak{flat} + "
           f"{training.reserve_gib:g} GiB, "
           + ("calibrated on real H100 runs (measured allocated -> reserved; the cases fitted and the held-out "
              "error are in profiles/allocator_overhead.json)" if calibrated else "as given (--reserve-gib, --fragmentation)")
           + f", so peak + gap predicts torch.cuda.max_memory_reserved() (JSON 'reserved')"
           + (f"; where the blocks are recomputed (checkpointing) the allocator caches {training.recompute_fraction(True):.1%} "
              "of the peak more (JSON 'recompute_cache', in reserved), which it frees before an allocation fails, so "
              "it does not decide the fit" if training.recompute_fraction(True) else "")
           + f"; plus {training.context_gib_at(world, gpu):g} "
             "GiB for the CUDA context" + (" and NCCL buffers" if world > 1 else " (one GPU: no NCCL communicator)")
           + " outside the allocator ("
           + (context_basis(gpu, world) if training.context_gib is None else "as given")
           + "); total = reserved + that, compared with the GPU's memory")
    if training.fit_fraction() < training.fragmentation:  # --fit-fragmentation: part of the gap in reserved only
        gap += (f"; of the gap, {training.fit_fraction():.1%} of the peak must fit (--fit-fragmentation): the allocator "
                f"frees the other {training.fragmentation - training.fit_fraction():.1%}, its cached blocks (JSON "
                "'allocator_cache', in reserved), and retries before an allocation fails, so total is that much less "
                "than reserved + context (a plan near the GPU's limit then runs with those retries, slower by an "
                "amount not modelled; benchmarks/results/fit_gap.md)")
    margin = (f"--margin {training.margin}: the {training.margin} end of each estimate's range decides whether it "
              "fits; the range (low-high) is the lowest to highest measured reserved / estimate of its kind (its stack "
              "and full / LoRA / QLoRA where 8 or more were measured, else its tuning, else every comparison), from "
              "our H100 runs and the published real-GPU cases (profiles/memory_error.json, benchmarks/error_table.py; held-out "
              "coverage in benchmarks/results/published_memory.md)")
    if "margin" not in training.model_fields_set:
        margin += ("; default expected: the calibrated best estimate, with the --headroom policy preferring plans "
                   "that leave room; --margin high when an out-of-memory failure costs more than a smaller batch")
    return [gap, margin]


def recipe_note(training: TrainingConfig) -> str | None:
    """What the recipe (or --optimizer-impl) sets, when either was given (the default recipe says nothing,
    so plans read as before recipes existed)."""
    if "recipe" not in training.model_fields_set and training.optimizer_impl is None:
        return None
    recipe = training.recipe
    impl = training.optimizer_implementation
    how = ("--optimizer-impl" if training.optimizer_impl is not None else f"recipe {recipe.name}")
    given = training.frozen_base is not None and training.base_dtype_counts  # else the recipe's fact is the note
    held = training.frozen_base_dtype if given else recipe.frozen_base
    base = _frozen_base_phrase(recipe, held) + (" (--frozen-base)" if given else "")
    return (f"recipe {recipe.name} ({recipe.summary}): optimizer step {impl} ({how}; "
            f"{_IMPL_TEMPORARIES[impl]}); {base}; loss {recipe.loss}, engine {recipe.engine} by default "
            "(sources: profiles/recipes.json)")


def _frozen_base_phrase(recipe, held: str) -> str:
    """How ``recipe`` holds a LoRA model's frozen base (``held``: its frozen_base, or --frozen-base's) and adapters:
    DeepSpeed casts the whole module, a recipe with no mixed precision (torchtune) builds every weight in one dtype,
    the PEFT stacks load the base as the checkpoint's dtype and upcast the adapters."""
    if held != "compute":
        return "frozen base in the precision's parameter dtype"
    if recipe.engine == "deepspeed":
        return ("frozen base and adapters cast to the compute dtype with the whole module, the adapters' fp32 master "
                "copies in the optimizer")
    if recipe.precisions is not None and not any(precision_info(name).mixed for name in recipe.precisions):
        return "the whole model, adapters too, built in the precision's one dtype (no mixed precision)"
    return ("frozen base in the compute dtype (loaded as from_pretrained's dtype='auto' does), adapters in fp32 "
            "(PEFT's autocast_adapter_dtype)")


def kv_cache_note(use_cache: bool, release: str | None = None) -> str:
    """The KV-cache assumption (advisor.estimate.kv_cache); ``release``: the installed release whose cache keeps
    the values in their own dtype (``ModelSpec.kv_cache_values_own_dtype``), None for the older behaviour."""
    if use_cache:
        values = (f"; {release} (installed): the cache keeps the values in their own dtype (under autocast bf16, the "
                  "tensor SDPA saves) and only the keys as an fp32 copy (profiles/library_releases.json)" if release
                  else "")
        return ("KV cache kept in training (--use-cache: config.use_cache left on, blocks checkpointed by torch's "
                "checkpoint_wrapper, as accelerate's and Lightning's FSDP checkpointing do): each layer's keys and "
                "values live from the forward to the bottom block's backward and the recomputation appends them "
                "again, counted at each moment of the data-parallel plans (not yet in mesh or pipeline plans); "
                f"model.config.use_cache = False frees it{values}")
    return ("KV cache off in training: HF Trainer sets config.use_cache = TrainingArguments.use_cache (False), "
            "gradient_checkpointing_enable() and wrap() turn it off; without checkpointing an SDPA cache holds "
            "the tensors autograd saves and is dropped with the output")


_IMPL_TEMPORARIES = {
    "fused": "one kernel updates weights and moments in place, no step temporary",
    "foreach": "one temporary the size of the optimizer's second moment, sqrt(v), during the step",
    "for-loop": "one tensor at a time: two temporaries the size of the largest trainable tensor",
}


def stream_pool_note(memory, capacity_bytes: int) -> str | None:
    """A line when the recommended plan's reserved memory reaches the GPU's: FSDP's gradient blocks, cached for
    its reduce-scatter stream (``memory.reduce_scatter_pool_bytes``), do not fit beside the default stream's peak,
    so the caching allocator frees its cached blocks when an allocation fails and allocates them again next
    backward, every step. None otherwise."""
    # the stream's blocks beside the rest (recompute_cache, capped after them, is not what fails to stay cached)
    if (memory is None or not memory.gradient_stream_pool
            or memory.total + memory.gradient_stream_pool < capacity_bytes):
        return None
    return ("reserved memory reaches the GPU's: FSDP's gradient shards, cached for its reduce-scatter stream "
            f"({memory.gradient_stream_pool / GIB:.1f} GiB of them fit beside the rest), cannot stay cached, so the "
            "caching allocator frees its cached blocks when an allocation fails and allocates them again, every step "
            "(torch.cuda.memory_stats()['num_alloc_retries'] counts it; not timed)")


def accumulation_note(training: TrainingConfig) -> str:
    """What gradient accumulation holds (``advisor.estimate.accumulation``), for the plan's engine and stack."""
    held = ("from a step's second micro-batch on, the earlier micro-batches' gradients are held through the forward "
            "and backward (advisor.estimate.accumulation): all of them under DDP or one GPU")
    if training.engine == "deepspeed":
        return f"gradient accumulation: {held}; ZeRO-2's flat gradient partition (ZeRO-1 and ZeRO-3 hold theirs anyway)"
    how = ("--accumulation-sync" if training.accumulation_sync is not None else f"recipe {training.recipe.name}")
    shard = "fp32" if training.mixed or training.trainable_param_bytes == 4 else "parameter-dtype"
    if training.accumulation_mode == "last_micro_batch":
        return (f"gradient accumulation: {held}; FSDP's sync is off until the last micro-batch ({how}; accelerate's "
                "no_sync), so every unit keeps its unsharded gradient in the "
                + ("fp32 of PEFT's adapters" if training.fp32_adapters else "compute dtype") + ", the whole model's on each "
                "GPU, offload or not (--accumulation-sync every_micro_batch, the Trainer's accelerator_config "
                f"gradient_accumulation_kwargs sync_each_batch, holds the {shard} shards instead)")
    return f"gradient accumulation: {held}, the rank's {shard} shards under FSDP (reduced every micro-batch: {how})"


def assumptions_of(spec: ModelSpec, hw: Hardware, training: TrainingConfig) -> list[str]:
    notes = list(hw.assumptions)
    if spec.defaulted:  # a local or Hub config.json without a width: its config class's default was built
        values = ", ".join(f"{fact} {getattr(spec, fact)}" for fact in spec.defaulted if getattr(spec, fact) is not None)
        notes.append(f"the config gives no {', '.join(spec.defaulted)}: planned at transformers' defaults for "
                     f"{spec.model_type}{f' ({values})' if values else ''}; check they are the model's")
    recipe = recipe_note(training)
    if recipe is not None:
        notes.append(recipe)
    for field, text in DEFAULT_NOTES.items():
        if field not in training.model_fields_set:
            notes.append(text.format(v=getattr(training, field)))
    notes.extend(overhead_notes(training, hw.world_size, hw.gpu.name))
    if training.global_batch_size is not None:  # advisor.estimate.accumulation (default plans read as before)
        notes.append(accumulation_note(training))
    if training.optimizer_in_backward or training.optimizer == "adamw-8bit-paged":  # advisor.estimate.in_backward
        from advisor.estimate.in_backward import optimizer_notes

        notes.extend(optimizer_notes(training))
    if training.activation_offload:  # advisor.estimate.activation_offload
        notes.append(ACTIVATION_OFFLOAD_NOTE)
    if "use_cache" in training.model_fields_set or training.recipe.kv_cache:  # default plans read as before
        notes.append(kv_cache_note(training.keeps_kv_cache, spec.kv_cache_values_own_dtype))
    if training.compile:  # advisor.estimate.compile_time
        notes.append("--compile: each block's elementwise ops timed as inductor fuses them (HBM bytes, "
                     "advisor.estimate.compile_time); memory: a block without checkpointing (bf16, fp32 under autocast, or "
                     "LoRA without dropout on a bf16 base) saves what torch.compile's partitioner keeps "
                     "(advisor.estimate.compile_memory: each RMSNorm's fp32 copy and cast and silu(gate) recomputed in "
                     "backward, one copy of each adapter input), under selective checkpointing in bf16 without "
                     "down_proj's output, other recipes estimated as eager")
        if training.recipe.compile_loss and training.loss == "hf":  # advisor.estimate.memory.memory_loss_kernel
            notes.append(f"--compile: the {training.recipe.name} recipe compiles its loss too: the cross-entropy "
                         "holds the logits and their gradient in their own dtype, no fp32 copy or log-softmax "
                         "(advisor.estimate.activations_loss.compiled_loss_bytes; a data-parallel or HSDP mesh; tensor, "
                         "context and pipeline parallel plans count it eager); its time is not counted")
    if training.chunked_nll:  # memory_loss_kernel
        notes.append(f"--loss chunked: the {training.recipe.name} recipe's own chunked loss, TRL SFTTrainer's "
                     "loss_type chunked_nll (its default since TRL 1.4.0): 256-token chunks, each casting the whole "
                     "head weight, under checkpointing, recomputed in backward (timed: one more product with the "
                     "head): advisor.estimate.activations_loss.chunked_nll_bytes, on a context-parallel or HSDP mesh "
                     "for each rank's tokens; tensor-parallel plans (TRL's full_tensor() of the sharded head) and "
                     "traced model families count wrappers.losses' eager kernel; a Trainer without TRL "
                     "runs it as wrappers.losses.use_loss_kernel(model, \"chunked\", checkpointed=True)")
    elif training.loss == "chunked" and training.recipe.chunked_logits is not None:  # memory_loss_kernel
        compiled = training.compile and training.recipe.compile_loss
        made = ("the model returns every chunk's logits first" if training.recipe.chunked_logits == "model"
                else "each chunk's logits made in the loss")
        notes.append(f"--loss chunked: the {training.recipe.name} recipe's own chunked cross-entropy ({made}"
                     + ("; each chunk compiled, so it keeps its logits in their own dtype, no fp32 log-softmax"
                        if compiled else "") + ": advisor.estimate.activations_loss.chunked_loss_bytes; tensor, "
                     "context, pipeline parallel and HSDP plans and traced model families count wrappers.losses' "
                     "eager kernel)")
    if training.fsdp_version == 1:  # a fact of the user's file (--from); wrap() and the exports apply FSDP2
        notes.append("FSDP planned as FSDP1 (FullyShardedDataParallel: flat parameters per block, bf16 reduce-scatter, "
                     "the root unsharded until backward, BACKWARD_PRE; --fsdp-version 1 or the --from file); advisor wrap() and "
                     "advisor export apply FSDP2 (fully_shard)")
    fit_rule = ("margin policy: a plan fits when the --margin end of its total (peak + runtime overhead) is at most "
                "the GPU's memory")
    if training.policy == "thresholds":
        notes.append(f"{fit_rule}; among plans within {SAME_SPEED:.0%} of the chosen one's tokens/s, one using at "
                     f"most {1 - training.headroom:.0%} of memory ({training.headroom:.0%} headroom, --headroom) is "
                     "preferred, then the one that communicates least")
    else:  # --policy fastest ranks by tokens/s alone (planner.choose_fastest)
        notes.append(f"{fit_rule}; --policy fastest takes the most tokens/s, with no headroom preference")
    encdec = kind_of(spec).family == "encdec"  # its decoder's own length (advisor.model.block_kinds)
    if not encdec and training.target_len is not None:
        notes.append(f"--target-len {training.target_len} ignored: {spec.name[:60]} is not an encoder-decoder model")
    elif encdec and "target_len" not in training.model_fields_set:
        notes.append(f"target length {training.seq_len} tokens: equal to --seq-len (default; --target-len for the "
                     "decoder's own length)")
    if training.images_per_sample:
        per_image = image_tokens(spec, training) // training.images_per_sample
        how = ("every image resized to the vision tower's side" + (
                   f"; --image-size {training.image_size} does not apply" if "image_size" in training.model_fields_set
                   else "") if spec.tokens_per_image is not None else
               f"{training.image_size} x {training.image_size} pixels assumed, --image-size; one token per "
               f"{spec.image_token_pixels} x {spec.image_token_pixels} pixels")
        notes.append(f"images: {training.images_per_sample} per sample x {per_image} tokens ({how}) added to the "
                     f"{training.seq_len} text tokens")
    shape_note = shape_of(spec).note  # size only, no formula for the family, or no token embeddings
    if shape_note and not spec.traced:
        notes.append(shape_note)
    if spec.trainable_params < spec.total_params:
        notes.append("frozen parameters sit inside the network (LoRA-like): activations are kept for every layer")
    if training.micro_batch_size is None:
        batch = ("; without --global-batch an optimizer step takes the micro-batch x the data-parallel GPUs, so the "
                 "micro-batch chosen sets the step's batch: give --global-batch to fix it (the rest summed over "
                 "micro-batches)" if training.global_batch_size is None else "")
        notes.append(f"micro-batch 'auto': the largest that leaves {training.headroom:.0%} of memory free at the "
                     f"{training.margin} end of its range (--headroom), searched up to 64 per GPU; micro-batch 1 "
                     f"when none does and it fits{batch}")
    return notes
