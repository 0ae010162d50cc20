"""What every reason shares: frozen, no unknown keys, and the figures of one candidate's fit."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Checkpointing = Literal["off", "on", "selective"]


class ReasonModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FitFigures(ReasonModel):
    """One candidate's fit: per-GPU total against one GPU's memory, at a micro-batch and checkpointing."""

    strategy: str
    total_bytes: int = Field(description="Per-GPU total (peak + runtime overhead + context).")
    capacity_bytes: int = Field(description="Memory of one GPU.")
    micro_batch_size: int
    checkpointing: Checkpointing
