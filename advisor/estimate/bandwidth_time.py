"""Time a GPU's HBM bandwidth moves when its utilisation was fitted on another GPU's runs.

What belongs here: the seconds the blocks' eager elementwise and reduction kernels take on this GPU beyond
(or short of) what they took on the GPU the utilisation fit's rows ran on. What does not: the utilisation
itself (``advisor.hardware.efficiency``), the bytes (``advisor.estimate.compile_time.block_bytes``, the same
op lists ``--compile`` reads), anything that is charged by bytes already (dequantisation, adapters, autocast
casts, float8 casts, the optimizer step: each at this GPU's own bandwidth).

Why: step time is FLOPs / (peak x utilisation), and one utilisation serves a group of GPUs
(``profiles/efficiency.json``: the H200 takes the H100 SXM fit, the 40 GB and PCIe A100s the A100-80GB SXM
one). The eager elementwise kernels inside that fitted time ran at the calibration GPU's bandwidth; the
same die with faster or slower HBM runs them faster or slower, at the same FLOPs. So, per block, per
token, per pass (forward, backward, and the recompute of a checkpointed block, as ``compile_time``):
eager bytes x (1 / this bandwidth - 1 / the calibration bandwidth) / hbm_efficiency, the optimizer
step's efficiency that ``compile_time`` also uses, so a compiled step on either GPU is the fitted eager
time less the eager bytes at the calibration bandwidth plus the compiled bytes at its own.

Which blocks: the Llama-like decoders ``compile_time`` counts. Others (MoE, encoder-decoder,
vision-language, SSM, GPT-2 style) keep the fit's time unchanged, and the plan says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from advisor.estimate.activations import shape_of
from advisor.estimate.compile_time import check_compile, compile_notes, compile_saving_s, spec_block_bytes
from advisor.units import GB

if TYPE_CHECKING:
    from advisor.estimate.step_time import FlopCount
    from advisor.hardware.cluster import Hardware
    from advisor.hardware.efficiency import EfficiencyProfile
    from advisor.model.spec import ModelSpec
    from advisor.training import TrainingConfig


class ElementwiseTime(BaseModel):
    """Seconds a micro-batch's elementwise kernels move from the fitted time: the bandwidth shift (added;
    negative on faster HBM) and what ``--compile`` saves (taken off), forward and backward + recompute."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shift_forward: float = 0.0
    shift_backward: float = 0.0
    saved_forward: float = 0.0
    saved_backward: float = 0.0

    @property
    def forward(self) -> float:
        return self.shift_forward - self.saved_forward

    @property
    def backward(self) -> float:
        return self.shift_backward - self.saved_backward

    @property
    def shift(self) -> float:
        return self.shift_forward + self.shift_backward

    @property
    def saved(self) -> float:
        return self.saved_forward + self.saved_backward


def modelled(spec: ModelSpec) -> bool:
    """True where the block's eager bytes are counted (``compile_time.check_compile`` accepts it)."""
    try:
        check_compile(spec)
    except ValueError:
        return False
    return True


def bandwidth_shift_s(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile, *,
                      tokens: int, checkpointing: bool, flops: FlopCount, rate: float,
                      peak: float) -> tuple[float, float]:
    """(forward, backward + recompute) seconds to add to a micro-batch of ``tokens`` tokens timed at ``rate``
    FLOP/s (negative on a GPU with faster HBM than the fit's; 0, 0 when the bandwidths agree or the block is
    not counted). A faster GPU's shortening is capped so the matmuls never run above the datasheet ``peak``."""
    calibrated = eff.compute.calibration_bandwidth(hardware.gpu)
    if calibrated is None or not modelled(spec):
        return 0.0, 0.0
    block = spec_block_bytes(spec, training)
    per_byte = shape_of(spec).num_layers * tokens * (1 / hardware.gpu.hbm_bandwidth_gbps - 1 / calibrated) / (
        GB * eff.optimizer_step.hbm_efficiency)
    recompute = block.eager_forward if checkpointing else 0
    fwd, bwd = block.eager_forward * per_byte, (block.eager_backward + recompute) * per_byte
    return (max(fwd, -flops.forward * (1 / rate - 1 / peak)),
            max(bwd, -flops.hardware_backward * (1 / rate - 1 / peak)))


def elementwise_s(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile, *,
                  tokens: int, checkpointing: bool, flops: FlopCount, rate: float, peak: float) -> ElementwiseTime:
    """The shift and ``--compile``'s saving on one micro-batch (the callers' one entry point; the caller
    divides by its model-parallel split)."""
    shift = bandwidth_shift_s(spec, hardware, training, eff, tokens=tokens, checkpointing=checkpointing,
                              flops=flops, rate=rate, peak=peak)
    saved = compile_saving_s(spec, hardware, training, eff, tokens=tokens, checkpointing=checkpointing,
                             flops=flops, rate=rate, peak=peak, shifted=shift)
    return ElementwiseTime(shift_forward=shift[0], shift_backward=shift[1], saved_forward=saved[0],
                           saved_backward=saved[1])


def elementwise_notes(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile, *,
                      shift_s: float, saved_s: float) -> list[str]:
    """The plan's lines: the bandwidth shift (when the bandwidths differ) and ``--compile``'s saving (when on)."""
    notes = []
    calibrated = eff.compute.calibration_bandwidth(hardware.gpu)
    if calibrated is not None:
        entry = eff.compute.entry(hardware.gpu.name)
        head = (f"HBM: {hardware.gpu.name} moves {hardware.gpu.hbm_bandwidth_gbps:,.0f} GB/s, the "
                f"{entry.calibration_gpu} its utilisation was fitted on {calibrated:,.0f}")
        notes.append(f"{head}: the blocks' eager elementwise kernels take {abs(shift_s) * 1e3:.1f} ms a step "
                     f"{'less' if shift_s < 0 else 'more'} (advisor.estimate.bandwidth_time)" if modelled(spec) else
                     f"{head}; a {shape_of(spec).kind} block's elementwise kernels are not counted, so they keep "
                     "the fit's time")
    if training.compile:
        notes.extend(compile_notes(spec, saved_s))
    return notes
