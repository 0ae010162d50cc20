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

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

StrategyKind = Literal["replicated", "sharded", "offload"]
Variant = Literal["plain", "checkpointing", "lora", "qlora", "loss_kernel"]
Margin = Literal["low", "expected", "high"]


class ErrorBound(BaseModel):
    """Measured relative error of the truth against the estimate (truth / estimate - 1) for one kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str = Field(default="*", description="model_type the row covers, or * for any.")
    strategy_kind: StrategyKind | Literal["*"] = Field(default="*", description="replicated, sharded, offload or *.")
    variant: Variant | Literal["*"] = Field(default="*", description="plain, checkpointing, lora, qlora, loss_kernel or *.")
    low: float = Field(le=0, description="Lowest truth/estimate - 1 measured (<= 0).")
    high: float = Field(ge=0, description="Highest truth/estimate - 1 measured (>= 0).")
    cases: int = Field(ge=0, description="How many measured cases the bounds come from (0: a stated default).")
    source: str = Field(description="Which measurement the bounds come from.")

    def matches(self, family: str, kind: str, variant: str) -> bool:
        return (self.family in ("*", family) and self.strategy_kind in ("*", kind)
                and self.variant in ("*", variant))

    @property
    def wildcard(self) -> bool:
        return self.family == "*" and self.strategy_kind == "*" and self.variant == "*"


class ErrorTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    allocator_low: float = Field(le=0, description="Reserved over its calibrated prediction - 1, 10th percentile.")
    allocator_high: float = Field(ge=0, description="Reserved over its calibrated prediction - 1, 90th percentile.")
    rows: tuple[ErrorBound, ...] = Field(description="Measured bounds by kind; a row of all * is the default.")


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
