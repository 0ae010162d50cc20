"""Step-time model: hand-checked FLOPs, the directions every term must move in, the efficiency
calibration rule, and the published throughputs of benchmarks/throughput_validation.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from advisor.model.architectures import count_from_config
from advisor.hardware.efficiency import load_efficiency
from advisor.planning.fastest import explain_tradeoff, rank_by_time, time_per_global_batch_s
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import resolve_model
from advisor.estimate.step_time import count_flops, estimate_step_time, matmul_params
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig
from tests.conftest import TINY_CONFIGS

_BENCH = Path(__file__).parents[2] / "benchmarks" / "throughput_validation.py"


def _load_validation():
    spec = importlib.util.spec_from_file_location("throughput_validation", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llama8b():
    return resolve_model("meta-llama/Llama-3.1-8B")


def _time(spec, gpus, name, *, engine="torch", micro=2, ckpt=False, accum=1, interconnect=None, **training):
    hw = parse_gpus(gpus, interconnect=interconnect)
    cfg = TrainingConfig(engine=engine, **training)
    return estimate_step_time(spec, hw, cfg, STRATEGIES[name].on(engine), micro_batch_size=micro,
                              checkpointing=ckpt, gradient_accumulation_steps=accum)


def test_flops_hand_checked():
    # Tiny Llama (hidden 64, 3 layers, 8 heads of 8, 2 KV heads, MLP 160, vocab 1000, untied):
    # per layer q,o 64x64 + k,v 64x16 + 3 MLP 64x160 + 2 norms = 41,088; x3 = 123,264;
    # head 64,000 + final norm 64 -> 187,328 matmul parameters (the input embedding is a lookup).
    spec = count_from_config(TINY_CONFIGS["llama_gqa_untied"], name="tiny", source="params")
    assert matmul_params(spec) == 187_328
    flops = count_flops(spec, tokens=32, seq_len=16, checkpointing=True)
    attention_fwd = 4 * 3 * 64 * 16 * 32  # QK^T and AV, 2 FLOPs per MAC, full (not halved) causal
    assert flops.forward == 2 * 187_328 * 32 + attention_fwd == 12_382_208
    assert flops.backward == 2 * flops.forward
    assert flops.recompute == flops.forward  # checkpointing: exactly one extra forward
    assert flops.model == 6 * 187_328 * 32 + 12 * 3 * 64 * 16 * 32


def test_frozen_parameters_skip_weight_gradients(llama8b):
    full = count_flops(llama8b, tokens=2048, seq_len=2048, checkpointing=False)
    lora = count_flops(llama8b.with_trainable(0), tokens=2048, seq_len=2048, checkpointing=False)
    assert lora.backward < full.backward and lora.forward == full.forward


def test_moe_counts_active_experts_only():
    spec = count_from_config(TINY_CONFIGS["mixtral_moe"], name="moe", source="params")
    assert spec.active_params < spec.total_params
    assert matmul_params(spec) < spec.total_params - spec.embedding_params


def test_more_gpus_less_compute_per_gpu_at_fixed_global_batch(llama8b):
    # Global batch 64: 8 GPUs accumulate 4 micro-batches of 2, 16 GPUs accumulate 2.
    eight = _time(llama8b, "8xA100", "zero3", accum=4)
    sixteen = _time(llama8b, "2x8xA100", "zero3", accum=2)
    assert sixteen.compute_s == pytest.approx(eight.compute_s / 2)
    assert time_per_global_batch_s(sixteen, global_batch_size=64) < time_per_global_batch_s(eight, global_batch_size=64)


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
@pytest.mark.parametrize("gpus", ["8xA100", "2x8xH100"])
def test_zero3_communicates_more_than_zero2(llama8b, engine, gpus):
    z2, z3 = (_time(llama8b, gpus, name, engine=engine) for name in ("zero2", "zero3"))
    assert z3.communication_s > z2.communication_s


@pytest.mark.parametrize("base", ["zero2", "zero3"])
@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_offload_is_slower(llama8b, base, engine):
    plain, offload = (_time(llama8b, "8xA100", name, engine=engine) for name in (base, f"{base}_offload"))
    assert offload.step_s > plain.step_s and offload.offload_s > 0 and plain.offload_s == 0


def test_offload_cpu_step_follows_published_cpu_adam_speed(llama8b):
    # DeepSpeed CPU-Adam is 5-7x faster than torch's CPU AdamW (DeepSpeed ZeRO-Offload tutorial).
    ds = _time(llama8b, "1xA100", "zero2_offload", engine="deepspeed")
    torch = _time(llama8b, "1xA100", "zero2_offload")
    assert 4 < (torch.offload_s / ds.offload_s) < 8


def test_multi_node_communication_slower_than_nvlink(llama8b):
    nvlink = _time(llama8b, "8xA100", "zero3")
    two_nodes = _time(llama8b, "2x4xA100", "zero3", interconnect="ib-hdr")
    ethernet = _time(llama8b, "2x4xA100", "zero3", interconnect="eth-100g")
    assert nvlink.communication_s < two_nodes.communication_s < ethernet.communication_s
    assert ethernet.exposed_communication_s > 0  # one 100 GbE port cannot hide behind backward


def test_single_gpu_has_no_communication(llama8b):
    step = _time(llama8b, "1xH100", "zero3")
    assert step.communication_s == 0 and step.exposed_communication_s == 0


def test_dataparallel_slower_than_ddp():
    spec = resolve_model("openai-community/gpt2")
    ddp, dp = (_time(spec, "4xA100", name, micro=8, seq_len=1024) for name in ("ddp", "dp"))
    assert dp.step_s > ddp.step_s and dp.exposed_communication_s > ddp.exposed_communication_s


def test_checkpointing_costs_time(llama8b):
    off, on = (_time(llama8b, "8xA100", "zero3", ckpt=c) for c in (False, True))
    assert on.compute_s == pytest.approx(off.compute_s * 4 / 3, rel=0.02)
    assert on.mfu < off.mfu and on.hardware_flops_per_gpu > on.model_flops_per_gpu


@pytest.mark.parametrize("name", ["dp", "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"])
@pytest.mark.parametrize("gpus", ["1xA100", "4xA100", "8xH100", "4xRTX4090"])
def test_mfu_between_zero_and_one(llama8b, name, gpus):
    step = _time(llama8b, gpus, name, micro=1)
    assert 0 < step.mfu < 1 and step.step_s >= step.compute_s
    assert step.tokens_per_s == pytest.approx(step.tokens_per_gpu * step.world_size / step.step_s)


def test_precision_picks_the_matching_peak(llama8b):
    assert _time(llama8b, "1xA100", "ddp", precision="fp32").peak_tflops == 19.5
    v100 = _time(llama8b, "1xV100-32GB", "zero3_offload")
    assert v100.peak_tflops == 125.0 and any("bf16" in n for n in v100.notes)


def test_utilisation_is_the_median_of_its_calibration_rows():
    compute = load_efficiency().compute
    for entry in compute.gpus:
        assert entry.calibration, entry.gpus
        assert entry.max_utilisation == pytest.approx(compute.calibrated_max(entry), abs=0.005)


def test_published_throughputs_within_tolerance():
    bench = _load_validation()
    rows = bench.run_cases()
    gated = [r for r in rows if r["gated"]]
    assert len(gated) >= 5
    off = {r["case"]: r["error"] for r in gated if abs(r["error"]) > bench.TOLERANCE}
    assert not off, off


def test_rank_and_explain(llama8b):
    z2 = _time(llama8b, "2x8xA100", "zero2", interconnect="eth-100g", micro=4)
    z3 = _time(llama8b, "2x8xA100", "zero3", interconnect="eth-100g", micro=2, accum=2)
    ranked = rank_by_time([("zero3", z3), ("zero2", z2)])
    assert [name for name, _ in ranked] == ["zero2", "zero3"]
    text = explain_tradeoff(("zero2", z2), ("zero3", z3))
    ratio = time_per_global_batch_s(z3, global_batch_size=64) / time_per_global_batch_s(z2, global_batch_size=64)
    assert f"{ratio:.2f}x faster than zero3" in text and "exposed communication" in text
    assert "default and the fastest" in explain_tradeoff(("zero3", z3), ("zero3", z3))
