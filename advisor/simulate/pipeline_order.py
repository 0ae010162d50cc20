"""The order in which one pipeline stage runs its forward and backward passes under a schedule.

``stage_order(schedule, stage=, num_stages=, num_microbatches=, virtual_stages=)`` lists the passes
one stage runs in one training step, in order: ``F`` (forward), ``BW`` (the whole backward), or, for
the zero-bubble schedules, ``B`` (gradient of the input only) and ``W`` (gradient of the weights,
deferred). Each pass names its micro-batch and its chunk (virtual stage) on this stage. The
simulator (``advisor.simulate.pipeline_stage``) replays the list on fake tensors; the memory a stage
holds follows from the order alone, so the order is the whole schedule as far as memory goes.

Sources, one per schedule:

- ``gpipe``: Huang et al. 2019; all forwards, then all backwards (torch.distributed.pipelining's
  ``ScheduleGPipe``).
- ``1f1b``: Narayanan et al. 2021 (PipeDream-Flush); Megatron-LM's
  ``forward_backward_pipelining_without_interleaving``: stage i (from 0) runs p - 1 - i warm-up
  forwards, then one forward and one backward in turn, then the remaining backwards.
- ``interleaved-1f1b``: Megatron-LM's ``forward_backward_pipelining_with_interleaving``: warm-up
  (p - i - 1) * 2 + (v - 1) * p chunk forwards; forward k runs chunk (k mod pv) // p on micro-batch
  (k // pv) * p + k mod p; backward k runs chunk v - 1 - (k mod pv) // p. Needs m divisible by p.
- ``zb-h1``: Qi et al. 2024 (Zero Bubble Pipeline Parallelism, ICLR), Figure 3 top: 1F1B's
  warm-up (p - i forwards, the memory of 1F1B), B and F in turn, each W deferred by i passes on
  stage i so that the last stages fill the drain with W. The paper's ZB-1p (auto-searched under a
  limit of p M_B) has the same in-flight count; its exact order comes from profiled times.
- ``zb-h2``: the same paper, Figure 3 bottom: 2(p - i) - 1 warm-up forwards on stage i (stage 0
  holds 2p - 1 micro-batches), then B, W, F. Stands for ZB-2p (limit 2p M_B).

Pure Python: the planning path may import it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Pass = Literal["F", "B", "W", "BW"]
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")
# The paper's names for the automatically searched zero-bubble schedules, replayed as the handcrafted
# schedule with the same activation-memory limit (Qi et al. 2024, section 5.1).
ALIASES = {"zb-1p": "zb-h1", "zb-2p": "zb-h2", "interleaved": "interleaved-1f1b", "1f1b-i": "interleaved-1f1b"}


class StagePass(NamedTuple):
    kind: Pass
    microbatch: int
    chunk: int = 0


def resolve_schedule(name: str) -> str:
    """The schedule's canonical name, or ``ValueError`` naming the known ones."""
    canonical = ALIASES.get(name.lower(), name.lower())
    if canonical not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule '{name}'; known: {', '.join(SCHEDULES + tuple(ALIASES))}")
    return canonical


def stage_order(schedule: str, *, stage: int, num_stages: int, num_microbatches: int,
                virtual_stages: int = 1) -> tuple[StagePass, ...]:
    """Every pass stage ``stage`` (0 = first) runs in one step, in order."""
    name = resolve_schedule(schedule)
    p, m, i, v = num_stages, num_microbatches, stage, virtual_stages
    if not 0 <= i < p:
        raise ValueError(f"stage {i} is not one of the {p} stages")
    if m < 1:
        raise ValueError("a step needs at least one micro-batch")
    if v != 1 and name != "interleaved-1f1b":
        raise ValueError(f"{name} runs one chunk per stage, not {v}")
    if name == "gpipe":
        return tuple(StagePass("F", k) for k in range(m)) + tuple(StagePass("BW", k) for k in range(m))
    if name == "1f1b":
        return _one_forward_one_backward(warmup=min(p - 1 - i, m), m=m)
    if name == "interleaved-1f1b":
        return _interleaved(i, p, m, v)
    if name == "zb-h1":
        return _zero_bubble(warmup=min(p - i, m), m=m, w_lag=i)
    return _zero_bubble(warmup=min(2 * (p - i) - 1, m), m=m, w_lag=0)


def _one_forward_one_backward(*, warmup: int, m: int) -> tuple[StagePass, ...]:
    order = [StagePass("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        order += [StagePass("F", warmup + k), StagePass("BW", k)]
    order += [StagePass("BW", k) for k in range(m - warmup, m)]
    return tuple(order)


def _interleaved(i: int, p: int, m: int, v: int) -> tuple[StagePass, ...]:
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of the stages ({p})")
    total = m * v
    warmup = min((p - i - 1) * 2 + (v - 1) * p, total)

    def forward(k: int) -> StagePass:
        return StagePass("F", (k // (p * v)) * p + k % p, (k % (p * v)) // p)

    def backward(k: int) -> StagePass:
        return StagePass("BW", (k // (p * v)) * p + k % p, v - 1 - (k % (p * v)) // p)

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return tuple(order)


def _zero_bubble(*, warmup: int, m: int, w_lag: int) -> tuple[StagePass, ...]:
    """Warm-up forwards, then B (and the W ``w_lag`` passes behind it) and F in turn, then the Ws left."""
    order = [StagePass("F", k) for k in range(warmup)]
    done_w = 0
    for k in range(m):
        order.append(StagePass("B", k))
        if k - done_w >= w_lag:
            order.append(StagePass("W", done_w))
            done_w += 1
        if warmup + k < m:
            order.append(StagePass("F", warmup + k))
    order += [StagePass("W", k) for k in range(done_w, m)]
    return tuple(order)


def max_in_flight(order: tuple[StagePass, ...]) -> int:
    """Most micro-batch chunks whose forward has run and whose backward (B or BW) has not."""
    live = peak = 0
    for step in order:
        live += 1 if step.kind == "F" else -1 if step.kind in ("B", "BW") else 0
        peak = max(peak, live)
    return peak
