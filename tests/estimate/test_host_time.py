"""The host floor of a step (advisor.estimate.host_time): operators counted by hand from the profile's counts, and
plans set against steps measured on an H200 (benchmarks/results/gpu_stacks.jsonl, timed under the Trainer)."""

from __future__ import annotations

import pytest

import advisor
from advisor.estimate import host_time
from advisor.model.lora import LoraConfig
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

BERT = "google-bert/bert-large-uncased"
# The Trainer's job of each timed row (benchmarks/gpu_stacks_report.job): one H200, the plain model
BERT_JOB = dict(gpus="1xH200", strategy="ddp", recipe="trainer", task="sequence-classification", num_labels=2,
                optimizer_impl="fused", seq_len=512, attention="eager")


@pytest.fixture(scope="module")
def bert():
    return resolve_model(BERT)


def _ops(spec, strategy="ddp", *, checkpointing=False, **training):
    return host_time.host_ops(spec, TrainingConfig(**training), STRATEGIES[strategy].on("torch"),
                              checkpointing=checkpointing)


def test_bert_large_operators_a_micro_batch_worked_by_hand(bert):
    # profiles/host_overhead.json, bert: a block 71 forward + 118 backward, outside 30 + 40; 24 blocks
    assert _ops(bert, precision="fp32") == 24 * (71 + 118) + 30 + 40 == 4_606
    # autocast over the fp32 weights: 92 + 140 a block, 36 + 46 outside
    assert _ops(bert, precision="bf16-mixed") == 24 * (92 + 140) + 36 + 46 == 5_650
    # checkpointed: the recompute in backward, 70 + 235 a block
    assert _ops(bert, precision="fp32", checkpointing=True) == 24 * (70 + 235) + 30 + 40 == 7_390
    # FSDP2's MixedPrecisionPolicy casts shards, not under autocast: the plain count
    assert _ops(bert, "zero3", precision="bf16-mixed") == 4_606


def test_lora_freezes_the_blocks_weight_gradients_and_adds_its_adapters(bert):
    # PEFT's default targets for BERT are query and value: 2 adapters a block, 48 in all. A frozen block runs 71 + 66
    # operators (the base's weight gradients gone), each adapter 10 + 20.2, outside the blocks 30 + 0 (nothing there
    # trains); under autocast the block keeps autocast's casts: 232 - (189 - 137) = 180 a block
    assert _ops(bert, precision="fp32", lora=LoraConfig(rank=16)) == round(24 * 137 + 30 + 48 * 30.2) == 4_768
    assert _ops(bert, precision="bf16-mixed", lora=LoraConfig(rank=16)) == round(24 * 180 + 30 + 48 * 30.2) == 5_800


@pytest.mark.parametrize("row, measured, tolerance", [
    # bert-bs2: fp32, 2 x 512 tokens, 0.0869 s a step measured; the GPU work alone is 0.059 s
    (dict(precision="fp32", micro_batch_size=2, activation_checkpointing="off"), 0.0869, 0.05),
    # bert-bs1-fp16: 1 x 512 tokens under fp16 autocast, 0.102 s measured; 0.008 s of GPU work
    (dict(precision="fp16-mixed", micro_batch_size=1, activation_checkpointing="off"), 0.102, 0.10),
    # bert-bs1-ga4-gc-fp16: 4 micro-batches of 1 x 512 a step, checkpointed (the recompute's operators in backward),
    # 0.700 s measured; 0.029 s of GPU work
    (dict(precision="fp16-mixed", micro_batch_size=1, activation_checkpointing="on", global_batch_size=4), 0.700, 0.10),
])
def test_bert_steps_on_the_floor_match_the_h200(row, measured, tolerance):
    step = advisor.plan(BERT, **{**BERT_JOB, **row}).chosen.step_time_s
    assert step == pytest.approx(measured, rel=tolerance)


def test_held_out_qwen_small_micro_batch_is_host_bound():
    # speed-qwen0.5b-bf16-small, held out of the fit: Qwen2.5-0.5B under the Trainer, bf16 autocast over fp32 weights,
    # 1 x 256 tokens, 0.139 s a step measured on the H200, where its GPU work is 0.009 s
    plan = advisor.plan("Qwen/Qwen2.5-0.5B", gpus="1xH200", strategy="ddp", recipe="trainer", precision="bf16-mixed",
                        optimizer_impl="fused", micro_batch_size=1, seq_len=256, activation_checkpointing="off")
    assert plan.chosen.step_time_s == pytest.approx(0.139, rel=0.2)
    assert any(note.startswith("host-bound") for note in plan.chosen.step_time.notes)


def test_large_micro_batches_and_compile_are_not_floored():
    job = dict(gpus="8xH100", strategy="zero3", micro_batch_size=1, seq_len=4096)
    with host_time.floor_disabled():
        gpu_only = advisor.plan("Qwen/Qwen2.5-7B", **job).chosen.step_time_s
    assert advisor.plan("Qwen/Qwen2.5-7B", **job).chosen.step_time_s == gpu_only  # 7B at 4,096 tokens: far above
    small = dict(gpus="1xH200", strategy="ddp", micro_batch_size=1, seq_len=256)
    with host_time.floor_disabled():
        compiled = advisor.plan("Qwen/Qwen2.5-0.5B", compile=True, **small).chosen.step_time_s
    assert advisor.plan("Qwen/Qwen2.5-0.5B", compile=True, **small).chosen.step_time_s == compiled
    assert advisor.plan("Qwen/Qwen2.5-0.5B", **small).chosen.step_time_s > compiled
