"""Strategy semantics in one table (``profiles/strategies.json``): what each strategy shards or
offloads, and which engine runs it and how. Everything else (estimators, planner, exporters, ``wrap``)
reads this table instead of branching on strategy names; the sources are cited in the data file.
"""

from __future__ import annotations

import json
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from advisor.training import Engine
from profiles import PROFILES_DIR

StrategyName = Literal["dp", "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"]

# Cheapest to most sharded: the escalation order when a strategy does not fit.
ESCALATION: tuple[StrategyName, ...] = ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")


class Implementation(BaseModel):
    """How one engine runs one strategy, and where model states live as a result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Engine = Field(description="torch or deepspeed.")
    available: bool = Field(default=True, description="Whether this engine can run the strategy.")
    reason: str | None = Field(default=None, description="Why not, when unavailable.")
    runs_as: str = Field(default="", description="The API that implements it.")
    shard_optimizer: bool = Field(default=False, description="Optimizer state split over ranks.")
    shard_grads: bool = Field(default=False, description="Gradients split over ranks.")
    shard_params: bool = Field(default=False, description="Parameters split over ranks at rest.")
    reshard_after_forward: bool = Field(default=False, description="Params freed between forward and backward.")
    offload_optimizer: bool = Field(default=False, description="Optimizer state (and step) on CPU.")
    offload_params: bool = Field(default=False, description="Sharded parameters and grads on CPU.")
    single_process: bool = Field(default=False, description="One process drives all GPUs (DataParallel).")

    @property
    def offloads(self) -> bool:
        """Parameters or optimizer state rest on the CPU."""
        return self.offload_params or self.offload_optimizer


class Strategy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrategyName
    summary: str = Field(description="One line for tables and help.")
    engines: dict[Engine, Implementation] = Field(description="engine name -> implementation.")

    @model_validator(mode="before")
    @classmethod
    def _engine_names(cls, data: dict) -> dict:
        """The data file keys each implementation by its engine; the object repeats it."""
        engines = {name: {"engine": name, **row} for name, row in (data.get("engines") or {}).items()}
        return {**data, "engines": engines}

    def on(self, engine: Engine) -> Implementation:
        return self.engines[engine]


class _StrategyTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str
    strategies: tuple[Strategy, ...]

    @model_validator(mode="after")
    def _every_strategy_on_every_engine(self) -> "_StrategyTable":
        names = tuple(s.name for s in self.strategies)
        if sorted(names) != sorted(get_args(StrategyName)) or len(set(names)) != len(names):
            raise ValueError(f"strategies.json must hold each of {get_args(StrategyName)} once, holds {names}")
        for s in self.strategies:
            if set(s.engines) != set(get_args(Engine)):
                raise ValueError(f"strategies.json: {s.name} must say how each of {get_args(Engine)} runs it")
        return self


def _load() -> dict[str, Strategy]:
    table = _StrategyTable.model_validate(json.loads((PROFILES_DIR / "strategies.json").read_text()))
    return {s.name: s for s in table.strategies}


STRATEGIES: dict[str, Strategy] = _load()


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy '{name[:40]}'; choose from {', '.join(STRATEGIES)}") from None
