"""What every reason shares: frozen, no unknown keys, and the figures of one candidate's fit."""

# No ``from __future__ import annotations`` here: pydantic would evaluate every string annotation of
# these ~50 classes at import (about 15 M instructions of each `advisor plan`; benchmarks/plan_instructions.py).
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Checkpointing = Literal["off", "on", "selective"]


class ReasonModel(BaseModel):
    """A reason's schema is built when one is first made (``defer_build``): a plan meets a handful of the
    kinds, and building all of them at import cost the CLI about 60 ms (benchmarks/plan_instructions.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class FitFigures(ReasonModel):
    """One candidate's fit: per-GPU total against one GPU's memory, at a micro-batch and checkpointing."""

    strategy: str
    total_bytes: int = Field(description="Per-GPU total (peak + runtime overhead + context).")
    capacity_bytes: int = Field(description="Memory of one GPU.")
    micro_batch_size: int
    checkpointing: Checkpointing
