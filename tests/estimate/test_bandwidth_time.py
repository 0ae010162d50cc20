"""A GPU whose utilisation was fitted on another GPU's runs (advisor.estimate.bandwidth_time): its blocks'
eager elementwise kernels move at its own HBM bandwidth. Worked by hand on Llama-3.1-8B, H200 (4,800 GB/s)
against the H100 SXM (3,350 GB/s) whose fit it takes."""

from __future__ import annotations

import json

import pytest

import advisor
from advisor.hardware.catalog import load_catalog
from advisor.hardware.cluster import parse_gpus
from profiles import PROFILES_DIR

# Llama-3.1-8B: h 4096, q 4096, kv 1024, hd 128, f 14336, 32 layers; bf16 activations (a = 2, cast = 6).
# Eager forward a token and block (compile_time's op list): two norms 2 x (2 cast h + 20h + 2a h + 24) = 2 x
# 147,480; two residual adds 2 x 3a h = 49,152; RoPE 10a (q + kv) + 2 x 2a hd = 102,400 + 1,024; silu and
# up 5a f = 143,360: 590,896. Backward: MLP 9a f = 258,048; five accumulations 15a h = 122,880; two norms
# 2 x (6a h + 2 cast h + 68h + 40) = 753,744; RoPE 11a (q + kv) + 2 x 2a hd = 112,640 + 1,024; the q/k copies
# 2a (q + kv) = 20,480: 1,268,816. Eager in all 1,859,712.
EAGER = 590_896 + 1_268_816
# Compiled (inductor's kernels): forward (2a h + 4) + 5a (q + kv) + 2 x 2a hd + (3a h + 4) + 3a f + 4a h = 211,976;
# backward 5a f + (6a h + 4) + 2a (q + kv) + 2 x 2a hd + (7a h + 8) + (6a h + 4) = 320,528.
COMPILED = 211_976 + 320_528
HBM_EFFICIENCY = 0.7  # profiles/efficiency.json optimizer_step.hbm_efficiency, which compile_time also uses


def _step(gpus: str, **knobs):
    plan = advisor.plan("meta-llama/Llama-3.1-8B", parse_gpus(gpus), strategy="zero3", micro_batch_size=1,
                        seq_len=2048, activation_checkpointing="off", optimizer="sgd", **knobs)
    return plan.candidate("zero3").step_time


def _seconds(bytes_a_token_block: int) -> float:
    """32 layers x 2,048 tokens x bytes x (1/4,800 - 1/3,350) GB/s / 0.7: negative, the H200 is faster."""
    return 32 * 2048 * bytes_a_token_block * (1 / 4800 - 1 / 3350) / (1e9 * HBM_EFFICIENCY)


def test_eager_step_moves_by_its_eager_bytes():
    h100, h200 = _step("8xH100-80GB-SXM"), _step("8xH200")
    assert h200.compute_s - h100.compute_s == pytest.approx(_seconds(EAGER), rel=1e-9)  # -0.0157 s
    assert not any("HBM:" in note for note in h100.notes)
    assert any("H200 moves 4,800 GB/s, the H100-80GB-SXM its utilisation was fitted on 3,350" in note
               and "less" in note for note in h200.notes)


def test_compiled_step_moves_by_its_compiled_bytes_only():
    """Compiled, each GPU runs the fitted eager time less the eager bytes at the fit's bandwidth plus the compiled
    bytes at its own: the two GPUs differ by the compiled bytes alone (what a fused block still moves)."""
    h100, h200 = _step("8xH100-80GB-SXM", compile=True), _step("8xH200", compile=True)
    assert h200.compute_s - h100.compute_s == pytest.approx(_seconds(COMPILED), rel=1e-9)


def test_slower_hbm_is_slower():
    """The 40 GB A100 (1,555 GB/s) takes the A100-80GB SXM fit (2,039): more time, never less."""
    a100_80, a100_40 = _step("8xA100-80GB-SXM"), _step("8xA100-40GB-SXM")
    shift = 32 * 2048 * EAGER * (1 / 1555 - 1 / 2039) / (1e9 * HBM_EFFICIENCY)
    assert a100_40.compute_s - a100_80.compute_s == pytest.approx(shift, rel=1e-9)  # +0.0266 s
    assert any("more (advisor.estimate.bandwidth_time)" in note for note in a100_40.notes)


def test_uncounted_block_keeps_the_fitted_time_and_says_so():
    """A mixture-of-experts block is not in compile_time's op lists: the H200 runs it in the H100's time."""
    def step(gpus):
        plan = advisor.plan("mistralai/Mixtral-8x7B-v0.1", parse_gpus(gpus), strategy="zero3", micro_batch_size=1,
                            seq_len=2048, optimizer="sgd")
        return plan.candidate("zero3").step_time

    h100, h200 = step("8xH100-80GB-SXM"), step("8xH200")
    assert h200.compute_s == h100.compute_s
    assert any("a moe block's elementwise kernels are not counted" in note for note in h200.notes)


def test_calibration_bandwidths_are_the_gpus_own():
    """Each group names the GPU its rows ran on, one of its own, with that GPU's datasheet bandwidth."""
    catalog = load_catalog()
    groups = json.loads((PROFILES_DIR / "efficiency.json").read_text())["compute"]["gpus"]
    for group in groups:
        assert group["calibration_gpu"] in group["gpus"]
        assert group["calibration_hbm_gbps"] == catalog.gpu(group["calibration_gpu"]).hbm_bandwidth_gbps
