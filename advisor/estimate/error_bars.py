"""Error bars on a memory estimate: a low / expected / high range from the errors measured for
estimates of the same kind. Pure functions over a small frozen error table; the table itself is
data (``profiles/memory_error.json``, built by ``benchmarks/error_table.py`` from the measured
comparisons in ``benchmarks/results/``) and is loaded at the edge (``advisor.calibration``).

Two measured spreads compose (independent multiplicative errors):

- the estimated peak allocated against the real GPU's ``max_memory_allocated`` (gpu_truth: the
  analytic estimate vs an H100, by model family and by variant: LoRA, loss kernels), with a wide
  default row for families no measurement covers;
- the allocator gap: measured reserved over the calibrated prediction from measured allocated
  (``profiles/allocator_overhead.json``), 10th to 90th percentile of its residuals.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.calibration import ErrorBound, ErrorTable, Margin  # the table's types live with its loader

__all__ = ["ErrorBound", "ErrorTable", "Margin", "MemoryRange", "memory_range", "relative_bounds"]


class MemoryRange(BaseModel):
    """Per-GPU memory (bytes): the estimate and the range the measured errors of its kind give."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low: int = Field(ge=0)
    expected: int = Field(ge=0)
    high: int = Field(ge=0)

    def at(self, margin: Margin) -> int:
        return getattr(self, margin)


def relative_bounds(table: ErrorTable, *, family: str, strategy_kind: str, variant: str) -> tuple[float, float]:
    """(low, high) relative bounds on the total: the envelope of every measured row this estimate
    belongs to (the default row when none does), composed with the allocator gap's spread."""
    rows = [r for r in table.rows if not r.wildcard and r.matches(family, strategy_kind, variant)]
    if not rows:
        rows = [r for r in table.rows if r.wildcard]
    low, high = min(r.low for r in rows), max(r.high for r in rows)
    return (1 + low) * (1 + table.allocator_low) - 1, (1 + high) * (1 + table.allocator_high) - 1


def memory_range(total: int, bounds: tuple[float, float], *, unmeasured: int = 0) -> MemoryRange:
    """The measured spreads scale only what they were measured on (the reserved memory: total less
    ``unmeasured``); ``unmeasured`` (the CUDA context and NCCL outside the allocator, an assumption no
    measurement here covers) is added as it is."""
    low, high = bounds
    measured = total - unmeasured
    return MemoryRange(low=int(measured * (1 + low)) + unmeasured, expected=total,
                       high=int(measured * (1 + high)) + unmeasured)
