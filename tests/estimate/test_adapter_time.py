"""The LoRA adapters' memory traffic in the step time (advisor.estimate.adapter_time), worked by hand."""

from __future__ import annotations

import pytest

from advisor.estimate.adapter_time import adapter_bytes, adapter_bytes_per_token
from advisor.estimate.step_time import count_flops, estimate_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.model.lora import LoraConfig, with_lora
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

QV16 = LoraConfig(rank=16, targets=("q_proj", "v_proj"))


def _compute_s(spec, training: TrainingConfig, *, ckpt: bool) -> float:
    run = estimate_step_time(spec, parse_gpus("1xA100-80GB-SXM"), training, STRATEGIES["ddp"].on("torch"),
                             micro_batch_size=1, checkpointing=ckpt)
    return run.compute_s


@pytest.mark.usefixtures("gpu_work_only")
def test_llama2_7b_lora_r16_qv_by_hand():
    """Llama-2-7B (32 blocks, hidden 4096, 32 heads: q and v both 4096 -> 4096), LoRA r16 on q,v, no dropout,
    pure bf16 (c = 2 B, no input casts), one micro-batch of 1 x 512 tokens on one A100-80GB SXM.

    FLOPs, already in count_flops: adapters 2 targets x 16 x (4096 + 4096) = 262,144 a block, 8,388,608
    in all; forward 2 x 8,388,608 x 512 = 8,589,934,592 FLOPs more than the base's.

    Bytes a token of one adapter (PEFT's Linear.forward):
      forward  2 x (4096 x-read by lora_A + 2 x 16 + 6 x 4096 [B writes out, * scaling r+w, + r2 w1]) = 57,408
      backward 2 x (5 x 4096 [A's grad write, A's weight grad read, grad accumulation r2 w1]
                    + 4 x 4096 [scaling grad r+w, B's input and weight grads read] + 4 x 16)        = 73,856
    A micro-batch: x 2 adapters x 32 blocks x 512 tokens = 32,768: forward 1,881,145,344 B, backward
    2,420,113,408 B. A100-80GB SXM 2,039 GB/s x 0.9 = 1,835.1 GB/s:
      no checkpointing 4,301,258,752 B -> 2.343882e-3 s; checkpointing (+ one forward) 6,182,404,096 B
      -> 3.368974e-3 s.
    """
    base = resolve_model("meta-llama/Llama-2-7b-hf")
    spec = with_lora(base, QV16)
    assert (count_flops(spec, tokens=512, seq_len=512, checkpointing=False).forward
            - count_flops(base, tokens=512, seq_len=512, checkpointing=False).forward) == 8_589_934_592
    assert adapter_bytes_per_token(4096, 4096, 16, compute_bytes=2, input_casts=False, dropout=False) == (57_408, 73_856)
    assert adapter_bytes(spec, QV16, tokens=512, compute_bytes=2, input_casts=False) == (1_881_145_344, 2_420_113_408)
    for ckpt, by_hand in ((False, 2.343882e-3), (True, 3.368974e-3)):
        with_adapters = _compute_s(spec, TrainingConfig(precision="bf16", seq_len=512, lora=QV16), ckpt=ckpt)
        without = _compute_s(spec, TrainingConfig(precision="bf16", seq_len=512), ckpt=ckpt)
        assert with_adapters - without == pytest.approx(by_hand, rel=1e-6), ckpt


def test_dropout_and_autocast_casts_by_hand():
    """One 4096 -> 4096 adapter, r16, bf16 activations, dropout on an fp32-cast input (bf16 base under
    bf16-mixed: PEFT casts x to the fp32 adapters' dtype, autocast casts it back for lora_A):
    casts 2 x (2 + 4) x 4096 = 49,152 and dropout (2 x 4 + 1 mask) x 4096 = 36,864 B a token each way:
    forward 57,408 + 86,016 = 143,424, backward 73,856 + 86,016 = 159,872."""
    assert adapter_bytes_per_token(4096, 4096, 16, compute_bytes=2, input_casts=True, dropout=True) == (143_424, 159_872)
    # without casts the dropout moves bf16: (2 x 2 + 1) x 4096 = 20,480 more each way
    assert adapter_bytes_per_token(4096, 4096, 16, compute_bytes=2, input_casts=False, dropout=True) == (77_888, 94_336)


def test_no_lora_no_charge():
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    run = estimate_step_time(spec, parse_gpus("1xA100-80GB-SXM"), TrainingConfig(precision="bf16"),
                             STRATEGIES["ddp"].on("torch"), micro_batch_size=1, checkpointing=True)
    assert not any("LoRA adapters" in note for note in run.notes)


# What one adapter added to inductor's forward and backward graphs of a frozen bf16 Llama block (h 256, f 704,
# 8 heads, 2 kv heads of 32: q 256, kv 64), rank 8, bytes a token: measured by
# `PYTHONPATH=$PWD python benchmarks/compile_bytes.py --lora` (benchmarks/results/compile_bytes.md, LoRA section).
MEASURED_COMPILED = {"q_proj": (256, 256, 1_024, 1_536), "k_proj": (256, 64, 256, 768),
                     "v_proj": (256, 64, 384, 768), "o_proj": (256, 256, 1_024, 2_048),
                     "gate_proj": (256, 704, 2_816, 1_920), "up_proj": (256, 704, 2_816, 1_920),
                     "down_proj": (704, 256, 512, 2_432)}


@pytest.mark.parametrize("name", sorted(MEASURED_COMPILED))
def test_compiled_adapter_elementwise_matches_inductor(name):
    """The compiled count less the two skinny GEMMs (extern kernels, not in inductor's count: forward
    2 x (in + 2r + out), backward 2 x (2 in + 2 out + 4r)) is what inductor measured for that target."""
    fan_in, fan_out, fwd, bwd = MEASURED_COMPILED[name]
    f, b = adapter_bytes_per_token(fan_in, fan_out, 8, compute_bytes=2, input_casts=False, dropout=False,
                                   compiled_as=name)
    assert (f - 2 * (fan_in + 16 + fan_out), b - 2 * (2 * fan_in + 2 * fan_out + 32)) == (fwd, bwd)


def test_compiled_llama2_7b_qv_by_hand():
    """Llama-2-7B, LoRA r16 on q and v (4096 -> 4096 each), bf16, 1 x 512 tokens, under --compile.
    q: forward 2 x (4096 + 32 + 4096) GEMMs + 2 x 2 x 4096 = 32,832; backward 2 x (8192 + 8192 + 64) + 2 x (4096 +
    2 x 4096) = 57,472. v: forward 16,448 + 2 x 3 x 4096 = 41,024; backward 57,472. A token 73,856 / 114,944 (eager
    114,816 / 147,712); x 32 blocks x 512 tokens = 16,384: 1,210,056,704 / 1,883,242,496 B. A fused qkv_proj, not in
    the table, keeps the eager count."""
    spec = with_lora(resolve_model("meta-llama/Llama-2-7b-hf"), QV16)
    assert adapter_bytes(spec, QV16, tokens=512, compute_bytes=2, input_casts=False, compiled=True) == \
        (1_210_056_704, 1_883_242_496)
    assert adapter_bytes_per_token(4096, 12288, 16, compute_bytes=2, input_casts=False, dropout=False,
                                   compiled_as="qkv_proj") == \
        adapter_bytes_per_token(4096, 12288, 16, compute_bytes=2, input_casts=False, dropout=False)


def test_fp32_adapters_without_autocast_by_hand():
    """PEFT's fp32 adapters under pure bf16 (the trainer recipe), 4096 -> 4096, rank 16, no dropout, a = 4, c = 2.
    Forward: the skinny products 4 x (4096 + 32 + 4096) = 32,896; * scaling, the fp32 sum and its cast back
    (5 x 4 + 2 x 2) x 4096 = 98,304; the input's cast to fp32 (2 + 4) x 4096 = 24,576: 155,776. Backward: the products
    4 x (8192 + 8192 + 64) = 65,792; on the output side the scaling's gradient, and two casts back to bf16 (the
    gradient of ``result.to`` and the add's promoted base output's): (2 x 4 + 2 x (4 + 2)) x 4096 = 81,920; on the
    input side the input cast's and the sum with the base layer's input gradient, (4 + 2 + 3 x 2) x 4096 = 49,152:
    196,864 (the ops as PEFT 0.21's Linear.forward runs them, logged op by op on a bf16 base with fp32 adapters).
    With dropout 9 x 4096 = 36,864 more each way."""
    assert adapter_bytes_per_token(4096, 4096, 16, compute_bytes=2, input_casts=False, dropout=False,
                                   fp32_adapters=True) == (155_776, 196_864)
    assert adapter_bytes_per_token(4096, 4096, 16, compute_bytes=2, input_casts=False, dropout=True,
                                   fp32_adapters=True) == (155_776 + 36_864, 196_864 + 36_864)
