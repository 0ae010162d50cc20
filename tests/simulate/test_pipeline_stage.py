"""One pipeline stage on fake tensors (advisor.simulate.pipeline_stage) against bytes worked by hand.

The model is a middle stage of a tiny GPT-2 (one layer a stage, h 64, 2 heads, b 2, s 32, fp32,
exact GELU, SDPA, residual dropout 0.1, no embedding dropout off the first stage), so that every
tensor a micro-batch holds can be listed. bsh = 2 x 32 x 64 = 4096 elements.
"""

from __future__ import annotations

import pytest

from advisor.simulate.pipeline_order import max_in_flight, stage_order
from advisor.training import TrainingConfig

H, B, S, HEADS = 64, 2, 32, 2
BSH = B * S * H
CFG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 3, "n_head": HEADS, "n_embd": H,
       "n_positions": 128, "vocab_size": 256, "activation_function": "gelu", "bos_token_id": 0, "eos_token_id": 0,
       "_name_or_path": "tiny-gpt2"}

# What one micro-batch's forward leaves held on a middle stage, fp32 (4 bytes), until its backward:
HELD_PER_MICROBATCH = (
    BSH * 4                   # the received hidden states (kept for the backward, as Megatron's input_tensor)
    + S * 8                   # position ids (int64), saved by the position embedding's backward
    + BSH * 4 + 2 * B * S * 4  # ln_1: input, mean and rstd
    + BSH * 4                 # c_attn: its input (ln_1's output)
    + 3 * BSH * 4             # c_attn's output: q, k, v, saved by SDPA (views of it)
    + BSH * 4 + B * HEADS * S * 4  # SDPA: output and fp32 log-sum-exp
    + BSH * 4                 # attention c_proj: its input (heads merged, a copy)
    + BSH                     # residual dropout: bool mask
    + BSH * 4 + 2 * B * S * 4  # ln_2: input, mean and rstd
    + BSH * 4                 # c_fc: its input
    + 4 * BSH * 4             # GELU: its input
    + 4 * BSH * 4             # MLP c_proj: its input (GELU's output)
    + BSH                     # residual dropout: bool mask
    + 4                       # the sent output, freed to one element (Megatron's deallocate_output_tensor)
)
# Zero bubble: between B and W a micro-batch keeps each linear layer's input and output gradient
# (Qi et al. 2024, Table 1: M_W). Inputs: c_attn h, c_proj h, c_fc h, MLP c_proj 4h = 7 bsh;
# output gradients: c_attn 3h, c_proj h, c_fc 4h, MLP c_proj h = 9 bsh.
W_STASH = (7 + 9) * BSH * 4
WEIGHT_GRADS = 12 * H * H * 4  # c_attn h x 3h, c_proj h x h, c_fc h x 4h, MLP c_proj 4h x h
# Parameters: the layer (12 h^2 weights, 13 h biases and norm vectors) and three one-row stubs left by a
# middle stage (token embedding 1 x h, GPT-2's positions 128 x 1, the tied head h x 1).
PARAMS = (12 * H * H + 13 * H + H + 128 + H) * 4


@pytest.fixture(scope="module")
def fp32() -> TrainingConfig:
    return TrainingConfig(seq_len=S, precision="fp32", activation_checkpointing="off")


def _steps(peak) -> dict[str, int]:
    """Change in live bytes over each pass of the measured step."""
    out, before = {}, None
    for label, live in peak.live_after:
        if before is not None:
            out[label] = live - before
        before = live
    return out


def test_arithmetic_above():
    assert HELD_PER_MICROBATCH == 304_900 and W_STASH == 262_144 and PARAMS == 200_960


@pytest.mark.parametrize("schedule,stage,expected", [
    ("1f1b", 0, 4), ("1f1b", 3, 1), ("gpipe", 2, 8), ("zb-h1", 0, 4), ("zb-h2", 0, 7), ("zb-h2", 3, 1),
])
def test_in_flight_per_schedule(schedule, stage, expected):
    # 1F1B: p - i; GPipe: m; ZB-H1: as 1F1B; ZB-H2: 2(p - i) - 1 (p = 4, m = 8).
    assert max_in_flight(stage_order(schedule, stage=stage, num_stages=4, num_microbatches=8)) == expected


def test_interleaved_warmup_is_megatrons():
    # Stage 0 of p 4, v 2: (p - 1) x 2 + (v - 1) x p = 10 warm-up chunk forwards, then one more before the
    # first backward: 11 chunks of half a stage, Megatron's 1 + (p - 1) / (p v) = 1.375 times p.
    order = stage_order("interleaved-1f1b", stage=0, num_stages=4, num_microbatches=8, virtual_stages=2)
    assert max_in_flight(order) == 11
    assert sorted(order) == sorted({(k, mb, c) for k in ("F", "BW") for mb in range(8) for c in range(2)})


def test_every_pass_once_and_in_dependency_order():
    order = stage_order("zb-h1", stage=1, num_stages=4, num_microbatches=6)
    for mb in range(6):
        f, b, w = (order.index(("F", mb, 0)), order.index(("B", mb, 0)), order.index(("W", mb, 0)))
        assert f < b < w
    assert len(order) == 18


def test_bad_schedule_is_one_line():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'pipedream'"):
        stage_order("pipedream", stage=0, num_stages=2, num_microbatches=2)


def test_gpipe_holds_each_microbatch_worked_by_hand(fp32):
    from advisor.simulate.pipeline_stage import simulate_stage

    peak = simulate_stage(CFG, schedule="gpipe", stage=1, num_stages=3, num_microbatches=3, micro_batch_size=B,
                          training=fp32)
    steps = _steps(peak)
    assert steps["F1"] == steps["F2"] == HELD_PER_MICROBATCH
    assert steps["BW1"] == steps["BW2"] == -HELD_PER_MICROBATCH  # the weight gradients exist since BW0
    assert peak.params == PARAMS
    # After the step: parameters, AdamW's two moments of the 13 tensors that trained (the token and
    # head stubs get no gradient) with their fp32 step counters, and the input ids (int64).
    adam = 2 * (PARAMS - 2 * H * 4) + 13 * 4
    assert peak.live_after[-1][1] == PARAMS + adam + B * S * 8
    assert peak.max_in_flight == 3


def test_zero_bubble_w_pass_frees_the_stash_worked_by_hand(fp32):
    from advisor.simulate.pipeline_stage import simulate_stage

    # Stage 1 of 3 under ZB-H1 runs F0 F1 B0 F2 B1 W0 B2 W1 W2: W lags B by one pass.
    peak = simulate_stage(CFG, schedule="zb-h1", stage=1, num_stages=3, num_microbatches=3, micro_batch_size=B,
                          training=fp32)
    steps = _steps(peak)
    assert [label for label, _ in peak.live_after][:-1] == ["F0", "F1", "B0", "F2", "B1", "W0", "B2", "W1", "W2"]
    # B frees the micro-batch's graph except the linear inputs (7 bsh of what it held) and adds the output
    # gradients (9 bsh): -(held - 7 bsh) + 9 bsh = -held + the stash.
    assert steps["B1"] == steps["B2"] == -HELD_PER_MICROBATCH + W_STASH
    assert steps["W1"] == steps["W2"] == -W_STASH
    assert steps["W0"] == -W_STASH + WEIGHT_GRADS  # the first W allocates the weight gradients
