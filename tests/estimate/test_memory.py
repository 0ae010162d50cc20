"""The memory model: hand-checked figures and invariants that must hold for any input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.hardware.cluster import parse_gpus
from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
from advisor.estimate.memory import estimate_memory, model_states
from advisor.model.architectures import count_from_config
from advisor.model.sources import resolve_model
from advisor.model.spec import spec_from_size
from advisor.strategies import ESCALATION, STRATEGIES
from advisor.training import TrainingConfig
from advisor.units import GIB
from tests.conftest import TINY_CONFIGS

GB = 10**9


def _impl(name, engine="torch"):
    return STRATEGIES[name].on(engine)


@pytest.mark.parametrize("name, expected_gb", [("ddp", 120), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.88)])
def test_zero_paper_model_states(name, expected_gb):
    """ZeRO paper, Figure 1 / Table 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (K=12)."""
    spec = spec_from_size(7_500_000_000)
    states = model_states(spec, TrainingConfig(engine="deepspeed"), _impl(name, "deepspeed"), 64)
    total_gb = (states.params + states.grads + states.optimizer) / GB
    assert total_gb == pytest.approx(expected_gb, rel=0.005)


GPT2_PARAMS = 124_439_808  # GPT-2 small, the model card's total (tests/model/test_architectures.py)
# Qwen2.5-0.5B from its config (hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864, vocab
# 151,936, tied): a layer is q 896*896+896 + k,v 2*(896*128+128) + o 896*896 + MLP 3*896*4864 + two
# norms 2*896 = 14,912,384; x24 = 357,897,216; + embeddings 151,936*896 = 136,134,656 + final norm 896.
QWEN05B_PARAMS = 494_032_768


def test_torch_ddp_fp32_adamw_by_hand():
    """GPT-2 small, fp32 DDP + AdamW, at the optimizer step.

    params 4P + grads 4P + exp_avg/exp_avg_sq 8P + foreach sqrt(v) temporary 4P + DDP buckets 4P = 24P.
    """
    p = GPT2_PARAMS
    spec = resolve_model("openai-community/gpt2")
    mem = estimate_memory(spec, parse_gpus("2xA100"), TrainingConfig(precision="fp32", seq_len=128), _impl("ddp"),
                          micro_batch_size=1, checkpointing=True)
    assert mem.peak_phase == "optimizer_step"
    assert (mem.params, mem.grads, mem.optimizer, mem.activations, mem.temporary) == (
        497_759_232, 497_759_232, 995_518_464, 0, 995_518_464)  # 4P, 4P, 8P, 0, 8P
    assert mem.peak_allocated == 24 * p == 2_986_555_392


def test_torch_fsdp_shards_states():
    """FSDP2 zero3 on 4 GPUs, fp32 SGD (no state): 4 bytes x P / 4 of parameters and of gradients."""
    spec = resolve_model("openai-community/gpt2")
    states = model_states(spec, TrainingConfig(precision="fp32", optimizer="sgd"), _impl("zero3"), 4)
    assert (states.params, states.grads, states.optimizer, states.step_temporary) == (GPT2_PARAMS, GPT2_PARAMS, 0, 0)


def test_deepspeed_zero2_shards_grads_and_optimizer_not_params():
    """ZeRO-2 (DeepSpeed, bf16 + AdamW, K=12) on 4 GPUs, Qwen2.5-0.5B: weights 2P on every rank,
    gradients 2P/4, fp32 master + Adam moments 12P/4 (Rajbhandari et al. 2020, section 5.1)."""
    spec = resolve_model("Qwen/Qwen2.5-0.5B")
    assert spec.total_params == QWEN05B_PARAMS
    states = model_states(spec, TrainingConfig(engine="deepspeed"), _impl("zero2", "deepspeed"), 4)
    assert (states.params, states.grads, states.optimizer) == (988_065_536, 247_016_384, 1_482_098_304)


# The tiny Llama of tests/conftest.py (hidden 64, 3 layers, 8 heads of 8, 2 KV heads, MLP 160,
# vocabulary 1,000, untied): P = 3 x 41,088 + 2 x 64,000 + 64 = 251,328 parameters.
# Saved activations per token and layer under bf16-mixed autocast over fp32 weights (residual stream
# fp32, matmul outputs bf16, each linear casting its own input), SDPA, worked from what
# advisor/estimate/activations.py says HF's LlamaDecoderLayer saves (Korthikanti et al. 2022,
# section 4, for the method; their 34sbh + 5as^2b is for a GPT block with 16-bit residuals and
# unfused attention, checked in test_activations.py on a BERT layer):
#   two RMSNorms, each its fp32 input 4h + normalised tensor 4h    = 16h = 1,024
#   autocast's bf16 copies of the norm outputs for q, k, v, gate, up  = 5 x 2h = 640
#   SDPA: q 2x64 + k, v 2 x 2x16 + output 2x64 + fp32 lse 4x8       = 352
#   gated MLP: gate, silu(gate), up, silu(gate)*up, 4 x 2 x 160     = 1,280   -> 3,296 bytes.
# Outside the blocks per token: ids + labels 2 x 8, final norm 8h = 512, head input cast 2h = 128 -> 656 bytes;
# and the RoPE cos/sin tables, 2 x 4 x 8 = 64 bytes a position, once a micro-batch (position_ids (1, s)): 4,096.
TINY_TOKENS = 8 * 64  # micro-batch 8, sequence 64: 512 tokens
TINY_SAVED = TINY_TOKENS * (3 * 3_296 + 656) + 64 * 64  # 5,402,624
TINY_LOSS = TINY_TOKENS * 1000 * 3 * 4  # three fp32 N x V tensors at loss backward: 6,144,000


def test_activations_of_a_tiny_llama_by_hand():
    spec = count_from_config(TINY_CONFIGS["llama_gqa_untied"], name="tiny", source="local")
    dtypes = Dtypes(residual=4, compute=2, input_casts=True)  # autocast over fp32 weights
    acts = estimate_activations(shape_of(spec), dtypes, micro_batch_size=8, seq_len=64, checkpointing=False, eager=False)
    assert acts.saved_bytes == TINY_SAVED == 5_402_624
    assert acts.layer_bytes == TINY_TOKENS * 3_296 == 1_687_552
    # bf16 logits, fp32 copy, log-softmax, and the final norm's fp32 output (4h), held by the model's forward
    assert acts.logits_bytes == TINY_TOKENS * (1000 * (2 + 4 + 4) + 4 * 64) == 5_251_072
    assert acts.loss_transient_bytes == TINY_LOSS
    # At the MLP's product rule: the incoming residual gradient (fp32) and the MLP's two widest gradients
    # (bf16): 4x64 + 2x2x160 (the outgoing residual gradient comes later; tests/estimate/test_block_backward.py).
    assert acts.backward_temp_bytes == TINY_TOKENS * 896 == 458_752
    # Gone before the blocks' backward: the labels (8), the final norm's fp32 input and output (8h) and
    # the head's input cast (2h): 648 bytes a token outside the blocks; the ids and RoPE tables stay.
    assert acts.outside_freed_bytes == TINY_TOKENS * 648 == 331_776
    # Checkpointing keeps each block's fp32 input (4h a token a layer) instead of its saved tensors.
    ckpt = estimate_activations(shape_of(spec), dtypes, micro_batch_size=8, seq_len=64, checkpointing=True, eager=False)
    assert ckpt.saved_bytes == TINY_TOKENS * (3 * 4 * 64 + 656) + 64 * 64 == 733_184


def test_ddp_peak_of_a_tiny_llama_by_hand():
    """bf16-mixed DDP on 2 GPUs, the tiny Llama above, micro-batch 8 x 64 tokens, no checkpointing.

    Model states at rest: fp32 parameters 4P = 1,005,312, AdamW moments 8P = 2,010,624 (gradients
    are allocated in backward). Held all step: DDP's bucket copy of the gradients 4P = 1,005,312.
    Autocast's bf16 weight copies: 2 x (3 x 41,088 + 64,000 head) = 374,528, the head's 128,000 of them freed by
    the head's backward, before any block's, and the top block's down_proj's 2 x 10,240 by down_proj's backward,
    before the MLP's product rule. The four moments:
      end of forward  3,015,936 + saved 5,402,624 + logits 5,251,072 + 1,379,840         = 15,049,472
      loss backward   3,015,936 + saved 5,402,624 + 1,379,840 + loss transient 6,144,000  = 15,942,400
      block backward  3,015,936 + saved 5,402,624 - 331,776 + 1,379,840 - 128,000 - 20,480 + temps 458,752
                      + fp32 gradients of the head and the top block's down_proj 4 x (64,000 + 10,240)
                                                                                        = 10,073,856
      optimizer step  24P (params, grads, moments, sqrt(v) temporary, buckets)           =  6,031,872
    The loss backward wins.
    """
    spec = count_from_config(TINY_CONFIGS["llama_gqa_untied"], name="tiny", source="local")
    mem = estimate_memory(spec, parse_gpus("2xA100"), TrainingConfig(seq_len=64), _impl("ddp"), micro_batch_size=8,
                          checkpointing=False)
    assert mem.peak_phase == "forward_backward"
    assert (mem.params, mem.grads, mem.optimizer, mem.activations, mem.temporary) == (
        1_005_312, 0, 2_010_624, 5_402_624, 7_523_840)
    assert mem.peak_allocated == 15_942_400
    assert mem.at_end_of_forward == 15_049_472
    assert mem.at_block_backward == 10_073_856
    # Runtime overhead, calibrated (profiles/allocator_overhead.json): 0.256 GiB (274,877,906.9, truncated)
    # plus 10.4% of the peak (1,658,009.6, truncated): the allocator's gap, so peak + gap is the reserved
    # figure; then the CUDA context and NCCL outside the allocator, which only the total counts.
    assert mem.reserved == 15_942_400 + 274_877_906 + 1_658_009
    assert mem.outside_allocator == GIB  # CUDA context and NCCL, --context-gib default
    assert mem.runtime_overhead == 274_877_906 + 1_658_009 + GIB


SPECS = [resolve_model(m) for m in ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B",
                                    "openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1")]
settings_ = settings(max_examples=60, deadline=None)
trainings = st.builds(
    TrainingConfig,
    optimizer=st.sampled_from(["adamw", "sgd", "sgd-momentum", "adafactor", "adamw-8bit"]),
    precision=st.sampled_from(["fp32", "bf16-mixed", "fp16-mixed", "bf16"]),
    seq_len=st.sampled_from([128, 512, 2048, 8192]),
    engine=st.sampled_from(["torch", "deepspeed"]),
)


@settings_
@given(spec=st.sampled_from(SPECS), training=trainings, micro=st.integers(1, 8), ckpt=st.booleans(),
       name=st.sampled_from(["zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"]),
       gpus=st.integers(2, 63))
def test_adding_gpus_never_raises_sharded_memory(spec, training, micro, ckpt, name, gpus):
    """From two GPUs on: one GPU runs the plain model, and the second adds DDP's buckets to a torch ZeRO-1
    rank (measured on an H100: no DDP wrapper at one GPU), which halving SGD's empty state cannot pay for
    (Qwen2.5-0.5B, fp32 SGD: 4,496,800,768 -> 6,472,931,840 bytes, the buckets' 4P = 1,976,131,072).
    Not for an MoE under FSDP2 (torch): fully_shard pads the experts' dim 0 to world x ceil(E / world) rows, so an
    unsharded block grows with the world past E (tests/estimate/test_moe_backward.py, measured on the simulator)."""
    impl = _impl(name, training.engine)
    if spec.num_experts and training.engine == "torch" and impl.shard_params:
        return
    small = estimate_memory(spec, parse_gpus(f"{gpus}xH100", nodes=1), training, impl,
                            micro_batch_size=micro, checkpointing=ckpt)
    large = estimate_memory(spec, parse_gpus(f"{gpus + 1}xH100-SXM", nodes=1), training, impl,
                            micro_batch_size=micro, checkpointing=ckpt)
    assert large.peak_allocated <= small.peak_allocated


@settings_
@given(spec=st.sampled_from(SPECS), training=trainings, micro=st.integers(1, 8), ckpt=st.booleans(),
       gpus=st.sampled_from([2, 4, 8, 16]))
def test_more_sharding_never_costs_more(spec, training, micro, ckpt, gpus):
    hw = parse_gpus(f"{gpus}xH100", nodes=1)
    """Except DeepSpeed's ZeRO-3 against its ZeRO-2 (only against ddp): on a model under stage3_max_reuse_distance
    (1e9 elements) ZeRO-3 releases no gathered parameter before backward reuses it, so it holds every parameter as
    ZeRO-2 does and adds the IPG buffer and gradient buffer it keeps from initialisation (Qwen2.5-0.5B in fp32 on 2
    GPUs: 4 x 896^2 = 3,211,264 B more)."""
    names = ("ddp", "zero1", "zero2", "zero3")
    peaks = [estimate_memory(spec, hw, training, _impl(n, training.engine), micro_batch_size=micro,
                             checkpointing=ckpt).peak_allocated for n in names]
    if training.engine == "deepspeed":
        assert peaks[3] <= peaks[0], dict(zip(names, peaks))
        names, peaks = names[:3], peaks[:3]
    assert peaks == sorted(peaks, reverse=True), dict(zip(names, peaks))


@settings_
@given(spec=st.sampled_from(SPECS), training=trainings, micro=st.integers(1, 4), ckpt=st.booleans(),
       name=st.sampled_from(["dp", *ESCALATION]), share=st.floats(0, 1))
def test_freezing_never_raises_memory(spec, training, micro, ckpt, name, share):
    impl = _impl(name, training.engine)
    if not impl.available:
        return
    if spec.num_experts and training.engine == "torch" and share < 1:  # a full MoE fine-tune's block backward is
        return  # read op by op (test_moe_backward.py), a partly frozen one keeps the whole block's gradients: not read
    hw = parse_gpus("4xA100-80GB-SXM")
    full = estimate_memory(spec, hw, training, impl, micro_batch_size=micro, checkpointing=ckpt)
    frozen = estimate_memory(spec.with_trainable(int(spec.total_params * share)), hw, training, impl,
                             micro_batch_size=micro, checkpointing=ckpt)
    assert frozen.peak_allocated <= full.peak_allocated
    if training.engine == "deepspeed" and impl.shard_optimizer:  # ZeRO's flat states get no allocator gap, a
        return  # frozen base's per-parameter tensors do: where the states do not decide the peak it can reserve more
    assert frozen.total <= full.total
