"""Per-GPU memory under a device mesh (dp_replicate x dp_shard x cp x tp): what tensor, context and
hybrid-sharded data parallelism leave on one rank, in the same four-moment ``MemoryBreakdown`` as
the data-parallel estimate (``advisor.estimate.memory``), which this module reuses for the moments.
Time under a mesh is ``advisor.estimate.mesh_time``; choosing a mesh is ``advisor.planning.meshes``.

What one rank holds (the recipe torchtitan runs: ``parallelize_llama``, TP, then CP, then FSDP2;
``wrap()`` runs the same order with transformers' TP plan):

- Parameters. TP (Megatron column/row split, Shoeybi et al. 2019, section 3) splits every attention
  and MLP matrix of a block by ``tp``; the embedding and the head are vocabulary-parallel (split by
  ``tp``) unless they are tied, in which case ``wrappers.tensor_parallel`` leaves the one shared
  matrix out of the plan and it is replicated over ``tp``, or the family has no transformers TP plan
  (``profiles/tensor_parallel.json``: StableLM, Falcon, OPT...), whose derived plan names neither
  (``vocab_parallel``); norms (2 x hidden per block) and other
  small tensors stay replicated. FSDP2 then shards that per-TP-rank share over ``dp_shard x cp``
  ranks (torchtitan's ``dp_shard_cp`` mesh: CP ranks hold different tokens of the same replica, so
  they shard parameters like data-parallel ranks); ``dp_replicate`` replicas hold copies (HSDP).
  Gradients and optimizer state follow the parameters.
- Activations. Inside a block the attention heads and the MLP's inner width are split by ``tp``.
  Without sequence parallelism (``sequence_parallel=False``, every recipe but torchtitan's:
  transformers' TP plans, hence ``wrap()`` and the accelerate/Trainer configs, have none) the norms, the residual stream and the
  inputs of the column-parallel linears are whole on every TP rank, as at tp 1. With it
  (torchtitan, Korthikanti et al. 2022, section 4.2.2) the norms and the residual stream between
  blocks are split along the sequence; what stays whole is the input of the column-parallel
  linears after the sequence all-gather: PyTorch's DTensor ``ColwiseParallel`` gathers the norm
  output and the matmul saves the gathered tensor (Megatron instead re-gathers it in backward;
  torch does not), 2 x hidden per token per block, and under checkpointing the saved block inputs
  are sequence shards. CP splits the sequence: every per-token activation is divided by ``cp``
  (SDPA/flash attention has no s^2 term, so nothing else depends on the sequence). Eager attention
  (``--attention eager``) saves its b x heads x s x s scores (the fp32 softmax output and its
  compute-dtype copy, ``advisor.estimate.activations_blocks.attention_per_token``) as in the
  data-parallel estimate, for the rank's heads/tp; with cp it is refused (``check_mesh_support``).
  Checked against ``advisor.simulate.mesh_step`` (benchmarks/accuracy_mesh.py). Selective checkpointing
  keeps the matrix products' outputs as the policy sees them, DTensors: a column-parallel layer's is
  split by ``tp``, a row-parallel layer's (o_proj, down_proj) is the partial sum before the all-reduce,
  whole on every rank (``kept_widths_on_rank``). A traced family (no formula) starts from its profile,
  measured on the whole model, less what TP takes off a rank (``split_traced``).
- Images (vision-language models, ``--images-per-sample``): the image tokens join the language
  model's sequence, as in the data-parallel estimate (``advisor.estimate.memory.image_tokens``), so
  CP splits text and image tokens alike, ``ceil((seq_len + image tokens) / cp)`` a rank (a length
  that does not split evenly is padded). The vision tower is not on the mesh: transformers' TP plans
  for Llava and Qwen2.5-VL name only the language model's layers (``model.language_model.layers.*``
  and its embedding; the head), so the tower's (and projector's) weights are replicated over tp
  and, like the other parameters outside the blocks, sharded by FSDP2 over dp_shard x cp; CP shards
  the language model's sequence, not the images. Every TP and CP rank therefore runs the whole
  tower over all of its micro-batch's images and keeps its activations whole
  (``advisor.estimate.memory.vision_tower_bytes``, the data-parallel figure, not divided by tp or
  cp). CP with images is counted here but refused by the planner (``advisor.planning.meshes``
  ``check_pins`` and the search): transformers' VLMs check that the image
  placeholders in ``input_ids`` match the features, so sharding ``input_ids`` before the model (torch
  ``context_parallel`` buffers) fails there, and the search offers no such mesh. A text-only batch of
  a VLM (no images) splits like any decoder's.
- Loss. The logits are gathered over the vocabulary: transformers' TP plans write the head as
  ``colwise_gather_output`` (``LlamaForCausalLM._tp_plan``), so each rank holds its tokens' full
  N/cp x V logits and their fp32 copies, which is what the exported accelerate/Trainer configs
  run. torchtitan's ``loss_parallel`` keeps N/cp x V/tp instead: ``loss_parallel=True`` models it, and
  by default the recipe decides (``Recipe.tp_loss_parallel``, with ``tp_sequence_parallel``: the
  torchtitan row runs both, the stacks on transformers' TP plans neither). ``--loss fused`` over a
  vocabulary-parallel head is refused (``check_mesh_support``): the kernel multiplies by the head's weight
  itself, a DTensor its matmul refuses; the chunked kernel calls the head module, which gathers.
- Ring attention (torch ``context_parallel``, torch/distributed/tensor/experimental/_attention.py,
  ``_templated_ring_attention``): each step computes on one key/value chunk while the next one is
  received, two chunks of b x s/cp x kv-width/tp in flight; backward also rotates the key/value
  gradients, two more chunks. Counted in a block's backward, the moment both exist.

Supported here: Llama-like decoders (and MoE, its experts split by ``tp``) with SDPA attention (or
eager, without cp), full fine-tuning on the torch engine's FSDP2 strategies. Everything else is refused
with the constraint named (``check_mesh_support``). Pure functions, integer bytes.
"""

from __future__ import annotations

import functools

from advisor.estimate.activations import ActivationEstimate, ActivationShape, estimate_activations, shape_of
from advisor.estimate.activations_blocks import cuda_math_sdpa_at
from advisor.estimate.accumulation import accumulation_steps, held_accumulated_grads, held_at_backward_end
from advisor.estimate.memory import (MemoryBreakdown, image_tokens, memory_at_moments, memory_loss_kernel, model_states,
                                     recipe_dtypes, vision_tower_bytes, whole_rank_extras)
from advisor.estimate.states import FP32
from advisor.estimate.traced import activations_from_profile, find_profile, profile_key
from advisor.estimate.strategy_buffers import block_backward_buffers, block_params, estimate_strategy_buffers
from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.mesh import ParallelDims
from advisor.model.bundled import load_tensor_parallel
from advisor.model.selective import block_products, selective_kept
from advisor.model.block_kinds import kind_of
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, in integers: one rank's share of ``a`` split ``b`` ways."""
    return -(-a // b)


def check_mesh_support(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims, *,
                       families: tuple[str, ...] = ("decoder",)) -> None:
    """ValueError naming the constraint when this model/recipe cannot run on ``mesh``. ``families``: the
    activation families whose blocks the caller can count (the planner: a Llama-like decoder, what
    ``wrap()`` splits; ``estimate_pipeline_memory`` also GPT-2 on a pipeline-only mesh)."""
    if mesh.is_data_parallel_only:
        return
    if training.engine != "torch" or not impl.shard_params or impl.engine != "torch":
        split = " or ".join(name for name, degree in (("tensor", mesh.tp), ("context", mesh.cp), ("pipeline", mesh.pp),
                                                         ("expert", mesh.ep)) if degree > 1) or "model"
        raise ValueError(f"mesh {mesh.label} runs FSDP2 on the torch engine (zero2/zero3); {impl.runs_as or impl.engine} "
                         f"cannot carry {split} parallelism here")
    if training.activation_offload:
        raise ValueError(f"mesh {mesh.label}: --activation-offload is modelled for data parallelism on one mesh "
                         "dimension (advisor.estimate.activation_offload); use --tp 1 --cp 1 --pp 1 --hybrid 1")
    if training.lora is not None or spec.trainable_params < spec.total_params:
        raise ValueError(f"mesh {mesh.label}: tensor/context-parallel plans are for full fine-tuning; drop --lora/--trainable-params")
    styles = load_tensor_parallel().unsupported_tp_styles.get(spec.model_type or "")
    if mesh.tp > 1 and styles:
        raise ValueError(f"mesh {mesh.label}: {spec.model_type}'s transformers TP plan uses {', '.join(styles)}, which "
                         "wrap() cannot apply (wrappers.tensor_parallel: plain PyTorch styles only); use --tp 1")
    shape = _tp_shape(spec, 1)
    if shape.family not in families or shape.assumed:
        kind = spec.model_type or spec.architecture or "this model"
        raise ValueError(f"mesh {mesh.label} needs a Llama-like attention decoder with known heads; {kind} has "
                         f"{'no attention heads in its config' if shape.assumed else 'no such layout'}")
    if mesh.tp > 1 and training.loss == "fused" and vocab_parallel(spec):
        raise ValueError(f"mesh {mesh.label}: --loss fused multiplies the hidden states by the head's weight itself "
                         f"(wrappers.losses), and tp {mesh.tp} splits that weight by vocabulary (transformers' TP plan: "
                         "a DTensor, which the kernel's matmul refuses beside a plain tensor); use --loss chunked or hf")
    if mesh.cp > 1 and training.attention == "eager":
        raise ValueError(f"--cp {mesh.cp} needs SDPA attention (torch context_parallel replaces "
                         "scaled_dot_product_attention); --attention eager cannot be context-parallel")
    mesh.check_model(num_attention_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads or
                     spec.num_attention_heads)
    mesh.check_sequence(training.seq_len)


def vocab_parallel(spec: ModelSpec) -> bool:
    """Whether TP splits the embedding and the head by vocabulary: transformers' plan does
    (``embedding_rowwise``, ``colwise_gather_output``) unless they are tied (one parameter cannot be
    placed twice); a family with no plan (``profiles/tensor_parallel.json``: StableLM, Falcon, OPT...)
    runs ``wrappers.tensor_parallel.derived_plan``, which names neither: both whole on every rank."""
    return not spec.tied_embeddings and spec.model_type not in load_tensor_parallel().no_tp_plan


@functools.lru_cache(maxsize=64)  # a pure function of frozen inputs; the mesh search asks many times
def tp_rank_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The parameters one TP rank owns, as a spec the data-parallel state formulas read: block
    matrices and the (vocabulary-parallel) embedding and head divided by ``tp``, norms whole."""
    if tp == 1:
        return spec
    layer, num_layers, outside = block_params(spec)
    norms = 2 * (spec.hidden_size or 0)  # two RMSNorm weights per block, replicated
    layer_tp = ceil_div(max(0, layer - norms), tp) + norms
    embedding = spec.embedding_params or 0
    head = spec.head_params or 0
    # A tied embedding and head are one parameter, which wrappers.tensor_parallel leaves out of the
    # plan (it cannot be placed twice), and a family with no TP plan has neither in its derived one:
    # replicated over tp, sharded by FSDP over dp only.
    vocab_tp = tp if vocab_parallel(spec) else 1
    other = max(0, outside - embedding - head)

    def split(params: int) -> int:
        return ceil_div(max(0, params - norms), tp) + norms

    # a stack of unequal blocks (DeepSeek's dense layers, Jamba's every block) splits each: advisor.model.block_kinds
    kind = kind_of(spec)
    update, saving = ({}, 0) if kind.split_blocks is None else kind.split_blocks(spec, split, layer_tp)
    total = layer_tp * num_layers - saving + ceil_div(embedding, vocab_tp) + ceil_div(head, vocab_tp) + other
    return validated_copy(spec, dict(
        update, total_params=total, trainable_params=total, layer_params=layer_tp,
        embedding_params=ceil_div(embedding, vocab_tp) if spec.embedding_params is not None else None,
        head_params=ceil_div(head, vocab_tp) if spec.head_params is not None else None))


@functools.lru_cache(maxsize=64)
def _tp_shape(spec: ModelSpec, tp: int) -> ActivationShape:
    """The activation shape one TP rank computes: its heads and its share of the MLP width."""
    shape = shape_of(spec)
    if tp == 1:
        return shape
    return validated_copy(shape, dict(num_attention_heads=shape.num_attention_heads // tp,
                                        num_kv_heads=shape.num_kv_heads // tp,
                                        intermediate_size=ceil_div(shape.intermediate_size, tp)))


def _mlp_saving(shape: ActivationShape, wide: int) -> ActivationShape:
    """``shape`` with an MLP width whose gated count (four tensors of that width a block) saves what ``wide``
    tensors of the real width do (``profiles/tensor_parallel.json`` mlp_wide_saved): only read for the share
    TP takes off a traced profile."""
    return validated_copy(shape, dict(intermediate_size=ceil_div(shape.intermediate_size * wide, 4)))


def mesh_activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims, *,
                     micro_batch_size: int, checkpointing: bool, loss_parallel: bool | None = None,
                     sequence_parallel: bool | None = None) -> ActivationEstimate:
    """One rank's activations: the decoder count for its heads and MLP width (``tp``) and its tokens
    (``cp``), less, under sequence parallelism, the shards of the norms and block inputs (module
    docstring); without it (what ``wrap()`` runs) those stay whole on every TP rank. Image tokens are
    part of the sequence; the vision tower's activations are whole on every rank (module docstring).
    ``loss_parallel`` / ``sequence_parallel`` None: as the recipe's TP runs (``tp_loss_parallel``,
    ``tp_sequence_parallel``: torchtitan's row, where the other stacks run transformers' TP plans)."""
    if loss_parallel is None:
        loss_parallel = training.recipe.tp_loss_parallel
    if sequence_parallel is None:
        sequence_parallel = training.recipe.tp_sequence_parallel
    shape, dt = _tp_shape(spec, 1), recipe_dtypes(training, impl)
    tp = mesh.tp
    rank_len = rank_seq_len(spec, training, mesh)
    tower = vision_tower_bytes(spec, training, dt, micro_batch_size=micro_batch_size)
    selective = checkpointing and training.activation_checkpointing == "selective"
    products = selective_kept(spec) if selective else None  # the mesh's blocks train whole (no adapters)
    kept, tail = (products.width, products.tail_width) if products is not None else (0, 0)
    kept_rank, tail_rank = kept_widths_on_rank(spec, tp) if selective else (0, 0)
    # TRL's chunked_nll on a rank's sequence shard (context parallel, HSDP: the head whole on each rank); under tensor
    # parallelism TRL gathers a vocabulary-sharded head with full_tensor(), not modelled: wrappers.losses' eager kernel
    kernel = memory_loss_kernel(training) if training.chunked_nll and tp == 1 else training.loss
    est = estimate_activations(_tp_shape(spec, tp), dt, micro_batch_size=micro_batch_size,
                               seq_len=rank_len, checkpointing=checkpointing,
                               eager=training.attention == "eager",
                               loss_kernel=kernel, selective=selective, kept_width=kept_rank,
                               kept_tail_width=tail_rank,
                               head_grads=tp == 1 or not vocab_parallel(spec))
    profile = find_profile(spec, profile_key(dt, training, checkpointing=checkpointing)) \
        if spec.traced and spec.num_layers and mesh.cp == 1 else None
    if profile is not None:  # a traced family: its measured step, less what TP takes off a rank
        whole = estimate_activations(shape, dt, micro_batch_size=micro_batch_size, seq_len=rank_len,
                                     checkpointing=checkpointing, eager=training.attention == "eager",
                                     loss_kernel=training.loss, selective=selective, kept_width=kept,
                                     kept_tail_width=tail)
        facts = load_tensor_parallel()
        rows = facts.selective_row_parallel_kept.get(spec.model_type or "", 0) if selective else 0
        copied = spec.model_type in facts.attention_output_copied
        tokens = micro_batch_size * rank_len
        attention_copy = tokens * shape.num_attention_heads * shape.head_dim * dt.compute if copied else 0
        wide = facts.mlp_wide_saved.get(spec.model_type or "")
        if wide:  # an MLP that saves `wide` tensors of its inner width, not the count's gated four: TP takes those off
            whole, est = (estimate_activations(_mlp_saving(s, wide), dt, micro_batch_size=micro_batch_size,
                                               seq_len=rank_len, checkpointing=checkpointing,
                                               eager=training.attention == "eager", loss_kernel=training.loss,
                                               selective=selective, kept_width=k, kept_tail_width=t, head_grads=g)
                          for s, k, t, g in ((shape, kept, tail, True),
                                             (_tp_shape(spec, tp), kept_rank, tail_rank,
                                              tp == 1 or not vocab_parallel(spec))))
        est = split_traced(activations_from_profile(profile, num_layers=spec.num_layers,
                                                    micro_batch_size=micro_batch_size, vocab_size=spec.vocab_size or 0,
                                                    hidden_size=spec.hidden_size or 0,
                                                    tied_head=bool(spec.tied_embeddings)), whole=whole, rank=est,
                           tp=tp, num_layers=spec.num_layers if selective else 0,
                           row_parallel_kept=rows * tokens * shape.hidden_size * dt.compute,
                           math_attention=training.attention != "eager" and cuda_math_sdpa_at(shape, dt,
                                                                                              seq_len=rank_len))
        if attention_copy:  # o_proj's copy of the attention output (profiles/tensor_parallel.json): the rank's heads
            est = split_attention_copy(est, copy=attention_copy, tp=tp, num_layers=spec.num_layers,
                                       saved=not checkpointing, heads=shape.num_attention_heads)
    if tower:  # replicated tower: its activations whole on every TP and CP rank
        est = validated_copy(est, dict(saved_bytes=est.saved_bytes + tower))
    if tp == 1:
        return est
    if loss_parallel:  # vocabulary-parallel cross-entropy: each rank keeps V/tp of every logit row
        est = validated_copy(est, dict(logits_bytes=ceil_div(est.logits_bytes, tp),
                                         loss_transient_bytes=ceil_div(est.loss_transient_bytes, tp),
                                         returned_logits_bytes=ceil_div(est.returned_logits_bytes, tp)))
    if not sequence_parallel:
        return est
    tokens = micro_batch_size * rank_len
    h, layers = shape.hidden_size, shape.num_layers
    # Sequence parallelism: each RMSNorm's fp32 input and normalised output are sequence shards.
    norm_shard = tokens * 2 * (FP32 + dt.residual) * h * (tp - 1) // tp
    layer = est.layer_bytes - norm_shard
    if checkpointing:  # the saved block inputs are sequence shards of the residual stream
        saved = est.saved_bytes - layers * tokens * dt.residual * h * (tp - 1) // tp
    else:
        saved = est.saved_bytes - layers * norm_shard
    return validated_copy(est, dict(saved_bytes=saved, layer_bytes=layer,
                                      recompute_bytes=max(0, est.recompute_bytes - norm_shard) if checkpointing else 0))


def kept_widths_on_rank(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(kept, tail) output widths of the products selective checkpointing keeps in one block, on one TP rank
    (``advisor.model.selective.selective_kept`` at tp 1, no adapters): a column-parallel layer's output is
    split by ``tp``; a row-parallel one's (``profiles/tensor_parallel.json`` row_parallel: o_proj, down_proj)
    is the partial sum before the all-reduce, whole on every rank, and the policy keeps it as it is (a
    Llama block keeps q, v and gate split, down whole)."""
    products = block_products(spec)
    whole = selective_kept(spec)
    if not products or whole is None:
        return 0, 0
    rows = load_tensor_parallel().row_parallel
    kept = sum(p.width if p.linear in rows else ceil_div(p.width, tp) for p in [q for q in products if q.counted][0::2])
    tail = whole.tail_width
    return kept, tail if products[-1].linear in rows else ceil_div(tail, tp)


def split_traced(traced: ActivationEstimate, *, whole: ActivationEstimate, rank: ActivationEstimate, tp: int,
                 num_layers: int = 0, row_parallel_kept: int = 0, math_attention: bool = False) -> ActivationEstimate:
    """A traced family's activations on one TP rank: the profile (measured on the whole model,
    ``advisor.estimate.traced``) less, moment by moment, the bytes TP takes off a rank in the
    decoder count (``whole`` at tp 1 less ``rank`` at the rank's heads and MLP width). What TP
    leaves whole (residual stream, norms, block inputs, the gathered logits) stays as traced.

    Under selective checkpointing (``num_layers`` > 0) a block saves, beyond what the count lists for it
    (block input, attention output: the count lists no kept products for a family whose linears it does
    not know), the matrix products the policy keeps: ``traced.block_kept_bytes - whole.block_kept_bytes``
    a block (the profile's step per block; the totals also differ outside the blocks). Of these the
    column-parallel ones are split by ``tp`` on a rank, the row-parallel ones (``row_parallel_kept``
    bytes a block: partial sums, whole on every rank; ``kept_widths_on_rank``) are not. Under full
    checkpointing the saved block inputs are whole. The formula shape alone was 4-7% short on these
    meshes, the profile undivided up to 7% over (benchmarks/results/sweep.jsonl 61132dbb970a,
    221fc5bac301, c5264a595c2d)."""
    fields = {name: max(0, getattr(traced, name) - (getattr(whole, name) - getattr(rank, name)))
              for name in ActivationEstimate.model_fields}
    # The forward's peak beyond the saved bytes is the logits (whole on a rank) where the count says so. Where
    # CUDA runs SDPA's math kernel (``math_attention``: fp32 with grouped-query heads) a traced peak above the
    # count's is a block's attention transient, its fp32 scores of every head, which a rank holds for its heads
    # only (sweep 35196b8f1f31: Phi fp32 GQA, s 8192, tp 4: +13.7% with it whole, -0.3% split; the fused loss's
    # whole-head excess, on StableLM's rows, is not split).
    excess = traced.logits_bytes - whole.logits_bytes
    if math_attention and excess > 0 and rank.logits_bytes == whole.logits_bytes:
        fields["logits_bytes"] = traced.logits_bytes - excess * (tp - 1) // tp
    if num_layers:
        kept = max(0, traced.block_kept_bytes - whole.block_kept_bytes)
        split = (kept - min(kept, row_parallel_kept)) * (tp - 1) // tp
        fields["saved_bytes"] = max(0, fields["saved_bytes"] - num_layers * split)
        fields["block_kept_bytes"] = max(0, fields["block_kept_bytes"] - split)
    return ActivationEstimate(**fields)


def split_attention_copy(est: ActivationEstimate, *, copy: int, tp: int, num_layers: int, saved: bool,
                         heads: int) -> ActivationEstimate:
    """``est`` less what TP takes off a block's copy of the attention output (``copy`` bytes a block on the
    whole model; StableLM's and Phi's o_proj input, ``profiles/tensor_parallel.json``): the rank holds its
    ``heads / tp`` heads' share of it, and none where that is one head (transposing a size-1 head dimension
    leaves the output contiguous: no copy; nor on the whole model with one head). In the block a backward
    recomputes (``layer_bytes``) always; in the saved bytes (every block) and a block's share of them only
    when blocks are not checkpointed (``saved``)."""
    if heads <= 1:
        return est
    off = copy if heads // tp == 1 else copy * (tp - 1) // tp
    update = dict(layer_bytes=max(0, est.layer_bytes - off))
    if saved:
        update.update(saved_bytes=max(0, est.saved_bytes - num_layers * off),
                      block_kept_bytes=max(0, est.block_kept_bytes - off))
    return validated_copy(est, update)


def rank_seq_len(spec: ModelSpec, training: TrainingConfig, mesh: ParallelDims) -> int:
    """The language model's tokens a sample puts on one CP rank: text and image tokens, split by cp."""
    return ceil_div(training.seq_len + image_tokens(spec, training), mesh.cp)


def ring_buffer_bytes(spec: ModelSpec, training: TrainingConfig, mesh: ParallelDims, *, micro_batch_size: int) -> int:
    """Ring attention in a block's backward: two key/value chunks and two of their gradients in flight."""
    if mesh.cp == 1:
        return 0
    shape = _tp_shape(spec, 1)
    chunk = (micro_batch_size * rank_seq_len(spec, training, mesh) * 2 * (shape.num_kv_heads // mesh.tp)
             * shape.head_dim * training.compute_bytes)  # K and V of one chunk
    return 2 * chunk + 2 * chunk


def estimate_mesh_memory(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, impl: Implementation,
                         mesh: ParallelDims, *, micro_batch_size: int, checkpointing: bool,
                         loss_parallel: bool | None = None, sequence_parallel: bool | None = None) -> MemoryBreakdown:
    """The worst rank's peak on ``mesh`` (module docstring); the moments of ``memory_at_moments``."""
    assert mesh.world_size == hardware.world_size, "mesh and hardware disagree on the world size"
    check_mesh_support(spec, training, impl, mesh)
    shard_world = mesh.dp_shard * mesh.cp  # FSDP2's mesh: torchtitan's dp_shard_cp
    local = tp_rank_spec(spec, mesh.tp)
    states = model_states(local, training, impl, shard_world)
    acts = mesh_activations(spec, training, impl, mesh, micro_batch_size=micro_batch_size,
                            checkpointing=checkpointing, loss_parallel=loss_parallel,
                            sequence_parallel=sequence_parallel)
    buffers = estimate_strategy_buffers(local, training, impl, shard_world, checkpointing=checkpointing)
    if mesh.tp == 1:  # the blocks' backward gradients as data parallelism holds them (not read under TP yet)
        buffers = block_backward_buffers(local, training, impl, shard_world, buffers, checkpointing=checkpointing)
    ring = ring_buffer_bytes(spec, training, mesh, micro_batch_size=micro_batch_size)
    if ring:
        buffers = validated_copy(buffers, dict(in_backward=buffers.in_backward + ring))
    # tp = cp = 1 (replicas of FSDP2): every rank holds the whole model's tokens, as under data parallelism
    whole = whole_rank_extras(spec, training, impl, acts, micro_batch_size=micro_batch_size,
                              checkpointing=checkpointing) if mesh.tp == 1 and mesh.cp == 1 else {}
    held = held_accumulated_grads(local, training, impl, states, world=shard_world, dp_world=mesh.dp,
                                  micro_batch_size=micro_batch_size)
    steps = accumulation_steps(training, dp_world=mesh.dp, micro_batch_size=micro_batch_size)
    # The end of backward under no_sync as data parallelism holds it (tp 1: the same blocks, root and buffers;
    # replicas only all-reduce the shards the reduce-scatter made); under TP not read yet: ``held`` stands.
    at_end = (held_at_backward_end(local, training, impl, held=held, split=buffers.at_embedding_backward is not None)
              if steps > 1 and mesh.tp == 1 else None)
    return memory_at_moments(states, acts, buffers, training, impl, world=shard_world, processes=mesh.world_size,
                             gpu=hardware.gpu.name, held_grads=held, device_bytes=hardware.gpu_memory_bytes,
                             held_at_backward_end=at_end, micro_batches=steps,
                             checkpointing=checkpointing, **whole)
