"""Reasons of the mesh search (``meshes``, ``pipeline_meshes``): what forced a mesh, what it and each
degree buy, and why pipeline or expert meshes were searched."""

# No ``from __future__ import annotations``: see reasons/base.py.
from typing import Annotated, Literal, Union

from pydantic import Field

from advisor.planning.reasons.base import Checkpointing, FitFigures, ReasonModel

class BatchLimit(ReasonModel):
    """The global batch cannot give every GPU whole micro-batches."""

    kind: Literal["batch-indivisible", "batch-micro-steps"]
    global_batch_size: int
    world_size: int
    micro_batch_size: int | None = None


class MemoryLimit(ReasonModel):
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


class NoDataParallelFits(ReasonModel):
    kind: Literal["no-data-parallel"] = "no-data-parallel"


Limit = Annotated[Union[BatchLimit, MemoryLimit, NoDataParallelFits], Field(discriminator="kind")]

# A mesh planned at its own micro-batch in place of an offload (no --global-batch was given): the offload plan's
# samples a step, at which no mesh fits within the headroom (or, under --policy fastest, none was faster), and the
# mesh's own samples a step.
OffloadSamplesUnfit = Annotated[int | None, Field(
    exclude_if=lambda n: n is None, description="The offload plan's samples a step, at which no mesh fits within the "
    "headroom (--policy fastest: none was faster): the mesh is planned at its own micro-batch (no --global-batch).")]
MeshOwnSamples = Annotated[int | None, Field(exclude_if=lambda n: n is None, description="The mesh's own samples a "
                                             "step, where offload_samples_unfit is given.")]


class DataParallelCannot(ReasonModel):
    """``Data parallelism alone cannot run this: the limit is ...``; where it runs only by offloading: ``Data
    parallelism alone runs this only with CPU offload (zero3_offload, 4,794 tokens/s); on the GPUs alone the limit
    is ...``"""

    kind: Literal["data-parallel-cannot"] = "data-parallel-cannot"
    limit: Limit
    offload_strategy: str | None = Field(default=None, exclude_if=lambda name: name is None,
                                         description="The data-parallel plan that runs it only by offloading to the "
                                                     "CPU, which a GPU-only mesh replaces.")
    offload_tokens_per_s: float | None = Field(default=None, exclude_if=lambda rate: rate is None)
    samples_per_step: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                         description="The offload plan's samples a step, at which the mesh that "
                                                     "replaces it is planned (no --global-batch was given).")
    offload_samples_unfit: OffloadSamplesUnfit = None
    mesh_samples_per_step: MeshOwnSamples = None


class MeshFits(FitFigures):
    """``mesh cp 8 (zero3: FSDP2 over dp_shard x cp) fits: 77.0 GiB of 79.2 GiB per GPU at ...``"""

    kind: Literal["mesh-fits"] = "mesh-fits"
    mesh_label: str
    step_s: float
    tokens_per_s: float
    mfu: float


class DegreeEffect(ReasonModel):
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


class StagePeaks(ReasonModel):
    """``per-stage peaks (GiB, rank 0 first): 70.1, 68.2; the worst, rank 0, decides the fit.``"""

    kind: Literal["stage-peaks"] = "stage-peaks"
    peaks_bytes: tuple[int, ...]


class WithoutPipeline(ReasonModel):
    """``best mesh without pp/ep: ...``, beside a pipeline choice."""

    kind: Literal["without-pipeline"] = "without-pipeline"
    mesh_label: str
    total_bytes: int
    fits: bool
    step_s: float | None = None
    tokens_per_s: float | None = None


class SearchCause(ReasonModel):
    """Why pipeline/expert meshes joined the search."""

    kind: Literal["pinned", "experts", "no-mesh-tried", "no-mesh-fits", "policy-fastest", "low-mfu"]
    expert_share: float | None = None
    num_params: int | None = None
    mesh_label: str | None = Field(default=None, description="The closest tp/cp/HSDP mesh (no-mesh-fits), or the "
                                   "best (low-mfu).")
    total_bytes: int | None = None
    capacity_bytes: int | None = None
    mfu: float | None = Field(default=None, exclude_if=lambda x: x is None,
                              description="low-mfu: the best tp/cp/HSDP mesh's MFU, below USEFUL_MFU on several nodes.")


class PipelineSearched(ReasonModel):
    """``Pipeline/expert meshes searched: <cause>.``"""

    kind: Literal["pipeline-searched"] = "pipeline-searched"
    cause: SearchCause


class PipelineSummary(ReasonModel):
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


class NoGpuOnlyMesh(ReasonModel):
    """``No GPU-only mesh fits (<cause>): the closest, ..., of which the model states alone are ...``"""

    kind: Literal["no-gpu-only-mesh"] = "no-gpu-only-mesh"
    cause: SearchCause
    mesh_label: str
    total_bytes: int
    capacity_bytes: int
    micro_batch_size: int
    states_bytes: int
    samples_per_step: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                         description="The offload plan's samples a step, at which the meshes were "
                                                     "planned (no --global-batch was given).")


class PinnedDegrees(ReasonModel):
    """``Pinned degrees: --tp 2, --cp 4.``"""

    kind: Literal["pinned-degrees"] = "pinned-degrees"
    flags: tuple[tuple[str, str], ...] = Field(description="(flag, value) as given, in the CLI's order.")


class NoPinnedMeshFits(ReasonModel):
    kind: Literal["no-pinned-mesh-fits"] = "no-pinned-mesh-fits"
    mesh_label: str | None = Field(default=None, description="The closest mesh tried.")
    total_bytes: int | None = None
    micro_batch_size: int | None = None


class NoMeshFits(ReasonModel):
    kind: Literal["no-mesh-fits"] = "no-mesh-fits"
    num_tried: int
    images: bool = Field(description="Image batches: no cp was tried.")
    tried: tuple[str, ...] = Field(default=(), description="The parallel dimensions the meshes tried take past 1 "
                                   "(tp, cp, HSDP, pp, ep), in that order.")
    unavailable: bool = Field(default=False, exclude_if=lambda none_ran: not none_ran,
                              description="No mesh could run the job at all: every mesh runs FSDP2, which this job's "
                                          "settings rule out (transformers' Adafactor).")


class MeshNotFaster(ReasonModel):
    """``The fastest mesh, tp 2, is not faster by more than 3%: 1,000 vs 990 tokens/s.``"""

    kind: Literal["mesh-not-faster"] = "mesh-not-faster"
    mesh_label: str
    tokens_per_s: float
    dp_tokens_per_s: float
    same_speed: float


class OffloadKeptOverMesh(ReasonModel):
    """The data-parallel family fits only by offloading, within the --headroom, and the best GPU-only mesh fits only
    past it: ``zero3 on mesh dp_shard 4 x tp 4 fits on the GPUs alone only past the 10% headroom (78.7 of 79.2 GiB,
    99%), at 7,950 tokens/s against zero3_offload's 10,629: the offload is kept.`` (where the mesh is faster, ``;
    --policy fastest takes the mesh``)."""

    kind: Literal["offload-kept-over-mesh"] = "offload-kept-over-mesh"
    mesh_label: str
    total_bytes: int
    capacity_bytes: int
    headroom: float
    tokens_per_s: float
    offload_strategy: str
    offload_tokens_per_s: float
    fastest_takes_mesh: bool = Field(default=False, description="The mesh is faster than the offload by more than "
                                     "SAME_SPEED, so --policy fastest takes it.")
    samples_per_step: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                         description="The offload plan's samples a step, at which the mesh was "
                                                     "planned (no --global-batch was given).")


class MeshSlowerThanOffload(ReasonModel):
    """A GPU-only mesh within the --headroom replaced an offloading plan the estimate makes faster: ``zero3 on mesh
    cp 4 x tp 2 runs 15% slower than zero3_offload (5,321 against 6,281 tokens/s), and is taken because it fits on
    the GPUs alone within the headroom; --policy fastest keeps the offload.`` (or takes the faster mesh past the
    headroom that it names)."""

    kind: Literal["mesh-slower-than-offload"] = "mesh-slower-than-offload"
    mesh_label: str
    tokens_per_s: float
    offload_strategy: str
    offload_tokens_per_s: float
    fastest_mesh_label: str | None = Field(default=None, description="The mesh --policy fastest takes instead "
                                           "(faster than the offload, past the headroom); None: it keeps the offload.")


class MeshTiming(ReasonModel):
    total_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float
    exposed_communication_s: float
    checkpointing: Checkpointing


class FastestMesh(ReasonModel):
    """``Policy fastest: mesh tp 2 is 12% faster than zero3 alone: ...``"""

    kind: Literal["fastest-mesh"] = "fastest-mesh"
    mesh_label: str
    dp_strategy: str
    mesh: MeshTiming
    dp: MeshTiming
    offload_samples_unfit: OffloadSamplesUnfit = None
    mesh_samples_per_step: MeshOwnSamples = None


class MeshWithinHeadroom(ReasonModel):
    """``zero3 alone needs 78.4 GiB of 79.2 GiB (99%), past the 10% headroom (within the estimate's error of an
    out-of-memory failure); mesh cp 8 runs within it: 54.4 GiB (69%), 34,143 vs 26,530 tokens/s.``"""

    kind: Literal["mesh-within-headroom"] = "mesh-within-headroom"
    mesh_label: str
    dp_strategy: str
    mesh: MeshTiming
    dp: MeshTiming
    capacity_bytes: int
    headroom: float
    dp_samples_unfit: int | None = Field(
        default=None, exclude_if=lambda n: n is None, description="The data-parallel plan's samples a step, at which "
        "no mesh fits within the headroom: the mesh is planned at its own micro-batch (no --global-batch).")
    mesh_samples_per_step: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                              description="The mesh's own samples a step, where dp_samples_unfit is given.")


class MeshOverSlowDataParallel(ReasonModel):
    """``zero3 alone runs at MFU 9% on 4 nodes (7,269 tokens/s, 2.81 s of its 4.51 s step in exposed communication);
    mesh pp 4 x dp_shard 2 x tp 4 runs 18,777 tokens/s (2.58x) within the headroom: 68.0 GiB (86%).``"""

    kind: Literal["mesh-over-slow-data-parallel"] = "mesh-over-slow-data-parallel"
    mesh_label: str
    dp_strategy: str
    mesh: MeshTiming
    dp: MeshTiming
    nodes: int
    dp_mfu: float
    capacity_bytes: int


class DataParallelAlsoFits(ReasonModel):
    """``zero3 alone (data parallelism over all 8 GPUs) also fits: ...``"""

    kind: Literal["data-parallel-also-fits"] = "data-parallel-also-fits"
    strategy: str
    world_size: int
    total_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float
