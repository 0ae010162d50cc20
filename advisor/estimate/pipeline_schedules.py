"""Pipeline schedules as facts (``profiles/pipeline_schedules.json``): how many micro-batches each stage
holds in flight, how many deferred weight-gradient (W) passes it keeps, and how many micro-batches a step
runs. Read by the per-stage memory estimate (``advisor.estimate.pipeline``), its step time and the
torchtitan export. Pure functions, no torch.
"""

from __future__ import annotations

import functools
import json
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from advisor.mesh import ParallelDims
from profiles import PROFILES_DIR


DEFAULT_MICRO_BATCHES_PER_RANK = 4  # num_micro_batches: a choice, not a fact


class ScheduleFacts(BaseModel):
    """One row of ``profiles/pipeline_schedules.json`` (its ``_doc`` defines the units)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    in_flight: str = Field(description="Rank micro-batches in flight on rank i (formula as written in the source).")
    bubble_coefficient: float = Field(ge=0, description="bubble = c x (p - 1) / v x (t_F + t_B) of one micro-batch.")
    w_deferred: bool = Field(description="The weight-gradient pass runs apart from the input-gradient pass.")
    w_held: str = Field(description="Micro-batches whose W inputs rank i holds beyond those in flight (formula as "
                        "written in the source; ``w_held`` evaluates it).")
    param_copies: int = Field(ge=1, description="Copies of the rank's share of the parameters.")
    v_shape: bool = Field(description="Two chunks per rank in a V: the first and last chunk on rank 0.")
    torch_class: str | None = Field(description="torch.distributed.pipelining schedule class; None: torch has none.")
    memory_limit: int | None = Field(ge=1, description="Auto-scheduled zero-bubble: the activation memory limit in "
                                     "units of p M_B (ZB-2p: 2) that deferred W passes fill; None: a fixed order.")
    source: str


@functools.cache
def load_schedules() -> dict[str, ScheduleFacts]:
    """The schedule table by name (read once)."""
    rows = json.loads((PROFILES_DIR / "pipeline_schedules.json").read_text())["schedules"]
    return {row["name"]: ScheduleFacts(**row) for row in rows}


def in_flight(schedule: str, *, rank: int, pp: int, micro_batches: int, chunks: int = 1) -> Fraction:
    """Rank micro-batches whose activations rank ``rank`` holds at its peak (the table's ``in_flight``)."""
    m, p, i, v = micro_batches, pp, rank, chunks
    if schedule == "gpipe":
        return Fraction(m)
    if schedule in ("1f1b", "zb_h1"):
        return Fraction(min(m, p - i))
    if schedule == "interleaved_1f1b":  # Megatron's warm-up chunks + the steady one, in chunks of 1/v
        return Fraction(min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1), v)
    if schedule in ("zb_h2", "zb_2p"):
        return Fraction(min(m, 2 * (p - i) - 1))
    if schedule == "zbv":  # torch's ScheduleZBVZeroBubble, counted on its actions: 2p chunks once m >= 2p - 1
        return Fraction(min(2 * m, m + i + 1, 2 * p), 2)
    if schedule == "dualpipev":
        return min(Fraction(m), Fraction(2 * p + 1, 2))
    raise ValueError(f"unknown pipeline schedule {schedule}")


def w_held(schedule: str, *, rank: int, pp: int, micro_batches: int, micro_batch_bytes: int = 0,
           w_bytes: int = 0) -> int:
    """Micro-batches whose deferred W inputs rank ``rank`` holds beside those in flight when a B starts (the
    table's ``w_held``): those whose B has run and whose W has not. ZB-H2 runs each W right after its B: none.
    ZB-H1 runs stage i's W i passes behind its B (Qi et al. 2024, Figure 3): i. The running B's own W inputs
    are not counted: they are saved activations of a micro-batch in flight, and its output gradients replace
    the activations B frees layer by layer (simulated, small Llama p 4: ZB-H2's last stage peaks at 1F1B's
    figure to the byte). ZB-V and DualPipeV, counted on torch's generated actions: none at the peak.

    The auto-scheduled ZB-2p (``memory_limit`` 2) defers each W until its memory limit of 2p M_B forces
    it (Qi et al. 2024, section 3.2), so the deferred W fill what the in-flight forwards leave of the
    limit: min(m - in flight, floor((2p - in flight) M_B / M_W)), with ``micro_batch_bytes`` M_B (one
    micro-batch's activations through the rank's blocks: the scheduler's f_mem, 34h + 5as a layer, counts no
    embedding or head tensors) and ``w_bytes`` M_W (what one deferred W keeps)."""
    facts = load_schedules()[schedule]
    if not facts.w_deferred:
        return 0
    if facts.memory_limit is not None:
        count = in_flight(schedule, rank=rank, pp=pp, micro_batches=micro_batches)
        if w_bytes <= 0:
            return int(micro_batches - count)
        room = int((facts.memory_limit * pp - count) * micro_batch_bytes) // w_bytes
        return int(max(0, min(micro_batches - count, room)))
    if schedule == "zb_h1":  # the table's "min(m - 1, i)"
        return min(micro_batches - 1, rank)
    return int(facts.w_held)  # a constant: ZB-H2, ZB-V, DualPipeV 0


def num_micro_batches(mesh: ParallelDims, accumulation: int | None) -> int:
    """Micro-batches per step and pipeline: the gradient accumulation the global batch gives, else
    ``DEFAULT_MICRO_BATCHES_PER_RANK`` x pp (a choice: Narayanan et al. 2021 want m >> p; 4 p keeps
    the 1F1B bubble (p - 1)/m under 25%)."""
    if accumulation is not None:
        return accumulation
    return DEFAULT_MICRO_BATCHES_PER_RANK * mesh.pp if mesh.pp > 1 else 1
