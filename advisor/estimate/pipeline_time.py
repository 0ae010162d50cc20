"""Time of one optimizer step under pipeline (and expert) parallelism.

    estimate_pipeline_step_time(spec, hardware, training, impl, mesh, *, micro_batch_size, checkpointing,
                                num_micro_batches, efficiency=None) -> StepTime

The same ``StepTime`` as the data-parallel and mesh models (``advisor.estimate.step_time``,
``advisor.estimate.mesh_time``, whose FLOP count, utilisation and collective formulas this module
reuses). The step is the slowest pipeline rank's:

- Compute: m micro-batches through the rank with the most layers, its share of one replica's FLOPs
  (``count_flops``) over tp x cp ranks; TP collectives and ring attention per micro-batch as on a mesh.
- Bubble: ``bubble_coefficient x (p - 1) / v`` micro-batch times (``profiles/pipeline_schedules.json``:
  1F1B and GPipe (p - 1)/m of the compute, interleaved divided by v, ZB-H1 and DualPipeV a third,
  ZB-H2 and ZB-V about none). Idle time: in ``step_s``, said in the notes, in no other field.
- Point-to-point: each micro-batch sends its activation forward and its gradient backward across
  every chunk boundary, b x s/cp x h in the compute dtype (each TP rank sends the whole tensor:
  transformers' TP plans keep it replicated). Pipeline ranks are world/pp ranks apart: inside a node
  when that is below the node's GPUs, else over the GPU's share of the node's NICs. Sends are
  asynchronous (batch_isend_irecv); the fill and drain, 2 (p - 1) v hops, are exposed.
- Expert parallelism: per MoE layer and pass (forward, backward, and the recomputed forward under
  checkpointing), one all-to-all dispatch and one combine of k x tokens rows of width h, (ep - 1)/ep
  of them leaving the rank: on NVLink while tp x ep ranks fit a node, else the part that leaves the
  node over the NIC share (bandwidths: ``profiles/interconnects.json``, discounted by the measured
  bus efficiency of ``profiles/efficiency.json``). Exposed, except under DualPipeV, which overlaps one
  micro-batch's all-to-all with another's compute (DeepSeek-V3 report, section 3.2.1), up to that compute.
- FSDP2 under pipelining gathers each stage once per step and reduce-scatters its gradients once,
  after the last backward (torch/distributed/pipelining/stage.py ``perform_reduce_grad``; see
  ``advisor.estimate.pipeline``): the gather hides under the first forward, the reduce-scatter is exposed.
  With ep alone (no pp) FSDP2 runs per micro-batch as on any mesh (``advisor.estimate.mesh_time``),
  over the rank's E/ep experts.
"""

from __future__ import annotations

from advisor.estimate.activations import shape_of
from advisor.estimate.mesh_time import cp_ring_s, group_collective_s, tp_comm_s, tp_matmul_width
from advisor.estimate.pipeline import layers_cut, stage_spec
from advisor.estimate.pipeline_schedules import load_schedules
from advisor.estimate.step_time import (GB, TFLOPS, StepTime, Traffic, count_flops, elementwise_step_notes,
                                        elementwise_time, peak_tflops)
from advisor.hardware.cluster import Hardware
from advisor.hardware.efficiency import EfficiencyProfile, load_efficiency
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig


def p2p_hop_s(nbytes: float, hw: Hardware, eff: EfficiencyProfile, *, stride: int) -> float:
    """One point-to-point send of ``nbytes`` between ranks ``stride`` apart."""
    comm = eff.communication
    if stride < hw.gpus_per_node:
        link = hw.intra_node_link
        return nbytes / (link.bandwidth_gbps * GB * comm.intra_node_efficiency) + link.latency_us * 1e-6
    inter = hw.inter_node_link
    assert inter is not None, "pipeline ranks across nodes need an inter-node link"
    g = hw.gpus_per_node
    nic = inter.bandwidth_gbps * GB * comm.inter_node_efficiency * comm.nic_ports(inter.name, g) / g
    return nbytes / nic + inter.latency_us * 1e-6


def all_to_all_s(nbytes: float, hw: Hardware, eff: EfficiencyProfile, *, size: int, stride: int) -> float:
    """One all-to-all in which each of ``size`` ranks (``stride`` apart) holds ``nbytes`` for all of
    them: (size - 1)/size leaves the rank, the part for ranks on other nodes over its NIC share."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    g, comm = hw.gpus_per_node, eff.communication
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    intra = hw.intra_node_link
    seconds = 0.0
    if per_node > 1:
        seconds += nbytes * (per_node - 1) / size / (intra.bandwidth_gbps * GB * comm.intra_node_efficiency)
        seconds += intra.latency_us * 1e-6
    if size > per_node:
        inter = hw.inter_node_link
        assert inter is not None, "an all-to-all across nodes needs an inter-node link"
        nic = inter.bandwidth_gbps * GB * comm.inter_node_efficiency * comm.nic_ports(inter.name, g) / g
        seconds += nbytes * (size - per_node) / size / nic + inter.latency_us * 1e-6
    return seconds


def estimate_pipeline_step_time(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, impl: Implementation,
                                mesh: ParallelDims, *, micro_batch_size: int, checkpointing: bool,
                                num_micro_batches: int, efficiency: EfficiencyProfile | None = None) -> StepTime:
    """Seconds of one optimizer step on ``mesh`` with pp and/or ep (module docstring)."""
    eff = efficiency or load_efficiency()
    facts = load_schedules()[mesh.pp_schedule]
    m, p, v = num_micro_batches, mesh.pp, mesh.chunks_per_rank
    shape = shape_of(spec)
    layers = mesh.stage_layers(shape.num_layers)
    slowest = max(layers)
    split = mesh.model_parallel
    replica_tokens = micro_batch_size * training.seq_len
    flops = count_flops(spec, tokens=replica_tokens, seq_len=training.seq_len, checkpointing=checkpointing,
                        selective=training.activation_checkpointing == "selective", target_len=training.target_len)
    share = slowest / shape.num_layers
    peak, peak_note = peak_tflops(hardware.gpu, training)
    util = eff.compute.utilisation(hardware.gpu.name, hidden_size=tp_matmul_width(shape.hidden_size, mesh.tp),
                                   tokens_per_micro_batch=max(1, replica_tokens // mesh.cp),
                                   rate=training.precision_info.peak_rate)
    rate = peak * TFLOPS * util
    ew = elementwise_time(spec, hardware, training, eff, tokens=replica_tokens, checkpointing=checkpointing,
                          flops=flops, rate=rate, peak=peak * TFLOPS)
    ew_fwd, ew_bwd = (ew.forward, ew.backward) if ew else (0.0, 0.0)
    fwd_s = flops.forward * share / split / rate + ew_fwd * share / split
    bwd_s = (flops.backward + flops.recompute) * share / split / rate + ew_bwd * share / split
    cut = layers_cut(spec, slowest)
    attention = 4 * slowest * shape.num_attention_heads * shape.head_dim * training.seq_len * replica_tokens
    attention_s = attention * (3 + (1 if checkpointing else 0)) / split / rate
    tp_s = tp_comm_s(cut, hardware, training, eff, mesh, micro_batch_size=micro_batch_size, checkpointing=checkpointing)
    ring_s, ring_exposed = cp_ring_s(cut, hardware, training, eff, mesh, micro_batch_size=micro_batch_size,
                                     attention_s=attention_s, checkpointing=checkpointing)
    per_micro = fwd_s + bwd_s + tp_s + ring_exposed
    bubble = facts.bubble_coefficient * (p - 1) / v * per_micro if p > 1 else 0.0
    # Point-to-point: an activation and a gradient per chunk boundary and micro-batch.
    hop = 0.0
    if p > 1:
        activation = replica_tokens // mesh.cp * shape.hidden_size * training.compute_bytes
        hop = p2p_hop_s(activation, hardware, eff, stride=mesh.world_size // p)
    p2p_total = 2 * m * v * hop
    p2p_exposed = 2 * (p - 1) * v * hop
    # Expert parallelism: dispatch and combine per MoE layer and pass.
    a2a_total = a2a_exposed = 0.0
    if mesh.ep > 1 and spec.num_experts:
        dense = spec.moe.num_dense_layers if spec.moe else 0
        moe_layers = slowest if p > 1 else shape.num_layers - dense
        rows = (spec.num_experts_per_token or 1) * replica_tokens // mesh.cp
        one = all_to_all_s(rows * shape.hidden_size * training.compute_bytes, hardware, eff, size=mesh.ep,
                           stride=mesh.tp)
        passes = 2 * (2 + (1 if checkpointing else 0))  # dispatch + combine, per forward/backward/recompute
        a2a_total = m * moe_layers * passes * one
        hidden = m * (fwd_s + bwd_s) if mesh.pp_schedule == "dualpipev" else 0.0
        a2a_exposed = max(0.0, a2a_total - hidden)
    # FSDP2 under pipelining: one gather (hidden under the first forward) and one reduce-scatter a step.
    held = stage_spec(spec, mesh, start=0, layers=slowest, embedding=True, head=False,
                       expert_divisor=mesh.ep if mesh.ep > 1 and spec.num_experts else None)
    size = mesh.dp_shard * mesh.cp
    gather_b = 4 if training.precision == "fp32" else 2
    count = slowest + 1
    gather = group_collective_s("all_gather", gather_b * held.total_params, hardware, eff, size=size,
                                stride=mesh.tp, count=count)
    scatter = group_collective_s("reduce_scatter", training.param_bytes * held.total_params, hardware, eff,
                                 size=size, stride=mesh.tp, count=count)
    replicate = 0.0
    if mesh.dp_replicate > 1:
        replicate = group_collective_s("all_reduce", training.param_bytes * held.total_params / size, hardware, eff,
                                       size=mesh.dp_replicate, stride=size * mesh.tp, count=1)
    if p > 1:
        fsdp_exposed = max(0.0, gather - fwd_s) + scatter + replicate
        fsdp_total = gather + scatter + replicate
    else:  # ep alone: FSDP2 per micro-batch as on any mesh (advisor.estimate.mesh_time), over E/ep experts
        backward = scatter + (gather if impl.reshard_after_forward else 0.0)
        traffic = Traffic(fwd=gather, bwd=backward, last_bwd=replicate)
        fsdp_exposed = traffic.exposed_s(fwd_s=fwd_s, bwd_s=bwd_s, accumulation=m,
                                overlap=eff.communication.overlap_fraction)
        fsdp_total = traffic.total_s(m)
    compute = m * (fwd_s + bwd_s)
    exposed = m * (tp_s + ring_exposed) + p2p_exposed + a2a_exposed + fsdp_exposed
    cost = eff.optimizer_step
    optimizer = (held.total_params / size * cost.bytes_per_param[training.optimizer]
                 / (hardware.gpu.hbm_bandwidth_gbps * GB * cost.hbm_efficiency))
    step = compute + bubble + exposed + optimizer
    gpus_per_replica = split * p
    model_flops = flops.model * m / gpus_per_replica
    notes = [n for n in (peak_note,) if n]
    passes = m + (facts.bubble_coefficient * (p - 1) / v if p > 1 else 0.0)  # the bubble is micro-batch times too
    notes.extend(elementwise_step_notes(spec, hardware, training, eff, ew, passes=passes * share / split))
    if training.float8:  # advisor.estimate.float8_time models data-parallel and mesh steps, not pipeline stages
        notes.append("--float8 is not modelled on a pipeline mesh: this step is timed in bf16")
    notes.append(f"pipeline {mesh.label}: {m} micro-batches a step, bubble {bubble:.2f} s "
                 f"({facts.bubble_coefficient:.2g} x (p - 1)/v micro-batch times), p2p fill and drain exposed "
                 f"{p2p_exposed:.3f} s" + (f", expert all-to-all {a2a_total:.2f} s ({a2a_exposed:.2f} s exposed)"
                                           if a2a_total else ""))
    return StepTime(
        compute_s=compute, communication_s=m * (tp_s + ring_s) + p2p_total + a2a_total + fsdp_total,
        exposed_communication_s=exposed, offload_s=0.0, exposed_offload_s=0.0, optimizer_s=optimizer,
        step_s=step, micro_batch_size=micro_batch_size, gradient_accumulation_steps=m,
        world_size=hardware.world_size, tokens_per_gpu=max(1, replica_tokens * m // gpus_per_replica),
        tokens_per_s=replica_tokens * m * mesh.dp / step, model_flops_per_gpu=model_flops,
        hardware_flops_per_gpu=flops.hardware * m / gpus_per_replica, peak_tflops=peak, utilisation=util,
        mfu=model_flops / (step * peak * TFLOPS), notes=tuple(notes),
    )
