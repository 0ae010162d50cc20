"""torch before 2.0: ``zero_grad()`` filled the gradients with zeros instead of freeing them
(profiles/library_releases.json ``zero_grad_sets_to_none``), so they stay allocated through the next step's
forward and backward. Measured on the simulated step, which runs ``zero_grad(set_to_none=False)`` for such a
release, and worked by hand. CPU only.

The tiny untied Llama of tests/estimate/test_accumulation.py: P = 1,141,056 parameters, all trainable, fp32
gradients (bf16-mixed AdamW): 4 x P = 4,564,224 bytes of gradients on a replica.
"""

from __future__ import annotations

import pytest

from advisor.simulate.step import simulate
from advisor.training import TrainingConfig
from tests.estimate.test_accumulation import TINY, _estimate

pytestmark = pytest.mark.filterwarnings("ignore")  # transformers warnings at model build


@pytest.mark.parametrize(("strategy", "world", "recipe"), [
    ("ddp", 1, "trainer"), ("ddp", 2, "torch"), ("zero2", 2, "torch"), ("zero3", 4, "trainer")])
def test_kept_gradients_match_the_simulated_step(strategy, world, recipe):
    """With torch 1.13.1 the estimate and the simulated step agree within 1 KB (the simulator's extra bytes:
    RoPE's buffer, AdamW's step counters, the ids), as they do with today's release."""
    for release in (None, "1.13.1"):
        training = TrainingConfig(seq_len=64, recipe=recipe, torch_release=release)
        sim = simulate(TINY, world_size=world, strategy=strategy, training=training, micro_batch_size=1,
                       checkpointing=False)
        est = _estimate(strategy, world, training)
        assert 0 <= sim.peak_allocated - est.peak_allocated <= 1_000, (release, sim, est)


@pytest.mark.parametrize(("strategy", "world", "kept"), [
    ("ddp", 1, 4_564_224),     # the whole model's fp32 gradients
    ("zero2", 2, 2_282_112),   # 4 x P / 2: the rank's gradient shard
    ("zero3", 4, 1_141_056)])  # 4 x P / 4
def test_the_kept_gradients_by_hand(strategy, world, kept):
    """The Trainer recipe at seq 64: the loss backward is the peak either way, and torch 1.13 adds exactly the
    gradients a rank keeps between steps."""
    new = _estimate(strategy, world, TrainingConfig(seq_len=64, recipe="trainer"))
    old = _estimate(strategy, world, TrainingConfig(seq_len=64, recipe="trainer", torch_release="1.13.1"))
    assert new.peak_moment == old.peak_moment == "loss_backward"
    assert old.peak_allocated - new.peak_allocated == kept


def test_not_kept_from_2_0_nor_on_deepspeed_nor_stepped_in_backward():
    assert TrainingConfig(torch_release="1.13.1").grads_kept_as_zeros
    assert not TrainingConfig(torch_release="2.0.0").grads_kept_as_zeros
    assert not TrainingConfig().grads_kept_as_zeros  # the newest release's behaviour
    assert not TrainingConfig(torch_release="1.13.1", engine="deepspeed").grads_kept_as_zeros
    assert not TrainingConfig(torch_release="1.13.1", optimizer_in_backward=True).grads_kept_as_zeros
