"""DeepSpeed ZeRO's own buffers under the deepspeed recipe (advisor/estimate/zero_buffers.py), with byte
counts worked by hand from DeepSpeed's rules (stage_1_and_2.py / stage3.py at edaa722, cited in
profiles/recipes.json) and checked against the published runs of profiles/published_memory.json.

Qwen2.5-7B: P = T = 7,615,616,512 parameters, hidden 3584, so the exported reduce_bucket_size is
3584^2 = 12,845,056 elements. bf16: 2 bytes a parameter, gradient and IPG element."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from advisor.estimate.memory import estimate_memory
from advisor.estimate.states import model_states
from advisor.estimate.strategy_buffers import estimate_strategy_buffers
from advisor.export.deepspeed import build_deepspeed
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig
from profiles import PROFILES_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from published_memory import estimate, published_bytes  # noqa: E402

CASES = {c["id"]: c for c in json.loads((PROFILES_DIR / "published_memory.json").read_text())["cases"]}

P = 7_615_616_512
BUCKET = 12_845_056  # 3584^2
HALF = 3_807_808_256  # P / 2: one rank's partition on 2 GPUs
EIGHTH = 951_952_064  # P / 8


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("Qwen/Qwen2.5-7B")


def _ds(impl: str | None = None) -> TrainingConfig:
    return TrainingConfig(recipe="deepspeed", optimizer_impl=impl)


def test_zero2_backward_holds_two_ipg_buffers_and_the_flat_gradient_partition(qwen7b):
    """setup_buckets: buf_0 and, with overlap_comm (which the export writes), buf_1, each 12,845,056 bf16
    elements = 2 x 2 x 12,845,056 = 51,380,224 B; copy_grads_in_partition: the rank's partition flat,
    2 x 3,807,808,256 = 7,615,616,512 B. Both appear in backward only (the IPG buffers are released at
    its end, the partition freed by the step), so nothing is held at the loss or at rest."""
    buffers = estimate_strategy_buffers(qwen7b, _ds(), STRATEGIES["zero2"].on("deepspeed"), 2)
    assert buffers.in_backward == 51_380_224 + 7_615_616_512 == 7_666_996_736
    assert buffers.persistent == 0 and buffers.at_loss == 0
    zero = build_deepspeed(plan("Qwen/Qwen2.5-7B", "8xA100", recipe="deepspeed", strategy="zero2"))["zero_optimization"]
    assert zero["overlap_comm"] is True and zero["contiguous_gradients"] is True
    assert zero["reduce_bucket_size"] == BUCKET


def test_zero1_backward_holds_the_ipg_buffers_only(qwen7b):
    """ZeRO-1 keeps its gradients as the ZeRO paper counts them (whole, 2 B each) and adds the two IPG
    buffers its hooks fill (overlap_comm): 51,380,224 B in backward."""
    buffers = estimate_strategy_buffers(qwen7b, _ds(), STRATEGIES["zero1"].on("deepspeed"), 2)
    assert buffers.in_backward == 51_380_224 and buffers.persistent == 0


@pytest.mark.parametrize("impl, expected", [
    # fused: the cast is the peak: flat bf16 copy 2 x 3,807,808,256 + its fp32 cast 4 x 3,807,808,256.
    ("fused", 7_615_616_512 + 15_231_233_024),
    # foreach over the one flat fp32 partition: fp32 grad 15,231,233,024 - the freed bf16 partition
    # 7,615,616,512 + one partition-sized temporary 15,231,233,024 = 22,846,849,536 (ties the cast).
    ("foreach", 22_846_849_536),
    # for-loop: two partition-sized temporaries (sqrt and the quotient): 7,615,616,512 + 2 x 15,231,233,024.
    ("for-loop", 38_078_082_560),
])
def test_zero2_step_casts_the_flat_partition_and_steps_it_whole(qwen7b, impl, expected):
    states = model_states(qwen7b, _ds(impl), STRATEGIES["zero2"].on("deepspeed"), 2)
    assert states.step_temporary == expected


def test_zero2_peak_at_the_step_is_twelve_bytes_a_parameter_on_two_gpus(qwen7b):
    """2P (bf16 weights) + 12P/2 (master, m, v) + the cast moment's 2P/2 views + 2P/2 flat copy + 4P/2
    fp32 = 2P + 20P/2 = 12 x 7,615,616,512 = 91,387,398,144 B (the ZeRO paper's 2 + 2/N + 12/N gives
    9P = 68,540,548,608)."""
    hardware = parse_gpus("2xA100-80GB-SXM")
    mem = estimate_memory(qwen7b, hardware, _ds(), STRATEGIES["zero2"].on("deepspeed"), micro_batch_size=1,
                          checkpointing=True)
    assert mem.at_optimizer_step == 12 * P == 91_387_398_144


def test_zero3_holds_its_gradient_buffer_and_one_ipg_buffer_throughout(qwen7b):
    """stage3.py: one IPG buffer from initialisation (2 x 12,845,056 = 25,690,112 B) and the flat gradient
    partition grad_partitions_flat_buffer (2 x 951,952,064 = 1,903,904,128 B on 8 GPUs), beside the
    gathered parameters (2 x 1e9 = stage3_max_live_parameters, under the 6,663,664,448 others')."""
    buffers = estimate_strategy_buffers(qwen7b, _ds(), STRATEGIES["zero3"].on("deepspeed"), 8)
    assert buffers.persistent == 25_690_112
    assert buffers.at_loss == buffers.in_backward == 2_000_000_000 + 1_903_904_128


@pytest.mark.parametrize("world, impl, expected", [
    (8, "fused", 6 * EIGHTH),  # one sub-group of 951,952,064: bf16 flat copy 2 + fp32 cast 4 bytes each
    (2, "fused", 6_000_000_000),  # 3,807,808,256 per rank, stepped in sub-groups of 1e9 (sub_group_size)
    (2, "for-loop", 12_000_000_000),  # fp32 grad 4e9 + two sub-group temporaries 2 x 4e9
])
def test_zero3_step_is_sub_group_sized(qwen7b, world, impl, expected):
    states = model_states(qwen7b, _ds(impl), STRATEGIES["zero3"].on("deepspeed"), world)
    assert states.step_temporary == expected


def test_a_users_own_bucket_sizes_and_overlap_decide_the_ipg_buffers(qwen7b):
    """A config that fixes reduce_bucket_size 5e8 (DeepSpeed's default) and leaves overlap_comm off
    (its ZeRO-1/2 default): buf_0 alone, 2 x 500,000,000 = 1,000,000,000 B, beside the flat partition
    7,615,616,512 B; with overlap_comm on, two: 2,000,000,000 B. ZeRO-3 keeps its one IPG buffer of
    that size and steps in the config's sub_group_size (2e8: bf16 flat copy 2 + fp32 cast 4 bytes each
    under the fused step). The export writes the same values back."""
    def buffers(strategy, world=2, **zero):
        return estimate_strategy_buffers(qwen7b, TrainingConfig(recipe="deepspeed", zero=zero),
                                 STRATEGIES[strategy].on("deepspeed"), world)

    assert buffers("zero2", reduce_bucket_size=500_000_000, overlap_comm=False).in_backward == 8_615_616_512
    assert buffers("zero2", reduce_bucket_size=500_000_000).in_backward == 9_615_616_512
    assert buffers("zero3", 8, reduce_bucket_size=500_000_000).persistent == 1_000_000_000
    training = TrainingConfig(recipe="deepspeed", optimizer_impl="fused", zero={"sub_group_size": 200_000_000})
    assert model_states(qwen7b, training, STRATEGIES["zero3"].on("deepspeed"), 8).step_temporary == 1_200_000_000
    zero = {"reduce_bucket_size": 500_000_000, "overlap_comm": False, "sub_group_size": 200_000_000}
    written = build_deepspeed(plan("Qwen/Qwen2.5-7B", "8xA100", strategy="zero3", recipe="deepspeed",
                                   zero=zero))["zero_optimization"]
    assert (written["reduce_bucket_size"], written["overlap_comm"], written["sub_group_size"]) == (
        500_000_000, False, 200_000_000)


@pytest.mark.parametrize("recipe", ["torch", "trainer", "lightning"])
def test_every_recipe_on_the_deepspeed_engine_holds_zeros_own_buffers(qwen7b, recipe):
    """The buffers are the engine's: HF Trainer, Lightning and wrap() hand their optimizer to
    deepspeed.initialize, which wraps it in ZeRO's. Under each recipe, ZeRO-2 on 2 GPUs holds in backward the
    two IPG buffers and the flat partition (51,380,224 + 7,615,616,512 B, as worked above), and the fused step
    the flat bf16 copy and its fp32 cast (7,615,616,512 + 15,231,233,024 B)."""
    training = TrainingConfig(recipe=recipe, engine="deepspeed", optimizer_impl="fused")
    impl = STRATEGIES["zero2"].on("deepspeed")
    assert estimate_strategy_buffers(qwen7b, training, impl, 2).in_backward == 7_666_996_736
    assert model_states(qwen7b, training, impl, 2).step_temporary == 7_615_616_512 + 15_231_233_024


def test_zero_stage_0_keeps_one_reduce_bucket(qwen7b):
    """ddp on the deepspeed engine (stage 0): one reduce bucket of bf16 gradients at rest,
    2 x 12,845,056 = 25,690,112 B, and nothing else."""
    buffers = estimate_strategy_buffers(qwen7b, _ds(), STRATEGIES["ddp"].on("deepspeed"), 2)
    assert (buffers.persistent, buffers.at_loss, buffers.in_backward) == (25_690_112, 0, 0)


def test_published_zero2_oom_is_judged_not_to_fit_and_zero3_run_to_fit():
    """LLaMA-Factory #1221 (LLaMA-7B, fp16, 8 x V100 32 GB, torch's for-loop AdamW): ZeRO-2 ran out of
    memory in the optimizer step ('28.28 GiB already allocated', asking for 3.14 GiB more: 31.42 GiB);
    the same job trained under ZeRO-3. The step's peak, P = 6,738,415,616: weights 2P = 13,476,831,232 +
    master, m, v 12P/8 = 10,107,623,424 + the fp32 gradient 4P/8 = 3,369,207,808 + two partition-sized
    temporaries 8P/8 = 6,738,415,616 = 33,692,078,080 B = 31.38 GiB, against 31.42 GiB in the message."""
    oom = CASES["lfissue1221-llama7b-zero2-8xv100-oom"]
    est = estimate(oom)
    assert est.allocated == 33_692_078_080
    assert abs(est.allocated / (31.42 * 2**30) - 1) < 0.01  # the message's allocated + request
    assert est.compared("oom")[1] > published_bytes(oom)  # judged not to fit
    trained = CASES["lfissue1221-llama7b-zero3-8xv100"]
    assert estimate(trained).compared("trained")[1] < published_bytes(trained)


def test_zero_flat_states_get_no_allocator_gap():
    """A plain-torch replay of the ZeRO-2 step's allocations (benchmarks/zero2_step_replay.py: Llama-2-7B,
    one rank of two) on an H100 80GB peaked at 75.31 GiB allocated and 75.63 GiB reserved. The estimate's
    reserved at that step is the peak + 0.256 GiB (the calibrated fixed part), not 1.104 x the peak
    (83.40 GiB, over the card): within 1% of the measured 75.63 GiB, and the run is judged to fit."""
    p = plan("meta-llama/Llama-2-7b-hf", "2xA100", recipe="deepspeed", strategy="zero2", seq_len=256,
             micro_batch_size=1)
    mem = p.candidates[0].memory_bytes
    assert mem.peak_moment == "optimizer_step" and mem.peak_allocated == 12 * 6_738_415_616
    assert abs(mem.reserved / (75.63 * 2**30) - 1) < 0.01
    assert p.candidates[0].fits


def test_an_accelerate_export_plans_the_deepspeed_defaults_its_file_runs(qwen7b):
    """accelerate's inline deepspeed_config carries no bucket size or overlap_comm, so DeepSpeed's defaults
    run (reduce_bucket_size 5e8, overlap_comm off for ZeRO-2: profiles/zero_defaults.json) and the export
    plans them: buf_0 alone, 2 x 500,000,000 B, beside the flat partition 2 x 951,952,064 B on 8 GPUs.
    A DeepSpeed JSON writes the plan's own sizes (two buffers of 3584^2)."""
    from advisor.export.formats import format_plan_options

    def backward(fmt):
        options = format_plan_options(fmt, {"recipe": "deepspeed"})
        return estimate_strategy_buffers(qwen7b, TrainingConfig(**options), STRATEGIES["zero2"].on("deepspeed"), 8).in_backward

    assert backward("accelerate") == 1_000_000_000 + 1_903_904_128
    assert backward("deepspeed-json") == 2 * 2 * BUCKET + 1_903_904_128


@pytest.mark.parametrize("recipe", ["torch", "trainer", "deepspeed", "lightning"])
def test_zero_offload_steps_cpu_adam_in_place_under_every_recipe(qwen7b, recipe):
    """A review: under ZeRO-Offload the torch and Lightning recipes counted their foreach AdamW's temporary on the host
    (170 GiB a node against 156 under the Trainer). DeepSpeed steps DeepSpeedCPUAdam in place on the host's fp32
    partition, its gradient already there, with no flattened or cast copy (stage_1_and_2.py step's cpu_offload
    branch), and refuses a client optimizer there by default (zero_force_ds_cpu_optimizer). So no step temporary,
    and the host holds 2 + 2 + 12 bytes a parameter per rank: 16 x 7,615,616,512 / 8 = 15,231,233,024 B on 8 GPUs."""
    training = TrainingConfig(recipe=recipe, engine="deepspeed")
    impl = STRATEGIES["zero3_offload"].on("deepspeed")
    assert model_states(qwen7b, training, impl, 8).step_temporary == 0
    mem = estimate_memory(qwen7b, parse_gpus("8xH100"), training, impl, micro_batch_size=1, checkpointing=True)
    assert mem.cpu_bytes == 16 * P // 8 == 15_231_233_024
