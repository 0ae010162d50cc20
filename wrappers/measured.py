"""Real runs feed back: the peak memory a training run really allocated and reserved, beside the plan.

On CUDA, ``wrap()`` and the Trainer / Lightning callbacks watch the first optimizer steps: after step 1
they reset the device's peak statistics (step 1 allocates the optimizer state lazily and warms the
caching allocator), after step 3 they read ``torch.cuda.max_memory_allocated()`` and
``max_memory_reserved()`` and print one line (rank 0) beside the plan's figures for the same run:

    advisor: measured over steps 2-3: peak allocated 61.20 GiB (planned 60.10, +1.8%),
             reserved 64.00 GiB (planned 63.50, +0.8%)

The planned figures are the estimate's ``peak_allocated`` and ``reserved`` (``advisor.estimate.memory``'s
``MemoryBreakdown``: what ``max_memory_reserved()`` should report, the CUDA context and NCCL left out).
A run with no plan (no GPU visible when it was planned) prints the measurement alone. The statistics come
from a ``MemorySource``; ``device_memory_source`` returns the CUDA one, or None off CUDA (nothing is
watched), and is the one seam the CPU tests replace with a stub.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from advisor.units import GIB

FIRST_STEP, LAST_STEP = 2, 3  # the steps measured: after the lazy optimizer state and the allocator's warm-up


class MemorySource(Protocol):
    """Peak-memory statistics of one device since the last reset, in bytes."""

    def reset_peaks(self) -> None: ...

    def peak_allocated(self) -> int: ...

    def peak_reserved(self) -> int: ...


class CudaMemory:
    """``torch.cuda``'s peak statistics of one device."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def reset_peaks(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))

    def peak_reserved(self) -> int:
        import torch

        return int(torch.cuda.max_memory_reserved(self.device))


def device_memory_source(device: Any) -> MemorySource | None:
    """The statistics of ``device`` when it is a CUDA device, else None (nothing to measure)."""
    return CudaMemory(device) if getattr(device, "type", None) == "cuda" else None


def _beside(measured: int, planned: int | None) -> str:
    if not planned:
        return f"{measured / GIB:.2f} GiB"
    return f"{measured / GIB:.2f} GiB (planned {planned / GIB:.2f}, {(measured - planned) / planned:+.1%})"


def measured_line(allocated: int, reserved: int, planned: Any | None) -> str:
    """The one line: measured peaks, each beside the plan's (``planned``: a ``MemoryBreakdown`` or None)."""
    plan_alloc = planned.peak_allocated if planned is not None else None
    plan_reserved = planned.reserved if planned is not None else None
    tail = "" if planned is not None else " (no plan to compare: memory was not planned for this run)"
    return (f"advisor: measured over steps {FIRST_STEP}-{LAST_STEP}: peak allocated {_beside(allocated, plan_alloc)}, "
            f"reserved {_beside(reserved, plan_reserved)}{tail}")


class StepMemory:
    """Counts finished optimizer steps; resets the peaks after step ``FIRST_STEP - 1``, reads them after
    ``LAST_STEP`` and reports once. ``report`` receives the line (rank 0 prints it)."""

    def __init__(self, source: MemorySource, planned: Any | None, report: Callable[[str], None]) -> None:
        self.source, self.planned, self.report = source, planned, report
        self.steps = 0
        self.line: str | None = None

    def step_done(self) -> None:
        self.steps += 1
        if self.steps == FIRST_STEP - 1:
            self.source.reset_peaks()
        elif self.steps == LAST_STEP:
            self.line = measured_line(self.source.peak_allocated(), self.source.peak_reserved(), self.planned)
            self.report(self.line)


def planned_breakdown(plan: Any, strategy: str | None) -> Any | None:
    """The plan's memory for the candidate the run applies (its ``MemoryBreakdown``), or None."""
    if plan is None:
        return None
    if strategy is None:  # the model left unchanged on one GPU: the plan of the plain model
        return getattr(plan.chosen, "memory_bytes", None)
    chosen = plan.chosen if plan.recommendation is not None and plan.recommendation.strategy == strategy else None
    row = chosen if chosen is not None else plan.candidate(strategy)
    return getattr(row, "memory_bytes", None)


def watch_optimizer(optimizer: Any, source: MemorySource | None, planned: Any | None,
                    report: Callable[[str], None]) -> StepMemory | None:
    """Measure steps 2-3 of the loop that steps ``optimizer`` (a post-step hook); None when off CUDA."""
    if source is None or optimizer is None or not hasattr(optimizer, "register_step_post_hook"):
        return None
    watcher = StepMemory(source, planned, report)
    handle = None

    def after_step(*_: Any) -> None:
        watcher.step_done()
        if watcher.line is not None and handle is not None:
            handle.remove()

    handle = optimizer.register_step_post_hook(after_step)
    return watcher
