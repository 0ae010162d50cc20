"""One owner for DeepSpeed bucket sizes: the memory estimate, the step time and the exported JSON
agree, with the sizes worked by hand (Qwen2.5-7B: hidden 3584)."""

from __future__ import annotations

from advisor.estimate.strategy_buffers import estimate_strategy_buffers
from advisor.export.deepspeed import build_deepspeed
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

HIDDEN_SQ = 3584 * 3584  # 12,845,056 elements


def test_exported_json_writes_the_buckets_the_estimate_assumed():
    p = plan("Qwen/Qwen2.5-7B", "8xA100", engine="deepspeed", strategy="zero2")
    zero = build_deepspeed(p)["zero_optimization"]
    assert zero["reduce_bucket_size"] == HIDDEN_SQ
    assert zero["allgather_bucket_size"] == HIDDEN_SQ
    spec = resolve_model("Qwen/Qwen2.5-7B")
    training = TrainingConfig(engine="deepspeed")
    buffers = estimate_strategy_buffers(spec, training, STRATEGIES["zero2"].on("deepspeed"), 8)
    # Two IPG buffers (overlap_comm) of one reduce bucket of bf16 gradients each: 2 x 2 bytes x 3584^2, not
    # 2 x 2 x 5e8; beside them in backward the rank's flat gradient partition, 2 x 7,615,616,512 / 8.
    assert buffers.in_backward == 2 * 2 * HIDDEN_SQ + 1_903_904_128 == 1_955_284_352


def test_zero3_json_writes_prefetch_and_live_parameter_caps():
    # context_gib=0: zero3 fits 2 A100s only without the CUDA context; the subject is the bucket sizes.
    p = plan("Qwen/Qwen2.5-7B", "2xA100", engine="deepspeed", strategy="zero3", context_gib=0)
    zero = build_deepspeed(p)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 11_560_550  # 0.9 x 3584^2, floored
    assert zero["stage3_max_live_parameters"] == 10**9  # DeepSpeed's default, which the estimate caps at
