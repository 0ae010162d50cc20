"""A LoRA model's frozen base in the dtype it was loaded in (``TrainingConfig.frozen_base``, ``--frozen-base``): the
trainer recipe under bf16-mixed with the base in bf16 (``compute``, from_pretrained's dtype='auto') and in fp32
(``param``, as TRL loads a model when no dtype is given). The tiny Llama of test_fp32_adapters (hidden 128, 2 blocks,
vocabulary 4,096, untied; LoRA rank 8 on q_proj / v_proj, dropout 0.1), one GPU, micro-batch 2 x 256 tokens. Simulated
peaks (``advisor.simulate.step.simulate``, torch 2.13, fake tensors), recorded: the fp32 base rests at 4 bytes a
weight and autocast saves a bf16 copy of each frozen weight a matmul reads, so without checkpointing it is 4.59 MB
above the bf16 base."""

from __future__ import annotations

import pytest

from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.lora import with_lora
from advisor.model.sources import spec_from_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.estimate.test_fp32_adapters import LORA, TINY

# (frozen_base, checkpointing) -> simulated peak allocated bytes (the loss backward in all four)
SIMULATED = {("compute", False): 32_845_224, ("compute", True): 28_652_968,
             ("param", False): 37_434_024, ("param", True): 32_832_168}


@pytest.mark.parametrize("held,checkpointing", sorted(SIMULATED))
def test_the_estimate_is_within_1_percent_of_the_simulated_step(held, checkpointing):
    training = TrainingConfig(seq_len=256, lora=LORA, recipe="trainer", frozen_base=held)
    spec = with_lora(spec_from_config(TINY, name=TINY["_name_or_path"], source="local"), LORA)
    est = estimate_memory(spec, parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"), micro_batch_size=2,
                          checkpointing=checkpointing)
    assert est.peak_moment == "loss_backward"
    assert abs(est.peak_allocated / SIMULATED[held, checkpointing] - 1) < 0.01


def test_the_recipes_dtype_unless_given():
    """The trainer recipe loads the base as the checkpoint's dtype (compute); lightning builds it in fp32 (param)."""
    assert TrainingConfig(recipe="trainer", lora=LORA).frozen_base_dtype == "compute"
    assert TrainingConfig(recipe="lightning", lora=LORA).frozen_base_dtype == "param"
    assert TrainingConfig(recipe="trainer", lora=LORA, frozen_base="param").frozen_base_dtype == "param"
    assert not TrainingConfig(recipe="trainer", lora=LORA, frozen_base="param").low_precision_base


@pytest.mark.parametrize("options,counts,why", [
    (dict(recipe="trainer"), True, None),
    (dict(recipe="trainer", fsdp_version=1), True, None),  # the Trainer's PEFT wrap policy: adapters in own units
    (dict(recipe="torch", fsdp_version=1), False, "FSDP1 flattens"),
    (dict(recipe="trainer", engine="deepspeed"), False, "DeepSpeed casts"),
    (dict(recipe="trainer", precision="bf16"), False, "every weight in bfloat16"),
])
def test_where_the_bases_dtype_counts(options, counts, why):
    """Only where the loaded dtype is what the base rests in: mixed precision on the torch engine, unquantised, and
    no FSDP1 unit holding the base with its adapters (accelerate upcasts that unit to fp32)."""
    training = TrainingConfig(lora=LORA, frozen_base="param", **options)
    assert training.base_dtype_counts is counts
    assert (training.base_dtype_ignored is None) if why is None else why in training.base_dtype_ignored


def test_the_remedy_is_offered_only_where_it_changes_the_bytes():
    """Qwen2.5-7B LoRA on one RTX 4090 with its base in fp32 offloads; loading the base in bf16 saves 2 bytes a frozen
    weight and names that remedy. Under the torch recipe's FSDP1 the unit is upcast either way: no such remedy."""
    import advisor

    def names(**options):
        plan = advisor.plan("Qwen/Qwen2.5-7B", "1xRTX4090", lora=16, frozen_base="param", **options)
        return [remedy.name for remedy in plan.recommendation.remedies or ()]

    assert "--frozen-base compute" in names(recipe="trainer")
    assert "--frozen-base compute" not in names(recipe="torch", fsdp_version=1)


def test_fsdp1_changes_nothing_where_fsdp_does_not_run():
    """--fsdp-version 1 (an accelerate FSDP1 file) flattens FSDP's units; DDP and DataParallel run no FSDP, so their
    LoRA base rests as loaded (bf16 under the torch recipe): Qwen2.5-7B's 7,615,616,512 weights x 2 bytes plus rank-16
    q/v adapters (28 x 16 x (3,584 + 3,584 + 3,584 + 512) = 5,046,272 weights) x 4 = 15,251,418,112 bytes either
    way; an FSDP1 unit holds the base with its adapters, upcast to fp32 (half of it on each of 2 GPUs)."""
    import advisor

    rest = {}
    for version in (1, 2):
        plan = advisor.plan("Qwen/Qwen2.5-7B", "2xA100", lora=16, fsdp_version=version)
        rest[version] = {c.strategy: c.memory_bytes.states_params for c in plan.candidates if c.memory_bytes}
    assert rest[1]["ddp"] == rest[2]["ddp"] == rest[1]["dp"] == 15_251_418_112
    assert rest[1]["zero3"] == (7_615_616_512 + 5_046_272) * 4 // 2
