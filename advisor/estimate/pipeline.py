"""Per-stage memory under pipeline (and expert) parallelism, schedule-aware.

    estimate_pipeline_memory(spec, hardware, training, impl, mesh, *, micro_batch_size, checkpointing,
                             num_micro_batches) -> PipelineMemory   # .stages[i].memory, .worst

Every pipeline rank gets its own ``MemoryBreakdown`` (the same moments as the data-parallel and mesh
estimates, ``advisor.estimate.memory.memory_at_moments``); the worst rank decides whether a plan
fits. Time under a pipeline is ``advisor.estimate.pipeline_time``; choosing one is
``advisor.planning.meshes``. What belongs here: what one pipeline rank holds. What does not: the
per-rank TP/CP shares (``advisor.estimate.model_parallel``, reused), the schedules' facts
(``profiles/pipeline_schedules.json``, loaded by ``load_schedules``).

What rank i of p holds:

- Parameters: its own decoder layers (``ParallelDims.stage_layers``; MoE dense layers where they
  fall, DeepSeek's first three on rank 0), per TP rank as ``tp_rank_spec`` splits them; the
  embedding on the rank with the first chunk, the final norm and the head on the rank with the last
  one (rank p - 1; rank 0 under the V schedules, whose first and last chunks share a rank). Tied
  embeddings are held on both ranks (Megatron and torchtitan keep a copy on each and sum their
  gradients). FSDP2 shards them over dp_shard x cp, as on a mesh without pp.
- Activations: one micro-batch through the rank's layers (``mesh_activations`` of a spec cut to
  them), times the micro-batches the schedule keeps in flight on that rank (the table's
  ``in_flight``: GPipe m, 1F1B p - i, interleaved Megatron's warm-up, ZB-H2 and ZB-2p 2 (p - i) - 1,
  ZB-V p, DualPipeV p + 1/2), plus, under the schedules that defer the weight-gradient pass (W), what W
  needs for ``w_held`` micro-batches: the linear layers' inputs and output gradients of every layer
  (those deferred when a B starts: ZB-H1 i on rank i, ZB-H2, ZB-V and DualPipeV none, ZB-2p as many
  as its memory limit of 2p micro-batches' activations leaves room for). Token ids are saved on the first
  rank only, the labels, the final norm and the logits on the last, where each in-flight micro-batch
  also keeps its loss's saved tensors (the loss runs in its forward); each rank keeps its receive
  buffers for one activation and one gradient (b x s/cp x h).
- Gradients: every pass after a rank's first backward runs with the rank's gradients allocated
  (``_held_grads_peak``).
- Experts under ``ep`` (torchtitan's placement with expert tensor parallelism = tp, ep carved out of
  dp_shard x cp): each rank holds E/ep routed experts of each of its MoE layers, split by tp like the
  other block weights, sharded by FSDP2 over the expert data-parallel group dp_shard x cp / ep, so a
  rank's share of the expert states is the same 1/(tp x dp_shard x cp) as without ep, while FSDP's
  unsharded block holds E/ep experts instead of E (the memory ep buys). What ep adds to one MoE layer
  (``advisor.estimate.pipeline_experts``, checked against the simulator): the all-to-all's send and
  receive buffers of k x tokens rows of width h while a block's backward runs, two int64 index
  vectors of k x tokens entries saved per layer, and, as the top of the error range, the busiest
  rank's extra rows (``imbalance_bytes``).

Pure functions of frozen inputs, integer bytes.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import ActivationEstimate, shape_of
from advisor.estimate.activations_blocks import (embedding_dropout_per_token, outside_norm_per_token,
                                                 outside_to_embedding_per_token)
from advisor.estimate.activations_loss import loss_kept_bytes
from advisor.estimate.pipeline_experts import moe_rank_bytes
from advisor.estimate.pipeline_schedules import ScheduleFacts, in_flight, load_schedules, w_held
from advisor.estimate.memory import MemoryBreakdown, memory_at_moments, model_states, recipe_dtypes
from advisor.estimate.model_parallel import (ceil_div, check_mesh_support, mesh_activations, rank_seq_len,
                                             ring_buffer_bytes, tp_rank_spec)
from advisor.estimate.states import ModelStates
from advisor.estimate.strategy_buffers import StrategyBuffers, estimate_strategy_buffers
from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.mesh import ParallelDims, split_layers  # noqa: F401 (split_layers: re-exported)
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig

INT64 = 8


class StageMemory(BaseModel):
    """One pipeline rank: what it holds and its peak."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0, description="Pipeline rank (0 holds the embedding).")
    num_layers: int = Field(ge=1, description="Decoder layers on this rank (all its chunks).")
    embedding: bool = Field(description="Holds the token embedding.")
    head: bool = Field(description="Holds the final norm, the head and the loss.")
    in_flight: float = Field(ge=0, description="Micro-batches of activations held at the peak.")
    activation_bytes: int = Field(ge=0, description="Saved activations held at the peak: in_flight x one "
                                  "micro-batch through the rank's layers, plus the deferred W passes' inputs.")
    imbalance_bytes: int = Field(default=0, ge=0, description="Extra routed-expert activations on the busiest ep "
                                 "rank at the assumed routing imbalance (the top of the error range).")
    memory: MemoryBreakdown


class PipelineMemory(BaseModel):
    """Every pipeline rank's memory; the worst decides fit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[StageMemory, ...]

    @functools.cached_property  # read again and again by the micro-batch search
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.memory.total, -s.rank))


def _expert_params(spec: ModelSpec) -> int:
    """Routed experts of one MoE layer (E x one expert)."""
    return (spec.num_experts or 0) * (spec.expert_params or 0)


def stage_spec(spec: ModelSpec, mesh: ParallelDims, *, start: int, layers: int, embedding: bool, head: bool,
               expert_divisor: int | None) -> ModelSpec:
    """The parameters one (pipeline, TP) rank holds, as a spec the state and buffer formulas read.
    ``expert_divisor``: None keeps the routed experts as TP splits them (what the states read: FSDP
    shards them over dp_shard x cp with or without ep); ep: FSDP's unsharded block, E/ep experts."""
    local = tp_rank_spec(spec, mesh.tp)
    layer = local.layer_params or 0
    if expert_divisor is not None and spec.num_experts:  # E/ep experts, each split by tp (ETP = TP)
        layer = layer - ceil_div(_expert_params(spec), mesh.tp) + ceil_div(_expert_params(spec), mesh.tp * expert_divisor)
    moe = spec.moe
    dense_here = 0
    if moe is not None and moe.num_dense_layers:
        dense_here = max(0, min(start + layers, moe.num_dense_layers) - start)
        dense_params = ceil_div(moe.dense_layer_params, mesh.tp)
        moe = validated_copy(moe, dict(num_dense_layers=dense_here, dense_layer_params=dense_params))
        saving = dense_here * (layer - dense_params)
    else:
        saving = 0
    hybrid = local.hybrid
    if hybrid is not None:  # Jamba: this stage's own blocks (as tp_rank_spec split them), E/ep experts under ep
        here = slice(start, start + layers)
        blocks = list(hybrid.block_params[here])
        if expert_divisor is not None and spec.num_experts:
            experts_tp = ceil_div(_expert_params(spec), mesh.tp)
            kept = ceil_div(_expert_params(spec), mesh.tp * expert_divisor)
            blocks = [b - experts_tp + kept if sparse else b for b, sparse in zip(blocks, hybrid.expert_layers[here])]
        hybrid = validated_copy(hybrid, dict(block_params=tuple(blocks), attention_layers=hybrid.attention_layers[here],
                                             expert_layers=hybrid.expert_layers[here]))
        saving = layers * layer - sum(blocks)
    emb = (local.embedding_params or 0) if embedding else 0
    vocab_head = local.embedding_params if spec.tied_embeddings else local.head_params
    head_params = (vocab_head or 0) if head else 0
    outside = spec.total_params - (spec.layer_params or 0) * (spec.num_layers or 0) + spec.dense_layer_saving \
        - (spec.embedding_params or 0) - (spec.head_params or 0)  # the final norm (replicated over tp)
    other = (spec.other_params if spec.other_params is not None else max(0, outside)) if head else 0
    total = max(1, layers * layer - saving + emb + head_params + other)
    return validated_copy(local, dict(
        total_params=total, trainable_params=total, layer_params=layer, num_layers=layers, moe=moe, hybrid=hybrid,
        embedding_params=emb, head_params=head_params if head else None, other_params=other,
        tied_embeddings=False, vocab_size=spec.vocab_size if head else None))


@functools.lru_cache(maxsize=256)  # a validated spec is dear; the search cuts the same few at every micro-batch
def layers_cut(spec: ModelSpec, layers: int, dense_layers: int | None = None) -> ModelSpec:
    """``spec`` cut to ``layers`` decoder layers (``dense_layers`` of them dense, for an MoE model with dense
    layers; default: as many as fit), for the activation formulas, which read the layer count. The parameter
    totals follow the cut, so the spec stays one its own validator accepts (the components sum to the total)."""
    moe = spec.moe
    if moe is not None:
        dense = min(moe.num_dense_layers, layers) if dense_layers is None else dense_layers
        moe = validated_copy(moe, dict(num_dense_layers=dense))
    update: dict = dict(num_layers=layers, moe=moe)
    if spec.layer_params is not None and spec.num_layers is not None:
        if spec.hybrid is not None:
            saving = spec.dense_layer_saving  # Jamba: the block list, not the layer count, decides it
        elif moe is not None and moe.num_dense_layers:
            saving = moe.num_dense_layers * (spec.layer_params - moe.dense_layer_params)
        else:
            saving = 0
        total = (spec.total_params - (spec.layer_params * spec.num_layers - spec.dense_layer_saving)
                 + spec.layer_params * layers - saving)
        frozen = spec.total_params - spec.trainable_params
        update.update(total_params=max(1, total), trainable_params=max(0, total - frozen))
    return validated_copy(spec, update)


def _w_bytes_per_token(spec: ModelSpec, training: TrainingConfig, impl: Implementation, tp: int) -> int:
    """What a deferred W pass needs of one layer, per token: the linear layers' inputs (q/k/v's and
    gate/up's normalised inputs, o_proj's and down_proj's) and their output gradients, on one TP rank.
    GPT-2's MLP has one up projection (c_fc), not gate and up: 16h a token in 16-bit, the paper's
    M_W = 32 sbh bytes a layer (Qi et al. 2024, Table 1)."""
    shape, cb = shape_of(spec), recipe_dtypes(training, impl).compute
    h, inter = shape.hidden_size, shape.intermediate_size
    k = shape.num_experts_per_token or 1
    ups = 1 if shape.family == "gpt2" else 2
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    inputs = 2 * h + (q + k * inter) // tp
    grads = (q + 2 * kv + ups * k * inter) // tp + 2 * h
    return cb * (inputs + grads)


def _stage_activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims, *,
                       start: int, layers: int, embedding: bool, head: bool, micro_batch_size: int,
                       checkpointing: bool) -> ActivationEstimate:
    """One micro-batch through this rank's layers: token ids on the first rank only, the labels, the
    final norm and the loss path on the last only."""
    dense = spec.moe.num_dense_layers if spec.moe is not None else 0
    dense_here = max(0, min(start + layers, dense) - start)
    return _cut_activations(spec, training, impl, _one_stage_mesh(mesh), layers, dense_here, embedding, head,
                            micro_batch_size, checkpointing)


@functools.lru_cache(maxsize=256)
def _one_stage_mesh(mesh: ParallelDims) -> ParallelDims:
    """The mesh one pipeline rank's activations see: no pp, no ep."""
    return validated_copy(mesh, dict(pp=1, ep=1, pp_layers=None, virtual_stages=1, world_size=mesh.world_size // mesh.pp))


@functools.lru_cache(maxsize=1024)  # the search asks for the same cut at many ranks and micro-batches
def _cut_activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims,
                     layers: int, dense_here: int, embedding: bool, head: bool, micro_batch_size: int,
                     checkpointing: bool) -> ActivationEstimate:
    cut = layers_cut(spec, layers, dense_here)
    est = mesh_activations(cut, training, impl, mesh, micro_batch_size=micro_batch_size,
                           checkpointing=checkpointing)
    dt = recipe_dtypes(training, impl)
    tokens = micro_batch_size * rank_seq_len(spec, training, mesh)
    shape = shape_of(spec)
    # token ids (the embedding's backward) and the embeddings' dropout mask (GPT-2)
    drop = 0 if embedding else tokens * (INT64 + embedding_dropout_per_token(shape))
    if not head:  # labels, the final norm's saved tensors and the head's input (or its cast); what the
        # blocks share stays (Llama's RoPE cos/sin, computed on every rank). Llama: RMSNorm's 8h (+ the cast);
        # GPT-2: LayerNorm's input and the head's input, 4h (8h here left 3h a token short of 34h + 5as).
        norm = outside_norm_per_token(shape, dt) - outside_to_embedding_per_token(shape, dt)
        drop += tokens * (INT64 + norm)
        est = validated_copy(est, dict(logits_bytes=0, loss_transient_bytes=0, returned_logits_bytes=0,
                                         outside_freed_bytes=0))
    return validated_copy(est, dict(saved_bytes=max(0, est.saved_bytes - drop)))


def _placement(mesh: ParallelDims, rank: int, v_shape: bool) -> tuple[bool, bool]:
    """(holds the embedding, holds the head) on pipeline rank ``rank``."""
    last = 0 if v_shape else mesh.pp - 1
    return rank == 0, rank == last


def _pipelined_fsdp(buffers: StrategyBuffers, held: ModelSpec, training: TrainingConfig, impl: Implementation,
                    shard_world: int) -> StrategyBuffers:
    """FSDP2 under ``torch.distributed.pipelining``: every backward but the step's last runs with
    ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``
    (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``; the reduce-scatter waits
    for ``perform_reduce_grad``), so from the first backward on the rank holds its stage unsharded and
    its gradients accumulated unsharded in the reduce dtype (FSDPParam ``unsharded_accumulated_grad``)."""
    if not impl.shard_params or shard_world == 1 or training.engine != "torch":
        return buffers
    ub = 2 if training.mixed else training.param_bytes
    reduce_b = 4 if training.mixed else training.param_bytes
    whole = (ub + reduce_b) * held.total_params
    fresh = ub * (held.layer_params or 0)  # one block's new gradients before they are accumulated
    return validated_copy(buffers, dict(at_loss=whole, at_forward_end=whole, in_backward=whole + fresh,
                                          at_backward_end=None))


def _forward_after_first_backward(facts: ScheduleFacts, count: Fraction, num_micro_batches: int) -> bool:
    """Whether the rank runs a forward after its first backward, so that it peaks, with ``count`` in
    flight, after that backward: every schedule but GPipe once m exceeds what the warm-up holds."""
    return facts.name != "gpipe" and count < num_micro_batches


def _held_grads_peak(states: ModelStates, one: ActivationEstimate, buffers: StrategyBuffers, training: TrainingConfig,
                     impl: Implementation, *, shard_world: int, processes: int, count: Fraction, chunks: int,
                     w_saved: int, loss_kept: int, forward_follows: bool,
                     gpu: str = "", device_bytes: int | None = None,
                     checkpointing: bool) -> tuple[Fraction, int, MemoryBreakdown]:
    """(micro-batches in flight, saved bytes, moments) at the rank's peak. In a pipeline every pass after a
    rank's first backward runs with its gradients allocated (accumulated over the step's micro-batches).
    FSDP2 over dp_shard x cp > 1 books them as its unsharded accumulators (``_pipelined_fsdp``); with one
    shard they are the states' gradients (fp32 under mixed precision), which the data-parallel moments
    book only at the optimizer step. Where a forward follows the first backward the rank peaks after it,
    ``count`` in flight, gradients allocated; where none does (GPipe, m within the warm-up) the peak is
    the larger of the first backward (``count`` in flight, no gradients yet) and the second (one chunk
    micro-batch fewer, gradients allocated). ``loss_kept``: what the loss keeps of each in-flight micro-batch
    beside the one whose loss the moments count (the last stage's, ``activations_loss.loss_kept_bytes``)."""

    def at(in_flight_now: Fraction, grads: int) -> tuple[Fraction, int, MemoryBreakdown]:
        saved = int(one.saved_bytes * in_flight_now) + w_saved + int(loss_kept * max(0, in_flight_now - 1))
        acts = validated_copy(one, dict(saved_bytes=saved))
        return in_flight_now, saved, memory_at_moments(states, acts, buffers, training, impl, world=shard_world,
                                                       held_grads=grads, processes=processes, gpu=gpu,
                                                       device_bytes=device_bytes, checkpointing=checkpointing)

    if shard_world > 1:
        return at(count, 0)
    if forward_follows:
        return at(count, states.grads)
    first = at(count, 0)
    if count <= Fraction(1, chunks):  # one backward only
        return first
    second = at(count - Fraction(1, chunks), states.grads)
    return second if second[2].peak_allocated > first[2].peak_allocated else first


@functools.lru_cache(maxsize=256)
def _stage_fixed(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims, rank: int,
                 start: int, layers: int, checkpointing: bool) -> tuple[ModelStates, StrategyBuffers]:
    """States and strategy buffers of one pipeline rank (they do not depend on the micro-batch)."""
    facts = load_schedules()[mesh.pp_schedule]
    embedding, head = _placement(mesh, rank, facts.v_shape)
    where = dict(start=start, layers=layers, embedding=embedding, head=head)
    ep_experts = mesh.ep > 1 and bool(spec.num_experts)
    shard_world = mesh.dp_shard * mesh.cp
    at_rest = stage_spec(spec, mesh, **where, expert_divisor=None)
    states = model_states(at_rest, training, impl, shard_world)
    if facts.param_copies > 1:
        states = validated_copy(states, dict(params=states.params * facts.param_copies))
    held = stage_spec(spec, mesh, **where, expert_divisor=mesh.ep) if ep_experts else at_rest
    buffers = estimate_strategy_buffers(held, training, impl, shard_world, checkpointing=checkpointing)
    if held is not at_rest:  # gradient shards are the states' share
        grads_end = estimate_strategy_buffers(at_rest, training, impl, shard_world,
                                      checkpointing=checkpointing).grads_at_backward_end
        buffers = validated_copy(buffers, dict(grads_at_backward_end=grads_end))
    if mesh.pp > 1:
        buffers = _pipelined_fsdp(buffers, held, training, impl, shard_world)
    return states, buffers


@functools.lru_cache(maxsize=256)  # the micro-batch search asks again for each micro-batch and mode
def _ranks_to_estimate(spec: ModelSpec, mesh: ParallelDims, facts: ScheduleFacts, num_micro_batches: int,
                       every_rank: bool) -> tuple[tuple[int, int, int, Fraction], ...]:
    """(rank, first layer, layers, micro-batches in flight) of the ranks to estimate: all of them, or
    (``every_rank=False``, the search), among ranks that hold the same layers, embedding, head and dense
    layers, those that no other holds at least as much as: micro-batches in flight, deferred W passes
    (ZB-H1's grow with the rank) and a forward after the first backward (gradients with all in flight,
    ``_held_grads_peak``), since a rank's peak grows with each."""
    dense = spec.moe.num_dense_layers if spec.moe else 0
    rows, start = [], 0
    for rank, layers in enumerate(mesh.stage_layers(spec.num_layers or 1)):
        count = in_flight(mesh.pp_schedule, rank=rank, pp=mesh.pp, micro_batches=num_micro_batches,
                          chunks=mesh.chunks_per_rank) if mesh.pp > 1 else Fraction(1)
        rows.append((rank, start, layers, count))
        start += layers
    if every_rank:
        return tuple(rows)
    chosen: dict[tuple, dict[tuple, tuple[int, int, int, Fraction]]] = {}
    for row in rows:
        rank, start, layers, count = row
        key = (layers, _placement(mesh, rank, facts.v_shape and mesh.pp > 1), max(0, min(start + layers, dense) - start))
        held = w_held(mesh.pp_schedule, rank=rank, pp=mesh.pp, micro_batches=num_micro_batches) if mesh.pp > 1 else 0
        chosen.setdefault(key, {}).setdefault(
            (count, held, _forward_after_first_backward(facts, count, num_micro_batches)), row)
    kept = []
    for group in chosen.values():
        kept += [row for held, row in group.items()
                 if not any(other != held and all(o >= h for o, h in zip(other, held)) for other in group)]
    return tuple(sorted(kept))


def estimate_pipeline_memory(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, impl: Implementation,
                             mesh: ParallelDims, *, micro_batch_size: int, checkpointing: bool,
                             num_micro_batches: int, every_rank: bool = True) -> PipelineMemory:
    """Each pipeline rank's peak on ``mesh`` (module docstring). Without pp (ep alone) one stage.
    ``every_rank=False`` (the search): only the ranks that can be the worst (``_ranks_to_estimate``)."""
    assert mesh.world_size == hardware.world_size, "mesh and hardware disagree on the world size"
    # A GPT-2 stage on a pipeline-only mesh is counted by its own block formula (no tp/cp split of it is
    # written); the planner never offers it (planning.pipeline_meshes: wrap() splits Llama-shaped models).
    pp_only = mesh.tp == mesh.cp == mesh.ep == 1
    check_mesh_support(spec, training, impl, mesh, families=("decoder", "gpt2") if pp_only else ("decoder",))
    mesh.check_layers(num_layers=spec.num_layers, num_experts=spec.num_experts)
    facts = load_schedules()[mesh.pp_schedule]
    shard_world = mesh.dp_shard * mesh.cp
    dt = recipe_dtypes(training, impl)
    tokens = micro_batch_size * rank_seq_len(spec, training, mesh)
    h = spec.hidden_size or 0
    ep_experts = mesh.ep > 1 and bool(spec.num_experts)
    moe = moe_rank_bytes(spec, dt, ep=mesh.ep, tp=mesh.tp, tokens=tokens, param_bytes=0) if ep_experts else None
    dense = spec.moe.num_dense_layers if spec.moe else 0
    ring = ring_buffer_bytes(spec, training, mesh, micro_batch_size=micro_batch_size)
    stages = []
    for rank, start, layers, count in _ranks_to_estimate(spec, mesh, facts, num_micro_batches, every_rank):
        embedding, head = _placement(mesh, rank, facts.v_shape and mesh.pp > 1)
        states, buffers = _stage_fixed(spec, training, impl, mesh, rank, start, layers, checkpointing)
        one = _stage_activations(spec, training, impl, mesh, start=start, layers=layers, embedding=embedding,
                                 head=head, micro_batch_size=micro_batch_size, checkpointing=checkpointing)
        w_saved = 0
        if mesh.pp > 1 and facts.w_deferred:
            w_one = tokens * layers * _w_bytes_per_token(spec, training, impl, mesh.tp)
            blocks = one  # ZB-2p's limit counts the blocks' activations (the scheduler's f_mem, 34h + 5as a layer)
            if facts.memory_limit is not None and (embedding or head):
                blocks = _stage_activations(spec, training, impl, mesh, start=start, layers=layers, embedding=False,
                                            head=False, micro_batch_size=micro_batch_size, checkpointing=checkpointing)
            held = w_held(mesh.pp_schedule, rank=rank, pp=mesh.pp, micro_batches=num_micro_batches,
                          micro_batch_bytes=blocks.saved_bytes, w_bytes=w_one)
            w_saved = held * w_one
        p2p = 2 * tokens * h * dt.residual if mesh.pp > 1 else 0  # receive buffers: activation and gradient
        moe_layers = layers - max(0, min(start + layers, dense) - start)
        a2a = moe.dispatch if moe is not None and moe_layers else 0  # send + receive of one exchange
        if moe is not None and not checkpointing:  # the ep path's own index vectors, every MoE layer
            one = validated_copy(one, dict(saved_bytes=one.saved_bytes + moe_layers * moe.sort_indices_saved))
        buffers = validated_copy(buffers, dict(persistent=buffers.persistent + p2p,
                                                 in_backward=buffers.in_backward + ring + a2a))
        if mesh.pp > 1:
            # The last chunk's micro-batches in flight each keep their loss's saved tensors. Only a rank with
            # one chunk holds more than one of them: interleaved and V schedules run the last chunk's
            # backward right after its forward.
            loss_kept = 0
            if head and mesh.chunks_per_rank == 1 and not facts.v_shape:
                loss_kept = loss_kept_bytes(training.loss, tokens=tokens, vocab=spec.vocab_size or 0, hidden=h, dt=dt)
            count, saved, memory = _held_grads_peak(
                states, one, buffers, training, impl, shard_world=shard_world, processes=mesh.world_size, count=count,
                chunks=mesh.chunks_per_rank, w_saved=w_saved, loss_kept=loss_kept,
                forward_follows=_forward_after_first_backward(facts, count, num_micro_batches), gpu=hardware.gpu.name,
                device_bytes=hardware.gpu_memory_bytes, checkpointing=checkpointing)
        else:
            saved = int(one.saved_bytes * count)
            memory = memory_at_moments(states, validated_copy(one, dict(saved_bytes=saved)), buffers, training, impl,
                                       world=shard_world, processes=mesh.world_size, gpu=hardware.gpu.name,
                                       device_bytes=hardware.gpu_memory_bytes, checkpointing=checkpointing)
        imbalance = 0
        if moe is not None and moe_layers:  # the busiest rank's extra routed rows, all in-flight micro-batches
            imbalance = int(moe.imbalance * (1 if checkpointing else moe_layers) * float(max(count, 1)))
        stages.append(StageMemory(rank=rank, num_layers=layers, embedding=embedding, head=head,
                                  in_flight=float(count), activation_bytes=saved, imbalance_bytes=imbalance,
                                  memory=memory))
    return PipelineMemory(stages=tuple(stages))
