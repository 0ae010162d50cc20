"""The planner's reasons as data: one small frozen model per sentence family, with its numbers.

The planner (``policy``, ``fastest``, ``meshes``, ``pipeline_meshes``, ``remedies``, ``notes``,
``smallest``) returns these, in the order a reader should meet them; ``advisor.planning.render`` turns
each into the sentence ``advisor plan`` prints, and nothing else formats them. Memory is in bytes,
time in seconds, rates in tokens per second, shares as fractions: a test reads a reason's numbers and
compares them with the plan's own candidates. ``Reason`` is the union, tagged by ``kind``.

What is not a number stays a name (a strategy, a mesh label, a CLI flag) or, where it comes from a
table as prose (why an engine cannot run a strategy), the table's own words.

The mesh search's reasons (``mesh``) load when first named (``reasons.MeshFits``, ``reasons.Reason``): a
data-parallel plan never makes one, and building their 20 classes cost every ``advisor plan`` about 30 M
instructions (benchmarks/plan_instructions.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from advisor.planning.reasons.base import Checkpointing, FitFigures, ReasonModel
from advisor.planning.reasons.choice import (SizeBand, SizeDefault, SizeDefaultUnfit, AlsoSizeDefault, DefaultFits,
    DoesNotFit, HighEndDoesNotFit, CpuRamDoesNotFit, Unavailable, Escalated, FasterOffload, OffloadNotTaken, Figures, MarginChoice,
    Dominates, CpuRam, CheckpointingOn, CheckpointingForHeadroom, AlsoFits, Requested, FastestPolicy, Spends, Recomputes, MicroBatches, Tradeoff,
    OffloadRemedy, HeadroomRemedy, SingleProcessRemedy, RemedyFits, LossSaving, LossPeak, LossWouldFit, SmallestFitFound, LongerWithOffload, LongerWithChange, BeyondContext, LongestWithinHeadroom, PastHeadroom, NoCountFits, Gap)

_MESH = ("BatchLimit", "MemoryLimit", "NoDataParallelFits", "DataParallelCannot", "MeshFits", "DegreeEffect",
         "StagePeaks", "WithoutPipeline", "SearchCause", "PipelineSearched", "PipelineSummary", "NoGpuOnlyMesh",
         "PinnedDegrees", "NoPinnedMeshFits", "NoMeshFits", "MeshNotFaster", "MeshTiming", "FastestMesh",
         "DataParallelAlsoFits", "OffloadKeptOverMesh", "MeshSlowerThanOffload", "MeshWithinHeadroom", "MeshOverSlowDataParallel", "Limit")


def __getattr__(name: str) -> Any:
    """The mesh reasons and ``Reason`` (which names them), imported on first use (PEP 562)."""
    if name not in _MESH and name != "Reason":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from advisor.planning.reasons import mesh

    globals().update({mesh_name: getattr(mesh, mesh_name) for mesh_name in _MESH})
    globals()["Reason"] = _reason_union()
    return globals()[name]


def _reason_union() -> Any:
    from advisor.planning.reasons.mesh import (DataParallelCannot, MeshFits, DegreeEffect, StagePeaks, WithoutPipeline,
        PipelineSearched, PipelineSummary, NoGpuOnlyMesh, PinnedDegrees, NoPinnedMeshFits, NoMeshFits, MeshNotFaster,
        FastestMesh, DataParallelAlsoFits, OffloadKeptOverMesh, MeshSlowerThanOffload, MeshWithinHeadroom, MeshOverSlowDataParallel)

    return Annotated[Union[
        SizeDefault, SizeDefaultUnfit, AlsoSizeDefault, DefaultFits, DoesNotFit, HighEndDoesNotFit, CpuRamDoesNotFit,
        Unavailable, Escalated, FasterOffload, OffloadNotTaken, MarginChoice, Dominates, CpuRam, CheckpointingOn, CheckpointingForHeadroom, AlsoFits, Requested, FastestPolicy,
        Tradeoff, OffloadRemedy, HeadroomRemedy, SingleProcessRemedy, RemedyFits, LossPeak, LossWouldFit, SmallestFitFound, LongerWithOffload,
        LongerWithChange, BeyondContext, LongestWithinHeadroom, PastHeadroom, NoCountFits,
        DataParallelCannot,
        MeshFits, DegreeEffect, StagePeaks, WithoutPipeline, PipelineSearched, PipelineSummary, NoGpuOnlyMesh,
        PinnedDegrees, NoPinnedMeshFits, NoMeshFits, MeshNotFaster, FastestMesh, DataParallelAlsoFits,
        OffloadKeptOverMesh, MeshSlowerThanOffload, MeshWithinHeadroom, MeshOverSlowDataParallel,
    ], Field(discriminator="kind")]


__all__ = ["Reason", "Checkpointing", "FitFigures", "ReasonModel", "SizeBand", "SizeDefault", "SizeDefaultUnfit",
           "AlsoSizeDefault", "DefaultFits", "DoesNotFit", "HighEndDoesNotFit", "CpuRamDoesNotFit", "Unavailable",
           "Escalated", "FasterOffload", "OffloadNotTaken", "Figures", "MarginChoice", "Dominates", "CpuRam", "CheckpointingOn", "CheckpointingForHeadroom", "AlsoFits",
           "Requested", "FastestPolicy", "Spends", "Recomputes", "MicroBatches", "Tradeoff", "OffloadRemedy",
           "HeadroomRemedy", "SingleProcessRemedy", "RemedyFits", "LossSaving", "LossPeak", "LossWouldFit", "SmallestFitFound", "LongerWithOffload",
           "LongerWithChange", "BeyondContext", "LongestWithinHeadroom", "PastHeadroom", "NoCountFits",
           "Gap",
           "BatchLimit", "MemoryLimit", "NoDataParallelFits", "DataParallelCannot", "MeshFits", "DegreeEffect",
           "StagePeaks", "WithoutPipeline", "SearchCause", "PipelineSearched", "PipelineSummary", "NoGpuOnlyMesh",
           "PinnedDegrees", "NoPinnedMeshFits", "NoMeshFits", "MeshNotFaster", "MeshTiming", "FastestMesh",
           "DataParallelAlsoFits", "OffloadKeptOverMesh", "MeshSlowerThanOffload", "MeshWithinHeadroom", "MeshOverSlowDataParallel", "Limit"]
