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

Measured = Literal["allocated", "reserved"]
Tuning = Literal["full", "lora", "qlora"]
Margin = Literal["low", "expected", "high"]
# The keys a row of the error table may have, most specific first: a plan takes the first level with a row
# that matches it (benchmarks/error_table.py keeps a row only where it has enough comparisons). The last,
# no key but the measured kind, is the default: every comparison of that kind.
KEY_LEVELS: tuple[tuple[str, ...], ...] = (("recipe", "tuning"), ("tuning",), ())


class ErrorBound(BaseModel):
    """Measured relative error of the truth against the estimate (truth / estimate - 1) for one key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    measured: Measured = Field(default="reserved", description="What the truth measured: peak allocated, or "
                               "reserved (torch.cuda.max_memory_reserved, or nvidia-smi less the CUDA context).")
    recipe: str = Field(default="*", description="Training stack (profiles/recipes.json) the row covers, or *.")
    tuning: Tuning | Literal["*"] = Field(default="*", description="full, lora, qlora or *.")
    family: str = Field(default="*", description="model_type the row covers, or *.")
    low: float = Field(le=0, description="Low end of truth/estimate - 1 (<= 0).")
    high: float = Field(ge=0, description="High end of truth/estimate - 1 (>= 0).")
    cases: int = Field(ge=0, description="How many measured comparisons the bounds come from.")
    source: str = Field(description="Which measurements the bounds come from.")

    @property
    def level(self) -> tuple[str, ...]:
        return tuple(name for name in ("recipe", "tuning", "family") if getattr(self, name) != "*")


class ErrorTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: tuple[ErrorBound, ...] = Field(description="Measured bounds by key; the rows with no key are the defaults.")

    def bound(self, *, measured: Measured, recipe: str, tuning: Tuning, family: str) -> ErrorBound:
        """The most specific row (``KEY_LEVELS`` order) matching this estimate."""
        values = {"recipe": recipe, "tuning": tuning, "family": family}
        for level in KEY_LEVELS:
            for row in self.rows:
                if (row.measured == measured and row.level == level
                        and all(getattr(row, name) == values[name] for name in level)):
                    return row
        raise ValueError(f"the error table has no default row for {measured}")


class MeasuredContext(BaseModel):
    """What one GPU kind held outside the allocator, measured (profiles/allocator_overhead.json measured_context)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    single_process_gib: float = Field(ge=0, description="One process, no NCCL communicator.")
    with_nccl_gib: float = Field(ge=0, description="With an NCCL communicator (measured at world size 1).")
    source: str


class AllocatorOverhead(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")  # description/provenance are for readers

    fragmentation: float = Field(ge=0, le=1, description="Reserved over allocated - 1, calibrated.")
    checkpointing_fragmentation: float = Field(ge=0, le=1, description="Added to fragmentation where the step recomputes "
                                               "its blocks (full or selective checkpointing), calibrated.")
    capped_fit_fragmentation: float = Field(ge=0, le=1, description="The part of fragmentation that must fit, read "
                                            "from runs under a cap on reserved memory (the allocator frees the rest, "
                                            "cached blocks, before an allocation fails); --fit-fragmentation, not a "
                                            "default.")
    allocator_constant_gib: float = Field(ge=0, description="Fixed part of the allocator's reserve, calibrated.")
    context_gib: float = Field(ge=0, description="CUDA context, cuBLAS and NCCL outside the allocator (an assumption, "
                               "where measured_context has no row for the GPU).")
    single_process_context_gib: float = Field(ge=0, description="The CUDA context alone, for a plan on one GPU (no "
                                              "NCCL communicator; an assumption from published figures, where "
                                              "measured_context has no row for the GPU).")
    measured_context: dict[str, MeasuredContext] = Field(default_factory=dict, description="GPU name -> what it held "
                                                         "outside the allocator, measured.")

    def context_for(self, gpu: str, *, nccl: bool) -> float:
        """GiB outside the allocator per GPU of kind ``gpu``: measured where measured_context has it, else the
        assumed defaults; ``nccl``: the process holds an NCCL communicator (more than one GPU)."""
        measured = self.measured_context.get(gpu)
        if measured is not None:
            return measured.with_nccl_gib if nccl else measured.single_process_gib
        return self.context_gib if nccl else self.single_process_context_gib


@lru_cache(maxsize=1)
def allocator_overhead() -> AllocatorOverhead:
    return AllocatorOverhead.model_validate(json.loads((PROFILES_DIR / "allocator_overhead.json").read_text()))


@lru_cache(maxsize=1)
def error_table() -> ErrorTable:
    data = json.loads((PROFILES_DIR / "memory_error.json").read_text())
    return ErrorTable.model_validate({"rows": data["rows"]})
