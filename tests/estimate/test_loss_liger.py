"""The trainer recipe's --loss fused is Liger's fused linear cross-entropy (the Trainer's use_liger_kernel;
``Recipe.fused_loss_in_place``): a trained head's gradient accumulates in the head's own dtype (torch.zeros_like(weight),
addmm in place; Liger v0.4.2-v0.8.2) and backward scales the kept gradients in place, where wrappers.losses' kernel
keeps an fp32 accumulator, its copy in the head's dtype, and scales out of place. Worked by hand for Llama 3.1 8B's
head (128,256 x 4,096 = 525,336,576 weights), 1,024 tokens, bf16-mixed (fp32 residual, bf16 compute): the input
gradient is 1,024 x 4,096 x 4 = 16,777,216 bytes."""

from __future__ import annotations

from advisor.estimate.activations import Dtypes
from advisor.estimate.activations_loss import loss_bytes
from advisor.estimate.memory import memory_loss_kernel
from advisor.training import TrainingConfig

HEAD, GRAD_INPUT = 128_256 * 4_096, 1_024 * 4_096 * 4
DT = Dtypes(residual=4, compute=2, input_casts=True, buffer=4)


def _backward(kernel: str, **options) -> int:
    return loss_bytes(kernel, tokens=1_024, vocab=128_256, hidden=4_096, dt=DT, **options)[1]


def test_liger_keeps_one_gradient_in_the_heads_dtype():
    assert _backward("fused_in_place") == GRAD_INPUT + 4 * HEAD  # an fp32 head (bf16-mixed's parameters)
    assert _backward("fused_in_place", head_bytes=2) == GRAD_INPUT + 2 * HEAD  # a copy TRL cast to bf16
    assert _backward("fused") == 2 * (GRAD_INPUT + 4 * HEAD)  # wrappers.losses: kept, and its scaled copy


def test_a_frozen_head_keeps_the_input_gradient_once():
    assert _backward("fused_in_place", head_frozen=True) == GRAD_INPUT
    assert _backward("fused", head_frozen=True) == 2 * GRAD_INPUT


def test_the_trainer_runs_liger_and_wrap_runs_its_own():
    assert memory_loss_kernel(TrainingConfig(recipe="trainer", loss="fused")) == "fused_in_place"
    assert memory_loss_kernel(TrainingConfig(recipe="torch", loss="fused")) == "fused"
