"""Time of one optimizer step on a device mesh (dp_replicate x dp_shard x cp x tp).

The same terms and the same ``StepTime`` as the data-parallel model (``advisor.estimate.step_time``,
whose FLOP count, utilisation and ring formulas this module reuses), with each mesh dimension's
traffic on the link it uses. Ranks are laid out torchtitan's way: tp innermost, then cp, then
dp_shard, then dp_replicate, so a group of ``k`` consecutive-dimension ranks spans
``ceil(k x stride / gpus_per_node)`` nodes.

- Compute: one replica's FLOPs for its micro-batch (``count_flops``) split over tp x cp ranks.
  Utilisation is read at the per-rank matmul shape (width / tp, tokens / cp).
- TP with sequence parallelism (Korthikanti et al. 2022, section 4.2.2): per block, forward runs two
  all-gathers and two reduce-scatters of the b x s/cp x h activations in the compute dtype, and
  backward the same again (plus the recomputed forward under checkpointing). They sit on the
  critical path (no async TP: torchtitan's ``enable_async_tensor_parallel`` is not modelled), on the
  intra-node link; a TP group across nodes pays the per-GPU NIC share instead (a heavy penalty).
  Without sequence parallelism (transformers' plans, what ``wrap()`` runs) each pair is one
  all-reduce of the same tensor, which moves the same bytes (a ring all-reduce is a reduce-scatter
  then an all-gather, Patarasuk and Yuan 2009), so the time is the same.
- CP ring attention (Liu et al. 2023, "Ring Attention"; torch ``context_parallel``): cp - 1 steps
  per block, each passing one key/value chunk (b x s/cp x 2 x kv-width/tp); backward passes the
  chunk and its gradients (2x). Overlapped with that block's attention compute, so only the excess
  is exposed.
- FSDP2 on the dp_shard x cp ranks: all-gathers of the per-TP-rank parameters, reduce-scatters of
  their gradients, as the data-parallel model times them, on that group's links. HSDP adds one
  all-reduce of the gradient shard across the dp_replicate replicas (inter-node), hideable under
  the last backward (Zhao et al. 2023, "PyTorch FSDP", section 3.2.2).
- Optimizer step on the rank's shard (memory-bound, as in the data-parallel model).
- ``--float8``: the data-parallel model's terms on the rank's share (``advisor.estimate.float8_time``);
  sequence-parallel all-gathers move fp8 (torchao's Float8 TP styles), reduce-scatters bf16.
"""

from __future__ import annotations

import math

from advisor.estimate.accumulation import reduces_once_a_step
from advisor.estimate.activations import shape_of
from advisor.estimate.model_parallel import tp_rank_spec
from advisor.estimate.strategy_buffers import fsdp2_reduce_bytes
from advisor.estimate.step_time import (GB, RING_FACTOR, TFLOPS, Collective, StepTime, Traffic, count_flops,
                                        elementwise_step_notes, elementwise_time, peak_tflops)
from advisor.hardware.cluster import Hardware
from advisor.hardware.efficiency import EfficiencyProfile, load_efficiency
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def group_collective_s(op: Collective, nbytes: float, hw: Hardware, eff: EfficiencyProfile, *, size: int,
                       stride: int, count: int = 1) -> float:
    """Ring (hierarchical across nodes) time of ``count`` collectives over ``nbytes`` in a group of
    ``size`` ranks ``stride`` apart. Inside a node: the intra-node ring; across nodes: 1/r of the
    bytes per GPU over its share of the node's NICs (the other groups use the other GPUs' shares)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    g, comm = hw.gpus_per_node, eff.communication
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    nodes = math.ceil(size / per_node)
    factor = RING_FACTOR[op]
    intra = hw.intra_node_link
    seconds = 0.0
    if per_node > 1:
        intra_bw = intra.bandwidth_gbps * GB * comm.intra_node_efficiency
        seconds += factor * (per_node - 1) / per_node * nbytes / intra_bw
        seconds += factor * (per_node - 1) * count * intra.latency_us * 1e-6
    if nodes > 1:
        inter = hw.inter_node_link
        assert inter is not None, "a group across nodes needs an inter-node link"
        nic_bw = inter.bandwidth_gbps * GB * comm.inter_node_efficiency * comm.nic_ports(inter.name, g) / g
        seconds += factor * (nodes - 1) / nodes * (nbytes / per_node) / nic_bw
        seconds += factor * (nodes - 1) * count * inter.latency_us * 1e-6
    return seconds


def tp_comm_s(spec: ModelSpec, hw: Hardware, training: TrainingConfig, eff: EfficiencyProfile, mesh: ParallelDims, *,
              micro_batch_size: int, checkpointing: bool) -> float:
    """Sequence-parallel all-gathers and reduce-scatters of one micro-batch, all blocks."""
    if mesh.tp == 1:
        return 0.0
    shape = shape_of(spec)
    activation = micro_batch_size * training.seq_len // mesh.cp * shape.hidden_size * training.compute_bytes
    passes = 3 if checkpointing else 2  # forward, backward, and the recomputed forward
    # Two all-gathers and two reduce-scatters of the whole b x s x h activation per block and pass: each
    # op's bytes are both collectives' (group_collective_s times nbytes, count only adds latencies).
    # --float8: torchao's Float8 TP styles gather fp8 activations and gradients (profiles/float8.json).
    gathered = activation // training.compute_bytes if training.float8 else activation
    one = sum(group_collective_s(op, 2 * nbytes, hw, eff, size=mesh.tp, stride=1, count=2)
              for op, nbytes in (("all_gather", gathered), ("reduce_scatter", activation)))
    return passes * shape.num_layers * one


def cp_ring_s(spec: ModelSpec, hw: Hardware, training: TrainingConfig, eff: EfficiencyProfile, mesh: ParallelDims, *,
              micro_batch_size: int, attention_s: float, checkpointing: bool) -> tuple[float, float]:
    """(all ring traffic, its part not hidden under attention) of one micro-batch, all blocks."""
    if mesh.cp == 1:
        return 0.0, 0.0
    shape = shape_of(spec)
    chunk = (micro_batch_size * training.seq_len // mesh.cp * 2 * (shape.num_kv_heads // mesh.tp)
             * shape.head_dim * training.compute_bytes)
    # A point-to-point step moves one chunk per rank: one "all_gather" ring step of cp ranks moves
    # (cp - 1)/cp of cp chunks, i.e. the same bytes as cp - 1 steps.
    per_pass = group_collective_s("all_gather", chunk * mesh.cp, hw, eff, size=mesh.cp, stride=mesh.tp,
                                  count=mesh.cp - 1)
    passes = (2 if checkpointing else 1) + 2  # forward (and its recompute) + backward with gradients
    total = passes * shape.num_layers * per_pass
    return total, max(0.0, total - attention_s)


def _fsdp_traffic(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation,
                  eff: EfficiencyProfile, mesh: ParallelDims) -> Traffic:
    local = tp_rank_spec(spec, mesh.tp)
    gather = training.compute_bytes
    grad = fsdp2_reduce_bytes(training)  # the MixedPrecisionPolicy's reduce_dtype (the recipe's)
    blocks = shape_of(spec).num_layers + 1
    size, stride = mesh.dp_shard * mesh.cp, mesh.tp

    def run(op: Collective, nbytes: float) -> float:
        return group_collective_s(op, nbytes, hw, eff, size=size, stride=stride, count=blocks)

    gathered = gather * local.total_params
    if training.float8_all_gather:
        from advisor.estimate.float8_time import float8_gather_saving_bytes

        gathered -= float8_gather_saving_bytes(spec, training, tp=mesh.tp)
    forward = run("all_gather", gathered)
    reduce = run("reduce_scatter", grad * local.total_params)
    last = 0.0
    if mesh.dp_replicate > 1:  # HSDP: the gradient shard all-reduced across replicas
        shard = grad * local.total_params / size
        last = group_collective_s("all_reduce", shard, hw, eff, size=mesh.dp_replicate,
                                  stride=size * mesh.tp, count=1)
    if reduces_once_a_step(training, impl):  # FSDP's sync off until the last micro-batch (accelerate's no_sync)
        backward = run("all_gather", gathered) if impl.reshard_after_forward else 0.0
        return Traffic(fwd=forward, bwd=backward, last_bwd=reduce + last)
    backward = reduce
    if impl.reshard_after_forward:
        backward += run("all_gather", gathered)
    return Traffic(fwd=forward, bwd=backward, last_bwd=last)


def tp_matmul_width(hidden_size: int, tp: int) -> int:
    """The model width whose matmuls match one TP rank's in size, for the utilisation's size factor.

    The size factor is fitted on whole models (``profiles/efficiency.json``), whose weight matrices grow as
    width x width; a TP rank multiplies by a width x width/tp shard (Megatron's column / row split keeps the
    other dimension whole), as many elements as a dense model of width / sqrt(tp) holds, not width / tp."""
    return max(1, round(hidden_size / math.sqrt(tp)))


def estimate_mesh_step_time(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, impl: Implementation,
                            mesh: ParallelDims, *, micro_batch_size: int, checkpointing: bool,
                            gradient_accumulation_steps: int = 1,
                            efficiency: EfficiencyProfile | None = None) -> StepTime:
    """Seconds of one optimizer step on ``mesh`` (module docstring)."""
    eff = efficiency or load_efficiency()
    accumulation = gradient_accumulation_steps
    shape = shape_of(spec)
    split = mesh.model_parallel
    replica_tokens = micro_batch_size * training.seq_len
    flops = count_flops(spec, tokens=replica_tokens, seq_len=training.seq_len, checkpointing=checkpointing,
                        selective=training.activation_checkpointing == "selective", target_len=training.target_len,
                        head_recompute=training.chunked_nll)
    peak, peak_note = peak_tflops(hardware.gpu, training)
    util = eff.compute.utilisation(hardware.gpu.name, hidden_size=tp_matmul_width(shape.hidden_size, mesh.tp),
                                   tokens_per_micro_batch=max(1, replica_tokens // mesh.cp),
                                   rate=training.precision_info.peak_rate)
    rate = peak * TFLOPS * util
    ew = elementwise_time(spec, hardware, training, eff, tokens=replica_tokens, checkpointing=checkpointing,
                          flops=flops, rate=rate, peak=peak * TFLOPS)
    ew_fwd, ew_bwd = (ew.forward, ew.backward) if ew else (0.0, 0.0)
    fwd_s = flops.forward / split / rate + ew_fwd / split
    bwd_s = (flops.backward + flops.recompute) / split / rate + ew_bwd / split
    f8: tuple[float, float, str] = (0.0, 0.0, "")
    if training.float8:
        from advisor.estimate.float8_time import float8_seconds

        f8 = float8_seconds(spec, hardware, training, impl, tokens=replica_tokens, checkpointing=checkpointing,
                            utilisation=util, bf16_tflops=peak, hardware_flops=flops.hardware / split,
                            hbm_efficiency=eff.optimizer_step.hbm_efficiency, tp=mesh.tp, cp=mesh.cp,
                            shards=mesh.dp_shard * mesh.cp)
    fwd_s, bwd_s = fwd_s + f8[0], bwd_s + f8[1]
    attention = 4 * shape.num_layers * shape.num_attention_heads * shape.head_dim * training.seq_len * replica_tokens
    attention_s = attention * (3 + (1 if checkpointing else 0)) / split / rate
    tp_s = tp_comm_s(spec, hardware, training, eff, mesh, micro_batch_size=micro_batch_size, checkpointing=checkpointing)
    ring_s, ring_exposed = cp_ring_s(spec, hardware, training, eff, mesh, micro_batch_size=micro_batch_size,
                                     attention_s=attention_s, checkpointing=checkpointing)
    fsdp = _fsdp_traffic(spec, hardware, training, impl, eff, mesh)
    overlap = eff.communication.overlap_fraction
    comm_exposed = (fsdp.exposed_s(fwd_s=fwd_s, bwd_s=bwd_s, accumulation=accumulation, overlap=overlap)
                    + accumulation * (tp_s + ring_exposed))
    local = tp_rank_spec(spec, mesh.tp)
    cost = eff.optimizer_step
    optimizer = (local.trainable_params / (mesh.dp_shard * mesh.cp) * cost.bytes_per_param[training.optimizer]
                 / (hardware.gpu.hbm_bandwidth_gbps * GB * cost.hbm_efficiency))
    compute = accumulation * (fwd_s + bwd_s)
    step = compute + comm_exposed + optimizer
    tokens_gpu = max(1, replica_tokens * accumulation // split)
    model_flops = flops.model * accumulation / split
    notes = [n for n in (peak_note, f8[2]) if n]
    notes.extend(elementwise_step_notes(spec, hardware, training, eff, ew, passes=accumulation / split))
    notes.append(f"mesh {mesh.label}: tensor-parallel collectives exposed (no async TP), ring attention hidden "
                 "under attention compute up to its time")
    return StepTime(
        compute_s=compute, communication_s=fsdp.total_s(accumulation) + accumulation * (tp_s + ring_s),
        exposed_communication_s=comm_exposed, offload_s=0.0, exposed_offload_s=0.0, optimizer_s=optimizer,
        step_s=step, micro_batch_size=micro_batch_size, gradient_accumulation_steps=accumulation,
        world_size=hardware.world_size, tokens_per_gpu=tokens_gpu,
        tokens_per_s=replica_tokens * accumulation * mesh.dp / step, model_flops_per_gpu=model_flops,
        hardware_flops_per_gpu=flops.hardware * accumulation / split, peak_tflops=peak, utilisation=util,
        mfu=model_flops / (step * peak * TFLOPS), notes=tuple(notes),
    )
