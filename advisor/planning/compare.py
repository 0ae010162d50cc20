"""``compare(model, ["2xA100", "8xH100", ...], **plan options) -> Comparison``: the same job on
several clusters side by side.

For each cluster: ``advisor.planning.api.plan`` chooses the strategy (its policy, its memory model), then
``advisor.estimate.step_time`` times the recommended candidate. GPU-hours per billion tokens = GPUs x
(1e9 / global tokens per second) / 3600, the cost figure that makes clusters of different sizes
comparable. No arithmetic of its own beyond that; no CLI types.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_serializer

from advisor.frozen import in_json_order
from advisor.planning.api import Plan, plan
from advisor.planning.candidates import within_headroom
from advisor.planning.render import headline_reason
from advisor.estimate.step_time import StepTime, estimate_step_time
from advisor.strategies import STRATEGIES
from advisor.training import CheckpointMode

BILLION = 1e9
SECONDS_PER_HOUR = 3600.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterResult(_Frozen):
    """One cluster's row; ``--json`` keeps its keys in ``_KEYS``' order (the checkpointing booleans are
    properties of ``checkpointing``)."""

    gpus: str = Field(description="The --gpus item as given.")
    label: str = Field(description="Resolved cluster, e.g. 2x8xH100-80GB-SXM.")
    world_size: int
    fits: bool
    strategy: str | None = None
    mesh: str | None = Field(default=None, description="The recommended mesh (advisor.mesh.ParallelDims.label), "
                             "None for data parallelism alone or where nothing fits.")
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    checkpointing: CheckpointMode | None = Field(default=None, exclude=True, description="How the recommended step "
                                                 "checkpoints its blocks; None: nothing fits. The JSON carries it as "
                                                 "activation_checkpointing and selective_checkpointing.")
    memory_per_gpu_bytes: int | None = Field(default=None, description="Estimated peak per GPU.")
    capacity_bytes: int
    step: StepTime | None = None
    gpu_hours_per_billion_tokens: float | None = None
    message: str = Field(default="", description="Why nothing fits, or the one line of why advisor plan answers with "
                         "(advisor.planning.render.headline_reason).")
    precision: str | None = Field(default=None, exclude=True, description="The precision the cluster was planned in "
                                  "(fp16-mixed on a GPU without bf16); the table says so where they differ.")
    within_headroom: bool | None = Field(default=None, description="The plan leaves the --headroom free at its "
                                         "--margin end (None: nothing fits); past it, the plan is within the "
                                         "estimate's error of an out-of-memory failure.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def activation_checkpointing(self) -> bool | None:
        """The step recomputes its blocks (fully or selectively); None: nothing fits."""
        return None if self.checkpointing is None else self.checkpointing != "off"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def selective_checkpointing(self) -> bool | None:
        """Checkpointing is selective (AC covers part of each block), not full recomputation; None: nothing fits."""
        return None if self.checkpointing is None else self.checkpointing == "selective"

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        return in_json_order(handler(self), _KEYS)


_KEYS = ("gpus", "label", "world_size", "fits", "strategy", "mesh", "micro_batch_size", "gradient_accumulation_steps",
         "activation_checkpointing", "selective_checkpointing", "memory_per_gpu_bytes", "capacity_bytes",
         "within_headroom", "step", "gpu_hours_per_billion_tokens", "message")


class Comparison(_Frozen):
    model: str
    total_params: int
    results: tuple[ClusterResult, ...]

    def _timed(self) -> list[ClusterResult]:
        """The clusters with a plan, those within the --headroom only where any is (one past it is within the
        estimate's error of an out-of-memory failure: not the answer while another cluster runs with room)."""
        timed = [r for r in self.results if r.step is not None and r.gpu_hours_per_billion_tokens is not None]
        return [r for r in timed if r.within_headroom] or timed

    @property
    def fastest(self) -> ClusterResult | None:
        timed = self._timed()
        return max(timed, key=lambda r: r.step.tokens_per_s) if timed else None

    @property
    def cheapest(self) -> ClusterResult | None:
        timed = self._timed()
        return min(timed, key=lambda r: r.gpu_hours_per_billion_tokens) if timed else None


def gpu_hours_per_billion_tokens(world_size: int, tokens_per_s: float) -> float:
    """GPUs x seconds to process 1e9 tokens, in hours."""
    return world_size * (BILLION / tokens_per_s) / SECONDS_PER_HOUR


def split_gpus(text: str) -> list[str]:
    """``"2xA100, 8xH100"`` -> ``["2xA100", "8xH100"]``; an empty item is an error."""
    items = [item.strip() for item in (text or "").split(",")]
    if not items or any(not item for item in items):
        raise ValueError(f"cannot read --gpus '{(text or '')[:60]}': expected a comma-separated list such as 2xA100,8xH100")
    return items


def _refuse_repeats(items: list[str], *, nodes: int | None, interconnect: str | None) -> None:
    """ValueError where two items name one cluster (2xA100 and 2xA100-80GB-SXM): its row would be printed twice."""
    from advisor.hardware.cluster import parse_gpus

    seen: dict[tuple, str] = {}
    for item in items:
        if not isinstance(item, str):
            continue  # a Hardware handed in by a caller: compared as given
        hw = parse_gpus(item, nodes=nodes, interconnect=interconnect)
        key = (hw.gpu.name, hw.gpus_per_node, hw.nodes, hw.intra_node_link.name,
               hw.inter_node_link.name if hw.inter_node_link is not None else None)
        if key in seen:
            raise ValueError(f"--gpus lists one cluster twice ({seen[key]} and {item}: {hw.nodes} x "
                             f"{hw.gpus_per_node} x {hw.gpu.name}): give each cluster once")
        seen[key] = item


def time_recommendation(result: Plan) -> StepTime | None:
    """Step time of the plan's recommended candidate (None when nothing fits), as the planner timed it: its own
    checkpointing mode (selective or full), micro-batch, accumulation and mesh. Re-timing it here from a bool
    timed selective checkpointing as full recomputation (issue 21 item 10)."""
    if result.recommendation is None:
        return None
    cand = result.chosen
    if cand.step_time is not None:
        return cand.step_time
    impl = STRATEGIES[cand.strategy].on(result.training.engine)
    return estimate_step_time(result.model, result.hardware, result.training, impl,
                              micro_batch_size=cand.micro_batch_size,
                              checkpointing=bool(cand.activation_checkpointing),
                              gradient_accumulation_steps=cand.gradient_accumulation_steps or 1)


def _cluster(result: Plan, gpus: str, step: StepTime | None) -> ClusterResult:
    hw, rec = result.hardware, result.recommendation
    base = dict(gpus=gpus, label=hw.label, world_size=hw.world_size,
                capacity_bytes=hw.gpu_memory_bytes, precision=result.training.precision)
    if rec is None or step is None:
        return ClusterResult(**base, fits=False, message=" ".join(result.why[-1:]))
    cand = result.chosen
    hours = gpu_hours_per_billion_tokens(hw.world_size, step.tokens_per_s)
    return ClusterResult(
        **base, fits=True, strategy=rec.strategy, mesh=cand.mesh.label if cand.mesh is not None else None,
        micro_batch_size=cand.micro_batch_size,
        gradient_accumulation_steps=step.gradient_accumulation_steps,
        checkpointing=cand.checkpointing, memory_per_gpu_bytes=cand.memory_bytes.total,
        step=step, gpu_hours_per_billion_tokens=hours, message=headline_reason(result),
        within_headroom=within_headroom(cand, result.training),
    )


def compare(model: Any, gpus: Sequence[str] | str, *, nodes: int | None = None, interconnect: str | None = None,
            **plan_options: Any) -> Comparison:
    """Plan and time ``model`` on every cluster in ``gpus`` (a list or a comma-separated string)."""
    items = split_gpus(gpus) if isinstance(gpus, str) else list(gpus)
    if not items:
        raise ValueError("give at least one cluster to compare")
    _refuse_repeats(items, nodes=nodes, interconnect=interconnect)
    results, spec = [], None
    for item in items:
        result = plan(model, item, nodes=nodes, interconnect=interconnect, **plan_options)
        spec = result.model
        model = spec  # resolve the model once, reuse the spec for the other clusters
        step = time_recommendation(result)
        results.append(_cluster(result, item, step))
    return Comparison(model=spec.name, total_params=spec.total_params, results=tuple(results))
