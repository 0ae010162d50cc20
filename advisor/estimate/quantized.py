"""A bitsandbytes-quantised frozen base (QLoRA): the bytes of the packed weights and their
quantisation constants, what each strategy keeps of them per GPU, and the dequantised temporaries.

What belongs here: the memory arithmetic of ``--quantize nf4|fp4|int8``; which strategy/engine
pairs cannot run a quantised base (``quantization_unavailable``); the inputs LLM.int8 linears keep
past checkpointing (``int8_kept_input_bytes``). Not here: the activation model (a 4-bit linear
saves what any frozen linear saves: ``MatMul4Bit`` keeps only the packed weight for the input
gradient since bitsandbytes 0.43.2; ``MatMul8bitLt`` keeps its input ``A`` too, counted here) and
the LoRA counts (``advisor.model.lora``).

What bitsandbytes quantises: every ``nn.Linear`` (GPT-2's ``Conv1D`` too) except the output head,
which transformers' ``replace_with_bnb_linear`` skips (``llm_int8_skip_modules`` defaults to the
output embeddings); embeddings, norms and biases stay in the compute dtype. Here that is every
linear layer of every block (``advisor.model.lora.block_linears``).

Bytes, from bitsandbytes ``functional.quantize_4bit`` / ``Params4bit`` / ``QuantState`` and
``Int8Params``:

- nf4 / fp4: two 4-bit codes per byte (``quant_storage`` only changes the dtype the bytes are
  viewed as, not their number); one absmax per 64-element block (``blocksize=64``), fp32; with
  double quantisation (``compress_statistics``, ``bnb_4bit_use_double_quant=True``, on for QLoRA)
  the absmax minus their mean are themselves quantised blockwise to 8 bits in blocks of 256
  (``quantize_blockwise(absmax, blocksize=256)``), keeping one fp32 absmax per 256 and one fp32
  offset: 8/64 + 32/(64*256) = 0.127 bits per parameter instead of 32/64 = 0.5 (Dettmers et al.
  2023, QLoRA, section 3 "Double Quantization").
- int8 (LLM.int8, ``load_in_8bit``): one int8 per weight (``Int8Params.CB``) and one fp32 scale per
  output row (``SCB``), as bitsandbytes stores them after quantising (Dettmers et al. 2022,
  vector-wise quantisation).

Sharding: FSDP and ZeRO-3 shard only floating-point parameters; a 4-bit weight shards when its
``bnb_4bit_quant_storage`` is the float dtype of the other parameters (bf16), as Answer.AI's
FSDP+QLoRA does (bitsandbytes docs "FSDP-QLoRA"; PEFT docs "Use PEFT QLoRA and FSDP" and "Use PEFT
QLoRA and DeepSpeed with ZeRO3"). The quantisation constants live in the module's ``quant_state``,
not in a parameter, so every rank keeps all of them (bitsandbytes PR #970, Answer.AI's
"Enabling 70B Finetuning on Consumer GPUs"); FSDP's CPU offload moves only the parameters. DDP and
ZeRO-1/2 keep a whole copy of the packed weights on every GPU. (With the default uint8 storage,
accelerate's FSDP2 preparation leaves the 4-bit weights out of the sharding, whole on every GPU:
``accelerate/utils/fsdp_utils.py`` ``fsdp2_prepare_model``; the exports set the storage dtype.) LLM.int8 weights are ``int8``
tensors with no storage-dtype option: FSDP / ZeRO-3 cannot shard them. ``torch.nn.DataParallel``
re-replicates the modules every step and loses the 4-bit quant state: transformers refuses to
wrap a bitsandbytes model in it (transformers PR #45407, where the bitsandbytes maintainer says
8-bit will not be made to work either).

Dequantised temporaries: ``MatMul4Bit`` dequantises the whole weight to the compute dtype in
forward (``F.linear(A, dequantize_4bit(B).t())``) and again in backward for the input gradient;
``MatMul8bitLt.backward`` dequantises ``CB * SCB / 127`` likewise (its forward is an int8 matmul).
One layer's weight at a time: the largest linear of a block, in the compute dtype, added to a
block's backward. Their time (``dequantization_s``, read by ``step_time``): the 4-bit kernels' HBM
bytes per weight per pass (forward, backward, checkpointing's recompute) over the bandwidth; the
int8 path is not timed.

Method of validation: fake tensors cannot run bitsandbytes kernels, so the simulator does not
cover a quantised base. The estimate is checked against published QLoRA runs with their full
settings (``profiles/published_qlora.json``, ``benchmarks/qlora_published.py``,
``tests/estimate/test_quantized.py``). What those runs allocated that today's recipe does not
(read from the code they ran; added per case in the benchmark, not here): transformers < 4.46
returned ``logits.float()``, which Answer.AI's loop holds through backward and the step (4 bytes a
logit: 2.4 GiB at Llama-2-7B micro-batch 10 x 2048); bitsandbytes < 0.43.2 kept each 4-bit
linear's input in the recomputed block; their LoRA dropout is 0.1. What stays unexplained (the
estimate is below every figure): Answer.AI's 7B FSDP runs already reserve 3.72 GiB after wrapping
(their ``reserved_after_model_wrap``; 1.98 GiB modelled at rest: FSDP1 ``sync_module_states``
from a CPU copy leaves cached blocks), which dominates the micro-batch-1 figures; the PEFT docs'
nvidia-smi rows sit ~3-5 GiB above the estimate (the offloaded one ~6.6 GiB).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from advisor.frozen import validated_copy
from advisor.model.block_kinds import kind_of
from advisor.model.bundled import load_architectures
from advisor.model.lora import block_linears
from advisor.model.selective import selective_kept
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from advisor.strategies import Implementation

if TYPE_CHECKING:  # the planner's types; memory.py imports this module lazily
    from advisor.hardware.cluster import Hardware
    from advisor.hardware.efficiency import EfficiencyProfile
    from advisor.training import TrainingConfig

BLOCKSIZE_4BIT = 64  # bitsandbytes quantize_4bit default blocksize (Params4bit, Linear4bit)
BLOCKSIZE_NESTED = 256  # quantize_blockwise(absmax, blocksize=256) under compress_statistics


QUANTIZED_KINDS = ("decoder", "gpt2")  # advisor.model.block_kinds: the kinds whose quantised linears are listed

class QuantizedBase(BaseModel):
    """The quantised linears of a model, summed over its blocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(ge=0, description="Weights held quantised (every block linear).")
    packed_bytes: int = Field(ge=0, description="The packed weights (shardable with a float storage dtype).")
    constant_bytes: int = Field(ge=0, description="Quantisation constants (quant_state): every rank keeps them.")
    layer_params: int = Field(ge=0, description="Quantised weights of one block.")
    layer_packed_bytes: int = Field(ge=0, description="Packed weights of one block.")
    largest_linear_params: int = Field(ge=0, description="The largest quantised linear (dequantised one at a time).")


def quantized_linear_bytes(fan_in: int, fan_out: int, scheme: str, *, double_quant: bool) -> tuple[int, int]:
    """(packed weight bytes, constant bytes) of one ``fan_in -> fan_out`` linear."""
    n = fan_in * fan_out
    if scheme == "int8":
        return n, FP32 * fan_out  # Int8Params.CB + SCB (one fp32 scale per output row)
    blocks = -(-n // BLOCKSIZE_4BIT)
    if not double_quant:
        return -(-n // 2), FP32 * blocks
    # uint8 absmax + one fp32 absmax per 256 of them + the fp32 offset (their mean)
    return -(-n // 2), blocks + FP32 * -(-blocks // BLOCKSIZE_NESTED) + FP32


@functools.lru_cache(maxsize=32)  # the planner asks once per memory estimate; specs are frozen (hashable)
def quantized_base(spec: ModelSpec, scheme: str, *, double_quant: bool = True) -> QuantizedBase:
    """The quantised linears of ``spec``; ValueError where its linear layers are not all known."""
    info = load_architectures().get(spec.model_type or "")
    # a dense decoder's or GPT-2's blocks are all its quantised linears; other kinds hold more (an encoder-decoder's
    # two stacks, a vision tower, Jamba's unequal blocks, experts) that block 0 times the layers does not count
    if info is None or kind_of(spec).name not in QUANTIZED_KINDS:
        raise ValueError(f"--quantize is modelled for dense decoder and GPT-2 models; {spec.name} "
                         f"({spec.model_type or 'size only'}) has linear layers this planner does not list")
    shapes = [shape for linears in block_linears(spec).values() for shape in linears]
    per_layer = [quantized_linear_bytes(i, o, scheme, double_quant=double_quant) for i, o in shapes]
    layers = spec.num_layers
    return QuantizedBase(
        params=layers * sum(i * o for i, o in shapes),
        packed_bytes=layers * sum(p for p, _ in per_layer),
        constant_bytes=layers * sum(c for _, c in per_layer),
        layer_params=sum(i * o for i, o in shapes),
        layer_packed_bytes=sum(p for p, _ in per_layer),
        largest_linear_params=max(i * o for i, o in shapes),
    )


def quantization_unavailable(impl: Implementation, scheme: str | None) -> str | None:
    """Why ``impl`` cannot train a base quantised with ``scheme`` (None: it can). Sources in the
    module docstring."""
    if scheme is None:
        return None
    if impl.single_process:
        return ("torch.nn.DataParallel loses bitsandbytes' quant state when it re-replicates the model "
                "(transformers refuses it for quantised models); use ddp")
    if scheme == "int8" and impl.shard_params:
        return ("LLM.int8 weights are int8 tensors with no storage-dtype option, which FSDP / ZeRO-3 cannot "
                "shard (bitsandbytes shards 4-bit weights only, via bnb_4bit_quant_storage); use nf4 or "
                "a strategy that keeps whole weights (ddp, zero1, DeepSpeed zero2)")
    return None


def frozen_dense_bytes(training: "TrainingConfig") -> int:
    """Bytes per parameter of the base weights left unquantised (embeddings, norms, head): the dtype
    the model is loaded in, which is the storage dtype: the compute dtype, or fp32 under fp16 autocast
    (PEFT docs, "Use PEFT QLoRA and FSDP": fp16 mixed precision needs float32 storage)."""
    return 4 if training.precision == "fp16-mixed" else training.compute_bytes


def quantized_param_bytes(spec: ModelSpec, training: "TrainingConfig", impl: Implementation, world: int,
                          q: QuantizedBase, *, adapter_bytes: int) -> int:
    """Parameters per rank at rest: packed weights, the rest of the frozen base in the compute dtype
    and the adapters at ``adapter_bytes``; sharded when the strategy shards parameters; the
    quantisation constants on every rank."""
    from advisor.estimate.states import compute_dtype_copy_params  # states imports this module lazily

    trainable = spec.trainable_params
    dense = spec.total_params - trainable - q.params
    cast = compute_dtype_copy_params(spec, training, impl)  # modules_to_save copies the recipe casts to bf16
    stored = (q.packed_bytes + frozen_dense_bytes(training) * dense + adapter_bytes * (trainable - cast)
              + training.compute_bytes * cast)
    return (-(-stored // world) if impl.shard_params else stored) + q.constant_bytes


def gathered_block_bytes(spec: ModelSpec, training: "TrainingConfig", q: QuantizedBase, *, adapter_bytes: int) -> int:
    """One block as FSDP / ZeRO-3 all-gathers it: packed weights, norms and biases in the compute
    dtype, the block's adapters (cast to the compute dtype under a mixed-precision policy)."""
    layer = spec.layer_params or 0
    adapters = spec.trainable_params // max(spec.num_layers or 1, 1)
    dense = max(layer - adapters - q.layer_params, 0)
    return q.layer_packed_bytes + frozen_dense_bytes(training) * dense + adapter_bytes * adapters


def dequantized_temporary_bytes(training: "TrainingConfig", q: QuantizedBase) -> int:
    """The largest linear dequantised to the compute dtype (one at a time, forward and backward)."""
    return training.compute_bytes * q.largest_linear_params


def dequantization_bytes(fan_in: int, fan_out: int, scheme: str, *, double_quant: bool, compute_bytes: int) -> int:
    """HBM bytes one dequantisation of a 4-bit ``fan_in -> fan_out`` weight moves (0 for int8, whose
    forward is an int8 matmul: not modelled as time). bitsandbytes ``functional.dequantize_4bit``:
    with double quantisation it first dequantises the uint8 absmax to fp32 (``dequantize_blockwise``:
    read 1 B, write 4 B a block) and adds the offset in place (read and write 4 B a block); then the
    4-bit kernel reads the packed codes and the fp32 absmax and writes the weight in the compute dtype.
    The matmul's read of that weight is the GEMM's own, inside its utilisation."""
    if scheme == "int8":
        return 0
    n = fan_in * fan_out
    blocks = -(-n // BLOCKSIZE_4BIT)
    absmax = FP32 * blocks  # read by the 4-bit kernel
    if double_quant:  # uint8 read + fp32 write, then += offset (fp32 read + write); state2's absmax read
        absmax += blocks + FP32 * blocks + 2 * FP32 * blocks + FP32 * -(-blocks // BLOCKSIZE_NESTED)
    return -(-n // 2) + absmax + compute_bytes * n


def dequantization_s(spec: ModelSpec, training: "TrainingConfig", *, bandwidth_bytes_s: float, checkpointing: bool,
                     kept_linears: tuple[tuple[int, int], ...] = ()) -> tuple[float, float]:
    """(forward, backward + recompute) seconds of one micro-batch's 4-bit dequantisations on one GPU.

    ``MatMul4Bit`` (bitsandbytes ``autograd/_functions.py``) dequantises each weight in forward
    (``F.linear(A, dequantize_4bit(B).t())``) and again in backward for the input gradient; under
    checkpointing the recomputed forward dequantises it a third time, except the base linears a
    selective policy keeps (``kept_linears``, one block's), whose products are not recomputed. The
    cost does not depend on the tokens: every rank dequantises the whole (gathered) weight per
    micro-batch. Bytes from ``dequantization_bytes``; ``bandwidth_bytes_s`` is the achieved HBM bandwidth."""
    if training.quantize is None or training.quantize == "int8":
        return 0.0, 0.0

    def moved(shapes) -> int:
        return sum(dequantization_bytes(i, o, training.quantize, double_quant=training.double_quant,
                                        compute_bytes=training.compute_bytes) for i, o in shapes)

    per_pass = spec.num_layers * moved(s for linears in block_linears(spec).values() for s in linears)
    recompute = per_pass - spec.num_layers * moved(kept_linears) if checkpointing else 0
    return per_pass / bandwidth_bytes_s, (per_pass + recompute) / bandwidth_bytes_s


def dequantization_step_s(spec: ModelSpec, hw: "Hardware", training: "TrainingConfig", eff: "EfficiencyProfile", *,
                          checkpointing: bool) -> tuple[float, float]:
    """(forward, backward) seconds of a 4-bit base's dequantisations per micro-batch for ``step_time``
    (``dequantization_s`` at the GPU's HBM bandwidth x ``dequantize.hbm_efficiency``), on the compute
    stream: they add to compute."""
    if training.quantize is None:
        return 0.0, 0.0
    kept = selective_kept(spec, training.lora) if checkpointing and training.activation_checkpointing == "selective" \
        else None
    bandwidth = hw.gpu.hbm_bandwidth_gbps * 1e9 * eff.dequantize.hbm_efficiency
    return dequantization_s(spec, training, bandwidth_bytes_s=bandwidth, checkpointing=checkpointing,
                            kept_linears=tuple(kept.linears) if kept is not None else ())


def dequantization_note(seconds: float, hw: "Hardware", eff: "EfficiencyProfile", *, checkpointing: bool) -> str:
    return (f"4-bit base: bitsandbytes dequantises every block weight in forward, backward"
            f"{' and the recompute' if checkpointing else ''}: {seconds:.3f} s a micro-batch at "
            f"{eff.dequantize.hbm_efficiency:.0%} of {hw.gpu.hbm_bandwidth_gbps:,.0f} GB/s")


def apply_quantization(spec: ModelSpec, training: "TrainingConfig", impl: Implementation, world: int, states, *,
                       checkpointing: bool, micro_batch_size: int = 1):
    """``(states, buffers, dequantized temporary)`` of ``estimate_memory`` for a quantised base:
    the model states with the packed parameters, and the strategy's buffers recomputed over them."""
    q = quantized_base(spec, training.quantize, double_quant=training.double_quant)
    deepspeed = training.engine == "deepspeed"
    adapter_bytes = training.compute_bytes if deepspeed else training.trainable_param_bytes
    params = quantized_param_bytes(spec, training, impl, world, q, adapter_bytes=adapter_bytes)
    if impl.offload_params:
        params -= q.constant_bytes  # the constants stay on the GPU: counted with the buffers
    states = validated_copy(states, {"params": params})
    buffers = quantized_buffers(spec, training, impl, world, q, checkpointing=checkpointing,
                                tokens=micro_batch_size * training.seq_len)
    return states, buffers, dequantized_temporary_bytes(training, q)


def int8_kept_input_bytes(spec: ModelSpec, training: "TrainingConfig", impl: Implementation, *, tokens: int,
                          checkpointing: bool) -> tuple[int, int]:
    """(until the loss, in a block's backward) bytes of the inputs ``MatMul8bitLt`` keeps.

    bitsandbytes' ``MatMul8bitLt.forward`` stores its input ``A`` (and the outlier columns ``subA``,
    a few columns, left out) in ``ctx.tensors`` whenever the input requires grad, an attribute that
    ``saved_tensors_hooks`` never see: non-reentrant checkpointing (``wrappers.checkpointing``)
    cannot drop it, so every block keeps the distinct inputs of its linears (both norm outputs, the
    attention output, the MLP's ``act * up``) until its backward, and the block being recomputed
    makes its own. Without checkpointing only the inputs nothing else saves are new: not the
    attention output (SDPA saves it), not an input an adapter saves as it is (no dropout, no cast).
    ``MatMul4Bit`` kept its input the same way until bitsandbytes 0.43.2 (PR #1270); it keeps only
    the packed weight now. GPT-2 keeps the full fine-tune count without checkpointing (linear inputs
    included): only the checkpointed case is added there. Under reentrant checkpointing (transformers
    before 5.0.0: ``TrainingConfig.reentrant_checkpointing``) a block's first forward runs without grad and
    makes no ctx: only the block being recomputed keeps its inputs, in its backward."""
    if training.quantize != "int8":
        return 0, 0
    from advisor.estimate.memory import recipe_dtypes  # memory.py imports this module lazily
    from advisor.model.lora import INPUT_SOURCE, target_names

    dt = recipe_dtypes(training, impl)
    width = {"attn_norm": dt.residual, "mlp_norm": dt.residual, "attention": dt.compute, "mlp_act": dt.compute}
    linears = block_linears(spec)
    if not all(name in INPUT_SOURCE for name in linears):  # GPT-2: every linear reads its own input
        per_token = sum(dt.compute * fan_in for shapes in linears.values() for fan_in, _ in shapes)
        if checkpointing and training.reentrant_checkpointing:
            return 0, tokens * per_token
        return (tokens * spec.num_layers * per_token, tokens * (spec.num_layers + 1) * per_token) if checkpointing \
            else (0, 0)
    sources = {INPUT_SOURCE[name]: shapes[0][0] for name, shapes in linears.items()}
    if not checkpointing:
        shared = set()
        if training.lora is not None and not training.lora.dropout and not dt.input_casts:
            shared = {INPUT_SOURCE[name] for name in target_names(spec, training.lora)}
        sources = {src: fan_in for src, fan_in in sources.items() if src != "attention" and src not in shared}
    per_block = tokens * sum(width[src] * fan_in for src, fan_in in sources.items())
    if checkpointing and training.reentrant_checkpointing:
        return 0, per_block
    blocks = spec.num_layers
    return blocks * per_block, (blocks + (1 if checkpointing else 0)) * per_block


def quantized_buffers(spec: ModelSpec, training: "TrainingConfig", impl: Implementation, world: int,
                      q: QuantizedBase, *, checkpointing: bool, tokens: int = 1):
    """What the strategy holds beyond states and activations when the base is quantised: the same
    moments as ``strategy_buffers.estimate_strategy_buffers``, over packed blocks and the adapters'
    gradients only, plus the inputs LLM.int8 linears keep past checkpointing (``int8_kept_input_bytes``)."""
    kept, kept_bwd = int8_kept_input_bytes(spec, training, impl, tokens=tokens, checkpointing=checkpointing)
    buffers = _strategy_moments(spec, training, impl, world, q, checkpointing=checkpointing)
    if not kept:
        return buffers
    forward_end = buffers.at_loss if buffers.at_forward_end is None else buffers.at_forward_end
    return validated_copy(buffers, {"at_loss": buffers.at_loss + kept, "in_backward": buffers.in_backward + kept_bwd,
                                      "at_forward_end": forward_end + kept})


def _strategy_moments(spec: ModelSpec, training: "TrainingConfig", impl: Implementation, world: int,
                      q: QuantizedBase, *, checkpointing: bool):
    """The strategy's buffers over packed blocks and the adapters' gradients (``quantized_buffers``)."""
    from advisor.estimate.buckets import deepspeed_buckets
    from advisor.estimate.strategy_buffers import StrategyBuffers, block_params, ddp_bucket_bytes

    trainable = spec.trainable_params
    on_gpu_constants = q.constant_bytes if impl.offload_params else 0
    if training.engine == "deepspeed":
        from advisor.estimate.zero_buffers import zero_facts, zero_strategy_buffers  # DeepSpeed's own buffers

        facts = zero_facts(training, impl)
        if facts is not None:  # ZeRO stage 1+, over the packed base (ZeRO-3 gathers it packed)
            packed = q.packed_bytes + training.compute_bytes * (spec.total_params - q.params)
            zero = zero_strategy_buffers(spec, training, impl, world, facts, packed_bytes=packed)
            return validated_copy(zero, {"persistent": zero.persistent + on_gpu_constants})
        # ZeRO stage 0 (ddp on the engine): one reduce bucket of the adapters' 16-bit gradients.
        bucket = 2 * min(trainable, deepspeed_buckets(spec, training.zero).reduce_elements)
        return StrategyBuffers(persistent=bucket + on_gpu_constants, at_loss=0, in_backward=0)
    pb = training.param_bytes
    if impl.shard_params:  # FSDP2 (strategy_buffers.estimate_strategy_buffers), blocks gathered packed
        ub = training.compute_bytes if training.mixed else pb
        reduce_b = FP32 if training.mixed else pb
        _, n_layers, outside = block_params(spec)
        block = gathered_block_bytes(spec, training, q, adapter_bytes=ub)
        h2d = gathered_block_bytes(spec, training, q, adapter_bytes=pb) // world if impl.offload_params else 0
        at_loss, blocks_bwd = (block, 2 * block) if impl.reshard_after_forward else (block * n_layers,) * 2
        # FSDP2 reduce-scatters only the gradients that exist: the block's adapters.
        grads = (ub + reduce_b) * (trainable // max(n_layers, 1))
        root = ub * outside
        return StrategyBuffers(persistent=on_gpu_constants, at_loss=root + at_loss + h2d,
                               in_backward=root + blocks_bwd + grads + h2d)
    buckets = ddp_bucket_bytes(pb * trainable, impl, world)  # DDP gradient buckets: the adapters' gradients
    # Autocast caches bf16 copies of the weights that require grad (the adapters) until the loss;
    # the quantised and the compute-dtype weights need no cast.
    casts = training.compute_bytes * trainable if training.mixed else 0
    return StrategyBuffers(persistent=buckets, at_loss=casts, in_backward=casts, at_forward_end=casts)


def stored_param_bytes(spec: ModelSpec, training: "TrainingConfig", *, bytes_per_param: int) -> int:
    """Bytes of all parameters as FSDP / ZeRO-3 gather or a CPU offload uploads them: the packed
    quantised weights plus the rest at ``bytes_per_param`` (everything at it without ``--quantize``)."""
    if training.quantize is None:
        return bytes_per_param * spec.total_params
    q = quantized_base(spec, training.quantize, double_quant=training.double_quant)
    return q.packed_bytes + bytes_per_param * (spec.total_params - q.params)
