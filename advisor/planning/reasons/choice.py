"""Reasons of the data-parallel choice (``policy``), ``--policy fastest`` (``fastest``), the remedies and the
loss (``remedies``, ``notes``) and the smallest fit (``smallest``)."""

# No ``from __future__ import annotations``: see reasons/base.py.
from typing import Annotated, Literal, Union

from pydantic import Field

from advisor.planning.reasons.base import Checkpointing, FitFigures, ReasonModel

# --- the data-parallel choice (policy.choose) -------------------------------------------------------

class SizeBand(ReasonModel):
    strategy: str = Field(description="The size-threshold default.")
    num_params: int = Field(description="The model's parameters.")
    band: Literal["small", "medium", "large", "one-gpu"] = Field(description="< 1B, 1-10B, > 10B parameters; "
                                                                 "one-gpu: a single GPU, whatever the size.")


class SizeDefault(SizeBand):
    """``Default from size: zero3 (7.62B parameters (1-10B): ...).``"""

    kind: Literal["size-default"] = "size-default"


class SizeDefaultUnfit(SizeBand):
    """``--policy fastest``: ``The size default zero3 (...) does not fit.``"""

    kind: Literal["size-default-unfit"] = "size-default-unfit"


class AlsoSizeDefault(SizeBand):
    """``--policy fastest``: ``It is also the size default (...).``"""

    kind: Literal["also-size-default"] = "also-size-default"


class DefaultFits(FitFigures):
    """``zero3 fits: 68.4 GiB of 79.2 GiB per GPU (86%) at micro-batch 1.``"""

    kind: Literal["default-fits"] = "default-fits"


class DoesNotFit(FitFigures):
    """``zero3 does not fit: needs 79.6 GiB per GPU of 79.2 GiB even at micro-batch 1 with checkpointing.``"""

    kind: Literal["does-not-fit"] = "does-not-fit"


class HighEndDoesNotFit(FitFigures):
    """``--margin high``: the high end of the range is past the GPU although the expected total is not."""

    kind: Literal["does-not-fit-high-end"] = "does-not-fit-high-end"
    high_bytes: int = Field(description="The high end of the per-GPU range.")


class CpuRamDoesNotFit(ReasonModel):
    """``zero3_offload does not fit in CPU RAM: needs 900.0 GiB per node of 512.0 GiB.``"""

    kind: Literal["does-not-fit-cpu-ram"] = "does-not-fit-cpu-ram"
    strategy: str
    cpu_bytes: int
    cpu_capacity_bytes: int


class Unavailable(ReasonModel):
    """``dp is unavailable: DataParallel is one process: one node only.``"""

    kind: Literal["unavailable"] = "unavailable"
    strategy: str
    detail: str = Field(description="Why, in the strategy table's (or the batch check's) words.")


class Escalated(FitFigures):
    """``escalated to zero2_offload: 69.0 GiB of 79.2 GiB per GPU at micro-batch 3``, or ``fell back to ddp: ...
    (the fastest of 2 that fit on the GPUs alone: 1,427 tokens/s).``"""

    kind: Literal["escalated"] = "escalated"
    direction: Literal["escalated", "fell back"] = Field(description="Past the default in ESCALATION, or before it.")
    num_fitting_on_gpu: int = Field(description="GPU-only candidates that fit (named when more than one).")
    tokens_per_s: float | None


class FasterOffload(ReasonModel):
    """``zero3_offload rather than zero2_offload: both offload, and ...``"""

    kind: Literal["faster-offload"] = "faster-offload"
    strategy: str
    tokens_per_s: float
    micro_batch_size: int
    instead_of: str
    instead_tokens_per_s: float
    instead_micro_batch_size: int


class OffloadNotTaken(ReasonModel):
    """``zero3_offload would run faster: 10,108 tokens/s against zero3's 8,396 (+20%) ...; offload is taken only
    when nothing fits on the GPUs alone``: a data-parallel offload plan that fits and runs faster (by more than
    SAME_SPEED) than the GPU-only recommendation, named so the trade is the user's to make."""

    kind: Literal["offload-not-taken"] = "offload-not-taken"
    strategy: str
    tokens_per_s: float
    micro_batch_size: int
    checkpointing: Checkpointing
    cpu_bytes: int = Field(description="CPU RAM per node it needs for the offloaded states.")
    chosen: str = Field(description="The recommended (GPU-only) strategy.")
    chosen_tokens_per_s: float


class Figures(ReasonModel):
    """One fitting candidate's figures, as a comparison quotes them."""

    strategy: str
    total_bytes: int
    capacity_bytes: int
    step_s: float
    micro_batch_size: int
    tokens_per_s: float


class MarginChoice(ReasonModel):
    """``zero2 rather than zero3: zero2 71% of memory, ... vs zero3 ...; as fast (within 3%) and ...``"""

    kind: Literal["margin-choice"] = "margin-choice"
    chosen: Figures
    runner_up: Figures
    same_speed: float = Field(description="Tokens/s within this fraction count as as fast.")
    headroom: float = Field(description="The memory share a comfortable plan leaves free.")
    roomy: Literal["chosen-only", "both", "neither"] = Field(description="Which stay within 1 - headroom.")
    one_gpu: bool = Field(default=False, exclude_if=lambda on: not on,
                          description="A single GPU: nothing communicates; the plain model needs no wrapper.")


class Dominates(ReasonModel):
    """``ddp rather than zero3: ddp 87% of memory, ... vs zero3 93% ...; faster and needs no more memory.``"""

    kind: Literal["dominates"] = "dominates"
    chosen: Figures
    runner_up: Figures = Field(description="The choice it replaces (the size default or its margin choice).")
    same_speed: float = Field(description="Faster means more tokens/s by more than this fraction.")


class CpuRam(ReasonModel):
    """``zero2_offload needs 141.9 GiB of CPU RAM per node for offloaded states (...).``"""

    kind: Literal["cpu-ram"] = "cpu-ram"
    strategy: str
    cpu_bytes: int
    cpu_capacity_bytes: int | None = Field(description="--cpu-memory-gib, when given.")
    activations: bool = Field(default=False, exclude_if=lambda on: not on,
                              description="Part of it is offloaded activations (--activation-offload).")


class CheckpointingOn(ReasonModel):
    """Checkpointing is on because nothing fits without it."""

    kind: Literal["checkpointing-on"] = "checkpointing-on"
    mode: Literal["on", "selective"]
    offload: bool = Field(default=False, exclude_if=lambda on: not on,
                          description="On because --activation-offload runs under it, not because nothing fits.")


class CheckpointingForHeadroom(ReasonModel):
    """Checkpointing is on although the same strategy fits without it: ``without it micro-batch 1 needs 78.21 of
    79.15 GiB (99%), past the 10% headroom (5,373 tokens/s; this plan 4,587)``; or, where the checkpointed plan is the
    faster, because the larger micro-batch it makes room for runs faster (advisor.planning.candidates): ``the larger micro-batch it makes
    room for runs faster: without it micro-batch 3 needs 56.0 GiB of 79.2 GiB (71%) and runs 840 tokens/s; this
    plan 2,834``."""

    kind: Literal["checkpointing-headroom"] = "checkpointing-headroom"
    mode: Literal["on", "selective"]
    micro_batch_size: int = Field(description="The micro-batch the plan without checkpointing fits at.")
    total_bytes: int = Field(description="That plan's per-GPU total at the --margin end.")
    capacity_bytes: int
    margin: Literal["low", "expected", "high"] = Field(description="Which end of the range decides (--margin).")
    headroom: float = Field(description="The share of memory a comfortable plan leaves free (--headroom).")
    tokens_per_s: float = Field(description="That plan's tokens/s.")
    chosen_tokens_per_s: float = Field(description="The checkpointed plan's tokens/s.")


class AlsoFits(ReasonModel):
    """``ddp also fits (61% of memory, micro-batch 2, 1.20 s/step) and communicates less``."""

    kind: Literal["also-fits"] = "also-fits"
    strategy: str
    total_bytes: int
    capacity_bytes: int
    micro_batch_size: int
    step_s: float | None
    one_gpu: bool = Field(default=False, exclude_if=lambda on: not on,
                          description="A single GPU: nothing communicates; the plain model needs no wrapper.")


class Requested(ReasonModel):
    """``--strategy zero2`` and it fits."""

    kind: Literal["requested"] = "requested"
    strategy: str


# --- --policy fastest (policy.choose_fastest, fastest.explain_tradeoff) -----------------------------

class FastestPolicy(ReasonModel):
    """``Policy fastest: of 4 data-parallel strategies that fit, zero1 is fastest: 12,000 tokens/s (MFU 41%).``
    (the data-parallel family; meshes are weighed after, advisor.planning.meshes)"""

    kind: Literal["fastest"] = "fastest"
    strategy: str
    num_fitting: int
    tokens_per_s: float
    mfu: float


class Spends(ReasonModel):
    kind: Literal["spends"] = "spends"
    label: str = Field(description="The step-time component.")
    slow_s: float = Field(description="Seconds per global batch, the slower candidate.")
    fast_s: float


class Recomputes(ReasonModel):
    kind: Literal["recomputes"] = "recomputes"


class MicroBatches(ReasonModel):
    kind: Literal["micro-batches"] = "micro-batches"
    fast: int
    slow: int


Gap = Annotated[Union[Spends, Recomputes, MicroBatches], Field(discriminator="kind")]


class Tradeoff(ReasonModel):
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

def _optional(description: str):
    """A field a remedy line has only sometimes: None, and left out of the JSON, where it has none."""
    return Field(default=None, exclude_if=lambda value: value is None, description=description)


RemedyMesh = Annotated[str | None, _optional("The mesh the re-plan runs on (--cp N, more GPUs on a mesh).")]
RemedySamples = Annotated[int | None, _optional("Remedy.own_samples: the re-plan's samples a step, where they differ "
                                                "from the plan's and no --global-batch fixes them.")]
PlanSamples = Annotated[int | None, _optional("The plan's samples a step, where remedy_samples is given.")]


class _RemedyLine(ReasonModel):
    """What the first line of a plan says of its best remedy: the plan, the change and the strategy it leads to."""

    kind: str
    strategy: str
    tokens_per_s: float
    remedy: str = Field(description="The change as the CLI spells it.")
    keeps_math: bool
    remedy_strategy: str


class OffloadRemedy(_RemedyLine):
    """The first line of a plan that offloads: the best remedy, in numbers."""

    kind: Literal["offload-remedy"] = "offload-remedy"
    remedy_fits: bool = Field(description="The re-plan runs on the GPUs alone.")
    remedy_step_s: float
    remedy_tokens_per_s: float
    saved_gib: float = Field(description="Remedy.saved_gib: GiB saved on the reference candidate.")
    reference: str = Field(description="The candidate the saving is measured on.")
    remedy_mesh: RemedyMesh = None
    remedy_samples: RemedySamples = None
    samples: PlanSamples = None


class HeadroomRemedy(_RemedyLine):
    """The first line of a plan past the --headroom: the best remedy that brings it back within it, in numbers."""

    kind: Literal["headroom-remedy"] = "headroom-remedy"
    total_bytes: int = Field(description="The plan's total at the --margin end.")
    capacity_bytes: int
    headroom: float
    remedy_total_gib: float = Field(description="Remedy.total_gib: the re-plan's total per GPU.")
    remedy_step_s: float
    remedy_tokens_per_s: float
    remedy_mesh: RemedyMesh = None
    remedy_samples: RemedySamples = None
    samples: PlanSamples = None


class SingleProcessRemedy(_RemedyLine):
    """The first line of a plan that falls back to DataParallel (one process, GPU 0 the bottleneck): the best remedy
    that runs faster on the GPUs alone, in numbers."""

    kind: Literal["single-process-remedy"] = "single-process-remedy"
    remedy_step_s: float
    remedy_tokens_per_s: float
    remedy_mesh: RemedyMesh = None
    remedy_samples: RemedySamples = None
    samples: PlanSamples = None


class RemedyFits(ReasonModel):
    """Nothing fits: ``with --lora 16 (changes the mathematics), zero3 fits on the GPUs alone: ...``"""

    kind: Literal["remedy-fits"] = "remedy-fits"
    remedy: str
    keeps_math: bool
    strategy: str
    fits: bool
    step_s: float
    tokens_per_s: float
    mesh: str | None = Field(default=None, exclude_if=lambda label: label is None,
                             description="The mesh the strategy runs on with the change (a pinned sharded strategy).")


class LossSaving(ReasonModel):
    kernel: str
    saved_bytes: int


class LossPeak(ReasonModel):
    """``the loss decides the peak of ddp (...): --loss chunked would save 2.2 GiB ... of its 21.3 GiB ...``"""

    kind: Literal["loss-peak"] = "loss-peak"
    strategy: str
    total_bytes: int
    micro_batch_size: int
    savings: tuple[LossSaving, ...]
    mesh_label: str | None = Field(default=None, exclude_if=lambda label: label is None,
                                   description="The plan's mesh, where it runs on one.")


class LossWouldFit(ReasonModel):
    """``nothing fits with the hf loss (...); with --loss chunked, zero3 fits at micro-batch 1 (70.0 GiB per GPU)``"""

    kind: Literal["loss-would-fit"] = "loss-would-fit"
    kernel: str
    strategy: str
    micro_batch_size: int
    total_bytes: int


class SmallestFitFound(ReasonModel):
    """``16 x H100-80GB-SXM would fit with zero3 at micro-batch 1.`` (on mesh ... when one is fewer); with
    ``current``, the plan's own count: ``zero3 fits on these 2 x A100-80GB-SXM at micro-batch 1.`` (a pinned
    strategy that does not fit)."""

    kind: Literal["smallest-fit"] = "smallest-fit"
    num_gpus: int
    gpu: str
    strategy: str
    mesh_label: str | None = None
    current: bool = Field(default=False, exclude_if=lambda on: not on,
                          description="The count is the plan's own: another strategy fits on these GPUs.")
    gpu_only_gpus: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                      description="Where ``strategy`` offloads: the fewest GPUs zero3 fits on alone.")
    gpu_only_mesh: str | None = Field(default=None, exclude_if=lambda label: label is None,
                                      description="The mesh ``gpu_only_gpus`` holds the job on (None: data parallelism).")
    without: str | None = Field(default=None, exclude_if=lambda flags: flags is None,
                                description="The pinned degrees the answer drops (``--pp 2 --tp 2``).")
    pinned: str | None = Field(default=None, exclude_if=lambda flags: flags is None,
                               description="Every pinned degree (``--tp 2 --pp 2``): what did not fit, where the "
                               "answer drops some of them.")
    micro_batch_size: int = Field(default=1, exclude_if=lambda n: n == 1,
                                  description="The micro-batch it fits at: 1, or with --global-batch the whole batch "
                                              "at once where accumulating it does not fit.")
    gpu_only_micro_batch: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                             description="The micro-batch ``gpu_only_gpus`` fit at, as "
                                                         "micro_batch_size.")


class LongerWithOffload(ReasonModel):
    """``--seq-len max``: ``zero3_offload holds 40,591 tokens by offloading to the CPU (1,479 tokens/s there);
    the plan is shown at 37,028, the longest on the GPUs alone.``"""

    kind: Literal["longer-with-offload"] = "longer-with-offload"
    strategy: str
    seq_len: int = Field(description="The longest the offloading strategy holds.")
    gpu_only_seq_len: int = Field(description="The longest a GPU-only candidate holds: the plan's length.")
    step_s: float
    tokens_per_s: float


class BeyondContext(ReasonModel):
    """``--seq-len max``, or a ``--seq-len`` past the context: ``265,616 tokens is past the model's context of
    131,072 tokens (max_position_embeddings): training that long needs RoPE scaling or a longer-context checkpoint
    (--seq-len 131072 stays within it).`` With learned positions (GPT-2, BERT, BART) no longer input runs."""

    kind: Literal["beyond-context"] = "beyond-context"
    seq_len: int = Field(description="The plan's length: the longest the GPUs hold, or the one given.")
    context: int = Field(description="The model's max_position_embeddings.")
    learned: bool = Field(default=False, exclude_if=lambda learned: not learned,
                          description="The positions are a learned table of `context` rows: a longer input fails.")


class LongestWithinHeadroom(ReasonModel):
    """``--seq-len max``: ``zero3 holds 37,028 tokens only past the 10% headroom (the longest fills the GPU); within
    it, 32,794 (--seq-len 32794).``"""

    kind: Literal["longest-within-headroom"] = "longest-within-headroom"
    strategy: str
    seq_len: int = Field(description="The longest the strategy holds within the --headroom.")
    longest_seq_len: int = Field(description="The longest it holds at all: the plan's length.")
    headroom: float


class LongerWithChange(ReasonModel):
    """``--seq-len max``: ``with --loss fused (keeps the mathematics), ddp holds 61,310 tokens, 1.86x this plan's
    32,939 (--seq-len max --loss fused).``"""

    kind: Literal["longer-with-change"] = "longer-with-change"
    strategy: str
    change: str = Field(description="The flag that keeps the mathematics (--loss fused, --optimizer-impl fused).")
    seq_len: int = Field(description="The longest the strategy holds with the change.")
    plan_seq_len: int = Field(description="The longest it holds without: the plan's length.")


class PastHeadroom(ReasonModel):
    """``--micro-batch auto`` stopped at the --headroom, and a larger micro-batch that still fits the GPU runs faster:
    ``micro-batch 2 also fits (20.4 GiB of 22.1 GiB, 92%), past the 10% headroom, and runs 917 tokens/s against this
    plan's 826 (--micro-batch 2; within the estimate's error of an out-of-memory failure).``"""

    kind: Literal["past-headroom"] = "past-headroom"
    micro_batch_size: int = Field(description="The largest micro-batch the GPU holds at the --margin end.")
    total_bytes: int = Field(description="Its per-GPU total at the --margin end.")
    capacity_bytes: int
    headroom: float
    tokens_per_s: float
    chosen_tokens_per_s: float = Field(description="The plan's tokens/s.")
    flags: str | None = Field(default=None, exclude_if=lambda flags: flags is None,
                              description="The flags beside --micro-batch that plan it, where the plan's mesh or "
                                          "global batch was the planner's choice (``--cp 2 --tp 2``).")


class NoCountFits(ReasonModel):
    """``No number of these GPUs fits: ...; shorten --seq-len.``"""

    kind: Literal["no-count-fits"] = "no-count-fits"
    checkpointing_tried: bool
    sharding_unavailable: str | None = Field(default=None, exclude_if=lambda reason: reason is None,
                                             description="Why zero3 cannot run this job on this stack, where that is "
                                                         "what no count gets past (the others replicate the model).")
    hints: tuple[str, ...] = Field(description="What to change, as CLI advice.")
    pinned: str | None = Field(default=None, exclude_if=lambda flags: flags is None,
                               description="The pinned degrees (``--tp 2 --pp 2``).")
    kept: str | None = Field(default=None, exclude_if=lambda flags: flags is None,
                             description="Those every mesh searched kept (``--tp 2``; the pipeline's are not searched).")
    reserve_gib: float | None = Field(default=None, exclude_if=lambda gib: gib is None,
                                      description="--reserve-gib, where the user raised it above the calibrated "
                                                  "allocator constant.")
    left_bytes: int | None = Field(default=None, exclude_if=lambda left: left is None,
                                   description="What that reserve and the CUDA context leave of a GPU.")
    bucket: str | None = Field(default=None, exclude_if=lambda name: name is None,
                               description="The DeepSpeed size the user's config set whose one buffer fills half a "
                                           "GPU or more (reduce_bucket_size, ...).")
    bucket_bytes: int | None = Field(default=None, exclude_if=lambda size: size is None,
                                     description="That buffer's bytes in the 16-bit compute dtype.")
    global_batch_size: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                          description="--global-batch, where it is the limit: without it a count "
                                                      "fits (without_batch).")
    without_batch: SmallestFitFound | None = Field(default=None, exclude_if=lambda fit: fit is None,
                                                   description="What fits without --global-batch.")
    above: int | None = Field(default=None, exclude_if=lambda n: n is None,
                              description="With global_batch_size: the plan's GPUs, above which counts were tried.")
    max_nodes: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                  description="With global_batch_size: the most nodes tried beyond doubling.")
