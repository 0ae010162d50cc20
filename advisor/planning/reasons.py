"""The planner's reasons as data: one small frozen model per sentence family, with its numbers.

The planner (``policy``, ``fastest``, ``meshes``, ``pipeline_meshes``, ``remedies``, ``notes``,
``smallest``) returns these, in the order a reader should meet them; ``advisor.planning.render`` turns
each into the sentence ``advisor plan`` prints, and nothing else formats them. Memory is in bytes,
time in seconds, rates in tokens per second, shares as fractions: a test reads a reason's numbers and
compares them with the plan's own candidates. ``Reason`` is the union, tagged by ``kind``.

What is not a number stays a name (a strategy, a mesh label, a CLI flag) or, where it comes from a
table as prose (why an engine cannot run a strategy), the table's own words.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

Checkpointing = Literal["off", "on", "selective"]


class _Reason(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- the data-parallel choice (policy.choose) -------------------------------------------------------

class _SizeBand(_Reason):
    strategy: str = Field(description="The size-threshold default.")
    num_params: int = Field(description="The model's parameters.")
    band: Literal["small", "medium", "large"] = Field(description="< 1B, 1-10B, > 10B parameters.")


class SizeDefault(_SizeBand):
    """``Default from size: zero3 (7.62B parameters (1-10B): ...).``"""

    kind: Literal["size-default"] = "size-default"


class SizeDefaultUnfit(_SizeBand):
    """``--policy fastest``: ``The size default zero3 (...) does not fit.``"""

    kind: Literal["size-default-unfit"] = "size-default-unfit"


class AlsoSizeDefault(_SizeBand):
    """``--policy fastest``: ``It is also the size default (...).``"""

    kind: Literal["also-size-default"] = "also-size-default"


class _Fit(_Reason):
    strategy: str
    total_bytes: int = Field(description="Per-GPU total (peak + runtime overhead + context).")
    capacity_bytes: int = Field(description="Memory of one GPU.")
    micro_batch_size: int
    checkpointing: Checkpointing


class DefaultFits(_Fit):
    """``zero3 fits: 68.4 GiB of 79.2 GiB per GPU (86%) at micro-batch 1.``"""

    kind: Literal["default-fits"] = "default-fits"


class DoesNotFit(_Fit):
    """``zero3 does not fit: needs 79.6 GiB per GPU of 79.2 GiB even at micro-batch 1 with checkpointing.``"""

    kind: Literal["does-not-fit"] = "does-not-fit"


class HighEndDoesNotFit(_Fit):
    """``--margin high``: the high end of the range is past the GPU although the expected total is not."""

    kind: Literal["does-not-fit-high-end"] = "does-not-fit-high-end"
    high_bytes: int = Field(description="The high end of the per-GPU range.")


class CpuRamDoesNotFit(_Reason):
    """``zero3_offload does not fit in CPU RAM: needs 900.0 GiB per node of 512.0 GiB.``"""

    kind: Literal["does-not-fit-cpu-ram"] = "does-not-fit-cpu-ram"
    strategy: str
    cpu_bytes: int
    cpu_capacity_bytes: int


class Unavailable(_Reason):
    """``dp is unavailable: DataParallel is one process: one node only.``"""

    kind: Literal["unavailable"] = "unavailable"
    strategy: str
    detail: str = Field(description="Why, in the strategy table's (or the batch check's) words.")


class Escalated(_Fit):
    """``escalated to zero2_offload: 69.0 GiB of 79.2 GiB per GPU at micro-batch 3``, or ``fell back to ddp: ...
    (the fastest of 2 that fit on the GPUs alone: 1,427 tokens/s).``"""

    kind: Literal["escalated"] = "escalated"
    direction: Literal["escalated", "fell back"] = Field(description="Past the default in ESCALATION, or before it.")
    num_fitting_on_gpu: int = Field(description="GPU-only candidates that fit (named when more than one).")
    tokens_per_s: float | None


class FasterOffload(_Reason):
    """``zero3_offload rather than zero2_offload: both offload, and ...``"""

    kind: Literal["faster-offload"] = "faster-offload"
    strategy: str
    tokens_per_s: float
    micro_batch_size: int
    instead_of: str
    instead_tokens_per_s: float
    instead_micro_batch_size: int


class Figures(_Reason):
    """One fitting candidate's figures, as a comparison quotes them."""

    strategy: str
    total_bytes: int
    capacity_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float


class MarginChoice(_Reason):
    """``zero2 rather than zero3: zero2 71% of memory, ... vs zero3 ...; as fast (within 3%) and ...``"""

    kind: Literal["margin-choice"] = "margin-choice"
    chosen: Figures
    runner_up: Figures
    same_speed: float = Field(description="Tokens/s within this fraction count as as fast.")
    headroom: float = Field(description="The memory share a comfortable plan leaves free.")
    roomy: Literal["chosen-only", "both", "neither"] = Field(description="Which stay within 1 - headroom.")


class CpuRam(_Reason):
    """``zero2_offload needs 141.9 GiB of CPU RAM per node for offloaded states (...).``"""

    kind: Literal["cpu-ram"] = "cpu-ram"
    strategy: str
    cpu_bytes: int
    cpu_capacity_bytes: int | None = Field(description="--cpu-memory-gib, when given.")


class CheckpointingOn(_Reason):
    """Checkpointing is on because nothing fits without it."""

    kind: Literal["checkpointing-on"] = "checkpointing-on"
    mode: Literal["on", "selective"]


class AlsoFits(_Reason):
    """``ddp also fits (61% of memory, micro-batch 2, 1.20 s/step) and communicates less``."""

    kind: Literal["also-fits"] = "also-fits"
    strategy: str
    total_bytes: int
    capacity_bytes: int
    micro_batch_size: int
    step_s: float | None


class Requested(_Reason):
    """``--strategy zero2`` and it fits."""

    kind: Literal["requested"] = "requested"
    strategy: str


# --- --policy fastest (policy.choose_fastest, fastest.explain_tradeoff) -----------------------------

class FastestPolicy(_Reason):
    """``Policy fastest: of 4 candidates that fit, zero1 is fastest: 12,000 tokens/s (MFU 41%).``"""

    kind: Literal["fastest"] = "fastest"
    strategy: str
    num_fitting: int
    tokens_per_s: float
    mfu: float


class Spends(_Reason):
    kind: Literal["spends"] = "spends"
    label: str = Field(description="The step-time component.")
    slow_s: float = Field(description="Seconds per global batch, the slower candidate.")
    fast_s: float


class Recomputes(_Reason):
    kind: Literal["recomputes"] = "recomputes"


class MicroBatches(_Reason):
    kind: Literal["micro-batches"] = "micro-batches"
    fast: int
    slow: int


Gap = Annotated[Union[Spends, Recomputes, MicroBatches], Field(discriminator="kind")]


class Tradeoff(_Reason):
    """``zero1 is 1.20x faster than zero3 (... per global batch of 64 samples; ...) because ...``"""

    kind: Literal["tradeoff"] = "tradeoff"
    fast: str
    slow: str
    fast_batch_s: float = Field(description="Seconds per global batch.")
    slow_batch_s: float
    global_batch_size: int
    fast_tokens_per_s: float
    slow_tokens_per_s: float
    gaps: tuple[Gap, ...] = Field(description="What explains most of the gap (at most three).")


# --- remedies and the loss (remedies, notes) ---------------------------------------------------------

class OffloadRemedy(_Reason):
    """The first line of a plan that offloads: the best remedy, in numbers."""

    kind: Literal["offload-remedy"] = "offload-remedy"
    strategy: str
    tokens_per_s: float
    remedy: str = Field(description="The change as the CLI spells it.")
    keeps_math: bool
    remedy_strategy: str
    remedy_fits: bool = Field(description="The re-plan runs on the GPUs alone.")
    remedy_step_s: float
    remedy_tokens_per_s: float
    saved_gib: float = Field(description="Remedy.saved_gib: GiB saved on the reference candidate.")
    reference: str = Field(description="The candidate the saving is measured on.")


class RemedyFits(_Reason):
    """Nothing fits: ``with --lora 16 (changes the mathematics), zero3 fits on the GPUs alone: ...``"""

    kind: Literal["remedy-fits"] = "remedy-fits"
    remedy: str
    keeps_math: bool
    strategy: str
    fits: bool
    step_s: float
    tokens_per_s: float


class LossSaving(_Reason):
    kernel: str
    saved_bytes: int


class LossPeak(_Reason):
    """``the loss decides the peak of ddp (...): --loss chunked would save 2.2 GiB ... of its 21.3 GiB ...``"""

    kind: Literal["loss-peak"] = "loss-peak"
    strategy: str
    total_bytes: int
    micro_batch_size: int
    savings: tuple[LossSaving, ...]


class LossWouldFit(_Reason):
    """``nothing fits with the hf loss (...); with --loss chunked, zero3 fits at micro-batch 1 (70.0 GiB per GPU)``"""

    kind: Literal["loss-would-fit"] = "loss-would-fit"
    kernel: str
    strategy: str
    micro_batch_size: int
    total_bytes: int


class SmallestFitFound(_Reason):
    """``16 x H100-80GB-SXM would fit with zero3 at micro-batch 1.`` (on mesh ... when one is fewer)"""

    kind: Literal["smallest-fit"] = "smallest-fit"
    num_gpus: int
    gpu: str
    strategy: str
    mesh_label: str | None = None


class NoCountFits(_Reason):
    """``No number of these GPUs fits: ...; shorten --seq-len.``"""

    kind: Literal["no-count-fits"] = "no-count-fits"
    checkpointing_tried: bool
    hints: tuple[str, ...] = Field(description="What to change, as CLI advice.")


# --- meshes (meshes, pipeline_meshes) ----------------------------------------------------------------

class BatchLimit(_Reason):
    """The global batch cannot give every GPU whole micro-batches."""

    kind: Literal["batch-indivisible", "batch-micro-steps"]
    global_batch_size: int
    world_size: int
    micro_batch_size: int | None = None


class MemoryLimit(_Reason):
    """Zero3 alone does not fit, and which part of its peak decides it."""

    kind: Literal["activations-and-logits", "activations", "largest-layer", "model-states"]
    activations_bytes: int
    temporary_bytes: int
    states_bytes: int = Field(description="Parameters + gradients + optimizer state per GPU.")
    checkpointing: Checkpointing
    total_bytes: int
    capacity_bytes: int
    micro_batch_size: int
    peak_moment: str


class NoDataParallelFits(_Reason):
    kind: Literal["no-data-parallel"] = "no-data-parallel"


Limit = Annotated[Union[BatchLimit, MemoryLimit, NoDataParallelFits], Field(discriminator="kind")]


class DataParallelCannot(_Reason):
    """``Data parallelism alone cannot run this: the limit is ...``"""

    kind: Literal["data-parallel-cannot"] = "data-parallel-cannot"
    limit: Limit


class MeshFits(_Fit):
    """``mesh cp 8 (zero3: FSDP2 over dp_shard x cp) fits: 77.0 GiB of 79.2 GiB per GPU at ...``"""

    kind: Literal["mesh-fits"] = "mesh-fits"
    mesh_label: str
    step_s: float
    tokens_per_s: float
    mfu: float


class DegreeEffect(_Reason):
    """``cp 8 saves 425.5 GiB per GPU (502.5 GiB without it); ...``: one degree against the same mesh
    with that degree folded into dp_shard, same micro-batch and checkpointing."""

    kind: Literal["degree-effect"] = "degree-effect"
    dim: str
    degree: int
    total_bytes: int = Field(description="The chosen mesh's per-GPU total.")
    without_bytes: int = Field(description="The per-GPU total without this degree.")
    compare: Literal["tokens", "step", "unfit", "none"] = Field(
        description="What the time clause compares: tokens/s (pp), s/step, or that it does not fit without it.")
    tokens_per_s: float | None = None
    without_tokens_per_s: float | None = None
    step_s: float | None = None
    without_step_s: float | None = None
    micro_batch_size: int


class StagePeaks(_Reason):
    """``per-stage peaks (GiB, rank 0 first): 70.1, 68.2; the worst, rank 0, decides the fit.``"""

    kind: Literal["stage-peaks"] = "stage-peaks"
    peaks_bytes: tuple[int, ...]


class WithoutPipeline(_Reason):
    """``best mesh without pp/ep: ...``, beside a pipeline choice."""

    kind: Literal["without-pipeline"] = "without-pipeline"
    mesh_label: str
    total_bytes: int
    fits: bool
    step_s: float | None = None
    tokens_per_s: float | None = None


class SearchCause(_Reason):
    """Why pipeline/expert meshes joined the search."""

    kind: Literal["pinned", "experts", "no-mesh-tried", "no-mesh-fits", "policy-fastest"]
    expert_share: float | None = None
    num_params: int | None = None
    mesh_label: str | None = Field(default=None, description="The closest tp/cp/HSDP mesh (no-mesh-fits).")
    total_bytes: int | None = None
    capacity_bytes: int | None = None


class PipelineSearched(_Reason):
    """``Pipeline/expert meshes searched: <cause>.``"""

    kind: Literal["pipeline-searched"] = "pipeline-searched"
    cause: SearchCause


class PipelineSummary(_Reason):
    """Pipeline/expert meshes were searched and none chosen: the fastest that fits, or the closest."""

    kind: Literal["pipeline-summary"] = "pipeline-summary"
    cause: SearchCause
    mesh_label: str
    total_bytes: int
    fits: bool
    step_s: float | None = None
    tokens_per_s: float | None = None
    worst_rank: int | None = None
    capacity_bytes: int | None = None


class NoGpuOnlyMesh(_Reason):
    """``No GPU-only mesh fits (<cause>): the closest, ..., of which the model states alone are ...``"""

    kind: Literal["no-gpu-only-mesh"] = "no-gpu-only-mesh"
    cause: SearchCause
    mesh_label: str
    total_bytes: int
    capacity_bytes: int
    micro_batch_size: int
    states_bytes: int


class PinnedDegrees(_Reason):
    """``Pinned degrees: --tp 2, --cp 4.``"""

    kind: Literal["pinned-degrees"] = "pinned-degrees"
    flags: tuple[tuple[str, str], ...] = Field(description="(flag, value) as given, in the CLI's order.")


class NoPinnedMeshFits(_Reason):
    kind: Literal["no-pinned-mesh-fits"] = "no-pinned-mesh-fits"
    mesh_label: str | None = Field(default=None, description="The closest mesh tried.")
    total_bytes: int | None = None
    micro_batch_size: int | None = None


class NoMeshFits(_Reason):
    kind: Literal["no-mesh-fits"] = "no-mesh-fits"
    num_tried: int
    images: bool = Field(description="Image batches: no cp was tried.")


class MeshNotFaster(_Reason):
    """``The fastest mesh, tp 2, is not faster by more than 3%: 1,000 vs 990 tokens/s.``"""

    kind: Literal["mesh-not-faster"] = "mesh-not-faster"
    mesh_label: str
    tokens_per_s: float
    dp_tokens_per_s: float
    same_speed: float


class MeshTiming(_Reason):
    total_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float
    exposed_communication_s: float
    checkpointing: Checkpointing


class FastestMesh(_Reason):
    """``Policy fastest: mesh tp 2 is 12% faster than zero3 alone: ...``"""

    kind: Literal["fastest-mesh"] = "fastest-mesh"
    mesh_label: str
    dp_strategy: str
    mesh: MeshTiming
    dp: MeshTiming


class DataParallelAlsoFits(_Reason):
    """``zero3 alone (data parallelism over all 8 GPUs) also fits: ...``"""

    kind: Literal["data-parallel-also-fits"] = "data-parallel-also-fits"
    strategy: str
    world_size: int
    total_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float


Reason = Annotated[Union[
    SizeDefault, SizeDefaultUnfit, AlsoSizeDefault, DefaultFits, DoesNotFit, HighEndDoesNotFit, CpuRamDoesNotFit,
    Unavailable, Escalated, FasterOffload, MarginChoice, CpuRam, CheckpointingOn, AlsoFits, Requested, FastestPolicy,
    Tradeoff, OffloadRemedy, RemedyFits, LossPeak, LossWouldFit, SmallestFitFound, NoCountFits, DataParallelCannot,
    MeshFits, DegreeEffect, StagePeaks, WithoutPipeline, PipelineSearched, PipelineSummary, NoGpuOnlyMesh,
    PinnedDegrees, NoPinnedMeshFits, NoMeshFits, MeshNotFaster, FastestMesh, DataParallelAlsoFits,
], Field(discriminator="kind")]
