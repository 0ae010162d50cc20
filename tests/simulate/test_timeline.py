"""The simulator's timeline (``advisor.simulate.timeline``): segments in execution order, and the
largest segment peak is exactly the peak PyTorch's memory tracker measured for the step."""

from __future__ import annotations


import pytest

from advisor.simulate.step import simulate
from advisor.training import TrainingConfig
from tests.conftest import TINY_CONFIGS

TINY = dict(TINY_CONFIGS["llama_tied_bias"], _name_or_path="tiny-llama-2-layers")  # 2 blocks


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


@pytest.mark.parametrize("strategy, checkpointing", [("ddp", True), ("zero3", False)])
def test_timeline_follows_the_step_and_reaches_the_measured_peak(strategy, checkpointing):
    sim = simulate(TINY, world_size=2, strategy=strategy, training=TrainingConfig(seq_len=64), micro_batch_size=2,
                   checkpointing=checkpointing, timeline=True)
    timeline = sim.timeline
    assert timeline is not None and timeline.num_blocks == 2
    # The tracker's own peak (SimulatedStep.peak_allocated, DDP buckets included) is a segment's peak.
    assert timeline.peak_bytes == sim.peak_allocated
    phases = [s.phase for s in timeline.segments]
    assert phases[0] == "forward" and phases[-1] == "optimizer_step"
    assert [s.label for s in timeline.segments if s.phase == "loss"] == ["loss", "loss backward"]
    assert phases == sorted(phases, key=["forward", "loss", "backward", "optimizer_step"].index)
    forward = [s.block for s in timeline.segments if s.phase == "forward" and s.block is not None]
    backward = [s.block for s in timeline.segments if s.phase == "backward" and s.block is not None]
    assert forward == [0, 1] and backward == [1, 0]
    assert all(s.peak.total >= s.end.total for s in timeline.segments)


def test_ddp_timeline_starts_with_the_replica_and_its_buckets():
    """Worked by hand: mixed precision keeps fp32 parameters and DDP a full replica (4 bytes each), plus
    the rotary tables (inv_freq and original_inv_freq, head_dim / 2 = 6 fp32 each); DDP's buckets hold
    one fp32 copy of the gradients (4 bytes per parameter) for the whole step."""
    sim = simulate(TINY, world_size=2, strategy="ddp", training=TrainingConfig(seq_len=32), micro_batch_size=1,
                   checkpointing=False, timeline=True)
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    first = sim.timeline.segments[0].end
    assert first.params == 4 * sim.total_params + 2 * 4 * (head_dim // 2)
    assert all(s.end.temporary >= 4 * sim.total_params for s in sim.timeline.segments)
    assert simulate(TINY, world_size=2, strategy="ddp", training=TrainingConfig(seq_len=32), micro_batch_size=1,
                    checkpointing=False).timeline is None
