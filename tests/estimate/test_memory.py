"""The memory model: hand-checked figures and invariants that must hold for any input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.hardware.cluster import parse_gpus
from advisor.estimate.memory import estimate_memory, model_states
from advisor.model.sources import resolve_model
from advisor.model.spec import spec_from_size
from advisor.strategies import ESCALATION, STRATEGIES
from advisor.training import TrainingConfig

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


def test_torch_ddp_fp32_adamw_by_hand():
    """A tiny model worked by hand: fp32 DDP + AdamW at the optimizer step.

    params 4P + grads 4P + exp_avg/exp_avg_sq 8P + foreach sqrt(v) temporary 4P + DDP buckets 4P = 24P.
    """
    spec = resolve_model("openai-community/gpt2")
    p = spec.total_params
    mem = estimate_memory(spec, parse_gpus("2xA100"), TrainingConfig(precision="fp32", seq_len=128), _impl("ddp"),
                          micro_batch_size=1, checkpointing=True)
    assert mem.peak_phase == "optimizer_step"
    assert (mem.params, mem.grads, mem.optimizer, mem.temporary) == (4 * p, 4 * p, 8 * p, 8 * p)
    assert mem.peak_allocated == 24 * p


def test_torch_fsdp_shards_states():
    """FSDP2 zero3 on 4 GPUs, fp32 SGD (no state): parameters and gradients are quartered."""
    spec = resolve_model("openai-community/gpt2")
    states = model_states(spec, TrainingConfig(precision="fp32", optimizer="sgd"), _impl("zero3"), 4)
    assert states.params == -(-4 * spec.total_params // 4) and states.optimizer == 0


def test_breakdown_sums_to_peak():
    spec = resolve_model("Qwen/Qwen2.5-7B")
    for name in STRATEGIES:
        mem = estimate_memory(spec, parse_gpus("8xH100"), TrainingConfig(), _impl(name), micro_batch_size=2,
                              checkpointing=False)
        assert mem.params + mem.grads + mem.optimizer + mem.activations + mem.temporary == mem.peak_allocated
        assert mem.total == mem.peak_allocated + mem.runtime_overhead


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
       gpus=st.integers(1, 63))
def test_adding_gpus_never_raises_sharded_memory(spec, training, micro, ckpt, name, gpus):
    impl = _impl(name, training.engine)
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
    peaks = [estimate_memory(spec, hw, training, _impl(n, training.engine), micro_batch_size=micro,
                             checkpointing=ckpt).peak_allocated for n in ("ddp", "zero1", "zero2", "zero3")]
    assert peaks == sorted(peaks, reverse=True), dict(zip(("ddp", "zero1", "zero2", "zero3"), peaks))


@settings_
@given(spec=st.sampled_from(SPECS), training=trainings, micro=st.integers(1, 4), ckpt=st.booleans(),
       name=st.sampled_from(["dp", *ESCALATION]), share=st.floats(0, 1))
def test_freezing_never_raises_memory(spec, training, micro, ckpt, name, share):
    impl = _impl(name, training.engine)
    if not impl.available:
        return
    hw = parse_gpus("4xA100-80GB-SXM")
    full = estimate_memory(spec, hw, training, impl, micro_batch_size=micro, checkpointing=ckpt)
    frozen = estimate_memory(spec.with_trainable(int(spec.total_params * share)), hw, training, impl,
                             micro_batch_size=micro, checkpointing=ckpt)
    assert frozen.total <= full.total
