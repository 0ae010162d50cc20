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
    torch_class: str = Field(description="torch.distributed.pipelining schedule class.")
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
    if schedule == "zb_h2":
        return Fraction(min(m, 2 * (p - i) - 1))
    if schedule == "zbv":
        return Fraction(min(m, p))
    if schedule == "dualpipev":
        return min(Fraction(m), Fraction(2 * p + 1, 2))
    raise ValueError(f"unknown pipeline schedule {schedule}")


def w_held(schedule: str, *, rank: int, pp: int, micro_batches: int) -> int:
    """Micro-batches whose deferred W inputs rank ``rank`` holds beside those in flight when a B starts (the
    table's ``w_held``): those whose B has run and whose W has not. ZB-H2 runs each W right after its B: none.
    ZB-H1 runs stage i's W i passes behind its B (Qi et al. 2024, Figure 3): i. The running B's own W inputs
    are not counted: they are saved activations of a micro-batch in flight, and its output gradients replace
    the activations B frees layer by layer (simulated, small Llama p 4: ZB-H2's last stage peaks at 1F1B's
    figure to the byte)."""
    facts = load_schedules()[schedule]
    if not facts.w_deferred:
        return 0
    if schedule == "zb_h1":  # the table's "min(m - 1, i)"
        return min(micro_batches - 1, rank)
    return int(facts.w_held)  # a constant: ZB-H2 0; ZB-V, DualPipeV 1 (no simulated order to count them on)


def num_micro_batches(mesh: ParallelDims, accumulation: int | None) -> int:
    """Micro-batches per step and pipeline: the gradient accumulation the global batch gives, else
    ``DEFAULT_MICRO_BATCHES_PER_RANK`` x pp (a choice: Narayanan et al. 2021 want m >> p; 4 p keeps
    the 1F1B bubble (p - 1)/m under 25%)."""
    if accumulation is not None:
        return accumulation
    return DEFAULT_MICRO_BATCHES_PER_RANK * mesh.pp if mesh.pp > 1 else 1
