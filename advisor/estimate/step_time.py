"""Time of one optimizer step (micro-batch x accumulation) for one strategy on one cluster.

``estimate_step_time(spec, hardware, training, impl, micro_batch_size=, checkpointing=,
gradient_accumulation_steps=) -> StepTime`` is a pure function of validated inputs and the
efficiency profile (``advisor.hardware.efficiency``); it returns seconds. The model, term by term:

- Compute. Training FLOPs per token = 6 x matmul parameters (active ones for MoE; the input
  embedding lookup excluded when untied) + 12 x layers x query width x sequence for attention
  (Narayanan et al. 2021, arXiv:2104.04473, appendix; Chinchilla, Hoffmann et al. 2022, appendix F).
  Causal attention is *not* halved, the convention of the published MFUs we calibrate on, so
  utilisations stay comparable. Frozen parameters skip their weight-gradient matmul (4 instead of 6).
  Checkpointing adds one forward of the blocks (not of the output head, which no checkpointing
  wrapper covers). Encoder-decoders (T5, BART): each stack's parameters on the
  tokens it processes, the decoder's on ``--target-len`` target tokens (``_encdec_forward_terms``). Time = FLOPs / (peak x utilisation), peak = bf16 for bf16 and
  bf16-mixed, fp16 for fp16-mixed, and the *FP32* (not TF32) rate for fp32, PyTorch's default
  (``torch.backends.cuda.matmul.allow_tf32`` is False since 1.12).
- Communication: ring collectives, alpha-beta. Within a node each GPU moves factor x (g-1)/g x
  bytes over its link; across nodes the cross-node phase moves 1/g of that over the node's NIC
  ports (hierarchical reduce-scatter / all-reduce / all-gather, as NCCL's rings achieve with one
  NIC per GPU). Latency: factor x (N-1) x link latency per collective (DDP 25 MB buckets, FSDP one
  collective per block per direction). Which collectives run follows the strategy table's flags:
  DDP all-reduces gradients once per step (``no_sync``); ZeRO-1 adds an all-gather of the updated
  parameters after the step; DeepSpeed ZeRO-2 reduce-scatters every micro-batch then all-gathers
  parameters after the step; FSDP all-gathers parameters before forward (and again before backward
  when it reshards) and reduce-scatters gradients every micro-batch. Gradient dtype: fp32 under the
  torch recipe (fp32 parameters; FSDP2 reduce_dtype=fp32), bf16/fp16 under DeepSpeed. Overlap:
  gradient collectives hide under ``overlap_fraction`` of backward, prefetched all-gathers under
  forward/backward; post-step all-gathers are exposed.
- Offload: PCIe transfers of shards (parameters up, gradients down) overlap like collectives; the
  CPU optimizer step (per-node CPU-Adam throughput, shared by the node's GPUs) and the upload of
  updated parameters after it are exposed.
- A 4-bit base (``--quantize nf4|fp4``, QLoRA): bitsandbytes dequantises every block weight to the
  compute dtype in forward, again in backward and again in checkpointing's recompute, a memory-bound
  kernel: bytes (``quantized.dequantization_bytes``) / (HBM bandwidth x efficiency), added to forward
  and backward per micro-batch, whatever its tokens.
- LoRA adapters: their products' FLOPs are in the count above; the bytes their memory-bound ops move
  (``adapter_time``: PEFT's dropout, skinny products, scaling and add) / (HBM bandwidth x efficiency) add.
- Autocast over fp32 weights (bf16-mixed under DDP, ZeRO-1, DataParallel, one GPU): every weight cast to the
  compute dtype a forward (and a recompute), its gradient cast back in backward (``autocast_time``), bytes /
  (HBM bandwidth x efficiency).
- Float8 linears (``--float8``, torchao): their products at the fp8 peak, the dynamic casts' bytes at HBM
  bandwidth, fp8 weights in FSDP's all-gather (``advisor.estimate.float8_time``).
- ``--compile``: the HBM bytes inductor's fusion removes from each block's elementwise ops
  (``compile_time``) / (HBM bandwidth x the optimizer step's efficiency), taken off forward and backward.
- HBM bandwidth: a GPU that takes another GPU's fitted utilisation (the H200 the H100 SXM's, the 40 GB and
  PCIe A100s the A100-80GB SXM's) moves its blocks' eager elementwise kernels at its own bandwidth
  (``bandwidth_time``: compile_time's eager bytes x (1 / its bandwidth - 1 / the fit's) / efficiency).
- Optimizer step on the GPU: memory-bound, bytes per parameter / (HBM bandwidth x efficiency).
- DataParallel: every micro-batch broadcasts parameters from GPU0, reduces gradients to GPU0 and
  gathers logits to GPU0, none of it overlapped; GPU0 alone steps the optimizer; utilisation times
  a documented single-process penalty.

- Host floor (``host_time``): a micro-batch takes at least the host time of the operators it launches from Python
  (counted per block for its family, x seconds an operator fitted on an H200 host); not under ``--compile`` (not
  measured). Data-parallel plans only: the mesh and pipeline estimators (large models) leave it out.

Not modelled: launch gaps within a step above the floor, data loading, compute slowdown from concurrent NCCL kernels,
the first all-gather of a step that nothing can hide, stragglers.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.accumulation import reduces_once_a_step
from advisor.estimate.activations import shape_of
from advisor.estimate.activations_loss import NLL_CHUNK
from advisor.estimate.adapter_time import adapter_note, adapter_s
from advisor.estimate.autocast_time import autocast_cast_note, autocast_cast_s, one_rank_cast_note, one_rank_cast_s
from advisor.estimate.host_time import host_floor_note, host_floor_s
from advisor.estimate.quantized import dequantization_note, dequantization_step_s, stored_param_bytes
from advisor.estimate.strategy_buffers import fsdp2_reduce_bytes
from advisor.frozen import validated_copy
from advisor.hardware.efficiency import EfficiencyProfile, load_efficiency
from advisor.hardware.cluster import Hardware
from advisor.model.block_kinds import kind_of
from advisor.model.lora import LoraConfig
from advisor.model.selective import selective_kept
from advisor.model.spec import ModelSpec
from advisor.hardware.catalog import GpuProfile, load_catalog
from advisor.strategies import Implementation
from advisor.training import TrainingConfig
from advisor.units import GB, TFLOPS

Collective = Literal["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
# Bytes each GPU sends per byte of payload in a ring collective, times (N-1)/N: an all-reduce is a
# reduce-scatter then an all-gather (Patarasuk & Yuan 2009; nccl-tests doc/PERFORMANCE.md, bus bandwidth).
RING_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepTime(_Frozen):
    """Seconds of one optimizer step and what they are made of (all per GPU unless 'global')."""

    compute_s: float = Field(ge=0, description="Forward + backward (+ recompute) of every micro-batch.")
    communication_s: float = Field(ge=0, description="All collectives of the step, hidden or not.")
    exposed_communication_s: float = Field(ge=0, description="Collective time not hidden behind compute.")
    offload_s: float = Field(ge=0, description="PCIe transfers + CPU optimizer step, hidden or not.")
    exposed_offload_s: float = Field(ge=0, description="Offload time not hidden behind compute.")
    optimizer_s: float = Field(ge=0, description="Optimizer step on the GPU (0 when on the CPU).")
    step_s: float = Field(gt=0, description="One optimizer step: micro-batch x accumulation.")
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    world_size: int = Field(ge=1)
    tokens_per_gpu: int = Field(ge=1, description="Tokens one GPU processes per step.")
    tokens_per_s: float = Field(gt=0, description="Global: all GPUs.")
    model_flops_per_gpu: float = Field(ge=0, description="Per step, without recompute.")
    hardware_flops_per_gpu: float = Field(ge=0, description="Per step, recompute included.")
    peak_tflops: float = Field(gt=0, description="Datasheet peak used for this precision.")
    utilisation: float = Field(gt=0, le=1, description="Matmul utilisation assumed.")
    mfu: float = Field(ge=0, lt=1, description="model FLOPs / (step_s x peak), per GPU.")
    notes: tuple[str, ...] = Field(default=(), description="Assumptions made for this estimate.")

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.world_size

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.world_size


class FlopCount(_Frozen):
    forward: float = Field(ge=0, description="One forward pass.")
    backward: float = Field(ge=0, description="Input and weight gradients.")
    recompute: float = Field(ge=0, description="Checkpointing's extra forward.")

    @property
    def model(self) -> float:
        return self.forward + self.backward

    @property
    def hardware(self) -> float:
        return self.model + self.recompute

    @property
    def hardware_backward(self) -> float:
        return self.backward + self.recompute


def matmul_params(spec: ModelSpec) -> int:
    """Parameters that take part in a matmul per token: active ones, minus an untied input embedding."""
    lookup = spec.embedding_params if (spec.embedding_params and spec.tied_embeddings is False) else 0
    return max(spec.active_params - lookup, 1)


def output_head_params(spec: ModelSpec) -> int:
    """Parameters of the output projection to the vocabulary: the head, or the embedding matrix when tied."""
    if spec.head_params:
        return spec.head_params
    return (spec.embedding_params or 0) if spec.tied_embeddings else 0


def _encdec_forward_terms(spec: ModelSpec, *, tokens: int, seq_len: int, target_len: int) -> tuple[int, int]:
    """(parameter x token products, attention-score FLOPs) of one encoder-decoder forward, ``tokens``
    source tokens of ``seq_len``-long samples, each with ``target_len`` target tokens.

    The 6N rule (Kaplan et al. 2020, arXiv:2001.08361, section 2.1: C ~ 6 N tokens) applied per stack,
    each stack's parameters on the tokens they process: the encoder's layers on the source tokens; the
    decoder's layers on the target tokens, except its cross-attention k and v projections, which read
    the encoder's output (source tokens); the tied head on the target tokens. Attention scores as the
    decoder formula counts them (4 x query width x keys per query token, forward): the encoder's
    self-attention over the source, the decoder's self-attention over the target and its
    cross-attention from each target token over the source."""
    facts, shape = spec.encdec, shape_of(spec)
    assert facts is not None
    target_tokens = tokens // seq_len * target_len
    head = spec.head_params or spec.embedding_params or 0  # tied (T5, BART): the embedding matrix is the head
    param_tokens = ((facts.encoder_params + facts.cross_kv_params) * tokens
                    + (facts.decoder_params - facts.cross_kv_params + head) * target_tokens)
    q_width = shape.num_attention_heads * shape.head_dim
    attention = 4 * q_width * (facts.num_encoder_layers * seq_len * tokens
                               + facts.num_decoder_layers * (target_len + seq_len) * target_tokens)
    return param_tokens, attention


def count_flops(spec: ModelSpec, *, tokens: int, seq_len: int, checkpointing: bool,
                selective: bool = False, target_len: int | None = None, lora: LoraConfig | None = None,
                head_recompute: bool = False) -> FlopCount:
    """Training FLOPs for ``tokens`` tokens of ``seq_len``-long samples (see module docstring);
    an encoder-decoder's decoder runs on ``target_len`` target tokens a sample (default ``seq_len``).
    Selective checkpointing recomputes the forward less the attention kernels and the base layers'
    products it kept (which ``lora``'s DoRA products move: ``advisor.model.selective``). ``head_recompute``: the
    loss checkpoints the head's product too (TRL's chunked_nll, ``TrainingConfig.chunked_nll``), so backward
    recomputes it, with or without the blocks' checkpointing."""
    shape = shape_of(spec)
    trainable_share = spec.trainable_params / spec.total_params
    if kind_of(spec).family == "encdec":
        param_tokens, attention_fwd = _encdec_forward_terms(spec, tokens=tokens, seq_len=seq_len,
                                                            target_len=target_len or seq_len)
    else:
        param_tokens = matmul_params(spec) * tokens
        attention_fwd = 4 * shape.num_layers * shape.num_attention_heads * shape.head_dim * seq_len * tokens
    forward = 2 * param_tokens + attention_fwd
    weight_grads = 2 * param_tokens * trainable_share
    backward = 2 * param_tokens + weight_grads + 2 * attention_fwd
    # Checkpointing wraps the blocks, not the output head: HF's GradientCheckpointingLayer is the decoder
    # layer, torchtitan's apply_ac wraps each TransformerBlock, llm-foundry's activation_checkpointing_fn
    # picks the MPTBlock; the head's product runs once (encoder-decoders: counted in full, as before).
    head_fwd = 0 if kind_of(spec).family == "encdec" else 2 * output_head_params(spec) * tokens
    recompute = forward - head_fwd if checkpointing else 0.0
    kept = selective_kept(spec, lora) if checkpointing and selective else None
    if kept is not None:  # the recompute skips the attention kernels and the base layers' products kept
        kept_params = sum(fan_in * fan_out for fan_in, fan_out in kept.linears)
        recompute = max(0.0, forward - head_fwd - attention_fwd - 2 * kept_params * shape.num_layers * tokens)
    if head_recompute:
        recompute += head_fwd
    return FlopCount(forward=forward, backward=backward, recompute=recompute)


def peak_tflops(gpu: GpuProfile, training: TrainingConfig) -> tuple[float, str | None]:
    """Dense peak for the training precision (the precision table's ``peak_rate``), and a note when a
    fallback was used."""
    rate = training.precision_info.peak_rate
    if rate == "fp32":
        return gpu.fp32_tflops, None
    if rate == "fp16":
        return (gpu.fp16_tflops or gpu.fp32_tflops), None
    if gpu.bf16_tflops is None:
        fallback = gpu.fp16_tflops or gpu.fp32_tflops
        return fallback, f"{gpu.name} has no bf16 tensor cores: timed at its fp16 rate (use --precision fp16-mixed)"
    return gpu.bf16_tflops, None


def collective_s(op: Collective, nbytes: float, hardware: Hardware, eff: EfficiencyProfile, *,
                 count: int = 1) -> float:
    """Ring (hierarchical across nodes) time of ``count`` collectives over ``nbytes`` in total."""
    world = hardware.world_size
    if world == 1 or nbytes <= 0:
        return 0.0
    comm = eff.communication
    factor = RING_FACTOR[op]
    g, n = hardware.gpus_per_node, hardware.nodes
    intra = hardware.intra_node_link
    intra_bw = intra.bandwidth_gbps * GB * comm.intra_node_efficiency
    seconds = factor * (g - 1) / g * nbytes / intra_bw + factor * (g - 1) * count * intra.latency_us * 1e-6
    if n > 1:
        inter = hardware.inter_node_link
        ports = comm.nic_ports(inter.name, g)
        nic_bw = inter.bandwidth_gbps * GB * comm.inter_node_efficiency * ports / g  # per GPU
        seconds += factor * (n - 1) / n * (nbytes / g) / nic_bw + factor * (n - 1) * count * inter.latency_us * 1e-6
    return seconds


def pcie_s(nbytes: float, hardware: Hardware, eff: EfficiencyProfile) -> float:
    link_name = eff.offload.pcie_link.get(hardware.gpu.name, eff.offload.default_pcie_link)
    link = load_catalog().interconnect(link_name)
    return nbytes / (link.bandwidth_gbps * GB * eff.offload.pcie_efficiency) if nbytes > 0 else 0.0


class Traffic(_Frozen):
    """Seconds of transfers by when they can run (read by the mesh and pipeline step times too)."""

    fwd: float = 0.0  # each micro-batch, hideable under forward
    bwd: float = 0.0  # each micro-batch, hideable under backward
    last_bwd: float = 0.0  # once per step, hideable under the last backward
    after_step: float = 0.0  # once per step, exposed

    def exposed_s(self, *, fwd_s: float, bwd_s: float, accumulation: int, overlap: float) -> float:
        """Seconds not hidden under ``overlap`` of each micro-batch's forward and backward compute."""
        per_micro = max(0.0, self.fwd - overlap * fwd_s) + max(0.0, self.bwd - overlap * bwd_s)
        last = max(0.0, self.bwd + self.last_bwd - overlap * bwd_s) - max(0.0, self.bwd - overlap * bwd_s)
        return accumulation * per_micro + last + self.after_step

    def total_s(self, accumulation: int) -> float:
        """All the seconds of transfers of a step of ``accumulation`` micro-batches, hidden or not."""
        return accumulation * (self.fwd + self.bwd) + self.last_bwd + self.after_step


def _dtype_bytes(training: TrainingConfig, impl: Implementation) -> tuple[int, int]:
    """(gathered parameter bytes, reduced gradient bytes) per element."""
    gather = training.compute_bytes
    # the torch engine reduces gradients in the trainable parameters' dtype (PEFT's fp32 adapters: fp32)
    grad = training.trainable_param_bytes if impl.engine == "torch" else training.compute_bytes
    return gather, grad


def _collectives(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation,
                 eff: EfficiencyProfile) -> Traffic:
    gather, grad = _dtype_bytes(training, impl)
    trainable = spec.trainable_params
    blocks = shape_of(spec).num_layers + 1  # one FSDP unit per block plus the root
    grad_bytes = grad * trainable
    if impl.engine == "torch":
        buckets = max(1, math.ceil(grad_bytes / eff.communication.ddp_bucket_bytes))
    else:  # one collective per DeepSpeed reduce bucket (the size our exported configs write)
        from advisor.estimate.buckets import deepspeed_buckets  # loaded only for that engine

        buckets = max(1, math.ceil(trainable / deepspeed_buckets(spec, training.zero).reduce_elements))

    def run(op: Collective, nbytes: float, count: int) -> float:
        return collective_s(op, nbytes, hw, eff, count=count)

    if impl.shard_params:  # FSDP / ZeRO-3: gather per block, reduce-scatter per block
        gathered = stored_param_bytes(spec, training, bytes_per_param=gather)  # --quantize: packed weights
        if training.float8_all_gather:  # 1 B a converted weight (imported only when asked: start-up)
            from advisor.estimate.float8_time import float8_gather_saving_bytes

            gathered -= float8_gather_saving_bytes(spec, training)
        forward = run("all_gather", gathered, blocks)
        if impl.engine == "torch":  # FSDP2 reduce-scatters in its MixedPrecisionPolicy's reduce_dtype (the recipe's)
            grad_bytes = fsdp2_reduce_bytes(training) * trainable
        reduce = run("reduce_scatter", grad_bytes, blocks)
        backward = run("all_gather", gathered, blocks) if impl.reshard_after_forward else 0.0
        if reduces_once_a_step(training, impl):  # FSDP's sync off until the last micro-batch (accelerate's no_sync)
            return Traffic(fwd=forward, bwd=backward, last_bwd=reduce)
        return Traffic(fwd=forward, bwd=backward + reduce)
    if impl.shard_grads:  # DeepSpeed ZeRO-2: reduce-scatter each micro-batch, gather updated params
        return Traffic(bwd=run("reduce_scatter", grad_bytes, buckets), after_step=run("all_gather", gather * trainable, buckets))
    all_reduce = run("all_reduce", grad_bytes, buckets)
    if impl.shard_optimizer:  # ZeRO-1: owners broadcast updated parameters (torch: fp32; DeepSpeed: bf16)
        updated = (training.trainable_param_bytes if impl.engine == "torch" else gather) * trainable
        return Traffic(last_bwd=all_reduce, after_step=run("all_gather", updated, buckets))
    return Traffic(last_bwd=all_reduce)


def chunked_head_gather_s(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation,
                          eff: EfficiencyProfile, *, tokens: int) -> float:
    """Seconds each micro-batch of ``tokens`` waits on TRL's gathers of the head under DeepSpeed ZeRO-3: its
    chunked_nll reads ``lm_head.weight`` itself, so it wraps each 256-token chunk's matmul in
    ``deepspeed.zero.GatheredParameters`` (trl/trainer/sft_trainer.py ``_maybe_gather_lm_head_ctx``,
    huggingface/trl#5873), a blocking all-gather of the whole head, in forward and again in backward's
    recomputation, where ZeRO-3's own hooks gather a module once each way (``_collectives`` counts those two). An
    untied head only: a head tied to the embeddings may still be gathered (the PR skips a parameter ZeRO-3 holds
    AVAILABLE), not counted. Zero on any other engine, stage or loss."""
    if not (training.chunked_nll and impl.engine == "deepspeed" and impl.shard_params and spec.head_params):
        return 0.0
    chunks = -(-tokens // NLL_CHUNK)
    return (2 * chunks - 2) * collective_s("all_gather", spec.head_params * training.compute_bytes, hw, eff, count=1)


def _cpu_rate(hw: Hardware, training: TrainingConfig, impl: Implementation, eff: EfficiencyProfile) -> float:
    """Parameters a second a node's CPU optimizer steps (``_offload``): ``--cpu-step-rate`` per process when given
    (under the node's memory bandwidth on the torch engine), else the measured defaults."""
    if training.cpu_step_rate is not None:
        given = training.cpu_step_rate * hw.gpus_per_node
        if impl.engine != "torch":
            return given
        return min(given, eff.offload.host_bandwidth_step_rate(gpu=hw.gpu.name, state_bytes=training.param_bytes))
    if impl.engine == "torch":  # torch.optim on the CPU, one thread a process (the launchers' OMP_NUM_THREADS=1)
        return eff.offload.torch_cpu_step_rate(gpu=hw.gpu.name, processes=hw.gpus_per_node,
                                               state_bytes=training.param_bytes,
                                               implementation=training.optimizer_implementation)
    return eff.offload.cpu_adam_params_per_s_per_node[impl.engine]


def _offload(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation,
             eff: EfficiencyProfile) -> tuple[Traffic, float]:
    """PCIe transfers and the CPU optimizer step (seconds) of the offloading strategies."""
    if not impl.offloads:
        return Traffic(), 0.0
    world = hw.world_size
    gather, grad = _dtype_bytes(training, impl)
    trainable_shard = spec.trainable_params / world
    cpu_step = trainable_shard * hw.gpus_per_node / _cpu_rate(hw, training, impl, eff)
    if impl.offload_params:  # shards live on the CPU: upload before every gather, download gradients
        stored = training.param_bytes if impl.engine == "torch" else gather
        up = pcie_s(stored_param_bytes(spec, training, bytes_per_param=stored) / world, hw, eff)
        down = pcie_s(grad * trainable_shard, hw, eff)
        again = up if impl.reshard_after_forward else 0.0
        if reduces_once_a_step(training, impl):  # no_sync: the gradients leave at the last micro-batch
            return Traffic(fwd=up, bwd=again, last_bwd=down), cpu_step
        return Traffic(fwd=up, bwd=down + again), cpu_step
    # Optimizer only (ZeRO-Offload): gradients down during backward, updated bf16 shard back up.
    down = pcie_s(grad * trainable_shard, hw, eff)
    return Traffic(bwd=down, after_step=pcie_s(gather * trainable_shard, hw, eff)), cpu_step


def _cpu_step_note(hw: Hardware, training: TrainingConfig, impl: Implementation, eff: EfficiencyProfile,
                   seconds: float) -> str:
    """What the CPU optimizer step's time rests on (``_offload``)."""
    node = _cpu_rate(hw, training, impl, eff)
    if training.cpu_step_rate is not None:
        return (f"CPU optimizer step {seconds:.2f} s: {node / hw.gpus_per_node / 1e9:.2f}G parameters/s a process "
                "(--cpu-step-rate, as given" + (", capped by the node's memory bandwidth)" if
                                                 node < training.cpu_step_rate * hw.gpus_per_node else ")"))
    if impl.engine != "torch":
        return (f"CPU optimizer step {seconds:.2f} s: DeepSpeed's CPU-Adam at {node / 1e9:.1f}G parameters/s a node "
                "(an assumption, after the ZeRO-Offload paper)")
    return (f"CPU optimizer step {seconds:.2f} s: torch AdamW ({training.optimizer_implementation}) on the CPU, "
            f"one thread a process (the launchers' OMP_NUM_THREADS=1), {node / hw.gpus_per_node / 1e9:.2f}G "
            "parameters/s each (measured on one recent AMD EPYC core, benchmarks/cpu_optimizer.py; a cloud H100 "
            "host's Xeon core stepped 2.1-3.6x slower, benchmarks/results/cpu_optimizer_h100_host.md, so on such a "
            "host this step takes up to that much longer: --cpu-step-rate plans your host's; the node's memory "
            "bandwidth caps them together)")


def _optimizer_s(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation,
                 eff: EfficiencyProfile) -> float:
    if impl.offload_optimizer:
        return 0.0
    stepped = spec.trainable_params / (hw.world_size if impl.shard_optimizer else 1)
    cost = eff.optimizer_step
    return stepped * cost.bytes_per_param[training.optimizer] / (hw.gpu.hbm_bandwidth_gbps * GB * cost.hbm_efficiency)


def _dataparallel_traffic(spec: ModelSpec, hw: Hardware, training: TrainingConfig, eff: EfficiencyProfile,
                          micro_batch_size: int) -> Traffic:
    """nn.DataParallel: replicate from GPU0, gather logits to GPU0, reduce gradients to GPU0."""
    if hw.world_size == 1:
        return Traffic()
    shape = shape_of(spec)
    replicate = collective_s("broadcast", training.param_bytes * spec.total_params, hw, eff)
    logits = training.compute_bytes * micro_batch_size * training.seq_len * shape.vocab_size * (hw.world_size - 1)
    gather = logits / (hw.intra_node_link.bandwidth_gbps * GB * eff.communication.intra_node_efficiency)
    reduce = collective_s("broadcast", training.param_bytes * spec.trainable_params, hw, eff)
    return Traffic(after_step=0.0, fwd=replicate + gather, bwd=reduce)


def elementwise_time(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile, *,
                     tokens: int, checkpointing: bool, flops: FlopCount, rate: float, peak: float):
    """``bandwidth_time.elementwise_s`` for a micro-batch of ``tokens`` where it counts anything (``--compile``, or
    HBM other than the utilisation fit's GPU); None otherwise, without importing it (the plain plan's start-up)."""
    if not (training.compile or eff.compute.calibration_bandwidth(hardware.gpu)):
        return None
    from advisor.estimate.bandwidth_time import elementwise_s

    return elementwise_s(spec, hardware, training, eff, tokens=tokens, checkpointing=checkpointing, flops=flops,
                         rate=rate, peak=peak)


def elementwise_step_notes(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile,
                           ew, *, passes: float) -> list[str]:
    """The plan's lines on ``ew`` (``elementwise_time``'s answer) over ``passes`` micro-batch times a step."""
    if ew is None:
        return []
    from advisor.estimate.bandwidth_time import elementwise_notes

    return elementwise_notes(spec, hardware, training, eff, shift_s=passes * ew.shift, saved_s=passes * ew.saved)


def estimate_step_time(
    spec: ModelSpec,
    hardware: Hardware,
    training: TrainingConfig,
    impl: Implementation,
    *,
    micro_batch_size: int,
    checkpointing: bool,
    gradient_accumulation_steps: int = 1,
    efficiency: EfficiencyProfile | None = None,
    paged_on_cpu_bytes: int = 0,
    offloaded_activation_bytes: int = 0,
) -> StepTime:
    """Seconds of one optimizer step, split into compute, communication and offload (module docstring).
    ``offloaded_activation_bytes``: a micro-batch's activations held in CPU memory (``--activation-offload``,
    ``MemoryBreakdown.activations_on_cpu``), out over PCIe under forward and back under backward, beside the
    compute on a side stream (exposed only past it, as the offloading strategies' transfers).
    ``paged_on_cpu_bytes``: paged optimizer state the memory estimate evicted to CPU RAM
    (``MemoryBreakdown.paged_on_cpu``), moved out and back in over PCIe every step, the two directions at once
    (PCIe is full-duplex), not hidden behind compute."""
    if micro_batch_size < 1 or gradient_accumulation_steps < 1:
        raise ValueError("micro-batch size and gradient accumulation steps must be at least 1")
    eff = efficiency or load_efficiency()
    accumulation = gradient_accumulation_steps
    shape = shape_of(spec)
    tokens_micro = micro_batch_size * training.seq_len
    flops = count_flops(spec, tokens=tokens_micro, seq_len=training.seq_len, checkpointing=checkpointing,
                        selective=training.activation_checkpointing == "selective", target_len=training.target_len,
                        lora=training.lora, head_recompute=training.chunked_nll)
    peak, peak_note = peak_tflops(hardware.gpu, training)
    util = eff.compute.utilisation(hardware.gpu.name, hidden_size=shape.hidden_size, tokens_per_micro_batch=tokens_micro,
                                   rate=training.precision_info.peak_rate)
    if impl.single_process and hardware.world_size > 1:
        util *= eff.dataparallel.compute_penalty
    rate = peak * TFLOPS * util
    fwd_s, bwd_s = flops.forward / rate, (flops.backward + flops.recompute) / rate
    deq_fwd, deq_bwd = dequantization_step_s(spec, hardware, training, eff, checkpointing=checkpointing)
    ad_fwd, ad_bwd = adapter_s(spec, hardware, training, impl, eff, tokens=tokens_micro, checkpointing=checkpointing)
    one_rank = impl.shard_params and hardware.world_size == 1  # FSDP2 on one rank: it casts whole parameters
    ac_fwd, ac_bwd = (one_rank_cast_s(spec, hardware, training, impl, eff) if one_rank else
                      autocast_cast_s(spec, hardware, training, impl, eff, checkpointing=checkpointing))
    ew = elementwise_time(spec, hardware, training, eff, tokens=tokens_micro, checkpointing=checkpointing,
                          flops=flops, rate=rate, peak=peak * TFLOPS)
    ew_fwd, ew_bwd = (ew.forward, ew.backward) if ew else (0.0, 0.0)
    fwd_s, bwd_s = fwd_s + deq_fwd + ad_fwd + ac_fwd + ew_fwd, bwd_s + deq_bwd + ad_bwd + ac_bwd + ew_bwd
    f8: tuple[float, float, str] = (0.0, 0.0, "")
    if training.float8:
        from advisor.estimate.float8_time import float8_seconds

        f8 = float8_seconds(spec, hardware, training, impl, tokens=tokens_micro, checkpointing=checkpointing,
                            utilisation=util, bf16_tflops=peak, hardware_flops=flops.hardware,
                            hbm_efficiency=eff.optimizer_step.hbm_efficiency)
    fwd_s, bwd_s = fwd_s + f8[0], bwd_s + f8[1]
    host_note = ""
    floor = host_floor_s(spec, training, impl, checkpointing=checkpointing)
    if floor > fwd_s + bwd_s:  # the GPU waits for the host's launches: the micro-batch takes the host's time
        host_note = host_floor_note(spec, training, impl, checkpointing=checkpointing, gpu_s=fwd_s + bwd_s)
        fwd_s, bwd_s = fwd_s * floor / (fwd_s + bwd_s), bwd_s * floor / (fwd_s + bwd_s)
    overlap = eff.communication.overlap_fraction
    head_gathers = 0.0
    if impl.single_process:
        comm = _dataparallel_traffic(spec, hardware, training, eff, micro_batch_size)
        comm_exposed = comm.total_s(accumulation)  # DataParallel overlaps nothing
    else:
        comm = _collectives(spec, hardware, training, impl, eff)
        comm_exposed = comm.exposed_s(fwd_s=fwd_s, bwd_s=bwd_s, accumulation=accumulation, overlap=overlap)
        head_gathers = chunked_head_gather_s(spec, hardware, training, impl, eff, tokens=tokens_micro)
        if head_gathers:  # blocking: nothing hides them (a step's every micro-batch)
            comm = validated_copy(comm, {"fwd": comm.fwd + head_gathers / 2, "bwd": comm.bwd + head_gathers / 2})
            comm_exposed += accumulation * head_gathers
    pcie, cpu_step = _offload(spec, hardware, training, impl, eff)
    if offloaded_activation_bytes:  # --activation-offload: out in forward, back in backward, each micro-batch
        moved = pcie_s(offloaded_activation_bytes, hardware, eff)  # (advisor.estimate.activation_offload)
        pcie = validated_copy(pcie, {"fwd": pcie.fwd + moved, "bwd": pcie.bwd + moved})
    offload_exposed = pcie.exposed_s(fwd_s=fwd_s, bwd_s=bwd_s, accumulation=accumulation, overlap=overlap) + cpu_step
    # advisor.estimate.in_backward: out and in at once over the full-duplex link, exposed (an assumption)
    paged_s = pcie_s(paged_on_cpu_bytes, hardware, eff)
    offload_exposed += paged_s
    optimizer = _optimizer_s(spec, hardware, training, impl, eff)
    compute = accumulation * (fwd_s + bwd_s)
    step = compute + comm_exposed + offload_exposed + optimizer
    tokens_gpu = tokens_micro * accumulation
    model_flops = flops.model * accumulation
    notes = [n for n in (peak_note, f8[2], host_note) if n]
    if cpu_step:
        notes.append(_cpu_step_note(hardware, training, impl, eff, cpu_step))
    if paged_s:
        from advisor.estimate.in_backward import paged_traffic_note

        notes.append(paged_traffic_note(paged_on_cpu_bytes, paged_s))
    if deq_fwd:
        notes.append(dequantization_note(deq_fwd + deq_bwd, hardware, eff, checkpointing=checkpointing))
    if ad_fwd:
        notes.append(adapter_note(ad_fwd + ad_bwd, hardware, eff, compiled=bool(training.compile)))
    if ac_fwd:
        notes.append(one_rank_cast_note(ac_fwd + ac_bwd, hardware, eff) if one_rank else
                     autocast_cast_note(ac_fwd + ac_bwd, hardware, eff, checkpointing=checkpointing))
    if head_gathers:
        chunks = -(-tokens_micro // NLL_CHUNK)
        notes.append(f"TRL's chunked_nll under ZeRO-3 gathers the head for each of its {chunks} chunks a micro-batch, "
                     f"in forward and in backward's recomputation: {head_gathers:.2f} s a micro-batch of blocking "
                     "all-gathers (--loss hf gathers it once each way)")
    notes.extend(elementwise_step_notes(spec, hardware, training, eff, ew, passes=accumulation))
    if shape.assumed or shape.family == "mamba":  # a bare size, or a config that lacks some shape fields
        notes.append("only the size is known: FLOPs assume a Llama-like shape" if spec.source == "params"
                     else "the config lacks some shape fields: FLOPs assume Llama-like values for them"
                     if shape.assumed else "Mamba: FLOPs count the matmuls, 2 x parameters a token forward "
                     "(the selective scan is not counted)")
    if kind_of(spec).family == "encdec":
        notes.append(f"encoder-decoder: FLOPs count the encoder on {training.seq_len} source tokens and the decoder "
                     f"and head on {training.target_len or training.seq_len} target tokens a sample (--target-len); "
                     "tokens/s counts source tokens")
    if eff.compute.entry(hardware.gpu.name) is None:
        notes.append(f"no published utilisation for {hardware.gpu.name}: assumed "
                     f"{eff.compute.default_max_utilisation:.0%} of peak for large matmuls")
    return StepTime(
        compute_s=compute, communication_s=comm.total_s(accumulation), exposed_communication_s=comm_exposed,
        offload_s=pcie.total_s(accumulation) + cpu_step + paged_s, exposed_offload_s=offload_exposed, optimizer_s=optimizer,
        step_s=step, micro_batch_size=micro_batch_size, gradient_accumulation_steps=accumulation,
        world_size=hardware.world_size, tokens_per_gpu=tokens_gpu, tokens_per_s=tokens_gpu * hardware.world_size / step,
        model_flops_per_gpu=model_flops, hardware_flops_per_gpu=flops.hardware * accumulation, peak_tflops=peak,
        utilisation=util, mfu=model_flops / (step * peak * TFLOPS), notes=tuple(notes),
    )
