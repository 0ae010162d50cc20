"""Calibrated constants, loaded once from ``profiles/``: the allocator gap
(``allocator_overhead.json``) and the measured error table (``memory_error.json``). This is the
edge where the data files are read; the estimators receive the values (``TrainingConfig`` fields,
an ``ErrorTable``, defined here with its loader) and never open a file."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from profiles import PROFILES_DIR

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



class AllocatorOverhead(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")  # description/provenance are for readers

    fragmentation: float = Field(ge=0, le=1, description="Reserved over allocated - 1, calibrated.")
    allocator_constant_gib: float = Field(ge=0, description="Fixed part of the allocator's reserve, calibrated.")
    context_gib: float = Field(ge=0, description="CUDA context, cuBLAS and NCCL outside the allocator (an assumption).")


@lru_cache(maxsize=1)
def allocator_overhead() -> AllocatorOverhead:
    return AllocatorOverhead.model_validate(json.loads((PROFILES_DIR / "allocator_overhead.json").read_text()))


@lru_cache(maxsize=1)
def error_table() -> ErrorTable:
    data = json.loads((PROFILES_DIR / "memory_error.json").read_text())
    return ErrorTable.model_validate({key: data[key] for key in ("allocator_low", "allocator_high", "rows")})
