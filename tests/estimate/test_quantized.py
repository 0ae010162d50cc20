"""A bitsandbytes-quantised base (``--quantize``): packed bytes and constants worked by hand from
bitsandbytes' formats, what sharding keeps per GPU, the published QLoRA runs
(``profiles/published_qlora.json``), and the must-show Llama-2-70B plan on two 24 GB cards."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from advisor.estimate.quantized import quantized_base
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.units import GIB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

# Llama-2-7B: per block q, k, v, o are 4096 x 4096, gate and up 4096 -> 11008, down 11008 -> 4096.
LLAMA2_7B_BLOCK = 4 * 4096 * 4096 + 3 * 4096 * 11008  # 202,375,168 quantised weights per block


def test_nf4_with_double_quant_is_half_a_byte_plus_0127_bits():
    """Per 4096 x 4096 linear: 16,777,216 / 64 = 262,144 blocks -> 262,144 uint8 absmax + 1,024 fp32
    second-level absmax + 1 fp32 offset = 266,244 B; per 4096 x 11008 linear: 704,512 blocks ->
    704,512 + 4 x 2,752 + 4 = 715,524 B. 32 blocks x (4 x 266,244 + 3 x 715,524) = 102,769,536 B:
    0.1270 bits per weight, the QLoRA paper's 0.127 (8/64 + 32/(64*256))."""
    q = quantized_base(resolve_model("meta-llama/Llama-2-7b-hf"), "nf4")
    assert q.params == 32 * LLAMA2_7B_BLOCK
    assert q.packed_bytes == q.params // 2
    assert q.constant_bytes == 102_769_536
    assert round(8 * q.constant_bytes / q.params, 3) == 0.127
    assert q.largest_linear_params == 4096 * 11008


def test_fp4_without_double_quant_and_int8_constants():
    """No double quantisation: one fp32 absmax per 64 weights = 0.5 bits/weight. LLM.int8: one byte
    per weight and one fp32 scale per output row: 32 x 4 x (4 x 4096 + 2 x 11008 + 4096) = 5,439,488 B."""
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    fp4 = quantized_base(spec, "fp4", double_quant=False)
    assert fp4.constant_bytes * 8 / fp4.params == 0.5
    int8 = quantized_base(spec, "int8")
    assert int8.packed_bytes == int8.params and int8.constant_bytes == 5_439_488


def _qlora(strategy: str, **options):
    result = plan("meta-llama/Llama-2-7b-hf", "2xA100", strategy=strategy, lora=64, quantize="nf4",
                  micro_batch_size=1, activation_checkpointing="on", **options)
    return result.candidate(strategy).memory_bytes


def test_fsdp_shards_the_packed_weights_and_ddp_keeps_a_copy():
    """ddp keeps the packed weights, the constants, the bf16 embeddings/head/norms and fp32 adapters
    whole per GPU (packed + constants + 2 B x the rest of the base + 4 B x adapters); FSDP2 keeps half of
    everything but the constants, which every rank holds (quant_state is not a parameter)."""
    q = quantized_base(resolve_model("meta-llama/Llama-2-7b-hf"), "nf4")
    ddp, zero3 = _qlora("ddp"), _qlora("zero3")
    adapters = 64 * (2 * (4096 + 4096)) * 32  # q_proj, v_proj (PEFT's llama default): 33,554,432
    dense = 6_738_415_616 - q.params  # embeddings, head, norms
    whole = q.packed_bytes + 2 * dense + 4 * adapters
    assert ddp.states_params == whole + q.constant_bytes
    assert zero3.states_params == -(-whole // 2) + q.constant_bytes


def test_quantized_base_needs_no_autocast_weight_copies():
    """Quantised DDP: only the adapters are cast by autocast, so ddp's QLoRA peak is far below the peak of a
    LoRA whose base rests in fp32 (recipe lightning: bf16 copies of 6.5B weights = 13 GB are not made)."""
    lora = plan("meta-llama/Llama-2-7b-hf", "2xA100", strategy="ddp", lora=64, micro_batch_size=1,
                activation_checkpointing="on", recipe="lightning").candidate("ddp").memory_bytes
    assert lora.total - _qlora("ddp").total > 20 * GIB


def test_published_qlora_runs_within_bound():
    """Every published QLoRA peak in profiles/published_qlora.json, with each case's 2024 software
    (fp32 logits held through backward, bitsandbytes < 0.43.2 saved inputs, LoRA dropout 0.1: the
    benchmark's era_extra_bytes), is matched within -30%..+7%. The published figures are reserved memory:
    Answer.AI's torch.cuda.max_memory_reserved (compared with the estimate's ``reserved``: peak + the
    calibrated allocator gap, no CUDA context) and the PEFT docs' nvidia-smi (compared with ``reserved`` + the
    1 GiB CUDA context and NCCL, --context-gib default). Measured (benchmarks/qlora_published.py): -26% to +6.1%,
    median |error| 4.7% (-1% to -29%, median 10.4%, before the allocator's cache under checkpointing was counted
    in reserved; with the allocated peak + 5% and no per-case settings: -17% to -39%). The rows beyond -18% (now only the offloaded one) are among the two the JSON names
    unexplained: Answer.AI's micro-batch-1 context-512 run starts from 3.72 GiB reserved after wrapping
    (1.98 GiB modelled at rest) and the PEFT docs' offloaded run (nvidia-smi)."""
    from qlora_published import rows

    results = rows()
    assert len(results) >= 8
    for case, estimate, error in results:
        assert -0.35 <= error <= 0.07, (case["id"], estimate, case["published_gib"])
    assert statistics.median(abs(error) for _, _, error in results) <= 0.12
    beyond = {case["id"] for case, _, error in results if error < -0.18}
    assert beyond <= {"answerai-7b-2x3090-fsdp-bs1-ctx512", "peft-fsdp-qlora-70b-offload"}, beyond


def test_int8_linears_keep_their_inputs_past_checkpointing():
    """MatMul8bitLt keeps its input in ctx.tensors, which non-reentrant checkpointing cannot drop.
    Llama-2-7B (h 4096, I 11008), bf16, micro-batch 1 x 512 tokens, checkpointing: every block keeps
    attn_norm out, the attention output, mlp_norm out (4096 each) and act*up (11008), 2 bytes each:
    512 x 2 x 23,296 = 23,855,104 bytes a block; 32 blocks until the loss, 33 in a block's backward
    (the recomputed block makes its own). nf4 (MatMul4Bit since bitsandbytes 0.43.2) keeps none.
    Without checkpointing nothing is new when every adapter saves its input as it is (all-linear,
    no dropout, bf16)."""
    from advisor.estimate.quantized import quantized_buffers
    from advisor.model.lora import LoraConfig
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    ddp = get_strategy("ddp").on("torch")

    def buffers(scheme, checkpointing, dropout=0.0):
        training = TrainingConfig(precision="bf16", seq_len=512, quantize=scheme,
                                  lora=LoraConfig(rank=64, targets="all-linear", dropout=dropout))
        return quantized_buffers(spec, training, ddp, 2, quantized_base(spec, scheme), checkpointing=checkpointing,
                                 tokens=512)

    block = 23_855_104
    nf4, int8 = buffers("nf4", True), buffers("int8", True)
    assert int8.at_loss - nf4.at_loss == 32 * block
    assert int8.in_backward - nf4.in_backward == 33 * block
    assert buffers("int8", False).at_loss == buffers("nf4", False).at_loss
    # With dropout the adapters save dropout's output instead: both norm outputs and act*up are new.
    assert buffers("int8", False, 0.1).at_loss - buffers("nf4", False, 0.1).at_loss == 32 * 512 * 2 * 19_200


def test_reentrant_checkpointing_keeps_only_the_recomputed_blocks_int8_inputs():
    """transformers before 5.0.0 checkpoints reentrant (the Trainer's gradient_checkpointing_enable() passed
    use_reentrant=True): a block's first forward runs under no_grad, so MatMul8bitLt makes no ctx there and only the
    block recomputed in backward keeps its inputs. Same Llama-2-7B job as above, 23,855,104 bytes a block: under
    the trainer recipe with transformers 4.48.1, nothing kept until the loss and one block in a block's backward;
    with 5.0.0 the 32 and 33 of the non-reentrant count; the torch recipe's own (non-reentrant) checkpoint keeps
    the 32 whatever the transformers release."""
    from advisor.estimate.quantized import int8_kept_input_bytes
    from advisor.model.lora import LoraConfig
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    ddp = get_strategy("ddp").on("torch")
    lora = LoraConfig(rank=64, targets="all-linear")

    def kept(recipe, release):
        training = TrainingConfig(precision="bf16", seq_len=512, quantize="int8", lora=lora, recipe=recipe,
                                  transformers_release=release)
        return int8_kept_input_bytes(spec, training, ddp, tokens=512, checkpointing=True)

    block = 23_855_104
    assert kept("trainer", "4.48.1") == (0, block)
    assert kept("trainer", "5.0.0") == kept("trainer", None) == (32 * block, 33 * block)
    assert kept("torch", "4.48.1") == (32 * block, 33 * block)


def test_llama2_70b_qlora_fits_two_24gb_cards_with_offload():
    """Must show: Llama-2-70B, nf4, rank 64, seq 2048 on 2x RTX 4090: FSDP without offload needs more
    than a 24 GB card (as the PEFT docs measured, 35.6 GB per GPU without offload); the plan escalates
    to CPU offload with activation checkpointing and fits, as Answer.AI's and PEFT's published runs on
    two 24 GB cards (both with CPU offload and checkpointing)."""
    result = plan("meta-llama/Llama-2-70b-hf", "2xRTX4090", lora=64, quantize="nf4", seq_len=2048)
    assert result.recommendation is not None
    assert result.recommendation.strategy == "zero3_offload"
    assert result.recommendation.activation_checkpointing
    assert not result.candidate("zero3").fits
    chosen = result.candidate("zero3_offload")
    assert chosen.memory_bytes.total <= chosen.capacity_bytes
    assert not result.candidate("dp").available


@pytest.mark.parametrize("strategy", ["zero3", "zero2", "zero3_offload"])
def test_int8_cannot_be_sharded(strategy):
    result = plan("meta-llama/Llama-2-7b-hf", "2xA100", lora=8, quantize="int8")
    cand = result.candidate(strategy)
    assert not cand.available and "int8" in cand.unavailable_reason
    assert result.candidate("ddp").available


def test_fsdp_gathers_the_packed_weights():
    """ZeRO-3 all-gathers each block as stored: with nf4 the 6.48B block weights travel at half a byte
    instead of two (bf16), so the gathers move 3.24 GB + 2 B x 0.26B = 3.76 GB instead of 13.48 GB; at
    the same micro-batch the step's communication time falls by that ratio less the adapters' gradient
    reduce-scatter (the same in both)."""
    from advisor.estimate.step_time import estimate_step_time
    from advisor.hardware.cluster import parse_gpus
    from advisor.strategies import STRATEGIES
    from advisor.training import TrainingConfig

    spec = plan("meta-llama/Llama-2-7b-hf", "2xRTX4090", lora=64, strategy="zero3").model
    hw, impl = parse_gpus("2xRTX4090"), STRATEGIES["zero3"].on("torch")
    times = {quant: estimate_step_time(spec, hw, TrainingConfig(lora=64, quantize=quant), impl, micro_batch_size=1,
                                       checkpointing=True).communication_s for quant in (None, "nf4")}
    assert 0.2 < times["nf4"] / times[None] < 0.35  # 3.76 / 13.48 = 0.28 for the gathers


def test_qlora_under_deepspeed_holds_zeros_own_buffers_over_the_packed_base():
    """The deepspeed recipe's ZeRO facts (profiles/recipes.json, from DeepSpeed's source) apply to a
    quantised base too. Llama-2-7B, LoRA r64 (q_proj, v_proj: 33,554,432 adapters), nf4, bf16, 2 GPUs,
    worked by hand: IPG buffers of reduce_bucket_size = hidden^2 = 16,777,216 bf16 elements (33,554,432 B);
    the adapters' gradient partition 2 x 33,554,432 / 2 = 33,554,432 B. ZeRO-3 gathers the packed base:
    6,476,005,376 quantised weights at half a byte (3,238,002,688 B) plus the other 295,964,672 parameters
    (embeddings, head, norms, adapters) at 2 B: 3,829,932,032 B, of which another rank holds half."""
    from advisor.estimate.quantized import quantized_buffers
    from advisor.model.lora import with_lora
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    training = TrainingConfig(lora=64, quantize="nf4", precision="bf16-mixed", recipe="deepspeed")
    spec = with_lora(resolve_model("meta-llama/Llama-2-7b-hf"), training.lora)
    q = quantized_base(spec, "nf4")

    def buffers(strategy):
        impl = get_strategy(strategy).on("deepspeed")
        return quantized_buffers(spec, training, impl, 2, q, checkpointing=True)

    zero2, zero3 = buffers("zero2"), buffers("zero3")
    assert (zero2.persistent, zero2.at_loss, zero2.in_backward) == (0, 0, 2 * 33_554_432 + 33_554_432)
    assert zero3.persistent == 33_554_432  # one IPG buffer, kept from initialisation
    assert zero3.at_loss == zero3.in_backward == 3_829_932_032 // 2 + 33_554_432
