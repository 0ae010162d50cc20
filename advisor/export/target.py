"""What an export writes: the plan's recommendation turned into one concrete, checked target.

A format can express only some (strategy, engine) pairs: accelerate has no ZeroRedundancyOptimizer
or single-process DataParallel, a DeepSpeed JSON is DeepSpeed only. ``resolve_target`` keeps the
recommendation when the format can express it; otherwise it re-evaluates the nearest pairs the
format can express with the planner (same model, GPUs and training options) and takes the first
that fits, saying so in ``notes``. It also decides hybrid sharding (HSDP): on several nodes, a
torch FSDP target is sharded within each node and replicated across nodes when one node's share of
the model states still fits at the chosen micro-batch (all-gathers stay on the fast intra-node
link; only the gradient all-reduce crosses nodes; Zhao et al. 2023, "PyTorch FSDP", section 3.2).

Pure functions of a ``Plan``: no file access, no torch or yaml import. Renderers live in the
per-format modules; file writing in ``write.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.planning.api import Plan
from advisor.hardware.cluster import Hardware, resize
from advisor.estimate.memory import estimate_memory
from advisor.planning.planner import evaluate_candidate
from advisor.strategies import ESCALATION, STRATEGIES, Implementation, StrategyName
from advisor.training import Engine

FormatName = Literal["accelerate", "deepspeed-json", "torchrun", "trainer-args", "lightning"]
Hybrid = Literal["auto", "on", "off"]

# (strategy, engine) pairs each format can express; torchrun launches any script, so any pair.
_EXPRESSIBLE: dict[str, set[tuple[str, str]]] = {
    "accelerate": {("ddp", "torch"), ("zero2", "torch"), ("zero3", "torch"), ("zero2_offload", "torch"),
                   ("zero3_offload", "torch"), ("ddp", "deepspeed"), ("zero1", "deepspeed"), ("zero2", "deepspeed"),
                   ("zero3", "deepspeed"), ("zero2_offload", "deepspeed"), ("zero3_offload", "deepspeed")},
    "deepspeed-json": {(s, "deepspeed") for s in ESCALATION},
    "torchrun": {(s, e) for s in STRATEGIES for e in ("torch", "deepspeed")},
}
_EXPRESSIBLE["trainer-args"] = _EXPRESSIBLE["accelerate"]
_EXPRESSIBLE["lightning"] = _EXPRESSIBLE["accelerate"]

# Why a pair has no config in a format, for the note that explains the substitute.
_WHY_NOT = {
    ("dp", "torch"): "dp (torch.nn.DataParallel, one process) has no {fmt} config: launchers start one process "
                     "per GPU; DDP keeps no more per GPU than DataParallel and is faster",
    ("zero1", "torch"): "zero1 on the torch engine (DDP + ZeroRedundancyOptimizer) has no {fmt} config: it has no "
                        "ZeroRedundancyOptimizer option; for ZeRO-1 exactly, re-run with --engine deepspeed "
                        "(DeepSpeed ZeRO stage 1)",
}

PLACEHOLDER_IP = "<MAIN_NODE_IP>"
PLACEHOLDER_RANK = "<MACHINE_RANK>"
DEFAULT_PORT = 29500
GRADIENT_CLIPPING = 1.0


class ExportOptions(BaseModel):
    """Choices that are about the exported file, not about the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: bool = Field(default=False, description="A CPU-only test config (gloo), for single-node ddp only.")
    hybrid: Hybrid = Field(default="auto", description="HSDP on several nodes: auto (when one node's share fits).")
    script: str = Field(default="train.py", description="Training script named in launcher commands.")
    script_args: tuple[str, ...] = Field(default=(), description="Arguments for the training script.")


class ExportTarget(BaseModel):
    """One concrete strategy to write, with every number a format needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: StrategyName
    engine: Engine
    impl: Implementation = Field(description="The strategy-table row: what is sharded and offloaded.")
    micro_batch_size: int = Field(ge=1, description="Samples per GPU per forward pass.")
    gradient_accumulation_steps: int = Field(ge=1, description="Micro-batches per optimizer step.")
    activation_checkpointing: bool
    precision: str = Field(description="TrainingConfig precision: fp32, bf16-mixed, fp16-mixed, bf16.")
    num_nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    hybrid: bool = Field(description="Shard within a node, replicate across nodes (FSDP HSDP).")
    cpu: bool = Field(description="CPU-only test config.")
    model_name: str
    model_type: str | None = None
    block_class: str | None = Field(default=None, description="Transformer block class FSDP wraps.")
    gpu: str
    notes: tuple[str, ...] = Field(default=(), description="Substitutions and caveats, one line each.")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def multi_node(self) -> bool:
        return self.num_nodes > 1

    @property
    def fsdp(self) -> bool:
        """Runs as PyTorch FSDP2 (the torch engine's sharded strategies)."""
        return self.engine == "torch" and self.impl.shard_params

    @property
    def zero_stage(self) -> int:
        """DeepSpeed ZeRO stage: 0 replicate, 1 optimizer, 2 + gradients, 3 + parameters."""
        if self.impl.shard_params:
            return 3
        if self.impl.shard_grads:
            return 2
        return 1 if self.impl.shard_optimizer else 0

    @property
    def mixed_precision(self) -> Literal["no", "fp16", "bf16"]:
        """accelerate's ``mixed_precision``; pure bf16 also computes in bf16 (the script loads bf16 weights)."""
        return {"fp32": "no", "fp16-mixed": "fp16", "bf16-mixed": "bf16", "bf16": "bf16"}[self.precision]

    @property
    def summary(self) -> str:
        nodes = f"{self.num_nodes} nodes x " if self.multi_node else ""
        return (f"{self.strategy} on {self.engine} ({self.impl.runs_as}) for {self.model_name} on "
                f"{nodes}{self.gpus_per_node} x {self.gpu}"
                f"{' (CPU test config)' if self.cpu else ''}: micro-batch {self.micro_batch_size}, "
                f"gradient accumulation {self.gradient_accumulation_steps}, activation checkpointing "
                f"{'on' if self.activation_checkpointing else 'off'}, precision {self.precision}"
                f"{', hybrid sharding (HSDP)' if self.hybrid else ''}")


def require_recommendation(plan: Plan) -> None:
    """A one-line ValueError when nothing fits, naming the smallest fit."""
    if plan.recommendation is not None:
        return
    fit = plan.smallest_fit
    hint = fit.message if fit is not None else "no strategy fits these GPUs"
    raise ValueError(f"nothing fits {plan.hardware.world_size} x {plan.hardware.gpu.name} for {plan.model.name}, "
                     f"so there is nothing to export: {hint}")


def hardware_of(plan: Plan, *, nodes: int | None = None, gpus_per_node: int | None = None) -> Hardware:
    """The plan's hardware as a validated object (optionally resized), for re-evaluation."""
    return resize(plan.hardware, nodes=nodes, gpus_per_node=gpus_per_node)


def _fallbacks(strategy: str, engine: str, fmt: str) -> list[tuple[StrategyName, Engine]]:
    """Nearest expressible pairs, closest first: same strategy on the other engine, then escalation."""
    allowed = _EXPRESSIBLE[fmt]
    start = ESCALATION.index(strategy) if strategy in ESCALATION else 0
    order: list[tuple[str, str]] = []
    engines = [engine, "deepspeed" if engine == "torch" else "torch"]
    if fmt == "deepspeed-json":
        engines = ["deepspeed"]
    elif (strategy, engine) in _WHY_NOT:
        engines = [engine]  # dp, torch zero1: stay on torch (DDP, then FSDP); the note offers deepspeed
    for eng in engines:
        order += [(s, eng) for s in ESCALATION[:start + 1][::-1] if (s, eng) in allowed][:1]
        order += [(s, eng) for s in ESCALATION[start + 1:] if (s, eng) in allowed]
    seen: list[tuple[StrategyName, Engine]] = []
    for pair in order:
        if pair not in seen:
            seen.append(pair)  # type: ignore[arg-type]
    return seen


def _substitute(plan: Plan, fmt: str) -> tuple[StrategyName, Engine, int, bool, int | None, list[str]]:
    rec = plan.recommendation
    assert rec is not None
    if (rec.strategy, rec.engine) in _EXPRESSIBLE[fmt]:
        return rec.strategy, rec.engine, rec.micro_batch_size, rec.activation_checkpointing, \
            rec.gradient_accumulation_steps, []
    why = _WHY_NOT.get((rec.strategy, rec.engine), "{fmt} runs only DeepSpeed; the plan used engine "
                       + rec.engine).format(fmt=fmt)
    hw = hardware_of(plan)
    for strategy, engine in _fallbacks(rec.strategy, rec.engine, fmt):
        training = plan.training.model_copy(update={"engine": engine})
        cand = evaluate_candidate(plan.model, hw, training, strategy)
        if cand.available and cand.fits:
            note = (f"{why}. Exported the nearest that fits instead: {strategy} on {engine} ({cand.runs_as}), "
                    f"micro-batch {cand.micro_batch_size}.")
            return strategy, engine, cand.micro_batch_size, bool(cand.activation_checkpointing), \
                cand.gradient_accumulation_steps, [note]
    raise ValueError(f"{why}, and no strategy {fmt} can express fits; try another --format")


def hybrid_fits(plan: Plan, strategy: StrategyName, engine: Engine, *, micro_batch_size: int,
                activation_checkpointing: bool) -> bool:
    """Whether sharding over one node's GPUs only still fits, at this micro-batch and checkpointing."""
    one_node = hardware_of(plan, nodes=1)
    training = plan.training.model_copy(update={"engine": engine})
    impl = STRATEGIES[strategy].on(engine)
    mem = estimate_memory(plan.model, one_node, training, impl, micro_batch_size=micro_batch_size,
                          checkpointing=activation_checkpointing)
    return mem.total <= one_node.gpu_memory_bytes


def resolve_target(plan: Plan, fmt: FormatName, options: ExportOptions | None = None) -> ExportTarget:
    """The target ``fmt`` writes for ``plan``; ValueError when nothing fits or cannot be written."""
    options = options or ExportOptions()
    require_recommendation(plan)
    strategy, engine, micro, ckpt, accum, notes = _substitute(plan, fmt)
    impl = STRATEGIES[strategy].on(engine)
    hw = plan.hardware
    if options.cpu:
        if strategy != "ddp" or engine != "torch":
            raise ValueError(f"--cpu makes a gloo test config for ddp only; this plan exports {strategy} on {engine} "
                             "(accelerate 1.15 enables FSDP and DeepSpeed only on accelerators); add --strategy ddp")
        notes.append("CPU test config: launched by torch.distributed.run on gloo; scripts using Accelerator need "
                     "ACCELERATE_USE_CPU=true (advisor launch sets it) or Accelerator(cpu=True).")
    hybrid = False
    torch_fsdp = engine == "torch" and impl.shard_params
    if options.hybrid != "off" and hw.nodes > 1 and torch_fsdp:
        hybrid = hybrid_fits(plan, strategy, engine, micro_batch_size=micro, activation_checkpointing=ckpt)
        if hybrid:
            notes.append(f"Hybrid sharding (HSDP): one node's share of the model states fits, so parameters are "
                         f"sharded over the {hw.gpus_per_node} GPUs of each node and replicated over the "
                         f"{hw.nodes} nodes (only the gradient all-reduce crosses nodes). --hybrid off to disable.")
        elif options.hybrid == "on":
            raise ValueError(f"--hybrid on: {strategy} sharded over one node's {hw.gpus_per_node} GPUs does not fit "
                             f"at micro-batch {micro}; use --hybrid auto or off")
    elif options.hybrid == "on":
        raise ValueError("--hybrid on needs several nodes and a torch FSDP strategy (zero2, zero3, *_offload)")
    if not plan.model.block_class and torch_fsdp:
        notes.append("The model's block class is unknown: FSDP wraps by size (SIZE_BASED_WRAP) instead of per block.")
    return ExportTarget(
        strategy=strategy, engine=engine, impl=impl, micro_batch_size=micro, gradient_accumulation_steps=accum or 1,
        activation_checkpointing=ckpt, precision=plan.training.precision, num_nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node, hybrid=hybrid, cpu=options.cpu, model_name=plan.model.name,
        model_type=plan.model.model_type, block_class=plan.model.block_class, gpu=hw.gpu.name, notes=tuple(notes),
    )
