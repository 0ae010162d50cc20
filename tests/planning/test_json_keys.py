"""Derived values are properties, and --json keeps its keys where readers have always found them: the two
checkpointing booleans read the one stored mode, step_time_s the step time, a recommendation's strategy, batch,
checkpointing and mesh its candidate, a breakdown's peak_phase its peak_moment."""

from __future__ import annotations

import pytest

from advisor.planning.api import plan
from advisor.planning.compare import compare

# The keys and their order as `advisor plan --json` wrote them before the mode became the stored field.
CANDIDATE_KEYS = ["strategy", "engine", "available", "unavailable_reason", "runs_as", "fits", "micro_batch_size",
                  "gradient_accumulation_steps", "activation_checkpointing", "selective_checkpointing",
                  "memory_bytes", "memory_range", "capacity_bytes", "cpu_memory_bytes", "cpu_capacity_bytes",
                  "step_time_s", "step_time", "mesh"]
BREAKDOWN_KEYS = ["params", "grads", "optimizer", "activations", "temporary", "runtime_overhead", "outside_allocator",
                  "cpu_bytes", "peak_phase", "peak_moment", "states_params", "states_grads", "states_optimizer",
                  "states_on_cpu", "at_start_of_forward", "at_end_of_forward", "at_loss_backward", "at_block_backward",
                  "at_end_of_backward", "at_optimizer_step", "peak_allocated", "total", "allocator_gap", "reserved",
                  "states_total"]
RECOMMENDATION_KEYS = ["strategy", "engine", "micro_batch_size", "activation_checkpointing", "selective_checkpointing",
                       "gradient_accumulation_steps", "reason", "alternatives", "mesh", "remedies"]


@pytest.fixture(scope="module")
def long_plan():
    # Llama-3.1-8B at 8k tokens on 8 H100s: zero2 fits only with selective checkpointing
    # (tests/wrappers/test_selective_checkpointing.py), and the data-parallel family is tried with checkpointing.
    return plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=8192)


def test_the_json_keeps_the_two_keys_in_place(long_plan):
    doc = long_plan.model_dump(mode="json")
    assert [list(c) for c in doc["candidates"]] == [CANDIDATE_KEYS] * len(doc["candidates"])
    assert list(doc["recommendation"]) == RECOMMENDATION_KEYS
    rec = doc["recommendation"]
    assert (rec["strategy"], rec["activation_checkpointing"], rec["selective_checkpointing"]) == ("zero2", True, True)
    assert "checkpointing" not in doc["recommendation"] and "checkpointing" not in doc["candidates"][0]


def test_the_booleans_read_the_mode(long_plan):
    for cand in long_plan.candidates:
        assert cand.activation_checkpointing == (cand.checkpointing != "off")
        assert cand.selective_checkpointing == (cand.checkpointing == "selective")
        assert cand.step_time_s == (cand.step_time.step_s if cand.step_time is not None else None)
    assert long_plan.recommendation.checkpointing == long_plan.chosen.checkpointing == "selective"


def test_an_unavailable_candidate_has_no_mode():
    # DataParallel is one process: refused on two nodes before any estimate.
    dp = plan("Qwen/Qwen2.5-0.5B", "2x8xH100").candidate("dp")
    assert (dp.available, dp.checkpointing, dp.activation_checkpointing, dp.selective_checkpointing) == (
        False, None, None, False)
    assert dp.model_dump(mode="json")["activation_checkpointing"] is None


def test_compare_keeps_its_keys():
    doc = compare("Qwen/Qwen2.5-0.5B", "1xA100", activation_checkpointing="selective").model_dump(mode="json")
    row = doc["results"][0]
    assert list(row)[4:11] == ["strategy", "mesh", "micro_batch_size", "gradient_accumulation_steps",
                               "activation_checkpointing", "selective_checkpointing", "memory_per_gpu_bytes"]
    assert (row["activation_checkpointing"], row["selective_checkpointing"]) == (True, True)


def test_the_recommendation_reads_its_candidate(long_plan):
    rec, chosen = long_plan.recommendation, long_plan.chosen
    assert rec.candidate is chosen
    assert (rec.strategy, rec.engine, rec.micro_batch_size, rec.gradient_accumulation_steps, rec.mesh) == (
        "zero2", "torch", 1, 1, None)  # one micro-batch a step: no --global-batch
    assert "candidate" not in long_plan.model_dump(mode="json")["recommendation"]


def test_the_breakdown_keeps_its_keys_and_phase(long_plan):
    doc = long_plan.model_dump(mode="json")
    # FSDP's cached gradient blocks (gradient_stream_pool) and the blocks cached around recomputation
    # (recompute_cache) are written after peak_moment where there are any.
    assert [list(c["memory_bytes"]) for c in doc["candidates"]] == [
        [*BREAKDOWN_KEYS[:10], *(["gradient_stream_pool"] if c["memory_bytes"].get("gradient_stream_pool") else []),
         *(["recompute_cache"] if c["memory_bytes"].get("recompute_cache") else []),
         *BREAKDOWN_KEYS[10:]] for c in doc["candidates"]]
    assert [c["strategy"] for c in doc["candidates"] if "gradient_stream_pool" in c["memory_bytes"]] == [
        "zero2", "zero3"]  # the sharded strategies on the GPU: offload sends the shards to the CPU
    # The (peak_moment, peak_phase) pairs this plan's JSON had when peak_phase was a stored field.
    assert {c["strategy"]: (c["memory_bytes"]["peak_moment"], c["memory_bytes"]["peak_phase"])
            for c in doc["candidates"]} == {
        "dp": ("loss_backward", "forward_backward"), "ddp": ("optimizer_step", "optimizer_step"),
        "zero1": ("optimizer_step", "optimizer_step"), "zero2": ("loss_backward", "forward_backward"),
        "zero3": ("loss_backward", "forward_backward"), "zero2_offload": ("loss_backward", "forward_backward"),
        "zero3_offload": ("loss_backward", "forward_backward")}
