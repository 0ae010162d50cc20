"""Error bars on a memory estimate: a low / expected / high range from the errors measured for
estimates of the same kind. Pure functions over a small frozen error table; the table itself is
data (``profiles/memory_error.json``, built by ``benchmarks/error_table.py`` from every measured
comparison: our H100 runs, the H100 stacks and the expressible published cases) and is loaded at the
edge (``advisor.calibration``).

The range is of reserved memory (what the caching allocator holds) measured directly: truth / estimate - 1
of measured reserved (or nvidia-smi less the CUDA context) against the estimated ``reserved``, keyed by
stack (recipe), tuning (full / LoRA / QLoRA) and model family, the most specific key with data first.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.calibration import ErrorBound, ErrorTable, Margin, Measured, Tuning  # the table's types live with its loader

__all__ = ["ErrorBound", "ErrorTable", "Margin", "MemoryRange", "memory_range", "relative_bounds"]


class MemoryRange(BaseModel):
    """Per-GPU memory (bytes): the estimate and the range the measured errors of its kind give."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low: int = Field(ge=0)
    expected: int = Field(ge=0)
    high: int = Field(ge=0)

    def at(self, margin: Margin) -> int:
        return getattr(self, margin)


def relative_bounds(table: ErrorTable, *, family: str, recipe: str, tuning: Tuning,
                    measured: Measured = "reserved") -> tuple[float, float]:
    """(low, high) relative bounds of ``measured`` memory: the most specific measured row this estimate
    belongs to (stack, tuning, family; the measured kind's default row when none is)."""
    row = table.bound(measured=measured, recipe=recipe, tuning=tuning, family=family)
    return row.low, row.high


def memory_range(total: int, bounds: tuple[float, float], *, unmeasured: int = 0) -> MemoryRange:
    """The measured spreads scale only what they were measured on (the reserved memory: total less
    ``unmeasured``); ``unmeasured`` (the CUDA context and NCCL outside the allocator, an assumption no
    measurement here covers) is added as it is."""
    low, high = bounds
    measured = total - unmeasured
    return MemoryRange(low=int(measured * (1 + low)) + unmeasured, expected=total,
                       high=int(measured * (1 + high)) + unmeasured)
