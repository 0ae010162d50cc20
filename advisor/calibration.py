"""Calibrated constants, loaded once from ``profiles/``: the allocator gap
(``allocator_overhead.json``) and the measured error table (``memory_error.json``). This is the
edge where the data files are read; the estimators receive the values (``TrainingConfig`` fields,
an ``ErrorTable``) and never open a file."""

from __future__ import annotations

import json
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.error_bars import ErrorTable
from profiles import PROFILES_DIR


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
