"""Strategy semantics in one table: what each strategy shards or offloads, which engine runs it
and how, and what it costs to talk. Everything else (estimators, planner, exporters, ``wrap``)
reads this table instead of branching on strategy names.

Sources: ZeRO (Rajbhandari et al., 2020) for the stages and their communication (ZeRO-1/2 move
the same bytes as DDP's all-reduce, ZeRO-3 1.5x); PyTorch docs for DistributedDataParallel,
ZeroRedundancyOptimizer and FSDP2 ``fully_shard`` (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2);
FSDP2's ``CPUOffloadPolicy`` offloads parameters, gradients and optimizer state together; DeepSpeed
docs for ``offload_optimizer`` / ``offload_param``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.training import Engine

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


class Strategy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrategyName
    summary: str = Field(description="One line for tables and help.")
    comm_factor: float = Field(description="Bytes moved per step per GPU, in model-gradient sizes (ring).")
    engines: dict[str, Implementation] = Field(description="engine name -> implementation.")

    def on(self, engine: Engine) -> Implementation:
        return self.engines[engine]


def _unavailable(engine: Engine, reason: str) -> Implementation:
    return Implementation(engine=engine, available=False, reason=reason)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="dp",
            summary="torch.nn.DataParallel: one process, GPU0 gathers outputs and holds the optimizer",
            comm_factor=2.0,
            engines={
                "torch": Implementation(engine="torch", runs_as="torch.nn.DataParallel", single_process=True),
                "deepspeed": _unavailable("deepspeed", "DeepSpeed has no single-process DataParallel mode"),
            },
        ),
        Strategy(
            name="ddp",
            summary="replicate everything, all-reduce gradients (bucketed, overlapped with backward)",
            comm_factor=2.0,
            engines={
                "torch": Implementation(engine="torch", runs_as="DistributedDataParallel"),
                "deepspeed": Implementation(engine="deepspeed", runs_as="DeepSpeed ZeRO stage 0"),
            },
        ),
        Strategy(
            name="zero1",
            summary="shard optimizer state",
            comm_factor=2.0,
            engines={
                "torch": Implementation(
                    engine="torch", runs_as="DDP + ZeroRedundancyOptimizer", shard_optimizer=True
                ),
                "deepspeed": Implementation(engine="deepspeed", runs_as="DeepSpeed ZeRO stage 1", shard_optimizer=True),
            },
        ),
        Strategy(
            name="zero2",
            summary="shard optimizer state and gradients (reduce-scatter)",
            comm_factor=2.0,
            engines={
                "torch": Implementation(
                    engine="torch",
                    runs_as="FSDP2 fully_shard(reshard_after_forward=False)",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                ),
                "deepspeed": Implementation(
                    engine="deepspeed", runs_as="DeepSpeed ZeRO stage 2", shard_optimizer=True, shard_grads=True
                ),
            },
        ),
        Strategy(
            name="zero3",
            summary="shard parameters too (all-gather per block, 1.5x the communication)",
            comm_factor=3.0,
            engines={
                "torch": Implementation(
                    engine="torch",
                    runs_as="FSDP2 fully_shard(reshard_after_forward=True)",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                    reshard_after_forward=True,
                ),
                "deepspeed": Implementation(
                    engine="deepspeed",
                    runs_as="DeepSpeed ZeRO stage 3",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                    reshard_after_forward=True,
                ),
            },
        ),
        Strategy(
            name="zero2_offload",
            summary="ZeRO-2 with optimizer state and step on the CPU",
            comm_factor=2.0,
            engines={
                # FSDP2's CPUOffloadPolicy cannot offload the optimizer alone: it moves sharded
                # parameters, gradients and optimizer state to the CPU together.
                "torch": Implementation(
                    engine="torch",
                    runs_as="FSDP2 fully_shard(reshard_after_forward=False, offload_policy=CPUOffloadPolicy())",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                    offload_optimizer=True,
                    offload_params=True,
                ),
                "deepspeed": Implementation(
                    engine="deepspeed",
                    runs_as="DeepSpeed ZeRO stage 2 + offload_optimizer(cpu)",
                    shard_optimizer=True,
                    shard_grads=True,
                    offload_optimizer=True,
                ),
            },
        ),
        Strategy(
            name="zero3_offload",
            summary="ZeRO-3 with parameters and optimizer state on the CPU",
            comm_factor=3.0,
            engines={
                "torch": Implementation(
                    engine="torch",
                    runs_as="FSDP2 fully_shard(reshard_after_forward=True, offload_policy=CPUOffloadPolicy())",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                    reshard_after_forward=True,
                    offload_optimizer=True,
                    offload_params=True,
                ),
                "deepspeed": Implementation(
                    engine="deepspeed",
                    runs_as="DeepSpeed ZeRO stage 3 + offload_param(cpu) + offload_optimizer(cpu)",
                    shard_optimizer=True,
                    shard_grads=True,
                    shard_params=True,
                    reshard_after_forward=True,
                    offload_optimizer=True,
                    offload_params=True,
                ),
            },
        ),
    )
}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy '{name[:40]}'; choose from {', '.join(STRATEGIES)}") from None
