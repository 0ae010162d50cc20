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
  ``in_flight``: GPipe m, 1F1B p - i, interleaved Megatron's warm-up, ZB-H2 2 (p - i) - 1, ZB-V p,
  DualPipeV p + 1/2), plus, under the schedules that defer the weight-gradient pass (W), what W
  needs for ``w_held`` micro-batches: the linear layers' inputs and output gradients of every layer.
  Token ids are saved on the first rank only, the labels, the final norm and the logits on the last;
  each rank keeps its receive buffers for one activation and one gradient (b x s/cp x h).
- Experts under ``ep`` (torchtitan's placement, expert tensor parallelism 1): each rank holds E/ep
  routed experts of each of its MoE layers, whole (not split by tp), sharded by FSDP2 over the
  expert data-parallel group dp_shard x cp / ep, so a rank's share of the expert states is the same
  1/(dp_shard x cp) as without ep, while FSDP's unsharded block holds E/ep experts instead of E
  (the memory ep buys). The all-to-all dispatch and combine of a block hold the send and receive
  buffers of k x tokens rows of width h while it runs. Dropless routing sends k x tokens rows in all;
  how they fall on the ep ranks is the routing's balance: the busiest rank's extra rows are
  ``imbalance_bytes`` (``profiles/expert_parallel.json``), the top of the error range, not part of
  the expected figure.

Pure functions of frozen inputs, integer bytes.
"""

from __future__ import annotations

import functools
import json
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import ActivationEstimate, shape_of
from advisor.estimate.activations_blocks import rms_norm_per_token
from advisor.estimate.memory import MemoryBreakdown, _recipe_dtypes, memory_at_moments, model_states
from advisor.estimate.model_parallel import (_ceil, _rank_seq_len, check_mesh_support, mesh_activations,
                                             ring_buffer_bytes, tp_rank_spec)
from advisor.estimate.strategy_buffers import _strategy_buffers
from advisor.hardware.cluster import Hardware
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig
from profiles import PROFILES_DIR

INT64 = 8


class ScheduleFacts(BaseModel):
    """One row of ``profiles/pipeline_schedules.json`` (its ``_doc`` defines the units)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    in_flight: str = Field(description="Rank micro-batches in flight on rank i (formula as written in the source).")
    bubble_coefficient: float = Field(ge=0, description="bubble = c x (p - 1) / v x (t_F + t_B) of one micro-batch.")
    w_deferred: bool = Field(description="The weight-gradient pass runs apart from the input-gradient pass.")
    w_held: int = Field(ge=0, description="Micro-batches whose W inputs are held beyond those in flight.")
    param_copies: int = Field(ge=1, description="Copies of the rank's share of the parameters.")
    v_shape: bool = Field(description="Two chunks per rank in a V: the first and last chunk on rank 0.")
    torch_class: str = Field(description="torch.distributed.pipelining schedule class.")
    source: str


@functools.cache
def load_schedules() -> dict[str, ScheduleFacts]:
    """The schedule table by name (read once)."""
    rows = json.loads((PROFILES_DIR / "pipeline_schedules.json").read_text())["schedules"]
    return {row["name"]: ScheduleFacts(**row) for row in rows}


def in_flight(schedule: str, *, rank: int, pp: int, micro_batches: int, chunks: int = 1) -> Fraction:
    """Rank micro-batches whose activations rank ``rank`` holds at its peak (the table's ``in_flight``)."""
    m, p, i, v = micro_batches, pp, rank, chunks
    if schedule == "gpipe":
        return Fraction(m)
    if schedule in ("1f1b", "zb_h1"):
        return Fraction(min(m, p - i))
    if schedule == "interleaved_1f1b":  # Megatron's warm-up chunks + the steady one, in chunks of 1/v
        return Fraction(min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1), v)
    if schedule == "zb_h2":
        return Fraction(min(m, 2 * (p - i) - 1))
    if schedule == "zbv":
        return Fraction(min(m, p))
    if schedule == "dualpipev":
        return min(Fraction(m), Fraction(2 * p + 1, 2))
    raise ValueError(f"unknown pipeline schedule {schedule}")


class StageMemory(BaseModel):
    """One pipeline rank: what it holds and its peak."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0, description="Pipeline rank (0 holds the embedding).")
    num_layers: int = Field(ge=1, description="Decoder layers on this rank (all its chunks).")
    embedding: bool = Field(description="Holds the token embedding.")
    head: bool = Field(description="Holds the final norm, the head and the loss.")
    in_flight: float = Field(ge=0, description="Micro-batches of activations held at the peak.")
    imbalance_bytes: int = Field(default=0, ge=0, description="Extra routed-expert activations on the busiest ep "
                                 "rank at the assumed routing imbalance (the top of the error range).")
    memory: MemoryBreakdown


class PipelineMemory(BaseModel):
    """Every pipeline rank's memory; the worst decides fit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[StageMemory, ...]

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.memory.total, -s.rank))


@functools.cache
def routing_imbalance() -> float:
    """Busiest ep rank's routed rows over the mean (``profiles/expert_parallel.json``)."""
    return float(json.loads((PROFILES_DIR / "expert_parallel.json").read_text())["routing_imbalance"]["value"])


def _expert_params(spec: ModelSpec) -> int:
    """Routed experts of one MoE layer (E x one expert)."""
    return (spec.num_experts or 0) * (spec.expert_params or 0)


def _stage_spec(spec: ModelSpec, mesh: ParallelDims, *, start: int, layers: int, embedding: bool, head: bool,
                expert_divisor: int | None) -> ModelSpec:
    """The parameters one (pipeline, TP) rank holds, as a spec the state and buffer formulas read.
    ``expert_divisor``: None keeps the experts as TP splits them; an integer holds the routed experts
    whole (expert tensor parallelism 1) and divides them by it (ep for FSDP's unsharded block, 1 for
    the states, which FSDP shards over dp_shard x cp either way)."""
    local = tp_rank_spec(spec, mesh.tp)
    layer = local.layer_params or 0
    if expert_divisor is not None and spec.num_experts:
        layer = layer - _ceil(_expert_params(spec), mesh.tp) + _ceil(_expert_params(spec), expert_divisor)
    moe = spec.moe
    dense_here = 0
    if moe is not None and moe.num_dense_layers:
        dense_here = max(0, min(start + layers, moe.num_dense_layers) - start)
        dense_params = _ceil(moe.dense_layer_params, mesh.tp)
        moe = moe.model_copy(update=dict(num_dense_layers=dense_here, dense_layer_params=dense_params))
        saving = dense_here * (layer - dense_params)
    else:
        saving = 0
    emb = (local.embedding_params or 0) if embedding else 0
    vocab_head = local.embedding_params if spec.tied_embeddings else local.head_params
    head_params = (vocab_head or 0) if head else 0
    other = max(0, local.total_params - (local.layer_params or 0) * (spec.num_layers or 0) + spec.dense_layer_saving
                - (local.embedding_params or 0) - (local.head_params or 0)) if head else 0
    total = max(1, layers * layer - saving + emb + head_params + other)
    return local.model_copy(update=dict(
        total_params=total, trainable_params=total, layer_params=layer, num_layers=layers, moe=moe,
        embedding_params=emb, head_params=head_params if head else None, other_params=other,
        tied_embeddings=False, vocab_size=spec.vocab_size if head else None))


def _w_bytes_per_token(spec: ModelSpec, training: TrainingConfig, impl: Implementation, tp: int) -> int:
    """What a deferred W pass needs of one layer, per token: the linear layers' inputs (q/k/v's and
    gate/up's normalised inputs, o_proj's and down_proj's) and their output gradients, on one TP rank."""
    shape, cb = shape_of(spec), _recipe_dtypes(training, impl).compute
    h, inter = shape.hidden_size, shape.intermediate_size
    k = shape.num_experts_per_token or 1
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    inputs = 2 * h + (q + k * inter) // tp
    grads = (q + 2 * kv + 2 * k * inter) // tp + 2 * h
    return cb * (inputs + grads)


def _stage_activations(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mesh: ParallelDims, *,
                       start: int, layers: int, embedding: bool, head: bool, micro_batch_size: int,
                       checkpointing: bool) -> ActivationEstimate:
    """One micro-batch through this rank's layers: token ids on the first rank only, the labels, the
    final norm and the loss path on the last only."""
    moe = spec.moe
    if moe is not None and moe.num_dense_layers:
        moe = moe.model_copy(update=dict(num_dense_layers=max(0, min(start + layers, moe.num_dense_layers) - start)))
    cut = spec.model_copy(update=dict(num_layers=layers, moe=moe))
    est = mesh_activations(cut, training, impl, mesh, micro_batch_size=micro_batch_size,
                           checkpointing=checkpointing)
    dt = _recipe_dtypes(training, impl)
    tokens = micro_batch_size * _rank_seq_len(spec, training, mesh)
    h = spec.hidden_size or 0
    drop = 0 if embedding else tokens * INT64  # token ids (the embedding's backward)
    if not head:  # labels, the final norm's saved tensors and the head's input cast
        drop += tokens * (INT64 + rms_norm_per_token(h, dt) + (dt.compute * h if dt.input_casts else 0))
        est = est.model_copy(update=dict(logits_bytes=0, loss_transient_bytes=0, returned_logits_bytes=0))
    return est.model_copy(update=dict(saved_bytes=max(0, est.saved_bytes - drop)))


def split_layers(num_layers: int, pp: int, chunks: int = 1) -> tuple[int, ...] | None:
    """An uneven split for the search when pp x chunks does not divide the layers: whole chunks per rank,
    the extra ones on the middle ranks (the first and last ranks carry the embedding and the head).
    None when the split is even (or impossible: fewer chunks than ranks)."""
    units, parts = divmod(num_layers, chunks)
    if num_layers % (pp * chunks) == 0 or parts or units < pp:
        return None
    base, extra = divmod(units, pp)
    order = sorted(range(pp), key=lambda r: (r in (0, pp - 1), abs(r - (pp - 1) / 2)))
    counts = [base] * pp
    for r in order[:extra]:
        counts[r] += 1
    return tuple(c * chunks for c in counts)


def _placement(mesh: ParallelDims, rank: int, v_shape: bool) -> tuple[bool, bool]:
    """(holds the embedding, holds the head) on pipeline rank ``rank``."""
    last = 0 if v_shape else mesh.pp - 1
    return rank == 0, rank == last


def estimate_pipeline_memory(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, impl: Implementation,
                             mesh: ParallelDims, *, micro_batch_size: int, checkpointing: bool,
                             num_micro_batches: int) -> PipelineMemory:
    """Each pipeline rank's peak on ``mesh`` (module docstring). Without pp (ep alone) one stage."""
    assert mesh.world_size == hardware.world_size, "mesh and hardware disagree on the world size"
    check_mesh_support(spec, training, impl, mesh)
    mesh.check_layers(num_layers=spec.num_layers, num_experts=spec.num_experts)
    facts = load_schedules()[mesh.pp_schedule] if mesh.pp > 1 else load_schedules()["1f1b"]
    shard_world = mesh.dp_shard * mesh.cp
    dt = _recipe_dtypes(training, impl)
    tokens = micro_batch_size * _rank_seq_len(spec, training, mesh)
    h = spec.hidden_size or 0
    ep_experts = mesh.ep > 1 and bool(spec.num_experts)
    k = spec.num_experts_per_token or 0
    stages, start = [], 0
    for rank, layers in enumerate(mesh.stage_layers(spec.num_layers or 1)):
        embedding, head = _placement(mesh, rank, facts.v_shape)
        where = dict(start=start, layers=layers, embedding=embedding, head=head)
        held = spec_for_states = _stage_spec(spec, mesh, **where, expert_divisor=1 if ep_experts else None)
        states = model_states(spec_for_states, training, impl, shard_world)
        if facts.param_copies > 1:
            states = states.model_copy(update=dict(params=states.params * facts.param_copies))
        if ep_experts:  # FSDP's unsharded block: E/ep experts
            held = _stage_spec(spec, mesh, **where, expert_divisor=mesh.ep)
        buffers = _strategy_buffers(held, training, impl, shard_world, checkpointing=checkpointing)
        if held is not spec_for_states:
            grads_end = _strategy_buffers(spec_for_states, training, impl, shard_world,
                                          checkpointing=checkpointing).grads_at_backward_end
            buffers = buffers.model_copy(update=dict(grads_at_backward_end=grads_end))
        one = _stage_activations(spec, training, impl, mesh, **where, micro_batch_size=micro_batch_size,
                                 checkpointing=checkpointing)
        count = in_flight(mesh.pp_schedule, rank=rank, pp=mesh.pp, micro_batches=num_micro_batches,
                          chunks=mesh.chunks_per_rank) if mesh.pp > 1 else Fraction(1)
        saved = int(one.saved_bytes * count)
        if mesh.pp > 1 and facts.w_deferred:
            saved += facts.w_held * tokens * layers * _w_bytes_per_token(spec, training, impl, mesh.tp)
        acts = one.model_copy(update=dict(saved_bytes=saved))
        p2p = 2 * tokens * h * dt.residual if mesh.pp > 1 else 0  # receive buffers: activation and gradient
        moe_layers = layers - ((spec.moe.num_dense_layers if spec.moe else 0) and
                               max(0, min(start + layers, spec.moe.num_dense_layers) - start))
        a2a = 2 * k * tokens * h * dt.compute if ep_experts and moe_layers else 0  # send + receive of one exchange
        ring = ring_buffer_bytes(spec, training, mesh, micro_batch_size=micro_batch_size)
        buffers = buffers.model_copy(update=dict(persistent=buffers.persistent + p2p,
                                                 in_backward=buffers.in_backward + ring + a2a))
        memory = memory_at_moments(states, acts, buffers, training, impl, world=shard_world)
        imbalance = 0
        if ep_experts and moe_layers:  # the busiest rank's extra routed rows, all in-flight micro-batches
            rows = k * tokens * (routing_imbalance() - 1)
            per_row = dt.compute * (2 * h + 4 * (spec.intermediate_size or 0))
            imbalance = int(rows * per_row * (1 if checkpointing else moe_layers) * float(max(count, 1)))
        stages.append(StageMemory(rank=rank, num_layers=layers, embedding=embedding, head=head,
                                  in_flight=float(count), imbalance_bytes=imbalance, memory=memory))
        start += layers
    return PipelineMemory(stages=tuple(stages))
