"""Autocast's weight casts in the step time (advisor.estimate.autocast_time), worked by hand: which recipes pay
them, the bytes a micro-batch, and that the step grows by exactly their seconds."""

from __future__ import annotations

import pytest

from advisor.estimate.autocast_time import autocast_cast_bytes, autocast_cast_s
from advisor.estimate.step_time import estimate_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.hardware.efficiency import load_efficiency
from advisor.model.lora import LoraConfig
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

# Llama-3.2-1B: 1,235,814,400 parameters, the embedding tied to the head (so cast for the head's matmul).
# Llama-3.1-8B: 8,030,261,248, an untied input embedding of 525,336,576 (a lookup, not cast).
LLAMA1B, LLAMA8B = 1_235_814_400, 8_030_261_248 - 525_336_576


@pytest.fixture(scope="module")
def llama1b():
    return resolve_model("meta-llama/Llama-3.2-1B")


@pytest.fixture(scope="module")
def llama8b():
    return resolve_model("meta-llama/Llama-3.1-8B")


def _bytes(spec, name, *, engine="torch", checkpointing=False, **training):
    return autocast_cast_bytes(spec, TrainingConfig(engine=engine, **training), STRATEGIES[name].on(engine),
                               checkpointing=checkpointing)


def test_ddp_under_bf16_mixed_casts_each_weight_forward_and_its_gradient_backward(llama1b, llama8b):
    # 4 bytes read + 2 written a weight in forward; the gradient 2 read + 4 written in backward; the recompute casts
    # again: 6 x 1,235,814,400 = 7,414,886,400; 6 x 7,504,924,672 = 45,029,548,032.
    assert _bytes(llama1b, "ddp") == (7_414_886_400, 7_414_886_400)
    # The recompute runs the 16 blocks only (60,821,504 parameters each): 6 x 973,144,064 = 5,838,864,384 bytes more
    # in backward; the tied embedding (the head's weight, cast in forward) and the final norm are not cast again.
    assert _bytes(llama1b, "ddp", checkpointing=True) == (7_414_886_400, 7_414_886_400 + 5_838_864_384)
    assert _bytes(llama8b, "zero1") == (6 * LLAMA8B, 6 * LLAMA8B) == (45_029_548_032, 45_029_548_032)


def test_recipes_that_hold_no_fp32_weight_under_autocast_pay_nothing(llama1b):
    assert _bytes(llama1b, "zero3") == (0, 0)  # FSDP2's MixedPrecisionPolicy casts the shard before its all-gather
    assert _bytes(llama1b, "ddp", precision="bf16") == (0, 0)
    assert _bytes(llama1b, "ddp", precision="fp32") == (0, 0)
    assert _bytes(llama1b, "ddp", engine="deepspeed") == (0, 0)  # DeepSpeed holds bf16 weights
    assert _bytes(llama1b, "ddp", lora=LoraConfig(rank=16)) == (0, 0)  # the LoRA base in bf16 (frozen_base compute)


def test_float8_linears_are_cast_to_fp8_by_torchao_not_by_autocast(llama1b):
    """Under --float8 every block linear of Llama-3.2-1B is converted (all dims multiples of 16): per block q 2048 x
    2048, k and v 2048 x 512, o 2048 x 2048, gate and up 2048 x 8192, down 8192 x 2048 = 60,817,408 weights, x 16 =
    973,078,528. Autocast casts the rest once a forward, 262,735,872 (the tied embedding and the norms): 6 x that =
    1,576,415,232 bytes; the recompute casts only the blocks' norms, 16 x 4,096 = 65,536 weights (393,216 bytes)."""
    down, up = _bytes(llama1b, "ddp", float8=True, checkpointing=True)
    assert down == 1_576_415_232 and up == 1_576_415_232 + 393_216

def test_seconds_at_the_measured_shares_of_hbm_bandwidth_and_the_step_grows_by_them(llama1b, monkeypatch):
    """H100 SXM, 3,350 GB/s: the weights' casts down at 0.84 (2.814e12 bytes/s), the gradients' up at 0.55
    (1.8425e12), as measured (benchmarks/results/gpu_cast_bandwidth.md): 7,414,886,400 bytes each way = 2.634999 ms
    forward, 4.024362 ms backward; checkpointed, the recompute's casts down of the blocks' 973,144,064 weights join
    backward (2.074934 ms more: 6.099296 ms). The step
    of one micro-batch grows by exactly the two (the plan without this term: the same call with it taken off)."""
    hw = parse_gpus("1xH100")
    training = TrainingConfig()
    impl = STRATEGIES["ddp"].on("torch")
    fwd, bwd = autocast_cast_s(llama1b, hw, training, impl, load_efficiency(), checkpointing=False)
    assert fwd == pytest.approx(2.634999e-3, rel=1e-6) and bwd == pytest.approx(4.024362e-3, rel=1e-6)
    _, bwd_ckpt = autocast_cast_s(llama1b, hw, training, impl, load_efficiency(), checkpointing=True)
    assert bwd_ckpt == pytest.approx(6.099296e-3, rel=1e-6)
    step = estimate_step_time(llama1b, hw, training, impl, micro_batch_size=4, checkpointing=False)
    assert any(n.startswith("autocast casts the fp32 weights") and "0.007 s a micro-batch at 84% / 55%" in n
               for n in step.notes)
    fsdp = estimate_step_time(llama1b, hw, training, STRATEGIES["zero3"].on("torch"), micro_batch_size=4,
                              checkpointing=False)
    assert not any(n.startswith("autocast casts") for n in fsdp.notes)
    from advisor.estimate import step_time as step_time_module

    monkeypatch.setattr(step_time_module, "autocast_cast_s", lambda *a, **k: (0.0, 0.0))
    without = estimate_step_time(llama1b, hw, training, impl, micro_batch_size=4, checkpointing=False)
    assert step.compute_s - without.compute_s == pytest.approx(2.634999e-3 + 4.024362e-3, rel=1e-6)


def test_fsdp2_on_one_rank_casts_whole_parameters_each_unshard(llama1b):
    """On a group of one FSDP2's copy-in casts the whole fp32 parameter (advisor.estimate.fsdp2_one_rank): Llama-3.2-1B,
    1,235,814,400 parameters, 6 bytes each way. zero3 unshards in forward and again in backward: forward
    7,414,886,400 bytes at 2.814e12 B/s = 2.634999 ms; backward the same again plus the gradients' casts up for the
    reduce, 7,414,886,400 at 1.8425e12 = 4.024362 ms: 6.659361 ms. zero2 keeps the forward's unshard: backward 4.024362
    ms. On 8 ranks the casts are of shards: nothing is added."""
    from advisor.estimate.autocast_time import one_rank_cast_s

    hw, training, eff = parse_gpus("1xH100"), TrainingConfig(), load_efficiency()
    fwd, bwd = one_rank_cast_s(llama1b, hw, training, STRATEGIES["zero3"].on("torch"), eff)
    assert fwd == pytest.approx(2.634999e-3, rel=1e-6) and bwd == pytest.approx(6.659361e-3, rel=1e-6)
    _, bwd2 = one_rank_cast_s(llama1b, hw, training, STRATEGIES["zero2"].on("torch"), eff)
    assert bwd2 == pytest.approx(4.024362e-3, rel=1e-6)
    one = estimate_step_time(llama1b, hw, training, STRATEGIES["zero3"].on("torch"), micro_batch_size=4,
                             checkpointing=False)
    assert any(n.startswith("FSDP2 on one rank casts every fp32 parameter") for n in one.notes)
    eight = estimate_step_time(llama1b, parse_gpus("8xH100"), training, STRATEGIES["zero3"].on("torch"),
                               micro_batch_size=4, checkpointing=False)
    assert not any(n.startswith("FSDP2 on one rank") for n in eight.notes)
    pure = one_rank_cast_s(llama1b, hw, TrainingConfig(precision="bf16"), STRATEGIES["zero3"].on("torch"), eff)
    assert pure == (0.0, 0.0)
