"""The optimizer step of each implementation: the simulator runs torch.optim.AdamW(fused=True /
foreach=True / foreach=False) and the estimate of the optimizer-step moment agrees within 1%
(measured: within 0.04% on these cases)."""

from __future__ import annotations


import pytest

from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.simulate.step import simulate
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.simulate.test_simulate import SMALL, TINY_LLAMA


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


def _optimizer_moment(strategy: str, world: int, impl: str) -> tuple[int, int, str]:
    training = TrainingConfig(seq_len=8, optimizer_impl=impl)
    sim = simulate(TINY_LLAMA, world_size=world, strategy=strategy, training=training, micro_batch_size=1,
                   checkpointing=False, timeline=True)
    measured = max(s.peak.total for s in sim.timeline.segments if s.phase == "optimizer_step")
    spec = spec_from_config(TINY_LLAMA, name="tiny", source="local")
    est = estimate_memory(spec, parse_gpus(f"{world}xH100"), training, get_strategy(strategy).on("torch"),
                          micro_batch_size=1, checkpointing=False)
    return est.at_optimizer_step, measured, sim.optimizer_impl


@pytest.mark.parametrize("strategy, world", [("ddp", 2), ("zero3", 4)])
@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
def test_optimizer_moment_within_1_percent_of_the_simulator(strategy, world, impl):
    estimated, measured, ran = _optimizer_moment(strategy, world, impl)
    assert ran == impl
    assert abs(estimated - measured) <= 0.01 * measured


def test_fused_step_allocates_no_state_sized_temporary():
    """Measured, not estimated: fused is below foreach by one fp32 copy of the parameters (158,016 x 4)."""
    _, fused, _ = _optimizer_moment("ddp", 1, "fused")
    _, foreach, _ = _optimizer_moment("ddp", 1, "foreach")
    assert abs((foreach - fused) - 4 * 158_016) <= 4 * 1024


@pytest.mark.parametrize("strategy, world, checkpointing, within", [
    ("ddp", 2, True, 0.01), ("zero3", 4, True, 0.01),
    # Without checkpointing this small model's loss moment is +1.34% with the bf16 base and was +1.48% with
    # the fp32 base (recipe lightning), measured: a gap in the loss moment that predates the base's dtype.
    ("ddp", 2, False, 0.015)])
def test_lora_bf16_base_agrees_with_the_simulator(strategy, world, checkpointing, within):
    """The simulator holds the frozen base in bf16 and PEFT's adapters in fp32 (issue 19), as the estimate
    does; measured 2 bytes a base weight and 4 an adapter weight."""
    from advisor.model.lora import LoraConfig, with_lora

    cfg = SMALL["llama-gqa"]
    training = TrainingConfig(seq_len=256, lora=LoraConfig(rank=4),
                              activation_checkpointing="on" if checkpointing else "off")
    sim = simulate(cfg, world_size=world, strategy=strategy, training=training, micro_batch_size=2,
                   checkpointing=checkpointing)
    base = spec_from_config(cfg, name="small", source="local")
    spec = with_lora(base, training.lora)
    est = estimate_memory(spec, parse_gpus(f"{world}xH100"), training, get_strategy(strategy).on("torch"),
                          micro_batch_size=2, checkpointing=checkpointing)
    if strategy == "ddp":  # the plain model: parameters, plus rotary inv_freq and original_inv_freq (16 fp32 each)
        assert sim.params == 2 * base.total_params + 4 * spec.trainable_params + 2 * 4 * 16
    assert abs(est.peak_allocated - sim.peak_allocated) <= within * sim.peak_allocated


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_adafactor_moment_within_1_percent_of_the_simulator(precision):
    """transformers' Adafactor as the Trainer builds it (scale_parameter=False, relative_step=False), run on the
    simulated step: the optimizer moment within 1% (measured +0.09% mixed, -0.53% pure bf16, DDP x2)."""
    training = TrainingConfig(seq_len=8, optimizer="adafactor", precision=precision)
    sim = simulate(TINY_LLAMA, world_size=2, strategy="ddp", training=training, micro_batch_size=1,
                   checkpointing=False, timeline=True)
    measured = max(s.peak.total for s in sim.timeline.segments if s.phase == "optimizer_step")
    spec = spec_from_config(TINY_LLAMA, name="tiny", source="local")
    est = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy("ddp").on("torch"),
                          micro_batch_size=1, checkpointing=False)
    assert abs(est.at_optimizer_step - measured) <= 0.01 * measured


def test_adafactor_cannot_step_fsdp2_parameters():
    """Why the planner marks FSDP2 strategies unavailable under Adafactor (advisor.planning.candidates): its
    factored state is built as plain tensors beside FSDP2's DTensor gradients, which DTensor refuses."""
    training = TrainingConfig(seq_len=8, optimizer="adafactor")
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        simulate(TINY_LLAMA, world_size=2, strategy="zero2", training=training, micro_batch_size=1,
                 checkpointing=False)
