"""``--policy fastest``: compare candidates that fit by time per global batch, and say why one wins.

Gradient accumulation keeps the global batch fixed, so the fair comparison between candidates with
different micro-batches is the time to process one global batch: step time x (global batch /
samples per step). Without a global batch the planner compares time per sample, which orders
candidates the same way (it is the same quantity for any fixed batch). Pure functions over
``StepTime`` values from ``advisor.estimate.step_time``.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from advisor.estimate.step_time import StepTime
from advisor.planning import reasons as r

T = TypeVar("T")


def time_per_global_batch_s(step: StepTime, *, global_batch_size: int | None = None) -> float:
    """Seconds to process ``global_batch_size`` samples (default: the step's own samples)."""
    samples = step.samples_per_step
    if global_batch_size is None:
        return step.step_s
    if global_batch_size < 1:
        raise ValueError("global batch size must be at least 1")
    return step.step_s * global_batch_size / samples


def rank_by_time(candidates: Sequence[tuple[T, StepTime]]) -> list[tuple[T, StepTime]]:
    """Fastest first: highest global tokens per second (= least time per fixed global batch)."""
    return sorted(candidates, key=lambda item: -item[1].tokens_per_s)


def _gaps(fast: StepTime, slow: StepTime, batch: int) -> list[r.Gap]:
    """The components that explain most of the gap, in seconds per global batch."""
    def per_batch(step: StepTime, seconds: float) -> float:
        return seconds * batch / step.samples_per_step

    parts = {
        "exposed communication": (per_batch(fast, fast.exposed_communication_s), per_batch(slow, slow.exposed_communication_s)),
        "compute": (per_batch(fast, fast.compute_s), per_batch(slow, slow.compute_s)),
        "offload (PCIe + CPU optimizer)": (per_batch(fast, fast.exposed_offload_s), per_batch(slow, slow.exposed_offload_s)),
        "optimizer step": (per_batch(fast, fast.optimizer_s), per_batch(slow, slow.optimizer_s)),
    }
    ranked = sorted(parts.items(), key=lambda kv: kv[1][0] - kv[1][1])
    gaps: list[r.Gap] = []
    for label, (f, s) in ranked:
        if s - f < 0.05 * max(s, 1e-9) or s - f <= 0:
            continue
        gaps.append(r.Spends(label=label, slow_s=s, fast_s=f))
    if fast.hardware_flops_per_gpu / fast.model_flops_per_gpu < slow.hardware_flops_per_gpu / slow.model_flops_per_gpu:
        gaps.append(r.Recomputes())
    if fast.micro_batch_size != slow.micro_batch_size:
        gaps.append(r.MicroBatches(fast=fast.micro_batch_size, slow=slow.micro_batch_size))
    return gaps[:3]


def explain_tradeoff(fastest: tuple[str, StepTime], default: tuple[str, StepTime], *,
                     global_batch_size: int | None = None) -> r.Tradeoff:
    """How much faster the fastest candidate is than the default, and why, in numbers."""
    (fast_name, fast), (slow_name, slow) = fastest, default
    batch = global_batch_size or slow.samples_per_step
    fast_s = time_per_global_batch_s(fast, global_batch_size=batch)
    slow_s = time_per_global_batch_s(slow, global_batch_size=batch)
    same = fast_name == slow_name or abs(slow_s - fast_s) < 1e-12
    return r.Tradeoff(fast=fast_name, slow=slow_name, fast_batch_s=fast_s, slow_batch_s=slow_s,
                      global_batch_size=batch, fast_tokens_per_s=fast.tokens_per_s, slow_tokens_per_s=slow.tokens_per_s,
                      gaps=() if same else tuple(_gaps(fast, slow, batch)))
