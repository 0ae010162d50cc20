"""Check a plan against PyTorch's execution: simulate the chosen candidate's step and compare.

``verify(plan, strategy=None)`` takes an ``advisor.plan(...)`` result, picks the recommended
candidate (or ``strategy``), runs ``advisor.simulate.step.simulate`` with the same micro-batch,
checkpointing and training settings, and returns both breakdowns and the error. ``advisor plan
--verify`` and ``advisor simulate`` both call it; it prints nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.memory import MemoryBreakdown
from advisor.frozen import validated_copy
from advisor.simulate.step import Progress, SimulatedStep, simulate

if TYPE_CHECKING:  # the simulator sits below the planner: it reads a Plan, never imports one at run time
    from advisor.planning.api import Plan


class Verification(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str
    micro_batch_size: int
    checkpointing: bool
    analytic: MemoryBreakdown = Field(description="The plan's estimate for this candidate.")
    simulated: SimulatedStep = Field(description="The measured step.")
    error_pct: float = Field(description="(analytic - simulated) / simulated peak_allocated, in %.")


def refuse_unsimulated(plan: Plan) -> None:
    """ValueError for what the simulator cannot build before it starts: a quantised base (fake tensors cannot run
    bitsandbytes kernels, so its estimate is checked against published runs instead, ``advisor.estimate.quantized``)
    and a model given by its size alone or as a live module (no config to build)."""
    if plan.training.quantize is not None:
        raise ValueError(f"--quantize {plan.training.quantize}: fake tensors cannot run bitsandbytes kernels, so a "
                         "quantised base is not simulated (see python benchmarks/qlora_published.py)")
    if plan.model.source in ("params", "module"):
        raise ValueError("simulate needs a model config (a bundled id, local config.json or Hub id)")


def unverified_reason(plan: Plan, strategy: str | None = None) -> str | None:
    """Why ``verify`` cannot simulate ``plan``'s candidate (the recommendation, or ``strategy``), found before it
    starts: nothing recommended, a mesh, a model or settings the simulator cannot build, a strategy it does not run;
    None when it can (``advisor plan --verify`` then prints the plan unverified, with this reason)."""
    from advisor.simulate.step import check_simulated

    name = strategy or (plan.recommendation.strategy if plan.recommendation else None)
    if name is None:
        return "nothing fits, so there is no candidate to simulate; pass --strategy and --micro-batch"
    if strategy is None and plan.recommendation.mesh is not None:
        return (f"the simulator runs data-parallel steps; the recommendation runs on mesh "
                f"{plan.recommendation.mesh.label}: pass --strategy to simulate a data-parallel candidate")
    try:
        refuse_unsimulated(plan)
        check_simulated(name, plan.training, plan.hardware.world_size)
    except ValueError as exc:
        return str(exc)
    return None


def verify(plan: Plan, *, strategy: str | None = None, real_tensors: bool = False,
           progress: Progress | None = None, timeline: bool = False) -> Verification:
    """Simulate ``plan``'s recommended candidate (or ``strategy``) and compare with its estimate;
    ``timeline`` also records the step segment by segment (``simulated.timeline``)."""
    why = unverified_reason(plan, strategy)
    if why is not None:
        raise ValueError(why)
    name = strategy or plan.recommendation.strategy
    candidate = plan.candidate(name)
    if candidate.memory_bytes is None or candidate.micro_batch_size is None:
        raise ValueError(f"strategy {name} has no estimate here ({candidate.unavailable_reason or 'does not fit'}); "
                         "pass --micro-batch")
    spec = plan.model
    partial = spec.trainable_params < spec.total_params and plan.training.lora is None  # LoRA: PEFT freezes
    trainable = spec.trainable_params if partial else None
    mode = "selective" if candidate.checkpointing == "selective" else plan.training.activation_checkpointing
    model: str | dict = spec.name
    if spec.head is not None:  # a task head: the head class transformers builds (advisor.simulate.heads)
        from advisor.simulate.heads import head_config
        from advisor.simulate.model import resolve_config

        model = head_config(resolve_config(spec.name)[1], spec.head)
    simulated = simulate(
        model, world_size=plan.hardware.world_size, strategy=name,
        training=validated_copy(plan.training, {"activation_checkpointing": mode}),
        micro_batch_size=candidate.micro_batch_size, checkpointing=bool(candidate.activation_checkpointing),
        trainable_params=trainable, real_tensors=real_tensors, progress=progress, timeline=timeline,
    )
    analytic = candidate.memory_bytes
    error = 100 * (analytic.peak_allocated - simulated.peak_allocated) / simulated.peak_allocated
    return Verification(strategy=name, micro_batch_size=candidate.micro_batch_size,
                        checkpointing=bool(candidate.activation_checkpointing), analytic=analytic,
                        simulated=simulated, error_pct=round(error, 2))
